"""Worker functions for the multi-process tests of cached-gradient accumulation.

They follow ``distributed_workers``: the same spawn harness; every rank takes its share of one
global float64 batch, accumulates its gradients in micro-batches with the method's loss taking
every rank's negatives, averages them over the ranks (what DDP would do) and saves them; the
test process compares with one process on the whole batch, without accumulation.
"""

from __future__ import annotations

from typing import Sequence

import torch

from contrastkit.train import PretrainConfig, average_gradients, get_method, pretrain
from contrastkit.methods import ContrastiveModel

ROWS = 8          # the global batch
MICRO = 2         # rows per micro-batch on each rank
METHODS = ("simclr", "supcon", "dcl", "moco")


def global_batch(seed: int = 3):
    """``(view_a, view_b)`` ``(ROWS, 1, 12, 12)`` float64 and class labels, the same everywhere."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(ROWS, 1, 12, 12, generator=g, dtype=torch.float64)
    y = (x + 0.1 * torch.randn(x.shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    return (x, y), torch.arange(ROWS) % 3


def model_for(name: str) -> ContrastiveModel:
    """The same GroupNorm model (learnable tau) on every process."""
    torch.manual_seed(0)
    model = ContrastiveModel(name, "small", 1, temperature=0.3, learnable_temperature=True, projection_dim=8,
                             queue_size=2 * ROWS if name == "moco" else None, norm="group")
    return model.double().train()


def grads_of(model) -> dict:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def accumulation_worker(rank: int, world: int, pretrain_options: dict, outs: Sequence[str]):
    share = ROWS // world
    rows = slice(rank * share, (rank + 1) * share)
    (x, y), labels = global_batch()
    results = {}
    for name in METHODS:
        model = model_for(name)
        model.distributed = True
        loss = get_method(name).cached_gradient_loss(model, (x[rows], y[rows]), labels[rows], MICRO)
        average_gradients(model.parameters())
        results[name] = {"loss": loss, "grads": grads_of(model),
                         "state": {k: v.clone() for k, v in model.state_dict().items()}}
    # the training loop end to end: --micro-batch (gradients averaged here) against DDP
    for micro_batch, out in zip((None, 2), outs):
        pretrain(PretrainConfig(out=out, micro_batch=micro_batch, **pretrain_options), progress=False,
                 baselines=False)
    return results


def reference(name: str):
    """One process, the whole batch, no accumulation: loss, gradients and state after the step."""
    model = model_for(name)
    (x, y), labels = global_batch()
    loss = get_method(name).loss(model, (x, y), labels)
    loss.backward()
    return loss.detach(), grads_of(model), model.state_dict()
