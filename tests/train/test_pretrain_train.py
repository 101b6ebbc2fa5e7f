"""End-to-end pretraining runs on tiny data: every method, every data kind, resume, refusals."""

import json
import math
import os

import numpy as np
import pytest
import torch

from contrastkit import records as run_records
from contrastkit.cli import main
from contrastkit.data import Dataset, Split, load_dataset
from contrastkit.train import PretrainConfig, pretrain, warmup_cosine

TINY_GLYPHLAB = {"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28}
SUMMARY_KEYS = ("probe_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy", "knn_accuracy",
                "final_loss", "epochs", "seconds")


def tiny_config(out, **overrides):
    options = dict(data="glyphlab", data_options=dict(TINY_GLYPHLAB), epochs=1, batch_size=8,
                   out=str(out), device="cpu", log_every=1)
    options.update(overrides)
    return PretrainConfig(**options)


def _read_jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _check_run_folder(out, summary, epochs):
    for key in SUMMARY_KEYS:
        assert key in summary, key
    for key in ("probe_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy", "knn_accuracy"):
        assert 0.0 <= summary[key] <= 1.0
    assert math.isfinite(summary["final_loss"]) and summary["epochs"] == epochs
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:  # the numbers and the format version
        assert json.load(handle) == json.loads(json.dumps(run_records.summary_to_dict(summary)))
    records = _read_jsonl(os.path.join(out, "metrics.jsonl"))
    epoch_records = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epoch_records] == list(range(1, epochs + 1))
    assert epoch_records[-1]["loss"] == pytest.approx(summary["final_loss"])
    with open(os.path.join(out, "config.json"), encoding="utf-8") as handle:
        stored = json.load(handle)
    assert stored["config"]["method"] == summary["method"]
    state = torch.load(os.path.join(out, "checkpoints", "last.pt"), weights_only=True)
    assert state["epoch"] == epochs
    assert not os.path.exists(os.path.join(out, "checkpoints", "last.pt.tmp"))


@pytest.mark.parametrize("method,views", [("simclr", "augment"), ("moco", "A"), ("supcon", "B"), ("dcl", "augment")])
def test_each_method_runs_on_glyphlab(tmp_path, method, views):
    out = tmp_path / method
    summary = pretrain(tiny_config(out, method=method, views=views, eval_every=1), progress=False)
    _check_run_folder(str(out), summary, 1)
    assert summary["views"] == views
    if method == "dcl":
        pass  # DCL drops the positive from the denominator: its loss may be negative
    else:
        assert summary["final_loss"] > 0
    records = _read_jsonl(out / "metrics.jsonl")
    assert 0.0 <= records[-1]["val_knn_accuracy"] <= 1.0
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 16 // 8 and all(r["images_per_second"] > 0 for r in steps)


def test_digits_subset_and_learnable_temperature(tmp_path):
    full = load_dataset("digits", size=16)

    def first(split, n):
        return Split(split.images[:n].clone(), split.labels[:n].clone())

    dataset = Dataset("digits", full.class_names, first(full.train, 40), first(full.val, 20), first(full.test, 30))
    config = tiny_config(tmp_path / "d", data="digits", data_options={}, learnable_temperature=True,
                         temperature=0.5, lr=0.05, batch_size=20)
    summary = pretrain(config, dataset=dataset, progress=False)
    _check_run_folder(str(tmp_path / "d"), summary, 1)
    assert summary["final_temperature"] != pytest.approx(0.5, abs=1e-7)  # tau received gradient steps


@pytest.mark.parametrize("kind", ["mnist", "cifar10", "imagefolder"])
def test_path_data_kinds(tmp_path, kind):
    from _data_fixtures import write_cifar, write_image_folder, write_mnist

    folder = tmp_path / kind
    if kind == "mnist":
        write_mnist(folder, n_train=40, n_test=20)
        options = {"val_fraction": 0.25}
    elif kind == "cifar10":
        write_cifar(folder, per_batch=10, n_test=20)
        # Read at 16x16 (the loader's resize): raw-pixel features of 768 numbers, not 3,072, which
        # were most of this run's read-out; the loader at the stored size is tests/data's.
        options = {"val_fraction": 0.2, "size": 16}
    else:
        write_image_folder(folder, per_class=10)
        options = {}
    out = tmp_path / "run"
    summary = pretrain(tiny_config(out, data=str(folder), data_options=options), progress=False)
    _check_run_folder(str(out), summary, 1)


