"""The optimizer and learning-rate schedule of a pretraining run, built from its
:class:`~contrastkit.methods.PretrainConfig`: the one construction ``contrastkit
pretrain`` and the Lightning integration (:mod:`contrastkit.integrations.lightning`) share."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .config import PretrainConfig

__all__ = ["build_optimizer", "build_lr_scheduler", "warmup_cosine", "warmup_steps"]


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR factor at step ``s``: linear warm-up ``(s + 1) / warmup_steps``, then cosine decay
    from 1 to 0 over the remaining steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def warmup_steps(config: PretrainConfig, total_steps: int) -> int:
    """The warm-up of a run of ``total_steps`` optimizer steps: ``config.warmup_fraction`` of
    them, rounded."""
    return int(round(config.warmup_fraction * total_steps))


def build_optimizer(model: nn.Module, config: PretrainConfig) -> torch.optim.Optimizer:
    """AdamW, or SGD with Nesterov momentum 0.9 (``config.optimizer``), at ``config.lr`` over
    the trainable parameters of ``model``; ``config.weight_decay`` on the weight matrices and
    kernels, none on biases, norms and tau (the parameters with at most one dimension).
    ``config`` must be resolved (:meth:`PretrainConfig.resolved`).

    Under ``precision="fp16"`` the optimizer is the fused one (``fused=True``, built on the
    device the model is on): it takes the gradient scaler's overflow flag on the device, so
    the step does not wait for the device (:mod:`contrastkit.methods.precision`); where torch
    has no fused form for that device, the ordinary one."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "adamw":
        kind, options = torch.optim.AdamW, {"lr": config.lr}
    else:
        kind, options = torch.optim.SGD, {"lr": config.lr, "momentum": 0.9, "nesterov": True}
    if config.precision == "fp16":
        try:
            return kind(groups, fused=True, **options)
        except (RuntimeError, TypeError):  # no fused kernel for this device or dtype
            pass
    return kind(groups, **options)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: PretrainConfig,
                       total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The per-step schedule of a run of ``total_steps`` optimizer steps: linear warm-up over
    ``round(config.warmup_fraction * total_steps)`` steps, then cosine decay to 0
    (:func:`warmup_cosine`); step it after each optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_steps(config, total_steps)))
