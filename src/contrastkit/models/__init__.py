"""Encoders (image -> representation ``h``) and projection heads (``h`` -> ``z``).

The encoder output ``h`` is what a frozen read-out (linear probe, kNN) evaluates; the
projection ``z`` only feeds the contrastive loss. Plain torch, no torchvision.
"""

from .encoders import ENCODERS, ProjectionHead, ResNet18, SmallCNN, build_encoder

__all__ = ["ENCODERS", "ProjectionHead", "ResNet18", "SmallCNN", "build_encoder"]
