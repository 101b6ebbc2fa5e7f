"""Temperature schedules: how ``tau`` changes over a training run.

A schedule is asked at every optimisation step ``step`` (``0 <= step < total_steps``)::

    schedule = parse_schedule("cosine:0.05,0.5", temperature=0.1)
    tau = schedule(step, total_steps)        # pass as ``temperature=`` to any loss
    log["tau"] = schedule.value(step, total_steps)

Kinds:

``constant``
    ``tau`` throughout.
``cosine`` (after Kukleva et al., ICLR 2023)
    ``tau = tau_min + 0.5 (tau_max - tau_min) (1 + cos(pi * e / T))``, starting at ``tau_max``.
    By default ``T`` spans the run (``e / T`` = progress), so ``tau`` falls once from
    ``tau_max`` to ``tau_min``; with ``period`` (in steps) it oscillates, ``T = period / 2``
    (lightly's ``cosine_schedule`` with a period).
``kukleva`` (Kukleva et al., ICLR 2023)
    "Temperature Schedules for Self-Supervised Contrastive Methods on Long-Tail Data": the
    paper's periodic schedule as its authors define it: the same cosine of the *epoch*
    ``e`` (0 for the first), ``tau`` constant within an epoch, ``T`` in epochs (their
    ``tau- = 0.1``, ``tau+ = 1.0``; their code's ``T = 200``), so ``tau`` falls from ``tau+``
    to ``tau-`` in ``T`` epochs and rises back in ``T`` more.
``linear``
    A ramp from ``start`` to ``end`` (``start < end`` raises ``tau`` during training, the
    suggestion of Wang & Liu, CVPR 2021, Understanding the Behaviour of Contrastive Loss).
``step``
    Piecewise constant: ``values[k]`` from the fraction ``milestones[k-1]`` of the steps on
    (equal segments by default).
``learnable``
    CLIP's parameterisation through :class:`contrastkit.losses.Temperature`; the schedule
    returns the module itself, whose parameter the trainer must give to its optimizer
    (:attr:`TemperatureSchedule.module`).

Temperature methods, whose loss decides its own temperatures, are not schedules: they are
:mod:`contrastkit.temperature_methods`, a run's own option (``--temperature-method``);
:func:`parse_schedule` refuses their forms, naming that option.

A trainer parses the schedule once and, at every step, calls :meth:`TemperatureSchedule.apply`
on its model's :class:`~contrastkit.losses.Temperature`: a varying schedule sets ``tau`` there
(:meth:`~contrastkit.losses.Temperature.set_`), a constant or learnable one leaves it alone.

"Progress" is ``step / (total_steps - 1)`` (0 at the first step, 1 at the last), so the
continuous schedules hit both endpoints exactly; ``step`` segments use ``step / total_steps``,
the fraction of the run already done, so that equal segments hold equal numbers of steps.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from contrastkit.losses import MIN_TEMPERATURE, Temperature
from contrastkit.temperature_methods import SCHEDULE_KINDS, temperature_method_of

__all__ = [
    "TemperatureSchedule",
    "ConstantSchedule",
    "CosineSchedule",
    "LinearSchedule",
    "StepSchedule",
    "LearnableSchedule",
    "KuklevaSchedule",
    "parse_schedule",
    "SCHEDULES",
]

#: The schedules of one ``tau``, by kind (the temperature methods are named by their registry,
#: :mod:`contrastkit.temperature_methods`).
SCHEDULES = SCHEDULE_KINDS


def _tau(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return value


def _check_step(step: object, total_steps: object) -> None:
    for name, v in (("step", step), ("total_steps", total_steps)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0 <= step < total_steps:
        raise ValueError(f"step must lie in [0, total_steps) = [0, {total_steps}), got {step}")


def _progress(step: int, total_steps: int) -> float:
    _check_step(step, total_steps)
    return step / (total_steps - 1) if total_steps > 1 else 0.0


class TemperatureSchedule:
    """Base class: ``schedule(step, total_steps)`` gives what a loss takes as ``temperature``.

    Subclasses implement :meth:`value`. ``module`` is ``None`` except for the learnable
    schedule.
    """

    kind = ""
    module: Optional[Temperature] = None
    varies = True  # tau is a function of the step, set on the model's Temperature by apply()

    def bind(self, *, epochs: int) -> "TemperatureSchedule":
        """Tell the schedule how many epochs the run has (a schedule that counts epochs needs
        it); returns ``self``."""
        return self

    @property
    def learnable(self) -> bool:
        return self.module is not None

    def value(self, step: int, total_steps: int) -> float:
        """``tau`` (a float) at ``step`` of ``total_steps`` (0-based)."""
        raise NotImplementedError

    @property
    def lowest(self) -> float:
        """The smallest ``tau`` the schedule can take (the initial one for ``learnable``)."""
        raise NotImplementedError

    def __call__(self, step: int, total_steps: int) -> Union[float, Temperature]:
        return self.value(step, total_steps)

    def apply(self, temperature: Temperature, step: int, total_steps: int) -> Optional[float]:
        """Set ``temperature`` to this step's ``tau`` and return it; ``None`` (nothing set)
        for a constant ``tau`` or a learnable one, which the optimizer changes."""
        if not self.varies:
            return None
        tau = self.value(step, total_steps)
        temperature.set_(tau)
        return tau

    def config(self) -> Dict[str, Any]:
        """The schedule's settings, JSON-serialisable."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items() if k != 'kind')})"


