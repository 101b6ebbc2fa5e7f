"""Unlabeled image collections: a folder of images without class structure (flat or nested,
read recursively) or a list file of image paths, streamed like class folders.

What is held per image is its path alone (one numpy byte array, shared by forked workers);
images are decoded in the ``DataLoader``'s workers. The rules:

* **Files**: every file below the folder whose name ends in an image extension
  (:data:`~contrastkit.data.files.IMAGE_EXTENSIONS`: JPEG, PNG, WebP, BMP, TIFF, GIF, PNM),
  hidden files and folders excepted, each read once: symbolic links to folders are followed
  unless the folder was already read (a loop among them), a link to a file already listed is
  left out and a link to nothing too, each named (:func:`skipped_files`); a ``.txt`` or ``.csv`` list holds one path a line
  (relative to the list's folder unless absolute; a CSV's first column, a header ``path`` or
  ``image`` skipped; blank lines and ``#`` comments skipped).
* **Colour**: grayscale (1 channel) when the first 32 files (in path order) are all grayscale,
  else RGB (3 channels); ``color="L"`` / ``"RGB"`` forces it. Palette images are expanded,
  CMYK converted to RGB, transparent pixels (RGBA, LA, a palette's transparency) composited
  over white, 16-bit images rescaled by their full range and 32-bit ones by their maximum.
* **Size**: the shorter side resized to ``size`` (bilinear, antialiased), then the centre
  ``size x size`` square cropped (what torchvision's ``Resize`` + ``CenterCrop`` does for
  evaluation); ``size`` defaults to 32, the built-in encoders' natural size. These rules are
  defined once, in :mod:`contrastkit.data.preprocess` (which an export's input contract states).
* **Splits**: a file belongs to val or test by a hash of its path relative to the collection
  (SHA-1, ``val_fraction`` / ``test_fraction`` of the hash range), never by its position, so
  adding files never moves a file between splits; a collection too small to put a file in
  every split that way lends each empty split the file nearest its share of the hash range
  (:func:`split_by_hash`), so from 3 files on no split is empty.
* **Damaged files** (unreadable, truncated, empty, not an image, over the pixel ceiling):
  ``bad_files="skip"`` (the default here) drops them from their batch, counts and names them
  (:func:`skipped_files`); ``"fail"`` stops at the first, naming it. A file removed, made
  unreadable or overwritten by something that does not decode after the collection was
  indexed (while a run reads it) is a damaged file like any other; a file overwritten by
  another image is read as it now is (what is held is the path, not the content).
* **File names that are not UTF-8** (bytes such as ``b'caf\\xe9.png'`` on Linux): they could
  not be written in a run's outputs (skipped.txt, the names of ``contrastkit embed``), so
  ``"skip"`` leaves them out when the collection is indexed and names them with the bytes
  escaped (``caf\\xe9.png``); ``"fail"`` refuses the folder, naming the bytes.
* **List files**: an entry that is not a regular file (a folder, ``/dev/zero``) or names a file
  another line names (a duplicate, however spelled) is refused, naming the line(s).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from contrastkit._io import escape_line, escape_undecodable, file_kind, is_utf8_name, open_input
from contrastkit.data.base import NO_LABEL, check_fraction, check_positive_int
from contrastkit.data.streaming import BadItemError, read_image_file

__all__ = ["ImageCollection", "CollectionDataset", "open_collection", "collection_files", "is_collection_source",
           "BAD_FILES", "DEFAULT_SIZE", "MAX_SIZE", "check_image_size", "skipped_files", "skipped_reasons",
           "skipped_reason", "add_skipped", "skips_bad_files", "hash_fraction", "split_by_hash", "SPLITS"]

#: What a damaged file does: dropped from its batch and named, or the run stops.
BAD_FILES = ("skip", "fail")
#: The side of a collection's images when no size is given (the built-in encoders' input).
DEFAULT_SIZE = 32
#: The largest side a collection's images are brought to. A 4096 x 4096 RGB image is 48 MiB
#: decoded and 192 MiB as the float32 an encoder reads, and a step holds two views of every
#: image of its batch: far beyond that, not even a batch of two fits in a large machine's memory.
MAX_SIZE = 4096
#: Files whose modes decide a collection's colour.
_COLOR_SAMPLE = 32
_LIST_SUFFIXES = (".txt", ".csv")


def is_collection_source(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` is a list file of image paths (``.txt`` / ``.csv``)."""
    return Path(path).is_file() and Path(path).suffix.lower() in _LIST_SUFFIXES


