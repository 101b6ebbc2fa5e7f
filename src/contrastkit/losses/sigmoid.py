"""The sigmoid loss of SigLIP (Zhai et al., ICCV 2023): every image-text pair a binary decision.

For ``N`` pairs, ``s_ij = <image_i, text_j>`` and ``z_ij = 1`` on the diagonal (the true pairs),
``-1`` elsewhere::

    L = -(1/N) sum_i sum_j log sigmoid(z_ij (s_ij / tau + b))

``tau`` is the temperature as everywhere in contrastkit, so SigLIP's learnable scale is
``t = 1 / tau``; ``b`` is a learnable bias (SigLIP initialises ``t = 10``, ``b = -10``, so that
the many negatives start with a small loss). Unlike the softmax losses, no row is normalised
against the others: each pair contributes on its own, which is what makes the loss easy to
split across tiles and ranks.

Three paths, all exact (the same loss and gradients up to floating-point rounding):

* dense: the ``N x N`` logits with ordinary autograd (small batches);
* tiled (``chunk_size``, or automatically above :data:`~contrastkit.losses.tiled.DENSE_MAX_ENTRIES`
  entries like the other losses): a custom autograd function that computes the loss and all
  its gradients tile by tile, memory ``O(N d + chunk_size^2)``;
* distributed (``distributed=``): the paper's ring. Each rank keeps its own images and passes
  blocks of texts around the ring of ranks (the positives are in the first, local block); the
  backward pass runs the ring again with each block's gradient and brings it home, so no rank
  ever holds the global batch.

The identity ``dloss/dlogit_ij = sigmoid(logit_ij) - [i == j]`` gives every gradient from a
recomputed tile: ``d image = W text``, ``d text = W^T image``, ``d b = sum W`` (``W`` the tile of
upstream-weighted ``sigmoid - [i == j]``); the temperature is folded into the images
(``a = image / tau``), so its gradient flows through ordinary autograd.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit.distributed.gather import DistributedArg

# The losses package's own internals, in one block.
from .validation import (
    check_scalar,
    TemperatureLike,
    check_embeddings,
    check_reduction,
    check_same,
    optional_int,
    prepare,
    resolve_temperature,
    value_checks,
)
from ._sharding import Shard
from .core import divide_rows, full_precision
from .modules import _changed_options
from .ring import _start_shift, _wait
from ._tiles import no_autocast, refuse_double_backward, tile_buffers, tile_ranges, tile_view
from .tiled import use_tiled

__all__ = ["sigmoid_loss", "SigmoidLoss", "SIGLIP_TEMPERATURE", "SIGLIP_BIAS"]



#: SigLIP's initial scale ``t = exp(t') = 10`` (Zhai et al., ICCV 2023).
SIGLIP_SCALE = 10.0
#: SigLIP's initial temperature ``tau = 1 / t = 0.1``: the default of :func:`sigmoid_loss` and
#: :class:`SigmoidLoss`.
SIGLIP_TEMPERATURE = 1.0 / SIGLIP_SCALE
#: SigLIP's initial bias ``b = -10`` (Zhai et al., ICCV 2023), so that the many negatives start
#: with a small loss: the default of :func:`sigmoid_loss` and :class:`SigmoidLoss`.
SIGLIP_BIAS = -10.0


def check_bias(bias: object, name: str = "bias") -> Union[float, Tensor]:
    """Return ``bias`` as a finite float or a 0-dim floating tensor (keeping its gradient)."""
    return check_scalar(bias, name, floating=True)


# --------------------------------------------------------------------------- tile kernels
# ``a`` holds images already divided by tau, ``b`` texts, ``bias`` a 0-dim tensor; all in the
# compute dtype. Only tiles with ``positives`` contain true pairs: the square tiles on the
# diagonal (images and texts are split into the same blocks).


def _add_tile_losses_(losses: Tensor, a: Tensor, b: Tensor, bias: Tensor, chunk: int, buf: Tensor,
                      positives: bool) -> None:
    """``losses_i += sum_j -log sigmoid(z_ij (a_i . b_j + bias))`` over every tile of ``a b^T``."""
    for i0, i1 in tile_ranges(a.shape[0], chunk):
        for j0, j1 in tile_ranges(b.shape[0], chunk):
            # -(logit), from the product directly: the negatives' z_ij = -1.
            tile = torch.addmm(bias, a[i0:i1], b[j0:j1].T, beta=-1, alpha=-1, out=tile_view(buf, i1 - i0, j1 - j0))
            if positives and i0 == j0:
                tile.diagonal().neg_()
            losses[i0:i1] -= F.logsigmoid(tile).sum(dim=1)


def _add_tile_grads_(a: Tensor, b: Tensor, bias: Tensor, grad: Tensor, chunk: int, buf: Tensor, positives: bool,
                     da: Optional[Tensor], db: Optional[Tensor]) -> Tensor:
    """Accumulate ``W b`` into ``da`` and ``W^T a`` into ``db`` (either may be ``None``) with
    ``W_ij = grad_i (sigmoid(logit_ij) - [i == j])``; returns ``sum_ij W_ij`` (the bias gradient)."""
    d_bias = a.new_zeros(())
    for i0, i1 in tile_ranges(a.shape[0], chunk):
        ai = a[i0:i1]
        for j0, j1 in tile_ranges(b.shape[0], chunk):
            bj = b[j0:j1]
            tile = torch.addmm(bias, ai, bj.T, out=tile_view(buf, i1 - i0, j1 - j0))
            on_diagonal = positives and i0 == j0
            if on_diagonal:
                positive_logits = tile.diagonal().clone()
            tile.sigmoid_()
            if on_diagonal:  # sigmoid(l) - 1 = -sigmoid(-l), without cancellation
                tile.diagonal().copy_(torch.sigmoid(-positive_logits).neg_())
            tile.mul_(grad[i0:i1, None])
            d_bias += tile.sum()
            if da is not None:
                da[i0:i1].addmm_(tile, bj)
            if db is not None:
                db[j0:j1].addmm_(tile.T, ai)
    return d_bias


def _around_the_ring(block: Tensor, sizes: Tuple[int, ...], group, visit,
                     carry: Optional[Tensor] = None) -> Optional[Tensor]:
    """Call ``visit(step, block, carry)`` on the block of every rank, in ring order.

    At step ``s`` rank ``r`` holds the block of rank ``(r - s) mod W`` (step 0: its own); the
    next block is received while ``visit`` runs. ``carry`` (a block's gradient) follows its
    block to the next rank once ``visit`` has finished with it, so after ``W`` hops this
    rank's own ``carry`` has come home and is returned. ``group=None``: one process, one step.
    """
    rank, world = (0 if group is None else torch.distributed.get_rank(group)), len(sizes)
    for step in range(world):
        source = (rank - step - 1) % world  # whose block arrives next
        requests: List = []
        if step < world - 1:
            incoming = block.new_empty((sizes[source], block.shape[1]))
            requests = _start_shift([block], [incoming], group)
        visit(step, block, carry)
        _wait(requests)
        if carry is not None and world > 1:
            incoming_carry = carry.new_empty((sizes[source], carry.shape[1]))
            _wait(_start_shift([carry], [incoming_carry], group))
            carry = incoming_carry
        if step < world - 1:
            block = incoming
    return carry


class _SigmoidTiles(torch.autograd.Function):
    """Per-image losses of ``a`` against the texts ``b``, in tiles; with a process group,
    against the texts of every rank (``sizes``: their row counts), passed around the ring.

    Step 0 is this rank's own block, the only one with positives. The backward pass follows
    :mod:`contrastkit.losses.ring`: each block travels on with the gradient accumulated for
    it, so the gradient of this rank's texts that comes home is the sum over ranks of every
    rank's contribution.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, bias: Tensor, chunk: int, group,  # type: ignore[override]
                sizes: Tuple[int, ...]) -> Tensor:
        losses = a.new_zeros(a.shape[0])
        buf, _ = tile_buffers(a, max(min(chunk, a.shape[0]), min(chunk, max(sizes))))

        def visit(step: int, block: Tensor, carry: None) -> None:
            _add_tile_losses_(losses, a, block, bias, chunk, buf, positives=step == 0)

        with torch.no_grad(), no_autocast(a):
            _around_the_ring(b.detach(), sizes, group, visit)
        ctx.chunk, ctx.group, ctx.sizes = chunk, group, sizes
        ctx.save_for_backward(a, b, bias)
        return losses

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        refuse_double_backward()
        a, b, bias = ctx.saved_tensors
        chunk = ctx.chunk
        need_a, need_b, need_bias = ctx.needs_input_grad[:3]
        grad = grad.to(a.dtype)
        da = torch.zeros_like(a) if need_a else None
        d_bias = a.new_zeros(())
        buf, _ = tile_buffers(a, max(min(chunk, a.shape[0]), min(chunk, max(ctx.sizes))))

        def visit(step: int, block: Tensor, d_block: Optional[Tensor]) -> None:
            d_bias.add_(_add_tile_grads_(a, block, bias, grad, chunk, buf, step == 0, da, d_block))

        # On a ring every block's gradient travels (another rank's texts may need it).
        d_texts = torch.zeros_like(b) if need_b or ctx.group is not None else None
        with torch.no_grad(), no_autocast(a):
            db = _around_the_ring(b.detach(), ctx.sizes, ctx.group, visit, carry=d_texts)
        return da, db, (d_bias if need_bias else None), None, None, None