class ConstantSchedule(TemperatureSchedule):
    """``tau`` throughout the run."""

    kind = "constant"
    varies = False

    def __init__(self, tau: float) -> None:
        self.tau = _tau(tau, "tau")

    def value(self, step: int, total_steps: int) -> float:
        _check_step(step, total_steps)
        return self.tau

    @property
    def lowest(self) -> float:
        return self.tau

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "tau": self.tau}


class CosineSchedule(TemperatureSchedule):
    """Kukleva et al.'s cosine: from ``tau_max`` down to ``tau_min`` (and back, with ``period``).

    Args:
        tau_min, tau_max: ``0 < tau_min <= tau_max``.
        period: full cycle length in steps (``tau`` is back at ``tau_max`` after ``period``
            steps), or ``None`` for one half-cycle spanning the run.
    """

    kind = "cosine"

    def __init__(self, tau_min: float, tau_max: float, period: Optional[int] = None) -> None:
        self.tau_min = _tau(tau_min, "tau_min")
        self.tau_max = _tau(tau_max, "tau_max")
        if self.tau_min > self.tau_max:
            raise ValueError(f"tau_min must be <= tau_max, got tau_min={self.tau_min}, tau_max={self.tau_max}")
        if period is not None and (isinstance(period, bool) or not isinstance(period, int) or period < 2):
            raise ValueError(f"period must be an int >= 2 (steps per cycle) or None, got {period!r}")
        self.period = period

    def value(self, step: int, total_steps: int) -> float:
        if self.period is None:
            phase = _progress(step, total_steps)  # e / T with T the whole run
        else:
            _check_step(step, total_steps)
            phase = 2.0 * step / self.period
        return self.tau_min + 0.5 * (self.tau_max - self.tau_min) * (1.0 + math.cos(math.pi * phase))

    @property
    def lowest(self) -> float:
        return self.tau_min

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "tau_min": self.tau_min, "tau_max": self.tau_max, "period": self.period}


class LinearSchedule(TemperatureSchedule):
    """A straight ramp from ``start`` (first step) to ``end`` (last step)."""

    kind = "linear"

    def __init__(self, start: float, end: float) -> None:
        self.start = _tau(start, "start")
        self.end = _tau(end, "end")

    def value(self, step: int, total_steps: int) -> float:
        tau = self.start + (self.end - self.start) * _progress(step, total_steps)
        # The ramp lies between its ends; keep rounding from stepping past the lower one
        # (which may be the floor that Temperature.set_ enforces).
        return min(max(tau, self.lowest), max(self.start, self.end))

    @property
    def lowest(self) -> float:
        return min(self.start, self.end)

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end}


