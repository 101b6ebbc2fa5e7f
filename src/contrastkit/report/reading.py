"""Reading what a run or study folder holds, for its report: the records of ``metrics.jsonl``,
result tables (CSV cells that are numbers become floats), the keys of a run's ``summary.json``
that the report shows together, and the mean and spread of a value over seeds."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["READOUTS", "BASELINES", "REPRESENTATION_KEYS", "read_metrics", "read_csv", "number", "mean_std"]

#: The read-outs of a run's summary: (label, key); a baseline's value is under its prefix + key.
READOUTS = (("linear probe accuracy", "probe_accuracy"), ("kNN accuracy", "knn_accuracy"))
#: The pretrained encoder and the baselines it is compared with: (label, key prefix in summary.json).
BASELINES = (("pretrained encoder", ""), ("random-init encoder", "random_init_"), ("raw pixels", "raw_pixel_"))
#: The representation metrics of summary.json's "representation" (per space z, h): (label, key, meaning).
REPRESENTATION_KEYS = (
    ("alignment", "alignment", "E||f(x) − f(y)||² over positive pairs; lower is better aligned"),
    ("uniformity", "uniformity", "log E exp(−2||f(x) − f(y)||²); lower is more uniform"),
    ("tolerance", "tolerance", "mean similarity of same-class pairs; higher is more tolerant"),
    ("positive similarity", "positive_similarity", "mean similarity of the two views"),
    ("penalty entropy", "penalty_entropy", "entropy of the penalty over negatives on real batches (nats)"),
    ("penalty entropy max", "penalty_entropy_max", "log(2b − 2): all negatives weigh the same"),
    ("effective rank", "effective_rank", "exp of the entropy of the normalised singular values"),
)


def read_metrics(path: Path) -> Tuple[List[Dict[str, Any]], int]:
    """Records of ``metrics.jsonl`` and the number of unreadable lines (an interrupted run may
    leave a partial last line)."""
    records, bad = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                bad += 1
    return records, bad


def number(value: Any) -> Optional[float]:
    """``value`` as a float, or None when it is missing, a boolean, NaN or not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(float(value)) else float(value)
    try:
        parsed = float(str(value).strip())
    except ValueError:
        return None
    return None if math.isnan(parsed) else parsed


def read_csv(path: Path) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Header and rows; a cell that parses as a number becomes a float, an empty one None."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:
            raise ValueError(f"{path} is empty: expected a header line")
        header = list(reader.fieldnames)
        rows = []
        for row in reader:
            parsed: Dict[str, Any] = {}
            for key in header:
                cell = row.get(key)
                if cell is None or cell == "":
                    parsed[key] = None
                else:
                    value = number(cell)
                    parsed[key] = value if value is not None else cell
            rows.append(parsed)
    return header, rows


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
