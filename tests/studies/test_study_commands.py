"""``contrastkit sweep`` and ``contrastkit experiment positive-pairs`` end to end on CPU, on a
tiny GlyphLab (1 epoch), through the command line entry point."""

import csv
import json
import os

import pytest

from contrastkit.cli import main

# One run at a time, in this process (the pool of run processes is tests/studies/test_study_jobs.py's).
TINY = ["--epochs", "1", "--batch-size", "8", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
        "--data-option", "test_scenes=15", "--no-progress", "--jobs", "1"]
STATUSES = {"holds", "does not hold here", "inconclusive"}


def png(path):
    with open(path, "rb") as handle:
        return handle.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sweep") / "out")
    code = main(["sweep", "--temperatures", "0.5,0.1", "--seeds", "1", "--out", out] + TINY)
    assert code == 0
    return out


def test_sweep_writes_csv_plots_and_verdicts(sweep_dir, capsys):
    with open(os.path.join(sweep_dir, "sweep.csv"), encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["loss"], r["tau"]) for r in rows] == [
        ("nt_xent", "0.1"), ("nt_xent", "0.5"), ("hard_negative", "0.1"), ("hard_negative", "0.5"), ("simple", "")]
    assert [r["method"] for r in rows] == ["simclr", "simclr", "hard_negative", "hard_negative", "simple"]
    for row in rows:
        assert 0.0 <= float(row["probe_accuracy"]) <= 1.0
        for space in ("z", "h"):
            assert float(row[f"{space}_uniformity"]) <= 0.0
            assert float(row[f"{space}_top_negative_1"]) >= float(row[f"{space}_top_negative_10"])
    assert rows[0]["random_init_probe_accuracy"] != "" and rows[1]["random_init_probe_accuracy"] == ""
    for name in ("accuracy_vs_tau.png", "uniformity_vs_tau.png", "tolerance_vs_tau.png",
                 "uniformity_tolerance.png", "similarity_profile.png"):
        assert png(os.path.join(sweep_dir, name)), name
    with open(os.path.join(sweep_dir, "verdicts.json"), encoding="utf-8") as handle:
        verdicts = json.load(handle)
    assert len(verdicts) == 6 and all(v["status"] in STATUSES for v in verdicts)
    # two temperatures and one seed: nothing about the shape or the noise can be decided
    assert verdicts[0]["status"] == "inconclusive"
    with open(os.path.join(sweep_dir, "runs", "nt_xent-tau0.1-seed0", "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["final_temperature"] == pytest.approx(0.1) and set(summary["representation"]) >= {"h", "z"}
    with open(os.path.join(sweep_dir, "runs", "simple-seed0", "config.json"), encoding="utf-8") as handle:
        assert json.load(handle)["config"]["method"] == "simple"


def test_sweep_never_overwrites_and_resumes(sweep_dir, capsys):
    marker = os.path.join(sweep_dir, "runs", "nt_xent-tau0.1-seed0", "summary.json")
    before = os.path.getmtime(marker)
    assert main(["sweep", "--temperatures", "0.5,0.1", "--seeds", "1", "--out", sweep_dir] + TINY) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["sweep", "--temperatures", "0.2", "--seeds", "1", "--out", sweep_dir, "--resume"] + TINY) == 2
    assert "other settings" in capsys.readouterr().err
    # a removed run is redone, finished ones are reused untouched
    os.remove(os.path.join(sweep_dir, "runs", "simple-seed0", "summary.json"))
    assert main(["sweep", "--temperatures", "0.1,0.5", "--seeds", "1", "--out", sweep_dir, "--resume"] + TINY) == 0
    captured = capsys.readouterr()
    assert os.path.getmtime(marker) == before
    assert captured.err.count("reused") == 4 and "simple-seed0: done" in captured.err
    assert "Verdicts (computed from the results above)" in captured.out


@pytest.mark.parametrize("args, message", [
    (["--temperatures", "0.1,abc"], "comma-separated numbers"),
    (["--temperatures", "0.001"], ">= 0.01"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--resume", "--force"], "exclude each other"),
    (["--data-option", "noise"], "KEY=VALUE"),
])
def test_sweep_bad_arguments(tmp_path, capsys, args, message):
    assert main(["sweep", "--out", str(tmp_path / "x")] + args) == 2
    assert message in capsys.readouterr().err


def test_positive_pairs_experiment(tmp_path, capsys):
    out = str(tmp_path / "pp")
    assert main(["experiment", "positive-pairs", "--seeds", "1", "--out", out] + TINY) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "results.csv"), encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["setting"] for r in rows] == ["pairs A", "random init", "raw pixels", "pairs B"]
    assert all(0.0 <= float(r["probe_accuracy"]) <= 1.0 for r in rows)
    with open(os.path.join(out, "runs", "pairsB-seed0", "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)["config"]
    assert config["views"] == "B" and config["data"] == "glyphlab" and config["method"] == "simclr"
    assert png(os.path.join(out, "positive_pairs.png"))
    with open(os.path.join(out, "verdicts.json"), encoding="utf-8") as handle:
        verdicts = json.load(handle)
    assert verdicts[0]["claim"].startswith("Pair definition B") and verdicts[0]["status"] in STATUSES
    assert "pairs A" in printed and "[" + verdicts[0]["status"] + "]" in printed
    assert main(["experiment", "positive-pairs", "--seeds", "1", "--out", out] + TINY) == 2


def test_experiment_name_is_a_choice(capsys):
    with pytest.raises(SystemExit):
        main(["experiment", "no-such-experiment"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_study_trains_the_encoder_it_is_given(tmp_path, capsys):
    """``--encoder`` / ``--encoder-option`` reach every run (as ``contrastkit pretrain``'s), are
    part of the study's settings (a resume with another encoder is refused), and a bad one is
    refused before anything trains."""
    out = str(tmp_path / "out")
    args = ["sweep", "--temperatures", "0.2", "--seeds", "1", "--no-variants", "--out", out, "--encoder", "small",
            "--encoder-option", "width=8"] + TINY
    assert main(args) == 0
    with open(os.path.join(out, "runs", "nt_xent-tau0.2-seed0", "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)["config"]
    assert config["encoder"] == "small" and config["encoder_options"] == {"width": 8}
    with open(os.path.join(out, "sweep.json"), encoding="utf-8") as handle:
        assert json.load(handle)["encoder_options"] == {"width": 8}
    assert main(args[:-len(TINY)] + ["--resume"] + TINY) == 0  # the same settings: read back
    assert "reused" in capsys.readouterr().err
    other = [a if a != "width=8" else "width=4" for a in args]
    assert main(other + ["--resume"]) == 2
    assert "other settings" in capsys.readouterr().err
    assert main(["sweep", "--out", str(tmp_path / "bad"), "--encoder", "no_such_encoder"] + TINY) == 2
    assert "no_such_encoder" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(str(tmp_path / "bad"), "runs"))
