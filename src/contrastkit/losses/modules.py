"""``nn.Module`` twins of the functional losses, in the ``torch.nn`` pattern.

Each class is a thin wrapper of the function of the same name: its constructor takes the
temperature and the function's keyword options, by name and with the function's defaults (a
misspelt option is Python's ``TypeError`` at construction); its ``forward`` takes the
function's tensors (``NTXentViews.forward(z_a, z_b)``, ``SupCon.forward(z, labels)``, ...)
and calls the function. Shapes and conventions are the functions'
(:mod:`contrastkit.losses.functional`).

The temperature is the module's own (a call cannot replace it: the Lightning integration
relies on this); a learnable one is in ``parameters()`` and trained by the optimizer of the
model that owns the loss. A call may override ``reduction`` and, for the losses that take
every rank's negatives, ``distributed`` and ``distributed_mode``: they depend on where the loss
is called (per-anchor losses for an evaluation, the process group of a training step), not on
what it computes.
"""

from __future__ import annotations

import inspect
import math  # noqa: F401  (used by the doctests)
from typing import Any, Callable, ClassVar, Dict, List, Optional, TypeVar

import torch  # noqa: F401  (used by the doctests)
from torch import Tensor, nn

from contrastkit.distributed.gather import DistributedArg

from . import functional as F
from .core import contrastive_loss
from .validation import TemperatureLike, resolve_temperature

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


_TEMPERATURE_DOC = """\
``temperature`` (required): ``tau > 0``, checked here. A number is kept as a float, a 0-dim
tensor as it is (graph included, as a buffer that is not saved in the state dict; a ``(A,)``
tensor gives each of the ``A`` anchor rows its own ``tau``, for batches of that size), an
``nn.Parameter`` becomes a parameter of this module and a module returning ``tau`` (such as
:class:`~contrastkit.losses.Temperature`) a submodule, trained with the model that owns the loss."""

_OPTIONS_DOC = """\
The other constructor arguments are the keyword options of
:func:`~contrastkit.losses.{function}`, with its defaults and meanings; a call may
override {overrides} for that call only."""

_Loss = TypeVar("_Loss", bound=type)


def _twin_of(function: Callable[..., Tensor], overrides: str = "``reduction``") -> Callable[[_Loss], _Loss]:
    """Class decorator: append the paragraphs every twin shares (the temperature, the options of
    ``function``) to the class docstring, before its example."""

    def decorate(cls: _Loss) -> _Loss:
        head, example, rest = inspect.cleandoc(cls.__doc__ or "").partition("\nExample")
        shared = [_TEMPERATURE_DOC] if getattr(cls, "_has_temperature", True) else []
        shared.append(_OPTIONS_DOC.format(function=function.__name__, overrides=overrides))
        cls.__doc__ = "\n\n".join([head.rstrip(), *shared]) + ("\n" + example + rest if example else "") + "\n"
        return cls

    return decorate


_DISTRIBUTED_OVERRIDES = "``reduction``,\n``distributed`` and ``distributed_mode``"


def _given(value: Any, default: Any) -> Any:
    """A call's override, or the constructor's value where the call gave ``None``."""
    return default if value is None else value


class _LossModule(nn.Module):
    """Holds the temperature and the options every loss takes (``reduction``, ``validate``);
    :meth:`_options` gives a call's keyword arguments for the function."""

    _has_temperature: ClassVar[bool] = True

    def __init__(self, temperature: Optional[TemperatureLike], *, reduction: str, validate: bool) -> None:
        super().__init__()
        if self._has_temperature:
            resolve_temperature(temperature)  # one clear error now rather than at the first call
            if isinstance(temperature, (nn.Module, nn.Parameter)):
                self.temperature = temperature  # registered: in parameters(), trained with the owner
            elif isinstance(temperature, Tensor):
                self.register_buffer("temperature", temperature, persistent=False)
            else:
                self.temperature = float(temperature)  # type: ignore[arg-type]
        self.reduction = reduction
        self.validate = validate

    def _options(self, reduction: Optional[str]) -> Dict[str, Any]:
        options: Dict[str, Any] = {"reduction": _given(reduction, self.reduction), "validate": self.validate}
        if self._has_temperature:
            options["temperature"] = self.temperature
        return options

    def extra_repr(self) -> str:
        parts = []
        if self._has_temperature and isinstance(self.temperature, float):
            parts.append(f"temperature={self.temperature:g}")
        elif self._has_temperature and not isinstance(self.temperature, nn.Module):
            tau = self.temperature.detach()
            parts.append(f"temperature={float(tau):g}" if tau.numel() == 1
                         else f"temperature=<one per anchor, {tau.shape[0]} rows>")
        return ", ".join(parts + _changed_options(self))


