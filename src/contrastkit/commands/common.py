"""What the subcommands share: the usage error, option parsing and the result printers.

Light to import (no torch): :mod:`contrastkit.cli` imports it for every command.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["UsageError", "parse_data_options", "parse_numbers", "add_study_arguments", "study_options",
           "print_result_table", "print_study"]


class UsageError(Exception):
    """An error in what the user asked for; printed as one line, exit status 2."""


def parse_data_options(items: Optional[Sequence[str]]) -> Dict[str, Any]:
    """``--data-option KEY=VALUE`` items as a dict (VALUE parsed as JSON when it can be)."""
    options: Dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--data-option must look like KEY=VALUE, got {item!r}")
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


# ------------------------------------------------------------------------------ study commands

def add_study_arguments(parser: argparse.ArgumentParser, *, epochs_default: Any, batch_default: Any) -> None:
    """Options every study command shares (data options, training length, output handling)."""
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
    parser.add_argument("--device", default="auto", help="torch device (default: CUDA if available, else CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per run (default: as contrastkit pretrain; 0 = torch's default)")
    parser.add_argument("--resume", action="store_true",
                        help="continue in an existing output folder: finished runs are skipped")
    parser.add_argument("--force", action="store_true",
                        help="start over in an existing output folder (deletes what this command wrote there)")
    parser.add_argument("--no-progress", action="store_true", help="no live display, one line per run")


def study_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The settings of :func:`add_study_arguments` for :mod:`contrastkit.studies`
    (``None``: the study's default)."""
    return {"data_options": parse_data_options(args.data_option), "epochs": args.epochs,
            "batch_size": args.batch_size, "device": args.device, "threads": args.threads,
            "train_limit": args.train_limit, "val_limit": args.val_limit, "test_limit": args.test_limit,
            "eval_every": args.eval_every}


def print_study(result: Any) -> None:
    """A finished study (:class:`contrastkit.studies.StudyResult`): table, verdicts, files."""
    from contrastkit.studies import format_verdicts

    print(result.table())
    print()
    print(format_verdicts(result.verdicts))
    print()
    plots = result.plots[0] if len(result.plots) == 1 else f"{len(result.plots)} plots in {result.out}"
    print(f"wrote {result.table_path}, {result.verdicts_path} and {plots}")


# ------------------------------------------------------------------------------ run results

def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def print_result_table(summary: Dict[str, Any], title: str) -> None:
    """A run's test-split numbers next to its baselines (``summary.json`` or ``contrastkit probe``)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("test split")
    table.add_column("pretrained", justify="right")
    table.add_column("random init", justify="right")
    table.add_column("raw pixels", justify="right")
    table.add_row("linear probe accuracy", _fmt(summary.get("probe_accuracy")),
                  _fmt(summary.get("random_init_probe_accuracy")), _fmt(summary.get("raw_pixel_probe_accuracy")))
    table.add_row("kNN accuracy (k=20)", _fmt(summary.get("knn_accuracy")),
                  _fmt(summary.get("random_init_knn_accuracy")), _fmt(summary.get("raw_pixel_knn_accuracy")))
    console = Console()
    console.print(table)
    if "retrieval_i2t_recall@1" in summary:  # convirt
        from contrastkit.train.convirt import retrieval_table

        console.print(retrieval_table(summary))
    details = [f"{key} {_fmt(summary[key])}" for key in ("final_loss", "final_temperature", "epochs", "steps",
                                                          "images_per_second", "seconds") if key in summary]
    console.print("  ".join(details))
    if "beats_baselines" in summary and not summary["beats_baselines"]:
        console.print("[yellow]the pretrained encoder does not beat both baselines on the linear probe[/yellow]")
