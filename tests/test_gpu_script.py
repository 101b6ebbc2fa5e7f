"""The CPU-checkable parts of the GPU run (benchmarks/gpu): argument handling, the result
writer, the sync counter off CUDA, and the refusal without a CUDA device."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", GPU / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(gpu_bench):
    args = gpu_bench.parse_args(["losses", "--out", "x"])
    assert (args.max_n, args.budget_s) == (262144, 240.0)
    assert gpu_bench.sizes_up_to(262144) == [1024 * 2**i for i in range(9)]
    assert gpu_bench.sizes_up_to(5000) == [1024, 2048, 4096]
    with pytest.raises(ValueError, match="max-n"):
        gpu_bench.parse_args(["losses", "--out", "x", "--max-n", "100"])
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["losses", "--out", "x", "--budget-s", "0"])
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["nonsense", "--out", "x"])
    assert gpu_bench.main(["losses", "--out", "x", "--max-n", "100"]) == 2


def test_result_writer(gpu_bench, tmp_path):
    path = gpu_bench.write_results(tmp_path / "gpu", "losses", [{"n": 1024, "seconds": 0.5}, {"n": 2048}])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert path == tmp_path / "gpu" / "losses.jsonl"
    assert [r["n"] for r in rows] == [1024, 2048]
    assert rows[0]["machine"]["torch"] == torch.__version__
    with pytest.raises(ValueError, match="file stem"):
        gpu_bench.write_results(tmp_path, "../escape", [])


def test_sync_counter_is_a_no_op_off_cuda(gpu_bench):
    called = []
    assert gpu_bench.count_syncs(lambda: called.append(1), torch.device("cpu")) is None
    assert called == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_cuda(gpu_bench):
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_bench.require_cuda()
    done = subprocess.run(["bash", str(GPU / "run.sh"), sys.executable], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr
    assert not (ROOT / "benchmarks" / "results" / "gpu" / "machine.txt").exists()
