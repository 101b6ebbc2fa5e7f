"""Shuffling a batch across ranks and back: MoCo's shuffle-BN (He et al. 2020).

A BatchNorm layer normalises each rank's rows with that rank's batch statistics. In MoCo the
query and its positive key come from the same images; if the key encoder saw the same rows as
the query encoder on the same rank, the batch statistics would carry information shared by a
query and its key, and the model can lower the loss through them instead of through the
representation. MoCo therefore shuffles the key encoder's batch across ranks before its
forward pass and restores the order afterwards: :func:`shuffle_across_ranks` returns this
rank's part of a permutation of the global batch, and :meth:`RankShuffle.unshuffle` gives
each rank the outputs of its own rows back, in their order. Both run without gradient (MoCo's
keys carry none). Under one process the shuffle is the identity and nothing is drawn.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .gather import DistributedArg, RowLayout, _comm_device, all_gather_no_grad, exchange_layout, resolve_group

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover - depends on the torch build
    dist = None  # type: ignore[assignment]

__all__ = ["RankShuffle", "shuffle_across_ranks"]


class RankShuffle:
    """The permutation one :func:`shuffle_across_ranks` call applied (identical on every rank).

    Attributes:
        permutation: ``(N,)`` long tensor over the global batch (rank 0's rows first), or
            ``None`` when not distributed: row ``j`` of the shuffled global batch is row
            ``permutation[j]`` of the original one; rank ``r`` holds the shuffled rows
            ``[offset(r), offset(r) + n_r)``.
    """

    def __init__(self, permutation: Optional[Tensor], layout: Optional[RowLayout], group) -> None:
        self.permutation = permutation
        self.layout = layout
        self.group = group

    @torch.no_grad()
    def unshuffle(self, y: Tensor) -> Tensor:
        """``y`` ``(n_r, ...)``: the outputs of this rank's shuffled rows -> the outputs of its
        own original rows, in their order (``y`` itself when not distributed)."""
        if self.permutation is None:
            return y
        gathered = all_gather_no_grad(y, self.group, layout=self.layout)
        inverse = torch.argsort(self.permutation.to(y.device))
        return gathered[inverse[self.layout.offset:self.layout.offset + self.layout.local]]


@torch.no_grad()
def shuffle_across_ranks(x: Tensor, distributed: DistributedArg = True, *,
                         generator: Optional[torch.Generator] = None) -> Tuple[Tensor, RankShuffle]:
    """This rank's part of a random permutation of the global batch, without gradient.

    Args:
        x: ``(n_r, ...)`` this rank's rows (row counts may differ between ranks; rank ``r``
            receives ``n_r`` rows of the shuffled batch).
        distributed: ``True`` (default process group), a ``ProcessGroup``, or ``False``
            (the identity: ``x`` is returned as it is and nothing is drawn).
        generator: where rank 0 draws the permutation (default: torch's global generator,
            so a seeded run draws the same permutations, and a run whose RNG state is
            checkpointed resumes them exactly); rank 0's draw is broadcast to every rank.

    Returns ``(shuffled rows (n_r, ...), RankShuffle)``; pass the outputs computed from the
    shuffled rows to :meth:`RankShuffle.unshuffle`.
    """
    group = resolve_group(distributed)
    if group is None:
        return x, RankShuffle(None, None, None)
    layout = exchange_layout(x.shape[0], x.shape[1:], x.dtype, group)
    gathered = all_gather_no_grad(x, group, layout=layout)
    if dist.get_rank(group) == 0:
        permutation = torch.randperm(layout.total, generator=generator)
    else:
        permutation = torch.empty(layout.total, dtype=torch.long)
    permutation = permutation.to(_comm_device(group))
    dist.broadcast(permutation, src=dist.get_global_rank(group, 0), group=group)
    mine = permutation[layout.offset:layout.offset + layout.local].to(x.device)
    return gathered[mine], RankShuffle(permutation, layout, group)
