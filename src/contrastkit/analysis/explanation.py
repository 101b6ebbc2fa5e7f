"""What the InfoNCE loss does with given similarities: probabilities, gradients, hardness, limits.

For anchor ``i`` with similarities ``s_ij`` to its candidates, temperature ``tau`` and
positive ``p(i)`` (the course page P10; the textbook, section 30.2)::

    logits       l_ij = s_ij / tau
    probability  p_ij = exp(l_ij) / sum_{k in D(i)} exp(l_ik)        (D(i): denominator terms)
    loss         l_i  = -log p_{i,p(i)}
    gradient     dl_i/ds_ij = (p_ij - 1) / tau  for the positive,  p_ij / tau  for a negative
    penalty      r_ij = exp(l_ij) / sum_{k in D(i), k != p(i)} exp(l_ik)   (negatives only)

The denominator ``D(i)`` holds every candidate, the positive included; with
``exclude_diagonal=True`` (a self-similarity matrix, as in NT-Xent) candidate ``i`` is the
anchor itself and is left out. The penalty ``r_i`` is the relative penalty of Wang & Liu
(CVPR 2021): a Boltzmann distribution over the negatives whose entropy grows strictly with
``tau`` (for negatives that are not all equally similar). Its exponential, the *effective
number of negatives*, runs from 1 (only the hardest negative matters, ``tau -> 0``) to the
number of negatives (all weigh the same, ``tau -> inf``).

Limits (the temperature lemma of the textbook, section 30.2), with
``A = max_{k in D(i)} s_ik``, ``B = s_{i,p(i)}`` and ``m`` the number of denominator terms
equal to ``A``: ``tau -> 0+``: ``l_i -> log m`` if ``A = B`` (0 when the positive is the
unique maximum) and ``+inf`` if ``A > B``, while ``tau * l_i -> A - B``; ``tau -> inf``:
``l_i -> log |D(i)|``. Ties are exact float equality. The sources' worked examples are
restated in ``docs/sources.md``.

Everything is computed in float64 through the loss core
(:func:`contrastkit.losses.contrastive_loss`); the log-normalisers are recovered from the
core's losses, so there is one log-sum-exp implementation in the package.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from contrastkit.losses.validation import check_embeddings, check_index, resolve_temperature
from contrastkit.losses.core import contrastive_loss

__all__ = ["Explanation", "Sweep", "explain", "sweep"]

SimilaritiesLike = Union[Tensor, np.ndarray, Sequence[float], Sequence[Sequence[float]]]
PositiveLike = Union[int, Sequence[int], Tensor, np.ndarray]


# --------------------------------------------------------------------------- input


@dataclass(frozen=True)
class _Problem:
    """Validated input: float64 similarities (N, K), positives (N,), denominator mask (N, K)."""

    similarities: Tensor
    positive: Tensor
    in_denominator: Tensor
    single_row: bool
    exclude_diagonal: bool


def _as_float64(similarities: object) -> Tensor:
    if isinstance(similarities, Tensor):
        if similarities.is_complex() or similarities.dtype == torch.bool:
            raise TypeError(f"similarities must be real numbers, got a tensor of dtype {similarities.dtype}")
        return similarities.detach().to(device="cpu", dtype=torch.float64)
    if isinstance(similarities, (str, bytes)):
        raise TypeError("similarities must be a sequence of numbers, got a string")
    try:
        array = np.asarray(similarities, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"similarities must be numbers (a (K,) row or an (N, K) matrix): {err}") from None
    return torch.from_numpy(array.copy())


def _prepare(similarities: SimilaritiesLike, positive: PositiveLike, exclude_diagonal: bool) -> _Problem:
    if not isinstance(exclude_diagonal, bool):
        raise TypeError(f"exclude_diagonal must be a bool, got {type(exclude_diagonal).__name__}")
    s = _as_float64(similarities)
    if s.numel() == 0:
        raise ValueError(f"similarities is empty (shape {tuple(s.shape)}): give a positive and at least one negative")
    single_row = s.dim() == 1
    if single_row:
        if exclude_diagonal:
            raise ValueError("exclude_diagonal=True needs an (N, N) similarity matrix; a single row has no diagonal")
        if isinstance(positive, bool) or not isinstance(positive, (int, np.integer)):
            raise TypeError(
                f"positive must be an int (the index of the positive candidate) for a single row, "
                f"got {type(positive).__name__}"
            )
        s = s[None, :]
        positive = [int(positive)]
    elif s.dim() == 2:
        if isinstance(positive, (bool, int, np.integer)):
            raise TypeError(
                "for an (N, K) similarity matrix, positive must give one column per row "
                "(a sequence of N ints, e.g. range(N) for positives on the diagonal)"
            )
    else:
        raise ValueError(
            f"similarities must be a (K,) row or an (N, K) matrix, got shape {tuple(s.shape)}"
        )
    check_embeddings(s, "similarities")
    n, k = s.shape
    index = check_index(positive, "positive", length=n, upper=k, device=s.device)
    mask = torch.ones(n, k, dtype=torch.bool)
    if exclude_diagonal:
        if n != k:
            raise ValueError(f"exclude_diagonal=True needs a square similarity matrix, got shape {(n, k)}")
        rows = torch.arange(n)
        if bool((index == rows).any()):
            bad = rows[index == rows][:5].tolist()
            raise ValueError(
                f"positive maps rows {bad} to themselves, but the diagonal (the anchor itself) is excluded"
            )
        mask &= ~torch.eye(n, dtype=torch.bool)
    negatives = int(mask[0].sum()) - 1
    if negatives < 1:
        need = "3 (the anchor, its positive and a negative)" if exclude_diagonal else "2 (a positive and a negative)"
        raise ValueError(f"each row needs at least one negative: at least {need} candidates, got {k}")
    return _Problem(s, index, mask, single_row, exclude_diagonal)


def _check_tau(temperature: object, name: str = "temperature") -> float:
    if isinstance(temperature, (np.floating, np.integer)):
        temperature = float(temperature)
    return float(resolve_temperature(temperature, name=name))


# --------------------------------------------------------------------------- result


@dataclass(frozen=True, eq=False)
class Explanation:
    """One temperature, every anchor. Arrays are float64 numpy; ``(N, K)`` per candidate, ``(N,)`` per anchor.

    A single row ``(K,)`` is reported as ``N = 1``. Candidates outside the denominator (the
    anchor itself with ``exclude_diagonal``) have probability, gradient and penalty 0.
    ``gradients[i]`` is the gradient of the anchor's own loss ``l_i`` (not of the mean) with
    respect to row ``i`` of the similarities.
    """

    temperature: float
    similarities: np.ndarray          # (N, K) input, float64
    positive: np.ndarray              # (N,) column of each anchor's positive
    in_denominator: np.ndarray        # (N, K) bool
    logits: np.ndarray                # (N, K) s / tau
    probabilities: np.ndarray         # (N, K) softmax over the denominator; rows sum to 1
    losses: np.ndarray                # (N,) -log p_positive
    gradients: np.ndarray             # (N, K) dl_i / ds_ij
    penalty: np.ndarray               # (N, K) relative penalty over negatives; rows sum to 1
    penalty_entropy: np.ndarray       # (N,) entropy of the penalty, nats
    effective_negatives: np.ndarray   # (N,) exp(penalty_entropy)
    hardest_negative: np.ndarray      # (N,) column of the most similar negative (first on ties)
    hardest_margin: np.ndarray        # (N,) s_positive - s_hardest (negative: a negative wins)
    log_n: np.ndarray                 # (N,) log(#denominator terms): loss of a uniform choice
    loss_uniform_negatives: np.ndarray  # (N,) loss if every negative had the mean negative similarity
    limit_zero: np.ndarray            # (N,) lim tau->0+ of l_i: 0, log m (ties) or inf
    limit_zero_rate: np.ndarray       # (N,) lim tau->0+ of tau * l_i = A - B
    limit_infinity: np.ndarray        # (N,) lim tau->inf of l_i = log(#denominator terms)
    single_row: bool = False
    exclude_diagonal: bool = False

    @property
    def loss(self) -> float:
        """Mean loss over anchors (for a single row, its loss)."""
        return float(self.losses.mean())

    @property
    def mean_limit_zero(self) -> float:
        return float(self.limit_zero.mean())

    @property
    def mean_limit_infinity(self) -> float:
        return float(self.limit_infinity.mean())

    @property
    def positive_probability(self) -> np.ndarray:
        """``(N,)`` probability of each anchor's positive."""
        return self.probabilities[np.arange(len(self.positive)), self.positive]

    @property
    def positive_gradient(self) -> np.ndarray:
        """``(N,)`` ``dl_i/ds_{i,p(i)} = (p_+ - 1)/tau`` (never positive)."""
        return self.gradients[np.arange(len(self.positive)), self.positive]

    def anchor_records(self) -> List[Dict[str, Any]]:
        """One flat record per anchor (for CSV / tables)."""
        rows = np.arange(len(self.positive))
        hardest_share = self.penalty[rows, self.hardest_negative]
        records = []
        for i in rows:
            records.append({
                "temperature": self.temperature,
                "anchor": int(i),
                "positive": int(self.positive[i]),
                "loss": float(self.losses[i]),
                "positive_probability": float(self.positive_probability[i]),
                "positive_gradient": float(self.positive_gradient[i]),
                "penalty_entropy": float(self.penalty_entropy[i]),
                "effective_negatives": float(self.effective_negatives[i]),
                "hardest_negative": int(self.hardest_negative[i]),
                "hardest_margin": float(self.hardest_margin[i]),
                "hardest_penalty": float(hardest_share[i]),
                "log_n": float(self.log_n[i]),
                "loss_uniform_negatives": float(self.loss_uniform_negatives[i]),
                "limit_zero": float(self.limit_zero[i]),
                "limit_zero_rate": float(self.limit_zero_rate[i]),
                "limit_infinity": float(self.limit_infinity[i]),
            })
        return records

    def candidate_records(self) -> List[Dict[str, Any]]:
        """One flat record per (anchor, candidate)."""
        n, k = self.similarities.shape
        records = []
        for i in range(n):
            for j in range(k):
                records.append({
                    "temperature": self.temperature,
                    "anchor": i,
                    "candidate": j,
                    "is_positive": bool(j == self.positive[i]),
                    "in_denominator": bool(self.in_denominator[i, j]),
                    "similarity": float(self.similarities[i, j]),
                    "logit": float(self.logits[i, j]),
                    "probability": float(self.probabilities[i, j]),
                    "gradient": float(self.gradients[i, j]),
                    "penalty": float(self.penalty[i, j]),
                })
        return records

    def to_dict(self) -> Dict[str, Any]:
        """Every field as plain Python lists and numbers (a single row keeps shape ``(1, K)``)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["loss"] = self.loss
        return out

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON; infinite values are written as the string ``"Infinity"``."""
        return _dumps(self.to_dict(), **kwargs)

    def to_csv(self, path: Optional[Union[str, os.PathLike]] = None, *, table: str = "candidates",
               overwrite: bool = False) -> Optional[str]:
        """Write ``table`` ("candidates" or "anchors") as CSV to ``path``, or return it as a string."""
        return _write_csv(_records(self, table), path, overwrite)


