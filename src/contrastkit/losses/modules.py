"""``nn.Module`` twins of the functional losses.

Each module stores its keyword options and calls the function of the same name. The
``temperature`` keeps what it was given: a :class:`~contrastkit.losses.Temperature` (or any
module returning ``tau``) becomes a submodule and an ``nn.Parameter`` a parameter of the loss,
so a learnable temperature appears in ``parameters()`` and is trained by the optimizer of the
model that owns the loss; a tensor is kept as it is (with its graph); a number stays a float.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from torch import Tensor, nn

from . import functional as F
from .validation import resolve_temperature
from .core import contrastive_loss
from .temperature import Temperature

__all__ = [
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


TemperatureArg = Union[float, Tensor, nn.Parameter, Temperature]


class _LossModule(nn.Module):
    """Holds the temperature and keyword options; subclasses name the function to call.

    ``temperature``: a number (kept as a float), a 0-dim tensor (kept as it is, graph
    included, as a buffer that is not saved in the state dict), an ``nn.Parameter`` (a
    parameter of this module) or a module returning ``tau`` such as
    :class:`~contrastkit.losses.Temperature` (a submodule). Keyword options given at a call
    override those given to the constructor, ``temperature`` included.
    """

    _function: Any = None
    _has_temperature = True

    def __init__(self, temperature: Optional[TemperatureArg] = None, **options: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if not self._has_temperature:
            if temperature is not None:
                raise TypeError(f"{name} has no temperature; do not pass one")
        elif temperature is None:
            raise TypeError(f"{name} needs a temperature")
        else:
            resolve_temperature(temperature)  # one clear error now rather than at the first call
            if isinstance(temperature, (nn.Module, nn.Parameter)):
                self.temperature = temperature  # registered: in parameters(), trained with the owner
            elif isinstance(temperature, Tensor):
                self.register_buffer("temperature", temperature, persistent=False)
            else:
                self.temperature = float(temperature)
        self.options = options

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        options = {**self.options, **kwargs}
        if self._has_temperature:
            options.setdefault("temperature", self.temperature)
        return type(self)._function(*args, **options)

    def extra_repr(self) -> str:
        parts = []
        if self._has_temperature and isinstance(self.temperature, float):
            parts.append(f"temperature={self.temperature:g}")
        elif self._has_temperature and not isinstance(self.temperature, nn.Module):
            parts.append(f"temperature={float(self.temperature.detach()):g}")
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
