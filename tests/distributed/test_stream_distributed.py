"""Data-parallel training from a stream (tar shards) in two processes: a run stopped by SIGTERM
on one rank in the middle of an epoch resumes to the uninterrupted run's weights; under
``torchrun`` a damaged sample met by either rank is named in ``skipped.txt``."""

import json
import os

import torch

from _shards import write_planned_shards, write_shards
from _tiny_run import without_timings
from test_distributed_torchrun import torchrun


def _model(out):
    return torch.load(os.path.join(out, "checkpoints", "last.pt"), map_location="cpu", weights_only=False)["model"]


def test_a_data_parallel_stream_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path):
    import distributed_workers as W

    data = write_shards(tmp_path)
    options = dict(data=data, data_options={"size": 16}, epochs=2, batch_size=8, device="cpu", log_every=1,
                   workers=1, checkpoint_every=0)
    straight, interrupted = str(tmp_path / "straight"), str(tmp_path / "interrupted")
    # 2 processes x 4 images: an epoch of (train samples // 2) // 4 steps; stopped during step 7,
    # in the middle of epoch 2.
    from contrastkit.data import open_tar_shards

    per_epoch = open_tar_shards(data).train.num_samples // 2 // 4
    assert per_epoch < 7 - 1 and 7 < 2 * per_epoch
    results = W.spawn(W.stream_worker, 2, tmp_path, options, straight, interrupted, 7)
    assert [r["stopped_at"] for r in results] == [7, 7]  # every rank stops at the agreed step
    assert results[0]["straight"]["steps"] == 2 * per_epoch and results[1]["straight"] is None
    assert without_timings(results[0]["resumed"]) == without_timings(results[0]["straight"])
    a, b = _model(straight), _model(interrupted)
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def test_torchrun_trains_on_a_stream_and_names_the_damaged_samples_of_both_ranks(tmp_path):
    # Two shards of 8 training samples (one damaged in each), one shard held out: each epoch
    # each rank reads one training shard whole (8 samples, 4 steps of 2), so both ranks meet a
    # damaged sample; the held-out one is met when the read-out's splits are read.
    data = str(tmp_path / "shards")
    damaged = write_planned_shards(data, [{"train": 7, "damaged_train": 1}, {"train": 7, "damaged_train": 1},
                                          {"held": 12, "damaged_held": 1}])
    out = tmp_path / "run"
    result = torchrun("--data", data, "--data-option", "size=16", "--epochs", "2", "--batch-size", "4",
                      "--device", "cpu", "--quiet", "--json", "--no-report", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    derived = json.loads((out / "config.json").read_text())["derived"]
    assert derived["world_size"] == 2 and derived["stream"]["train_samples"] == 16
    assert derived["steps_per_epoch"] == 4
    named = sorted(line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines())
    assert named == sorted(damaged)
