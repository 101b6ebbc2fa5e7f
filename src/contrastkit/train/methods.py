"""The pretraining methods: one :class:`Method` object per method, and the two-view model.

A method owns everything the training loop would otherwise decide by the method's name: the
data it reads (:meth:`Method.load_data`), how a batch is drawn (:meth:`Method.batches`: two
augmented views of images, or images and the token ids of their texts), the model it trains
(:meth:`Method.build_model`), its loss (:meth:`Method.embed` then :meth:`Method.objective`,
together :meth:`Method.loss`) and its own evaluation (:meth:`Method.val_metrics` each
``eval_every`` epochs, :meth:`Method.readout` and :meth:`Method.test_metrics` at the end).
The linear probe and kNN read-out of the encoder, common to all methods, are not a method's:
they run wherever the data carry labels (:mod:`contrastkit.train.evaluate`).

:data:`METHOD_REGISTRY` maps each name of :data:`~contrastkit.train.config.METHODS` to its
object; a new method is a subclass with its ``name``, registered there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
import os
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import layout, losses
from contrastkit.distributed import KeyQueue, shuffle_across_ranks
from contrastkit.losses.sigmoid import SIGLIP_BIAS, SIGLIP_SCALE
from contrastkit.models import ProjectionHead, build_encoder

from . import convirt
from .accumulation import cached_gradient_loss
from .config import PretrainConfig
from .geometry import geometry

__all__ = ["Method", "EvalContext", "METHOD_REGISTRY", "get_method", "TwoViewMethod", "ContrastiveModel",
           "HARD_NEGATIVE_QUANTILE", "Siglip", "SiglipModel"]

# Wang & Liu's hard contrastive loss keeps the K most similar negatives (K = 4096 in the
# paper); with the few in-batch negatives of a small batch we keep the hardest quarter.
HARD_NEGATIVE_QUANTILE = 0.75

#: A batch as the batch maker returns it: ``(view_a, view_b)`` or ``(images, (ids, mask))``.
Batch = Tuple[Any, Any]


@dataclass
class EvalContext:
    """What a method's evaluation hooks read during a run: the model being trained, the data
    set, the run's batch maker (``batches(split, indices) -> batch``), the device, the resolved
    configuration and the effective (global) batch size."""

    model: nn.Module
    dataset: Any
    batches: Callable[[Any, Tensor], Batch]
    device: torch.device
    config: PretrainConfig
    batch_size: int


class Method:
    """One pretraining method. Stateless: the run's state lives in the model (parameters,
    MoCo's queue) and the loop; the one instance in :data:`METHOD_REGISTRY` serves every run.

    Subclasses set ``name`` and implement :meth:`load_data`, :meth:`batches`,
    :meth:`build_model`, :meth:`embed` and :meth:`objective`; the other hooks have defaults.
    """

    name: ClassVar[str]
    #: Whether the loss has a cross-rank form (every rank's negatives) for torchrun.
    cross_rank: ClassVar[bool] = True
    #: Whether ``--micro-batch`` (cached-gradient accumulation) applies: :meth:`embed` is
    #: per-row and :meth:`objective` takes the whole batch's embeddings (its in-batch
    #: negatives). A new method opts in.
    cached_gradients: ClassVar[bool] = False

    # -- data ---------------------------------------------------------------------------
    def load_data(self, config: PretrainConfig) -> Any:
        """The data set ``config.data`` (train / val / test splits)."""
        raise NotImplementedError

    def run_tokenizer(self, dataset: Any, out: str, resume: bool) -> Any:
        """The run's text tokenizer (paired methods), else ``None``."""
        return None

    def saved_tokenizer(self, run_dir: str) -> Any:
        """The tokenizer a finished run of this method saved in ``run_dir``, else ``None``."""
        return None

    def save_run_files(self, model: nn.Module, folder: layout.RunFolder) -> None:
        """Write the method's own files into the run folder (once, on rank 0)."""

    def batches(self, dataset: Any, config: PretrainConfig, device: torch.device,
                tokenizer: Any = None) -> Callable[[Any, Tensor], Batch]:
        """The batch maker: ``batches(split, indices)`` -> a training batch on ``device``."""
        raise NotImplementedError

    # -- model and loss -----------------------------------------------------------------
    def build_model(self, config: PretrainConfig, in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        """The model at its initialisation (the caller seeds the RNG). ``encoder``: the image
        encoder to build it on, already checked (with ``out_dim``; see
        ``contrastkit.train.setup.build_model``), else the built-in ``config.encoder``."""
        raise NotImplementedError

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        """The batch's embeddings, as :meth:`objective` takes them: ``(z_a, z_b)`` ``(N, d)``
        for the two-view methods, ``(query, keys)`` for MoCo, ``(v, u)`` for convirt. Row ``i``
        of each comes from batch element ``i``, so the rows of a batch split in parts are the
        row blocks of the whole. In training mode it may advance state that has no gradient
        (MoCo's key network)."""
        raise NotImplementedError

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        """The mean loss over the batch from all its embeddings (the in-batch negatives are
        taken here); ``labels`` ``(N,)`` class ids or ``None``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor] = None) -> Tensor:
        """Mean loss over the batch: ``objective(model, embed(model, batch), labels)`` (the
        forward of one training step; MoCo also enqueues its keys afterwards)."""
        self._check_cross_rank(model)
        return self.objective(model, self.embed(model, batch), labels)

    def cached_gradient_loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor],
                             micro_batch: int) -> Tensor:
        """The loss of one training step with its gradients accumulated in micro-batches of
        ``micro_batch`` rows (:func:`~contrastkit.train.accumulation.cached_gradient_loss`):
        the parameters' ``.grad`` are those of ``loss(model, batch, labels).backward()`` when
        no layer has batch statistics; returns the (detached) loss."""
        self.require_cached_gradients()
        self._check_cross_rank(model)
        return cached_gradient_loss(lambda part: self.embed(model, part),
                                    lambda embeddings: self.objective(model, embeddings, labels),
                                    batch, micro_batch, model=model)

    def require_cached_gradients(self) -> None:
        """Raise ``ValueError`` unless the method takes ``--micro-batch`` (:attr:`cached_gradients`)."""
        if not self.cached_gradients:
            raise ValueError(f"method {self.name!r} does not take --micro-batch: its loss is not one of the "
                             "whole batch's per-row embeddings (in-batch negatives)")

    def _check_cross_rank(self, model: nn.Module) -> None:
        if getattr(model, "distributed", False) and not self.cross_rank:
            raise ValueError(f"method {self.name!r} has no cross-rank form yet; run it without torchrun")

    # -- evaluation ---------------------------------------------------------------------
    def val_metrics(self, run: EvalContext) -> Dict[str, Any]:
        """The method's own numbers on the val split for the epoch record."""
        return {}

    def readout(self, model: nn.Module, dataset: Any, device: torch.device) -> Dict[str, Any]:
        """The method's own held-out numbers read from the model alone (in ``summary.json``
        and in the re-evaluation of a checkpoint, ``contrastkit probe``)."""
        return {}

    def test_metrics(self, run: EvalContext) -> Dict[str, Any]:
        """Held-out numbers that need the run's batch maker (``summary.json`` only)."""
        return {}


def _across_ranks(model: nn.Module) -> Dict[str, Any]:
    """The loss options that, under torchrun, take every rank's negatives."""
    return {"distributed": True, "distributed_mode": "local"} if model.distributed else {}


class TwoViewMethod(Method):
    """Methods on two augmented views of each image, trained as a :class:`ContrastiveModel`:
    one forward pass over both views (BatchNorm sees both, as in SimCLR) gives
    ``(z_a, z_b)``; the val and test numbers are the two-view geometry of ``h`` and ``z``
    (alignment, uniformity, tolerance; ``train/geometry.py``)."""

    cached_gradients = True

    def load_data(self, config: PretrainConfig) -> Any:
        """:func:`~contrastkit.data.load_dataset`, or for an image folder with ``workers > 0``
        or the data option ``stream=true``, :func:`~contrastkit.data.stream_image_folder`
        (only the file index in memory)."""
        from contrastkit.data import load_dataset, stream_image_folder

        options = dict(config.data_options)
        stream = options.pop("stream", None)
        if stream is not None and not isinstance(stream, bool):
            raise ValueError(f"data option stream must be true or false, got {stream!r}")
        if stream or (stream is None and config.workers > 0 and _is_image_folder(config.data)):
            if not _is_image_folder(config.data):
                raise ValueError(f"data option stream=true streams a folder of class subfolders of images; "
                                 f"{config.data!r} is not one")
            return stream_image_folder(config.data, **options)
        return load_dataset(config.data, seed=config.seed, **options)

    def batches(self, dataset: Any, config: PretrainConfig, device: torch.device,
                tokenizer: Any = None) -> Callable[[Any, Tensor], Batch]:
        from contrastkit.data import make_views
        from contrastkit.data.streaming import StreamedViews, is_streaming

        views = make_views(dataset, mode=config.views, device=device, strength=config.view_strength)
        return StreamedViews(views) if is_streaming(dataset) else views

    def build_model(self, config: PretrainConfig, in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        return ContrastiveModel(
            self.name, config.encoder if encoder is None else encoder, in_channels,
            temperature=config.temperature, learnable_temperature=config.learnable_temperature,
            projection_dim=config.projection_dim, momentum=config.momentum, queue_size=config.queue_size,
            norm=config.norm,
        )

    def extend_model(self, model: "ContrastiveModel", queue_size: Optional[int]) -> None:
        """Add the method's own modules to a freshly built model (MoCo's key network)."""

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        view_a, view_b = batch
        n = view_a.shape[0]
        z = model.head(model.encoder(torch.cat([view_a, view_b], dim=0)))
        return z[:n], z[n:]

    def _geometry(self, run: EvalContext, split: Any) -> Dict[str, Any]:
        return geometry(run.model, split, run.batches, run.device, batch_size=run.batch_size,
                        temperature=run.model.temperature.value, seed=run.config.seed)

    def val_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return {"val_geometry": self._geometry(run, run.dataset.val)}

    def test_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return {"representation": self._geometry(run, run.dataset.test)}


class SimCLR(TwoViewMethod):
    """:func:`~contrastkit.losses.nt_xent_views` on the ``2N`` anchors of both views."""

    name = "simclr"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        z_a, z_b = embeddings
        return losses.nt_xent_views(z_a, z_b, temperature=model.temperature, **_across_ranks(model))


class DCL(TwoViewMethod):
    """:func:`~contrastkit.losses.dcl` (the positive left out of the denominator)."""

    name = "dcl"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        z_a, z_b = embeddings
        return losses.dcl(z_a, z_b, temperature=model.temperature, **_across_ranks(model))


class SupCon(TwoViewMethod):
    """:func:`~contrastkit.losses.supcon` on both views, positives from the labels."""

    name = "supcon"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        if labels is None:
            raise ValueError("supcon needs the labels of the batch")
        z_a, z_b = embeddings
        return losses.supcon(torch.stack([z_a, z_b], dim=1), labels, temperature=model.temperature,
                             **_across_ranks(model))


class Simple(TwoViewMethod):
    """Wang & Liu's simple contrastive loss (:func:`~contrastkit.losses.simple_loss`, no
    temperature)."""

    name = "simple"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        return losses.simple_loss(*embeddings, **_across_ranks(model))


class HardNegative(TwoViewMethod):
    """Wang & Liu's hard contrastive loss (:func:`~contrastkit.losses.hard_negative_nt_xent`),
    keeping the hardest quarter of the ``2N - 2`` negatives (``HARD_NEGATIVE_QUANTILE``)."""

    name = "hard_negative"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        # Under torchrun the hardest quarter of the global batch's negatives.
        return losses.hard_negative_nt_xent(*embeddings, temperature=model.temperature,
                                            quantile=HARD_NEGATIVE_QUANTILE, **_across_ranks(model))


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

    def loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor] = None) -> Tensor:
        self._check_cross_rank(model)
        embeddings = self.embed(model, batch)
        loss = self.objective(model, embeddings, labels)
        if model.training:
            model.queue.enqueue(embeddings[1], group=model.distributed)
        return loss

    def cached_gradient_loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor],
                             micro_batch: int) -> Tensor:
        """Only the queries are accumulated: the key side has no gradient and runs once per
        step, between the two passes (one momentum update after the queries' first pass, as
        in :meth:`embed`; the keys in micro-batches; one enqueue at the end)."""
        self._check_cross_rank(model)
        view_a, view_b = batch
        keys: List[Tensor] = []

        def objective(embeddings: Tuple[Tensor, ...]) -> Tensor:
            keys.append(_keys(model, view_b, micro_batch))
            return self.objective(model, (embeddings[0], keys[0]), labels)

        loss = cached_gradient_loss(lambda part: (model.head(model.encoder(part)),), objective, view_a,
                                    micro_batch, model=model)
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


