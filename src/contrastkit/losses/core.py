"""The dense primitive of the family, the reduction, and :func:`contrastive_loss`.

:func:`per_anchor_nll` turns temperature-scaled logits ``l_ij = s_ij / tau`` into one loss
per anchor, given a denominator mask ``M`` and the positives ``P(i)``::

    loss_i = -l_{i,p(i)} + log sum_j M_ij exp(l_ij)                      (one positive)
    loss_i = log sum_j M_ij exp(l_ij) - mean_{p in P(i)} l_ip            (multi_positive="out")
    loss_i = log sum_j M_ij exp(l_ij) - log mean_{p in P(i)} exp(l_ip)   (multi_positive="in")

Whether the positive belongs to the denominator is decided by ``M`` alone: the standard
losses keep it, the decoupled variant removes it. :func:`contrastive_loss` is this primitive
on a similarity matrix, with validation, for users. The losses of
:mod:`contrastkit.losses.functional` reach it through their dense backend
(:mod:`contrastkit.losses.dispatch`); their tiled and ring backends compute the same
log-sum-exp without the matrix, and the debiased, HCL and simple variants replace the
denominator by their own estimate, so they use only :func:`reduce`.

Precision: every loss computes in at least float32 (half-precision inputs are upcast by
:func:`contrastkit.losses.validation.prepare`) with autocast switched off
(:func:`full_precision`), so the loss stays finite at temperatures down to 0.01 and below.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from .validation import (
    TemperatureLike,
    check_choice,
    check_embeddings,
    check_index,
    check_reduction,
    compute_dtype,
    per_anchor,
    require,
    resolve_temperature,
    value_checks,
)


#: The values of ``multi_positive`` (:func:`contrastive_loss`) and of SupCon's ``variant``:
#: Khosla et al.'s L_out and L_in.
MULTI_POSITIVE = ("out", "in")


@contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """Switch autocast off for the loss computation (it would run the GEMM in half precision)."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def reduce(losses: Tensor, reduction: str, valid: Optional[Tensor] = None) -> Tensor:
    """Reduce per-anchor losses; anchors with ``valid == False`` are left out of the mean.

    With ``reduction="none"`` invalid anchors are reported as 0 (never NaN).
    """
    if valid is not None:
        losses = torch.where(valid, losses, torch.zeros((), dtype=losses.dtype, device=losses.device))
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if valid is None:
        return losses.sum() / losses.shape[0]
    count = valid.sum()
    require(count > 0, "no anchor has a positive: the mean loss is undefined")
    return losses.sum() / count


def divide_rows(values: Tensor, tau) -> Tensor:
    """``values / tau``: a vector of per-anchor values, or a matrix whose row ``i`` is anchor
    ``i``'s (divided by ``tau_i`` for a per-anchor ``tau``, ``(N,)``)."""
    if per_anchor(tau):
        tau = tau.to(values.dtype)
        return values / (tau if values.dim() == 1 else tau[:, None])
    return values / tau


def per_anchor_nll(
    logits: Tensor,
    positives: Tensor,
    denominator_mask: Optional[Tensor] = None,
    multi_positive: str = "out",
) -> Tuple[Tensor, Optional[Tensor]]:
    """Per-anchor losses from already temperature-scaled logits (no validation).

    ``positives`` is a long index ``(N,)`` or a boolean mask ``(N, K)``. Returns the losses
    ``(N,)`` and, for a mask, which anchors have at least one positive (else ``None``).
    """
    masked = logits if denominator_mask is None else logits.masked_fill(~denominator_mask, float("-inf"))
    # log sum_j exp(l_ij) = m + log1p(sum_{j != j*} exp(l_ij - m)), m = l_ij* the row's maximum,
    # and the loss (m - positive term) + log1p(...). A small loss (the positive the maximum)
    # keeps its digits: m - l_pos is exactly 0, and log1p takes the sum of the other terms
    # whole, where lse - l_pos would round at the size of the logits (up to 1/tau) and
    # F.cross_entropy's log(1 + sum) at 1. The sum, whose maximum's term is exactly 1, is taken
    # in float64, so that subtracting that 1 leaves the others' sum exact to float32. m carries
    # no gradient (the value does not depend on it); a row without candidates gives -inf.
    top = masked.detach().amax(dim=1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = (masked - top).exp_().sum(dim=1, dtype=torch.float64)
    log_sum = torch.log1p((total - 1.0).to(logits.dtype))
    top = top.squeeze(1)
    if positives.dtype != torch.bool:
        return (top - logits.gather(1, positives[:, None]).squeeze(1)) + log_sum, None
    counts = positives.sum(dim=1)
    valid = counts > 0
    safe_counts = counts.clamp(min=1).to(logits.dtype)
    if multi_positive == "out":
        positive_term = torch.where(positives, logits, torch.zeros((), dtype=logits.dtype,
                                                                     device=logits.device)).sum(1) / safe_counts
    else:  # "in": log of the mean probability over positives
        positive_term = torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)
        positive_term = torch.where(valid, positive_term, torch.zeros((), dtype=logits.dtype,
                                                                      device=logits.device))
        positive_term = positive_term - safe_counts.log()
    return (top - positive_term) + log_sum, valid


