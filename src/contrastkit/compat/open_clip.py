"""open_clip's ``ClipLoss`` and ``SigLipLoss`` (https://github.com/mlfoundations/open_clip,
open_clip_torch 3.3.0, ``open_clip/loss.py``), on contrastkit's losses.

Change ``from open_clip.loss import ClipLoss, SigLipLoss`` (or ``from open_clip import
ClipLoss``) to ``from contrastkit.compat.open_clip import ClipLoss, SigLipLoss``: the same
constructors (``ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=False, rank=0,
world_size=1, use_horovod=False)``, ``SigLipLoss(cache_labels=False, rank=0, world_size=1,
dist_impl=None)``), the same call (``loss(image_features, text_features, logit_scale,
logit_bias=None, output_dict=False)``; ``SigLipLoss``'s ``logit_bias`` has no default, as in
the peer), the same return (a 0-dim tensor, or ``{"contrastive_loss": loss}`` with
``output_dict=True``) and the same numbers and gradients (features, ``logit_scale``,
``logit_bias``; to float rounding), on every rank under torch.distributed too. As in the peer
the features ``(N, D)`` are used as given (open_clip's model L2-normalises them, not the loss)
and ``logit_scale`` multiplies the similarities as it is (the model passes
``logit_scale.exp()``; the loss takes no exponential).

* **ClipLoss** (Radford et al. 2021): ``logits = logit_scale * image_features @
  text_features.T``, the mean of the image-to-text and text-to-image cross-entropies with the
  diagonal as the targets: :func:`contrastkit.losses.bidirectional_info_nce` (``weight=0.5``,
  ``normalize=False``, ``temperature = 1 / logit_scale`` as a tensor, so that the gradient
  reaches ``logit_scale``), tiled in memory linear in ``N`` for large batches. ``logit_bias``
  adds one number to every logit, which a softmax ignores: it leaves the loss unchanged (its
  gradient is 0; the peer's is 0 up to rounding) and stays connected to the result.
* **SigLipLoss** (Zhai et al. 2023): ``-(1/N) sum_ij log sigmoid(z_ij (logit_scale * s_ij +
  logit_bias))`` with ``z_ij = 1`` on the diagonal and ``-1`` elsewhere:
  :func:`contrastkit.losses.sigmoid_loss` (``normalize=False``, ``temperature = 1 /
  logit_scale``, ``bias=logit_bias``, or no bias for ``None``, as the peer adds none).

Under torch.distributed (``world_size > 1``; the default process group, whose rank and size
``rank`` and ``world_size`` must be, which is checked):

* ClipLoss, ``local_loss=False``: every rank computes the loss of the global batch
  (contrastkit's ``distributed_mode="global"``). With ``gather_with_grad=True`` each rank's
  features get the gradient summed over the ranks' (identical) losses, as the peer's
  ``torch.distributed.nn.all_gather`` and contrastkit's gather give it: after DDP's averaging,
  single-process training on the global batch. With ``gather_with_grad=False`` (the peer's
  default) the peer treats the other ranks' features as constants, so a rank's features get
  the gradient of its own copy of the loss only, ``1 / world_size`` of the above; that is kept
  exactly (the gradient that contrastkit's gather returns to this rank's features is scaled by
  ``1 / world_size``). ``logit_scale``'s gradient is the full one in both.
* ClipLoss, ``local_loss=True``: each rank computes its own pairs' rows and columns against
  every rank's features, the mean over its own pairs. ``gather_with_grad=True``: contrastkit's
  ``distributed_mode="local"`` (each rank's features get the gradient summed over ranks, as in
  the peer). ``gather_with_grad=False``: the peer treats every gathered feature as a constant,
  this rank's own included, so the features get only the gradient of their role as this
  rank's anchors; kept exactly: the features are gathered without gradient
  (:func:`contrastkit.distributed.all_gather_no_grad`) and each direction is
  :func:`contrastkit.losses.similarity_loss` of this rank's rows (dense ``(n, N)``, as in the
  peer).
* SigLipLoss: the peer's four ``dist_impl`` (``"bidir"``, ``"shift"``, ``"reduce"``,
  ``"gather"``) compute the same loss (each rank: its images against every rank's texts,
  divided by its own ``n``) and the same gradients (a rank's texts get the sum over ranks).
  All four are contrastkit's ring (``sigmoid_loss(distributed=True)``: text blocks passed from
  rank to rank, as the peer's ``"shift"``, tiled for large blocks); ``dist_impl`` is checked and
  kept as the peer keeps it (``self.dist_impl``, ``None`` read as ``"bidir"``).

What differs from the peer, or is kept from it on purpose:

* a **logit_scale of 0 or below** is kept as the peer computes it, though contrastkit's core
  needs a temperature above 0: the sign goes into the image features and ``temperature = 1 /
  |logit_scale|``; a scale of 0 (or below the smallest normal float) multiplies the image
  features with ``temperature = 1``, so that the logits are 0 and the gradient still reaches
  it. Under ``world_size > 1`` a ClipLoss ``logit_scale`` of exactly 0 then gets, on each rank,
  the share of its gradient that flows through this rank's features: the ranks' gradients
  differ from the peer's, their mean (what DDP applies) is the peer's;
* ``logit_scale`` and ``logit_bias`` must be single numbers (a float, a 0-dim tensor or one of
  shape ``(1,)``, as open_clip's ``nonscalar_logit_scale`` makes them): a larger tensor, which
  the peer would broadcast over the logits, is a ``ValueError`` naming it;
* a non-finite feature, ``logit_scale`` or ``logit_bias`` is refused with a ``ValueError``
  naming it (the peer returns NaN), on the CPU at once and on an accelerator without waiting for
  the device (``torch._assert_async``); under ``world_size > 1`` every rank raises (one rank's
  error is shared at the first collective, so that no rank is left waiting). Shapes that do not
  pair (row or feature counts, dtypes) are ``ValueError`` / ``TypeError`` naming them (the peer's
  matmul and ``cross_entropy`` raise ``RuntimeError`` or ``IndexError``), and so are ``rank`` /
  ``world_size`` that are not the default process group's (the peer computes with another rank's rows, or fails in its gather);
* the **row counts may differ between ranks** (the peer's all-gather needs equal ones): each
  rank then returns contrastkit's share, ``world_size * sum(own losses) / N_global``, whose mean
  over ranks is the global loss (with equal row counts: the peer's mean over its own rows);
* ``use_horovod=True`` is refused with a ``ValueError`` naming it (contrastkit's distributed
  losses run on torch.distributed); a ``dist_impl`` other than the four is a ``ValueError``
  naming it (the peer: ``AssertionError``);
* ``cache_labels`` is accepted and kept as an attribute, without effect (contrastkit builds no
  label tensor); the peer's helpers ``get_logits`` / ``get_ground_truth`` and its subclasses
  (``CoCaLoss``, ``DistillClipLoss``) are not offered;
* half-precision features are computed in float32 (contrastkit's rule; the result is float32)
  where the peer computes in the features' precision;
* a ClipLoss batch of one pair gives 0, as in the peer, without contrastkit's warning about a
  batch without negatives.
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.distributed import all_gather_no_grad, exchange_layout, get_rank, get_world_size, is_active
from contrastkit.losses.validation import check_embeddings, check_same, check_scalar

__all__ = ["ClipLoss", "SigLipLoss"]

Number = Union[float, Tensor]
_DIST_IMPLS = ("bidir", "shift", "reduce", "gather")


# --------------------------------------------------------------------------- shared helpers


def _process_group(owner: str, rank: int, world_size: int) -> bool:
    """Whether the call runs on the default process group (``world_size > 1``, as in the
    peer); checks that ``rank`` and ``world_size`` are that group's."""
    if world_size <= 1:
        return False
    if not is_active():
        raise ValueError(f"{owner}(world_size={world_size}) needs an initialised torch.distributed process "
                         "group (torch.distributed.init_process_group), or world_size=1")
    if get_world_size() != world_size or get_rank() != rank:
        raise ValueError(f"{owner}(rank={rank}, world_size={world_size}) does not match the default process "
                         f"group (rank {get_rank()} of {get_world_size()})")
    return True


