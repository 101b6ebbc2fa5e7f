"""Functional InfoNCE / NT-Xent family.

Conventions shared by every function here:

* Embeddings are ``(N, d)`` rows; with ``normalize=True`` (the default) rows are
  L2-normalised, so similarities are cosines. Zero-norm rows raise ``ValueError``.
* ``temperature`` is ``tau > 0`` (a float, a scalar tensor, or a
  :class:`~contrastkit.losses.Temperature` module); logits are ``s / tau``.
* ``reduction`` is ``"mean"`` (over anchors), ``"sum"`` or ``"none"`` (one loss per anchor).
* Half-precision inputs are computed in float32 with autocast switched off; the result has
  the compute dtype (float32 for fp16/bf16 inputs, else the input dtype).
* ``chunk_size`` (losses that build an ``N x N`` or ``N x M`` similarity matrix):
  ``None`` chooses automatically — the dense matrix for small problems, the exact tiled
  kernels of :mod:`contrastkit.losses.tiled` above a measured size, whose memory grows
  linearly with ``N``; an int forces tiling with tiles of that many rows. Both paths give
  the same loss and gradients up to floating-point rounding.
* The losses with in-batch negatives (:func:`info_nce` without a bank, :func:`nt_xent_views`,
  :func:`bidirectional_info_nce`, :func:`supcon`, :func:`dcl`) take ``distributed=``:
  ``False`` (default), ``True`` (the default torch.distributed process group) or a
  ``ProcessGroup``. The negatives are then those of the concatenated global batch (rank 0's
  rows first; row counts may differ between ranks), and after DDP's gradient averaging the
  parameter gradients equal single-process training on that batch.
  ``distributed_mode="global"`` gathers the batch and computes every anchor on every rank; it
  returns the global loss. ``"local"`` computes only this rank's anchors against all
  candidates (``1/W`` of the similarity matrix) and returns a value whose mean over ranks is
  the global loss (with equal batch sizes and ``reduction="mean"``: the mean over this rank's
  anchors); ``reduction="none"`` gives this rank's anchors only. In ``"local"`` mode a tiled
  computation (``chunk_size``) becomes a ring exchange (:mod:`contrastkit.losses.ring`): no
  rank holds the global batch. See ``docs/distributed.md``.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
from torch import Tensor

from contrastkit.distributed.gather import DistributedArg

from ._checks import (
    TemperatureLike,
    check_embeddings,
    check_index,
    check_probability,
    check_reduction,
    check_same,
    optional_int,
    prepare,
    resolve_temperature,
)
from ._sharding import Shard, select
from .core import full_precision, per_anchor_nll, reduce
from .ring import ring_logsumexp
from .tiled import cross_logsumexp, self_logsumexp, use_tiled

__all__ = [
    "info_nce",
    "nt_xent",
    "nt_xent_views",
    "bidirectional_info_nce",
    "supcon",
    "similarity_loss",
    "dcl",
    "simple_loss",
    "hard_negative_nt_xent",
    "debiased_nt_xent",
    "hcl",
    "views_positive_index",
]


# --------------------------------------------------------------------------- helpers


def _pair(z_a: Tensor, z_b: Tensor) -> None:
    check_embeddings(z_a, "z_a")
    check_embeddings(z_b, "z_b")
    check_same(z_a, "z_a", z_b, "z_b", dims=((0, 0), (1, 1)))


def views_positive_index(n: int, device: Optional[torch.device] = None) -> Tensor:
    """Positive map of SimCLR's 2N views: row ``i`` pairs with ``i + N`` and vice versa."""
    base = torch.arange(n, device=device)
    return torch.cat([base + n, base])


def _warn_few_rows(rows: int) -> None:
    if rows < 4:
        warnings.warn(
            f"only {rows} rows: each anchor has at most {max(rows - 2, 0)} negative(s), so the "
            "loss is degenerate (with 2 rows it is always 0); use N >= 4",
            UserWarning,
            stacklevel=3,
        )


def _views_logits(z_a: Tensor, z_b: Tensor, tau, normalize: bool, anchor_rows: Optional[Tensor] = None) -> Tensor:
    """(2N, 2N) logits of the stacked views, in the compute dtype, autocast already off; only
    the rows ``anchor_rows`` (of the 2N) when given."""
    z = torch.cat([prepare(z_a, normalize, "z_a"), prepare(z_b, normalize, "z_b")])
    return (select(z, anchor_rows) @ z.T) / tau


def _self_mask(rows: int, device: torch.device, anchor_rows: Optional[Tensor] = None) -> Tensor:
    """Denominator mask without the anchor itself: ``(rows, rows)``, or only ``anchor_rows``."""
    if anchor_rows is None:
        return ~torch.eye(rows, dtype=torch.bool, device=device)
    mask = torch.ones(anchor_rows.shape[0], rows, dtype=torch.bool, device=device)
    mask[torch.arange(anchor_rows.shape[0], device=device), anchor_rows] = False
    return mask


