"""The four pretraining methods as one module: encoder + projection head + temperature
(+ MoCo's momentum encoder and queue), with a single ``loss(view_a, view_b, labels)``."""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.models import ProjectionHead, build_encoder

__all__ = ["ContrastiveModel", "HARD_NEGATIVE_QUANTILE"]

# Wang & Liu's hard contrastive loss keeps the K most similar negatives (K = 4096 in the
# paper); with the few in-batch negatives of a small batch we keep the hardest quarter.
HARD_NEGATIVE_QUANTILE = 0.75


class ContrastiveModel(nn.Module):
    """Views -> encoder -> ``h`` -> projection head -> ``z`` -> loss.

    Args:
        method: ``"simclr"`` (:func:`~contrastkit.losses.nt_xent_views` on ``2N`` anchors),
            ``"moco"`` (:func:`~contrastkit.losses.info_nce`: queries from view A, the
            momentum encoder's keys of view B as positives, the queue as negatives),
            ``"supcon"`` (:func:`~contrastkit.losses.supcon` on both views with labels),
            ``"dcl"`` (:func:`~contrastkit.losses.dcl`), or Wang & Liu's two variants:
            ``"simple"`` (:func:`~contrastkit.losses.simple_loss`, no temperature) and
            ``"hard_negative"`` (:func:`~contrastkit.losses.hard_negative_nt_xent` keeping the
            hardest quarter of the ``2N - 2`` negatives, ``HARD_NEGATIVE_QUANTILE``).
        encoder: ``"small"`` or ``"resnet18"``; ``in_channels`` its input channels.
        temperature: initial ``tau``; ``learnable_temperature`` trains it (CLIP's
            parameterisation, :class:`~contrastkit.losses.Temperature`).
        projection_dim: size of ``z``.
        momentum: MoCo's key-encoder EMA coefficient.
        queue_size: MoCo's number of stored keys (required for ``"moco"``).
    """

    def __init__(self, method: str, encoder: str, in_channels: int, *, temperature: float,
                 learnable_temperature: bool = False, projection_dim: int = 64,
                 momentum: float = 0.99, queue_size: Optional[int] = None) -> None:
        super().__init__()
        self.method = method
        # Set by the training loop under torchrun: the losses then use every rank's negatives
        # (local mode) and MoCo's queue receives every rank's keys.
        self.distributed = False
        self.encoder = build_encoder(encoder, in_channels)
        self.head = ProjectionHead(self.encoder.out_dim, hidden_dim=max(self.encoder.out_dim, projection_dim),
                                   out_dim=projection_dim)
        self.temperature = losses.Temperature(temperature, learnable=learnable_temperature)
        self.momentum = momentum
        if method == "moco":
            if queue_size is None:
                raise ValueError("moco needs a queue_size")
            self.key_encoder = copy.deepcopy(self.encoder)
            self.key_head = copy.deepcopy(self.head)
            for parameter in list(self.key_encoder.parameters()) + list(self.key_head.parameters()):
                parameter.requires_grad_(False)
            self.register_buffer("queue", F.normalize(torch.randn(queue_size, projection_dim), dim=1))
            self.register_buffer("queue_pointer", torch.zeros((), dtype=torch.long))
        elif method not in ("simclr", "supcon", "dcl", "simple", "hard_negative"):
            raise ValueError(f"method must be simclr, moco, supcon, dcl, simple or hard_negative, got {method!r}")

    def embed(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` -> ``h`` ``(N, encoder.out_dim)``."""
        return self.encoder(images)

    def loss(self, view_a: Tensor, view_b: Tensor, labels: Optional[Tensor] = None) -> Tensor:
        """Mean loss over the batch; ``view_a``/``view_b`` ``(N, C, H, W)``, row ``i`` of each
        from the same source image; ``labels`` ``(N,)`` (used by ``supcon`` only)."""
        n = view_a.shape[0]
        if self.method == "moco":
            return self._moco_loss(view_a, view_b)
        # One forward pass over both views: BatchNorm sees both, as in SimCLR.
        z = self.head(self.encoder(torch.cat([view_a, view_b], dim=0)))
        z_a, z_b = z[:n], z[n:]
        across_ranks = {"distributed": True, "distributed_mode": "local"} if self.distributed else {}
        if self.method == "simclr":
            return losses.nt_xent_views(z_a, z_b, temperature=self.temperature, **across_ranks)
        if self.method == "dcl":
            return losses.dcl(z_a, z_b, temperature=self.temperature, **across_ranks)
        if self.method in ("simple", "hard_negative") and self.distributed:
            raise ValueError(f"method {self.method!r} has no cross-rank form yet; run it without torchrun")
        if self.method == "simple":
            return losses.simple_loss(z_a, z_b)
        if self.method == "hard_negative":
            return losses.hard_negative_nt_xent(z_a, z_b, temperature=self.temperature,
                                                quantile=HARD_NEGATIVE_QUANTILE)
        if labels is None:
            raise ValueError("supcon needs the labels of the batch")
        return losses.supcon(torch.stack([z_a, z_b], dim=1), labels, temperature=self.temperature, **across_ranks)

    @torch.no_grad()
    def _momentum_update(self) -> None:
        pairs = zip(list(self.encoder.parameters()) + list(self.head.parameters()),
                    list(self.key_encoder.parameters()) + list(self.key_head.parameters()))
        for online, key in pairs:
            key.mul_(self.momentum).add_(online.detach(), alpha=1.0 - self.momentum)
        # BatchNorm running statistics follow the same average.
        online_buffers = list(self.encoder.buffers()) + list(self.head.buffers())
        key_buffers = list(self.key_encoder.buffers()) + list(self.key_head.buffers())
        for online, key in zip(online_buffers, key_buffers):
            if key.is_floating_point():
                key.mul_(self.momentum).add_(online, alpha=1.0 - self.momentum)
            else:
                key.copy_(online)

    def _moco_loss(self, view_a: Tensor, view_b: Tensor) -> Tensor:
        query = self.head(self.encoder(view_a))
        with torch.no_grad():
            if self.training:
                self._momentum_update()
            keys = F.normalize(self.key_head(self.key_encoder(view_b)), dim=1)
        loss = losses.info_nce(query, keys, self.queue.clone(), temperature=self.temperature)
        if self.training:
            self._enqueue(keys)
        return loss

    @torch.no_grad()
    def _enqueue(self, keys: Tensor) -> None:
        if self.distributed:  # every rank writes every rank's keys, in rank order
            from contrastkit.distributed import all_gather_no_grad

            keys = all_gather_no_grad(keys)
        size = self.queue.shape[0]
        n = keys.shape[0]
        if size % n:
            raise ValueError(f"the MoCo queue ({size}) must be a multiple of the batch size ({n})")
        # Stays on the device: no host sync for the pointer.
        rows = (self.queue_pointer + torch.arange(n, device=keys.device)) % size
        self.queue[rows] = keys
        self.queue_pointer.copy_((self.queue_pointer + n) % size)
