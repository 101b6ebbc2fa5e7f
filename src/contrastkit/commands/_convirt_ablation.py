"""``contrastkit experiment convirt-ablation``: ConVIRT's direction weight and temperature.

SPEC section 3: the ConVIRT loss ``L = mean_i [lambda l_i(v->u) + (1 - lambda) l_i(u->v)]``
with ``lambda = 0.75``, ``tau = 0.1``; the source reports that ``tau = 0.01`` and ``tau = 1``
both hurt retrieval. This experiment pretrains ``contrastkit pretrain --method convirt`` on
glyphlab-text for every ``lambda`` x ``tau`` (x seed) and judges each run by held-out
retrieval (image->text and text->image Recall@1/5/10 on the test pairs), zero-shot
orientation accuracy and the linear probe of the image encoder.

Writes ``OUT/results.csv`` (one row per run), ``OUT/verdicts.json``, ``OUT/convirt_ablation.png``
(heat maps and per-direction curves), ``OUT/experiment.json`` (settings) and ``OUT/runs/<run>/``.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Dict, List, Sequence, Tuple

from contrastkit import layout
from contrastkit._io import write_csv, write_json
from contrastkit.commands._study import (FAILS, HOLDS, UNDECIDED, RunSpec, Verdict, format_verdicts,
                                         parse_data_options, prepare_out, run_grid, spearman)

__all__ = ["ABLATION_DEFAULTS", "DEFAULT_WEIGHTS", "DEFAULT_TEMPERATURES", "ablation_rows", "ablation_verdicts",
           "ablation_table", "plot_ablation", "run_convirt_ablation", "run_from_args"]

DEFAULT_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_TEMPERATURES = (0.01, 0.1, 1.0)
#: Defaults of the shared experiment options for this experiment: 15 runs of 10 epochs x
#: 6 steps (400 training pairs, batch 64) plus evaluation; docs/convirt.md has the measured
#: time on 2 CPU cores.
ABLATION_DEFAULTS = {"epochs": 10, "batch_size": 64, "seeds": 1}
DEFAULT_DATA_OPTIONS = {"train_scenes": 400, "val_scenes": 100, "test_scenes": 300}
#: The Recall@K the verdicts use (mean of the two directions).
VERDICT_K = 5
OWNED = (layout.RUNS, layout.EXPERIMENT_TABLE, layout.EXPERIMENT_SETTINGS, layout.VERDICTS, layout.CONVIRT_ABLATION_PLOT)
_METRICS = ("i2t_recall@1", "i2t_recall@5", "i2t_recall@10", "t2i_recall@1", "t2i_recall@5", "t2i_recall@10")


def _name(weight: float, tau: float, seed: int) -> str:
    return f"lambda{weight:g}-tau{tau:g}-seed{seed}"


def _specs(settings: Dict[str, Any]) -> List[RunSpec]:
    specs = []
    for seed in range(settings["seeds"]):
        for tau in settings["temperatures"]:
            for weight in settings["weights"]:
                config = dict(data="glyphlab-text", data_options=settings["data_options"], method="convirt",
                              weight=weight, temperature=tau, epochs=settings["epochs"],
                              batch_size=settings["batch_size"], device=settings["device"], seed=seed,
                              text_encoder=settings["text_encoder"])
                # The random-init / raw-pixel probe baselines depend on the seed only: once per seed.
                first = (tau == settings["temperatures"][0] and weight == settings["weights"][0])
                specs.append(RunSpec(_name(weight, tau, seed), f"tau {tau:g}", f"lambda {weight:g}", config,
                                     baselines=first))
    return specs


def ablation_rows(specs: Sequence[RunSpec]) -> List[Dict[str, Any]]:
    """One row per run: lambda, tau, seed, retrieval recalls, chance, zero-shot, probe, loss."""
    rows = []
    for spec in specs:
        s = spec.summary or {}
        row: Dict[str, Any] = {"lambda": spec.config["weight"], "tau": spec.config["temperature"],
                               "seed": spec.config["seed"]}
        for key in _METRICS:
            row[key] = s.get(f"retrieval_{key}")
        row[f"chance_recall@{VERDICT_K}"] = s.get(f"retrieval_chance_recall@{VERDICT_K}")
        row[f"fact_ceiling_recall@{VERDICT_K}"] = s.get(f"retrieval_fact_ceiling_recall@{VERDICT_K}")
        row["pairs"] = s.get("retrieval_pairs")
        row["zero_shot_accuracy"] = s.get("zero_shot_accuracy")
        row["probe_accuracy"] = s.get("probe_accuracy")
        row["random_init_probe_accuracy"] = s.get("random_init_probe_accuracy", "")
        row["final_loss"] = s.get("final_loss")
        row["train_seconds"] = s.get("train_seconds")
        row["run"] = spec.name
        rows.append(row)
    return rows


def _retrieval(row: Dict[str, Any], k: int = VERDICT_K) -> float:
    """The verdicts' retrieval score: mean of image->text and text->image Recall@k."""
    return (float(row[f"i2t_recall@{k}"]) + float(row[f"t2i_recall@{k}"])) / 2.0


