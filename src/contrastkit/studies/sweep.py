"""The temperature sweep: what tau does on real training runs (Wang & Liu, CVPR 2021).

One pretraining run per ``(tau, seed)`` with NT-Xent, plus the two columns of Wang & Liu's
Table 1 (unless ``no_variants``): the "simple" loss (no temperature: one run per seed) and
NT-Xent with explicit hard-negative mining (per ``(tau, seed)``). Every run is judged by the
same frozen-encoder linear probe; the representation metrics of its held-out test embeddings
(``h`` and ``z``) come from its ``summary.json``.

The folder: ``sweep.csv`` (one row per run), ``verdicts.json``, the five plots of
:data:`contrastkit.layout.SWEEP_PLOTS`, ``sweep.json`` (settings) and ``runs/<run>/``.
Over training budgets (:mod:`.budgets`) a sweep adds :func:`sweep_means` per budget and the
plots of :func:`~contrastkit.studies.plots.plot_sweep_budgets`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Sequence

from contrastkit import layout
from contrastkit.losses import MIN_TEMPERATURE
from contrastkit.records import KNN_ACCURACY, PROBE_ACCURACY, RANDOM_INIT, RAW_PIXEL, baseline_key

from .grid import RunSpec
from .plots import plot_sweep, plot_sweep_budgets
from .rows import PROFILE_LENGTH, best_tau, by_tau, headline, selected_columns, selected_numbers, values
from .stats import mean_std, spearman
from .study import RUN_DEFAULTS, Study, check_counts, check_numbers, run_config
from .verdicts import NEEDS_LABELS, UNDECIDED, Verdict, correlation_status, gap_verdict, margin_status

__all__ = ["SWEEP", "LOSSES", "DEFAULT_TEMPERATURES", "sweep_rows", "sweep_verdicts", "sweep_table", "sweep_means"]

DEFAULT_TEMPERATURES = (0.05, 0.1, 0.2, 0.5, 1.0)
#: A sweep row's loss -> the ``contrastkit pretrain`` method that trains it.
LOSSES = {"nt_xent": "simclr", "hard_negative": "hard_negative", "simple": "simple"}
METRIC_KEYS = ("alignment", "uniformity", "tolerance", "positive_similarity", "penalty_entropy",
               "penalty_entropy_max", "effective_rank")

#: The runs next to NT-Xent's (Wang & Liu's Table 1): hard-negative NT-Xent at each tau, the
#: simple loss once per seed.
VARIANTS = ("hard_negative", "simple")

# 33 runs (5 tau x 3 seeds x 2 losses + 3 simple) in <= 30 minutes on 2 CPU cores on glyphlab:
# about 40 s per run (300 steps of ~0.11 s, one thread, plus evaluation; docs/temperature-study.md).
DEFAULTS: Dict[str, Any] = {
    "data": "glyphlab", "data_options": {}, "temperatures": list(DEFAULT_TEMPERATURES), "seeds": 3,
    "views": "augment", "epochs": 100, "batch_size": 40, "device": "auto", "threads": None, "no_variants": False,
    "variants": list(VARIANTS),
    **RUN_DEFAULTS,
}


def _check(settings: Dict[str, Any]) -> Dict[str, Any]:
    check_counts(settings)
    settings["temperatures"] = check_numbers(settings["temperatures"], "temperatures", MIN_TEMPERATURE)
    settings["no_variants"] = bool(settings["no_variants"])
    variants = [] if settings["no_variants"] else settings.get("variants", list(VARIANTS))
    if isinstance(variants, str):
        variants = [v.strip().replace("-", "_") for v in variants.split(",") if v.strip() and v.strip() != "none"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or len(set(variants)) != len(variants):
        raise ValueError("--variants must be distinct names among "
                         f"{', '.join(v.replace('_', '-') for v in VARIANTS)} (or none), got {','.join(variants)}")
    settings["variants"] = [v for v in VARIANTS if v in variants]
    return settings


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    base = run_config(settings, data=settings["data"], views=settings["views"])
    losses = ["nt_xent"] + (["hard_negative"] if "hard_negative" in settings["variants"] else [])
    specs = []
    for seed in range(settings["seeds"]):  # seed-major: an interrupted sweep still has whole curves
        for loss in losses:
            for tau in settings["temperatures"]:
                specs.append(RunSpec(f"{loss}-tau{tau:g}-seed{seed}", loss, f"tau {tau:g}",
                                     {**base, "method": LOSSES[loss], "temperature": tau, "seed": seed},
                                     baselines=(loss == "nt_xent" and tau == settings["temperatures"][0])))
        if "simple" in settings["variants"]:
            specs.append(RunSpec(f"simple-seed{seed}", "simple", "no tau",
                                 {**base, "method": "simple", "seed": seed}))
    return specs


def sweep_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One flat row per finished run: settings, accuracies and the test-set metrics of
    ``z`` and ``h`` (``z_top_negative_1..10`` is the similarity profile), all of the epoch the
    val read-out selected (:func:`~contrastkit.studies.rows.selected_columns`)."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        selected = selected_numbers(s)
        row: Dict[str, Any] = {
            "loss": spec.row, "method": spec.config["method"],
            "tau": spec.config.get("temperature", "") if spec.row != "simple" else "",
            "seed": spec.config["seed"], **selected_columns(s), "final_loss": s.get("final_loss"),
            baseline_key(PROBE_ACCURACY, RANDOM_INIT): s.get(baseline_key(PROBE_ACCURACY, RANDOM_INIT), ""),
            baseline_key(PROBE_ACCURACY, RAW_PIXEL): s.get(baseline_key(PROBE_ACCURACY, RAW_PIXEL), ""),
            "train_seconds": s.get("train_seconds"), "run": spec.name,
        }
        geometry = selected.get("representation", {})
        for space in ("z", "h"):
            metrics = geometry.get(space, {})
            for key in METRIC_KEYS:
                row[f"{space}_{key}"] = metrics.get(key, "")
            profile = metrics.get("top_negative_similarity", [])
            for k in range(PROFILE_LENGTH):
                row[f"{space}_top_negative_{k + 1}"] = profile[k] if k < len(profile) else ""
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ verdicts

def _fmt_curve(curve: Dict[float, List[float]]) -> str:
    return ", ".join(f"tau {t:g}: {mean_std(v)[0]:.4f}" for t, v in curve.items())


def _trend_verdict(claim: str, curve: Dict[float, List[float]], what: str, expected_sign: int) -> Verdict:
    taus = list(curve)
    means = [mean_std(v)[0] for v in curve.values()]
    rho = spearman(taus, means) if len(taus) >= 3 else math.nan
    rule = ("holds if Spearman's rank correlation between tau and the mean "
            f"{what} over seeds is {'>= +0.8' if expected_sign > 0 else '<= -0.8'}; does not hold if it has the "
            "other sign or is 0; inconclusive otherwise (needs >= 3 temperatures)")
    return Verdict(claim, correlation_status(rho * expected_sign), f"{what}: {_fmt_curve(curve)}; "
                   f"Spearman rho = {rho:+.2f}", rule)


def _dilemma_verdict(rows: Sequence[Dict[str, Any]]) -> Verdict:
    """Across all runs, a more uniform ``z`` goes with a less tolerant one."""
    points = [(values([r], "z_uniformity"), values([r], "z_tolerance")) for r in rows]
    points = [(u[0], t[0]) for u, t in points if u and t]
    rho = spearman([u for u, _ in points], [t for _, t in points]) if len(points) >= 3 else math.nan
    return Verdict("Uniformity and tolerance trade off (a more uniform z is a less tolerant one)",
                   correlation_status(rho),
                   f"Spearman rho(uniformity, tolerance) over {len(points)} runs of every loss = {rho:+.2f}",
                   "holds if rho >= +0.8 (uniformity falls, i.e. improves, together with tolerance); does not "
                   "hold if rho <= 0; inconclusive otherwise (needs >= 3 runs)")


def _reverse_u_verdict(accuracy: Dict[float, List[float]]) -> Verdict:
    taus = list(accuracy)
    rule = ("holds if the tau with the best mean probe accuracy is neither the smallest nor the largest "
            "tried and both ends are below it by more than the largest standard deviation over seeds (needs >= 2 "
            "seeds); does not hold "
            "if the best tau is at an end; inconclusive otherwise (needs >= 3 temperatures)")
    claim = "Probe accuracy is reverse-U shaped in tau (the best tau is interior)"
    if len(taus) < 3:
        return Verdict(claim, UNDECIDED, f"only {len(taus)} temperature(s)", rule)
    means = {t: mean_std(v)[0] for t, v in accuracy.items()}
    best = max(taus, key=lambda t: means[t])
    noise = max(mean_std(v)[1] for v in accuracy.values())
    drops = (means[best] - means[taus[0]], means[best] - means[taus[-1]])
    status = margin_status(contrary=best in (taus[0], taus[-1]), margin=min(drops), noise=noise,
                           runs=min(len(v) for v in accuracy.values()))
    evidence = (f"probe accuracy: {_fmt_curve(accuracy)}; best tau {best:g}; drop to the ends "
                f"{drops[0]:+.4f} / {drops[1]:+.4f} vs largest std {noise:.4f}")
    return Verdict(claim, status, evidence, rule)


def _hard_negative_verdict(accuracy: Dict[float, List[float]], hard: Dict[float, List[float]]) -> Verdict:
    means = [mean_std(v)[0] for v in accuracy.values()]
    hard_means = [mean_std(v)[0] for v in hard.values()]
    spread_nt = max(means) - min(means)
    spread_hn = max(hard_means) - min(hard_means)
    curves = list(accuracy.values()) + list(hard.values())
    noise = statistics.fmean([mean_std(v)[1] for v in curves])
    difference = spread_nt - spread_hn
    status = margin_status(contrary=spread_hn >= spread_nt, margin=difference, noise=noise,
                           runs=min(len(v) for v in curves))
    evidence = (f"spread of mean probe accuracy over tau: NT-Xent {spread_nt:.4f}, hard-negative "
                f"{spread_hn:.4f} (difference {difference:+.4f} vs mean seed std {noise:.4f}); "
                f"hard-negative {_fmt_curve(hard)}")
    rule = ("spread = max - min over tau of the mean accuracy; holds if the hard-negative spread is "
            "smaller by more than the mean standard deviation over seeds (needs >= 2 seeds); does not hold if "
            "it is not smaller; inconclusive otherwise")
    return Verdict("Hard-negative mining makes accuracy less sensitive to tau", status, evidence, rule)


def _label_free_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """A sweep on unlabeled data: the uniformity trend is judged; the claims about accuracy and
    tolerance (which need class labels) say so."""
    rule = "the data carry no class labels: run the sweep on labelled data (class folders) to judge it"
    needs = [Verdict(claim, NEEDS_LABELS, "no probe accuracy or tolerance without labels", rule) for claim in (
        "Probe accuracy is reverse-U shaped in tau (the best tau is interior)",
        "Larger tau makes the embedding more tolerant (tolerance rises with tau)",
        "Uniformity and tolerance trade off (a more uniform z is a less tolerant one)",
        "The simple loss trains worse than the best NT-Xent")]
    return [_trend_verdict("Smaller tau makes the embedding more uniform (uniformity rises with tau)",
                           by_tau(rows, "nt_xent", "z_uniformity"), "uniformity of z (lower = more uniform)", +1),
            *needs]


def sweep_verdicts(rows: Sequence[Dict[str, Any]]) -> List[Verdict]:
    """The claims of Wang & Liu (CVPR 2021), each judged from a sweep's rows by a stated rule.

    Uniformity and tolerance are read on ``z``, the embedding the loss acts on.
    """
    accuracy = by_tau(rows, "nt_xent", PROBE_ACCURACY)
    if not any(values(rows, PROBE_ACCURACY)):  # unlabeled data: only the label-free claims are judged
        return _label_free_verdicts(rows)
    verdicts = [
        _reverse_u_verdict(accuracy),
        _trend_verdict("Smaller tau makes the embedding more uniform (uniformity rises with tau)",
                       by_tau(rows, "nt_xent", "z_uniformity"), "uniformity of z (lower = more uniform)", +1),
        _trend_verdict("Larger tau makes the embedding more tolerant (tolerance rises with tau)",
                       by_tau(rows, "nt_xent", "z_tolerance"), "tolerance of z", +1),
        _dilemma_verdict(rows),
    ]
    simple = values(rows, PROBE_ACCURACY, loss="simple")
    best = best_tau(rows)
    if simple and best is not None:
        verdicts.append(gap_verdict("The simple loss trains worse than the best NT-Xent",
                                    accuracy[best], simple, f"NT-Xent (tau {best:g})", "simple loss"))
    hard = by_tau(rows, "hard_negative", PROBE_ACCURACY)
    if hard and len(accuracy) >= 2:
        verdicts.append(_hard_negative_verdict(accuracy, hard))
    return verdicts


# ------------------------------------------------------------------------------ table

def _settings(rows: Sequence[Dict[str, Any]]) -> Dict[tuple, List[Dict[str, Any]]]:
    """The runs of each ``(loss, tau)``, in the rows' order (tau ``""`` for the simple loss)."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["loss"], row["tau"]), []).append(row)
    return groups


