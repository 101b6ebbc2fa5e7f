"""pytorch-metric-learning's ``NTXentLoss`` and ``SupConLoss`` (https://github.com/KevinMusgrave/
pytorch-metric-learning, 2.9), on contrastkit's losses.

Change ``from pytorch_metric_learning.losses import NTXentLoss, SupConLoss`` to ``from
contrastkit.compat.pml import NTXentLoss, SupConLoss``: the same constructors
(``NTXentLoss(temperature=0.07)``, ``SupConLoss(temperature=0.1)``), the same call
(``loss(embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None)``) and the
same numbers (to float rounding). As in the peer, the embeddings (and ``ref_emb``) are compared
by cosine similarity; without ``ref_emb`` each embedding is compared with the others of the
batch; the pairs are every pair of the batch (same label: positive, another label: negative)
or those of ``indices_tuple`` (a miner's ``(anchors, positives, negatives)`` triplets or
``(anchors1, positives, anchors2, negatives)`` pairs).

* **NTXentLoss** (Chen et al. 2020, as PML computes it for labelled batches): each positive pair
  ``(a, p)`` is its own softmax of ``s_ap / tau`` against the anchor's negatives only (the
  anchor's other positives are left out), ``-log(e^{s_ap/tau} / (e^{s_ap/tau} + sum_n
  e^{s_an/tau}))``, computed as ``softplus(logsumexp_n(s_an / tau) - s_ap / tau)``; the mean over
  the positive pairs. A pair whose anchor has no negative costs 0. With labels, a batch above
  contrastkit's dense size (float32 or float64) runs in tiles, memory linear in ``N``
  (``contrastkit.losses.tiled.pair_softplus_sum``); with ``indices_tuple``, a dense
  ``(N, M)`` computation.
* **SupConLoss** (Khosla et al. 2020, L_out): for each anchor, the mean over its positives of
  the log-probability of the positive among all its pairs (positives and negatives, itself
  left out); the mean over the anchors whose loss is above 0 (PML's ``AvgNonZeroReducer``).
  With labels alone it is :func:`contrastkit.losses.supcon` (``variant="out"``), tiled in
  memory linear in ``N`` for large batches; with ``ref_emb`` or ``indices_tuple``, a dense
  ``(N, M)`` computation.

What differs from the peer, or is kept from it on purpose:

* the peer's **zero loss** is kept: a batch without a positive pair or without a negative pair
  (and, as in the peer's pair losses, a batch whose pair lists all have at most one entry)
  gives ``0``, connected to the embeddings, where contrastkit's core raises;
* a **negative temperature** is kept as the peer computes it (the similarities divided by it);
  ``0`` and a temperature that is not a finite number are refused with a ``ValueError``;
* PML's other options (``distance=``, ``reducer=``, ``embedding_regularizer=``, ...) are not
  offered: passing one is a ``TypeError`` naming it (keep the peer's class for them);
* a non-finite entry or a zero-norm row is refused by name (the peer returns NaN);
* the NT-Xent per pair is ``softplus`` of a difference rather than the log of a ratio plus the
  smallest positive float, so small losses keep their digits in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import losses

__all__ = ["NTXentLoss", "SupConLoss"]


def _check_temperature(temperature: Any) -> None:
    if isinstance(temperature, Tensor):
        value = temperature.detach()
        if value.numel() == 1 and bool(torch.isfinite(value)) and float(value) != 0:
            return
    elif not isinstance(temperature, bool) and isinstance(temperature, (int, float)) and math.isfinite(temperature) \
            and temperature != 0:
        return
    raise ValueError(f"temperature must be a finite number other than 0, got {temperature!r}")


def _refuse_options(name: str, options: dict) -> None:
    if options:
        raise TypeError(f"contrastkit.compat.pml.{name} takes temperature only; "
                        f"{', '.join(sorted(options))} of pytorch-metric-learning are not offered (use the peer's "
                        "class for them)")


def _unit(x: Tensor, what: str) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"{what} must be a (N, D) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what} has non-finite entries")
    if bool((x.norm(dim=1) == 0).any()):
        raise ValueError(f"{what} has a zero-norm row, which has no direction to compare")
    return F.normalize(x, dim=1)


def _labels(labels: Optional[Tensor], n: int, device: torch.device, what: str) -> Optional[Tensor]:
    if labels is None:
        return None
    labels = torch.as_tensor(labels, device=device)
    if labels.shape != (n,):
        raise ValueError(f"{what} must have shape ({n},), got {tuple(labels.shape)}")
    return labels


class _PairLoss(nn.Module):
    """What PML's pair losses share: the inputs, the similarity matrix and the pairs."""

    def __init__(self, temperature: Any) -> None:
        super().__init__()
        _check_temperature(temperature)
        self.temperature = temperature

    def _inputs(self, embeddings: Tensor, labels: Optional[Tensor], indices_tuple: Optional[Sequence[Tensor]],
                ref_emb: Optional[Tensor], ref_labels: Optional[Tensor]) -> Tuple[Tensor, Tensor, Any, bool]:
        """``(queries, references, pairs, same_set)``: the unit rows, and the pairs as masks
        ``(positive, negative)`` of ``(N, M)`` or as index lists ``(a1, p, a2, n)``."""
        _check_temperature(self.temperature)
        queries = _unit(embeddings, "embeddings")
        same_set = ref_emb is None
        references = queries if same_set else _unit(ref_emb, "ref_emb")
        if queries.shape[1] != references.shape[1]:
            raise ValueError(f"ref_emb has {references.shape[1]} dimensions; embeddings have {queries.shape[1]}")
        labels = _labels(labels, queries.shape[0], queries.device, "labels")
        ref_labels = labels if same_set else _labels(ref_labels, references.shape[0], queries.device, "ref_labels")
        if indices_tuple is None:
            if labels is None or ref_labels is None:
                raise ValueError("labels (and ref_labels with ref_emb) are required without indices_tuple")
            return queries, references, _LabelPairs(labels, ref_labels, same_set), same_set
        if len(indices_tuple) == 3:  # a miner's triplets: anchor-positive and anchor-negative pairs
            a, p, n = indices_tuple
            indices_tuple = (a, p, a, n)
        if len(indices_tuple) != 4:
            raise ValueError(f"indices_tuple must hold 3 (triplets) or 4 (pairs) index tensors, got {len(indices_tuple)}")
        pairs = tuple(torch.as_tensor(t, device=queries.device).long().reshape(-1) for t in indices_tuple)
        return queries, references, pairs, same_set

    def forward(self, embeddings: Tensor, labels: Optional[Tensor] = None,
                indices_tuple: Optional[Sequence[Tensor]] = None, ref_emb: Optional[Tensor] = None,
                ref_labels: Optional[Tensor] = None) -> Tensor:
        """The loss of ``embeddings`` ``(N, D)`` (PML's call: the module's description)."""
        queries, references, pairs, same_set = self._inputs(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        positives, negatives = self._count(pairs)
        if max(positives, negatives) <= 1 or positives == 0 or negatives == 0:
            return self._zero(embeddings)  # the peer's zero loss
        return self._loss(embeddings, labels, queries, references, pairs, same_set, positives)

    def _loss(self, embeddings: Tensor, labels: Optional[Tensor], queries: Tensor, references: Tensor, pairs: Any,
              same_set: bool, positives: int) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def _count(pairs: Any) -> Tuple[int, int]:
        """The positive and negative pairs' counts (labels or index lists)."""
        if isinstance(pairs, _LabelPairs):
            return pairs.counts()
        return int(pairs[0].numel()), int(pairs[2].numel())

    @staticmethod
    def _zero(embeddings: Tensor) -> Tensor:
        return (embeddings * 0).sum()


@dataclass
class _LabelPairs:
    """Every pair of the batch by its labels: same label positive (a row never with itself),
    another label negative. Counted in ``O(N + M)``; the ``(N, M)`` masks only on request."""

    labels: Tensor
    ref_labels: Tensor
    same_set: bool

    def counts(self) -> Tuple[int, int]:
        classes, sizes = torch.unique(self.ref_labels, return_counts=True)
        labels = self.labels.to(classes.dtype)
        where = torch.searchsorted(classes, labels).clamp(max=classes.numel() - 1)
        same = torch.where(classes[where] == labels, sizes[where], torch.zeros_like(sizes[where]))
        same_pairs = int(same.sum())
        everything = self.labels.numel() * self.ref_labels.numel()
        return same_pairs - (self.labels.numel() if self.same_set else 0), everything - same_pairs

    def masks(self) -> Tuple[Tensor, Tensor]:
        """``(positive, negative)`` boolean ``(N, M)``."""
        same = self.labels[:, None] == self.ref_labels[None, :]
        negative = ~same
        if self.same_set:
            same.fill_diagonal_(False)
        return same, negative

    def own_column(self) -> Optional[Tensor]:
        """``(N, 1)``: each row's own column, left out of its pairs (same set only)."""
        if not self.same_set:
            return None
        return torch.arange(self.labels.numel(), device=self.labels.device)[:, None]


def _tiles(rows: int, columns: int, dtype: torch.dtype) -> Optional[int]:
    """The tile size where contrastkit would tile a ``rows x columns`` similarity matrix
    (float32 and float64 only), else ``None``."""
    if dtype not in (torch.float32, torch.float64):
        return None
    return losses.tiled.use_tiled(rows, columns, None)


def _scatter_logsumexp(values: Tensor, index: Tensor, size: int) -> Tensor:
    """``(size,)``: the log-sum-exp of ``values`` grouped by ``index`` (``-inf`` for an empty group)."""
    top = torch.full((size,), -math.inf, dtype=values.dtype, device=values.device)
    top = top.scatter_reduce(0, index, values.detach(), reduce="amax", include_self=True)
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    sums = torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, index,
                                                                               torch.exp(values - shift[index]))
    return torch.where(sums > 0, shift + torch.log(torch.where(sums > 0, sums, torch.ones_like(sums))),
                       torch.full_like(sums, -math.inf))


