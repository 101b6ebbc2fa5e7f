#!/usr/bin/env bash
# The GPU run: device-agnostic tests on CUDA, the loss benchmark (dense vs tiled vs peers,
# float32 and bfloat16, N up to 262,144 pairs or the first out-of-memory), the host syncs of
# one loss call, and a training-throughput row. About 6 minutes on one GPU (each part has its
# own time limit; the whole stays under 8). Results: benchmarks/results/gpu/.
#
#   bash benchmarks/gpu/run.sh [PYTHON]      (PYTHON defaults to $PYTHON, then python)
set -u
cd "$(dirname "$0")/../.."
PY="${1:-${PYTHON:-python}}"
OUT=benchmarks/results/gpu
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "benchmarks/gpu/run.sh: no CUDA device is available to $PY (torch.cuda.is_available() is False); this run needs one GPU" >&2
    exit 2
fi
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; } > "$OUT/machine.txt"
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
step tests 90 "$PY" -m pytest -q -p no:cacheprovider --test-device cuda tests/test_losses_device.py \
    --junitxml "$OUT/tests.xml"
step losses 240 "$PY" benchmarks/gpu/gpu_bench.py losses --out "$OUT" --max-n 262144 --budget-s 210
step syncs 60 "$PY" benchmarks/gpu/gpu_bench.py syncs --out "$OUT"
step train 60 "$PY" benchmarks/gpu/gpu_bench.py train --out "$OUT" --steps 30
exit $status