def _mean(group: Sequence[Dict[str, Any]], key: str) -> float:
    found = values(group, key)
    return mean_std(found)[0] if found else math.nan


#: The columns of :func:`sweep_means`: (column, sweep row key, statistic).
MEAN_COLUMNS = ((PROBE_ACCURACY, PROBE_ACCURACY, 0), ("probe_accuracy_std", PROBE_ACCURACY, 1),
                (KNN_ACCURACY, KNN_ACCURACY, 0), ("z_uniformity", "z_uniformity", 0),
                ("z_tolerance", "z_tolerance", 0))


def sweep_means(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per ``(loss, tau)`` of a sweep: the runs, the mean over seeds of the probe
    accuracy (and its standard deviation), kNN accuracy, uniformity and tolerance of ``z``, and
    the sweep's :func:`~contrastkit.studies.rows.best_tau` (``""``: none): a budget's rows of the
    cross-budget table."""
    best = best_tau(rows)
    out = []
    for (loss, tau), group in _settings(rows).items():
        row: Dict[str, Any] = {"loss": loss, "tau": tau, "runs": len(group)}
        for column, key, statistic in MEAN_COLUMNS:
            found = values(group, key)
            row[column] = mean_std(found)[statistic] if found else ""
        row["best_tau"] = "" if best is None else best
        out.append(row)
    return out


def sweep_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean over seeds of every (loss, tau): accuracies and the geometry of ``z`` / ``h``."""
    groups = _settings(rows)
    header = (f"{'loss':<14} {'tau':>5} {'runs':>4} {'probe acc':>17} {'kNN acc':>7} {'unif(z)':>8} "
              f"{'tol(z)':>7} {'pos(z)':>7} {'neg1(z)':>7} {'H_pen(z)':>8} {'erank(h)':>8}")
    lines = [header, "-" * len(header)]
    for (loss, tau), group in groups.items():
        accuracies = values(group, PROBE_ACCURACY)
        acc_mean, acc_std = mean_std(accuracies) if accuracies else (math.nan, math.nan)
        lines.append(f"{loss:<14} {str(tau if tau != '' else '-'):>5} {len(group):>4} "
                     f"{acc_mean:>8.4f} +/- {acc_std:.4f} {_mean(group, 'knn_accuracy'):>7.4f} "
                     f"{_mean(group, 'z_uniformity'):>8.4f} {_mean(group, 'z_tolerance'):>7.4f} "
                     f"{_mean(group, 'z_positive_similarity'):>7.4f} {_mean(group, 'z_top_negative_1'):>7.4f} "
                     f"{_mean(group, 'z_penalty_entropy'):>8.4f} {_mean(group, 'h_effective_rank'):>8.2f}")
    random_init = values(rows, baseline_key(PROBE_ACCURACY, RANDOM_INIT))
    pixels = values(rows, baseline_key(PROBE_ACCURACY, RAW_PIXEL))
    if random_init:
        lines.append(f"baselines: random-init encoder {mean_std(random_init)[0]:.4f} +/- {mean_std(random_init)[1]:.4f}, "
                     f"raw pixels {mean_std(pixels)[0]:.4f} +/- {mean_std(pixels)[1]:.4f}")
    return "\n".join(lines)


#: The temperature sweep after Wang & Liu, CVPR 2021 (``contrastkit sweep``).
SWEEP = Study(
    name="sweep", description="NT-Xent, hard-negative NT-Xent and the simple loss over a grid of tau and seeds, "
                              "judged against the claims of Wang & Liu (CVPR 2021)",
    label="sweep", title="temperature sweep", folder="sweep",
    settings_file=layout.SWEEP_SETTINGS, table_file=layout.SWEEP_TABLE, plot_files=layout.SWEEP_PLOTS,
    defaults=DEFAULTS, check=_check, specs=_specs, rows=sweep_rows, verdicts=sweep_verdicts, table=sweep_table,
    plot=plot_sweep, cell=headline, budget_table=sweep_means, budget_plot=plot_sweep_budgets,
    budget_plot_files=layout.BUDGET_PLOTS,
)
