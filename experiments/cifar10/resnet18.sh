#!/usr/bin/env bash
# The budget study's stronger-encoder point (docs/temperature-study.md, "Does the verdict move with the
# training budget?"): NT-Xent over the tau grid at the smallest budget (5,000 images x 18 epochs)
# with the built-in CIFAR-stem ResNet-18 instead of the small CNN, one seed, the same val/test
# images, batch and read-out as experiments/cifar10/budgets.sh. A ResNet-18 run costs far more
# than a small-CNN one on a CPU (about 70 minutes on 2 cores): time one run first (TAUS=0.2),
# then run what fits. The committed results (experiments/cifar10/results/resnet18-5000x18) ran
# TAUS=0.05,0.2,1.0 JOBS=2; --resume continues a cut-off grid from the runs' checkpoints.
# Usage: [TAUS=...] [JOBS=...] experiments/cifar10/resnet18.sh CIFAR10_DIR [OUT] [--resume]
set -euo pipefail
data=${1:?usage: experiments/cifar10/resnet18.sh CIFAR10_DIR [OUT] [--resume]}
out=${2:-runs/cifar10/resnet18-5000x18}
shift $(( $# < 2 ? $# : 2 ))
contrastkit sweep --data "$data" --train-limit 5000 --epochs 18 --val-limit 1000 --test-limit 2000 \
    --temperatures "${TAUS:-0.05,0.1,0.2,0.5,1.0}" --no-variants --batch-size 256 --eval-every 10 --seeds 1 \
    --encoder resnet18 --jobs "${JOBS:-1}" --no-progress --out "$out" "$@"
