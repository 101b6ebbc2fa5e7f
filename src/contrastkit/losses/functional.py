"""Functional InfoNCE / NT-Xent family: every loss function, in one namespace.

The functions live by family -- :mod:`contrastkit.losses.infonce` (InfoNCE, NT-Xent,
bidirectional, on a similarity matrix), :mod:`contrastkit.losses.supervised` (SupCon),
:mod:`contrastkit.losses.variants` (DCL, simple, hard-negative, debiased, HCL) -- and the
backend of the losses with in-batch negatives is chosen in one place,
:mod:`contrastkit.losses.dispatch`. This module gathers them under the conventions below.

Conventions shared by every loss function:

* Embeddings are ``(N, d)`` rows; with ``normalize=True`` (the default) rows are
  L2-normalised, so similarities are cosines. Zero-norm rows raise ``ValueError``.
* ``temperature`` is ``tau > 0`` (a float, a scalar tensor, or a
  :class:`~contrastkit.losses.Temperature` module); logits are ``s / tau``. It may also be a
  ``(A,)`` tensor with one ``tau`` per anchor row, in the order of the rows the loss returns
  with ``reduction="none"`` (each function says what its anchors are): anchor ``i``'s logits
  are ``s_ij / tau_i``, on every path, with gradients to every entry.
* ``reduction`` is ``"mean"`` (over anchors), ``"sum"`` or ``"none"`` (one loss per anchor).
* Half-precision inputs are computed in float32 with autocast switched off; the result has
  the compute dtype (float32 for fp16/bf16 inputs, else the input dtype).
* ``chunk_size`` (losses that build an ``N x N`` or ``N x M`` similarity matrix):
  ``None`` chooses automatically — the dense matrix for small problems, the exact tiled
  kernels of :mod:`contrastkit.losses.tiled` above a measured size, whose memory grows
  linearly with ``N``; an int forces tiling with tiles of that many rows. Both paths give
  the same loss and gradients up to floating-point rounding.
* The losses with in-batch negatives (:func:`info_nce` without a bank, :func:`nt_xent_views`,
  :func:`bidirectional_info_nce`, :func:`supcon`, :func:`dcl`) take ``distributed=``:
  ``False`` (default), ``True`` (the default torch.distributed process group) or a
  ``ProcessGroup``. The negatives are then those of the concatenated global batch (rank 0's
  rows first; row counts may differ between ranks), and after DDP's gradient averaging the
  parameter gradients equal single-process training on that batch.
  ``distributed_mode="global"`` gathers the batch and computes every anchor on every rank; it
  returns the global loss. ``"local"`` computes only this rank's anchors against all
  candidates (``1/W`` of the similarity matrix) and returns a value whose mean over ranks is
  the global loss (with equal batch sizes and ``reduction="mean"``: the mean over this rank's
  anchors); ``reduction="none"`` gives this rank's anchors only. In ``"local"`` mode a tiled
  computation (``chunk_size``) becomes a ring exchange (:mod:`contrastkit.losses.ring`): no
  rank holds the global batch. See ``docs/distributed.md``.
"""

from __future__ import annotations

from .dispatch import views_positive_index
from .infonce import bidirectional_info_nce, info_nce, nt_xent, nt_xent_views, similarity_loss
from .supervised import supcon
from .variants import dcl, debiased_nt_xent, hard_negative_nt_xent, hcl, simple_loss

__all__ = [
    "info_nce",
    "nt_xent",
    "nt_xent_views",
    "bidirectional_info_nce",
    "supcon",
    "similarity_loss",
    "dcl",
    "simple_loss",
    "hard_negative_nt_xent",
    "debiased_nt_xent",
    "hcl",
    "views_positive_index",
]
