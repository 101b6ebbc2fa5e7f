"""The fixed read-out protocol applied to encoders: frozen ``h`` features of the un-augmented
train / val / test images -> linear probe and weighted kNN (:mod:`contrastkit.metrics`).

Baselines evaluated the same way: the same architecture at its random initialisation (same
seed) and the raw pixels.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Optional

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

__all__ = ["extract_features", "evaluate_features", "evaluate_encoders", "evaluate_model", "evaluate_run"]


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


def evaluate_run(run_dir: str, *, checkpoint: Optional[str] = None, device: str = "auto",
                 baselines: bool = True, threads: Optional[int] = None) -> Dict[str, Any]:
    """Re-evaluate the checkpoint of a finished or interrupted run (``contrastkit probe``);
    ``threads`` defaults to the run's setting."""
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
    if state["config"] != config.to_dict():
        raise ValueError(f"checkpoint {path} does not belong to the run in {run_dir} (configurations differ)")
    with limit_threads(config.threads if threads is None else threads):
        return _evaluate_state(config, state, path, config_path, device, baselines)


def _evaluate_state(config: PretrainConfig, state: Dict[str, Any], path: str, config_path: str, device: str,
                    baselines: bool) -> Dict[str, Any]:
    started = time.perf_counter()
    torch_device = resolve_device(device)
    dataset = load_data(config)
    tokenizer = get_method(config.method).saved_tokenizer(os.path.dirname(config_path))
    model = build_model(config, dataset.image_shape[0], tokenizer)
    baseline = build_model(config, dataset.image_shape[0], tokenizer).encoder.to(torch_device) if baselines else None
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise ValueError(f"checkpoint {path} does not match the model in {config_path}: "
                         f"{str(err).splitlines()[0]}") from None
    model.to(torch_device)
    result = evaluate_model(config, model, dataset, torch_device, baseline_encoder=baseline, raw_pixels=baselines)
    result.update({"checkpoint": os.path.abspath(path), "epochs": int(state["epoch"]), "step": int(state["step"]),
                   "data": config.data, "method": config.method, "encoder": config.encoder,
                   "seconds": time.perf_counter() - started})
    return result