@dataclass(frozen=True, eq=False)
class Sweep:
    """The same similarities explained at several temperatures (in the order given)."""

    temperatures: Tuple[float, ...]
    results: Tuple[Explanation, ...]

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self):
        return iter(self.results)

    def __getitem__(self, index: int) -> Explanation:
        return self.results[index]

    @property
    def losses(self) -> np.ndarray:
        """``(T,)`` mean loss at each temperature."""
        return np.array([r.loss for r in self.results])

    def anchor_records(self) -> List[Dict[str, Any]]:
        return [rec for r in self.results for rec in r.anchor_records()]

    def candidate_records(self) -> List[Dict[str, Any]]:
        return [rec for r in self.results for rec in r.candidate_records()]

    def to_dict(self) -> Dict[str, Any]:
        return {"temperatures": list(self.temperatures), "losses": self.losses.tolist(),
                "results": [r.to_dict() for r in self.results]}

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON; infinite values are written as the string ``"Infinity"``."""
        return _dumps(self.to_dict(), **kwargs)

    def to_csv(self, path: Optional[Union[str, os.PathLike]] = None, *, table: str = "anchors",
               overwrite: bool = False) -> Optional[str]:
        """Write ``table`` ("anchors" or "candidates") as CSV to ``path``, or return it as a string."""
        return _write_csv(_records(self, table), path, overwrite)


# --------------------------------------------------------------------------- export


def _records(obj: Union[Explanation, Sweep], table: str) -> List[Dict[str, Any]]:
    if table == "anchors":
        return obj.anchor_records()
    if table == "candidates":
        return obj.candidate_records()
    raise ValueError(f"table must be 'anchors' or 'candidates', got {table!r}")


def _finite_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            raise ValueError("NaN in an explanation: this is a bug, please report it")
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    return value


def _dumps(data: Dict[str, Any], **kwargs: Any) -> str:
    return json.dumps(_finite_json(data), allow_nan=False, **kwargs)


def _write_csv(records: List[Dict[str, Any]], path, overwrite: bool) -> Optional[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in record.items()})
    text = buffer.getvalue()
    if path is None:
        return text
    mode = "w" if overwrite else "x"  # "x": never overwrite a user's file silently
    try:
        with open(path, mode, newline="", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise FileExistsError(f"{os.fspath(path)} exists; pass overwrite=True to replace it") from None
    return None


# --------------------------------------------------------------------------- computation


def _explain(problem: _Problem, tau: Union[float, Tensor]) -> Explanation:
    """One explanation at ``tau``: a float, or ``(N,)`` float64 with one per anchor (a
    temperature method's view; ``Explanation.temperature`` is then their mean)."""
    s, positive, mask = problem.similarities, problem.positive, problem.in_denominator
    n, k = s.shape
    rows = torch.arange(n)
    per_row = isinstance(tau, Tensor)
    scale = tau[:, None] if per_row else tau
    logits = s / scale
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"temperature {tau!r} is too small for these similarities: s / tau overflows float64")

    # Loss and its log-normaliser, from the core: loss = log Z - l_+.
    losses = contrastive_loss(s, positive, temperature=tau, denominator_mask=mask, reduction="none")
    if not bool(torch.isfinite(losses).all()):
        raise ValueError(f"temperature {tau!r} is too small for these similarities: the loss overflows float64")
    positive_logit = logits[rows, positive]
    log_z = losses + positive_logit
    probabilities = torch.where(mask, (logits - log_z[:, None]).exp(), torch.zeros(()))
    probabilities[rows, positive] = torch.exp(-losses)
    negative = mask.clone()
    negative[rows, positive] = False
    # 1 - p_+ as the sum of the negatives' probabilities, each accurate to a few ulps: 1 - exp(-loss)
    # would inherit the loss's absolute rounding (ulp of log Z) and lose digits when p_+ is near 1.
    gradients = probabilities / scale
    gradients[rows, positive] = -torch.where(negative, probabilities, torch.zeros(())).sum(dim=1) / tau

    # Relative penalty over negatives: the core's loss with the positive dropped from the
    # denominator (the decoupled denominator) gives log of the negatives' normaliser.
    hardest = s.masked_fill(~negative, float("-inf")).argmax(dim=1)
    hardest_logit = logits[rows, hardest]
    log_z_neg = contrastive_loss(s, hardest, temperature=tau, denominator_mask=negative,
                                 reduction="none") + hardest_logit
    log_penalty = logits - log_z_neg[:, None]
    penalty = torch.where(negative, log_penalty.exp(), torch.zeros(()))
    entropy = -torch.where(negative & (penalty > 0), penalty * log_penalty, torch.zeros(())).sum(dim=1)
    entropy = entropy.clamp(min=0.0)  # rounding can leave -1e-17 when one negative dominates

    # Jensen reference: every negative at the mean negative similarity (the tau -> inf weighting).
    negatives_per_row = int(negative[0].sum())
    mean_negative = torch.where(negative, s, torch.zeros(())).sum(dim=1) / negatives_per_row
    flat = torch.cat([s[rows, positive][:, None], mean_negative[:, None].expand(n, negatives_per_row)], dim=1)
    loss_uniform = contrastive_loss(flat, torch.zeros(n, dtype=torch.long), temperature=tau, reduction="none")

    # The temperature lemma (textbook, section 30.2).
    terms = mask.sum(dim=1).to(torch.float64)
    top = s.masked_fill(~mask, float("-inf")).max(dim=1).values
    positive_score = s[rows, positive]
    ties = (mask & (s == top[:, None])).sum(dim=1).to(torch.float64)
    limit_zero = torch.where(top > positive_score, torch.full((), math.inf, dtype=torch.float64), ties.log())

    def arr(t: Tensor) -> np.ndarray:
        return t.detach().numpy().copy()

    return Explanation(
        temperature=float(tau.mean()) if per_row else tau,
        similarities=arr(s),
        positive=arr(positive),
        in_denominator=arr(mask),
        logits=arr(logits),
        probabilities=arr(probabilities),
        losses=arr(losses),
        gradients=arr(gradients),
        penalty=arr(penalty),
        penalty_entropy=arr(entropy),
        effective_negatives=arr(entropy.exp()),
        hardest_negative=arr(hardest),
        hardest_margin=arr(positive_score - s[rows, hardest]),
        log_n=arr(terms.log()),
        loss_uniform_negatives=arr(loss_uniform),
        limit_zero=arr(limit_zero),
        limit_zero_rate=arr(top - positive_score),
        limit_infinity=arr(terms.log()),
        single_row=problem.single_row,
        exclude_diagonal=problem.exclude_diagonal,
    )


