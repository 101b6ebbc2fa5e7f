"""torch.distributed support: gathers with exact gradients for global negatives.

Depends on torch alone and imports without an initialised process group. The losses in
:mod:`contrastkit.losses` use these through their ``distributed=`` option; the derivation of
the gradients and the communication model are in ``docs/distributed.md``.
"""

from .gather import (
    DistributedArg,
    RowLayout,
    all_gather_no_grad,
    all_gather_with_grad,
    exchange_layout,
    get_rank,
    get_world_size,
    is_active,
    resolve_group,
)
from .queue import KeyQueue

__all__ = [
    "DistributedArg",
    "KeyQueue",
    "RowLayout",
    "all_gather_no_grad",
    "all_gather_with_grad",
    "exchange_layout",
    "get_rank",
    "get_world_size",
    "is_active",
    "resolve_group",
]