def _cell_means(rows: Sequence[Dict[str, Any]], key: Any) -> Dict[Tuple[float, float], float]:
    """``(lambda, tau)`` -> mean over seeds of ``key(row)``."""
    cells: Dict[Tuple[float, float], List[float]] = {}
    for row in rows:
        cells.setdefault((float(row["lambda"]), float(row["tau"])), []).append(key(row))
    return {cell: statistics.fmean(values) for cell, values in cells.items()}


def _standard_error(p: float, pairs: Any, runs: int) -> float:
    """Binomial standard error of a recall ``p`` measured on ``pairs`` queries in ``runs`` runs
    (``nan`` when the number of pairs is unknown)."""
    try:
        n = int(pairs) * max(1, runs)
    except (TypeError, ValueError):
        return math.nan
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else math.nan


def _paired_tau_verdict(rows: Sequence[Dict[str, Any]], reference_tau: float, other_tau: float) -> Verdict:
    """Claim: ``other_tau`` hurts retrieval vs ``reference_tau``, compared within each (lambda, seed)."""
    by_key = {(float(r["lambda"]), int(r["seed"]), float(r["tau"])): _retrieval(r) for r in rows}
    pairs = sorted({(lam, seed) for lam, seed, _ in by_key})
    gaps = [by_key[(lam, seed, reference_tau)] - by_key[(lam, seed, other_tau)] for lam, seed in pairs
            if (lam, seed, reference_tau) in by_key and (lam, seed, other_tau) in by_key]
    claim = f"tau = {other_tau:g} hurts retrieval compared with tau = {reference_tau:g}"
    rule = (f"retrieval = mean of image->text and text->image Recall@{VERDICT_K} on the test pairs; compared "
            "within each (lambda, seed) cell: holds if tau = {0:g} is better in every cell, does not hold if "
            "the mean gap is <= 0, inconclusive otherwise").format(reference_tau)
    if not gaps:
        return Verdict(claim, UNDECIDED, "no cells with both temperatures", rule)
    wins = sum(g > 0 for g in gaps)
    mean_gap = statistics.fmean(gaps)
    ref = statistics.fmean(_retrieval(r) for r in rows if float(r["tau"]) == reference_tau)
    oth = statistics.fmean(_retrieval(r) for r in rows if float(r["tau"]) == other_tau)
    status = HOLDS if wins == len(gaps) else (FAILS if mean_gap <= 0 else UNDECIDED)
    error = _standard_error(ref, rows[0].get("pairs"), 1)
    evidence = (f"mean R@{VERDICT_K} tau={reference_tau:g} {ref:.4f} vs tau={other_tau:g} {oth:.4f}; "
                f"tau={reference_tau:g} better in {wins}/{len(gaps)} cells, mean gap {mean_gap:+.4f} "
                f"(binomial standard error of one cell {error:.4f})")
    return Verdict(claim, status, evidence, rule)


