"""Encoders (image -> representation ``h``) and projection heads (``h`` -> ``z``).

The encoder output ``h`` is what a frozen read-out (linear probe, kNN) evaluates; the
projection ``z`` only feeds the contrastive loss. Plain torch, no torchvision.
"""

from .encoders import ENCODERS, NORMS, ProjectionHead, ResNet18, SmallCNN, build_encoder, norm_layer

__all__ = ["ENCODERS", "NORMS", "ProjectionHead", "ResNet18", "SmallCNN", "build_encoder", "norm_layer"]
