"""Named variants of NT-Xent on two views: other denominators, other weights.

:func:`dcl` (the positive left out of the denominator), :func:`simple_loss` (no softmax),
:func:`hard_negative_nt_xent` (only the hardest negatives), :func:`debiased_nt_xent` and
:func:`hcl` (a corrected, reweighted negative mass). Conventions:
:mod:`contrastkit.losses.functional`.

Every one of them goes through :func:`contrastkit.losses.dispatch.contrast`, the one choice
of backend (dense, tiled, gathered or ring; ``chunk_size=`` and ``distributed=`` as for
:func:`nt_xent_views`). :func:`dcl` is a :class:`~contrastkit.losses.dispatch.SelfContrast`;
the others describe their per-anchor losses to it here, once on the dense logits and once
without the matrix:

* the simple loss is linear in the similarities: the negatives' sum is ``z_i . sum_k z_k``
  minus the anchor's own and its positive's terms, so its tiled path needs no tile at all
  (and its ring form only the sum of every rank's rows);
* the debiased and HCL denominators are log-sum-exps over the negatives (of ``l``, and for
  HCL of ``(1 + beta) l`` and ``beta l``), taken in tiles
  (:func:`contrastkit.losses.tiled.masked_logsumexp`) or round the ring, and the floor
  ``M e^{-1/tau}`` then acts on each anchor's whole total, as on the dense path;
* the hard-negative loss selects each anchor's ``k`` hardest negatives, which needs whole
  rows: :func:`contrastkit.losses.tiled.topk_logsumexp` works in blocks of whole rows of
  about ``chunk_size^2`` entries. Under ``distributed_mode="local"`` with tiles its ranks
  gather the rows (``O(N d)`` per rank, exact gradients) instead of passing them round a
  ring: a row's selection needs all of its candidates at once.

In ``"local"`` mode a rank computes its own anchors against the candidates of every rank,
so the simple loss's mean is over the negatives of every rank and the hardest negatives are
mined among all of them (:class:`contrastkit.losses._sharding.Shard`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from contrastkit.distributed.gather import DistributedArg, RowLayout, all_gather_with_grad

from . import tiled
from ._sharding import Shard, select
from ._tiles import top_k_mask
from .core import divide_rows, per_anchor_nll
from .dispatch import (
    LossCall,
    SelfContrast,
    _divide_by_temperature,
    _gather_anchor_rows,
    _ring_lse,
    contrast,
    self_mask,
    views_positive_index,
)
from .infonce import nt_xent_views  # noqa: F401  (used by the doctests)
from .validation import (
    TemperatureLike,
    check_nonnegative,
    check_pair,
    check_probability,
    optional_int,
    prepare,
)

__all__ = ["dcl", "simple_loss", "hard_negative_nt_xent", "debiased_nt_xent", "hcl"]


def _views(shard: Shard, blocks: Tuple[Tensor, Tensor], tau, normalize: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Logits of the stacked (gathered) views ``(2N, 2N)``, each anchor's positive index, a
    mask of its negatives (neither itself nor its positive) and its own column; autocast must
    already be off. With ``shard`` in ``"local"`` mode: only the rows of this rank's anchors
    ``(2n, 2N)`` of the global batch's logits."""
    total = blocks[0].shape[0]
    z = torch.cat([prepare(blocks[0], normalize, "z_a"), prepare(blocks[1], normalize, "z_b")])
    rows = shard.anchor_rows(blocks=2, device=z.device)
    own = torch.arange(2 * total, device=z.device) if rows is None else rows
    index = select(views_positive_index(total, z.device), rows)
    negatives = self_mask(2 * total, z.device, rows)
    negatives[torch.arange(own.shape[0], device=z.device), index] = False
    return divide_rows(select(z, rows) @ z.T, tau), index, negatives, own


