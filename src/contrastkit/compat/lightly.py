"""lightly's ``NTXentLoss``, ``DCLLoss`` and ``DCLWLoss`` (https://github.com/lightly-ai/lightly,
1.6), on contrastkit's losses.

Change ``from lightly.loss import NTXentLoss, DCLLoss, DCLWLoss`` to ``from
contrastkit.compat.lightly import NTXentLoss, DCLLoss, DCLWLoss``: the same constructors
(``NTXentLoss(temperature=0.5, memory_bank_size=0, gather_distributed=False)``,
``DCLLoss(temperature=0.1, weight_fn=None, gather_distributed=False)``,
``DCLWLoss(temperature=0.1, sigma=0.5, gather_distributed=False)``), the same call
(``loss(out0, out1)``, two ``(B, D)`` views, row ``i`` of each from the same image), the same
numbers (to float rounding) and, with a memory bank, the same bank from the same seed. As in
the peer, the rows are L2-normalised first (``torch.nn.functional.normalize``: a zero row stays
zero).

* **NTXentLoss** without a memory bank: SimCLR's NT-Xent (Chen et al. 2020) over the ``2B``
  views, each anchor against the ``2B - 1`` others (its positive included), the mean over the
  ``2B`` anchors: :func:`contrastkit.losses.nt_xent_views`, tiled in memory linear in ``B`` for
  large batches. With ``memory_bank_size=(K, D)``: MoCo's loss (He et al. 2020), each ``out0``
  row against its ``out1`` row and the ``K`` bank entries, the mean over the ``B`` anchors
  (:func:`contrastkit.losses.info_nce` with a shared bank); the bank is lightly's: ``K`` random
  unit rows drawn with ``torch.randn`` when the loss is built, then a ring that takes ``out1``
  (gathered from every rank with ``gather_distributed``) after each call whose ``out0``
  requires a gradient, dropping the rows of a batch that reach its end.
* **DCLLoss**: decoupled contrastive learning (Yeh et al. 2022, eq. 6): NT-Xent with the
  positive left out of the denominator, :func:`contrastkit.losses.dcl`; ``weight_fn(out0,
  out1)`` (on the normalised views, as in the peer) scales each anchor's positive term.
* **DCLWLoss**: DCLLoss with the paper's von Mises-Fisher weight
  (:func:`negative_mises_fisher_weights`, ``sigma``).
* ``gather_distributed=True`` under torch.distributed: every rank's views are candidates for
  this rank's anchors, with gradients (the ``"local"`` mode of contrastkit's distributed losses;
  lightly's all-gather with an all-reduced backward gives each rank the same gradients). Without
  an initialised process group it is ignored, as in the peer.

What differs from the peer, or is kept from it on purpose:

* a **negative temperature** is kept as the peer computes it (the similarities divided by it;
  a dense computation, since contrastkit's kernels need ``tau > 0``); a temperature below
  ``1e-8`` in magnitude, or one that is not a finite number, is refused with a ``ValueError``;
* a **non-finite entry** is refused by name (the peer returns NaN);
* with a memory bank the bank is used in the inputs' dtype (the peer's float32 bank makes a
  float64 call fail); the bank itself stays float32, as the peer keeps it;
* the float32 rounding of a small per-anchor loss is contrastkit's, finer than
  ``F.cross_entropy``'s (docs/migrating.md).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.distributed import all_gather_no_grad, all_gather_with_grad, get_rank, get_world_size, is_active

__all__ = ["NTXentLoss", "DCLLoss", "DCLWLoss", "negative_mises_fisher_weights"]

_EPS = 1e-8  # the peer's smallest temperature magnitude


def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or abs(temperature) < _EPS:
        raise ValueError(f"temperature must be a finite number of magnitude at least 1e-8, got {temperature!r}")
    return float(temperature)


def _views(out0: Tensor, out1: Tensor) -> Tuple[Tensor, Tensor]:
    for name, x in (("out0", out0), ("out1", out1)):
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError(f"{name} must be a (batch_size, embedding_size) tensor, "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} has non-finite entries")
    if out0.shape != out1.shape:
        raise ValueError(f"out0 and out1 must have the same shape, got {tuple(out0.shape)} and {tuple(out1.shape)}")
    return F.normalize(out0, dim=1), F.normalize(out1, dim=1)


def _gathers(gather_distributed: bool) -> bool:
    return bool(gather_distributed) and is_active() and get_world_size() > 1


def _dense_views(z0: Tensor, z1: Tensor, temperature: float, gather: bool, decoupled: bool) -> Tensor:
    """Per-anchor ``(2B,)`` ``[-s_pos / tau, logsumexp over the candidates]`` of the ``2B``
    local anchors (``z0``'s, then ``z1``'s) against every rank's views (``gather``), the anchor
    left out, and its positive too where ``decoupled``; for a temperature the kernels refuse."""
    all0 = all_gather_with_grad(z0) if gather else z0
    all1 = all_gather_with_grad(z1) if gather else z1
    b = z0.shape[0]
    offset = get_rank() * b if gather else 0
    anchors = torch.cat([z0, z1])
    candidates = torch.cat([all0, all1])
    total = all0.shape[0]
    logits = anchors @ candidates.T / temperature
    rows = torch.arange(2 * b, device=z0.device)
    own = torch.cat([rows[:b] + offset, rows[b:] - b + offset + total])
    positive = torch.cat([rows[:b] + offset + total, rows[b:] - b + offset])
    mask = torch.zeros_like(logits, dtype=torch.bool)
    mask[rows, own] = True
    if decoupled:
        mask[rows, positive] = True
    return torch.stack([-logits[rows, positive], torch.logsumexp(logits.masked_fill(mask, -math.inf), dim=1)])


class NTXentLoss(nn.Module):
    """lightly's ``NTXentLoss(temperature=0.5, memory_bank_size=0, gather_distributed=False)``:
    ``loss(out0, out1)`` with ``out0``, ``out1`` of shape ``(B, D)`` gives a scalar (module
    docstring). ``memory_bank_size``: ``0``, or ``(K, D)`` for a bank of ``K`` negatives of
    dimension ``D`` (a bare positive integer is refused, as the peer refuses it)."""

    def __init__(self, temperature: float = 0.5, memory_bank_size: Union[int, Sequence[int]] = 0,
                 gather_distributed: bool = False) -> None:
        super().__init__()
        self.temperature = _check_temperature(temperature)
        self.gather_distributed = bool(gather_distributed)
        size = (memory_bank_size,) if isinstance(memory_bank_size, int) else tuple(memory_bank_size)
        if isinstance(memory_bank_size, bool) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                          for n in size):
            raise ValueError(f"memory_bank_size must be 0 or (num_features, dim) of non-negative integers, "
                             f"got {memory_bank_size!r}")
        if size != (0,) and (len(size) != 2 or isinstance(memory_bank_size, int)):
            raise ValueError(f"memory_bank_size={memory_bank_size!r} does not give (num_features, dim): pass "
                             "(num_features, dim), or 0 to use the batch's negatives only")
        self.memory_bank_size = size
        # lightly's bank: unit rows drawn when the loss is built (the same draw from the same seed),
        # float32, not saved with the module's state (as the peer's buffers).
        bank = torch.empty(size, dtype=torch.float)
        if len(size) == 2:
            bank = F.normalize(torch.randn(size).type_as(bank), dim=-1)
        self.register_buffer("bank", bank, persistent=False)
        self.register_buffer("bank_ptr", torch.zeros(1, dtype=torch.long), persistent=False)

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        z0, z1 = _views(out0, out1)
        tau = self.temperature
        if self.memory_bank_size[0] > 0:
            bank = self.bank.clone().detach().to(device=z0.device, dtype=z0.dtype)
            if out0.requires_grad:
                self._enqueue(z1)
            # tau < 0: the logits over a negative tau are the negated query's over |tau|.
            query = z0 if tau > 0 else -z0
            return losses.info_nce(query, z1, bank, temperature=abs(tau), normalize=False)
        gather = _gathers(self.gather_distributed)
        if tau < 0:
            positive, spread = _dense_views(z0, z1, tau, gather, decoupled=False)
            return (positive + spread).mean()
        return losses.nt_xent_views(z0, z1, temperature=tau, normalize=False, distributed=gather,
                                    distributed_mode="local")

    @torch.no_grad()
    def _enqueue(self, keys: Tensor) -> None:
        """The peer's ring: ``keys`` (every rank's with ``gather_distributed``) from the pointer
        on; a batch that reaches the end fills it, the rest is dropped and the pointer restarts."""
        if _gathers(self.gather_distributed):
            keys = all_gather_no_grad(keys)
        size = self.memory_bank_size[0]
        ptr = int(self.bank_ptr)
        if ptr + keys.shape[0] >= size:
            self.bank[ptr:] = keys[:size - ptr].detach().to(self.bank.dtype)
            self.bank_ptr.zero_()
        else:
            self.bank[ptr:ptr + keys.shape[0]] = keys.detach().to(self.bank.dtype)
            self.bank_ptr[0] = ptr + keys.shape[0]


def negative_mises_fisher_weights(out0: Tensor, out1: Tensor, sigma: float = 0.5) -> Tensor:
    """The weight of DCL-W (Yeh et al. 2022, eq. 7) for each positive pair of the two ``(B, D)``
    views: ``2 - B * softmax_i(<out0_i, out1_i> / sigma)``, computed on detached inputs (no
    gradient flows through the weight). Returns ``(B,)``."""
    similarity = torch.einsum("nm,nm->n", out0.detach(), out1.detach()) / sigma
    return 2 - out0.shape[0] * F.softmax(similarity, dim=0)


class DCLLoss(nn.Module):
    """lightly's ``DCLLoss(temperature=0.1, weight_fn=None, gather_distributed=False)``:
    ``loss(out0, out1)`` with ``out0``, ``out1`` of shape ``(B, D)`` gives a scalar, the mean
    over the ``2B`` anchors of ``w_i * (-s_pos / tau) + logsumexp`` of the anchor's negatives
    (module docstring); ``weight_fn(out0, out1) -> (B,)`` on the normalised views, ``w = 1``
    without one."""

    def __init__(self, temperature: float = 0.1, weight_fn: Optional[Callable[[Tensor, Tensor], Tensor]] = None,
                 gather_distributed: bool = False) -> None:
        super().__init__()
        self.temperature = _check_temperature(temperature)
        if weight_fn is not None and not callable(weight_fn):
            raise TypeError(f"weight_fn must be a function of (out0, out1) or None, got {type(weight_fn).__name__}")
        self.weight_fn = weight_fn
        self.gather_distributed = bool(gather_distributed)

    def forward(self, out0: Tensor, out1: Tensor) -> Tensor:
        z0, z1 = _views(out0, out1)
        tau = self.temperature
        gather = _gathers(self.gather_distributed)
        if tau < 0:
            positive, spread = _dense_views(z0, z1, tau, gather, decoupled=True)
            per_anchor = positive + spread
        else:
            per_anchor = losses.dcl(z0, z1, temperature=tau, reduction="none", normalize=False,
                                    distributed=gather, distributed_mode="local")
            positive = -torch.cat([(z0 * z1).sum(dim=1), (z1 * z0).sum(dim=1)]) / tau
        if self.weight_fn is not None:
            # Only the positive term is weighted: w * (-s/tau) = (-s/tau) + (w - 1) * (-s/tau).
            weights = torch.cat([self._weights(z0, z1), self._weights(z1, z0)])
            per_anchor = per_anchor + (weights - 1) * positive
        b = z0.shape[0]
        return 0.5 * (per_anchor[:b].mean() + per_anchor[b:].mean())

    def _weights(self, a: Tensor, b: Tensor) -> Tensor:
        weights = torch.as_tensor(self.weight_fn(a, b), dtype=a.dtype, device=a.device)
        if weights.shape not in ((a.shape[0],), ()):
            raise ValueError(f"weight_fn must return one weight per row ({a.shape[0]},), got {tuple(weights.shape)}")
        return weights.expand(a.shape[0])


class DCLWLoss(DCLLoss):
    """lightly's ``DCLWLoss(temperature=0.1, sigma=0.5, gather_distributed=False)``: DCLLoss
    weighted by :func:`negative_mises_fisher_weights` with ``sigma``."""

    def __init__(self, temperature: float = 0.1, sigma: float = 0.5, gather_distributed: bool = False) -> None:
        super().__init__(temperature=temperature, weight_fn=partial(negative_mises_fisher_weights, sigma=sigma),
                         gather_distributed=gather_distributed)
