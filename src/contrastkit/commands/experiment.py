"""``contrastkit experiment NAME``: the experiments of the source texts, run end to end.

Parses the options and runs one of :data:`contrastkit.studies.EXPERIMENTS`
(``positive-pairs``: the textbook, section 30.2, exercise F5; ``convirt-ablation``: the ConVIRT
tutorial; ``schedules``: fixed vs cosine vs rising tau; ``temperature-methods``: MACL, dual,
iSogCLR and TempNet against the best fixed tau), then prints its table and verdicts.
"""

from __future__ import annotations

import argparse

from contrastkit.commands.common import add_study_arguments, parse_numbers, run_study_command


def _per_experiment(key: str) -> str:
    from contrastkit.studies import EXPERIMENTS

    return "; ".join(f"{name} {study.defaults[key]}" for name, study in sorted(EXPERIMENTS.items()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from contrastkit.studies import CONVIRT_ABLATION, EXPERIMENTS, SCHEDULES, TEMPERATURE_METHODS
    from contrastkit.studies.temperature_methods import default_methods

    ablation = CONVIRT_ABLATION.defaults
    parser.description = "Run an experiment of the source texts end to end. " + " ".join(
        f"{name}: {study.description}." for name, study in sorted(EXPERIMENTS.items()))
    parser.add_argument("name", choices=sorted(EXPERIMENTS), help="which experiment to run")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"runs per setting, seeds 0..N-1 (default: {_per_experiment('seeds')})")
    parser.add_argument("--out", default=None, help="output folder (default runs/experiment-NAME; with --budgets runs/experiment-NAME-budgets)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="positive-pairs: tau of the NT-Xent loss; schedules: the fixed tau (default: "
                             "contrastkit pretrain's simclr default)")
    parser.add_argument("--data", default=None,
                        help="schedules, temperature-methods: glyphlab, digits or a path (default glyphlab)")
    parser.add_argument("--cosine", default=None, metavar="SCHEDULE",
                        help=f"schedules: the cosine schedule (default {SCHEDULES.defaults['cosine']})")
    parser.add_argument("--linear", default=None, metavar="SCHEDULE",
                        help=f"schedules: the rising ramp (default {SCHEDULES.defaults['linear']})")
    add_study_arguments(parser, epochs_default=_per_experiment("epochs"), batch_default=_per_experiment("batch_size"))
    parser.add_argument("--weights", default=None,
                        help="convirt-ablation: lambdas, comma-separated (default "
                             + ",".join(f"{w:g}" for w in ablation["weights"]) + ")")
    parser.add_argument("--temperatures", default=None,
                        help="convirt-ablation: taus, comma-separated (default "
                             + ",".join(f"{t:g}" for t in ablation["temperatures"]) + "); temperature-methods: "
                             "the fixed taus of the sweep (default "
                             + ",".join(f"{t:g}" for t in TEMPERATURE_METHODS.defaults["temperatures"]) + ")")
    parser.add_argument("--method", action="append", default=None, metavar="FORM",
                        help="temperature-methods: a method in its --temperature-method form, repeat for several "
                             "(default: every registered method, " + " ".join(default_methods()) + ", with its "
                             "defaults)")
    parser.add_argument("--text-encoder", choices=("transformer", "mean"), default=None,
                        help=f"convirt-ablation: text encoder (default {ablation['text_encoder']})")


def run(args: argparse.Namespace) -> int:
    return run_study_command(args.name, args, seeds=args.seeds, temperature=args.temperature,
                             weights=parse_numbers(args.weights, "--weights"),
                             temperatures=parse_numbers(args.temperatures, "--temperatures"),
                             text_encoder=args.text_encoder, data=args.data, cosine=args.cosine,
                             linear=args.linear, methods=args.method)