class StepSchedule(TemperatureSchedule):
    """Piecewise constant: ``values[0]`` first, ``values[k]`` once the fraction
    ``milestones[k-1]`` of the steps is done.

    Args:
        values: ``m >= 1`` temperatures.
        milestones: ``m - 1`` strictly increasing fractions in ``(0, 1)``; default equal
            segments ``k / m``.
    """

    kind = "step"

    def __init__(self, values: Sequence[float], milestones: Optional[Sequence[float]] = None) -> None:
        values = list(values)
        if not values:
            raise ValueError("values must hold at least one temperature")
        self.values = [_tau(v, f"values[{i}]") for i, v in enumerate(values)]
        m = len(self.values)
        if milestones is None:
            milestones = [k / m for k in range(1, m)]
        milestones = [float(f) for f in milestones]
        if len(milestones) != m - 1:
            raise ValueError(f"milestones must have len(values) - 1 = {m - 1} entries, got {len(milestones)}")
        if any(not (0.0 < f < 1.0) for f in milestones) or any(b <= a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"milestones must be strictly increasing fractions in (0, 1), got {milestones}")
        self.milestones = milestones

    def value(self, step: int, total_steps: int) -> float:
        _check_step(step, total_steps)
        done = step / total_steps
        return self.values[sum(1 for f in self.milestones if done >= f)]

    @property
    def lowest(self) -> float:
        return min(self.values)

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "values": list(self.values), "milestones": list(self.milestones)}


class LearnableSchedule(TemperatureSchedule):
    """A learnable ``tau`` (CLIP: ``tau = 1 / exp(log_scale)``, ``1 / tau <= max_scale``).

    Calling the schedule returns the :class:`~contrastkit.losses.Temperature` module (the
    loss reads its value with the gradient); :attr:`module` must be trained along with the
    model. :meth:`value` is its current value.
    """

    kind = "learnable"
    varies = False

    def __init__(self, initial: float = 0.07, max_scale: float = 1.0 / MIN_TEMPERATURE) -> None:
        self.initial = _tau(initial, "initial")
        self.max_scale = float(max_scale)
        self.module = Temperature(self.initial, learnable=True, max_scale=self.max_scale)

    def value(self, step: int, total_steps: int) -> float:
        _check_step(step, total_steps)
        return self.module.value

    @property
    def lowest(self) -> float:
        return self.initial

    def __call__(self, step: int, total_steps: int) -> Temperature:
        _check_step(step, total_steps)
        return self.module

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "initial": self.initial, "max_scale": self.max_scale}


class KuklevaSchedule(TemperatureSchedule):
    """Kukleva et al.'s periodic cosine of the epoch (module docstring):
    ``tau = tau_min + 0.5 (tau_max - tau_min) (1 + cos(pi e / T))`` with ``e`` the epoch
    (0-based) and ``T`` in epochs; ``tau_max`` in the first epoch. The same as lightly's
    ``cosine_schedule(e, ..., start_value=tau_max, end_value=tau_min, period=2 T)``.

    The run's number of epochs is given by :meth:`bind` (the trainer does); step ``s`` of
    ``total_steps`` lies in epoch ``floor(s * epochs / total_steps)``.
    """

    kind = "kukleva"

    def __init__(self, tau_min: float = 0.1, tau_max: float = 1.0, half_period: float = 200) -> None:
        self.tau_min = _tau(tau_min, "tau_min")
        self.tau_max = _tau(tau_max, "tau_max")
        if self.tau_min > self.tau_max:
            raise ValueError(f"tau_min must be <= tau_max, got tau_min={self.tau_min}, tau_max={self.tau_max}")
        self.half_period = _tau(half_period, "T (epochs)")
        self.epochs: Optional[int] = None

    def bind(self, *, epochs: int) -> "KuklevaSchedule":
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
        self.epochs = epochs
        return self

    def epoch(self, step: int, total_steps: int) -> int:
        """The (0-based) epoch of ``step``."""
        _check_step(step, total_steps)
        if self.epochs is None:
            raise ValueError("the kukleva schedule counts epochs: bind(epochs=...) the run's number of epochs first")
        return (step * self.epochs) // total_steps

    def value(self, step: int, total_steps: int) -> float:
        e = self.epoch(step, total_steps)
        return self.tau_min + 0.5 * (self.tau_max - self.tau_min) * (1.0 + math.cos(math.pi * e / self.half_period))

    @property
    def lowest(self) -> float:
        return self.tau_min

    def config(self) -> Dict[str, Any]:
        return {"kind": self.kind, "tau_min": self.tau_min, "tau_max": self.tau_max, "half_period": self.half_period}