def _ring_lse(shard: Shard, anchors: Tensor, candidates: Tensor, chunk: int, blocks: int = 1,
              exclude_own: Optional[Tensor] = None) -> Tensor:
    """Log-sum-exp of this rank's anchors against every rank's candidates, by ring exchange;
    each rank holds ``blocks`` candidate rows per row of its batch."""
    sizes = [blocks * size for size in shard.layout.sizes]
    return ring_logsumexp(anchors, candidates, shard.group, sizes, chunk, exclude_own)


def _tile_size(chunk_size: Optional[int], rows: int, cols: int) -> Optional[int]:
    """Validated ``chunk_size`` -> tile size for an ``rows x cols`` matrix, or ``None`` (dense)."""
    return use_tiled(rows, cols, optional_int(chunk_size, "chunk_size", minimum=1))


def _divide_by_temperature(x: Tensor, tau, power: float) -> Tensor:
    """``x / tau**power``: the tiled kernels see the temperature folded into their inputs, so
    a learnable temperature gets its gradient through this product."""
    if isinstance(tau, Tensor):
        return x * tau.to(x.dtype).pow(-power)
    return x / tau ** power


def _tiled_self_losses(x: Tensor, positive_index: Tensor, tau, chunk: int) -> Tensor:
    """Per-anchor NT-Xent with any positive map, from prepared rows ``x``, in tiles."""
    x = _divide_by_temperature(x, tau, 0.5)
    return self_logsumexp(x, chunk) - (x * x[positive_index]).sum(dim=1)


def _views_negatives_mask(n: int, device: torch.device) -> Tensor:
    """(2N, 2N) mask of each view-anchor's negatives: neither itself nor its positive."""
    mask = _self_mask(2 * n, device)
    mask[torch.arange(2 * n, device=device), views_positive_index(n, device)] = False
    return mask


# --------------------------------------------------------------------------- losses


