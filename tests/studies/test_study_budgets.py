"""A study over training budgets (``--budgets SIZExEPOCHS,...``): the budgets parsed and refused,
the verdicts across budgets, and ``contrastkit sweep --budgets`` end to end on a tiny GlyphLab
(cut off in its second budget, then resumed), with its report."""

import contextlib
import csv
import dataclasses
import io
import json
import os
import shutil
import statistics

import pytest

from contrastkit import studies
from contrastkit.cli import main
from contrastkit.studies import grid
from contrastkit.studies.budgets import (NOT_JUDGED, Budget, check_budgets, claims_across_budgets,
                                         describe_statuses, run_budgets)
from contrastkit.studies.verdicts import FAILS, HOLDS, UNDECIDED, Verdict

# One run at a time, in this process (so that a cut-off can be simulated in it).
TINY = ["--batch-size", "8", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
        "--data-option", "test_scenes=15", "--no-progress", "--jobs", "1"]
SWEEP = ["sweep", "--temperatures", "0.5,0.1", "--seeds", "1", "--budgets", "16x2,8x1"] + TINY
BUDGET_FILES = ("sweep.csv", "sweep.json", "verdicts.json", "accuracy_vs_tau.png", "similarity_profile.png")
CROSS_PLOTS = ("budgets_accuracy_vs_tau.png", "budgets_uniformity_vs_tau.png", "budgets_tolerance_vs_tau.png",
               "best_tau_vs_budget.png")


def png(path):
    with open(path, "rb") as handle:
        return handle.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


def read_csv(path):
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# ------------------------------------------------------------------------------ budgets

def test_budgets_parse_and_sort_by_image_steps():
    parsed = check_budgets(" 15000x20, 5000x18,45000X20")
    assert [b.label for b in parsed] == ["5000x18", "15000x20", "45000x20"]
    assert [b.image_steps for b in parsed] == [90_000, 300_000, 900_000]
    assert parsed[0].folder == "budget-5000x18" and parsed[0].describe() == "5000x18 (90k image-steps)"
    assert check_budgets([(20, 1), Budget(10, 2), "5x2"]) == [Budget(5, 2), Budget(10, 2), Budget(20, 1)]


@pytest.mark.parametrize("value, message", [
    ("5000", "'5000' is not SIZExEPOCHS"),
    ("5000x18,big", "'big' is not SIZExEPOCHS"),
    ("5000x0", "5000x0: the epochs must be >= 1"),
    ("1x5", "1x5: the training-set size must be >= 2"),
    ("8x1,8x1", "repeated budgets: 8x1"),
    (",", "--budgets is empty"),
])
def test_bad_budgets_refused_in_one_line(tmp_path, capsys, value, message):
    out = tmp_path / "x"
    assert main(["sweep", "--out", str(out), "--budgets", value]) == 2
    err = capsys.readouterr().err
    assert message in err and "--budgets" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("option", ["--epochs", "--train-limit"])
def test_budgets_replace_epochs_and_train_limit(tmp_path, capsys, option):
    assert main(["sweep", "--out", str(tmp_path / "x"), "--budgets", "8x1", option, "4"]) == 2
    assert f"leave out {option}" in capsys.readouterr().err


# ------------------------------------------------------------------------------ verdicts across budgets

@pytest.mark.parametrize("statuses, expected", [
    ([HOLDS, HOLDS, HOLDS], "holds at every budget"),
    ([HOLDS, FAILS, FAILS], "holds at A, does not hold here from B on"),
    ([UNDECIDED, UNDECIDED, HOLDS], "inconclusive up to B, holds at C"),
    ([HOLDS, FAILS, FAILS, HOLDS], "holds at A, does not hold here from B to C, holds at D"),
    ([FAILS, HOLDS, UNDECIDED], "does not hold here at A, holds at B, inconclusive at C"),
])
def test_describe_statuses(statuses, expected):
    assert describe_statuses("ABCD"[:len(statuses)], statuses) == expected


