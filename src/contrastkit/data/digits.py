"""scikit-learn's bundled handwritten digits (1797 images, 8x8, 10 classes), upsampled.

The 8x8 images (values 0..16) are scaled to ``[0, 1]`` and bilinearly upsampled to
``size x size`` (default 32) so that crop augmentations have pixels to work with. The
train / val / test split is stratified by class with a fixed ``split_seed`` (default 0),
independent of any training seed, so runs with different seeds are judged on the same test set.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Tuple

import numpy as np
import torch
import torch.nn.functional as F

from contrastkit.data.base import Dataset, check_fraction, check_positive_int, stratified_split, subset


@lru_cache(maxsize=1)
def _raw_digits() -> Tuple[np.ndarray, np.ndarray]:
    """sklearn's 8x8 images (float32 in [0, 1]) and targets, read once per process."""
    from sklearn.datasets import load_digits as _sk_load_digits  # lazy: optional dependency

    bunch = _sk_load_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0
    target = np.asarray(bunch.target, dtype=np.int64)
    images.flags.writeable = False
    target.flags.writeable = False
    return images, target


def load_digits(*, size: int = 32, val_fraction: float = 0.15, test_fraction: float = 0.25,
                split_seed: int = 0) -> Dataset:
    """Load the digits data set as a :class:`Dataset` of ``(1, size, size)`` images.

    Args:
        size: output side in pixels (>= 8); bilinear upsampling (``align_corners=False``).
        val_fraction, test_fraction: shares of each class put in val and test.
        split_seed: seed of the stratified split.
    """
    size = check_positive_int(size, "size", minimum=8)
    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    raw_images, target = _raw_digits()
    images = torch.tensor(raw_images).unsqueeze(1)
    if size != images.shape[-1]:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    images = images.clamp_(0.0, 1.0).contiguous()
    labels = torch.tensor(target)
    train_idx, val_idx, test_idx = stratified_split(
        target, [1.0 - val_fraction - test_fraction, val_fraction, test_fraction], int(split_seed))
    return Dataset(name="digits", class_names=[str(d) for d in range(10)],
                   train=subset(images, labels, train_idx), val=subset(images, labels, val_idx),
                   test=subset(images, labels, test_idx), image_shape=(1, size, size))
