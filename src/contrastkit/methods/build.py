"""A run's data set and model built from its configuration: the one construction that
``contrastkit pretrain``, ``probe``, ``embed`` and the Lightning integration share."""

from __future__ import annotations

import copy
import inspect
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from contrastkit.data import DataSplits, is_iterable_data, limit_splits

from .config import PretrainConfig
from .registry import get_method

__all__ = ["load_data", "method_data", "limit_data", "build_model"]


def method_data(method: Any, config: PretrainConfig, *, index: Optional[str] = None,
                collection_changed: str = "stop") -> DataSplits:
    """``method.load_data(config)`` with an unlabeled collection's recorded listing (``index``)
    and what a change since does (``collection_changed``: :func:`~contrastkit.data.open_data`),
    for a method whose ``load_data`` takes them: a method of one's own that overrides
    ``load_data(self, config)`` reads its data its own way, as it did before they existed."""
    parameters = inspect.signature(method.load_data).parameters
    if "index" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return method.load_data(config, index=index, collection_changed=collection_changed)
    return method.load_data(config)


def load_data(config: PretrainConfig, *, index: Optional[str] = None, collection_changed: str = "stop") -> DataSplits:
    """The data set of ``config.data`` as ``config.method`` reads it
    (:meth:`~contrastkit.methods.Method.load_data`), cut to the configured subsets
    (:func:`limit_data`): what a finished run's read-out reads (``probe``, ``embed``, the
    report). Of a stream (:mod:`contrastkit.data.iterable`), the map-style data set its
    read-out read during training (``readout()``: ``train`` its bounded, seeded sample).
    ``index``, ``collection_changed``: an unlabeled collection's recorded listing and what a
    change since does (:func:`~contrastkit.data.open_data`)."""
    dataset = method_data(get_method(config.method), config, index=index, collection_changed=collection_changed)
    if is_iterable_data(dataset):
        return limit_splits(dataset.readout(config.workers), val=config.val_limit, test=config.test_limit, seed=config.subset_seed)
    return limit_data(dataset, config)


def limit_data(dataset: DataSplits, config: PretrainConfig) -> DataSplits:
    """``dataset`` with each split cut to ``config.train_limit`` / ``val_limit`` /
    ``test_limit`` samples, class-stratified subsets drawn with ``config.subset_seed``
    (:func:`contrastkit.data.limit_splits`)."""
    return limit_splits(dataset, train=config.train_limit, val=config.val_limit, test=config.test_limit,
                        seed=config.subset_seed)


def build_model(config: PretrainConfig, image_shape: Union[int, Sequence[int]], tokenizer: Any = None, *,
                encoder: Optional[nn.Module] = None, initial_weights: bool = True, train_size: int = 0) -> Any:
    """The model at its initialisation for ``config.seed``: the one place a run's model, its
    random-init baseline, and the model of a finished run (``probe``, ``embed``) are built.

    Args:
        config: the run's configuration; ``config.encoder`` / ``config.encoder_options`` say
            which encoder (:func:`~contrastkit.models.encoder_from_spec`).
        image_shape: the data's ``(C, H, W)`` (or only ``C``: the dry forward then assumes
            32x32, and is skipped for an encoder that declares ``out_dim``).
        tokenizer: the run's text tokenizer (convirt).
        encoder: a module to use instead of ``config.encoder`` (copied, never modified: the
            copy is trained, so the baseline built from the same module is its initialisation).
        initial_weights: read ``config.encoder_weights`` (when set) into the encoder
            (:func:`~contrastkit.models.load_encoder_weights`); ``False`` where a checkpoint's
            weights replace them anyway, so that the file is not needed.
        train_size: the training split's size, for a temperature method's per-sample state
            (methods that take temperature methods); ``0`` where a checkpoint gives the state
            its size (a finished run rebuilt without its data).

    With ``config.encoder_weights`` read, the model's ``weights_report`` attribute is the
    :class:`~contrastkit.models.WeightsReport` of what was loaded (else ``None``). The encoder
    is checked by one dry forward (:func:`~contrastkit.models.prepare_encoder`), and the projection head is built on the feature size it finds. The global RNG is left
    untouched, so the random-init baseline can be rebuilt at any time with identical weights.
    """
    from contrastkit.models import encoder_from_spec, load_encoder_weights, prepare_encoder

    shape = (int(image_shape), 32, 32) if isinstance(image_shape, int) else tuple(int(s) for s in image_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if encoder is not None:
            module, name = copy.deepcopy(encoder), f"{type(encoder).__module__}.{type(encoder).__qualname__}"
        else:
            options = dict(config.encoder_options)
            if config.norm is not None and ":" not in config.encoder:  # --norm of the built-in networks
                options.setdefault("norm", config.norm)
            module, name = encoder_from_spec(config.encoder, shape[0], options), config.encoder
        # Read before the dry forward, into the module as built: the file's keys are its own.
        report = load_encoder_weights(module, config.encoder_weights) if (
            config.encoder_weights is not None and initial_weights) else None
        if not isinstance(image_shape, int) or getattr(module, "out_dim", None) is None:
            module = prepare_encoder(module, shape, name=repr(name))
        method = get_method(config.method)
        sized = {"train_size": int(train_size)} if method.temperature_methods else {}
        model = method.build_model(config, shape[0], tokenizer, encoder=module, **sized)
    model.weights_report = report
    return model