def ablation_verdicts(rows: Sequence[Dict[str, Any]], reference_tau: float = 0.1,
                      reference_weight: float = 0.75) -> List[Verdict]:
    """The claims of SPEC section 3 / the issue, judged from the rows."""
    taus = sorted({float(r["tau"]) for r in rows})
    weights = sorted({float(r["lambda"]) for r in rows})
    verdicts: List[Verdict] = []
    if reference_tau in taus:
        low = [t for t in taus if t < reference_tau]
        high = [t for t in taus if t > reference_tau]
        parts = [_paired_tau_verdict(rows, reference_tau, t) for t in (low[:1] + high[-1:])]
        verdicts += parts
        if len(parts) == 2:
            statuses = {p.status for p in parts}
            status = HOLDS if statuses == {HOLDS} else (FAILS if FAILS in statuses else UNDECIDED)
            verdicts.append(Verdict(
                f"tau = {low[0]:g} and tau = {high[-1]:g} both hurt retrieval vs tau = {reference_tau:g} "
                "(the source's claim)", status, " | ".join(p.evidence for p in parts),
                "holds if both parts hold, does not hold if either does not, inconclusive otherwise"))
        # Direction weight: lambda moves quality from text->image to image->text.
        at_ref = [r for r in rows if float(r["tau"]) == reference_tau]
        diff = _cell_means(at_ref, lambda r: float(r[f"i2t_recall@{VERDICT_K}"]) - float(r[f"t2i_recall@{VERDICT_K}"]))
        lams = sorted(lam for lam, _ in diff)
        if len(lams) >= 3:
            values = [diff[(lam, reference_tau)] for lam in lams]
            rho = spearman(lams, values)
            status = HOLDS if (rho >= 0.7 and values[-1] > values[0]) else (
                FAILS if (math.isnan(rho) or rho <= 0) else UNDECIDED)
            verdicts.append(Verdict(
                f"a larger lambda favours image->text over text->image retrieval (tau = {reference_tau:g})", status,
                "i2t - t2i R@{k} by lambda: ".format(k=VERDICT_K)
                + ", ".join(f"{lam:g}: {v:+.4f}" for lam, v in zip(lams, values)) + f"; Spearman rho {rho:.3f}",
                "holds if Spearman's rho between lambda and (i2t - t2i Recall@5) is >= 0.7 and the largest lambda "
                "has the larger difference; does not hold if rho <= 0; inconclusive otherwise"))
        means = _cell_means(at_ref, _retrieval)
        if (reference_weight, reference_tau) in means and len(weights) > 1:
            best = max(means, key=means.get)
            ours = means[(reference_weight, reference_tau)]
            runs = sum(1 for r in at_ref if float(r["lambda"]) == reference_weight)
            error = _standard_error(ours, at_ref[0].get("pairs"), runs)
            gap = means[best] - ours
            status = HOLDS if gap <= 0 else (FAILS if gap > 2 * error else UNDECIDED)
            verdicts.append(Verdict(
                f"ConVIRT's lambda = {reference_weight:g} gives the best retrieval among the lambdas at "
                f"tau = {reference_tau:g}", status,
                ", ".join(f"lambda {lam:g}: {means[(lam, reference_tau)]:.4f}" for lam in lams)
                + f"; best lambda {best[0]:g}, gap {gap:+.4f}, binomial standard error {error:.4f}",
                f"holds if no other lambda has a higher mean R@{VERDICT_K} (mean of both directions, over seeds); "
                "does not hold if the best is higher by more than 2 binomial standard errors "
                "(sqrt(p (1 - p) / pairs / runs)); inconclusive otherwise"))
    return verdicts


