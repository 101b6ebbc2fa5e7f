"""Worker functions for tests/test_distributed_scaleout.py (imported by spawned processes):
the simple and hard-negative losses across ranks, data-parallel training of the ``simple``,
``hard_negative`` and ``convirt`` methods, and MoCo's shuffle-BN.

The harness (process group through a file, results saved per rank) and the tiny float64
data and encoder are those of :mod:`distributed_workers`.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import torch
import torch.distributed as dist

import distributed_workers as W
from contrastkit import losses as L

# name -> loss(z_a, z_b, tau, **distributed options)
LOSSES: Dict[str, Callable] = {
    "simple_loss": lambda a, b, t, **kw: L.simple_loss(a, b, negative_weight=0.7, **kw),
    "hard_negative[top_k]": lambda a, b, t, **kw: L.hard_negative_nt_xent(a, b, temperature=t, top_k=3, **kw),
    "hard_negative[quantile]": lambda a, b, t, **kw: L.hard_negative_nt_xent(a, b, temperature=t, quantile=0.75,
                                                                             **kw),
}
METHODS = ("simple", "hard_negative", "convirt")
TRAIN_SIZES, TRAIN_STEPS, TRAIN_LR = (3, 5), 3, 0.5
SHUFFLE_SIZES = (3, 5)
SHUFFLE_SEED, SHUFFLE_STEPS = 11, 3


def loss_and_grads(model: W.Encoder, name: str, data, reduction: str, **options):
    """The loss value (detached) and the gradient of every parameter that gets one."""
    model.zero_grad()
    z_a, z_b, tau = model(data[0], data[1])
    loss = LOSSES[name](z_a, z_b, tau, reduction=reduction, **options)
    if reduction == "none":
        return loss.detach(), {}
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def losses_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str]):
    data = W.batches(seed, sizes)[rank]
    model = W.Encoder()
    results = {}
    for name in LOSSES:
        for mode in W.MODES:
            for reduction in reductions:
                value, grads = loss_and_grads(model, name, data, reduction, distributed=True, distributed_mode=mode)
                results[(name, mode, reduction)] = (value, W._average(grads))
    return results


# --------------------------------------------------------------------------- methods


class PairModel(torch.nn.Module):
    """What the methods' hooks read from a model, on tiny float64 networks without batch
    statistics (so that data-parallel training can equal one process exactly): ``encoder``
    and ``head`` (two-view methods), ``image_embeddings``/``text_embeddings`` (convirt),
    ``temperature``, ``weight`` and ``distributed``."""

    def __init__(self, method: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(W.D_IN, 6), torch.nn.Tanh(),
                                           torch.nn.Linear(6, W.D_OUT)).double()
        self.head = torch.nn.Identity()
        if method == "convirt":  # DDP refuses parameters without gradient: only where used
            self.text = torch.nn.Sequential(torch.nn.Linear(W.D_IN, 6), torch.nn.Tanh(),
                                            torch.nn.Linear(6, W.D_OUT)).double()
        # The simple loss has no temperature: a learnable one would be a parameter without
        # gradient, which DDP refuses.
        self.temperature = L.Temperature(0.3, learnable=method != "simple").double()
        self.weight = 0.75
        self.distributed = False

    def image_embeddings(self, images):
        return self.encoder(images)

    def text_embeddings(self, ids, mask):
        return self.text(ids)


def method_batch(method: str, x_a, x_b):
    return (x_a, (x_b, None)) if method == "convirt" else (x_a, x_b)


def train_method(method: str, seed: int, sizes: Sequence[int], steps: int, lr: float, rank=None) -> dict:
    """SGD steps through ``Method.loss``: under DDP on this rank's part of each batch
    (``rank`` given), else on the concatenated batches in one process."""
    from torch.nn.parallel import DistributedDataParallel

    from contrastkit.methods import get_method
    from contrastkit.train.parallel import LossForward

    model = PairModel(method)
    step_loss = LossForward(model, get_method(method))
    if rank is not None:
        model.distributed = True
        step_loss = DistributedDataParallel(step_loss)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        parts = W.batches(seed + step, sizes)
        x_a, x_b, _ = parts[rank] if rank is not None else W.concatenated(parts)
        optimizer.zero_grad()
        step_loss(method_batch(method, x_a, x_b), None).backward()
        optimizer.step()
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def methods_worker(rank: int, world: int, seed: int):
    return {method: train_method(method, seed, TRAIN_SIZES, TRAIN_STEPS, TRAIN_LR, rank) for method in METHODS}


# --------------------------------------------------------------------------- shuffle-BN


def moco_model(key_network_eval: bool):
    from contrastkit.train import ContrastiveModel

    torch.manual_seed(0)
    model = ContrastiveModel("moco", "small", 1, temperature=0.2, queue_size=8, projection_dim=4,
                             momentum=1.0).double()  # momentum 1: the key network stays as it is
    model.train()
    if key_network_eval:
        model.key_encoder.eval()
        model.key_head.eval()
    return model


def moco_views(rank: int, sizes: Sequence[int], step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    n = sizes[rank]
    return (torch.rand(n, 1, 12, 12, generator=g, dtype=torch.float64),
            torch.rand(n, 1, 12, 12, generator=g, dtype=torch.float64))


def shuffle_worker(rank: int, world: int):
    """MoCo's keys with and without shuffle-BN, and the permutations drawn."""
    import contrastkit.methods.moco as methods_module
    from contrastkit.distributed import shuffle_across_ranks
    from contrastkit.methods import get_method

    moco = get_method("moco")
    results: Dict[str, object] = {}
    # The helper itself, rows of uneven counts tagged with their global index.
    offset = sum(SHUFFLE_SIZES[:rank])
    tagged = torch.arange(offset, offset + SHUFFLE_SIZES[rank], dtype=torch.float64)[:, None].repeat(1, 3)
    torch.manual_seed(SHUFFLE_SEED)
    shuffled, shuffle = shuffle_across_ranks(tagged)
    results["helper"] = {"shuffled": shuffled, "permutation": shuffle.permutation,
                         "unshuffled": shuffle.unshuffle(shuffled * 2), "tagged": tagged}

    permutations = []
    original = methods_module.shuffle_across_ranks

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        permutations.append(out[1].permutation.clone())
        return out

    methods_module.shuffle_across_ranks = recording
    try:
        for key_network_eval in (True, False):
            model = moco_model(key_network_eval)
            model.distributed = True
            view_a, view_b = moco_views(rank, SHUFFLE_SIZES, 0)
            _, shuffled_keys = moco.embed(model, (view_a, view_b))
            model.shuffle_bn = False
            _, plain_keys = moco.embed(model, (view_a, view_b))
            results[("keys", key_network_eval)] = (shuffled_keys, plain_keys)
        permutations.clear()
        model = moco_model(False)
        model.distributed = True
        for run in range(2):  # the same seed twice: the same permutations, one per step
            torch.manual_seed(SHUFFLE_SEED + rank)
            for step in range(SHUFFLE_STEPS):
                moco.loss(model, moco_views(rank, SHUFFLE_SIZES, step))
        results["permutations"] = list(permutations)
    finally:
        methods_module.shuffle_across_ranks = original
    dist.barrier()
    return results


def suite_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str]):
    """All checks of one spawned run, keyed by check name."""
    return {"losses": losses_worker(rank, world, seed, sizes, reductions),
            "methods": methods_worker(rank, world, seed),
            "shuffle": shuffle_worker(rank, world)}
