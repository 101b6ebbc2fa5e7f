"""The figures of a report, drawn with matplotlib's Agg canvas (imported here, lazily, when a
page is drawn): a run's training curves, read-out bars, similarity profile and validation
geometry, and a sweep's accuracy against the temperature. Each returns a matplotlib ``Figure``,
or None when the folder holds nothing to draw."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from contrastkit.records import (EPOCH, ONLINE_KNN_ACCURACY, ONLINE_PROBE_ACCURACY, ONLINE_VIEW_RETRIEVAL_TOP1,
                                 PROBE_ACCURACY, STEP, TAU, TAU_HISTOGRAM, baseline_key)

from .reading import BASELINES, READOUTS, REPRESENTATION_KEYS, mean_std, number

__all__ = ["EPOCH_READOUT_CURVES", "training_figure", "readout_figure", "profile_figure", "geometry_figure", "accuracy_vs_tau_figure",
           "batch_figure", "map_figure", "diagnostics_by_tau_figure", "tau_histogram_figure", "CLASS_COLORS"]

#: One colour per class (matplotlib's tab10, then tab20's light tones).
CLASS_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
                "#dbdb8d", "#9edae5"]


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


#: The per-epoch read-out numbers that the training figure's validation panel draws, each as
#: ``(epoch record key, label, colour, line style)``; the val read-out of the ``--eval-every``
#: epochs solid, the online read-out of every epoch dashed.
EPOCH_READOUT_CURVES = (("val_knn_accuracy", "val kNN", "#7b3fc4", "-"),
                        ("val_probe_accuracy", "val probe", "#2457c5", "-"),
                        (ONLINE_KNN_ACCURACY, "online kNN", "#7b3fc4", "--"),
                        (ONLINE_PROBE_ACCURACY, "online probe", "#2457c5", "--"),
                        (ONLINE_VIEW_RETRIEVAL_TOP1, "online view retrieval top-1", "#d9480f", "--"))


def training_figure(records: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """Loss, temperature, learning rate and the validation read-out per epoch (the val kNN and
    probe of the ``--eval-every`` epochs, the online read-out of every epoch,
    :data:`EPOCH_READOUT_CURVES`) over training (the panels that ``records``, from
    ``metrics.jsonl``, have values for)."""
    steps = [r for r in records if r.get("kind") == STEP and number(r.get("step")) is not None]
    epochs = [r for r in records if r.get("kind") == EPOCH and number(r.get("step")) is not None]
    taus = [r for r in records if r.get("kind") in (STEP, TAU) and number(r.get("tau")) is not None
            and number(r.get("step")) is not None]
    validation = [r for r in epochs if any(number(r.get(key)) is not None for key, *_ in EPOCH_READOUT_CURVES)]
    batch = [r for r in steps if number(r.get("positive_probability")) is not None]
    panels = []
    if steps or epochs:
        panels.append("loss")
    if taus:
        panels.append("tau")
    if batch:
        panels += ["choice", "similarity"]
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
    if "choice" in panels:  # room for the right-hand axis of the p+ / e^H panel
        figure.subplots_adjust(wspace=0.5, right=1 - 0.75 / 10.5)
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
        elif panel == "choice":
            x = [r["step"] for r in batch]
            ax.plot(x, [r["positive_probability"] for r in batch], color="#1a8a4a", linewidth=2, label="mean p+")
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("p+", color="#1a8a4a")
            ax.set_title("Batch: p+ and effective negatives")
            right = ax.twinx()
            effective = [number(r.get("effective_negatives")) for r in batch]
            right.plot(x, effective, color="#7b3fc4", linewidth=2, label="mean e^H")
            negatives = [number(r.get("negatives")) for r in batch if number(r.get("negatives"))]
            if negatives:
                right.axhline(max(negatives), color="#7b3fc4", linestyle=":", linewidth=1, label="all negatives")
            right.set_ylim(0, 1.05 * max([v for v in effective if v is not None] + negatives + [1.0]))
            right.set_ylabel("effective negatives e^H", color="#7b3fc4")
            right.spines["top"].set_visible(False)
            lines = ax.get_lines() + right.get_lines()
            ax.legend(lines, [line.get_label() for line in lines], frameon=False, fontsize=8, loc="center right")
        elif panel == "similarity":
            x = [r["step"] for r in batch]
            for key, label, color in (("positive_similarity", "positive", "#1a8a4a"),
                                      ("hardest_negative_similarity", "hardest negative", "#b3261e"),
                                      ("negative_similarity", "mean negative", "#868e96")):
                values = [number(r.get(key)) for r in batch]
                if any(v is not None for v in values):
                    ax.plot(x, values, color=color, linewidth=2, label=label)
            ax.set_ylim(-1.02, 1.02)
            ax.set_title("Batch: cosine similarities")
            ax.set_ylabel("mean similarity")
            ax.legend(frameon=False, fontsize=8)
        elif panel == "lr":
            ax.plot([r["step"] for r in steps if number(r.get("lr")) is not None],
                    [r["lr"] for r in steps if number(r.get("lr")) is not None], color="#5c940d", linewidth=2)
            ax.set_title("Learning rate")
            ax.set_ylabel("learning rate")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            drawn = []
            for key, label, color, style in EPOCH_READOUT_CURVES:
                points = [(r["epoch"], number(r.get(key))) for r in validation if number(r.get(key)) is not None]
                if points:
                    ax.plot([e for e, _ in points], [v for _, v in points], color=color, linestyle=style, marker="o",
                            markersize=3.5, linewidth=2, label=label)
                    drawn.append(label)
            if drawn == ["val kNN"]:  # (the panel as it was before the online read-out)
                ax.set_title("Validation kNN accuracy")
            else:
                ax.set_title("Validation read-out per epoch")
                ax.legend(frameon=False, fontsize=8)
            ax.set_ylabel("accuracy" if not drawn[-1].startswith("online view") else "accuracy / top-1")
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            continue
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure


def readout_figure(summary: Dict[str, Any]) -> Optional[Any]:
    """Bars of each read-out's test accuracy for the pretrained encoder and the baselines."""
    series = []
    for label, baseline in BASELINES:
        values = [number(summary.get(baseline_key(key, baseline))) for _, key in READOUTS]
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
        values = [r[PROBE_ACCURACY] for r in rows if number(r.get(PROBE_ACCURACY)) is not None]
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


