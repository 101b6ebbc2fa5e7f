"""The fixed read-out protocol applied to encoders: frozen ``h`` features of the un-augmented
train / val / test images -> linear probe and weighted kNN (:mod:`contrastkit.metrics`).

Baselines evaluated the same way: the same architecture at its random initialisation (same
seed) and the raw pixels. They do not depend on the training run, so each is computed once per
data set and protocol and read back from the baseline cache afterwards
(:mod:`contrastkit.train.baselines`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import torch
from torch import nn

from contrastkit import layout
from contrastkit._io import read_json
from contrastkit.data.streaming import in_memory, make_loader, unit_float
from contrastkit.metrics import knn_accuracy, linear_probe

from .baselines import BaselineCache, data_digest, encoder_digest, readout_protocol
from .checkpoint import load_checkpoint
from .config import PretrainConfig
from .methods import get_method
from .setup import as_run_data, build_model, limit_threads, load_data, resolve_device

__all__ = ["extract_features", "evaluate_features", "evaluate_encoders", "evaluate_model", "evaluate_run",
           "split_images", "image_batches", "SavedRun", "load_run"]


def split_images(split: Any) -> Any:
    """What :func:`extract_features` reads of a split: an in-memory split's ``images`` tensor,
    or the streamed split itself (read in batches)."""
    return split.images if in_memory(split) else split


def image_batches(images: Any, batch_size: int = 256, workers: int = 0) -> Iterator[torch.Tensor]:
    """Consecutive batches of ``images`` (what :func:`split_images` returns), in order, the
    last one partial: ``(b, C, H, W)`` float in ``[0, 1]``, slices of an in-memory tensor or a
    streamed split's items decoded ``batch_size`` at a time in ``workers`` processes (never the
    whole split at once). The one way the read-out and ``contrastkit embed`` read a split."""
    if isinstance(images, torch.Tensor):
        for i in range(0, images.shape[0], batch_size):
            yield images[i:i + batch_size]
        return
    for batch, _ in make_loader(images, batch_size=batch_size, workers=workers):
        yield unit_float(batch)


@torch.no_grad()
def extract_features(encoder: nn.Module, images: Any, device: torch.device, batch_size: int = 256, *,
                     workers: int = 0) -> np.ndarray:
    """``h`` of ``images`` in eval mode (BatchNorm uses running statistics): ``(n, d)`` float32
    (the precision the read-out computes in).

    ``images`` is an ``(n, C, H, W)`` float tensor in ``[0, 1]`` or a streamed split (a
    map-style data set of ``(image, label)``, uint8 images scaled to ``[0, 1]``), read in
    batches of ``batch_size`` (decoded in ``workers`` processes). The encoder's train/eval mode
    is restored afterwards."""
    was_training = encoder.training
    encoder.eval()
    try:
        chunks = [encoder(batch.to(device)).float().cpu() for batch in image_batches(images, batch_size, workers)]
    finally:
        encoder.train(was_training)
    return torch.cat(chunks).numpy()


def _pixels(split: Any, workers: int) -> np.ndarray:
    """The raw-pixel baseline's features of a split: its images flattened, float32."""
    if in_memory(split):
        return split.images.reshape(split.images.shape[0], -1).float().cpu().numpy()
    return extract_features(nn.Flatten(), split, torch.device("cpu"), workers=workers)


def evaluate_features(train_x: np.ndarray, val_x: np.ndarray, test_x: np.ndarray, dataset: Any, *,
                      knn_k: int = 20, knn_temperature: float = 0.07) -> Dict[str, Any]:
    """Probe (C on val, accuracy on test) and kNN (test vs train memory) on given features."""
    labels = [split.labels.cpu().numpy() for split in (dataset.train, dataset.val, dataset.test)]
    probe = linear_probe(train_x, labels[0], val_x, labels[1], test_x, labels[2])
    knn = knn_accuracy(train_x, labels[0], test_x, labels[2], k=knn_k, temperature=knn_temperature,
                       num_classes=dataset.num_classes)
    return {"probe_accuracy": probe.test_accuracy, "probe_val_accuracy": probe.val_accuracy,
            "probe_c": probe.best_c, "knn_accuracy": knn}


