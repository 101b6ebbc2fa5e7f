"""Where a run's numbers go besides ``metrics.jsonl``: ``--logger csv,tensorboard``.

The trainer hands every record it writes to ``metrics.jsonl`` (one per logged step, one per
epoch) and, at the end, the summary to :class:`Loggers`, which flattens them into named scalars
and passes them to each :class:`Logger`:

* ``train/loss``, ``train/tau``, ``train/lr``, ``train/images_per_second`` per logged step;
* ``epoch/loss``, ``epoch/tau``, ... per epoch, and ``val/...`` (``val/knn_accuracy``,
  ``val/geometry/h/uniformity``, ...) on the epochs with a val evaluation;
* ``online/probe_accuracy`` and ``online/knn_accuracy`` per epoch: the online probe and kNN
  monitor; without labels ``online/view_retrieval_top1`` and ``_top5`` (the online read-out,
  on unless ``--no-online-probe``, :mod:`contrastkit.train.online`);
* ``summary/...`` at the end: the probe table (``summary/probe_accuracy``,
  ``summary/random_init_probe_accuracy``, ``summary/raw_pixel_knn_accuracy``, ...) and the
  geometry of the test split (``summary/representation/h/alignment``, ...); for an unlabeled
  collection the label-free read-out instead of the probe table (``summary/view_retrieval_top1``,
  ``summary/random_init_heldout_loss``, ...), and ``summary/skipped_files``.

The x-axis is the optimizer step. :class:`CSVLogger` writes ``metrics.csv`` (one scalar per
row: ``group,name,step,epoch,value``); :class:`TensorBoardLogger` writes event files under
``tensorboard/`` through :class:`torch.utils.tensorboard.SummaryWriter`. TensorBoard is the
optional ``[tensorboard]`` extra, imported only when that logger is opened.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from typing import Any, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

from contrastkit import layout, records
from contrastkit._io import append_file, atomic_file
from contrastkit.metrics.readout import LABEL_FREE_ROWS

__all__ = ["LOGGER_NAMES", "Logger", "CSVLogger", "TensorBoardLogger", "Loggers", "open_loggers",
           "check_loggers", "flatten_scalars", "probe_table_markdown", "label_free_table_markdown"]

#: The names ``--logger`` accepts.
LOGGER_NAMES: Tuple[str, ...] = ("csv", "tensorboard")
TENSORBOARD_MISSING = "--logger tensorboard needs the tensorboard package: pip install 'contrastkit[tensorboard]'"

# The summary's probe table, in display order (the TensorBoard text table).
_PROBE_ROWS = (("linear probe accuracy", records.PROBE_ACCURACY), ("kNN accuracy", records.KNN_ACCURACY))
_PROBE_COLUMNS = (("pretrained", None), ("random init", records.RANDOM_INIT), ("raw pixels", records.RAW_PIXEL))


class Logger(Protocol):
    """What a logger does: take named scalars of one group at a step, and close."""

    def log_scalars(self, group: str, scalars: Mapping[str, float], *, step: int, epoch: int) -> None:
        """Record ``scalars`` (name -> finite float) of ``group`` (``train``, ``epoch``,
        ``val``, ``summary``) at optimizer step ``step`` of epoch ``epoch``."""

    def log_summary(self, summary: Mapping[str, Any], *, step: int) -> None:
        """Anything beyond the scalars the summary deserves (a table); may do nothing."""

    def flush(self) -> None:
        """Write what is buffered (the trainer calls it once per epoch)."""

    def close(self) -> None:
        """Flush and release the files."""


def flatten_scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[Tuple[str, float]]:
    """The finite numbers of a (nested) record as ``("a/b", value)`` pairs; booleans, strings
    and ``None`` are skipped."""
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_scalars(value, f"{name}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield name, float(value)


class CSVLogger:
    """``metrics.csv``: one row ``group,name,step,epoch,value`` per scalar (a long table: load it
    with ``pandas.read_csv`` and pivot on ``name``)."""

    FIELDS = ("group", "name", "step", "epoch", "value")

    def __init__(self, path: str, *, resume_step: Optional[int] = None) -> None:
        self.path = path
        if resume_step is not None and os.path.isfile(path):
            _drop_rows_after(path, resume_step)
        new = not os.path.isfile(path) or os.path.getsize(path) == 0
        self._handle = append_file(path, newline="", encoding="utf-8")
        self._writer = csv.writer(self._handle)
        if new:
            self._writer.writerow(self.FIELDS)

    def log_scalars(self, group: str, scalars: Mapping[str, float], *, step: int, epoch: int) -> None:
        self._writer.writerows((group, name, step, epoch, repr(float(value))) for name, value in scalars.items())

    def log_summary(self, summary: Mapping[str, Any], *, step: int) -> None:
        pass

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def _drop_rows_after(path: str, step: int) -> None:
    """Keep the rows a resumed run's checkpoint covers (steps up to ``step``; no summary)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    kept = [row for row in rows[1:] if len(row) == len(CSVLogger.FIELDS) and row[0] != "summary"
            and row[2].isdigit() and int(row[2]) <= step]
    with atomic_file(path, newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSVLogger.FIELDS)
        writer.writerows(kept)


