"""The temperature-methods study (``contrastkit experiment temperature-methods``): the choice of
the best fixed tau, the verdict rule, and tiny runs (GlyphLab, and a CIFAR-10 subset when the
tarball is there)."""

from __future__ import annotations

import os

import pytest

from _data_fixtures import CIFAR_TARBALL, cifar_subset
from contrastkit import layout, studies
from contrastkit.cli import main
from contrastkit.studies.temperature_methods import best_fixed_temperature, methods_verdicts


def _rows(fixed, method, val=None):
    """``fixed``: {tau: [test accuracy per seed]}; ``method``: {name: [per seed]}; ``val``: {tau: [...]}."""
    rows = []
    for tau, scores in fixed.items():
        for seed, score in enumerate(scores):
            rows.append({"method": "fixed", "tau": tau, "seed": seed, "probe_accuracy": score,
                         "val_probe_accuracy": None if val is None else val[tau][seed]})
    for name, scores in method.items():
        for seed, score in enumerate(scores):
            rows.append({"method": name, "tau": name, "seed": seed, "probe_accuracy": score,
                         "val_probe_accuracy": None})
    return rows


def test_the_best_fixed_tau_is_chosen_on_val_when_every_run_has_it():
    fixed = {"0.1": [0.50, 0.52, 0.51], "0.5": [0.55, 0.56, 0.55]}
    val = {"0.1": [0.60, 0.61, 0.62], "0.5": [0.40, 0.41, 0.40]}  # val prefers 0.1, test would prefer 0.5
    assert best_fixed_temperature(_rows(fixed, {}, val)) == ("0.1", "val")
    assert best_fixed_temperature(_rows(fixed, {})) == ("0.5", "test")


@pytest.mark.parametrize("method, status", [
    ([0.57, 0.58, 0.58], studies.HOLDS),        # +0.057 over tau 0.1 (the best on val), 2 SE = 0.014
    ([0.49, 0.50, 0.51], studies.FAILS),        # mean difference < 0
    ([0.56, 0.50, 0.53], studies.UNDECIDED),    # +0.017, 2 SE = 0.035
])
def test_each_method_is_judged_against_the_best_fixed_tau_per_seed(method, status):
    fixed = {"0.1": [0.50, 0.52, 0.51], "0.5": [0.55, 0.56, 0.55]}
    val = {"0.1": [0.60, 0.61, 0.62], "0.5": [0.40, 0.41, 0.40]}
    (verdict,) = methods_verdicts(_rows(fixed, {"macl": method}, val))
    assert verdict.status == status
    assert "MACL" in verdict.claim and "best fixed tau 0.1 (chosen on val)" in verdict.evidence
    assert "2 standard errors" in verdict.rule


def test_a_choice_made_on_test_says_so():
    (verdict,) = methods_verdicts(_rows({"0.2": [0.5, 0.5]}, {"dual": [0.6, 0.61]}))
    assert "chosen on the test split, which favours the fixed tau" in verdict.rule


def test_the_study_runs_on_glyphlab(tmp_path):
    out = tmp_path / "methods"
    result = studies.run_experiment("temperature-methods", str(out), progress=False, seeds=2, epochs=2,
                                    batch_size=20, train_limit=40, eval_every=1, temperatures=[0.1, 0.5],
                                    methods=["macl", "individual:0.2,0.4"])
    assert len(result.specs) == 8 and len(result.rows) == 8
    assert [v.claim.split()[0] for v in result.verdicts] == ["MACL's", "Individual"]
    assert all(v.status in studies.STATUSES for v in result.verdicts)
    assert {row["method"] for row in result.rows} == {"fixed", "macl", "individual"}
    assert all(row["val_probe_accuracy"] is not None for row in result.rows)
    for name in (layout.EXPERIMENT_TABLE, layout.VERDICTS, layout.TEMPERATURE_METHODS_PLOT,
                 layout.EXPERIMENT_SETTINGS):
        assert os.path.isfile(out / name)
    individual = next(s for s in result.specs if s.row == "individual")
    assert individual.summary["temperature_method"] == "individual:0.2,0.4"
    table = result.table()
    assert "the best fixed tau" in table and "baselines" in table


@pytest.mark.skipif(not CIFAR_TARBALL, reason="the CIFAR-10 tarball (shared/data/cifar10-jpeg.tar.gz or "
                                              "$CONTRASTKIT_CIFAR10_TARBALL) is not on this machine")
def test_the_command_runs_on_a_cifar10_subset(tmp_path, capsys):
    data = cifar_subset(tmp_path / "cifar", per_class=8)
    out = tmp_path / "methods"
    code = main(["experiment", "temperature-methods", "--data", str(data), "--seeds", "1", "--epochs", "1",
                 "--batch-size", "16", "--temperatures", "0.2", "--method", "dual", "--method", "network",
                 "--eval-every", "1", "--no-progress", "--jobs", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "dual temperature" in printed.lower() and "network" in printed and "Verdicts" in printed
    assert os.path.isfile(out / layout.VERDICTS)


@pytest.mark.parametrize("argv, message", [
    (["--method", "cosine:0.1,1"], "is not a temperature method"),
    (["--method", "macl", "--method", "macl:0.2"], "names a method twice"),
    (["--temperature", "0.2"], "has no option --temperature"),
])
def test_bad_options_are_one_line(capsys, argv, message):
    assert main(["experiment", "temperature-methods", "--epochs", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_without_a_selection_the_last_epoch_s_val_probe_chooses_and_unfinished_runs_have_no_say():
    from contrastkit.studies.temperature_methods import _val_accuracy

    assert _val_accuracy({"probe_val_accuracy": 0.41}) == 0.41
    assert _val_accuracy({"selection": {"scores": [0.3, 0.5]}, "probe_val_accuracy": 0.41}) == 0.5
    rows = _rows({"0.1": [0.5, 0.5], "0.5": [0.4, 0.4]}, {}, val={"0.1": [0.3, 0.3], "0.5": [0.6, 0.6]})
    rows.append({"method": "fixed", "tau": "0.2", "seed": 0, "probe_accuracy": None, "val_probe_accuracy": None})
    assert best_fixed_temperature(rows) == ("0.5", "val")
