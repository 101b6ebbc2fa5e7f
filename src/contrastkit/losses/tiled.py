"""Exact, memory-linear (tiled) kernels for the InfoNCE / NT-Xent family.

Every loss of the family is ``log-sum-exp over candidates - positive logit``. The positive
logit is a row-wise dot product (``O(N d)``, left to ordinary autograd); only the
log-sum-exp needs the ``N x K`` similarity matrix. The two autograd functions here compute it
tile by tile and never hold more than two ``chunk x chunk`` tiles:

* :func:`self_logsumexp` — one modality, ``lse_i = log sum_{j != i} exp(x_i . x_j)``.
  ``S = X X^T`` is symmetric, so each off-diagonal tile is computed once and used for its
  rows *and* its columns, in the forward and in the backward pass: half the products of the
  dense formulation.
* :func:`cross_logsumexp` — two modalities, the row-wise (and optionally column-wise)
  log-sum-exp of ``A B^T``, both from the same tile.
* :func:`masked_logsumexp` — the row-wise log-sum-exp of ``A C^T`` over a subset of the
  candidates of each row: some columns excluded per row (the decoupled loss leaves out the
  anchor and its positive) and/or only the columns of the row's class (SupCon L_in's
  positives), or only the columns of other classes (its negatives). Every tile is computed
  for its rows only.
* :func:`pair_softplus_sum` — ``sum_j softplus(offset_i - a_i . c_j)`` over the columns of
  the row's class: one softmax per positive pair against the anchor's negatives (the offset),
  pytorch-metric-learning's NT-Xent over labels.
* :func:`topk_logsumexp` — the row-wise log-sum-exp of ``A C^T`` over only the ``k`` largest
  entries of each row (hard-negative mining). Selecting them needs whole rows, so it works
  in blocks of whole rows holding about ``chunk_size^2`` entries.

The temperature is folded into the inputs by the callers (``x = z / sqrt(tau)``, or
``a = v / tau``), so its gradient, learnable or not, flows through ordinary autograd. With
one temperature per anchor row a kernel whose tiles serve both their rows and their columns
(:func:`self_logsumexp`, :func:`cross_logsumexp` with ``columns``) cannot fold it into one
input: it takes the inverse temperatures ``scale`` (``beta_i = 1 / tau_i``) itself, scales
each tile by ``beta_i`` for its rows and by ``beta_j`` for its columns (one more
exponential per entry than a shared scalar shift), and returns their gradient
``sum_j p_ij S_ij`` (the anchor's expected similarity under its own softmax) from the same
backward pass. The kernels that compute a tile for its rows only take ``a = beta * z``.

Forward: running per-row (and per-column) maximum and scaled sum, merged online (the tile
machinery of :mod:`contrastkit.losses._tiles`, shared with the ring exchange). A tile whose
rows and columns are all within a fixed margin of the tile maximum is exponentiated once with
that one scalar shift and summed along both axes; any other tile falls back to separate
per-row and per-column shifts, so the result is exact for any input.
Backward: the tiles are recomputed and ``P = exp(S - lse)`` is rebuilt from the saved
per-row log-sum-exp; ``dX`` is accumulated for the tile's rows and columns.

Inputs must already be in the compute dtype (float32 or float64) with autocast off; the
dispatcher of the public losses (:mod:`contrastkit.losses.dispatch`) takes care of that.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ._tiles import (
    add_masked_row_grads_,
    backward_lse,
    mask_excluded_,
    masked_tiles,
    PositiveSplit,
    both_stats,
    merge_masked_rows_,
    merge_,
    no_autocast,
    pair_weights,
    refuse_double_backward,
    row_stats,
    split_row_stats,
    scaled_both_stats,
    scaled_pair_weights,
    scaled_row_stats,
    shifted_tile,
    tile_buffers,
    tile_ranges,
    tile_view,
    top_k_mask,
)

__all__ = ["self_logsumexp", "cross_logsumexp", "masked_logsumexp", "pair_softplus_sum", "topk_logsumexp",
           "DEFAULT_CHUNK_SIZE", "DENSE_MAX_ENTRIES", "use_tiled"]

#: Tile edge used when tiling is chosen automatically (fastest on a 2-core CPU, fp32, d=128;
#: see benchmarks/RESULTS.md). Two float32 tiles of this size take 8 MiB.
DEFAULT_CHUNK_SIZE = 1024

#: Automatic dispatch: similarity matrices with at most this many entries are computed
#: densely, larger ones in tiles (measured crossover, see docs/tiled.md).
DENSE_MAX_ENTRIES = 1024 * 1024


def use_tiled(rows: int, cols: int, chunk_size: Optional[int]) -> Optional[int]:
    """Tile size for a ``rows x cols`` similarity matrix, or ``None`` for the dense path.

    ``chunk_size=None`` chooses automatically (dense up to :data:`DENSE_MAX_ENTRIES`
    entries, else tiles of :data:`DEFAULT_CHUNK_SIZE`); an int forces tiling with that size.
    """
    if chunk_size is not None:
        return chunk_size
    return None if rows * cols <= DENSE_MAX_ENTRIES else DEFAULT_CHUNK_SIZE


# --------------------------------------------------------------------------- one modality


class _SelfLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, chunk: int, positive: Optional[Tensor],  # type: ignore[override]
                positive_shift: Optional[int]):
        n = x.shape[0]
        m = x.new_full((n,), float("-inf"))
        s = x.new_zeros(n)
        blocks = tile_ranges(n, chunk)
        tile_buf, work_buf = tile_buffers(x, min(chunk, n))
        shifts: List[Tuple[Tensor, bool]] = []
        split = None if positive is None else PositiveSplit(positive, x, n, n, shift=positive_shift)
        with torch.no_grad(), no_autocast(x):
            for bi, (i0, i1) in enumerate(blocks):
                xi = x[i0:i1]
                tile = torch.mm(xi, xi.T, out=tile_view(tile_buf, i1 - i0, i1 - i0))
                tile.fill_diagonal_(float("-inf"))
                work = tile_view(work_buf, i1 - i0, i1 - i0)
                if split is None:
                    merge_(m[i0:i1], s[i0:i1], *row_stats(tile, work))
                else:
                    split_row_stats(tile, work, split, i0, i1, i0, i1, m[i0:i1], s[i0:i1])
                for j0, j1 in blocks[bi + 1:]:
                    tile = torch.mm(xi, x[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
                    work = tile_view(work_buf, i1 - i0, j1 - j0)
                    shifts.append(both_stats(tile, work, m[i0:i1], s[i0:i1], m[j0:j1], s[j0:j1],
                                              split, (i0, i1, j0, j1)))
            lse = m + s.log()
            without = x.new_empty(0) if split is None else split.self_lse()
        ctx.chunk = chunk
        ctx.shifts = shifts
        ctx.save_for_backward(x, lse)
        ctx.mark_non_differentiable(without)
        return lse, without

    @staticmethod
    def backward(ctx, grad: Tensor, _without: Optional[Tensor] = None):  # type: ignore[override]
        refuse_double_backward()
        x, lse = ctx.saved_tensors
        n = x.shape[0]
        dx = torch.zeros_like(x)
        if n < 2:  # no candidate at all: lse = -inf does not depend on x
            return dx, None, None, None
        grad = grad.to(x.dtype)
        blocks = tile_ranges(n, ctx.chunk)
        tile_buf, work_buf = tile_buffers(x, min(ctx.chunk, n))
        shifts = iter(ctx.shifts)
        with torch.no_grad(), no_autocast(x):
            for bi, (i0, i1) in enumerate(blocks):
                xi = x[i0:i1]
                tile = torch.mm(xi, xi.T, out=tile_view(tile_buf, i1 - i0, i1 - i0))
                tile.fill_diagonal_(float("-inf"))
                tile.sub_(lse[i0:i1, None]).exp_().mul_(grad[i0:i1, None])
                dx[i0:i1].addmm_(tile, xi).addmm_(tile.T, xi)
                for j0, j1 in blocks[bi + 1:]:
                    xj = x[j0:j1]
                    shift, shared = next(shifts)
                    tile = shifted_tile(xi, xj, tile_view(tile_buf, i1 - i0, j1 - j0), shift, shared)
                    weights = pair_weights(tile, tile_view(work_buf, i1 - i0, j1 - j0), shift, shared,
                                            grad[i0:i1], lse[i0:i1], grad[j0:j1], lse[j0:j1])
                    dx[i0:i1].addmm_(weights, xj)
                    dx[j0:j1].addmm_(weights.T, xi)
        return dx, None, None, None


class _ScaledSelfLogSumExp(torch.autograd.Function):
    """``lse_i = log sum_{j != i} exp(beta_i x_i . x_j)``: each symmetric tile once, scaled by
    ``beta`` of its rows for the rows and of its columns for the columns."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: Tensor, chunk: int, positive: Optional[Tensor],  # type: ignore[override]
                positive_shift: Optional[int]):
        n = x.shape[0]
        m = x.new_full((n,), float("-inf"))
        s = x.new_zeros(n)
        blocks = tile_ranges(n, chunk)
        tile_buf, work_buf = tile_buffers(x, min(chunk, n))
        split = None if positive is None else PositiveSplit(positive, x, n, n, shift=positive_shift)
        with torch.no_grad(), no_autocast(x):
            for bi, (i0, i1) in enumerate(blocks):
                xi = x[i0:i1]
                tile = torch.mm(xi, xi.T, out=tile_view(tile_buf, i1 - i0, i1 - i0))
                tile.fill_diagonal_(float("-inf"))
                work = tile_view(work_buf, i1 - i0, i1 - i0)
                if split is None:
                    merge_(m[i0:i1], s[i0:i1], *scaled_row_stats(tile, work, scale[i0:i1]))
                else:
                    split_row_stats(tile, work, split, i0, i1, i0, i1, m[i0:i1], s[i0:i1], scale=scale[i0:i1])
                for j0, j1 in blocks[bi + 1:]:
                    tile = torch.mm(xi, x[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
                    scaled_both_stats(tile, tile_view(work_buf, i1 - i0, j1 - j0), scale[i0:i1], scale[j0:j1],
                                      m[i0:i1], s[i0:i1], m[j0:j1], s[j0:j1], split, (i0, i1, j0, j1))
            lse = m + s.log()
            without = x.new_empty(0) if split is None else split.self_lse()
        ctx.chunk = chunk
        ctx.save_for_backward(x, scale, lse)
        ctx.mark_non_differentiable(without)
        return lse, without

    @staticmethod
    def backward(ctx, grad: Tensor, _without: Optional[Tensor] = None):  # type: ignore[override]
        refuse_double_backward()
        x, scale, lse = ctx.saved_tensors
        n = x.shape[0]
        dx = torch.zeros_like(x)
        d_scale = torch.zeros_like(scale) if ctx.needs_input_grad[1] else None
        if n < 2:  # no candidate at all: lse = -inf does not depend on x
            return dx, d_scale, None, None, None
        grad = grad.to(x.dtype)
        blocks = tile_ranges(n, ctx.chunk)
        side = min(ctx.chunk, n)
        tile_buf, work_buf = tile_buffers(x, side)
        spare_buf = x.new_empty(side * side)
        with torch.no_grad(), no_autocast(x):
            for bi, (i0, i1) in enumerate(blocks):
                xi = x[i0:i1]
                r = i1 - i0
                tile = torch.mm(xi, xi.T, out=tile_view(tile_buf, r, r))
                work = tile_view(work_buf, r, r)
                torch.addcmul((scale[i0:i1].log() - lse[i0:i1])[:, None], tile, scale[i0:i1, None], out=work)
                work.fill_diagonal_(float("-inf"))
                work.exp_().mul_(grad[i0:i1, None])  # g scale P: the diagonal (itself) weighs 0
                if d_scale is not None:
                    d_scale[i0:i1] += tile.mul_(work).sum(dim=1) / scale[i0:i1]
                dx[i0:i1].addmm_(work, xi).addmm_(work.T, xi)
                for j0, j1 in blocks[bi + 1:]:
                    xj = x[j0:j1]
                    tile = torch.mm(xi, xj.T, out=tile_view(tile_buf, r, j1 - j0))
                    weights = scaled_pair_weights(
                        tile, tile_view(work_buf, r, j1 - j0), tile_view(spare_buf, r, j1 - j0),
                        scale[i0:i1], grad[i0:i1], lse[i0:i1], scale[j0:j1], grad[j0:j1], lse[j0:j1],
                        None if d_scale is None else d_scale[i0:i1], None if d_scale is None else d_scale[j0:j1])
                    dx[i0:i1].addmm_(weights, xj)
                    dx[j0:j1].addmm_(weights.T, xi)
        return dx, d_scale, None, None, None


def self_logsumexp(x: Tensor, chunk_size: int, *, scale: Optional[Tensor] = None,
                   positive: Optional[Tensor] = None, positive_shift: Optional[int] = None):
    """``lse_i = log sum_{j != i} exp(x_i . x_j)`` for ``x`` of shape ``(N, d)``, in tiles.

    Exact (same value as the dense ``logsumexp`` of ``X X^T`` with the diagonal masked, up
    to rounding) and differentiable; memory ``O(N d + chunk_size^2)``. With ``N = 1`` the sum
    is empty and the result is ``-inf``.

    ``scale``: ``(N,)`` positive factors, one per row (inverse temperatures ``1 / tau_i``):
    ``lse_i = log sum_{j != i} exp(scale_i x_i . x_j)``, differentiable in ``scale`` too;
    each tile is still computed once for its rows and its columns (three tile buffers in the
    backward pass instead of two).

    ``positive``: ``(N,)`` each row's positive (an involution, ``positive[positive[i]] = i``);
    then returns ``(lse, lse_without)``, ``lse_without_i`` the same sum without the positive, a
    value without gradient (:class:`~contrastkit.losses._tiles.PositiveSplit`).
    ``positive_shift``: where ``positive[i] = (i + shift) % N`` (two views:
    ``N / 2``), the tiles without a positive are known without reading ``positive``.
    """
    if scale is not None:
        lse, without = _ScaledSelfLogSumExp.apply(x, scale, int(chunk_size), positive, positive_shift)
    else:
        lse, without = _SelfLogSumExp.apply(x, int(chunk_size), positive, positive_shift)
    return lse if positive is None else (lse, without)


# --------------------------------------------------------------------------- two modalities


class _CrossLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, chunk: int, columns: bool, diagonal: bool):  # type: ignore[override]
        n, k = a.shape[0], b.shape[0]
        row_m = a.new_full((n,), float("-inf"))
        row_s = a.new_zeros(n)
        col_m = a.new_full((k,), float("-inf"))
        col_s = a.new_zeros(k)
        row_blocks, col_blocks = tile_ranges(n, chunk), tile_ranges(k, chunk)
        tile_buf, work_buf = tile_buffers(a, max(min(chunk, n), min(chunk, k)))
        shifts: List[Tuple[Tensor, bool]] = []
        # diagonal: row i's positive is column i (and column j's row j), set apart for the values.
        split = PositiveSplit(torch.arange(n, device=a.device), a, n, k, shift=0) if diagonal else None
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in row_blocks:
                ai = a[i0:i1]
                for j0, j1 in col_blocks:
                    tile = torch.mm(ai, b[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
                    work = tile_view(work_buf, i1 - i0, j1 - j0)
                    if columns:
                        shifts.append(both_stats(tile, work, row_m[i0:i1], row_s[i0:i1], col_m[j0:j1],
                                                  col_s[j0:j1], split, (i0, i1, j0, j1)))
                    elif split is not None:
                        split_row_stats(tile, work, split, i0, i1, j0, j1, row_m[i0:i1], row_s[i0:i1])
                    else:
                        merge_(row_m[i0:i1], row_s[i0:i1], *row_stats(tile, work))
            row_lse = row_m + row_s.log()
            col_lse = col_m + col_s.log() if columns else a.new_empty(0)
            row_without, col_without = split.lse() if split is not None else (a.new_empty(0), a.new_empty(0))
            if not columns:
                col_without = a.new_empty(0)
        ctx.chunk, ctx.columns, ctx.shifts = chunk, columns, shifts
        ctx.save_for_backward(a, b, row_lse, col_lse)
        ctx.set_materialize_grads(False)
        if not columns:
            ctx.mark_non_differentiable(col_lse)
        ctx.mark_non_differentiable(row_without, col_without)
        return row_lse, col_lse, row_without, col_without

    @staticmethod
    def backward(ctx, grad_row: Optional[Tensor], grad_col: Optional[Tensor],  # type: ignore[override]
                 _row_without: Optional[Tensor] = None, _col_without: Optional[Tensor] = None):
        refuse_double_backward()
        a, b, row_lse, col_lse = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        da = torch.zeros_like(a) if need_a else None
        db = torch.zeros_like(b) if need_b else None
        if grad_row is None and grad_col is None:
            return da, db, None, None, None
        n, k = a.shape[0], b.shape[0]
        grad_row = a.new_zeros(n) if grad_row is None else grad_row.to(a.dtype)
        shifts = iter(ctx.shifts)
        if ctx.columns:
            grad_col = a.new_zeros(k) if grad_col is None else grad_col.to(a.dtype)
        tile_buf, work_buf = tile_buffers(a, max(min(ctx.chunk, n), min(ctx.chunk, k)))
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in tile_ranges(n, ctx.chunk):
                ai = a[i0:i1]
                for j0, j1 in tile_ranges(k, ctx.chunk):
                    bj = b[j0:j1]
                    tile_out = tile_view(tile_buf, i1 - i0, j1 - j0)
                    if ctx.columns:
                        shift, shared = next(shifts)
                        tile = shifted_tile(ai, bj, tile_out, shift, shared)
                        weights = pair_weights(tile, tile_view(work_buf, i1 - i0, j1 - j0), shift, shared,
                                                grad_row[i0:i1], row_lse[i0:i1],
                                                grad_col[j0:j1], col_lse[j0:j1])
                    else:
                        tile = torch.mm(ai, bj.T, out=tile_out)
                        weights = tile.sub_(row_lse[i0:i1, None]).exp_().mul_(grad_row[i0:i1, None])
                    if need_a:
                        da[i0:i1].addmm_(weights, bj)
                    if need_b:
                        db[j0:j1].addmm_(weights.T, ai)
        return da, db, None, None, None


class _ScaledCrossLogSumExp(torch.autograd.Function):
    """Row-wise ``log sum_j exp(row_scale_i a_i . b_j)`` and column-wise
    ``log sum_i exp(col_scale_j a_i . b_j)`` from the same tiles."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, row_scale: Tensor, col_scale: Tensor,  # type: ignore[override]
                chunk: int, diagonal: bool):
        n, k = a.shape[0], b.shape[0]
        row_m, row_s = a.new_full((n,), float("-inf")), a.new_zeros(n)
        col_m, col_s = a.new_full((k,), float("-inf")), a.new_zeros(k)
        tile_buf, work_buf = tile_buffers(a, max(min(chunk, n), min(chunk, k)))
        split = PositiveSplit(torch.arange(n, device=a.device), a, n, k, shift=0) if diagonal else None
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in tile_ranges(n, chunk):
                ai = a[i0:i1]
                for j0, j1 in tile_ranges(k, chunk):
                    tile = torch.mm(ai, b[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
                    scaled_both_stats(tile, tile_view(work_buf, i1 - i0, j1 - j0), row_scale[i0:i1],
                                      col_scale[j0:j1], row_m[i0:i1], row_s[i0:i1], col_m[j0:j1], col_s[j0:j1],
                                      split, (i0, i1, j0, j1))
            row_lse, col_lse = row_m + row_s.log(), col_m + col_s.log()
            row_without, col_without = split.lse() if split is not None else (a.new_empty(0), a.new_empty(0))
        ctx.chunk = chunk
        ctx.save_for_backward(a, b, row_scale, col_scale, row_lse, col_lse)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(row_without, col_without)
        return row_lse, col_lse, row_without, col_without

    @staticmethod
    def backward(ctx, grad_row: Optional[Tensor], grad_col: Optional[Tensor],  # type: ignore[override]
                 _row_without: Optional[Tensor] = None, _col_without: Optional[Tensor] = None):
        refuse_double_backward()
        a, b, row_scale, col_scale, row_lse, col_lse = ctx.saved_tensors
        need_a, need_b, need_row, need_col = ctx.needs_input_grad[:4]
        da = torch.zeros_like(a) if need_a else None
        db = torch.zeros_like(b) if need_b else None
        d_row = torch.zeros_like(row_scale) if need_row else None
        d_col = torch.zeros_like(col_scale) if need_col else None
        if grad_row is None and grad_col is None:
            return da, db, d_row, d_col, None, None
        n, k = a.shape[0], b.shape[0]
        grad_row = a.new_zeros(n) if grad_row is None else grad_row.to(a.dtype)
        grad_col = a.new_zeros(k) if grad_col is None else grad_col.to(a.dtype)
        side = max(min(ctx.chunk, n), min(ctx.chunk, k))
        tile_buf, work_buf = tile_buffers(a, side)
        spare_buf = a.new_empty(side * side)
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in tile_ranges(n, ctx.chunk):
                ai = a[i0:i1]
                for j0, j1 in tile_ranges(k, ctx.chunk):
                    bj = b[j0:j1]
                    shape = (i1 - i0, j1 - j0)
                    tile = torch.mm(ai, bj.T, out=tile_view(tile_buf, *shape))
                    weights = scaled_pair_weights(
                        tile, tile_view(work_buf, *shape), tile_view(spare_buf, *shape),
                        row_scale[i0:i1], grad_row[i0:i1], row_lse[i0:i1],
                        col_scale[j0:j1], grad_col[j0:j1], col_lse[j0:j1],
                        None if d_row is None else d_row[i0:i1], None if d_col is None else d_col[j0:j1])
                    if need_a:
                        da[i0:i1].addmm_(weights, bj)
                    if need_b:
                        db[j0:j1].addmm_(weights.T, ai)
        return da, db, d_row, d_col, None, None


def cross_logsumexp(a: Tensor, b: Tensor, chunk_size: int, *, columns: bool = True,
                    row_scale: Optional[Tensor] = None, col_scale: Optional[Tensor] = None,
                    diagonal_positives: bool = False):
    """Row-wise and column-wise log-sum-exp of ``A B^T`` for ``a`` ``(N, d)``, ``b`` ``(K, d)``.

    Returns ``(row_lse (N,), col_lse (K,))``; with ``columns=False`` only the rows are
    computed (``col_lse`` is empty) and each tile is exponentiated with a per-row shift.
    Exact and differentiable in both inputs; memory ``O((N + K) d + chunk_size^2)``.

    ``row_scale`` ``(N,)`` and ``col_scale`` ``(K,)`` (both or neither, with ``columns``):
    positive factors, one per row of ``a`` and one per row of ``b`` (inverse temperatures of
    the two directions' anchors): ``row_lse_i = log sum_j exp(row_scale_i a_i . b_j)``,
    ``col_lse_j = log sum_i exp(col_scale_j a_i . b_j)``, differentiable in the scales too.

    ``diagonal_positives`` (``a`` and ``b`` paired, ``N = K``): also returns the sums without
    each row's and column's positive, the diagonal entry, as values without gradient:
    ``(row_lse, col_lse, row_lse_without, col_lse_without)``
    (:class:`~contrastkit.losses._tiles.PositiveSplit`).
    """
    if (row_scale is None) != (col_scale is None):
        raise ValueError("give both row_scale and col_scale, or neither")
    if row_scale is not None:
        if not columns:
            raise ValueError("row_scale and col_scale apply to both directions (columns=True); for the rows "
                             "alone multiply each row of a by its scale")
    if diagonal_positives and a.shape[0] != b.shape[0]:
        raise ValueError(f"diagonal_positives needs paired rows, got {a.shape[0]} and {b.shape[0]}")
    if row_scale is not None:
        row_lse, col_lse, row_without, col_without = _ScaledCrossLogSumExp.apply(
            a, b, row_scale, col_scale, int(chunk_size), bool(diagonal_positives))
    else:
        row_lse, col_lse, row_without, col_without = _CrossLogSumExp.apply(a, b, int(chunk_size), bool(columns),
                                                                          bool(diagonal_positives))
    return (row_lse, col_lse, row_without, col_without) if diagonal_positives else (row_lse, col_lse)


# --------------------------------------------------------------------------- masked rows


class _MaskedLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, c: Tensor, chunk: int, exclude: Optional[Tensor],  # type: ignore[override]
                a_labels: Optional[Tensor], c_labels: Optional[Tensor], keep_same: bool) -> Tensor:
        ctx.chunk, ctx.keep_same = chunk, keep_same
        n, k = a.shape[0], c.shape[0]
        m = a.new_full((n,), float("-inf"))
        s = a.new_zeros(n)
        tile_buf, work_buf = tile_buffers(a, max(min(chunk, n), min(chunk, k), 1))
        with torch.no_grad(), no_autocast(a):
            merge_masked_rows_(m, s, a, c, exclude, a_labels, c_labels, chunk, tile_buf, work_buf,
                               keep_same=keep_same)
        lse = m + s.log()
        ctx.save_for_backward(a, c, lse, exclude, a_labels, c_labels)
        return lse

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        a, c, lse, exclude, a_labels, c_labels = ctx.saved_tensors
        refuse_double_backward()
        need_a, need_c = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        da = torch.zeros_like(a) if need_a else None
        dc = torch.zeros_like(c) if need_c else None
        tile_buf, _ = tile_buffers(a, max(min(ctx.chunk, a.shape[0]), min(ctx.chunk, c.shape[0]), 1))
        with torch.no_grad(), no_autocast(a):
            add_masked_row_grads_(da, dc, a, c, grad.to(a.dtype), backward_lse(lse), exclude, a_labels, c_labels,
                                  ctx.chunk, tile_buf, ctx.keep_same)
        return da, dc, None, None, None, None, None


def _keep_same(keep: str) -> bool:
    if keep not in ("same", "other"):
        raise ValueError(f"keep must be 'same' or 'other', got {keep!r}")
    return keep == "same"


def masked_logsumexp(
    a: Tensor,
    c: Tensor,
    chunk_size: int,
    *,
    exclude: Optional[Tensor] = None,
    labels: Optional[Tuple[Tensor, Tensor]] = None,
    keep: str = "same",
) -> Tensor:
    """``lse_i = log sum_{j in C(i)} exp(a_i . c_j)`` for ``a`` ``(N, d)``, ``c`` ``(K, d)``, in tiles.

    ``C(i)`` is every candidate except the columns ``exclude[i]`` (``exclude``: ``(N, m)``
    long column indices, e.g. the anchor itself and its positive) and, with
    ``labels = (a_labels (N,), c_labels (K,))``, except the candidates of other classes
    (``keep="same"``: SupCon's positives) or of the anchor's own class (``keep="other"``: its
    negatives). A row whose ``C(i)`` is empty gets ``-inf`` and a zero gradient. Exact and
    differentiable in ``a`` and ``c`` (``c`` may be ``a`` itself); memory
    ``O((N + K) d + chunk_size^2)``.
    """
    keep_same = _keep_same(keep)
    a_labels, c_labels = (None, None) if labels is None else labels
    return _MaskedLogSumExp.apply(a, c, int(chunk_size), exclude, a_labels, c_labels, keep_same)


class _PairSoftplusSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, c: Tensor, offset: Tensor, chunk: int,  # type: ignore[override]
                exclude: Optional[Tensor], a_labels: Tensor, c_labels: Tensor) -> Tensor:
        ctx.chunk = chunk
        total = a.new_zeros(a.shape[0])
        tile_buf, _ = tile_buffers(a, max(min(chunk, a.shape[0]), min(chunk, c.shape[0]), 1))
        with torch.no_grad(), no_autocast(a):
            for i0, i1, _j0, _j1, tile in masked_tiles(a, c, exclude, a_labels, c_labels, chunk, tile_buf):
                total[i0:i1] += _pair_terms(tile, offset[i0:i1], torch.logaddexp, tile.new_zeros(())).sum(dim=1)
        ctx.save_for_backward(a, c, offset, exclude, a_labels, c_labels)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        refuse_double_backward()
        a, c, offset, exclude, a_labels, c_labels = ctx.saved_tensors
        need_a, need_c, need_offset = ctx.needs_input_grad[:3]
        da = torch.zeros_like(a) if need_a else None
        dc = torch.zeros_like(c) if need_c else None
        d_offset = torch.zeros_like(offset)
        grad = grad.to(a.dtype)
        tile_buf, _ = tile_buffers(a, max(min(ctx.chunk, a.shape[0]), min(ctx.chunk, c.shape[0]), 1))
        with torch.no_grad(), no_autocast(a):
            for i0, i1, j0, j1, tile in masked_tiles(a, c, exclude, a_labels, c_labels, ctx.chunk, tile_buf):
                # d/d offset_i of softplus(offset_i - s_ij) is sigmoid(offset_i - s_ij); d/d s_ij its negative.
                weights = _pair_terms(tile, offset[i0:i1], lambda z, _: torch.sigmoid(z), None)
                weights.mul_(grad[i0:i1, None])
                d_offset[i0:i1] += weights.sum(dim=1)
                if da is not None:
                    da[i0:i1].addmm_(weights, c[j0:j1], alpha=-1)
                if dc is not None:
                    dc[j0:j1].addmm_(weights.T, a[i0:i1], alpha=-1)
        return da, dc, (d_offset if need_offset else None), None, None, None, None


def _pair_terms(tile: Tensor, offset: Tensor, term, zero) -> Tensor:
    """``term(offset_i - tile_ij, zero)`` on the kept entries of a masked tile (``-inf``
    elsewhere), 0 on the others; an ``offset_i`` of ``-inf`` (nothing to compare) gives
    ``term(-inf)``, which is 0 for the softplus and the sigmoid."""
    kept = tile != float("-inf")
    return term(offset[:, None] - tile, zero).masked_fill_(~kept, 0.0)


def pair_softplus_sum(
    a: Tensor,
    c: Tensor,
    offset: Tensor,
    chunk_size: int,
    *,
    labels: Tuple[Tensor, Tensor],
    exclude: Optional[Tensor] = None,
) -> Tensor:
    """``out_i = sum_{j in P(i)} softplus(offset_i - a_i . c_j)`` for ``a`` ``(N, d)``, ``c``
    ``(K, d)``, ``offset`` ``(N,)``, in tiles.

    ``P(i)`` is the candidates of anchor ``i``'s class (``labels = (a_labels (N,), c_labels
    (K,))``) except the columns ``exclude[i]`` (``(N, m)`` long, e.g. the anchor itself).
    With ``offset`` the log-sum-exp of the anchor's negatives (:func:`masked_logsumexp` with
    ``keep="other"``), each term is the NT-Xent of one positive pair against the anchor's
    negatives, ``-log(e^{s_ip} / (e^{s_ip} + sum_n e^{s_in}))``, the loss of
    pytorch-metric-learning's ``NTXentLoss``; an ``offset_i`` of ``-inf`` (no negative) gives 0.
    Exact and differentiable in ``a``, ``c`` and ``offset``; memory
    ``O((N + K) d + chunk_size^2)``.
    """
    a_labels, c_labels = labels
    return _PairSoftplusSum.apply(a, c, offset, int(chunk_size), exclude, a_labels, c_labels)


# --------------------------------------------------------------------------- top-k rows


def _slab_rows(chunk: int, columns: int) -> int:
    """Rows per block of whole rows: about ``chunk^2`` entries, between 1 and ``chunk`` rows."""
    return max(1, min(chunk, (chunk * chunk) // max(columns, 1)))


def _selected_slab(a: Tensor, c: Tensor, k: int, exclude: Optional[Tensor], i0: int, i1: int,
                   buffer: Tensor) -> Tensor:
    """Rows ``i0:i1`` of ``A C^T`` with everything but each row's ``k`` largest non-excluded
    entries set to ``-inf``. The forward and the backward pass call this with the same
    arguments, so the product, and with it the selection, is the same in both."""
    slab = torch.mm(a[i0:i1], c.T, out=tile_view(buffer, i1 - i0, c.shape[0]))
    mask_excluded_(slab, exclude, i0, i1, 0, c.shape[0])
    return slab.masked_fill_(~top_k_mask(slab, k), float("-inf"))


class _TopKLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, c: Tensor, chunk: int, k: int,  # type: ignore[override]
                exclude: Optional[Tensor]) -> Tensor:
        n, m = a.shape[0], c.shape[0]
        rows = _slab_rows(chunk, m)
        lse = a.new_empty(n)
        buffer = a.new_empty(min(rows, n) * m)
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in tile_ranges(n, rows):
                lse[i0:i1] = torch.logsumexp(_selected_slab(a, c, k, exclude, i0, i1, buffer), dim=1)
        ctx.chunk, ctx.k = chunk, k
        ctx.save_for_backward(a, c, lse, exclude)
        return lse

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        refuse_double_backward()
        a, c, lse, exclude = ctx.saved_tensors
        n, m = a.shape[0], c.shape[0]
        need_a, need_c = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        da = torch.zeros_like(a) if need_a else None
        dc = torch.zeros_like(c) if need_c else None
        rows = _slab_rows(ctx.chunk, m)
        buffer = a.new_empty(min(rows, n) * m)
        grad, lse = grad.to(a.dtype), backward_lse(lse)
        with torch.no_grad(), no_autocast(a):
            for i0, i1 in tile_ranges(n, rows):
                slab = _selected_slab(a, c, ctx.k, exclude, i0, i1, buffer)
                weights = slab.sub_(lse[i0:i1, None]).exp_().mul_(grad[i0:i1, None])
                if need_a:
                    da[i0:i1].addmm_(weights, c)
                if need_c:
                    dc.addmm_(weights.T, a[i0:i1])
        return da, dc, None, None, None


def topk_logsumexp(a: Tensor, c: Tensor, chunk_size: int, k: int, *, exclude: Optional[Tensor] = None) -> Tensor:
    """``lse_i = log sum_{j in T(i)} exp(a_i . c_j)`` for ``a`` ``(N, d)``, ``c`` ``(K, d)``,
    where ``T(i)`` holds the ``k`` largest ``a_i . c_j`` among the columns not in ``exclude[i]``
    (``(N, m)`` long column indices, as in :func:`masked_logsumexp`).

    Ties at the cut go to the lowest column indices (``_tiles.top_k_mask``); the
    selection carries no gradient. Each row needs at least ``k`` columns left after the
    exclusions. The rows are computed in blocks of whole rows, about ``chunk_size^2`` entries
    each (at least one row): memory ``O((N + K) d + max(chunk_size^2, K))``, never ``N x K``.
    Exact and differentiable in ``a`` and ``c`` (``c`` may be ``a`` itself).
    """
    return _TopKLogSumExp.apply(a, c, int(chunk_size), int(k), exclude)