def _single_number(value: object, name: str) -> Number:
    """``value`` as a finite float or a 0-dim tensor (its gradient kept)."""
    if isinstance(value, Tensor) and value.numel() != 1:
        raise ValueError(f"{name} must be a single number (a float or a tensor of one element), "
                         f"got a tensor of shape {tuple(value.shape)}")
    return check_scalar(value, name)


def _check_inputs(image_features: Tensor, text_features: Tensor, logit_scale: object,
                  logit_bias: object) -> Tuple[Number, Optional[Number]]:
    """The peer's arguments, checked by name; returns ``(logit_scale, logit_bias)`` as single numbers."""
    check_embeddings(image_features, "image_features")
    check_embeddings(text_features, "text_features")
    check_same(image_features, "image_features", text_features, "text_features", dims=((0, 0), (1, 1)))
    scale = _single_number(logit_scale, "logit_scale")
    bias = None if logit_bias is None else _single_number(logit_bias, "logit_bias")
    return scale, bias


def _checked(distributed: bool, *args: object) -> Tuple[Number, Optional[Number]]:
    """``_check_inputs``; when distributed, an error is raised on every rank (shared at the row
    exchange, the first collective of contrastkit's distributed losses and of ClipLoss's
    ``local_loss=True, gather_with_grad=False`` path), so that no rank waits for one that failed."""
    if not distributed:
        return _check_inputs(*args)
    try:
        return _check_inputs(*args)
    except (ValueError, TypeError) as error:
        exchange_layout(0, (), torch.float64, None, error=error)
        raise  # exchange_layout re-raises this rank's error; this line is not reached