def _masked_logsumexp(scores: Tensor, mask: Tensor) -> Tensor:
    """``(N,)``: the log-sum-exp of each row's ``mask`` ed entries (``-inf`` for a row with none),
    with finite gradients everywhere."""
    has = mask.any(dim=1)
    kept = torch.where(mask, scores, torch.full_like(scores, -math.inf))
    kept = torch.where(has[:, None], kept, torch.zeros_like(kept))
    return torch.where(has, torch.logsumexp(kept, dim=1), torch.full_like(has, -math.inf, dtype=scores.dtype))


def _pair_softplus(negatives: Tensor, positive: Tensor) -> Tensor:
    """``softplus(negatives - positive)``: 0, with gradient 0, where the anchor has no negative."""
    finite = torch.isfinite(negatives)
    return torch.where(finite, F.softplus(torch.where(finite, negatives, positive) - positive),
                       torch.zeros_like(positive))


class NTXentLoss(_PairLoss):
    """pytorch-metric-learning's ``NTXentLoss(temperature=0.07)``: the module's description."""

    def __init__(self, temperature: float = 0.07, **options: Any) -> None:
        _refuse_options("NTXentLoss", options)
        super().__init__(temperature)

    def _loss(self, embeddings: Tensor, labels: Optional[Tensor], queries: Tensor, references: Tensor, pairs: Any,
              same_set: bool, positives: int) -> Tensor:
        if isinstance(pairs, _LabelPairs):  # every pair of the batch, by labels
            chunk = _tiles(queries.shape[0], references.shape[0], queries.dtype)
            if chunk is not None:
                return self._tiled(queries, references, pairs, chunk) / positives
            positive, negative = pairs.masks()
            scores = queries @ references.T / self.temperature
            per_anchor = _masked_logsumexp(scores, negative)
            per_pair = _pair_softplus(per_anchor[:, None].expand_as(scores), scores)
            return per_pair[positive].sum() / positives
        scores = queries @ references.T / self.temperature
        a1, p, a2, n = pairs
        per_anchor = _scatter_logsumexp(scores[a2, n], a2, scores.shape[0])
        return _pair_softplus(per_anchor[a1], scores[a1, p]).mean()

    def _tiled(self, queries: Tensor, references: Tensor, pairs: _LabelPairs, chunk: int) -> Tensor:
        """The sum over positive pairs in contrastkit's tiles (memory linear in ``N``): each
        anchor's negatives' log-sum-exp, then each positive pair's softplus against it."""
        anchors = queries / self.temperature
        classes = (pairs.labels, pairs.ref_labels)
        negatives = losses.tiled.masked_logsumexp(anchors, references, chunk, labels=classes, keep="other")
        return losses.tiled.pair_softplus_sum(anchors, references, negatives, chunk, labels=classes,
                                              exclude=pairs.own_column()).sum()


