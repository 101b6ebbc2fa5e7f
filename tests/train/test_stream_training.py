"""Training from a stream (tar shards, ``contrastkit.data.shards``): a run preempted by
SIGTERM in the middle of an epoch resumes to the uninterrupted run's weights and summary, in
one process and with DataLoader workers; a damaged sample is skipped and named by its key;
what cannot read a stream is refused before any work, naming the option."""

import json
import os

import pytest
import torch

from contrastkit.cli import main
from contrastkit.data import open_tar_shards, split_of_key
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.train.faults import Preempted

from _shards import add_damaged_shard, write_shards
from _tiny_run import preempted_at_backward, without_timings


def _config(data, out, **overrides):
    options = dict(data=data, data_options={"size": 16}, epochs=2, batch_size=8, out=str(out), device="cpu",
                   log_every=1, checkpoint_every=0)
    options.update(overrides)
    return PretrainConfig(**options)


def _weights(out):
    state = torch.load(os.path.join(out, "checkpoints", "last.pt"), map_location="cpu", weights_only=False)
    return state["model"]



@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("stream"))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_preempted_mid_epoch_resumes_to_the_uninterrupted_run(shards, tmp_path, monkeypatch, workers):
    straight = pretrain(_config(shards, tmp_path / "straight", workers=workers), progress=False, baselines=False)
    steps_per_epoch = straight["steps"] // 2
    assert steps_per_epoch >= 4
    # Step 3 of epoch 2: mid-epoch, and (with 2 workers) a batch of the second worker next.
    restore = preempted_at_backward(monkeypatch, steps_per_epoch + 3)
    with pytest.raises(Preempted):
        pretrain(_config(shards, tmp_path / "stopped", workers=workers), progress=False, baselines=False)
    restore()
    stopped = torch.load(tmp_path / "stopped" / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert (stopped["epoch"], stopped["epoch_step"]) == (1, 3)
    assert stopped["data_per_rank"][0]["workers"] == max(1, workers)
    resumed = pretrain(_config(shards, tmp_path / "stopped", workers=workers), resume=True, progress=False,
                       baselines=False)
    assert without_timings(resumed) == without_timings(straight)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "stopped")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    derived = json.loads((tmp_path / "straight" / "config.json").read_text())["derived"]
    assert derived["stream"]["train_samples"] == open_tar_shards(shards).train.num_samples
    assert derived["steps_per_epoch"] == steps_per_epoch == derived["stream"]["train_samples"] // 8


def test_resuming_a_stream_mid_epoch_with_other_workers_is_refused_naming_the_option(shards, tmp_path, monkeypatch):
    restore = preempted_at_backward(monkeypatch, 2)
    with pytest.raises(Preempted):
        pretrain(_config(shards, tmp_path / "run", epochs=1), progress=False, baselines=False)
    restore()
    with pytest.raises(ValueError, match="--workers 0 or 1; resume it with the same number \\(now 2\\)"):
        pretrain(_config(shards, tmp_path / "run", epochs=1, workers=2), resume=True, progress=False,
                 baselines=False)


def test_the_stream_command_line_run_names_each_damaged_sample_by_key(tmp_path, capsys):
    data = write_shards(tmp_path, per_class=16)
    damaged = add_damaged_shard(data)
    with open(os.path.join(data, "zz-truncated.tar"), "wb") as handle:  # a shard cut off in its first header
        handle.write(b"\0" * 100 + b"ustar")
    train_samples = open_tar_shards(data).train.num_samples
    # A batch that divides the training samples: the one epoch reads every one of them.
    batch = next(b for b in range(8, 1, -1) if train_samples % b == 0)
    out = tmp_path / "run"
    assert main(["pretrain", "--data", data, "--data-option", "size=16", "--epochs", "1", "--batch-size", str(batch),
                 "--device", "cpu", "--quiet", "--no-report", "--out", str(out)]) == 0
    named = [line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines()]
    # train ones met by the stream, val and test ones read after training, the damaged shard when opened
    assert sorted(named) == sorted(damaged + ["zz-truncated.tar"])
    assert sorted(split_of_key(key) == "train" for key in damaged) == [False, False, True, True]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_files"] == len(damaged) + 1
    assert "skipped 5 damaged image file(s)" in capsys.readouterr().err


