"""A MoCo key queue that stays identical on every rank."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .gather import DistributedArg, all_gather_no_grad, resolve_group

__all__ = ["KeyQueue"]


class KeyQueue(nn.Module):
    """First-in-first-out bank of the last ``size`` keys (MoCo's negatives), shared by all ranks.

    :meth:`enqueue` gathers the keys of every rank without gradient (rank 0's first; batch
    sizes may differ) and writes the same rows in the same order on every rank, so the queues
    never drift apart and equal the queue of single-process training on the concatenated
    batches. Keys are stored detached; the queue is a buffer, so it is saved in
    ``state_dict()`` and restored on resume. Neither :meth:`enqueue` nor :meth:`negatives`
    waits for the device (the write position stays a device tensor).

    Args:
        size: capacity ``K`` (rows).
        dim: key width ``d``.
        distributed: ``False``, ``True`` (default process group) or a ``ProcessGroup``;
            resolved at every :meth:`enqueue`, so the queue can be built before
            ``init_process_group``.
        dtype: storage dtype of the keys.
        start_full: start with ``K`` random unit keys (drawn from torch's global generator)
            instead of empty, as MoCo does (He et al. 2020): every step then has ``K``
            negatives, random ones until the first ``K`` keys have arrived.

    Example:
        >>> queue = KeyQueue(4, 2)
        >>> queue.enqueue(torch.ones(3, 2)); queue.enqueue(2 * torch.ones(2, 2))
        >>> queue.negatives().tolist()  # the 4 most recent keys, oldest first
        [[1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    """

    def __init__(self, size: int, dim: int, *, distributed: DistributedArg = False,
                 dtype: torch.dtype = torch.float32, start_full: bool = False) -> None:
        super().__init__()
        for value, name in ((size, "size"), (dim, "dim")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(start_full, bool):
            raise TypeError(f"start_full must be a bool, got {type(start_full).__name__}")
        self.distributed = distributed
        if start_full:
            keys = F.normalize(torch.randn(size, dim, dtype=dtype), dim=1)
        else:
            keys = torch.zeros(size, dim, dtype=dtype)
        self.register_buffer("keys", keys)
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))  # next row to write
        self.register_buffer("filled", torch.full((), size if start_full else 0, dtype=torch.long))  # rows holding keys
        # A host copy of ``filled`` (known from the key counts), so that reading the queue needs
        # no device sync; refreshed when a state is loaded.
        self._filled = size if start_full else 0
        self.register_load_state_dict_post_hook(_refresh_filled)

    @property
    def size(self) -> int:
        return self.keys.shape[0]

    def negatives(self, *, oldest_first: bool = True) -> Tensor:
        """The stored keys ``(min(filled, K), d)`` (a copy, no gradient), oldest first, or with
        ``oldest_first=False`` in storage order (a loss over the set of negatives does not
        depend on their order; this skips the rotation)."""
        if self._filled < self.size:
            return self.keys[:self._filled].clone()  # never wrapped: storage order is oldest first
        if not oldest_first:
            return self.keys.clone()
        return self.keys[self._rows(self.size)]

    def _rows(self, count: int) -> Tensor:
        """Rows ``pointer, pointer + 1, ...`` (wrapping), computed on the device."""
        return (self.pointer + torch.arange(count, device=self.keys.device)) % self.size

    @torch.no_grad()
    def enqueue(self, keys: Tensor, group: Optional[DistributedArg] = None) -> None:
        """Append this step's keys of every rank (``(n_r, d)`` here), dropping the oldest;
        ``group`` overrides the queue's ``distributed`` for this call."""
        if not isinstance(keys, Tensor) or keys.dim() != 2 or keys.shape[1] != self.keys.shape[1]:
            shape = tuple(keys.shape) if isinstance(keys, Tensor) else type(keys).__name__
            raise ValueError(f"keys must have shape (n, {self.keys.shape[1]}), got {shape}")
        process_group = resolve_group(self.distributed if group is None else group)
        keys = keys.detach().to(self.keys.dtype)
        if process_group is not None:
            keys = all_gather_no_grad(keys, process_group)
        keys = keys[-self.size:]  # more new keys than room: only the newest survive
        count = keys.shape[0]
        self.keys[self._rows(count)] = keys
        self.pointer.copy_((self.pointer + count) % self.size)
        self._filled = min(self.size, self._filled + count)
        self.filled.fill_(self._filled)


def _refresh_filled(queue: Any, incompatible_keys: Any) -> None:
    queue._filled = int(queue.filled)
