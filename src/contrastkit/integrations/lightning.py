"""Contrastive pretraining as a Lightning module: :class:`ContrastiveModule` and :class:`ContrastiveDataModule`.

:class:`ContrastiveModule` is a ``lightning.LightningModule`` made of the pieces ``contrastkit
pretrain`` trains with, from the same :class:`~contrastkit.methods.PretrainConfig`:

* the model of :func:`contrastkit.methods.build_model`: the encoder (a built-in name, a
  ``package.module:factory`` spec, or any ``nn.Module`` mapping ``(N, C, H, W)`` to
  ``(N, D)``), the projection head on its feature size, and the temperature
  (:class:`~contrastkit.losses.Temperature`);
* the method's loss (:class:`~contrastkit.methods.Method` of
  :func:`~contrastkit.methods.get_method`: ``simclr``, ``moco``, ``supcon``, ``dcl``,
  ``simple``, ``hard_negative``), or any loss of :mod:`contrastkit.losses` on the two views'
  embeddings (``loss=``);
* the optimizer and learning-rate schedule (:func:`~contrastkit.methods.build_optimizer`,
  :func:`~contrastkit.methods.build_lr_scheduler`: AdamW or SGD, linear warm-up then cosine,
  stepped every optimizer step over the trainer's ``estimated_stepping_batches``);
* the training step of :mod:`contrastkit.methods.step`, as ``contrastkit pretrain`` runs it:
  the temperature schedule (``config.temperature_schedule``) before each step, the loss with
  the batch's sample indices (the per-sample state of the temperature methods ``individual``
  and ``network``), and after each optimizer step :meth:`Temperature.clamp_
  <contrastkit.losses.Temperature.clamp_>` and a temperature method's own update;
* the views of :func:`contrastkit.data.make_views` (mode ``"augment"``, batched kornia on the
  module's device) made from the images the data loader yields;
* ``config.channels_last``: the model and the views in the channels-last memory format.

Mixed precision is the trainer's (``lightning.Trainer(precision="bf16-mixed")`` or
``"16-mixed"``, which run autocast and, for float16, the gradient scaler), as the device is: a
config that asks for ``precision="bf16"`` or ``"fp16"`` is refused under a trainer that does not
run that precision, and under ``"fp16"`` the optimizer is the fused one
(:func:`~contrastkit.methods.build_optimizer`). ``config.data_on_device`` is
``contrastkit pretrain``'s: here the data module's loader brings the images (``"on"`` is refused).

Under a data-parallel strategy with more than one process (``strategy="ddp"``, its spawn and
fork variants) the loss gets ``distributed=True``: every rank's anchors are contrasted with
the negatives of all ranks through gradient-exact gathers, and with DDP's averaging of the
gradients a step is exactly a step on the global batch (when no layer has batch statistics:
``norm="group"``, or an encoder without BatchNorm).

:class:`ContrastiveDataModule` gives the loaders over a contrastkit data set (or a map-style
``torch.utils.data.Dataset`` of ``(image, label)``): training batches of ``(images, labels,
indices)`` (the sample indices in the training split), the others ``(images, labels)``, the
configured batch size being the global batch.

Lightning is an optional extra (``pip install 'contrastkit[lightning]'``); nothing else in
contrastkit imports it.

Example::

    import lightning
    from contrastkit.methods import PretrainConfig
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule

    config = PretrainConfig(data="digits", method="simclr", batch_size=128, norm="group")
    data = ContrastiveDataModule.from_config(config)
    module = ContrastiveModule(config, data)
    lightning.Trainer(max_epochs=10, accelerator="cpu", devices=2, strategy="ddp").fit(module, data)
    features = module.embed(images)            # h, (N, D)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

try:
    import lightning
except ImportError as err:  # the optional extra; re-raised with what to install
    raise ImportError("contrastkit.integrations.lightning needs Lightning, which is not installed: "
                      "pip install 'contrastkit[lightning]'") from err

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from contrastkit.data import unit_float
from contrastkit.data.loader import ignore_stop_signals
from contrastkit.data import (SkippingItems, add_skipped, as_data, check_indexed, check_positive_int, collate_skipping,
                              item_dataset, reads_files, record_damaged, skipped_files, skipped_reasons, skips_bad_files)
from contrastkit import layout
from contrastkit.distributed import rank_seed
from contrastkit.run_writer import RunWriter
from contrastkit.methods import (MoCo, PretrainConfig, TwoViewMethod, build_lr_scheduler, build_model, build_optimizer,
                                 channels_last_batch, default_batch_size, get_method, limit_data, resolve_for_data)
from contrastkit.methods.step import after_optimizer_step, before_loss, keeps_sample_state, step_loss

__all__ = ["ContrastiveModule", "ContrastiveDataModule"]

#: The trainer precisions that run a config's ``precision`` (Lightning's ``Trainer(precision=...)``).
_TRAINER_PRECISIONS = {"bf16": ("bf16-mixed",), "fp16": ("16-mixed",)}

#: A loss on the two views' embeddings: ``loss(z_a, z_b, **keywords) -> Tensor``.
LossFunction = Callable[..., Tensor]



def _data_set(data: Any) -> Any:
    """The contrastkit data set of ``data`` (a :class:`ContrastiveDataModule` or a data set)."""
    if isinstance(data, ContrastiveDataModule):
        return data.dataset
    if all(hasattr(data, name) for name in ("train", "val", "test", "image_shape")):
        return data
    raise TypeError(f"data must be a ContrastiveDataModule or a contrastkit data set, got {type(data).__name__} "
                    "(a torch.utils.data.Dataset of (image, label): pass ContrastiveDataModule(dataset))")


#: The keywords a ``loss=`` callable may get, those it takes (:func:`_loss_keywords`).
_LOSS_KEYWORDS = frozenset({"temperature", "labels", "distributed", "distributed_mode"})


def _loss_keywords(loss: Callable[..., Any]) -> frozenset:
    """The keywords of :data:`_LOSS_KEYWORDS` that ``loss`` takes: those its signature (an
    ``nn.Module``'s ``forward``) names (contrastkit's loss modules name ``distributed`` and
    ``distributed_mode`` where they have them, never ``temperature``: they keep their own); a
    function or module taking ``**kwargs`` gets all of them, a module the distributed ones only."""
    try:
        parameters = list(inspect.signature(loss.forward if isinstance(loss, nn.Module) else loss).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): pass nothing extra
        return frozenset()
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        names |= {"distributed", "distributed_mode"} if isinstance(loss, nn.Module) else _LOSS_KEYWORDS
    return frozenset(names & _LOSS_KEYWORDS)


class ContrastiveModule(lightning.LightningModule):
    """Contrastive pretraining of ``config.method`` as a ``lightning.LightningModule``.

    Args:
        config: the run's :class:`~contrastkit.methods.PretrainConfig` (or its dict, as the
            checkpoint's hyper-parameters hold it). What applies here: ``method``,
            ``encoder`` / ``encoder_options`` / ``norm``, ``projection_dim``, ``temperature``,
            ``learnable_temperature``, ``temperature_schedule``, ``temperature_method``, ``optimizer``, ``lr``,
            ``weight_decay``, ``warmup_fraction``, ``momentum`` / ``queue_size`` (MoCo; the
            queue is a multiple of ``batch_size``, the global batch), ``views`` (``"augment"``
            only) / ``view_strength``, and ``seed`` (the initial weights). The trainer decides
            the number of steps (``max_steps`` / ``max_epochs``), the device and the
            processes; the data module the batches. ``online_probe`` is ``contrastkit
            pretrain``'s (:mod:`contrastkit.train.online`): the module trains no online probe and
            logs no online numbers, whatever it says (a Lightning callback of the user's reads
            :attr:`encoder`).
        data: the :class:`ContrastiveDataModule` (or the contrastkit data set) the module
            trains on: its image shape sizes the model, its kind sets the views' defaults.
        encoder: a built-in name or ``"package.module:factory"`` spec replacing
            ``config.encoder``, or any ``nn.Module`` mapping ``(N, C, H, W)`` to ``(N, D)`` or
            ``(N, D, ...)`` (pooled). A module is copied
            (:func:`contrastkit.methods.build_model`): the trained one is :attr:`encoder`.
        loss: replaces the method's loss with ``loss(z_a, z_b, **keywords)`` on the two views'
            projections ``(N, d)`` (row ``i`` of each from image ``i``), e.g.
            :func:`contrastkit.losses.debiased_nt_xent` or
            ``functools.partial(contrastkit.losses.hard_negative_nt_xent, top_k=8)``, or an
            ``nn.Module`` loss such as ``contrastkit.losses.DCL(temperature=0.2)`` (its
            parameters are trained too; it keeps its own temperature). Of the keywords
            ``temperature`` (the model's :class:`~contrastkit.losses.Temperature`, which the
            temperature schedule drives), ``labels`` (``(N,)``), ``distributed`` and
            ``distributed_mode`` it gets those it takes; under a multi-process strategy it
            must take ``distributed``. Not with ``moco``, whose loss reads its queue.

    Batches are ``(images, labels, indices)``, ``(images, labels)`` or images alone,
    ``images`` ``(N, C, H, W)`` uint8 or float in ``[0, 1]``, ``indices`` ``(N,)`` the sample
    indices in the training split (:class:`ContrastiveDataModule`'s training batches carry
    them; the temperature methods ``individual`` and ``network`` need them, and a training
    batch without them is refused naming the schedule). Each step makes two views of the
    images, logs ``loss``, ``tau`` and ``lr`` (``self.log``; ``val_loss`` in validation) and
    returns the mean loss.
    """

    def __init__(self, config: Union[PretrainConfig, Mapping[str, Any]], data: Any, *,
                 encoder: Union[str, nn.Module, None] = None, loss: Optional[LossFunction] = None) -> None:
        super().__init__()
        if isinstance(config, Mapping):
            config = PretrainConfig.from_dict(dict(config))
        if not isinstance(config, PretrainConfig):
            raise TypeError(f"config must be a PretrainConfig or its dict, got {type(config).__name__}")
        if isinstance(encoder, str):
            config = dataclasses.replace(config, encoder=encoder)
        elif encoder is not None and not isinstance(encoder, nn.Module):
            raise TypeError(f"encoder must be a built-in name, a 'package.module:factory' spec or a torch.nn.Module, "
                            f"got {type(encoder).__name__}")
        if config.batch_size is None and isinstance(data, ContrastiveDataModule):
            config = dataclasses.replace(config, batch_size=data.batch_size)  # the batch it trains at
        config = config.resolved()
        method = get_method(config.method)
        if not isinstance(method, TwoViewMethod):
            raise ValueError(f"ContrastiveModule trains the two-view methods; method {config.method!r} trains on "
                             "image-text pairs: use contrastkit pretrain")
        if config.views != "augment":
            raise ValueError(f"ContrastiveModule makes its views from the loader's images (views 'augment'); views "
                             f"{config.views!r} needs GlyphLab's noise realisations: use contrastkit pretrain")
        if config.micro_batch is not None:
            raise ValueError("micro_batch (cached-gradient accumulation) is not available in ContrastiveModule; "
                             "use contrastkit pretrain --micro-batch, or Lightning's accumulate_grad_batches")
        if config.data_on_device == "on":
            raise ValueError("data_on_device='on' is contrastkit pretrain's: under Lightning the data module's loader "
                             "brings the images (leave it 'auto' or 'off')")
        if loss is not None:
            if not callable(loss):
                raise TypeError(f"loss must be callable as loss(z_a, z_b, **keywords), got {type(loss).__name__}")
            if isinstance(method, MoCo):
                raise ValueError("loss= replaces a two-view loss; moco's loss is the InfoNCE of its key queue")
            if config.temperature_method is not None:
                raise ValueError(f"loss= replaces the method's loss; temperature_method "
                                 f"{config.temperature_method!r} is that loss: pass one or the other")
        dataset = _data_set(data)
        config, choices = resolve_for_data(config, len(dataset.train))  # the batch and the queue, as pretrain's
        if isinstance(encoder, nn.Module):
            from contrastkit.models import describe_encoder

            config = dataclasses.replace(config, encoder=describe_encoder(encoder, dataset.image_shape[0]))  # as pretrain records it
        self.config = config
        self._schedule = config.schedule  # the temperature schedule of the resolved fields, made once
        self.method = method
        self.dataset = dataset
        self.model = build_model(config, dataset.image_shape, encoder=encoder if isinstance(encoder, nn.Module) else None,
                                 train_size=choices.train_size)
        self.loss_function = loss  # an nn.Module loss is registered as a submodule (trained, moved)
        self._loss_keywords = _loss_keywords(loss) if loss is not None else frozenset()
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self._views: Any = None
        self._total_steps: Optional[int] = None
        self._skip_batch = False          # this training batch is skipped on every rank
        self._trained_since_step = False  # a batch since the last optimizer step reached the loss
        self.save_hyperparameters({"config": config.to_dict()})

    # -- the pieces -----------------------------------------------------------------------
    @property
    def encoder(self) -> nn.Module:
        """The encoder being trained (``h = encoder(images)``)."""
        return self.model.encoder

    @property
    def temperature(self) -> float:
        """The current ``tau``."""
        return self.model.temperature.value

    @property
    def distributed(self) -> bool:
        """Whether the loss takes every rank's negatives (set when the trainer is set up)."""
        return bool(self.model.distributed)

    def embed(self, images: Tensor) -> Tensor:
        """``h`` ``(N, D)`` of images ``(N, C, H, W)``, uint8 or float in ``[0, 1]`` (in the
        module's current mode: ``eval()`` for features)."""
        return self.model.embed(unit_float(images.to(self.device)))

    def views(self, images: Tensor) -> Tuple[Tensor, Tensor]:
        """Two views ``(N, C, H, W)`` float32 on the module's device of a batch of images
        (:meth:`contrastkit.data.ViewMaker.views_of`)."""
        if self._views is None or self._views.device != self.device:
            from contrastkit.data import make_views

            self._views = make_views(self.dataset, mode=self.config.views, device=self.device,
                                     strength=self.config.view_strength)
        return self._views.views_of(images)

    def loss(self, images: Tensor, labels: Optional[Tensor] = None, indices: Optional[Tensor] = None) -> Tensor:
        """The mean loss of a batch of images: their two views, embedded, through the method's
        loss (:func:`contrastkit.methods.step.step_loss`, or ``loss=``); ``labels`` ``(N,)``
        (supcon's positives), ``indices`` ``(N,)`` the images' indices in the training split
        (a training step of a per-sample temperature method)."""
        batch = self.views(images)
        if self.config.channels_last:
            batch = channels_last_batch(batch)
        if self.loss_function is None:
            indices = None if indices is None else indices.to(self.device, non_blocking=True)
            return step_loss(self.method, self.model, batch, labels, indices=indices)
        z_a, z_b = self.method.embed(self.model, batch)
        return self.loss_function(z_a, z_b, **self._keywords_for(labels))

    def _keywords_for(self, labels: Optional[Tensor]) -> Dict[str, Any]:
        offered: Dict[str, Any] = {"temperature": self.model.temperature, "labels": labels}
        if self.model.distributed:  # this rank's anchors against every rank's candidates
            offered.update(distributed=True, distributed_mode="local")
        return {key: value for key, value in offered.items() if key in self._loss_keywords}

    # -- Lightning hooks -------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Under more than one process, the loss takes every rank's negatives; a config's mixed
        precision must be the trainer's (bf16: ``"bf16-mixed"``, fp16: ``"16-mixed"``)."""
        wanted = _TRAINER_PRECISIONS.get(self.config.precision)
        running = str(getattr(self.trainer, "precision", ""))
        if wanted is not None and running not in wanted:
            raise ValueError(f"config.precision {self.config.precision!r} asks for mixed precision, but the trainer "
                             f"runs precision={running!r}: pass lightning.Trainer(precision={wanted[0]!r}) (Lightning "
                             "runs autocast and the gradient scaler)")
        world_size = self.trainer.world_size
        distributed = world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and self.loss_function is not None:
            if "distributed" not in self._loss_keywords:
                raise ValueError(f"loss {getattr(self.loss_function, '__name__', type(self.loss_function).__name__)} "
                                 f"takes no distributed= argument: under {world_size} processes its negatives would be "
                                 "this rank's only; pass a loss of contrastkit.losses that takes it")
        self.model.distributed = distributed

    def on_train_start(self) -> None:
        # Each rank draws its own views (the ranks were seeded alike, e.g. by seed_everything).
        if self.model.distributed:
            torch.manual_seed(rank_seed(torch.initial_seed(), self.global_rank))

    def configure_optimizers(self) -> Dict[str, Any]:
        """:func:`~contrastkit.methods.build_optimizer` and the per-step
        :func:`~contrastkit.methods.build_lr_scheduler` over the trainer's optimizer steps."""
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total < 1:
            raise ValueError(f"the trainer runs {total} optimizer steps; give it max_steps or max_epochs so that the "
                             "learning-rate and temperature schedules have an end")
        self._total_steps = int(total)
        optimizer = build_optimizer(self, self.config)
        scheduler = build_lr_scheduler(optimizer, self.config, self._total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # A varying temperature schedule sets this step's tau (constant and learnable ones: no-op).
        before_loss(self.model, self._schedule, self.global_step, self._total_steps or 1)
        # Decided here, before the step's closure runs, on every rank alike.
        self._skip_batch = not self._every_rank_has_a_batch(_unpack(batch)[0])

    def _every_rank_has_a_batch(self, images: Tensor) -> bool:
        """Whether this batch, and under several processes every rank's batch, holds at least
        2 readable images (damaged files skipped by the collate may leave fewer). One
        all-reduce of a flag per batch: a rank that skipped its step alone would leave the
        others waiting in the loss's gathers and DDP's gradient all-reduce."""
        short = images.shape[0] < 2
        if self.model.distributed:
            flag = torch.tensor([float(short)], device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            short = bool(flag.item())
        return not short

    def _zero_weight_loss(self) -> Tensor:
        """A loss of 0 through every trained parameter: a skipped batch's step under DDP, whose
        backward pass gives every rank's reducer its zero gradients (Lightning refuses a
        ``None`` step under several processes)."""
        return sum((p.sum() * 0.0 for p in self.parameters() if p.requires_grad), torch.zeros((), device=self.device))

    def training_step(self, batch: Any, batch_idx: int) -> Optional[Tensor]:
        images, labels, indices = _unpack(batch)
        if indices is None and keeps_sample_state(self.model):
            raise ValueError(f"temperature_method {self.config.temperature_method!r} keeps one state per "
                             "training sample: the training loader must yield (images, labels, indices), the "
                             "indices in the training split, as ContrastiveDataModule's does")
        if self._skip_batch or images.shape[0] < 2:  # damaged files skipped left no negatives
            # One process: no step (Lightning skips None). Several: every rank skips together
            # (:meth:`on_train_batch_start`); the update is dropped in on_before_optimizer_step.
            return self._zero_weight_loss() if self.model.distributed else None
        self._trained_since_step = True
        loss = self.loss(images, labels, indices)
        rows = images.shape[0]
        self.log("loss", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=rows)
        self.log("tau", self.model.temperature().detach(), on_step=True, on_epoch=False, prog_bar=True,
                 batch_size=rows)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False,
                 batch_size=rows)
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Drop the update of a step none of whose batches reached the loss (skipped on every
        rank, its gradients the zero ones of a zero loss): without gradients the
        optimizer leaves the weights and its own state alone, as for a skipped step in one
        process (a momentum or weight decay would otherwise still move the weights)."""
        if not self._trained_since_step:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None
        self._trained_since_step = False

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Optional[Callable[[], Any]] = None) -> None:
        """The optimizer's step, then :func:`contrastkit.methods.step.after_optimizer_step`:
        :meth:`Temperature.clamp_ <contrastkit.losses.Temperature.clamp_>` (CLIP: a learnable
        tau's parameter stays at or below its cap) and a temperature method's own update
        (iSogCLR's per-sample temperatures, the moving estimates)."""
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        after_optimizer_step(self.method, self.model)

    def validation_step(self, batch: Any, batch_idx: int) -> Optional[Tensor]:
        images, labels, _ = _unpack(batch)
        if not self._every_rank_has_a_batch(images):  # skipped on every rank together (the loss gathers)
            return None
        loss = self.loss(images, labels)
        self.log("val_loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True,
                 batch_size=images.shape[0])
        return loss

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """``h`` of the batch's images (``trainer.predict``)."""
        return self.embed(_unpack(batch)[0])


def _unpack(batch: Any) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """``(images, labels, indices)`` of a batch of ``(images, labels, indices)``, ``(images,
    labels)`` or images alone (what is missing ``None``)."""
    if isinstance(batch, Tensor):
        return batch, None, None
    if isinstance(batch, (tuple, list)) and len(batch) >= 1 and isinstance(batch[0], Tensor):
        labels, indices = (list(batch[1:3]) + [None, None])[:2]
        return (batch[0], labels if isinstance(labels, Tensor) else None,
                indices if isinstance(indices, Tensor) else None)
    raise TypeError(f"a batch must be images, (images, labels) or (images, labels, indices) tensors, "
                    f"got {type(batch).__name__}")


class ContrastiveDataModule(lightning.LightningDataModule):
    """Loaders over the splits of a data set: training batches ``(images, labels, indices)``
    (``indices`` ``(B,)`` int64, the items' indices in the training split, the same under any
    number of processes), the others ``(images, labels)``.

    Args:
        dataset: a contrastkit data set (:func:`contrastkit.data.load_dataset`, a streamed
            image folder), a map-style ``torch.utils.data.Dataset`` of ``(image, label)`` or a
            dict of them with the key ``train`` (and ``val``, ``test``): see
            :func:`contrastkit.data.as_data`.
        batch_size: the global batch: each of the trainer's processes loads
            ``batch_size / world_size`` images per step (it must divide); the last partial
            batch is dropped, as in ``contrastkit pretrain``. ``None``: sized to the training
            split as ``contrastkit pretrain`` sizes it
            (:func:`contrastkit.methods.default_batch_size`: 60 up to 2,047 images, growing
            to 256 from 8,192).
        workers: ``DataLoader`` worker processes (persistent), decoding streamed images.
        shuffle: shuffle the training split each epoch.
        seed: the seed of the shuffle (with the epoch: ``DistributedSampler``'s order).

    The val loader holds the val split (``val_loss``); :meth:`test_dataloader` and
    :meth:`predict_dataloader` the test split, in order.

    Damaged image files of an unlabeled collection opened with ``bad_files="skip"`` (its
    default; :func:`contrastkit.data.open_data`) are left out of their batch, as ``contrastkit
    pretrain`` leaves them out, never stopping the run: :meth:`skipped_files` names each (file
    and reason, one ``path<TAB>reason`` line), and when a stage ends with any, rank 0 writes them
    to ``skipped.txt`` in the trainer's ``log_dir`` (listed in that folder's
    ``contrastkit-manifest.json``; a ``skipped.txt`` of the user's is never replaced) and warns
    with the count. Under several processes each rank meets its own share; the list holds all.
    A batch left with fewer than 2 readable images is skipped by :class:`ContrastiveModule`; under
    several processes, when any rank's batch is, every rank skips that step (no update).
    """

    def __init__(self, dataset: Any, *, batch_size: Optional[int] = None, workers: int = 0, shuffle: bool = True,
                 seed: int = 0) -> None:
        super().__init__()
        if batch_size is not None:
            check_positive_int(batch_size, "batch_size", 2)  # a contrastive batch needs negatives
        check_positive_int(workers, "workers", 0)
        self.dataset = as_data(dataset)
        check_indexed(self.dataset, "ContrastiveDataModule")  # a stream trains with contrastkit pretrain
        if hasattr(self.dataset.train, "texts"):
            raise ValueError("ContrastiveDataModule loads images with labels; image-text pairs train with "
                             "contrastkit pretrain")
        if batch_size is None:
            batch_size = default_batch_size(len(self.dataset.train))[0]
        self.batch_size, self.workers, self.shuffle, self.seed = batch_size, workers, bool(shuffle), int(seed)

    @classmethod
    def from_config(cls, config: PretrainConfig, *, shuffle: bool = True) -> "ContrastiveDataModule":
        """``config.data`` loaded as ``contrastkit pretrain`` loads it (its data options and
        subsets, :func:`contrastkit.methods.load_data`), with ``config.batch_size`` (``None``:
        sized to the training split, :func:`~contrastkit.methods.resolve_for_data`),
        ``config.workers`` and ``config.seed``."""
        config = config.resolved()
        opened = get_method(config.method).load_data(config)
        check_indexed(opened, "ContrastiveDataModule")  # (load_data would give a stream's read-out sample)
        dataset = limit_data(opened, config)
        choices = resolve_for_data(config, len(dataset.train))[1]
        return cls(dataset, batch_size=choices.batch_size, workers=config.workers, shuffle=shuffle, seed=config.seed)

    def _rank_batch(self, split: Any, what: str) -> int:
        """This process's batch: its share of the global batch, at most its share of ``split``."""
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.batch_size % world:
            raise ValueError(f"the batch size {self.batch_size} must be a multiple of the number of processes ({world})")
        batch = min(self.batch_size // world, len(split) // world)
        if batch < 2:
            raise ValueError(f"the {what} split of {len(split)} images gives each of {world} process(es) fewer than "
                             "2 images: a contrastive batch needs negatives")
        return batch

    def _loader(self, name: str, batch: int, *, sampler: Any = None, drop_last: bool = False,
                with_index: bool = False) -> DataLoader:
        split = getattr(self.dataset, name)
        on_cuda = self.trainer is not None and getattr(self.trainer.strategy.root_device, "type", "cpu") == "cuda"
        items, skipping = item_dataset(split, with_index=with_index), {}
        if skips_bad_files(split):  # damaged files leave their batch (recorded in on_before_batch_transfer)
            collate = functools.partial(collate_skipping, fields=3 if with_index else 2)
            items, skipping = SkippingItems(items, name), {"collate_fn": collate}
        return DataLoader(items, batch_size=batch, sampler=sampler, drop_last=drop_last,
                          num_workers=self.workers, persistent_workers=self.workers > 0,
                          pin_memory=on_cuda and reads_files(split), worker_init_fn=ignore_stop_signals, **skipping)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch of a collection that skips damaged files: its damaged items recorded (in this
        process, whatever worker met them), the batch without them (``(images, labels)``, with
        the ``indices`` in training)."""
        if isinstance(batch, (tuple, list)) and len(batch) in (3, 4) and isinstance(batch[-1], list):
            record_damaged({name: split for name, split in self.dataset.splits()}, batch[-1])
            return tuple(batch[:-1])
        return batch

    def skipped_files(self) -> List[str]:
        """``path<TAB>reason`` of every damaged file skipped so far (all ranks' after a stage ends)."""
        return skipped_files(self.dataset)

    def teardown(self, stage: str) -> None:
        """Gather the damaged files every rank skipped; rank 0 writes and reports them."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            found: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(found, skipped_reasons(self.dataset))
            for other in found:
                add_skipped(self.dataset, other)
        skipped = self.skipped_files()  # the same on every rank now
        if not skipped:
            return
        folder = self.trainer.log_dir if self.trainer is not None else None  # a broadcast: every rank asks
        if self.trainer is not None and self.trainer.global_rank != 0:
            return
        folder = folder or os.getcwd()
        where = RunWriter(folder).write_skipped(skipped)
        warnings.warn(f"skipped {len(skipped)} damaged image file(s); " + (
            f"they are named in {where}" if where else
            f"{os.path.join(folder, layout.SKIPPED)} is not contrastkit's, so not replaced: "
            + "; ".join(line.split("\t")[0] for line in skipped)), stacklevel=2)

    def train_dataloader(self) -> DataLoader:
        """This process's batches ``(images, labels, indices)`` of the training split. The
        sampler is a ``DistributedSampler`` over the trainer's processes (one of one in a single
        process; Lightning sets its epoch), so that the global batches of an epoch -- this
        rank's rows interleaved with the others' -- are the same for any number of processes;
        ``indices`` are the items' indices in the whole training split, whichever rank loads them."""
        from torch.utils.data import DistributedSampler

        split = self.dataset.train
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        sampler = DistributedSampler(range(len(split)), num_replicas=world, rank=rank, shuffle=self.shuffle,
                                     seed=self.seed, drop_last=True)
        return self._loader("train", self._rank_batch(split, "train"), sampler=sampler, drop_last=True,
                            with_index=True)

    def val_dataloader(self) -> DataLoader:
        # Full batches only: a val batch is a contrastive batch too.
        return self._loader("val", self._rank_batch(self.dataset.val, "val"), drop_last=True)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", min(self.batch_size, len(self.dataset.test)))

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()
