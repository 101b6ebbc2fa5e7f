#!/usr/bin/env bash
# The temperature-methods experiment of docs/temperature-methods.md at the CIFAR-10 study's
# setting (docs/temperature-study.md): MACL, dual temperature, iSogCLR and TempNet, each against
# the best fixed tau of a 5-point sweep, 3 seeds, the same budget and read-out as the sweep.
# Usage: experiments/cifar10/temperature_methods.sh CIFAR10_DIR [OUT]
#   CIFAR10_DIR: a class-folder tree of the CIFAR-10 images, or the folder download_cifar10 filled.
#   OUT:         where the study folder goes (default runs/cifar10).
# Cut off, it continues with the same command plus --resume.
set -euo pipefail
data=${1:?usage: experiments/cifar10/temperature_methods.sh CIFAR10_DIR [OUT]}
out=${2:-runs/cifar10}
jobs=${JOBS:-2}
shift $(( $# < 2 ? $# : 2 ))
contrastkit experiment temperature-methods --data "$data" --train-limit 5000 --val-limit 1000 --test-limit 2000 \
    --epochs 30 --batch-size 256 --eval-every 10 --seeds 3 --jobs "$jobs" --no-progress \
    --out "$out/temperature-methods" "$@"
contrastkit report "$out/temperature-methods"
