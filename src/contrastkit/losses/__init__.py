"""The InfoNCE / NT-Xent family and the sigmoid (SigLIP) loss: functional core and ``nn.Module`` twins.

Depends on torch and :mod:`contrastkit.distributed` only. See
:mod:`contrastkit.losses.functional` for the conventions.

Modules: :mod:`.infonce`, :mod:`.supervised`, :mod:`.variants` (the loss functions by
family, all re-exported by :mod:`.functional`); :mod:`.core` (the dense primitive and
:func:`contrastive_loss`); :mod:`.dispatch` (one choice of backend: dense, tiled, gathered,
ring); :mod:`.sigmoid` (SigLIP's pairwise sigmoid loss, dense, tiled and ring); :mod:`.tiled` and :mod:`.ring` (the memory-linear kernels, over the online
log-sum-exp of ``._tiles``); ``._sharding`` (the ``distributed=`` option);
:mod:`.validation` (input checks, also used by other layers); :mod:`.modules` (the
``nn.Module`` twins); :mod:`.temperature` (:class:`Temperature`); :mod:`.adaptive` (the
temperatures beyond one number: MACL, dual temperature, iSogCLR's individual temperatures,
TempNet).
"""

from .adaptive import (
    MACLNTXentLoss,
    RobustLoss,
    AdaptiveTemperatureLoss,
    DualTemperatureNTXentLoss,
    IndividualTemperatureLoss,
    RobustLoss,
    TemperatureNetworkLoss,
    dual_temperature_nt_xent,
    macl_nt_xent,
    macl_temperature,
    robust_nt_xent,
)
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
)
from .sigmoid import SIGLIP_BIAS, SIGLIP_TEMPERATURE, SigmoidLoss, sigmoid_loss
from .temperature import MIN_TEMPERATURE, Temperature
from .validation import value_checks

__all__ = [
    "contrastive_loss", "info_nce", "nt_xent", "nt_xent_views", "bidirectional_info_nce", "supcon",
    "similarity_loss", "dcl", "simple_loss", "hard_negative_nt_xent", "debiased_nt_xent", "hcl",
    "views_positive_index", "sigmoid_loss",
    "ContrastiveLoss", "InfoNCE", "NTXent", "NTXentViews", "BidirectionalInfoNCE", "SupCon",
    "SimilarityLoss", "DCL", "SimpleLoss", "HardNegativeNTXent", "DebiasedNTXent", "HCL", "Temperature",
    "MIN_TEMPERATURE", "SigmoidLoss", "SIGLIP_TEMPERATURE", "SIGLIP_BIAS",
    "macl_nt_xent", "macl_temperature", "dual_temperature_nt_xent", "robust_nt_xent", "AdaptiveTemperatureLoss", "MACLNTXentLoss",
    "DualTemperatureNTXentLoss", "IndividualTemperatureLoss", "TemperatureNetworkLoss", "RobustLoss", "value_checks",
]
