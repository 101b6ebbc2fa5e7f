"""MoCo (He et al. 2020): a momentum key network and a queue of earlier keys as negatives."""

from __future__ import annotations

import copy
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.distributed import KeyQueue, shuffle_across_ranks

from contrastkit.metrics.batch import NOT_AN_ITEM, OWN_ITEM, QUEUED, VIEW_A, VIEW_B, BatchProblem

from .accumulation import cached_gradient_loss
from .base import Batch
from .tap import BatchTap, observe_batch
from .two_view import ContrastiveModel, TwoViewMethod, _similarity_dtype

__all__ = ["MoCo"]


class MoCo(TwoViewMethod):
    """MoCo (He et al. 2020): queries from view A, the momentum encoder's keys of view B as
    positives, a :class:`~contrastkit.distributed.KeyQueue` of earlier keys (starting full of
    random unit keys) as negatives, :func:`~contrastkit.losses.info_nce`. In training mode
    each step first moves the key network towards the online one and afterwards enqueues its
    keys (every rank's, under torchrun).

    Shuffle-BN (He et al. 2020): under torchrun the key network's batch is shuffled across
    ranks before its forward pass and put back in order afterwards
    (:func:`~contrastkit.distributed.shuffle_across_ranks`), so that its BatchNorm statistics
    are those of other images than the query's and cannot leak the positive. The permutation
    is drawn by rank 0 from torch's global RNG (seeded, and checkpointed on resume). Under one
    process it is a no-op; ``model.shuffle_bn = False`` turns it off."""

    name = "moco"
    default_temperature = 0.2  # MoCo v2

    def queue_size(self, given: Optional[int], batch_size: int, train_size: int) -> Optional[int]:
        """A multiple of the effective batch size; by default up to 16 batches, but fewer than the
        training set holds, so that the queue does not mostly hold older keys of the very images
        in the batch."""
        if given is None:
            return batch_size * max(1, min(16, train_size // batch_size - 1))
        if given % batch_size:
            raise ValueError(f"queue_size ({given}) must be a multiple of the batch size ({batch_size})")
        return given

    def extend_model(self, model: "ContrastiveModel", queue_size: Optional[int]) -> None:
        if queue_size is None:
            raise ValueError("moco needs a queue_size")
        model.key_encoder = copy.deepcopy(model.encoder)
        model.key_head = copy.deepcopy(model.head)
        for parameter in list(model.key_encoder.parameters()) + list(model.key_head.parameters()):
            parameter.requires_grad_(False)
        model.queue = KeyQueue(queue_size, model.head.out_dim, start_full=True)
        model.shuffle_bn = True

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        view_a, view_b = batch
        query = model.head(model.encoder(view_a))
        return query, _keys(model, view_b)

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        query, keys = embeddings
        return losses.info_nce(query, keys, model.queue.negatives(oldest_first=False), temperature=model.temperature)

    def batch_problem(self, model: nn.Module, embeddings: Tuple[Tensor, ...]) -> Optional[BatchProblem]:
        """Each query (view A) against its own key (view B, the positive, column 0) and the
        queue's keys (the negatives, earlier steps' keys: no image of this batch)."""
        query, keys = embeddings
        dtype = _similarity_dtype(query)
        q = F.normalize(query.to(dtype), dim=1)
        k = F.normalize(keys.to(dtype), dim=1)
        queue = F.normalize(model.queue.negatives(oldest_first=False).to(q.device, dtype), dim=1)
        n, m = q.shape[0], queue.shape[0]
        device = q.device

        def rows_of(index: Tensor) -> Tensor:
            return torch.cat([(q[index] * k[index]).sum(1, keepdim=True), q[index] @ queue.T], dim=1)

        return BatchProblem.computed(rows_of, (n, 1 + m), torch.zeros(n, dtype=torch.long, device=device), False,
                                     torch.arange(n, device=device), torch.full((n,), VIEW_A, device=device),
                                     torch.tensor([OWN_ITEM] + [NOT_AN_ITEM] * m, device=device),
                                     torch.tensor([VIEW_B] + [QUEUED] * m, device=device),
                                     "each query (view A) against its own key (view B) and the queue of earlier keys")

    def loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor] = None, *,
             indices: Optional[Tensor] = None, tap: Optional[BatchTap] = None) -> Tensor:
        self._check_cross_rank(model)
        embeddings = self.embed(model, batch)
        observe_batch(self, model, embeddings, tap)  # before the keys are enqueued: the queue the loss saw
        loss = self.objective(model, embeddings, labels)
        if model.training:
            model.queue.enqueue(embeddings[1], group=model.distributed)
        return loss

    def cached_gradient_loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor],
                             micro_batch: int, *, indices: Optional[Tensor] = None, tap: Optional[BatchTap] = None,
                             **precision: Any) -> Tensor:
        """Only the queries are accumulated: the key side has no gradient and runs once per
        step, between the two passes (one momentum update after the queries' first pass, as
        in :meth:`embed`; the keys in micro-batches; one enqueue at the end)."""
        self._check_cross_rank(model)
        view_a, view_b = batch
        keys: List[Tensor] = []

        def objective(embeddings: Tuple[Tensor, ...]) -> Tensor:
            keys.append(_keys(model, view_b, micro_batch))
            observe_batch(self, model, (embeddings[0], keys[0]), tap)
            return self.objective(model, (embeddings[0], keys[0]), labels)

        loss = cached_gradient_loss(lambda part: (model.head(model.encoder(part)),), objective, view_a,
                                    micro_batch, model=model, **precision)
        if model.training:
            model.queue.enqueue(keys[0], group=model.distributed)
        return loss


@torch.no_grad()
def _keys(model: nn.Module, view_b: Tensor, chunk: Optional[int] = None) -> Tensor:
    """MoCo's keys of ``view_b`` (in chunks of ``chunk`` rows if given), after the momentum
    update in training mode (called after the query's forward: the key BatchNorm follows its
    statistics); the batch is shuffled across ranks for the key network in training under
    torchrun (shuffle-BN, :class:`MoCo`)."""
    if model.training:
        _momentum_update(model)
    shuffle = None
    if model.training and model.distributed and getattr(model, "shuffle_bn", True):
        view_b, shuffle = shuffle_across_ranks(view_b, model.distributed)
    parts = view_b.split(chunk) if chunk else (view_b,)
    keys = torch.cat([F.normalize(model.key_head(model.key_encoder(part)), dim=1) for part in parts])
    return keys if shuffle is None else shuffle.unshuffle(keys)


@torch.no_grad()
def _momentum_update(model: nn.Module) -> None:
    """Key network <- momentum * key network + (1 - momentum) * online network, parameters and
    BatchNorm running statistics alike."""
    pairs = zip(list(model.encoder.parameters()) + list(model.head.parameters()),
                list(model.key_encoder.parameters()) + list(model.key_head.parameters()))
    for online, key in pairs:
        key.mul_(model.momentum).add_(online.detach(), alpha=1.0 - model.momentum)
    online_buffers = list(model.encoder.buffers()) + list(model.head.buffers())
    key_buffers = list(model.key_encoder.buffers()) + list(model.key_head.buffers())
    for online, key in zip(online_buffers, key_buffers):
        if key.is_floating_point():
            key.mul_(model.momentum).add_(online, alpha=1.0 - model.momentum)
        else:
            key.copy_(online)


