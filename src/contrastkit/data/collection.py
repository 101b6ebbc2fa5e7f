"""Unlabeled image collections: a folder of images without class structure (flat or nested,
read recursively) or a list file of image paths, streamed like class folders.

What is held per image is its path alone (one numpy byte array, shared by forked workers);
images are decoded in the ``DataLoader``'s workers. The rules:

* **Files**: every file below the folder whose name ends in an image extension
  (:data:`~contrastkit.data.files.IMAGE_EXTENSIONS`: JPEG, PNG, WebP, BMP, TIFF, GIF, PNM),
  hidden files and folders excepted; a ``.txt`` or ``.csv`` list holds one path a line
  (relative to the list's folder unless absolute; a CSV's first column, a header ``path`` or
  ``image`` skipped; blank lines and ``#`` comments skipped).
* **Colour**: grayscale (1 channel) when the first 32 files (in path order) are all grayscale,
  else RGB (3 channels); ``color="L"`` / ``"RGB"`` forces it. Palette images are expanded,
  CMYK converted to RGB, transparent pixels (RGBA, LA, a palette's transparency) composited
  over white, 16-bit images rescaled by their full range and 32-bit ones by their maximum.
* **Size**: the shorter side resized to ``size`` (bilinear, antialiased), then the centre
  ``size x size`` square cropped (what torchvision's ``Resize`` + ``CenterCrop`` does for
  evaluation); ``size`` defaults to 32, the built-in encoders' natural size.
* **Splits**: a file belongs to val or test by a hash of its path relative to the collection
  (SHA-1, ``val_fraction`` / ``test_fraction`` of the hash range), never by its position, so
  adding files never moves a file between splits (a collection too small to put a file in val
  or test that way gives each the training file lowest in the hash range).
* **Damaged files** (unreadable, truncated, empty, not an image, over the pixel ceiling):
  ``bad_files="skip"`` (the default here) drops them from their batch, counts and names them
  (:func:`skipped_files`); ``"fail"`` stops at the first, naming it.
"""

from __future__ import annotations

import csv
import hashlib
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from contrastkit.data.base import NO_LABEL, check_fraction, check_positive_int
from contrastkit.data.streaming import BadItemError, UnreadableImageError

__all__ = ["ImageCollection", "CollectionDataset", "open_collection", "collection_files", "is_collection_source",
           "BAD_FILES", "DEFAULT_SIZE", "skipped_files", "skipped_reasons", "skipped_reason", "add_skipped",
           "skips_bad_files"]

#: What a damaged file does: dropped from its batch and named, or the run stops.
BAD_FILES = ("skip", "fail")
#: The side of a collection's images when no size is given (the built-in encoders' input).
DEFAULT_SIZE = 32
#: Files whose modes decide a collection's colour.
_COLOR_SAMPLE = 32
_LIST_SUFFIXES = (".txt", ".csv")


