"""Input validation for the losses and for every layer that takes the same kinds of input.

Every check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong
value or shape) and names the argument, so a user never has to debug a silent NaN. The
metrics, the ConVIRT trainer and the explanation tools use these same checks, so an argument
is refused with the same words wherever it is given.

* Tensors: :func:`check_embeddings`, :func:`check_same`, :func:`check_pair`,
  :func:`check_index`, :func:`check_positive_map`, :func:`check_labels`.
* Numbers: :func:`resolve_temperature` (a scalar ``tau`` or one per anchor row),
  :func:`check_probability`,
  :func:`check_nonnegative`, :func:`optional_int`, :func:`check_reduction`.
* Preparation: :func:`compute_dtype`, :func:`prepare` (upcast, L2-normalise).
* :func:`warn_few_rows`: the warning for a batch too small to have negatives.
* ``require`` and :func:`value_checks`: the checks that need the values of a tensor
  (finite entries, zero-norm rows, index ranges). On the CPU they raise the detailed error at
  once; on an accelerator they are queued on the device with ``torch._assert_async`` (the
  kernel fails with the short message), so a loss call never waits for the device. Inside
  ``value_checks(False)`` (a loss's ``validate=False``) they are skipped.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Optional, Tuple, Union

import torch
from torch import Tensor

TemperatureLike = Union[float, int, Tensor, torch.nn.Module]

__all__ = [
    "TemperatureLike", "REDUCTIONS", "check_choice", "check_scalar", "check_embeddings", "check_same", "check_pair", "check_reduction",
    "resolve_temperature", "compute_dtype", "prepare", "check_index", "check_positive_map", "check_labels",
    "check_probability", "check_nonnegative", "optional_int", "warn_few_rows", "require", "value_checks",
    "reads_are_free", "per_anchor",
]

#: The values of every loss's ``reduction`` argument.
REDUCTIONS = ("mean", "sum", "none")

_CHECK_VALUES: ContextVar[bool] = ContextVar("contrastkit_check_values", default=True)


@contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """Turn the value checks (``require``) on or off inside the block (they are on by
    default); a loss's ``validate=False`` runs its call inside ``value_checks(False)``."""
    if not isinstance(enabled, bool):
        raise TypeError(f"validate must be True or False, got {type(enabled).__name__}")
    token = _CHECK_VALUES.set(enabled)
    try:
        yield
    finally:
        _CHECK_VALUES.reset(token)


def reads_are_free(x: Tensor) -> bool:
    """Whether reading ``x``'s value from Python costs nothing: a CPU tensor (no device to
    wait for). The checks and kernels that read values on the CPU only (for detailed errors,
    or to take a faster exact branch) ask this, so there is one place that decides."""
    return x.device.type == "cpu"


def require(condition: Tensor, message: str, detail: Optional[Callable[[], str]] = None) -> None:
    """Raise ``ValueError`` unless the boolean 0-dim tensor ``condition`` is true.

    On the CPU the check is immediate and the error says ``detail()`` (which may read tensor
    values) or ``message``. On any other device it is ``torch._assert_async(condition,
    message)``: no host synchronisation, and a failure surfaces as a device-side assertion at
    the next synchronising operation. Skipped inside ``value_checks(False)``.
    """
    if not _CHECK_VALUES.get():
        return
    if reads_are_free(condition):
        if not bool(condition):
            raise ValueError(detail() if detail is not None else message)
        return
    torch._assert_async(condition, message)


