"""``torchrun --nproc-per-node 2 -m contrastkit pretrain`` on a tiny data set (gloo, CPU).

Each launch starts two fresh interpreters and trains and evaluates a tiny model (about a
minute on a 2-core machine for the whole file).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import contrastkit
from contrastkit.train.parallel import Parallel, setup

TINY = ["--data", "glyphlab", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
        "--data-option", "test_scenes=12", "--data-option", "size=28", "--batch-size", "8", "--device", "cpu",
        "--log-every", "1", "--quiet", "--json"]


def _env() -> dict:
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(contrastkit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def torchrun(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    env = _env()
    # --standalone: a local rendezvous on a free port (no fixed port).
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "contrastkit", "pretrain", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _summary(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    start = result.stdout.index("{")
    return json.loads(result.stdout[start:result.stdout.rindex("}") + 1])  # printed by rank 0 only


def _records(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _checkpoint(out):
    return torch.load(os.path.join(out, "checkpoints", "last.pt"), map_location="cpu", weights_only=False)


def _online_numbers_recomputed(out) -> dict:
    """The online read-out of the run's last checkpoint (its encoder, and its online probe's
    head), computed again in this one process."""
    from contrastkit.train.evaluate import readout_views
    from contrastkit.train.online import OnlineProbe, OnlineViewRetrieval
    from contrastkit.train.runs import load_run

    saved = load_run(str(out))
    dataset = saved.load_data()
    model = saved.build_model(dataset.image_shape, torch.device("cpu"))
    config = saved.config
    if dataset.num_classes:
        online = OnlineProbe(model.encoder.out_dim, dataset.num_classes, torch.device("cpu"), seed=config.seed,
                             knn_k=config.knn_k, knn_temperature=config.knn_temperature)
        online.load_state_dict(saved.state["online_probe"])
    else:
        online = OnlineViewRetrieval(readout_views(config, dataset, torch.device("cpu")), torch.device("cpu"),
                                     seed=config.seed)
    return online.evaluate(model.encoder, dataset)


def test_two_process_torchrun_pretrain_writes_one_run_folder_and_resumes(tmp_path):
    out = tmp_path / "run"
    summary = _summary(torchrun(*TINY, "--method", "simclr", "--epochs", "1", "--out", str(out)))
    assert summary["epochs"] == 1 and summary["method"] == "simclr"
    # One run folder, written by rank 0 alone: no per-rank files, no duplicated records.
    assert sorted(os.listdir(out)) == ["checkpoints", "config.json", "config.yaml", "contrastkit-manifest.json",
                                       "explorer.html", "last_batch.pt", "metrics.jsonl", "report.html",
                                       "summary.json"]
    assert sorted(os.listdir(out / "checkpoints")) == ["last.pt", "last.pt.sha256"]  # and its digest
    with open(out / "config.json", encoding="utf-8") as handle:
        assert json.load(handle)["derived"]["world_size"] == 2
    # The report of the first launch was checked above; the resumed one is judged by its records.
    summary = _summary(torchrun("--resume", "--epochs", "2", "--quiet", "--json", "--no-report", "--out", str(out)))
    assert summary["epochs"] == 2
    records = _records(out)
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2]
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == sorted(set(steps)) and len(steps) == records[-1]["step"]
    checkpoint = _checkpoint(out)
    assert checkpoint["world_size"] == 2 and len(checkpoint["rng_per_rank"]) == 2
    # The online read-out (on by default) that the two ranks computed, each its share, is what
    # one process computes from the checkpoint's encoder and head.
    online = {key: value for key, value in summary.items() if key.startswith("online_")}
    assert set(online) == {"online_probe_accuracy", "online_knn_accuracy"}
    assert online == _online_numbers_recomputed(out)
    assert checkpoint["online_probe"]["steps"] == summary["steps"]


def test_two_process_torchrun_trains_on_an_unlabeled_collection_and_names_every_damaged_file(tmp_path):
    from _data_fixtures import write_collection

    # 60 images and four empty .jpg files: a training split of 40 files (4 damaged), so that each
    # rank reads 20 of them (5 steps of 4) and every damaged one is met by one rank or the other;
    # fake.png lies in the test split, which rank 0's read-out and report read.
    damaged = ["zero.jpg", "zero1.jpg", "zero2.jpg", "zero3.jpg", "fake.png"]
    data = write_collection(tmp_path / "photos", 60, damaged)
    out = tmp_path / "run"
    result = torchrun("--data", str(data), "--batch-size", "8", "--device", "cpu", "--log-every", "1", "--quiet",
                      "--json", "--epochs", "1", "--out", str(out))
    summary = _summary(result)
    with open(out / "config.json", encoding="utf-8") as handle:
        derived = json.load(handle)["derived"]
    assert derived["world_size"] == 2 and derived["dataset"]["num_classes"] == 0
    assert derived["dataset"]["sizes"]["train"] == 40
    for prefix in ("", "random_init_", "raw_pixel_"):
        assert 0 <= summary[prefix + "view_retrieval_top1"] <= 1
    assert "probe_accuracy" not in summary and summary["steps"] == 5
    online = {key: value for key, value in summary.items() if key.startswith("online_")}
    assert set(online) == {"online_view_retrieval_top1", "online_view_retrieval_top5"}
    assert online == _online_numbers_recomputed(out)  # the two ranks' shares: one process's numbers
    # Each rank skipped the damaged files of its own batches; rank 0 names them all, once.
    named = [line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines()]
    assert sorted(os.path.basename(path) for path in named) == sorted(damaged)
    assert summary["skipped_files"] == len(damaged)
    assert "no report written" not in result.stderr and (out / "report.html").is_file()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc (Linux)")
def test_data_parallel_pretrain_leaves_no_backend_threads_behind(tmp_path):
    # A process group whose backend outlives destroy_process_group (held by a DDP wrapper in a
    # reference cycle, or by a module imported while the group existed) keeps its threads
    # running into the interpreter's shutdown, where tearing them down can abort a rank that
    # finished its work: the launch then fails now and then, after a complete run.
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torchrun_threads.py")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             script, str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        with open(tmp_path / f"threads_{rank}.json", encoding="utf-8") as handle:
            threads = json.load(handle)
        assert threads["during"] and all(threads["during"]), threads  # the backend's threads are seen
        assert threads["after"] == [], threads


def test_resumed_data_parallel_run_ends_with_the_uninterrupted_weights(tmp_path):
    import distributed_workers as W

    options = dict(data="glyphlab", data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 12,
                                                  "size": 28},
                   method="moco", epochs=2, batch_size=8, device="cpu", log_every=1)
    straight, interrupted = str(tmp_path / "straight"), str(tmp_path / "interrupted")
    results = W.spawn(W.pretrain_worker, 2, tmp_path, options, straight, interrupted)
    assert results[0]["straight"]["epochs"] == 2 and results[1]["straight"] is None  # rank 0 reports
    for r in results:
        assert r["stopped"]
        assert r["overwrite"] is not None and "not empty" in r["overwrite"]  # refused on every rank
    assert results[0]["resumed"]["epochs"] == 2
    a, b = _checkpoint(straight), _checkpoint(interrupted)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert results[0]["resumed"]["final_loss"] == results[0]["straight"]["final_loss"]


def test_without_torchrun_training_is_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    parallel = setup(torch.device("cpu"))
    assert parallel == Parallel() and not parallel.active and parallel.is_main
    assert parallel.gather_objects("x") == ["x"]
    assert float(parallel.mean(torch.tensor(3.0))) == 3.0
    assert parallel.run_on_main(lambda: 5) == 5
