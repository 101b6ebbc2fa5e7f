#!/usr/bin/env bash
# The CIFAR-10 temperature study of docs/temperature-study.md, exactly as its committed results
# were produced. Usage: experiments/cifar10/run.sh CIFAR10_DIR [OUT]
#   CIFAR10_DIR: a class-folder tree of the CIFAR-10 images (train/<class>/*, test/<class>/*),
#                or the folder download_cifar10 filled.
#   OUT:         where the study folders go (default runs/cifar10).
# Both commands can be cut off and continued with the same command plus --resume.
set -euo pipefail
data=${1:?usage: experiments/cifar10/run.sh CIFAR10_DIR [OUT]}
out=${2:-runs/cifar10}
jobs=${JOBS:-2}
common=(--data "$data" --train-limit 5000 --val-limit 1000 --test-limit 2000
        --epochs 30 --batch-size 256 --eval-every 10 --seeds 3 --jobs "$jobs" --no-progress)
shift $(( $# < 2 ? $# : 2 ))
contrastkit sweep "${common[@]}" --out "$out/sweep" "$@"
contrastkit experiment schedules "${common[@]}" --out "$out/schedules" "$@"
contrastkit report "$out/sweep"
contrastkit report "$out/schedules"