# --------------------------------------------------------------------------- the loss


def _dense_losses(a: Tensor, b: Tensor, bias: Union[float, Tensor]) -> Tensor:
    logits = a @ b.T + bias
    positives = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    return -F.logsigmoid(torch.where(positives, logits, -logits)).sum(dim=1)


def sigmoid_loss(
    image: Tensor,
    text: Tensor,
    temperature: TemperatureLike = SIGLIP_TEMPERATURE,
    bias: Union[float, Tensor] = SIGLIP_BIAS,
    *,
    normalize: bool = True,
    reduction: str = "mean",
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    validate: bool = True,
) -> Tensor:
    """SigLIP's pairwise sigmoid loss (Zhai et al., ICCV 2023).

    ``L = -(1/N) sum_ij log sigmoid(z_ij (s_ij / tau + b))`` with ``s_ij = <image_i, text_j>``,
    ``z_ij = 1`` for the true pairs ``i == j`` and ``-1`` for every other pair.

    Args:
        image: ``(N, d)``; row ``i`` pairs with row ``i`` of ``text``.
        text: ``(N, d)``.
        temperature: ``tau > 0`` (a float, a 0-dim tensor with gradient, or a
            :class:`~contrastkit.losses.Temperature` module); SigLIP's scale is ``t = 1 / tau``.
            Default 0.1, SigLIP's initialisation ``t = 10``. Or ``(N,)``, one per image row
            (this rank's images under ``distributed=``): row ``i``'s logits are
            ``s_ij / tau_i + b``.
        bias: ``b``, a finite float or a 0-dim tensor with gradient. Default -10, SigLIP's
            initialisation.
        normalize: L2-normalise rows first (cosine similarity, as in SigLIP).
        reduction: ``"mean"`` (the paper's ``L``), ``"sum"``, or ``"none"`` for ``(N,)``:
            ``loss_i = -sum_j log sigmoid(z_ij (s_ij / tau + b))``, image ``i``'s pairs with every
            text. The paper divides the double sum by ``N`` (the number of pairs in the batch,
            not ``N^2``), so ``"mean"`` is the mean of these per-image sums and ``"sum"`` their sum.
        chunk_size: ``None`` chooses the dense ``N x N`` computation for small batches and
            tiles above the same size as the other losses; an int forces the memory-linear
            tiled computation with tiles of that many rows. Both give the same loss and
            gradients (images, texts, temperature, bias) up to rounding.
        distributed: ``False``, ``True`` (the default process group) or a ``ProcessGroup``.
            Each rank passes its own image and text rows (row counts may differ between ranks;
            ``temperature`` and ``bias`` must be the same on every rank, as DDP keeps them). The
            loss is that of the concatenated global batch of ``N = sum of the ranks' rows``
            pairs, every image against every text of every rank, computed by SigLIP's ring
            exchange of text blocks. Each rank returns its share, normalised by the global
            ``N``: for ``"mean"`` ``W * sum(own per-image losses) / N`` (with equal batches: the
            mean over its own images), for ``"sum"`` ``W * sum(own)``, for ``"none"`` its own
            images' losses. The mean over ranks is the global loss, and after DDP's gradient
            averaging every gradient equals single-process training on the global batch.
            Each ring step is tiled as ``chunk_size`` says (automatically: one tile per step
            up to the dense size, so memory per rank ``O(n * max rank rows)``, then tiles).
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Half-precision inputs are computed in float32 (autocast off), with ``F.logsigmoid`` so the
    loss stays finite at temperatures down to 0.01 and below; the result has the compute dtype.

    Example:
        >>> x = torch.eye(2)
        >>> round(float(sigmoid_loss(x, x, temperature=1.0, bias=0.0)), 6)  # log(1+e^-1) + log 2
        1.006409
    """
    with value_checks(validate):
        shard = Shard(distributed, "local")
        with shard.checking():
            check_reduction(reduction)
            check_embeddings(image, "image")
            check_embeddings(text, "text")
            check_same(image, "image", text, "text", dims=((0, 0), (1, 1)))
            tau = resolve_temperature(temperature, anchors=image.shape[0], device=image.device)
            bias = check_bias(bias)
            chunk_size = optional_int(chunk_size, "chunk_size", minimum=1)
            with full_precision(image.device):  # zero-norm rows, too, must fail on every rank
                x, b = prepare(image, normalize, "image"), prepare(text, normalize, "text")
        total = shard.exchange(image, text)
        chunk = use_tiled(image.shape[0], total, chunk_size)
        with full_precision(image.device):
            a = divide_rows(x, tau)  # each image row by its own tau when there is one per row
            bias = bias.to(device=a.device, dtype=a.dtype) if isinstance(bias, Tensor) else a.new_tensor(bias)
            if shard.active or chunk is not None:
                sizes = tuple(shard.layout.sizes) if shard.active else (total,)
                # A ring without tiling takes each rank's whole block as one tile.
                tile = chunk if chunk is not None else max(sizes)
                losses = _SigmoidTiles.apply(a, b, bias, tile, shard.group, sizes)
            else:
                losses = _dense_losses(a, b, bias)
            return shard.reduce(losses, reduction, anchors_total=total)