def _compute_dtype(features: Tensor, scale: Number) -> torch.dtype:
    """The dtype ``logit_scale`` is used in: the features' compute dtype (float32 for half
    precision), or the scale's own when wider, as torch's promotion would give it."""
    dtype = torch.float32 if features.dtype in (torch.float16, torch.bfloat16) else features.dtype
    if isinstance(scale, Tensor) and scale.is_floating_point():
        dtype = torch.promote_types(dtype, scale.dtype)
    return dtype


def _scale_tensor(scale: Number, features: Tensor) -> Tensor:
    """``logit_scale`` as a 0-dim tensor in the compute dtype (its gradient kept)."""
    dtype = _compute_dtype(features, scale)
    if isinstance(scale, Tensor):
        return scale.reshape(()).to(dtype)
    return torch.tensor(float(scale), dtype=dtype, device=features.device)


def _as_temperature(scale: Number, features: Tensor) -> Tuple[Tensor, Tensor]:
    """``(factor, tau)``, 0-dim tensors with ``factor / tau = logit_scale`` and ``tau > 0`` (what
    contrastkit's core takes): ``tau = 1 / |logit_scale|`` and ``factor`` its sign (gradient 0),
    so that ``logit_scale``'s gradient flows through ``tau``; below the smallest normal float in
    magnitude (0 included) ``tau = 1`` and ``factor = logit_scale`` itself. The image features
    are multiplied by ``factor``."""
    scale = _scale_tensor(scale, features)
    magnitude = scale.abs()
    tiny = magnitude < torch.finfo(scale.dtype).tiny
    tau = torch.where(tiny, torch.ones_like(magnitude), magnitude).reciprocal()
    factor = torch.where(tiny, scale, torch.sign(scale))
    return factor, tau


