"""Temperatures beyond one number: MACL, dual temperature, individual temperatures, a temperature network.

Four methods from the literature, each on SimCLR's two views (``2N`` anchors, each with the
``2N - 1`` other rows as candidates or, for the robust objective, the ``2N - 2`` negatives):

* :func:`macl_nt_xent` -- Model-Aware Contrastive Learning (Huang et al., ICML 2023, "Model-Aware
  Contrastive Learning: Towards Escaping the Dilemmas"): one temperature per batch that follows
  the alignment ``A`` (the mean cosine similarity of the positive pairs, no gradient),
  ``tau_A = tau_0 (1 + alpha (A - A_0))``, and the gradient reweighting
  ``loss_i = sg[1 / (1 - P_i)] (-log P_i)`` with ``P_i`` the positive's probability at ``tau_A``.
  Defaults ``tau_0 = 0.1``, ``alpha = 0.5``, ``A_0 = 0`` (lightly's ``MACLLoss`` takes the same;
  it adds ``1e-8`` to ``1 - P_i``, this module clamps it at the smallest normal number instead).
* :func:`dual_temperature_nt_xent` -- Zhang et al. (CVPR 2022, "Dual Temperature Helps
  Contrastive Learning Without Many Negative Samples"): Wang & Liu's two roles of ``tau``
  separated. ``tau_alpha`` sets the distribution of the penalty over one anchor's negatives
  (intra-anchor), ``tau_beta`` how strongly each anchor is pulled (inter-anchor), by the
  stop-gradient reweighting ``loss_i = sg[(1 - P_i(tau_beta)) / (1 - P_i(tau_alpha))] (-log P_i(tau_alpha))``.
  Defaults ``tau_alpha = 0.1``, ``tau_beta = 1.0`` (the authors' ``dt_m = 10``). The paper
  applies it to SimCo's InfoNCE (each view's query against the other view's keys); here the
  candidates are NT-Xent's, as for every two-view method of contrastkit.
* :func:`robust_nt_xent` -- the distributionally robust objective of iSogCLR (Qiu et al., ICML
  2023, "Not All Semantics are Created Equal: Contrastive Self-supervised Learning with
  Automatic Temperature Individualization") with a temperature per anchor::

      F_i = tau_i log E_{j in negatives(i)} exp((s_ij - s_i+) / tau_i) + tau_i rho

  optimised with SogCLR's moving estimate ``u_i`` of ``g_i = E_j exp(s_ij / tau_i)``
  (``u_i <- (1 - gamma) u_i + gamma g_i(batch)``, per sample): the gradient it gives is
  ``(tau_i / u_i) grad g_i - grad s_i+`` for the encoder and
  ``log u_i + rho - (g_i / u_i) E_q[s_ij / tau_i]`` for ``tau_i``. Its users:
  :class:`IndividualTemperatureLoss` (iSogCLR: one learnable ``tau`` per training sample, updated
  by momentum SGD and projected on ``[tau_min, tau_max]``) and :class:`TemperatureNetworkLoss`
  (TempNet, Qiu et al., ICML 2024, "To Cool or not to Cool? Temperature Network Meets Large
  Foundation Models via DRO": a head on the embedding predicts each anchor's ``tau``, bounded).

:class:`MACLNTXentLoss` and :class:`DualTemperatureNTXentLoss` wrap the first two as modules with the same
interface as the stateful two (:class:`AdaptiveTemperatureLoss`), so that a trainer can use any
of the four alike. Every loss here runs dense, tiled or across ranks as
:func:`~contrastkit.losses.nt_xent_views` does (the robust objective: ``distributed_mode="local"``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor, nn

from contrastkit.distributed.gather import DistributedArg, all_gather_no_grad

from ._sharding import Shard
from .core import full_precision, reduce
from .infonce import nt_xent_views
from .validation import (
    check_index,
    check_pair,
    check_probability,
    check_reduction,
    compute_dtype,
    prepare,
    require,
    resolve_temperature,
    value_checks,
)
from .variants import dcl

__all__ = [
    "macl_temperature", "macl_nt_xent", "dual_temperature_nt_xent", "robust_nt_xent", "RobustLoss",
    "AdaptiveTemperatureLoss", "MACLNTXentLoss", "DualTemperatureNTXentLoss", "IndividualTemperatureLoss", "TemperatureNetworkLoss",
    "MACL_TEMPERATURE", "MACL_ALPHA", "MACL_THRESHOLD", "DUAL_INTRA", "DUAL_INTER", "ISOGCLR",
]

#: MACL's base temperature, alpha and alignment threshold (Huang et al., ICML 2023; lightly's defaults).
MACL_TEMPERATURE, MACL_ALPHA, MACL_THRESHOLD = 0.1, 0.5, 0.0
#: Dual temperature's tau_alpha (intra-anchor) and tau_beta (inter-anchor) (Zhang et al., CVPR 2022).
DUAL_INTRA, DUAL_INTER = 0.1, 1.0
#: iSogCLR's settings for self-supervised image training (the authors' CIFAR example:
#: ``tau`` starts at 0.1 within [0.05, 1.0], rho = 0.4, gamma = 0.8, momentum beta = 0.5,
#: step eta = 0.03).
ISOGCLR: Dict[str, float] = {"initial": 0.1, "tau_min": 0.05, "tau_max": 1.0, "rho": 0.4, "gamma": 0.8,
                             "beta": 0.5, "eta": 0.03}


# --------------------------------------------------------------------------- shared pieces


def _shard_reduce(per_anchor: Tensor, reduction: str, distributed: DistributedArg, mode: str) -> Tuple[Tensor, float]:
    """Reduce per-anchor losses as the loss that returned them did: plainly, or under
    ``distributed_mode="local"`` as this rank's share of the global mean. Also returns
    ``d result / d per_anchor[i]`` (the same for every anchor)."""
    shard = Shard(distributed, mode)
    if not shard.local:
        weight = 1.0 / per_anchor.shape[0] if reduction == "mean" else 1.0
        return reduce(per_anchor, reduction), weight
    total = shard.exchange(per_anchor[:, None])
    world = shard.layout.world_size
    weight = world / total if reduction == "mean" else (float(world) if reduction == "sum" else 1.0)
    return shard.reduce(per_anchor, reduction, anchors_total=total), weight


def _positive_similarity(z_a: Tensor, z_b: Tensor, normalize: bool) -> Tensor:
    """``s_i+`` of each pair ``(N,)``: the cosine similarity (the dot product without ``normalize``)."""
    return (prepare(z_a, normalize, "z_a") * prepare(z_b, normalize, "z_b")).sum(dim=1)


def _global_sum(values: Tensor, distributed: DistributedArg) -> Tensor:
    """``values`` summed over every rank of ``distributed`` (itself when not distributed)."""
    group = Shard(distributed, "local").group
    if group is None:
        return values
    summed = values.detach().clone()
    dist.all_reduce(summed, group=group)
    return summed


def _one_minus_probability(losses: Tensor) -> Tensor:
    """``1 - P_i`` from ``loss_i = -log P_i`` (``-expm1(-loss)``: exact as ``P_i -> 1``),
    kept at or above the smallest normal number so that its inverse stays finite."""
    return (-torch.expm1(-losses)).clamp_min(torch.finfo(losses.dtype).tiny)


# --------------------------------------------------------------------------- MACL


def macl_temperature(alignment: Union[float, Tensor], temperature: float = MACL_TEMPERATURE,
                     alpha: float = MACL_ALPHA, threshold: float = MACL_THRESHOLD) -> Union[float, Tensor]:
    """MACL's model-aware temperature ``tau_A = tau_0 (1 + alpha (A - A_0))`` for an alignment
    ``A`` (the mean positive cosine similarity, in ``[-1, 1]``).

    Example:
        >>> macl_temperature(0.6)  # 0.1 (1 + 0.5 * 0.6)
        0.13
    """
    value = temperature * (1.0 + alpha * (alignment - threshold))
    return round(value, 12) if isinstance(value, float) else value


def _macl_options(temperature: float, alpha: float, threshold: float) -> None:
    resolve_temperature(temperature)
    if isinstance(temperature, Tensor):
        raise TypeError("MACL's temperature is its base tau_0, a number")
    check_probability(alpha, "alpha")
    check_probability(threshold, "threshold")


def macl_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    temperature: float = MACL_TEMPERATURE,
    alpha: float = MACL_ALPHA,
    threshold: float = MACL_THRESHOLD,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """MACL (Huang et al., ICML 2023) on SimCLR's two views (module docstring).

    Args:
        z_a, z_b: ``(N, d)`` views, row ``i`` of each forming a positive pair.
        temperature: the base ``tau_0`` (default 0.1).
        alpha: how much ``tau`` follows the alignment, in ``[0, 1]`` (default 0.5).
        threshold: the alignment ``A_0`` at which ``tau_A = tau_0``, in ``[0, 1]`` (default 0).
        reduction: ``"mean"`` over the ``2N`` anchors of ``sg[w_i] (-log P_i)``, ``"sum"``, or
            ``"none"`` for ``(2N,)``.
        normalize, chunk_size, distributed, distributed_mode, validate: as for
            :func:`~contrastkit.losses.nt_xent_views`; under ``distributed=`` the alignment is
            that of the global batch.

    Raises ``ValueError`` when ``tau_A`` would not be positive (``alpha`` and ``threshold``
    allow it only for a batch whose positives are anti-aligned).

    Example:
        >>> z = torch.eye(4)[:2] + 0.1
        >>> loss = macl_nt_xent(z, z)
        >>> bool(loss > 0)
        True
    """
    with value_checks(validate):
        check_reduction(reduction)
        check_pair(z_a, z_b)
        _macl_options(temperature, alpha, threshold)
        with full_precision(z_a.device), torch.no_grad():
            positives = _positive_similarity(z_a, z_b, normalize)
            totals = _global_sum(torch.stack([positives.sum(), positives.new_tensor(float(positives.shape[0]))]),
                                 distributed)
            tau = macl_temperature(totals[0] / totals[1], temperature, alpha, threshold)
        require(tau > 0, "MACL's temperature tau_0 (1 + alpha (A - A_0)) is not positive at this batch's alignment A")
    losses = nt_xent_views(z_a, z_b, temperature=tau, reduction="none", normalize=normalize, chunk_size=chunk_size,
                           distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    weights = 1.0 / _one_minus_probability(losses.detach())
    return _shard_reduce(weights * losses, reduction, distributed, distributed_mode)[0]


# --------------------------------------------------------------------------- dual temperature


def dual_temperature_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    *,
    intra_temperature: float = DUAL_INTRA,
    inter_temperature: float = DUAL_INTER,
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Dual temperature (Zhang et al., CVPR 2022) on SimCLR's two views (module docstring).

    ``loss_i = sg[(1 - P_i(tau_beta)) / (1 - P_i(tau_alpha))] (-log P_i(tau_alpha))``: within
    an anchor the gradient is spread over its negatives as at ``tau_alpha``; across anchors each
    is weighted as at ``tau_beta``. ``tau_beta = tau_alpha`` is NT-Xent.

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired.
        intra_temperature: ``tau_alpha`` (default 0.1).
        inter_temperature: ``tau_beta`` (default 1.0).
        reduction, normalize, chunk_size, distributed, distributed_mode, validate: as for
            :func:`~contrastkit.losses.nt_xent_views` (``tau_beta``'s probabilities are a second
            forward pass without gradient).

    Example:
        >>> z = torch.eye(4)[:3] + 0.1
        >>> a = dual_temperature_nt_xent(z, z, intra_temperature=0.5, inter_temperature=0.5)
        >>> bool(torch.isclose(a, nt_xent_views(z, z, temperature=0.5)))
        True
    """
    with value_checks(validate):
        check_reduction(reduction)
        for value, name in ((intra_temperature, "intra_temperature"), (inter_temperature, "inter_temperature")):
            if isinstance(value, Tensor):
                raise TypeError(f"{name} must be a number")
            resolve_temperature(value, name=name)
    options = dict(reduction="none", normalize=normalize, chunk_size=chunk_size, distributed=distributed,
                   distributed_mode=distributed_mode, validate=validate)
    losses = nt_xent_views(z_a, z_b, temperature=intra_temperature, **options)
    with torch.no_grad():
        inter = nt_xent_views(z_a.detach(), z_b.detach(), temperature=inter_temperature, **options)
        weights = _one_minus_probability(inter) / _one_minus_probability(losses.detach())
    return _shard_reduce(weights * losses, reduction, distributed, distributed_mode)[0]