class TensorBoardLogger:
    """Event files in ``log_dir`` (:class:`torch.utils.tensorboard.SummaryWriter`): each scalar
    under the tag ``group/name``, and the summary's probe table as text (``summary/probe_table``).
    On resume the events after the checkpoint's step are purged."""

    def __init__(self, log_dir: str, *, resume_step: Optional[int] = None) -> None:
        check_loggers(["tensorboard"])
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(log_dir=log_dir, purge_step=purge)

    def log_scalars(self, group: str, scalars: Mapping[str, float], *, step: int, epoch: int) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(f"{group}/{name}", value, global_step=step)

    def log_summary(self, summary: Mapping[str, Any], *, step: int) -> None:
        for tag, table in (("summary/probe_table", probe_table_markdown(summary)),
                           ("summary/label_free_table", label_free_table_markdown(summary))):
            if table:
                self._writer.add_text(tag, table, global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def probe_table_markdown(summary: Mapping[str, Any]) -> str:
    """The probe table of a summary (pretrained vs random init vs raw pixels) as Markdown."""
    return _table_markdown(summary, _PROBE_ROWS, "test split")


def label_free_table_markdown(summary: Mapping[str, Any]) -> str:
    """The label-free read-out of a summary (an unlabeled collection's run: pretrained vs random
    init vs raw pixels on the held-out split) as Markdown; ``""`` when it has none."""
    return _table_markdown(summary, LABEL_FREE_ROWS, "held-out split")


def _table_markdown(summary: Mapping[str, Any], rows: Sequence[Tuple[str, str]], corner: str) -> str:
    lines = [f"| {corner} | " + " | ".join(title for title, _ in _PROBE_COLUMNS) + " |",
             "|---" * (len(_PROBE_COLUMNS) + 1) + "|"]
    found = False
    for title, key in rows:
        cells = []
        for _, baseline in _PROBE_COLUMNS:
            value = summary.get(records.baseline_key(key, baseline))
            found = found or value is not None
            cells.append("-" if value is None else f"{value:.3f}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if found else ""


class Loggers:
    """The run's loggers together (none: every call does nothing): turns the trainer's records
    into groups of scalars for each."""

    def __init__(self, loggers: Sequence[Logger] = ()) -> None:
        self.loggers: List[Logger] = list(loggers)

    def record(self, record: Mapping[str, Any]) -> None:
        """A ``metrics.jsonl`` record (``kind`` ``step`` or ``epoch``, with ``step`` and ``epoch``)."""
        if not self.loggers:
            return
        step, epoch = int(record["step"]), int(record["epoch"])
        numbers = {key: value for key, value in record.items() if key not in ("kind", "step", "epoch")}
        if record.get("kind") == records.STEP:
            self._log("train", numbers, step, epoch)
            return
        val = {key[len("val_"):]: value for key, value in numbers.items() if key.startswith("val_")}
        online = {key[len("online_"):]: value for key, value in numbers.items() if key.startswith("online_")}
        self._log("epoch", {key: value for key, value in numbers.items()
                            if not key.startswith(("val_", "online_"))}, step, epoch)
        if val:
            self._log("val", val, step, epoch)
        if online:
            self._log("online", online, step, epoch)

    def summary(self, summary: Mapping[str, Any], *, step: int, epoch: int) -> None:
        """The final numbers (``summary.json``)."""
        self._log("summary", summary, step, epoch)
        for logger in self.loggers:
            logger.log_summary(summary, step=step)

    def _log(self, group: str, record: Mapping[str, Any], step: int, epoch: int) -> None:
        scalars = dict(flatten_scalars(record))
        if scalars:
            for logger in self.loggers:
                logger.log_scalars(group, scalars, step=step, epoch=epoch)

    def flush(self) -> None:
        for logger in self.loggers:
            logger.flush()

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []


def check_loggers(names: Sequence[str]) -> None:
    """Refuse an unknown logger name, or ``tensorboard`` where the package is not installed
    (before a run does any work)."""
    for name in names:
        if name not in LOGGER_NAMES:
            raise ValueError(f"unknown logger {name!r}; choose from {', '.join(LOGGER_NAMES)}")
    if "tensorboard" in names and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(TENSORBOARD_MISSING)


def open_loggers(names: Sequence[str], folder: layout.RunFolder, *, resume_step: Optional[int] = None) -> Loggers:
    """The loggers ``names`` writing into the run folder ``folder`` (``resume_step``: the step
    of the checkpoint a resumed run continues from; later rows/events are dropped)."""
    check_loggers(names)
    opened: List[Logger] = []
    try:
        for name in names:
            if name == "csv":
                opened.append(CSVLogger(folder.metrics_csv, resume_step=resume_step))
            else:
                opened.append(TensorBoardLogger(folder.tensorboard, resume_step=resume_step))
    except BaseException:
        Loggers(opened).close()
        raise
    return Loggers(opened)