class _ScaleGradient(torch.autograd.Function):
    """The identity, whose backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return grad * ctx.factor, None


def _result(loss: Tensor, output_dict: bool) -> Union[Tensor, Dict[str, Tensor]]:
    return {"contrastive_loss": loss} if output_dict else loss


# --------------------------------------------------------------------------- ClipLoss


class ClipLoss(nn.Module):
    """open_clip's ``ClipLoss(local_loss=False, gather_with_grad=False, cache_labels=False,
    rank=0, world_size=1, use_horovod=False)``: CLIP's symmetric cross-entropy over
    ``logit_scale * image_features @ text_features.T``, computed by
    :func:`contrastkit.losses.bidirectional_info_nce` (the module's description).

    ``forward(image_features, text_features, logit_scale, logit_bias=None, output_dict=False)``:
    features ``(N, D)`` (this rank's, paired row by row), ``logit_scale`` and ``logit_bias``
    single numbers; returns the 0-dim loss, or ``{"contrastive_loss": loss}``.
    """

    def __init__(self, local_loss: bool = False, gather_with_grad: bool = False, cache_labels: bool = False,
                 rank: int = 0, world_size: int = 1, use_horovod: bool = False) -> None:
        super().__init__()
        if use_horovod:
            raise ValueError("use_horovod=True is not supported by contrastkit.compat.open_clip.ClipLoss: "
                             "contrastkit's distributed losses run on torch.distributed (keep open_clip's "
                             "ClipLoss for Horovod)")
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.cache_labels = cache_labels  # accepted for the peer's signature; no label tensor is built
        self.rank = rank
        self.world_size = world_size
        self.use_horovod = use_horovod

    def forward(self, image_features: Tensor, text_features: Tensor, logit_scale: Number,
                logit_bias: Optional[Number] = None, output_dict: bool = False) -> Union[Tensor, Dict[str, Tensor]]:
        distributed = _process_group("ClipLoss", self.rank, self.world_size)
        scale, bias = _checked(distributed, image_features, text_features, logit_scale, logit_bias)
        if distributed and self.local_loss and not self.gather_with_grad:
            loss = self._local_constant_candidates(image_features, text_features, scale)
        else:
            loss = self._bidirectional(image_features, text_features, scale, distributed)
        if isinstance(bias, Tensor):  # a shift of every logit: no change, gradient 0, kept connected
            loss = loss + (bias * 0).sum()
        return _result(loss, output_dict)

    def _bidirectional(self, image: Tensor, text: Tensor, scale: Number, distributed: bool) -> Tensor:
        factor, tau = _as_temperature(scale, image)
        if distributed and not self.gather_with_grad:
            # The peer's constants: this rank's features get 1 / world_size of the gradient that
            # contrastkit's gather (summed over the ranks' identical losses) gives them.
            image = _ScaleGradient.apply(image, 1.0 / self.world_size)
            text = _ScaleGradient.apply(text, 1.0 / self.world_size)
        call = dict(temperature=tau, weight=0.5, normalize=False, distributed=distributed,
                    distributed_mode="local" if self.local_loss else "global", validate=False)
        if distributed or image.shape[0] > 1:
            return losses.bidirectional_info_nce(image * factor, text, **call)
        with warnings.catch_warnings():  # one pair: 0, as in the peer, without contrastkit's warning
            warnings.simplefilter("ignore", UserWarning)
            return losses.bidirectional_info_nce(image * factor, text, **call)

    def _local_constant_candidates(self, image: Tensor, text: Tensor, scale: Number) -> Tensor:
        """``local_loss=True, gather_with_grad=False``: this rank's rows and columns against every
        rank's features, gathered as constants (the peer's gradients: the anchors' only)."""
        rows = image.shape[0]
        if image.dtype in (torch.float16, torch.bfloat16):  # half precision: computed in float32
            image, text = image.float(), text.float()
        joined = torch.cat([image.detach(), text.detach()], dim=1)
        layout = exchange_layout(rows, (joined.shape[1],), joined.dtype, None)
        gathered = all_gather_no_grad(joined, None, layout=layout)
        all_image, all_text = gathered[:, :image.shape[1]], gathered[:, image.shape[1]:]
        scale = _scale_tensor(scale, image)
        positives = torch.arange(layout.offset, layout.offset + rows, device=image.device)
        call = dict(temperature=1.0, exclude_diagonal=False, validate=False)
        per_image = losses.similarity_loss(scale * image @ all_text.T, positives, **call)
        per_text = losses.similarity_loss(scale * text @ all_image.T, positives, **call)
        # contrastkit's share: the mean over this rank's pairs when the ranks' row counts are equal.
        return (per_image + per_text) / 2 * (layout.world_size * rows / layout.total)

    def extra_repr(self) -> str:
        return (f"local_loss={self.local_loss}, gather_with_grad={self.gather_with_grad}, rank={self.rank}, "
                f"world_size={self.world_size}")


# --------------------------------------------------------------------------- SigLipLoss


class SigLipLoss(nn.Module):
    """open_clip's ``SigLipLoss(cache_labels=False, rank=0, world_size=1, dist_impl=None)``:
    SigLIP's pairwise sigmoid loss over ``logit_scale * image_features @ text_features.T +
    logit_bias``, computed by :func:`contrastkit.losses.sigmoid_loss` (the module's description).

    ``forward(image_features, text_features, logit_scale, logit_bias, output_dict=False)``:
    features ``(N, D)`` (this rank's, paired row by row), ``logit_scale`` and ``logit_bias``
    (or ``None``: no bias) single numbers; returns the 0-dim loss, or ``{"contrastive_loss":
    loss}``.
    """

    def __init__(self, cache_labels: bool = False, rank: int = 0, world_size: int = 1,
                 dist_impl: Optional[str] = None) -> None:
        super().__init__()
        if dist_impl is not None and dist_impl not in _DIST_IMPLS:
            raise ValueError(f"dist_impl must be None or one of {_DIST_IMPLS}, got {dist_impl!r}")
        self.cache_labels = cache_labels  # accepted for the peer's signature; no label tensor is built
        self.rank = rank
        self.world_size = world_size
        self.dist_impl = dist_impl or "bidir"  # every one computes the same loss: contrastkit's ring

    def forward(self, image_features: Tensor, text_features: Tensor, logit_scale: Number,
                logit_bias: Optional[Number], output_dict: bool = False) -> Union[Tensor, Dict[str, Tensor]]:
        distributed = _process_group("SigLipLoss", self.rank, self.world_size)
        scale, bias = _checked(distributed, image_features, text_features, logit_scale, logit_bias)
        factor, tau = _as_temperature(scale, image_features)
        loss = losses.sigmoid_loss(image_features * factor, text_features, temperature=tau,
                                   bias=0.0 if bias is None else bias, normalize=False, distributed=distributed,
                                   validate=False)
        return _result(loss, output_dict)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world_size={self.world_size}, dist_impl={self.dist_impl!r}"
