"""The fixed read-out protocol applied to encoders: frozen ``h`` features of the un-augmented
train / val / test images -> linear probe and weighted kNN (:mod:`contrastkit.metrics`).

Baselines evaluated the same way: the same architecture at its random initialisation (same
seed) and the raw pixels.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from contrastkit import layout
from contrastkit._io import read_json
from contrastkit.metrics import knn_accuracy, linear_probe

from .checkpoint import load_checkpoint
from .config import PretrainConfig
from .methods import get_method
from .setup import build_model, limit_threads, load_data, resolve_device

__all__ = ["extract_features", "evaluate_features", "evaluate_encoders", "evaluate_model", "evaluate_run",
           "SavedRun", "load_run"]


@torch.no_grad()
def extract_features(encoder: nn.Module, images: torch.Tensor, device: torch.device,
                     batch_size: int = 256) -> np.ndarray:
    """``h`` of ``images`` ``(n, C, H, W)`` in eval mode (BatchNorm uses running statistics):
    ``(n, d)`` float32 (the precision the read-out computes in). The encoder's train/eval mode
    is restored afterwards."""
    was_training = encoder.training
    encoder.eval()
    try:
        chunks = [encoder(images[i:i + batch_size].to(device)).float().cpu()
                  for i in range(0, images.shape[0], batch_size)]
    finally:
        encoder.train(was_training)
    return torch.cat(chunks).numpy()


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
                      knn_k: int = 20, knn_temperature: float = 0.07) -> Dict[str, Any]:
    """Numbers for ``summary.json``: the trained encoder's, and with ``random_init_`` /
    ``raw_pixel_`` prefixes the baselines' (when asked for)."""
    splits = (dataset.train, dataset.val, dataset.test)
    options = {"knn_k": knn_k, "knn_temperature": knn_temperature}
    result = evaluate_features(*(extract_features(encoder, s.images, device) for s in splits), dataset, **options)
    if baseline_encoder is not None:
        baseline = evaluate_features(*(extract_features(baseline_encoder, s.images, device) for s in splits),
                                     dataset, **options)
        result.update({f"random_init_{key}": value for key, value in baseline.items()})
    if raw_pixels:
        pixels = evaluate_features(*(s.images.reshape(s.images.shape[0], -1).float().cpu().numpy()
                                     for s in splits), dataset, **options)
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
                                   raw_pixels=raw_pixels, knn_k=config.knn_k, knn_temperature=config.knn_temperature)
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

    def build_model(self, in_channels: int, device: torch.device) -> nn.Module:
        """The run's model with the checkpoint's weights, on ``device``."""
        tokenizer = get_method(self.config.method).saved_tokenizer(self.folder)
        model = build_model(self.config, in_channels, tokenizer)
        try:
            model.load_state_dict(self.state["model"])
        except RuntimeError as err:
            raise ValueError(f"checkpoint {self.checkpoint} does not match the model in {self.config_path}: "
                             f"{str(err).splitlines()[0]}") from None
        return model.to(device)


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
                 baselines: bool = True, threads: Optional[int] = None) -> Dict[str, Any]:
    """Re-evaluate the checkpoint of a finished or interrupted run (``contrastkit probe``);
    ``threads`` defaults to the run's setting."""
    saved = load_run(run_dir, checkpoint=checkpoint)
    with limit_threads(saved.config.threads if threads is None else threads):
        return _evaluate_state(saved, device, baselines)


def _evaluate_state(saved: SavedRun, device: str, baselines: bool) -> Dict[str, Any]:
    started = time.perf_counter()
    config, state = saved.config, saved.state
    torch_device = resolve_device(device)
    dataset = saved.load_data()
    model = saved.build_model(dataset.image_shape[0], torch_device)
    baseline = (build_model(config, dataset.image_shape[0], get_method(config.method).saved_tokenizer(saved.folder))
                .encoder.to(torch_device) if baselines else None)
    result = evaluate_model(config, model, dataset, torch_device, baseline_encoder=baseline, raw_pixels=baselines)
    result.update({"checkpoint": os.path.abspath(saved.checkpoint), "epochs": int(state["epoch"]),
                   "step": int(state["step"]), "data": config.data, "method": config.method,
                   "encoder": config.encoder, "seconds": time.perf_counter() - started})
    return result