# --------------------------------------------------------------------------- the robust objective


class RobustLoss(NamedTuple):
    """What :func:`robust_nt_xent` returns.

    Attributes:
        loss: the reduced objective (its value the batch estimate of ``mean_i F_i``, its
            gradient iSogCLR's); ``(2N,)`` with ``reduction="none"``.
        log_u: ``(N,)`` the updated moving estimates ``log u`` of each pair (no gradient).
        anchor_weight: ``d loss / d F_i``, the same for every anchor (``1 / (2N)`` for the mean
            of one process), to read each anchor's gradient back from a temperature's ``.grad``.
    """

    loss: Tensor
    log_u: Tensor
    anchor_weight: float


def robust_nt_xent(
    z_a: Tensor,
    z_b: Tensor,
    temperature: Any,
    log_u: Optional[Tensor] = None,
    *,
    rho: float = ISOGCLR["rho"],
    gamma: float = ISOGCLR["gamma"],
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    validate: bool = True,
) -> RobustLoss:
    """iSogCLR's distributionally robust objective on two views (module docstring).

    For anchor ``i`` with temperature ``tau_i``, negatives ``j`` (every row but itself and its
    positive, ``M = 2N - 2`` of them) and ``g_i = (1/M) sum_j exp(s_ij / tau_i)``::

        F_i = tau_i log g_i - s_i+ + tau_i rho     (= tau_i log E_j exp((s_ij - s_i+) / tau_i) + tau_i rho)

    The gradient is SogCLR's, with the moving estimate ``u_i = (1 - gamma) u_i + gamma g_i`` of
    the pair (``log_u``, the previous estimate; ``None`` or non-finite entries: not seen yet,
    ``u_i = g_i``): ``(tau_i / u_i) grad g_i - grad s_i+`` for the embeddings and
    ``log u_i + rho - (g_i / u_i) E_q[s_ij / tau_i]`` for ``tau_i`` (``q`` the anchor's softmax over
    its negatives). The two anchors of a pair share its estimate: each updates it from the
    previous one, the pair keeps their mean (as the authors' code does).

    Args:
        z_a, z_b: ``(N, d)`` views, rows paired; ``N >= 2``.
        temperature: ``tau``, or ``(2N,)`` one per anchor (``z_a``'s, then ``z_b``'s); its
            gradient is the objective's.
        log_u: ``(N,)`` the pairs' previous ``log u`` (e.g. gathered by sample index).
        rho: the robustness ``rho >= 0`` (the KL radius's dual weight; default 0.4).
        gamma: the moving average's weight on the new batch, in ``(0, 1]`` (default 0.8).
        reduction: ``"mean"`` over the ``2N`` anchors, ``"sum"``, or ``"none"``.
        normalize, chunk_size, validate: as for :func:`~contrastkit.losses.dcl`.
        distributed: every rank's negatives (``distributed_mode="local"``: each rank returns
            its share, and its own anchors' estimates).
    """
    with value_checks(validate):
        check_reduction(reduction)
        check_pair(z_a, z_b)
        rho = float(rho)
        if not math.isfinite(rho) or rho < 0:
            raise ValueError(f"rho must be a finite number >= 0, got {rho}")
        check_probability(gamma, "gamma")
        if gamma == 0:
            raise ValueError("gamma must lie in (0, 1]: with 0 the estimate never sees a batch")
        n = z_a.shape[0]
        tau = resolve_temperature(temperature, anchors=2 * n, device=z_a.device)
        if log_u is not None:
            if not isinstance(log_u, Tensor) or log_u.shape != (n,):
                raise ValueError(f"log_u must be a tensor of shape ({n},), one estimate per pair")
    dtype = compute_dtype(z_a.dtype)
    taus = tau.to(dtype) if isinstance(tau, Tensor) and tau.dim() == 1 else z_a.new_full((2 * n,), 1.0, dtype=dtype) * tau
    per_anchor_dcl = dcl(z_a, z_b, temperature=taus, reduction="none", normalize=normalize, chunk_size=chunk_size,
                         distributed=distributed, distributed_mode="local", validate=validate)
    with full_precision(z_a.device):
        positives = _positive_similarity(z_a, z_b, normalize).to(dtype)
        s_pos = torch.cat([positives, positives])
        lse = per_anchor_dcl + s_pos / taus  # log sum_j exp(s_ij / tau_i) over the negatives
        # The global batch's pairs: one rank's count is known on the host (no read back from the
        # device); across ranks it is summed on the device and read once.
        pairs = (float(n) if Shard(distributed, "local").group is None
                 else float(_global_sum(z_a.new_tensor(float(n), dtype=torch.float64), distributed)))
        with torch.no_grad():
            log_g = lse - math.log(2 * pairs - 2)
            log_g_a, log_g_b = log_g[:n], log_g[n:]
            if log_u is not None:
                prior = log_u.to(device=log_g.device, dtype=log_g.dtype)
                seen = torch.isfinite(prior)
                kept = prior + math.log1p(-gamma) if gamma < 1 else torch.full_like(prior, float("-inf"))

                def moved(estimate: Tensor) -> Tensor:
                    return torch.where(seen, torch.logaddexp(kept, estimate + math.log(gamma)), estimate)

                log_g_a, log_g_b = moved(log_g_a), moved(log_g_b)
            log_u_anchor = torch.cat([log_g_a, log_g_b])
            weight = taus.detach() * torch.exp(log_g - log_u_anchor)
            value = taus.detach() * log_g - s_pos.detach() + taus.detach() * rho
        surrogate = weight * lse - s_pos + taus * (log_u_anchor + rho)
        per_anchor = value + (surrogate - surrogate.detach())
        loss, anchor_weight = _shard_reduce(per_anchor, reduction, distributed, "local")
        log_u_pairs = torch.logaddexp(log_g_a, log_g_b) - math.log(2.0)
    return RobustLoss(loss, log_u_pairs, anchor_weight)


