#!/usr/bin/env bash
# The GPU run, one script: the device-agnostic tests on CUDA (losses and training steps), the
# loss benchmark (dense vs tiled vs peers, float32 and bfloat16, N up to 262,144 pairs or the
# first out-of-memory, torch.cuda.max_memory_allocated), the host syncs of one loss call and of
# each training step (torch.cuda.set_sync_debug_mode), and a CIFAR-10 ResNet-18 run in bf16,
# channels-last, images on the GPU (images/s, kNN and probe after --epochs) next to a float32
# one; then RESULTS.md with the tables. Each part has its own time limit, the whole stays under
# 9 minutes. Results: benchmarks/results/gpu/ (commit them with the command below).
#
#   bash benchmarks/gpu/run.sh [PYTHON]      (PYTHON defaults to $PYTHON, then python3)
#
# What must travel with the source tree (prepared on a machine with the package registry):
#   * kornia (the views) and the loss benchmark's peers, as wheels for the GPU machine's
#     Python: `bash benchmarks/gpu/fetch_wheels.sh` downloads them into .whl/ (ignored by git).
#     This script installs them from $WHEELS (default .whl/) into a private folder when kornia
#     is not importable, without any network.
#   * CIFAR-10 as JPEGs (cifar10-jpeg.tar.gz: train/<class>/*.jpg, test/<class>/*.jpg), found at
#     $CIFAR10_TARBALL, .gpu-data/cifar10-jpeg.tar.gz (ignored by git) or
#     ../shared/data/cifar10-jpeg.tar.gz, extracted to $CIFAR10_DIR (default /tmp/cifar10-jpeg);
#     or an extracted tree already at $CIFAR10_DIR. Without it the training part is skipped.
# On a lent machine whose files come back from one folder ($OUT), e.g.
#   bash benchmarks/gpu/run.sh python3; tar czf "$OUT/gpu.tgz" benchmarks/results/gpu
set -u
cd "$(dirname "$0")/../.."
PY="${1:-${PYTHON:-python3}}"
OUT=benchmarks/results/gpu
WHEELS="${WHEELS:-.whl}"
CIFAR10_DIR="${CIFAR10_DIR:-/tmp/cifar10-jpeg}"
EPOCHS="${GPU_EPOCHS:-6}"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "benchmarks/gpu/run.sh: no CUDA device is available to $PY (torch.cuda.is_available() is False); this run needs one GPU" >&2
    exit 2
fi

if ! "$PY" -c "import kornia" 2>/dev/null; then
    if compgen -G "$WHEELS/*.whl" > /dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/contrastkit-wheels "$WHEELS"/*.whl || { echo "run.sh: installing $WHEELS/*.whl failed" >&2; exit 3; }
        export PYTHONPATH="$PYTHONPATH:/tmp/contrastkit-wheels"
    fi
    if ! "$PY" -c "import kornia" 2>/dev/null; then
        echo "benchmarks/gpu/run.sh: kornia is not importable and $WHEELS/ holds no wheel of it; run" \
             "bash benchmarks/gpu/fetch_wheels.sh where pip reaches the package index, and bring $WHEELS/ along" >&2
        exit 3
    fi
fi

if [ ! -d "$CIFAR10_DIR/train" ]; then
    for tarball in "${CIFAR10_TARBALL:-}" .gpu-data/cifar10-jpeg.tar.gz ../shared/data/cifar10-jpeg.tar.gz; do
        if [ -n "$tarball" ] && [ -f "$tarball" ]; then
            mkdir -p "$CIFAR10_DIR" && tar xzf "$tarball" -C "$CIFAR10_DIR"
            top=$(dirname "$(find "$CIFAR10_DIR" -maxdepth 2 -type d -name train | head -n 1)")
            [ "$top" != "$CIFAR10_DIR" ] && [ -d "$top/train" ] && CIFAR10_DIR="$top"
            break
        fi
    done
fi

mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$PY" -c "import torch, kornia; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'kornia', kornia.__version__)"
  echo "command: bash benchmarks/gpu/run.sh $PY (GPU_EPOCHS=$EPOCHS)"; } > "$OUT/machine.txt"
status=0
step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, log, remember a failure
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 3 "$OUT/$name.log"
    echo "$name rc=$rc" >> "$OUT/machine.txt"
    [ $rc -eq 0 ] || status=1
}
step tests 90 "$PY" -m pytest -q -p no:cacheprovider --test-device cuda tests/losses/test_losses_device.py \
    tests/train/test_device_training.py --junitxml "$OUT/tests.xml"
step losses 150 "$PY" benchmarks/gpu/gpu_bench.py losses --out "$OUT" --max-n 262144 --budget-s 120
step syncs 80 "$PY" benchmarks/gpu/gpu_bench.py syncs --out "$OUT"
if [ -d "$CIFAR10_DIR/train" ]; then
    step train 180 "$PY" benchmarks/gpu/gpu_bench.py train --out "$OUT" --data "$CIFAR10_DIR" --epochs "$EPOCHS"
else
    echo "train skipped: no CIFAR-10 tree at $CIFAR10_DIR and no tarball" | tee -a "$OUT/machine.txt"
    status=1
fi
step table 30 "$PY" benchmarks/gpu/gpu_bench.py table --out "$OUT"
exit $status
