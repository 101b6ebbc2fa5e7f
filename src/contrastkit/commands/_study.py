"""Shared machinery of the study commands (``sweep``, ``experiment``): a grid of pretraining
runs executed through :func:`contrastkit.train.pretrain`, resume-safe output folders, a live
grid display, simple statistics and the verdict records the commands print.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from contrastkit import layout
from contrastkit._io import read_json as _read_json
from contrastkit._io import remove_outputs, write_json

__all__ = ["RunSpec", "Verdict", "parse_data_options", "prepare_out", "run_grid", "mean_std", "spearman",
           "write_json", "read_json", "format_verdicts", "add_common_arguments"]


# ------------------------------------------------------------------------------ arguments

def add_common_arguments(parser: Any, *, epochs_default: int, batch_default: int) -> None:
    """Options every study command shares (data options, training length, output handling)."""
    parser.add_argument("--epochs", type=int, default=epochs_default,
                        help=f"pretraining epochs per run (default {epochs_default})")
    parser.add_argument("--batch-size", type=int, default=batch_default,
                        help=f"pairs per batch (default {batch_default})")
    parser.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a data set option, e.g. train_scenes=240 or clutter=[2,5] (repeatable)")
    parser.add_argument("--device", default="auto", help="torch device (default: CUDA if available, else CPU)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per run (default 1, as contrastkit pretrain; 0 = torch's default)")
    parser.add_argument("--resume", action="store_true",
                        help="continue in an existing output folder: finished runs are skipped")
    parser.add_argument("--force", action="store_true",
                        help="start over in an existing output folder (deletes what this command wrote there)")
    parser.add_argument("--no-progress", action="store_true", help="no live display, one line per run")


def parse_data_options(items: Sequence[str]) -> Dict[str, Any]:
    """``--data-option KEY=VALUE`` items as ``contrastkit pretrain`` reads them (VALUE as JSON
    when it parses)."""
    from contrastkit.commands.pretrain import _parse_data_options

    return _parse_data_options(items)


# ------------------------------------------------------------------------------ files

def read_json(path: str) -> Any:
    return _read_json(path, hint="; remove it or start over with --force")


def prepare_out(out: str, *, resume: bool, force: bool, owned: Iterable[str], settings: Dict[str, Any],
                settings_file: str, command: str) -> None:
    """Make ``out`` ready: a new or empty folder; with ``--force`` the files in ``owned`` are
    deleted first; with ``--resume`` the stored settings must equal ``settings``.

    Anything else in a non-empty folder is never overwritten.
    """
    if resume and force:
        raise ValueError("--resume and --force exclude each other: resume continues, force starts over")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"output path {out} exists and is not a folder")
    settings = json.loads(json.dumps(settings))  # compare as stored
    settings_path = os.path.join(out, settings_file)
    if resume:
        if not os.path.isfile(settings_path):
            raise FileNotFoundError(f"nothing to resume: {settings_path} does not exist")
        stored = read_json(settings_path)
        differing = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        if differing:
            details = ", ".join(f"{k}: stored {stored.get(k)!r} vs now {settings.get(k)!r}" for k in differing)
            raise ValueError(f"{out} holds a {command} with other settings ({details}); "
                             "resume with the same options or start over with --force")
        return
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise FileExistsError(f"output folder {out} is not empty; pass --resume to continue the {command} "
                                  f"in it or --force to start over (deletes {', '.join(owned)})")
        remove_outputs(out, owned)
    os.makedirs(out, exist_ok=True)
    write_json(settings_path, settings)


# ------------------------------------------------------------------------------ runs

@dataclass
class RunSpec:
    """One pretraining run of a grid: ``row`` and ``column`` place it in the display."""

    name: str
    row: str
    column: str
    config: Dict[str, Any]
    baselines: bool = False
    summary: Optional[Dict[str, Any]] = field(default=None, repr=False)


def _execute(spec: RunSpec, run_dir: str, progress: bool) -> Dict[str, Any]:
    """Run (or finish, or reuse) one pretraining run in ``run_dir``."""
    from contrastkit.train import PretrainConfig, pretrain

    summary_path = layout.RunFolder(run_dir).summary
    if os.path.isfile(summary_path):
        return read_json(summary_path)
    config = PretrainConfig(**{**spec.config, "out": run_dir})
    has_checkpoint = os.path.isfile(layout.RunFolder(run_dir).last_checkpoint)
    # A folder without a checkpoint holds an attempt cut off in its first epoch: ours to redo.
    return pretrain(config, resume=has_checkpoint, force=not has_checkpoint, progress=progress,
                    baselines=spec.baselines)


class _Display:
    """A live table of the run grid (rich), or one line per finished run when not a terminal."""

    def __init__(self, title: str, specs: List[RunSpec], enabled: bool,
                 cell: Callable[[Dict[str, Any]], str]) -> None:
        self.title, self.specs, self.cell = title, specs, cell
        self.state = {spec.name: "·" for spec in specs}
        from rich.console import Console

        self.console = Console(stderr=True)
        self.live = None
        if enabled and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self.live.start()

    def _table(self) -> Any:
        from rich.table import Table

        rows = list(dict.fromkeys(spec.row for spec in self.specs))
        columns = list(dict.fromkeys(spec.column for spec in self.specs))
        done = sum(1 for v in self.state.values() if v not in ("·", "running"))
        table = Table(title=f"{self.title}: {done}/{len(self.specs)} runs")
        table.add_column("")
        for column in columns:
            table.add_column(column, justify="center")
        for row in rows:
            cells = []
            for column in columns:
                names = [s.name for s in self.specs if s.row == row and s.column == column]
                cells.append(" ".join(self.state[n] for n in names) if names else "")
            table.add_row(row, *cells)
        return table

    def update(self, spec: RunSpec, status: str, summary: Optional[Dict[str, Any]] = None) -> None:
        self.state[spec.name] = "running" if status == "running" else self.cell(summary or {})
        if self.live is not None:
            self.live.update(self._table())
        elif status != "running":
            done = sum(1 for v in self.state.values() if v not in ("·", "running"))
            print(f"[{done}/{len(self.specs)}] {spec.name}: {status} {self.state[spec.name]}", file=sys.stderr)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def run_grid(specs: List[RunSpec], runs_dir: str, *, title: str, progress: bool,
             cell: Callable[[Dict[str, Any]], str]) -> List[RunSpec]:
    """Run every spec in order (``runs_dir/<name>``), filling ``spec.summary``.

    Runs whose ``summary.json`` exists are reused, interrupted ones resumed from their
    checkpoint, so a grid interrupted at any point can be continued.
    """
    os.makedirs(runs_dir, exist_ok=True)
    display = _Display(title, specs, progress, cell)
    try:
        for spec in specs:
            run_dir = os.path.join(runs_dir, spec.name)
            reused = os.path.isfile(layout.RunFolder(run_dir).summary)
            display.update(spec, "running")
            spec.summary = _execute(spec, run_dir, progress=False)
            display.update(spec, "reused" if reused else "done", spec.summary)
    finally:
        display.close()
    return specs


# ------------------------------------------------------------------------------ statistics

def mean_std(values: Sequence[float]) -> tuple:
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0  # ties share their mean rank
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson correlation of the ranks; ties get mean ranks).

    ``nan`` when either side is constant or there are fewer than 2 points.
    """
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = _ranks(list(x)), _ranks(list(y))
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