def test_claims_across_budgets_report_where_a_claim_changes():
    def v(claim, status):
        return Verdict(claim, status, f"{claim} is {status}", "rule")

    at_small = [v("reverse-U", FAILS), v("uniformity", HOLDS), v("simple worse", HOLDS)]
    at_middle = [v("reverse-U", FAILS), v("uniformity", HOLDS)]  # no simple-loss verdict here
    at_large = [v("uniformity", HOLDS), v("reverse-U", HOLDS), v("simple worse", HOLDS), v("new", UNDECIDED)]
    claims = claims_across_budgets(["90k", "300k", "900k"], [at_small, at_middle, at_large])
    assert [c.claim for c in claims] == ["reverse-U", "uniformity", "simple worse", "new"]
    reverse_u, uniformity, simple, new = claims
    assert reverse_u.changes and reverse_u.where == "does not hold here up to 300k, holds at 900k"
    assert not uniformity.changes and uniformity.where == "holds at every budget"
    assert simple.statuses == [HOLDS, NOT_JUDGED, HOLDS] and simple.changes
    assert new.statuses == [NOT_JUDGED, NOT_JUDGED, UNDECIDED]
    entry = reverse_u.to_dict()
    assert entry["changes"] is True and [e["budget"] for e in entry["by_budget"]] == ["90k", "300k", "900k"]
    assert entry["by_budget"][2] == {"budget": "900k", "status": HOLDS, "evidence": "reverse-U is holds"}
    with pytest.raises(ValueError):
        claims_across_budgets(["90k"], [at_small, at_large])


# ------------------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def budget_study(tmp_path_factory):
    """The tiny sweep at 8x1 and 16x2, cut off at the second run of its second budget, then resumed;
    the stderr of the resumed call."""
    out = str(tmp_path_factory.mktemp("budgets") / "out")
    started = []
    real = grid._execute

    def cut_off_at_seventh(spec, run_dir, progress, wait_for_it=False):
        started.append(os.path.relpath(run_dir, out))
        if len(started) == 7:
            raise KeyboardInterrupt
        return real(spec, run_dir, progress, wait_for_it)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grid, "_execute", cut_off_at_seventh)
        assert main(SWEEP + ["--out", out]) == 130
    assert [name.split(os.sep)[0] for name in started] == ["budget-8x1"] * 5 + ["budget-16x2"] * 2
    mtimes = {name: os.path.getmtime(os.path.join(out, "budget-8x1", "runs", name, "summary.json"))
              for name in os.listdir(os.path.join(out, "budget-8x1", "runs"))}
    err, printed = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed):
        assert main(SWEEP + ["--out", out]) == 2  # not empty: needs --resume
        assert main(SWEEP + ["--out", out, "--resume"]) == 0
    return {"out": out, "err": err.getvalue(), "printed": printed.getvalue(), "mtimes": mtimes}


def test_resume_reads_back_finished_budget_and_runs(budget_study):
    out, err = budget_study["out"], budget_study["err"]
    assert "not empty; pass --resume" in err
    resumed = err.split("not empty", 1)[1]
    # budget 8x1: all 5 runs read back; budget 16x2: the run finished before the cut-off read back, 4 trained
    assert resumed.count(": reused") == 6 and resumed.count(": done") == 4
    for name, before in budget_study["mtimes"].items():
        assert os.path.getmtime(os.path.join(out, "budget-8x1", "runs", name, "summary.json")) == before


def test_each_budget_is_a_sweep_folder_of_its_own(budget_study):
    out = budget_study["out"]
    assert sorted(n for n in os.listdir(out) if n.startswith("budget-")) == ["budget-16x2", "budget-8x1"]
    for budget, epochs in (("8x1", 1), ("16x2", 2)):
        folder = os.path.join(out, f"budget-{budget}")
        assert all(os.path.isfile(os.path.join(folder, name)) for name in BUDGET_FILES)
        settings = read_json(os.path.join(folder, "sweep.json"))
        assert settings["epochs"] == epochs and settings["train_limit"] == int(budget.split("x")[0])
        config = read_json(os.path.join(folder, "runs", "nt_xent-tau0.1-seed0", "config.json"))
        assert config["derived"]["dataset"]["sizes"]["train"] == int(budget.split("x")[0])
    assert read_json(os.path.join(out, "budgets.json"))["budgets"] == ["8x1", "16x2"]
    # the budget folder resumes on its own, as a plain sweep
    assert main(["sweep", "--temperatures", "0.1,0.5", "--seeds", "1", "--epochs", "1", "--train-limit", "8",
                 "--out", os.path.join(out, "budget-8x1"), "--resume"] + TINY) == 0


