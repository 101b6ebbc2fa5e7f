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

from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ._tiles import merge_, no_autocast, refuse_double_backward, row_stats, tile_buffers, tile_ranges, tile_view

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


def _mask_excluded_(tile: Tensor, exclude: Optional[Tensor], i0: int, i1: int, j0: int, j1: int) -> None:
    """Set the excluded entries (own block only) of a tile to -inf."""
    if exclude is None:
        return
    columns = exclude[i0:i1]
    inside = (columns >= j0) & (columns < j1)
    if bool(inside.any()):
        rows = torch.arange(i1 - i0, device=tile.device)[:, None].expand_as(columns)
        tile[rows[inside], columns[inside] - j0] = float("-inf")


def _prefetch(block: Tensor, sizes: Sequence[int], step: int, group) -> Tuple[Optional[Tensor], List]:
    """Start passing ``block`` on and receiving the next one (none after the last step)."""
    rank, world = dist.get_rank(group), len(sizes)
    if step == world - 1:
        return None, []
    incoming = block.new_empty((sizes[(rank - step - 1) % world], block.shape[1]))
    return incoming, _start_shift([block], [incoming], group)


def _tiles(anchors: Tensor, block: Tensor, exclude: Optional[Tensor], chunk: int,
           tile_buf: Tensor) -> Iterator[Tuple[int, int, int, int, Tensor]]:
    """Every tile ``anchors[i0:i1] @ block[j0:j1].T`` (excluded entries -inf), in one buffer."""
    for i0, i1 in tile_ranges(anchors.shape[0], chunk):
        for j0, j1 in tile_ranges(block.shape[0], chunk):
            tile = torch.mm(anchors[i0:i1], block[j0:j1].T, out=tile_view(tile_buf, i1 - i0, j1 - j0))
            _mask_excluded_(tile, exclude, i0, i1, j0, j1)
            yield i0, i1, j0, j1, tile


class _RingLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchors: Tensor, candidates: Tensor, exclude: Optional[Tensor],  # type: ignore[override]
                sizes: Tuple[int, ...], group, chunk: int) -> Tensor:
        world = len(sizes)
        n = anchors.shape[0]
        m = anchors.new_full((n,), float("-inf"))
        s = anchors.new_zeros(n)
        side = max(min(chunk, n), min(chunk, max(sizes)))
        tile_buf, work_buf = tile_buffers(anchors, side)
        block = candidates.detach()
        with torch.no_grad(), no_autocast(anchors):
            for step in range(world):
                incoming, requests = _prefetch(block, sizes, step, group)
                for i0, i1, j0, j1, tile in _tiles(anchors, block, exclude if step == 0 else None, chunk, tile_buf):
                    merge_(m[i0:i1], s[i0:i1], *row_stats(tile, tile_view(work_buf, i1 - i0, j1 - j0)))
                _wait(requests)
                if incoming is not None:
                    block = incoming
            lse = m + s.log()
        ctx.sizes, ctx.group, ctx.chunk = sizes, group, chunk
        ctx.save_for_backward(anchors, candidates, lse, exclude)
        return lse

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        refuse_double_backward()
        anchors, candidates, lse, exclude = ctx.saved_tensors
        sizes, group, chunk = ctx.sizes, ctx.group, ctx.chunk
        rank, world = dist.get_rank(group), len(sizes)
        n = anchors.shape[0]
        grad = grad.to(anchors.dtype)
        d_anchors = torch.zeros_like(anchors)
        block, d_block = candidates.detach(), torch.zeros_like(candidates)
        side = max(min(chunk, n), min(chunk, max(sizes)))
        tile_buf, _ = tile_buffers(anchors, side)
        with torch.no_grad(), no_autocast(anchors):
            for step in range(world):
                # The block must be fully used before it moves on with its gradient, so the
                # candidates (not yet their gradient) are prefetched while computing.
                incoming, requests = _prefetch(block, sizes, step, group)
                for i0, i1, j0, j1, tile in _tiles(anchors, block, exclude if step == 0 else None, chunk, tile_buf):
                    weights = tile.sub_(lse[i0:i1, None]).exp_().mul_(grad[i0:i1, None])
                    d_anchors[i0:i1].addmm_(weights, block[j0:j1])
                    d_block[j0:j1].addmm_(weights.T, anchors[i0:i1])
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
        return d_anchors, d_block, None, None, None, None


def ring_logsumexp(
    anchors: Tensor,
    candidates: Tensor,
    group,
    sizes: Sequence[int],
    chunk_size: int,
    exclude_own: Optional[Tensor] = None,
) -> Tensor:
    """``lse_i = log sum_j exp(a_i . c_j)`` over the candidates of *every* rank, in tiles.

    Args:
        anchors: ``(n, d)`` this rank's anchors (temperature already folded in).
        candidates: ``(sizes[rank], d)`` this rank's candidates; may be ``anchors`` itself.
        group: the process group (ranks form a ring in group order).
        sizes: number of candidate rows on each rank of the group.
        chunk_size: tile edge.
        exclude_own: optional ``(n, k)`` long tensor: column indices into this rank's *own*
            candidates left out of anchor ``i``'s sum (itself, or its positive).

    Returns ``(n,)``; the backward pass sends each rank's candidate gradient home (see the
    module docstring). Memory ``O((n + max(sizes)) d + chunk_size^2)``.
    """
    return _RingLogSumExp.apply(anchors, candidates, exclude_own, tuple(int(s) for s in sizes), group,
                                int(chunk_size))
