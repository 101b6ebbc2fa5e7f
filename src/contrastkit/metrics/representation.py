"""What a representation looks like, beyond the probe accuracy: the quantities of Wang & Isola
(ICML 2020) and Wang & Liu (CVPR 2021) that explain what the temperature does.

Conventions:

* Embeddings are ``(N, d)`` floating tensors, one row per sample. Paired inputs ``x, y`` are
  two views of the same ``N`` samples: row ``i`` of ``x`` and row ``i`` of ``y`` form the
  positive pair of sample ``i``; every other row is a negative.
* With ``normalize=True`` (the default everywhere except :func:`effective_rank`) rows are
  L2-normalised first, so similarities are cosines and squared distances ``2 - 2 cos``.
  Zero-norm rows raise ``ValueError``.
* Everything is computed in float64 and returned as a Python float (or a float64 tensor for
  profiles); pairwise quantities are computed ``chunk_size`` rows at a time, so memory is
  ``O(chunk_size * N)`` instead of ``O(N^2)``.
"""

from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Union

import torch
from torch import Tensor

from contrastkit.losses.validation import (
    TemperatureLike,
    check_embeddings,
    check_same,
    optional_int,
    prepare,
    resolve_temperature,
)

__all__ = [
    "alignment",
    "uniformity",
    "tolerance",
    "similarity_profile",
    "SimilarityProfile",
    "penalty_entropy",
    "effective_rank",
    "representation_metrics",
]

DEFAULT_CHUNK = 1024


def _rows(x: object, name: str, normalize: bool, minimum: int = 1) -> Tensor:
    x = check_embeddings(x, name)
    if x.shape[0] < minimum:
        raise ValueError(f"{name} needs at least {minimum} rows, got {x.shape[0]}")
    return prepare(x.detach().to(torch.float64), normalize, name)


def _pair(x: object, y: object, normalize: bool, minimum: int = 1):
    check_embeddings(x, "x")
    check_embeddings(y, "y")
    check_same(x, "x", y, "y", dims=((0, 0), (1, 1)))
    return _rows(x, "x", normalize, minimum), _rows(y, "y", normalize, minimum)


def _chunk(chunk_size: int) -> int:
    return optional_int(chunk_size, "chunk_size", minimum=1)