def test_cross_budget_table_and_plots(budget_study):
    out = budget_study["out"]
    table = read_csv(os.path.join(out, "budgets.csv"))
    assert [(r["budget"], r["loss"], r["tau"]) for r in table] == [
        (b, loss, tau) for b in ("8x1", "16x2")
        for loss, tau in (("nt_xent", "0.1"), ("nt_xent", "0.5"), ("hard_negative", "0.1"),
                          ("hard_negative", "0.5"), ("simple", ""))]
    for budget, steps in (("8x1", "8"), ("16x2", "32")):
        rows = read_csv(os.path.join(out, f"budget-{budget}", "sweep.csv"))
        mine = [r for r in table if r["budget"] == budget]
        assert {r["image_steps"] for r in mine} == {steps}
        nt = {float(r["tau"]): float(r["probe_accuracy"]) for r in rows if r["loss"] == "nt_xent"}
        best = max(sorted(nt), key=lambda t: nt[t])
        assert {float(r["best_tau"]) for r in mine} == {best}
        for row in mine:
            runs = [r for r in rows if r["loss"] == row["loss"] and r["tau"] == row["tau"]]
            for column in ("probe_accuracy", "knn_accuracy", "z_uniformity", "z_tolerance"):
                assert float(row[column]) == pytest.approx(statistics.fmean(float(r[column]) for r in runs))
    for name in CROSS_PLOTS:
        assert png(os.path.join(out, name)), name


def test_verdicts_by_budget_are_each_budgets_own(budget_study):
    out, printed = budget_study["out"], budget_study["printed"]
    by_budget = read_json(os.path.join(out, "verdicts_by_budget.json"))
    assert [b["budget"] for b in by_budget["budgets"]] == ["8x1", "16x2"]
    assert [b["image_steps"] for b in by_budget["budgets"]] == [8, 32]
    own = {b: {v["claim"]: v["status"] for v in read_json(os.path.join(out, f"budget-{b}", "verdicts.json"))}
           for b in ("8x1", "16x2")}
    assert len(by_budget["claims"]) == len(own["8x1"]) == 6
    for claim in by_budget["claims"]:
        statuses = [entry["status"] for entry in claim["by_budget"]]
        assert statuses == [own["8x1"][claim["claim"]], own["16x2"][claim["claim"]]]
        assert claim["changes"] == (statuses[0] != statuses[1])
        assert claim["where"] == describe_statuses([e["budget"] for e in claim["by_budget"]], statuses)
        assert f"[{'changes' if claim['changes'] else 'same'}] {claim['claim']}\n      {claim['where']}" in printed
    assert "Best tau (NT-Xent, mean probe accuracy) by budget: 8x1 (8 image-steps)" in printed


def test_a_verdict_that_changes_with_the_budget_is_reported(budget_study, tmp_path):
    """The study's own verdicts decide each budget's status: one that depends on the training
    length holds at one budget and not at the other, and the cross-budget view says where."""
    def epochs_verdicts(rows):
        longest = max(int(r["epoch"]) for r in rows)
        return [Verdict("Runs trained for 2 epochs", HOLDS if longest == 2 else FAILS, f"{longest} epoch(s)", "rule")]

    study = dataclasses.replace(studies.SWEEP, verdicts=epochs_verdicts)
    out = str(tmp_path / "copy")
    shutil.copytree(budget_study["out"], out)  # the other tests read the study's own verdicts
    result = run_budgets(study, out, budgets="8x1,16x2", resume=True, progress=False, jobs=1,
                         temperatures=[0.1, 0.5], seeds=1, batch_size=8,
                         data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 15})
    (claim,) = result.claims
    assert claim.changes and claim.statuses == [FAILS, HOLDS]
    assert claim.where == "does not hold here at 8x1 (8 image-steps), holds at 16x2 (32 image-steps)"
    stored = read_json(os.path.join(out, "verdicts_by_budget.json"))["claims"]
    assert stored == [claim.to_dict()]