def batch_figure(similarities: Any, positive: Sequence[int], exclude_diagonal: bool, p_positive: Sequence[float],
                 effective: Sequence[float], negatives: int, lowest: int, temperature: float) -> Any:
    """One real training batch: its similarity matrix (positives marked, self excluded) and each
    anchor's ``p+`` against its effective number of negatives at the run's ``tau``."""
    import numpy as np

    s = np.asarray(similarities, dtype=np.float64)
    m, k = s.shape
    figure = _figure(11.0, 4.6, left=0.6, right=0.3, bottom=0.6, top=0.45)
    ax, scatter = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.05, 1.0], "wspace": 0.45})
    shown = np.ma.masked_array(s, mask=np.zeros_like(s, dtype=bool))
    if exclude_diagonal:
        np.fill_diagonal(shown.mask, True)
    from matplotlib import colormaps

    cmap = colormaps["RdBu_r"].with_extremes(bad="#d9dde3")
    image = ax.imshow(shown, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest", aspect="auto")
    marker = max(0.4, min(12.0, 2000.0 / max(m, k)))
    ax.scatter(list(positive), range(m), s=marker, facecolors="none", edgecolors="#111", linewidths=0.6,
               label="positive")
    ax.axhline(lowest, color="#f0a400", linewidth=1.0, label="lowest p+")
    ax.set_xlabel("candidate")
    ax.set_ylabel("anchor")
    ax.set_title(f"Similarity matrix ({m} x {k})" + ("; self excluded (grey)" if exclude_diagonal else ""),
                 fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="cosine similarity")
    _style(scatter)
    scatter.scatter(p_positive, effective, s=10, color="#2457c5", alpha=0.6, label="anchor")
    scatter.scatter([p_positive[lowest]], [effective[lowest]], s=40, color="#f0a400", edgecolors="#111",
                    label="lowest p+", zorder=3)
    scatter.axhline(negatives, color="#7b3fc4", linestyle=":", linewidth=1, label=f"all {negatives} negatives")
    scatter.axhline(1, color="#868e96", linestyle=":", linewidth=1)
    scatter.set_xlim(-0.02, 1.02)
    scatter.set_ylim(0, negatives * 1.08 + 1)
    scatter.set_xlabel("p+ (probability of the positive)")
    scatter.set_ylabel("effective negatives e^H")
    scatter.set_title(f"Each anchor at τ = {temperature:.4g}", fontsize=10)
    scatter.legend(frameon=False, fontsize=7, loc="upper right")
    return figure


def map_figure(embedding: Any, labels: Optional[Sequence[int]], class_names: Sequence[str],
               thumbnails: Sequence[Tuple[int, Any]], method: str) -> Any:
    """The 2-D map of held-out embeddings, coloured by class, with ``thumbnails`` (position,
    ``(H, W, C)`` uint8 image) drawn at their points."""
    import numpy as np
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    points = np.asarray(embedding, dtype=np.float64)
    figure = _figure(9.5, 7.0, left=0.3, right=2.0, bottom=0.3, top=0.45)
    ax = figure.subplots()
    for side in ax.spines.values():
        side.set_color("#dde1e7")
    ax.set_xticks([])
    ax.set_yticks([])
    if labels is None:
        ax.scatter(points[:, 0], points[:, 1], s=7, color="#2457c5", alpha=0.7, linewidths=0)
    else:
        labels = np.asarray(labels)
        for c in sorted(set(labels.tolist())):
            chosen = labels == c
            name = class_names[c] if c < len(class_names) else str(c)
            ax.scatter(points[chosen, 0], points[chosen, 1], s=7, color=CLASS_COLORS[c % len(CLASS_COLORS)],
                       alpha=0.75, linewidths=0, label=name)
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=2.5)
    for position, image in thumbnails:
        zoom = 28.0 / max(image.shape[0], image.shape[1])
        box = OffsetImage(image if image.shape[2] == 3 else image[:, :, 0], zoom=zoom,
                          cmap=None if image.shape[2] == 3 else "gray", interpolation="nearest")
        color = "#868e96" if labels is None else CLASS_COLORS[int(labels[position]) % len(CLASS_COLORS)]
        ax.add_artist(AnnotationBbox(box, tuple(points[position]), frameon=True, pad=0.1,
                                     bboxprops={"edgecolor": color, "linewidth": 1.5}))
    ax.set_title(f"{method} map of {len(points)} held-out images (trained encoder's h)", fontsize=10)
    return figure


