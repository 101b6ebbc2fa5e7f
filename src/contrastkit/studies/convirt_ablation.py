"""The ConVIRT ablation: direction weight lambda x temperature tau (the ConVIRT tutorial).

The ConVIRT loss ``L = mean_i [lambda l_i(v->u) + (1 - lambda) l_i(u->v)]`` with
``lambda = 0.75``, ``tau = 0.1``; the tutorial reports that ``tau = 0.01`` and ``tau = 1``
both hurt retrieval. This study pretrains ``contrastkit pretrain --method convirt`` on
glyphlab-text for every ``lambda`` x ``tau`` (x seed) and judges each run by held-out
retrieval (image->text and text->image Recall@1/5/10 on the test pairs), zero-shot
orientation accuracy and the linear probe of the image encoder.

The folder: ``results.csv`` (one row per run), ``verdicts.json``, ``convirt_ablation.png``
(heat maps and per-direction curves), ``experiment.json`` (settings) and ``runs/<run>/``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Sequence

from contrastkit import layout
from contrastkit.losses import MIN_TEMPERATURE
from contrastkit.records import PROBE_ACCURACY, RANDOM_INIT, baseline_key

from .grid import RunSpec
from .plots import plot_convirt_ablation
from .rows import RETRIEVAL_K, cell_means, retrieval, selected_numbers
from .stats import binomial_standard_error, spearman
from .study import RUN_DEFAULTS, Study, check_counts, check_numbers, run_config
from .verdicts import FAILS, HOLDS, UNDECIDED, Verdict

__all__ = ["CONVIRT_ABLATION", "DEFAULT_WEIGHTS", "DEFAULT_TEMPERATURES", "DEFAULT_DATA_OPTIONS", "ablation_rows",
           "ablation_verdicts", "ablation_table"]

DEFAULT_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_TEMPERATURES = (0.01, 0.1, 1.0)
#: glyphlab-text split sizes, under the user's ``data_options``.
DEFAULT_DATA_OPTIONS = {"train_scenes": 400, "val_scenes": 100, "test_scenes": 300}
# 15 runs of 10 epochs x 6 steps (400 training pairs, batch 64) plus evaluation;
# docs/convirt.md has the measured time on 2 CPU cores.
DEFAULTS: Dict[str, Any] = {"data_options": {}, "seeds": 1, "weights": list(DEFAULT_WEIGHTS),
                            "temperatures": list(DEFAULT_TEMPERATURES), "epochs": 10, "batch_size": 64,
                            "device": "auto", "threads": None, "text_encoder": "mean", **RUN_DEFAULTS}
_METRICS = ("i2t_recall@1", "i2t_recall@5", "i2t_recall@10", "t2i_recall@1", "t2i_recall@5", "t2i_recall@10")
K = RETRIEVAL_K


def _check(settings: Dict[str, Any]) -> Dict[str, Any]:
    check_counts(settings)
    settings["weights"] = check_numbers(settings["weights"], "weights", 0.0, 1.0)
    settings["temperatures"] = check_numbers(settings["temperatures"], "temperatures", MIN_TEMPERATURE, 100.0)
    settings["data_options"] = {**DEFAULT_DATA_OPTIONS, **settings["data_options"]}
    return settings


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        for tau in settings["temperatures"]:
            for weight in settings["weights"]:
                config = run_config(settings, data="glyphlab-text", method="convirt", weight=weight,
                                    temperature=tau, seed=seed, text_encoder=settings["text_encoder"])
                # The random-init / raw-pixel probe baselines depend on the seed only: once per seed.
                first = (tau == settings["temperatures"][0] and weight == settings["weights"][0])
                specs.append(RunSpec(f"lambda{weight:g}-tau{tau:g}-seed{seed}", f"tau {tau:g}",
                                     f"lambda {weight:g}", config, baselines=first))
    return specs


def ablation_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run: lambda, tau, seed, retrieval recalls, chance, zero-shot, probe, loss."""
    rows = []
    for spec in specs:
        summary = spec.summary or {}
        s = {**summary, **selected_numbers(summary)}  # the numbers of the epoch the val read-out selected
        row: Dict[str, Any] = {"lambda": spec.config["weight"], "tau": spec.config["temperature"],
                               "seed": spec.config["seed"], "epoch": summary.get("selected_epoch", summary.get("epochs"))}
        for key in _METRICS:
            row[key] = s.get(f"retrieval_{key}")
        row[f"chance_recall@{K}"] = s.get(f"retrieval_chance_recall@{K}")
        row[f"fact_ceiling_recall@{K}"] = s.get(f"retrieval_fact_ceiling_recall@{K}")
        row["pairs"] = s.get("retrieval_pairs")
        row["zero_shot_accuracy"] = s.get("zero_shot_accuracy")
        row[PROBE_ACCURACY] = s.get(PROBE_ACCURACY)
        row[baseline_key(PROBE_ACCURACY, RANDOM_INIT)] = s.get(baseline_key(PROBE_ACCURACY, RANDOM_INIT), "")
        row["final_loss"] = s.get("final_loss")
        row["train_seconds"] = s.get("train_seconds")
        row["run"] = spec.name
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ verdicts

