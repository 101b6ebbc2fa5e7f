"""What a study is: settings with defaults, a grid of runs, result rows, verdicts, plots.

A :class:`Study` is a plain record of functions; :meth:`Study.run` is the one pipeline every
study goes through (validate the settings, prepare the folder, run the grid, write the
table, the verdicts and the plots). New studies are a new record in
:data:`contrastkit.studies.STUDIES`, not a new command.

Settings are plain JSON-able dicts, stored in the study folder and compared on ``resume``.
Error messages name a setting as the command line spells it (``seeds`` is ``--seeds``), since
the commands pass their options straight through.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from contrastkit import layout

from .grid import RunSpec, check_jobs, check_specs, prepare_out, run_grid, with_run_options
from .verdicts import Verdict

__all__ = ["Study", "StudyResult", "option", "check_counts", "check_numbers", "run_config", "RUN_DEFAULTS"]

Row = Dict[str, Any]

#: Run settings every study has, passed to each run when given (``None``: the trainer's default):
#: the stratified subsets of the splits (``--train-limit`` ...), ``--eval-every``, the epochs
#: at which the val probe is read to pick the epoch whose numbers the verdicts use
#: (:mod:`contrastkit.train.selection`; with 0 or ``None`` that is the last epoch), and the
#: encoder every run trains (``--encoder``, ``--encoder-option``; as ``contrastkit pretrain``).
RUN_DEFAULTS: Dict[str, Any] = {"train_limit": None, "val_limit": None, "test_limit": None, "eval_every": None,
                                "encoder": None, "encoder_options": None}


def option(key: str) -> str:
    """The command-line spelling of a setting: ``batch_size`` -> ``--batch-size``."""
    return "--" + key.replace("_", "-")


def check_counts(settings: Mapping[str, Any]) -> None:
    """``seeds`` and ``epochs`` >= 1 and ``batch_size`` >= 2 (a batch needs a negative); the
    :data:`RUN_DEFAULTS` a study has: ``None`` or ``train_limit`` >= 2, the other limits >= 1,
    ``eval_every`` >= 0."""
    if settings.get("encoder") is not None and not isinstance(settings["encoder"], str):
        raise TypeError(f"--encoder must be a name, got {settings['encoder']!r}")
    if settings.get("encoder_options") is not None and not isinstance(settings["encoder_options"], dict):
        raise TypeError(f"--encoder-option must be KEY=VALUE pairs, got {settings['encoder_options']!r}")
    optional = (("train_limit", 2), ("val_limit", 1), ("test_limit", 1), ("eval_every", 0))
    for key, low in (("seeds", 1), ("epochs", 1), ("batch_size", 2)) + optional:
        if key not in settings or (settings[key] is None and key in RUN_DEFAULTS):
            continue
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{option(key)} must be an integer, got {value!r}")
        if value < low:
            raise ValueError(f"{option(key)} must be >= {low}, got {value}")


def check_numbers(values: Sequence[Any], key: str, low: float, high: float = math.inf) -> List[float]:
    """A non-empty list of distinct finite numbers in ``[low, high]``, sorted."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{option(key)} must be numbers, got {values!r}") from None
    if not numbers:
        raise ValueError(f"{option(key)} is empty")
    bad = [v for v in numbers if not (math.isfinite(v) and low <= v <= high)]
    if bad:
        bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise ValueError(f"{option(key)} must be finite and {bounds}, got {bad}")
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"{option(key)} has repeated values: {numbers}")
    return sorted(numbers)


def run_config(settings: Mapping[str, Any], **fields: Any) -> Dict[str, Any]:
    """A run's :class:`~contrastkit.methods.PretrainConfig` fields: the settings every study shares
    (data options, epochs, batch size, device, threads, the :data:`RUN_DEFAULTS`) plus ``fields``.

    ``threads`` and the :data:`RUN_DEFAULTS` of ``None`` are left out, so that the trainer's own
    defaults apply.
    """
    config = {key: settings[key] for key in ("data_options", "epochs", "batch_size", "device")}
    for key in ("threads",) + tuple(RUN_DEFAULTS):
        if settings.get(key) is not None:
            config[key] = settings[key]
    config.update(fields)
    return config


@dataclass
class StudyResult:
    """What :meth:`Study.run` returns: the settings, the runs and everything written in ``out``."""

    study: "Study"
    out: str
    settings: Dict[str, Any]
    specs: List[RunSpec]
    rows: List[Row]
    verdicts: List[Verdict]
    plots: List[str]

    @property
    def table_path(self) -> str:
        return os.path.join(self.out, self.study.table_file)

    @property
    def verdicts_path(self) -> str:
        return os.path.join(self.out, layout.VERDICTS)

    def table(self) -> str:
        """The study's result table as text."""
        return self.study.table(self.rows)


