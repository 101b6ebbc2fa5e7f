"""Cross-modal retrieval and zero-shot classification read-outs (pure functions, numpy).

Retrieval: ``N`` held-out pairs; image ``i`` queries the ``N`` texts (image->text) and text
``i`` queries the ``N`` images (text->image) by cosine similarity; the one correct candidate
is the query's own partner (instance-level: a different pair with an equally true text counts
as a miss). Recall@K is the fraction of queries whose partner ranks in the top ``K``.

Tie rule: candidates with exactly the same score as the correct one are ordered uniformly at
random, and the metrics return the exact *expected* value of that random order (no sampling).
If ``g`` candidates score strictly higher and ``e`` others tie with the correct one, its rank
is uniform on ``g + 1 .. g + e + 1``, so ``P(rank <= K) = clip((K - g) / (e + 1), 0, 1)`` and
the expected rank is ``g + 1 + e / 2``. This makes a constant scorer score exactly chance,
``K / N``, instead of 0 (pessimistic ties) or 1 (optimistic ties).

Zero-shot classification is the same read-out with the ``K`` class embeddings (mean of the
normalised prompt embeddings) as candidates and the label as the correct one, so accuracy is
Recall@1 with the same tie rule.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

__all__ = ["rank_counts", "recall_at_k", "mean_rank", "chance_recall", "cosine_similarity",
           "retrieval_metrics", "class_embeddings", "zero_shot_accuracy"]


def _matrix(x: object, name: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _targets(targets: Optional[object], queries: int, candidates: int) -> np.ndarray:
    if targets is None:
        if queries != candidates:
            raise ValueError(f"similarity is {queries} x {candidates}; without targets it must be square "
                             "(query i's correct candidate is i)")
        return np.arange(queries)
    if hasattr(targets, "detach"):
        targets = targets.detach().cpu().numpy()
    array = np.asarray(targets)
    if array.shape != (queries,) or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"targets must be {queries} integer candidate indices, got {array.dtype} {array.shape}")
    if queries and (array.min() < 0 or array.max() >= candidates):
        raise ValueError(f"targets must lie in [0, {candidates}), got range [{array.min()}, {array.max()}]")
    return array.astype(np.int64)


def rank_counts(similarity: object, targets: Optional[object] = None):
    """Per query: ``(higher, tied)`` -- how many candidates score strictly above the correct one,
    and how many *other* candidates score exactly the same.

    Args:
        similarity: ``(Q, C)`` scores, row = query, column = candidate.
        targets: ``(Q,)`` index of each query's correct candidate; default ``arange(Q)``
            (square ``similarity``, pair ``i`` correct for query ``i``).

    Returns two ``(Q,)`` int64 arrays.
    """
    s = _matrix(similarity, "similarity")
    t = _targets(targets, s.shape[0], s.shape[1])
    correct = s[np.arange(s.shape[0]), t][:, None]
    higher = (s > correct).sum(axis=1)
    tied = (s == correct).sum(axis=1) - 1  # minus the correct candidate itself
    return higher.astype(np.int64), tied.astype(np.int64)


def recall_at_k(similarity: object, k: int, targets: Optional[object] = None) -> float:
    """Recall@``k``: expected fraction of queries whose correct candidate ranks ``<= k`` (ties
    broken uniformly at random, in expectation; see the module docstring)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    higher, tied = rank_counts(similarity, targets)
    hit = np.clip((int(k) - higher) / (tied + 1.0), 0.0, 1.0)
    return float(hit.mean())


def mean_rank(similarity: object, targets: Optional[object] = None) -> float:
    """Expected rank (1 = best) of the correct candidate, averaged over queries."""
    higher, tied = rank_counts(similarity, targets)
    return float((higher + 1.0 + tied / 2.0).mean())


def chance_recall(num_candidates: int, k: int) -> float:
    """Recall@``k`` of a random ranking of ``num_candidates`` with one correct: ``min(k, C) / C``."""
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, (int, np.integer)) or num_candidates < 1:
        raise ValueError(f"num_candidates must be a positive integer, got {num_candidates!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return min(int(k), int(num_candidates)) / int(num_candidates)


def _unit(x: np.ndarray, name: str) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError(f"{name} has a zero-norm row ({int(np.argmax(norms[:, 0] == 0))}); cosine is undefined")
    return x / norms


def cosine_similarity(a: object, b: object) -> np.ndarray:
    """``(N, d)``, ``(M, d)`` -> ``(N, M)`` cosine similarities (float64)."""
    a_, b_ = _matrix(a, "a"), _matrix(b, "b")
    if a_.shape[1] != b_.shape[1]:
        raise ValueError(f"a has {a_.shape[1]} features but b has {b_.shape[1]}")
    return _unit(a_, "a") @ _unit(b_, "b").T


def retrieval_metrics(image_embeddings: object, text_embeddings: object,
                      ks: Sequence[int] = (1, 5, 10)) -> Dict[str, float]:
    """Image->text and text->image Recall@K, mean rank and chance level on ``N`` pairs.

    Args:
        image_embeddings, text_embeddings: ``(N, d)``; row ``i`` of each is pair ``i``.
        ks: the ``K`` values.

    Returns ``{"i2t_recall@K", "t2i_recall@K", "chance_recall@K" for each K,
    "i2t_mean_rank", "t2i_mean_rank", "chance_mean_rank", "pairs"}``.
    """
    v, u = _matrix(image_embeddings, "image_embeddings"), _matrix(text_embeddings, "text_embeddings")
    if v.shape[0] != u.shape[0]:
        raise ValueError(f"{v.shape[0]} image embeddings but {u.shape[0]} text embeddings; they must pair up")
    s = cosine_similarity(v, u)
    n = s.shape[0]
    out: Dict[str, float] = {"pairs": n}
    for k in ks:
        out[f"i2t_recall@{k}"] = recall_at_k(s, k)
        out[f"t2i_recall@{k}"] = recall_at_k(s.T, k)
        out[f"chance_recall@{k}"] = chance_recall(n, k)
    out["i2t_mean_rank"] = mean_rank(s)
    out["t2i_mean_rank"] = mean_rank(s.T)
    out["chance_mean_rank"] = (n + 1) / 2.0
    return out


def class_embeddings(prompt_embeddings: object, prompt_classes: object, num_classes: int) -> np.ndarray:
    """``(K, d)`` unit class embeddings: the mean of each class's normalised prompt embeddings,
    renormalised. ``prompt_embeddings`` ``(P, d)``; ``prompt_classes`` ``(P,)`` in ``[0, K)``;
    every class needs at least one prompt."""
    e = _unit(_matrix(prompt_embeddings, "prompt_embeddings"), "prompt_embeddings")
    classes = _targets(prompt_classes, e.shape[0], num_classes)
    missing = sorted(set(range(num_classes)) - set(classes.tolist()))
    if missing:
        raise ValueError(f"class(es) {missing} have no prompt")
    means = np.stack([e[classes == c].mean(axis=0) for c in range(num_classes)])
    return _unit(means, "class mean of prompts")


def zero_shot_accuracy(image_embeddings: object, class_embeddings_: object, labels: object) -> float:
    """Accuracy of predicting the class whose embedding is most cosine-similar to the image's,
    ties broken uniformly at random in expectation (= Recall@1 against the labels)."""
    s = cosine_similarity(image_embeddings, class_embeddings_)
    return recall_at_k(s, 1, targets=labels)