@dataclass
class _TwoViewVariant:
    """What :func:`~contrastkit.losses.dispatch.contrast` needs of a variant on two views
    (the interface of :class:`~contrastkit.losses.dispatch.SelfContrast`): every one of the
    ``2N`` stacked rows is an anchor, its negatives are the rows other than itself and its
    positive. Subclasses give the per-anchor losses on the dense logits
    (:meth:`dense_losses`) and from tiles (:meth:`tiled_losses`).

    The default ring form gathers the rows (``O(N d)`` per rank, with the exact
    ``"per_rank"`` gradient) and computes this rank's anchors in tiles: the losses whose
    whole-row statistics are plain log-sum-exps override it with a true ring exchange.
    """

    blocks: Tuple[Tensor, Tensor]

    names = ("z_a", "z_b")

    def sizes(self, shard: Shard, total: int) -> Tuple[int, int]:
        return (2 * self.blocks[0].shape[0] if shard.local else 2 * total), 2 * total

    def tileable(self, shard: Shard) -> bool:
        return True

    def gather(self, shard: Shard) -> Tuple[Tensor, ...]:
        return shard.gather(*self.blocks)

    def gather_temperature(self, shard: Shard, tau: Tensor) -> Tensor:
        return _gather_anchor_rows(shard, tau, 2)

    def _stacked(self, blocks: Tuple[Tensor, ...], normalize: bool) -> Tensor:
        return torch.cat([prepare(b, normalize, name) for b, name in zip(blocks, self.names)])

    def dense(self, call: LossCall, gathered, normalize: bool, total: int) -> Tensor:
        logits, index, negatives, own = _views(call.shard, gathered, call.tau, normalize)
        losses = self.dense_losses(call, logits, index, negatives, own, total)
        return call.shard.reduce(losses, call.reduction, anchors_total=2 * total)

    def tiled(self, call: LossCall, gathered, chunk: int, normalize: bool, total: int) -> Tensor:
        x = self._stacked(gathered, normalize)
        rows = call.shard.anchor_rows(blocks=2, device=x.device)
        own = torch.arange(x.shape[0], device=x.device) if rows is None else rows
        positive = select(views_positive_index(total, x.device), rows)
        losses = self.tiled_losses(call, select(x, rows), x, torch.stack([own, positive], dim=1), chunk, total)
        return call.shard.reduce(losses, call.reduction, anchors_total=2 * total)

    def ring(self, call: LossCall, chunk: int, normalize: bool, total: int) -> Tensor:
        return self.tiled(call, self.gather(call.shard), chunk, normalize, total)

    def dense_losses(self, call: LossCall, logits: Tensor, index: Tensor, negatives: Tensor, own: Tensor,
                     total: int) -> Tensor:
        raise NotImplementedError

    def tiled_losses(self, call: LossCall, anchors: Tensor, x: Tensor, exclude: Tensor, chunk: int,
                     total: int) -> Tensor:
        """Per-anchor losses of ``anchors`` (rows of ``x``, prepared) against the candidates
        ``x``; ``exclude[:, 0]`` is each anchor's own column, ``exclude[:, 1]`` its positive."""
        raise NotImplementedError


def _positive_dot(anchors: Tensor, x: Tensor, exclude: Tensor) -> Tensor:
    return (anchors * x[exclude[:, 1]]).sum(dim=1)


