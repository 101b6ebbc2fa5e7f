"""``contrastkit explain``: what InfoNCE does with given similarities and temperatures.

    contrastkit explain                                  # course page P10 example: s = 1 0.5 0, tau = 0.5
    contrastkit explain 0.8 0.4 0.2 --tau 1,0.5,0.1      # temperature sweep of one query
    contrastkit explain --matrix S.csv --positives 1,0,3,2 --tau 1   # self-similarity (NT-Xent)
    contrastkit explain --matrix S.npy --diagonal --tau 0.1          # cross-modal, positives on the diagonal
    contrastkit explain 1 0.5 0 --json                   # machine-readable
    contrastkit explain 1 0.5 0 --plot temperature.png   # three panels
    contrastkit explain 1 0.5 0 --sigmoid --tau 0.1 --bias -10   # SigLIP's sigmoid loss next to the softmax
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, TextIO

import numpy as np

from contrastkit._io import memory_guard, open_input, read_exactly, read_npy_header

# The worked example of the course page P10: one query, three candidates, the first is the positive.
DEFAULT_SCORES = (1.0, 0.5, 0.0)
DEFAULT_TAU = 0.5
SIGLIP_BIAS = -10.0  # the default of contrastkit.analysis.explain_sigmoid (not imported: torch loads late)
_MAX_PROBABILITY_COLUMNS = 6


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
    parser.add_argument("--bias", metavar="B",
                        help=f"with --sigmoid: the bias b (default {SIGLIP_BIAS:g}, SigLIP's initialisation)")


# --------------------------------------------------------------------------- parsing


def _split_list(tokens: Sequence[str], what: str) -> List[str]:
    """The items of numbers separated by commas and/or spaces; an empty item between commas
    (``1,,2``, a trailing ``,``) is refused rather than skipped, as it may be a lost number."""
    text = " ".join(tokens)
    items: List[str] = []
    if not text.strip():
        return items
    for part in text.split(","):
        if not part.strip():
            raise ValueError(f"{what} list {text.strip()!r} has an empty entry (two commas in a row, or a "
                             "comma at an end)")
        items.extend(part.split())
    return items


def _parse_floats(tokens: Sequence[str], what: str) -> List[float]:
    values = []
    for part in _split_list(tokens, what):
        try:
            values.append(float(part))
        except ValueError:
            raise ValueError(f"{what} {part!r} is not a number") from None
    return values


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


def _parse_taus(text: Optional[str]) -> List[float]:
    if text is None:
        return [DEFAULT_TAU]
    taus = _parse_floats([text], "--tau value")
    if not taus:
        raise ValueError("--tau is empty: give a temperature such as 0.5 or a list such as 1,0.5,0.1")
    for tau in taus:
        if not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"--tau values must be positive and finite, got {tau:g}")
    return taus


def _parse_positive_map(text: str) -> List[int]:
    parts = _split_list([text], "--positives") if text.strip(", ") else []
    if not parts:
        raise ValueError("--positives is empty: give one column per row, e.g. 1,0,3,2")
    return [_parse_int(p, "--positives entry") for p in parts]


def _read_npy(handle, what: str) -> np.ndarray:
    """A real matrix from a .npy file whose header is checked (dtype, and a declared size that
    matches the file) before its data are read."""
    header = read_npy_header(handle, what)
    if header.kind == "c":
        raise ValueError(f"{what}: holds complex numbers ({header.descr}); similarities must be real "
                         "(save the real part if that is what you mean)")
    held = os.fstat(handle.fileno()).st_size - header.data_offset
    if held != header.nbytes:
        raise ValueError(f"{what}: its header declares shape {header.shape} ({header.nbytes} bytes of "
                         f"{header.descr}) but the file holds {held} bytes")
    data = np.frombuffer(read_exactly(handle, header.nbytes, what), dtype=np.dtype(header.descr))
    return data.reshape(header.shape, order="F" if header.fortran_order else "C")


def load_matrix(path: str) -> np.ndarray:
    """Read a similarity matrix from .npy or from CSV/whitespace-separated text (``#`` comments).

    Only a regular file within the input ceiling is read (``$CONTRASTKIT_MAX_INPUT_BYTES``,
    see :func:`contrastkit._io.max_input_bytes`); a device, FIFO, complex or non-numeric
    array is refused before its data are read.
    """
    what = f"--matrix {path}"
    if not os.path.lexists(path):
        raise FileNotFoundError(f"--matrix file not found: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"--matrix {path} is a directory, not a file")
    try:
        lower = path.lower()
        if lower.endswith(".npz"):
            raise ValueError("a .npz archive holds several arrays; save the matrix alone as .npy or CSV")
        with memory_guard(what), open_input(path, what) as handle:
            if lower.endswith(".npy"):
                data = _read_npy(handle, what)
            else:
                text = read_exactly(handle, os.fstat(handle.fileno()).st_size, what, exact=False).decode("utf-8")
                delimiter = "," if "," in text else None
                data = np.loadtxt(io.StringIO(text), delimiter=delimiter, comments="#", ndmin=2, dtype=np.float64)
            data = np.asarray(data, dtype=np.float64)
    except (ValueError, TypeError, OSError, UnicodeDecodeError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if message.startswith(what):  # already names the file
            raise ValueError(message) from None
        raise ValueError(f"{what}: cannot read a numeric matrix: {message}") from None
    if data.ndim != 2 or data.shape[0] != data.shape[1]:
        raise ValueError(f"--matrix {path}: expected a square (N, N) similarity matrix, got shape {data.shape}")
    return data


@dataclass
class _Request:
    similarities: object
    positive: object
    exclude_diagonal: bool
    taus: List[float]
    is_matrix: bool
    row: Optional[int]
    description: str


def _request(args: argparse.Namespace) -> _Request:
    taus = _parse_taus(args.tau)
    if args.matrix is None:
        for flag, value in (("--positives", args.positives), ("--diagonal", args.diagonal), ("--row", args.row)):
            if value:
                raise ValueError(f"{flag} needs --matrix FILE")
        scores = _parse_floats(args.scores, "similarity")
        if not args.scores:
            scores = list(DEFAULT_SCORES)
            description = "worked example (course page P10)"
        else:
            description = "one query"
        if not scores:
            raise ValueError("no similarities given")
        positive = 0 if args.positive is None else _parse_int(args.positive, "--positive")
        if not 0 <= positive < len(scores):
            raise ValueError(f"--positive must be in [0, {len(scores)}) for {len(scores)} candidates, got {positive}")
        return _Request(scores, positive, False, taus, False, None, description)
    if args.scores:
        raise ValueError("give either similarities S... or --matrix FILE, not both")
    if args.positive is not None:
        raise ValueError("--positive is for a single row; with --matrix use --positives MAP or --diagonal")
    if not args.positives and not args.diagonal:
        raise ValueError("--matrix needs --positives MAP (self-similarity, diagonal excluded) or --diagonal")
    matrix = load_matrix(args.matrix)
    n = matrix.shape[0]
    if args.diagonal:
        positive, exclude, kind = list(range(n)), False, "positives on the diagonal"
    else:
        positive = _parse_positive_map(args.positives)
        if len(positive) != n:
            raise ValueError(f"--positives has {len(positive)} entries but the matrix has {n} rows")
        bad = [p for p in positive if not 0 <= p < n]
        if bad:
            raise ValueError(f"--positives has columns out of range [0, {n}): {bad[:5]}")
        selfs = [i for i, p in enumerate(positive) if p == i]
        if selfs:
            raise ValueError(f"--positives maps rows {selfs[:5]} to themselves; the diagonal is excluded "
                             "with --positives (use --diagonal for positives on the diagonal)")
        exclude, kind = True, "diagonal excluded"
    row = None
    if args.row is not None:
        row = _parse_int(args.row, "--row")
        if not 0 <= row < n:
            raise ValueError(f"--row must be in [0, {n}), got {row}")
    return _Request(matrix, positive, exclude, taus, True, row, f"{n}x{n} matrix from {args.matrix}, {kind}")


# --------------------------------------------------------------------------- output


def fmt(x: float) -> str:
    """Six decimals; scientific for tiny or huge magnitudes so nothing reads as a false 0."""
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0.000000"
    if 1e-4 <= abs(x) < 1e6:
        return f"{x:.6f}"
    return f"{x:.3e}"


def _count(n: int) -> str:
    return f"log {n} = {fmt(math.log(n))}"


@dataclass
class _Table:
    headers: List[str]
    rows: List[List[str]] = field(default_factory=list)


class _Printer:
    """Plain aligned text, or rich tables on a terminal."""

    def __init__(self, use_rich: bool, stream=None, width: Optional[int] = None):
        self.stream = stream or sys.stdout
        self.console = None
        if use_rich:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                self.console = Console(file=self.stream, highlight=False, width=width)

    def line(self, text: str = "") -> None:
        if self.console is not None:
            self.console.print(text, markup=False, soft_wrap=True)
        else:
            print(text, file=self.stream)

    def table(self, table: _Table) -> None:
        widths = [max(len(h), *(len(r[i]) for r in table.rows)) for i, h in enumerate(table.headers)]
        # rich would shorten numbers with an ellipsis when the table is wider than the terminal
        if self.console is not None and sum(widths) + 3 * len(widths) + 1 <= self.console.width:
            from rich.table import Table

            rich_table = Table()
            for i, header in enumerate(table.headers):
                rich_table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
            for row in table.rows:
                rich_table.add_row(*row)
            self.console.print(rich_table)
            return

        def render(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        lines = [render(table.headers).rstrip(), "  ".join("-" * w for w in widths)]
        lines += [render(row).rstrip() for row in table.rows]
        for text in lines:
            self.line(text)


def _candidate_table(e, anchor: int) -> _Table:
    table = _Table(["candidate", "similarity", "logit", "probability", "dL/ds", "penalty share"])
    for j in range(e.similarities.shape[1]):
        name = f"{j} +" if j == e.positive[anchor] else str(j)
        if not e.in_denominator[anchor, j]:
            table.rows.append([f"{j} (self)", fmt(e.similarities[anchor, j]), "excluded", "-", "-", "-"])
            continue
        share = "-" if j == e.positive[anchor] else fmt(e.penalty[anchor, j])
        table.rows.append([name, fmt(e.similarities[anchor, j]), fmt(e.logits[anchor, j]),
                           fmt(e.probabilities[anchor, j]), fmt(e.gradients[anchor, j]), share])
    return table


def _limit_lines(e, anchor: int) -> List[str]:
    terms = int(e.in_denominator[anchor].sum())
    rate = float(e.limit_zero_rate[anchor])
    if math.isinf(e.limit_zero[anchor]):
        zero = (f"loss -> inf (a negative scores {fmt(rate)} above the positive); "
                f"tau*loss -> {fmt(rate)}")
    else:
        ties = int(round(math.exp(e.limit_zero[anchor])))
        why = ("the positive is the unique maximum" if ties == 1 else
               f"{ties} candidates, the positive among them, tie at the maximum")
        zero = f"loss -> {'0' if ties == 1 else _count(ties)} ({why}); tau*loss -> 0"
    return [f"limits: tau -> 0+: {zero}",
            f"        tau -> inf: loss -> {_count(terms)} (every candidate equally likely)"]


def print_anchor(explanation, anchor: int = 0, *, header: str = "", stream: Optional[TextIO] = None,
                 rich: bool = False, width: Optional[int] = None) -> None:
    """Print what ``contrastkit explain`` shows for one anchor of an :func:`contrastkit.analysis.explain`
    result: its candidate table (similarity, logit, probability, dL/ds, penalty share), the loss,
    the hardest negative and the limits in tau.

    ``rich`` draws the table with rich when it fits in ``width`` columns (default: the
    terminal's), else plain aligned text; numbers are never shortened.
    """
    _explain_one(_Printer(rich, stream, width=width), explanation, anchor, header)


def _explain_one(printer: _Printer, e, anchor: int, header: str) -> None:
    negatives = int(e.in_denominator[anchor].sum()) - 1
    p = e.positive[anchor]
    printer.line(header)
    printer.line()
    printer.table(_candidate_table(e, anchor))
    printer.line()
    printer.line(f"loss = -ln p+ = {fmt(e.losses[anchor])}    uniform choice: "
                 f"{_count(int(e.in_denominator[anchor].sum()))}")
    printer.line(f"dL/ds+ = (p+ - 1)/tau = {fmt(e.gradients[anchor, p])}; the negatives' dL/ds_j = p_j/tau "
                 "sum to the same magnitude")
    h = int(e.hardest_negative[anchor])
    printer.line(f"hardest negative: candidate {h} (s+ - s = {fmt(e.hardest_margin[anchor])}); "
                 f"penalty entropy {fmt(e.penalty_entropy[anchor])} nats = "
                 f"{e.effective_negatives[anchor]:.2f} effective negatives of {negatives}")
    printer.line(f"if every negative had the mean negative similarity: loss {fmt(e.loss_uniform_negatives[anchor])} "
                 "(never above the actual loss)")
    for text in _limit_lines(e, anchor):
        printer.line(text)


def _anchor_table(e) -> _Table:
    table = _Table(["anchor", "positive", "s+", "p+", "loss", "dL/ds+", "hardest", "s+ - s_hard",
                        "eff. negatives", "lim tau->0", "lim tau->inf"])
    for i in range(len(e.positive)):
        p = int(e.positive[i])
        table.rows.append([str(i), str(p), fmt(e.similarities[i, p]), fmt(e.probabilities[i, p]),
                           fmt(e.losses[i]), fmt(e.gradients[i, p]), str(int(e.hardest_negative[i])),
                           fmt(e.hardest_margin[i]), f"{e.effective_negatives[i]:.2f}",
                           fmt(e.limit_zero[i]), fmt(e.limit_infinity[i])])
    return table


def _matrix_block(printer: _Printer, title: str, table: _Table, notes: List[str], row: Optional[int],
                  explain_row) -> None:
    """A matrix's anchor table and notes, then (with --row) every candidate of one anchor."""
    printer.line(title)
    printer.line()
    printer.table(table)
    printer.line()
    for text in notes:
        printer.line(text)
    if row is not None:
        printer.line()
        explain_row(row, f"anchor {row}:")


def _explain_matrix(printer: _Printer, e, request: _Request) -> None:
    _matrix_block(printer, f"InfoNCE on a {request.description}, tau = {e.temperature:g}", _anchor_table(e),
                  [f"mean loss = {fmt(e.loss)}    mean uniform choice: {fmt(float(e.log_n.mean()))}",
                   f"mean loss limits: tau -> 0+: {fmt(e.mean_limit_zero)}; tau -> inf: {fmt(e.mean_limit_infinity)}"],
                  request.row, lambda row, header: _explain_one(printer, e, row, header))


def _sweep_table(s, request: _Request) -> _Table:
    first = s[0]
    if not request.is_matrix:
        k = first.similarities.shape[1]
        p = int(first.positive[0])
        show_all = k <= _MAX_PROBABILITY_COLUMNS
        prob_headers = [f"p{j}{' +' if j == p else ''}" for j in range(k)] if show_all else ["p+"]
        table = _Table(["tau", "loss", *prob_headers, "dL/ds+", "hardest share", "penalty entropy",
                            "eff. negatives"])
        for e in s:
            probs = [fmt(x) for x in e.probabilities[0]] if show_all else [fmt(e.probabilities[0, p])]
            h = int(e.hardest_negative[0])
            table.rows.append([f"{e.temperature:g}", fmt(e.losses[0]), *probs, fmt(e.gradients[0, p]),
                               fmt(e.penalty[0, h]), fmt(e.penalty_entropy[0]), f"{e.effective_negatives[0]:.2f}"])
        return table
    table = _Table(["tau", "mean loss", "mean p+", "min p+", "mean |dL/ds+|", "mean eff. negatives"])
    for e in s:
        pp = e.positive_probability
        table.rows.append([f"{e.temperature:g}", fmt(e.loss), fmt(pp.mean()), fmt(pp.min()),
                           fmt(np.abs(e.positive_gradient).mean()), f"{e.effective_negatives.mean():.2f}"])
    return table


def _print_sweep(printer: _Printer, s, request: _Request) -> None:
    first = s[0]
    if request.is_matrix:
        printer.line(f"InfoNCE temperature sweep on a {request.description}")
    else:
        k = first.similarities.shape[1]
        scores = " ".join(f"{x:g}" for x in first.similarities[0])
        printer.line(f"InfoNCE temperature sweep, {request.description}: s = {scores}, "
                     f"positive = candidate {int(first.positive[0])} ({k} candidates)")
    printer.line()
    printer.table(_sweep_table(s, request))
    printer.line()
    if request.is_matrix:
        printer.line(f"mean loss limits: tau -> 0+: {fmt(first.mean_limit_zero)}; "
                     f"tau -> inf: {fmt(first.mean_limit_infinity)}")
    else:
        printer.line(f"uniform choice: {_count(int(first.in_denominator[0].sum()))}")
        for text in _limit_lines(first, 0):
            printer.line(text)
    printer.line("note: a lower loss at a lower tau is not a better representation; compare "
                 "representations with a frozen encoder and a linear probe")


def _parse_bias(args: argparse.Namespace) -> float:
    if args.bias is None:
        return SIGLIP_BIAS
    if not args.sigmoid:
        raise ValueError("--bias needs --sigmoid")
    values = _parse_floats([args.bias], "--bias")
    if len(values) != 1 or not math.isfinite(values[0]):
        raise ValueError(f"--bias must be one finite number, got {args.bias!r}")
    return values[0]


def _sigmoid_pair_table(e, anchor: int) -> _Table:
    table = _Table(["candidate", "similarity", "logit", "P(match)", "P(right)", "loss term", "dL/ds", "dL/dt",
                    "dL/db", "softmax p", "softmax dL/ds"])
    for j in range(e.similarities.shape[1]):
        if e.labels[anchor, j] == 0:
            table.rows.append([f"{j} (self)", fmt(e.similarities[anchor, j])] + ["excluded"] + ["-"] * 8)
            continue
        name = f"{j} +" if j == e.positive[anchor] else str(j)
        table.rows.append([name, fmt(e.similarities[anchor, j]), fmt(e.logits[anchor, j]),
                           fmt(e.match_probabilities[anchor, j]), fmt(e.probabilities[anchor, j]),
                           fmt(e.loss_terms[anchor, j]), fmt(e.gradients[anchor, j]),
                           fmt(e.scale_gradients[anchor, j]), fmt(e.bias_gradients[anchor, j]),
                           fmt(e.softmax.probabilities[anchor, j]), fmt(e.softmax.gradients[anchor, j])])
    return table


def _sigmoid_one(printer: _Printer, e, anchor: int, header: str) -> None:
    printer.line(header)
    printer.line()
    printer.table(_sigmoid_pair_table(e, anchor))
    printer.line()
    printer.line(f"loss: sigmoid L = sum of the terms = {fmt(e.losses[anchor])}; "
                 f"softmax -ln p+ = {fmt(e.softmax.losses[anchor])}")
    printer.line(f"sum of dL/ds: sigmoid {fmt(e.gradient_sum[anchor])} (each pair is its own binary decision, "
                 f"dL/ds = t (P(match) - [positive])); softmax {fmt(e.softmax.gradients[anchor].sum())} "
                 "(the negatives compete with the positive: their gradients sum to minus its own)")
    printer.line(f"scale t = 1/tau = {e.scale:g}: dL/dt = {fmt(e.scale_gradient[anchor])}, "
                 f"dL/dt' = t dL/dt = {fmt(e.log_scale_gradient[anchor])} (SigLIP's t = exp(t')), "
                 f"dL/dtau = {fmt(e.temperature_gradient[anchor])}")
    printer.line(f"bias b = {e.bias:g}: dL/db = {fmt(e.bias_gradient[anchor])} (b shifts every logit alike; "
                 "a negative dL/db raises b, every P(match) with it)")
    printer.line(f"threshold: a pair reads as a match when s > -b tau = {fmt(e.threshold)}; tau sets how sharply "
                 "P(match) turns around it (the softmax has no threshold: only differences of s count)")


def _sigmoid_anchor_table(e) -> _Table:
    table = _Table(["anchor", "positive", "s+", "P(right)+", "loss", "softmax loss", "sum dL/ds", "dL/dt", "dL/db"])
    for i in range(len(e.positive)):
        p = int(e.positive[i])
        table.rows.append([str(i), str(p), fmt(e.similarities[i, p]), fmt(e.probabilities[i, p]),
                           fmt(e.losses[i]), fmt(e.softmax.losses[i]), fmt(e.gradient_sum[i]),
                           fmt(e.scale_gradient[i]), fmt(e.bias_gradient[i])])
    return table


def _print_sigmoid(printer: _Printer, e, request: _Request) -> None:
    where = f"tau = {e.temperature:g} (t = {e.scale:g}), b = {e.bias:g}"
    if not request.is_matrix:
        scores = " ".join(f"{x:g}" for x in e.similarities[0])
        _sigmoid_one(printer, e, 0, f"sigmoid (SigLIP) vs softmax (InfoNCE), {request.description}: s = {scores}, "
                                    f"{where}, positive = candidate {int(e.positive[0])} (marked +)")
        return
    _matrix_block(printer, f"sigmoid (SigLIP) vs softmax (InfoNCE) on a {request.description}, {where}",
                  _sigmoid_anchor_table(e),
                  [f"mean loss: sigmoid {fmt(e.loss)} (SigLIP's L); softmax {fmt(e.softmax.loss)}",
                   f"mean dL/dt = {fmt(float(e.scale_gradient.mean()))}, "
                   f"mean dL/db = {fmt(float(e.bias_gradient.mean()))}"],
                  request.row, lambda row, header: _sigmoid_one(printer, e, row, header))


def _run_sigmoid(args: argparse.Namespace, request: _Request, bias: float) -> int:
    from contrastkit.analysis import explain_sigmoid

    results = [explain_sigmoid(request.similarities, temperature=tau, bias=bias, positive=request.positive,
                               exclude_diagonal=request.exclude_diagonal) for tau in request.taus]
    if args.json:
        if len(results) == 1:
            print(results[0].to_json(indent=2))
        else:
            print("[" + ",\n".join(r.to_json(indent=2) for r in results) + "]")
        return 0
    printer = _Printer(not args.plain and sys.stdout.isatty())
    for k, e in enumerate(results):
        if k:
            printer.line()
        _print_sigmoid(printer, e, request)
    return 0


def run(args: argparse.Namespace) -> int:
    request = _request(args)  # before importing torch, so a typo is reported at once
    bias = _parse_bias(args)
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
        use_rich = not args.plain and sys.stdout.isatty()
        printer = _Printer(use_rich)
        if len(request.taus) > 1:
            _print_sweep(printer, result, request)
        elif request.is_matrix:
            _explain_matrix(printer, result, request)
        else:
            scores = " ".join(f"{x:g}" for x in result.similarities[0])
            _explain_one(printer, result, 0,
                         f"InfoNCE, {request.description}: s = {scores}, tau = {result.temperature:g}, "
                         f"positive = candidate {int(result.positive[0])} (marked +)")

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