@pytest.mark.parametrize("options, option", [
    ({"data_on_device": "on"}, "--data-on-device on"),
    ({"train_limit": 10}, "--train-limit"),
    ({"temperature_method": "individual"}, "--temperature-method individual"),
    ({"workers": 9}, "lower --workers \\(now 9\\)"),
], ids=["on-device", "train-limit", "per-sample-temperature", "more-readers-than-shards"])
def test_what_cannot_read_a_stream_is_refused_before_any_work(shards, tmp_path, options, option):
    with pytest.raises(ValueError, match=option):
        pretrain(_config(shards, tmp_path / "run", **options), progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_lightning_data_module_refuses_a_stream_in_one_line(shards):
    pytest.importorskip("lightning")
    from contrastkit.integrations.lightning import ContrastiveDataModule

    with pytest.raises(ValueError, match="ContrastiveDataModule reads the training split by sample index.*is iterable"):
        ContrastiveDataModule.from_config(_config(shards, "unused"))
    with pytest.raises(ValueError, match="ContrastiveDataModule reads the training split by sample index"):
        ContrastiveDataModule(open_tar_shards(shards))


def test_probe_of_a_stream_run_reads_the_runs_read_out_sample(shards, tmp_path):
    from contrastkit.train import evaluate_run

    summary = pretrain(_config(shards, tmp_path / "run", epochs=1), progress=False, baselines=False)
    again = evaluate_run(str(tmp_path / "run"), baselines=False)
    assert again["probe_accuracy"] == summary["probe_accuracy"] and again["knn_accuracy"] == summary["knn_accuracy"]


def test_embed_and_neighbors_of_a_stream_run_name_rows_by_sample_key(shards, tmp_path, capsys):
    """A run trained from shards: ``embed`` writes a row for every sample of the shards (the
    training stream's included), named ``SHARD/key``; ``neighbors`` finds a training image's own
    sample first and names it by its key."""
    import numpy as np

    out = tmp_path / "run"
    pretrain(_config(shards, out, epochs=1), progress=False, baselines=False)
    assert main(["embed", str(out), "--out", str(tmp_path / "rows.npz")]) == 0
    rows = np.load(tmp_path / "rows.npz")
    total = open_tar_shards(shards)
    expected = total.train.num_samples + len(total.val) + len(total.test)
    assert rows["h"].shape[0] == expected and all("/" in str(name) and str(name).split("/")[0].endswith(".tar")
                                                  for name in rows["names"])
    key = str(rows["names"][0])
    query = tmp_path / "query.png"
    shard, name = key.split("/")
    import tarfile

    with tarfile.open(os.path.join(shards, shard)) as tar:
        query.write_bytes(tar.extractfile(f"{name}.png").read())
    capsys.readouterr()
    assert main(["neighbors", str(out), str(query), "--k", "1", "--no-picture"]) == 0
    assert key in capsys.readouterr().out


def test_contrastkit_shard_then_pretrain_with_the_held_out_shards_as_eval_data(tmp_path):
    """The flow of docs/data.md: ``contrastkit shard`` writes a tree's train and test parts as two
    shard sets; ``pretrain`` trains on every training shard and takes val and test (the probe's
    test) from the held-out ones. ``--eval-data`` beside labelled data that is not shards is
    refused rather than ignored."""
    from _shards import write_image_tree

    tree = tmp_path / "tree"
    write_image_tree(str(tree / "train"), classes=3, per_class=12, size=16, seed=1)
    write_image_tree(str(tree / "test"), classes=3, per_class=6, size=16, seed=2)
    shards = tmp_path / "shards"
    assert main(["shard", str(tree), str(shards), "--shard-size", "6", "--quiet"]) == 0
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(shards / "train"), "--eval-data", str(shards / "test"), "--data-option",
                 "size=16", "--epochs", "1", "--batch-size", "6", "--device", "cpu", "--quiet", "--no-report",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    derived = json.loads((out / "config.json").read_text())["derived"]
    assert derived["stream"]["train_samples"] == 36  # every training sample trains
    assert 0.0 <= summary["probe_accuracy"] <= 1.0
    with pytest.raises(ValueError, match="--eval-data judges an encoder trained on unlabeled data"):
        pretrain(_config(str(tree / "train"), tmp_path / "refused", eval_data=str(shards / "test")), progress=False,
                 baselines=False)
