"""A grid of pretraining runs: resume-safe study folders and a live display of the grid.

Each run of a study is one :class:`RunSpec`, executed through :func:`contrastkit.train.pretrain`
into ``OUT/runs/<name>/`` (a ``contrastkit pretrain`` run folder). A finished run (its
``summary.json`` exists) is reused, an interrupted one resumed from its checkpoint, so a study
cut off at any point continues where it stopped.

The study folder's manifest (:mod:`contrastkit.manifest`) lists the study's own files and each
run folder as a nested manifest, so that ``--force`` removes the study's runs through their own
manifests and leaves any other folder in ``OUT/runs/`` alone.

Runs are independent, so a grid runs ``jobs`` of them at once, each in its own process (by
default as many as the cores and the memory allow: :func:`~contrastkit.studies.resolve_jobs`). A run
folder is locked (``flock`` on the folder itself, no lock file) while a process trains in it:
two study processes started on the same folder with ``--resume`` share out its runs instead of
training one twice, and each waits for the runs the other holds before it writes the table.
"""

from __future__ import annotations

import contextlib
import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from contrastkit import layout, records
from contrastkit._io import available_memory as _available_memory  # tests replace it here
from contrastkit._io import read_json as _read_json
from contrastkit.run_writer import FolderWriter, prepare_folder

__all__ = ["RunSpec", "RunBusy", "prepare_out", "check_specs", "check_jobs", "resolve_jobs", "RUN_MEMORY_BYTES",
           "RUN_OPTIONS", "check_run_options", "with_run_options", "run_grid", "read_json"]


@dataclass
class RunSpec:
    """One pretraining run of a grid.

    ``config`` holds :class:`contrastkit.methods.PretrainConfig` fields (``out`` is set by the
    grid); ``row`` and ``column`` place the run in the live display; ``baselines`` asks for the
    random-init and raw-pixel probes; ``summary`` is filled by :func:`run_grid`.
    """

    name: str
    row: str
    column: str
    config: Dict[str, Any]
    baselines: bool = False
    summary: Optional[Dict[str, Any]] = field(default=None, repr=False)


_HINT = "; remove it or start over with --force"


def read_json(path: str) -> Any:
    """A study file's JSON; a corrupt file is a ``ValueError`` saying how to get past it."""
    return _read_json(path, hint=_HINT)


def read_summary(path: str) -> Dict[str, Any]:
    """A run's ``summary.json`` (:func:`contrastkit.records.read_summary`), with the hint of :func:`read_json`."""
    return records.read_summary(path, hint=_HINT)


def prepare_out(out: str, *, resume: bool, force: bool, owned: Iterable[str], settings: Dict[str, Any],
                settings_file: str, command: str) -> FolderWriter:
    """Make a study's ``out`` ready and return its writer (:func:`contrastkit.run_writer.prepare_folder`;
    the runs, listed through their own manifests, are never in ``owned``'s way)."""
    return prepare_folder(out, resume=resume, force=force, owned=[name for name in owned if name != layout.RUNS],
                          settings=settings, settings_file=settings_file, kind=command,
                          not_empty=f"pass --resume to continue the {command} in it or --force to start over "
                                    f"(deletes the files its {layout.MANIFEST} lists as contrastkit's, and the "
                                    "runs it lists through their own)")


def check_specs(specs: Sequence[RunSpec]) -> None:
    """Validate every run's configuration before anything is written or trained, so that a bad
    setting fails at once with the trainer's message rather than in the middle of the grid."""
    from contrastkit.methods import PretrainConfig

    for spec in specs:
        PretrainConfig(**spec.config).resolved()


#: :class:`~contrastkit.methods.PretrainConfig` fields that change how a study's runs compute,
#: not what (``torch.compile``, the channels-last memory layout: the same numbers within float
#: rounding). Like ``jobs`` they are not study settings: every run the study trains gets them,
#: and a study may be resumed with or without them (a run resumed from its checkpoint too).
RUN_OPTIONS = ("compile", "channels_last")


