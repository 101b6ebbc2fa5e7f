"""Ring-exchanged, tiled log-sum-exp: global negatives without gathering them.

Rank ``r`` keeps its own anchors ``A_r`` and passes blocks of candidates around the ring of
ranks: at step ``s`` it holds the candidates of rank ``(r - s) mod W`` and merges the tiles of
``A_r C^T`` into a running per-row log-sum-exp (the online merge of
:mod:`contrastkit.losses._tiles`, shared with the tiled kernels). Only one block is in use
and one in flight, so the memory per rank is ``O((N / W) d + chunk^2)``: no rank ever holds
the global batch or the global similarity matrix.

The backward pass runs the ring again: each block travels together with the gradient of its
rows, every rank adds ``P^T A_r`` (``P = g * exp(A_r C^T - lse)``), and a last hop brings the
accumulated gradient home. That is exactly the sum over ranks of each rank's contribution,
i.e. the ``"per_rank"`` rule of :func:`contrastkit.distributed.all_gather_with_grad`, so after
DDP's averaging the gradients equal single-process training on the concatenated batch.

The next block is sent while the current one is being computed (``batch_isend_irecv``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ._tiles import (
    PositiveSplit,
    add_masked_row_grads_,
    backward_lse,
    merge_masked_rows_,
    no_autocast,
    refuse_double_backward,
    tile_buffers,
)

__all__ = ["ring_logsumexp"]


def _start_shift(send: Sequence[Tensor], recv: Sequence[Tensor], group) -> List:
    """Send tensors to the next rank of the ring and receive from the previous one."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nxt = dist.get_global_rank(group, (rank + 1) % world)
    prv = dist.get_global_rank(group, (rank - 1) % world)
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in send]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recv]
    return dist.batch_isend_irecv(ops)


def _wait(requests) -> None:
    for request in requests:
        request.wait()


def _prefetch(block: Sequence[Tensor], sizes: Sequence[int], step: int, group) -> Tuple[Optional[List[Tensor]], List]:
    """Start passing ``block`` (the candidates, and their labels if any) on and receiving the
    next one (none after the last step)."""
    rank, world = dist.get_rank(group), len(sizes)
    if step == world - 1:
        return None, []
    rows = sizes[(rank - step - 1) % world]
    incoming = [t.new_empty((rows, *t.shape[1:])) for t in block]
    return incoming, _start_shift(block, incoming, group)


def _labels(block: Sequence[Tensor]) -> Optional[Tensor]:
    return block[1] if len(block) > 1 else None


def _travelling(candidates: Tensor, labels: Optional[Tensor]) -> List[Tensor]:
    return [candidates.detach()] if labels is None else [candidates.detach(), labels]


