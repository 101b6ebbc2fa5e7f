"""The training batch as the loss saw it, for a loop that asks: :class:`BatchTap`.

A training loop that wants a step's diagnostics (:mod:`contrastkit.metrics.batch`) keeps a
:class:`BatchTap`, arms it before that step and passes it to the step's loss
(:func:`contrastkit.methods.step.step_loss`, ``tap=``). The method's loss
(:meth:`~contrastkit.methods.Method.loss`, and its micro-batch form) hands the step's
embeddings to :func:`observe_batch` between :meth:`~contrastkit.methods.Method.embed` and
:meth:`~contrastkit.methods.Method.objective`; an armed tap then keeps the method's
:meth:`~contrastkit.methods.Method.batch_problem` of them and its diagnostics at the model's
``tau`` of that step, computed on the device without reading a value back. An unarmed tap (or
none) costs one attribute lookup: nothing is computed at the steps nobody logs, and no extra
forward pass is ever made.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor, nn

from contrastkit.metrics.batch import BatchProblem, batch_diagnostics

__all__ = ["BatchTap", "observe_batch"]


class BatchTap:
    """What one armed step's loss saw: its :class:`~contrastkit.metrics.batch.BatchProblem`
    (``problem``), diagnostics (``values``, a tensor on the device) and ``tau`` (the model's,
    a 0-dim tensor, when the loss was computed)."""

    def __init__(self) -> None:
        self.armed = False
        self.problem: Optional[BatchProblem] = None
        self.values: Optional[Tensor] = None
        self.tau: Optional[Tensor] = None

    def arm(self) -> None:
        """Keep what the next loss call sees."""
        self.armed, self.problem, self.values, self.tau = True, None, None, None

    def take(self) -> Tuple[Optional[BatchProblem], Optional[Tensor]]:
        """``(problem, values)`` of the armed step (``(None, None)`` if its method has no
        problem to show), and disarm."""
        kept = (self.problem, self.values)
        self.armed, self.problem, self.values = False, None, None
        return kept


def observe_batch(method: Any, model: nn.Module, embeddings: Tuple[Tensor, ...],
                  tap: Optional[BatchTap] = None) -> None:
    """Hand a step's ``embeddings`` to ``tap`` if it is armed (a no-op otherwise)."""
    if tap is None or not tap.armed:
        return
    tap.armed = False  # one loss call per step: a second (an evaluation) is not the step's
    device = embeddings[0].device.type if embeddings else "cpu"
    # The step's forward may run under autocast (--precision): the diagnostics' similarities
    # are computed in the dtype the method asks for, not in half precision.
    with torch.no_grad(), torch.autocast(device_type=device, enabled=False):
        problem = method.batch_problem(model, tuple(e.detach() for e in embeddings))
        if problem is not None:
            tap.tau = model.temperature().detach()
            tap.problem = problem
            tap.values = batch_diagnostics(problem, tap.tau)