@dataclass
class _Simple(_TwoViewVariant):
    negative_weight: float = 1.0

    def _losses(self, anchors: Tensor, partners: Tensor, row_sum: Tensor, total: int) -> Tensor:
        # Linear in the similarities: the negatives' sum is x_i . (sum of every row) minus
        # the anchor's own and its positive's terms, without any matrix.
        positive = (anchors * partners).sum(dim=1)
        negative_sum = anchors @ row_sum - (anchors * anchors).sum(dim=1) - positive
        return -positive + self.negative_weight * negative_sum / (2 * total - 2)

    def dense_losses(self, call, logits, index, negatives, own, total):
        positive = logits.gather(1, index[:, None]).squeeze(1)
        negative_sum = logits.sum(dim=1) - logits.gather(1, own[:, None]).squeeze(1) - positive
        return -positive + self.negative_weight * negative_sum / (2 * total - 2)

    def tiled_losses(self, call, anchors, x, exclude, chunk, total):
        return self._losses(anchors, x[exclude[:, 1]], x.sum(dim=0), total)

    def ring(self, call: LossCall, chunk: int, normalize: bool, total: int) -> Tensor:
        # Only the sum of every rank's rows is needed: one (1, d) row per rank is gathered,
        # with the gradient of each rank's loss sent back to every rank's rows.
        shard = call.shard
        x = self._stacked(self.blocks, normalize)
        layout = RowLayout(sizes=(1,) * shard.layout.world_size, rank=shard.layout.rank)
        row_sum = all_gather_with_grad(x.sum(dim=0, keepdim=True), shard.group, objective="per_rank",
                                       layout=layout).sum(dim=0)
        partners = x[views_positive_index(self.blocks[0].shape[0], x.device)]
        return shard.reduce(self._losses(x, partners, row_sum, total), call.reduction, anchors_total=2 * total)


@dataclass
class _HardNegative(_TwoViewVariant):
    top_k: int = 1

    def dense_losses(self, call, logits, index, negatives, own, total):
        with torch.no_grad():
            mask = top_k_mask(logits.masked_fill(~negatives, float("-inf")), self.top_k)
            mask[torch.arange(logits.shape[0], device=logits.device), index] = True
        losses, _ = per_anchor_nll(logits, index, mask)
        return losses

    def tiled_losses(self, call, anchors, x, exclude, chunk, total):
        a = _divide_by_temperature(anchors, call.tau, 1.0)
        positive = _positive_dot(a, x, exclude)
        hardest = tiled.topk_logsumexp(a, x, chunk, self.top_k, exclude=exclude)
        return torch.logaddexp(positive, hardest) - positive


@dataclass
class _Debiased(_TwoViewVariant):
    tau_plus: float = 0.1
    beta: float = 0.0

    def _losses(self, log_positive: Tensor, negatives_lse: Callable[[float], Tensor], total: int, tau) -> Tensor:
        """``negatives_lse(f)``: each anchor's log-sum-exp of ``f * l_ij`` over its negatives."""
        num_negatives = 2 * total - 2
        if self.beta == 0.0:
            log_mass = negatives_lse(1.0)
        else:
            # sum_j w_j exp(l_j) = M * sum_j exp((1+beta) l_j) / sum_k exp(beta l_k)
            log_mass = math.log(num_negatives) + negatives_lse(1.0 + self.beta) - negatives_lse(self.beta)
        return _debiased_from_log_masses(log_positive, log_mass, num_negatives, self.tau_plus, tau)

    def dense_losses(self, call, logits, index, negatives, own, total):
        def negatives_lse(factor: float) -> Tensor:
            scaled = logits if factor == 1.0 else factor * logits
            return torch.logsumexp(scaled.masked_fill(~negatives, float("-inf")), dim=1)

        return self._losses(logits.gather(1, index[:, None]).squeeze(1), negatives_lse, total, call.tau)

    def tiled_losses(self, call, anchors, x, exclude, chunk, total):
        a = _divide_by_temperature(anchors, call.tau, 1.0)
        return self._losses(_positive_dot(a, x, exclude),
                            lambda f: tiled.masked_logsumexp(_scaled(a, f), x, chunk, exclude=exclude),
                            total, call.tau)

    def ring(self, call: LossCall, chunk: int, normalize: bool, total: int) -> Tensor:
        # The negative sums are log-sum-exps over every rank's rows and the floor acts on
        # their totals per anchor: the ring exchange gives both exactly.
        shard = call.shard
        x = self._stacked(self.blocks, normalize)
        a = _divide_by_temperature(x, call.tau, 1.0)
        own = torch.arange(x.shape[0], device=x.device)
        exclude = torch.stack([own, views_positive_index(self.blocks[0].shape[0], x.device)], dim=1)
        losses = self._losses(_positive_dot(a, x, exclude),
                              lambda f: _ring_lse(shard, _scaled(a, f), x, chunk, blocks=2, exclude_own=exclude),
                              total, call.tau)
        return shard.reduce(losses, call.reduction, anchors_total=2 * total)


