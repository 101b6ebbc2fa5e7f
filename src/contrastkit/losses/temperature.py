"""The temperature ``tau`` as a module, and its supported floor :data:`MIN_TEMPERATURE`.

:class:`Temperature` owns one ``tau``: fixed, set from outside by a schedule
(:meth:`Temperature.set_`), or learnable in CLIP's parameterisation. How ``tau`` changes over a
run (schedules) lives in :mod:`contrastkit.temperature`.
"""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor, nn

from .validation import require, resolve_temperature

__all__ = ["MIN_TEMPERATURE", "Temperature"]

MIN_TEMPERATURE = 0.01
"""The smallest ``tau`` a trained model supports: :class:`Temperature` caps ``1 / tau`` at
``1 / MIN_TEMPERATURE = 100`` by default (CLIP's cap on its logit scale). Every check of a
temperature given to training (configuration, command-line options) uses this constant."""


class Temperature(nn.Module):
    """A temperature ``tau``: fixed, set by a schedule, or learnable in CLIP's parameterisation.

    The state is ``log_scale = log(1 / tau)`` (a parameter when learnable, a buffer
    otherwise) and ``tau = 1 / exp(log_scale)``, with the scale ``exp(log_scale)`` capped at
    ``max_scale`` (CLIP: init 0.07, cap 100), so ``tau >= 1 / max_scale``.

    The cap, as in CLIP: the training step projects the parameter back into range after each
    optimizer step (call :meth:`clamp_` after ``optimizer.step()``); in the forward pass the
    gradient flows up to and including the cap and is zero only strictly beyond it. So a
    learnable ``tau`` that reaches the cap still gets the gradient of the loss there and can
    come back when the loss wants a larger ``tau``. The alternatives were rejected: a
    straight-through gradient beyond the cap lets the parameter drift past it for as long as
    the loss wants a smaller ``tau`` (and takes as long to come back); a different
    parameterisation (e.g. a softplus above the floor) would change the numbers and
    checkpoints of every learnable run, and the gradient here is exact wherever it is used.

    Args:
        initial: starting ``tau`` with ``1 / initial <= max_scale`` (default 0.07, CLIP's).
        learnable: train ``log_scale`` by gradient descent.
        max_scale: upper bound on ``1 / tau`` (default ``1 / MIN_TEMPERATURE = 100``).

    Calling the module returns ``tau`` as a 0-dim tensor (carrying the gradient when
    learnable); :attr:`value` returns it as a float; :meth:`set_` sets it.

    Example:
        >>> t = Temperature(0.07, learnable=True)
        >>> round(t.value, 4)
        0.07
        >>> round(t.set_(0.2).value, 4)
        0.2
    """

    def __init__(self, initial: float = 0.07, *, learnable: bool = False,
                 max_scale: float = 1.0 / MIN_TEMPERATURE) -> None:
        super().__init__()
        if isinstance(max_scale, bool) or not isinstance(max_scale, (int, float)) \
                or not math.isfinite(max_scale) or max_scale <= 0:
            raise ValueError(f"max_scale must be positive and finite, got {max_scale}")
        self.learnable = bool(learnable)
        self.max_scale = float(max_scale)
        self._log_max = math.log(self.max_scale)
        log_scale = torch.tensor(self._log_scale_of(initial, "initial temperature"), dtype=torch.float32)
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    @property
    def min_value(self) -> float:
        """The floor ``1 / max_scale``: the smallest ``tau`` this module takes."""
        return 1.0 / self.max_scale

    def _log_scale_of(self, tau: float, name: str) -> float:
        tau = float(resolve_temperature(tau, name=name))
        if 1.0 / tau > self.max_scale:
            raise ValueError(f"{name} {tau} is below 1 / max_scale = {self.min_value}")
        return math.log(1.0 / tau)

    def _log_cap(self) -> Tensor:
        """``log(max_scale)`` in the dtype of ``log_scale``. A float32 ``log_scale`` at the cap is
        this rounding (float32(log 100) lies above log 100); compared with the float64 bound,
        clamp's backward (torch >= 2.14) would cut the gradient at the cap itself. Filled on
        the device (``new_full``): ``new_tensor`` would copy a host number to the device and,
        on a GPU, wait for the queued work at every forward pass."""
        return self.log_scale.detach().new_full((), self._log_max)

    def forward(self) -> Tensor:
        # Clamping in the log domain keeps the gradient at the cap itself (clamp passes it for
        # log_scale <= log(max_scale)), where clamp_() leaves the parameter.
        scale = self.log_scale.clamp(max=self._log_cap()).exp()
        # exp(log(max_scale)) may round a hair above max_scale: cap the value there without
        # cutting the gradient (the subtraction is exact, so the value is what it always was).
        scale = scale - (scale - scale.clamp(max=self.max_scale)).detach()
        return 1.0 / scale

    @torch.no_grad()
    def clamp_(self) -> "Temperature":
        """Project ``log_scale`` back to ``<= log(max_scale)`` in place (CLIP clamps its logit
        scale so after every optimizer step); returns ``self``. The value of ``tau`` does not
        change (the forward pass caps it anyway), only where the next step starts from."""
        self.log_scale.clamp_(max=self._log_cap())
        return self

    @torch.no_grad()
    def set_(self, tau: Union[float, Tensor]) -> "Temperature":
        """Set ``tau`` in place (a schedule's value for this step); returns ``self``.

        Raises ``ValueError`` for a ``tau`` below :attr:`min_value` (it would be silently
        raised to the floor) or not positive and finite. A 0-dim tensor is copied where it
        lives, without reading it on the host (checked at once on the CPU, on the device
        elsewhere).
        """
        if isinstance(tau, Tensor):
            value = resolve_temperature(tau, name="tau").detach().to(self.log_scale)
            require(value >= self.min_value * (1 - 1e-6), f"tau is below 1 / max_scale = {self.min_value}")
            self.log_scale.copy_(value.reciprocal().log().clamp(max=self._log_cap()))
            return self
        self.log_scale.fill_(self._log_scale_of(tau, "tau"))
        return self

    @property
    def value(self) -> float:
        """``tau`` as a float."""
        return float(self.forward().detach())

    def extra_repr(self) -> str:
        return f"tau={self.value:.4g}, learnable={self.learnable}, max_scale={self.max_scale:g}"
