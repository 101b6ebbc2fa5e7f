"""The figures of a report, drawn with matplotlib's Agg canvas (imported here, lazily, when a
page is drawn): a run's training curves, read-out bars, similarity profile and validation
geometry, and a sweep's accuracy against the temperature. Each returns a matplotlib ``Figure``,
or None when the folder holds nothing to draw."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .reading import BASELINES, READOUTS, REPRESENTATION_KEYS, mean_std, number

__all__ = ["training_figure", "readout_figure", "profile_figure", "geometry_figure", "accuracy_vs_tau_figure"]


def _figure(width: float, height: float, *, left: float = 0.75, bottom: float = 0.55, top: float = 0.35,
            right: float = 0.2, rows: int = 1) -> Any:
    """A Figure with margins in inches (constrained layout would double the drawing time)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           wspace=0.28, hspace=0.75 if rows > 1 else 0.2)
    return figure


def _style(ax: Any) -> None:
    ax.grid(True, color="#e6e9ee", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def training_figure(records: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """Loss, temperature, learning rate and validation kNN accuracy over training (the panels
    that ``records``, from ``metrics.jsonl``, have values for)."""
    steps = [r for r in records if r.get("kind") == "step" and number(r.get("step")) is not None]
    epochs = [r for r in records if r.get("kind") == "epoch" and number(r.get("step")) is not None]
    taus = [r for r in records if r.get("kind") in ("step", "tau") and number(r.get("tau")) is not None
            and number(r.get("step")) is not None]
    validation = [r for r in epochs if number(r.get("val_knn_accuracy")) is not None]
    panels = []
    if steps or epochs:
        panels.append("loss")
    if taus:
        panels.append("tau")
    if any(number(r.get("lr")) is not None for r in steps):
        panels.append("lr")
    if validation:
        panels.append("val")
    if not panels:
        return None
    from matplotlib.ticker import MaxNLocator

    columns = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / columns)
    figure = _figure(10.5 if columns == 2 else 6.5, 3.1 * rows, rows=rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes, panels):
        _style(ax)
        if panel == "loss":
            if steps:
                ax.plot([r["step"] for r in steps if number(r.get("loss")) is not None],
                        [r["loss"] for r in steps if number(r.get("loss")) is not None],
                        color="#9db4e6", linewidth=1, label="logged step")
            if epochs:
                ax.plot([r["step"] for r in epochs], [r["loss"] for r in epochs], color="#2457c5",
                        marker="o", markersize=3.5, linewidth=2, label="epoch mean")
            ax.set_title("Training loss")
            ax.set_ylabel("loss")
            ax.legend(frameon=False, fontsize=8)
        elif panel == "tau":
            ordered = sorted(taus, key=lambda r: r["step"])
            ax.plot([r["step"] for r in ordered], [r["tau"] for r in ordered], color="#d9480f", linewidth=2)
            values = [r["tau"] for r in ordered]
            if max(values) / max(min(values), 1e-12) > 20:
                ax.set_yscale("log")
            elif max(values) == min(values):  # a fixed tau: show it against zero, not magnified rounding
                ax.set_ylim(0, 1.5 * max(values) if max(values) > 0 else 1)
            ax.set_title("Temperature τ")
            ax.set_ylabel("τ")
        elif panel == "lr":
            ax.plot([r["step"] for r in steps if number(r.get("lr")) is not None],
                    [r["lr"] for r in steps if number(r.get("lr")) is not None], color="#5c940d", linewidth=2)
            ax.set_title("Learning rate")
            ax.set_ylabel("learning rate")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            ax.plot([r["epoch"] for r in validation], [r["val_knn_accuracy"] for r in validation],
                    color="#7b3fc4", marker="o", markersize=3.5, linewidth=2)
            ax.set_title("Validation kNN accuracy")
            ax.set_ylabel("accuracy")
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            continue
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure


def readout_figure(summary: Dict[str, Any]) -> Optional[Any]:
    """Bars of each read-out's test accuracy for the pretrained encoder and the baselines."""
    series = []
    for label, prefix in BASELINES:
        values = [number(summary.get(prefix + key)) for _, key in READOUTS]
        if any(v is not None for v in values):
            series.append((label, values))
    if not series:
        return None
    figure = _figure(6.5, 2.8, left=1.65, top=0.45)
    ax = figure.subplots()
    _style(ax)
    colors = {"pretrained encoder": "#2457c5", "random-init encoder": "#adb5bd", "raw pixels": "#f0a400"}
    height = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        positions = [r + (i - (len(series) - 1) / 2) * height for r in range(len(READOUTS))]
        shown = [v if v is not None else 0.0 for v in values]
        bars = ax.barh(positions, shown, height=height * 0.92, color=colors.get(label, "#868e96"), label=label)
        for bar, value in zip(bars, values):
            if value is not None:
                ax.text(bar.get_width() + 0.01, bar.get_y() + bar.get_height() / 2, f"{value:.3f}",
                        va="center", fontsize=8)
    ax.set_yticks(range(len(READOUTS)), [label for label, _ in READOUTS])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.1)
    ax.set_xlabel("test accuracy")
    ax.legend(frameon=False, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(series))
    return figure


