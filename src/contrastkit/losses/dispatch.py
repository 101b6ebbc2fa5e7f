"""One dispatcher for the losses with in-batch negatives: a loss says what it contrasts, this
module decides how to compute it.

Every such loss is, for anchor ``i`` with candidates ``C(i)`` and temperature ``tau``::

    loss_i = log sum_{j in C(i)} exp(a_i . c_j / tau) - (positive term of anchor i)

and is described by its anchors, candidates, positives and exclusions:

* :class:`SelfContrast` -- one set of rows (a batch, or two views stacked block after block):
  every row is an anchor and a candidate for the other rows. Excluded: the anchor itself (and,
  with ``exclude_positive``, its positive: the decoupled loss). Positives: an index map, the
  same row of the other view block, or class labels (several positives per anchor).
* :class:`CrossContrast` -- two paired batches (query/positive, image/text): anchor ``i``
  picks candidate ``i`` among all candidates, nothing excluded; optionally in both directions
  (weighted), or against a bank of negatives instead of the other rows of the batch.

:func:`contrast` picks the backend, once for all of them:

* **gathered** -- with ``distributed=`` the rows of every rank are concatenated first
  (:class:`contrastkit.losses._sharding.Shard`); in ``"local"`` mode only this rank's
  anchors are computed, against every candidate.
* **ring** -- ``"local"`` mode with tiles: :mod:`contrastkit.losses.ring`, no rank holds the
  global batch.
* **tiled** -- above :data:`contrastkit.losses.tiled.DENSE_MAX_ENTRIES` similarity entries,
  or whenever ``chunk_size`` is given: the memory-linear kernels of
  :mod:`contrastkit.losses.tiled`, with the temperature folded into their inputs.
* **dense** -- otherwise: the similarity matrix and :func:`contrastkit.losses.core.per_anchor_nll`.

Float32 rounding: a small loss (the positive far above the negatives) keeps its digits. The
dense path computes ``(max - positive) + log1p(the other terms)``; the tiled kernels with one
temperature also return each anchor's log-sum-exp without its positive, and the loss takes the
value ``softplus(that - positive)`` with the gradient of ``lse - positive`` (``_nll``), with one
temperature or one per anchor, in the ring exchange too.

The temperature is one ``tau`` for every anchor, or a ``(A,)`` tensor with one per anchor
row (:func:`~contrastkit.losses.validation.resolve_temperature`), in the order of the rows a
loss returns with ``reduction="none"``: anchor ``i``'s logits are ``s_ij / tau_i``. Every
backend computes it exactly: the dense logits divide each row by its own ``tau``, the kernels
that compute a tile for its rows only take the anchors multiplied by ``1 / tau_i``, and the
kernels whose tiles serve rows and columns take the inverse temperatures themselves. A rank
passes the temperatures of its own anchors; ``"global"`` mode gathers them with the rows.

:class:`LossCall` validates the arguments every loss shares (reduction, temperature,
``chunk_size``, ``distributed=``) around the loss's own checks, and owns ``validate``: with
``validate=False`` the checks that read tensor values (finite entries, zero-norm rows, index
ranges: :func:`contrastkit.losses.validation.require`) are skipped for the whole call, for
users who check their inputs upstream. With ``validate=True`` (the default) they run on the
device without a host synchronisation on accelerators.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple, Union

import torch
from torch import Tensor

from contrastkit.distributed.gather import DistributedArg

from . import ring, tiled
from ._sharding import Shard, select
from .core import divide_rows, full_precision, per_anchor_nll, reduce
from .validation import (
    TemperatureLike,
    check_reduction,
    optional_int,
    per_anchor,
    prepare,
    resolve_temperature,
    value_checks,
    warn_few_rows,
)

__all__ = ["LossCall", "SelfContrast", "CrossContrast", "contrast", "views_positive_index", "self_mask"]


class LossCall:
    """The arguments every loss shares, validated once (see :meth:`checking`).

    After the checks: :attr:`tau` (float, 0-dim tensor, or ``(A,)`` with one per anchor row
    of this rank: the loss's body says how many with :meth:`set_anchors`), :attr:`chunk_size`
    (``None`` or a validated int), :attr:`reduction` and :attr:`shard` (the distributed
    batch; inactive unless ``distributed=`` is given). :attr:`validate` says whether the
    value checks run (:meth:`values`: around the checks and the computation, which prepares
    the inputs).
    """

    def __init__(self, *, temperature: TemperatureLike, reduction: str, chunk_size: Optional[int] = None,
                 distributed: DistributedArg = False, distributed_mode: str = "global",
                 validate: bool = True) -> None:
        self.shard = Shard(distributed, distributed_mode)
        self.reduction = reduction
        self.chunk_size = chunk_size
        self.validate = validate
        self.tau: Union[float, Tensor, None] = None
        self._temperature = temperature
        self._anchors: Optional[int] = None
        self._device: Optional[torch.device] = None

    def set_anchors(self, count: int, device: torch.device) -> None:
        """How many anchor rows this call has on this rank, and their device: a per-anchor
        temperature must have that many entries, there."""
        self._anchors, self._device = int(count), device

    def values(self):
        """The value checks of this call on or off (``validate``), for a block of its work."""
        return value_checks(self.validate)

    @contextmanager
    def checking(self) -> Iterator["LossCall"]:
        """Check ``reduction``, run the loss's own checks (the body), then the temperature and
        ``chunk_size``. When distributed, an error is raised on every rank at the row exchange
        instead of here (a rank that raised alone would leave the others waiting)."""
        with self.values(), self.shard.checking():
            check_reduction(self.reduction)
            yield self
            self.tau = resolve_temperature(self._temperature, anchors=self._anchors, device=self._device)
            self.chunk_size = optional_int(self.chunk_size, "chunk_size", minimum=1)


def views_positive_index(n: int, device: Optional[torch.device] = None) -> Tensor:
    """Positive map of SimCLR's 2N views: row ``i`` pairs with ``i + N`` and vice versa."""
    base = torch.arange(n, device=device)
    return torch.cat([base + n, base])


def self_mask(rows: int, device: torch.device, anchor_rows: Optional[Tensor] = None) -> Tensor:
    """Denominator mask without the anchor itself: ``(rows, rows)``, or only ``anchor_rows``."""
    if anchor_rows is None:
        return ~torch.eye(rows, dtype=torch.bool, device=device)
    mask = torch.ones(anchor_rows.shape[0], rows, dtype=torch.bool, device=device)
    mask[torch.arange(anchor_rows.shape[0], device=device), anchor_rows] = False
    return mask


def _temperature_power(tau, power: float):
    """``tau**power`` (a float, or a tensor that keeps a learnable temperature's gradient), for
    :func:`~contrastkit.losses.validation.prepare` to divide by while it normalises."""
    return tau.pow(power) if isinstance(tau, Tensor) else tau ** power


def _divide_by_temperature(x: Tensor, tau, power: float) -> Tensor:
    """``x / tau**power``, row ``i`` by ``tau_i**power`` for a per-anchor ``tau``: the tiled
    kernels see the temperature folded into their inputs, so a learnable temperature gets its
    gradient through this product."""
    if isinstance(tau, Tensor):
        factor = tau.to(x.dtype).pow(-power)
        return x * (factor[:, None] if per_anchor(tau) else factor)
    return x / tau ** power


def _inverse(tau: Tensor, dtype: torch.dtype) -> Tensor:
    """``1 / tau_i`` in ``dtype``: the scales the tiled kernels take (gradient kept)."""
    return tau.to(dtype).reciprocal()


def _gather_anchor_rows(shard: Shard, tau: Tensor, groups: int, per_row: int = 1) -> Tensor:
    """The per-anchor temperatures of every rank, in the order of the gathered anchors (with
    the ``"replicated"`` gradient, as the rows): ``tau`` holds this rank's ``groups`` blocks of
    ``n`` rows, each with ``per_row`` anchors."""
    n = tau.shape[0] // (groups * per_row)
    local = tau.reshape(groups, n, per_row).permute(1, 0, 2).reshape(n, groups * per_row)
    (everyone,) = shard.gather(local)
    return everyone.reshape(everyone.shape[0], groups, per_row).permute(1, 0, 2).reshape(-1)


def _ring_lse(shard: Shard, anchors: Tensor, candidates: Tensor, chunk: int, blocks: int = 1,
              exclude_own: Optional[Tensor] = None, labels: Optional[Tuple[Tensor, Tensor]] = None,
              positive_own: Optional[Tensor] = None):
    """Log-sum-exp of this rank's anchors against every rank's candidates, by ring exchange;
    each rank holds ``blocks`` candidate rows per row of its batch. With ``positive_own`` (each
    anchor's positive among this rank's candidates) also the sums without it."""
    sizes = [blocks * size for size in shard.layout.sizes]
    return ring.ring_logsumexp(anchors, candidates, shard.group, sizes, chunk, exclude_own, labels, positive_own)


def _ring_nll(shard: Shard, anchors: Tensor, candidates: Tensor, chunk: int, positive_logit: Tensor,
              **options) -> Tensor:
    """Per-anchor ``lse - positive`` by ring exchange, its value ``softplus(lse_without -
    positive)`` (:func:`_nll`); ``options`` as :func:`_ring_lse`'s, ``positive_own`` among them."""
    lse, without = _ring_lse(shard, anchors, candidates, chunk, **options)
    return _nll(lse, without, positive_logit)


@dataclass
class SelfContrast:
    """One set of rows contrasted with itself (module docstring).

    Attributes:
        blocks: the raw batches, each ``(N, d)`` -- or ``(N, V, d)``, ``V`` views per row,
            flattened view-major -- stacked block after block; gathered over ranks together.
        names: each block's argument name, for error messages.
        positive_index: an explicit positive map over the stacked rows (not distributed).
        labels: ``(N,)`` class labels: an anchor's positives are the other rows of its class.
            With neither ``positive_index`` nor ``labels``, two blocks are two views and row
            ``i`` of one pairs with row ``i`` of the other.
        multi_positive: with ``labels``, ``"out"`` or ``"in"`` (:func:`.core.per_anchor_nll`);
            ``"out"`` has no ring form (its positive term needs the gathered class sums).
        exclude_positive: leave the positive out of the denominator too (the decoupled loss).
    """

    blocks: Tuple[Tensor, ...]
    names: Tuple[str, ...]
    positive_index: Optional[Tensor] = None
    labels: Optional[Tensor] = None
    multi_positive: str = "out"
    exclude_positive: bool = False

    @property
    def _per_row(self) -> int:
        return self.blocks[0].shape[1] if self.blocks[0].dim() == 3 else 1

    def _rows(self, batch: int) -> int:
        return len(self.blocks) * batch * self._per_row

    def sizes(self, shard: Shard, total: int) -> Tuple[int, int]:
        """(anchor rows computed here, candidate rows); warns for a batch without negatives."""
        rows = self._rows(total)
        if self.labels is None and rows < 4:
            warn_few_rows(rows, rows - 2)
        return self._rows(self.blocks[0].shape[0]) if shard.local else rows, rows

    def tileable(self, shard: Shard) -> bool:
        # L_out's positive term is a per-class sum of the gathered rows: no ring form.
        return self.labels is None or self.multi_positive == "in" or not shard.local

    def _positive_index(self, batch: int, device: torch.device) -> Tensor:
        if self.positive_index is not None:
            return self.positive_index
        return views_positive_index(batch, device)

    def _prepared(self, blocks: Tuple[Tensor, ...], normalize: bool, divisor=None) -> Tensor:
        flat = [prepare(b.reshape(-1, b.shape[-1]), normalize, name, divisor=divisor)
                for b, name in zip(blocks, self.names)]
        return flat[0] if len(flat) == 1 else torch.cat(flat)

    def _exclusions(self, own: Tensor, positive: Tensor) -> Tensor:
        """The columns left out of each anchor's denominator: itself (and its positive)."""
        return torch.stack([own, positive], dim=1) if self.exclude_positive else own[:, None]

    def gather_temperature(self, shard: Shard, tau: Tensor) -> Tensor:
        return _gather_anchor_rows(shard, tau, len(self.blocks), self._per_row)

    def _anchor_side(self, call: LossCall, blocks: Tuple[Tensor, ...], normalize: bool) -> Tuple[Tensor, Tensor]:
        """``(anchors, candidates)`` for the kernels that compute a tile for its rows only: the
        prepared rows, the anchors divided by ``tau`` (by ``sqrt(tau)`` on both sides, in one
        buffer, for a scalar ``tau``)."""
        if per_anchor(call.tau):
            x = self._prepared(blocks, normalize)
            return _divide_by_temperature(x, call.tau, 1.0), x
        x = self._prepared(blocks, normalize, _temperature_power(call.tau, 0.5))  # x / sqrt(tau), in one pass
        return x, x

    def ring(self, call: LossCall, chunk: int, normalize: bool, total: int) -> Tensor:
        # Every anchor's positives are found among the rows travelling round the ring: the
        # other view of its own row is one of this rank's rows, SupCon L_in's are its class.
        shard = call.shard
        anchors, x = self._anchor_side(call, self.blocks, normalize)
        own = torch.arange(x.shape[0], device=x.device)
        blocks = len(self.blocks) * self._per_row
        if self.labels is not None:
            labels = self.labels.to(torch.int64).repeat_interleave(self._per_row)  # travels the ring
            lse = _ring_lse(shard, anchors, x, chunk, blocks=blocks, exclude_own=own[:, None])
            positive_lse = _ring_lse(shard, anchors, x, chunk, blocks=blocks, exclude_own=own[:, None],
                                     labels=(labels, labels))
            everyone = shard.gather_labels(self.labels).repeat_interleave(self._per_row)
            counts = _positive_counts(labels, everyone)
            valid = counts > 0
            losses = lse - positive_lse + counts.clamp(min=1).to(x.dtype).log()
            return shard.reduce(losses, call.reduction, valid, anchors_total=_anchors_with_positive(everyone))
        positive = views_positive_index(self.blocks[0].shape[0], x.device)
        exclude = self._exclusions(own, positive)
        if self.exclude_positive:  # the decoupled loss: its positive is not in its sum
            losses = (_ring_lse(shard, anchors, x, chunk, blocks=blocks, exclude_own=exclude)
                      - _anchor_logits(x, positive, True, call.tau))
        else:
            losses = _ring_nll(shard, anchors, x, chunk, _anchor_logits(x, positive, True, call.tau), blocks=blocks,
                               exclude_own=exclude, positive_own=positive)
        return shard.reduce(losses, call.reduction, anchors_total=self._rows(total))

    def gather(self, shard: Shard) -> Tuple[Tensor, ...]:
        blocks = shard.gather(*self.blocks)
        labels = None
        if self.labels is not None:
            labels = shard.gather_labels(self.labels).repeat_interleave(self._per_row)
        return blocks, labels

    def tiled(self, call: LossCall, gathered, chunk: int, normalize: bool, total: int) -> Tensor:
        blocks, labels = gathered
        if labels is not None:
            tiled_supcon = _tiled_supcon_out if self.multi_positive == "out" else _tiled_supcon_in
            return tiled_supcon(self._prepared(blocks, normalize), labels, call.tau, chunk, call.reduction)
        anchors, x = self._anchor_side(call, blocks, normalize)
        index = self._positive_index(total, x.device)
        if self.exclude_positive:
            own = torch.arange(x.shape[0], device=x.device)
            lse = tiled.masked_logsumexp(anchors, x, chunk, exclude=self._exclusions(own, index))
        else:
            views = self.positive_index is None and len(blocks) == 2
            scale = _inverse(call.tau, x.dtype) if per_anchor(call.tau) else None
            lse, without = tiled.self_logsumexp(x, chunk, scale=scale, positive=index,
                                                positive_shift=x.shape[0] // 2 if views else None)
            return reduce(_nll(lse, without, _anchor_logits(x, index, self.positive_index is None, call.tau)),
                          call.reduction)
        return reduce(lse - _anchor_logits(x, index, self.positive_index is None, call.tau), call.reduction)

    def dense(self, call: LossCall, gathered, normalize: bool, total: int) -> Tensor:
        blocks, labels = gathered
        shard = call.shard
        x = self._prepared(blocks, normalize)
        device = x.device
        rows = shard.anchor_rows(blocks=len(blocks), per_row=self._per_row, device=device)
        mask = self_mask(x.shape[0], device, rows)
        if labels is not None:
            positives = (select(labels, rows)[:, None] == labels[None, :]) & mask
            anchors_total = _anchors_with_positive(labels) if shard.local else None
        else:
            positives = select(self._positive_index(total, device), rows)
            anchors_total = x.shape[0]
            if self.exclude_positive:
                mask[torch.arange(positives.shape[0], device=device), positives] = False
        logits = divide_rows(select(x, rows) @ x.T, call.tau)
        losses, valid = per_anchor_nll(logits, positives, mask, self.multi_positive)
        return shard.reduce(losses, call.reduction, valid, anchors_total=anchors_total)


def _nll(lse: Tensor, without: Tensor, positive: Tensor) -> Tensor:
    """Per-anchor ``lse - positive`` (its gradient) with the value ``softplus(without -
    positive)``, ``without`` the log-sum-exp without the positive (a kernel's value, no
    gradient): the same number, whose small values keep their digits in float32 where ``lse -
    positive`` rounds at the size of the logits (up to ``1 / tau``)."""
    loss = lse - positive
    exact = _softplus(without - positive)
    return torch.where(torch.isfinite(loss), loss + (exact - loss).detach(), loss)


def _softplus(x: Tensor) -> Tensor:
    """``log(1 + e^x)`` to the last digit (``F.softplus`` returns ``x`` itself above 20)."""
    return torch.logaddexp(x, torch.zeros_like(x))


def _positive_logits(x: Tensor, index: Tensor, views: bool) -> Tensor:
    """``x_i . x_{index[i]}`` per row. For two views (``index`` from
    :func:`views_positive_index`: row ``i`` of the first half with row ``i`` of the second)
    from the two halves, without the ``x[index]`` copy that autograd would keep (and scatter
    back) for the backward pass: the same products, one ``(N, d)`` buffer less at the peak."""
    half = x.shape[0] // 2
    if views and x.shape[0] == 2 * half:
        products = (x[:half] * x[half:]).sum(dim=1)
        return torch.cat([products, products])
    return (x * x[index]).sum(dim=1)


def _anchor_logits(x: Tensor, index: Tensor, views: bool, tau) -> Tensor:
    """Each anchor's positive logit: :func:`_positive_logits` of the prepared rows ``x``,
    divided by the anchor's ``tau`` (per-anchor); for a scalar ``tau`` the rows are already
    scaled (``x / sqrt(tau)`` on both sides)."""
    products = _positive_logits(x, index, views)
    return divide_rows(products, tau) if per_anchor(tau) else products


def _positive_counts(labels: Tensor, everyone: Tensor) -> Tensor:
    """How many rows of ``everyone`` (which holds ``labels``' rows too) share each row's label,
    the row itself not counted."""
    classes, counts = torch.unique(everyone, return_counts=True)
    return counts[torch.searchsorted(classes, labels.to(classes.dtype))] - 1


def _tiled_supcon_in(x: Tensor, labels: Tensor, tau, chunk: int, reduction: str) -> Tensor:
    """SupCon L_in in tiles: ``loss_i = lse_{j != i} l_ij - lse_{p in P(i)} l_ip + log |P(i)|``;
    the positives' log-sum-exp is a second pass over the tiles that keeps only the columns of
    the anchor's class."""
    own = torch.arange(x.shape[0], device=x.device)[:, None]
    if per_anchor(tau):
        anchors = _divide_by_temperature(x, tau, 1.0)
        lse = tiled.self_logsumexp(x, chunk, scale=_inverse(tau, x.dtype))
    else:
        x = anchors = _divide_by_temperature(x, tau, 0.5)
        lse = tiled.self_logsumexp(x, chunk)
    positive_lse = tiled.masked_logsumexp(anchors, x, chunk, exclude=own, labels=(labels, labels))
    counts = _positive_counts(labels, labels)
    losses = lse - positive_lse + counts.clamp(min=1).to(x.dtype).log()
    return reduce(losses, reduction, counts > 0)


def _anchors_with_positive(labels: Tensor) -> int:
    """How many rows share their label with at least one other row (O(N), no N x N mask)."""
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return int((counts[inverse] > 1).sum())


def _tiled_supcon_out(x: Tensor, labels: Tensor, tau, chunk: int, reduction: str) -> Tensor:
    """SupCon L_out in tiles: the mean positive logit of anchor ``i`` is
    ``x_i . (sum of its class - x_i) / (class size - 1)``, so only the denominator needs tiles."""
    if per_anchor(tau):
        lse = tiled.self_logsumexp(x, chunk, scale=_inverse(tau, x.dtype))
    else:
        x = _divide_by_temperature(x, tau, 0.5)
        lse = tiled.self_logsumexp(x, chunk)
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    class_sums = x.new_zeros(counts.shape[0], x.shape[1]).index_add(0, inverse, x)
    positive_counts = counts[inverse] - 1
    valid = positive_counts > 0
    positive_mean = (x * (class_sums[inverse] - x)).sum(dim=1) / positive_counts.clamp(min=1).to(x.dtype)
    losses = lse - (divide_rows(positive_mean, tau) if per_anchor(tau) else positive_mean)
    return reduce(losses, reduction, valid)


@dataclass
class CrossContrast:
    """Anchors contrasted with a paired set of candidates (module docstring).

    Attributes:
        anchors, candidates: raw ``(N, d)`` batches; candidate ``i`` is anchor ``i``'s positive.
        names: their argument names, for error messages.
        weight: ``None`` for one direction (anchors choose among candidates); a float for both,
            ``weight`` on anchors -> candidates and ``1 - weight`` on candidates -> anchors.
        bank: ``None`` (the candidates are every row of ``candidates``), or negatives that
            replace the other rows: ``(M, d)`` shared by all anchors, or ``(N, M, d)`` per
            anchor with ``paired_bank`` (never tiled: no matrix larger than the input).
    """

    anchors: Tensor
    candidates: Tensor
    names: Tuple[str, str]
    weight: Optional[float] = None
    bank: Optional[Tensor] = None
    paired_bank: bool = False

    def sizes(self, shard: Shard, total: int) -> Tuple[int, int]:
        """(anchor rows computed here, candidate rows); warns for a batch without negatives."""
        if self.bank is None and total < 2:
            warn_few_rows(total, total - 1)
        candidates = total if self.bank is None else self.bank.shape[0]
        return (self.anchors.shape[0] if shard.local else total), candidates

    def tileable(self, shard: Shard) -> bool:
        return not self.paired_bank

    def gather_temperature(self, shard: Shard, tau: Tensor) -> Tensor:
        return _gather_anchor_rows(shard, tau, 1 if self.weight is None else 2)

    def _directions(self, tau, rows: int):
        """The temperatures of the two directions' anchors: ``(tau_a, tau_b)``, each a scalar or
        ``(rows,)`` (a per-anchor ``tau`` holds the anchors of ``a -> b``, then of ``b -> a``)."""
        return (tau[:rows], tau[rows:]) if per_anchor(tau) else (tau, tau)

    def _prepared(self, anchors: Tensor, candidates: Tensor, normalize: bool,
                  divisor=None) -> Tuple[Tensor, Tensor]:
        """Both sides prepared; the anchors divided by ``divisor`` too (the tiled kernels' tau)."""
        return (prepare(anchors, normalize, self.names[0], divisor=divisor),
                prepare(candidates, normalize, self.names[1]))

    def ring(self, call: LossCall, chunk: int, normalize: bool, total: int) -> Tensor:
        shard = call.shard
        if self.weight is None:
            a, b = self._prepared(self.anchors, self.candidates, normalize, call.tau)
            own = torch.arange(a.shape[0], device=a.device)
            losses = _ring_nll(shard, a, b, chunk, (a * b).sum(dim=1), positive_own=own)
            return shard.reduce(losses, call.reduction, anchors_total=total)
        a, b = self._prepared(self.anchors, self.candidates, normalize)
        tau_a, tau_b = self._directions(call.tau, a.shape[0])
        diagonal = (a * b).sum(dim=1)
        weight = self.weight
        losses = 0.0
        own = torch.arange(a.shape[0], device=a.device)
        if weight > 0:  # once per direction, the anchors divided by their tau
            losses = weight * _ring_nll(shard, _divide_by_temperature(a, tau_a, 1.0), b, chunk,
                                        divide_rows(diagonal, tau_a), positive_own=own)
        if weight < 1:
            losses = losses + (1.0 - weight) * _ring_nll(shard, _divide_by_temperature(b, tau_b, 1.0), a, chunk,
                                                         divide_rows(diagonal, tau_b), positive_own=own)
        return shard.reduce(losses, call.reduction, anchors_total=total)

    def gather(self, shard: Shard) -> Tuple[Tensor, Tensor]:
        if shard.local and self.weight is None:  # own anchors against every rank's candidates
            (candidates,) = shard.gather(self.candidates)
            return self.anchors, candidates
        return shard.gather(self.anchors, self.candidates)

    def tiled(self, call: LossCall, gathered, chunk: int, normalize: bool, total: int) -> Tensor:
        weight = self.weight
        if weight is not None and per_anchor(call.tau):
            return self._tiled_per_anchor(call, gathered, chunk, normalize)
        a, b = self._prepared(*gathered, normalize, call.tau)
        diagonal = (a * b).sum(dim=1)
        if weight is None and self.bank is not None:
            bank_lse, _ = tiled.cross_logsumexp(a, prepare(self.bank, normalize, "negatives"), chunk, columns=False)
            losses = _softplus(bank_lse - diagonal)  # log(e^d + e^bank) - d
        elif weight is None or weight == 1.0:
            lse, _, without, _ = tiled.cross_logsumexp(a, b, chunk, columns=False, diagonal_positives=True)
            losses = _nll(lse, without, diagonal)
        elif weight == 0.0:
            lse, _, without, _ = tiled.cross_logsumexp(b, a, chunk, columns=False, diagonal_positives=True)
            losses = _nll(lse, without, diagonal)
        else:  # both directions from the same tiles
            a_lse, b_lse, a_without, b_without = tiled.cross_logsumexp(a, b, chunk, diagonal_positives=True)
            losses = weight * _nll(a_lse, a_without, diagonal) + (1.0 - weight) * _nll(b_lse, b_without, diagonal)
        return reduce(losses, call.reduction)

    def _tiled_per_anchor(self, call: LossCall, gathered, chunk: int, normalize: bool) -> Tensor:
        """Both directions with a temperature per anchor: one direction alone takes its anchors
        divided by their tau; both take the inverse temperatures of the rows (``a -> b``) and of
        the columns (``b -> a``) into the same tiles."""
        a, b = self._prepared(*gathered, normalize)
        tau_a, tau_b = self._directions(call.tau, a.shape[0])
        diagonal = (a * b).sum(dim=1)
        weight = self.weight
        if weight == 1.0:
            a_lse, _, a_without, _ = tiled.cross_logsumexp(_divide_by_temperature(a, tau_a, 1.0), b, chunk,
                                                           columns=False, diagonal_positives=True)
            losses = _nll(a_lse, a_without, divide_rows(diagonal, tau_a))
        elif weight == 0.0:
            b_lse, _, b_without, _ = tiled.cross_logsumexp(_divide_by_temperature(b, tau_b, 1.0), a, chunk,
                                                           columns=False, diagonal_positives=True)
            losses = _nll(b_lse, b_without, divide_rows(diagonal, tau_b))
        else:
            a_lse, b_lse, a_without, b_without = tiled.cross_logsumexp(
                a, b, chunk, row_scale=_inverse(tau_a, a.dtype), col_scale=_inverse(tau_b, a.dtype),
                diagonal_positives=True)
            losses = (weight * _nll(a_lse, a_without, divide_rows(diagonal, tau_a))
                      + (1.0 - weight) * _nll(b_lse, b_without, divide_rows(diagonal, tau_b)))
        return reduce(losses, call.reduction)

    def dense(self, call: LossCall, gathered, normalize: bool, total: int) -> Tensor:
        shard, tau = call.shard, call.tau
        a, b = self._prepared(*gathered, normalize)
        own = shard.layout.local_rows(a.device) if shard.local else None
        if self.weight is not None:
            return shard.reduce(self._both_directions(a, b, tau, own), call.reduction, anchors_total=total)
        if self.bank is None:
            logits = divide_rows(a @ b.T, tau)
            index = torch.arange(a.shape[0], device=a.device) if own is None else own
        else:
            bank = prepare(self.bank, normalize, "negatives")
            positive_logit = (a * b).sum(dim=1, keepdim=True)
            if self.paired_bank:
                negative_logits = torch.bmm(bank, a[:, :, None]).squeeze(2)
            else:
                negative_logits = a @ bank.T
            logits = divide_rows(torch.cat([positive_logit, negative_logits], dim=1), tau)
            index = torch.zeros(a.shape[0], dtype=torch.long, device=a.device)
        losses, _ = per_anchor_nll(logits, index)
        return shard.reduce(losses, call.reduction, anchors_total=total)

    def _both_directions(self, a: Tensor, b: Tensor, tau, own: Optional[Tensor]) -> Tensor:
        rows = a.shape[0] if own is None else own.shape[0]
        tau_a, tau_b = self._directions(tau, rows)
        if own is None:
            products = a @ b.T
            a_logits = divide_rows(products, tau_a)
            # Column j is anchor j of b -> a: divided by its own tau.
            b_logits = a_logits if not per_anchor(tau) else products / tau_b.to(products.dtype)[None, :]
            diagonal = torch.arange(rows, device=a.device)
            a_to_b, _ = per_anchor_nll(a_logits, diagonal)
            b_to_a, _ = per_anchor_nll(b_logits.T, diagonal)
        else:  # rows and columns of this rank's pairs only
            a_to_b, _ = per_anchor_nll(divide_rows(a[own] @ b.T, tau_a), own)
            b_to_a, _ = per_anchor_nll(divide_rows(b[own] @ a.T, tau_b), own)
        return self.weight * a_to_b + (1.0 - self.weight) * b_to_a


Contrast = Union[SelfContrast, CrossContrast]


def contrast(call: LossCall, spec: Contrast, *, normalize: bool) -> Tensor:
    """Compute the loss ``spec`` describes, on the backend its size and ``distributed=`` call
    for (module docstring): ring, or gathered and then tiled or dense."""
    shard = call.shard
    total = shard.exchange(*((spec.anchors, spec.candidates) if isinstance(spec, CrossContrast) else spec.blocks))
    anchors, candidates = spec.sizes(shard, total)
    chunk = tiled.use_tiled(anchors, candidates, call.chunk_size) if spec.tileable(shard) else None
    device = spec.anchors.device if isinstance(spec, CrossContrast) else spec.blocks[0].device
    if shard.local and chunk is not None:
        with full_precision(device), call.values():
            return spec.ring(call, chunk, normalize, total)
    gathered = spec.gather(shard)
    if shard.active and not shard.local and per_anchor(call.tau):  # every rank computes every anchor
        call.tau = spec.gather_temperature(shard, call.tau)
    with full_precision(device), call.values():
        if chunk is not None:
            return spec.tiled(call, gathered, chunk, normalize, total)
        return spec.dense(call, gathered, normalize, total)