# ------------------------------------------------------------------------------ verdicts

HOLDS, FAILS, UNDECIDED = "holds", "does not hold here", "inconclusive"


@dataclass
class Verdict:
    """One claim, what the results say about it, and the numbers behind the call."""

    claim: str
    status: str  # HOLDS, FAILS or UNDECIDED
    evidence: str
    rule: str

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


def format_verdicts(verdicts: Sequence[Verdict]) -> str:
    lines = ["Verdicts (computed from the results above):"]
    for v in verdicts:
        lines.append(f"  [{v.status}] {v.claim}")
        lines.append(f"      {v.evidence}")
        lines.append(f"      rule: {v.rule}")
    return "\n".join(lines)


def gap_verdict(claim: str, better: Sequence[float], worse: Sequence[float], better_name: str,
                worse_name: str) -> Verdict:
    """``worse`` has a lower mean than ``better``: holds when the gap exceeds the larger of
    the two standard deviations, does not hold when ``worse`` is not lower, else inconclusive."""
    mb, sb = mean_std(better)
    mw, sw = mean_std(worse)
    gap = mb - mw
    noise = max(sb, sw)
    if gap <= 0:
        status = FAILS
    elif min(len(better), len(worse)) < 2:
        status = UNDECIDED  # one run per side: no estimate of the seed-to-seed noise
    elif gap > noise:
        status = HOLDS
    else:
        status = UNDECIDED
    evidence = (f"{better_name} {mb:.4f} +/- {sb:.4f} vs {worse_name} {mw:.4f} +/- {sw:.4f} "
                f"(gap {gap:+.4f}, n = {len(better)}/{len(worse)})")
    rule = ("holds if the gap in means is positive and larger than the larger standard deviation over "
            "seeds (needs >= 2 seeds); does not hold if it is <= 0; inconclusive otherwise")
    return Verdict(claim, status, evidence, rule)
