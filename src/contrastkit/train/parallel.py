"""Data-parallel pretraining under ``torchrun``: process group, sharded batches, rank-0 output.

``torchrun --nproc-per-node K -m contrastkit pretrain ...`` starts K processes with
``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set; :func:`setup` joins them into a process group
(gloo on CPU, NCCL on CUDA). Every rank trains on its shard of each global batch (a
``DistributedSampler`` over the training images), the loss sees the negatives of every rank
(``distributed=True`` on the losses, local mode) and DDP averages the gradients, so one step
is one step on the global batch of ``--batch-size`` images. Only rank 0 writes files, shows
progress and evaluates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Parallel", "setup", "LossForward"]


@dataclass
class Parallel:
    """This process's place in the data-parallel job (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1
    owns_group: bool = False

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

    def reduce(self, value: torch.Tensor, op: str) -> torch.Tensor:
        """Combine a tensor over ranks by ``op`` (``"sum"``, ``"min"`` or ``"max"``; a copy,
        the same on every rank)."""
        value = value.detach().clone()
        if self.active:
            dist.all_reduce(value, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                                       "max": dist.ReduceOp.MAX}[op])
        return value

    def gather_objects(self, obj: Any) -> List[Any]:
        if not self.active:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def run_on_main(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` on rank 0; if it raises, every rank raises the same kind of error
        (the others would otherwise wait in the next collective)."""
        if not self.active:
            return action()
        error: Optional[BaseException] = None
        result = None
        if self.is_main:
            try:
                result = action()
            except (ValueError, TypeError, FileNotFoundError, FileExistsError, PermissionError) as err:
                error = err
        shared = [None if error is None else (type(error).__name__, str(error))]
        dist.broadcast_object_list(shared, src=0)
        if shared[0] is not None:
            if error is not None:
                raise error
            kind = {"TypeError": TypeError, "FileNotFoundError": FileNotFoundError,
                    "FileExistsError": FileExistsError, "PermissionError": PermissionError}.get(shared[0][0], ValueError)
            raise kind(shared[0][1])
        return result

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
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Parallel(dist.get_rank(), dist.get_world_size(), owns_group=True)


class LossForward(nn.Module):
    """``forward(batch, labels) = method.loss(model, batch, labels)``, so that DDP (which hooks
    ``forward``) wraps the training step; its state is the model's."""

    def __init__(self, model: nn.Module, method: Any) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, batch: Any, labels: Optional[torch.Tensor]) -> torch.Tensor:
        return self.method.loss(self.model, batch, labels)
