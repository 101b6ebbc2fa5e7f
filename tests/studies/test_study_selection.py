"""Train subsets and the read-out protocol of the textbook, section 30.2, exercise F5 (val picks
the epoch, test is read once), through ``pretrain``."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from contrastkit.cli import main
from contrastkit.data import load_dataset, stratified_subset, stratified_subset_indices
from contrastkit.data.base import Split
from contrastkit.data.paired import PairedSplit
from contrastkit.models import build_encoder
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.train import loop as loop_module
from contrastkit.metrics.readout import evaluate_encoders
from contrastkit.train.selection import EpochSelection, selected_numbers

from _data_fixtures import CIFAR_TARBALL, cifar_subset

# The project's real data live in shared/data next to (or inside) the checkout; an environment
# variable may point elsewhere.


def _split(labels):
    labels = torch.tensor(labels, dtype=torch.long)
    images = torch.arange(labels.numel(), dtype=torch.float32).div(labels.numel()).view(-1, 1, 1, 1)
    return Split(images=images, labels=labels)


# ------------------------------------------------------------------------------ stratified_subset

def test_stratified_subset_keeps_class_shares_and_is_deterministic():
    split = _split([0] * 60 + [1] * 30 + [2] * 10)
    part = stratified_subset(split, 20, seed=3)
    assert len(part) == 20
    assert np.bincount(part.labels.numpy()).tolist() == [12, 6, 2]
    again = stratified_subset(split, 20, seed=3)
    assert torch.equal(part.images, again.images) and torch.equal(part.labels, again.labels)
    other = stratified_subset(split, 20, seed=4)
    assert not torch.equal(part.images, other.images)
    # images and labels stay paired: image value i / n belongs to label i
    index = (part.images.flatten() * 100).round().long()
    assert torch.equal(split.labels[index], part.labels)


def test_stratified_subset_whole_split_and_bad_size():
    split = _split([0, 1] * 5)
    assert stratified_subset(split, 10, seed=0) is split
    assert stratified_subset(split, 50, seed=0) is split
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        stratified_subset(split, 0, seed=0)


def test_stratified_subset_paired_split_keeps_texts_with_images():
    images = torch.rand(12, 1, 4, 4)
    texts = [f"text {i}" for i in range(12)]
    split = PairedSplit(images=images, texts=texts, labels=torch.tensor([0, 1] * 6))
    part = stratified_subset(split, 4, seed=1)
    assert len(part) == 4 and len(part.texts) == 4
    for image, text in zip(part.images, part.texts):
        assert torch.equal(image, images[int(text.split()[1])])
    # without labels: a uniform draw, also deterministic
    unlabelled = stratified_subset_indices(None, 12, 5, seed=2)
    assert unlabelled.tolist() == stratified_subset_indices(None, 12, 5, seed=2).tolist() and unlabelled.size == 5


def test_train_limit_applies_to_pretrain_and_is_recorded(tmp_path):
    out = tmp_path / "run"
    config = PretrainConfig(epochs=1, batch_size=20, train_limit=40, val_limit=30, test_limit=60, out=str(out))
    summary = pretrain(config, progress=False, baselines=False)
    stored = json.loads((out / "config.json").read_text())
    assert stored["config"]["train_limit"] == 40 and stored["config"]["subset_seed"] == 0
    assert stored["derived"]["dataset"]["sizes"] == {"train": 40, "val": 30, "test": 60}
    assert summary["steps"] == 2  # 40 images / batch 20


def test_cli_rejects_a_bad_train_limit(capsys):
    assert main(["pretrain", "--train-limit", "1", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_limit" in err[0]


# ------------------------------------------------------------------------------ epoch selection

def test_epoch_selection_keeps_the_earliest_best_and_round_trips():
    model = torch.nn.Linear(2, 2)
    selection = EpochSelection()
    for epoch, score in ((1, 0.5), (2, 0.8), (3, 0.8), (4, 0.7)):
        with torch.no_grad():
            model.weight.fill_(epoch)
        selection.observe(epoch, score, model)
    assert selection.best_epoch == 2
    assert float(selection.best_state["weight"][0, 0]) == 2.0
    restored = EpochSelection()
    restored.load_state_dict(copy.deepcopy(selection.state_dict()))
    assert restored.best_epoch == 2 and restored.scores == [0.5, 0.8, 0.8, 0.7]
    with pytest.raises(ValueError, match="inconsistent"):
        EpochSelection().load_state_dict({"epochs": [1], "scores": [0.5], "best_epoch": 1, "best_state": None})


def _peaking_val_probe(monkeypatch, scores):
    """Patch the loop's val score: ``scores[k]`` at the (k+1)-th evaluation; keep each encoder seen."""
    seen = []

    def fake(encoder, dataset, device, *, seed=0, **options):
        seen.append(copy.deepcopy(encoder.state_dict()))
        return scores[len(seen) - 1]

    monkeypatch.setattr(loop_module, "val_probe_accuracy", fake)
    return seen


