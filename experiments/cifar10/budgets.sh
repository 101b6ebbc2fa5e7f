#!/usr/bin/env bash
# The CIFAR-10 temperature study at three training budgets (docs/temperature-study.md, "Does the
# verdict move with the training budget?"): NT-Xent at tau 0.05, 0.1, 0.2, 0.5, 1.0 and the simple
# loss, 3 seeds each, at 5,000 images x 18 epochs (90,000 image-steps per run), 15,000 x 20
# (300,000) and the whole 45,000-image training split x 20 (900,000).
# Usage: experiments/cifar10/budgets.sh CIFAR10_DIR [OUT] [--resume]
#   CIFAR10_DIR: a class-folder tree of the CIFAR-10 images (train/<class>/*, test/<class>/*).
#   OUT:         the study folder (default runs/cifar10/budgets).
# The budgets run from the smallest; cut off, the same command plus --resume continues (finished
# runs are read back from OUT/budget-*/runs/*/summary.json, an interrupted one resumes from its
# checkpoint). Run folders are not kept in the repository: experiments/cifar10/results/budgets/
# holds each budget's settings, tables, verdicts and plots, and on another machine --resume trains
# the runs again (deterministic on the CPU: the rerun gives the committed tables back).
set -euo pipefail
data=${1:?usage: experiments/cifar10/budgets.sh CIFAR10_DIR [OUT] [--resume]}
out=${2:-runs/cifar10/budgets}
jobs=${JOBS:-2}
shift $(( $# < 2 ? $# : 2 ))
contrastkit sweep --data "$data" --budgets 5000x18,15000x20,45000x20 --val-limit 1000 --test-limit 2000 \
    --temperatures 0.05,0.1,0.2,0.5,1.0 --variants simple --batch-size 256 --eval-every 10 --seeds 3 \
    --jobs "$jobs" --no-progress --out "$out" "$@"
contrastkit report "$out"
