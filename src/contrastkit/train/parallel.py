"""Data-parallel pretraining under ``torchrun``: process group, sharded batches, rank-0 output.

``torchrun --nproc-per-node K -m contrastkit pretrain ...`` starts K processes with
``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set; :func:`setup` joins them into a process group
(gloo on CPU, NCCL on CUDA; a group that torchrun restarted after a rank died keeps its keys
apart from the earlier start's). Every rank trains on its shard of each global batch (a
``DistributedSampler`` over the training images), the loss sees the negatives of every rank
(``distributed=True`` on the losses, local mode) and DDP averages the gradients, so one step
is one step on the global batch of ``--batch-size`` images. Only rank 0 writes files, shows
progress and evaluates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from contrastkit.methods.step import step_loss

__all__ = ["Parallel", "setup", "LossForward"]


@dataclass
class Parallel:
    """This process's place in the data-parallel job (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1
    owns_group: bool = False
    # A gloo group for the flags of :meth:`any` when the default group is NCCL (made on first use).
    cpu_group: Any = field(default=None, repr=False, compare=False)

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks (a copy; every rank gets the same number)."""
        value = value.detach().clone()
        if self.active:
            dist.all_reduce(value)
            value /= self.world_size
        return value

    def any(self, *flags: bool) -> Tuple[bool, ...]:
        """Whether each flag is set on at least one rank (the same answer on every rank). One
        all-reduce of a few numbers on the CPU; under NCCL over a gloo group of its own, so that
        asking does not wait for the GPU's queued work. Every rank must call it at the same point."""
        if not self.active:
            return tuple(bool(flag) for flag in flags)
        if self.cpu_group is None and dist.get_backend() != "gloo":
            self.cpu_group = dist.new_group(backend="gloo")
        values = torch.tensor([float(bool(flag)) for flag in flags])
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return tuple(bool(value) for value in values.tolist())

    def reduce(self, value: torch.Tensor, op: str) -> torch.Tensor:
        """Combine a tensor over ranks by ``op`` (``"sum"``, ``"min"`` or ``"max"``; a copy,
        the same on every rank)."""
        value = value.detach().clone()
        if self.active:
            dist.all_reduce(value, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                                       "max": dist.ReduceOp.MAX}[op])
        return value

    def broadcast_buffers(self, module: nn.Module) -> None:
        """Give every rank rank 0's buffers of ``module`` (BatchNorm's running statistics), as
        DistributedDataParallel does at the start of each forward: after a step, the other
        ranks hold the statistics of their own last batch until then."""
        if self.active:
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)

    def gather_objects(self, obj: Any) -> List[Any]:
        if not self.active:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def run_on_main(self, action: Callable[[], Any], share: bool = False) -> Any:
        """Run ``action`` on rank 0; if it raises, every rank raises the same kind of error
        (the others would otherwise wait in the next collective). Its result is rank 0's
        (``None`` on the others), or with ``share`` every rank's (pickled: keep it small)."""
        if not self.active:
            return action()
        error: Optional[BaseException] = None
        result = None
        if self.is_main:
            try:
                result = action()
            except (ValueError, TypeError, OSError) as err:  # OSError: a file in the way, a full disk...
                error = err
        shared = [None if error is None else (type(error).__name__, str(error)), result if share else None]
        dist.broadcast_object_list(shared, src=0)
        if shared[0] is not None:
            if error is not None:
                raise error
            kind = {"TypeError": TypeError, "FileNotFoundError": FileNotFoundError,
                    "FileExistsError": FileExistsError, "PermissionError": PermissionError}.get(shared[0][0], ValueError)
            raise kind(shared[0][1])
        return shared[1] if share else result

    def teardown(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def setup(device: torch.device) -> Parallel:
    """Join the ``torchrun`` job if there is one (``WORLD_SIZE > 1``), else a single process."""
    if dist.is_available() and dist.is_initialized():
        return Parallel(dist.get_rank(), dist.get_world_size(), owns_group=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return Parallel()
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if device.type == "cuda" else "gloo"
    # DDP's constructor imports torch._dynamo; imported while a group exists, it keeps that
    # group's backend (and its threads) alive past destroy_process_group, to be torn down at
    # the interpreter's shutdown, where it can abort a rank that finished its work. Imported
    # before the group exists, it holds nothing.
    import torch._dynamo  # noqa: F401
    start = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if start is None:
        dist.init_process_group(backend)
    else:
        # torchrun's agent keeps one store for every start of the group (--max-restarts): the
        # addresses an earlier start's ranks left there (dead processes) would be read as this
        # start's, so each start keeps its keys under its own prefix.
        store, rank, world = next(dist.rendezvous("env://"))
        dist.init_process_group(backend, store=dist.PrefixStore(f"contrastkit-start-{start}", store), rank=rank,
                                world_size=world)
    return Parallel(dist.get_rank(), dist.get_world_size(), owns_group=True)


class LossForward(nn.Module):
    """``forward(batch, labels, indices=, tap=)`` is the step's loss
    (:func:`contrastkit.methods.step.step_loss`), so that DDP (which hooks ``forward``) wraps
    the training step; its state is the model's."""

    def __init__(self, model: nn.Module, method: Any) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, batch: Any, labels: Optional[torch.Tensor], *, indices: Optional[torch.Tensor] = None,
                tap: Any = None) -> torch.Tensor:
        return step_loss(self.method, self.model, batch, labels, indices=indices, tap=tap)