def _is_image_folder(data: str) -> bool:
    from contrastkit.data.files import detect_format

    try:
        return os.path.isdir(data) and detect_format(data) == "imagefolder"
    except (ValueError, FileNotFoundError):
        return False


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


class Convirt(Method):
    """ConVIRT (Zhang et al. 2020; the ConVIRT tutorial) on image-text pairs, trained as a
    :class:`~contrastkit.train.convirt.ConvirtModel`: a batch is images and the token ids of
    their texts (:class:`~contrastkit.train.convirt.PairedBatches`), the loss
    :func:`~contrastkit.losses.bidirectional_info_nce` weighted by ``lambda``, the numbers
    retrieval and zero-shot classification (:func:`~contrastkit.train.convirt.evaluate_convirt`)."""

    name = "convirt"
    cached_gradients = True

    def load_data(self, config: PretrainConfig) -> Any:
        from contrastkit.data.paired import load_paired

        return load_paired(config.data, seed=config.seed, **config.data_options)

    def run_tokenizer(self, dataset: Any, out: str, resume: bool) -> Any:
        return convirt.run_tokenizer(dataset, out, resume)

    def saved_tokenizer(self, run_dir: str) -> Any:
        return convirt.load_run_tokenizer(run_dir)

    def save_run_files(self, model: nn.Module, folder: layout.RunFolder) -> None:
        model.tokenizer.save(folder.tokenizer)

    def batches(self, dataset: Any, config: PretrainConfig, device: torch.device,
                tokenizer: Any = None) -> Callable[[Any, Tensor], Batch]:
        return convirt.PairedBatches(tokenizer, device)

    def build_model(self, config: PretrainConfig, in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        if tokenizer is None:
            raise ValueError("convirt needs the run's text tokenizer to build its model")
        return convirt.ConvirtModel(config.encoder if encoder is None else encoder, in_channels, tokenizer, temperature=config.temperature,
                                    learnable_temperature=config.learnable_temperature, weight=config.weight,
                                    projection_dim=config.projection_dim, text_encoder=config.text_encoder,
                                    norm=config.norm)

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        images, (ids, mask) = batch
        return model.image_embeddings(images), model.text_embeddings(ids, mask)

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        # labels are ignored: pairs, not classes, define the positives.
        v, u = embeddings
        return losses.bidirectional_info_nce(v, u, temperature=model.temperature, weight=model.weight,
                                             **_across_ranks(model))

    def val_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return convirt.val_retrieval(run.model, run.dataset, run.device)

    def readout(self, model: nn.Module, dataset: Any, device: torch.device) -> Dict[str, Any]:
        return convirt.evaluate_convirt(model, dataset, device)


class SiglipModel(convirt.ConvirtModel):
    """A :class:`~contrastkit.train.convirt.ConvirtModel` (image and text encoders, heads)
    with SigLIP's learnable bias ``b`` next to its temperature, for the ``siglip`` method.

    The temperature keeps contrastkit's ``tau``: :class:`~contrastkit.losses.Temperature`
    stores ``log_scale = log(1 / tau)``, which is SigLIP's ``t'`` (``t = exp(t') = 1 / tau``),
    so ``temperature=0.1`` is SigLIP's ``t' = log 10``; ``bias`` starts at ``b = -10``.
    ``weight`` (convirt's lambda) does not apply: the sigmoid loss is symmetric.
    """

    def __init__(self, encoder: Union[str, nn.Module], in_channels: int, tokenizer: Any, *,
                 temperature: float = 1.0 / SIGLIP_SCALE, learnable_temperature: bool = True,
                 bias: float = SIGLIP_BIAS, projection_dim: int = convirt.DEFAULT_DIM,
                 text_encoder: str = "mean", text_width: int = 128, norm: Optional[str] = None) -> None:
        super().__init__(encoder, in_channels, tokenizer, temperature=temperature,
                         learnable_temperature=learnable_temperature, projection_dim=projection_dim,
                         text_encoder=text_encoder, text_width=text_width, norm=norm)
        self.method = "siglip"
        self.bias = nn.Parameter(torch.tensor(float(bias)))

    def loss(self, images: Tensor, tokens: Tuple[Tensor, Tensor], labels: Optional[Tensor] = None) -> Tensor:
        """Mean sigmoid loss over the ``N`` pairs of the batch (inputs as
        :meth:`ConvirtModel.loss <contrastkit.train.convirt.ConvirtModel.loss>`)."""
        return get_method("siglip").loss(self, (images, tokens), labels)


class Siglip(Convirt):
    """SigLIP (Zhai et al., ICCV 2023) on image-text pairs: convirt's data, tokenizer, encoders
    and retrieval / zero-shot evaluation, with the loss :func:`~contrastkit.losses.sigmoid_loss`
    (every pair an independent binary decision) and SigLIP's learnable scale ``t = 1 / tau``
    (init ``t' = log 10``) and bias (init ``b = -10``), trained as a :class:`SiglipModel`.
    Under torchrun the loss is the paper's ring over every rank's texts."""

    name = "siglip"
    cross_rank = True

    def build_model(self, config: PretrainConfig, in_channels: int, tokenizer: Any = None, *,
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


#: Every method by name, in the order of :data:`~contrastkit.train.config.METHODS`.
METHOD_REGISTRY: Dict[str, Method] = {method.name: method for method in (
    SimCLR(), MoCo(), SupCon(), DCL(), Simple(), HardNegative(), Convirt(), Siglip())}


def get_method(name: str) -> Method:
    """The registered method called ``name``."""
    if name not in METHOD_REGISTRY:
        raise ValueError(f"method must be one of {tuple(METHOD_REGISTRY)}, got {name!r}")
    return METHOD_REGISTRY[name]


class ContrastiveModel(nn.Module):
    """Views -> encoder -> ``h`` -> projection head -> ``z`` -> loss, for the two-view methods.

    Args:
        method: ``"simclr"``, ``"moco"``, ``"supcon"``, ``"dcl"``, ``"simple"`` or
            ``"hard_negative"`` (see their :class:`Method` objects in :data:`METHOD_REGISTRY`).
        encoder: a built-in name of :data:`~contrastkit.models.ENCODERS`, or an encoder module
            with ``out_dim`` (:func:`~contrastkit.models.prepare_encoder`); ``in_channels``
            the input channels.
        temperature: initial ``tau``; ``learnable_temperature`` trains it (CLIP's
            parameterisation, :class:`~contrastkit.losses.Temperature`).
        projection_dim: size of ``z``.
        momentum: MoCo's key-encoder EMA coefficient.
        queue_size: MoCo's number of stored keys (required for ``"moco"``).
        norm: the encoder's and head's normalisation, ``None``/``"batch"`` (BatchNorm) or
            ``"group"`` (GroupNorm, LayerNorm in the head; :func:`~contrastkit.models.build_encoder`).
    """

    def __init__(self, method: str, encoder: Union[str, nn.Module], in_channels: int, *, temperature: float,
                 learnable_temperature: bool = False, projection_dim: int = 64,
                 momentum: float = 0.99, queue_size: Optional[int] = None, norm: Optional[str] = None) -> None:
        super().__init__()
        two_view = METHOD_REGISTRY.get(method)
        if not isinstance(two_view, TwoViewMethod):
            names = [name for name, m in METHOD_REGISTRY.items() if isinstance(m, TwoViewMethod)]
            raise ValueError(f"method must be one of {', '.join(names)}, got {method!r}")
        self.method = method
        # Set by the training loop under torchrun: the losses then use every rank's negatives
        # (local mode) and MoCo's queue receives every rank's keys.
        self.distributed = False
        self.encoder = encoder if isinstance(encoder, nn.Module) else build_encoder(encoder, in_channels, norm=norm)
        self.head = ProjectionHead(self.encoder.out_dim, hidden_dim=max(self.encoder.out_dim, projection_dim),
                                   out_dim=projection_dim, norm=norm)
        self.temperature = losses.Temperature(temperature, learnable=learnable_temperature)
        self.momentum = momentum
        two_view.extend_model(self, queue_size)
        self.register_load_state_dict_pre_hook(_rename_old_queue)

    def embed(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` -> ``h`` ``(N, encoder.out_dim)``."""
        return self.encoder(images)

    def loss(self, view_a: Tensor, view_b: Tensor, labels: Optional[Tensor] = None) -> Tensor:
        """Mean loss over the batch; ``view_a``/``view_b`` ``(N, C, H, W)``, row ``i`` of each
        from the same source image; ``labels`` ``(N,)`` (used by ``supcon`` only)."""
        return get_method(self.method).loss(self, (view_a, view_b), labels)


def _rename_old_queue(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    """Checkpoints written before MoCo's queue became a KeyQueue hold it as ``queue`` and
    ``queue_pointer`` (always full): read them into ``queue.keys`` / ``.pointer`` / ``.filled``."""
    old = prefix + "queue"
    if isinstance(state_dict.get(old), Tensor) and prefix + "queue_pointer" in state_dict:
        keys = state_dict.pop(old)
        state_dict[old + ".keys"] = keys
        state_dict[old + ".pointer"] = state_dict.pop(prefix + "queue_pointer")
        state_dict[old + ".filled"] = torch.tensor(keys.shape[0], dtype=torch.long)
