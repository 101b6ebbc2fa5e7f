"""The InfoNCE / NT-Xent family and the sigmoid (SigLIP) loss: functional core and ``nn.Module`` twins.

Depends on torch alone. See :mod:`contrastkit.losses.functional` for the conventions.
"""

from .core import contrastive_loss
from .functional import (
    bidirectional_info_nce,
    dcl,
    debiased_nt_xent,
    hard_negative_nt_xent,
    hcl,
    info_nce,
    nt_xent,
    nt_xent_views,
    similarity_loss,
    simple_loss,
    supcon,
    views_positive_index,
)
from .modules import (
    DCL,
    HCL,
    BidirectionalInfoNCE,
    ContrastiveLoss,
    DebiasedNTXent,
    HardNegativeNTXent,
    InfoNCE,
    NTXent,
    NTXentViews,
    SimilarityLoss,
    SimpleLoss,
    SupCon,
    Temperature,
)
from .sigmoid import SigmoidLoss, sigmoid_loss

__all__ = [
    "contrastive_loss", "info_nce", "nt_xent", "nt_xent_views", "bidirectional_info_nce", "supcon",
    "similarity_loss", "dcl", "simple_loss", "hard_negative_nt_xent", "debiased_nt_xent", "hcl",
    "views_positive_index", "sigmoid_loss",
    "ContrastiveLoss", "InfoNCE", "NTXent", "NTXentViews", "BidirectionalInfoNCE", "SupCon",
    "SimilarityLoss", "DCL", "SimpleLoss", "HardNegativeNTXent", "DebiasedNTXent", "HCL", "Temperature",
    "SigmoidLoss",
]
