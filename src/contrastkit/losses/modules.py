"""``nn.Module`` twins of the functional losses, and the :class:`Temperature` module.

Each module stores its keyword options and calls the function of the same name; a
:class:`Temperature` passed as ``temperature`` is registered as a submodule, so a learnable
temperature is trained by the optimizer of the model that owns the loss.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from . import functional as F
from .validation import resolve_temperature
from .core import contrastive_loss

__all__ = [
    "Temperature",
    "ContrastiveLoss",
    "InfoNCE",
    "NTXent",
    "NTXentViews",
    "BidirectionalInfoNCE",
    "SupCon",
    "SimilarityLoss",
    "DCL",
    "SimpleLoss",
    "HardNegativeNTXent",
    "DebiasedNTXent",
    "HCL",
]


class Temperature(nn.Module):
    """A temperature ``tau``: fixed, or learnable in CLIP's parameterisation.

    Learnable: the parameter is ``log_scale = log(1 / tau)`` and ``tau = 1 / exp(log_scale)``
    with the scale ``exp(log_scale)`` clamped to ``<= max_scale`` (CLIP: init 0.07, 100).

    Args:
        initial: starting ``tau > 0`` (default 0.07, CLIP's).
        learnable: train ``log_scale`` by gradient descent.
        max_scale: upper bound on ``1 / tau`` (so ``tau >= 1 / max_scale``).

    Calling the module returns ``tau`` as a 0-dim tensor (carrying the gradient when
    learnable); :attr:`value` returns it as a float.

    Example:
        >>> t = Temperature(0.07, learnable=True)
        >>> round(t.value, 4)
        0.07
    """

    def __init__(self, initial: float = 0.07, *, learnable: bool = False, max_scale: float = 100.0) -> None:
        super().__init__()
        initial = float(resolve_temperature(initial, name="initial"))
        if not math.isfinite(max_scale) or max_scale <= 0:
            raise ValueError(f"max_scale must be positive and finite, got {max_scale}")
        if 1.0 / initial > max_scale:
            raise ValueError(f"initial temperature {initial} is below 1 / max_scale = {1.0 / max_scale}")
        self.learnable = bool(learnable)
        self.max_scale = float(max_scale)
        log_scale = torch.tensor(math.log(1.0 / initial), dtype=torch.float32)
        if self.learnable:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    def forward(self) -> Tensor:
        scale = self.log_scale.exp().clamp(max=self.max_scale)
        return 1.0 / scale

    @property
    def value(self) -> float:
        return float(self.forward().detach())

    def extra_repr(self) -> str:
        return f"tau={self.value:.4g}, learnable={self.learnable}, max_scale={self.max_scale:g}"


TemperatureArg = Union[float, Tensor, Temperature]


class _LossModule(nn.Module):
    """Holds the temperature and keyword options; subclasses name the function to call."""

    _function: Any = None
    _has_temperature = True

    def __init__(self, temperature: Optional[TemperatureArg] = None, **options: Any) -> None:
        super().__init__()
        if self._has_temperature:
            if temperature is None:
                raise TypeError(f"{type(self).__name__} needs a temperature")
            if isinstance(temperature, Temperature):
                self.temperature = temperature
            else:
                self.temperature = float(resolve_temperature(temperature))
        self.options = options

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        options = {**self.options, **kwargs}
        if self._has_temperature:
            options["temperature"] = self.temperature
        return type(self)._function(*args, **options)

    def extra_repr(self) -> str:
        parts = [] if not self._has_temperature or isinstance(self.temperature, nn.Module) else [
            f"temperature={self.temperature:g}"]
        parts += [f"{k}={v!r}" for k, v in self.options.items()]
        return ", ".join(parts)


def _twin(name: str, function: Any, has_temperature: bool = True) -> type:
    doc = (f"Module form of :func:`contrastkit.losses.{function.__name__}`: options given to the "
           f"constructor (``temperature`` first) are passed on every call.\n\n"
           f"Example:\n    >>> loss_fn = {name}({'temperature=0.1' if has_temperature else ''})\n")
    return type(name, (_LossModule,), {"_function": staticmethod(function), "_has_temperature": has_temperature,
                                       "__doc__": doc, "__module__": __name__})


ContrastiveLoss = _twin("ContrastiveLoss", contrastive_loss)
InfoNCE = _twin("InfoNCE", F.info_nce)
NTXent = _twin("NTXent", F.nt_xent)
NTXentViews = _twin("NTXentViews", F.nt_xent_views)
BidirectionalInfoNCE = _twin("BidirectionalInfoNCE", F.bidirectional_info_nce)
SupCon = _twin("SupCon", F.supcon)
SimilarityLoss = _twin("SimilarityLoss", F.similarity_loss)
DCL = _twin("DCL", F.dcl)
SimpleLoss = _twin("SimpleLoss", F.simple_loss, has_temperature=False)
HardNegativeNTXent = _twin("HardNegativeNTXent", F.hard_negative_nt_xent)
DebiasedNTXent = _twin("DebiasedNTXent", F.debiased_nt_xent)
HCL = _twin("HCL", F.hcl)