def check_image_size(size: Any, name: str = "size") -> int:
    """``size`` as the side of a collection's images: an integer from 1 to :data:`MAX_SIZE`;
    a ``ValueError`` naming ``name`` otherwise (before any memory is asked for)."""
    size = check_positive_int(size, name)
    if size > MAX_SIZE:
        raise ValueError(f"{name} {size} is over the ceiling of {MAX_SIZE} pixels a side: two views of a batch of "
                         f"{size}x{size} images would not fit in memory (images are resized to it; "
                         f"{DEFAULT_SIZE} is the built-in encoders' size)")
    return size


def collection_files(source: Union[str, os.PathLike]) -> Tuple[Path, List[Path]]:
    """``(root, files)``: the collection's folder (paths are named relative to it) and its image
    files in path order. A folder is walked recursively; a list file is read line by line. A
    file name that is not UTF-8 is refused (:func:`open_collection` with ``bad_files="skip"``
    leaves such files out instead)."""
    root, files, _ = _index(source, "fail")
    return root, files


def _index(source: Union[str, os.PathLike], bad_files: str) -> Tuple[Path, List[Path], Dict[str, str]]:
    """:func:`collection_files` and the files left out (``{escaped path: reason}``, non-UTF-8
    names under ``bad_files="skip"``)."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    source = Path(source)
    left_out: Dict[str, str] = {}
    if source.is_dir():
        files = _walk(source, left_out, bad_files)
        if not files:
            if left_out:
                first, reason = next(iter(left_out.items()))
                raise ValueError(f"{source}: no image file to read in it or below it ({len(left_out)} left out, "
                                 f"e.g. {first}: {reason})")
            raise ValueError(f"{source}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it or below it")
        named = []
        for path in files:
            relative = os.path.relpath(path, source)
            if is_utf8_name(relative):  # (the folder's own name may be anything: it is never written)
                named.append(path)
                continue
            if bad_files == "fail":
                raise ValueError(f"{source}: the file name {os.fsencode(relative)!r} is not valid UTF-8, so a run's "
                                 "outputs could not name it (rename it, or let bad_files=skip leave it out)")
            left_out[escape_undecodable(path)] = (f"file name is not valid UTF-8 ({os.fsencode(relative)!r}): left out, "
                                            "since a run's outputs could not name it")
        if not named:
            raise ValueError(f"{source}: none of its {len(files)} image file names is valid UTF-8 (e.g. "
                             f"{os.fsencode(os.path.relpath(files[0], source))!r}): rename them")
        return source, named, left_out
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file or folder")
    return source.parent, _read_list(source), left_out


def _walk(source: Path, left_out: Dict[str, str], bad_files: str = "skip") -> List[Path]:
    """The image files below the folder ``source`` in path order (each folder's files by name,
    then its sub-folders by name), hidden files and folders excepted, every file and folder read
    once however it is reached: a symbolic link to a folder is followed unless that folder was
    already read (a link to one of its own parents, a loop, among them), and a link to a file
    (or a hard link) already listed, or a link to nothing, is left out; each of these is named
    with its reason in ``left_out`` (``{escaped path: reason}``). Under ``bad_files="fail"`` a
    link to nothing, a damaged entry, stops the listing in a ``ValueError`` naming it."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    files: List[Path] = []
    folders_read: Dict[Tuple[int, int], str] = {}
    files_read: Dict[Tuple[int, int], str] = {}
    start = os.stat(source)
    stack: List[Tuple[Path, Tuple[int, int]]] = [(source, (start.st_dev, start.st_ino))]
    while stack:
        folder, key = stack.pop()
        if key in folders_read:
            left_out[escape_undecodable(folder)] = (f"the folder {escape_undecodable(folders_read[key])}, already "
                                                    "read (reached again through a symbolic link): read once")
            continue
        folders_read[key] = str(folder)
        try:
            with os.scandir(folder) as listing:
                entries = sorted((entry for entry in listing if not entry.name.startswith(".")),
                                 key=lambda entry: entry.name)
        except OSError as err:  # e.g. a sub-folder without read permission
            left_out[escape_undecodable(folder)] = f"folder cannot be listed ({err.strerror or err}): left out"
            continue
        below = []
        for entry in entries:
            try:
                is_folder = entry.is_dir()  # (follows a symbolic link)
            except OSError:
                is_folder = False
            if is_folder:
                try:
                    info = entry.stat()
                except OSError as err:
                    left_out[escape_undecodable(entry.path)] = f"folder cannot be read ({err.strerror or err})"
                    continue
                below.append((Path(entry.path), (info.st_dev, info.st_ino)))
                continue
            if not entry.name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            if entry.is_symlink():
                try:
                    info = entry.stat()
                except OSError:  # a link to nothing (or a loop of links)
                    reason = f"a symbolic link to nothing ({escape_undecodable(os.readlink(entry.path))} does not exist)"
                    if bad_files == "fail":
                        raise ValueError(f"{escape_undecodable(entry.path)}: {reason}") from None
                    left_out[escape_undecodable(entry.path)] = reason
                    continue
                identity = (info.st_dev, info.st_ino)
            else:
                identity = (key[0], entry.inode())  # (free: read with the folder's listing)
            if identity in files_read:
                left_out[escape_undecodable(entry.path)] = (f"the same file as {escape_undecodable(files_read[identity])}"
                                                            " (a link to it): read once")
                continue
            files_read[identity] = entry.path
            files.append(Path(entry.path))
        stack.extend(reversed(below))  # sub-folders by name, each after the one before it and all below it
    return files


