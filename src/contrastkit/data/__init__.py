"""Data sets with train / val / test splits, and the view makers that form positive pairs.

>>> from contrastkit.data import load_dataset, make_views
>>> ds = load_dataset("glyphlab", seed=0)               # doctest: +SKIP
>>> views = make_views(ds, mode="A")                    # doctest: +SKIP
>>> view_a, view_b = views(ds.train, torch.arange(8))   # doctest: +SKIP

``load_dataset`` accepts a built-in name (``"glyphlab"``, ``"digits"``) or a filesystem path
(a folder of class subfolders of images, a folder of MNIST idx files, a folder of CIFAR-10
python batches, or a ``.npz`` file); see :func:`load_dataset`. Nothing is downloaded unless
asked: :func:`download_mnist` and :func:`download_cifar10` fetch the official files into a
folder to load.

Data too large to hold are streamed (:mod:`contrastkit.data.streaming`): :func:`stream_image_folder`
keeps only the file index of a class-folder tree and decodes images in ``DataLoader`` workers;
:func:`as_streaming` wraps any map-style ``torch.utils.data.Dataset`` of ``(image, label)``,
:func:`as_streaming_pairs` one of ``(image, text)`` pairs (for ``convirt`` and ``siglip``).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Dict, Union

from contrastkit.data.base import Dataset, Split, stratified_subset, stratified_subset_indices
from contrastkit.data.download import download_cifar10, download_mnist
from contrastkit.data.streaming import (BadItemError, CaptionedDataset, EpochBatchSampler, ImageFolderDataset,
                                        StreamingDataset, UnreadableImageError, as_streaming, as_streaming_pairs,
                                        make_loader, stream_image_folder, subset_split)
from contrastkit.data.views import MODES, ViewMaker, make_views

__all__ = ["load_dataset", "make_views", "Dataset", "Split", "ViewMaker", "MODES", "BUILTIN",
           "download_mnist", "download_cifar10", "ImageFolderDataset", "StreamingDataset", "UnreadableImageError",
           "BadItemError", "CaptionedDataset", "EpochBatchSampler", "stream_image_folder", "as_streaming",
           "as_streaming_pairs", "make_loader", "subset_split",
           "stratified_subset", "stratified_subset_indices"]

#: Built-in data set names.
BUILTIN = ("glyphlab", "digits")


def _call_with_options(loader: Callable[..., Dataset], what: str, options: Dict[str, Any], **fixed: Any) -> Dataset:
    """Call ``loader`` with ``options``, rejecting unknown option names with a clear message."""
    accepted = [name for name, p in inspect.signature(loader).parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name not in fixed]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(map(repr, unknown))} for {what}; "
                        f"accepted: {', '.join(accepted)}")
    return loader(**fixed, **options)


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

            return _call_with_options(load_glyphlab, "glyphlab", options, seed=seed)
        from contrastkit.data.digits import load_digits

        return _call_with_options(load_digits, "digits", options)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a data set name or a path, got {type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no data set {str(name_or_path)!r}: not a built-in name "
                                f"({', '.join(BUILTIN)}) and no such file or folder")
    from contrastkit.data.files import load_path

    return _call_with_options(load_path, str(path), options, path=path)
