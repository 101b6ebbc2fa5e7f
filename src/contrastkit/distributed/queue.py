"""A MoCo key queue that stays identical on every rank."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .gather import DistributedArg, all_gather_no_grad, resolve_group

__all__ = ["KeyQueue"]


class KeyQueue(nn.Module):
    """First-in-first-out bank of the last ``size`` keys (MoCo's negatives), shared by all ranks.

    :meth:`enqueue` gathers the keys of every rank without gradient (rank 0's first; batch
    sizes may differ) and writes the same rows in the same order on every rank, so the queues
    never drift apart and equal the queue of single-process training on the concatenated
    batches. Keys are stored detached; the queue is a buffer, so it is saved in
    ``state_dict()`` and restored on resume.

    Args:
        size: capacity ``K`` (rows).
        dim: key width ``d``.
        distributed: ``False``, ``True`` (default process group) or a ``ProcessGroup``;
            resolved at every :meth:`enqueue`, so the queue can be built before
            ``init_process_group``.
        dtype: storage dtype of the keys.

    Example:
        >>> queue = KeyQueue(4, 2)
        >>> queue.enqueue(torch.ones(3, 2)); queue.enqueue(2 * torch.ones(2, 2))
        >>> queue.negatives().tolist()  # the 4 most recent keys, oldest first
        [[1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    """

    def __init__(self, size: int, dim: int, *, distributed: DistributedArg = False,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        for value, name in ((size, "size"), (dim, "dim")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.distributed = distributed
        self.register_buffer("keys", torch.zeros(size, dim, dtype=dtype))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))  # next row to write
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))   # rows holding keys

    @property
    def size(self) -> int:
        return self.keys.shape[0]

    def negatives(self) -> Tensor:
        """The stored keys ``(min(filled, K), d)``, oldest first (a copy, no gradient)."""
        filled, pointer = int(self.filled), int(self.pointer)
        if filled < self.size:
            return self.keys[:filled].clone()
        return torch.cat([self.keys[pointer:], self.keys[:pointer]])

    @torch.no_grad()
    def enqueue(self, keys: Tensor, group: Optional[DistributedArg] = None) -> None:
        """Append this step's keys of every rank (``(n_r, d)`` here), dropping the oldest."""
        if not isinstance(keys, Tensor) or keys.dim() != 2 or keys.shape[1] != self.keys.shape[1]:
            shape = tuple(keys.shape) if isinstance(keys, Tensor) else type(keys).__name__
            raise ValueError(f"keys must have shape (n, {self.keys.shape[1]}), got {shape}")
        process_group = resolve_group(self.distributed if group is None else group)
        keys = keys.detach().to(self.keys.dtype)
        if process_group is not None:
            keys = all_gather_no_grad(keys, process_group)
        keys = keys[-self.size:]  # more new keys than room: only the newest survive
        count, pointer = keys.shape[0], int(self.pointer)
        first = min(count, self.size - pointer)
        self.keys[pointer:pointer + first] = keys[:first]
        self.keys[: count - first] = keys[first:]
        self.pointer.fill_((pointer + count) % self.size)
        self.filled.fill_(min(self.size, int(self.filled) + count))
