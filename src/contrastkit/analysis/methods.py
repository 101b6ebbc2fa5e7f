"""What each temperature method does to one row of similarities, next to a fixed tau.

For anchor ``i`` (its similarities ``s_ij``, its positive ``+``, its negatives ``j``) every
temperature method (:mod:`contrastkit.temperature_methods`) is a softmax at some temperature with a gradient
of its own; :func:`explain_methods` gives, for each, the temperature every anchor uses, the
probabilities and the penalty distribution over the negatives at that temperature (an
:class:`~contrastkit.analysis.Explanation`), and the gradient the method's loss sends to each
similarity:

* fixed ``tau``: InfoNCE, ``dl/ds_j = p_j / tau``, ``dl/ds_+ = (p_+ - 1) / tau``.
* each registered temperature method: what its record's ``explain`` says and computes
  (:mod:`contrastkit.temperature_methods`: MACL's ``tau_A`` and ``1 / (1 - P_i)`` weight, dual
  temperature's two, the robust objective's optimum for iSogCLR and TempNet, a plug-in's own),
  on the rows as :class:`~contrastkit.temperature_methods.MethodRows` offers them.

Each method is given in its ``--temperature-method`` form (``"macl"``, ``"dual:0.1,1"``, ...,
:func:`contrastkit.temperature_methods.parse_temperature_method`), with its defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from contrastkit.temperature_methods import MethodRows, parse_temperature_method, temperature_method_names

from .explanation import Explanation, PositiveLike, SimilaritiesLike, _check_tau, _dumps, _explain, _prepare

__all__ = ["MethodView", "MethodComparison", "explain_methods", "robust_temperature"]

#: What the fixed tau's view says (the ``source`` of a :class:`MethodView`; a method's is its
#: record's title, citation and summary, :mod:`contrastkit.temperature_methods`).
FIXED_SOURCE = "a fixed temperature: InfoNCE"


@dataclass(frozen=True, eq=False)
class MethodView:
    """One method on the rows: ``temperatures`` ``(N,)`` (each anchor's), ``weights`` ``(N,)``
    (the factor on the anchor's gradient: MACL's and dual's stop-gradient weights, the robust
    objective's ``tau_i`` on the gradient of its negatives-only softmax, 1 for a fixed tau),
    ``explanation`` (probabilities, penalty, effective negatives at those temperatures),
    ``gradients`` ``(N, K)`` (the method's loss of anchor ``i`` w.r.t. its similarities)."""

    method: str
    source: str
    settings: Dict[str, float]
    temperatures: np.ndarray
    weights: np.ndarray
    explanation: Explanation
    gradients: np.ndarray

    @property
    def positive_pull(self) -> np.ndarray:
        """``(N,)`` how strongly each positive is pulled: ``-d loss_i / d s_+``."""
        rows = np.arange(len(self.explanation.positive))
        return -self.gradients[rows, self.explanation.positive]

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Explanation):
                value = value.to_dict()
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["positive_pull"] = self.positive_pull.tolist()
        return out


@dataclass(frozen=True, eq=False)
class MethodComparison:
    """A fixed tau (:attr:`fixed`) and each method's view (:attr:`views`) of the same rows."""

    fixed: MethodView
    views: Tuple[MethodView, ...]

    def __iter__(self):
        return iter((self.fixed,) + self.views)

    def anchor_records(self) -> List[Dict[str, Any]]:
        """One record per (method, anchor): temperature, weight, loss, positive probability and
        pull, penalty entropy and effective negatives."""
        records = []
        for view in self:
            e = view.explanation
            for i in range(len(e.positive)):
                records.append({"method": view.method, "anchor": i, "temperature": float(view.temperatures[i]),
                                 "weight": float(view.weights[i]),
                                 "positive_probability": float(e.positive_probability[i]),
                                 "positive_pull": float(view.positive_pull[i]),
                                 "penalty_entropy": float(e.penalty_entropy[i]),
                                 "effective_negatives": float(e.effective_negatives[i])})
        return records

    def to_dict(self) -> Dict[str, Any]:
        return {"fixed": self.fixed.to_dict(), "methods": [v.to_dict() for v in self.views]}

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON; infinite values are written as the string ``"Infinity"``."""
        return _dumps(self.to_dict(), **kwargs)


def _negatives(explanation_problem) -> torch.Tensor:
    rows = torch.arange(explanation_problem.similarities.shape[0])
    negative = explanation_problem.in_denominator.clone()
    negative[rows, explanation_problem.positive] = False
    return negative


def _kl_to_uniform(s: torch.Tensor, negative: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``KL(q || uniform)`` of each row's softmax ``q`` over its negatives at ``tau`` ``(N,)``."""
    logits = (s / tau[:, None]).masked_fill(~negative, float("-inf"))
    log_q = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    q = log_q.exp()
    count = negative.sum(dim=1).to(s.dtype)
    return torch.where(negative, q * log_q, torch.zeros(())).sum(dim=1) + count.log()


def robust_temperature(similarities: SimilaritiesLike, *, rho: float, tau_min: float, tau_max: float,
                       positive: PositiveLike = 0, exclude_diagonal: bool = False) -> np.ndarray:
    """``(N,)`` the temperature that minimises iSogCLR's robust objective for each row (module
    docstring): where the penalty over the negatives is ``rho`` nats from uniform, in
    ``[tau_min, tau_max]`` (bisection on ``log tau``, to float64 resolution).

    Example (two equally similar negatives are uniform at any tau: the smallest tau wins):
        >>> robust_temperature([0.9, 0.1, 0.1], rho=0.4, tau_min=0.05, tau_max=1.0).tolist()
        [0.05]
    """
    problem = _prepare(similarities, positive, exclude_diagonal)
    return _robust_temperature(problem, float(rho), _check_tau(tau_min, "tau_min"), _check_tau(tau_max, "tau_max"))


def _robust_temperature(problem, rho: float, tau_min: float, tau_max: float) -> np.ndarray:
    s, negative = problem.similarities, _negatives(problem)
    n = s.shape[0]
    low = torch.full((n,), math.log(tau_min), dtype=torch.float64)
    high = torch.full((n,), math.log(tau_max), dtype=torch.float64)
    # KL falls as tau grows: above rho at tau_max means the optimum lies beyond it (and so on).
    at_max = _kl_to_uniform(s, negative, high.exp()) >= rho
    at_min = _kl_to_uniform(s, negative, low.exp()) <= rho
    for _ in range(200):
        middle = 0.5 * (low + high)
        above = _kl_to_uniform(s, negative, middle.exp()) > rho
        low, high = torch.where(above, middle, low), torch.where(above, high, middle)
    tau = (0.5 * (low + high)).exp()
    tau = torch.where(at_max, torch.full_like(tau, tau_max), tau)
    tau = torch.where(at_min, torch.full_like(tau, tau_min), tau)
    return tau.numpy()


class _Rows(MethodRows):
    """The rows of :func:`explain_methods`, as a method's ``explain`` asks for them."""

    def __init__(self, problem) -> None:
        self.problem = problem
        self.n = problem.similarities.shape[0]

    @property
    def alignment(self) -> float:
        return float(self.problem.similarities[torch.arange(self.n), self.problem.positive].mean())

    def softmax(self, tau: Any) -> Explanation:
        return _explain(self.problem, torch.from_numpy(tau) if isinstance(tau, np.ndarray) else tau)

    def negative_mass(self, explanation: Explanation) -> np.ndarray:
        return explanation.probabilities.sum(axis=1) - explanation.positive_probability

    def robust_temperature(self, rho: float, tau_min: float, tau_max: float) -> np.ndarray:
        return _robust_temperature(self.problem, float(rho), float(tau_min), float(tau_max))


def _view(rows: _Rows, method: str, source: str, settings: Dict[str, float], tau: np.ndarray, weights: np.ndarray,
          gradients: np.ndarray) -> MethodView:
    return MethodView(method, source, dict(settings), tau, weights, rows.softmax(tau), gradients)


def explain_methods(
    similarities: SimilaritiesLike,
    *,
    temperature: float,
    positive: PositiveLike = 0,
    exclude_diagonal: bool = False,
    methods: Optional[Sequence[str]] = None,
) -> MethodComparison:
    """Each temperature method on the given rows, next to the fixed ``temperature``.

    Args:
        similarities, positive, exclude_diagonal: as for :func:`~contrastkit.analysis.explain`
            (a row ``(K,)`` or ``N`` anchors ``(N, K)``; MACL's alignment is the mean of their
            positives' similarities).
        temperature: the fixed tau to compare with.
        methods: ``--temperature-method`` forms of temperature methods (default: every
            registered one, :mod:`contrastkit.temperature_methods`, with its defaults).

    Example (a row whose positive leads: MACL pulls it by 1 / tau_A whatever P is):
        >>> c = explain_methods([0.8, 0.4, 0.2], temperature=0.5, methods=["macl"])
        >>> macl = c.views[0]
        >>> round(float(macl.temperatures[0]), 4), round(float(macl.positive_pull[0] * macl.temperatures[0]), 6)
        (0.14, 1.0)
    """
    tau = _check_tau(temperature)
    rows = _Rows(_prepare(similarities, positive, exclude_diagonal))
    if methods is None:
        methods = temperature_method_names()
    elif isinstance(methods, str):
        methods = [methods]
    fixed_taus = np.full(rows.n, tau)
    fixed = _view(rows, "fixed", FIXED_SOURCE, {"temperature": tau}, fixed_taus, np.ones(rows.n),
                  rows.softmax(fixed_taus).gradients)
    views = []
    for form in methods:
        method = parse_temperature_method(form)
        record, settings = method.spec, dict(method.settings)
        taus, weights, gradients = record.explain(rows, settings)
        views.append(_view(rows, record.name, f"{record.title} ({record.citation}): {record.summary}", settings,
                           np.asarray(taus, dtype=np.float64), np.asarray(weights, dtype=np.float64),
                           np.asarray(gradients, dtype=np.float64)))
    return MethodComparison(fixed, tuple(views))