def _read_list(source: Path) -> List[Path]:
    """The image files a ``.txt`` / ``.csv`` list names, each a regular file named once; the
    list itself a regular file within the input ceiling."""
    root = source.parent
    files: List[Path] = []
    seen: Dict[Tuple[int, int], Tuple[int, str]] = {}  # (device, inode) -> (line, entry): one file however spelled
    repeated: List[str] = []
    number = 0
    try:
        with open_input(source) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
            rows = csv.reader(handle) if source.suffix.lower() == ".csv" else ([line] for line in handle)
            for number, row in enumerate(rows, 1):
                entry = (row[0] if row else "").strip()
                if not entry or entry.startswith("#") or (number == 1 and entry.lower() in ("path", "image")):
                    continue
                path = Path(entry) if os.path.isabs(entry) else root / entry
                try:
                    info = os.stat(path)
                except (OSError, ValueError):  # missing, a broken link, a name with a NUL byte, too long
                    raise ValueError(f"{source}: line {number}: no such image file {_shown(entry)}") from None
                if not stat.S_ISREG(info.st_mode):
                    raise ValueError(f"{source}: line {number}: {_shown(entry)} is {file_kind(info.st_mode)}, not a "
                                     "regular image file")
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    line, first = seen[key]
                    named = f"both name {_shown(entry)}" if first == entry else \
                        f"name the same file ({_shown(first)} and {_shown(entry)})"
                    repeated.append(f"lines {line} and {number} {named}")
                    continue
                seen[key] = (number, entry)
                files.append(path)
    except UnicodeDecodeError:
        raise ValueError(f"{source}: line {number + 1} is not UTF-8 text (save the list as UTF-8)") from None
    except csv.Error as err:  # e.g. a quoted field running past the csv module's field size limit
        raise ValueError(f"{source}: line {number + 1} is not a CSV row ({err})") from None
    if repeated:
        more = f" (and {len(repeated) - 1} more repeated entries)" if len(repeated) > 1 else ""
        raise ValueError(f"{source}: {repeated[0]}{more}; a list names each image once (a repeated one would be "
                         "trained on more often than the others)")
    if not files:
        raise ValueError(f"{source}: lists no image files")
    return files


