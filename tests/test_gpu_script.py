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


def test_the_training_part_needs_the_data(gpu_bench):
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["train", "--out", "x"])
    args = gpu_bench.parse_args(["train", "--out", "x", "--data", "cifar"])
    assert (args.epochs, args.baseline_epochs, args.batch_size) == (8, 1, 512)
    with pytest.raises(SystemExit):
        gpu_bench.parse_args(["train", "--out", "x", "--data", "cifar", "--epochs", "0"])


def test_every_file_the_script_names_exists():
    """run.sh names its test files and scripts by path: a moved file fails here, not on the GPU."""
    import re

    script = (GPU / "run.sh").read_text()
    paths = set(re.findall(r"(?:tests|benchmarks)/[\w/]+\.(?:py|sh)", script))
    assert "tests/train/test_device_training.py" in paths and "benchmarks/gpu/gpu_bench.py" in paths
    assert [p for p in sorted(paths) if not (ROOT / p).is_file()] == []


def test_the_tables_of_the_results(gpu_bench, tmp_path):
    rows = [{"method": m, "n": n, "dtype": "float32", "status": "ok", "seconds": (2.0 if "dense" in m else 1.0) * n,
             "extra_peak_mib": (8.0 if "dense" in m else 2.0) * n} for m in gpu_bench.LOSS_METHODS for n in (1024, 2048)]
    rows.append({"method": "bidirectional/contrastkit-dense", "n": 4096, "dtype": "float32", "status": "OOM"})
    gpu_bench.write_results(tmp_path, "losses", rows)
    gpu_bench.write_results(tmp_path, "syncs", [
        {"call": "info_nce dense", "validate": True, "forward_syncs": 0, "forward_backward_syncs": 0},
        {"run": "simclr", "step": 1, "syncs": 0, "where": [], "logging": False},
        {"run": "simclr", "step": 3, "syncs": 1, "where": ["loop.py:9"], "logging": True}])
    gpu_bench.write_results(tmp_path, "train", [{"run": "bf16", "epochs": 6, "images_per_second": 12345.6,
                                                 "knn_accuracy": 0.5, "probe_accuracy": 0.6, "command": "c"}])
    assert gpu_bench.main(["table", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "### bidirectional, float32" in text and "tiled / open_clip s" in text
    # tiled / dense: half the time, a quarter of the memory; the dense loss out of memory at 4,096
    assert "| 1,024 | 2048 / 8192 | 1024 / 2048 | 1024 / 2048 | 0.50 | 0.25 | 1.00 | 1.00 |" in text
    assert "| 4,096 | OOM |" in text
    assert "| simclr | 2 | 0 | 1 |" in text and "| bf16 | 6 | 12,346 | 0.500 | 0.600 | `c` |" in text


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
