"""Contrastive pretraining (SimCLR, MoCo, SupCon, DCL, ConVIRT, ...) and the fixed read-out evaluation.

Entry points: :func:`pretrain` (train + evaluate, writes a run folder) and
:func:`evaluate_run` (re-evaluate a run folder's checkpoint). Each method is a
:class:`Method` object, registered by name in :data:`METHOD_REGISTRY`. :func:`cached_gradient_loss`
(:mod:`contrastkit.train.accumulation`) takes a batch larger than the encoder's activations
fit, exactly, in micro-batches, in any training loop. The epoch a run
reports is picked on val (:class:`EpochSelection`, :func:`selected_numbers`). A run's optimizer
and learning-rate schedule are :func:`build_optimizer` and :func:`build_lr_scheduler` (also
used by :mod:`contrastkit.integrations.lightning`).
"""

from .accumulation import average_gradients, cached_gradient_loss
from .config import DEFAULT_TEMPERATURE, METHODS, PretrainConfig
from .evaluate import evaluate_encoders, evaluate_features, evaluate_run, extract_features
from .loop import pretrain, warmup_cosine
from .methods import METHOD_REGISTRY, ContrastiveModel, EvalContext, Method, TwoViewMethod, get_method
from .optimization import build_lr_scheduler, build_optimizer
from .selection import EpochSelection, selected_numbers

__all__ = ["PretrainConfig", "METHODS", "DEFAULT_TEMPERATURE", "ContrastiveModel", "pretrain",
           "warmup_cosine", "Method", "TwoViewMethod", "EvalContext", "METHOD_REGISTRY", "get_method",
           "evaluate_run", "evaluate_encoders", "evaluate_features", "extract_features", "cached_gradient_loss",
           "average_gradients", "EpochSelection", "selected_numbers", "build_optimizer", "build_lr_scheduler"]
