"""What the sigmoid (SigLIP) loss does with given similarities, next to the softmax view.

For anchor ``i`` with similarities ``s_ij`` to its candidates, temperature ``tau`` (SigLIP's
scale ``t = 1 / tau``), bias ``b`` and positive ``p(i)`` (Zhai et al., ICCV 2023)::

    label        z_ij = +1 for the positive, -1 for every negative      (y_ij = [j == p(i)])
    logit        l_ij = s_ij / tau + b = t s_ij + b
    match prob.  q_ij = sigmoid(l_ij)              the model's belief that (i, j) is a true pair
    probability  p_ij = sigmoid(z_ij l_ij)         the probability it gives the right answer
    loss term    L_ij = -log p_ij = softplus(-z_ij l_ij);   row loss L_i = sum_j L_ij
    gradients    dL_ij/ds_ij = t (q_ij - y_ij),   dL_ij/dt = s_ij (q_ij - y_ij),   dL_ij/db = q_ij - y_ij

Each pair is its own binary decision: its gradient depends on its own similarity only, and
the gradients of a row need not sum to anything; in the softmax (InfoNCE) the candidates
share one normaliser, so every negative competes with the positive and the gradients of a
row sum to zero. The bias shifts every logit alike: the decision boundary ``q_ij = 1/2`` lies
at the similarity ``s = -b tau`` (:attr:`SigmoidExplanation.threshold`), so ``b`` says where
"similar enough" begins, while ``tau`` says how sharply the decision flips around it. SigLIP
starts at ``t = 10, b = -10`` (threshold ``s = 1``): every pair is judged a negative, so the
many negatives start with a small loss.

The ``tau -> 0+`` limit (``b`` fixed): a pair's term goes to 0 when it lies on the right side
of ``s = 0`` (positives with ``s > 0``, negatives with ``s < 0``) and grows like
``|s| / tau`` on the wrong side; in the softmax only the gap to the best competitor counts.

Computed in float64. The softmax side is :func:`~contrastkit.analysis.explain` at the same
``tau`` (the bias does not enter it: a softmax is unchanged by adding a constant to every logit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from contrastkit.losses import SIGLIP_BIAS
from contrastkit.losses.validation import check_scalar

from .explanation import Explanation, PositiveLike, SimilaritiesLike, _check_tau, _dumps, _explain, _prepare, \
    _write_csv

__all__ = ["SigmoidExplanation", "explain_sigmoid", "SIGLIP_BIAS"]


@dataclass(frozen=True, eq=False)
class SigmoidExplanation:
    """The sigmoid loss at one ``tau`` and ``b``, every anchor, and the softmax view of the same rows.

    Arrays are float64 numpy, ``(N, K)`` per pair and ``(N,)`` per anchor; a single row
    ``(K,)`` is reported as ``N = 1``. Pairs left out (the anchor itself with
    ``exclude_diagonal``) have label 0 and every term, probability and gradient 0.
    Gradients are of the anchor's own row loss ``L_i = sum_j L_ij`` (the per-image sum that
    :func:`~contrastkit.losses.sigmoid_loss` averages over images).
    """

    temperature: float
    bias: float
    similarities: np.ndarray          # (N, K) input
    positive: np.ndarray              # (N,) column of each anchor's positive
    labels: np.ndarray                # (N, K) z: +1 positive, -1 negative, 0 left out
    logits: np.ndarray                # (N, K) s / tau + b
    match_probabilities: np.ndarray   # (N, K) sigmoid(logit): P(pair is a true pair)
    probabilities: np.ndarray         # (N, K) sigmoid(z logit): P(the right answer)
    loss_terms: np.ndarray            # (N, K) -log sigmoid(z logit)
    gradients: np.ndarray             # (N, K) dL/ds = t (q - y)
    scale_gradients: np.ndarray       # (N, K) dL/dt = s (q - y)
    bias_gradients: np.ndarray        # (N, K) dL/db = q - y
    losses: np.ndarray                # (N,) sum_j loss_terms
    softmax: Explanation              # InfoNCE on the same rows at the same tau
    single_row: bool = False
    exclude_diagonal: bool = False

    @property
    def scale(self) -> float:
        """SigLIP's ``t = 1 / tau``."""
        return 1.0 / self.temperature

    @property
    def threshold(self) -> float:
        """The similarity ``s = -b tau`` at which a pair's match probability is 1/2."""
        return -self.bias * self.temperature

    @property
    def loss(self) -> float:
        """SigLIP's ``L``, the mean over anchors of the row loss (for a single row, its loss)."""
        return float(self.losses.mean())

    @property
    def scale_gradient(self) -> np.ndarray:
        """``(N,)`` ``dL_i/dt``: the sum of the row's pair terms."""
        return self.scale_gradients.sum(axis=1)

    @property
    def bias_gradient(self) -> np.ndarray:
        """``(N,)`` ``dL_i/db``: the sum of the row's pair terms."""
        return self.bias_gradients.sum(axis=1)

    @property
    def log_scale_gradient(self) -> np.ndarray:
        """``(N,)`` ``dL_i/dt'`` for SigLIP's ``t = exp(t')``: ``t dL_i/dt``."""
        return self.scale * self.scale_gradient

    @property
    def temperature_gradient(self) -> np.ndarray:
        """``(N,)`` ``dL_i/dtau = -t^2 dL_i/dt``."""
        return -self.scale ** 2 * self.scale_gradient

    @property
    def gradient_sum(self) -> np.ndarray:
        """``(N,)`` the sum of a row's ``dL/ds`` (the softmax's is 0)."""
        return self.gradients.sum(axis=1)

    def candidate_records(self) -> List[Dict[str, Any]]:
        """One flat record per (anchor, candidate): the sigmoid columns, then the softmax's."""
        columns = {"similarity": self.similarities, "logit": self.logits,
                   "match_probability": self.match_probabilities, "probability": self.probabilities,
                   "loss_term": self.loss_terms, "gradient": self.gradients, "scale_gradient": self.scale_gradients,
                   "bias_gradient": self.bias_gradients, "softmax_probability": self.softmax.probabilities,
                   "softmax_gradient": self.softmax.gradients}
        return [{"temperature": self.temperature, "bias": self.bias, "anchor": i, "candidate": j,
                 "is_positive": bool(j == self.positive[i]), "label": int(self.labels[i, j]),
                 **{name: float(values[i, j]) for name, values in columns.items()}}
                for i, j in np.ndindex(*self.similarities.shape)]

    def anchor_records(self) -> List[Dict[str, Any]]:
        """One flat record per anchor."""
        return [{"temperature": self.temperature, "bias": self.bias, "anchor": i, "positive": int(self.positive[i]),
                 "loss": float(self.losses[i]), "scale_gradient": float(self.scale_gradient[i]),
                 "bias_gradient": float(self.bias_gradient[i]), "gradient_sum": float(self.gradient_sum[i]),
                 "softmax_loss": float(self.softmax.losses[i])} for i in range(len(self.positive))]

    def to_dict(self) -> Dict[str, Any]:
        """Every field as plain lists and numbers, the derived ones too; ``softmax`` nested."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Explanation):
                value = value.to_dict()
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        for name in ("scale", "threshold", "loss"):
            out[name] = getattr(self, name)
        for name in ("scale_gradient", "bias_gradient", "log_scale_gradient", "temperature_gradient", "gradient_sum"):
            out[name] = getattr(self, name).tolist()
        return out

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON; infinite values are written as the string ``"Infinity"``."""
        return _dumps(self.to_dict(), **kwargs)

    def to_csv(self, path: Optional[Union[str, os.PathLike]] = None, *, table: str = "candidates",
               overwrite: bool = False) -> Optional[str]:
        """Write ``table`` ("candidates" or "anchors") as CSV to ``path``, or return it as a string."""
        if table not in ("candidates", "anchors"):
            raise ValueError(f"table must be 'anchors' or 'candidates', got {table!r}")
        records = self.candidate_records() if table == "candidates" else self.anchor_records()
        return _write_csv(records, path, overwrite)