def similarity_loss(
    similarities: Tensor,
    positive_index: Tensor,
    *,
    temperature: TemperatureLike,
    exclude_diagonal: bool,
    reduction: str = "mean",
) -> Tensor:
    """InfoNCE on a precomputed similarity matrix, so printed matrices can be used as given.

    Args:
        similarities: ``(N, K)``; row ``i`` is anchor ``i``'s scores against ``K`` candidates.
        positive_index: ``(N,)`` column of each anchor's positive.
        temperature: ``tau > 0``.
        exclude_diagonal: ``True`` for a self-similarity matrix (``K == N``, one modality):
            candidate ``i`` is anchor ``i`` itself and is removed from the denominator.
            ``False`` for a cross-modal matrix whose diagonal holds the positives.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    The positive is always in the denominator.

    Example (SPEC §3, image-to-text direction, tau = 0.1):
        >>> s = torch.tensor([[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
        ...                   [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]])
        >>> round(float(similarity_loss(s, torch.arange(4), temperature=0.1,
        ...                             exclude_diagonal=False)), 4)
        0.0964
    """
    check_reduction(reduction)
    check_embeddings(similarities, "similarities")
    tau = resolve_temperature(temperature)
    n, k = similarities.shape
    if exclude_diagonal and n != k:
        raise ValueError(f"exclude_diagonal=True needs a square similarity matrix, got {(n, k)}")
    index = check_index(positive_index, "positive_index", length=n, upper=k, device=similarities.device)
    mask = None
    if exclude_diagonal:
        if bool((index == torch.arange(n, device=index.device)).any()):
            raise ValueError("positive_index points an anchor at itself, but the diagonal is excluded")
        mask = _self_mask(n, similarities.device)
    with full_precision(similarities.device):
        logits = prepare(similarities, False, "similarities") / tau
        losses, _ = per_anchor_nll(logits, index, mask)
        return reduce(losses, reduction)


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
) -> Tensor:
    """Candidate-choice InfoNCE (SPEC §1): each query picks its positive among candidates.

    Args:
        query: ``(N, d)``; every row is an anchor.
        positive: ``(N, d)``; row ``i`` is the positive of query ``i``.
        negatives: ``None`` for in-batch negatives (query ``i``'s candidates are all rows of
            ``positive``, the other rows acting as negatives); ``(M, d)`` with
            ``negative_mode="unpaired"`` for a bank shared by all queries (a MoCo queue);
            ``(N, M, d)`` with ``negative_mode="paired"`` for per-query negatives.
        temperature: ``tau > 0``.
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

    The positive is in the denominator: ``loss_i = -log softmax(candidates_i / tau)[pos]``.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]]); p = torch.tensor([[1.0, 0.0]])
        >>> n = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
        >>> round(float(info_nce(q, p, n, temperature=1.0)), 6)  # -log(e / (e + 1 + 1/e))
        0.407606
    """
    shard = Shard(distributed, distributed_mode)
    with shard.checking():
        check_reduction(reduction)
        check_embeddings(query, "query")
        check_embeddings(positive, "positive")
        check_same(query, "query", positive, "positive", dims=((0, 0), (1, 1)))
        if negative_mode not in ("unpaired", "paired"):
            raise ValueError(f"negative_mode must be 'unpaired' or 'paired', got {negative_mode!r}")
        if negatives is not None:
            if shard.active:
                raise ValueError("distributed= gathers in-batch negatives and cannot be combined with "
                                 "negatives=; share a bank across ranks with contrastkit.distributed.KeyQueue")
            if negative_mode == "unpaired":
                check_embeddings(negatives, "negatives", ndim=2)
                check_same(query, "query", negatives, "negatives", dims=((1, 1),))
            else:
                check_embeddings(negatives, "negatives", ndim=3)
                check_same(query, "query", negatives, "negatives", dims=((0, 0), (2, 1)))
        tau = resolve_temperature(temperature)
        chunk_size = optional_int(chunk_size, "chunk_size", minimum=1)
    total = shard.exchange(query, positive)
    candidates = total if negatives is None else negatives.shape[0]
    anchors = query.shape[0] if shard.local else total
    chunk = _tile_size(chunk_size, anchors, candidates)
    if shard.local and chunk is not None:  # ring: own queries, every rank's positives in turn
        with full_precision(query.device):
            q = _divide_by_temperature(prepare(query, normalize, "query"), tau, 1.0)
            p = prepare(positive, normalize, "positive")
            losses = _ring_lse(shard, q, p, chunk) - (q * p).sum(dim=1)
            return shard.reduce(losses, reduction, anchors_total=total)
    if shard.local:  # own queries against every rank's positives
        (positive,) = shard.gather(positive)
    else:
        query, positive = shard.gather(query, positive)
    with full_precision(query.device):
        q = prepare(query, normalize, "query")
        p = prepare(positive, normalize, "positive")
        if chunk is not None and (negatives is None or negative_mode == "unpaired"):
            q = _divide_by_temperature(q, tau, 1.0)
            positive_logit = (q * p).sum(dim=1)
            if negatives is None:
                lse, _ = cross_logsumexp(q, p, chunk, columns=False)
            else:
                bank_lse, _ = cross_logsumexp(q, prepare(negatives, normalize, "negatives"), chunk, columns=False)
                lse = torch.logaddexp(positive_logit, bank_lse)
            return reduce(lse - positive_logit, reduction)
        if negatives is None:
            logits = (q @ p.T) / tau
            if shard.local:
                index = shard.layout.local_rows(q.device)
            else:
                index = torch.arange(q.shape[0], device=q.device)
        else:
            neg = prepare(negatives, normalize, "negatives")
            positive_logit = (q * p).sum(dim=1, keepdim=True)
            if negative_mode == "unpaired":
                negative_logits = q @ neg.T
            else:
                negative_logits = torch.bmm(neg, q[:, :, None]).squeeze(2)
            logits = torch.cat([positive_logit, negative_logits], dim=1) / tau
            index = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        losses, _ = per_anchor_nll(logits, index)
        return shard.reduce(losses, reduction, anchors_total=total)


def _check_positive_map(positive_index: object, n: int, device: torch.device) -> Tensor:
    index = check_index(positive_index, "positive_index", length=n, upper=n, device=device)
    rows = torch.arange(n, device=device)
    if bool((index == rows).any()):
        bad = rows[index == rows][:5].tolist()
        raise ValueError(f"positive_index maps rows {bad} to themselves; p(i) != i is required")
    if bool((index[index] != rows).any()):
        bad = rows[index[index] != rows][:5].tolist()
        raise ValueError(
            f"positive_index is not symmetric: p(p(i)) != i for rows {bad}; "
            "every row needs exactly one partner that points back"
        )
    return index


