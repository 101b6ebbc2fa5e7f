"""Supervised contrastive loss: the positives of an anchor are the rows of its class.

Conventions: :mod:`contrastkit.losses.functional`; the backend is chosen by
:func:`contrastkit.losses.dispatch.contrast`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from contrastkit.distributed.gather import DistributedArg

from .dispatch import LossCall, SelfContrast, contrast
from .core import MULTI_POSITIVE
from .validation import TemperatureLike, check_choice, check_embeddings, check_labels

__all__ = ["supcon"]


def supcon(
    z: Tensor,
    labels: Tensor,
    *,
    temperature: TemperatureLike,
    variant: str = "out",
    reduction: str = "mean",
    normalize: bool = True,
    chunk_size: Optional[int] = None,
    distributed: DistributedArg = False,
    distributed_mode: str = "global",
    validate: bool = True,
) -> Tensor:
    """Supervised contrastive loss (Khosla et al. 2020), L_out or L_in.

    Args:
        z: ``(N, d)`` embeddings, or ``(N, V, d)`` with ``V`` views per sample (flattened to
            ``N * V`` anchors, view-major within a sample, labels repeated).
        labels: ``(N,)`` integer class labels; rows with equal labels are positives.
        temperature: ``tau > 0``, or one per anchor: ``(N,)``, or ``(N * V,)`` in the
            flattened order (sample-major, its views in order).
        variant: ``"out"`` (average of log-probabilities over positives, the paper's
            recommendation) or ``"in"`` (log of the average probability).
        reduction: ``"mean"`` over anchors that have at least one positive, ``"sum"``, or
            ``"none"`` (anchors without a positive get 0). If no anchor has a positive,
            ``"mean"`` raises ``ValueError``.
        normalize: L2-normalise rows first.
        chunk_size: ``None`` (automatic dense/tiled choice) or a tile size forcing the
            memory-linear tiled computation. ``"out"``'s positive term is a per-class sum;
            ``"in"``'s, the log-sum-exp over the anchor's positives, is a second pass over
            the tiles that keeps only the columns of the anchor's class.
        distributed, distributed_mode: global negatives over ranks (module docstring); the
            labels are gathered too, so positives are found on every rank, and ``"mean"`` is
            over the global batch's anchors that have a positive. Tiling is done on the
            gathered batch in ``"global"`` mode. In ``"local"`` mode with tiles, ``"in"``
            runs the ring exchange (the labels travel with their rows); ``"out"`` has no ring
            form and raises ``ValueError`` if a ``chunk_size`` is given.
        validate: ``False`` skips the checks that read tensor values (finite entries,
            zero-norm rows, index ranges) for inputs checked upstream; with ``True`` they run
            without a host synchronisation on accelerators.

    Denominator: every other row (positives included, self excluded).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> round(float(supcon(z, torch.tensor([0, 0, 1, 1]), temperature=1.0)), 6)
        0.551445
    """
    call = LossCall(temperature=temperature, reduction=reduction, chunk_size=chunk_size,
                    distributed=distributed, distributed_mode=distributed_mode, validate=validate)
    with call.checking():
        check_choice(variant, "variant", MULTI_POSITIVE)
        check_embeddings(z, "z", ndim=3 if isinstance(z, Tensor) and z.dim() == 3 else 2)
        labels = check_labels(labels, z.shape[0], z.device)
        call.set_anchors(z.shape[0] * (z.shape[1] if z.dim() == 3 else 1), z.device)
        if call.shard.local and chunk_size is not None and variant == "out":
            raise ValueError("chunk_size is not available with distributed_mode='local' for supcon "
                             "variant='out'; use distributed_mode='global' for the tiled computation")
    spec = SelfContrast((z,), ("z",), labels=labels, multi_positive=variant)
    return contrast(call, spec, normalize=normalize)
