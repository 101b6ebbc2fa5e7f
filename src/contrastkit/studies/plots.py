"""The figures of the studies, drawn from their result rows (matplotlib, no display needed).

* :func:`plot_sweep`: probe accuracy, uniformity and tolerance against tau, the
  uniformity-tolerance scatter and the positive-vs-nearest-negatives profile;
* :func:`plot_sweep_budgets`: a sweep over training budgets: accuracy, uniformity and
  tolerance against tau with one curve per budget, and the best tau against the budget;
* :func:`plot_positive_pairs`: probe accuracy of pairs A / B / random init / raw pixels;
* :func:`plot_schedules`: probe accuracy of each temperature schedule;
* :func:`plot_convirt_ablation`: Recall@5 heat maps over (lambda, tau) and retrieval vs lambda.
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Sequence, Tuple

from contrastkit import layout
from contrastkit.records import PROBE_ACCURACY, RANDOM_INIT, VIEW_RETRIEVAL_TOP1, baseline_key

from .budgets import image_steps_text
from .rows import PROFILE_LENGTH, RETRIEVAL_K, best_tau, by_tau, cell_means, retrieval, values
from .stats import mean_std

__all__ = ["plot_sweep", "plot_sweep_budgets", "plot_positive_pairs", "plot_schedules", "plot_convirt_ablation",
           "POSITIVE_PAIRS_SETTINGS"]

#: The settings of the positive-pairs experiment, in display order.
POSITIVE_PAIRS_SETTINGS = ("pairs A", "pairs B", "random init", "raw pixels")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str, dpi: int = 120) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return path


def _finish(ax: Any, xlabel: str, ylabel: str, title: str, **legend: Any) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**{"fontsize": 8, **legend})
    else:  # e.g. probe accuracy or tolerance of a study on unlabeled data
        ax.text(0.5, 0.5, "nothing to draw: no run has this number\n(probe accuracy and tolerance need class labels)",
                ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")


# ------------------------------------------------------------------------------ sweep

_SWEEP_STYLES = {"nt_xent": ("NT-Xent", "C0", "o"), "hard_negative": ("hard-negative NT-Xent", "C1", "s")}


def _tau_curves(rows: Sequence[dict], path: str, key_of: Callable[[str], str], ylabel: str, title: str,
                spaces: Sequence[str] = ("z",), baselines: bool = False) -> str:
    """Mean +/- std over seeds against tau, one curve per loss (and per embedding space)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for loss, (label, colour, marker) in _SWEEP_STYLES.items():
        for space in spaces:
            curve = by_tau(rows, loss, key_of(space))
            if not curve:
                continue
            stats = [mean_std(v) for v in curve.values()]
            ax.errorbar(list(curve), [m for m, _ in stats], yerr=[s for _, s in stats], color=colour,
                        marker=marker, capsize=3, linestyle="-" if space == "z" else "--",
                        label=label + (f" ({space})" if len(spaces) > 1 else ""))
    if baselines:
        simple = values(rows, PROBE_ACCURACY, loss="simple")
        if simple:
            m, s = mean_std(simple)
            ax.axhline(m, color="C3", linestyle=":", label=f"simple loss ({m:.3f})")
            ax.axhspan(m - s, m + s, color="C3", alpha=0.1)
        random_init = values(rows, baseline_key(PROBE_ACCURACY, RANDOM_INIT))
        if random_init:
            ax.axhline(mean_std(random_init)[0], color="grey", linestyle="-.", label="random init")
    ax.set_xscale("log")
    _finish(ax, "temperature tau (log scale)", ylabel, title)
    return _save(fig, path)


def _sweep_taus(rows: Sequence[dict]) -> List[float]:
    return sorted({float(r["tau"]) for r in rows if r["loss"] != "simple" and r["tau"] != ""})


def _uniformity_tolerance(rows: Sequence[dict], path: str) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    taus = _sweep_taus(rows)
    cmap = plt.get_cmap("viridis")
    for loss, (label, _, marker) in {**_SWEEP_STYLES, "simple": ("simple loss", "C3", "^")}.items():
        points = [r for r in rows if r["loss"] == loss and values([r], "z_uniformity") and values([r], "z_tolerance")]
        if not points:
            continue
        colours = ["C3" if loss == "simple" else cmap(taus.index(float(r["tau"])) / max(1, len(taus) - 1))
                   for r in points]
        ax.scatter([float(r["z_uniformity"]) for r in points], [float(r["z_tolerance"]) for r in points],
                   c=colours, marker=marker, label=label, edgecolors="black", linewidths=0.4)
    for i, t in enumerate(taus):
        ax.scatter([], [], color=cmap(i / max(1, len(taus) - 1)), label=f"tau {t:g}")
    _finish(ax, "uniformity of z (lower = more uniform)", "tolerance of z",
            "Uniformity-tolerance dilemma (one point per run)", fontsize=7, ncol=2)
    return _save(fig, path)


