"""Independent loop-based float64 references for the loss family.

Written from the formulas in the papers with plain Python floats and ``math``, no torch
ops, so that they share no code (and no bug) with ``contrastkit.losses``.

Every ``tau`` is a number, or a list with one temperature per anchor (in the order of the
losses returned): anchor ``i``'s logits are its similarities divided by ``tau[i]``
(:func:`tau_of`).
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


def tau_of(tau, anchor: int) -> float:
    """Anchor ``anchor``'s temperature: ``tau`` itself, or its entry of a per-anchor list."""
    return float(tau) if isinstance(tau, (int, float)) else float(tau[anchor])


def info_nce(q: Matrix, p: Matrix, negatives=None, tau: float = 1.0, paired: bool = False) -> List[float]:
    losses = []
    for i, qi in enumerate(q):
        t = tau_of(tau, i)
        if negatives is None:
            candidates = [dot(qi, pk) / t for pk in p]
            positive = candidates[i]
        else:
            bank = negatives[i] if paired else negatives
            candidates = [dot(qi, p[i]) / t] + [dot(qi, nk) / t for nk in bank]
            positive = candidates[0]
        losses.append(log_sum_exp(candidates) - positive)
    return losses


def similarity(s: Matrix, positive_index: Sequence[int], tau: float, exclude_diagonal: bool) -> List[float]:
    """InfoNCE on a given similarity matrix: anchor ``i`` against the candidates of row ``i``
    (without itself when the diagonal is excluded), its positive in the denominator."""
    losses = []
    for i, row in enumerate(s):
        t = tau_of(tau, i)
        candidates = [v / t for j, v in enumerate(row) if not (exclude_diagonal and j == i)]
        losses.append(log_sum_exp(candidates) - row[positive_index[i]] / t)
    return losses


def nt_xent(z: Matrix, positive_index: Sequence[int], tau: float) -> List[float]:
    losses = []
    for i, zi in enumerate(z):
        t = tau_of(tau, i)
        others = [dot(zi, zj) / t for j, zj in enumerate(z) if j != i]
        losses.append(log_sum_exp(others) - dot(zi, z[positive_index[i]]) / t)
    return losses


def views_index(n: int) -> List[int]:
    return [i + n for i in range(n)] + [i for i in range(n)]


def bidirectional(v: Matrix, u: Matrix, tau, weight: float) -> List[float]:
    """Per pair; a per-anchor ``tau`` has the ``N`` anchors of ``v -> u`` (the rows of ``v``)
    first, then the ``N`` of ``u -> v`` (the rows of ``u``)."""
    n = len(v)
    out = []
    for i in range(n):
        t_v, t_u = tau_of(tau, i), tau_of(tau, n + i if not isinstance(tau, (int, float)) else i)
        v_to_u = log_sum_exp([dot(v[i], u[k]) / t_v for k in range(n)]) - dot(v[i], u[i]) / t_v
        u_to_v = log_sum_exp([dot(u[i], v[k]) / t_u for k in range(n)]) - dot(u[i], v[i]) / t_u
        out.append(weight * v_to_u + (1 - weight) * u_to_v)
    return out


def supcon(z: Matrix, labels: Sequence[int], tau: float, variant: str) -> List[float]:
    """Per-anchor losses; ``None`` for anchors without a positive (Khosla et al. eq. 2, 3)."""
    out = []
    for i, zi in enumerate(z):
        t = tau_of(tau, i)
        denominator = log_sum_exp([dot(zi, zj) / t for j, zj in enumerate(z) if j != i])
        positives = [dot(zi, zj) / t for j, zj in enumerate(z) if j != i and labels[j] == labels[i]]
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
        t = tau_of(tau, i)
        negatives = [dot(zi, zj) / t for j, zj in enumerate(z) if j not in (i, positive_index[i])]
        out.append(log_sum_exp(negatives) - dot(zi, z[positive_index[i]]) / t)
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
        t = tau_of(tau, i)
        out.append(log_sum_exp([positive / t] + [s / t for s in negatives]) - positive / t)
    return out


def debiased(z: Matrix, positive_index: Sequence[int], tau: float, tau_plus: float, beta: float) -> List[float]:
    """Chuang et al. 2020 (beta = 0) and Robinson et al. 2021 (beta > 0), written as in the papers."""
    out = []
    for i, zi in enumerate(z):
        t = tau_of(tau, i)
        pos = math.exp(dot(zi, z[positive_index[i]]) / t)
        neg = [math.exp(dot(zi, zj) / t) for j, zj in enumerate(z) if j not in (i, positive_index[i])]
        m = len(neg)
        weights = [n ** beta for n in neg]  # exp(beta * s / tau)
        mean_weight = mean(weights)
        reweighted = sum(w * n for w, n in zip(weights, neg)) / mean_weight
        ng = (-tau_plus * m * pos + reweighted) / (1 - tau_plus)
        ng = max(ng, m * math.exp(-1 / t))
        out.append(-math.log(pos / (pos + ng)))
    return out


