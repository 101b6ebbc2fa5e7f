"""A temperature method with its settings, as a run is configured with one
(``--temperature-method NAME[:VALUES]``, ``PretrainConfig.temperature_method``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .registry import SCHEDULE_KINDS, TEMPERATURE_METHOD_REGISTRY, TemperatureMethodSpec, temperature_method_names

__all__ = ["TemperatureMethod", "parse_temperature_method", "temperature_method_of"]

class TemperatureMethod:
    """A registered temperature method and its settings: :meth:`build` makes its loss (an
    :class:`~contrastkit.losses.AdaptiveTemperatureLoss`), which computes the two-view loss with
    its own temperatures.

    Args:
        spec: the method's record (:class:`~contrastkit.temperature_methods.TemperatureMethodSpec`).
        settings: values of its ``options`` (the rest take their loss's defaults).

    ``kind`` is its name, ``settings`` every option's value, ``initial`` the temperature it
    starts from (what a run reports before its first step) and :attr:`needs_indices` whether its
    loss keeps per-sample state (its steps then need the batch's sample indices).
    """

    def __init__(self, spec: TemperatureMethodSpec, **settings: float) -> None:
        self.spec = spec
        self.kind = spec.name
        given = {**spec.defaults, **settings}
        self.settings: Dict[str, float] = {name: float(given[name]) for name in spec.options}
        # The settings are checked once, here, by the loss itself.
        self.initial = float(self.build(0, 1).initial_value)

    @property
    def needs_indices(self) -> bool:
        """Whether its loss keeps one state per training sample."""
        return self.spec.keeps_sample_state

    @property
    def lowest(self) -> float:
        """The smallest temperature its settings name (``tau_min`` where it has one)."""
        return min(self.initial, self.settings.get("tau_min", self.initial))

    def build(self, num_samples: int, dim: int) -> Any:
        """Its loss for a training set of ``num_samples`` and embeddings of ``dim``."""
        return self.spec.build(self.settings, num_samples, dim)

    def config(self) -> Dict[str, Any]:
        """Its name and settings, JSON-serialisable."""
        return {"kind": self.kind, **self.settings}

    def __repr__(self) -> str:
        return f"TemperatureMethod({self.kind!r}, {', '.join(f'{k}={v!r}' for k, v in self.settings.items())})"


def temperature_method_of(form: Optional[str]) -> Optional[TemperatureMethodSpec]:
    """The record of the temperature method that ``form`` names (``"macl:0.2"`` -> MACL's), or
    ``None`` (a schedule of one ``tau``, or no form)."""
    if not isinstance(form, str):
        return None
    kind = form.strip().partition(":")[0].strip().lower()
    return None if kind in SCHEDULE_KINDS else TEMPERATURE_METHOD_REGISTRY.get(kind)


def parse_temperature_method(form: str) -> TemperatureMethod:
    """A temperature method from its command-line form ``NAME[:VALUES]`` (its record's
    :attr:`~contrastkit.temperature_methods.TemperatureMethodSpec.form`; the values not given
    take its loss's defaults), e.g. ``parse_temperature_method("macl:0.2")``."""
    names = ", ".join(temperature_method_names())
    if not isinstance(form, str) or not form.strip():
        raise ValueError(f"temperature method must be one of {names}, got {form!r}")
    form = form.strip()
    kind, _, rest = form.partition(":")
    kind = kind.strip().lower()
    method = temperature_method_of(form)
    if method is None:
        if kind in SCHEDULE_KINDS:
            raise ValueError(f"{form!r} is a schedule of tau (--temperature-schedule), not a temperature method; "
                             f"choose one of {names}")
        raise ValueError(f"unknown temperature method {kind!r}; choose one of {names}")
    try:
        values = [float(v) for v in rest.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"temperature method {form!r}: expected numbers, as in {method.form}") from None
    try:
        return TemperatureMethod(method, **method.settings(values))
    except (TypeError, ValueError) as err:
        raise ValueError(f"temperature method {form!r}: {err}") from None
