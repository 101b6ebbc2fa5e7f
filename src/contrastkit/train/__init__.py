"""The trainer: :func:`pretrain` (train + evaluate, writes a run folder), :func:`evaluate_run`
(re-evaluate a run folder's checkpoint), checkpoints, run folders, loggers and the baseline
cache. It builds on the library of methods (:mod:`contrastkit.methods`: the methods, models,
configuration, accumulation and optimizer), which imports nothing of it; :class:`PretrainConfig`,
:class:`Method`, :func:`get_method` and :func:`cached_gradient_loss` are handed on here for the
scripts that train. The epoch a run reports is picked on val (:class:`EpochSelection`,
:func:`selected_numbers`).
"""

from contrastkit.methods import (METHOD_REGISTRY, ContrastiveModel, EvalContext, Method, PretrainConfig,
                                 TwoViewMethod, average_gradients, build_lr_scheduler, build_optimizer,
                                 cached_gradient_loss, get_method, register_method, warmup_cosine)
from contrastkit.metrics.readout import evaluate_encoders, evaluate_features, extract_features

from .evaluate import evaluate_run
from .loop import pretrain
from .selection import EpochSelection, selected_numbers

__all__ = ["PretrainConfig", "ContrastiveModel", "pretrain", "warmup_cosine", "Method", "TwoViewMethod",
           "EvalContext", "METHOD_REGISTRY", "get_method", "register_method", "evaluate_run", "evaluate_encoders",
           "evaluate_features", "extract_features", "cached_gradient_loss", "average_gradients", "EpochSelection",
           "selected_numbers", "build_optimizer", "build_lr_scheduler"]
