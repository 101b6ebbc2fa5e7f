"""Independent loop-based float64 references for the loss family.

Written from the formulas in the papers with plain Python floats and ``math``, no torch
ops, so that they share no code (and no bug) with ``contrastkit.losses``.
"""

from __future__ import annotations

import math
from typing import List, Sequence

Matrix = List[List[float]]


def rows(x) -> Matrix:
    return [[float(v) for v in row] for row in x.tolist()]


def normalized(x: Matrix) -> Matrix:
    out = []
    for row in x:
        norm = math.sqrt(sum(v * v for v in row))
        out.append([v / norm for v in row])
    return out


def dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def log_sum_exp(values: Sequence[float]) -> float:
    m = max(values)
    return m + math.log(sum(math.exp(v - m) for v in values))


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def info_nce(q: Matrix, p: Matrix, negatives=None, tau: float = 1.0, paired: bool = False) -> List[float]:
    losses = []
    for i, qi in enumerate(q):
        if negatives is None:
            candidates = [dot(qi, pk) / tau for pk in p]
            positive = candidates[i]
        else:
            bank = negatives[i] if paired else negatives
            candidates = [dot(qi, p[i]) / tau] + [dot(qi, nk) / tau for nk in bank]
            positive = candidates[0]
        losses.append(log_sum_exp(candidates) - positive)
    return losses


def similarity(s: Matrix, positive_index: Sequence[int], tau: float, exclude_diagonal: bool) -> List[float]:
    """InfoNCE on a given similarity matrix: anchor ``i`` against the candidates of row ``i``
    (without itself when the diagonal is excluded), its positive in the denominator."""
    losses = []
    for i, row in enumerate(s):
        candidates = [v / tau for j, v in enumerate(row) if not (exclude_diagonal and j == i)]
        losses.append(log_sum_exp(candidates) - row[positive_index[i]] / tau)
    return losses


def nt_xent(z: Matrix, positive_index: Sequence[int], tau: float) -> List[float]:
    losses = []
    for i, zi in enumerate(z):
        others = [dot(zi, zj) / tau for j, zj in enumerate(z) if j != i]
        losses.append(log_sum_exp(others) - dot(zi, z[positive_index[i]]) / tau)
    return losses


def views_index(n: int) -> List[int]:
    return [i + n for i in range(n)] + [i for i in range(n)]


def bidirectional(v: Matrix, u: Matrix, tau: float, weight: float) -> List[float]:
    n = len(v)
    s = [[dot(v[i], u[k]) / tau for k in range(n)] for i in range(n)]
    out = []
    for i in range(n):
        v_to_u = log_sum_exp(s[i]) - s[i][i]
        u_to_v = log_sum_exp([s[k][i] for k in range(n)]) - s[i][i]
        out.append(weight * v_to_u + (1 - weight) * u_to_v)
    return out


def supcon(z: Matrix, labels: Sequence[int], tau: float, variant: str) -> List[float]:
    """Per-anchor losses; ``None`` for anchors without a positive (Khosla et al. eq. 2, 3)."""
    out = []
    for i, zi in enumerate(z):
        denominator = log_sum_exp([dot(zi, zj) / tau for j, zj in enumerate(z) if j != i])
        positives = [dot(zi, zj) / tau for j, zj in enumerate(z) if j != i and labels[j] == labels[i]]
        if not positives:
            out.append(None)
        elif variant == "out":
            out.append(-mean([p - denominator for p in positives]))
        else:
            out.append(-math.log(mean([math.exp(p - denominator) for p in positives])))
    return out


def dcl(z: Matrix, positive_index: Sequence[int], tau: float) -> List[float]:
    out = []
    for i, zi in enumerate(z):
        negatives = [dot(zi, zj) / tau for j, zj in enumerate(z) if j not in (i, positive_index[i])]
        out.append(log_sum_exp(negatives) - dot(zi, z[positive_index[i]]) / tau)
    return out


def simple(z: Matrix, positive_index: Sequence[int], lam: float) -> List[float]:
    out = []
    for i, zi in enumerate(z):
        negatives = [dot(zi, zj) for j, zj in enumerate(z) if j not in (i, positive_index[i])]
        out.append(-dot(zi, z[positive_index[i]]) + lam * mean(negatives))
    return out


def hard_negative(z: Matrix, positive_index: Sequence[int], tau: float, k: int) -> List[float]:
    out = []
    for i, zi in enumerate(z):
        negatives = sorted((dot(zi, zj) for j, zj in enumerate(z) if j not in (i, positive_index[i])),
                           reverse=True)[:k]
        positive = dot(zi, z[positive_index[i]])
        out.append(log_sum_exp([positive / tau] + [s / tau for s in negatives]) - positive / tau)
    return out


def debiased(z: Matrix, positive_index: Sequence[int], tau: float, tau_plus: float, beta: float) -> List[float]:
    """Chuang et al. 2020 (beta = 0) and Robinson et al. 2021 (beta > 0), written as in the papers."""
    out = []
    for i, zi in enumerate(z):
        pos = math.exp(dot(zi, z[positive_index[i]]) / tau)
        neg = [math.exp(dot(zi, zj) / tau) for j, zj in enumerate(z) if j not in (i, positive_index[i])]
        m = len(neg)
        weights = [n ** beta for n in neg]  # exp(beta * s / tau)
        mean_weight = mean(weights)
        reweighted = sum(w * n for w, n in zip(weights, neg)) / mean_weight
        ng = (-tau_plus * m * pos + reweighted) / (1 - tau_plus)
        ng = max(ng, m * math.exp(-1 / tau))
        out.append(-math.log(pos / (pos + ng)))
    return out
