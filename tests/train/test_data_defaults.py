"""Defaults sized to the data: a run without --batch-size takes a batch that grows with its
training set (60 for the small built-in sets, 256 from 8,192 images on), says so at its start and
records the choice and its reason in config.json; a given batch size (option, --config file, the
saved configuration of a resumed run) always wins."""

import argparse
import json

import numpy as np
import pytest
import torch

from contrastkit.cli import main
from contrastkit.commands import pretrain as pretrain_command
from contrastkit.commands.common import apply_config_file
from contrastkit.data.base import Dataset, Split
from contrastkit.methods import default_batch_size, resolve_for_data
from contrastkit.train import PretrainConfig, pretrain


def test_the_default_batch_grows_with_the_training_set_between_60_and_256():
    assert default_batch_size(120)[0] == 60        # GlyphLab's training scenes: two steps an epoch, as before
    assert default_batch_size(1078)[0] == 60       # digits' training split
    assert default_batch_size(60_000)[0] == 256    # SimCLR's batch on a CIFAR-10 / MNIST-sized set
    assert default_batch_size(40)[0] == 40         # never more than the training set
    previous = 0
    for n in list(range(2, 3000, 7)) + list(range(3000, 70_000, 997)):
        batch, reason = default_batch_size(n)
        assert min(60, n) <= batch <= 256 and batch >= previous, n
        if 60 < batch:
            assert n // batch >= 32 and batch % 8 == 0, n  # an epoch keeps at least 32 steps
        assert f"{n:,} training images" in reason
        previous = batch
    for world in (2, 3, 8):  # under torchrun the global batch splits evenly over the processes
        assert all(default_batch_size(n, world_size=world)[0] % world == 0 for n in (120, 1078, 5000, 60_000))


def _fake_data(n_train, size=8):
    """An in-memory data set whose training split has ``n_train`` images (8x8 gray, two
    classes); the choice of the batch reads its size alone."""
    def split(n):
        labels = torch.arange(n) % 2
        return Split(labels.float().view(n, 1, 1, 1).expand(n, 1, size, size).contiguous() * 0.5, labels)

    return Dataset("fake", ["0", "1"], split(n_train), split(20), split(20))


class _Stop(Exception):
    pass


def _stop_at_the_first_step(split, indices):
    raise _Stop  # the run has chosen its defaults, printed them and written config.json


def _set_up_only(config, dataset):
    with pytest.raises(_Stop):
        pretrain(config, dataset=dataset, views=_stop_at_the_first_step, progress=False)
    with open(f"{config.out}/config.json", encoding="utf-8") as handle:
        return json.load(handle)


def test_a_60000_image_set_gets_the_larger_batch_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    record = _set_up_only(PretrainConfig(out=str(out), device="cpu"), _fake_data(60_000))
    told = capsys.readouterr().err
    assert "batch size 256, chosen for 60,000 training images" in told and "--batch-size sets it" in told
    assert "234 steps an epoch" in told
    assert record["config"]["batch_size"] == 256
    derived = record["derived"]
    assert derived["batch_size"] == 256 and derived["steps_per_epoch"] == 60_000 // 256
    assert derived["defaults"]["train_size"] == 60_000
    assert derived["defaults"]["batch_size"]["value"] == 256
    assert "60,000 training images" in derived["defaults"]["batch_size"]["reason"]
    # The small set of the same kind keeps the old default, and says why too.
    record = _set_up_only(PretrainConfig(out=str(tmp_path / "small"), device="cpu"), _fake_data(120))
    assert record["derived"]["batch_size"] == 60 and record["derived"]["defaults"]["batch_size"]["value"] == 60
    assert "batch size 60, chosen for 120 training images" in capsys.readouterr().err


def test_an_explicit_batch_size_wins_and_nothing_is_chosen(tmp_path, capsys):
    record = _set_up_only(PretrainConfig(out=str(tmp_path / "run"), device="cpu", batch_size=128), _fake_data(60_000))
    assert record["config"]["batch_size"] == 128 and record["derived"]["batch_size"] == 128
    assert record["derived"]["defaults"] == {}
    assert "chosen for" not in capsys.readouterr().err


def _cli_config(*argv):
    parser = argparse.ArgumentParser()
    pretrain_command.add_arguments(parser)
    return pretrain_command.config_from_args(parser.parse_args(list(argv)))


def test_the_command_line_and_a_config_file_give_a_batch_size_that_wins(tmp_path):
    assert _cli_config().batch_size is None                      # left to the data
    assert _cli_config("--batch-size", "32").batch_size == 32
    path = tmp_path / "run.json"
    path.write_text('{"batch-size": 96}', encoding="utf-8")
    parser = argparse.ArgumentParser()
    pretrain_command.add_arguments(parser)
    argv = ["--config", str(path)]
    apply_config_file(parser, argv)
    config = pretrain_command.config_from_args(parser.parse_args(argv))
    assert config.batch_size == 96 and resolve_for_data(config.resolved(), 60_000)[0].batch_size == 96


def _npz(path, n):
    """``n`` 8x8 gray images of two classes a linear read-out separates (dark / bright)."""
    rng = np.random.default_rng(0)
    labels = np.arange(n) % 2
    images = (labels[:, None, None] * 150 + rng.integers(0, 100, size=(n, 8, 8))).astype(np.uint8)
    np.savez(path, x_train=images, y_train=labels, x_test=images[:16], y_test=labels[:16])


def test_resume_keeps_the_chosen_batch_and_its_record(tmp_path, capsys):
    data, out = tmp_path / "set.npz", tmp_path / "run"
    _npz(data, 32)  # 24 training images after the val split: the batch is the whole set (the rule's floor is 60)
    common = ["--out", str(out), "--quiet", "--no-report", "--no-baselines", "--device", "cpu", "--json"]
    assert main(["pretrain", "--data", str(data), "--data-option", "val_fraction=0.25", "--epochs", "1", *common]) == 0
    first = capsys.readouterr()
    assert "batch size 24, chosen for 24 training images: the whole training set" in first.err
    assert json.loads(first.out)["steps"] == 1
    recorded = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert recorded["config"]["batch_size"] == 24 and recorded["derived"]["defaults"]["batch_size"]["value"] == 24
    assert main(["pretrain", "--resume", "--epochs", "2", *common]) == 0
    resumed = capsys.readouterr()
    assert "chosen for" not in resumed.err  # the saved configuration's batch, nothing chosen anew
    assert json.loads(resumed.out)["steps"] == 2
    again = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert again["config"]["batch_size"] == 24 and again["derived"]["batch_size"] == 24
    assert again["derived"]["defaults"] == recorded["derived"]["defaults"]  # the record of the choice is kept
    # A different batch on resume is a different run: refused, naming the key.
    assert main(["pretrain", "--resume", "--epochs", "2", "--batch-size", "12", *common]) == 2
    assert "batch_size: checkpoint 24 vs now 12" in capsys.readouterr().err
