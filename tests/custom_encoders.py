"""Encoders a user might bring, for the tests of any-encoder training: importable factories and
classes, and modules with the defects the set-up must refuse."""

import torch
from torch import nn


class TinyConv(nn.Module):
    """Two convolutions and no pooling: ``(N, C, H, W)`` -> ``(N, width, H / 2, W / 2)``, which the
    pipeline pools. No ``out_dim``: the dry forward finds it."""

    def __init__(self, in_channels: int = 1, width: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU())

    def forward(self, x):
        return self.net(x)


def tiny_conv(in_channels: int = 1, width: int = 4) -> nn.Module:
    """A factory as ``--encoder custom_encoders:tiny_conv`` calls it."""
    return TinyConv(in_channels, width)


def not_a_module() -> str:
    return "not a module"


class WrongShape(nn.Module):
    """One number per image: ``(N,)``, not ``(N, D)``."""

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x.flatten(1).mean(dim=1) * self.scale


class NotFinite(TinyConv):
    def forward(self, x):
        return super().forward(x) * float("nan")


class Noisy(TinyConv):
    """Dropout left on in eval mode: two calls differ."""

    def forward(self, x):
        return nn.functional.dropout(super().forward(x), 0.5, training=True)


class BatchSizeDependent(TinyConv):
    """Scales its output by the batch size, a Python number: a trace bakes in the size it saw, so
    the traced module disagrees with this one at any other size."""

    def forward(self, x):
        return super().forward(x) * float(x.shape[0])
