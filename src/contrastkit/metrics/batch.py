"""What a training batch says about the run: the choice each anchor of the batch faces, read from
the similarities the loss itself computed (no extra forward pass).

A batch is a :class:`BatchProblem`: the similarities ``S`` ``(M, K)`` of ``M`` anchors to ``K``
candidates, each anchor's positive, and whether candidate ``i`` of a square matrix is anchor ``i``
itself (SimCLR's ``2B x 2B`` matrix, self excluded), as :func:`contrastkit.analysis.explain`
takes them. Each method says how its embeddings form one
(:meth:`contrastkit.methods.Method.batch_problem`): SimCLR and the other two-view methods the
``2B x 2B`` matrix of both views, positives ``i <-> i + B``; MoCo each query against its own key
and the queue; ConVIRT and SigLIP the ``B x B`` image-to-text matrix, positives on the diagonal
(for SigLIP the softmax view of its similarities).

:func:`batch_diagnostics` reduces a problem, at the run's ``tau``, to the numbers a training
record carries (:data:`DIAGNOSTICS`), on the batch's device and without reading any value
back (the caller reads them once, with the loss, at its logging step):

* ``positive_probability``: mean over anchors of ``p+ = exp(s+/tau) / sum_j exp(s_j/tau)`` (the
  course page P10: the probability the softmax gives the positive), ``min_positive_probability``
  the smallest;
* ``effective_negatives``: mean over anchors of ``exp(H)``, ``H`` the entropy of Wang & Liu's
  (CVPR 2021) relative penalty over the negatives ``r_j = exp(s_j/tau) / sum_{k neg} exp(s_k/tau)``:
  1 when the hardest negative takes the whole gradient, the number of negatives
  (``negatives``) when every negative weighs the same;
* ``positive_similarity``, ``hardest_negative_similarity``, ``negative_similarity``: the mean
  similarity of the positive, of the most similar negative and of all negatives.

:func:`batch_warnings` reads a record's numbers for the failures they show (:data:`WARNINGS`).
They agree with :func:`~contrastkit.analysis.explain` on the same matrix (tested to 1e-12 in
float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["BatchProblem", "DIAGNOSTICS", "batch_diagnostics", "diagnostic_anchors", "MAX_DIAGNOSTIC_ANCHORS", "diagnostics_record", "WARNINGS",
           "batch_warnings", "COLLAPSE_SIMILARITY", "COLLAPSE_STEPS", "COLLAPSE_FALL", "CERTAIN_PROBABILITY", "BOUND_TOLERANCE",
           "OWN_ITEM", "NOT_AN_ITEM", "VIEW_A", "VIEW_B", "IMAGE", "TEXT", "QUEUED"]

#: The numbers :func:`batch_diagnostics` returns, in its order (keys of a step record).
DIAGNOSTICS: Tuple[str, ...] = ("positive_probability", "min_positive_probability", "effective_negatives",
                                "positive_similarity", "hardest_negative_similarity", "negative_similarity")

# What a row or column of a problem is (BatchProblem.row_views / column_views).
VIEW_A, VIEW_B, IMAGE, TEXT, QUEUED = 0, 1, 2, 3, 4
#: ``column_items`` value of a column that is each anchor's own item (MoCo's key of the query's image).
OWN_ITEM = -2
#: ``column_items`` value of a column that is no item of the batch (a queued key of an earlier step).
NOT_AN_ITEM = -1


@dataclass
class BatchProblem:
    """The choice every anchor of a batch faces, as the loss saw it.

    ``similarities`` ``(M, K)`` (cosine similarities, before the division by ``tau``);
    ``positive`` ``(M,)`` the column of each anchor's positive; ``exclude_diagonal``: the matrix
    is square and candidate ``i`` is anchor ``i`` itself (left out of the denominator).
    ``row_items`` / ``column_items``: the batch element (``0 .. B-1``) of each row and column
    (``OWN_ITEM`` = -2: the anchor's own element; ``NOT_AN_ITEM`` = -1: none);
    ``row_views`` / ``column_views``: what of it (``VIEW_A`` = 0, ``VIEW_B`` = 1, ``IMAGE`` = 2,
    ``TEXT`` = 3, ``QUEUED`` = 4, constants of this module: the batch maker's ``batch[0]`` holds
    view A or the images, ``batch[1]`` view B). ``description`` says in words what the rows and
    columns are.
    """

    similarities: Optional[Tensor]
    positive: Tensor
    exclude_diagonal: bool
    row_items: Tensor
    row_views: Tensor
    column_items: Tensor
    column_views: Tensor
    description: str = ""
    #: ``rows_of(index)``: the similarities of the anchors ``index`` (``(t,)`` int64) to every
    #: candidate, ``(t, K)``, computed when asked; ``similarities`` is then ``None`` and ``size``
    #: says ``(M, K)``, so that a large batch's matrix (``2B x 2B`` = 8 GiB of float64 at
    #: B = 16,384) is never held whole (:meth:`computed`).
    rows_of: Optional[Callable[[Tensor], Tensor]] = None
    size: Optional[Tuple[int, int]] = None

    @classmethod
    def computed(cls, rows_of: Callable[[Tensor], Tensor], size: Tuple[int, int], positive: Tensor,
                 exclude_diagonal: bool, row_items: Tensor, row_views: Tensor, column_items: Tensor,
                 column_views: Tensor, description: str = "") -> "BatchProblem":
        """A problem whose similarities are computed a block of anchors at a time by ``rows_of``
        (e.g. ``lambda index: z[index] @ z.T``), ``size`` ``(M, K)``."""
        return cls(None, positive, exclude_diagonal, row_items, row_views, column_items, column_views, description,
                   rows_of, (int(size[0]), int(size[1])))

    @property
    def shape(self) -> Tuple[int, int]:
        """``(M, K)``: anchors and candidates."""
        if self.similarities is not None:
            return int(self.similarities.shape[0]), int(self.similarities.shape[1])
        assert self.size is not None
        return self.size

    def similarity_rows(self, index: Tensor) -> Tensor:
        """``(t, K)``: the similarities of the anchors ``index`` to every candidate."""
        if self.similarities is not None:
            return self.similarities[index.to(self.similarities.device)]
        assert self.rows_of is not None
        return self.rows_of(index)

    def matrix(self) -> Tensor:
        """The whole ``(M, K)`` similarity matrix (computed if it is not held: mind its size)."""
        if self.similarities is not None:
            return self.similarities
        return self.similarity_rows(torch.arange(self.shape[0], device=self.positive.device))

    @property
    def negatives(self) -> int:
        """The number of negatives of each anchor (the denominator less the positive)."""
        return self.shape[1] - 1 - int(self.exclude_diagonal)

    def denominator(self) -> Tensor:
        """``(M, K)`` bool: the candidates in each anchor's denominator."""
        m, k = self.shape
        mask = torch.ones(m, k, dtype=torch.bool, device=self.positive.device)
        if self.exclude_diagonal:
            mask.fill_diagonal_(False)
        return mask

    def item_of(self, row: int, column: int) -> int:
        """The batch element of candidate ``column`` of anchor ``row`` (-1: none)."""
        item = int(self.column_items[column])
        return int(self.row_items[row]) if item == OWN_ITEM else item


#: At most this many anchors of a batch enter its diagnostics: all of them up to it (SimCLR's
#: ``2B`` rows for B <= 2,048), else this many spread evenly over the batch, whose means and
#: smallest p+ they then estimate. Each is compared with every candidate of the batch.
MAX_DIAGNOSTIC_ANCHORS = 4096
#: Similarities computed at once (a block of anchors by every candidate): 32 MiB of float64.
_BLOCK_ENTRIES = 1 << 22


def diagnostic_anchors(m: int, max_anchors: int = MAX_DIAGNOSTIC_ANCHORS) -> Tensor:
    """The anchors of a batch of ``m`` that enter its diagnostics (``(t,)`` int64, increasing):
    all of them, or ``max_anchors`` spread evenly from the first to the last."""
    if m <= max_anchors:
        return torch.arange(m)
    return torch.linspace(0, m - 1, max_anchors, dtype=torch.float64).round().long().unique()


def batch_diagnostics(problem: BatchProblem, temperature: Union[float, Tensor], *,
                      max_anchors: int = MAX_DIAGNOSTIC_ANCHORS) -> Tensor:
    """The :data:`DIAGNOSTICS` of ``problem`` at ``temperature`` (a float, or a 0-dim tensor such
    as a learnable ``tau`` of the step), a ``(6,)`` tensor on the problem's device, in the
    precision of its similarities (float64 from the built-in methods where the device has it).
    No value is read back.

    The anchors are ``diagnostic_anchors(M, max_anchors)`` (all of them up to ``max_anchors``),
    each against every candidate, a block of anchors at a time (at most 4M similarities), so
    that memory is bounded whatever the batch: the whole matrix is never formed.

    Candidates outside an anchor's denominator get a logit far below every other (the block's
    smallest logit less 1e4), whose share underflows to exactly 0: no infinity or NaN is formed
    (a version with ``-inf`` masks was 4x slower on a CPU, ``benchmarks/results/pictures.md``)."""
    m, k = problem.shape
    device = problem.positive.device
    anchors = diagnostic_anchors(m, max_anchors).to(device)
    block = max(1, _BLOCK_ENTRIES // max(k, 1))
    sums: Optional[Tensor] = None
    smallest: Optional[Tensor] = None
    for start in range(0, int(anchors.shape[0]), block):
        index = anchors[start:start + block]
        s = problem.similarity_rows(index).detach()
        if not s.is_floating_point():
            s = s.double()
        tau = temperature.detach().to(s.device, s.dtype) if isinstance(temperature, Tensor) else float(temperature)
        rows = torch.arange(index.shape[0], device=s.device)
        index = index.to(s.device)
        positive = problem.positive.to(s.device)[index]
        logits = s / tau
        low = logits.amin() - 1e4
        if problem.exclude_diagonal:
            logits[rows, index] = low
        p_positive = torch.log_softmax(logits, dim=1)[rows, positive].exp()
        logits[rows, positive] = low
        log_r = torch.log_softmax(logits, dim=1)
        effective = (-(log_r.exp() * log_r).sum(1)).clamp(min=0.0).exp()
        positive_similarity = s[rows, positive]
        hardest = logits.amax(dim=1) * tau
        others = s.sum(1) - positive_similarity - (s[rows, index] if problem.exclude_diagonal else 0.0)
        totals = torch.stack([p_positive.sum(), effective.sum(), positive_similarity.sum(), hardest.sum(),
                              (others / problem.negatives).sum()])
        sums = totals if sums is None else sums + totals
        least = p_positive.min()
        smallest = least if smallest is None else torch.minimum(smallest, least)
    assert sums is not None and smallest is not None
    means = sums / anchors.shape[0]
    return torch.stack([means[0], smallest, means[1], means[2], means[3], means[4]])


def diagnostics_record(values: Any, negatives: int) -> Dict[str, float]:
    """The step record's fields from the values of :func:`batch_diagnostics` (read back) and the
    number of negatives per anchor."""
    record = {key: float(value) for key, value in zip(DIAGNOSTICS, values)}
    record["negatives"] = int(negatives)
    return record


#: A collapsing embedding: the mean similarity of the negatives at or above this (every similarity
#: near 1) at :data:`COLLAPSE_STEPS` logged steps in a row, not falling over them by more than
#: :data:`COLLAPSE_FALL`.
COLLAPSE_SIMILARITY = 0.9
COLLAPSE_STEPS = 3
COLLAPSE_FALL = 0.01
#: p+ at 1 for every anchor: the smallest p+ of the batch at or above this.
CERTAIN_PROBABILITY = 0.999
#: A learnable tau within this relative distance of its bound is pinned at it.
BOUND_TOLERANCE = 0.01

#: The failures :func:`batch_warnings` reports, by kind, with what each means.
WARNINGS: Dict[str, str] = {
    "collapse": "the embedding is collapsing: every similarity is near 1, the negatives are as close as the "
                "positive",
    "tau_at_bound": "the learnable temperature is pinned at its bound",
    "positives_certain": "p+ is 1 for every anchor: the choice is trivial, so 1 - p+ and the gradient vanish",
}


def batch_warnings(record: Mapping[str, Any], *, learnable: bool = False, tau_bound: Optional[float] = None,
                   previous: Sequence[Mapping[str, Any]] = ()) -> List[Dict[str, Any]]:
    """The failures a step record's diagnostics show, as ``{"kind", "message"}`` dicts
    (kinds of :data:`WARNINGS`; none when the record has no diagnostics); ``previous``: the
    records of the logged steps before it, oldest first:

    * ``collapse``: the mean negative similarity is at least ``COLLAPSE_SIMILARITY`` (0.9) at this
      and the ``COLLAPSE_STEPS - 1`` (2) logged steps before it, and has not fallen over them by
      more than ``COLLAPSE_FALL`` (0.01). A network at its initialisation (with GroupNorm or
      LayerNorm especially) can start with every similarity near 1 and leave it within a few
      steps: that is not a collapse. The effective number of negatives then sits near all of
      them (the penalty is uniform) or, at a tiny ``tau``, near 1;
    * ``tau_at_bound``: ``learnable`` and the record's ``tau`` within ``BOUND_TOLERANCE`` (1 %,
      relative) of ``tau_bound``, the floor ``1 / max_scale`` of the temperature;
    * ``positives_certain``: the smallest ``p+`` of the batch is at least ``CERTAIN_PROBABILITY``
      (0.999).
    """
    out: List[Dict[str, Any]] = []

    def number(key: str) -> Optional[float]:
        value = record.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    negative = number("negative_similarity")
    effective, count = number("effective_negatives"), number("negatives")
    window = [r.get("negative_similarity") for r in list(previous)[-(COLLAPSE_STEPS - 1):]] + [negative]
    if len(window) == COLLAPSE_STEPS and all(isinstance(v, (int, float)) and v >= COLLAPSE_SIMILARITY for v in window) \
            and window[-1] >= window[0] - COLLAPSE_FALL:
        spread = f"; effective negatives {effective:.1f} of {count:.0f}" if effective is not None and count else ""
        out.append({"kind": "collapse", "message": f"{WARNINGS['collapse']} (mean negative similarity "
                                                   f"{negative:.3f}, positive {number('positive_similarity') or 0:.3f}"
                                                   f"{spread})"})
    tau = number("tau")
    if learnable and tau is not None and tau_bound is not None and tau <= tau_bound * (1 + BOUND_TOLERANCE):
        out.append({"kind": "tau_at_bound", "message": f"{WARNINGS['tau_at_bound']} (tau {tau:.4g}, bound "
                                                       f"{tau_bound:.4g})"})
    lowest = number("min_positive_probability")
    if lowest is not None and lowest >= CERTAIN_PROBABILITY:
        out.append({"kind": "positives_certain", "message": f"{WARNINGS['positives_certain']} (smallest p+ "
                                                            f"{lowest:.4f})"})
    return out
