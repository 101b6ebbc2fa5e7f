"""What ``contrastkit explain`` prints: the candidate table of one anchor, a matrix's table of
anchors, a temperature sweep, the sigmoid (SigLIP) view next to the softmax and the temperature
methods next to a fixed tau, with the loss,
gradients, hardness and limits under each table; plain aligned text, or rich tables on a
terminal. Every number is shown in full (:func:`fmt`)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, TextIO

import numpy as np

from .explain_input import Request

__all__ = ["fmt", "Printer", "print_anchor", "print_softmax", "print_sigmoid", "print_methods"]

_MAX_PROBABILITY_COLUMNS = 6


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
class Table:
    """A table of text cells; the first column is aligned left, the others right."""

    headers: List[str]
    rows: List[List[str]] = field(default_factory=list)


class Printer:
    """Plain aligned text, or rich tables on a terminal."""

    def __init__(self, use_rich: bool, stream: Optional[TextIO] = None, width: Optional[int] = None) -> None:
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

    def table(self, table: Table) -> None:
        widths = [max(len(h), *(len(r[i]) for r in table.rows)) for i, h in enumerate(table.headers)]
        # rich would shorten numbers with an ellipsis when the table is wider than the terminal
        if self.console is not None and sum(widths) + 3 * len(widths) + 1 <= self.console.width:
            from rich.table import Table as RichTable

            rich_table = RichTable()
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


def _candidate_table(e, anchor: int) -> Table:
    table = Table(["candidate", "similarity", "logit", "probability", "dL/ds", "penalty share"])
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
    _explain_one(Printer(rich, stream, width=width), explanation, anchor, header)


def _explain_one(printer: Printer, e, anchor: int, header: str) -> None:
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


def _anchor_table(e) -> Table:
    table = Table(["anchor", "positive", "s+", "p+", "loss", "dL/ds+", "hardest", "s+ - s_hard",
                        "eff. negatives", "lim tau->0", "lim tau->inf"])
    for i in range(len(e.positive)):
        p = int(e.positive[i])
        table.rows.append([str(i), str(p), fmt(e.similarities[i, p]), fmt(e.probabilities[i, p]),
                           fmt(e.losses[i]), fmt(e.gradients[i, p]), str(int(e.hardest_negative[i])),
                           fmt(e.hardest_margin[i]), f"{e.effective_negatives[i]:.2f}",
                           fmt(e.limit_zero[i]), fmt(e.limit_infinity[i])])
    return table


def _matrix_block(printer: Printer, title: str, table: Table, notes: List[str], row: Optional[int],
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


def print_softmax(printer: Printer, result, request: Request) -> None:
    """The softmax (InfoNCE) view of ``request``: a temperature sweep's table when it has several
    temperatures, else a matrix's anchor table or the one query's candidate table."""
    if len(request.taus) > 1:
        _print_sweep(printer, result, request)
    elif request.is_matrix:
        _explain_matrix(printer, result, request)
    else:
        scores = " ".join(f"{x:g}" for x in result.similarities[0])
        _explain_one(printer, result, 0,
                     f"InfoNCE, {request.description}: s = {scores}, tau = {result.temperature:g}, "
                     f"positive = candidate {int(result.positive[0])} (marked +)")


def _explain_matrix(printer: Printer, e, request: Request) -> None:
    _matrix_block(printer, f"InfoNCE on a {request.description}, tau = {e.temperature:g}", _anchor_table(e),
                  [f"mean loss = {fmt(e.loss)}    mean uniform choice: {fmt(float(e.log_n.mean()))}",
                   f"mean loss limits: tau -> 0+: {fmt(e.mean_limit_zero)}; tau -> inf: {fmt(e.mean_limit_infinity)}"],
                  request.row, lambda row, header: _explain_one(printer, e, row, header))


def _sweep_table(s, request: Request) -> Table:
    first = s[0]
    if not request.is_matrix:
        k = first.similarities.shape[1]
        p = int(first.positive[0])
        show_all = k <= _MAX_PROBABILITY_COLUMNS
        prob_headers = [f"p{j}{' +' if j == p else ''}" for j in range(k)] if show_all else ["p+"]
        table = Table(["tau", "loss", *prob_headers, "dL/ds+", "hardest share", "penalty entropy",
                            "eff. negatives"])
        for e in s:
            probs = [fmt(x) for x in e.probabilities[0]] if show_all else [fmt(e.probabilities[0, p])]
            h = int(e.hardest_negative[0])
            table.rows.append([f"{e.temperature:g}", fmt(e.losses[0]), *probs, fmt(e.gradients[0, p]),
                               fmt(e.penalty[0, h]), fmt(e.penalty_entropy[0]), f"{e.effective_negatives[0]:.2f}"])
        return table
    table = Table(["tau", "mean loss", "mean p+", "min p+", "mean |dL/ds+|", "mean eff. negatives"])
    for e in s:
        pp = e.positive_probability
        table.rows.append([f"{e.temperature:g}", fmt(e.loss), fmt(pp.mean()), fmt(pp.min()),
                           fmt(np.abs(e.positive_gradient).mean()), f"{e.effective_negatives.mean():.2f}"])
    return table


def _print_sweep(printer: Printer, s, request: Request) -> None:
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



def _sigmoid_pair_table(e, anchor: int) -> Table:
    table = Table(["candidate", "similarity", "logit", "P(match)", "P(right)", "loss term", "dL/ds", "dL/dt",
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


def _sigmoid_one(printer: Printer, e, anchor: int, header: str) -> None:
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


def _sigmoid_anchor_table(e) -> Table:
    table = Table(["anchor", "positive", "s+", "P(right)+", "loss", "softmax loss", "sum dL/ds", "dL/dt", "dL/db"])
    for i in range(len(e.positive)):
        p = int(e.positive[i])
        table.rows.append([str(i), str(p), fmt(e.similarities[i, p]), fmt(e.probabilities[i, p]),
                           fmt(e.losses[i]), fmt(e.softmax.losses[i]), fmt(e.gradient_sum[i]),
                           fmt(e.scale_gradient[i]), fmt(e.bias_gradient[i])])
    return table


def print_sigmoid(printer: Printer, e, request: Request) -> None:
    """The sigmoid view of an :func:`contrastkit.analysis.explain_sigmoid` result: one row's pair table, or
    a matrix's anchor table (and with --row every pair of that anchor)."""
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


