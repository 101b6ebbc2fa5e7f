"""A data-parallel run (2 gloo processes on the CPU) on an unlabeled collection whose damaged
files leave one rank's batch with fewer than 2 readable images: every rank skips that step
together and the run ends with the same steps on every rank (``tests/short_batch_workers.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(ROOT / "tests" / "short_batch_workers.py")


def _two_ranks(tmp_path: Path, data: Path, out: Path, timeout: int) -> list:
    """The worker on ranks 0 and 1, each in a session of its own: past ``timeout`` both are
    killed and the test fails (a hang), as it does when a rank fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    ranks = [subprocess.Popen([sys.executable, WORKER, str(rank), "2", str(tmp_path / "init"), str(data), str(out),
                               str(tmp_path / f"result_{rank}.json")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
             for rank in (0, 1)]
    logs = []
    try:
        for child in ranks:
            logs.append(child.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for child in ranks:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
        pytest.fail(f"the ranks did not finish in {timeout} s (a hang): "
                    + " | ".join(child.communicate()[0][-1500:] for child in ranks))
    for rank, (child, log) in enumerate(zip(ranks, logs)):
        assert child.returncode == 0, f"rank {rank}: {log[-3000:]}"
    return [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]


def test_a_batch_left_short_of_readable_images_on_one_rank_is_skipped_by_every_rank(tmp_path):
    from _data_fixtures import write_collection
    from contrastkit.data import open_data
    from contrastkit.data.loader import EpochBatchSampler

    photos = write_collection(tmp_path / "photos", 40, damaged=())
    train = open_data(photos).train
    # A global batch of 8: 4 images a rank, 3 steps an epoch. Rank 1 draws the batches the
    # sampler gives it; its first loses every image, its second all but one (BatchNorm, and
    # the loss, need 2); rank 0's batches are whole.
    sampler = EpochBatchSampler(len(train), 4, 0, rank=1, world_size=2)
    sampler.set_epoch(0)
    first, second, _ = list(sampler)
    damaged = [train.path(index) for index in first + second[:3]]
    for path in damaged:
        Path(path).write_bytes(b"")
    out = tmp_path / "run"
    results = _two_ranks(tmp_path, photos, out, timeout=150)
    # Every rank ran the epoch's 3 steps (2 of them skipped by both), so none waited for another.
    assert [result["ended_at"] for result in results] == [[3], [3]]
    summary = results[0]["summary"]
    assert summary["steps"] == 3 and summary["skipped_batches"] == 2 and summary["skipped_files"] == len(damaged)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = [record for record in records if record["kind"] == "skipped"]
    assert [record["step"] for record in skipped] == [1, 2]
    assert all("fewer than 2 readable images" in record["reason"] for record in skipped)
    assert [record["step"] for record in records if record["kind"] == "step"] == [3]
    # The damaged files are named, once each, whichever rank met them.
    named = [line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines()]
    assert sorted(named) == sorted(str(path) for path in damaged)
