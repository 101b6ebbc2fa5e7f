"""``contrastkit probe RUN_DIR``: re-evaluate a pretraining run's checkpoint."""

from __future__ import annotations

import argparse
import json
import os

from contrastkit.run_writer import RunWriter
from contrastkit.commands.common import add_collection_changed_argument, print_result_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Re-evaluate the encoder saved by contrastkit pretrain with the fixed read-out "
                          "protocol (linear probe with C chosen on val, weighted kNN k=20) and the baselines.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="output folder of contrastkit pretrain")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default RUN_DIR/checkpoints/last.pt)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, ... (default auto)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the run's setting)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the random-init and raw-pixel baselines")
    parser.add_argument("--baseline-cache", default=None, metavar="DIR",
                        help="where the baselines' numbers are kept: auto, off or a folder (default: the run's setting)")
    parser.add_argument("--save", action="store_true", help="also write RUN_DIR/probe.json (replacing an earlier one)")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON instead of the table")
    add_collection_changed_argument(parser.add_argument, "probe")


def run(args: argparse.Namespace) -> int:
    from contrastkit.train import evaluate_run

    result = evaluate_run(args.run_dir, checkpoint=args.checkpoint, device=args.device,
                          baselines=not args.no_baselines, threads=args.threads, baseline_cache=args.baseline_cache,
                          collection_changed=args.collection_changed)
    if args.save:
        RunWriter(args.run_dir).write_probe(result)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print_result_table(result, f"{result['method']} on {os.path.basename(str(result['data']))} "
                            f"({result['encoder']} encoder, {result['epochs']} epochs): {result['checkpoint']}")
    return 0
