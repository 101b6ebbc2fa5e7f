"""A trained model's held-out numbers as a run reports them: the read-out protocol
(:mod:`contrastkit.metrics.readout`) with the baselines kept in the baseline cache
(:mod:`contrastkit.train.baselines`), then the method's own read-out; and the re-evaluation of
a run folder's checkpoint (``contrastkit probe``).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Dict, Optional

import torch
from torch import nn

from contrastkit.data import DataSplits, as_data, is_iterable_data
from contrastkit.methods import PretrainConfig, get_method, resolve_for_data
from contrastkit.data import make_views, open_data
from contrastkit.metrics.readout import evaluate_encoders, evaluate_without_labels

from .baselines import BaselineCache
from .runs import SavedRun, load_run
from .setup import limit_threads, resolve_device

__all__ = ["evaluate_model", "evaluate_run", "evaluate_on_labelled", "readout_views"]


def readout_views(config: PretrainConfig, dataset: DataSplits, device: torch.device) -> Any:
    """The view maker whose two views of each held-out image the label-free read-out matches
    (the run's augmentation at its ``view_strength``, on ``device``): the read-out at the end
    and the online view retrieval during training make the same views."""
    return make_views(dataset, mode="augment", device=device, strength=config.view_strength)


def evaluate_model(config: PretrainConfig, model: nn.Module, dataset: DataSplits, device: torch.device, *,
                   baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True) -> Dict[str, Any]:
    """The held-out numbers of a trained model: :func:`~contrastkit.metrics.readout.evaluate_encoders`
    on its encoder when the data carry labels (paired data from a CSV may not), its baselines
    kept in the run's baseline cache, then its method's own read-out
    (:meth:`~contrastkit.methods.Method.readout`: retrieval and zero-shot for convirt)."""
    result: Dict[str, Any] = {}
    if dataset.num_classes:
        baselines = BaselineCache.from_setting(config.baseline_cache).for_data(
            dataset, knn_k=config.knn_k, knn_temperature=config.knn_temperature, device=device,
            workers=config.workers)
        result = evaluate_encoders(dataset, model.encoder, device, baseline_encoder=baseline_encoder,
                                   raw_pixels=raw_pixels, knn_k=config.knn_k, knn_temperature=config.knn_temperature,
                                   workers=config.workers, baselines=baselines)
    elif not get_method(config.method).paired:  # images without labels
        views = readout_views(config, dataset, device)
        # the run's (config.json records it); only a configuration never fitted to its data asks
        # the data (not every time: a stream's read-out sample is not the split the queue was checked on)
        batch_size = config.batch_size if config.batch_size is not None else \
            resolve_for_data(config, len(dataset.train))[1].batch_size
        result = evaluate_without_labels(dataset.test, model.encoder, device, views,
                                         temperature=float(model.temperature.value), batch_size=batch_size,
                                         baseline_encoder=baseline_encoder, raw_pixels=raw_pixels, seed=config.seed,
                                         workers=config.workers)
        if config.eval_data is not None:
            result.update(evaluate_on_labelled(config, model.encoder, dataset.image_shape, device,
                                               baseline_encoder=baseline_encoder, raw_pixels=raw_pixels))
    result.update(get_method(config.method).readout(model, dataset, device))
    return result


def evaluate_on_labelled(config: PretrainConfig, encoder: nn.Module, image_shape: Any, device: torch.device, *,
                         baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True) -> Dict[str, Any]:
    """The probe and kNN read-out of ``encoder`` (trained on unlabeled images) on the labelled
    data set ``config.eval_data``, read at the training images' size and colour: train on
    unlabeled data, judge on a labelled set."""
    channels, height, width = (int(v) for v in image_shape)
    options: Dict[str, Any] = {"size": height if height == width else (height, width)}
    if os.path.exists(config.eval_data) and os.path.isdir(config.eval_data):
        options["color"] = "L" if channels == 1 else "RGB"
    labelled = open_data(config.eval_data, seed=config.seed, workers=config.workers, **options)
    if is_iterable_data(labelled):  # a stream (tar shards): its read-out sample, val and test, map-style
        labelled = labelled.readout(config.workers)
    if not labelled.num_classes:
        raise ValueError(f"eval_data {config.eval_data!r} holds no class labels: give class folders or another "
                         "labelled data set")
    if tuple(labelled.image_shape) != (channels, height, width):
        raise ValueError(f"eval_data {config.eval_data!r} has {'x'.join(map(str, labelled.image_shape))} images; the "
                         f"encoder was trained on {channels}x{height}x{width} (class folders are read at the training "
                         "images' size and colour: give those)")
    baselines = BaselineCache.from_setting(config.baseline_cache).for_data(
        labelled, knn_k=config.knn_k, knn_temperature=config.knn_temperature, device=device, workers=config.workers)
    numbers = evaluate_encoders(labelled, encoder, device, baseline_encoder=baseline_encoder, raw_pixels=raw_pixels,
                                knn_k=config.knn_k, knn_temperature=config.knn_temperature, workers=config.workers,
                                baselines=baselines)
    return {**numbers, "eval_data": labelled.name, "eval_data_sizes": {name: len(split) for name, split in
                                                                        labelled.splits()}}


def evaluate_run(run_dir: str, *, checkpoint: Optional[str] = None, device: str = "auto",
                 baselines: bool = True, threads: Optional[int] = None, encoder: Optional[nn.Module] = None,
                 dataset: Any = None, baseline_cache: Optional[str] = None,
                 collection_changed: str = "stop") -> Dict[str, Any]:
    """Re-evaluate the checkpoint of a finished or interrupted run (``contrastkit probe``);
    ``threads`` and ``baseline_cache`` (``"auto"``, ``"off"`` or a folder) default to the run's
    settings.

    The encoder is rebuilt from the run's ``encoder`` and ``encoder_options``
    (:func:`contrastkit.methods.build_model`); a run given its encoder as a Python object
    whose class cannot be rebuilt with no arguments needs it again as ``encoder`` (its
    architecture; the weights come from the checkpoint). A run given its data set as an
    object needs it again as ``dataset``. ``collection_changed``: what the run's unlabeled
    collection does when its files changed since the run recorded its listing (``"stop"``,
    ``"reindex"``, ``"keep"``: :meth:`~contrastkit.train.runs.SavedRun.load_data`)."""
    saved = load_run(run_dir, checkpoint=checkpoint)
    if baseline_cache is not None:
        saved = replace(saved, config=replace(saved.config, baseline_cache=baseline_cache).resolved())
    with limit_threads(saved.config.threads if threads is None else threads):
        return _evaluate_state(saved, device, baselines, encoder, dataset, collection_changed)


def _evaluate_state(saved: SavedRun, device: str, baselines: bool, encoder: Optional[nn.Module] = None,
                    dataset: Any = None, collection_changed: str = "stop") -> Dict[str, Any]:
    started = time.perf_counter()
    config, state = saved.config, saved.state
    torch_device = resolve_device(device)
    dataset = saved.load_data(collection_changed=collection_changed) if dataset is None else as_data(dataset)
    model = saved.build_model(dataset.image_shape, torch_device, encoder)
    baseline = saved.build_untrained(dataset.image_shape, encoder).encoder.to(torch_device) if baselines else None
    result = evaluate_model(config, model, dataset, torch_device, baseline_encoder=baseline, raw_pixels=baselines)
    result.update({"checkpoint": os.path.abspath(saved.checkpoint), "epochs": int(state["epoch"]),
                   "step": int(state["step"]), "data": config.data, "method": config.method,
                   "encoder": config.encoder, "seconds": time.perf_counter() - started})
    return result