def profile_figure(representation: Dict[str, Any]) -> Optional[Any]:
    """Positive-pair similarity against the k-th most similar negatives, per space (z, h)."""
    spaces = [(space, metrics) for space, metrics in representation.items()
              if isinstance(metrics, dict) and isinstance(metrics.get("top_negative_similarity"), list)
              and metrics["top_negative_similarity"]]
    if not spaces:
        return None
    figure = _figure(8.5, 3.0, right=2.3)
    ax = figure.subplots()
    _style(ax)
    colors = ["#2457c5", "#d9480f", "#1a8a4a", "#7b3fc4"]
    for (space, metrics), color in zip(spaces, colors):
        negatives = [number(v) for v in metrics["top_negative_similarity"]]
        ranks = list(range(1, len(negatives) + 1))
        ax.plot(ranks, negatives, marker="o", markersize=3.5, color=color, linewidth=1.8,
                label=f"{space}: k-th most similar negative")
        positive = number(metrics.get("positive_similarity"))
        if positive is not None:
            ax.axhline(positive, color=color, linestyle="--", linewidth=1.3, label=f"{space}: positive pair")
    ax.set_xlabel("rank of the negative")
    ax.set_ylabel("cosine similarity")
    ax.set_xticks(range(1, max(len(m["top_negative_similarity"]) for _, m in spaces) + 1))
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def geometry_figure(epochs: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """Validation geometry over training (epoch records with ``val_geometry``)."""
    points = [(r["epoch"], r["val_geometry"]) for r in epochs
              if isinstance(r.get("val_geometry"), dict) and number(r.get("epoch")) is not None]
    if not points:
        return None
    from matplotlib.ticker import MaxNLocator

    keys = [k for _, k, _ in REPRESENTATION_KEYS if k in ("alignment", "uniformity", "tolerance")]
    figure = _figure(10.5, 3.0)
    axes = figure.subplots(1, len(keys), squeeze=False).ravel()
    for ax, key in zip(axes, keys):
        _style(ax)
        for space, color in (("z", "#2457c5"), ("h", "#d9480f")):
            series = [(e, number(g.get(space, {}).get(key))) for e, g in points if isinstance(g.get(space), dict)]
            series = [(e, v) for e, v in series if v is not None]
            if series:
                ax.plot([e for e, _ in series], [v for _, v in series], marker="o", markersize=3, color=color,
                        label=space)
        ax.set_title(key)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(frameon=False, fontsize=8)
    return figure


def accuracy_vs_tau_figure(groups: Dict[Tuple[str, Optional[float]], List[Dict[str, Any]]]) -> Optional[Any]:
    """Mean ± std linear-probe accuracy against tau per loss; a loss without tau as a band."""
    curves: Dict[str, List[Tuple[float, float, float]]] = {}
    flat: Dict[str, Tuple[float, float]] = {}
    for (loss, tau), rows in groups.items():
        values = [r["probe_accuracy"] for r in rows if number(r.get("probe_accuracy")) is not None]
        if not values:
            continue
        mean, std = mean_std(values)
        if tau is None:
            flat[loss] = (mean, std)
        else:
            curves.setdefault(loss, []).append((tau, mean, std))
    if not curves and not flat:
        return None
    figure = _figure(6.5, 3.6)
    ax = figure.subplots()
    _style(ax)
    palette = ["#2457c5", "#d9480f", "#1a8a4a", "#7b3fc4"]
    for (loss, points), color in zip(curves.items(), palette):
        points.sort()
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, color=color, linewidth=2, label=loss)
    for (loss, (mean, std)), color in zip(flat.items(), ["#868e96", "#a66a00"]):
        ax.axhline(mean, color=color, linestyle="--", label=f"{loss} (no τ)")
        ax.axhspan(mean - std, mean + std, color=color, alpha=0.12)
    if curves:
        from matplotlib.ticker import NullFormatter

        taus = sorted({p[0] for points in curves.values() for p in points})
        ax.set_xscale("log")
        ax.set_xticks(taus, [f"{tau:g}" for tau in taus])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("temperature τ")
    ax.set_ylabel("linear-probe accuracy (test)")
    ax.legend(frameon=False, fontsize=8)
    return figure