# --------------------------------------------------------------------------- the modules


class AdaptiveTemperatureLoss(nn.Module):
    """What a trainer needs of a temperature method (the four classes below).

    ``forward(z_a, z_b, indices=None, **options)`` returns the loss of SimCLR's two views
    (``indices`` ``(N,)``: the batch's sample indices, needed by the methods with per-sample
    state, :attr:`needs_indices`; ``options``: ``reduction``, ``chunk_size``, ``distributed``,
    ``distributed_mode``, ``validate``). :meth:`step_` runs after ``loss.backward()`` (and the
    optimizer's step) and updates the state the method keeps outside the optimizer.
    ``last_temperatures`` holds the ``(2N,)`` temperatures the last call gave its anchors
    (detached), :attr:`value` one number for the logs (their mean).
    """

    needs_indices = False

    def __init__(self) -> None:
        super().__init__()
        self.last_temperatures: Optional[Tensor] = None

    @property
    def value(self) -> float:
        """The mean temperature of the last call's anchors (the base ``tau`` before any call)."""
        return float(self.mean_temperature())

    def mean_temperature(self) -> Tensor:
        """:attr:`value` as a 0-dim tensor where the temperatures live (no host read)."""
        if self.last_temperatures is None:
            return torch.tensor(self.initial_value, dtype=torch.float64)
        return self.last_temperatures.double().mean()

    @property
    def initial_value(self) -> float:
        raise NotImplementedError

    def step_(self) -> None:
        """Update the state kept outside the optimizer (nothing for a stateless method)."""

    def _remember(self, taus: Union[float, Tensor], anchors: int, like: Tensor) -> None:
        taus = taus.detach() if isinstance(taus, Tensor) else like.new_tensor(float(taus))
        self.last_temperatures = taus.expand(anchors).clone() if taus.dim() == 0 else taus.clone()


