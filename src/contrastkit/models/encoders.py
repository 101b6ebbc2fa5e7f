"""A small CNN (the CPU default), a CIFAR-stem ResNet-18 and an MLP projection head.

Each normalises with BatchNorm by default, or, with ``norm="group"``, without batch
statistics: GroupNorm (up to 32 groups, Wu & He 2018) in the convolutional layers and
LayerNorm in the head, so that a row's output does not depend on the other rows of its
batch (what cached-gradient accumulation needs to be exact, ``docs/accumulation.md``).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

__all__ = ["SmallCNN", "ResNet18", "ProjectionHead", "build_encoder", "ENCODERS", "NORMS", "norm_layer"]

#: The normalisations of the built-in networks: ``"batch"`` (the default) or ``"group"``.
NORMS = ("batch", "group")
GROUPS = 32  # Wu & He's default number of groups


def norm_layer(norm: Optional[str], channels: int, *, spatial: bool = True) -> nn.Module:
    """The normalisation of ``channels`` features: ``"batch"`` (or ``None``) -> BatchNorm;
    ``"group"`` -> GroupNorm with ``gcd(32, channels)`` groups for ``(N, C, H, W)`` inputs
    (``spatial``), LayerNorm for ``(N, C)`` ones."""
    norm = "batch" if norm is None else norm
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if norm == "batch":
        return nn.BatchNorm2d(channels) if spatial else nn.BatchNorm1d(channels)
    return nn.GroupNorm(math.gcd(GROUPS, channels), channels) if spatial else nn.LayerNorm(channels)


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1, norm: Optional[str] = None) -> List[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        norm_layer(norm, out_channels),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Module):
    """A stride-2 3x3 conv stem, three 3x3 conv-BN-ReLU blocks (2x2 max-pools after the
    second and third), then global average pooling. Sized for CPU training: about 3.6 M
    multiply-adds per 32x32 image; the stride-2 stem makes a step ~1.5x faster on CPU than a
    stride-1 stem with a max-pool (benchmarks/RESULTS_train.md).

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``; any ``H, W >= 8``.
        width: channels of the stem; the next blocks use ``2``, ``4`` and ``8`` times it.
        norm: ``"batch"`` (BatchNorm, default) or ``"group"`` (GroupNorm; :func:`norm_layer`).

    ``forward`` returns ``h`` of shape ``(N, 8 * width)``; ``out_dim`` holds that size.
    """

    def __init__(self, in_channels: int = 1, width: int = 16, norm: Optional[str] = None) -> None:
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, width, stride=2, norm=norm),
            *_conv_bn_relu(width, 2 * width, norm=norm),
            nn.MaxPool2d(2),
            *_conv_bn_relu(2 * width, 4 * width, norm=norm),
            nn.MaxPool2d(2),
            *_conv_bn_relu(4 * width, 8 * width, norm=norm),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.out_dim = 8 * width

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


class _BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: Optional[str] = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(norm, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm_layer(norm, out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                norm_layer(norm, out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with the CIFAR stem (one 3x3 conv, stride 1, no max-pool), as in SimCLR's
    CIFAR-10 experiments; the classification layer is dropped.

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``.
        width: channels of the first stage (64 in the standard network).
        norm: ``"batch"`` (BatchNorm, default) or ``"group"`` (GroupNorm; :func:`norm_layer`).

    ``forward`` returns ``h`` of shape ``(N, 8 * width)`` (512 for the standard network).
    """

    def __init__(self, in_channels: int = 3, width: int = 64, norm: Optional[str] = None) -> None:
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        self.stem = nn.Sequential(*_conv_bn_relu(in_channels, width, norm=norm))
        stages = []
        channels = width
        for index, out_channels in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if index == 0 else 2
            stages.append(nn.Sequential(_BasicBlock(channels, out_channels, stride, norm),
                                        _BasicBlock(out_channels, out_channels, 1, norm)))
            channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out_dim = channels

    def forward(self, x: Tensor) -> Tensor:
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)


class ProjectionHead(nn.Module):
    """SimCLR's MLP head ``z = W2 relu(BN(W1 h))``: ``(N, in_dim)`` -> ``(N, out_dim)``;
    ``norm="group"`` puts LayerNorm in place of BN (:func:`norm_layer`)."""

    def __init__(self, in_dim: int, hidden_dim: int = 128, out_dim: int = 64, norm: Optional[str] = None) -> None:
        super().__init__()
        if min(in_dim, hidden_dim, out_dim) < 1:
            raise ValueError(f"head sizes must be >= 1, got {in_dim}, {hidden_dim}, {out_dim}")
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden_dim, bias=False),
            norm_layer(norm, hidden_dim, spatial=False),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, out_dim),
        )
        self.out_dim = out_dim

    def forward(self, h: Tensor) -> Tensor:
        return self.net(h)


ENCODERS: Dict[str, Callable[..., nn.Module]] = {
    "small": lambda in_channels, norm=None: SmallCNN(in_channels, norm=norm),
    "resnet18": lambda in_channels, norm=None: ResNet18(in_channels, norm=norm),
}


def build_encoder(name: str, in_channels: int, norm: Optional[str] = None) -> nn.Module:
    """The encoder called ``name`` (``"small"`` or ``"resnet18"``) for ``in_channels`` inputs,
    normalised by ``norm`` (``None``/``"batch"``: BatchNorm; ``"group"``: GroupNorm)."""
    if name not in ENCODERS:
        raise ValueError(f"encoder must be one of {sorted(ENCODERS)}, got {name!r}")
    return ENCODERS[name](in_channels, norm=norm)