def evaluate_encoders(dataset: Any, encoder: nn.Module, device: torch.device, *,
                      baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True,
                      knn_k: int = 20, knn_temperature: float = 0.07, workers: int = 0,
                      cache: Optional[BaselineCache] = None) -> Dict[str, Any]:
    """Numbers for ``summary.json``: the trained encoder's, and with ``random_init_`` /
    ``raw_pixel_`` prefixes the baselines' (when asked for), read from ``cache`` when it holds
    them and stored there when it does not (``None``: always computed). Streamed splits are
    read in batches (``workers`` decoding processes)."""
    splits = (dataset.train, dataset.val, dataset.test)
    options = {"knn_k": knn_k, "knn_temperature": knn_temperature}
    cache = BaselineCache(None) if cache is None else cache

    def features(model: nn.Module) -> Iterator[np.ndarray]:
        return (extract_features(model, split_images(s), device, workers=workers) for s in splits)

    result = evaluate_features(*features(encoder), dataset, **options)
    data = protocol = None
    if cache.enabled and (baseline_encoder is not None or raw_pixels):
        data = data_digest((image_batches(split_images(s), workers=workers), s.labels) for s in splits)
        protocol = readout_protocol(knn_k, knn_temperature, dataset.num_classes)
    if baseline_encoder is not None:
        cache_key = None if data is None else cache.key("random_init", data, protocol,
                                                         encoder_digest(baseline_encoder, device))
        baseline = cache.get_or_compute(cache_key, "random_init", lambda: evaluate_features(
            *features(baseline_encoder), dataset, **options))
        result.update({f"random_init_{key}": value for key, value in baseline.items()})
    if raw_pixels:
        cache_key = None if data is None else cache.key("raw_pixel", data, protocol)
        pixels = cache.get_or_compute(cache_key, "raw_pixel", lambda: evaluate_features(
            *(_pixels(s, workers) for s in splits), dataset, **options))
        result.update({f"raw_pixel_{key}": value for key, value in pixels.items()})
    return result


def evaluate_model(config: PretrainConfig, model: nn.Module, dataset: Any, device: torch.device, *,
                   baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True) -> Dict[str, Any]:
    """The held-out numbers of a trained model: :func:`evaluate_encoders` on its encoder when the
    data carry labels (paired data from a CSV may not), then its method's own read-out
    (:meth:`~contrastkit.train.methods.Method.readout`: retrieval and zero-shot for convirt)."""
    result: Dict[str, Any] = {}
    if dataset.num_classes:
        result = evaluate_encoders(dataset, model.encoder, device, baseline_encoder=baseline_encoder,
                                   raw_pixels=raw_pixels, knn_k=config.knn_k, knn_temperature=config.knn_temperature,
                                   workers=config.workers, cache=BaselineCache.from_setting(config.baseline_cache))
    result.update(get_method(config.method).readout(model, dataset, device))
    return result


@dataclass
class SavedRun:
    """A run folder read back: its configuration, a checkpoint's state and where they came from
    (:func:`load_run`)."""

    folder: str
    config: PretrainConfig
    state: Dict[str, Any]
    checkpoint: str
    config_path: str
    image_shape: Optional[Tuple[int, ...]] = None  # (C, H, W) of the training images, if recorded

    def load_data(self, data: Optional[str] = None, data_options: Optional[Dict[str, Any]] = None) -> Any:
        """The run's own data set (its loader and options, as it trained), or ``data`` (with
        ``data_options``) read by the run's method."""
        if data is None:
            return load_data(self.config)
        return load_data(replace(self.config, data=data, data_options=dict(data_options or {})))

    def build_model(self, image_shape: Any, device: torch.device, encoder: Optional[nn.Module] = None) -> nn.Module:
        """The run's model for images of ``image_shape`` ``(C, H, W)`` with the checkpoint's
        weights, on ``device``; ``encoder``: the architecture of a run given its encoder as a
        module (see :func:`evaluate_run`)."""
        model = self.build_untrained(image_shape, encoder)
        try:
            model.load_state_dict(self.state["model"])
        except RuntimeError as err:
            hint = ("; the run's encoder was given as a module: pass the same architecture again (encoder=...)"
                    if ":" in self.config.encoder and encoder is None else "")
            raise ValueError(f"checkpoint {self.checkpoint} does not match the model (encoder "
                             f"{self.config.encoder!r}) in {self.config_path}: {str(err).splitlines()[0]}{hint}") from None
        return model.to(device)

    def build_untrained(self, image_shape: Any, encoder: Optional[nn.Module] = None) -> nn.Module:
        """The run's model at its initialisation (the random-init baseline's network)."""
        tokenizer = get_method(self.config.method).saved_tokenizer(self.folder)
        return build_model(self.config, image_shape, tokenizer, encoder=encoder)