def nt_xent(
    z: Tensor,
    positive_index: Tensor,
    *,
    temperature: TemperatureLike,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
) -> Tensor:
    """Pairwise NT-Xent with any positive map (SPEC §2).

    ``loss_i = -S_{i,p(i)}/tau + log sum_{j != i} exp(S_ij/tau)``, ``S = Z Z^T``.

    Args:
        z: ``(N, d)``; every row is an anchor and a candidate for the others.
        positive_index: ``(N,)`` positive map with ``p(i) != i`` and ``p(p(i)) = i``.
        temperature: ``tau > 0``.
        reduction: ``"mean"`` over all ``N`` anchors, ``"sum"``, or ``"none"`` for ``(N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation.

    Denominator: every row but the anchor itself (the positive is kept). With ``N < 4`` a
    warning is issued (no real negatives). SimCLR's 2N-view loss is the map ``p(i) = i +/- N``
    (:func:`nt_xent_views`).

    Example (SPEC §2 worked example):
        >>> z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
        >>> nt_xent(z, torch.tensor([1, 0, 3, 2]), temperature=1.0, reduction="none")
        tensor([0.8189, 1.0960, 0.8189, 1.0960])
    """
    check_reduction(reduction)
    check_embeddings(z, "z")
    tau = resolve_temperature(temperature)
    n = z.shape[0]
    index = _check_positive_map(positive_index, n, z.device)
    _warn_few_rows(n)
    chunk = _tile_size(chunk_size, n, n)
    with full_precision(z.device):
        x = prepare(z, normalize, "z")
        if chunk is not None:
            return reduce(_tiled_self_losses(x, index, tau, chunk), reduction)
        logits = (x @ x.T) / tau
        losses, _ = per_anchor_nll(logits, index, _self_mask(n, z.device))
        return reduce(losses, reduction)


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
) -> Tensor:
    """SimCLR's NT-Xent on two views: ``2N`` anchors, each with ``2N - 2`` negatives.

    Args:
        z_a: ``(N, d)`` first view; ``z_b``: ``(N, d)`` second view, row ``i`` pairs with
            ``z_a[i]``.
        temperature: ``tau > 0``.
        reduction: ``"mean"`` over all ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``
            (anchors of ``z_a`` first, then ``z_b``).
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation over the ``2N x 2N`` similarity matrix.
        distributed, distributed_mode: global negatives over ranks (module docstring); ``N``
            is then the global batch and ``"local"`` mode's ``"none"`` gives this rank's
            ``z_a`` anchors, then its ``z_b`` anchors.

    Denominator: all ``2N - 1`` other rows (positive included, self excluded).

    Example:
        >>> z = torch.ones(3, 4)
        >>> round(float(nt_xent_views(z, z, temperature=0.5)), 6) == round(math.log(5), 6)
        True
    """
    shard = Shard(distributed, distributed_mode)
    with shard.checking():
        check_reduction(reduction)
        _pair(z_a, z_b)
        tau = resolve_temperature(temperature)
        chunk_size = optional_int(chunk_size, "chunk_size", minimum=1)
    n = shard.exchange(z_a, z_b)
    _warn_few_rows(2 * n)
    chunk = _tile_size(chunk_size, 2 * (z_a.shape[0] if shard.local else n), 2 * n)
    if shard.local and chunk is not None:  # ring: the positive of each own anchor is local
        with full_precision(z_a.device):
            x = torch.cat([prepare(z_a, normalize, "z_a"), prepare(z_b, normalize, "z_b")])
            x = _divide_by_temperature(x, tau, 0.5)
            own = torch.arange(x.shape[0], device=x.device)
            lse = _ring_lse(shard, x, x, chunk, blocks=2, exclude_own=own[:, None])
            losses = lse - (x * x[views_positive_index(z_a.shape[0], x.device)]).sum(dim=1)
            return shard.reduce(losses, reduction, anchors_total=2 * n)
    z_a, z_b = shard.gather(z_a, z_b)
    rows = shard.anchor_rows(blocks=2, device=z_a.device)
    with full_precision(z_a.device):
        if chunk is not None:
            x = torch.cat([prepare(z_a, normalize, "z_a"), prepare(z_b, normalize, "z_b")])
            return reduce(_tiled_self_losses(x, views_positive_index(n, z_a.device), tau, chunk), reduction)
        logits = _views_logits(z_a, z_b, tau, normalize, rows)
        index = select(views_positive_index(n, z_a.device), rows)
        losses, _ = per_anchor_nll(logits, index, _self_mask(2 * n, z_a.device, rows))
        return shard.reduce(losses, reduction, anchors_total=2 * n)


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
) -> Tensor:
    """ConVIRT / CLIP loss: InfoNCE in both directions between paired modalities (SPEC §3).

    ``loss_i = weight * l_i(v->u) + (1 - weight) * l_i(u->v)`` where ``l_i(v->u)`` is the
    cross-entropy of row ``i`` of ``S = v u^T / tau`` against column ``i``, and
    ``l_i(u->v)`` the same for column ``i``.

    Args:
        v: ``(N, d)`` first modality (images); ``u``: ``(N, d)`` second modality (texts),
            row ``i`` of each forming pair ``i``.
        temperature: ``tau > 0`` (ConVIRT: 0.1; CLIP: learnable, init 0.07).
        weight: lambda in ``[0, 1]`` on the ``v -> u`` direction. 0.75 is ConVIRT, 0.5 CLIP.
        reduction: ``"mean"`` over the ``N`` pairs, ``"sum"``, or ``"none"`` for ``(N,)``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation; both directions come from the same tiles.
        distributed, distributed_mode: global negatives over ranks (module docstring);
            ``"local"`` mode computes the rows and columns of this rank's pairs.

    Denominator: all ``N`` candidates of the other modality, the positive included.

    Example:
        >>> v = torch.eye(3); u = torch.eye(3)
        >>> round(float(bidirectional_info_nce(v, u, temperature=1.0, weight=0.75)), 6)
        0.551445
    """
    shard = Shard(distributed, distributed_mode)
    with shard.checking():
        check_reduction(reduction)
        check_embeddings(v, "v")
        check_embeddings(u, "u")
        check_same(v, "v", u, "u", dims=((0, 0), (1, 1)))
        weight = check_probability(weight, "weight")
        tau = resolve_temperature(temperature)
        chunk_size = optional_int(chunk_size, "chunk_size", minimum=1)
    total = shard.exchange(v, u)
    chunk = _tile_size(chunk_size, v.shape[0] if shard.local else total, total)
    if shard.local and chunk is not None:  # ring, once per direction
        with full_precision(v.device):
            a = _divide_by_temperature(prepare(v, normalize, "v"), tau, 1.0)
            b = prepare(u, normalize, "u")
            diagonal = (a * b).sum(dim=1)
            losses = weight * (_ring_lse(shard, a, b, chunk) - diagonal) if weight > 0 else 0.0
            if weight < 1:
                losses = losses + (1.0 - weight) * (_ring_lse(shard, b, a, chunk) - diagonal)
            return shard.reduce(losses, reduction, anchors_total=total)
    v, u = shard.gather(v, u)
    rows = shard.anchor_rows(device=v.device)
    with full_precision(v.device):
        if chunk is not None:
            a = _divide_by_temperature(prepare(v, normalize, "v"), tau, 1.0)
            b = prepare(u, normalize, "u")
            diagonal = (a * b).sum(dim=1)
            if weight == 1.0:
                losses = cross_logsumexp(a, b, chunk, columns=False)[0] - diagonal
            elif weight == 0.0:
                losses = cross_logsumexp(b, a, chunk, columns=False)[0] - diagonal
            else:
                v_lse, u_lse = cross_logsumexp(a, b, chunk)
                losses = weight * (v_lse - diagonal) + (1.0 - weight) * (u_lse - diagonal)
            return reduce(losses, reduction)
        v, u = prepare(v, normalize, "v"), prepare(u, normalize, "u")
        if rows is None:
            logits = (v @ u.T) / tau
            diagonal = logits.diagonal()
            v_to_u = torch.logsumexp(logits, dim=1) - diagonal
            u_to_v = torch.logsumexp(logits, dim=0) - diagonal
        else:  # rows and columns of this rank's pairs only
            v_rows = (v[rows] @ u.T) / tau
            u_rows = (u[rows] @ v.T) / tau
            diagonal = v_rows.gather(1, rows[:, None]).squeeze(1)
            v_to_u = torch.logsumexp(v_rows, dim=1) - diagonal
            u_to_v = torch.logsumexp(u_rows, dim=1) - diagonal
        return shard.reduce(weight * v_to_u + (1.0 - weight) * u_to_v, reduction, anchors_total=total)