def check_embeddings(x: object, name: str, *, ndim: int = 2, allow_empty: bool = False) -> Tensor:
    """Check that ``x`` is a finite floating tensor with ``ndim`` dimensions and rows."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if not allow_empty and x.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): a loss needs at least one row")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has a zero-sized feature dimension (shape {tuple(x.shape)})")
    require(torch.isfinite(x).all(), f"{name} contains NaN or infinite value(s)",
            lambda: f"{name} contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    return x


def check_same(reference: Tensor, ref_name: str, other: Tensor, name: str, *, dims: tuple = ()) -> None:
    """Check that ``other`` matches ``reference`` in dtype, device and the listed dimensions."""
    if other.dtype != reference.dtype:
        raise TypeError(f"{name} has dtype {other.dtype} but {ref_name} has dtype {reference.dtype}")
    if other.device != reference.device:
        raise ValueError(f"{name} is on {other.device} but {ref_name} is on {reference.device}")
    for dim_other, dim_ref in dims:
        if other.shape[dim_other] != reference.shape[dim_ref]:
            raise ValueError(
                f"{name} has shape {tuple(other.shape)}, incompatible with {ref_name} of shape "
                f"{tuple(reference.shape)} (dimension {dim_other} of {name} must equal dimension "
                f"{dim_ref} of {ref_name})"
            )


def check_pair(a: object, b: object, names: Tuple[str, str] = ("z_a", "z_b")) -> None:
    """Check two ``(N, d)`` embedding batches that are paired row by row."""
    check_embeddings(a, names[0])
    check_embeddings(b, names[1])
    check_same(a, names[0], b, names[1], dims=((0, 0), (1, 1)))


def check_choice(value: object, name: str, choices: Tuple[str, ...]) -> None:
    """Check that ``value`` is one of ``choices``: "``name`` must be 'a' or 'b', got ..."."""
    if value not in choices:
        raise ValueError(f"{name} must be {' or '.join(repr(choice) for choice in choices)}, got {value!r}")


def check_reduction(reduction: str) -> str:
    """Check a ``reduction`` argument (one of :data:`REDUCTIONS`)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_scalar(value: object, name: str, *, positive: bool = False,
                 floating: bool = False) -> Union[float, Tensor]:
    """Return ``value`` as a finite float or a 0-dim tensor (keeping its gradient); with
    ``positive`` it must be > 0, with ``floating`` a tensor must have a floating dtype."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or a scalar tensor, got bool")
    if isinstance(value, Tensor):
        if floating and not value.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {value.dtype}")
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.reshape(())
        # Checked where the value lives: on an accelerator, reading it would wait for it.
        detached = value.detach()
        ok = torch.isfinite(detached) & (detached > 0) if positive else torch.isfinite(detached)
        wanted = f"{name} must be {'positive and ' if positive else ''}finite"
        require(ok, wanted, lambda: f"{wanted}, got {float(detached)}")
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        value = number
    else:
        raise TypeError(f"{name} must be a number or a scalar tensor, got {type(value).__name__}")
    if not math.isfinite(number) or (positive and number <= 0):
        raise ValueError(f"{name} must be {'positive and ' if positive else ''}finite, got {number}")
    return value


def per_anchor(tau: object) -> bool:
    """Whether ``tau`` (as :func:`resolve_temperature` returns it) holds one temperature per
    anchor row, a ``(A,)`` tensor, rather than one for all."""
    return isinstance(tau, Tensor) and tau.dim() == 1


def resolve_temperature(temperature: TemperatureLike, *, name: str = "temperature",
                        anchors: Optional[int] = None, device: Optional[torch.device] = None) -> Union[float, Tensor]:
    """Return the temperature as a positive finite float, a 0-dim tensor, or a ``(A,)``
    tensor with one temperature per anchor row.

    A ``torch.nn.Module`` (such as :class:`contrastkit.losses.Temperature`) is called to get
    its current value, so learnable temperatures pass straight through with their gradient.
    A tensor of more than one element must be one-dimensional and floating, every entry
    positive and finite; with ``anchors`` given its length must be ``anchors`` (each loss
    says which rows are its anchors) and with ``device`` it must live there (the device of
    the embeddings). A one-element tensor is a scalar ``tau``.
    """
    if isinstance(temperature, torch.nn.Module):
        temperature = temperature()
    if not isinstance(temperature, Tensor) or temperature.numel() == 1:
        return check_scalar(temperature, name, positive=True)
    if not temperature.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {temperature.dtype}")
    if temperature.dim() != 1:
        raise ValueError(f"{name} must be a number, a scalar tensor or one value per anchor row (A,), "
                         f"got a tensor of shape {tuple(temperature.shape)}")
    if anchors is not None and temperature.shape[0] != anchors:
        raise ValueError(f"{name} has {temperature.shape[0]} values but the loss has {anchors} anchor rows: "
                         f"give one temperature per anchor row, shape ({anchors},)")
    if device is not None and temperature.device != torch.device(device):
        raise ValueError(f"{name} is on {temperature.device} but the embeddings are on {device}")
    detached = temperature.detach()
    ok = (torch.isfinite(detached) & (detached > 0)).all()
    require(ok, f"{name} must be positive and finite in every entry",
            lambda: f"{name} must be positive and finite in every entry, got "
                    f"{detached[~(torch.isfinite(detached) & (detached > 0))][:5].tolist()}")
    return temperature


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in float32; float32 and float64 stay as they are."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def prepare(x: Tensor, normalize: bool, name: str, *, divisor: Union[float, Tensor, None] = None) -> Tensor:
    """Cast to the compute dtype and, if asked, L2-normalise the last dimension; with
    ``divisor`` (a float, a 0-dim tensor, e.g. a temperature, or ``(N,)``, one per row) also
    divide by it, in the same pass (one ``(N, d)`` result, not two: the tiled losses' memory
    is a few such buffers).

    Zero-norm rows raise instead of being silently mapped to zero (``F.normalize`` would
    clamp the norm and hide the problem).
    """
    x = x.to(compute_dtype(x.dtype))
    if isinstance(divisor, Tensor):
        divisor = divisor.to(x.dtype)
        if divisor.dim() == 1:  # one per row
            divisor = divisor[:, None]
    if not normalize:
        return x if divisor is None else x / divisor
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)

    def detail() -> str:
        zero = norms == 0
        rows = torch.nonzero(zero.reshape(zero.shape[:-1]), as_tuple=False)[:5].tolist()
        return (f"{name} has {int(zero.sum())} zero-norm row(s) (first at {rows}); they cannot be "
                "L2-normalised. Remove them or pass normalize=False")

    require((norms != 0).all(), f"{name} has zero-norm row(s); they cannot be L2-normalised", detail)
    return x / (norms if divisor is None else norms * divisor)


def check_index(index: object, name: str, *, length: int, upper: int, device: torch.device) -> Tensor:
    """Check an integer index vector of the given length with values in [0, upper)."""
    if not isinstance(index, Tensor):
        try:
            index = torch.as_tensor(index)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be an integer tensor or sequence: {err}") from None
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise TypeError(f"{name} must have an integer dtype, got {index.dtype}")
    if index.dim() != 1 or index.shape[0] != length:
        raise ValueError(f"{name} must have shape ({length},), got {tuple(index.shape)}")
    index = index.to(device=device, dtype=torch.long)
    if length:
        outside = (index < 0) | (index >= upper)
        require(~outside.any(), f"{name} has values out of range [0, {upper})",
                lambda: f"{name} has values out of range [0, {upper}): {index[outside][:5].tolist()}")
    return index


def check_positive_map(positive_index: object, n: int, device: torch.device) -> Tensor:
    """Check a positive map of ``n`` rows: ``p(i) != i`` and ``p(p(i)) = i`` (the textbook,
    section 30.2); returns it as a long tensor on ``device``."""
    index = check_index(positive_index, "positive_index", length=n, upper=n, device=device)
    if not _CHECK_VALUES.get():
        return index
    rows = torch.arange(n, device=device)
    itself = index == rows
    require(~itself.any(), "positive_index maps a row to itself; p(i) != i is required",
            lambda: f"positive_index maps rows {rows[itself][:5].tolist()} to themselves; p(i) != i is required")
    # An index out of range has already failed above (on the CPU) or is clamped here so that
    # the device-side check below cannot itself index out of bounds.
    unpaired = index[index.clamp(0, max(n - 1, 0))] != rows
    require(~unpaired.any(), "positive_index is not symmetric: p(p(i)) != i for some row",
            lambda: (f"positive_index is not symmetric: p(p(i)) != i for rows {rows[unpaired][:5].tolist()}; "
                     "every row needs exactly one partner that points back"))
    return index


def check_labels(labels: object, n: int, device: torch.device) -> Tensor:
    """Check ``(n,)`` integer class labels; returns them as a tensor on ``device``."""
    if not isinstance(labels, Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"labels must be an integer tensor or sequence: {err}") from None
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    return labels.to(device)


def check_probability(value: float, name: str, *, low: float = 0.0, high: float = 1.0,
                      open_high: bool = False) -> float:
    """Check a number in ``[low, high]`` (``[low, high)`` with ``open_high``); returns a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    ok = math.isfinite(value) and low <= value and (value < high if open_high else value <= high)
    if not ok:
        interval = f"[{low}, {high})" if open_high else f"[{low}, {high}]"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value


def check_nonnegative(value: float, name: str) -> float:
    """Check a finite number ``>= 0`` (a weight, a concentration); returns a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def optional_int(value: Optional[int], name: str, *, minimum: int) -> Optional[int]:
    """Check ``None`` or an int ``>= minimum`` (a tile size, a top-k)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def warn_few_rows(rows: int, negatives: int) -> None:
    """Warn that a batch of ``rows`` rows leaves each anchor ``negatives`` (< 2) negatives.

    A loss whose anchors have no negative is always 0: its value and gradient say nothing
    about the representation (the textbook, section 30.2: "N = 2 has no negatives").
    """
    warnings.warn(
        f"only {rows} rows: each anchor has at most {max(negatives, 0)} negative(s), so the "
        "loss is degenerate (with no negative it is always 0); use N >= 4",
        UserWarning,
        stacklevel=5,  # the user's call of the loss (loss -> contrast -> sizes -> here)
    )
