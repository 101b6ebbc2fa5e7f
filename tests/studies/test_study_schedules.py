"""The temperature-schedules study (``contrastkit experiment schedules``): its verdict rule and a
tiny run on GlyphLab."""

from __future__ import annotations

import os

import pytest

from contrastkit import layout, studies
from contrastkit.cli import main
from contrastkit.studies.schedules import schedule_verdict


def _rows(fixed, varied):
    rows = [{"schedule": "fixed", "tau": "constant 0.2", "seed": s, "probe_accuracy": v} for s, v in enumerate(fixed)]
    rows += [{"schedule": "cosine", "tau": "cosine:0.1,1", "seed": s, "probe_accuracy": v}
             for s, v in enumerate(varied)]
    return rows


@pytest.mark.parametrize("fixed, varied, status", [
    ([0.50, 0.52, 0.51], [0.55, 0.56, 0.56], studies.HOLDS),        # +0.047 mean, 2 SE = 0.007
    ([0.50, 0.52, 0.51], [0.49, 0.50, 0.51], studies.FAILS),        # mean difference < 0
    ([0.50, 0.52, 0.51], [0.56, 0.50, 0.52], studies.UNDECIDED),    # +0.017 mean, 2 SE = 0.04
    ([0.50], [0.60], studies.UNDECIDED),                            # one seed: no noise estimate
])
def test_schedule_verdict_rule(fixed, varied, status):
    verdict = schedule_verdict(_rows(fixed, varied), "cosine")
    assert verdict.status == status
    assert "2 standard errors" in verdict.rule and "cosine:0.1,1" in verdict.evidence


def test_schedules_study_runs_on_glyphlab(tmp_path):
    out = tmp_path / "schedules"
    result = studies.run_experiment("schedules", str(out), progress=False, seeds=2, epochs=2, batch_size=20,
                                    train_limit=40, eval_every=1, jobs=1)  # in this process, one run at a time
    assert len(result.specs) == 6 and len(result.rows) == 6
    assert [v.claim for v in result.verdicts] == [studies.SCHEDULES.verdicts(result.rows)[i].claim for i in (0, 1)]
    assert all(v.status in studies.STATUSES for v in result.verdicts)
    assert {row["schedule"] for row in result.rows} == {"fixed", "cosine", "linear"}
    assert all(row["epoch"] in (1, 2) for row in result.rows)
    for name in (layout.EXPERIMENT_TABLE, layout.VERDICTS, layout.SCHEDULES_PLOT, layout.EXPERIMENT_SETTINGS):
        assert os.path.isfile(out / name)
    cosine = next(s for s in result.specs if s.row == "cosine")
    assert cosine.summary["temperature_schedule"] == "cosine:0.1,1"
    assert cosine.summary["final_temperature"] == pytest.approx(0.1, rel=1e-5)
    assert "fixed" in result.table() and "baselines" in result.table()


def test_schedules_option_must_be_its_kind(capsys):
    assert main(["experiment", "schedules", "--cosine", "linear:0.1,0.5", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cosine" in err[0]
