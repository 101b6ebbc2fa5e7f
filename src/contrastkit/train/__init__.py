"""The trainer: :func:`pretrain` (train + evaluate, writes a run folder), :func:`evaluate_run`
(re-evaluate a run folder's checkpoint), :func:`export_model` (its encoder as safetensors, ONNX or
TorchScript), checkpoints, run folders, loggers and the baseline
cache. It builds on the library of methods (:mod:`contrastkit.methods`: the methods, models,
configuration, accumulation and optimizer) and the read-out (:mod:`contrastkit.metrics.readout`),
which import nothing of it; their names that scripts train with
(:class:`~contrastkit.methods.PretrainConfig`, :class:`~contrastkit.methods.Method`,
:func:`~contrastkit.methods.get_method`, :func:`~contrastkit.methods.cached_gradient_loss`, ...)
are handed on here too, so that ``from contrastkit.train import PretrainConfig, pretrain`` works. The epoch a run reports is picked on val (:class:`EpochSelection`,
:func:`selected_numbers`). The last training batch a run keeps for its report's pictures is read
back with :func:`read_last_batch`.
"""

from contrastkit.methods import (METHOD_REGISTRY, ContrastiveModel, EvalContext, Method, PretrainConfig,
                                 TwoViewMethod, average_gradients, build_lr_scheduler, build_optimizer,
                                 cached_gradient_loss, get_method, register_method, warmup_cosine)
from contrastkit.metrics.readout import evaluate_encoders, evaluate_features, extract_features

from .evaluate import evaluate_run
from .export import ModelExport, export_model
from .last_batch import LastBatch, read_last_batch
from .loop import pretrain
from .selection import EpochSelection, selected_numbers

# The trainer's own names; the library's handed on above are documented where they live.
__all__ = ["pretrain", "evaluate_run", "EpochSelection", "selected_numbers", "LastBatch", "read_last_batch",
           "export_model", "ModelExport"]