def supcon(
    z: Tensor,
    labels: Tensor,
    *,
    temperature: TemperatureLike,
    variant: str = "out",
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
) -> Tensor:
    """Supervised contrastive loss (Khosla et al. 2020), L_out or L_in.

    Args:
        z: ``(N, d)`` embeddings, or ``(N, V, d)`` with ``V`` views per sample (flattened to
            ``N * V`` anchors, view-major within a sample, labels repeated).
        labels: ``(N,)`` integer class labels; rows with equal labels are positives.
        temperature: ``tau > 0``.
        variant: ``"out"`` (average of log-probabilities over positives, the paper's
            recommendation) or ``"in"`` (log of the average probability).
        reduction: ``"mean"`` over anchors that have at least one positive, ``"sum"``, or
            ``"none"`` (anchors without a positive get 0). If no anchor has a positive,
            ``"mean"`` raises ``ValueError``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation. Tiling is available for ``variant="out"``
            (whose positive term is a per-class sum); ``"in"`` is always dense and raises
            ``ValueError`` if a ``chunk_size`` is given.
        distributed, distributed_mode: global negatives over ranks (module docstring); the
            labels are gathered too, so positives are found on every rank, and ``"mean"`` is
            over the global batch's anchors that have a positive. Tiling is done on the
            gathered batch in ``"global"`` mode; ``"local"`` mode is dense (there is no ring
            SupCon) and raises ``ValueError`` if a ``chunk_size`` is given.

    Denominator: every other row (positives included, self excluded).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(supcon(z, torch.tensor([0, 0, 1, 1]), temperature=1.0)), 6)
        0.551445
    """
    shard = Shard(distributed, distributed_mode)
    with shard.checking():
        check_reduction(reduction)
        if variant not in ("out", "in"):
            raise ValueError(f"variant must be 'out' or 'in', got {variant!r}")
        if isinstance(z, Tensor) and z.dim() == 3:
            check_embeddings(z, "z", ndim=3)
            views = z.shape[1]
        else:
            check_embeddings(z, "z")
            views = 1
        tau = resolve_temperature(temperature)
        labels = _check_labels(labels, z.shape[0], z.device)
        if variant == "in" and chunk_size is not None:
            raise ValueError("chunk_size (tiled computation) is only available for variant='out'")
        if shard.local and chunk_size is not None:
            raise ValueError("chunk_size is not available with distributed_mode='local' for supcon; "
                             "use distributed_mode='global' for the tiled computation")
        chunk_size = optional_int(chunk_size, "chunk_size", minimum=1)
    (z,) = shard.gather(z)
    labels = shard.gather_labels(labels).repeat_interleave(views)
    z = z.reshape(-1, z.shape[-1])
    n = z.shape[0]
    chunk = _tile_size(chunk_size, n, n) if variant == "out" and not shard.local else None
    if chunk is not None:
        with full_precision(z.device):
            return _tiled_supcon_out(prepare(z, normalize, "z"), labels, tau, chunk, reduction)
    rows = shard.anchor_rows(per_row=views, device=z.device)
    not_self = _self_mask(n, z.device, rows)
    positives = (select(labels, rows)[:, None] == labels[None, :]) & not_self
    with full_precision(z.device):
        x = prepare(z, normalize, "z")
        logits = (select(x, rows) @ x.T) / tau
        losses, valid = per_anchor_nll(logits, positives, not_self, variant)
        return shard.reduce(losses, reduction, valid,
                            anchors_total=_anchors_with_positive(labels) if shard.local else None)


