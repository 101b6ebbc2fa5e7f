"""Contrastive pretraining (SimCLR, MoCo, SupCon, DCL) and the fixed read-out evaluation.

Entry points: :func:`pretrain` (train + evaluate, writes a run folder) and
:func:`evaluate_run` (re-evaluate a run folder's checkpoint).
"""

from .config import DEFAULT_TEMPERATURE, METHODS, PretrainConfig
from .evaluate import evaluate_encoders, evaluate_features, evaluate_run, extract_features
from .loop import pretrain, warmup_cosine
from .methods import ContrastiveModel

__all__ = ["PretrainConfig", "METHODS", "DEFAULT_TEMPERATURE", "ContrastiveModel", "pretrain",
           "warmup_cosine", "evaluate_run", "evaluate_encoders", "evaluate_features", "extract_features"]