def test_a_run_whose_val_peaks_early_reports_that_epoch(tmp_path, monkeypatch):
    seen = _peaking_val_probe(monkeypatch, [0.6, 0.9, 0.5, 0.4])
    config = PretrainConfig(epochs=4, eval_every=1, batch_size=20, train_limit=60, out=str(tmp_path / "run"))
    summary = pretrain(config, progress=False, baselines=False)
    assert summary["selected_epoch"] == 2
    assert summary["selection"]["epochs"] == [1, 2, 3, 4]
    assert summary["selection"]["scores"] == [0.6, 0.9, 0.5, 0.4]
    # The selected numbers are the test read-out of the epoch-2 encoder, not of the last one.
    dataset = load_dataset("glyphlab", seed=0)
    from contrastkit.methods import limit_data as limit_splits

    dataset = limit_splits(dataset, config.resolved())
    encoder = build_encoder("small", 1)
    encoder.load_state_dict(seen[1])
    expected = evaluate_encoders(dataset, encoder, torch.device("cpu"), raw_pixels=False)
    assert summary["selected"]["probe_accuracy"] == expected["probe_accuracy"]
    assert summary["selected"]["knn_accuracy"] == expected["knn_accuracy"]
    assert any(not torch.equal(seen[1][k], seen[3][k]) for k in seen[1])
    assert summary["selected"]["representation"]["z"]["uniformity"] != summary["representation"]["z"]["uniformity"]
    assert selected_numbers(summary) is summary["selected"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val_probe_accuracy"] for r in records if r["kind"] == "epoch"] == [0.6, 0.9, 0.5, 0.4]


def test_without_eval_every_the_last_epoch_is_selected(tmp_path):
    summary = pretrain(PretrainConfig(epochs=1, batch_size=20, train_limit=40, out=str(tmp_path / "run")),
                       progress=False, baselines=False)
    assert summary["selected_epoch"] == 1 and summary["selection"] is None
    assert summary["selected"]["probe_accuracy"] == summary["probe_accuracy"]
    with pytest.raises(ValueError, match="without the numbers of its selected epoch"):
        selected_numbers({"probe_accuracy": 0.5})  # no selected block: not a summary of this contrastkit


def test_the_selection_survives_a_resume(tmp_path, monkeypatch):
    scores = [0.9, 0.5, 0.6, 0.4]
    config = dict(epochs=4, eval_every=1, batch_size=20, train_limit=40)
    _peaking_val_probe(monkeypatch, scores)
    whole = pretrain(PretrainConfig(**config, out=str(tmp_path / "whole")), progress=False, baselines=False)

    _peaking_val_probe(monkeypatch, scores)

    def stop(epoch, record):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pretrain(PretrainConfig(**config, out=str(tmp_path / "cut")), progress=False, baselines=False,
                 on_epoch_end=stop)
    _peaking_val_probe(monkeypatch, scores[2:])
    resumed = pretrain(PretrainConfig(**config, out=str(tmp_path / "cut")), resume=True, progress=False,
                       baselines=False)
    assert resumed["selected_epoch"] == whole["selected_epoch"] == 1
    assert resumed["selection"] == whole["selection"]
    assert resumed["selected"]["probe_accuracy"] == whole["selected"]["probe_accuracy"]


# ------------------------------------------------------------------------------ CIFAR-10 (when present)



@pytest.mark.skipif(not CIFAR_TARBALL, reason="the CIFAR-10 JPEG tarball (shared/data/cifar10-jpeg.tar.gz next to "
                                              "the checkout, or $CONTRASTKIT_CIFAR10_TARBALL) is not present")
def test_cifar10_subset_runs_with_epoch_selection(tmp_path):
    data = cifar_subset(tmp_path / "cifar", per_class=16)
    summary = pretrain(PretrainConfig(data=str(data), epochs=2, eval_every=1, batch_size=32, train_limit=80,
                                      out=str(tmp_path / "run")), progress=False, baselines=False)
    stored = json.loads((tmp_path / "run" / "config.json").read_text())["derived"]["dataset"]
    assert stored["num_classes"] == 10 and stored["image_shape"] == [3, 32, 32]
    assert stored["sizes"]["train"] == 80
    assert summary["selected_epoch"] in (1, 2) and len(summary["selection"]["scores"]) == 2
