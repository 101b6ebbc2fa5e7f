"""Loading a data set by name or path: images with labels (:func:`load_dataset`) or image-text
pairs (:func:`load_paired`)."""

from __future__ import annotations

import os
from typing import Any, Union

from contrastkit.data.base import Dataset
from contrastkit.data.paired import PairedDataset

__all__ = ["BUILTIN", "load_dataset", "load_paired"]

#: Built-in data set names.
BUILTIN = ("glyphlab", "digits")


def load_dataset(name_or_path: Union[str, os.PathLike], seed: int = 0, **options: Any) -> Dataset:
    """Load a data set as a :class:`Dataset` with ``train``, ``val`` and ``test`` splits:
    :func:`~contrastkit.data.open_data` with no workers (a class-folder tree held in memory
    unless ``stream=True``), resolved by the same data sources (:mod:`contrastkit.data.sources`).

    Args:
        name_or_path: ``"glyphlab"`` (generated, see :mod:`contrastkit.data.glyphlab`),
            ``"digits"`` (scikit-learn's bundled handwritten digits, upsampled), or a path:
            a folder of class subfolders of images (optionally ``train/``, ``val/``, ``test/``
            subfolders), a folder of MNIST idx files (optionally ``.gz``), a folder of CIFAR-10
            python batches, or a ``.npz`` with ``x_train, y_train, x_test, y_test``.
        seed: GlyphLab's generator seed. Real data ignore it: their splits use the fixed
            ``split_seed`` option (default 0), so every training seed sees the same test set.
        **options: loader options, e.g. glyphlab ``train_scenes=120, val_scenes=60,
            test_scenes=300, size=32, realisations=2, noise=0.15``; digits ``size=32``;
            paths ``size=None, val_fraction=0.1, split_seed=0`` (see the loaders).

    Raises:
        FileNotFoundError: a path (or a file the format needs) does not exist.
        ValueError: the data are malformed (message names the file), or bad option values.
        TypeError: an option the loader does not know.
    """
    from contrastkit.data.contract import open_data

    return open_data(name_or_path, seed=seed, **options)


def load_paired(name_or_path: Union[str, os.PathLike], seed: int = 0, **options: Any) -> PairedDataset:
    """Load paired image-text data: ``"glyphlab-text"``, ``"digits-text"`` or a ``.csv`` path.

    ``seed`` drives the generated texts (and GlyphLab's scenes); ``options`` go to the loader
    (``contrastkit.data.paired_texts.load_glyphlab_text``, ``load_digits_text``,
    ``contrastkit.data.paired_csv.load_pair_csv``).

    Raises:
        FileNotFoundError: the CSV or an image it names does not exist.
        ValueError: malformed pairs (the message names the file and row) or bad options.
        TypeError: an option the loader does not know.
    """
    from contrastkit.data.contract import open_data

    return open_data(name_or_path, seed=seed, paired=True, **options)
