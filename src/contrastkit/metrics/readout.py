"""The fixed read-out protocol applied to encoders: frozen ``h`` features of the un-augmented
train / val / test images -> linear probe with C chosen on val (:func:`~contrastkit.metrics.linear_probe`)
and weighted kNN (:func:`~contrastkit.metrics.knn_accuracy`).

Baselines read out the same way: the same architecture at its random initialisation and the raw
pixels. Neither depends on a training run, so a caller may keep their numbers
(:class:`BaselineStore`; ``contrastkit pretrain`` keeps them in its baseline cache).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Protocol

import numpy as np
import torch
from torch import nn

from contrastkit.data import DataSplits, image_batches

from .probe import knn_accuracy, linear_probe

__all__ = ["extract_features", "pixel_features", "evaluate_features", "evaluate_encoders", "BaselineStore"]


class BaselineStore(Protocol):
    """Where :func:`evaluate_encoders` gets a baseline's numbers: ``numbers(kind, compute,
    encoder)`` returns those kept for ``kind`` (``"raw_pixel"`` or ``"random_init"``, with its
    untrained ``encoder``) on the data set it was made for, or ``compute()`` (and may keep them)."""

    def numbers(self, kind: str, compute: Callable[[], Dict[str, Any]],
                encoder: Optional[nn.Module] = None) -> Dict[str, Any]: ...


@torch.no_grad()
def extract_features(encoder: nn.Module, images: Any, device: torch.device, batch_size: int = 256, *,
                     workers: int = 0) -> np.ndarray:
    """``h`` of ``images`` in eval mode (BatchNorm uses running statistics): ``(n, d)`` float32
    (the precision the read-out computes in).

    ``images`` is a split of any storage (:class:`~contrastkit.data.DataSplit`) or an
    ``(n, C, H, W)`` float tensor in ``[0, 1]``, read in batches of ``batch_size`` (decoded in
    ``workers`` processes; :func:`~contrastkit.data.image_batches`). The encoder's train/eval
    mode is restored afterwards."""
    was_training = encoder.training
    encoder.eval()
    try:
        chunks = [encoder(batch.to(device)).float().cpu() for batch in image_batches(images, batch_size, workers)]
    finally:
        encoder.train(was_training)
    return torch.cat(chunks).numpy()


def pixel_features(split: Any, workers: int = 0) -> np.ndarray:
    """The raw-pixel baseline's features of a split: its images flattened, ``(n, C*H*W)`` float32."""
    return torch.cat([batch.reshape(batch.shape[0], -1).float().cpu()
                      for batch in image_batches(split, workers=workers)]).numpy()


def evaluate_features(train_x: np.ndarray, val_x: np.ndarray, test_x: np.ndarray, dataset: DataSplits, *,
                      knn_k: int = 20, knn_temperature: float = 0.07) -> Dict[str, Any]:
    """Probe (C on val, accuracy on test) and kNN (test vs train memory) on given features
    ``(n, d)`` of the data set's three splits (in order), scored with their labels."""
    labels = [split.labels.cpu().numpy() for split in (dataset.train, dataset.val, dataset.test)]
    probe = linear_probe(train_x, labels[0], val_x, labels[1], test_x, labels[2])
    knn = knn_accuracy(train_x, labels[0], test_x, labels[2], k=knn_k, temperature=knn_temperature,
                       num_classes=dataset.num_classes)
    return {"probe_accuracy": probe.test_accuracy, "probe_val_accuracy": probe.val_accuracy,
            "probe_c": probe.best_c, "knn_accuracy": knn}


class _ComputeAlways:
    def numbers(self, kind: str, compute: Callable[[], Dict[str, Any]],
                encoder: Optional[nn.Module] = None) -> Dict[str, Any]:
        return compute()


def evaluate_encoders(dataset: DataSplits, encoder: nn.Module, device: torch.device, *,
                      baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True,
                      knn_k: int = 20, knn_temperature: float = 0.07, workers: int = 0,
                      baselines: Optional[BaselineStore] = None) -> Dict[str, Any]:
    """The read-out of a trained ``encoder`` on a labelled data set (``summary.json``'s numbers),
    and with ``random_init_`` / ``raw_pixel_`` prefixes those of the baselines asked for: the
    untrained ``baseline_encoder`` and (``raw_pixels``) the flattened images, taken from
    ``baselines`` when it keeps them (``None``: always computed). Streamed splits are read in
    batches (``workers`` decoding processes)."""
    splits = (dataset.train, dataset.val, dataset.test)
    options = {"knn_k": knn_k, "knn_temperature": knn_temperature}
    store: BaselineStore = _ComputeAlways() if baselines is None else baselines

    def features(model: nn.Module) -> Iterator[np.ndarray]:
        return (extract_features(model, split, device, workers=workers) for split in splits)

    result = evaluate_features(*features(encoder), dataset, **options)
    if baseline_encoder is not None:
        baseline = store.numbers("random_init", lambda: evaluate_features(
            *features(baseline_encoder), dataset, **options), baseline_encoder)
        result.update({f"random_init_{key}": value for key, value in baseline.items()})
    if raw_pixels:
        pixels = store.numbers("raw_pixel", lambda: evaluate_features(
            *(pixel_features(split, workers) for split in splits), dataset, **options))
        result.update({f"raw_pixel_{key}": value for key, value in pixels.items()})
    return result
