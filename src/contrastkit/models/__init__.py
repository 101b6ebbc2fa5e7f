"""Encoders (image -> representation ``h``) and projection heads (``h`` -> ``z``).

The encoder output ``h`` is what a frozen read-out (linear probe, kNN) evaluates; the
projection ``z`` only feeds the contrastive loss. Plain torch, no torchvision. Any other
``nn.Module`` can serve as the encoder (:func:`prepare_encoder`, :func:`encoder_from_spec`).
"""

from .encoders import (ENCODERS, NORMS, OBJECT_PREFIX, PooledEncoder, ProjectionHead, ResNet18, ResNet50, SmallCNN,
                       SmallViT, build_encoder, describe_encoder, encoder_from_spec, load_factory, norm_layer,
                       prepare_encoder, unwrap_encoder)
from .text import TEXT_ENCODERS, TextEncoder, WordTokenizer

__all__ = ["ENCODERS", "NORMS", "ProjectionHead", "ResNet18", "ResNet50", "SmallCNN", "SmallViT", "PooledEncoder",
           "build_encoder", "norm_layer", "load_factory", "encoder_from_spec", "describe_encoder", "prepare_encoder",
           "unwrap_encoder", "OBJECT_PREFIX", "TextEncoder", "WordTokenizer", "TEXT_ENCODERS"]