def test_resume_with_other_budgets_is_refused(budget_study, capsys):
    assert main(["sweep", "--temperatures", "0.5,0.1", "--seeds", "1", "--budgets", "8x1", "--out",
                 budget_study["out"], "--resume"] + TINY) == 2
    assert "budgets: stored ['8x1', '16x2'] vs now ['8x1']" in capsys.readouterr().err


def test_report_of_a_study_over_budgets(budget_study):
    from contrastkit.report import report_html
    from contrastkit.report.html import detect_kind

    out = budget_study["out"]
    assert detect_kind(out) == "budgets" and detect_kind(os.path.join(out, "budget-8x1")) == "sweep"
    page = report_html(out, pictures=False)
    by_budget = read_json(os.path.join(out, "verdicts_by_budget.json"))
    assert "Verdicts by budget" in page and "budgets.csv" in page and "budget-16x2/" in page
    for claim in by_budget["claims"]:
        assert claim["claim"] in page


def test_experiment_over_budgets(tmp_path, capsys):
    """An experiment without a cross-budget table of its own still gets its verdicts by budget."""
    out = tmp_path / "pp"
    assert main(["experiment", "positive-pairs", "--seeds", "1", "--budgets", "8x1,16x1", "--epochs", "1",
                 "--out", str(out)] + TINY) == 2
    assert "leave out --epochs" in capsys.readouterr().err
    assert main(["experiment", "positive-pairs", "--seeds", "1", "--budgets", "8x1,16x1", "--out", str(out)]
                + TINY) == 0
    for budget in ("8x1", "16x1"):
        assert os.path.isfile(out / f"budget-{budget}" / "results.csv")
    assert not (out / "budgets.csv").exists()
    claims = read_json(out / "verdicts_by_budget.json")["claims"]
    assert claims and claims[0]["claim"].startswith("Pair definition B")
    assert "Verdicts by budget" in capsys.readouterr().out


# --- which variants run next to NT-Xent ----------------------------------------------------------

@pytest.mark.parametrize("variants, names", [
    (None, {"nt_xent", "hard_negative", "simple"}),
    ("simple", {"nt_xent", "simple"}),
    ("hard-negative", {"nt_xent", "hard_negative"}),
    ("none", {"nt_xent"}),
])
def test_the_variants_decide_the_runs(variants, names):
    from contrastkit.studies import SWEEP

    settings = SWEEP.settings(temperatures=[0.1, 0.5], seeds=2, variants=variants)
    specs = SWEEP.specs(settings)
    assert {spec.row for spec in specs} == names
    assert len([s for s in specs if s.row == "simple"]) == (2 if "simple" in names else 0)
    assert len([s for s in specs if s.row == "hard_negative"]) == (4 if "hard_negative" in names else 0)


def test_unknown_variants_are_refused_in_one_line(tmp_path, capsys):
    assert main(["sweep", "--variants", "simple,dcl", "--epochs", "1", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "variants" in err and "dcl" in err
    assert not (tmp_path / "x").exists()


def test_a_sweep_stored_without_a_setting_of_this_contrastkit_is_not_resumed(tmp_path):
    """A stored sweep.json lacking a setting (none is filled in at a default) is another
    sweep's: resuming it is refused naming the setting, and nothing is run."""
    from contrastkit.studies import SWEEP
    from contrastkit.studies.grid import prepare_out

    now = SWEEP.settings(temperatures=[0.1, 0.5], seeds=2)
    (tmp_path / SWEEP.settings_file).write_text(json.dumps({k: v for k, v in now.items() if k != "variants"}))
    with pytest.raises(ValueError, match=r"other settings \(variants: stored None vs now"):
        prepare_out(str(tmp_path), resume=True, force=False, owned=SWEEP.outputs, settings=now,
                    settings_file=SWEEP.settings_file, command=SWEEP.label)


def test_no_variants_and_variants_together_are_refused(tmp_path, capsys):
    assert main(["sweep", "--no-variants", "--variants", "simple", "--epochs", "1", "--out", str(tmp_path / "x")]) == 2
    assert "not both" in capsys.readouterr().err