class MACLNTXentLoss(AdaptiveTemperatureLoss):
    """:func:`macl_nt_xent` as a temperature method (no state)."""

    def __init__(self, temperature: float = MACL_TEMPERATURE, alpha: float = MACL_ALPHA,
                 threshold: float = MACL_THRESHOLD) -> None:
        super().__init__()
        _macl_options(temperature, alpha, threshold)
        self.temperature, self.alpha, self.threshold = float(temperature), float(alpha), float(threshold)

    @property
    def initial_value(self) -> float:
        return self.temperature

    def forward(self, z_a: Tensor, z_b: Tensor, indices: Optional[Tensor] = None, **options: Any) -> Tensor:
        loss = macl_nt_xent(z_a, z_b, temperature=self.temperature, alpha=self.alpha, threshold=self.threshold,
                            **options)
        with torch.no_grad():
            positives = _positive_similarity(z_a.detach(), z_b.detach(), options.get("normalize", True))
            totals = _global_sum(torch.stack([positives.sum(), positives.new_tensor(float(positives.shape[0]))]),
                                 options.get("distributed", False))
            self._remember(macl_temperature(totals[0] / totals[1], self.temperature, self.alpha, self.threshold),
                           2 * z_a.shape[0], z_a)
        return loss

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:g}, alpha={self.alpha:g}, threshold={self.threshold:g}"


