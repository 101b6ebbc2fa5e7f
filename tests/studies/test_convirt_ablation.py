"""``contrastkit experiment convirt-ablation``: verdicts computed from given result rows, and a
tiny grid end to end (table, CSV, plot, verdicts)."""

import csv
import json
import os

import pytest

from contrastkit.cli import main
from contrastkit.studies import FAILS, HOLDS, UNDECIDED
from contrastkit.studies.convirt_ablation import ablation_table, ablation_verdicts


def _row(lam, tau, i2t, t2i, seed=0):
    return {"lambda": lam, "tau": tau, "seed": seed, "i2t_recall@5": i2t, "t2i_recall@5": t2i, "pairs": 300,
            "chance_recall@5": 0.05, "fact_ceiling_recall@5": 0.9, "zero_shot_accuracy": 0.5}


def _grid(score):
    return [_row(lam, tau, *score(lam, tau)) for tau in (0.01, 0.1, 1.0) for lam in (0.0, 0.25, 0.5, 0.75, 1.0)]


def test_verdicts_when_the_claims_hold():
    # tau 0.1 best everywhere; i2t grows with lambda, t2i falls; 0.75 has the best mean.
    def score(lam, tau):
        base = {0.01: 0.3, 0.1: 0.6, 1.0: 0.4}[tau]
        bump = 0.05 if lam == 0.75 else 0.0
        return base + 0.1 * lam + bump, base + 0.1 * (1 - lam) + bump

    verdicts = {v.claim: v for v in ablation_verdicts(_grid(score))}
    assert verdicts["tau = 0.01 hurts retrieval compared with tau = 0.1"].status == HOLDS
    assert verdicts["tau = 1 hurts retrieval compared with tau = 0.1"].status == HOLDS
    both = [v for c, v in verdicts.items() if "both hurt" in c][0]
    assert both.status == HOLDS
    assert "better in 5/5 cells" in both.evidence
    direction = [v for c, v in verdicts.items() if "larger lambda" in c][0]
    assert direction.status == HOLDS and "rho 1.000" in direction.evidence
    best = [v for c, v in verdicts.items() if "best retrieval" in c][0]
    assert best.status == HOLDS


def test_verdicts_when_the_claims_fail_or_are_mixed():
    # tau 1 beats 0.1 everywhere (fails); tau 0.01 beats 0.1 at two lambdas only (mixed, mean gap > 0);
    # no lambda trend in the directions; lambda 0.5 best.
    def score(lam, tau):
        if tau == 1.0:
            return 0.8, 0.8
        if tau == 0.01:
            return (0.7, 0.7) if lam in (0.0, 0.25) else (0.3, 0.3)
        return (0.6 + (0.1 if lam == 0.5 else 0.0),) * 2

    verdicts = {v.claim: v for v in ablation_verdicts(_grid(score))}
    assert verdicts["tau = 1 hurts retrieval compared with tau = 0.1"].status == FAILS
    low = verdicts["tau = 0.01 hurts retrieval compared with tau = 0.1"]
    assert low.status == UNDECIDED and "better in 3/5 cells" in low.evidence
    assert [v for c, v in verdicts.items() if "both hurt" in c][0].status == FAILS
    assert [v for c, v in verdicts.items() if "larger lambda" in c][0].status == FAILS  # constant: rho undefined
    # lambda 0.5: 0.7 vs 0.75: 0.6; the binomial standard error at p = 0.6, 300 pairs is
    # sqrt(0.24 / 300) = 0.0283, so a gap of 0.1 is more than two of them.
    best = [v for c, v in verdicts.items() if "best retrieval" in c][0]
    assert best.status == FAILS and "standard error 0.0283" in best.evidence


def test_small_lambda_gap_is_inconclusive():
    # lambda 0 ahead of 0.75 by 0.01 at p ~ 0.5 with 300 pairs: SE = sqrt(0.25 / 300) = 0.0289.
    rows = _grid(lambda lam, tau: (0.51, 0.51) if lam == 0.0 else (0.5, 0.5))
    best = [v for v in ablation_verdicts(rows) if "best retrieval" in v.claim][0]
    assert best.status == UNDECIDED


def test_table_lists_every_cell():
    rows = _grid(lambda lam, tau: (lam, 1 - lam))
    table = ablation_table(rows)
    assert "chance R@5 0.0500" in table
    assert table.count("\n") == 3 + 5
    assert " 0.750  0.250" in table


def test_tiny_ablation_end_to_end(tmp_path, capsys):
    out = str(tmp_path / "ablation")
    args = ["experiment", "convirt-ablation", "--weights", "0,1", "--temperatures", "0.1,1", "--epochs", "1",
            "--batch-size", "16", "--data-option", "train_scenes=32", "--data-option", "val_scenes=16",
            "--data-option", "test_scenes=16", "--text-encoder", "mean", "--out", out, "--no-progress",
            "--jobs", "1"]  # one run at a time, in this process (the run pool: tests/studies/test_study_jobs.py)
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Recall@5 on held-out pairs" in printed and "Verdicts" in printed
    with open(os.path.join(out, "results.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((float(r["lambda"]), float(r["tau"])) for r in rows) == [(0, 0.1), (0, 1), (1, 0.1), (1, 1)]
    for row in rows:
        assert 0.0 <= float(row["i2t_recall@5"]) <= 1.0
        assert float(row["chance_recall@5"]) == pytest.approx(5 / 16)
    verdicts = json.load(open(os.path.join(out, "verdicts.json")))
    assert any("tau = 1 hurts retrieval" in v["claim"] for v in verdicts)
    assert all(v["status"] in (HOLDS, FAILS, UNDECIDED) for v in verdicts)
    assert os.path.getsize(os.path.join(out, "convirt_ablation.png")) > 0
    # Finished runs are reused on --resume; a plain rerun refuses to overwrite.
    assert main(args + ["--resume"]) == 0
    assert main(args) == 2
    assert main(args[:2] + ["--temperature", "0.1", "--out", str(tmp_path / "x")]) == 2
