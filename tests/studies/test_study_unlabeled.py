"""Sweeps and experiments on an unlabeled image collection judge the label-free claims and say
of the others that they need labels, never a crash; the experiments bound to their own data
refuse --data in one line."""

from __future__ import annotations

import csv
import json

import pytest

from _data_fixtures import write_collection
from contrastkit.cli import main
from contrastkit.studies import EXPERIMENTS
from contrastkit.studies.verdicts import NEEDS_LABELS

TINY = ["--seeds", "1", "--epochs", "1", "--batch-size", "8", "--no-progress", "--jobs", "1", "--device", "cpu"]


def _statuses(folder):
    return {v["claim"]: v for v in json.loads((folder / "verdicts.json").read_text())}


def test_a_sweep_on_unlabeled_images_reports_what_needs_labels(tmp_path, capsys):
    data = write_collection(tmp_path / "photos", 36, damaged=("zero.jpg",))
    code = main(["sweep", "--data", str(data), "--temperatures", "0.1,0.5", *TINY, "--out", str(tmp_path / "sweep")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    verdicts = _statuses(tmp_path / "sweep")
    assert verdicts["Probe accuracy is reverse-U shaped in tau (the best tau is interior)"]["status"] == NEEDS_LABELS
    uniformity = "Smaller tau makes the embedding more uniform (uniformity rises with tau)"
    assert verdicts[uniformity]["status"] != NEEDS_LABELS
    assert "needs labels" in captured.out
    assert "done view top-1 0." in captured.out + captured.err  # each run's label-free number in the grid


def test_the_schedules_experiment_on_unlabeled_images_needs_labels_for_its_claims(tmp_path, capsys):
    # Both claims are about probe accuracy: not judged, and never "does not hold" on missing numbers.
    data = write_collection(tmp_path / "photos", 40, damaged=("zero.jpg", "fake.png"))
    out_dir = tmp_path / "schedules"
    code = main(["experiment", "schedules", "--data", str(data), *TINY, "--eval-every", "1", "--train-limit", "24",
                 "--out", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    verdicts = _statuses(out_dir)
    assert len(verdicts) == 2 and {v["status"] for v in verdicts.values()} == {NEEDS_LABELS}
    assert all("view retrieval top-1" in v["evidence"] and "fixed 0." in v["evidence"] for v in verdicts.values())
    with open(out_dir / "results.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["schedule"] for row in rows] == ["fixed", "cosine", "linear"]
    assert all(0 <= float(row["view_retrieval_top1"]) <= 1 and row["probe_accuracy"] == "" for row in rows)
    assert "view retrieval top-1 (held out)" in captured.out and "nan" not in captured.out
    assert (out_dir / "schedules.png").stat().st_size > 0


def test_the_temperature_methods_experiment_on_unlabeled_images_needs_labels(tmp_path, capsys):
    data = write_collection(tmp_path / "photos", 32, damaged=("zero.jpg",))
    out_dir = tmp_path / "methods"
    code = main(["experiment", "temperature-methods", "--data", str(data), *TINY, "--temperatures", "0.2",
                 "--method", "macl", "--train-limit", "20", "--out", str(out_dir)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    verdicts = _statuses(out_dir)
    assert len(verdicts) == 1 and {v["status"] for v in verdicts.values()} == {NEEDS_LABELS}
    assert all("view retrieval top-1" in v["evidence"] and "macl 0." in v["evidence"] for v in verdicts.values())
    assert "view retrieval top-1 (held out)" in captured.out and "nan" not in captured.out


@pytest.mark.parametrize("name", sorted(set(EXPERIMENTS) - {"schedules", "temperature-methods"}))
def test_an_experiment_bound_to_its_own_data_refuses_a_collection_in_one_line(tmp_path, capsys, name):
    data = write_collection(tmp_path / "photos", 12, damaged=())
    assert main(["experiment", name, "--data", str(data), *TINY, "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--data" in error and "schedules" in error, error
    assert not (tmp_path / "x").exists()
