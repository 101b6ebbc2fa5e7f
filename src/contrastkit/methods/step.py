"""One training step of a method, in the library: what every training loop calls, in order.

``contrastkit pretrain``'s loop (:mod:`contrastkit.train.loop`) and the Lightning module
(:mod:`contrastkit.integrations.lightning`) both run their steps through these three
functions, so that a method and a temperature method train the same way under either::

    tau = before_loss(model, schedule, step, total_steps)   # a varying schedule's tau, else None
    loss = step_loss(method, model, batch, labels, indices=indices, tap=tap)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    temperatures = after_optimizer_step(method, model)      # (2N,) per-anchor taus, or None

Everything that varies from batch to batch is an argument, never an attribute set on the
model from outside: ``indices`` ``(N,)`` int64, the batch's sample indices in the training
split (global ones under several processes; the per-sample state of the temperature methods
``individual`` and ``network`` is kept by them, :func:`keeps_sample_state`), and ``tap``, a
:class:`~contrastkit.methods.tap.BatchTap` that keeps an armed step's diagnostics. None of
the three reads a value back from the device (no host synchronisation).
"""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn

from .tap import BatchTap

__all__ = ["before_loss", "step_loss", "after_optimizer_step", "keeps_sample_state"]


def keeps_sample_state(model: nn.Module) -> bool:
    """Whether ``model``'s loss keeps one state per training sample (a temperature method with
    ``needs_indices``: iSogCLR's ``individual``, TempNet's ``network``), so that its training
    steps need the batch's sample indices."""
    return bool(getattr(getattr(model, "temperature_method", None), "needs_indices", False))


def before_loss(model: nn.Module, schedule: Any, step: int, total_steps: int) -> Optional[float]:
    """Before step ``step`` (0-based) of ``total_steps``: a varying temperature schedule
    (:class:`~contrastkit.temperature.TemperatureSchedule`) sets the model's ``tau`` for this
    step and it is returned; ``None`` for a constant or learnable tau and for a temperature
    method, which nothing sets here."""
    return schedule.apply(model.temperature, step, total_steps)


def step_loss(method: Any, model: nn.Module, batch: Any, labels: Optional[Tensor] = None, *,
              indices: Optional[Tensor] = None, tap: Optional[BatchTap] = None) -> Tensor:
    """The mean loss of one training step (:meth:`Method.loss <contrastkit.methods.Method.loss>`):
    ``batch`` as the method's batch maker returns it, ``labels`` ``(N,)`` or ``None``,
    ``indices`` ``(N,)`` the batch's sample indices in the training split (on the loss's device;
    required when :func:`keeps_sample_state`, else unused) and ``tap`` the step's batch tap
    (kept only when armed)."""
    return method.loss(model, batch, labels, indices=indices, tap=tap)


def after_optimizer_step(method: Any, model: nn.Module) -> Optional[Tensor]:
    """After the optimizer's step: a learnable tau's parameter is clamped to its cap (CLIP,
    :meth:`Temperature.clamp_ <contrastkit.losses.Temperature.clamp_>`), then a temperature
    method updates the state it keeps outside the optimizer (:meth:`Method.end_step
    <contrastkit.methods.Method.end_step>`). Returns the ``(2N,)`` temperatures the step's
    anchors used (detached, on the device) for a temperature method, else ``None``."""
    model.temperature.clamp_()
    method.end_step(model)
    temperature_method = getattr(model, "temperature_method", None)
    return None if temperature_method is None else temperature_method.last_temperatures
