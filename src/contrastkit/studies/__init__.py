"""Studies: grids of pretraining runs that answer a claim of the source texts with a verdict.

The layer between :mod:`contrastkit.train` (one run) and ``contrastkit.commands`` (the
command line). A study runs a grid of ``contrastkit pretrain`` runs into one resume-safe
folder, tabulates them, judges each claim by a stated rule (:mod:`.verdicts`) from simple
statistics (:mod:`.stats`), and draws its plots (:mod:`.plots`)::

    from contrastkit import studies

    result = studies.run_sweep("runs/sweep", temperatures=[0.1, 0.5], seeds=2, epochs=20)
    print(result.table())
    print(studies.format_verdicts(result.verdicts))

    studies.run_experiment("positive-pairs", seeds=3)       # folder runs/experiment-positive-pairs

    # the same sweep at three training budgets (SIZExEPOCHS), one folder each, and the claims across them
    result = studies.run_budgets("sweep", "runs/sweep-budgets", budgets="5000x18,15000x20,45000x20")
    print(studies.format_budget_verdicts(result.claims))

The studies (:data:`STUDIES`; ``contrastkit experiment NAME`` offers :data:`EXPERIMENTS`):

``sweep`` (:mod:`.sweep`)
    NT-Xent, hard-negative NT-Xent and the simple loss over tau x seeds, against the claims of
    Wang & Liu (CVPR 2021): the reverse-U of accuracy, uniformity and tolerance rising with
    tau, their trade-off, the simple loss far worse, hard negatives less sensitive to tau.
``positive-pairs`` (:mod:`.positive_pairs`)
    The textbook, section 30.2, exercise F5: GlyphLab pair definitions A vs B vs random init.
``convirt-ablation`` (:mod:`.convirt_ablation`)
    The ConVIRT tutorial: direction weight lambda x temperature, judged by retrieval.
``schedules`` (:mod:`.schedules`)
    A fixed tau vs a cosine schedule (Kukleva et al., ICLR 2023) vs a rising tau (Wang & Liu).
``temperature-methods`` (:mod:`.temperature_methods`)
    MACL, dual temperature, iSogCLR and TempNet, each against the best fixed tau of a sweep.

Every run's numbers are those of the epoch its val probe selected (``eval_every``; the
textbook, section 30.2, exercise F5; :mod:`contrastkit.train.selection`).

Every study also runs over training budgets (:func:`run_budgets`, :mod:`.budgets`): once per
budget, each in a folder of its own, and each claim's verdict at every budget.

Each study is a :class:`Study` record (defaults, runs, rows, verdicts, table, plots); the
folder names come from :mod:`contrastkit.layout`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .budgets import run_budgets as _run_budgets
from .budgets import (Budget, BudgetResult, ClaimAcrossBudgets, check_budgets, claims_across_budgets,
                      format_budget_verdicts)
from .convirt_ablation import CONVIRT_ABLATION
from .grid import RUN_OPTIONS, RunSpec, prepare_out, resolve_jobs, run_grid
from .positive_pairs import POSITIVE_PAIRS
from .schedules import SCHEDULES
from .stats import binomial_standard_error, mean_std, spearman, standard_error
from .study import Study, StudyResult
from .sweep import SWEEP
from .temperature_methods import TEMPERATURE_METHODS
from .verdicts import FAILS, HOLDS, STATUSES, UNDECIDED, Verdict, format_verdicts, gap_verdict

__all__ = [
    "STUDIES", "EXPERIMENTS", "get_study", "run_study", "run_sweep", "run_experiment", "run_budgets",
    "Budget", "BudgetResult", "ClaimAcrossBudgets", "check_budgets", "claims_across_budgets", "format_budget_verdicts",
    "Study", "StudyResult", "RunSpec", "run_grid", "resolve_jobs", "prepare_out", "RUN_OPTIONS",
    "Verdict", "HOLDS", "FAILS", "UNDECIDED", "STATUSES", "format_verdicts", "gap_verdict",
    "mean_std", "standard_error", "binomial_standard_error", "spearman",
    "SWEEP", "POSITIVE_PAIRS", "CONVIRT_ABLATION", "SCHEDULES", "TEMPERATURE_METHODS",
]

#: Every study by name.
STUDIES: Dict[str, Study] = {study.name: study for study in (SWEEP, POSITIVE_PAIRS, CONVIRT_ABLATION, SCHEDULES,
                                                            TEMPERATURE_METHODS)}
#: The studies ``contrastkit experiment NAME`` runs (the sweep has its own command).
EXPERIMENTS: Dict[str, Study] = {name: study for name, study in STUDIES.items() if name != SWEEP.name}


def get_study(name: str) -> Study:
    """The study called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return STUDIES[name]
    except KeyError:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(sorted(STUDIES))}") from None


def run_study(name: str, out: Optional[str] = None, *, resume: bool = False, force: bool = False,
              progress: bool = True, jobs: int = 0, run_options: Optional[Mapping[str, bool]] = None,
              **settings: Any) -> StudyResult:
    """Run the study ``name`` into ``out`` (default ``runs/<its folder>``); see :meth:`Study.run`
    (``run_options``: ``compile``, ``channels_last`` for every run, not settings).

    ``settings`` override the study's defaults (:attr:`Study.defaults`; ``None`` keeps one).
    """
    return get_study(name).run(out, resume=resume, force=force, progress=progress, jobs=jobs,
                               run_options=run_options, **settings)


def run_sweep(out: Optional[str] = None, *, resume: bool = False, force: bool = False, progress: bool = True,
              jobs: int = 0, run_options: Optional[Mapping[str, bool]] = None,
              **settings: Any) -> StudyResult:
    """The temperature sweep (:data:`SWEEP`): settings ``data``, ``data_options``,
    ``temperatures``, ``seeds``, ``views``, ``epochs``, ``batch_size``, ``device``, ``threads``
    (``None``: the trainer's default), ``variants`` (a list among ``"hard_negative"``, ``"simple"``, or
    "hard-negative,simple"; default both) and ``no_variants`` (none); default folder ``runs/sweep``."""
    return run_study(SWEEP.name, out, resume=resume, force=force, progress=progress, jobs=jobs,
                     run_options=run_options, **settings)


def run_budgets(name: str, out: Optional[str] = None, *, budgets: Any, resume: bool = False, force: bool = False,
                progress: bool = True, jobs: int = 0, run_options: Optional[Mapping[str, bool]] = None,
                **settings: Any) -> BudgetResult:
    """The study ``name`` at every training budget of ``budgets`` (``"5000x18,45000x20"``: training
    images x epochs), each in ``out/budget-SIZExEPOCHS/``, with the cross-budget view in ``out``
    (default ``runs/<its folder>-budgets``). ``settings`` are the study's but ``epochs`` and
    ``train_limit`` (each budget sets them); ``resume`` continues the whole folder: a budget already
    run is read back (its finished runs are not trained again), the others run."""
    return _run_budgets(get_study(name), out, budgets=budgets, resume=resume, force=force, progress=progress, jobs=jobs,
                        run_options=run_options, **settings)


def run_experiment(name: str, out: Optional[str] = None, *, resume: bool = False, force: bool = False,
                   progress: bool = True, jobs: int = 0, run_options: Optional[Mapping[str, bool]] = None,
                   **settings: Any) -> StudyResult:
    """One of :data:`EXPERIMENTS` (``positive-pairs``, ``convirt-ablation``, ``schedules``); default folder
    ``runs/experiment-NAME``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    return run_study(name, out, resume=resume, force=force, progress=progress, jobs=jobs,
                     run_options=run_options, **settings)
