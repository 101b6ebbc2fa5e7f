"""Worker functions for the multi-process tests of the sigmoid (SigLIP) loss.

They follow ``distributed_workers``: the same spawn harness, per-rank data and encoder; every
worker saves what it measured and the test process compares with the single-process loss on
the concatenated batch.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

import distributed_workers as W
from contrastkit import losses as L
from contrastkit.losses import sigmoid as S

TILE = 3  # several tiles per rank, ragged at the edges
PATHS = {"dense": {}, "tiled": {"chunk_size": TILE}}
VARIANTS = ("functional", "twin")
REDUCTIONS = ("mean", "sum", "none")


class Model(nn.Module):
    """The shared float64 tower for both modalities and a learnable tau and bias: a
    :class:`~contrastkit.losses.Temperature` and a bias parameter passed to
    ``sigmoid_loss`` (``"functional"``), or the :class:`~contrastkit.losses.SigmoidLoss` twin
    (``"twin"``)."""

    def __init__(self, variant: str, chunk_size=None) -> None:
        super().__init__()
        encoder = W.Encoder()
        self.net = encoder.net
        self.variant = variant
        self.chunk_size = chunk_size
        if variant == "twin":
            self.loss = L.SigmoidLoss(temperature=1 / 3.0, bias=-1.5, chunk_size=chunk_size).double()
        else:
            self.temperature = encoder.temperature
            self.bias = nn.Parameter(torch.tensor(-1.5, dtype=torch.float64))

    def forward(self, x_image: torch.Tensor, x_text: torch.Tensor, **options) -> torch.Tensor:
        image, text = self.net(x_image), self.net(x_text)
        if self.variant == "twin":  # the twin's chunk_size is its own; reduction and distributed per call
            return self.loss(image, text, **options)
        return L.sigmoid_loss(image, text, self.temperature, self.bias, chunk_size=self.chunk_size, **options)


def loss_and_grads(variant: str, data, reduction: str, chunk_size=None, **options):
    """The loss value (detached) and every parameter's gradient (dict by name)."""
    model = Model(variant, chunk_size)
    loss = model(data[0], data[1], reduction=reduction, **options)
    if reduction == "none":
        return loss.detach(), {}
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def losses_worker(rank: int, world: int, seed: int, sizes: Sequence[int]):
    """Both variants, dense and tiled ring, every reduction: value and averaged gradients, and
    how many times the ring ran."""
    data = W.batches(seed, sizes)[rank]
    results, ring_calls = {}, []
    tiles = S._SigmoidTiles.apply

    def counting_ring(*args):
        if args[4] is not None:  # a process group: the ring
            ring_calls.append(args[3])  # the tile size
        return tiles(*args)

    S._SigmoidTiles.apply = counting_ring
    try:
        for variant in VARIANTS:
            for path, options in PATHS.items():
                for reduction in REDUCTIONS:
                    value, grads = loss_and_grads(variant, data, reduction, distributed=True, **options)
                    results[(variant, path, reduction)] = (value, W._average(grads))
    finally:
        S._SigmoidTiles.apply = tiles
    results["ring_calls"] = ring_calls
    return results


def errors_worker(rank: int, world: int):
    """Bad input on one rank, and ranks that disagree: every rank must raise, none may hang."""
    z = torch.randn(4, 3, dtype=torch.float64)

    def on_rank_1(value: float) -> torch.Tensor:  # z, with row 2 set to ``value`` on rank 1 only
        return z.index_fill(0, torch.tensor([2]), value) if rank == 1 else z

    cases = {
        "nan_on_rank_1": lambda: L.sigmoid_loss(on_rank_1(float("nan")), z, distributed=True),
        "zero_norm_row_on_rank_1": lambda: L.sigmoid_loss(z, on_rank_1(0.0), distributed=True),
        "width_differs": lambda: L.sigmoid_loss(z[:, :2 + rank], z[:, :2 + rank], distributed=True),
        "dtype_differs": lambda: L.sigmoid_loss(z.to(torch.float32 if rank else torch.float64),
                                                z.to(torch.float32 if rank else torch.float64), distributed=True),
        "chunk_size_on_rank_1": lambda: L.sigmoid_loss(z, z, chunk_size=0 if rank == 1 else 2, distributed=True),
    }
    return W.error_messages(cases)


def suite_worker(rank: int, world: int, seed: int, sizes: Sequence[int]):
    return {"losses": losses_worker(rank, world, seed, sizes), "errors": errors_worker(rank, world)}
