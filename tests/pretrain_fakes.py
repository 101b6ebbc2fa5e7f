"""A tiny stand-in data set with the ``contrastkit.data`` interface, for fast loop tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch


@dataclass
class FakeSplit:
    images: torch.Tensor
    labels: torch.Tensor
    realisations: Optional[torch.Tensor] = None
    groups: Optional[torch.Tensor] = None


@dataclass
class FakeDataset:
    name: str
    num_classes: int
    class_names: Tuple[str, ...]
    image_shape: Tuple[int, int, int]
    train: FakeSplit
    val: FakeSplit
    test: FakeSplit


def _bars(n: int, size: int, generator: torch.Generator) -> FakeSplit:
    """Vertical, horizontal or diagonal bars at random offsets plus noise (labels 0, 1, 2)."""
    labels = torch.arange(n) % 3
    images = 0.1 * torch.rand(n, 1, size, size, generator=generator)
    offsets = torch.randint(2, size - 2, (n,), generator=generator)
    for i in range(n):
        o = int(offsets[i])
        if labels[i] == 0:
            images[i, 0, :, o] = 1.0
        elif labels[i] == 1:
            images[i, 0, o, :] = 1.0
        else:
            images[i, 0].fill_diagonal_(1.0)
            images[i, 0] = torch.roll(images[i, 0], shifts=o - size // 2, dims=1)
    return FakeSplit(images.clamp(0, 1), labels.long())


def fake_dataset(n_train: int = 48, n_eval: int = 24, size: int = 12, seed: int = 0) -> FakeDataset:
    generator = torch.Generator().manual_seed(seed)
    return FakeDataset("fake-bars", 3, ("vertical", "horizontal", "diagonal"), (1, size, size),
                       _bars(n_train, size, generator), _bars(n_eval, size, generator),
                       _bars(n_eval, size, generator))


def fake_views(dataset, mode="augment", device="cpu"):
    """Two views: the image plus noise drawn from torch's global RNG (as kornia would)."""

    def views(split, indices):
        images = split.images[indices]
        a = (images + 0.1 * torch.randn(images.shape)).clamp(0, 1)
        b = (images + 0.1 * torch.randn(images.shape)).clamp(0, 1)
        return a.to(device), b.to(device)

    return views
