"""Reading a study's result rows: the flat dicts of its CSV, grouped the way the verdicts,
tables and plots need them.

Rows come either from a finished grid or from a CSV read back (every value a string, missing
ones ``""``), so every reader goes through :func:`contrastkit.studies.stats.finite`.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from contrastkit.records import KNN_ACCURACY, PROBE_ACCURACY, RANDOM_INIT, RAW_PIXEL, VIEW_RETRIEVAL_TOP1, baseline_key
from contrastkit.train.selection import selected_numbers

from .stats import finite

__all__ = ["values", "headline", "by_tau", "best_tau", "cell_means", "retrieval", "selected_columns", "selected_numbers",
           "RETRIEVAL_K", "PROFILE_LENGTH", "baselines_line", "schedule_columns"]

#: How many nearest negatives a sweep row keeps (``z_top_negative_1..10``, the similarity profile).
PROFILE_LENGTH = 10
#: The Recall@K the ConVIRT ablation judges retrieval by (mean of the two directions).
RETRIEVAL_K = 5

Row = Dict[str, Any]


def selected_columns(summary: Dict[str, Any]) -> Row:
    """A run's read-out columns: ``probe_accuracy`` and ``knn_accuracy`` of the epoch its val
    probe selected (:func:`~contrastkit.train.selection.selected_numbers`), that ``epoch``, and
    ``last_probe_accuracy`` of the last epoch."""
    selected = selected_numbers(summary)
    return {PROBE_ACCURACY: selected.get(PROBE_ACCURACY), KNN_ACCURACY: selected.get(KNN_ACCURACY),
            "epoch": summary.get("selected_epoch", summary.get("epochs")),
            "last_probe_accuracy": summary.get(PROBE_ACCURACY)}


def schedule_columns(summary: Dict[str, Any], run: str) -> Row:
    """The columns of a run that follows a temperature schedule or method (the schedules and
    temperature-methods studies): :func:`selected_columns`, the held-out view retrieval, the
    tau it ended at, the baselines, the last epoch's loss, the training time and the run's name."""
    return {**selected_columns(summary),
            VIEW_RETRIEVAL_TOP1: selected_numbers(summary).get(VIEW_RETRIEVAL_TOP1, ""),
            "final_temperature": summary.get("final_temperature"),
            baseline_key(PROBE_ACCURACY, RANDOM_INIT): summary.get(baseline_key(PROBE_ACCURACY, RANDOM_INIT), ""),
            baseline_key(PROBE_ACCURACY, RAW_PIXEL): summary.get(baseline_key(PROBE_ACCURACY, RAW_PIXEL), ""),
            "final_loss": summary.get("final_loss"), "train_seconds": summary.get("train_seconds"), "run": run}


def headline(numbers: Dict[str, Any]) -> str:
    """A run's number in a study's live grid: its probe accuracy, or on data without labels its
    held-out view retrieval top-1."""
    if PROBE_ACCURACY not in numbers and VIEW_RETRIEVAL_TOP1 in numbers:
        return f"view top-1 {numbers[VIEW_RETRIEVAL_TOP1]:.3f}"
    return f"{numbers.get(PROBE_ACCURACY, float('nan')):.3f}"


def values(rows: Sequence[Row], key: str, **match: Any) -> List[float]:
    """The finite values of ``key`` in the rows whose fields equal ``match`` (e.g. ``loss="simple"``)."""
    out = []
    for row in rows:
        if all(row.get(field) == wanted for field, wanted in match.items()):
            value = finite(row.get(key))
            if value is not None:
                out.append(value)
    return out


def by_tau(rows: Sequence[Row], loss: str, key: str) -> Dict[float, List[float]]:
    """``{tau: [value per seed]}`` of one loss of a sweep, by increasing tau (missing values left out)."""
    out: Dict[float, List[float]] = {}
    for row in rows:
        value = finite(row.get(key))
        if row["loss"] == loss and value is not None:
            out.setdefault(float(row["tau"]), []).append(value)
    return dict(sorted(out.items()))


def best_tau(rows: Sequence[Row]) -> Optional[float]:
    """The NT-Xent tau of a sweep with the best mean probe accuracy over seeds; ``None``
    without any (no NT-Xent run finished, or data without labels)."""
    accuracy = by_tau(rows, "nt_xent", PROBE_ACCURACY)
    return max(accuracy, key=lambda t: statistics.fmean(accuracy[t])) if accuracy else None


def cell_means(rows: Sequence[Row], key: Callable[[Row], float]) -> Dict[Tuple[float, float], float]:
    """``(lambda, tau)`` -> mean over seeds of ``key(row)`` (the ConVIRT ablation's cells)."""
    cells: Dict[Tuple[float, float], List[float]] = {}
    for row in rows:
        cells.setdefault((float(row["lambda"]), float(row["tau"])), []).append(key(row))
    return {cell: statistics.fmean(v) for cell, v in cells.items()}


def retrieval(row: Row, k: int = RETRIEVAL_K) -> float:
    """A ConVIRT run's retrieval score: mean of image->text and text->image Recall@k."""
    return (float(row[f"i2t_recall@{k}"]) + float(row[f"t2i_recall@{k}"])) / 2.0


def baselines_line(rows: Sequence[Row]) -> List[str]:
    """The table line of the read-out's baselines (the mean over the rows that have them), or
    none when no row has them."""
    random_init = values(rows, baseline_key(PROBE_ACCURACY, RANDOM_INIT))
    pixels = values(rows, baseline_key(PROBE_ACCURACY, RAW_PIXEL))
    if not random_init:
        return []
    return [f"baselines: random-init encoder {statistics.fmean(random_init):.4f}, raw pixels "
            f"{statistics.fmean(pixels):.4f}"]