def ablation_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Mean over seeds of image->text / text->image Recall@5 for every (lambda, tau)."""
    taus = sorted({float(r["tau"]) for r in rows})
    lams = sorted({float(r["lambda"]) for r in rows})
    i2t = _cell_means(rows, lambda r: float(r[f"i2t_recall@{VERDICT_K}"]))
    t2i = _cell_means(rows, lambda r: float(r[f"t2i_recall@{VERDICT_K}"]))
    zs = _cell_means(rows, lambda r: float(r["zero_shot_accuracy"]) if r["zero_shot_accuracy"] is not None else math.nan)
    chance = rows[0][f"chance_recall@{VERDICT_K}"]
    ceiling = rows[0][f"fact_ceiling_recall@{VERDICT_K}"]
    header = f"{'lambda':>6} | " + " | ".join(f"{'tau ' + format(t, 'g'):^22}" for t in taus)
    sub = f"{'':>6} | " + " | ".join(f"{'i2t':>6} {'t2i':>6} {'0-shot':>7}" for _ in taus)
    lines = [f"Recall@{VERDICT_K} on held-out pairs (image->text, text->image) and zero-shot accuracy; "
             f"chance R@{VERDICT_K} {chance:.4f}, fact ceiling {ceiling:.4f}", header, sub, "-" * len(header)]
    for lam in lams:
        cells = []
        for t in taus:
            if (lam, t) in i2t:
                cells.append(f"{i2t[(lam, t)]:>6.3f} {t2i[(lam, t)]:>6.3f} {zs[(lam, t)]:>7.3f}")
            else:
                cells.append(f"{'-':>22}")
        lines.append(f"{lam:>6g} | " + " | ".join(cells))
    return "\n".join(lines)


def plot_ablation(rows: Sequence[Dict[str, Any]], path: str) -> str:
    """Heat maps of i2t and t2i Recall@5 over (lambda, tau) and retrieval-vs-lambda curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    taus = sorted({float(r["tau"]) for r in rows})
    lams = sorted({float(r["lambda"]) for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, direction, title in ((axes[0], "i2t", "image -> text"), (axes[1], "t2i", "text -> image")):
        means = _cell_means(rows, lambda r: float(r[f"{direction}_recall@{VERDICT_K}"]))
        grid = np.array([[means.get((lam, t), np.nan) for lam in lams] for t in taus])
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(1e-9, float(np.nanmax(grid))), aspect="auto")
        for i in range(len(taus)):
            for j in range(len(lams)):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="white", fontsize=8)
        ax.set_xticks(range(len(lams)))
        ax.set_xticklabels([f"{lam:g}" for lam in lams])
        ax.set_yticks(range(len(taus)))
        ax.set_yticklabels([f"{t:g}" for t in taus])
        ax.set_xlabel("lambda (weight of image -> text)")
        ax.set_ylabel("tau")
        ax.set_title(f"{title} Recall@{VERDICT_K}")
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[2]
    for i, t in enumerate(taus):
        means = _cell_means([r for r in rows if float(r["tau"]) == t], _retrieval)
        ax.plot(lams, [means.get((lam, t), np.nan) for lam in lams], marker="o", color=f"C{i}", label=f"tau {t:g}")
    chance = float(rows[0][f"chance_recall@{VERDICT_K}"])
    ax.axhline(chance, color="grey", linestyle=":", label=f"chance {chance:.3f}")
    ax.set_xlabel("lambda")
    ax.set_ylabel(f"mean of both directions' Recall@{VERDICT_K}")
    ax.set_title("retrieval vs lambda")
    ax.legend(fontsize=8)
    fig.suptitle("ConVIRT on glyphlab-text: direction weight x temperature (held-out pairs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_convirt_ablation(settings: Dict[str, Any], out: str, *, resume: bool = False, force: bool = False,
                         progress: bool = True) -> Dict[str, Any]:
    """Run the lambda x tau grid into ``out``; returns ``{"rows", "verdicts", "plot"}``."""
    prepare_out(out, resume=resume, force=force, owned=OWNED, settings=settings, settings_file=layout.EXPERIMENT_SETTINGS,
                command="convirt ablation")
    specs = run_grid(_specs(settings), os.path.join(out, layout.RUNS), title="ConVIRT lambda x tau",
                     progress=progress, cell=lambda s: f"{s.get(f'retrieval_i2t_recall@{VERDICT_K}', float('nan')):.2f}"
                                                       f"/{s.get(f'retrieval_t2i_recall@{VERDICT_K}', float('nan')):.2f}")
    rows = ablation_rows(specs)
    write_csv(os.path.join(out, layout.EXPERIMENT_TABLE), rows)
    verdicts = ablation_verdicts(rows)
    write_json(os.path.join(out, layout.VERDICTS), [v.to_dict() for v in verdicts])
    plot = plot_ablation(rows, os.path.join(out, layout.CONVIRT_ABLATION_PLOT))
    return {"rows": rows, "verdicts": verdicts, "plot": plot}


def _floats(text: str, name: str, low: float, high: float, open_low: bool = False) -> List[float]:
    try:
        values = [float(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None
    bad = [v for v in values if not (math.isfinite(v) and (v > low if open_low else v >= low) and v <= high)]
    if not values or bad:
        raise ValueError(f"{name} must be numbers in {'(' if open_low else '['}{low:g}, {high:g}], got {text!r}")
    return sorted(set(values))


def run_from_args(args: Any) -> int:
    """The ``convirt-ablation`` entry of ``contrastkit experiment``."""
    if getattr(args, "temperature", None) is not None:
        raise ValueError("convirt-ablation sweeps the temperature: use --temperatures, not --temperature")
    if args.seeds < 1 or args.epochs < 1 or args.batch_size < 2:
        raise ValueError(f"--seeds and --epochs must be >= 1 and --batch-size >= 2, got {args.seeds}, "
                         f"{args.epochs}, {args.batch_size}")
    weights = _floats(args.weights or ",".join(map(str, DEFAULT_WEIGHTS)), "--weights", 0.0, 1.0)
    from contrastkit.losses import MIN_TEMPERATURE  # imports torch: only when the ablation runs

    taus = _floats(args.temperatures or ",".join(map(str, DEFAULT_TEMPERATURES)), "--temperatures",
                   MIN_TEMPERATURE, 100.0)
    settings = {"data_options": {**DEFAULT_DATA_OPTIONS, **parse_data_options(args.data_option)},
                "seeds": args.seeds, "weights": weights, "temperatures": taus, "epochs": args.epochs,
                "batch_size": args.batch_size, "device": args.device,
                "text_encoder": args.text_encoder or "mean"}
    out = args.out or os.path.join(layout.DEFAULT_ROOT, f"experiment-{args.name}")
    result = run_convirt_ablation(settings, out, resume=args.resume, force=args.force,
                                  progress=not args.no_progress)
    print(ablation_table(result["rows"]))
    print()
    print(format_verdicts(result["verdicts"]))
    print()
    print(f"wrote {os.path.join(out, 'results.csv')}, {os.path.join(out, 'verdicts.json')} and {result['plot']}")
    return 0