# --------------------------------------------------------------------------- module twin


class SigmoidLoss(nn.Module):
    """Module form of :func:`sigmoid_loss` that owns SigLIP's temperature and bias.

    Call with ``image`` and ``text``, ``(N, d)`` with rows ``i`` paired; returns the loss
    (``(N,)`` per image with ``reduction="none"``).

    ``temperature`` is ``tau`` as for every loss of contrastkit (SigLIP's scale is
    ``t = 1 / tau``: its initialisation ``t = 10`` is ``temperature=0.1``, the default). It is
    stored as ``log_scale = t' = log(1 / tau)``, the parameterisation of CLIP and SigLIP, and
    the bias as ``bias = b`` (default -10, SigLIP's). Both are ``nn.Parameter``s trained by the
    optimizer of the model that owns the loss, or fixed buffers when
    ``learnable_temperature`` / ``learnable_bias`` is ``False``.

    Args:
        temperature: initial ``tau > 0`` (default 0.1).
        bias: initial ``b`` (default -10).
        learnable_temperature, learnable_bias: train ``t'`` and ``b`` (default ``True``).
        reduction, normalize, chunk_size, distributed, validate: the keyword options of
            :func:`sigmoid_loss`, with its defaults; a call may override ``reduction`` and
            ``distributed`` for that call only.
        scale, learnable_scale: removed (``scale`` was ``t = 1 / tau``); passing either raises
            ``TypeError``: pass ``temperature=1/scale`` and ``learnable_temperature``.

    Example:
        >>> loss_fn = SigmoidLoss()
        >>> round(loss_fn.temperature, 4), loss_fn.bias.item()
        (0.1, -10.0)
    """

    def __init__(self, temperature: float = SIGLIP_TEMPERATURE, bias: float = SIGLIP_BIAS, *,
                 learnable_temperature: bool = True, learnable_bias: bool = True, reduction: str = "mean",
                 normalize: bool = True, chunk_size: Optional[int] = None, distributed: DistributedArg = False,
                 validate: bool = True, scale: Optional[float] = None,
                 learnable_scale: Optional[bool] = None) -> None:
        super().__init__()
        if scale is not None or learnable_scale is not None:
            raise TypeError("SigmoidLoss takes temperature= (tau), not scale= (SigLIP's t = 1 / tau): pass "
                            "temperature=1/scale (SigLIP's t = 10 is temperature=0.1), and "
                            "learnable_temperature= for learnable_scale=")
        tau = float(resolve_temperature(temperature))
        log_scale = torch.tensor(math.log(1.0 / tau), dtype=torch.float32)
        bias_t = torch.tensor(float(check_bias(bias)), dtype=torch.float32)
        if learnable_temperature:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)
        if learnable_bias:
            self.bias = nn.Parameter(bias_t)
        else:
            self.register_buffer("bias", bias_t)
        self.reduction = reduction
        self.normalize = normalize
        self.chunk_size = chunk_size
        self.distributed = distributed
        self.validate = validate

    def forward(self, image: Tensor, text: Tensor, *, reduction: Optional[str] = None,
                distributed: DistributedArg = None) -> Tensor:
        return sigmoid_loss(image, text, temperature=torch.exp(-self.log_scale), bias=self.bias,
                            reduction=self.reduction if reduction is None else reduction, normalize=self.normalize,
                            chunk_size=self.chunk_size,
                            distributed=self.distributed if distributed is None else distributed,
                            validate=self.validate)

    @property
    def temperature(self) -> float:
        """Current ``tau = 1 / t = exp(-t')``."""
        return math.exp(-float(self.log_scale.detach()))

    def extra_repr(self) -> str:
        parts = [f"temperature={self.temperature:.4g}", f"bias={float(self.bias.detach()):.4g}",
                 f"learnable_temperature={isinstance(self.log_scale, nn.Parameter)}",
                 f"learnable_bias={isinstance(self.bias, nn.Parameter)}"]
        return ", ".join(parts + _changed_options(self))