def _anchors_with_positive(labels: Tensor) -> int:
    """How many rows share their label with at least one other row (O(N), no N x N mask)."""
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return int((counts[inverse] > 1).sum())


def _tiled_supcon_out(x: Tensor, labels: Tensor, tau, chunk: int, reduction: str) -> Tensor:
    """SupCon L_out in tiles: the mean positive logit of anchor ``i`` is
    ``x_i . (sum of its class - x_i) / (class size - 1)``, so only the denominator needs tiles."""
    x = _divide_by_temperature(x, tau, 0.5)
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    class_sums = x.new_zeros(counts.shape[0], x.shape[1]).index_add(0, inverse, x)
    positive_counts = counts[inverse] - 1
    valid = positive_counts > 0
    positive_mean = (x * (class_sums[inverse] - x)).sum(dim=1) / positive_counts.clamp(min=1).to(x.dtype)
    losses = self_logsumexp(x, chunk) - positive_mean
    return reduce(losses, reduction, valid)


def _check_labels(labels: object, n: int, device: torch.device) -> Tensor:
    if not isinstance(labels, Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"labels must be an integer tensor or sequence: {err}") from None
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    return labels.to(device)


# --------------------------------------------------------------------------- named variants


def dcl(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    reduction: str = "mean",
    normalize: bool = True,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
) -> Tensor:
    """Decoupled contrastive loss (Yeh et al. 2022): NT-Xent with the positive removed from
    the denominator (SPEC §2 exercise F4).

    ``loss_i = -S_{i,p(i)}/tau + log sum_{j not in {i, p(i)}} exp(S_ij/tau)`` over the ``2N``
    anchors of two views. Unlike the standard losses this one is **not** bounded below by 0:
    it goes negative whenever the positive beats the negatives' log-sum-exp.

    Args:
        z_a, z_b: ``(N, d)`` views, row ``i`` of each forming a positive pair; ``N >= 2``
            (with ``N = 1`` the denominator would be empty).
        temperature: ``tau > 0``.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.
        distributed, distributed_mode: global negatives over ranks (module docstring), as in
            :func:`nt_xent_views`; ``N >= 2`` then applies to the global batch.

    Example:
        >>> z_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]]); z_b = z_a.clone()
        >>> round(float(dcl(z_a, z_b, temperature=1.0)), 6)  # -1 + log(2 * exp(0)) < 0
        -0.306853
    """
    shard = Shard(distributed, distributed_mode)
    with shard.checking():
        check_reduction(reduction)
        _pair(z_a, z_b)
        tau = resolve_temperature(temperature)
    z_a, z_b = shard.gather(z_a, z_b)
    if z_a.shape[0] < 2:
        raise ValueError("dcl needs at least 2 pairs: with one pair the denominator is empty")
    n = z_a.shape[0]
    rows = shard.anchor_rows(blocks=2, device=z_a.device)
    index = select(views_positive_index(n, z_a.device), rows)
    if rows is None:
        mask = _views_negatives_mask(n, z_a.device)
    else:
        mask = _self_mask(2 * n, z_a.device, rows)
        mask[torch.arange(index.shape[0], device=z_a.device), index] = False
    with full_precision(z_a.device):
        logits = _views_logits(z_a, z_b, tau, normalize, rows)
        losses, _ = per_anchor_nll(logits, index, mask)
        return shard.reduce(losses, reduction, anchors_total=2 * n)