def _scaled(x: Tensor, factor: float) -> Tensor:
    return x if factor == 1.0 else factor * x


def _at_least_two_pairs(n: int, name: str, empty: str) -> None:
    if n < 2:
        raise ValueError(f"{name} needs at least 2 pairs: with one pair {empty}")


def dcl(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Decoupled contrastive loss (Yeh et al. 2022): NT-Xent with the positive removed from
    the denominator (the textbook, section 30.2, exercise F4).

    ``loss_i = -S_{i,p(i)}/tau + log sum_{j not in {i, p(i)}} exp(S_ij/tau)`` over the ``2N``
    anchors of two views. Unlike the standard losses this one is **not** bounded below by 0:
    it goes negative whenever the positive beats the negatives' log-sum-exp.

    Args:
        z_a, z_b: ``(N, d)`` views, row ``i`` of each forming a positive pair; ``N >= 2``
            (with ``N = 1`` the denominator would be empty).
        temperature: ``tau > 0``, or ``(2N,)``: one per anchor (``z_a``'s, then ``z_b``'s).
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation, whose tiles leave out each anchor and its
            positive (``contrastkit.losses.tiled.masked_logsumexp``).
        distributed, distributed_mode: global negatives over ranks (module docstring), as in
            :func:`nt_xent_views` (tiles in ``"local"`` mode: the ring exchange); ``N >= 2``
            then applies to the global batch.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Example:
        >>> z_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]]); z_b = z_a.clone()
        >>> round(float(dcl(z_a, z_b, temperature=1.0)), 6)  # -1 + log(2 * exp(0)) < 0
        -0.306853
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(z_a, z_b)
        call.set_anchors(2 * z_a.shape[0], z_a.device)
    _at_least_two_pairs(call.shard.exchange(z_a, z_b), "dcl", "the denominator is empty")
    return contrast(call, SelfContrast((z_a, z_b), ("z_a", "z_b"), exclude_positive=True), normalize=normalize)


