"""The statistics the studies report: mean, standard deviation, standard errors, Spearman's rho.

Plain Python (``statistics``, ``math``) on lists of floats, so that every number a verdict
quotes can be recomputed by hand.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["mean_std", "standard_error", "binomial_standard_error", "spearman", "finite"]


def finite(value: Any) -> Optional[float]:
    """``value`` as a float, or ``None`` when it is missing (``None``, ``""``) or not finite."""
    if value is None or value == "":
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; ``nan, nan`` for none)."""
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean, ``std / sqrt(n)`` (``nan`` for fewer than 2 values)."""
    if len(values) < 2:
        return math.nan
    return mean_std(values)[1] / math.sqrt(len(values))


def binomial_standard_error(p: float, trials: Any) -> float:
    """Standard error ``sqrt(p (1 - p) / trials)`` of a rate ``p`` measured on ``trials``
    independent queries (``nan`` when the number of trials is unknown or not positive)."""
    try:
        n = int(trials)
    except (TypeError, ValueError):
        return math.nan
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else math.nan


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0  # ties share their mean rank
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson correlation of the ranks; ties get mean ranks).

    ``nan`` when either side is constant or there are fewer than 2 points.
    """
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = _ranks(list(x)), _ranks(list(y))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)