@dataclass(frozen=True)
class Study:
    """A study, with its settings and their defaults, its runs, its rows, verdicts, table and plots.

    ``settings_file``, ``table_file`` and ``plot_files`` are names from :mod:`contrastkit.layout`.
    ``check(settings)`` validates a complete settings dict and returns it normalised (it may
    raise ``ValueError``); ``hints`` maps a setting the study does not have to the message
    that explains why.

    Run over training budgets (:func:`contrastkit.studies.run_budgets`), every study gets its
    verdicts by budget; ``budget_table(rows)`` (one row per setting of a budget's rows) and
    ``budget_plot([(label, image_steps, rows)], out)`` (writing ``budget_plot_files``) add the
    study's own cross-budget table and plots (``None``: it has none).
    """

    name: str
    description: str
    label: str  # what the folder holds, in messages: "sweep", "convirt ablation"
    title: str  # of the live display
    folder: str  # default output folder under layout.DEFAULT_ROOT
    settings_file: str
    table_file: str
    plot_files: Tuple[str, ...]
    defaults: Mapping[str, Any]
    check: Callable[[Dict[str, Any]], Dict[str, Any]]
    specs: Callable[[Dict[str, Any]], List[RunSpec]]
    rows: Callable[[Sequence[RunSpec]], List[Row]]
    verdicts: Callable[[Sequence[Row]], List[Verdict]]
    table: Callable[[Sequence[Row]], str]
    plot: Callable[[Sequence[Row], str], List[str]]
    cell: Callable[[Dict[str, Any]], str]
    hints: Mapping[str, str] = field(default_factory=dict)
    budget_table: Optional[Callable[[Sequence[Row]], List[Row]]] = None
    budget_plot: Optional[Callable[[Sequence[Tuple[str, int, Sequence[Row]]], str], List[str]]] = None
    budget_plot_files: Tuple[str, ...] = ()

    @property
    def outputs(self) -> Tuple[str, ...]:
        """Every name this study writes in its folder (``force`` deletes those of them its
        manifest lists, and only those)."""
        return (layout.RUNS, self.table_file, self.settings_file, layout.VERDICTS) + tuple(self.plot_files)

    @property
    def default_out(self) -> str:
        return os.path.join(layout.DEFAULT_ROOT, self.folder)

    @property
    def default_budgets_out(self) -> str:
        """The default folder of the study over training budgets (``runs/<folder>-budgets``)."""
        return os.path.join(layout.DEFAULT_ROOT, self.folder + layout.BUDGETS_SUFFIX)

    def settings(self, **options: Any) -> Dict[str, Any]:
        """The complete, validated settings: ``options`` over :attr:`defaults` (``None`` means
        the default). An option the study does not have is a ``ValueError``."""
        unknown = sorted(set(options) - set(self.defaults))
        for key in unknown:
            if options[key] is not None:
                raise ValueError(self.hints.get(key, f"{self.name} has no option {option(key)}"))
        settings = {key: copy.deepcopy(self.defaults[key] if options.get(key) is None else options[key])
                    for key in self.defaults}
        return self.check(settings)

    def run(self, out: Optional[str] = None, *, resume: bool = False, force: bool = False, progress: bool = True,
            jobs: int = 0, run_options: Optional[Mapping[str, bool]] = None, **options: Any) -> StudyResult:
        """Run the study into ``out`` (default ``runs/<folder>``) and write its results.

        ``resume`` continues a folder with the same settings (finished runs are reused);
        ``force`` starts over (deletes :attr:`outputs`, nothing else); ``progress`` shows the
        live grid on a terminal; ``jobs`` runs train at once (:func:`~contrastkit.studies.run_grid`:
        how it runs does not change what it computes, so it is not a setting), and
        ``run_options`` (``{"compile": True, "channels_last": True}``,
        :data:`~contrastkit.studies.RUN_OPTIONS`) are given to every run it trains, for the
        same reason not settings either. ``options`` are settings (see :attr:`defaults`).
        """
        check_jobs(jobs)
        settings = self.settings(**options)
        out = self.default_out if out is None else os.fspath(out)
        specs = with_run_options(self.specs(settings), run_options)
        check_specs(specs)
        manifest = prepare_out(out, resume=resume, force=force, owned=self.outputs, settings=settings,
                               settings_file=self.settings_file, command=self.label)
        run_grid(specs, os.path.join(out, layout.RUNS), title=self.title, progress=progress, cell=self.cell,
                 manifest=manifest, resume=resume, jobs=jobs)
        rows = self.rows(specs)
        manifest.write_csv(self.table_file, rows)
        verdicts = self.verdicts(rows)
        manifest.write_json(layout.VERDICTS, [v.to_dict() for v in verdicts])
        with manifest.writing(*self.plot_files):
            plots = self.plot(rows, out)
        return StudyResult(self, out, settings, specs, rows, verdicts, plots)
