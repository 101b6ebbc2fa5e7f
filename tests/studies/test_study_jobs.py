"""Study grids run several runs at once (``--jobs``) and share a folder between processes:
the same numbers as one run at a time, a locked run folder is left to its holder and waited for,
a bad ``--jobs`` is refused before anything is written, and ``--jobs 0`` (the default) chooses
from the runs left, the cores and the memory."""

import csv
import fcntl
import json
import os
import threading
import time

import pytest

from contrastkit import layout, records
from contrastkit.cli import main
from contrastkit.studies import RunSpec, run_grid
from contrastkit.studies.grid import RunBusy, _execute, _run_lock

TINY = ["--epochs", "1", "--batch-size", "8", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
        "--data-option", "test_scenes=15", "--no-progress", "--threads", "1", "--no-variants"]
TINY_CONFIG = {"data": "glyphlab", "data_options": {"train_scenes": 16, "val_scenes": 9, "test_scenes": 15},
               "epochs": 1, "batch_size": 8, "threads": 1}


def sweep_rows(out):
    with open(os.path.join(out, "sweep.csv"), encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_two_jobs_give_the_numbers_of_one(tmp_path, capsys):
    serial, parallel = str(tmp_path / "serial"), str(tmp_path / "parallel")
    grid = ["--temperatures", "0.5,0.1", "--seeds", "2"]
    assert main(["sweep", "--out", serial, "--jobs", "1"] + grid + TINY) == 0  # one at a time, in this process
    assert main(["sweep", "--out", parallel, "--jobs", "2"] + grid + TINY) == 0
    rows_1, rows_2 = sweep_rows(serial), sweep_rows(parallel)
    assert len(rows_1) == 4  # 2 tau x 2 seeds
    for a, b in zip(rows_1, rows_2):
        for key in ("tau", "probe_accuracy", "knn_accuracy", "z_uniformity", "final_loss"):
            if key in a:
                assert a[key] == b[key], key
    # every run folder of the parallel sweep is a complete run
    for name in os.listdir(os.path.join(parallel, layout.RUNS)):
        assert os.path.isfile(layout.RunFolder(os.path.join(parallel, layout.RUNS, name)).summary)


def test_a_locked_run_is_refused_without_waiting(tmp_path):
    run_dir = str(tmp_path / "runs" / "a")
    spec = RunSpec("a", "r", "c", dict(TINY_CONFIG))
    with _run_lock(run_dir, wait_for_it=False):
        with pytest.raises(RunBusy):
            _execute(spec, run_dir, False)
    assert not os.path.exists(layout.RunFolder(run_dir).summary)  # nothing was trained


def test_a_run_held_by_another_process_is_waited_for_and_not_trained_twice(tmp_path):
    runs = str(tmp_path / "runs")
    held = os.path.join(runs, "held")
    os.makedirs(held)
    # A finished run's summary as the other process's contrastkit writes it (a current record).
    fake = {"epochs": 1, "steps": 2, "method": "simclr", "data": "glyphlab", records.PROBE_ACCURACY: 0.123,
            "written_by": "the other process"}
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: conflicts with the grid's flock

    def other_process_finishes():
        time.sleep(1.0)
        # Written whole, as contrastkit writes it (a temporary file, then a rename): the grid
        # may read the summary the moment the free run is done, without the lock.
        summary = layout.RunFolder(held).summary
        with open(f"{summary}.tmp", "w", encoding="utf-8") as handle:
            json.dump(records.summary_to_dict(fake), handle)
        os.replace(f"{summary}.tmp", summary)
        os.close(fd)

    holder = threading.Thread(target=other_process_finishes)
    holder.start()
    specs = [RunSpec("held", "r", "c", dict(TINY_CONFIG)), RunSpec("free", "r", "c", dict(TINY_CONFIG))]
    run_grid(specs, runs, title="t", progress=False, cell=lambda s: "x", jobs=1)  # in this process
    holder.join()
    assert specs[0].summary == fake  # read from the holder's run, not retrained
    assert "probe_accuracy" in specs[1].summary and specs[1].summary != fake
    assert os.listdir(held) == [os.path.basename(layout.RunFolder(held).summary)]


@pytest.mark.parametrize("value", ["-1", "-4"])
def test_bad_jobs_is_refused_before_anything_is_written(tmp_path, capsys, value):
    out = tmp_path / "out"
    assert main(["sweep", "--out", str(out), "--jobs", value] + TINY) == 2
    assert "--jobs" in capsys.readouterr().err
    assert not out.exists()


def _specs(count, **config):
    return [RunSpec(f"r{i}", "row", f"c{i}", {**TINY_CONFIG, "device": "cpu", **config}) for i in range(count)]


@pytest.mark.parametrize("cores, memory_gib, runs, threads, expected", [
    (8, 64, 5, None, 5),    # runs left
    (8, 64, 20, None, 8),   # cores, one thread per run
    (8, 64, 20, 4, 2),      # cores, the threads a run asks for
    (8, 5, 20, None, 2),    # memory: 2 GiB per run
    (8, 1, 20, None, 1),    # never below one
])
def test_the_default_jobs_fit_the_runs_the_cores_and_the_memory(monkeypatch, tmp_path, cores, memory_gib, runs,
                                                                threads, expected):
    from contrastkit.studies import grid
    from contrastkit.train import setup

    monkeypatch.setattr(setup, "resolve_threads", lambda threads: cores)
    monkeypatch.setattr(grid, "_available_memory", lambda: memory_gib * 2**30)
    specs = _specs(runs, threads=threads)
    assert grid.resolve_jobs(0, specs, str(tmp_path)) == expected
    assert grid.resolve_jobs(3, specs, str(tmp_path)) == 3  # asked for: as asked
    with pytest.raises(ValueError, match="--jobs"):
        grid.resolve_jobs(2.5, specs, str(tmp_path))


def test_the_default_jobs_count_only_runs_left_and_keep_a_gpu_to_one(monkeypatch, tmp_path):
    from contrastkit.studies import grid
    from contrastkit.train import setup

    monkeypatch.setattr(setup, "resolve_threads", lambda threads: 8)
    monkeypatch.setattr(grid, "_available_memory", lambda: None)  # unknown: no memory cap
    specs = _specs(6)
    for spec in specs[:4]:  # finished runs need no process
        folder = layout.RunFolder(tmp_path / spec.name)
        os.makedirs(folder.root)
        open(folder.summary, "w").close()
    assert grid.resolve_jobs(0, specs, str(tmp_path)) == 2
    import torch

    monkeypatch.setattr(setup, "resolve_device", lambda name: torch.device("cuda" if name == "cuda" else "cpu"))
    assert grid.resolve_jobs(0, _specs(6, device="cuda"), str(tmp_path)) == 1
