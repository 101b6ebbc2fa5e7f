"""The InfoNCE / NT-Xent losses: a choice of the positive among in-batch candidates.

:func:`info_nce` (queries against paired positives, or a bank of negatives),
:func:`nt_xent` (any positive map over one batch), :func:`nt_xent_views` (SimCLR's two views),
:func:`bidirectional_info_nce` (ConVIRT / CLIP, both directions) and :func:`similarity_loss`
(a precomputed similarity matrix). Each validates its own inputs, describes what it
contrasts and leaves the backend (dense, tiled, gathered, ring) to
:func:`contrastkit.losses.dispatch.contrast`. Conventions: :mod:`contrastkit.losses.functional`.
"""

from __future__ import annotations

import math  # noqa: F401  (used by the doctests)
from typing import Optional

import torch
from torch import Tensor

from contrastkit.distributed.gather import DistributedArg

from .core import contrastive_loss
from .dispatch import CrossContrast, LossCall, SelfContrast, contrast, self_mask, views_positive_index
from .validation import (
    TemperatureLike,
    check_choice,
    check_embeddings,
    check_index,
    check_pair,
    check_positive_map,
    check_probability,
    check_reduction,
    check_same,
    require,
    value_checks,
)

__all__ = ["info_nce", "nt_xent", "nt_xent_views", "bidirectional_info_nce", "similarity_loss",
           "views_positive_index"]


def similarity_loss(
    similarities: Tensor,
    positive_index: Tensor,
    *,
    temperature: TemperatureLike,
    exclude_diagonal: bool,
    reduction: str = "mean",
    validate: bool = True,
) -> Tensor:
    """InfoNCE on a precomputed similarity matrix, so printed matrices can be used as given.

    Args:
        similarities: ``(N, K)``; row ``i`` is anchor ``i``'s scores against ``K`` candidates.
        positive_index: ``(N,)`` column of each anchor's positive.
        temperature: ``tau > 0``, or ``(N,)``: one per row.
        exclude_diagonal: ``True`` for a self-similarity matrix (``K == N``, one modality):
            candidate ``i`` is anchor ``i`` itself and is removed from the denominator.
            ``False`` for a cross-modal matrix whose diagonal holds the positives.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    The positive is always in the denominator. This is :func:`~contrastkit.losses.contrastive_loss`
    with one positive per anchor and, for ``exclude_diagonal``, the diagonal out of the
    denominator mask.

    Example (the ConVIRT tutorial's matrix, image-to-text direction, tau = 0.1):
        >>> s = torch.tensor([[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
        ...                   [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]])
        >>> round(float(similarity_loss(s, torch.arange(4), temperature=0.1,
        ...                             exclude_diagonal=False)), 4)
        0.0964
    """
    # The checks that name this function's own arguments; contrastive_loss does the rest.
    with value_checks(validate):
        check_reduction(reduction)
        check_embeddings(similarities, "similarities")
        n, k = similarities.shape
        if exclude_diagonal and n != k:
            raise ValueError(f"exclude_diagonal=True needs a square similarity matrix, got {(n, k)}")
        index = check_index(positive_index, "positive_index", length=n, upper=k, device=similarities.device)
        if exclude_diagonal and n:
            # through require: no host read under validate=False, none on a device either
            require(~(index == torch.arange(n, device=index.device)).any(),
                    "positive_index points an anchor at itself, but the diagonal is excluded")
    mask = self_mask(n, similarities.device) if exclude_diagonal else None
    return contrastive_loss(similarities, index, temperature=temperature, denominator_mask=mask, reduction=reduction,
                            validate=validate)


