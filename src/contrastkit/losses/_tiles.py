"""The online log-sum-exp over tiles, shared by the tiled kernels and the ring exchange.

A log-sum-exp over many candidates is kept as a running (maximum ``m``, scaled sum ``s``)
pair per row (and per column) with ``lse = m + log s``; each tile of similarities is reduced
to its own pair and merged in (:func:`merge_`). Entries left out of a sum (the anchor itself,
its positive, or every column of another class) are set to ``-inf`` in the tile
(:func:`mask_excluded_`, :func:`mask_other_labels_`, together in :func:`masked_tiles`; the
row-only passes over such tiles are :func:`merge_masked_rows_` and
:func:`add_masked_row_grads_`). :func:`both_stats` reduces a tile for its rows and its
columns with one shared shift when that is safe; :func:`pair_weights` and :func:`shifted_tile`
rebuild ``exp(S - lse)`` in the backward pass. With one temperature per anchor row the rows
and the columns of a shared tile see different scales (``beta_i S_ij`` for row ``i``,
``beta_j S_ij`` for column ``j``): :func:`scaled_both_stats` (over :func:`scaled_row_stats`
and :func:`scaled_col_stats`) and :func:`scaled_pair_weights` are their forms. :func:`top_k_mask` selects each row's hardest
candidates (one tie rule for the dense and the tiled hard-negative loss). The buffers are flat and
reused for every tile (:func:`tile_buffers`, :func:`tile_view`), so a kernel never holds more
than two ``chunk x chunk`` tiles.

Private to :mod:`contrastkit.losses`: :mod:`.tiled` and :mod:`.ring` are its users.
"""

from __future__ import annotations

import math
from typing import Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from . import validation

# A tile shared between rows and columns uses one scalar shift c (the tile maximum). If every
# row and column of the tile keeps sum exp(s - c) >= exp(-margin), no term that matters can
# underflow and the per-row factor exp(c - lse) used in the backward stays below
# exp(margin + log(chunk)), far from overflow in float32.
_SHIFT_MARGIN = 30.0
_MIN_SHIFTED_SUM = math.exp(-_SHIFT_MARGIN)


def tile_ranges(n: int, chunk: int) -> List[Tuple[int, int]]:
    return [(start, min(start + chunk, n)) for start in range(0, n, chunk)]


def merge_(m: Tensor, s: Tensor, m_tile: Tensor, s_tile: Tensor) -> None:
    """Online log-sum-exp, in place: ``s * e^m <- s * e^m + s_tile * e^m_tile``."""
    m_new = torch.maximum(m, m_tile)
    ref = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    s.mul_(torch.exp(m - ref)).add_(s_tile * torch.exp(m_tile - ref))
    m.copy_(m_new)


