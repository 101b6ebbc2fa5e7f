"""Pictures of what temperature does to one anchor's InfoNCE loss (needs matplotlib).

matplotlib is imported inside the function and used through its object-oriented API with
the Agg canvas, so calling this never changes the user's pyplot backend.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from .explanation import PositiveLike, SimilaritiesLike, _check_tau, _explain, _prepare

__all__ = ["plot_temperature"]

_MAX_LINES = 7  # candidates drawn one by one in (a) and (b); the rest are summed


def _anchor_row(similarities, positive, exclude_diagonal: bool, anchor: int):
    """One anchor's denominator terms as a single row, with their original column numbers."""
    problem = _prepare(similarities, positive, exclude_diagonal)
    n, k = problem.similarities.shape
    if isinstance(anchor, bool) or not isinstance(anchor, (int, np.integer)):
        raise TypeError(f"anchor must be an int, got {type(anchor).__name__}")
    if not 0 <= anchor < n:
        raise ValueError(f"anchor must be in [0, {n}), got {anchor}")
    keep = problem.in_denominator[anchor].numpy()
    columns = np.flatnonzero(keep)
    row = problem.similarities[anchor].numpy()[columns]
    positive_column = int(problem.positive[anchor])
    return row, columns, int(np.flatnonzero(columns == positive_column)[0]), problem.single_row


def plot_temperature(
    similarities: SimilaritiesLike,
    *,
    temperatures: Sequence[float],
    positive: PositiveLike = 0,
    exclude_diagonal: bool = False,
    anchor: int = 0,
    path: Optional[Union[str, os.PathLike]] = None,
    overwrite: bool = False,
) -> Any:
    """Draw three panels for one anchor and return the matplotlib ``Figure``.

    (a) probability of each candidate vs temperature (log axis); (b) gradient magnitude
    ``|dl/ds_j|`` vs temperature; (c) relative penalty on each negative vs its similarity at
    several temperatures (Wang & Liu's figure: the Boltzmann weighting flattens as ``tau``
    grows). The chosen ``temperatures`` are marked in (a) and (b) and drawn in (c) (with a
    single temperature, (c) shows it and four around it).

    Arguments as in :func:`contrastkit.analysis.explain`; ``anchor`` picks the row of a
    matrix. With ``path`` the figure is saved (format from the suffix); an existing file is
    replaced only with ``overwrite=True``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    taus = [_check_tau(t, name="temperatures") for t in temperatures]
    if not taus:
        raise ValueError("temperatures is empty: give at least one temperature")
    if path is not None and os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{os.fspath(path)} exists; pass overwrite=True (--force) to replace it")
    row, columns, pos, is_row = _anchor_row(similarities, positive, exclude_diagonal, anchor)
    single = _prepare(row, pos, False)

    grid = np.geomspace(min(taus) / 10.0, max(taus) * 10.0, 160)
    # One row per grid temperature, explained at tau = 1: the logits s / tau_g are the same, so
    # the probabilities are too, and the gradient w.r.t. s is the one w.r.t. the logits / tau_g.
    stacked = _explain(_prepare(row[None, :] / grid[:, None], [pos] * len(grid), False), 1.0)
    probs = stacked.probabilities                                    # (G, K)
    grads = np.abs(stacked.gradients) / grid[:, None]                # (G, K)

    k = len(row)
    negatives = [j for j in range(k) if j != pos]
    order = sorted(negatives, key=lambda j: -row[j])                 # hardest first
    shown = [pos] + order[: _MAX_LINES - 1] if k > _MAX_LINES else [pos] + order
    rest = [j for j in negatives if j not in shown]

    def label(j: int) -> str:
        role = "positive" if j == pos else "negative"
        return f"cand. {columns[j]} ({role}), s = {row[j]:.3g}"

    fig = Figure(figsize=(17, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    ax_p, ax_g, ax_r = fig.subplots(1, 3)
    colors = _colors(len(shown))

    for c, j in zip(colors, shown):
        style = dict(color=c, lw=2.6 if j == pos else 1.6)
        ax_p.plot(grid, probs[:, j], label=label(j), **style)
        ax_g.plot(grid, grads[:, j], label=label(j), **style)
    if rest:
        ax_p.plot(grid, probs[:, rest].sum(1), color="0.5", ls="--", label=f"{len(rest)} other negatives (sum)")
        ax_g.plot(grid, grads[:, rest].sum(1), color="0.5", ls="--", label=f"{len(rest)} other negatives (sum)")
    ax_p.axhline(1.0 / k, color="0.3", ls="-.", lw=1, label=f"uniform choice 1/{k}")
    for ax in (ax_p, ax_g):
        ax.set_xscale("log")
        ax.set_xlabel("temperature τ (log scale)")
        for i, t in enumerate(sorted(set(taus))):
            ax.axvline(t, color="0.5", ls=":", lw=1.2, label="chosen τ" if i == 0 and ax is ax_p else None)
        ax.grid(alpha=0.3)
    ax_p.set_ylim(-0.02, 1.02)
    ax_p.set_ylabel("probability p_j = softmax(s / τ)_j")
    ax_p.set_title("(a) probability of each candidate")
    ax_p.legend(fontsize=8, loc="best")
    ax_g.set_ylabel("|∂loss/∂s_j|  ((1 − p₊)/τ for the positive, p_j/τ for a negative)", fontsize=9)
    ax_g.set_title("(b) gradient magnitude")
    ax_g.legend(fontsize=8, loc="best")

    panel_taus = sorted(set(taus)) if len(set(taus)) > 1 else [taus[0] * f for f in (0.2, 0.5, 1.0, 2.0, 5.0)]
    panel_taus = panel_taus[:6]
    neg_s = row[negatives]
    lo, hi = float(neg_s.min()), float(neg_s.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    xs = np.linspace(lo, hi, 200)
    for c, t in zip(_colors(len(panel_taus), cmap="viridis"), panel_taus):
        r = _explain(single, float(t))
        h = int(r.hardest_negative[0])
        # r(s) = exp(s/τ) / Z_neg: the share a negative of similarity s would get; actual negatives lie on it.
        log_z_neg = row[h] / t - np.log(r.penalty[0, h])
        ax_r.plot(xs, np.exp(xs / t - log_z_neg), color=c,
                  label=f"τ = {t:.3g}  ({r.effective_negatives[0]:.2f} effective negatives)")
        ax_r.plot(neg_s, r.penalty[0, negatives], "o", color=c, ms=5)
    ax_r.set_xlabel("similarity s_j of a negative to the anchor")
    ax_r.set_ylabel("relative penalty r_j = exp(s_j/τ) / Σ_negatives exp(s_k/τ)", fontsize=9)
    ax_r.set_title("(c) relative penalty on negatives (dots: actual negatives)")
    ax_r.grid(alpha=0.3)
    ax_r.legend(fontsize=8, loc="upper left")

    where = "" if is_row else f"anchor {anchor}, "
    fig.suptitle(f"InfoNCE vs temperature: {where}positive = candidate {columns[pos]}, "
                 f"{k} denominator terms, {len(negatives)} negatives")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path)
    return fig


def _colors(count: int, cmap: str = "tab10") -> List[Tuple[float, float, float, float]]:
    from matplotlib import colormaps

    colormap = colormaps[cmap]
    if cmap == "tab10":
        return [colormap(i % 10) for i in range(count)]
    return [colormap(x) for x in np.linspace(0.0, 0.85, max(count, 1))]
