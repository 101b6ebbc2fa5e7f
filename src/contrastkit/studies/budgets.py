"""A study over training budgets: the same study at several budgets, and what changes between them.

A *budget* is what one run of the study trains on: a class-stratified subset of ``SIZE``
training images (as ``--train-limit``) for ``EPOCHS`` epochs, written ``SIZExEPOCHS``; its size
in *image-steps* is ``SIZE x EPOCHS`` (the images one run passes through the encoder, each in
two views). Wang & Liu (CVPR 2021) trained for hundreds of epochs on full data sets; whether a
claim that does not hold at a small budget holds at a larger one is a question of this axis.

:func:`run_budgets` runs a :class:`~contrastkit.studies.Study` once per budget, each into a study
folder of its own (``OUT/budget-5000x18/``: the study's usual files, resumable and readable on
its own), then writes the cross-budget view in ``OUT``:

* ``verdicts_by_budget.json``: every claim's status at each budget and whether (and where) it
  changes between budgets (:func:`claims_across_budgets`, from the study's own verdicts);
* the study's cross-budget table and plots when it has them (:attr:`Study.budget_table`,
  :attr:`Study.budget_plot`): for the sweep, ``budgets.csv`` (per budget and setting the mean
  probe and kNN accuracy, uniformity, tolerance, and the best tau) and the curves against tau
  with one line per budget, and the best tau against the budget.

``--resume`` continues such a folder with the same settings (``budgets.json``): a budget whose
study folder exists is resumed as that study resumes (finished runs are read back, not
trained again), a budget not started yet is started.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from contrastkit import layout
from contrastkit.run_writer import FolderWriter

from .grid import check_jobs, check_run_options, check_specs, prepare_out, with_run_options
from .study import Study, StudyResult, option
from .verdicts import Verdict

__all__ = ["Budget", "BudgetResult", "ClaimAcrossBudgets", "NOT_JUDGED", "check_budgets", "claims_across_budgets",
           "describe_statuses", "format_budget_verdicts", "run_budgets", "image_steps_text"]

#: A claim a budget's study did not judge (e.g. the simple-loss claim where no simple run has a number).
NOT_JUDGED = "not judged"

_BUDGET = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")
_OPTION = "--budgets"


def image_steps_text(steps: int) -> str:
    """A count of image-steps in short: ``90000`` -> ``90k``, ``1500000`` -> ``1.5M``."""
    if steps >= 1_000_000:
        return f"{steps / 1e6:.3g}M"
    return f"{steps / 1e3:.3g}k" if steps >= 1000 else str(steps)


@dataclass(frozen=True)
class Budget:
    """One training budget: ``train_size`` training images (a class-stratified subset) for
    ``epochs`` epochs."""

    train_size: int
    epochs: int

    @property
    def label(self) -> str:
        """``SIZExEPOCHS``, as ``--budgets`` spells it: ``5000x18``."""
        return f"{self.train_size}x{self.epochs}"

    @property
    def image_steps(self) -> int:
        """The images one run trains on, summed over its epochs (``train_size * epochs``)."""
        return self.train_size * self.epochs

    @property
    def folder(self) -> str:
        """Its study folder inside the study over budgets (:func:`contrastkit.layout.budget_folder`)."""
        return layout.budget_folder(self.label)

    def describe(self) -> str:
        """``5000x18 (90k image-steps)``."""
        return f"{self.label} ({image_steps_text(self.image_steps)} image-steps)"


BudgetLike = Union[str, Budget, Sequence[int]]


def _budget(item: BudgetLike) -> Budget:
    if isinstance(item, Budget):
        size, epochs, shown = item.train_size, item.epochs, item.label
    elif isinstance(item, str):
        match = _BUDGET.fullmatch(item)
        if match is None:
            raise ValueError(f"{_OPTION}: {item.strip()!r} is not SIZExEPOCHS (training images x epochs, "
                             "e.g. 5000x18)")
        size, epochs, shown = int(match.group(1)), int(match.group(2)), item.strip()
    else:
        try:
            size, epochs = item
        except (TypeError, ValueError):
            raise ValueError(f"{_OPTION}: {item!r} is not SIZExEPOCHS or a (size, epochs) pair") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (size, epochs)):
            raise ValueError(f"{_OPTION}: {item!r} must be two integers (size, epochs)")
        shown = f"{size}x{epochs}"
    if size < 2:
        raise ValueError(f"{_OPTION}: {shown}: the training-set size must be >= 2 (a batch needs a negative)")
    if epochs < 1:
        raise ValueError(f"{_OPTION}: {shown}: the epochs must be >= 1")
    return Budget(size, epochs)


def check_budgets(budgets: Union[str, Sequence[BudgetLike]]) -> List[Budget]:
    """The budgets of ``budgets`` (``"5000x18,15000x20"``, or a list of such strings,
    :class:`Budget` or ``(size, epochs)`` pairs), distinct, by increasing image-steps (then
    size); ``ValueError`` naming ``--budgets`` otherwise."""
    items: Sequence[BudgetLike] = [part for part in budgets.split(",") if part.strip()] if isinstance(
        budgets, str) else list(budgets)
    if not items:
        raise ValueError(f"{_OPTION} is empty: give SIZExEPOCHS values, comma-separated (e.g. 5000x18,45000x20)")
    parsed = [_budget(item) for item in items]
    repeated = sorted({b.label for b in parsed if parsed.count(b) > 1})
    if repeated:
        raise ValueError(f"{_OPTION} has repeated budgets: {', '.join(repeated)}")
    return sorted(parsed, key=lambda b: (b.image_steps, b.train_size))


# ------------------------------------------------------------------------------ verdicts across budgets

@dataclass
class ClaimAcrossBudgets:
    """One claim's status at each budget (in increasing budget order), and its evidence there."""

    claim: str
    budgets: List[str]  # each budget's Budget.describe()
    statuses: List[str]
    evidence: List[str]

    @property
    def changes(self) -> bool:
        """Whether the status is not the same at every budget."""
        return len(set(self.statuses)) > 1

    @property
    def where(self) -> str:
        """Where each status holds, in one line (``holds at A, does not hold here from B on``)."""
        return describe_statuses(self.budgets, self.statuses)

    def to_dict(self) -> Dict[str, Any]:
        """The claim as ``verdicts_by_budget.json`` lists it: ``by_budget`` in budget order."""
        return {"claim": self.claim, "changes": self.changes, "where": self.where,
                "by_budget": [{"budget": budget, "status": status, "evidence": evidence}
                              for budget, status, evidence in zip(self.budgets, self.statuses, self.evidence)]}


