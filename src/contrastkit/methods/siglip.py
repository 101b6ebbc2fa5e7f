"""SigLIP (Zhai et al., ICCV 2023) on image-text pairs: ConVIRT's data, encoders and read-out
with the pairwise sigmoid loss and a learnable bias."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.losses import SIGLIP_BIAS, SIGLIP_TEMPERATURE

from .convirt import DEFAULT_DIM, DEFAULT_TEXT_ENCODER, Convirt, ConvirtModel

if TYPE_CHECKING:
    from .config import PretrainConfig

__all__ = ["Siglip", "SiglipModel"]


class SiglipModel(ConvirtModel):
    """A :class:`~contrastkit.methods.ConvirtModel` (image and text encoders, heads)
    with SigLIP's learnable bias ``b`` next to its temperature, for the ``siglip`` method.

    The temperature keeps contrastkit's ``tau``: :class:`~contrastkit.losses.Temperature`
    stores ``log_scale = log(1 / tau)``, which is SigLIP's ``t'`` (``t = exp(t') = 1 / tau``),
    so ``temperature=0.1`` is SigLIP's ``t' = log 10``; ``bias`` starts at ``b = -10``.
    ``weight`` (convirt's lambda) does not apply: the sigmoid loss is symmetric.
    """

    def __init__(self, encoder: Union[str, nn.Module], in_channels: int, tokenizer: Any, *,
                 temperature: float = SIGLIP_TEMPERATURE, learnable_temperature: bool = True,
                 bias: float = SIGLIP_BIAS, projection_dim: int = DEFAULT_DIM,
                 text_encoder: str = DEFAULT_TEXT_ENCODER, text_width: int = 128, norm: Optional[str] = None) -> None:
        super().__init__(encoder, in_channels, tokenizer, temperature=temperature,
                         learnable_temperature=learnable_temperature, projection_dim=projection_dim,
                         text_encoder=text_encoder, text_width=text_width, norm=norm)
        self.method = "siglip"
        self.training_method = Siglip()
        self.bias = nn.Parameter(torch.tensor(float(bias)))

    def loss(self, images: Tensor, tokens: Tuple[Tensor, Tensor], labels: Optional[Tensor] = None) -> Tensor:
        """Mean sigmoid loss over the ``N`` pairs of the batch (inputs as
        :meth:`ConvirtModel.loss <contrastkit.methods.ConvirtModel.loss>`)."""
        return self.training_method.loss(self, (images, tokens), labels)


class Siglip(Convirt):
    """SigLIP (Zhai et al., ICCV 2023) on image-text pairs: convirt's data, tokenizer, encoders
    and retrieval / zero-shot evaluation, with the loss :func:`~contrastkit.losses.sigmoid_loss`
    (every pair an independent binary decision) and SigLIP's learnable scale ``t = 1 / tau``
    (init ``t' = log 10``) and bias (init ``b = -10``), trained as a :class:`SiglipModel`.
    Under torchrun the loss is the paper's ring over every rank's texts."""

    name = "siglip"
    cross_rank = True
    weighted = False
    default_temperature = SIGLIP_TEMPERATURE   # SigLIP's t = 1 / tau = 10 (Zhai et al. 2023) ...
    default_schedule = "learnable"             # ... learnable by default ("constant" fixes it)

    def build_model(self, config: "PretrainConfig", in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        if tokenizer is None:
            raise ValueError("siglip needs the run's text tokenizer to build its model")
        return SiglipModel(config.encoder if encoder is None else encoder, in_channels, tokenizer, temperature=config.temperature,
                           learnable_temperature=config.learnable_temperature,
                           projection_dim=config.projection_dim, text_encoder=config.text_encoder,
                           norm=config.norm)

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        v, u = embeddings
        return losses.sigmoid_loss(v, u, temperature=model.temperature, bias=model.bias,
                                   distributed=bool(model.distributed))