def _similarity_profile(rows: Sequence[dict], path: str) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    taus = _sweep_taus(rows)
    cmap = plt.get_cmap("viridis")
    ranks = list(range(1, PROFILE_LENGTH + 1))
    for i, t in enumerate(taus):
        group = [r for r in rows if r["loss"] == "nt_xent" and r["tau"] != "" and float(r["tau"]) == t]
        profiles = [[float(r[f"z_top_negative_{k}"]) for k in ranks] for r in group
                    if all(values([r], f"z_top_negative_{k}") for k in ranks)]
        positives = values(group, "z_positive_similarity")
        if not profiles or not positives:
            continue
        colour = cmap(i / max(1, len(taus) - 1))
        mean_profile = [sum(p[k] for p in profiles) / len(profiles) for k in range(PROFILE_LENGTH)]
        ax.plot(ranks, mean_profile, color=colour, marker="o", markersize=3, label=f"tau {t:g}")
        ax.scatter([0], [mean_std(positives)[0]], color=colour, marker="*", s=120, edgecolors="black",
                   linewidths=0.4)
    ax.set_xticks([0] + ranks)
    ax.set_xticklabels(["pos"] + [str(r) for r in ranks])
    _finish(ax, "positive (star) and k-th most similar negative", "cosine similarity of z (test set)",
            "Positive vs the 10 nearest negatives, NT-Xent")
    return _save(fig, path)


def plot_sweep(rows: Sequence[dict], out: str) -> List[str]:
    """The five figures of a sweep (:data:`contrastkit.layout.SWEEP_PLOTS`) in ``out``; their paths."""
    def path(name: str) -> str:
        return os.path.join(out, name)

    return [
        _tau_curves(rows, path(layout.ACCURACY_PLOT), lambda s: PROBE_ACCURACY, "linear-probe test accuracy",
                    "Probe accuracy vs tau (mean +/- std over seeds)", baselines=True),
        _tau_curves(rows, path(layout.UNIFORMITY_PLOT), lambda s: f"{s}_uniformity",
                    "uniformity (lower = more uniform)", "Uniformity vs tau (test set)", spaces=("z", "h")),
        _tau_curves(rows, path(layout.TOLERANCE_PLOT), lambda s: f"{s}_tolerance",
                    "tolerance (mean same-class cosine)", "Tolerance vs tau (test set)", spaces=("z", "h")),
        _uniformity_tolerance(rows, path(layout.UNIFORMITY_TOLERANCE_PLOT)),
        _similarity_profile(rows, path(layout.SIMILARITY_PROFILE_PLOT)),
    ]


# ------------------------------------------------------------------------------ sweep over budgets

#: A budget's sweep, as the cross-budget plots take it: (label, image-steps per run, its rows).
BudgetRows = Tuple[str, int, Sequence[dict]]


