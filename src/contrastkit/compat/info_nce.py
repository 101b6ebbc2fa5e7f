"""info-nce-pytorch's ``InfoNCE`` and ``info_nce`` (https://github.com/RElbers/info-nce-pytorch,
0.1.4), computed by :func:`contrastkit.losses.info_nce`.

Change ``from info_nce import InfoNCE`` to ``from contrastkit.compat.info_nce import InfoNCE``:
the same constructor (``temperature=0.1, reduction='mean', negative_mode='unpaired'``), the same
call (``loss(query, positive_key, negative_keys=None)``) and the same numbers (to float rounding).
Each query is compared, by cosine similarity over ``temperature``, with its positive key and
with ``negative_keys`` (``(M, D)`` shared by every query, ``negative_mode='unpaired'``; ``(N, M,
D)`` per query, ``'paired'``), or, without them, with the other queries' positive keys; the loss
is the cross-entropy of picking the positive (van den Oord et al. 2018, arXiv 1807.03748).

What contrastkit adds: a large batch of in-batch or unpaired negatives is computed in tiles
(memory linear in ``N``), and the inputs are checked (a non-finite entry or a zero-norm row is
refused by name instead of giving NaN). What differs from the peer:

* a **negative temperature** is kept, as the peer computes it (the logits divided by it: the
  least similar candidate becomes the favoured one), though contrastkit's core refuses it;
* a **temperature of 0** (the peer returns NaN or infinity) and any temperature that is not a
  finite number are refused with a ``ValueError`` naming ``temperature``;
* the peer's shape errors are ``ValueError`` here too, with contrastkit's messages.
"""

from __future__ import annotations

import math
from typing import Optional

from torch import Tensor, nn

from contrastkit import losses

__all__ = ["InfoNCE", "info_nce"]


def info_nce(query: Tensor, positive_key: Tensor, negative_keys: Optional[Tensor] = None, temperature: float = 0.1,
             reduction: str = "mean", negative_mode: str = "unpaired") -> Tensor:
    """info-nce-pytorch's ``info_nce``: ``query`` ``(N, D)``, ``positive_key`` ``(N, D)``,
    ``negative_keys`` ``None``, ``(M, D)`` (``negative_mode='unpaired'``) or ``(N, M, D)``
    (``'paired'``); ``reduction`` ``'mean'``, ``'sum'`` or ``'none'`` (``(N,)``). See the
    module's description for what differs from the peer."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature == 0:
        raise ValueError(f"temperature must be a finite number other than 0, got {temperature!r}")
    if temperature < 0:
        # The peer divides the logits by a negative temperature: the same as comparing the
        # negated query at |temperature| (normalisation keeps the sign), which the core accepts.
        query, temperature = -query, -temperature
    return losses.info_nce(query, positive_key, negative_keys, temperature=float(temperature),
                           negative_mode=negative_mode, reduction=reduction)


class InfoNCE(nn.Module):
    """info-nce-pytorch's ``InfoNCE(temperature=0.1, reduction='mean', negative_mode='unpaired')``;
    ``forward(query, positive_key, negative_keys=None)`` is :func:`info_nce` with them."""

    def __init__(self, temperature: float = 0.1, reduction: str = "mean", negative_mode: str = "unpaired") -> None:
        super().__init__()
        self.temperature = temperature
        self.reduction = reduction
        self.negative_mode = negative_mode

    def forward(self, query: Tensor, positive_key: Tensor, negative_keys: Optional[Tensor] = None) -> Tensor:
        return info_nce(query, positive_key, negative_keys, temperature=self.temperature, reduction=self.reduction,
                        negative_mode=self.negative_mode)
