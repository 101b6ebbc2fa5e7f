"""The temperature methods by name: a :class:`TemperatureMethodSpec` says everything about one.

A temperature method replaces NT-Xent on SimCLR's two views by a loss that decides its own
temperatures (:class:`~contrastkit.losses.AdaptiveTemperatureLoss`). Each method is one file
that registers one record (:func:`register_temperature_method`); everything else that names
the methods (the ``--temperature-method`` parser and help, the ``temperature-methods`` study,
``contrastkit explain --methods``, the explorer) reads this registry::

    register_temperature_method(TemperatureMethodSpec(
        name="mine", loss=MyTemperatureLoss, title="my method", citation="Me et al., 2026",
        summary="what it does to one anchor, in one line", options=("temperature",),
        explain=explain_at_setting("temperature")))

Written once, in the record or its loss: the defaults (the loss's signature,
:attr:`TemperatureMethodSpec.defaults`), the form (:attr:`~TemperatureMethodSpec.form`, from
``options`` and ``counts``), the builder (:meth:`~TemperatureMethodSpec.build`: the loss with
``num_samples`` and ``dim`` where its signature asks for them), the per-sample state (the
loss's ``needs_indices``), the explanation (``summary`` and ``explain``, what the method does to
rows of similarities, :func:`contrastkit.analysis.explain_methods`) and the study's claim.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["TemperatureMethodSpec", "TEMPERATURE_METHOD_REGISTRY", "register_temperature_method",
           "unregister_temperature_method", "get_temperature_method", "temperature_method_names",
           "explain_at_setting", "MethodRows", "registering_modules", "SCHEDULE_KINDS"]

#: The kinds of the schedules of one tau (:data:`contrastkit.temperature.SCHEDULES` is this
#: tuple): no temperature method may take one of these names.
SCHEDULE_KINDS = ("constant", "cosine", "kukleva", "linear", "step", "learnable")

class MethodRows:
    """What an ``explain`` function of a record may ask of the rows it explains (implemented by
    :mod:`contrastkit.analysis.methods`): ``n`` anchors, their similarities ``(n, K)`` float64
    and ``positive`` ``(n,)`` column indices."""

    n: int

    @property
    def alignment(self) -> float:
        """The mean similarity of the rows' positives (MACL's ``A``)."""
        raise NotImplementedError

    def softmax(self, tau: Any) -> Any:
        """The rows' :class:`~contrastkit.analysis.Explanation` at ``tau`` (a number or ``(n,)``)."""
        raise NotImplementedError

    def negative_mass(self, explanation: Any) -> np.ndarray:
        """``(n,)`` ``1 - P_i``, the probability of each row's negatives (without cancellation)."""
        raise NotImplementedError

    def robust_temperature(self, rho: float, tau_min: float, tau_max: float) -> np.ndarray:
        """``(n,)`` the temperature that minimises iSogCLR's robust objective for each row."""
        raise NotImplementedError


#: ``explain(rows, settings) -> (temperatures (n,), weights (n,), gradients (n, K))``: each
#: anchor's temperature, the factor on its gradient, and its loss's gradient w.r.t. its similarities.
ExplainFunction = Callable[[MethodRows, Mapping[str, float]], Tuple[np.ndarray, np.ndarray, np.ndarray]]