def _changed_options(module: nn.Module) -> List[str]:
    """``name=value`` for each keyword-only constructor option of ``module`` (kept as an
    attribute of that name) that differs from its default, for ``extra_repr``."""
    parts = []
    for name, parameter in inspect.signature(type(module).__init__).parameters.items():
        value = getattr(module, name, parameter.default)
        same = value is parameter.default or (not isinstance(value, Tensor) and value == parameter.default)
        if parameter.kind is parameter.KEYWORD_ONLY and not same:
            parts.append(f"{name}={value!r}")
    return parts


class _EmbeddingLoss(_LossModule):
    """A loss on ``(N, d)`` embeddings: adds ``normalize`` and ``chunk_size``."""

    def __init__(self, temperature: TemperatureLike, *, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, validate=validate)
        self.normalize = normalize
        self.chunk_size = chunk_size

    def _options(self, reduction: Optional[str]) -> Dict[str, Any]:
        return {**super()._options(reduction), "normalize": self.normalize, "chunk_size": self.chunk_size}


class _ShardedLoss(_EmbeddingLoss):
    """A loss with in-batch negatives that takes every rank's (``distributed=``): adds
    ``distributed`` and ``distributed_mode``, which a call may override."""

    def __init__(self, temperature: TemperatureLike, *, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         validate=validate)
        self.distributed = distributed
        self.distributed_mode = distributed_mode

    def _options(self, reduction: Optional[str], distributed: DistributedArg = None,  # type: ignore[override]
                 distributed_mode: Optional[str] = None) -> Dict[str, Any]:
        return {**super()._options(reduction), "distributed": _given(distributed, self.distributed),
                "distributed_mode": _given(distributed_mode, self.distributed_mode)}


@_twin_of(contrastive_loss)
class ContrastiveLoss(_LossModule):
    """Temperature-scaled log-softmax loss on a similarity matrix (module form of
    :func:`~contrastkit.losses.contrastive_loss`).

    Call with ``similarities`` ``(N, K)`` (row ``i`` anchor ``i``, column ``j`` candidate ``j``)
    and ``positives``: an ``(N,)`` index of each anchor's positive or a boolean ``(N, K)`` mask
    of positives; returns the loss (``(N,)`` with ``reduction="none"``). ``denominator_mask``
    ``(N, K)``, if given, is the same for every call.

    Example:
        >>> loss_fn = ContrastiveLoss(temperature=0.5)
        >>> round(float(loss_fn(torch.tensor([[1.0, 0.5, 0.0]]), torch.tensor([0]))), 6)
        0.407606
    """

    def __init__(self, temperature: TemperatureLike, *, denominator_mask: Optional[Tensor] = None,
                 multi_positive: str = "out", reduction: str = "mean", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, validate=validate)
        self.denominator_mask = denominator_mask
        self.multi_positive = multi_positive

    def forward(self, similarities: Tensor, positives: Tensor, *, reduction: Optional[str] = None) -> Tensor:
        return contrastive_loss(similarities, positives, denominator_mask=self.denominator_mask,
                                multi_positive=self.multi_positive, **self._options(reduction))