class DualTemperatureNTXentLoss(AdaptiveTemperatureLoss):
    """:func:`dual_temperature_nt_xent` as a temperature method (no state)."""

    def __init__(self, intra_temperature: float = DUAL_INTRA, inter_temperature: float = DUAL_INTER) -> None:
        super().__init__()
        for value, name in ((intra_temperature, "intra_temperature"), (inter_temperature, "inter_temperature")):
            resolve_temperature(value, name=name)
        self.intra_temperature, self.inter_temperature = float(intra_temperature), float(inter_temperature)

    @property
    def initial_value(self) -> float:
        return self.intra_temperature

    def forward(self, z_a: Tensor, z_b: Tensor, indices: Optional[Tensor] = None, **options: Any) -> Tensor:
        self._remember(self.intra_temperature, 2 * z_a.shape[0], z_a)
        return dual_temperature_nt_xent(z_a, z_b, intra_temperature=self.intra_temperature,
                                        inter_temperature=self.inter_temperature, **options)

    def extra_repr(self) -> str:
        return f"intra_temperature={self.intra_temperature:g}, inter_temperature={self.inter_temperature:g}"


def _check_bounds(tau_min: float, tau_max: float) -> Tuple[float, float]:
    tau_min = float(resolve_temperature(tau_min, name="tau_min"))
    tau_max = float(resolve_temperature(tau_max, name="tau_max"))
    if tau_min >= tau_max:
        raise ValueError(f"tau_min must be < tau_max, got tau_min={tau_min}, tau_max={tau_max}")
    return tau_min, tau_max