def simple_loss(
    z_a: Tensor,
    z_b: Tensor,
    *,
    negative_weight: float = 1.0,
    reduction: str = "mean",
    normalize: bool = True,
) -> Tensor:
    """Wang & Liu's "simple" loss, the ``tau -> infinity`` limit that weighs every negative
    the same: ``loss_i = -s_{i,p(i)} + negative_weight * mean_{j not in {i, p(i)}} s_ij``.

    No temperature and no softmax: the gradient on each negative is the same, so there is no
    hardness awareness (Wang & Liu, CVPR 2021, SPEC §4). It is negative for good embeddings.

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        negative_weight: lambda >= 0 on the mean negative similarity.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.

    Example:
        >>> z_a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(simple_loss(z_a, z_a.clone()))  # -1 + mean of one negative cosine 0
        -1.0
    """
    check_reduction(reduction)
    _pair(z_a, z_b)
    if z_a.shape[0] < 2:
        raise ValueError("simple_loss needs at least 2 pairs: with one pair there are no negatives")
    if isinstance(negative_weight, bool) or not isinstance(negative_weight, (int, float)) \
            or not math.isfinite(negative_weight) or negative_weight < 0:
        raise ValueError(f"negative_weight must be a finite number >= 0, got {negative_weight!r}")
    n = z_a.shape[0]
    with full_precision(z_a.device):
        similarities = _views_logits(z_a, z_b, 1.0, normalize)
        index = views_positive_index(n, z_a.device)
        positive = similarities.gather(1, index[:, None]).squeeze(1)
        negative_sum = similarities.sum(dim=1) - similarities.diagonal() - positive
        losses = -positive + negative_weight * negative_sum / (2 * n - 2)
        return reduce(losses, reduction)


def hard_negative_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    top_k: Optional[int] = None,
    quantile: Optional[float] = None,
    reduction: str = "mean",
    normalize: bool = True,
) -> Tensor:
    """NT-Xent whose denominator keeps only each anchor's hardest negatives (Wang & Liu's
    explicit hard-negative sampling).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired.
        temperature: ``tau > 0``.
        top_k: keep the ``top_k`` most similar negatives per anchor (all if larger than
            ``2N - 2``). Exactly one of ``top_k`` and ``quantile`` must be given.
        quantile: keep the negatives at or above this quantile of the anchor's negative
            similarities, i.e. the top ``ceil((1 - quantile) * (2N - 2))`` (at least one).
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.

    Denominator: the positive plus the selected negatives. Selection is by similarity and
    carries no gradient; ties at the cut are broken arbitrarily.

    Example:
        >>> z = torch.eye(4)
        >>> round(float(hard_negative_nt_xent(z, z, temperature=1.0, top_k=1)), 6)
        0.313262
    """
    check_reduction(reduction)
    _pair(z_a, z_b)
    if (top_k is None) == (quantile is None):
        raise ValueError("give exactly one of top_k and quantile")
    n = z_a.shape[0]
    num_negatives = 2 * n - 2
    if num_negatives == 0:
        raise ValueError("hard_negative_nt_xent needs at least 2 pairs: with one pair there are no negatives")
    if top_k is not None:
        k = min(optional_int(top_k, "top_k", minimum=1), num_negatives)
    else:
        q = check_probability(quantile, "quantile", open_high=True)
        k = max(1, math.ceil((1.0 - q) * num_negatives))
    tau = resolve_temperature(temperature)
    index = views_positive_index(n, z_a.device)
    rows = torch.arange(2 * n, device=z_a.device)
    with full_precision(z_a.device):
        logits = _views_logits(z_a, z_b, tau, normalize)
        with torch.no_grad():
            negatives_only = logits.masked_fill(~_views_negatives_mask(n, z_a.device), float("-inf"))
            hardest = negatives_only.topk(k, dim=1).indices
            mask = torch.zeros_like(logits, dtype=torch.bool)
            mask.scatter_(1, hardest, True)
            mask[rows, index] = True
        losses, _ = per_anchor_nll(logits, index, mask)
        return reduce(losses, reduction)