def is_collection_source(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` is a list file of image paths (``.txt`` / ``.csv``)."""
    return Path(path).is_file() and Path(path).suffix.lower() in _LIST_SUFFIXES


def collection_files(source: Union[str, os.PathLike]) -> Tuple[Path, List[Path]]:
    """``(root, files)``: the collection's folder (paths are named relative to it) and its image
    files in path order. A folder is walked recursively; a list file is read line by line."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    source = Path(source)
    if source.is_dir():
        files = []
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            files.extend(Path(dirpath) / name for name in sorted(filenames)
                         if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS))
        if not files:
            raise ValueError(f"{source}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it or below it")
        return source, files
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file or folder")
    root = source.parent
    files = []
    with open(source, encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle) if source.suffix.lower() == ".csv" else ([line] for line in handle)
        for number, row in enumerate(rows, 1):
            entry = (row[0] if row else "").strip()
            if not entry or entry.startswith("#") or (number == 1 and entry.lower() in ("path", "image")):
                continue
            path = Path(entry) if os.path.isabs(entry) else root / entry
            if not path.is_file():
                raise ValueError(f"{source}: line {number}: no such image file {entry!r}")
            files.append(path)
    if not files:
        raise ValueError(f"{source}: lists no image files")
    return root, files


def _hash_fraction(relative: str) -> float:
    digest = hashlib.sha1(relative.replace(os.sep, "/").encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


class ImageCollection(torch.utils.data.Dataset):
    """One split of an unlabeled collection: item ``i`` is ``(image, NO_LABEL)`` (-1), ``image``
    ``(C, size, size)`` uint8 (the rules of :mod:`contrastkit.data.collection`); ``labels`` is
    ``None``. Only the paths are held."""

    labels = None

    def __init__(self, files: Sequence[Union[str, os.PathLike]], root: Union[str, os.PathLike], *, color: str,
                 size: int, bad_files: str = "skip") -> None:
        if color not in ("L", "RGB"):
            raise ValueError(f"color must be 'L' or 'RGB', got {color!r}")
        if bad_files not in BAD_FILES:
            raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
        self.files = np.array([os.fsencode(str(f)) for f in files], dtype=np.bytes_)
        self.root = str(root)
        self.color, self.size, self.bad_files = color, int(size), bad_files
        #: The damaged files met so far in this process (path -> reason).
        self.skipped: Dict[str, str] = {}

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        return (1 if self.color == "L" else 3, self.size, self.size)

    def __len__(self) -> int:
        return int(self.files.shape[0])

    def path(self, index: int) -> str:
        """The file of item ``index``."""
        return os.fsdecode(self.files[index])

    def relative_path(self, index: int) -> str:
        """The file of item ``index`` relative to the collection (its name in exports)."""
        return os.path.relpath(self.path(index), self.root)

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        path = self.path(index)
        try:
            return torch.from_numpy(fit_image(Path(path), self.color, self.size)), NO_LABEL
        except ValueError as err:
            raise UnreadableImageError(str(err)) from None

    def record_skipped(self, index: int, reason: str) -> None:
        """Note that item ``index`` was dropped (``bad_files="skip"``)."""
        self.skipped[self.path(index)] = reason


def fit_image(path: Path, color: str, size: int) -> np.ndarray:
    """The image at ``path`` as ``(C, size, size)`` uint8 by the collection's rules; a
    ``ValueError`` naming the file when it cannot be read (or is over the pixel ceiling)."""
    from PIL import Image

    from contrastkit.data.files import decode_image, open_image, to_array

    with open_image(path) as opened:
        image = decode_image(opened, path)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba).convert("RGB")
    elif image.mode in ("P", "CMYK", "YCbCr", "LAB", "HSV", "1"):
        image = image.convert("RGB" if color == "RGB" or image.mode != "1" else "L")
    width, height = image.size
    scale = size / min(width, height)
    resized = (max(size, round(height * scale)), max(size, round(width * scale)))
    array = to_array([image], color, resized)[0]
    top, left = (resized[0] - size) // 2, (resized[1] - size) // 2
    return np.ascontiguousarray(array[:, top:top + size, left:left + size])


class CollectionDataset:
    """An unlabeled collection's three splits (:class:`ImageCollection`), with the names a run
    reads: ``name``, ``class_names`` (none), ``num_classes`` (0), ``image_shape``; streamed."""

    streamed = True
    source = "collection"
    has_realisations = False

    def __init__(self, name: str, train: ImageCollection, val: ImageCollection, test: ImageCollection) -> None:
        self.name = name
        self.class_names: List[str] = []
        self.train, self.val, self.test = train, val, test
        self.image_shape = train.image_shape
        for split_name, split in self.splits():
            if len(split) == 0:
                raise ValueError(f"{name}: the {split_name} split is empty ({len(train) + len(val) + len(test)} "
                                 "images in all: too few for the val and test fractions)")

    @property
    def num_classes(self) -> int:
        return 0

    def splits(self) -> List[Tuple[str, ImageCollection]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]

    def read_image(self, path: Union[str, os.PathLike]) -> Tensor:
        """Any image file read by the collection's rules (its colour, resize and centre crop), as
        its images are: ``(C, size, size)`` uint8; a ``ValueError`` naming the file when it
        cannot be read (e.g. a query compared with the collection's images)."""
        channels, size, _ = self.image_shape
        return torch.from_numpy(fit_image(Path(path), "L" if channels == 1 else "RGB", size))

    def summary(self) -> str:
        c, h, w = self.image_shape
        sizes = ", ".join(f"{name} {len(split)}" for name, split in self.splits())
        return f"{self.name}: {c}x{h}x{w} images (streamed, unlabeled); {sizes}"


def open_collection(source: Union[str, os.PathLike], *, size: Optional[int] = None, val_fraction: float = 0.1,
                    test_fraction: float = 0.2, color: Optional[str] = None,
                    bad_files: str = "skip") -> CollectionDataset:
    """The unlabeled collection at ``source`` (a folder, or a ``.txt`` / ``.csv`` list of image
    paths) by the rules of :mod:`contrastkit.data.collection`. Only the file index is read."""
    from contrastkit.data.files import GRAY_MODES, open_image

    size = DEFAULT_SIZE if size is None else check_positive_int(size, "size")
    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    if color is not None and color not in ("L", "RGB"):
        raise ValueError(f"color must be None, 'L' or 'RGB', got {color!r}")
    if bad_files not in BAD_FILES:
        raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
    root, files = collection_files(source)
    if color is None:
        modes = []
        for path in files[:_COLOR_SAMPLE]:
            try:
                with open_image(path) as image:
                    modes.append(image.mode)
            except ValueError:
                continue  # a damaged file decides nothing
        color = "L" if modes and all(mode in GRAY_MODES for mode in modes) else "RGB"
    parts: Dict[str, List[Path]] = {"train": [], "val": [], "test": []}
    positions = sorted((_hash_fraction(os.path.relpath(path, root)), path) for path in files)
    for position, path in positions:
        part = "test" if position < test_fraction else "val" if position < test_fraction + val_fraction else "train"
        parts[part].append(path)
    # A collection too small to fill val or test by hash gives each the training file nearest its
    # share of the hash range (the lowest positions): still a function of the paths alone.
    for part in ("test", "val"):
        if not parts[part] and len(parts["train"]) > 1:
            lowest = min(parts["train"], key=lambda p: _hash_fraction(os.path.relpath(p, root)))
            parts["train"].remove(lowest)
            parts[part].append(lowest)
    parts = {part: sorted(paths) for part, paths in parts.items()}
    splits = {part: ImageCollection(paths, root, color=color, size=size, bad_files=bad_files)
              for part, paths in parts.items()}
    name = Path(source).stem if Path(source).is_file() else (Path(source).resolve().name or "images")
    return CollectionDataset(name, splits["train"], splits["val"], splits["test"])


def _base_split(split: Any) -> Any:
    while hasattr(split, "dataset") and not hasattr(split, "record_skipped"):
        split = split.dataset
    return split


def _base_index(split: Any, index: int) -> int:
    while hasattr(split, "dataset") and hasattr(split, "indices") and not hasattr(split, "record_skipped"):
        index = int(split.indices[index])
        split = split.dataset
    return index


def skips_bad_files(split: Any) -> bool:
    """Whether a damaged item of ``split`` is dropped from its batch rather than an error."""
    return getattr(_base_split(split), "bad_files", "fail") == "skip"


def skip_item(split: Any, index: int, error: BadItemError) -> None:
    """Record item ``index`` of ``split`` as skipped (its file and why)."""
    _base_split(split).record_skipped(_base_index(split, index), str(error))


def skipped_reason(split: Any, index: int) -> Optional[str]:
    """Why item ``index`` of ``split`` (a collection's split, or a ``Subset`` of one) was
    skipped as damaged in this process (the file named), or ``None`` if it was not."""
    base = _base_split(split)
    skipped = getattr(base, "skipped", None)
    if not skipped:
        return None
    return skipped.get(base.path(_base_index(split, index)))


def skipped_reasons(dataset: Any) -> Dict[str, str]:
    """``{path: reason}`` of every damaged file met in ``dataset``'s splits in this process."""
    found: Dict[str, str] = {}
    for _, split in dataset.splits():
        found.update(getattr(_base_split(split), "skipped", {}) or {})
    return found


def add_skipped(dataset: Any, found: Dict[str, str]) -> None:
    """Add to ``dataset``'s record the damaged files another process met (``{path: reason}``,
    e.g. :func:`skipped_reasons` of the other ranks under torchrun, which each read their own
    share of the training split); a file already recorded keeps its reason."""
    if not found:
        return
    base = _base_split(dataset.train)
    if not hasattr(base, "skipped"):
        raise ValueError(f"{getattr(dataset, 'name', 'the data set')} is not an unlabeled collection: it skips no "
                         "files")
    known = skipped_reasons(dataset)
    base.skipped.update((path, reason) for path, reason in found.items() if path not in known)


def skipped_files(dataset: Any) -> List[str]:
    """``"path<TAB>reason"`` of every damaged file a run met in ``dataset``'s splits, sorted."""
    return [f"{path}\t{reason}" for path, reason in sorted(skipped_reasons(dataset).items())]