class _PerSampleState(AdaptiveTemperatureLoss):
    """The moving estimates ``log u`` of every training sample (a buffer, so checkpoints keep
    them), the batch's pending update, and its exchange between ranks."""

    needs_indices = True

    def __init__(self, num_samples: int, rho: float, gamma: float) -> None:
        super().__init__()
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")
        self.rho, self.gamma = float(rho), float(gamma)
        # -inf: a sample not seen yet (its first batch sets its estimate).
        self.register_buffer("log_u", torch.full((num_samples,), float("-inf")))
        self._pending: Optional[Dict[str, Any]] = None
        self.register_load_state_dict_pre_hook(_resize_to_checkpoint)

    @property
    def num_samples(self) -> int:
        return self.log_u.shape[0]

    def _indices(self, indices: Optional[Tensor], rows: int) -> Tensor:
        if indices is None:
            raise ValueError(f"{type(self).__name__} keeps one state per training sample: pass the batch's "
                             "sample indices (indices=)")
        return check_index(indices, "indices", length=rows, upper=self.num_samples, device=self.log_u.device)

    def _robust(self, z_a: Tensor, z_b: Tensor, taus: Tensor, idx: Tensor, options: Dict[str, Any]) -> RobustLoss:
        if options.get("distributed") and options.pop("distributed_mode", "local") != "local":
            raise ValueError("the robust objective keeps per-sample state of this rank's anchors: use "
                             "distributed_mode='local'")
        options.pop("distributed_mode", None)
        return robust_nt_xent(z_a, z_b, taus, self.log_u[idx].to(z_a.device), rho=self.rho, gamma=self.gamma,
                              **options)

    def _keep(self, idx: Tensor, result: RobustLoss, distributed: DistributedArg, **extra: Any) -> None:
        """Hold the batch's update until :meth:`step_` (only a training step updates)."""
        self._pending = None
        if self.training and torch.is_grad_enabled():
            self._pending = {"idx": idx, "log_u": result.log_u.detach(), "weight": result.anchor_weight,
                             "distributed": distributed, **extra}

    def _exchange(self, idx: Tensor, columns: Tensor, distributed: DistributedArg) -> Tuple[Tensor, Tensor]:
        """Every rank's ``(indices, columns)`` of this step, so that every rank applies every
        update and holds the same state (rank 0 writes the checkpoint)."""
        group = Shard(distributed, "local").group
        if group is None:
            return idx, columns
        joined = torch.cat([idx.to(torch.float64)[:, None], columns.to(torch.float64)], dim=1)
        everyone = all_gather_no_grad(joined, group)
        return everyone[:, 0].round().to(torch.long), everyone[:, 1:]


