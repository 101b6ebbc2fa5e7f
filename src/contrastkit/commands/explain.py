"""``contrastkit explain``: what InfoNCE does with given similarities and temperatures.

    contrastkit explain                                  # course page P10 example: s = 1 0.5 0, tau = 0.5
    contrastkit explain 0.8 0.4 0.2 --tau 1,0.5,0.1      # temperature sweep of one query
    contrastkit explain --matrix S.csv --positives 1,0,3,2 --tau 1   # self-similarity (NT-Xent)
    contrastkit explain --matrix S.npy --diagonal --tau 0.1          # cross-modal, positives on the diagonal
    contrastkit explain 1 0.5 0 --json                   # machine-readable
    contrastkit explain 1 0.5 0 --plot temperature.png   # three panels
    contrastkit explain 1 0.5 0 --sigmoid --tau 0.1 --bias -10   # SigLIP's sigmoid loss next to the softmax
    contrastkit explain 0.8 0.4 0.2 --methods            # MACL, dual, iSogCLR, TempNet next to the fixed tau
    contrastkit explain 0.8 0.4 0.2 --method macl:0.1,1 --method individual:0.1,0.2

The arguments are parsed by :mod:`contrastkit.commands.explain_input` (before torch is imported,
so that a mistake is reported at once) and the tables printed by
:mod:`contrastkit.commands.explain_output`; the numbers come from :mod:`contrastkit.analysis`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from .explain_input import DEFAULT_TAU, Request, parse_bias, request_from_args
from .explain_output import Printer, print_methods, print_sigmoid, print_softmax

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def one_line_error(message: str) -> None:
        # argparse would print the whole usage first; every error of this command is one line
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = one_line_error  # type: ignore[method-assign]
    parser.epilog = (
        "With no similarities and no --matrix, the worked example s = 1 0.5 0 (positive first), "
        f"tau = {DEFAULT_TAU} is explained. Negative numbers work as arguments (-0.5); for "
        "exponents like -1e-3 put -- before the numbers."
    )
    parser.add_argument("scores", nargs="*", metavar="S",
                        help="similarities of one query to its candidates (spaces or commas)")
    parser.add_argument("--tau", metavar="T[,T...]",
                        help=f"temperature, or a comma-separated list for a sweep (default {DEFAULT_TAU})")
    parser.add_argument("--positive", metavar="J",
                        help="index of the positive among the S candidates (default 0)")
    parser.add_argument("--matrix", metavar="FILE",
                        help="square similarity matrix: CSV/text (commas or spaces) or .npy")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--positives", metavar="MAP",
                       help="with --matrix: positive column of each row, e.g. 1,0,3,2; the diagonal "
                            "(each row's self-similarity) is excluded from the denominator (NT-Xent)")
    group.add_argument("--diagonal", action="store_true",
                       help="with --matrix: row i's positive is column i and the diagonal stays in the "
                            "denominator (cross-modal, e.g. image-text)")
    parser.add_argument("--row", metavar="I",
                        help="with --matrix: show every candidate of anchor I (and plot anchor I; default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw probability, gradient and penalty vs temperature into FILE.png")
    parser.add_argument("--force", action="store_true", help="let --plot replace an existing file")
    parser.add_argument("--plain", action="store_true", help="plain-text tables even on a terminal")
    parser.add_argument("--sigmoid", action="store_true",
                        help="the sigmoid (SigLIP) loss: each pair's probability, loss term and gradients "
                             "(w.r.t. s, the scale t = 1/tau and the bias b) next to the softmax view")
    parser.add_argument("--methods", action="store_true",
                        help="what each registered temperature method (with its defaults; see "
                             "docs/temperature-methods.md) does to the probabilities, gradients and penalty, next "
                             "to the fixed --tau")
    parser.add_argument("--method", action="append", metavar="FORM",
                        help="one temperature method in its --temperature-method form (repeat for several), "
                             "e.g. macl:0.1,1 or dual:0.1,0.5; implies --methods")
    # No number here: the default is contrastkit.losses.sigmoid.SIGLIP_BIAS, read when the command
    # runs (importing it loads torch, which --help and a mistyped argument should not wait for).
    parser.add_argument("--bias", metavar="B",
                        help="with --sigmoid: the bias b (default: SigLIP's initialisation, "
                             "contrastkit.losses.sigmoid.SIGLIP_BIAS; the tables show its value)")


def _run_sigmoid(args: argparse.Namespace, request: Request, bias: Optional[float]) -> int:
    from contrastkit.analysis import explain_sigmoid
    from contrastkit.losses.sigmoid import SIGLIP_BIAS

    bias = SIGLIP_BIAS if bias is None else bias
    results = [explain_sigmoid(request.similarities, temperature=tau, bias=bias, positive=request.positive,
                               exclude_diagonal=request.exclude_diagonal) for tau in request.taus]
    if args.json:
        if len(results) == 1:
            print(results[0].to_json(indent=2))
        else:
            print("[" + ",\n".join(r.to_json(indent=2) for r in results) + "]")
        return 0
    printer = Printer(not args.plain and sys.stdout.isatty())
    for k, e in enumerate(results):
        if k:
            printer.line()
        print_sigmoid(printer, e, request)
    return 0


def _run_methods(args: argparse.Namespace, request: Request) -> int:
    if len(request.taus) != 1:
        raise ValueError("--methods compares the methods with one fixed temperature: give one --tau")
    if args.sigmoid or args.plot:
        raise ValueError("--methods shows the softmax methods as tables: leave out --sigmoid and --plot")
    from contrastkit.analysis import explain_methods
    comparison = explain_methods(request.similarities, temperature=request.taus[0], positive=request.positive,
                                 exclude_diagonal=request.exclude_diagonal, methods=args.method or None)
    if args.json:
        print(comparison.to_json(indent=2))
    else:
        print_methods(Printer(not args.plain and sys.stdout.isatty()), comparison, request)
    return 0


def run(args: argparse.Namespace) -> int:
    request = request_from_args(args)  # before importing torch, so a typo is reported at once
    bias = parse_bias(args)
    if args.methods or args.method:
        return _run_methods(args, request)
    if args.sigmoid:
        if args.plot:
            raise ValueError("--plot draws the softmax view only; leave it out with --sigmoid")
        return _run_sigmoid(args, request, bias)
    if args.plot and os.path.exists(args.plot) and not args.force:
        raise FileExistsError(f"--plot {args.plot} exists; pass --force to replace it")
    from contrastkit.analysis import explain, sweep

    kwargs = dict(positive=request.positive, exclude_diagonal=request.exclude_diagonal)
    if len(request.taus) == 1:
        result = explain(request.similarities, temperature=request.taus[0], **kwargs)
    else:
        result = sweep(request.similarities, temperatures=request.taus, **kwargs)

    if args.json:
        print(result.to_json(indent=2))
    else:
        print_softmax(Printer(not args.plain and sys.stdout.isatty()), result, request)

    if args.plot:
        try:
            import matplotlib  # noqa: F401  (only to give a clear message when it is missing)
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install 'contrastkit[all]'") from None
        from contrastkit.analysis import plot_temperature

        plot_temperature(request.similarities, temperatures=request.taus, anchor=request.row or 0,
                         path=args.plot, overwrite=args.force, **kwargs)
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
