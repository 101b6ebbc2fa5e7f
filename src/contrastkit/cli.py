"""The ``contrastkit`` command line.

Each subcommand lives in ``contrastkit.commands.<name>`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``; what they share is in
:mod:`contrastkit.commands.common`, and the study commands call :mod:`contrastkit.studies`.
Modules are imported only when their command runs, so ``contrastkit --help`` stays fast.
Errors a user can fix (bad numbers, missing files, invalid options, a full disk; see
:mod:`contrastkit.commands.errors`) print one line and exit with status 2; a run stopped by a
preemption signal (SIGTERM, SIGUSR1) after checkpointing prints one line and exits with status
75 (``contrastkit.train.faults.PREEMPTED_EXIT``). Any other exception
is a bug and keeps its Python traceback. ``contrastkit --traceback COMMAND ...`` (or
``CONTRASTKIT_TRACEBACK=1``) prints the traceback of a user error too, before its line.

Help texts are plain text, as the terminal shows them: no reST markup.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import List, Optional

from contrastkit.commands.common import UsageError, apply_config_file
from contrastkit.commands.errors import first_line, is_user_error

__all__ = ["main", "build_parser", "COMMANDS", "DESCRIPTION", "UsageError", "TRACEBACK_FLAG", "TRACEBACK_VARIABLE"]

#: What ``contrastkit --help`` says first.
DESCRIPTION = ("contrastkit: contrastive representation learning around the temperature-scaled InfoNCE loss "
               "(run 'contrastkit COMMAND --help' for the options of a command)")

#: The option, before the command, that shows the traceback of every error.
TRACEBACK_FLAG = "--traceback"
#: The environment variable that does the same when set to 1.
TRACEBACK_VARIABLE = "CONTRASTKIT_TRACEBACK"

# name -> (module, one-line help)
COMMANDS = {
    "explain": ("contrastkit.commands.explain",
                "show probabilities, gradients, hardness and limits of InfoNCE on given similarities"),
    "pretrain": ("contrastkit.commands.pretrain", "contrastive pretraining judged by a frozen linear probe"),
    "probe": ("contrastkit.commands.probe", "re-evaluate a pretraining run's checkpoint with the linear probe"),
    "sweep": ("contrastkit.commands.sweep", "pretrain over a grid of temperatures and seeds; metrics, plots, verdicts"),
    "experiment": ("contrastkit.commands.experiment", "run an experiment of the source texts (positive-pairs, convirt-ablation)"),
    "embed": ("contrastkit.commands.embed", "write a run's embeddings (h, optionally z) of a data set to .npy/.csv or .npz"),
    "export": ("contrastkit.commands.export",
               "write a run's encoder (optionally its projection head) as safetensors, ONNX or TorchScript"),
    "neighbors": ("contrastkit.commands.neighbors",
                  "print and draw the images of a run's data set nearest to query images (cosine of h; exact or FAISS)"),
    "explore": ("contrastkit.commands.explore", "write (or serve) the interactive temperature explorer page and open it"),
    "report": ("contrastkit.commands.report", "write one self-contained HTML report of a run, sweep or experiment folder"),
    "shard": ("contrastkit.commands.shard",
              "write images (a class tree, a collection, an image-text CSV) as tar shards in WebDataset's layout"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contrastkit", description=DESCRIPTION)
    from contrastkit import __version__

    parser.add_argument("--version", action="version", version=f"contrastkit {__version__}")
    parser.add_argument(TRACEBACK_FLAG, action="store_true",
                        help="when a command fails, print the Python traceback, not only the one-line "
                             f"error (also: {TRACEBACK_VARIABLE}=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        # Arguments are added lazily in main() for the chosen command only.
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = os.environ.get(TRACEBACK_VARIABLE, "") == "1"
    while argv[:1] == [TRACEBACK_FLAG]:
        show_traceback = True
        argv = argv[1:]
    parser = build_parser()
    # Find the subcommand first, then let its module declare the arguments.
    if argv and argv[0] in COMMANDS:
        name = argv[0]
        module = importlib.import_module(COMMANDS[name][0])
        sub = argparse.ArgumentParser(prog=f"contrastkit {name}", description=COMMANDS[name][1])
        module.add_arguments(sub)
        try:
            apply_config_file(sub, argv[1:])  # --config FILE: the file's values become the defaults
            args = sub.parse_args(argv[1:])
            return int(module.run(args) or 0)
        except Exception as err:
            status = getattr(err, "exit_status", None)
            if isinstance(status, int) and not isinstance(status, bool):
                # A run that stopped on purpose (a preempted run: status 75) says why and how to go on.
                print(f"contrastkit {name}: {first_line(err)}", file=sys.stderr)
                return status
            if not is_user_error(err):
                raise  # a bug: Python prints the traceback
            if show_traceback:
                traceback.print_exc()
            print(f"contrastkit {name}: error: {first_line(err)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"contrastkit {name}: interrupted", file=sys.stderr)
            return 130
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
