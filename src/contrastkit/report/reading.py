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

from contrastkit import records as run_records

__all__ = ["READOUTS", "BASELINES", "REPRESENTATION_KEYS", "read_metrics", "read_csv", "number", "mean_std"]

#: The read-outs of a run's summary: (label, key); a baseline's value is under
#: :func:`contrastkit.records.baseline_key`.
READOUTS = (("linear probe accuracy", run_records.PROBE_ACCURACY), ("kNN accuracy", run_records.KNN_ACCURACY))
#: The pretrained encoder and the baselines it is compared with: (label, baseline of
#: :data:`contrastkit.records.ENCODERS`; ``None``: the pretrained encoder).
BASELINES = (("pretrained encoder", None), ("random-init encoder", run_records.RANDOM_INIT),
             ("raw pixels", run_records.RAW_PIXEL))
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
    """Records of ``metrics.jsonl`` (:func:`contrastkit.records.metrics_record_from_dict`) and the
    number of unreadable lines (an interrupted run may leave a partial last line); a record of an
    unknown format version is a ``ValueError`` naming the file and line."""
    records, bad = [], 0
    with open(path, encoding="utf-8") as handle:
        for number_, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict):
                records.append(run_records.metrics_record_from_dict(record, f"{path} line {number_}"))
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
