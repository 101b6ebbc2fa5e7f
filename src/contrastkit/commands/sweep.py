"""``contrastkit sweep``: what the temperature does on real training runs (Wang & Liu, CVPR 2021).

Parses the options and runs :data:`contrastkit.studies.SWEEP` (see :mod:`contrastkit.studies.sweep`):
one NT-Xent run per ``(tau, seed)``, hard-negative NT-Xent and the simple loss next to it, then a
table, plots and one verdict per claim, computed from the results.
"""

from __future__ import annotations

import argparse

from contrastkit.commands.common import add_study_arguments, parse_numbers, run_study_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from contrastkit.studies import SWEEP

    d = SWEEP.defaults
    parser.description = (
        "Pretrain with NT-Xent over a grid of temperatures and seeds, with the hard-negative and simple-loss "
        "variants of Wang & Liu (CVPR 2021), all judged by the same frozen-encoder linear probe. Writes "
        "OUT/sweep.csv, OUT/verdicts.json, five plots, OUT/sweep.json and OUT/runs/RUN/, and prints a table "
        "and one verdict per claim. With --budgets, the same sweep at each training budget in "
        "OUT/budget-SIZExEPOCHS/, and across them OUT/budgets.csv, OUT/verdicts_by_budget.json and four plots.")
    parser.add_argument("--data", default=None, help=f"glyphlab, digits or a path (default {d['data']})")
    parser.add_argument("--temperatures", default=None,
                        help="comma-separated tau values (default " + ",".join(f"{t:g}" for t in d["temperatures"]) + ")")
    parser.add_argument("--seeds", type=int, default=None, help=f"runs per setting, seeds 0..N-1 (default {d['seeds']})")
    parser.add_argument("--out", default=None, help=f"output folder (default {SWEEP.default_out}; with --budgets {SWEEP.default_budgets_out})")
    parser.add_argument("--views", default=None, choices=("augment", "A", "B"),
                        help=f"positive pairs (A/B need glyphlab; default {d['views']})")
    parser.add_argument("--no-variants", action="store_true",
                        help="NT-Xent only: skip the simple-loss and hard-negative columns (--variants none)")
    parser.add_argument("--variants", default=None, metavar="LIST",
                        help="the runs next to NT-Xent's, comma-separated: hard-negative (at each tau), simple "
                             "(once per seed), or none (default: hard-negative,simple)")
    add_study_arguments(parser, epochs_default=d["epochs"], batch_default=d["batch_size"])


def run(args: argparse.Namespace) -> int:
    from contrastkit.studies import SWEEP

    if args.no_variants and args.variants is not None:
        raise ValueError("give --no-variants or --variants, not both (--no-variants is --variants none)")
    return run_study_command(SWEEP.name, args, data=args.data,
                             temperatures=parse_numbers(args.temperatures, "--temperatures"), seeds=args.seeds,
                             views=args.views, no_variants=args.no_variants, variants=args.variants)
