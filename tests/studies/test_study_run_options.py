"""``--compile`` and ``--channels-last`` on the study commands: every run a study trains gets
them (at every budget too), they are not study settings (a study resumes with or without them,
as with ``--jobs``), and a bad value is refused before anything is written."""

import csv
import json
import os
import re
import shutil

import pytest
import torch

from contrastkit import layout
from contrastkit.cli import main
from contrastkit.studies import run_sweep
from contrastkit.studies.grid import RUN_OPTIONS, check_run_options
from contrastkit.methods.config import RESUME_MAY_CHANGE

GRID = ["--batch-size", "8", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
        "--data-option", "test_scenes=15", "--no-progress", "--threads", "1", "--no-variants", "--jobs", "1",
        "--temperatures", "0.5", "--seeds", "1"]
TINY = ["--epochs", "1"] + GRID


def run_configs(out):
    """``{run folder: its recorded config}`` of every run under ``out`` (budget folders included)."""
    configs = {}
    for root, _, files in os.walk(out):
        if os.path.basename(os.path.dirname(root)) == layout.RUNS and "config.json" in files:
            with open(os.path.join(root, "config.json"), encoding="utf-8") as handle:
                configs[os.path.relpath(root, out)] = json.load(handle)["config"]
    return configs


def rows(path):
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_run_options_are_the_ones_a_resumed_run_may_change():
    # not settings of the study, so not of its runs either: a run resumed without them is valid
    assert set(RUN_OPTIONS) <= RESUME_MAY_CHANGE


def test_channels_last_reaches_every_run_and_a_resume_without_it_reads_the_study_back(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), "--channels-last"] + TINY) == 0
    configs = run_configs(out)
    assert list(configs) == [os.path.join(layout.RUNS, "nt_xent-tau0.5-seed0")]
    assert all(config["channels_last"] is True and config["compile"] is False for config in configs.values())
    settings = json.loads((out / "sweep.json").read_text())
    assert not set(RUN_OPTIONS) & set(settings)  # how the runs compute is not what the study is
    before = rows(out / "sweep.csv")
    capsys.readouterr()
    assert main(["sweep", "--out", str(out), "--resume"] + TINY) == 0  # the same settings without the flag
    assert rows(out / "sweep.csv") == before  # the finished run read back, not trained again


def test_compile_reaches_every_run_of_every_budget(tmp_path, capsys, monkeypatch):
    if not any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if name):
        pytest.skip("no C++ compiler: --compile is refused here (tested in tests/train/test_compile.py)")
    compiled = []
    # record the call instead of compiling: what is tested is that each run asks for it
    monkeypatch.setattr(torch.nn.Module, "compile", lambda module, *args, **kwargs: compiled.append(type(module).__name__))
    out = tmp_path / "budgets"
    assert main(["sweep", "--out", str(out), "--budgets", "8x1,16x1", "--compile"] + GRID) == 0
    configs = run_configs(out)
    assert sorted(configs) == [os.path.join("budget-16x1", layout.RUNS, "nt_xent-tau0.5-seed0"),
                               os.path.join("budget-8x1", layout.RUNS, "nt_xent-tau0.5-seed0")]
    assert all(config["compile"] is True and config["channels_last"] is False for config in configs.values())
    assert compiled == ["SmallCNN", "SmallCNN"]  # each run's encoder, once


@pytest.mark.parametrize("options, message", [
    ({"compile": "yes"}, "--compile must be true or false"),
    ({"channels_last": 1}, "--channels-last must be true or false"),
    ({"precision": True}, "unknown run option(s) precision"),
])
def test_bad_run_options_are_refused_before_anything_is_written(tmp_path, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_run_options(options)
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_sweep(str(out), progress=False, jobs=1, run_options=options, temperatures=[0.5], seeds=1, epochs=1)
    assert not out.exists()