@_twin_of(F.similarity_loss)
class SimilarityLoss(_LossModule):
    """InfoNCE on a precomputed similarity matrix (module form of
    :func:`~contrastkit.losses.similarity_loss`).

    Call with ``similarities`` ``(N, K)`` and ``positive_index`` ``(N,)``, the column of each
    anchor's positive; ``exclude_diagonal`` (required) says whether the matrix is a
    self-similarity matrix whose diagonal leaves the denominator.

    Example:
        >>> loss_fn = SimilarityLoss(0.5, exclude_diagonal=False)
        >>> round(float(loss_fn(torch.tensor([[1.0, 0.5, 0.0]]), torch.tensor([0]))), 6)
        0.407606
    """

    def __init__(self, temperature: TemperatureLike, *, exclude_diagonal: bool, reduction: str = "mean",
                 validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, validate=validate)
        self.exclude_diagonal = exclude_diagonal

    def forward(self, similarities: Tensor, positive_index: Tensor, *, reduction: Optional[str] = None) -> Tensor:
        return F.similarity_loss(similarities, positive_index, exclude_diagonal=self.exclude_diagonal,
                                 **self._options(reduction))


@_twin_of(F.info_nce, _DISTRIBUTED_OVERRIDES)
class InfoNCE(_ShardedLoss):
    """Candidate-choice InfoNCE: each query picks its positive among candidates (module form
    of :func:`~contrastkit.losses.info_nce`).

    Call with ``query`` ``(N, d)``, ``positive`` ``(N, d)`` (row ``i`` the positive of query
    ``i``) and optionally ``negatives``: ``None`` for in-batch negatives, ``(M, d)`` (a bank,
    ``negative_mode="unpaired"``) or ``(N, M, d)`` (``negative_mode="paired"``); returns the loss
    (``(N,)`` with ``reduction="none"``).

    Example:
        >>> loss_fn = InfoNCE(temperature=1.0)
        >>> q = torch.tensor([[1.0, 0.0]]); n = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
        >>> round(float(loss_fn(q, q.clone(), n)), 6)
        0.407606
    """

    def __init__(self, temperature: TemperatureLike, *, negative_mode: str = "unpaired", reduction: str = "mean",
                 normalize: bool = True, chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.negative_mode = negative_mode

    def forward(self, query: Tensor, positive: Tensor, negatives: Optional[Tensor] = None, *,
                reduction: Optional[str] = None, distributed: DistributedArg = None,
                distributed_mode: Optional[str] = None) -> Tensor:
        return F.info_nce(query, positive, negatives, negative_mode=self.negative_mode,
                          **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.nt_xent)
class NTXent(_EmbeddingLoss):
    """Pairwise NT-Xent with any positive map (module form of :func:`~contrastkit.losses.nt_xent`).

    Call with ``z`` ``(N, d)`` (every row an anchor and a candidate for the others) and
    ``positive_index`` ``(N,)``, with ``p(i) != i`` and ``p(p(i)) = i``; returns the loss
    (``(N,)`` with ``reduction="none"``).

    Example:
        >>> loss_fn = NTXent(temperature=1.0, reduction="none")
        >>> z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
        >>> loss_fn(z, torch.tensor([1, 0, 3, 2]))
        tensor([0.8189, 1.0960, 0.8189, 1.0960])
    """

    def __init__(self, temperature: TemperatureLike, *, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         validate=validate)

    def forward(self, z: Tensor, positive_index: Tensor, *, reduction: Optional[str] = None) -> Tensor:
        return F.nt_xent(z, positive_index, **self._options(reduction))


@_twin_of(F.nt_xent_views, _DISTRIBUTED_OVERRIDES)
class NTXentViews(_ShardedLoss):
    """SimCLR's NT-Xent on two views (module form of :func:`~contrastkit.losses.nt_xent_views`).

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views whose rows ``i`` form a positive pair;
    returns the loss over the ``2N`` anchors (``(2N,)`` with ``reduction="none"``: ``z_a``'s
    anchors first).

    Example:
        >>> loss_fn = NTXentViews(temperature=0.5)
        >>> z = torch.ones(3, 4)
        >>> round(float(loss_fn(z, z)), 6) == round(math.log(5), 6)
        True
    """

    def __init__(self, temperature: TemperatureLike, *, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.nt_xent_views(z_a, z_b, **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.bidirectional_info_nce, _DISTRIBUTED_OVERRIDES)
class BidirectionalInfoNCE(_ShardedLoss):
    """ConVIRT / CLIP loss, InfoNCE in both directions (module form of
    :func:`~contrastkit.losses.bidirectional_info_nce`).

    Call with ``v`` and ``u``, ``(N, d)`` paired modalities (images, texts) whose rows ``i``
    form pair ``i``; returns the loss (``(N,)`` with ``reduction="none"``). ``weight`` is the
    share of the ``v -> u`` direction (0.75 ConVIRT, 0.5 CLIP).

    Example:
        >>> loss_fn = BidirectionalInfoNCE(1.0, weight=0.75)
        >>> round(float(loss_fn(torch.eye(3), torch.eye(3))), 6)
        0.551445
    """

    def __init__(self, temperature: TemperatureLike, *, weight: float = 0.5, reduction: str = "mean",
                 normalize: bool = True, chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.weight = weight

    def forward(self, v: Tensor, u: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.bidirectional_info_nce(v, u, weight=self.weight,
                                        **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.supcon, _DISTRIBUTED_OVERRIDES)
class SupCon(_ShardedLoss):
    """Supervised contrastive loss of Khosla et al. (2020) (module form of
    :func:`~contrastkit.losses.supcon`).

    Call with ``z`` ``(N, d)``, or ``(N, V, d)`` with ``V`` views per sample, and integer
    ``labels`` ``(N,)``: rows with equal labels are positives. ``variant`` is ``"out"``
    (L_out, the default) or ``"in"`` (L_in).

    Example:
        >>> loss_fn = SupCon(temperature=1.0)
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(loss_fn(z, torch.tensor([0, 0, 1, 1]))), 6)
        0.551445
    """

    def __init__(self, temperature: TemperatureLike, *, variant: str = "out", reduction: str = "mean",
                 normalize: bool = True, chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.variant = variant

    def forward(self, z: Tensor, labels: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.supcon(z, labels, variant=self.variant, **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.dcl, _DISTRIBUTED_OVERRIDES)
class DCL(_ShardedLoss):
    """Decoupled contrastive loss of Yeh et al. (2022): NT-Xent without the positive in the
    denominator (module form of :func:`~contrastkit.losses.dcl`).

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views with paired rows, ``N >= 2``; returns the
    loss over the ``2N`` anchors (``(2N,)`` with ``reduction="none"``), which can be negative.

    Example:
        >>> loss_fn = DCL(temperature=1.0)
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> round(float(loss_fn(z, z.clone())), 6)
        -0.306853
    """

    def __init__(self, temperature: TemperatureLike, *, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.dcl(z_a, z_b, **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.simple_loss, _DISTRIBUTED_OVERRIDES)
class SimpleLoss(_ShardedLoss):
    """Wang & Liu's (CVPR 2021) "simple" loss, the temperature-free limit of NT-Xent (module
    form of :func:`~contrastkit.losses.simple_loss`). It has no temperature.

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views with paired rows, ``N >= 2``; returns the
    loss over the ``2N`` anchors (``(2N,)`` with ``reduction="none"``).

    Example:
        >>> loss_fn = SimpleLoss(negative_weight=1.0)
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(loss_fn(z, z.clone()))
        -1.0
    """

    _has_temperature = False

    def __init__(self, *, negative_weight: float = 1.0, reduction: str = "mean", normalize: bool = True,
                 chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(None, reduction=reduction, normalize=normalize,  # type: ignore[arg-type]
                         chunk_size=chunk_size, distributed=distributed, distributed_mode=distributed_mode,
                         validate=validate)
        self.negative_weight = negative_weight

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.simple_loss(z_a, z_b, negative_weight=self.negative_weight,
                             **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.hard_negative_nt_xent, _DISTRIBUTED_OVERRIDES)
class HardNegativeNTXent(_ShardedLoss):
    """NT-Xent over each anchor's hardest negatives only (module form of
    :func:`~contrastkit.losses.hard_negative_nt_xent`).

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views with paired rows; returns the loss over the
    ``2N`` anchors (``(2N,)`` with ``reduction="none"``). Exactly one of ``top_k`` and
    ``quantile`` must be given.

    Example:
        >>> loss_fn = HardNegativeNTXent(1.0, top_k=1)
        >>> round(float(loss_fn(torch.eye(4), torch.eye(4))), 6)
        0.313262
    """

    def __init__(self, temperature: TemperatureLike, *, top_k: Optional[int] = None, quantile: Optional[float] = None,
                 reduction: str = "mean", normalize: bool = True, chunk_size: Optional[int] = None,
                 distributed: DistributedArg = False, distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.top_k = top_k
        self.quantile = quantile

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.hard_negative_nt_xent(z_a, z_b, top_k=self.top_k, quantile=self.quantile,
                                       **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.debiased_nt_xent, _DISTRIBUTED_OVERRIDES)
class DebiasedNTXent(_ShardedLoss):
    """Debiased contrastive loss of Chuang et al. (NeurIPS 2020) (module form of
    :func:`~contrastkit.losses.debiased_nt_xent`).

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views with paired rows, ``N >= 2``; returns the
    loss over the ``2N`` anchors (``(2N,)`` with ``reduction="none"``). ``tau_plus`` is the
    class prior in ``[0, 1)``.

    Example:
        >>> loss_fn = DebiasedNTXent(0.5, tau_plus=0.0)
        >>> z = torch.eye(4)
        >>> bool(torch.isclose(loss_fn(z, z), NTXentViews(0.5)(z, z)))
        True
    """

    def __init__(self, temperature: TemperatureLike, *, tau_plus: float = 0.1, reduction: str = "mean",
                 normalize: bool = True, chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.tau_plus = tau_plus

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.debiased_nt_xent(z_a, z_b, tau_plus=self.tau_plus,
                                  **self._options(reduction, distributed, distributed_mode))


@_twin_of(F.hcl, _DISTRIBUTED_OVERRIDES)
class HCL(_ShardedLoss):
    """Hard-negative contrastive loss of Robinson et al. (ICLR 2021) (module form of
    :func:`~contrastkit.losses.hcl`).

    Call with ``z_a`` and ``z_b``, ``(N, d)`` views with paired rows, ``N >= 2``; returns the
    loss over the ``2N`` anchors (``(2N,)`` with ``reduction="none"``). ``tau_plus`` is the
    class prior in ``[0, 1)``, ``beta >= 0`` the concentration on hard negatives.

    Example:
        >>> loss_fn = HCL(0.5, beta=0.0)
        >>> z = torch.eye(4)
        >>> bool(torch.isclose(loss_fn(z, z), DebiasedNTXent(0.5)(z, z)))
        True
    """

    def __init__(self, temperature: TemperatureLike, *, tau_plus: float = 0.1, beta: float = 1.0,
                 reduction: str = "mean", normalize: bool = True, chunk_size: Optional[int] = None,
                 distributed: DistributedArg = False, distributed_mode: str = "global", validate: bool = True) -> None:
        super().__init__(temperature, reduction=reduction, normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode=distributed_mode, validate=validate)
        self.tau_plus = tau_plus
        self.beta = beta

    def forward(self, z_a: Tensor, z_b: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None, distributed_mode: Optional[str] = None) -> Tensor:
        return F.hcl(z_a, z_b, tau_plus=self.tau_plus, beta=self.beta,
                     **self._options(reduction, distributed, distributed_mode))