def check_run_options(options: Optional[Mapping[str, Any]]) -> Dict[str, bool]:
    """``options`` (``None``: none) as a dict of :data:`RUN_OPTIONS` to bools, else a ``ValueError``
    naming the option."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(RUN_OPTIONS))
    if unknown:
        raise ValueError(f"unknown run option(s) {', '.join(unknown)}; a study's runs take "
                         f"{', '.join('--' + key.replace('_', '-') for key in RUN_OPTIONS)}")
    for key, value in options.items():
        if not isinstance(value, bool):
            raise ValueError(f"--{key.replace('_', '-')} must be true or false, got {value!r}")
    return options


def with_run_options(specs: Sequence[RunSpec], options: Optional[Mapping[str, Any]]) -> List[RunSpec]:
    """``specs`` with the :data:`RUN_OPTIONS` in ``options`` set in every run's configuration
    (options that are false are left to the run's default)."""
    chosen = {key: value for key, value in check_run_options(options).items() if value}
    if not chosen:
        return list(specs)
    return [replace(spec, config={**spec.config, **chosen}) for spec in specs]


class RunBusy(Exception):
    """Another process holds the run folder's lock (it is training that run now)."""


@contextlib.contextmanager
def _run_lock(run_dir: str, *, wait_for_it: bool) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the run folder (created if missing) for the block.

    ``wait_for_it=False`` raises :class:`RunBusy` when another process holds it. Where
    ``fcntl`` does not exist (Windows) the block runs unlocked: one study process per folder.
    """
    os.makedirs(run_dir, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait_for_it else fcntl.LOCK_NB))
        except BlockingIOError:
            raise RunBusy(run_dir) from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _import_modules(modules: Sequence[str]) -> None:
    """Import ``modules`` (in a study's worker process: the temperature methods' registrations)."""
    import importlib

    for module in modules:
        importlib.import_module(module)


def _execute(spec: RunSpec, run_dir: str, progress: bool, wait_for_it: bool = False) -> Dict[str, Any]:
    """Run (or finish, or reuse) one pretraining run in ``run_dir``, holding its lock
    (:class:`RunBusy` if another process holds it and ``wait_for_it`` is false)."""
    from contrastkit.methods import PretrainConfig
    from contrastkit.train import pretrain

    folder = layout.RunFolder(run_dir)
    if os.path.isfile(folder.summary):
        return read_summary(folder.summary)
    with _run_lock(run_dir, wait_for_it=wait_for_it):
        if os.path.isfile(folder.summary):  # finished by the process we waited for
            return read_summary(folder.summary)
        config = PretrainConfig(**{**spec.config, "out": run_dir})
        has_checkpoint = os.path.isfile(folder.last_checkpoint)
        # A folder without a checkpoint holds an attempt cut off in its first epoch (or an empty
        # folder the lock created): ours to redo.
        return pretrain(config, resume=has_checkpoint, force=not has_checkpoint, progress=progress,
                        baselines=spec.baselines)


#: The memory one study run may need, for ``jobs=0``: the peak of a run of the committed CIFAR-10
#: study (all 60,000 images held in memory, 1.8 GiB), rounded up.
RUN_MEMORY_BYTES = 2 * 2**30


def check_jobs(jobs: Any) -> int:
    """``jobs`` as an int >= 0 (0: :func:`~contrastkit.studies.resolve_jobs` chooses), else a
    ``ValueError`` naming ``--jobs``."""
    from contrastkit.data.base import check_positive_int

    return check_positive_int(jobs, "--jobs", minimum=0)


def resolve_jobs(jobs: int, specs: Sequence[RunSpec], runs_dir: str) -> int:
    """How many runs of ``specs`` train at once: ``jobs`` itself, or for ``0`` as many as
    there are runs left to train, cores for them (one each, or the ``threads`` a run asks
    for) and memory for them (``RUN_MEMORY_BYTES`` each, 2 GiB) -- at least 1; a grid on a GPU
    runs one at a time (its runs share one device).

    Why runs before threads: a small network's step does not scale across cores (2 threads
    trained the small CNN 1.5x faster than 1 on CIFAR-10, benchmarks/results/plain_loop.md),
    while independent runs scale with the cores they get."""
    check_jobs(jobs)
    if jobs:
        return jobs
    from contrastkit.train.setup import resolve_device, resolve_threads

    if any(resolve_device(spec.config.get("device", "auto")).type != "cpu" for spec in specs):
        return 1
    left = sum(1 for spec in specs if not os.path.isfile(layout.RunFolder(os.path.join(runs_dir, spec.name)).summary))
    per_run = max([int(spec.config.get("threads") or 1) for spec in specs] or [1])
    memory = _available_memory()
    by_memory = len(specs) if memory is None else memory // RUN_MEMORY_BYTES
    return max(1, min(left, resolve_threads(0) // per_run, by_memory))


def _threads_per_job(specs: Sequence[RunSpec], jobs: int) -> List[RunSpec]:
    """With ``jobs`` runs at once, a run whose threads are not set gets its share of the cores
    this process may use (at least 1), so that the runs do not oversubscribe the CPU."""
    if jobs <= 1:
        return list(specs)
    from contrastkit.train.setup import resolve_threads

    share = max(1, resolve_threads(0) // jobs)
    return [spec if spec.config.get("threads") else
            RunSpec(spec.name, spec.row, spec.column, {**spec.config, "threads": share}, spec.baselines)
            for spec in specs]


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

    def _done(self) -> int:
        return sum(1 for v in self.state.values() if v not in ("·", "running"))

    def _table(self) -> Any:
        from rich.table import Table

        rows = list(dict.fromkeys(spec.row for spec in self.specs))
        columns = list(dict.fromkeys(spec.column for spec in self.specs))
        table = Table(title=f"{self.title}: {self._done()}/{len(self.specs)} runs")
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
            print(f"[{self._done()}/{len(self.specs)}] {spec.name}: {status} {self.state[spec.name]}", file=sys.stderr)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _register_runs(specs: Sequence[RunSpec], runs_dir: str, manifest: FolderWriter, resume: bool) -> None:
    """List every run folder in the study's manifest before any run starts. A folder already
    in ``runs_dir`` under a run's name that the manifest does not list is someone else's: it
    is refused, except on ``resume`` (the user continues this study: its runs are adopted)."""
    nested = set(manifest.nested)
    names = [os.path.relpath(os.path.join(runs_dir, spec.name), manifest.root).replace(os.sep, "/")
             for spec in specs]
    foreign = [name for name in names if name not in nested and not resume
               and os.path.lexists(os.path.join(manifest.root, name))
               and (not os.path.isdir(os.path.join(manifest.root, name))
                    or os.listdir(os.path.join(manifest.root, name)))]
    if foreign:
        raise FileExistsError(f"{', '.join(foreign)} in {manifest.root} already exist(s) and are not runs "
                              f"this study's {layout.MANIFEST} lists; move them away or choose another --out")
    manifest.add_nested(*[name for name in names if name not in nested])


def run_grid(specs: List[RunSpec], runs_dir: str, *, title: str, progress: bool,
             cell: Callable[[Dict[str, Any]], str], manifest: Optional[FolderWriter] = None,
             resume: bool = False, jobs: int = 0) -> List[RunSpec]:
    """Run every spec (``runs_dir/<name>``), filling ``spec.summary``.

    Runs whose ``summary.json`` exists are reused, interrupted ones resumed from their
    checkpoint, so a grid interrupted at any point can be continued. ``jobs`` runs train at
    once (0: :func:`~contrastkit.studies.resolve_jobs` chooses), each in a process of its own (spawned) when more than
    one; a run without ``threads`` then gets its share of the cores. A run another process is training (its folder is locked) is left to it and
    waited for at the end. ``progress`` shows a live table on a terminal (``cell(summary)`` is a
    finished run's entry), else one line per run on stderr. ``manifest`` (the study folder's,
    from :func:`prepare_out`) gets every run folder as a nested manifest before the first run
    starts; ``resume`` says the study is being continued (run folders it does not list yet are
    adopted rather than refused).
    """
    if manifest is not None:
        _register_runs(specs, runs_dir, manifest, resume)
    os.makedirs(runs_dir, exist_ok=True)
    jobs = resolve_jobs(jobs, specs, runs_dir)
    runnable = _threads_per_job(specs, jobs)
    display = _Display(title, specs, progress, cell)
    busy: List[int] = []

    def finished(index: int, summary: Dict[str, Any], reused: bool) -> None:
        specs[index].summary = summary
        display.update(specs[index], "reused" if reused else "done", summary)

    try:
        if jobs == 1:
            for index, spec in enumerate(runnable):
                run_dir = os.path.join(runs_dir, spec.name)
                reused = os.path.isfile(layout.RunFolder(run_dir).summary)
                display.update(specs[index], "running")
                try:
                    finished(index, _execute(spec, run_dir, False), reused)
                except RunBusy:
                    busy.append(index)
        else:
            import multiprocessing

            # spawn: a fresh interpreter per worker (no forked torch thread pools or locks)
            from contrastkit.temperature_methods import registering_modules

            # ... which imports the modules that registered the temperature methods, a plug-in's
            # too, so that its runs know every method this process does.
            with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_import_modules, initargs=(registering_modules(),)) as pool:
                pending: Dict[Future, int] = {}
                for index, spec in enumerate(runnable):
                    run_dir = os.path.join(runs_dir, spec.name)
                    if os.path.isfile(layout.RunFolder(run_dir).summary):
                        finished(index, read_summary(layout.RunFolder(run_dir).summary), True)
                        continue
                    pending[pool.submit(_execute, spec, run_dir, False)] = index
                try:
                    while pending:
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for future in done:
                            index = pending.pop(future)
                            try:
                                finished(index, future.result(), False)
                            except RunBusy:
                                busy.append(index)
                except BaseException:
                    for future in pending:
                        future.cancel()
                    raise
        for index in busy:  # held by another process: wait for it, then read (or finish) the run
            run_dir = os.path.join(runs_dir, runnable[index].name)
            finished(index, _execute(runnable[index], run_dir, False, wait_for_it=True), True)
    finally:
        display.close()
    return specs