_SHOWN_ENTRY = 200  # characters of a list entry an error shows


def _shown(entry: str) -> str:
    """An entry of a list file as an error names it: quoted, cut short when long."""
    if len(entry) <= _SHOWN_ENTRY:
        return repr(entry)
    return f"{entry[:_SHOWN_ENTRY]!r}... ({len(entry)} characters)"


def hash_fraction(relative: str) -> float:
    """Where the name ``relative`` (a path relative to its collection, or a sample's key) falls
    in ``[0, 1)``: the first 8 bytes of the SHA-1 of its UTF-8 (``/`` separators). What puts a
    file, or a sample of an iterable source (:func:`~contrastkit.data.split_of_key`), in val or test."""
    # os.fsencode: a name's UTF-8 bytes (those of every name that reaches here are valid UTF-8)
    digest = hashlib.sha1(os.fsencode(relative.replace(os.sep, "/"))).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


#: The splits of a collection, in the order the hash range gives them (test lowest).
SPLITS = ("train", "val", "test")


def split_by_hash(names: Sequence[str], val_fraction: float = 0.1, test_fraction: float = 0.2) -> List[str]:
    """The split (``"train"``, ``"val"`` or ``"test"``) of each of ``names`` (paths relative
    to the collection, or sample keys), a function of the names alone.

    Each name falls in test when its :func:`hash_fraction` is below ``test_fraction``, in val
    when it is below ``test_fraction + val_fraction``, else in train: adding names never moves
    a name between splits. A small collection can leave a split without a name that way (3
    names all fall in train 34 % of the time at the default fractions); then, while a split is
    empty, it takes from the largest split (ties: train, val, test) the name whose position is
    nearest its own share of the hash range (ties: the lower name). So from 3 names on every
    split has one, the names so lent being the only ones that may move as names are added,
    back to where their hash puts them once their split has names of its own. Fewer than 3
    names cannot fill three splits: a ``ValueError``."""
    if len(names) < len(SPLITS):
        raise ValueError(f"{len(names)} names cannot fill the {len(SPLITS)} splits train, val and test")
    bounds = {"test": (0.0, test_fraction), "val": (test_fraction, test_fraction + val_fraction),
              "train": (test_fraction + val_fraction, 1.0)}
    positions = [hash_fraction(name) for name in names]
    parts = [next(part for part, (_, high) in bounds.items() if p < high or part == "train") for p in positions]
    members: Dict[str, List[int]] = {part: [i for i, got in enumerate(parts) if got == part] for part in SPLITS}
    for part in SPLITS:
        if members[part]:
            continue
        donor = max(SPLITS, key=lambda other: (len(members[other]), -SPLITS.index(other)))
        low, high = bounds[part]
        lent = min(members[donor], key=lambda i: (max(low - positions[i], positions[i] - high, 0.0), names[i]))
        members[donor].remove(lent)
        members[part].append(lent)
        parts[lent] = part
    return parts


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
        from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

        preprocessing = ImagePreprocessing(self.color, (self.size, self.size), SHORTER_SIDE_THEN_CENTRE_CROP)
        return read_image_file(preprocessing, self.path(index)), NO_LABEL

    def record_skipped(self, index: int, reason: str) -> None:
        """Note that item ``index`` was dropped (``bad_files="skip"``)."""
        self.skipped[self.path(index)] = reason


