"""Encoders (image -> representation ``h``) and projection heads (``h`` -> ``z``).

The encoder output ``h`` is what a frozen read-out (linear probe, kNN) evaluates; the
projection ``z`` only feeds the contrastive loss. The built-ins are plain torch; timm and
torchvision models (``timm:NAME``, ``torchvision:NAME``; :mod:`contrastkit.models.external`) are
imported only when asked for. Any other ``nn.Module`` can serve as the encoder
(:func:`prepare_encoder`, :func:`encoder_from_spec`), started from local weights
(:func:`load_encoder_weights`).
"""

from .encoders import (ENCODERS, NORMS, OBJECT_PREFIX, PooledEncoder, ProjectionHead, ResNet18, ResNet50, SmallCNN,
                       SmallViT, build_encoder, describe_encoder, encoder_from_spec, load_factory, norm_layer,
                       prepare_encoder, unwrap_encoder)
from .external import (CIFAR_STEM, EXTERNAL_PREFIXES, TIMM_PREFIX, TORCHVISION_PREFIX, adapt_input_channels,
                       apply_cifar_stem, external_encoder, is_external_spec, remove_classifier, timm_encoder,
                       torchvision_encoder)
from .text import TEXT_ENCODERS, TextEncoder, WordTokenizer
from .weights import TensorFileError, WeightsReport, load_encoder_weights, load_tensors, read_state_dict

__all__ = ["ENCODERS", "NORMS", "ProjectionHead", "ResNet18", "ResNet50", "SmallCNN", "SmallViT", "PooledEncoder",
           "build_encoder", "norm_layer", "load_factory", "encoder_from_spec", "describe_encoder", "prepare_encoder",
           "unwrap_encoder", "OBJECT_PREFIX", "TextEncoder", "WordTokenizer", "TEXT_ENCODERS",
           "CIFAR_STEM", "EXTERNAL_PREFIXES", "TIMM_PREFIX", "TORCHVISION_PREFIX", "adapt_input_channels",
           "apply_cifar_stem", "external_encoder", "is_external_spec", "remove_classifier", "timm_encoder",
           "torchvision_encoder", "WeightsReport", "load_encoder_weights", "read_state_dict", "TensorFileError",
           "load_tensors"]