def _method_label(name: str) -> str:
    """How the tables name a method: its record's label (``fixed tau`` for the fixed one)."""
    from contrastkit.temperature_methods import get_temperature_method

    return "fixed tau" if name == "fixed" else get_temperature_method(name).label


def _method_candidates(view, anchor: int) -> Table:
    e = view.explanation
    table = Table(["candidate", "similarity", "probability", "gradient", "penalty share"])
    for j in range(e.similarities.shape[1]):
        if not e.in_denominator[anchor, j]:
            table.rows.append([f"{j} (self)", fmt(e.similarities[anchor, j]), "excluded", "-", "-"])
            continue
        positive = j == e.positive[anchor]
        table.rows.append([f"{j} +" if positive else str(j), fmt(e.similarities[anchor, j]),
                           fmt(e.probabilities[anchor, j]), fmt(view.gradients[anchor, j]),
                           "-" if positive else fmt(e.penalty[anchor, j])])
    return table


def _gradient_note(name: str) -> str:
    """A method's gradient, in its record's words (the first paragraph of its ``explain``'s docstring)."""
    from contrastkit.temperature_methods import get_temperature_method

    doc = get_temperature_method(name).explain.__doc__ or "its loss's gradient"
    return " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")


def print_methods(printer: Printer, comparison, request: Request) -> None:
    """The temperature methods next to a fixed tau (:func:`contrastkit.analysis.explain_methods`):
    a summary of every method for the anchor (its tau, gradient weight, positive's probability and
    pull, penalty spread), then each method's candidate table."""
    anchor = request.row or 0
    what = f"anchor {anchor}" if comparison.fixed.explanation.similarities.shape[0] > 1 else "the row"
    printer.line(f"temperature methods on {what}, next to tau = {fmt(comparison.fixed.temperatures[0])}")
    summary = Table(["method", "tau", "gradient weight", "P(positive)", "pull on positive", "effective negatives"])
    for view in comparison:
        e = view.explanation
        summary.rows.append([_method_label(view.method), fmt(view.temperatures[anchor]), fmt(view.weights[anchor]),
                             fmt(e.positive_probability[anchor]), fmt(view.positive_pull[anchor]),
                             fmt(e.effective_negatives[anchor])])
    printer.table(summary)
    for view in comparison:
        printer.line()
        printer.line(f"{_method_label(view.method)}: {view.source}")
        printer.table(_method_candidates(view, anchor))
    printer.line()
    printer.line("gradient: what the method's loss sends to each similarity; each method's, at the temperatures "
                 "above:")
    for view in comparison.views:
        printer.line(f"  {_method_label(view.method)}: {_gradient_note(view.method)}")