def simple_loss(
    z_a: Tensor,
    z_b: Tensor,
    *,
    negative_weight: float = 1.0,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Wang & Liu's "simple" loss, the ``tau -> infinity`` limit that weighs every negative
    the same: ``loss_i = -s_{i,p(i)} + negative_weight * mean_{j not in {i, p(i)}} s_ij``.

    No temperature and no softmax: the gradient on each negative is the same, so there is no
    hardness awareness (Wang & Liu, CVPR 2021, "Understanding the Behaviour of Contrastive
    Loss"). It is negative for good embeddings.

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        negative_weight: lambda >= 0 on the mean negative similarity.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or any tile size, forcing the
            matrix-free computation: the loss is linear in the similarities, so it needs
            ``O(N d)`` memory and no tiles at all (the value only selects the path).
        distributed, distributed_mode: the negatives of every rank (module docstring): the
            mean is over the ``2N - 2`` negatives of the global batch of ``N`` pairs, and the
            reductions are those of :func:`nt_xent_views` (without a matrix in ``"local"``
            mode: only the sum of each rank's rows is exchanged).
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Example:
        >>> z_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(simple_loss(z_a, z_a.clone()))  # -1 + mean of one negative cosine 0
        -1.0
    """
    call = LossCall(temperature=1.0, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(z_a, z_b)
        call.set_anchors(2 * z_a.shape[0], z_a.device)
        negative_weight = check_nonnegative(negative_weight, "negative_weight")
    _at_least_two_pairs(call.shard.exchange(z_a, z_b), "simple_loss", "there are no negatives")
    return contrast(call, _Simple((z_a, z_b), negative_weight=negative_weight), normalize=normalize)


def hard_negative_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    top_k: Optional[int] = None,
    quantile: Optional[float] = None,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """NT-Xent whose denominator keeps only each anchor's hardest negatives (Wang & Liu's
    explicit hard-negative sampling).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired.
        temperature: ``tau > 0``, or ``(2N,)``: one per anchor (``z_a``'s, then ``z_b``'s).
        top_k: keep the ``top_k`` most similar negatives per anchor (all if larger than
            ``2N - 2``). Exactly one of ``top_k`` and ``quantile`` must be given.
        quantile: keep the negatives at or above this quantile of the anchor's negative
            similarities, i.e. the top ``ceil((1 - quantile) * (2N - 2))`` (at least one).
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear computation in blocks of whole rows of about ``chunk_size^2``
            entries (``contrastkit.losses.tiled.topk_logsumexp``).
        distributed, distributed_mode: mine among the negatives of every rank (module
            docstring): ``N`` is then the global batch, so ``top_k`` and ``quantile`` count
            its ``2N - 2`` negatives; the reductions are those of :func:`nt_xent_views`.
            With tiles in ``"local"`` mode the rows are gathered (``O(N d)`` per rank), not
            passed round a ring.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Denominator: the positive plus the selected negatives. Selection is by similarity and
    carries no gradient. Tie rule, the same on the dense and the tiled path: every negative
    above the ``k``-th largest similarity is kept, and of those equal to it the ones with the
    lowest column index (the stacked rows ``z_a`` then ``z_b``), so exactly ``k`` are kept.
    Ties are decided on the computed similarities, so two paths whose rounding differs can
    select differently only between negatives equal to rounding (same value, different
    gradient).

    Example:
        >>> z = torch.eye(4)
        >>> round(float(hard_negative_nt_xent(z, z, temperature=1.0, top_k=1)), 6)
        0.313262
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(z_a, z_b)
        call.set_anchors(2 * z_a.shape[0], z_a.device)
        if (top_k is None) == (quantile is None):
            raise ValueError("give exactly one of top_k and quantile")
        if top_k is not None:
            top_k = optional_int(top_k, "top_k", minimum=1)
        else:
            quantile = check_probability(quantile, "quantile", open_high=True)
    n = call.shard.exchange(z_a, z_b)
    _at_least_two_pairs(n, "hard_negative_nt_xent", "there are no negatives")
    num_negatives = 2 * n - 2
    k = min(top_k, num_negatives) if top_k is not None else max(1, math.ceil((1.0 - quantile) * num_negatives))
    return contrast(call, _HardNegative((z_a, z_b), top_k=k), normalize=normalize)


def _debiased_from_log_masses(
    log_positive: Tensor, log_negative_mass: Tensor, num_negatives: int, tau_plus: float, tau
) -> Tensor:
    """``-log(pos / (pos + Ng))`` with Chuang et al.'s estimator, in log space.

    ``Ng = max((mass - tau_plus * M * pos) / (1 - tau_plus), M * exp(-1/tau))``, where
    ``mass`` is the (possibly reweighted) negative sum and ``M`` the number of negatives.
    Everything is a log-sum-exp or ``log(-expm1)``, so nothing overflows at small ``tau``.
    The floor is built from ``tau`` itself: where it binds, the loss depends on ``tau``
    through it, and a learnable temperature gets that gradient.
    """
    if tau_plus == 0.0:
        log_ng = log_negative_mass
    else:
        log_bias = math.log(tau_plus * num_negatives) + log_positive
        gap = log_bias - log_negative_mass  # < 0 means the debiased mass is positive
        usable = gap < 0
        safe_gap = torch.where(usable, gap, torch.full_like(gap, -1.0))
        log_ng = log_negative_mass + torch.log(-torch.expm1(safe_gap)) - math.log1p(-tau_plus)
        log_ng = torch.where(usable, log_ng, torch.full_like(log_ng, float("-inf")))
    if isinstance(tau, Tensor):
        log_ng = torch.maximum(log_ng, math.log(num_negatives) - 1.0 / tau.to(log_ng.dtype))
    else:
        log_ng = log_ng.clamp(min=math.log(num_negatives) - 1.0 / tau)
    return torch.nn.functional.softplus(log_ng - log_positive)


def debiased_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    tau_plus: float = 0.1,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Debiased contrastive loss (Chuang et al., NeurIPS 2020) on two views.

    Corrects the negative sum for same-class "negatives" with the class prior ``tau_plus``:
    ``Ng = max((sum_neg - tau_plus * M * pos) / (1 - tau_plus), M * exp(-1/tau))`` and
    ``loss_i = -log(pos / (pos + Ng))``, with ``M = 2N - 2`` negatives per anchor,
    ``pos = exp(s_{i,p(i)}/tau)``. ``tau_plus = 0`` recovers :func:`nt_xent_views`
    (as long as the floor does not bind).

    Denominator: the positive plus the debiased negative mass ``Ng`` (self excluded).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        temperature: ``tau > 0``, or ``(2N,)``: one per anchor (``z_a``'s, then ``z_b``'s).
        tau_plus: class prior in ``[0, 1)``.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first (the floor assumes cosine similarities).
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation of the negative sum; the floor acts on each
            anchor's whole sum, as on the dense path.
        distributed, distributed_mode: the negatives of every rank, as in
            :func:`nt_xent_views` (tiles in ``"local"`` mode: the ring exchange); ``N`` and
            ``M = 2N - 2`` are then those of the global batch.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Example:
        >>> z = torch.eye(4)
        >>> a = debiased_nt_xent(z, z, temperature=0.5, tau_plus=0.0)
        >>> bool(torch.isclose(a, nt_xent_views(z, z, temperature=0.5)))
        True
    """
    return _debiased(z_a, z_b, "debiased_nt_xent", temperature=temperature, tau_plus=tau_plus, beta=0.0,
                     reduction=reduction, normalize=normalize, chunk_size=chunk_size, distributed=distributed,
                     distributed_mode=distributed_mode, validate=validate)


def hcl(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    tau_plus: float = 0.1,
    beta: float = 1.0,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Hard-negative contrastive loss (Robinson et al., ICLR 2021) on two views.

    Negatives are reweighted by importance ``w_j = exp(beta * s_j / tau) / mean_k
    exp(beta * s_k / tau)`` before the debiasing of :func:`debiased_nt_xent`; ``beta = 0``
    gives the debiased loss, larger ``beta`` concentrates on harder negatives.

    Denominator: the positive plus the reweighted, debiased negative mass (self excluded).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        temperature: ``tau > 0``, or ``(2N,)``: one per anchor (``z_a``'s, then ``z_b``'s).
        tau_plus: class prior in ``[0, 1)``.
        beta: concentration ``>= 0``.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation: the reweighted mass is two log-sum-exps over the
            negatives (of ``(1 + beta) l`` and ``beta l``), each taken in tiles.
        distributed, distributed_mode: as in :func:`debiased_nt_xent` (ring exchange with
            tiles in ``"local"`` mode).
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Example:
        >>> z = torch.eye(4)
        >>> a = hcl(z, z, temperature=0.5, beta=0.0)
        >>> bool(torch.isclose(a, debiased_nt_xent(z, z, temperature=0.5)))
        True
    """
    return _debiased(z_a, z_b, "hcl", temperature=temperature, tau_plus=tau_plus, beta=beta,
                     reduction=reduction, normalize=normalize, chunk_size=chunk_size, distributed=distributed,
                     distributed_mode=distributed_mode, validate=validate)


def _debiased(z_a: Tensor, z_b: Tensor, name: str, *, temperature: TemperatureLike, tau_plus: float, beta: float,
              reduction: str, normalize: bool, chunk_size: Optional[int], distributed: DistributedArg,
              distributed_mode: str, validate: bool) -> Tensor:
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(z_a, z_b)
        call.set_anchors(2 * z_a.shape[0], z_a.device)
        tau_plus = check_probability(tau_plus, "tau_plus", open_high=True)
        beta = check_nonnegative(beta, "beta")
    _at_least_two_pairs(call.shard.exchange(z_a, z_b), name, "there are no negatives")
    return contrast(call, _Debiased((z_a, z_b), tau_plus=tau_plus, beta=beta), normalize=normalize)