def describe_statuses(budgets: Sequence[str], statuses: Sequence[str]) -> str:
    """One line on a claim's ``statuses`` at ``budgets`` (same length, increasing budget
    order): ``"holds at every budget"``, or each run of equal statuses with where it lies:
    ``"holds at A, does not hold here from B on"``, ``"inconclusive up to B, holds from C on"``,
    ``"... from B to C ..."``."""
    if len(budgets) != len(statuses) or not budgets:
        raise ValueError("one status per budget, and at least one budget")
    if len(set(statuses)) == 1:
        return f"{statuses[0]} at {'every budget' if len(budgets) > 1 else budgets[0]}"
    parts, start, last = [], 0, len(budgets) - 1
    for end in range(len(statuses)):
        if end < last and statuses[end + 1] == statuses[start]:
            continue
        if start == end:
            where = f"at {budgets[start]}"
        elif start == 0:
            where = f"up to {budgets[end]}"
        elif end == last:
            where = f"from {budgets[start]} on"
        else:
            where = f"from {budgets[start]} to {budgets[end]}"
        parts.append(f"{statuses[start]} {where}")
        start = end + 1
    return ", ".join(parts)


def claims_across_budgets(budgets: Sequence[str], verdicts: Sequence[Sequence[Verdict]]) -> List[ClaimAcrossBudgets]:
    """Each claim of ``verdicts`` (one list per budget, the study's own verdicts at it) with its
    status at every budget, in the order the claims first appear; a claim missing at a budget
    is ``"not judged"`` there (``NOT_JUDGED``)."""
    if len(budgets) != len(verdicts):
        raise ValueError("one verdict list per budget")
    by_claim: Dict[str, Dict[int, Verdict]] = {}
    for index, found in enumerate(verdicts):
        for verdict in found:
            by_claim.setdefault(verdict.claim, {})[index] = verdict
    out = []
    for claim, at in by_claim.items():
        judged = [at.get(i) for i in range(len(budgets))]
        out.append(ClaimAcrossBudgets(claim, list(budgets), [v.status if v else NOT_JUDGED for v in judged],
                                      [v.evidence if v else "" for v in judged]))
    return out


