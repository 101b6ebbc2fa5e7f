"""torch.distributed support: gathers with exact gradients for global negatives.

Depends on torch alone and imports without an initialised process group. The losses in
:mod:`contrastkit.losses` use these through their ``distributed=`` option; the derivation of
the gradients and the communication model are in ``docs/distributed.md``. MoCo's shuffle-BN
across ranks is :func:`shuffle_across_ranks`.
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
    rank_seed,
    resolve_group,
)
from .queue import KeyQueue
from .shuffle import RankShuffle, shuffle_across_ranks

__all__ = [
    "DistributedArg",
    "KeyQueue",
    "RankShuffle",
    "RowLayout",
    "all_gather_no_grad",
    "all_gather_with_grad",
    "exchange_layout",
    "get_rank",
    "get_world_size",
    "is_active",
    "rank_seed",
    "resolve_group",
    "shuffle_across_ranks",
]
