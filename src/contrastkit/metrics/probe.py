"""The fixed read-out protocol on frozen features.

* Linear probe: features standardised with train statistics, scikit-learn's multinomial
  ``LogisticRegression`` (L-BFGS) fitted on train for every ``C`` of a grid; the ``C`` with
  the best val accuracy (the smallest such ``C`` on ties) is reported with its test accuracy.
* Weighted kNN (Wu et al. 2018, "instance discrimination"): features L2-normalised, the
  ``k`` train rows with the largest cosine similarity vote for their class with weight
  ``exp(cos / temperature)``; the class with the largest total wins.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Dict, Sequence

import numpy as np

__all__ = ["DEFAULT_C_GRID", "ProbeResult", "linear_probe", "knn_predict", "knn_accuracy"]

DEFAULT_C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)


@dataclass
class ProbeResult:
    """Outcome of :func:`linear_probe`: test accuracy at the ``C`` picked on val."""

    test_accuracy: float
    val_accuracy: float
    best_c: float
    val_accuracy_by_c: Dict[float, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["val_accuracy_by_c"] = {str(k): v for k, v in self.val_accuracy_by_c.items()}
        return data


def _features(x: object, name: str) -> np.ndarray:
    array = np.asarray(x, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _labels(y: object, n: int, name: str) -> np.ndarray:
    array = np.asarray(y)
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integer class labels, got dtype {array.dtype}")
    return array.astype(np.int64)


def linear_probe(
    train_x: object, train_y: object,
    val_x: object, val_y: object,
    test_x: object, test_y: object,
    *,
    c_grid: Sequence[float] = DEFAULT_C_GRID,
    max_iter: int = 2000,
) -> ProbeResult:
    """Logistic-regression probe with ``C`` chosen on val.

    Args:
        train_x, val_x, test_x: ``(n_split, d)`` features (same ``d``).
        train_y, val_y, test_y: ``(n_split,)`` integer labels.
        c_grid: inverse regularisation strengths to try.
        max_iter: L-BFGS iterations per fit.

    Returns a :class:`ProbeResult`; accuracies are fractions in ``[0, 1]``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    train_x = _features(train_x, "train_x")
    val_x = _features(val_x, "val_x")
    test_x = _features(test_x, "test_x")
    dim = train_x.shape[1]
    for name, x in (("val_x", val_x), ("test_x", test_x)):
        if x.shape[1] != dim:
            raise ValueError(f"{name} has {x.shape[1]} features but train_x has {dim}")
    train_y = _labels(train_y, train_x.shape[0], "train_y")
    val_y = _labels(val_y, val_x.shape[0], "val_y")
    test_y = _labels(test_y, test_x.shape[0], "test_y")
    if len(np.unique(train_y)) < 2:
        raise ValueError("train_y holds a single class; a probe needs at least two")
    grid = [float(c) for c in c_grid]
    if not grid or any(not np.isfinite(c) or c <= 0 for c in grid):
        raise ValueError(f"c_grid must be a non-empty sequence of positive numbers, got {c_grid}")

    scaler = StandardScaler().fit(train_x)
    train_s, val_s, test_s = (scaler.transform(x) for x in (train_x, val_x, test_x))
    # One model walked along the grid from strong to weak regularisation, each fit starting
    # from the previous solution (same optimum, far fewer L-BFGS iterations at large C).
    model = LogisticRegression(max_iter=max_iter, warm_start=True)
    best = None
    by_c: Dict[float, float] = {}
    for c in sorted(set(grid)):
        with warnings.catch_warnings():
            # A probe that has not fully converged at max_iter is still a valid read-out.
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.set_params(C=c).fit(train_s, train_y)
        val_acc = float((model.predict(val_s) == val_y).mean())
        by_c[c] = val_acc
        if best is None or val_acc > best[0]:
            best = (val_acc, c, float((model.predict(test_s) == test_y).mean()))
    val_acc, best_c, test_acc = best
    return ProbeResult(test_accuracy=test_acc, val_accuracy=val_acc, best_c=best_c, val_accuracy_by_c=by_c)


def knn_predict(
    memory_x: object, memory_y: object, query_x: object,
    *, k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
) -> np.ndarray:
    """Weighted kNN predictions (cosine similarity, votes ``exp(cos / temperature)``).

    Args:
        memory_x: ``(n, d)`` features of the labelled memory (train split).
        memory_y: ``(n,)`` integer labels in ``[0, num_classes)``.
        query_x: ``(m, d)`` features to classify.
        k: neighbours per query (capped at ``n``).
        temperature: vote temperature (Wu et al. 2018 use 0.07).
        num_classes: defaults to ``max(memory_y) + 1``.

    Returns ``(m,)`` predicted labels; ties go to the smaller class index.
    """
    memory_x = _features(memory_x, "memory_x")
    query_x = _features(query_x, "query_x")
    if query_x.shape[1] != memory_x.shape[1]:
        raise ValueError(f"query_x has {query_x.shape[1]} features but memory_x has {memory_x.shape[1]}")
    memory_y = _labels(memory_y, memory_x.shape[0], "memory_y")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if memory_y.min() < 0:
        raise ValueError("memory_y must hold non-negative class indices")
    classes = int(memory_y.max()) + 1 if num_classes is None else int(num_classes)
    if memory_y.max() >= classes:
        raise ValueError(f"memory_y holds label {memory_y.max()} but num_classes is {classes}")

    def unit(x: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.maximum(norms, 1e-12)

    similarity = unit(query_x) @ unit(memory_x).T  # (m, n)
    k = min(int(k), memory_x.shape[0])
    neighbours = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    neighbour_sim = np.take_along_axis(similarity, neighbours, axis=1)
    # Subtracting the row maximum keeps exp() finite; it scales every vote of a row equally.
    weights = np.exp((neighbour_sim - neighbour_sim.max(axis=1, keepdims=True)) / temperature)
    votes = np.zeros((query_x.shape[0], classes))
    np.add.at(votes, (np.arange(query_x.shape[0])[:, None], memory_y[neighbours]), weights)
    return votes.argmax(axis=1)


def knn_accuracy(
    memory_x: object, memory_y: object, query_x: object, query_y: object,
    *, k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
) -> float:
    """Accuracy of :func:`knn_predict` against ``query_y`` ``(m,)``."""
    predictions = knn_predict(memory_x, memory_y, query_x, k=k, temperature=temperature,
                              num_classes=num_classes)
    query_y = _labels(query_y, predictions.shape[0], "query_y")
    return float((predictions == query_y).mean())