def _standard_error(p: float, pairs: Any, runs: int) -> float:
    """Binomial standard error of a recall ``p`` measured on ``pairs`` queries in each of ``runs`` runs."""
    try:
        trials = int(pairs) * max(1, runs)
    except (TypeError, ValueError):
        return math.nan
    return binomial_standard_error(p, trials)


def _paired_tau_verdict(rows: Sequence[Dict[str, Any]], reference_tau: float, other_tau: float) -> Verdict:
    """Claim: ``other_tau`` hurts retrieval vs ``reference_tau``, compared within each (lambda, seed)."""
    by_key = {(float(r["lambda"]), int(r["seed"]), float(r["tau"])): retrieval(r) for r in rows}
    pairs = sorted({(lam, seed) for lam, seed, _ in by_key})
    gaps = [by_key[(lam, seed, reference_tau)] - by_key[(lam, seed, other_tau)] for lam, seed in pairs
            if (lam, seed, reference_tau) in by_key and (lam, seed, other_tau) in by_key]
    claim = f"tau = {other_tau:g} hurts retrieval compared with tau = {reference_tau:g}"
    rule = (f"retrieval = mean of image->text and text->image Recall@{K} on the test pairs; compared "
            f"within each (lambda, seed) cell: holds if tau = {reference_tau:g} is better in every cell, does not "
            "hold if the mean gap is <= 0, inconclusive otherwise")
    if not gaps:
        return Verdict(claim, UNDECIDED, "no cells with both temperatures", rule)
    wins = sum(g > 0 for g in gaps)
    mean_gap = statistics.fmean(gaps)
    ref = statistics.fmean(retrieval(r) for r in rows if float(r["tau"]) == reference_tau)
    oth = statistics.fmean(retrieval(r) for r in rows if float(r["tau"]) == other_tau)
    status = HOLDS if wins == len(gaps) else (FAILS if mean_gap <= 0 else UNDECIDED)
    error = _standard_error(ref, rows[0].get("pairs"), 1)
    evidence = (f"mean R@{K} tau={reference_tau:g} {ref:.4f} vs tau={other_tau:g} {oth:.4f}; "
                f"tau={reference_tau:g} better in {wins}/{len(gaps)} cells, mean gap {mean_gap:+.4f} "
                f"(binomial standard error of one cell {error:.4f})")
    return Verdict(claim, status, evidence, rule)


def _direction_verdict(at_ref: Sequence[Dict[str, Any]], reference_tau: float) -> List[Verdict]:
    """Claim: lambda moves quality from text->image to image->text retrieval."""
    diff = cell_means(at_ref, lambda r: float(r[f"i2t_recall@{K}"]) - float(r[f"t2i_recall@{K}"]))
    lams = sorted(lam for lam, _ in diff)
    if len(lams) < 3:
        return []
    values = [diff[(lam, reference_tau)] for lam in lams]
    rho = spearman(lams, values)
    status = HOLDS if (rho >= 0.7 and values[-1] > values[0]) else (
        FAILS if (math.isnan(rho) or rho <= 0) else UNDECIDED)
    return [Verdict(
        f"a larger lambda favours image->text over text->image retrieval (tau = {reference_tau:g})", status,
        f"i2t - t2i R@{K} by lambda: " + ", ".join(f"{lam:g}: {v:+.4f}" for lam, v in zip(lams, values))
        + f"; Spearman rho {rho:.3f}",
        "holds if Spearman's rho between lambda and (i2t - t2i Recall@5) is >= 0.7 and the largest lambda "
        "has the larger difference; does not hold if rho <= 0; inconclusive otherwise")]


def _best_weight_verdict(at_ref: Sequence[Dict[str, Any]], reference_tau: float, reference_weight: float,
                         weights: int) -> List[Verdict]:
    """Claim: ConVIRT's lambda is the best of the ``weights`` direction weights at the reference tau."""
    means = cell_means(at_ref, retrieval)
    if (reference_weight, reference_tau) not in means or weights < 2:
        return []
    lams = sorted(lam for lam, _ in means)
    best = max(means, key=means.get)
    ours = means[(reference_weight, reference_tau)]
    runs = sum(1 for r in at_ref if float(r["lambda"]) == reference_weight)
    error = _standard_error(ours, at_ref[0].get("pairs"), runs)
    gap = means[best] - ours
    status = HOLDS if gap <= 0 else (FAILS if gap > 2 * error else UNDECIDED)
    return [Verdict(
        f"ConVIRT's lambda = {reference_weight:g} gives the best retrieval among the lambdas at "
        f"tau = {reference_tau:g}", status,
        ", ".join(f"lambda {lam:g}: {means[(lam, reference_tau)]:.4f}" for lam in lams)
        + f"; best lambda {best[0]:g}, gap {gap:+.4f}, binomial standard error {error:.4f}",
        f"holds if no other lambda has a higher mean R@{K} (mean of both directions, over seeds); "
        "does not hold if the best is higher by more than 2 binomial standard errors "
        "(sqrt(p (1 - p) / pairs / runs)); inconclusive otherwise")]