def explain(
    similarities: SimilaritiesLike,
    *,
    temperature: float,
    positive: PositiveLike = 0,
    exclude_diagonal: bool = False,
) -> Explanation:
    """Explain the InfoNCE loss on given similarities at one temperature.

    Args:
        similarities: a row ``(K,)`` — one query's scores against ``K`` candidates — or a
            matrix ``(N, K)`` whose row ``i`` is anchor ``i``'s scores. A list, numpy array
            or tensor; computed in float64.
        temperature: ``tau > 0``.
        positive: for a row, the index of the positive candidate (default 0); for a matrix,
            one column per row (a sequence of ``N`` ints; ``range(N)`` for a cross-modal
            matrix with positives on the diagonal, as in ConVIRT).
        exclude_diagonal: ``True`` for a self-similarity matrix (``K == N``, as in NT-Xent):
            candidate ``i`` is anchor ``i`` itself and is left out of the denominator, and
            ``positive[i] != i`` is required.

    The positive is always in the denominator. Every row needs at least one negative.

    Returns:
        :class:`Explanation` with probabilities, losses (``.loss`` is the mean), gradients,
        relative penalty over negatives, hardest negative, references and limits.

    Example (the course page P10's worked example):
        >>> e = explain([1.0, 0.5, 0.0], temperature=0.5)
        >>> e.probabilities[0].round(4).tolist(), round(e.loss, 6)
        ([0.6652, 0.2447, 0.09], 0.407606)
    """
    tau = _check_tau(temperature)
    return _explain(_prepare(similarities, positive, exclude_diagonal), tau)


def sweep(
    similarities: SimilaritiesLike,
    *,
    temperatures: Sequence[float],
    positive: PositiveLike = 0,
    exclude_diagonal: bool = False,
) -> Sweep:
    """:func:`explain` at each temperature in ``temperatures`` (kept in the given order).

    Example (the ConVIRT tutorial's worked example, image-to-text, positives on the diagonal):
        >>> s = [[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
        ...      [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]]
        >>> sweep(s, temperatures=[0.01, 0.1, 1.0], positive=range(4)).losses.round(4).tolist()
        [0.0, 0.0964, 0.8732]
    """
    if isinstance(temperatures, (str, bytes)) or not hasattr(temperatures, "__iter__"):
        raise TypeError(f"temperatures must be a sequence of numbers, got {type(temperatures).__name__}")
    taus = tuple(_check_tau(t, name=f"temperatures[{i}]") for i, t in enumerate(temperatures))
    if not taus:
        raise ValueError("temperatures is empty: give at least one temperature")
    problem = _prepare(similarities, positive, exclude_diagonal)
    return Sweep(taus, tuple(_explain(problem, tau) for tau in taus))