def sigmoid(image: Matrix, text: Matrix, tau, bias: float) -> List[float]:
    """SigLIP (Zhai et al., ICCV 2023): per image ``i``, ``sum_j -log sigmoid(z_ij (s_ij / tau_i + b))``."""
    out = []
    for i, x in enumerate(image):
        t = tau_of(tau, i)
        total = 0.0
        for j, y in enumerate(text):
            logit = dot(x, y) / t + bias
            margin = logit if i == j else -logit
            total += max(-margin, 0.0) + math.log1p(math.exp(-abs(margin)))  # -log sigmoid(margin)
        out.append(total)
    return out


# ---------------------------------------------------------------- temperatures beyond one number
# ``z`` below is SimCLR's stacked views: rows 0..n-1 the first view, n..2n-1 the second, and
# anchor i's positive is row i +/- n (``views_index(n)``). Each returns per-anchor numbers.


def _positive_probability(z: Matrix, i: int, tau: float) -> float:
    """P_i: the positive's softmax probability among the 2n - 1 other rows, at ``tau``."""
    n = len(z) // 2
    p = views_index(n)[i]
    logits = [dot(z[i], z[j]) / tau for j in range(len(z)) if j != i]
    return math.exp(dot(z[i], z[p]) / tau - log_sum_exp(logits))


def macl(z: Matrix, tau0: float, alpha: float, threshold: float):
    """Huang et al. (ICML 2023): ``tau_A = tau_0 (1 + alpha (A - A_0))`` with ``A`` the mean
    positive similarity; per anchor ``(w_i, -log P_i)`` with ``w_i = 1 / (1 - P_i)``; and tau_A."""
    n = len(z) // 2
    alignment = mean([dot(z[i], z[i + n]) for i in range(n)])
    tau = tau0 * (1 + alpha * (alignment - threshold))
    out = []
    for i in range(2 * n):
        p = _positive_probability(z, i, tau)
        out.append((1 / (1 - p), -math.log(p)))
    return out, tau


def dual(z: Matrix, tau_alpha: float, tau_beta: float):
    """Zhang et al. (CVPR 2022): per anchor ``(w_i, -log P_i(tau_alpha))`` with
    ``w_i = (1 - P_i(tau_beta)) / (1 - P_i(tau_alpha))``."""
    out = []
    for i in range(len(z)):
        p_alpha, p_beta = _positive_probability(z, i, tau_alpha), _positive_probability(z, i, tau_beta)
        out.append(((1 - p_beta) / (1 - p_alpha), -math.log(p_alpha)))
    return out


def robust(z: Matrix, taus: Sequence[float], u_prior, rho: float, gamma: float):
    """iSogCLR (Qiu et al., ICML 2023), written from the paper's objective and its SogCLR
    update. Per anchor ``i`` (negatives: every row but ``i`` and its positive, ``M = 2n - 2``):
    ``g_i = (1/M) sum_j exp(s_ij / tau_i)``; the pair's estimate ``u`` moves to
    ``(1 - gamma) u + gamma g_i`` (``g_i`` itself for a pair not seen, ``u_prior[k] is None``).

    Returns, per anchor, ``F_i = tau_i log g_i - s_i+ + tau_i rho`` (the objective's batch
    estimate), the ``u_i`` used, the gradient of ``tau_i``
    ``log u_i + rho - (1 / (M u_i)) sum_j exp(s_ij / tau_i) s_ij / tau_i``, and per pair the
    kept estimate (the mean of its two anchors')."""
    n = len(z) // 2
    index = views_index(n)
    values, estimates, tau_grads = [], [], []
    for i in range(2 * n):
        t = taus[i]
        negatives = [dot(z[i], z[j]) for j in range(2 * n) if j not in (i, index[i])]
        m = len(negatives)
        g = sum(math.exp(s / t) for s in negatives) / m
        prior = u_prior[i % n] if u_prior is not None else None
        u = g if prior is None else (1 - gamma) * prior + gamma * g
        s_pos = dot(z[i], z[index[i]])
        values.append(t * math.log(g) - s_pos + t * rho)
        estimates.append(u)
        tau_grads.append(math.log(u) + rho - sum(math.exp(s / t) * s / t for s in negatives) / (m * u))
    kept = [(estimates[k] + estimates[k + n]) / 2 for k in range(n)]
    return values, estimates, tau_grads, kept


def robust_encoder_objective(z: Matrix, taus: Sequence[float], estimates: Sequence[float]) -> float:
    """The function whose gradient (``tau`` and the estimates held fixed) is SogCLR's estimator
    of the encoder's gradient: ``mean_i [(tau_i / u_i) g_i - s_i+]``."""
    n = len(z) // 2
    index = views_index(n)
    total = 0.0
    for i in range(2 * n):
        t = taus[i]
        negatives = [dot(z[i], z[j]) for j in range(2 * n) if j not in (i, index[i])]
        g = sum(math.exp(s / t) for s in negatives) / len(negatives)
        total += t / estimates[i] * g - dot(z[i], z[index[i]])
    return total / (2 * n)


def numeric_gradient(function, x: Matrix, step: float = 1e-6) -> Matrix:
    """Central differences of ``function(x)`` with respect to every entry of ``x``."""
    grad = []
    for r, row in enumerate(x):
        out = []
        for c in range(len(row)):
            up = [list(v) for v in x]
            down = [list(v) for v in x]
            up[r][c] += step
            down[r][c] -= step
            out.append((function(up) - function(down)) / (2 * step))
        grad.append(out)
    return grad
