"""Temperature schedules as a claim: a fixed tau vs a cosine schedule vs a rising ramp.

Two claims about *varying* tau during training, each tested against the same NT-Xent run with
a fixed tau (same data, epochs, batch, seed, read-out):

* Kukleva et al. (ICLR 2023): a cosine schedule ``tau_min + 0.5 (tau_max - tau_min)(1 + cos(pi e / T))``
  (``cosine:MIN,MAX``, falling once from MAX to MIN over the run) learns a better representation
  than a fixed tau;
* Wang & Liu (CVPR 2021), suggested there but not tested: raising tau as training goes on
  (``linear:START,END`` with ``START < END``) is better than a fixed tau.

Every run is read out by the protocol of the textbook, section 30.2 (exercise F5): with
``eval_every`` the val probe picks the epoch and the test probe of that epoch is compared
(:mod:`contrastkit.train.selection`). The runs of one seed share the initialisation, the
data order and the subsets, so each schedule is compared with the fixed tau *within* a seed.

The folder: ``results.csv`` (one row per run), ``verdicts.json``, ``schedules.png``,
``experiment.json`` (settings) and ``runs/<run>/``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from contrastkit import layout
from contrastkit.losses import MIN_TEMPERATURE
from contrastkit.records import PROBE_ACCURACY, VIEW_RETRIEVAL_TOP1

from .grid import RunSpec
from .plots import plot_schedules
from .rows import baselines_line, headline, schedule_columns, values
from .stats import mean_std
from .study import RUN_DEFAULTS, Study, check_counts, check_numbers, run_config
from .verdicts import PAIRED_SEED_RULE, Verdict, needs_labels_verdict, paired_seed_verdict

__all__ = ["SCHEDULES", "DEFAULT_COSINE", "DEFAULT_LINEAR", "schedules_rows", "schedules_verdicts",
           "schedules_table"]

#: Kukleva et al.'s range (tau- = 0.1, tau+ = 1.0), one fall over the run.
DEFAULT_COSINE = "cosine:0.1,1"
#: A rise over the range where NT-Xent reads out best on the data sets here (docs/temperature-study.md).
DEFAULT_LINEAR = "linear:0.1,0.5"
#: The row of the fixed-tau runs.
FIXED = "fixed"

DEFAULTS: Dict[str, Any] = {"data": "glyphlab", "data_options": {}, "seeds": 3, "temperature": None,
                            "cosine": DEFAULT_COSINE, "linear": DEFAULT_LINEAR, "epochs": 100, "batch_size": 40,
                            "device": "auto", "threads": None, **RUN_DEFAULTS}

_CLAIMS = {"cosine": "A cosine temperature schedule (Kukleva et al., ICLR 2023) beats a fixed tau",
           "linear": "Raising tau during training (suggested by Wang & Liu, CVPR 2021) beats a fixed tau"}


def _check(settings: Dict[str, Any]) -> Dict[str, Any]:
    from contrastkit.temperature import parse_schedule

    check_counts(settings)
    if settings["temperature"] is None:  # contrastkit pretrain's NT-Xent default, stored as a number
        from contrastkit.methods import get_method

        settings["temperature"] = get_method("simclr").default_temperature
    settings["temperature"] = check_numbers([settings["temperature"]], "temperature", MIN_TEMPERATURE)[0]
    for kind in ("cosine", "linear"):
        text = settings[kind]
        try:
            schedule = parse_schedule(str(text), settings["temperature"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"--{kind}: {err}") from None
        if schedule.kind != kind:
            raise ValueError(f"--{kind} must be a {kind}: schedule, got {text!r}")
        if schedule.lowest < MIN_TEMPERATURE:
            raise ValueError(f"--{kind} {text!r} goes below the supported minimum tau {MIN_TEMPERATURE}")
        settings[kind] = str(text)
    return settings


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        base = run_config(settings, data=settings["data"], method="simclr", temperature=settings["temperature"],
                          seed=seed)
        specs.append(RunSpec(f"fixed-seed{seed}", FIXED, f"seed {seed}", base, baselines=True))
        for kind in ("cosine", "linear"):
            specs.append(RunSpec(f"{kind}-seed{seed}", kind, f"seed {seed}",
                                 {**base, "temperature_schedule": settings[kind]}))
    return specs


def schedules_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run: its schedule (``fixed``, ``cosine``, ``linear``) and what it was, the
    seed, the read-out of the selected epoch and the last epoch, and the tau it ended at."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        schedule = spec.config.get("temperature_schedule", f"constant {spec.config['temperature']:g}")
        rows.append({"schedule": spec.row, "tau": schedule, "seed": spec.config["seed"],
                     **schedule_columns(s, spec.name)})
    return rows


def _by_seed(rows: Sequence[Dict[str, Any]], schedule: str) -> Dict[int, float]:
    return {int(row["seed"]): value for row in rows if row["schedule"] == schedule
            for value in values([row], PROBE_ACCURACY)}


def schedule_verdict(rows: Sequence[Dict[str, Any]], kind: str) -> Verdict:
    """The claim that schedule ``kind`` beats the fixed tau, judged on the per-seed differences."""
    described = next((str(r["tau"]) for r in rows if r["schedule"] == kind), kind)
    return paired_seed_verdict(_CLAIMS[kind], _by_seed(rows, FIXED), _by_seed(rows, kind),
                               compared=f"{described} minus fixed tau, probe accuracy of the selected epoch",
                               rule=PAIRED_SEED_RULE.format(other="schedule", baseline="fixed tau"))


def schedules_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """Kukleva et al.'s cosine schedule and Wang & Liu's rising tau, each against the fixed tau.
    On data without labels (no probe accuracy) neither is judged: both say they need labels."""
    if not values(rows, PROBE_ACCURACY):
        return [_needs_labels(rows, kind) for kind in ("cosine", "linear")]
    return [schedule_verdict(rows, kind) for kind in ("cosine", "linear")]


def _needs_labels(rows: Sequence[Dict[str, Any]], kind: str) -> Verdict:
    """Both claims are about probe accuracy: without labels they are not judged."""
    return needs_labels_verdict(_CLAIMS[kind], {name: values(rows, VIEW_RETRIEVAL_TOP1, schedule=name)
                                                for name in (FIXED, kind)}, "schedules")


def schedules_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean +/- std over seeds of the selected and last epochs' probe accuracy per schedule
    (without labels: of the held-out view retrieval top-1)."""
    if not values(rows, PROBE_ACCURACY):
        return _label_free_table(rows)
    header = (f"{'schedule':<8} {'tau':<18} {'runs':>4} {'probe acc (selected)':>22} {'probe acc (last)':>18} "
              f"{'epoch':>6}")
    lines = [header, "-" * len(header)]
    for schedule in list(dict.fromkeys(row["schedule"] for row in rows)):
        group = [row for row in rows if row["schedule"] == schedule]
        selected, last = mean_std(values(group, PROBE_ACCURACY)), mean_std(values(group, "last_probe_accuracy"))
        epochs = values(group, "epoch")
        lines.append(f"{schedule:<8} {str(group[0]['tau']):<18} {len(group):>4} {selected[0]:>13.4f} +/- "
                     f"{selected[1]:.4f} {last[0]:>9.4f} +/- {last[1]:.4f} {mean_std(epochs)[0]:>6.1f}")
    return "\n".join(lines + baselines_line(rows))