def _resize_to_checkpoint(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    """A model rebuilt without its data (``probe``, ``embed``) takes the per-sample state's size
    from the checkpoint it loads."""
    for name, buffer in module._buffers.items():
        saved = state_dict.get(prefix + name)
        if isinstance(saved, Tensor) and buffer is not None and saved.shape != buffer.shape:
            module._buffers[name] = buffer.new_empty(saved.shape)


class IndividualTemperatureLoss(_PerSampleState):
    """iSogCLR (Qiu et al., ICML 2023): one temperature per training sample, learnt with the
    robust objective (:func:`robust_nt_xent`; module docstring).

    State (buffers, saved with the model): ``tau`` ``(num_samples,)``, ``log_u`` (the moving
    estimates) and ``momentum`` (of ``tau``'s gradient). A call uses ``tau[indices]`` for both
    anchors of each pair; :meth:`step_` (after ``loss.backward()``) applies the authors' update
    to the batch's samples: ``m <- (1 - beta) m + beta g``, ``tau <- clip(tau - eta m, tau_min,
    tau_max)`` with ``g`` the mean of the pair's two anchors' gradients, and writes their
    estimates. Under ``distributed=`` every rank applies every rank's updates, so the state is
    the same everywhere.

    Args:
        num_samples: the size of the training set (sample indices lie in ``[0, num_samples)``).
        initial, tau_min, tau_max, rho, gamma, beta, eta: ``ISOGCLR`` (the authors' CIFAR
            example): ``tau`` starts at 0.1 within ``[0.05, 1.0]``, ``rho = 0.4``,
            ``gamma = 0.8``, ``beta = 0.5``, ``eta = 0.03``.
    """

    def __init__(self, num_samples: int, initial: float = ISOGCLR["initial"], *, tau_min: float = ISOGCLR["tau_min"],
                 tau_max: float = ISOGCLR["tau_max"], rho: float = ISOGCLR["rho"], gamma: float = ISOGCLR["gamma"],
                 beta: float = ISOGCLR["beta"], eta: float = ISOGCLR["eta"]) -> None:
        super().__init__(num_samples, rho, gamma)
        self.tau_min, self.tau_max = _check_bounds(tau_min, tau_max)
        initial = float(resolve_temperature(initial, name="initial"))
        if not self.tau_min <= initial <= self.tau_max:
            raise ValueError(f"initial must lie in [tau_min, tau_max] = [{self.tau_min}, {self.tau_max}], got {initial}")
        self.initial = initial
        self.beta = check_probability(beta, "beta")
        self.eta = float(resolve_temperature(eta, name="eta"))
        self.register_buffer("tau", torch.full((num_samples,), initial))
        self.register_buffer("momentum", torch.zeros(num_samples))

    @property
    def initial_value(self) -> float:
        return self.initial

    def forward(self, z_a: Tensor, z_b: Tensor, indices: Optional[Tensor] = None, **options: Any) -> Tensor:
        idx = self._indices(indices, z_a.shape[0])
        tau = self.tau[idx].to(device=z_a.device, dtype=compute_dtype(z_a.dtype)).requires_grad_(torch.is_grad_enabled())
        taus = torch.cat([tau, tau])
        result = self._robust(z_a, z_b, taus, idx, options)
        self._remember(taus, taus.shape[0], z_a)
        self._keep(idx, result, options.get("distributed", False), tau=tau)
        return result.loss

    @torch.no_grad()
    def step_(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        tau = pending["tau"]
        if tau.grad is None:
            raise RuntimeError("IndividualTemperatureLoss.step_() runs after loss.backward(): the temperatures have "
                               "no gradient yet")
        idx = pending["idx"]
        # The pair's tau served both its anchors: its gradient is the sum of theirs.
        gradient = (tau.grad / (2.0 * pending["weight"])).to(self.momentum.device, self.momentum.dtype)
        momentum = (1.0 - self.beta) * self.momentum[idx] + self.beta * gradient
        new_tau = (self.tau[idx] - self.eta * momentum).clamp(self.tau_min, self.tau_max)
        columns = torch.stack([new_tau, momentum, pending["log_u"].to(new_tau)], dim=1)
        idx, columns = self._exchange(idx, columns, pending["distributed"])
        self.tau[idx] = columns[:, 0].to(self.tau.dtype)
        self.momentum[idx] = columns[:, 1].to(self.momentum.dtype)
        self.log_u[idx] = columns[:, 2].to(self.log_u.dtype)

    def extra_repr(self) -> str:
        return (f"num_samples={self.num_samples}, initial={self.initial:g}, tau_min={self.tau_min:g}, "
                f"tau_max={self.tau_max:g}, rho={self.rho:g}, gamma={self.gamma:g}, beta={self.beta:g}, "
                f"eta={self.eta:g}")


class TemperatureNetworkLoss(_PerSampleState):
    """TempNet (Qiu et al., ICML 2024): a head on the embedding predicts each anchor's
    temperature, bounded in ``[tau_min, tau_max]``, trained through the robust objective
    (:func:`robust_nt_xent`, with the per-sample moving estimates ``log_u``).

    The head follows the paper's design: a projection with a sigmoid, the cosine similarity of
    the result to ``prototypes`` learnt prototypes, a softmax over them at a learnt scale, a
    linear read-out of the weighted similarities and a sigmoid onto the bounds:
    ``tau = tau_min + (tau_max - tau_min) sigmoid(w . (softmax(c / t) * c) + b)``, ``b``
    initialised so that ``tau`` starts near ``initial``. It reads the embeddings without their
    gradient: the encoder learns from the loss at the predicted temperatures, the head from the
    objective's gradient with respect to them (a decision of this implementation; the paper
    trains TempNet on a frozen or a jointly trained model).

    Its parameters are trained by the optimizer of the model that owns it; :meth:`step_`
    writes the batch's moving estimates (exchanged between ranks as for
    :class:`IndividualTemperatureLoss`).

    Args:
        dim: the size of the embeddings.
        num_samples: the size of the training set.
        initial, tau_min, tau_max: where ``tau`` starts and its bounds (default 0.1 in
            ``[0.05, 1.0]``, iSogCLR's range for images).
        prototypes: the number of prototypes (default 256, the paper's).
        rho, gamma: the robust objective's (``ISOGCLR``).
    """

    def __init__(self, dim: int, num_samples: int, initial: float = ISOGCLR["initial"], *,
                 tau_min: float = ISOGCLR["tau_min"], tau_max: float = ISOGCLR["tau_max"], prototypes: int = 256,
                 rho: float = ISOGCLR["rho"], gamma: float = ISOGCLR["gamma"]) -> None:
        super().__init__(num_samples, rho, gamma)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if isinstance(prototypes, bool) or not isinstance(prototypes, int) or prototypes < 1:
            raise ValueError(f"prototypes must be an int >= 1, got {prototypes!r}")
        self.tau_min, self.tau_max = _check_bounds(tau_min, tau_max)
        initial = float(resolve_temperature(initial, name="initial"))
        if not self.tau_min < initial < self.tau_max:
            raise ValueError(f"initial must lie inside (tau_min, tau_max) = ({self.tau_min}, {self.tau_max}), "
                             f"got {initial}")
        self.initial = initial
        self.projection = nn.Linear(dim, dim)
        self.prototypes = nn.Parameter(torch.randn(prototypes, dim))
        self.log_scale = nn.Parameter(torch.tensor(math.log(0.1)))
        self.readout = nn.Linear(prototypes, 1)
        with torch.no_grad():
            self.readout.weight.fill_(1.0)
            fraction = (initial - self.tau_min) / (self.tau_max - self.tau_min)
            self.readout.bias.fill_(math.log(fraction / (1.0 - fraction)))

    @property
    def initial_value(self) -> float:
        return self.initial

    def temperatures(self, z: Tensor) -> Tensor:
        """``(n,)`` temperatures in ``[tau_min, tau_max]`` for embeddings ``z`` ``(n, dim)``."""
        hidden = torch.sigmoid(self.projection(nn.functional.normalize(z, dim=1)))
        similarity = nn.functional.normalize(hidden, dim=1) @ nn.functional.normalize(self.prototypes, dim=1).T
        weights = torch.softmax(similarity / self.log_scale.exp(), dim=1)
        out = self.readout(weights * similarity).squeeze(1)
        return self.tau_min + (self.tau_max - self.tau_min) * torch.sigmoid(out)

    def forward(self, z_a: Tensor, z_b: Tensor, indices: Optional[Tensor] = None, **options: Any) -> Tensor:
        idx = self._indices(indices, z_a.shape[0])
        taus = self.temperatures(torch.cat([z_a, z_b]).detach().to(self.projection.weight.dtype))
        result = self._robust(z_a, z_b, taus.to(compute_dtype(z_a.dtype)), idx, options)
        self._remember(taus, taus.shape[0], z_a)
        self._keep(idx, result, options.get("distributed", False))
        return result.loss

    @torch.no_grad()
    def step_(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        idx, columns = self._exchange(pending["idx"], pending["log_u"][:, None], pending["distributed"])
        self.log_u[idx] = columns[:, 0].to(self.log_u.dtype)

    def extra_repr(self) -> str:
        return (f"num_samples={self.num_samples}, prototypes={self.prototypes.shape[0]}, initial={self.initial:g}, "
                f"tau_min={self.tau_min:g}, tau_max={self.tau_max:g}, rho={self.rho:g}, gamma={self.gamma:g}")
