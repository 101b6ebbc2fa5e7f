"""Contrastive pretraining (SimCLR, MoCo, SupCon, DCL, ConVIRT, ...) and the fixed read-out evaluation.

Entry points: :func:`pretrain` (train + evaluate, writes a run folder) and
:func:`evaluate_run` (re-evaluate a run folder's checkpoint). Each method is a
:class:`Method` object, registered by name in :data:`METHOD_REGISTRY`. The epoch a run
reports is picked on val (:class:`EpochSelection`, :func:`selected_numbers`).
"""

from .config import DEFAULT_TEMPERATURE, METHODS, PretrainConfig
from .evaluate import evaluate_encoders, evaluate_features, evaluate_run, extract_features
from .loop import pretrain, warmup_cosine
from .methods import METHOD_REGISTRY, ContrastiveModel, EvalContext, Method, TwoViewMethod, get_method
from .selection import EpochSelection, selected_numbers

__all__ = ["PretrainConfig", "METHODS", "DEFAULT_TEMPERATURE", "ContrastiveModel", "pretrain",
           "warmup_cosine", "Method", "TwoViewMethod", "EvalContext", "METHOD_REGISTRY", "get_method",
           "evaluate_run", "evaluate_encoders", "evaluate_features", "extract_features", "EpochSelection",
           "selected_numbers"]