def _label_free_table(rows: Sequence[Dict[str, Any]]) -> str:
    header = f"{'schedule':<8} {'tau':<18} {'runs':>4} {'view retrieval top-1 (held out)':>32}"
    lines = [header, "-" * len(header)]
    for schedule in list(dict.fromkeys(row["schedule"] for row in rows)):
        group = [row for row in rows if row["schedule"] == schedule]
        mean, std = mean_std(values(group, VIEW_RETRIEVAL_TOP1))
        lines.append(f"{schedule:<8} {str(group[0]['tau']):<18} {len(group):>4} {mean:>23.4f} +/- {std:.4f}")
    lines.append("no labels: probe accuracy and the verdicts need labelled data")
    return "\n".join(lines)


#: Fixed tau vs cosine vs rising tau (``contrastkit experiment schedules``).
SCHEDULES = Study(
    name="schedules",
    description="NT-Xent with a fixed tau vs a cosine schedule (Kukleva et al., ICLR 2023) vs a rising tau "
                "(Wang & Liu, CVPR 2021), same budget and read-out",
    label="schedules experiment", title="temperature schedules", folder="experiment-schedules",
    settings_file=layout.EXPERIMENT_SETTINGS, table_file=layout.EXPERIMENT_TABLE,
    plot_files=(layout.SCHEDULES_PLOT,), defaults=DEFAULTS, check=_check, specs=_specs, rows=schedules_rows,
    verdicts=schedules_verdicts, table=schedules_table, plot=plot_schedules,
    cell=lambda s: headline(s.get("selected", s)),
)