def contrastive_loss(
    similarities: Tensor,
    positives: Tensor,
    *,
    temperature: TemperatureLike,
    denominator_mask: Optional[Tensor] = None,
    multi_positive: str = "out",
    reduction: str = "mean",
    validate: bool = True,
) -> Tensor:
    """Temperature-scaled log-softmax loss on a similarity matrix — the core of the family.

    Args:
        similarities: ``(N, K)`` scores; row ``i`` is anchor ``i``, column ``j`` candidate ``j``.
        positives: ``(N,)`` integer index of each anchor's positive candidate, or a boolean
            ``(N, K)`` mask of positives (several per anchor; anchors with none are left out
            of the mean and reported as 0 with ``reduction="none"``).
        temperature: ``tau > 0``; logits are ``similarities / tau``. Or ``(N,)``, one per
            anchor row: row ``i``'s logits are ``similarities[i] / tau[i]``.
        denominator_mask: boolean ``(N, K)``; ``True`` marks candidates that enter the
            log-sum-exp. ``None`` means all of them. The positive is in the denominator only
            if the mask keeps it.
        multi_positive: for a positive mask, ``"out"`` averages the log-probabilities of the
            positives (SupCon L_out), ``"in"`` takes the log of their mean probability (L_in).
        reduction: ``"mean"`` over anchors, ``"sum"``, or ``"none"`` for ``(N,)``.
        validate: ``False`` skips the checks that read tensor values (finite entries, index
            ranges, empty mask rows) for inputs checked upstream; the other checks stay.

    Example:
        >>> s = torch.tensor([[1.0, 0.5, 0.0]])
        >>> round(float(contrastive_loss(s, torch.tensor([0]), temperature=0.5)), 6)
        0.407606
    """
    with value_checks(validate):
        check_reduction(reduction)
        check_choice(multi_positive, "multi_positive", MULTI_POSITIVE)
        check_embeddings(similarities, "similarities")
        n, k = similarities.shape
        tau = resolve_temperature(temperature, anchors=n, device=similarities.device)
        if isinstance(positives, Tensor) and positives.dtype == torch.bool:
            if positives.shape != (n, k):
                raise ValueError(f"positives mask must have shape {(n, k)}, got {tuple(positives.shape)}")
            positives = positives.to(similarities.device)
        else:
            positives = check_index(positives, "positives", length=n, upper=k, device=similarities.device)
        if denominator_mask is not None:
            if not isinstance(denominator_mask, Tensor) or denominator_mask.dtype != torch.bool:
                raise TypeError("denominator_mask must be a boolean tensor")
            if denominator_mask.shape != (n, k):
                raise ValueError(f"denominator_mask must have shape {(n, k)}, got {tuple(denominator_mask.shape)}")
            denominator_mask = denominator_mask.to(similarities.device)
            require(denominator_mask.any(dim=1).all(),
                    "denominator_mask has a row with no candidate: that anchor's loss is undefined")
        with full_precision(similarities.device):
            logits = divide_rows(similarities.to(compute_dtype(similarities.dtype)), tau)
            losses, valid = per_anchor_nll(logits, positives, denominator_mask, multi_positive)
            return reduce(losses, reduction, valid)
