"""The pretraining method: one :class:`Method` object per method (registered by name in
:mod:`contrastkit.methods.registry`), and what its evaluation hooks read (:class:`EvalContext`).

A method owns everything the training loop would otherwise decide by the method's name: its
facts (default temperature, whether it reads image-text pairs, whether it takes micro-batches),
its own configuration options (:meth:`Method.complete`), the data it reads
(:meth:`Method.load_data`), how a batch is drawn (:meth:`Method.batches`: two augmented views of
images, or images and the token ids of their texts), the model it trains
(:meth:`Method.build_model`), its loss (:meth:`Method.embed` then :meth:`Method.objective`,
together :meth:`Method.loss`), the similarity matrix its batch diagnostics read
(:meth:`Method.batch_problem`) and its own evaluation (:meth:`Method.val_metrics` each
``eval_every`` epochs, :meth:`Method.readout` and :meth:`Method.test_metrics` at the end). The
linear probe and kNN read-out of the encoder, common to all methods, are not a method's: they
run wherever the data carry labels (:mod:`contrastkit.metrics.readout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from contrastkit import layout
from contrastkit.data import DataSplits, open_data

from contrastkit.metrics.batch import BatchProblem

from .accumulation import cached_gradient_loss
from .config import PretrainConfig
from .step import keeps_sample_state
from .tap import BatchTap, observe_batch

__all__ = ["Method", "EvalContext", "Batch", "across_ranks"]

#: A batch as the batch maker returns it: ``(view_a, view_b)`` or ``(images, (ids, mask))``.
Batch = Tuple[Any, Any]


@dataclass
class EvalContext:
    """What a method's evaluation hooks read during a run: the model being trained, the data
    set, the run's batch maker (``batches(split, indices) -> batch``), the device, the resolved
    configuration and the effective (global) batch size."""

    model: nn.Module
    dataset: DataSplits
    batches: Callable[[Any, Tensor], Batch]
    device: torch.device
    config: PretrainConfig
    batch_size: int


class Method:
    """One pretraining method. Stateless: the run's state lives in the model (parameters,
    MoCo's queue) and the loop; the one instance in :data:`METHOD_REGISTRY` serves every run.

    A method owns its facts (``name``, :attr:`default_temperature`, :attr:`paired`,
    :attr:`cached_gradients`, ...) and completes a run's configuration with its own options
    (:meth:`complete`); nothing else in contrastkit knows a method by name. Subclasses set
    ``name`` and ``default_temperature`` and implement :meth:`batches`, :meth:`build_model`,
    :meth:`embed` and :meth:`objective`; the other hooks have defaults. Registered with
    :func:`~contrastkit.methods.register_method`, a method is available to ``pretrain``, the
    CLI's ``--method``, studies and the Lightning module.
    """

    # -- configuration ------------------------------------------------------------------
    def complete(self, config: PretrainConfig) -> None:
        """Check and fill in, in place, the fields of ``config`` that are this method's own
        (called by :meth:`PretrainConfig.resolved() <contrastkit.methods.config.PretrainConfig.resolved>`
        before the generic defaults). By default a method takes two views of images: the
        image-text options ``weight`` and ``text_encoder`` do not apply."""
        if config.weight is not None or config.text_encoder is not None:
            raise ValueError(f"weight and text_encoder apply to the image-text methods only, not {config.method!r}")

    name: ClassVar[str]
    #: The temperature a run starts from when none is given.
    default_temperature: ClassVar[float]
    #: How tau changes over a run when no schedule is given
    #: (:func:`contrastkit.temperature.parse_schedule` form).
    default_schedule: ClassVar[str] = "constant"
    #: The size of ``z`` when ``projection_dim`` is not given.
    default_projection_dim: ClassVar[int] = 64
    #: Whether the method trains on image-text pairs (its data are
    #: :func:`~contrastkit.data.open_data` ``(..., paired=True)``, a run keeps a text tokenizer).
    paired: ClassVar[bool] = False
    #: Whether the loss needs the class labels of the batch (an unlabeled collection is refused).
    needs_labels: ClassVar[bool] = False
    #: Whether the loss has a cross-rank form (every rank's negatives) for torchrun.
    cross_rank: ClassVar[bool] = True
    #: Whether ``--micro-batch`` (cached-gradient accumulation) applies: :meth:`embed` is
    #: per-row and :meth:`objective` takes the whole batch's embeddings (its in-batch
    #: negatives). A new method opts in.
    cached_gradients: ClassVar[bool] = False
    #: Whether the method's loss is NT-Xent on two views, so that a temperature method
    #: (:class:`contrastkit.temperature_methods.TemperatureMethod`: MACL, dual, individual, network, a plug-in)
    #: can take its place; the model then holds it as ``temperature_method``, and where it
    #: keeps per-sample state the method's :meth:`objective` gets the batch's sample indices
    #: as the keyword ``indices=`` (``(N,)``, in the training split), and its
    #: :meth:`build_model` the keyword ``train_size=`` (the state's size; 0 when a checkpoint
    #: gives it).
    temperature_methods: ClassVar[bool] = False

    # -- data ---------------------------------------------------------------------------
    def load_data(self, config: PretrainConfig, *, index: Optional[str] = None,
                  collection_changed: str = "stop") -> DataSplits:
        """The data set ``config.data`` (train / val / test splits) as this method reads it:
        :func:`~contrastkit.data.open_data` (images with labels, or image-text pairs when the
        method is :attr:`paired`; streamed or held as ``data`` decides). ``index``,
        ``collection_changed``: an unlabeled collection's recorded listing and what a change
        since does (:func:`~contrastkit.data.open_data`)."""
        return open_data(config.data, seed=config.seed, workers=config.workers, paired=self.paired,
                         unlabeled=config.unlabeled, bad_files=config.bad_files, eval_data=config.eval_data,
                         index=index, collection_changed=collection_changed, **config.data_options)

    def run_tokenizer(self, dataset: DataSplits, out: str, resume: bool) -> Any:
        """The run's text tokenizer (paired methods), else ``None``."""
        return None

    def saved_tokenizer(self, run_dir: str) -> Any:
        """The tokenizer a finished run of this method saved in ``run_dir``, else ``None``."""
        return None

    def save_run_files(self, model: nn.Module, folder: layout.RunFolder) -> None:
        """Write the method's own files into the run folder (once, on rank 0)."""

    def batches(self, dataset: DataSplits, config: PretrainConfig, device: torch.device,
                tokenizer: Any = None, *, transform: Optional[Callable[[Tensor], Any]] = None
                ) -> Callable[[Any, Tensor], Batch]:
        """The batch maker: ``batches(split, indices)`` -> a training batch on ``device``.
        ``transform``: a per-image view transform made in the loader's workers (the two-view
        methods, :func:`~contrastkit.data.training_views`); a method without two views refuses it."""
        raise NotImplementedError

    # -- model and loss -----------------------------------------------------------------
    def queue_size(self, given: Optional[int], batch_size: int, train_size: int) -> Optional[int]:
        """The length of the method's queue of earlier keys for an effective batch of
        ``batch_size`` and a training set of ``train_size`` (``given``: the configured one, or
        ``None``), checked; ``None`` for a method without a queue (the default)."""
        return None

    def build_model(self, config: PretrainConfig, in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None) -> nn.Module:
        """The model at its initialisation (the caller seeds the RNG). ``encoder``: the image
        encoder to build it on, already checked (with ``out_dim``; see
        :func:`contrastkit.methods.build_model`), else the built-in ``config.encoder``."""
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

    def loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor] = None, *,
             indices: Optional[Tensor] = None, tap: Optional[BatchTap] = None) -> Tensor:
        """Mean loss over the batch: ``objective(model, embed(model, batch), labels)`` (the
        forward of one training step; MoCo also enqueues its keys afterwards). ``indices``
        ``(N,)``: the batch's sample indices in the training split, which the objective gets
        (as ``indices=``) when the model keeps per-sample state
        (:func:`~contrastkit.methods.step.keeps_sample_state`); ``tap``: the step's
        :class:`~contrastkit.methods.tap.BatchTap` (:func:`~contrastkit.methods.step.step_loss`)."""
        self._check_cross_rank(model)
        embeddings = self.embed(model, batch)
        observe_batch(self, model, embeddings, tap)
        return self._step_objective(model, embeddings, labels, indices)

    def _step_objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor],
                        indices: Optional[Tensor]) -> Tensor:
        """:meth:`objective`, with the sample indices where the model keeps per-sample state
        (only a method with :attr:`temperature_methods` has such a model: its objective takes
        ``indices=``; every other objective keeps its three arguments)."""
        if keeps_sample_state(model):
            return self.objective(model, embeddings, labels, indices=indices)  # type: ignore[call-arg]
        return self.objective(model, embeddings, labels)

    def batch_problem(self, model: nn.Module, embeddings: Tuple[Tensor, ...]) -> Optional[BatchProblem]:
        """The choice each anchor of a training batch faces, from the step's ``embeddings``
        (as :meth:`embed` returned them, detached): the similarity matrix the loss contrasts,
        the positives, and what each row and column is
        (:class:`~contrastkit.metrics.batch.BatchProblem`). The trainer's batch diagnostics and
        the report's pictures of one real batch are read from it. ``None`` (the default, for a
        method that does not say): no diagnostics."""
        return None

    def end_step(self, model: nn.Module) -> None:
        """After the optimizer's step: a temperature method updates the state it keeps
        outside the optimizer (:meth:`contrastkit.losses.AdaptiveTemperatureLoss.step_`), and the
        model's reported ``tau`` becomes the mean of the temperatures its anchors used."""
        method = getattr(model, "temperature_method", None)
        if method is not None:
            method.step_()
            floor = model.temperature.min_value
            model.temperature.set_(method.mean_temperature().clamp(min=floor))  # no host read

    def cached_gradient_loss(self, model: nn.Module, batch: Batch, labels: Optional[Tensor],
                             micro_batch: int, *, indices: Optional[Tensor] = None, tap: Optional[BatchTap] = None,
                             **precision: Any) -> Tensor:
        """The loss of one training step with its gradients accumulated in micro-batches of
        ``micro_batch`` rows (:func:`~contrastkit.methods.cached_gradient_loss`):
        the parameters' ``.grad`` are those of ``loss(model, batch, labels).backward()`` when
        no layer has batch statistics; returns the (detached) loss. ``precision``: that
        function's ``autocast`` and ``backward`` (:class:`~contrastkit.methods.precision.StepPrecision`);
        ``indices`` and ``tap`` as in :meth:`loss`."""
        self.require_cached_gradients()
        self._check_cross_rank(model)
        def objective(embeddings: Tuple[Tensor, ...]) -> Tensor:
            observe_batch(self, model, embeddings, tap)
            return self._step_objective(model, embeddings, labels, indices)

        return cached_gradient_loss(lambda part: self.embed(model, part), objective, batch, micro_batch, model=model,
                                    **precision)

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

    def readout(self, model: nn.Module, dataset: DataSplits, device: torch.device) -> Dict[str, Any]:
        """The method's own held-out numbers read from the model alone (in ``summary.json``
        and in the re-evaluation of a checkpoint, ``contrastkit probe``)."""
        return {}

    def test_metrics(self, run: EvalContext) -> Dict[str, Any]:
        """Held-out numbers that need the run's batch maker (``summary.json`` only)."""
        return {}


def across_ranks(model: nn.Module) -> Dict[str, Any]:
    """The loss options that, under torchrun, take every rank's negatives."""
    return {"distributed": True, "distributed_mode": "local"} if model.distributed else {}