def explain_sigmoid(
    similarities: SimilaritiesLike,
    *,
    temperature: float,
    bias: float = SIGLIP_BIAS,
    positive: PositiveLike = 0,
    exclude_diagonal: bool = False,
) -> SigmoidExplanation:
    """Explain the sigmoid loss on given similarities at one ``tau`` and bias ``b``.

    Args:
        similarities: a row ``(K,)`` or a matrix ``(N, K)``, as for :func:`~contrastkit.analysis.explain`.
        temperature: ``tau > 0`` (SigLIP's ``t = 1 / tau``; its initialisation is ``tau = 0.1``).
        bias: ``b``, a finite number (default -10, SigLIP's initialisation).
        positive: the positive's column (an int for a row, one per row for a matrix).
        exclude_diagonal: leave each anchor's pair with itself out (a self-similarity matrix).

    Returns:
        :class:`SigmoidExplanation`, with :attr:`~SigmoidExplanation.softmax` the InfoNCE
        explanation of the same rows at the same ``tau``.

    Example:
        >>> e = explain_sigmoid([1.0, 0.5, 0.0], temperature=0.5, bias=-1.0)
        >>> e.probabilities[0].round(4).tolist(), round(e.loss, 6)
        ([0.7311, 0.5, 0.7311], 1.319671)
    """
    tau = _check_tau(temperature)
    if isinstance(bias, (np.floating, np.integer)):
        bias = float(bias)
    b = float(check_scalar(bias, "bias", floating=True))
    problem = _prepare(similarities, positive, exclude_diagonal)
    softmax = _explain(problem, tau)
    s, mask = problem.similarities, problem.in_denominator
    n, k = s.shape
    rows = torch.arange(n)
    positives = torch.zeros(n, k, dtype=torch.bool)
    positives[rows, problem.positive] = True
    z = torch.where(positives, 1.0, -1.0).to(torch.float64).masked_fill(~mask, 0.0)
    logits = s / tau + b
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"temperature {tau!r} is too small for these similarities: s / tau overflows float64")
    zero = torch.zeros((), dtype=torch.float64)
    match = torch.where(mask, torch.sigmoid(logits), zero)
    probabilities = torch.where(mask, torch.sigmoid(z * logits), zero)
    terms = torch.where(mask, -F.logsigmoid(z * logits), zero)
    # q - y: for the positive -sigmoid(-l), not sigmoid(l) - 1, which would cancel near q = 1.
    residual = torch.where(positives, -torch.sigmoid(-logits), match).masked_fill(~mask, 0.0)

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().numpy().copy()

    return SigmoidExplanation(
        temperature=tau, bias=b, similarities=arr(s), positive=arr(problem.positive), labels=arr(z),
        logits=arr(torch.where(mask, logits, zero)), match_probabilities=arr(match), probabilities=arr(probabilities),
        loss_terms=arr(terms), gradients=arr(residual / tau), scale_gradients=arr(residual * s),
        bias_gradients=arr(residual), losses=arr(terms.sum(dim=1)), softmax=softmax,
        single_row=problem.single_row, exclude_diagonal=problem.exclude_diagonal,
    )