def explain_at_setting(option: str) -> ExplainFunction:
    """An ``explain`` for a method whose rows see InfoNCE at the temperature its setting
    ``option`` holds (weight 1)."""

    def explain(rows: MethodRows, settings: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        taus = np.full(rows.n, float(settings[option]))
        return taus, np.ones(rows.n), rows.softmax(taus).gradients

    return explain


@dataclass(frozen=True)
class TemperatureMethodSpec:
    """One temperature method.

    Attributes:
        name: its name and the head of its ``--temperature-method`` form (lower case).
        loss: its loss, an :class:`~contrastkit.losses.AdaptiveTemperatureLoss` subclass; the
            defaults of ``options`` are its constructor's.
        title: its name in prose (``"MACL"``, ``"iSogCLR"``).
        citation: its paper (``"Huang et al., ICML 2023"``).
        summary: what it does, in one line (``explain --methods``).
        options: the values its form may give, in order (names of the loss's arguments).
        counts: how many of ``options`` a form may give (default: any number from none to all).
        explain: what it does to rows of similarities, ``explain(rows, settings) ->
            (temperatures (n,), weights (n,), gradients (n, K))`` (:class:`MethodRows`); the first
            paragraph of its docstring is what ``explain --methods`` prints of its gradient.
        claim: the ``temperature-methods`` study's claim for it.
        label: how tables name it (default ``title``).
    """

    name: str
    loss: type
    title: str
    citation: str
    summary: str
    options: Tuple[str, ...]
    explain: ExplainFunction
    counts: Optional[Tuple[int, ...]] = None
    claim: str = ""
    label: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip().lower() \
                or ":" in self.name or "," in self.name:
            raise ValueError(f"a temperature method needs a lower-case name without ':' or ',', got {self.name!r}")
        parameters = inspect.signature(self.loss).parameters
        for option in self.options:
            if option not in parameters or parameters[option].default is inspect.Parameter.empty:
                raise ValueError(f"temperature method {self.name!r}: option {option!r} is not an argument with a "
                                 f"default of {self.loss.__name__}")
        counts = self.counts if self.counts is not None else tuple(range(len(self.options) + 1))
        if not counts or any(not 0 <= c <= len(self.options) for c in counts):
            raise ValueError(f"temperature method {self.name!r}: counts must lie in [0, {len(self.options)}]")
        object.__setattr__(self, "counts", tuple(sorted(set(counts))))
        if not self.label:
            object.__setattr__(self, "label", self.title)
        if not self.claim:
            object.__setattr__(self, "claim", f"{self.title} ({self.citation}) beats the best fixed tau")

    @property
    def defaults(self) -> Dict[str, float]:
        """Each option's default, read from the loss's signature."""
        parameters = inspect.signature(self.loss).parameters
        return {option: parameters[option].default for option in self.options}

    @property
    def keeps_sample_state(self) -> bool:
        """Whether its loss keeps one state per training sample (its steps need the batch's
        sample indices)."""
        return bool(getattr(self.loss, "needs_indices", False))

    @property
    def form(self) -> str:
        """Its ``--temperature-method`` forms, e.g. ``macl or macl:TEMPERATURE[,ALPHA[,THRESHOLD]]``."""
        given = [c for c in self.counts if c > 0]
        if not given:
            return self.name
        text, start, closing = "", 0, ""
        for k, count in enumerate(given):
            names = ",".join(option.upper() for option in self.options[start:count])
            text += names if k == 0 else f"[,{names}"
            closing += "" if k == 0 else "]"
            start = count
        return (f"{self.name} or " if 0 in self.counts else "") + f"{self.name}:{text}{closing}"

    def settings(self, values: Sequence[float]) -> Dict[str, float]:
        """The settings of a form that gives ``values`` (the first ``len(values)`` options,
        the rest their defaults); a count the form does not allow is a ``ValueError``."""
        if len(values) not in self.counts:
            raise ValueError(f"expected {self.form}")
        defaults = self.defaults
        return {option: float(values[k]) if k < len(values) else float(defaults[option])
                for k, option in enumerate(self.options)}

    def build(self, settings: Mapping[str, float], num_samples: int = 0, dim: int = 1) -> Any:
        """Its loss with ``settings``, for a training set of ``num_samples`` and embeddings of
        ``dim`` (passed where the loss's signature names them)."""
        parameters = inspect.signature(self.loss).parameters
        run = {name: value for name, value in (("num_samples", num_samples), ("dim", dim)) if name in parameters}
        return self.loss(**run, **dict(settings))


#: Every registered temperature method by name, in the order of registration.
TEMPERATURE_METHOD_REGISTRY: Dict[str, TemperatureMethodSpec] = {}
#: The module whose import registered each method (a new process imports it to know the method).
_REGISTERED_BY: Dict[str, str] = {}


def register_temperature_method(spec: TemperatureMethodSpec) -> TemperatureMethodSpec:
    """Register ``spec`` under its name (returned). A name registered twice is a ``ValueError``
    (one method owns each name)."""
    if not isinstance(spec, TemperatureMethodSpec):
        raise TypeError(f"register_temperature_method takes a TemperatureMethodSpec, got {type(spec).__name__}")
    if spec.name in SCHEDULE_KINDS:
        raise ValueError(f"{spec.name!r} names a temperature schedule; a temperature method needs another name")
    held = TEMPERATURE_METHOD_REGISTRY.get(spec.name)
    if held is not None and held != spec:
        raise ValueError(f"temperature method {spec.name!r} is already registered ({held.loss.__name__})")
    TEMPERATURE_METHOD_REGISTRY[spec.name] = spec
    _REGISTERED_BY[spec.name] = sys._getframe(1).f_globals.get("__name__", "")
    return spec


def unregister_temperature_method(name: str) -> None:
    """Remove the temperature method ``name`` (one a test or a plug-in registered for a while)."""
    TEMPERATURE_METHOD_REGISTRY.pop(name, None)
    _REGISTERED_BY.pop(name, None)


def registering_modules() -> Tuple[str, ...]:
    """The modules whose import registered the temperature methods (a plug-in's among them),
    for a process started afresh (a study's workers) to import: it then knows every method
    this one does. A script's own ``__main__`` is left out (a spawned process runs it as its
    main module already)."""
    return tuple(dict.fromkeys(module for module in _REGISTERED_BY.values() if module and module != "__main__"))


def temperature_method_names() -> Tuple[str, ...]:
    """The registered temperature methods' names, in the order of registration."""
    return tuple(TEMPERATURE_METHOD_REGISTRY)


def get_temperature_method(name: str) -> TemperatureMethodSpec:
    """The record of the temperature method ``name``; an unknown name is a ``ValueError`` listing them."""
    spec = TEMPERATURE_METHOD_REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown temperature method {name!r}; choose one of {', '.join(temperature_method_names())}")
    return spec