def _debiased_from_log_masses(
    log_positive: Tensor, log_negative_mass: Tensor, num_negatives: int, tau_plus: float, tau: float
) -> Tensor:
    """``-log(pos / (pos + Ng))`` with Chuang et al.'s estimator, in log space.

    ``Ng = max((mass - tau_plus * M * pos) / (1 - tau_plus), M * exp(-1/tau))``, where
    ``mass`` is the (possibly reweighted) negative sum and ``M`` the number of negatives.
    Everything is a log-sum-exp or ``log(-expm1)``, so nothing overflows at small ``tau``.
    """
    log_floor = math.log(num_negatives) - 1.0 / tau
    if tau_plus == 0.0:
        log_ng = log_negative_mass
    else:
        log_bias = math.log(tau_plus * num_negatives) + log_positive
        gap = log_bias - log_negative_mass  # < 0 means the debiased mass is positive
        usable = gap < 0
        safe_gap = torch.where(usable, gap, torch.full_like(gap, -1.0))
        log_ng = log_negative_mass + torch.log(-torch.expm1(safe_gap)) - math.log1p(-tau_plus)
        log_ng = torch.where(usable, log_ng, torch.full_like(log_ng, float("-inf")))
    log_ng = log_ng.clamp(min=log_floor)
    return torch.nn.functional.softplus(log_ng - log_positive)


def _views_log_terms(z_a, z_b, tau, normalize):
    """Logits of the 2N views, the positive logit per anchor and a negatives-only mask."""
    n = z_a.shape[0]
    logits = _views_logits(z_a, z_b, tau, normalize)
    index = views_positive_index(n, z_a.device)
    return logits, logits.gather(1, index[:, None]).squeeze(1), _views_negatives_mask(n, z_a.device)


def debiased_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    tau_plus: float = 0.1,
    reduction: str = "mean",
    normalize: bool = True,
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
        temperature: ``tau > 0``.
        tau_plus: class prior in ``[0, 1)``.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first (the floor assumes cosine similarities).

    Example:
        >>> z = torch.eye(4)
        >>> a = debiased_nt_xent(z, z, temperature=0.5, tau_plus=0.0)
        >>> bool(torch.isclose(a, nt_xent_views(z, z, temperature=0.5)))
        True
    """
    return _debiased(z_a, z_b, temperature, tau_plus, 0.0, reduction, normalize, "debiased_nt_xent")


def hcl(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: TemperatureLike,
    tau_plus: float = 0.1,
    beta: float = 1.0,
    reduction: str = "mean",
    normalize: bool = True,
) -> Tensor:
    """Hard-negative contrastive loss (Robinson et al., ICLR 2021) on two views.

    Negatives are reweighted by importance ``w_j = exp(beta * s_j / tau) / mean_k
    exp(beta * s_k / tau)`` before the debiasing of :func:`debiased_nt_xent`; ``beta = 0``
    gives the debiased loss, larger ``beta`` concentrates on harder negatives.

    Denominator: the positive plus the reweighted, debiased negative mass (self excluded).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        temperature: ``tau > 0``.
        tau_plus: class prior in ``[0, 1)``.
        beta: concentration ``>= 0``.
        reduction: ``"mean"`` over ``2N`` anchors, ``"sum"``, or ``"none"`` for ``(2N,)``.
        normalize: L2-normalise rows first.

    Example:
        >>> z = torch.eye(4)
        >>> a = hcl(z, z, temperature=0.5, beta=0.0)
        >>> bool(torch.isclose(a, debiased_nt_xent(z, z, temperature=0.5)))
        True
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    return _debiased(z_a, z_b, temperature, tau_plus, float(beta), reduction, normalize, "hcl")


def _debiased(z_a, z_b, temperature, tau_plus, beta, reduction, normalize, name):
    check_reduction(reduction)
    _pair(z_a, z_b)
    n = z_a.shape[0]
    if n < 2:
        raise ValueError(f"{name} needs at least 2 pairs: with one pair there are no negatives")
    tau_plus = check_probability(tau_plus, "tau_plus", open_high=True)
    tau = resolve_temperature(temperature)
    num_negatives = 2 * n - 2
    with full_precision(z_a.device):
        logits, log_positive, negatives = _views_log_terms(z_a, z_b, tau, normalize)
        neg_inf = float("-inf")
        if beta == 0.0:
            log_mass = torch.logsumexp(logits.masked_fill(~negatives, neg_inf), dim=1)
        else:
            # sum_j w_j exp(l_j) = M * sum_j exp((1+beta) l_j) / sum_k exp(beta l_k)
            log_mass = (
                math.log(num_negatives)
                + torch.logsumexp(((1.0 + beta) * logits).masked_fill(~negatives, neg_inf), dim=1)
                - torch.logsumexp((beta * logits).masked_fill(~negatives, neg_inf), dim=1)
            )
        tau_value = float(tau)
        losses = _debiased_from_log_masses(log_positive, log_mass, num_negatives, tau_plus, tau_value)
        return reduce(losses, reduction)
