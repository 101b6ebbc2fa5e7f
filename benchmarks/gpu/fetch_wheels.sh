#!/usr/bin/env bash
# Download what benchmarks/gpu/run.sh needs beyond the GPU machine's own Python packages, as
# wheels for that machine (CPython 3.12 on x86-64 Linux; set GPU_PYTHON_VERSION for another):
# kornia and kornia_rs (the views) and the loss benchmark's peers (benchmarks/requirements.txt),
# each without its dependencies (torch, numpy, tqdm are there). Run it where pip reaches the
# package index; run.sh installs them from .whl/ without a network.
#
#   bash benchmarks/gpu/fetch_wheels.sh [DIR]      (DIR defaults to .whl, which git ignores)
set -eu
cd "$(dirname "$0")/../.."
DIR="${1:-.whl}"
PY="${PYTHON:-python3}"
VERSION="${GPU_PYTHON_VERSION:-3.12}"
mkdir -p "$DIR"
platforms=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
           manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
peers=$(grep -v '^\s*#' benchmarks/requirements.txt | grep -v '^\s*tqdm\s*$' | grep -v '^\s*$')
# shellcheck disable=SC2086
"$PY" -m pip download --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
    "${platforms[@]}" -d "$DIR" kornia==0.9.0 kornia_rs==0.2.0 $peers
ls -l "$DIR"
