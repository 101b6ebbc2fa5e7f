"""Verdicts: one claim of a source text, what a study's numbers say about it, and the rule.

Every verdict is one of three statuses, decided by a rule that is printed with it:

* :data:`HOLDS` -- the numbers support the claim by more than their noise;
* :data:`FAILS` -- the numbers go the other way (printed "does not hold here");
* :data:`UNDECIDED` -- within the noise, or too few runs to tell (printed "inconclusive").

The helpers here are the rules the studies share; each study states its own claims.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Sequence

from .stats import mean_std, standard_error

__all__ = ["HOLDS", "FAILS", "UNDECIDED", "NEEDS_LABELS", "STATUSES", "Verdict", "format_verdicts", "margin_status",
           "correlation_status", "gap_verdict", "paired_seed_verdict", "needs_labels_verdict", "PAIRED_SEED_RULE"]

HOLDS, FAILS, UNDECIDED = "holds", "does not hold here", "inconclusive"
#: A claim about class labels (accuracy, tolerance) on data without any: not judged.
NEEDS_LABELS = "needs labels"
#: The statuses, in this order.
STATUSES = (HOLDS, FAILS, UNDECIDED, NEEDS_LABELS)


@dataclass
class Verdict:
    """One claim, what the results say about it, and the numbers behind the call."""

    claim: str
    status: str  # HOLDS, FAILS or UNDECIDED
    evidence: str
    rule: str

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


def format_verdicts(verdicts: Sequence[Verdict]) -> str:
    """The verdicts as the study commands print them (claim, evidence, rule)."""
    lines = ["Verdicts (computed from the results above):"]
    for v in verdicts:
        lines.append(f"  [{v.status}] {v.claim}")
        lines.append(f"      {v.evidence}")
        lines.append(f"      rule: {v.rule}")
    return "\n".join(lines)


def margin_status(*, contrary: bool, margin: float, noise: float, runs: int) -> str:
    """The rule of a claim that one side beats another by more than the noise.

    :data:`FAILS` when the result is ``contrary`` to the claim; :data:`HOLDS` when ``margin``
    exceeds ``noise`` and there are at least 2 runs per setting (``runs`` is the fewest), so
    that the seed-to-seed noise is estimated at all; :data:`UNDECIDED` otherwise.
    """
    if contrary:
        return FAILS
    if runs >= 2 and margin > noise:
        return HOLDS
    return UNDECIDED


#: The rule of :func:`paired_seed_verdict`, to be completed with what is compared.
PAIRED_SEED_RULE = ("difference = {other} minus {baseline} within each seed (same initialisation, data order and "
                    "read-out); holds if the mean difference is larger than 2 standard errors of the mean (needs >= 2 "
                    "seeds); does not hold if it is <= 0; inconclusive otherwise")


def paired_seed_verdict(claim: str, baseline: Dict[int, float], other: Dict[int, float], *, compared: str,
                        rule: str) -> Verdict:
    """The claim that ``other`` beats ``baseline`` (each ``{seed: accuracy}``), judged on the
    per-seed differences by :func:`margin_status` with 2 standard errors as the noise;
    ``compared`` says what the differences are, in the evidence."""
    seeds = sorted(set(baseline) & set(other))
    differences = [other[seed] - baseline[seed] for seed in seeds]
    mean = mean_std(differences)[0] if differences else float("nan")
    error = standard_error(differences)
    status = margin_status(contrary=not mean > 0, margin=mean, noise=2 * error, runs=len(differences))
    evidence = (f"{compared} per seed: " + ", ".join(f"{d:+.4f}" for d in differences)
                + f"; mean {mean:+.4f} vs 2 standard errors {2 * error:.4f} (n = {len(differences)} seeds)")
    return Verdict(claim, status, evidence, rule)


def needs_labels_verdict(claim: str, retrieval: Dict[str, Sequence[float]], compared: str) -> Verdict:
    """A claim about probe accuracy on data without labels: not judged (``NEEDS_LABELS``). The
    held-out view retrieval top-1 of each compared setting (``retrieval``: name -> per-run
    values) is shown, not used: it scores the pretext task the loss itself optimises, which a
    setting can win without a better representation. ``compared``: what the user would judge
    with ``--eval-data`` (e.g. ``"schedules"``)."""
    shown = ", ".join(f"{name} {mean_std(found)[0]:.4f}" for name, found in retrieval.items() if found)
    evidence = "no probe accuracy without labels" + (f"; held-out view retrieval top-1 (label-free, not the "
                                                     f"claim's measure): {shown}" if shown else "")
    rule = ("the claim is about probe accuracy, which needs class labels: run the experiment on labelled data "
            f"(class folders), or judge the {compared} with --eval-data on a labelled set in contrastkit pretrain")
    return Verdict(claim, NEEDS_LABELS, evidence, rule)


def correlation_status(rho: float, threshold: float = 0.8) -> str:
    """A claimed monotone trend, from a rank correlation ``rho`` signed so that the claim is
    ``rho > 0``: holds at ``rho >= threshold``, fails at ``rho <= 0``, undecided otherwise or
    when ``rho`` is ``nan``."""
    if math.isnan(rho):
        return UNDECIDED
    if rho >= threshold:
        return HOLDS
    if rho <= 0:
        return FAILS
    return UNDECIDED


def gap_verdict(claim: str, better: Sequence[float], worse: Sequence[float], better_name: str,
                worse_name: str) -> Verdict:
    """``worse`` has a lower mean than ``better``: holds when the gap exceeds the larger of
    the two standard deviations, does not hold when ``worse`` is not lower, else inconclusive."""
    mb, sb = mean_std(better)
    mw, sw = mean_std(worse)
    gap = mb - mw
    status = margin_status(contrary=gap <= 0, margin=gap, noise=max(sb, sw), runs=min(len(better), len(worse)))
    evidence = (f"{better_name} {mb:.4f} +/- {sb:.4f} vs {worse_name} {mw:.4f} +/- {sw:.4f} "
                f"(gap {gap:+.4f}, n = {len(better)}/{len(worse)})")
    rule = ("holds if the gap in means is positive and larger than the larger standard deviation over "
            "seeds (needs >= 2 seeds); does not hold if it is <= 0; inconclusive otherwise")
    return Verdict(claim, status, evidence, rule)