class SupConLoss(_PairLoss):
    """pytorch-metric-learning's ``SupConLoss(temperature=0.1)``: the module's description."""

    def __init__(self, temperature: float = 0.1, **options: Any) -> None:
        _refuse_options("SupConLoss", options)
        super().__init__(temperature)

    def _loss(self, embeddings: Tensor, labels: Optional[Tensor], queries: Tensor, references: Tensor, pairs: Any,
              same_set: bool, positives: int) -> Tensor:
        positive_temperature = not isinstance(self.temperature, Tensor) and self.temperature > 0
        if isinstance(pairs, _LabelPairs) and same_set and positive_temperature:
            # Labels alone: contrastkit's SupCon (L_out), tiled for large batches.
            per_anchor = losses.supcon(embeddings, labels, temperature=float(self.temperature), variant="out",
                                       reduction="none")
        else:
            per_anchor = self._dense(queries, references, pairs)
        kept = per_anchor > 0  # PML's AvgNonZeroReducer
        if not bool(kept.any()):
            return self._zero(embeddings)
        return per_anchor[kept].mean()

    def _dense(self, queries: Tensor, references: Tensor, pairs: Any) -> Tensor:
        scores = queries @ references.T / self.temperature
        if isinstance(pairs, _LabelPairs):
            positive, negative = pairs.masks()
        else:
            a1, p, a2, n = pairs
            positive = torch.zeros_like(scores, dtype=torch.bool)
            negative = torch.zeros_like(scores, dtype=torch.bool)
            positive[a1, p] = True
            negative[a2, n] = True
            if bool((positive & negative).any()):
                raise ValueError("indices_tuple names a pair both positive and negative")
        denominator = _masked_logsumexp(scores, positive | negative)
        denominator = torch.where(torch.isfinite(denominator), denominator, torch.zeros_like(denominator))
        log_probability = torch.where(positive, scores - denominator[:, None], torch.zeros_like(scores))
        count = positive.sum(dim=1)
        return -log_probability.sum(dim=1) / count.clamp(min=1)