def alignment(x: Tensor, y: Tensor, *, alpha: float = 2.0, normalize: bool = True) -> float:
    """Alignment of positive pairs (Wang & Isola 2020): ``mean_i ||x_i - y_i||^alpha``.

    Args:
        x, y: ``(N, d)``; row ``i`` of each is a view of sample ``i`` (the positive pair).
        alpha: exponent ``> 0`` (2 in the paper).
        normalize: L2-normalise rows first (the paper's setting).

    Lower is better: 0 when every pair coincides; 4 (with ``alpha = 2``) when every pair is
    antipodal on the unit sphere.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    a, b = _pair(x, y, normalize)
    return float(torch.linalg.vector_norm(a - b, dim=1).pow(alpha).mean())


def _squared_distances(block: Tensor, rows: Tensor, normalized: bool) -> Tensor:
    if normalized:
        return (2.0 - 2.0 * block @ rows.T).clamp_(min=0.0)
    sq = (block * block).sum(1, keepdim=True) + (rows * rows).sum(1)[None, :] - 2.0 * block @ rows.T
    return sq.clamp_(min=0.0)


def uniformity(x: Tensor, *, t: float = 2.0, normalize: bool = True, chunk_size: int = DEFAULT_CHUNK) -> float:
    """Uniformity (Wang & Isola 2020): ``log mean_{i != j} exp(-t ||x_i - x_j||^2)``.

    Args:
        x: ``(N, d)`` embeddings, ``N >= 2``; the mean runs over all distinct pairs.
        t: ``> 0`` (2 in the paper).
        normalize: L2-normalise rows first (the paper's setting).
        chunk_size: rows per block of the pairwise computation.

    Lower (more negative) is more uniform. A collapsed embedding (all rows equal) gives 0;
    it is never positive. The mean is taken by a log-sum-exp, so it stays finite for large
    ``t``.
    """
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"t must be a finite number > 0, got {t!r}")
    chunk = _chunk(chunk_size)
    rows = _rows(x, "x", normalize, minimum=2)
    n = rows.shape[0]
    partial = []
    for start in range(0, n, chunk):
        block = rows[start:start + chunk]
        values = -t * _squared_distances(block, rows, normalize)
        local = torch.arange(block.shape[0])
        values[local, local + start] = float("-inf")  # a point and itself is not a pair
        partial.append(torch.logsumexp(values.reshape(-1), dim=0))
    return float(torch.logsumexp(torch.stack(partial), dim=0) - math.log(n * (n - 1)))


def tolerance(x: Tensor, labels: Tensor, *, normalize: bool = True) -> float:
    """Tolerance (Wang & Liu 2021): mean cosine similarity over all same-class pairs ``i != j``.

    Args:
        x: ``(N, d)`` embeddings.
        labels: ``(N,)`` integer classes (used only to measure, never to train).
        normalize: L2-normalise rows first (the paper's setting: cosine similarity).

    Higher means semantically similar samples sit closer together. Computed per class as
    ``(||sum_i x_i||^2 - sum_i ||x_i||^2) / (n_c (n_c - 1))`` pooled over classes, so it needs
    no ``N x N`` matrix. Raises ``ValueError`` if no class has two samples.
    """
    rows = _rows(x, "x", normalize)
    if not isinstance(labels, Tensor):
        labels = torch.as_tensor(labels)
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    if labels.dim() != 1 or labels.shape[0] != rows.shape[0]:
        raise ValueError(f"labels must have shape ({rows.shape[0]},), got {tuple(labels.shape)}")
    labels = labels.to(torch.long)
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    pairs = counts.to(torch.float64) * (counts.to(torch.float64) - 1.0)
    if float(pairs.sum()) == 0.0:
        raise ValueError("tolerance needs at least one class with two samples; every class has one")
    sums = torch.zeros(classes.shape[0], rows.shape[1], dtype=torch.float64).index_add_(0, inverse, rows)
    self_terms = torch.zeros(classes.shape[0], dtype=torch.float64).index_add_(0, inverse, (rows * rows).sum(1))
    return float(((sums * sums).sum(1) - self_terms).sum() / pairs.sum())


class SimilarityProfile(NamedTuple):
    """Mean positive similarity and the mean similarity of each anchor's ``r``-th most similar
    negative, ``r = 1..k`` (Wang & Liu 2021, Fig. 5)."""

    positive: float
    negatives: Tensor  # (k,) float64, decreasing


def similarity_profile(x: Tensor, y: Tensor, *, k: int = 10, normalize: bool = True,
                       chunk_size: int = DEFAULT_CHUNK) -> SimilarityProfile:
    """Positive similarity vs the ``k`` most similar negatives.

    Args:
        x: ``(N, d)`` anchors; ``y``: ``(N, d)`` candidates, ``y_i`` the positive of ``x_i``
            and ``y_j`` (``j != i``) its negatives. ``N >= k + 1``.
        k: how many nearest negatives to profile (10 in the paper).
        normalize: L2-normalise rows first (cosine similarity).
        chunk_size: anchors per block.

    Returns the mean over anchors of ``x_i . y_i`` and, for each rank ``r``, the mean over
    anchors of the ``r``-th largest ``x_i . y_j`` over ``j != i``.
    """
    k = optional_int(k, "k", minimum=1)
    chunk = _chunk(chunk_size)
    a, b = _pair(x, y, normalize)
    n = a.shape[0]
    if n < k + 1:
        raise ValueError(f"similarity_profile with k={k} needs at least {k + 1} rows, got {n}")
    positive_sum = 0.0
    ranked_sum = torch.zeros(k, dtype=torch.float64)
    for start in range(0, n, chunk):
        block = a[start:start + chunk]
        sims = block @ b.T
        local = torch.arange(block.shape[0])
        positive_sum += float(sims[local, local + start].sum())
        sims[local, local + start] = float("-inf")
        ranked_sum += sims.topk(k, dim=1).values.sum(0)
    return SimilarityProfile(positive_sum / n, ranked_sum / n)


def penalty_entropy(x: Tensor, y: Tensor, *, temperature: TemperatureLike, batch_size: int,
                    normalize: bool = True) -> float:
    """Mean entropy (nats) of Wang & Liu's relative penalty over the negatives, on real batches.

    The pairs are cut into consecutive batches of ``batch_size`` (a last batch with fewer
    than 2 pairs is dropped). In each batch, as in :func:`contrastkit.losses.nt_xent_views`,
    the ``2b`` stacked views are anchors and anchor ``i``'s negatives are the ``2b - 2`` rows
    other than itself and its positive; its penalty distribution is
    ``r_j = exp(s_ij / tau) / sum_{k neg} exp(s_ik / tau)``, the share of the gradient that
    negative ``j`` receives (Wang & Liu, CVPR 2021), as :func:`contrastkit.analysis.explain`
    computes it.

    Args:
        x, y: ``(N, d)`` two views, rows paired; ``N >= 2``.
        temperature: ``tau > 0`` (a float, scalar tensor or ``Temperature`` module).
        batch_size: pairs per batch, ``>= 2``; the entropy depends on it (its maximum is
            ``log(2b - 2)``, reached when every negative weighs the same).
        normalize: L2-normalise rows first.

    Returns the mean over all anchors of all batches. Low entropy: a few hard negatives
    take the whole penalty (small ``tau``); high: the loss treats negatives alike.
    """
    from contrastkit.analysis import explain  # the one implementation of the penalty distribution

    batch = optional_int(batch_size, "batch_size", minimum=2)
    tau = float(resolve_temperature(temperature))
    a, b = _pair(x, y, normalize, minimum=2)
    total, count = 0.0, 0
    for start in range(0, a.shape[0], batch):
        za, zb = a[start:start + batch], b[start:start + batch]
        m = za.shape[0]
        if m < 2:
            break
        z = torch.cat([za, zb])
        positive = ((torch.arange(2 * m) + m) % (2 * m)).tolist()
        entropy = explain(z @ z.T, temperature=tau, positive=positive, exclude_diagonal=True).penalty_entropy
        total += float(entropy.sum())
        count += 2 * m
    return total / count


def effective_rank(x: Tensor, *, normalize: bool = False, center: bool = False,
                   chunk_size: int = DEFAULT_CHUNK) -> float:
    """Effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p_k = sigma_k / sum sigma``
    the L1-normalised singular values of the ``(N, d)`` embedding matrix.

    Args:
        x: ``(N, d)`` embeddings.
        normalize: L2-normalise rows first (default off: the raw embedding matrix).
        center: subtract the column mean first.
        chunk_size: rows per block when accumulating the Gram matrix.

    Ranges from 1 (one direction, e.g. collapsed embeddings) to ``min(N, d)`` (all singular
    values equal). Singular values are the square roots of the eigenvalues of the smaller Gram
    matrix, ``X^T X`` (``d x d``) or ``X X^T`` (``N x N``), which share their nonzero eigenvalues;
    accumulated in float64, so memory is ``O(min(N, d)^2)`` and time ``O(N d min(N, d))``: 78
    raw 128 x 128 RGB images (``d = 49,152``) take a 78 x 78 matrix, not a 19 GB one. Singular
    values below ``sqrt(max(N, d) * eps) * sigma_max`` (float64 ``eps``; about ``1e-6 sigma_max``
    at ``max(N, d) = 5,000``) count as 0, whichever matrix was used. A zero matrix raises
    ``ValueError``.
    """
    chunk = _chunk(chunk_size)
    rows = _rows(x, "x", normalize)  # float64
    if center:
        rows = rows - rows.mean(0, keepdim=True)
    n, d = rows.shape
    if d <= n:
        gram = torch.zeros(d, d, dtype=torch.float64)
        for start in range(0, n, chunk):
            block = rows[start:start + chunk]
            gram += block.T @ block
    else:
        gram = torch.empty(n, n, dtype=torch.float64)
        for start in range(0, n, chunk):
            gram[start:start + chunk] = rows[start:start + chunk] @ rows.T
    eigenvalues = torch.linalg.eigvalsh(gram)
    if float(eigenvalues.max()) <= 0.0:
        raise ValueError("effective_rank of a zero matrix is undefined (all singular values are 0)")
    # Eigenvalues below the Gram matrix's rounding level are zero singular values (as in
    # numpy's matrix_rank), not sqrt(rounding noise) ~ 1e-8 * sigma_max.
    noise = float(eigenvalues.max()) * max(n, d) * torch.finfo(torch.float64).eps
    singular = torch.where(eigenvalues > noise, eigenvalues, torch.zeros_like(eigenvalues)).sqrt()
    total = singular.sum()
    p = singular / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def representation_metrics(
    x: Tensor,
    y: Tensor,
    labels: Optional[Tensor] = None,
    *,
    temperature: TemperatureLike,
    batch_size: int,
    top_k: int = 10,
    chunk_size: int = DEFAULT_CHUNK,
) -> Dict[str, Union[float, list]]:
    """All metrics of this module on two views of a held-out set, as a JSON-ready dict.

    Args:
        x, y: ``(N, d)`` embeddings of two views of the same ``N`` held-out samples.
        labels: ``(N,)`` classes for ``tolerance`` (omitted when ``None``).
        temperature: the ``tau`` of the penalty distribution (the run's training ``tau``).
        batch_size: pairs per batch for :func:`penalty_entropy` (the training batch size).
        top_k: nearest negatives in the profile (capped at ``N - 1``).

    Keys: ``alignment``, ``uniformity`` (of ``x``), ``tolerance`` (of ``x``; only with
    labels), ``positive_similarity``, ``top_negative_similarity`` (list of ``top_k``),
    ``penalty_entropy``, ``penalty_entropy_max`` (``log(2b - 2)`` for the full batch),
    ``effective_rank`` (of ``x``, raw).
    """
    check_embeddings(x, "x")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"representation metrics need at least 2 held-out samples, got {n}")
    batch = min(optional_int(batch_size, "batch_size", minimum=2), n)
    profile = similarity_profile(x, y, k=min(top_k, n - 1), chunk_size=chunk_size)
    out: Dict[str, Union[float, list]] = {
        "alignment": alignment(x, y),
        "uniformity": uniformity(x, chunk_size=chunk_size),
    }
    if labels is not None:
        out["tolerance"] = tolerance(x, labels)
    out.update(
        positive_similarity=profile.positive,
        top_negative_similarity=[float(v) for v in profile.negatives],
        penalty_entropy=penalty_entropy(x, y, temperature=temperature, batch_size=batch),
        penalty_entropy_max=math.log(2 * batch - 2),
        effective_rank=effective_rank(x, chunk_size=chunk_size),
    )
    return out