def _finite_or_zero(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def row_stats(tile: Tensor, work: Tensor, positives: Optional[Tuple[Tensor, Tensor]] = None):
    """Per-row (max, sum exp(tile - max)); rows that are entirely -inf give (-inf, 0).

    ``positives`` (:meth:`PositiveSplit.entries`): also the sums without each row's positive,
    ``(max, sums, sums_without)``."""
    row_max = tile.amax(dim=1)
    torch.sub(tile, _finite_or_zero(row_max)[:, None], out=work).exp_()
    if positives is None:
        return row_max, work.sum(dim=1)
    return (row_max, *PositiveSplit.row_sums(work, positives))


class PositiveSplit:
    """Next to a kernel's log-sum-exp over all candidates, the same sums without each anchor's
    positive, for the value of a small loss: ``loss_i = softplus(lse_neg_i - l_pos_i)`` keeps
    the digits that ``lse_i - l_pos_i`` loses to rounding at the size of the logits (a value
    only: the gradient stays the kernel's). ``positive`` ``(n,)``: each row's positive column
    (of the whole candidate block); in a tile shared by rows and columns the positive map is an
    involution, so the entries left out of the rows are those left out of the columns.

    A tile's sums are taken once, with the positives' entries set to 0 in the exponentials
    (their terms kept aside, ``O(rows)``), and the sums over all candidates are the sums
    without them plus those terms: no pass over the tile is added."""

    def __init__(self, positive: Tensor, like: Tensor, rows: int, cols: int, shift: Optional[int] = None) -> None:
        self.positive = positive
        self.shift = shift  # positive[i] = (i + shift) % rows where known (views, a diagonal): tiles skipped
        self.rows = rows
        self.row_m, self.row_s = like.new_full((rows,), float("-inf")), like.new_zeros(rows)
        self.col_m, self.col_s = like.new_full((cols,), float("-inf")), like.new_zeros(cols)

    def entries(self, i0: int, i1: int, j0: int, j1: int) -> Optional[Tuple[Tensor, Tensor]]:
        """Each row's positive column inside the tile (clamped) and whether it is inside;
        ``None`` for a tile known to hold no positive."""
        if self.shift is not None:
            first, last = (i0 + self.shift) % self.rows, (i1 - 1 + self.shift) % self.rows
            spans = [(first, last)] if first <= last else [(first, self.rows - 1), (0, last)]
            if not any(lo < j1 and hi >= j0 for lo, hi in spans):
                return None
        columns = self.positive[i0:i1] - j0
        inside = (columns >= 0) & (columns < j1 - j0)
        return columns.clamp(0, j1 - j0 - 1)[:, None], inside

    @staticmethod
    def take_(work: Tensor, columns: Tensor, inside: Tensor) -> Tensor:
        """Set the positives' entries of ``work`` to 0; returns their values (0 for rows whose
        positive is not in the tile)."""
        found = work.gather(1, columns).squeeze(1)
        kept = torch.where(inside, torch.zeros_like(found), found)
        work.scatter_(1, columns, kept[:, None])
        return torch.where(inside, found, torch.zeros_like(found))

    @staticmethod
    def row_sums(work: Tensor, positives: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        """The rows' sums of ``work`` (exponentials), over all entries and without the positives."""
        positive = PositiveSplit.take_(work, *positives)
        without = work.sum(dim=1)
        return without + positive, without

    @staticmethod
    def col_sums(work: Tensor, positives: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor]:
        """The columns' sums, over all entries and without the positives (the rows' positive
        entries, which are the columns' own)."""
        positive = PositiveSplit.take_(work, *positives)
        without = work.sum(dim=0)
        return without + torch.zeros_like(without).scatter_add_(0, positives[0].squeeze(1), positive), without

    @staticmethod
    def both_sums(work: Tensor, positives: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """The rows' and the columns' sums of one ``work`` (a shift shared by both), each over
        all entries and without the positives: ``(rows, rows_without, cols, cols_without)``."""
        positive = PositiveSplit.take_(work, *positives)
        rows, cols = work.sum(dim=1), work.sum(dim=0)
        return rows + positive, rows, cols + torch.zeros_like(cols).scatter_add_(0, positives[0].squeeze(1),
                                                                                 positive), cols

    def merge(self, where: Tuple[int, int, int, int], row_max: Tensor, rows: Tensor,
              col_max: Optional[Tensor] = None, cols: Optional[Tensor] = None) -> None:
        """Merge a tile's sums without the positives into the rows ``i0:i1`` (and the columns
        ``j0:j1``) of ``where = (i0, i1, j0, j1)``."""
        i0, i1, j0, j1 = where
        merge_(self.row_m[i0:i1], self.row_s[i0:i1], row_max, rows)
        if cols is not None:
            merge_(self.col_m[j0:j1], self.col_s[j0:j1], col_max, cols)

    def lse(self) -> Tuple[Tensor, Tensor]:
        """``(row lse without positives, column lse without positives)``."""
        return self.row_m + self.row_s.log(), self.col_m + self.col_s.log()

    def self_lse(self) -> Tensor:
        """Of a kernel whose rows are also its columns (one set contrasted with itself, each tile
        above the diagonal once): each row's sum without its positive, from both sides."""
        merge_(self.row_m, self.row_s, self.col_m, self.col_s)
        return self.row_m + self.row_s.log()


def split_row_stats(tile: Tensor, work: Tensor, split: PositiveSplit, i0: int, i1: int, j0: int,
                    j1: int, m: Tensor, s: Tensor, scale: Optional[Tensor] = None) -> None:
    """:func:`row_stats` (:func:`scaled_row_stats` with ``scale``) merged into ``(m, s)`` (all
    candidates) and into ``split``'s rows (the positives left out)."""
    entries = split.entries(i0, i1, j0, j1)
    stats = row_stats if scale is None else (lambda t, w, *p: scaled_row_stats(t, w, scale, *p))
    if entries is None:
        row_max, every = stats(tile, work)
        without = every
    else:
        row_max, every, without = stats(tile, work, entries)
    merge_(m, s, row_max, every)
    split.merge((i0, i1, j0, j1), row_max, without)


def col_stats(tile: Tensor, work: Tensor, positives: Optional[Tuple[Tensor, Tensor]] = None):
    """Per-column (max, sum exp(tile - max)); with ``positives`` (the rows' positive entries,
    which are the columns' own) also the sums without them, as :func:`row_stats`."""
    col_max = tile.amax(dim=0)
    torch.sub(tile, _finite_or_zero(col_max)[None, :], out=work).exp_()
    if positives is None:
        return col_max, work.sum(dim=0)
    return (col_max, *PositiveSplit.col_sums(work, positives))


def both_stats(tile: Tensor, work: Tensor, row_m: Tensor, row_s: Tensor, col_m: Tensor,
                col_s: Tensor, split: Optional[PositiveSplit] = None,
                where: Optional[Tuple[int, int, int, int]] = None) -> Tuple[Tensor, bool]:
    """Merge a tile's statistics into its rows and columns; returns (shift, shared_shift_used).

    With a shared scalar shift the tile is exponentiated once for both axes. Whether that
    shift is safe is a value of the tile: reading it is free on the CPU, but on an
    accelerator it would stop the host once per tile, so there every tile takes the separate
    per-row and per-column shifts (one more exponential per element, no synchronisation).
    With ``split`` (and the tile's ``where``, ``(i0, i1, j0, j1)``), the sums without the
    positives are merged into it too (the same entries for rows and columns, the positive map
    being an involution).
    """
    entries = None if split is None else split.entries(*where)
    (row_max, rows, rows_without, col_max, cols, cols_without), shift, shared = _both_sums(tile, work, entries)
    merge_(row_m, row_s, row_max, rows)
    merge_(col_m, col_s, col_max, cols)
    if split is not None:
        split.merge(where, row_max, rows_without, col_max, cols_without)
    return shift, shared


def _both_sums(tile: Tensor, work: Tensor, positives: Optional[Tuple[Tensor, Tensor]] = None):
    """:func:`both_stats`' per-row and per-column ``(shift, sum, sum without the positives)``,
    not merged (the last two the same without ``positives``), with the shift and whether it
    was shared."""
    def separate(shift: Tensor):
        if positives is None:
            (row_max, rows), (col_max, cols) = row_stats(tile, work), col_stats(tile, work)
            return (row_max, rows, rows, col_max, cols, cols), shift, False
        return (*row_stats(tile, work, positives), *col_stats(tile, work, positives)), shift, False

    if not validation.reads_are_free(tile):
        return separate(tile.new_zeros(()))
    shift = tile.max()
    torch.sub(tile, shift, out=work).exp_()
    if positives is None:
        rows = rows_all = work.sum(dim=1)
        cols = cols_all = work.sum(dim=0)
    else:
        rows_all, rows, cols_all, cols = PositiveSplit.both_sums(work, positives)
    if float(torch.minimum(rows.min(), cols.min())) >= _MIN_SHIFTED_SUM:
        return (shift, rows_all, rows, shift, cols_all, cols), shift, True
    return separate(shift)


def scaled_row_stats(tile: Tensor, work: Tensor, scale: Tensor, positives: Optional[Tuple[Tensor, Tensor]] = None):
    """:func:`row_stats` of ``scale[:, None] * tile`` (``scale > 0``, one per row), the
    scaling done in the same pass as the shift; with ``positives``, also the sums without them."""
    row_max = tile.amax(dim=1) * scale
    torch.addcmul(_finite_or_zero(row_max).neg()[:, None], tile, scale[:, None], out=work).exp_()
    if positives is None:
        return row_max, work.sum(dim=1)
    return (row_max, *PositiveSplit.row_sums(work, positives))


def scaled_col_stats(tile: Tensor, work: Tensor, scale: Tensor, positives: Optional[Tuple[Tensor, Tensor]] = None):
    """:func:`col_stats` of ``tile * scale[None, :]`` (one scale per column); with
    ``positives``, also the sums without them."""
    col_max = tile.amax(dim=0) * scale
    torch.addcmul(_finite_or_zero(col_max).neg()[None, :], tile, scale[None, :], out=work).exp_()
    if positives is None:
        return col_max, work.sum(dim=0)
    return (col_max, *PositiveSplit.col_sums(work, positives))


def _scaled_both_sums(tile: Tensor, work: Tensor, row_scale: Tensor, col_scale: Tensor,
                      positives: Optional[Tuple[Tensor, Tensor]]) -> Tuple[Tensor, ...]:
    """:func:`scaled_both_stats`' per-row and per-column ``(shift, sum, sum without the
    positives)``, not merged (the last two the same without ``positives``)."""
    if validation.reads_are_free(tile):
        shift = tile.max()
        row_shift, col_shift = row_scale * shift, col_scale * shift
        torch.addcmul(row_shift.neg()[:, None], tile, row_scale[:, None], out=work).exp_()
        rows_all, rows = (work.sum(dim=1),) * 2 if positives is None else PositiveSplit.row_sums(work, positives)
        torch.addcmul(col_shift.neg()[None, :], tile, col_scale[None, :], out=work).exp_()
        cols_all, cols = (work.sum(dim=0),) * 2 if positives is None else PositiveSplit.col_sums(work, positives)
        if float(torch.minimum(rows.min(), cols.min())) >= _MIN_SHIFTED_SUM:
            return row_shift, rows_all, rows, col_shift, cols_all, cols
    if positives is None:
        row_max, rows = scaled_row_stats(tile, work, row_scale)
        col_max, cols = scaled_col_stats(tile, work, col_scale)
        return row_max, rows, rows, col_max, cols, cols
    return (*scaled_row_stats(tile, work, row_scale, positives), *scaled_col_stats(tile, work, col_scale, positives))


def scaled_both_stats(tile: Tensor, work: Tensor, row_scale: Tensor, col_scale: Tensor, row_m: Tensor,
                      row_s: Tensor, col_m: Tensor, col_s: Tensor, split: Optional[PositiveSplit] = None,
                      where: Optional[Tuple[int, int, int, int]] = None) -> None:
    """Merge a tile's statistics into its rows (at ``row_scale``) and its columns (at
    ``col_scale``). On the CPU one scalar, the tile maximum ``c``, shifts both: row ``i`` sums
    ``exp(row_scale_i (S_ij - c))`` (no per-row maximum pass), kept when every row's and
    column's sum stays above ``exp(-margin)`` as for :func:`both_stats`; otherwise, and on an
    accelerator (where the check would stop the host), exact per-row and per-column maxima.
    With ``split`` (and the tile's ``where``, ``(i0, i1, j0, j1)``), the sums without the
    positives are merged into it too."""
    entries = None if split is None else split.entries(*where)
    row_max, rows, rows_without, col_max, cols, cols_without = _scaled_both_sums(tile, work, row_scale, col_scale,
                                                                                 entries)
    merge_(row_m, row_s, row_max, rows)
    merge_(col_m, col_s, col_max, cols)
    if split is not None:
        split.merge(where, row_max, rows_without, col_max, cols_without)


def scaled_pair_weights(tile: Tensor, work: Tensor, spare: Tensor, row_scale: Tensor, g_row: Tensor,
                        lse_row: Tensor, col_scale: Tensor, g_col: Tensor, lse_col: Tensor,
                        d_row_scale: Optional[Tensor], d_col_scale: Optional[Tensor]) -> Tensor:
    """The backward of a tile ``S`` whose rows are anchors at ``row_scale`` and whose columns
    are anchors at ``col_scale`` (``S_ij`` enters row ``i``'s log-sum-exp as
    ``row_scale_i S_ij`` and column ``j``'s as ``col_scale_j S_ij``).

    With ``P = exp(row_scale S - lse_row)`` and ``Q = exp(S col_scale - lse_col)`` returns
    ``W = g_row row_scale P + Q g_col col_scale``, the gradient with respect to ``S`` (in
    ``work``), and adds ``g_row sum_j P_ij S_ij`` to ``d_row_scale`` and
    ``g_col sum_i Q_ij S_ij`` to ``d_col_scale`` (the gradients of the scales; skipped where
    ``None``). The factor ``row_scale`` rides in the exponent (``log row_scale - lse_row``).
    Overwrites all three buffers; ``tile`` holds ``S``.
    """
    log_row, log_col = row_scale.log() - lse_row, col_scale.log() - lse_col
    # Positive upstream gradients (every reduction but a user's own weights) ride in the
    # exponent too, which saves two passes over the tile; the check is a read, free on the CPU.
    fold = validation.reads_are_free(tile) and bool((g_row > 0).all()) and bool((g_col > 0).all())
    if fold:
        log_row, log_col = log_row + g_row.log(), log_col + g_col.log()
    torch.addcmul(log_row[:, None], tile, row_scale[:, None], out=work).exp_()
    if not fold:
        work.mul_(g_row[:, None])
    if d_row_scale is not None:
        d_row_scale.add_(torch.mul(work, tile, out=spare).sum(dim=1) / row_scale)
    torch.addcmul(log_col[None, :], tile, col_scale[None, :], out=spare).exp_()
    if d_col_scale is not None:
        d_col_scale.add_(tile.mul_(spare).sum(dim=0) * ((1.0 if fold else g_col) / col_scale))
    return work.add_(spare) if fold else work.addcmul_(spare, g_col[None, :])


def mask_excluded_(tile: Tensor, exclude: Optional[Tensor], i0: int, i1: int, j0: int, j1: int) -> None:
    """Set the excluded entries of a tile to -inf: ``exclude`` ``(n, k)`` holds, per anchor
    row, the candidate columns (of the whole candidate block) left out of its sum."""
    if exclude is None:
        return
    columns = exclude[i0:i1] - j0
    inside = (columns >= 0) & (columns < j1 - j0)
    # Without reading ``inside`` on the host: every listed entry takes min(entry, -inf) if it
    # is in this tile, min(entry, +inf) = entry (at a clamped, harmless column) if not.
    limits = torch.where(inside, float("-inf"), float("inf")).to(tile.dtype)
    tile.scatter_reduce_(1, columns.clamp(0, j1 - j0 - 1), limits, reduce="amin")


def mask_other_labels_(tile: Tensor, row_labels: Optional[Tensor], col_labels: Optional[Tensor],
                       keep_same: bool = True) -> None:
    """Keep only the entries whose row and column share a label (SupCon's positives), or with
    ``keep_same=False`` only those whose labels differ (an anchor's negatives)."""
    if row_labels is not None:
        differ = row_labels[:, None] != col_labels[None, :]
        tile.masked_fill_(differ if keep_same else ~differ, float("-inf"))


def top_k_mask(scores: Tensor, k: int) -> Tensor:
    """The ``k`` largest entries of each row of ``scores`` (``(r, K)``, left-out entries
    ``-inf``, at least ``k`` finite per row), as a boolean mask.

    Tie rule: every entry above the row's ``k``-th largest value is kept, and of the entries
    equal to it the ones with the lowest column indices, so that exactly ``k`` are kept. The
    rule reads values only, so a kernel that recomputes the same scores (the backward pass of
    a tiled loss) selects the same entries, and the dense path, given the same scores, too.
    """
    kth = scores.topk(k, dim=1).values[:, -1:]
    above = scores > kth
    tied = scores == kth
    room = k - above.sum(dim=1, keepdim=True)
    return above.logical_or_(tied.logical_and_(tied.cumsum(dim=1) <= room))


def backward_lse(lse: Tensor) -> Tensor:
    """``lse`` for rebuilding ``exp(S - lse)``: a row whose sum is empty (``-inf``, every entry
    masked) gets ``+inf``, so its weights are ``exp(-inf) = 0`` instead of NaN."""
    return torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)


def masked_tiles(a: Tensor, c: Tensor, exclude: Optional[Tensor], a_labels: Optional[Tensor],
                 c_labels: Optional[Tensor], chunk: int, tile_buf: Tensor,
                 keep_same: bool = True) -> Iterator[Tuple[int, int, int, int, Tensor]]:
    """Every tile ``a[i0:i1] @ c[j0:j1].T`` with its left-out entries -inf, in one buffer
    (``keep_same``: :func:`mask_other_labels_`)."""
    for i0, i1 in tile_ranges(a.shape[0], chunk):
        for j0, j1 in tile_ranges(c.shape[0], chunk):
            tile = torch.mm(a[i0:i1], c[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
            mask_excluded_(tile, exclude, i0, i1, j0, j1)
            mask_other_labels_(tile, None if a_labels is None else a_labels[i0:i1],
                               None if c_labels is None else c_labels[j0:j1], keep_same)
            yield i0, i1, j0, j1, tile


def merge_masked_rows_(m: Tensor, s: Tensor, a: Tensor, c: Tensor, exclude: Optional[Tensor],
                       a_labels: Optional[Tensor], c_labels: Optional[Tensor], chunk: int,
                       tile_buf: Tensor, work_buf: Tensor, split: Optional[PositiveSplit] = None,
                       positives_here: bool = False, keep_same: bool = True) -> None:
    """Merge the masked tiles of ``a c^T`` (:func:`masked_tiles`) into the rows' running
    ``(m, s)``, in place; with ``split``, the sums without each row's positive into its rows
    too (the positives are among ``c`` where ``positives_here``)."""
    for i0, i1, j0, j1, tile in masked_tiles(a, c, exclude, a_labels, c_labels, chunk, tile_buf, keep_same):
        work = tile_view(work_buf, i1 - i0, j1 - j0)
        entries = split.entries(i0, i1, j0, j1) if split is not None and positives_here else None
        if entries is None:
            row_max, every = row_stats(tile, work)
            without = every
        else:
            row_max, every, without = row_stats(tile, work, entries)
        merge_(m[i0:i1], s[i0:i1], row_max, every)
        if split is not None:
            split.merge((i0, i1, j0, j1), row_max, without)


def add_masked_row_grads_(da: Optional[Tensor], dc: Optional[Tensor], a: Tensor, c: Tensor, grad: Tensor,
                          lse: Tensor, exclude: Optional[Tensor], a_labels: Optional[Tensor],
                          c_labels: Optional[Tensor], chunk: int, tile_buf: Tensor,
                          keep_same: bool = True) -> None:
    """The backward of :func:`merge_masked_rows_`: with ``P = grad * exp(a c^T - lse)`` on
    the kept entries, ``da += P c`` and ``dc += P^T a`` (either may be ``None``); ``lse`` as
    from :func:`backward_lse`."""
    for i0, i1, j0, j1, tile in masked_tiles(a, c, exclude, a_labels, c_labels, chunk, tile_buf, keep_same):
        weights = tile.sub_(lse[i0:i1, None]).exp_().mul_(grad[i0:i1, None])
        if da is not None:
            da[i0:i1].addmm_(weights, c[j0:j1])
        if dc is not None:
            dc[j0:j1].addmm_(weights.T, a[i0:i1])


def refuse_double_backward() -> None:
    # Grad mode is on in a backward pass only with create_graph=True; the tiled backward is
    # not itself differentiable, and silently dropping its second-order term would be wrong.
    if torch.is_grad_enabled():
        raise RuntimeError(
            "the tiled contrastive losses support one backward pass only: create_graph=True "
            "(double backward) is not supported; use the dense path (small batches) for it")


def no_autocast(like: Tensor):
    # Autocast would run the tile products in half precision (the backward may be called
    # inside a user's autocast region); the kernels always compute in the input's dtype.
    return torch.autocast(device_type=like.device.type, enabled=False)


def tile_buffers(like: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    return like.new_empty(chunk * chunk), like.new_empty(chunk * chunk)


def tile_view(buffer: Tensor, rows: int, cols: int) -> Tensor:
    return buffer[: rows * cols].view(rows, cols)


def pair_weights(tile: Tensor, work: Tensor, shift: Tensor, shared: bool,
                  g_row: Tensor, lse_row: Tensor, g_col: Tensor, lse_col: Tensor) -> Tensor:
    """``W = g_row * exp(S - lse_row) + g_col * exp(S - lse_col)``; overwrites both buffers.

    ``tile`` holds ``S - c`` if ``shared`` else ``S``.

    ``lse_row`` runs along the tile's rows (shape ``(r,)``), ``lse_col`` along its columns.
    Returns ``W`` (it lives in ``work`` or ``tile``).
    """
    if shared:
        # exp(s - lse) = exp(s - c) * exp(c - lse): one exponential per element. The caller
        # has already subtracted c (folded into the product, see shifted_tile).
        alpha = g_row * torch.exp(shift - lse_row)
        beta = g_col * torch.exp(shift - lse_col)
        tile.exp_()
        torch.mul(tile, alpha[:, None], out=work)
        return work.addcmul_(tile, beta[None, :])
    torch.sub(tile, lse_row[:, None], out=work).exp_().mul_(g_row[:, None])
    tile.sub_(lse_col[None, :]).exp_().mul_(g_col[None, :])
    return tile.add_(work)


def shifted_tile(a: Tensor, b: Tensor, out: Tensor, shift: Tensor, shared: bool) -> Tensor:
    """``A B^T - c`` when the tile uses the shared shift ``c`` (the subtraction rides on the
    product for free), else ``A B^T``."""
    if shared:
        return torch.addmm(-shift, a, b.T, out=out)
    return torch.mm(a, b.T, out=out)
