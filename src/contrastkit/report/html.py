"""``contrastkit report``: one self-contained HTML file for a run, a sweep or an experiment folder.

The kind of folder is read from its files:

* a pretraining run (``contrastkit pretrain``): ``config.json``, ``metrics.jsonl``,
  ``summary.json`` -> configuration, loss / temperature / learning-rate curves with the batch
  diagnostics and their warnings, the read-out table against the baselines, representation
  metrics when present, and the pictures of its own images (views, neighbors, map, one real
  batch: :mod:`.run_pictures`), drawn from its checkpoint, data and ``last_batch.pt``; next to
  the report, ``explorer.html``: the temperature explorer on the last batch's rows, linked
  from the page;
* a temperature sweep (``contrastkit sweep``): ``sweep.csv`` (+ ``sweep.json``,
  ``verdicts.json`` and its plots) -> verdicts, mean +/- std per setting, the study's plots,
  every run;
* an experiment (``contrastkit experiment ...``): ``experiment.json``, ``verdicts.json`` or
  result tables (``*.csv``) -> its settings, verdicts, tables and plots;
* a study over training budgets (``--budgets``): ``budgets.json`` -> the verdicts by budget,
  the cross-budget table and plots, and the budgets' own study folders.

This module finds the kind of folder and writes the page; each kind's page is built in its own
module (:mod:`.run_page`, :mod:`.sweep_page`, :mod:`.experiment_page`, :mod:`.budgets_page`) from the shared pieces of
:mod:`.sections`, with figures from :mod:`.figures` (matplotlib's Agg canvas, imported lazily)
embedded as base64 PNG; the page has no script and refers to nothing outside itself (but the
explorer page written next to a run's report).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, TextIO, Union

from contrastkit import layout

from .budgets_page import budgets_page
from .document import Page, check_target, write_page
from .experiment_page import experiment_page
from .run_page import run_page
from .sections import GENERATOR
from .sweep_page import sweep_page

__all__ = ["GENERATOR", "REPORT_NAME", "detect_kind", "report_html", "write_report", "report_after_run"]

#: File name of a report written inside the folder it describes.
REPORT_NAME = layout.REPORT

# Defined here as in .document: imported from there, the API reference's build (docs/api/conf.py)
# does not resolve the name in the signatures of write_report and report_html.
PathLike = Union[str, "os.PathLike[str]"]

#: The page of each kind of folder.
PAGES: Dict[str, Callable[[Path], Page]] = {"run": run_page, "sweep": sweep_page, "experiment": experiment_page,
                                            "budgets": budgets_page}


def _folder(path: PathLike) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file; give the folder of a run, a sweep or an experiment")
    return folder


def detect_kind(path: PathLike) -> str:
    """``"run"``, ``"sweep"``, ``"experiment"`` or ``"budgets"`` (a study over training budgets)
    from the folder's files; ValueError if none."""
    folder = _folder(path)
    if (folder / layout.BUDGETS_SETTINGS).is_file():
        return "budgets"
    if (folder / layout.SWEEP_TABLE).is_file():
        return "sweep"
    if any((folder / name).is_file() for name in layout.RUN_MARKERS):
        return "run"
    if (folder / layout.EXPERIMENT_SETTINGS).is_file() or (folder / layout.VERDICTS).is_file() or any(folder.glob("*.csv")):
        return "experiment"
    raise ValueError(
        f"{folder} is not a contrastkit run, sweep or experiment folder: expected summary.json, metrics.jsonl "
        f"or config.json (contrastkit pretrain), sweep.csv (contrastkit sweep), or experiment.json, "
        f"verdicts.json or result .csv files (contrastkit experiment)")


def report_html(path: PathLike, *, pictures: bool = True, explorer_link: Optional[str] = None) -> str:
    """The report of the run, sweep or experiment folder ``path`` as one HTML string;
    ``pictures``: with the pictures of a run's (or a sweep's runs') images; ``explorer_link``:
    the address of the explorer page on a run's last batch, relative to the page."""
    folder = _folder(path)
    kind = detect_kind(folder)
    files = sorted(p.name for p in folder.iterdir() if p.name not in (REPORT_NAME, layout.EXPLORER))
    if kind == "run":
        page = run_page(folder, pictures=pictures, explorer_link=explorer_link)
    elif kind == "sweep":
        page = sweep_page(folder, pictures=pictures)
    else:
        page = PAGES[kind](folder)
    return page.render(footer=f"Folder kind: {kind}. Files: {', '.join(files)}.")


def write_report(path: PathLike, out: Optional[PathLike] = None, *, force: bool = False,
                 pictures: bool = True) -> Path:
    """Write the report of folder ``path`` to ``out`` (default ``path/report.html``) and return it.

    A file at ``out`` is replaced only if it is an earlier contrastkit report, or with
    ``force=True``; otherwise ``FileExistsError``. For a run with a kept last batch (and
    ``pictures``), the explorer on its rows is written to ``path/explorer.html`` first and
    linked from the report. ``pictures=False`` leaves the pictures out (no checkpoint or data read).
    """
    folder = _folder(path)
    target = Path(out) if out is not None else folder / REPORT_NAME
    check_target(target, generator=GENERATOR, force=force)  # before the (slower) drawing
    link = _run_explorer(folder, target) if pictures and detect_kind(folder) == "run" else None
    return write_page(target, report_html(folder, pictures=pictures, explorer_link=link), generator=GENERATOR,
                      force=force)


def _run_explorer(folder: Path, target: Path) -> Optional[str]:
    """Write the explorer on the run's last batch next to the run's files; its address relative
    to the report at ``target`` (``None`` when the run keeps no batch matrix)."""
    from contrastkit.train.last_batch import read_last_batch

    from .explorer import write_run_explorer

    try:
        batch = read_last_batch(str(folder))
    except ValueError:
        return None  # the report says why
    if batch is None or batch.similarities is None:
        return None
    try:
        page = write_run_explorer(folder)
    except FileExistsError:  # a file of the user's is in the way: the report goes without the link
        return None
    return Path(os.path.relpath(page.resolve(), target.resolve().parent)).as_posix()


def report_after_run(run_dir: PathLike, *, stream: Optional[TextIO] = None) -> Optional[Path]:
    """Write ``run_dir/report.html`` at the end of a training run; a problem is printed as a
    one-line warning and never fails the run (its results are already on disk)."""
    stream = sys.stderr if stream is None else stream
    try:
        return write_report(run_dir)
    except (OSError, ValueError, ImportError, RuntimeError) as err:
        print(f"warning: no report written for {run_dir}: {err}", file=stream)
        return None
