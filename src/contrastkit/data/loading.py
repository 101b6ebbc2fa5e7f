"""Loading a data set by name or path: images with labels (:func:`load_dataset`) or image-text
pairs (:func:`load_paired`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

from contrastkit.data.base import Dataset, call_with_options
from contrastkit.data.paired import PairedDataset

__all__ = ["BUILTIN", "load_dataset", "load_paired"]

#: Built-in data set names.
BUILTIN = ("glyphlab", "digits")


def load_dataset(name_or_path: Union[str, os.PathLike], seed: int = 0, **options: Any) -> Dataset:
    """Load a data set as a :class:`Dataset` with ``train``, ``val`` and ``test`` splits.

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
    if isinstance(name_or_path, str) and name_or_path.lower() in BUILTIN:
        key = name_or_path.lower()
        if key == "glyphlab":
            from contrastkit.data.glyphlab import load_glyphlab

            return call_with_options(load_glyphlab, "glyphlab", options, seed=seed)
        from contrastkit.data.digits import load_digits

        return call_with_options(load_digits, "digits", options)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a data set name or a path, got {type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no data set {str(name_or_path)!r}: not a built-in name "
                                f"({', '.join(BUILTIN)}) and no such file or folder")
    from contrastkit.data.files import detect_format, load_path

    if detect_format(path) == "collection":  # unlabeled images: streamed, only the file index read
        from contrastkit.data.collection import open_collection

        size = options.get("size")
        if isinstance(size, (tuple, list)):
            if len(size) != 2 or size[0] != size[1]:
                raise ValueError(f"{path}: an unlabeled collection's images are square crops; give size as one "
                                 f"number, got {size!r}")
            options = {**options, "size": size[0]}
        return call_with_options(open_collection, str(path), options, source=path)
    return call_with_options(load_path, str(path), options, path=path)


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
    from contrastkit.data.paired import PAIRED_BUILTIN
    from contrastkit.data.paired_csv import load_pair_csv
    from contrastkit.data.paired_texts import load_digits_text, load_glyphlab_text

    if isinstance(name_or_path, str) and name_or_path.lower() in PAIRED_BUILTIN:
        if name_or_path.lower() == "glyphlab-text":
            return call_with_options(load_glyphlab_text, "glyphlab-text", options, seed=seed)
        return call_with_options(load_digits_text, "digits-text", options, seed=seed)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"paired data must be a name or a CSV path, got {type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no paired data {str(name_or_path)!r}: not a built-in name "
                                f"({', '.join(PAIRED_BUILTIN)}) and no such file")
    if path.is_dir() or path.suffix.lower() != ".csv":
        raise ValueError(f"paired data {str(path)!r}: expected a .csv file of (image, text) rows")
    return call_with_options(load_pair_csv, str(path), options, path=path)