def _budget_curves(budgets: Sequence[BudgetRows], path: str, key: str, ylabel: str, title: str) -> str:
    """NT-Xent's mean +/- std over seeds against tau, one curve per budget (darker: larger)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    cmap = plt.get_cmap("viridis")
    for i, (label, steps, rows) in enumerate(budgets):
        curve = by_tau(rows, "nt_xent", key)
        if not curve:
            continue
        stats = [mean_std(v) for v in curve.values()]
        ax.errorbar(list(curve), [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3,
                    color=cmap(0.85 * (1 - i / max(1, len(budgets) - 1))),
                    label=f"{label} ({image_steps_text(steps)} image-steps)")
    ax.set_xscale("log")
    _finish(ax, "temperature tau (log scale)", ylabel, title)
    return _save(fig, path)


def _best_tau_plot(budgets: Sequence[BudgetRows], path: str, best_of: Callable[[Sequence[dict]], Any]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    points = [(steps, best_of(rows), label) for label, steps, rows in budgets]
    points = [(steps, best, label) for steps, best, label in points if best is not None]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color="C0", label="best NT-Xent tau")
        for steps, best, label in points:
            ax.annotate(label, (steps, best), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        taus = sorted({t for _, _, rows in budgets for t in _sweep_taus(rows)})
        ax.set_yticks(taus)
        ax.set_yticklabels([f"{t:g}" for t in taus])
        ax.set_ylim(min(taus) / 1.5, max(taus) * 1.5)
    _finish(ax, "image-steps per run (training-set size x epochs, log scale)", "tau (log scale)",
            "Best tau (mean probe accuracy) against the training budget")
    return _save(fig, path)


def plot_sweep_budgets(budgets: Sequence[BudgetRows], out: str) -> List[str]:
    """The four figures of a sweep over training budgets (:data:`contrastkit.layout.BUDGET_PLOTS`)
    in ``out``, from each budget's ``(label, image_steps, sweep rows)`` in increasing budget
    order; their paths."""
    def path(name: str) -> str:
        return os.path.join(out, name)

    return [
        _budget_curves(budgets, path(layout.BUDGETS_ACCURACY_PLOT), PROBE_ACCURACY, "linear-probe test accuracy",
                       "NT-Xent probe accuracy vs tau, per budget (mean +/- std)"),
        _budget_curves(budgets, path(layout.BUDGETS_UNIFORMITY_PLOT), "z_uniformity",
                       "uniformity of z (lower = more uniform)", "NT-Xent uniformity vs tau, per budget"),
        _budget_curves(budgets, path(layout.BUDGETS_TOLERANCE_PLOT), "z_tolerance", "tolerance of z",
                       "NT-Xent tolerance vs tau, per budget"),
        _best_tau_plot(budgets, path(layout.BEST_TAU_PLOT), best_tau),
    ]


# ------------------------------------------------------------------------------ positive pairs

def _bars(rows: Sequence[dict], field: str, settings: Sequence[str], ylabel: str, title: str, path: str,
          chance: float = 0.0, key: str = PROBE_ACCURACY) -> str:
    """One bar per setting (the rows' ``field``): mean of ``key``, error bar std, dots seeds."""
    plt = _pyplot()
    settings = [s for s in settings if values(rows, key, **{field: s})]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, setting in enumerate(settings):
        scores = values(rows, key, **{field: setting})
        mean, std = mean_std(scores)
        ax.bar(i, mean, yerr=std, capsize=5, color=f"C{i}", alpha=0.8)
        ax.scatter([i] * len(scores), scores, color="black", s=12, zorder=3)
        ax.text(i, mean + std + 0.01, f"{mean:.3f}", ha="center", fontsize=9)
    ax.set_xticks(range(len(settings)))
    ax.set_xticklabels(settings, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.08)
    if chance:
        ax.axhline(chance, color="grey", linestyle=":", label=f"chance ({chance:.3g})")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def plot_positive_pairs(rows: Sequence[dict], out: str) -> List[str]:
    """Bar plot of the mean probe accuracy per setting (error bar: std; dots: seeds) in
    ``out/positive_pairs.png``; its path in a list."""
    return [_bars(rows, "setting", POSITIVE_PAIRS_SETTINGS, "linear-probe test accuracy (3 orientation classes)",
                  "GlyphLab (textbook F5): pairs A vs B, mean +/- std over seeds",
                  os.path.join(out, layout.POSITIVE_PAIRS_PLOT), chance=1 / 3)]


def plot_schedules(rows: Sequence[dict], out: str) -> List[str]:
    """Bar plot of the mean probe accuracy (selected epoch) per temperature schedule in
    ``out/schedules.png`` (without labels: the held-out view retrieval top-1); its path in a list."""
    schedules = list(dict.fromkeys(str(row["schedule"]) for row in rows))
    labelled = bool(values(rows, PROBE_ACCURACY))  # else unlabeled data: the label-free read-out
    return [_bars(rows, "schedule", schedules, "linear-probe test accuracy (selected epoch)" if labelled
                  else "held-out view retrieval top-1 (no labels)",
                  "Temperature schedules, same budget: mean +/- std over seeds",
                  os.path.join(out, layout.SCHEDULES_PLOT),
                  key=PROBE_ACCURACY if labelled else VIEW_RETRIEVAL_TOP1)]


def plot_temperature_methods(rows: Sequence[dict], out: str) -> List[str]:
    """Bar plot of the mean probe accuracy (selected epoch) of each fixed tau and each temperature
    method in ``out/temperature_methods.png``; its path in a list."""
    labelled = [{**row, "setting": f"tau {row['tau']}" if row["method"] == "fixed" else str(row["method"])}
                for row in rows]
    settings = list(dict.fromkeys(row["setting"] for row in labelled))
    return [_bars(labelled, "setting", settings, "linear-probe test accuracy (selected epoch)",
                  "Temperature methods vs fixed tau, same budget: mean +/- std over seeds",
                  os.path.join(out, layout.TEMPERATURE_METHODS_PLOT))]


# ------------------------------------------------------------------------------ ConVIRT ablation

def plot_convirt_ablation(rows: Sequence[dict], out: str) -> List[str]:
    """Heat maps of i2t and t2i Recall@5 over (lambda, tau) and retrieval-vs-lambda curves in
    ``out/convirt_ablation.png``; its path in a list."""
    import numpy as np

    plt = _pyplot()
    k = RETRIEVAL_K
    taus = sorted({float(r["tau"]) for r in rows})
    lams = sorted({float(r["lambda"]) for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, direction, title in ((axes[0], "i2t", "image -> text"), (axes[1], "t2i", "text -> image")):
        means = cell_means(rows, lambda r: float(r[f"{direction}_recall@{k}"]))
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
        ax.set_title(f"{title} Recall@{k}")
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[2]
    for i, t in enumerate(taus):
        means = cell_means([r for r in rows if float(r["tau"]) == t], retrieval)
        ax.plot(lams, [means.get((lam, t), np.nan) for lam in lams], marker="o", color=f"C{i}", label=f"tau {t:g}")
    chance = float(rows[0][f"chance_recall@{k}"])
    ax.axhline(chance, color="grey", linestyle=":", label=f"chance {chance:.3f}")
    ax.set_xlabel("lambda")
    ax.set_ylabel(f"mean of both directions' Recall@{k}")
    ax.set_title("retrieval vs lambda")
    ax.legend(fontsize=8)
    fig.suptitle("ConVIRT on glyphlab-text: direction weight x temperature (held-out pairs)")
    return [_save(fig, os.path.join(out, layout.CONVIRT_ABLATION_PLOT), dpi=110)]