def info_nce(
    query: Tensor,
    positive: Tensor,
    negatives: Optional[Tensor] = None,
    *,
    temperature: TemperatureLike,
    negative_mode: str = "unpaired",
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Candidate-choice InfoNCE (the course page, P10): each query picks its positive among candidates.

    Args:
        query: ``(N, d)``; every row is an anchor.
        positive: ``(N, d)``; row ``i`` is the positive of query ``i``.
        negatives: ``None`` for in-batch negatives (query ``i``'s candidates are all rows of
            ``positive``, the other rows acting as negatives); ``(M, d)`` with
            ``negative_mode="unpaired"`` for a bank shared by all queries (a MoCo queue);
            ``(N, M, d)`` with ``negative_mode="paired"`` for per-query negatives.
        temperature: ``tau > 0``, or ``(N,)``: one per query.
        negative_mode: ``"unpaired"`` or ``"paired"`` (see ``negatives``).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` for ``(N,)``.
        normalize: L2-normalise every input first (cosine similarity).
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size that forces the
            memory-linear tiled computation (in-batch and unpaired negatives; paired
            negatives never build a matrix larger than the input, so it has no effect there).
        distributed: in-batch negatives only: every rank's ``positive`` rows become candidates
            (module docstring). Not allowed with ``negatives``: a bank shared over ranks is
            :class:`contrastkit.distributed.KeyQueue`.
        distributed_mode: ``"global"`` (also gathers ``query``) or ``"local"`` (this rank's
            queries only).
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    The positive is in the denominator: ``loss_i = -log softmax(candidates_i / tau)[pos]``.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]]); p = torch.tensor([[1.0, 0.0]])
        >>> n = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
        >>> round(float(info_nce(q, p, n, temperature=1.0)), 6)  # -log(e / (e + 1 + 1/e))
        0.407606
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(query, positive, ("query", "positive"))
        call.set_anchors(query.shape[0], query.device)
        check_choice(negative_mode, "negative_mode", ("unpaired", "paired"))
        if negatives is not None:
            if call.shard.active:
                raise ValueError("distributed= gathers in-batch negatives and cannot be combined with "
                                 "negatives=; share a bank across ranks with contrastkit.distributed.KeyQueue")
            if negative_mode == "unpaired":
                check_embeddings(negatives, "negatives", ndim=2)
                check_same(query, "query", negatives, "negatives", dims=((1, 1),))
            else:
                check_embeddings(negatives, "negatives", ndim=3)
                check_same(query, "query", negatives, "negatives", dims=((0, 0), (2, 1)))
    spec = CrossContrast(query, positive, ("query", "positive"), bank=negatives,
                         paired_bank=negatives is not None and negative_mode == "paired")
    return contrast(call, spec, normalize=normalize)


def nt_xent(
    z: Tensor,
    positive_index: Tensor,
    *,
    temperature: TemperatureLike,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    validate: bool = True,
) -> Tensor:
    """Pairwise NT-Xent with any positive map (the textbook, section 30.2).

    ``loss_i = -S_{i,p(i)}/tau + log sum_{j != i} exp(S_ij/tau)``, ``S = Z Z^T``.

    Args:
        z: ``(N, d)``; every row is an anchor and a candidate for the others.
        positive_index: ``(N,)`` positive map with ``p(i) != i`` and ``p(p(i)) = i``.
        temperature: ``tau > 0``, or ``(N,)``: one per anchor row, ``l_ij = S_ij / tau_i``.
        reduction: ``"mean"`` over all ``N`` anchors, ``"sum"``, or ``"none"`` for ``(N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Denominator: every row but the anchor itself (the positive is kept). With ``N < 4`` a
    warning is issued (no real negatives). SimCLR's 2N-view loss is the map ``p(i) = i +/- N``
    (:func:`nt_xent_views`).

    The worked example of the textbook, section 30.2, recomputed (the text prints 0.9344 for
    rows 1 and 3, an arithmetic slip).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
        >>> nt_xent(z, torch.tensor([1, 0, 3, 2]), temperature=1.0, reduction="none")
        tensor([0.8189, 1.0960, 0.8189, 1.0960])
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size, validate=validate)
    with call.checking():
        check_embeddings(z, "z")
        call.set_anchors(z.shape[0], z.device)
        index = check_positive_map(positive_index, z.shape[0], z.device)
    return contrast(call, SelfContrast((z,), ("z",), positive_index=index), normalize=normalize)


def nt_xent_views(
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
    """SimCLR's NT-Xent on two views: ``2N`` anchors, each with ``2N - 2`` negatives.

    Args:
        z_a: ``(N, d)`` first view; ``z_b``: ``(N, d)`` second view, row ``i`` pairs with
            ``z_a[i]``.
        temperature: ``tau > 0``, or ``(2N,)``: one per anchor, those of ``z_a`` first, then
            of ``z_b`` (under ``distributed=``, this rank's own anchors in that order).
        reduction: ``"mean"`` over all ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``
            (anchors of ``z_a`` first, then ``z_b``).
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation over the ``2N x 2N`` similarity matrix.
        distributed, distributed_mode: global negatives over ranks (module docstring); ``N``
            is then the global batch and ``"local"`` mode's ``"none"`` gives this rank's
            ``z_a`` anchors, then its ``z_b`` anchors.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Denominator: all ``2N - 1`` other rows (positive included, self excluded).

    Example:
        >>> z = torch.ones(3, 4)
        >>> round(float(nt_xent_views(z, z, temperature=0.5)), 6) == round(math.log(5), 6)
        True
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(z_a, z_b)
        call.set_anchors(2 * z_a.shape[0], z_a.device)
    return contrast(call, SelfContrast((z_a, z_b), ("z_a", "z_b")), normalize=normalize)


def bidirectional_info_nce(
    v: Tensor,
    u: Tensor,
    *,
    temperature: TemperatureLike,
    weight: float = 0.5,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """ConVIRT / CLIP loss: InfoNCE in both directions between paired modalities (the
    ConVIRT tutorial).

    ``loss_i = weight * l_i(v->u) + (1 - weight) * l_i(u->v)`` where ``l_i(v->u)`` is the
    cross-entropy of row ``i`` of ``S = v u^T / tau`` against column ``i``, and
    ``l_i(u->v)`` the same for column ``i``.

    Args:
        v: ``(N, d)`` first modality (images); ``u``: ``(N, d)`` second modality (texts),
            row ``i`` of each forming pair ``i``.
        temperature: ``tau > 0`` (ConVIRT: 0.1; CLIP: learnable, init 0.07), or ``(2N,)``: one
            per anchor, the rows of ``v`` (anchors of ``v -> u``) first, then those of ``u``
            (anchors of ``u -> v``); row ``i`` of ``S`` is divided by ``tau[i]``, column ``i``
            by ``tau[N + i]``.
        weight: lambda in ``[0, 1]`` on the ``v -> u`` direction. 0.75 is ConVIRT, 0.5 CLIP.
        reduction: ``"mean"`` over the ``N`` pairs, ``"sum"``, or ``"none"`` for ``(N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation; both directions come from the same tiles.
        distributed, distributed_mode: global negatives over ranks (module docstring);
            ``"local"`` mode computes the rows and columns of this rank's pairs.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Denominator: all ``N`` candidates of the other modality, the positive included.

    Example:
        >>> v = torch.eye(3); u = torch.eye(3)
        >>> round(float(bidirectional_info_nce(v, u, temperature=1.0, weight=0.75)), 6)
        0.551445
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_pair(v, u, ("v", "u"))
        call.set_anchors(2 * v.shape[0], v.device)
        weight = check_probability(weight, "weight")
    return contrast(call, CrossContrast(v, u, ("v", "u"), weight=weight), normalize=normalize)