def diagnostics_by_tau_figure(series: Dict[float, Sequence[Dict[str, Any]]]) -> Optional[Any]:
    """Mean p+ and effective negatives over training, one line per temperature of a sweep."""
    series = {tau: [r for r in records if number(r.get("positive_probability")) is not None]
              for tau, records in series.items()}
    series = {tau: records for tau, records in series.items() if records}
    if not series:
        return None
    figure = _figure(10.5, 3.2)
    left, right = figure.subplots(1, 2)
    palette = ["#2457c5", "#d9480f", "#1a8a4a", "#7b3fc4", "#c2255c", "#0b7285", "#a66a00"]
    for (tau, records), color in zip(sorted(series.items()), palette * 3):
        x = [r["step"] for r in records]
        left.plot(x, [r["positive_probability"] for r in records], color=color, linewidth=2, label=f"τ = {tau:g}")
        right.plot(x, [number(r.get("effective_negatives")) for r in records], color=color, linewidth=2,
                   label=f"τ = {tau:g}")
    from matplotlib.ticker import MaxNLocator

    for ax, title, label in ((left, "Batch: mean p+", "p+"), (right, "Batch: effective negatives", "e^H")):
        _style(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(frameon=False, fontsize=8)
    left.set_ylim(0, 1.02)
    return figure


def tau_histogram_figure(records: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """The per-anchor temperatures of a temperature method over training: one column per epoch
    (its ``tau_histogram`` record), the share of the epoch's anchors in each temperature bin
    (log scale) as a colour, and the epoch's mean, minimum and maximum as lines."""
    histograms = [r for r in records if r.get("kind") == TAU_HISTOGRAM and isinstance(r.get("counts"), list)
                  and isinstance(r.get("edges"), list) and len(r["edges"]) == len(r["counts"]) + 1
                  and number(r.get("epoch")) is not None and sum(r["counts"]) > 0]
    if not histograms:
        return None
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    edges = np.asarray(histograms[0]["edges"], dtype=float)
    epochs = np.asarray([r["epoch"] for r in histograms], dtype=float)
    shares = np.stack([np.asarray(r["counts"], dtype=float) / sum(r["counts"]) for r in histograms], axis=1)
    figure = _figure(7.5, 3.2, left=1.0, right=1.2)
    ax = figure.subplots()
    epoch_edges = np.concatenate([epochs - 0.5, epochs[-1:] + 0.5])
    mesh = ax.pcolormesh(epoch_edges, edges, shares, cmap="Blues", vmin=0.0, vmax=max(float(shares.max()), 1e-12),
                         shading="flat")
    for key, style, label in (("mean", "-", "mean"), ("min", ":", "min / max"), ("max", ":", None)):
        values = [(r["epoch"], number(r.get(key))) for r in histograms if number(r.get(key)) is not None]
        if values:
            ax.plot([e for e, _ in values], [v for _, v in values], style, color="#d9480f", linewidth=1.6,
                    marker="o" if key == "mean" else None, markersize=3, label=label)
    ax.set_yscale("log")
    used = np.nonzero(shares.sum(axis=1))[0]
    ax.set_ylim(edges[max(used[0] - 1, 0)], edges[min(used[-1] + 2, len(edges) - 1)])
    ax.set_xlabel("epoch")
    ax.set_ylabel("temperature τ of an anchor")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.colorbar(mesh, ax=ax, label="share of the epoch's anchors", pad=0.02)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    return figure