def load_run(run_dir: str, *, checkpoint: Optional[str] = None) -> SavedRun:
    """Read the run folder ``run_dir`` (``config.json`` and ``checkpoint``, by default
    ``checkpoints/last.pt``); a folder that is not a run, or a checkpoint of another run, is
    refused naming the file."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    config_path = layout.RunFolder(run_dir).config
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} is missing: is {run_dir} a `contrastkit pretrain` output?")
    try:
        stored = read_json(config_path)
        config = PretrainConfig.from_dict(stored["config"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{config_path} is not a valid run configuration: {err}") from None
    path = checkpoint or layout.RunFolder(run_dir).last_checkpoint
    state = load_checkpoint(path)
    # Compared as configurations, so that a field added since the run was written (at its default) matches.
    try:
        same = PretrainConfig.from_dict(state["config"]).to_dict() == config.to_dict()
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ValueError(f"checkpoint {path} does not belong to the run in {run_dir} (configurations differ)")
    shape = (stored.get("derived") or {}).get("dataset", {}).get("image_shape")
    return SavedRun(run_dir, config, state, path, config_path, tuple(shape) if isinstance(shape, list) else None)


def evaluate_run(run_dir: str, *, checkpoint: Optional[str] = None, device: str = "auto",
                 baselines: bool = True, threads: Optional[int] = None, encoder: Optional[nn.Module] = None,
                 dataset: Any = None, baseline_cache: Optional[str] = None) -> Dict[str, Any]:
    """Re-evaluate the checkpoint of a finished or interrupted run (``contrastkit probe``);
    ``threads`` and ``baseline_cache`` (``"auto"``, ``"off"`` or a folder) default to the run's
    settings.

    The encoder is rebuilt from the run's ``encoder`` and ``encoder_options``
    (``contrastkit.train.setup.build_model``); a run given its encoder as a Python object
    whose class cannot be rebuilt with no arguments needs it again as ``encoder`` (its
    architecture; the weights come from the checkpoint). A run given its data set as an
    object needs it again as ``dataset``."""
    saved = load_run(run_dir, checkpoint=checkpoint)
    if baseline_cache is not None:
        saved = replace(saved, config=replace(saved.config, baseline_cache=baseline_cache).resolved())
    with limit_threads(saved.config.threads if threads is None else threads):
        return _evaluate_state(saved, device, baselines, encoder, dataset)


def _evaluate_state(saved: SavedRun, device: str, baselines: bool, encoder: Optional[nn.Module] = None,
                    dataset: Any = None) -> Dict[str, Any]:
    started = time.perf_counter()
    config, state = saved.config, saved.state
    torch_device = resolve_device(device)
    dataset = saved.load_data() if dataset is None else as_run_data(dataset)
    model = saved.build_model(dataset.image_shape, torch_device, encoder)
    baseline = saved.build_untrained(dataset.image_shape, encoder).encoder.to(torch_device) if baselines else None
    result = evaluate_model(config, model, dataset, torch_device, baseline_encoder=baseline, raw_pixels=baselines)
    result.update({"checkpoint": os.path.abspath(saved.checkpoint), "epochs": int(state["epoch"]),
                   "step": int(state["step"]), "data": config.data, "method": config.method,
                   "encoder": config.encoder, "seconds": time.perf_counter() - started})
    return result