_FORMS = {
    "constant": "constant or constant:TAU",
    "cosine": "cosine:TAU_MIN,TAU_MAX or cosine:TAU_MIN,TAU_MAX,PERIOD_STEPS",
    "linear": "linear:START,END",
    "step": "step:V1,V2,... or step:V1,V2,...@F1,... (fractions of the run)",
    "learnable": "learnable or learnable:INITIAL",
    "kukleva": "kukleva, kukleva:TAU_MIN,TAU_MAX or kukleva:TAU_MIN,TAU_MAX,T_EPOCHS",
}


def parse_schedule(spec: str, temperature: Optional[float] = None) -> TemperatureSchedule:
    """Build a schedule from its command-line form.

    ``constant`` / ``learnable`` use ``temperature`` unless a value follows the colon;
    ``cosine:0.05,0.5`` (``tau_min, tau_max[, period]``), ``kukleva:0.1,1.0,200``
    (``tau-, tau+, T`` in epochs), ``linear:0.05,0.5`` (``start, end``),
    ``step:0.05,0.1,0.2`` or ``step:0.05,0.5@0.3`` (values @ milestones). A temperature method
    is not a schedule (:func:`contrastkit.temperature_methods.parse_temperature_method`): its form
    is refused here, naming ``--temperature-method``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"temperature schedule must be one of {', '.join(SCHEDULES)}, got {spec!r}")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if temperature_method_of(spec) is not None:
        raise ValueError(f"temperature schedule {spec.strip()!r} is a temperature method, not a schedule of tau: "
                         f"give it as the temperature method (--temperature-method {spec.strip()})")
    if kind not in SCHEDULES:
        raise ValueError(f"unknown temperature schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    form = _FORMS[kind]

    def numbers(text: str) -> list:
        try:
            return [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"temperature schedule {spec!r}: expected numbers, as in {form}") from None

    milestones_text = None
    if kind == "step" and "@" in rest:
        rest, milestones_text = rest.split("@", 1)
    args = numbers(rest)
    if kind == "kukleva":
        if len(args) not in (0, 2, 3):
            raise ValueError(f"temperature schedule {spec!r}: expected {form}")
        return KuklevaSchedule(*args)
    if kind in ("constant", "learnable"):
        if len(args) > 1:
            raise ValueError(f"temperature schedule {spec!r}: expected {form}")
        if not args:
            if temperature is None:
                raise ValueError(f"temperature schedule {kind!r} needs a temperature: give {form}")
            args = [temperature]
        return ConstantSchedule(args[0]) if kind == "constant" else LearnableSchedule(args[0])
    if kind == "cosine":
        if len(args) not in (2, 3):
            raise ValueError(f"temperature schedule {spec!r}: expected {form}")
        period = None
        if len(args) == 3:
            if args[2] != int(args[2]):
                raise ValueError(f"temperature schedule {spec!r}: the period must be a whole number of steps")
            period = int(args[2])
        return CosineSchedule(args[0], args[1], period)
    if kind == "linear":
        if len(args) != 2:
            raise ValueError(f"temperature schedule {spec!r}: expected {form}")
        return LinearSchedule(args[0], args[1])
    if not args:
        raise ValueError(f"temperature schedule {spec!r}: expected {form}")
    return StepSchedule(args, None if milestones_text is None else numbers(milestones_text))