def test_npz_path_through_the_cli_and_probe_reproduces_summary(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, size=(24, 12, 12), dtype=np.uint8)
    x_test = rng.integers(0, 255, size=(12, 12, 12), dtype=np.uint8)
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=x_train, y_train=np.arange(24) % 2, x_test=x_test, y_test=np.arange(12) % 2)
    out = tmp_path / "run"
    code = main(["pretrain", "--data", str(path), "--data-option", "val_fraction=0.25", "--epochs", "1",
                 "--batch-size", "8", "--out", str(out), "--quiet", "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0 and "linear probe accuracy" in printed and "random init" in printed
    with open(out / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert main(["probe", str(out), "--json", "--device", "cpu"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("probe_accuracy", "knn_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy"):
        assert again[key] == summary[key], key
    # --resume takes the options not given from OUT/config.json (data, batch size, ...).
    assert main(["pretrain", "--out", str(out), "--resume", "--epochs", "2", "--quiet", "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["epochs"] == 2 and resumed["steps"] == 2 * summary["steps"]


class _Interrupt(Exception):
    pass


def _interrupt_after_first_epoch(epoch, record):
    if epoch == 1:
        raise _Interrupt


@pytest.fixture(scope="module")
def two_epoch_moco(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    config = tiny_config(out, method="moco", epochs=2, learnable_temperature=True, temperature=0.2,
                         data_options=dict(TINY_GLYPHLAB, train_scenes=24))
    summary = pretrain(config, progress=False)
    return config, summary, torch.load(out / "checkpoints" / "last.pt", weights_only=True)


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif isinstance(a[key], dict):
            _assert_same_state(a[key], b[key])


def test_resume_reaches_the_uninterrupted_result(tmp_path, two_epoch_moco):
    config, summary, state = two_epoch_moco
    out = tmp_path / "resumed"
    resumed_config = PretrainConfig(**{**config.to_dict(), "out": str(out)})
    with pytest.raises(_Interrupt):
        pretrain(resumed_config, progress=False, on_epoch_end=_interrupt_after_first_epoch)
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    assert not (out / "summary.json").exists()
    resumed = pretrain(resumed_config, resume=True, progress=False)
    final = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    _assert_same_state(state["model"], final["model"])  # weights, queue, temperature
    _assert_same_state(state["optimizer"]["state"], final["optimizer"]["state"])
    assert final["step"] == state["step"]
    assert resumed["final_loss"] == summary["final_loss"]
    for key in ("probe_accuracy", "knn_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy"):
        assert resumed[key] == summary[key]
    epochs = [r for r in _read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]


def test_same_seed_same_run_other_seed_differs(tmp_path, two_epoch_moco):
    config, summary, state = two_epoch_moco
    again = pretrain(PretrainConfig(**{**config.to_dict(), "out": str(tmp_path / "a")}), progress=False)
    assert again["final_loss"] == summary["final_loss"]
    _assert_same_state(state["model"], torch.load(tmp_path / "a" / "checkpoints" / "last.pt",
                                                  weights_only=True)["model"])
    other = pretrain(PretrainConfig(**{**config.to_dict(), "out": str(tmp_path / "b"), "seed": 1}), progress=False)
    assert other["final_loss"] != summary["final_loss"]


def test_existing_output_is_never_overwritten_without_resume_or_force(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    with pytest.raises(FileExistsError, match="--resume .* --force"):
        pretrain(tiny_config(out), progress=False)
    assert main(["pretrain", "--out", str(out), "--epochs", "1", "--quiet"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.txt"]
    # a folder without a manifest: --force cannot tell a run's files from the user's, and refuses
    with pytest.raises(FileExistsError, match="no contrastkit-manifest.json.*notes.txt"):
        pretrain(tiny_config(out), force=True, progress=False)
    assert sorted(os.listdir(out)) == ["notes.txt"]
    out = tmp_path / "run"
    pretrain(tiny_config(out), progress=False)
    (out / "notes.txt").write_text("my notes")
    pretrain(tiny_config(out), force=True, progress=False)
    assert (out / "notes.txt").read_text() == "my notes"  # --force removes only the run's own files
    first = (out / "summary.json").read_text()
    with pytest.raises(FileExistsError):
        pretrain(tiny_config(out, seed=3), progress=False)
    assert (out / "summary.json").read_text() == first
    pretrain(tiny_config(out, seed=3), force=True, progress=False)
    assert (out / "summary.json").read_text() != first
    with pytest.raises(ValueError, match="exclude"):
        pretrain(tiny_config(out), resume=True, force=True, progress=False)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        pretrain(tiny_config(tmp_path / "empty"), resume=True, progress=False)


def test_corrupt_or_mismatched_checkpoint_is_refused(tmp_path):
    out = tmp_path / "run"
    config = tiny_config(out, epochs=2)
    with pytest.raises(_Interrupt):
        pretrain(config, progress=False, on_epoch_end=_interrupt_after_first_epoch)
    checkpoint = out / "checkpoints" / "last.pt"
    good = checkpoint.read_bytes()
    with pytest.raises(ValueError, match="method: checkpoint 'simclr' vs now 'dcl'") as err:
        pretrain(tiny_config(out, epochs=2, method="dcl"), resume=True, progress=False)
    assert str(checkpoint) in str(err.value)
    checkpoint.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="corrupt") as err:
        pretrain(config, resume=True, progress=False)
    assert str(checkpoint) in str(err.value)
    torch.save({"model": {}}, checkpoint)
    with pytest.raises(ValueError, match="not a contrastkit pretraining checkpoint"):
        pretrain(config, resume=True, progress=False)
    checkpoint.write_bytes(good)
    assert pretrain(config, resume=True, progress=False)["epochs"] == 2


def test_bad_options_are_clear_errors(tmp_path):
    for overrides, message in [({"method": "byol"}, "method must be"), ({"temperature": -1.0}, "temperature"),
                               ({"epochs": 0}, "epochs"), ({"views": "C"}, "views must be"),
                               ({"method": "moco", "queue_size": 12}, "multiple of the batch size")]:
        with pytest.raises(ValueError, match=message):
            pretrain(tiny_config(tmp_path / "x", **overrides), progress=False)
    with pytest.raises(FileNotFoundError):
        pretrain(tiny_config(tmp_path / "y", data=str(tmp_path / "missing.npz")), progress=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # a failed start leaves nothing


def test_warmup_cosine_schedule():
    factor = warmup_cosine(total_steps=6, warmup_steps=2)
    # Warm-up (s + 1) / 2, then 0.5 (1 + cos(pi (s - 2) / 4)).
    expected = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    assert [factor(s) for s in range(6)] == pytest.approx(expected)
