"""What the subcommands share: the usage error, option parsing and the result printers.

Light to import (no torch): :mod:`contrastkit.cli` imports it for every command.
"""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from contrastkit import records
from contrastkit._io import escape_line

__all__ = ["UsageError", "parse_data_options", "parse_numbers", "parse_names", "add_config_argument",
           "apply_config_file", "config_defaults", "add_study_arguments", "study_options", "run_study_command",
           "print_result_table", "print_study", "print_budgets", "print_skipped"]

#: Skipped rows printed by name; the JSON output lists them all.
_SKIPPED_SHOWN = 10


class UsageError(Exception):
    """An error in what the user asked for; printed as one line, exit status 2."""


def parse_data_options(items: Optional[Sequence[str]], option: str = "--data-option") -> Dict[str, Any]:
    """``--data-option KEY=VALUE`` items (or another ``option``'s) as a dict (VALUE parsed as
    JSON when it can be)."""
    options: Dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} must look like KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def parse_numbers(text: Optional[str], option: str) -> Optional[List[float]]:
    """A comma-separated list of numbers (``None`` stays ``None``: the default)."""
    if text is None:
        return None
    try:
        return [float(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} must be comma-separated numbers, got {text!r}") from None


def parse_names(text: Optional[str], option: str, known: Sequence[str]) -> Optional[List[str]]:
    """A comma-separated list of names out of ``known`` (``None`` stays ``None``: the default;
    ``""`` or ``none``: no names)."""
    if text is None:
        return None
    names = [part.strip() for part in str(text).split(",") if part.strip() and part.strip() != "none"]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"{option}: unknown name {unknown[0]!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------ config files
# A command that declares ``--config FILE`` (add_config_argument) gets the file's values as its
# argparse defaults (apply_config_file, called by contrastkit.cli before parsing), so every
# option given on the command line still wins over the file.

_ALIASES = "_config_aliases"


def add_collection_changed_argument(add: Callable[..., Any], what: str) -> None:
    """``--collection-changed {stop,reindex,keep}`` (``add``: a parser's or a group's
    ``add_argument``): what a run's unlabeled collection or image-text CSV does when its files
    or rows changed since the run recorded them (``what``: the command, as the help names it)."""
    from contrastkit.data import COLLECTION_CHANGED

    add("--collection-changed", choices=COLLECTION_CHANGED, default="stop",
        help=f"what {what} does with a run's unlabeled collection (or image-text CSV) whose files (rows) were added "
             "or removed since the run recorded them: stop naming the change (default), reindex (read it again), "
             "keep (the recorded ones still there); unchanged, it is read from the record, not listed again")


def add_config_argument(parser: argparse.ArgumentParser, *, aliases: Optional[Mapping[str, str]] = None) -> None:
    """Add ``--config FILE``: a YAML or JSON mapping of this command's options (keys as the option
    names, dashes or underscores; ``aliases`` maps further accepted keys to option names)."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="read options from a YAML or JSON file (keys: the option names, e.g. "
                             "batch-size or batch_size); options given here override the file's")
    parser.set_defaults(**{_ALIASES: dict(aliases or {})})


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Optional[str]:
    """Read the ``--config FILE`` named in ``argv`` (if the parser has that option and it is
    given) and make its values the parser's defaults; returns the file's path or ``None``."""
    if not any(action.dest == "config" for action in parser._actions):
        return None
    finder = argparse.ArgumentParser(add_help=False)
    finder.add_argument("--config", default=None)
    path = finder.parse_known_args(list(argv))[0].config
    if path is None:
        return None
    from contrastkit.config_files import read_config_file

    parser.set_defaults(**config_defaults(parser, read_config_file(path), path))
    return path


def config_defaults(parser: argparse.ArgumentParser, values: Mapping[str, Any], path: str) -> Dict[str, Any]:
    """``values`` (from the file ``path``) checked against the options of ``parser`` and
    converted to their types: ``{dest: value}``. An unknown key (with the closest option
    suggested), a key given twice or a value of the wrong type raises :class:`UsageError`."""
    by_name: Dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "config") or action.dest.startswith("_"):
            continue
        by_name[action.dest] = action
        for option in action.option_strings:
            if option.startswith("--"):
                by_name[option[2:].replace("-", "_")] = action
    for alias, target in (parser.get_default(_ALIASES) or {}).items():
        by_name[alias] = by_name[target.replace("-", "_")]
    positionals = {action.dest for action in parser._actions if not action.option_strings}
    result: Dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        action = by_name.get(name)
        if action is None:
            if name in positionals:
                raise UsageError(f"config file {path}: {key!r} is given on the command line, not in the file")
            close = difflib.get_close_matches(name, list(by_name), n=1)
            hint = f" (did you mean {close[0].replace('_', '-')!r}?)" if close else ""
            raise UsageError(f"config file {path}: unknown key {key!r}{hint}")
        if action.dest in result:
            raise UsageError(f"config file {path}: {key!r} sets --{action.dest.replace('_', '-')} a second time")
        result[action.dest] = _config_value(action, value, f"config file {path}: {key!r}")
    return result


def _config_value(action: argparse.Action, value: Any, where: str) -> Any:
    """One config value as the command line would have produced it for ``action``."""
    if value is None:
        return None
    if action.nargs == 0:  # a flag (store_true)
        if not isinstance(value, bool):
            raise UsageError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):  # repeatable KEY=VALUE items
        if isinstance(value, dict):
            return [f"{k}={json.dumps(v)}" for k, v in value.items()]
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, str) for item in items):
            raise UsageError(f"{where} must be a mapping or a list of KEY=VALUE strings, got {value!r}")
        return list(items)
    if isinstance(value, list) and action.type is None:  # a comma-separated option
        value = ",".join(str(item) for item in value)
    expected = {int: "an integer", float: "a number"}.get(action.type)
    if isinstance(value, bool) or isinstance(value, (list, dict)) or (
            action.type is int and isinstance(value, float)):
        raise UsageError(f"{where} must be {expected or 'a string'}, got {value!r}")
    if expected is None and not isinstance(value, str):
        value = str(value)
    if action.type is not None and isinstance(value, str):
        try:
            value = action.type(value)
        except (TypeError, ValueError):
            raise UsageError(f"{where} must be {expected or 'valid'}, got {value!r}") from None
    if action.choices is not None and value not in action.choices:
        raise UsageError(f"{where} must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value


# ------------------------------------------------------------------------------ study commands

def add_study_arguments(parser: argparse.ArgumentParser, *, epochs_default: Any, batch_default: Any) -> None:
    """Options every study command shares (data options, training length, output handling,
    ``--config FILE``)."""
    parser.add_argument("--epochs", type=int, default=None, help=f"pretraining epochs per run (default {epochs_default})")
    parser.add_argument("--batch-size", type=int, default=None, help=f"pairs per batch (default {batch_default})")
    parser.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a data set option, e.g. train_scenes=240 or clutter=[2,5] (repeatable)")
    parser.add_argument("--train-limit", type=int, default=None, metavar="N",
                        help="each run trains on a class-stratified subset of N training images (default: all)")
    parser.add_argument("--val-limit", type=int, default=None, metavar="N", help="stratified val subset (default: all)")
    parser.add_argument("--test-limit", type=int, default=None, metavar="N",
                        help="stratified test subset (default: all)")
    parser.add_argument("--eval-every", type=int, default=None, metavar="E",
                        help="read the val probe every E epochs (and at the last) and judge each run by the "
                             "epoch it selects (default 0: the last epoch)")
    parser.add_argument("--encoder", default=None, metavar="NAME",
                        help="the encoder every run trains, as contrastkit pretrain --encoder (a built-in: "
                             "small, resnet18 (CIFAR stem), resnet50, vit; timm:NAME; torchvision:NAME; "
                             "package.module:factory; default: pretrain's)")
    parser.add_argument("--encoder-option", action="append", default=None, metavar="KEY=VALUE",
                        help="keyword argument of the encoder, repeatable, as contrastkit pretrain --encoder-option")
    parser.add_argument("--device", default="auto", help="torch device (default: CUDA if available, else CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per run (default: as contrastkit pretrain; 0 = torch's default)")
    parser.add_argument("--jobs", type=int, default=0, metavar="N",
                        help="runs trained at once, each in its own process with its share of the cores "
                             "unless --threads is given; each holds its own copy of the data in memory "
                             "(default 0: as many as there are cores and 2 GiB of free memory per run, "
                             "one at a time on a GPU; 1: one run at a time, using every core)")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="torch.compile every run's encoder for its training steps, as contrastkit pretrain "
                             "--compile (speed, not a setting: a study may be resumed with or without it)")
    parser.add_argument("--channels-last", action="store_true", default=None,
                        help="every run's model and images in the channels-last memory format, as contrastkit "
                             "pretrain --channels-last (speed, not a setting, as --compile)")
    parser.add_argument("--resume", action="store_true",
                        help="continue in an existing output folder: finished runs are skipped (two "
                             "processes resuming one folder share out its runs)")
    parser.add_argument("--force", action="store_true",
                        help="start over in an existing output folder (deletes what this command wrote there)")
    parser.add_argument("--no-progress", action="store_true", help="no live display, one line per run")
    parser.add_argument("--budgets", default=None, metavar="SIZExEPOCHS,...",
                        help="run the whole study at each training budget, e.g. 5000x18,15000x20,45000x20: a "
                             "budget is a class-stratified subset of SIZE training images (as --train-limit) "
                             "trained for EPOCHS epochs, SIZE x EPOCHS image-steps per run. Each budget gets "
                             "its own study folder OUT/budget-SIZExEPOCHS/, and OUT the verdicts by budget "
                             "(where a claim changes between budgets) and the cross-budget table and plots; "
                             "replaces --epochs and --train-limit (default: one budget, those two options)")
    add_config_argument(parser)


def study_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The settings of :func:`add_study_arguments` for :mod:`contrastkit.studies`
    (``None``: the study's default)."""
    return {"data_options": parse_data_options(args.data_option), "epochs": args.epochs,
            "batch_size": args.batch_size, "device": args.device, "threads": args.threads,
            "train_limit": args.train_limit, "val_limit": args.val_limit, "test_limit": args.test_limit,
            "eval_every": args.eval_every, "encoder": args.encoder,
            "encoder_options": None if args.encoder_option is None
            else parse_data_options(args.encoder_option, option="--encoder-option")}


def run_study_command(name: str, args: argparse.Namespace, **settings: Any) -> int:
    """Run the study ``name`` with the options of :func:`add_study_arguments` in ``args`` and
    ``settings`` (the command's own), over ``--budgets`` when given, and print its results."""
    from contrastkit import studies

    how = {"resume": args.resume, "force": args.force, "progress": not args.no_progress, "jobs": args.jobs,
           "run_options": {"compile": bool(args.compile), "channels_last": bool(args.channels_last)}}
    settings = {**settings, **study_options(args)}
    if args.budgets is not None:
        print_budgets(studies.run_budgets(name, args.out, budgets=args.budgets, **how, **settings))
    else:
        print_study(studies.run_study(name, args.out, **how, **settings))
    return 0


def print_study(result: Any) -> None:
    """A finished study (:class:`contrastkit.studies.StudyResult`): table, verdicts, files."""
    from contrastkit.studies import format_verdicts

    print(result.table())
    print()
    print(format_verdicts(result.verdicts))
    print()
    plots = result.plots[0] if len(result.plots) == 1 else f"{len(result.plots)} plots in {result.out}"
    print(f"wrote {result.table_path}, {result.verdicts_path} and {plots}")


def print_budgets(result: Any) -> None:
    """A finished study over budgets (:class:`contrastkit.studies.BudgetResult`): each budget's
    table and verdicts, then the best tau per budget and the verdicts by budget."""
    from contrastkit.studies import format_budget_verdicts, format_verdicts

    for budget, study in zip(result.budgets, result.results):
        print(f"== budget {budget.describe()}: {study.out}")
        print(study.table())
        print()
        print(format_verdicts(study.verdicts))
        print()
    best = result.best_taus()
    if best:
        print("Best tau (NT-Xent, mean probe accuracy) by budget: " + ", ".join(
            f"{budget.describe()}: {best[budget.label] if best.get(budget.label, '') != '' else '-'}"
            for budget in result.budgets))
    print(format_budget_verdicts(result.claims))
    for warning in result.warnings:
        print(f"warning: {warning}")
    print()
    written = [result.verdicts_path] + ([result.table_path] if result.table_path else [])
    plots = f" and {len(result.plots)} plots" if result.plots else ""
    print(f"wrote {', '.join(written)}{plots} in {result.out}; each budget's study in {result.out}/budget-*/")


# ------------------------------------------------------------------------------ run results

def print_skipped(skipped: Sequence[Any]) -> None:
    """One line per skipped row (``SkippedRow`` of ``contrastkit embed`` / ``neighbors``): its
    ``SPLIT:INDEX``, name and why it could not be read; the first few, then a count."""
    for row in skipped[:_SKIPPED_SHOWN]:
        path, sep, why = row.reason.partition(": ")
        reason = why if sep and path.endswith(row.name) else row.reason
        print(f"skipped {row.split}:{row.index}  {escape_line(row.name)}  ({escape_line(reason)})")
    if len(skipped) > _SKIPPED_SHOWN:
        print(f"skipped {len(skipped) - _SKIPPED_SHOWN} more (--json lists them all)")


def print_left_out(left_out: Mapping[str, str]) -> None:
    """One line per file a collection's listing left out (``contrastkit embed`` / ``neighbors``):
    the file and why; the first few, then a count."""
    for name, reason in list(left_out.items())[:_SKIPPED_SHOWN]:
        print(f"left out  {escape_line(name)}  ({escape_line(reason)})")
    if len(left_out) > _SKIPPED_SHOWN:
        print(f"left out {len(left_out) - _SKIPPED_SHOWN} more (--json lists them all)")


def print_result_table(summary: Dict[str, Any], title: str) -> None:
    """A run's test-split numbers next to its baselines (``summary.json`` or ``contrastkit probe``)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("test split")
    table.add_column("pretrained", justify="right")
    table.add_column("random init", justify="right")
    table.add_column("raw pixels", justify="right")
    rows = [("linear probe accuracy", records.PROBE_ACCURACY), ("kNN accuracy (k=20)", records.KNN_ACCURACY)]
    judged = [rows[0]]  # the rows a verdict line judges the encoder by, each its table's first
    if records.VIEW_RETRIEVAL_TOP1 in summary:  # an unlabeled collection: the label-free read-out first
        from contrastkit.metrics.readout import LABEL_FREE_ROWS

        judged = [LABEL_FREE_ROWS[0]] + (judged if records.PROBE_ACCURACY in summary else [])
        rows = list(LABEL_FREE_ROWS) + (rows if records.PROBE_ACCURACY in summary else [])
    for label, key in rows:
        table.add_row(label, *(records.table_number(summary.get(records.baseline_key(key, baseline)))
                               for baseline in records.ENCODERS))
    console = Console()
    console.print(table)
    if "retrieval_i2t_recall@1" in summary:  # convirt
        from contrastkit.methods.convirt import retrieval_table

        console.print(retrieval_table(summary))
    shown = ("final_loss", "final_temperature", "epochs", "steps", "images_per_second", "seconds")
    details = [f"{key} {records.table_number(summary[key])}" for key in shown if key in summary]
    console.print("  ".join(details))
    for baseline, name in records.ENCODER_NAMES.items():
        capped = records.baseline_key("probe_capped_c", baseline)
        if summary.get(capped):
            console.print(f"[yellow]warning: the linear probe of {name} stopped at its evaluation cap at C = "
                          f"{', '.join(f'{c:g}' for c in summary[capped])} (not converged; "
                          f"{capped} in the summary)[/yellow]")
    for row_title, key in judged:  # none without baselines (--no-baselines): nothing was compared
        verdict = records.verdict_line(summary, key, row_title)
        if verdict is not None:
            console.print(verdict[0], style="green" if verdict[1] else "yellow", soft_wrap=True, markup=False)