class _RingLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchors: Tensor, candidates: Tensor, exclude: Optional[Tensor],  # type: ignore[override]
                sizes: Tuple[int, ...], group, chunk: int, anchor_labels: Optional[Tensor] = None,
                candidate_labels: Optional[Tensor] = None, positive: Optional[Tensor] = None):
        world = len(sizes)
        n = anchors.shape[0]
        m = anchors.new_full((n,), float("-inf"))
        s = anchors.new_zeros(n)
        side = max(min(chunk, n), min(chunk, max(sizes)))
        tile_buf, work_buf = tile_buffers(anchors, side)
        block = _travelling(candidates, candidate_labels)
        split = None if positive is None else PositiveSplit(positive, anchors, n, 0)
        with torch.no_grad(), no_autocast(anchors):
            for step in range(world):
                incoming, requests = _prefetch(block, sizes, step, group)
                merge_masked_rows_(m, s, anchors, block[0], exclude if step == 0 else None, anchor_labels,
                                   _labels(block), chunk, tile_buf, work_buf, split, positives_here=step == 0)
                _wait(requests)
                if incoming is not None:
                    block = incoming
            lse = m + s.log()
            without = anchors.new_empty(0) if split is None else split.lse()[0]
        ctx.sizes, ctx.group, ctx.chunk = sizes, group, chunk
        ctx.save_for_backward(anchors, candidates, lse, exclude, anchor_labels, candidate_labels)
        ctx.mark_non_differentiable(without)
        return lse, without

    @staticmethod
    def backward(ctx, grad: Tensor, _without: Optional[Tensor] = None):  # type: ignore[override]
        refuse_double_backward()
        anchors, candidates, lse, exclude, anchor_labels, candidate_labels = ctx.saved_tensors
        sizes, group, chunk = ctx.sizes, ctx.group, ctx.chunk
        rank, world = dist.get_rank(group), len(sizes)
        n = anchors.shape[0]
        grad = grad.to(anchors.dtype)
        lse = backward_lse(lse)
        d_anchors = torch.zeros_like(anchors)
        block, d_block = _travelling(candidates, candidate_labels), torch.zeros_like(candidates)
        side = max(min(chunk, n), min(chunk, max(sizes)))
        tile_buf, _ = tile_buffers(anchors, side)
        with torch.no_grad(), no_autocast(anchors):
            for step in range(world):
                # The block must be fully used before it moves on with its gradient, so the
                # candidates (not yet their gradient) are prefetched while computing.
                incoming, requests = _prefetch(block, sizes, step, group)
                add_masked_row_grads_(d_anchors, d_block, anchors, block[0], grad, lse,
                                      exclude if step == 0 else None, anchor_labels, _labels(block), chunk, tile_buf)
                _wait(requests)
                if world == 1:
                    break
                # Hand the finished gradient to the next rank, which now holds its block.
                incoming_grad = d_block.new_empty((sizes[(rank - step - 1) % world], d_block.shape[1]))
                _wait(_start_shift([d_block], [incoming_grad], group))
                if incoming is not None:
                    block = incoming
                d_block = incoming_grad
        # After W hops the gradient of this rank's own candidates has come home.
        return d_anchors, d_block, None, None, None, None, None, None, None


def ring_logsumexp(
    anchors: Tensor,
    candidates: Tensor,
    group,
    sizes: Sequence[int],
    chunk_size: int,
    exclude_own: Optional[Tensor] = None,
    labels: Optional[Tuple[Tensor, Tensor]] = None,
    positive_own: Optional[Tensor] = None,
):
    """``lse_i = log sum_j exp(a_i . c_j)`` over the candidates of *every* rank, in tiles.

    Args:
        anchors: ``(n, d)`` this rank's anchors (temperature already folded in).
        candidates: ``(sizes[rank], d)`` this rank's candidates; may be ``anchors`` itself.
        group: the process group (ranks form a ring in group order).
        sizes: number of candidate rows on each rank of the group.
        chunk_size: tile edge.
        exclude_own: optional ``(n, k)`` long tensor: column indices into this rank's *own*
            candidates left out of anchor ``i``'s sum (itself, or its positive).
        labels: optional ``(anchor_labels (n,), candidate_labels (sizes[rank],))``: only the
            candidates of the anchor's class enter its sum (SupCon L_in's positives); the
            labels travel with their block. An anchor left with no candidate gets ``-inf``
            (and a zero gradient).

        positive_own: optional ``(n,)``: each anchor's positive, a column of this rank's own
            candidates; then returns ``(lse, lse_without)``, the second the same sums without
            the positive (a value, no gradient: :class:`contrastkit.losses._tiles.PositiveSplit`).

    Returns ``(n,)``; the backward pass sends each rank's candidate gradient home (see the
    module docstring). Memory ``O((n + max(sizes)) d + chunk_size^2)``.
    """
    anchor_labels, candidate_labels = (None, None) if labels is None else labels
    lse, without = _RingLogSumExp.apply(anchors, candidates, exclude_own, tuple(int(s) for s in sizes), group,
                                        int(chunk_size), anchor_labels, candidate_labels, positive_own)
    return lse if positive_own is None else (lse, without)