def ablation_verdicts(rows: Sequence[Dict[str, Any]], reference_tau: float = 0.1,
                      reference_weight: float = 0.75) -> List[Verdict]:
    """The ConVIRT tutorial's claims (tau = 0.01 and tau = 1 hurt; lambda = 0.75), judged from the rows."""
    taus = sorted({float(r["tau"]) for r in rows})
    if reference_tau not in taus:
        return []
    low = [t for t in taus if t < reference_tau]
    high = [t for t in taus if t > reference_tau]
    verdicts = [_paired_tau_verdict(rows, reference_tau, t) for t in (low[:1] + high[-1:])]
    if len(verdicts) == 2:
        statuses = {p.status for p in verdicts}
        status = HOLDS if statuses == {HOLDS} else (FAILS if FAILS in statuses else UNDECIDED)
        verdicts.append(Verdict(
            f"tau = {low[0]:g} and tau = {high[-1]:g} both hurt retrieval vs tau = {reference_tau:g} "
            "(the source's claim)", status, " | ".join(p.evidence for p in verdicts),
            "holds if both parts hold, does not hold if either does not, inconclusive otherwise"))
    at_ref = [r for r in rows if float(r["tau"]) == reference_tau]
    return (verdicts + _direction_verdict(at_ref, reference_tau)
            + _best_weight_verdict(at_ref, reference_tau, reference_weight, len({float(r["lambda"]) for r in rows})))


# ------------------------------------------------------------------------------ table

def ablation_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean over seeds of image->text / text->image Recall@5 for every (lambda, tau)."""
    taus = sorted({float(r["tau"]) for r in rows})
    lams = sorted({float(r["lambda"]) for r in rows})
    i2t = cell_means(rows, lambda r: float(r[f"i2t_recall@{K}"]))
    t2i = cell_means(rows, lambda r: float(r[f"t2i_recall@{K}"]))
    zs = cell_means(rows, lambda r: float(r["zero_shot_accuracy"]) if r["zero_shot_accuracy"] is not None else math.nan)
    chance = rows[0][f"chance_recall@{K}"]
    ceiling = rows[0][f"fact_ceiling_recall@{K}"]
    header = f"{'lambda':>6} | " + " | ".join(f"{'tau ' + format(t, 'g'):^22}" for t in taus)
    sub = f"{'':>6} | " + " | ".join(f"{'i2t':>6} {'t2i':>6} {'0-shot':>7}" for _ in taus)
    lines = [f"Recall@{K} on held-out pairs (image->text, text->image) and zero-shot accuracy; "
             f"chance R@{K} {chance:.4f}, fact ceiling {ceiling:.4f}", header, sub, "-" * len(header)]
    for lam in lams:
        cells = []
        for t in taus:
            if (lam, t) in i2t:
                cells.append(f"{i2t[(lam, t)]:>6.3f} {t2i[(lam, t)]:>6.3f} {zs[(lam, t)]:>7.3f}")
            else:
                cells.append(f"{'-':>22}")
        lines.append(f"{lam:>6g} | " + " | ".join(cells))
    return "\n".join(lines)


#: The ConVIRT lambda x tau ablation (``contrastkit experiment convirt-ablation``).
CONVIRT_ABLATION = Study(
    name="convirt-ablation",
    description="ConVIRT's direction weight lambda x tau on glyphlab-text, judged by retrieval (the ConVIRT tutorial)",
    label="convirt ablation", title="ConVIRT lambda x tau", folder="experiment-convirt-ablation",
    settings_file=layout.EXPERIMENT_SETTINGS, table_file=layout.EXPERIMENT_TABLE,
    plot_files=(layout.CONVIRT_ABLATION_PLOT,), defaults=DEFAULTS, check=_check, specs=_specs, rows=ablation_rows,
    verdicts=ablation_verdicts, table=ablation_table, plot=plot_convirt_ablation,
    cell=lambda s: f"{s.get(f'retrieval_i2t_recall@{K}', float('nan')):.2f}"
                   f"/{s.get(f'retrieval_t2i_recall@{K}', float('nan')):.2f}",
    hints={"temperature": "convirt-ablation sweeps the temperature: use --temperatures, not --temperature",
           "data": "convirt-ablation trains on GlyphLab's image-text pairs (its retrieval needs the texts); for "
                   "your own images use contrastkit experiment schedules --data or contrastkit sweep --data"},
)
