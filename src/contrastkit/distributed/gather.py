"""Collectives for contrastive losses: gathers with and without gradient, and the row layout.

The gradient-carrying gather is the only subtle part; its backward is derived in
``docs/distributed.md``. In short, DDP optimises ``F = (1/W) sum_r L_r`` (it averages the
per-rank gradients), so rank ``s`` must back-propagate ``W * dF/dz_s = sum_r dL_r/dz_s``:

* ``objective="per_rank"`` (each rank computes a different loss ``L_r``, e.g. only its own
  anchors): the incoming gradients differ between ranks, so they are summed across ranks and
  each rank keeps its own block -- a reduce-scatter (the same result as all-reduce then slice,
  with half the bytes).
* ``objective="replicated"`` (every rank computes the *same* loss from the gathered tensor):
  the incoming gradients are identical, so their sum is ``W`` times this rank's block and no
  communication is needed in the backward pass.

Every function works on a process group that is not the default one, and on batches whose row
counts differ between ranks (blocks are padded to the largest one for the collective and the
padding is removed again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

try:  # torch builds without distributed support still import contrastkit
    import torch.distributed as dist

    _AVAILABLE = dist.is_available()
except ImportError:  # pragma: no cover - depends on the torch build
    dist = None  # type: ignore[assignment]
    _AVAILABLE = False

__all__ = [
    "DistributedArg",
    "RowLayout",
    "resolve_group",
    "rank_seed",
    "RANK_SEED_STRIDE",
    "is_active",
    "get_rank",
    "get_world_size",
    "exchange_layout",
    "all_gather_with_grad",
    "all_gather_no_grad",
]

# False / None: off; True: the default (WORLD) group; or an explicit ProcessGroup.
DistributedArg = Union[bool, None, "dist.ProcessGroup"]

_OBJECTIVES = ("per_rank", "replicated")
# Only these dtypes can travel; the code is part of the layout exchange so that ranks which
# disagree get a clear error instead of a hang or garbage.
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)


def is_active() -> bool:
    """``True`` when torch.distributed is available and a default process group exists."""
    return _AVAILABLE and dist.is_initialized()


def resolve_group(distributed: DistributedArg, name: str = "distributed") -> Optional["dist.ProcessGroup"]:
    """Turn a ``distributed=`` argument into a process group, or ``None`` when it is off.

    ``True`` means the default group; a ``ProcessGroup`` is used as given. Raises
    ``ValueError`` when no process group is initialised or this process is not a member of
    the given group, and ``TypeError`` for anything else.
    """
    if distributed is None or distributed is False:
        return None
    if distributed is True:
        if not is_active():
            raise ValueError(
                f"{name}=True needs an initialised torch.distributed process group; call "
                "torch.distributed.init_process_group(...) first (torchrun sets up the environment "
                f"for it), or pass {name}=False"
            )
        return dist.group.WORLD
    if _AVAILABLE and isinstance(distributed, dist.ProcessGroup):
        if not is_active():
            raise ValueError(f"{name} is a ProcessGroup but torch.distributed is not initialised")
        if dist.get_rank(distributed) < 0:
            raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of the "
                             f"process group passed as {name}")
        return distributed
    raise TypeError(f"{name} must be False, True or a torch.distributed.ProcessGroup, "
                    f"got {type(distributed).__name__}")


#: Added, times the rank, to the seed each rank's random stream starts from, so that the ranks of
#: one run draw different views (``contrastkit pretrain`` and the Lightning module alike).
RANK_SEED_STRIDE = 1_000_003


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s own random stream in a run seeded with ``seed``."""
    return int(seed) + RANK_SEED_STRIDE * int(rank)


def get_rank(group: Optional["dist.ProcessGroup"] = None) -> int:
    """Rank of this process in ``group`` (the default group if ``None``); 0 when not distributed."""
    return dist.get_rank(group) if is_active() else 0


def get_world_size(group: Optional["dist.ProcessGroup"] = None) -> int:
    """Number of processes in ``group`` (the default group if ``None``); 1 when not distributed."""
    return dist.get_world_size(group) if is_active() else 1


@dataclass(frozen=True)
class RowLayout:
    """Where each rank's rows sit in the concatenated (global) batch.

    ``sizes[r]`` is the number of rows rank ``r`` contributes; rank ``r``'s rows occupy
    ``[offset(r), offset(r) + sizes[r])`` of the gathered tensor, ranks in order.
    """

    sizes: Tuple[int, ...]
    rank: int

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def local(self) -> int:
        return self.sizes[self.rank]

    @property
    def offset(self) -> int:
        return sum(self.sizes[: self.rank])

    @property
    def largest(self) -> int:
        return max(self.sizes)

    def local_rows(self, device: Optional[torch.device] = None) -> Tensor:
        """Indices of this rank's rows in the gathered tensor, ``(local,)``."""
        return torch.arange(self.offset, self.offset + self.local, device=device)