def format_budget_verdicts(claims: Sequence[ClaimAcrossBudgets]) -> str:
    """The verdicts by budget as the study commands print them: per claim, whether it changes
    between budgets, and where each status holds."""
    lines = ["Verdicts by budget (each budget's own verdicts; the evidence is in its folder's "
             f"{layout.VERDICTS}):"]
    for claim in claims:
        lines.append(f"  [{'changes' if claim.changes else 'same'}] {claim.claim}")
        lines.append(f"      {claim.where}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ running

@dataclass
class BudgetResult:
    """What :func:`run_budgets` returns: the settings, each budget's study result, the claims
    across budgets, the cross-budget table's rows and every file written in ``out``."""

    study: Study
    out: str
    settings: Dict[str, Any]
    budgets: List[Budget]
    results: List[StudyResult]
    claims: List[ClaimAcrossBudgets]
    table: List[Dict[str, Any]]
    plots: List[str]
    warnings: List[str]

    @property
    def verdicts_path(self) -> str:
        return os.path.join(self.out, layout.VERDICTS_BY_BUDGET)

    @property
    def table_path(self) -> Optional[str]:
        return os.path.join(self.out, layout.BUDGETS_TABLE) if self.study.budget_table is not None else None

    def best_taus(self) -> Dict[str, Any]:
        """Each budget's best tau as the cross-budget table has it (``""``: none)."""
        best: Dict[str, Any] = {}
        for row in self.table:
            best.setdefault(row["budget"], row.get("best_tau", ""))
        return best


def _outputs(study: Study) -> List[str]:
    return ([layout.BUDGETS_SETTINGS, layout.VERDICTS_BY_BUDGET]
            + ([layout.BUDGETS_TABLE] if study.budget_table is not None else []) + list(study.budget_plot_files))


def _train_images(result: StudyResult) -> Optional[int]:
    """The training images a budget's runs had (the data's split may be smaller than the
    budget's size), from its first finished run's ``config.json``."""
    for spec in result.specs:
        try:
            record = layout.read_run_record(os.path.join(result.out, layout.RUNS, spec.name))
            return int(record["derived"]["dataset"]["sizes"]["train"])  # type: ignore[index]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def run_budgets(study: Study, out: Optional[str] = None, *, budgets: Union[str, Sequence[BudgetLike]],
                resume: bool = False, force: bool = False, progress: bool = True, jobs: int = 0,
                run_options: Optional[Mapping[str, bool]] = None, **options: Any) -> BudgetResult:
    """Run ``study`` at every budget of ``budgets`` (:func:`check_budgets`) into
    ``out/budget-SIZExEPOCHS/`` (default ``out``: ``runs/<its folder>-budgets``) and write the
    cross-budget view in ``out`` (the module's docstring lists it).

    ``options`` are the study's settings but ``epochs`` and ``train_limit``, which each budget
    sets; ``resume``, ``force``, ``progress``, ``jobs`` and ``run_options`` as in :meth:`Study.run`
    (``resume`` over the whole folder: budgets already run are read back, the others run).
    """
    check_jobs(jobs)
    run_options = check_run_options(run_options)
    chosen = check_budgets(budgets)
    for key in ("epochs", "train_limit"):
        if options.get(key) is not None:
            raise ValueError(f"{_OPTION} sets each run's training-set size and epochs: leave out {option(key)}")
    per_budget = [study.settings(**{**options, "epochs": b.epochs, "train_limit": b.train_size}) for b in chosen]
    for settings in per_budget:  # every budget's runs are valid before the first one trains
        check_specs(with_run_options(study.specs(settings), run_options))
    stored = {key: value for key, value in per_budget[0].items() if key not in ("epochs", "train_limit")}
    stored["budgets"] = [b.label for b in chosen]
    out = study.default_budgets_out if out is None else os.fspath(out)
    label = f"{study.label} over budgets"
    manifest = prepare_out(out, resume=resume, force=force, owned=_outputs(study), settings=stored,
                           settings_file=layout.BUDGETS_SETTINGS, command=label)
    manifest.add_nested(*[b.folder for b in chosen if b.folder not in manifest.nested])
    results = []
    for budget in chosen:
        folder = os.path.join(out, budget.folder)
        started = os.path.isfile(os.path.join(folder, study.settings_file))
        # a budget cut off before its settings were written holds only contrastkit's files: start it over
        cut_off = not started and FolderWriter(folder).exists()
        at_budget = dataclasses.replace(study, title=f"{study.title}, budget {budget.describe()}")
        results.append(at_budget.run(folder, resume=started, force=cut_off, progress=progress, jobs=jobs,
                                     run_options=run_options, **{**options, "epochs": budget.epochs, "train_limit": budget.train_size}))
    warnings = []
    images = [_train_images(result) for result in results]
    for budget, found in zip(chosen, images):
        if found is not None and found < budget.train_size:
            warnings.append(f"budget {budget.label}: the training split has only {found} images, so its runs "
                            f"trained {image_steps_text(found * budget.epochs)} image-steps, not "
                            f"{image_steps_text(budget.image_steps)}")
    described = [b.describe() for b in chosen]
    claims = claims_across_budgets(described, [result.verdicts for result in results])
    manifest.write_json(layout.VERDICTS_BY_BUDGET, {
        "budgets": [{"budget": b.label, "name": b.describe(), "train_size": b.train_size, "epochs": b.epochs,
                     "image_steps": b.image_steps, "train_images": found, "folder": b.folder} for b, found in zip(chosen, images)],
        "claims": [claim.to_dict() for claim in claims], "warnings": warnings})
    table: List[Dict[str, Any]] = []
    if study.budget_table is not None:
        for budget, found, result in zip(chosen, images, results):
            columns = {"budget": budget.label, "train_size": budget.train_size, "epochs": budget.epochs,
                       "image_steps": budget.image_steps, "train_images": "" if found is None else found}
            table.extend({**columns, **row} for row in study.budget_table(result.rows))
        manifest.write_csv(layout.BUDGETS_TABLE, table)
    plots: List[str] = []
    if study.budget_plot is not None:
        with manifest.writing(*study.budget_plot_files):
            plots = study.budget_plot([(b.label, b.image_steps, r.rows) for b, r in zip(chosen, results)], out)
    return BudgetResult(study, out, stored, chosen, results, claims, table, plots, warnings)
