"""The positive-pairs experiment of the textbook (section 30.2, exercise F5) on GlyphLab.

GlyphLab's three-class orientation task: the same network, loss and temperature pretrained
with positive-pair definition ``A`` (two noise realisations of the same scene) and ``B`` (the
second realisation rotated by 90 degrees), judged by the same frozen-encoder linear probe
(C chosen on val, accuracy on test), next to the same network at random initialisation (and
raw pixels). Labels never form pairs; splits are by scene. Mean +/- std over seeds.

The folder: ``results.csv`` (one row per run, plus the baselines of each seed),
``verdicts.json``, ``positive_pairs.png``, ``experiment.json`` (settings) and ``runs/<run>/``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from contrastkit import layout
from contrastkit.losses import MIN_TEMPERATURE
from contrastkit.records import KNN_ACCURACY, PROBE_ACCURACY, RANDOM_INIT, RAW_PIXEL, baseline_key

from .grid import RunSpec
from .plots import POSITIVE_PAIRS_SETTINGS, plot_positive_pairs
from .rows import selected_columns, values
from .stats import mean_std
from .study import RUN_DEFAULTS, Study, check_counts, check_numbers, run_config
from .verdicts import Verdict, gap_verdict

__all__ = ["POSITIVE_PAIRS", "PAIRS", "positive_pairs_rows", "positive_pairs_verdicts", "positive_pairs_table"]

#: The two pair definitions: ``--views`` of ``contrastkit pretrain`` -> what they pair.
PAIRS = {"A": "A: two noise realisations", "B": "B: second view rotated 90 deg"}

# 6 runs (2 pair definitions x 3 seeds) of 150 epochs x 3 steps at batch 40: about 1 minute
# per run on 2 CPU cores (docs/temperature-study.md).
DEFAULTS: Dict[str, Any] = {"data_options": {}, "seeds": 3, "temperature": None, "epochs": 150, "batch_size": 40,
                            "device": "auto", "threads": None, **RUN_DEFAULTS}


def _check(settings: Dict[str, Any]) -> Dict[str, Any]:
    check_counts(settings)
    if settings["temperature"] is None:  # contrastkit pretrain's NT-Xent default, stored as a number
        from contrastkit.methods import get_method

        settings["temperature"] = get_method("simclr").default_temperature
    settings["temperature"] = check_numbers([settings["temperature"]], "temperature", MIN_TEMPERATURE)[0]
    return settings


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        for pairs in PAIRS:
            config = run_config(settings, data="glyphlab", method="simclr", views=pairs,
                                temperature=settings["temperature"], seed=seed)
            # A and B share the random initialisation of their seed: one baseline per seed.
            specs.append(RunSpec(f"pairs{pairs}-seed{seed}", PAIRS[pairs], f"seed {seed}", config,
                                 baselines=(pairs == "A")))
    return specs


def positive_pairs_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run, plus one ``random init`` and one ``raw pixels`` row per seed."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        seed = spec.config["seed"]
        rows.append({"setting": f"pairs {spec.config['views']}", "seed": seed, **selected_columns(s),
                     "final_loss": s.get("final_loss"), "run": spec.name})
        if baseline_key(PROBE_ACCURACY, RANDOM_INIT) in s:
            for baseline, setting in ((RANDOM_INIT, "random init"), (RAW_PIXEL, "raw pixels")):
                rows.append({"setting": setting, "seed": seed,
                             PROBE_ACCURACY: s[baseline_key(PROBE_ACCURACY, baseline)],
                             KNN_ACCURACY: s[baseline_key(KNN_ACCURACY, baseline)], "final_loss": "", "run": spec.name})
    return rows


def positive_pairs_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """Exercise F5's expectation (pairs B weaker than A) and the sanity checks it rests on."""
    a, b, base = (values(rows, PROBE_ACCURACY, setting=s) for s in ("pairs A", "pairs B", "random init"))
    verdicts = [gap_verdict("Pair definition B (90-degree rotation) gives a weaker orientation probe than A",
                            a, b, "A", "B")]
    if base:
        verdicts.append(gap_verdict("Pretraining with pairs A beats the same network at random init",
                                    a, base, "A", "random init"))
        verdicts.append(gap_verdict("Pretraining with pairs B beats the same network at random init",
                                    b, base, "B", "random init"))
    return verdicts


def positive_pairs_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean +/- std over seeds of the probe and kNN accuracy of every setting."""
    header = f"{'setting':<12} {'runs':>4} {'probe accuracy':>17} {'kNN accuracy':>17}  per seed (probe)"
    lines = [header, "-" * len(header)]
    for setting in POSITIVE_PAIRS_SETTINGS:
        probe = values(rows, PROBE_ACCURACY, setting=setting)
        if not probe:
            continue
        (pm, ps), (km, ks) = mean_std(probe), mean_std(values(rows, KNN_ACCURACY, setting=setting))
        lines.append(f"{setting:<12} {len(probe):>4} {pm:>8.4f} +/- {ps:.4f} {km:>8.4f} +/- {ks:.4f}  "
                     + " ".join(f"{v:.3f}" for v in probe))
    return "\n".join(lines)


#: The positive-pairs experiment, textbook 30.2 exercise F5 (``contrastkit experiment positive-pairs``).
POSITIVE_PAIRS = Study(
    name="positive-pairs",
    description="pair definition A vs B vs random init on GlyphLab (the textbook, section 30.2, exercise F5)",
    label="positive-pairs experiment", title="positive pairs (textbook 30.2, exercise F5)",
    folder="experiment-positive-pairs", settings_file=layout.EXPERIMENT_SETTINGS,
    table_file=layout.EXPERIMENT_TABLE, plot_files=(layout.POSITIVE_PAIRS_PLOT,), defaults=DEFAULTS,
    check=_check, specs=_specs, rows=positive_pairs_rows, verdicts=positive_pairs_verdicts,
    table=positive_pairs_table, plot=plot_positive_pairs,
    cell=lambda s: f"{s.get(PROBE_ACCURACY, float('nan')):.3f}",
    hints={"data": "positive-pairs runs on GlyphLab: pairs A and B are its noise realisations of one scene and its "
                   "orientation classes score them; for your own images use contrastkit experiment schedules --data "
                   "or contrastkit sweep --data"},
)
