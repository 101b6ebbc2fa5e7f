"""Run folders written before the configuration's data choices became a record of their own
still read back: ``probe``, ``embed``, ``export`` and ``neighbors`` on them work, and one this
version cannot read is refused in one line naming its config.json.

The folders in tests/fixtures/runs-b5568db were written by contrastkit at commit b5568db (its
README.md gives the commands): a SimCLR run with a data-chosen batch and a per-sample temperature
method, and a MoCo run. What differs from what this version writes: the configuration that wrote
them kept its data choices and training-set size beside its fields, and the checkpoint's copy of
the configuration has its fields in the former order."""

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny_run import one_error_line
from contrastkit.cli import main
from contrastkit.train.runs import load_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs-b5568db"
RUNS = ("simclr-individual", "moco")
ROWS = {"train": 16, "val": 9, "test": 12}  # the runs' GlyphLab scenes


@pytest.fixture(params=RUNS)
def old_run(request, tmp_path):
    """A copy of one of the folders (the commands may write into a run folder)."""
    run = tmp_path / request.param
    shutil.copytree(FIXTURES / request.param, run)
    return run


def _embed(run, out):
    """h of every row of the run's data (train, val, test) and each row's split, as ``embed`` writes them."""
    assert main(["embed", str(run), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    with np.load(out, allow_pickle=False) as archive:
        return archive["h"].astype(np.float64), archive["splits"].tolist()


def test_probe_reads_an_old_run_back_to_the_numbers_it_recorded(old_run, capsys, one_torch_thread):
    """The probe rebuilds the run's model from its config.json and checkpoint: the same encoder,
    so the same held-out numbers as the run's own summary.json."""
    capsys.readouterr()
    assert main(["probe", str(old_run), "--no-baselines", "--device", "cpu", "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    recorded = json.loads((old_run / "summary.json").read_text(encoding="utf-8"))
    for key in ("probe_accuracy", "probe_val_accuracy", "knn_accuracy", "probe_c"):
        assert numbers[key] == recorded[key], key


def test_an_old_runs_configuration_and_choices_read_back(old_run):
    """The recorded batch size and MoCo queue are the configuration's, and the checkpoint
    (configuration in the former field order) belongs to it."""
    saved = load_run(str(old_run))
    stored = json.loads((old_run / "config.json").read_text(encoding="utf-8"))
    # A field added since b5568db reads back at what its absence meant (online_probe: the run had
    # none, though the online read-out is on by default now) or at its default (select_by).
    assert saved.config.to_dict() == {**stored["config"], "online_probe": False, "select_by": "val_probe"}
    assert "online_probe" not in stored["config"] and "online_probe" not in saved.state
    assert saved.config.batch_size == 16 and saved.config.queue_size == (16 if saved.config.method == "moco" else None)
    assert list(saved.state["config"]) != list(saved.config.to_dict())  # the former order: read all the same
    if old_run.name == "simclr-individual":
        assert stored["derived"]["defaults"]["batch_size"]["value"] == 16


def test_embed_export_and_neighbors_of_an_old_run_agree(old_run, tmp_path, capsys, one_torch_thread):
    """embed writes h of every image; the exported encoder gives the same h; neighbors finds the
    rows nearest by the cosine of that h."""
    h, splits = _embed(old_run, tmp_path / "h.npz")
    assert h.shape[0] == sum(ROWS.values()) and np.isfinite(h).all()
    assert splits == ["train"] * ROWS["train"] + ["val"] * ROWS["val"] + ["test"] * ROWS["test"]

    assert main(["export", str(old_run), "--format", "torchscript", "--out", str(tmp_path / "encoder.pt")]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TorchScript deprecation note
        encoder = torch.jit.load(str(tmp_path / "encoder.pt"))
    test_images = load_run(str(old_run)).load_data().test.images
    with torch.no_grad():
        exported = encoder(test_images.float()).double().numpy()
    np.testing.assert_allclose(exported, h[-ROWS["test"]:], rtol=1e-5, atol=1e-6)

    capsys.readouterr()
    assert main(["neighbors", str(old_run), "test:3", "--k", "3", "--no-picture", "--json", "--device", "cpu"]) == 0
    found = json.loads(capsys.readouterr().out)
    row = ROWS["train"] + ROWS["val"] + 3
    unit = h / np.linalg.norm(h, axis=1, keepdims=True)
    similarity = unit @ unit[row]
    similarity[row] = -np.inf  # a query of the collection is left out of its own neighbors
    nearest = [n["row"] for n in found["queries"][0]["neighbors"]]
    assert found["queries"][0]["row"] == row and nearest == list(np.argsort(-similarity, kind="stable")[:3])


@pytest.mark.parametrize("command", [["probe"], ["embed", "--out", "h.npz"], ["export", "--out", "encoder.pt"],
                                     ["neighbors", "test:0", "--no-picture"]], ids=lambda c: c[0])
def test_an_old_run_this_version_cannot_read_is_refused_in_one_line_naming_the_file(tmp_path, capsys, command,
                                                                                    monkeypatch):
    """A config.json with a key this version does not know (here the training-set size the former
    configuration kept beside its fields, as if it had been saved) is refused, exit status 2, in one
    line naming the file and the key; nothing is written."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "simclr-individual", run)
    path = run / "config.json"
    stored = json.loads(path.read_text(encoding="utf-8"))
    stored["config"]["_train_size"] = 16
    path.write_text(json.dumps(stored, indent=2), encoding="utf-8")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, [command[0], str(run), *command[1:]])
    assert line == (f"contrastkit {command[0]}: error: {path} is not a valid run configuration: "
                    "unknown configuration keys ['_train_size']")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