def exchange_layout(
    rows: int,
    trailing_shape: Sequence[int],
    dtype: torch.dtype,
    group: Optional["dist.ProcessGroup"],
    *,
    error: Optional[BaseException] = None,
) -> RowLayout:
    """Share every rank's row count (one small all-gather) and check that the ranks agree.

    If this rank's own input checks failed, pass the exception as ``error``: every rank then
    raises (the message of each failing rank is shared), instead of the healthy ranks waiting
    forever in the next collective.
    """
    if len(trailing_shape) > 6:
        raise ValueError(f"at most 6 trailing dimensions can be gathered, got shape (rows, *{tuple(trailing_shape)})")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    code = _DTYPES.index(dtype) if dtype in _DTYPES else -1
    shape = list(trailing_shape) + [-1] * (6 - len(trailing_shape))
    info = torch.tensor([1 if error is not None else 0, rows, code, len(trailing_shape), *shape],
                        dtype=torch.int64, device=_comm_device(group))
    gathered = [torch.empty_like(info) for _ in range(world)]
    dist.all_gather(gathered, info, group=group)
    table = torch.stack(gathered).cpu().tolist()
    failed = [r for r, row in enumerate(table) if row[0]]
    if failed:
        messages: List[Optional[str]] = [None] * world
        dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}",
                               group=group)
        if error is not None:
            raise error
        details = "; ".join(f"rank {r}: {messages[r]}" for r in failed)
        raise ValueError(f"the inputs of another rank failed validation ({details})")
    if code < 0:
        raise TypeError(f"tensors of dtype {dtype} cannot be gathered")
    for r, row in enumerate(table):
        if row[2:] != table[rank][2:]:
            theirs = (_DTYPES[row[2]], tuple(row[4:4 + row[3]]))
            mine = (dtype, tuple(trailing_shape))
            raise ValueError(
                f"ranks disagree on the gathered tensor: rank {r} has dtype/trailing shape {theirs}, "
                f"rank {rank} has {mine}; every rank must pass embeddings of the same width and dtype"
            )
    return RowLayout(sizes=tuple(row[1] for row in table), rank=rank)


def _comm_device(group) -> torch.device:
    """Device for small bookkeeping tensors: NCCL only moves CUDA tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    padding = x.new_zeros((rows - x.shape[0], *x.shape[1:]))
    return torch.cat([x, padding]).contiguous()


def _gather_blocks(x: Tensor, layout: RowLayout, group) -> Tensor:
    blocks = [torch.empty((layout.largest, *x.shape[1:]), dtype=x.dtype, device=x.device)
              for _ in range(layout.world_size)]
    dist.all_gather(blocks, _pad_rows(x, layout.largest), group=group)
    return torch.cat([block[:size] for block, size in zip(blocks, layout.sizes)])


class _AllGatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, layout: RowLayout, group, objective: str) -> Tensor:  # type: ignore[override]
        ctx.layout, ctx.group, ctx.objective = layout, group, objective
        return _gather_blocks(x, layout, group)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        layout: RowLayout = ctx.layout
        own = slice(layout.offset, layout.offset + layout.local)
        if ctx.objective == "replicated":
            # Every rank holds the same gradient; summing W copies is multiplying by W.
            return grad[own] * layout.world_size, None, None, None
        grad = grad.contiguous()
        pieces, start = [], 0
        for size in layout.sizes:
            pieces.append(_pad_rows(grad[start:start + size], layout.largest))
            start += size
        summed = torch.empty_like(pieces[0])
        dist.reduce_scatter(summed, pieces, op=dist.ReduceOp.SUM, group=ctx.group)
        return summed[: layout.local], None, None, None


def all_gather_with_grad(
    x: Tensor,
    group: Optional["dist.ProcessGroup"] = None,
    *,
    objective: str = "per_rank",
    layout: Optional[RowLayout] = None,
) -> Tensor:
    """Concatenate ``x`` (``(n_r, ...)`` on rank ``r``) from every rank, keeping the gradient.

    Returns ``(sum_r n_r, ...)``, rank 0's rows first. The backward pass is right for DDP's
    gradient averaging: with ``objective="per_rank"`` the gradients of all ranks are summed and
    each rank keeps the block of its own rows (a reduce-scatter); with
    ``objective="replicated"`` -- only valid when every rank computes exactly the same function
    of the gathered tensor -- this rank's block is multiplied by the world size without any
    communication. See ``docs/distributed.md`` for the derivation.

    ``layout`` (from :func:`exchange_layout`) saves the size exchange when already known.
    """
    if objective not in _OBJECTIVES:
        raise ValueError(f"objective must be one of {_OBJECTIVES}, got {objective!r}")
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    group = dist.group.WORLD if group is None else group
    if layout is None:
        layout = exchange_layout(x.shape[0], x.shape[1:], x.dtype, group)
    return _AllGatherWithGrad.apply(x, layout, group, objective)


def all_gather_no_grad(
    x: Tensor,
    group: Optional["dist.ProcessGroup"] = None,
    *,
    layout: Optional[RowLayout] = None,
) -> Tensor:
    """Concatenate ``x`` from every rank without a gradient (labels, MoCo keys).

    Returns a detached ``(sum_r n_r, ...)`` tensor, rank 0's rows first; row counts may differ
    between ranks.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    group = dist.group.WORLD if group is None else group
    if layout is None:
        layout = exchange_layout(x.shape[0], x.shape[1:], x.dtype, group)
    with torch.no_grad():
        return _gather_blocks(x.detach(), layout, group)