def fit_image(path: Path, color: str, size: int) -> np.ndarray:
    """The image at ``path`` as ``(C, size, size)`` uint8 by the collection's rules; a
    ``ValueError`` naming the file when it cannot be read (or is over the pixel ceiling)."""
    from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

    return ImagePreprocessing(color, (size, size), SHORTER_SIDE_THEN_CENTRE_CROP).read(path)


class CollectionDataset:
    """An unlabeled collection's three splits (:class:`ImageCollection`), with the names a run
    reads: ``name``, ``class_names`` (none), ``num_classes`` (0), ``image_shape``; streamed."""

    streamed = True
    source = "collection"
    has_realisations = False

    def __init__(self, name: str, train: ImageCollection, val: ImageCollection, test: ImageCollection,
                 left_out: Optional[Dict[str, str]] = None) -> None:
        self.name = name
        #: The files the listing left out (``{escaped path: reason}``: a name that is not UTF-8, a
        #: link to nothing, a second link to a file or folder already listed), in no split.
        self.left_out: Dict[str, str] = dict(left_out or {})
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


def check_unlabeled_options(val_fraction: float, test_fraction: float, color: Optional[str],
                            bad_files: str) -> Tuple[float, float]:
    """The options of image files split by the SHA-1 of their names (a collection, tar shards)
    checked, each refused naming it: the val and test fractions (returned), the colour
    (``None``, ``"L"``, ``"RGB"``) and ``bad_files``."""
    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    if color is not None and color not in ("L", "RGB"):
        raise ValueError(f"color must be None, 'L' or 'RGB', got {color!r}")
    if bad_files not in BAD_FILES:
        raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
    return val_fraction, test_fraction


def open_collection(source: Union[str, os.PathLike], *, size: Optional[int] = None, val_fraction: float = 0.1,
                    test_fraction: float = 0.2, color: Optional[str] = None,
                    bad_files: str = "skip") -> CollectionDataset:
    """The unlabeled collection at ``source`` (a folder, or a ``.txt`` / ``.csv`` list of image
    paths) by the rules of :mod:`contrastkit.data.collection`. Only the file index is read."""
    from contrastkit.data.files import GRAY_MODES, open_image

    size = DEFAULT_SIZE if size is None else check_image_size(size, "size")
    val_fraction, test_fraction = check_unlabeled_options(val_fraction, test_fraction, color, bad_files)
    root, files, left_out = _index(source, bad_files)
    if color is None:
        modes = []
        for path in files[:_COLOR_SAMPLE]:
            try:
                with open_image(path) as image:
                    modes.append(image.mode)
            except (ValueError, OSError):
                continue  # a damaged (or already removed) file decides nothing
        color = "L" if modes and all(mode in GRAY_MODES for mode in modes) else "RGB"
    if len(files) < len(SPLITS):
        raise ValueError(f"{source}: {len(files)} image{'s' if len(files) != 1 else ''} in all: a collection needs "
                         "at least 3, one each for the train, val and test splits (add images)")
    relative = [os.path.relpath(path, root) for path in files]
    parts: Dict[str, List[Path]] = {part: [] for part in SPLITS}
    for path, part in zip(files, split_by_hash(relative, val_fraction, test_fraction)):
        parts[part].append(path)
    parts = {part: sorted(paths) for part, paths in parts.items()}
    splits = {part: ImageCollection(paths, root, color=color, size=size, bad_files=bad_files)
              for part, paths in parts.items()}
    splits["train"].skipped.update(left_out)  # named with the damaged files the run meets
    name = Path(source).stem if Path(source).is_file() else (Path(source).resolve().name or "images")
    return CollectionDataset(name, splits["train"], splits["val"], splits["test"], left_out)


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
    """``"path<TAB>reason"`` of every damaged file a run met in ``dataset``'s splits, sorted, one
    line each: a byte of a path that is not UTF-8, and a control character (a newline or a tab
    in a file name), written ``\\xNN``."""
    return [f"{escape_line(path)}\t{escape_line(reason)}" for path, reason in sorted(skipped_reasons(dataset).items())]
