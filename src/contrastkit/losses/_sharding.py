"""The ``distributed=`` option of the losses with in-batch negatives.

A :class:`Shard` gathers a loss's embeddings from every rank (with the exact gradient of
:func:`contrastkit.distributed.all_gather_with_grad`), says which rows of the gathered batch
are this rank's anchors, and reduces the per-anchor losses so that DDP's gradient averaging
reproduces single-process training on the concatenated batch:

* ``"global"`` mode: every rank computes the loss of all anchors (the same number on every
  rank) and the gather uses the ``"replicated"`` backward.
* ``"local"`` mode: a rank computes only its own anchors against all gathered candidates and
  returns its share scaled so that the mean over ranks is the global loss: for
  ``reduction="mean"`` that is ``W * sum(own losses) / (number of anchors in the global
  batch)`` -- with equal batch sizes simply the mean over its own anchors -- and for
  ``"sum"`` ``W * sum(own losses)``; ``"none"`` gives the own anchors' losses.

When distributed is off, every method is the identity and the loss runs exactly as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from contrastkit.distributed.gather import (
    DistributedArg,
    RowLayout,
    all_gather_no_grad,
    all_gather_with_grad,
    exchange_layout,
    resolve_group,
)

from .core import reduce

_MODES = ("global", "local")


class Shard:
    """One loss call's view of the distributed batch (see the module docstring)."""

    def __init__(self, distributed: DistributedArg, mode: str) -> None:
        if mode not in _MODES:
            raise ValueError(f"distributed_mode must be one of {_MODES}, got {mode!r}")
        self.group = resolve_group(distributed)
        self.mode = mode
        self.layout: Optional[RowLayout] = None
        self._error: Optional[BaseException] = None

    @property
    def active(self) -> bool:
        return self.group is not None

    @property
    def local(self) -> bool:
        return self.active and self.mode == "local"

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Run input checks; when distributed, a failure is raised on every rank at the gather
        (a rank that raised alone would leave the others waiting in the collective)."""
        if not self.active:
            yield
            return
        try:
            yield
        except (ValueError, TypeError) as err:
            self._error = err

    def exchange(self, *tensors: Tensor) -> int:
        """Share row counts (and any input error) with the other ranks; returns the number of
        rows of the global batch (the local count when not distributed)."""
        if not self.active:
            return tensors[0].shape[0]
        if self.layout is not None:  # already exchanged for this call
            return self.layout.total
        if self._error is not None:
            exchange_layout(0, (), torch.float64, self.group, error=self._error)
        width = sum(t[0].numel() for t in tensors)
        self.layout = exchange_layout(tensors[0].shape[0], (width,), tensors[0].dtype, self.group)
        return self.layout.total

    def gather(self, *tensors: Tensor) -> Tuple[Tensor, ...]:
        """Concatenate each tensor (same row count, same dtype) over ranks, in one collective."""
        if not self.active:
            return tensors
        if self.layout is None:
            self.exchange(*tensors)
        flat = [t.reshape(t.shape[0], -1) for t in tensors]
        joined = flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)
        objective = "per_rank" if self.local else "replicated"
        gathered = all_gather_with_grad(joined, self.group, objective=objective, layout=self.layout)
        pieces = gathered.split([f.shape[1] for f in flat], dim=1)
        return tuple(p.reshape(self.layout.total, *t.shape[1:]) for p, t in zip(pieces, tensors))

    def gather_labels(self, labels: Tensor) -> Tensor:
        """Concatenate integer labels over ranks (no gradient); call after :meth:`gather`."""
        if not self.active:
            return labels
        return all_gather_no_grad(labels.to(torch.int64), self.group, layout=self.layout)

    def anchor_rows(self, *, blocks: int = 1, per_row: int = 1, device=None) -> Optional[Tensor]:
        """This rank's anchors in local mode, else ``None`` (every row is an anchor).

        The anchor matrix stacks ``blocks`` copies of the global batch (two views: 2), and each
        global row gives ``per_row`` consecutive anchors (SupCon's views per sample).
        """
        if not self.local:
            return None
        layout = self.layout
        own = torch.arange(layout.offset * per_row, (layout.offset + layout.local) * per_row, device=device)
        return torch.cat([own + b * layout.total * per_row for b in range(blocks)])

    def reduce(self, losses: Tensor, reduction: str, valid: Optional[Tensor] = None,
               anchors_total: Optional[int] = None) -> Tensor:
        """``core.reduce``, or in local mode this rank's share (``anchors_total``: number of
        anchors in the global batch that enter the mean)."""
        if not self.local:
            return reduce(losses, reduction, valid)
        if valid is not None:
            losses = torch.where(valid, losses, torch.zeros((), dtype=losses.dtype, device=losses.device))
        if reduction == "none":
            return losses
        world = self.layout.world_size
        if reduction == "sum":
            return losses.sum() * world
        if not anchors_total:
            raise ValueError("no anchor has a positive: the mean loss is undefined")
        return losses.sum() * (world / anchors_total)


def select(x: Tensor, rows: Optional[Tensor]) -> Tensor:
    """``x[rows]``, or ``x`` itself when every row is an anchor."""
    return x if rows is None else x[rows]
