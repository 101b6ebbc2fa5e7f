"""Loading data sets from disk, with the format detected from what the path holds.

Formats:

* a ``.npz`` file with ``x_train, y_train, x_test, y_test`` (optionally ``x_val, y_val``);
  images ``NHW``, ``NHWC`` or ``NCHW`` (C in 1, 3), uint8 (0..255) or float in ``[0, 1]``;
* a folder of CIFAR-10 python batches ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``
  (optionally inside ``cifar-10-batches-py/``; ``batches.meta`` supplies class names);
* a folder of MNIST idx files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``);
* a folder of class subfolders of images (``root/<class>/<image>``), or of ``train/``,
  ``test/`` (and optionally ``val/``) folders that each hold class subfolders.

A validation split is carved out of the training data (stratified by class, ``val_fraction``,
fixed ``split_seed``) unless the data bring one. A class-subfolder tree without ``train/`` and
``test/`` is split three ways (``test_fraction``). Every malformed input raises one
``ValueError`` (or ``FileNotFoundError`` for a missing file) that names the file.

CIFAR batches are pickles; they are read with an unpickler that only admits the numpy
array constructors such files contain, so a crafted file cannot run code.

Reading is bounded: only regular files are opened (a FIFO or ``/dev/zero`` is refused before
reading), no file, decompressed stream, set of arrays or decoded image set may exceed the
input ceiling (:func:`contrastkit._io.max_input_bytes`, ``$CONTRASTKIT_MAX_INPUT_BYTES``,
default 4 GiB), and every size a header declares (idx dimensions, ``.npy`` shapes inside a
``.npz``, image dimensions) is checked against the ceiling and against what the file holds
before memory is allocated for it; a gzip stream is read up to its declared size and no
further.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import pickle
import struct
import zipfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from contrastkit._io import (check_input_size, memory_guard, one_line, open_input, read_exactly, read_input,
                             read_npy_header)
from contrastkit.data.base import (Dataset, Split, check_fraction, stratified_split, subset, to_float_images,
                                   to_labels)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

SizeLike = Union[None, int, Tuple[int, int]]


# ----------------------------------------------------------------------------------------
# options

def resolve_size(size: SizeLike) -> Optional[Tuple[int, int]]:
    if size is None:
        return None
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (int(size), int(size))
    try:
        h, w = (int(v) for v in size)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"size must be None, an integer or a pair (height, width), got {size!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, got {size!r}")
    return h, w


def _resize(images: Tensor, size: Optional[Tuple[int, int]]) -> Tensor:
    if size is None or tuple(images.shape[-2:]) == size:
        return images
    check_input_size(math.prod(images.shape[:2]) * size[0] * size[1] * images.element_size(),
                     f"size={size[0]}x{size[1]}: {images.shape[0]} resized images")
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False,
                         antialias=True).clamp_(0.0, 1.0).contiguous()


def _carve_val(images: Tensor, labels: Tensor, val_fraction: float, split_seed: int,
               source: Path) -> Tuple[Split, Split]:
    train_idx, val_idx = stratified_split(labels.numpy(), [1.0 - val_fraction, val_fraction], split_seed)
    if train_idx.size == 0 or val_idx.size == 0:
        raise ValueError(f"{source}: {labels.numel()} training samples are too few to carve out a "
                         f"non-empty validation split with val_fraction={val_fraction}")
    return subset(images, labels, train_idx), subset(images, labels, val_idx)


def _class_names(num_classes: int, names: Optional[Sequence[str]] = None) -> List[str]:
    if names is not None and len(names) >= num_classes:
        return [str(n) for n in names]
    return [str(i) for i in range(num_classes)]


def _check_nonempty(split: Split, what: str, source: Path) -> None:
    if len(split) == 0:
        raise ValueError(f"{source}: the {what} split is empty")


def _finish(name: str, source_kind: str, source: Path, train: Split, val: Split, test: Split,
            names: Optional[Sequence[str]] = None) -> Dataset:
    for what, split in (("train", train), ("val", val), ("test", test)):
        _check_nonempty(split, what, source)
    num_classes = int(max(int(s.labels.max()) for s in (train, val, test))) + 1
    samples = sum(len(s) for s in (train, val, test))
    if num_classes > max(samples, len(names or ())):
        raise ValueError(f"{source}: labels go up to {num_classes - 1} but there are only {samples} samples; "
                         "labels must be class indices 0, 1, ...")
    if names is not None and len(names) < num_classes:
        raise ValueError(f"{source}: labels go up to {num_classes - 1} but only {len(names)} class names are given")
    shapes = {tuple(s.images.shape[1:]) for s in (train, val, test)}
    if len(shapes) != 1:
        raise ValueError(f"{source}: train and test images differ in shape: {sorted(shapes)}")
    return Dataset(name=name, class_names=_class_names(num_classes, names), train=train, val=val, test=test,
                   source=source_kind)


# ----------------------------------------------------------------------------------------
# npz

def _nchw(array: np.ndarray, key: str, source: Path) -> np.ndarray:
    """Bring NHW / NHWC / NCHW to NCHW (channels 1 or 3)."""
    if array.ndim == 3:
        return array[:, None]
    if array.ndim == 4:
        if array.shape[3] in (1, 3):
            return array.transpose(0, 3, 1, 2)
        if array.shape[1] in (1, 3):
            return array
    raise ValueError(f"{source}: {key} must have shape (N, H, W), (N, H, W, C) or (N, C, H, W) with C in "
                     f"(1, 3), got {array.shape}")


_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError, RuntimeError,
                   KeyError, struct.error, UnicodeDecodeError)


def _read_member(archive: zipfile.ZipFile, key: str, path: Path) -> np.ndarray:
    """One ``.npy`` member of an archive, its header checked against the member's declared
    size before the data are read (and the data read up to that size, no further)."""
    what = f"{path} ({key})"
    info = archive.getinfo(f"{key}.npy")
    check_input_size(info.file_size, what)
    with archive.open(info) as member:
        header = read_npy_header(member, what)
        if header.kind == "c":
            raise ValueError(f"{what}: holds complex numbers ({header.descr}); store real images and labels")
        if header.data_offset + header.nbytes != info.file_size:
            raise ValueError(f"{what}: its header declares shape {header.shape} ({header.nbytes} bytes of "
                             f"{header.descr}) but the member holds {info.file_size - header.data_offset} bytes")
        data = read_exactly(member, header.nbytes, what)
    array = np.frombuffer(data, dtype=np.dtype(header.descr))
    return array.reshape(header.shape, order="F" if header.fortran_order else "C")


def _npz_arrays(path: Path) -> Dict[str, np.ndarray]:
    """The x_/y_ arrays of an ``.npz`` file, read within the input ceiling."""
    with open_input(path) as handle:
        try:
            archive = zipfile.ZipFile(handle)
        except _ARCHIVE_ERRORS as err:
            raise ValueError(f"{path}: not a readable .npz file ({one_line(err)})") from None
        with archive:
            keys = {name[:-4] for name in archive.namelist() if name.endswith(".npy")}
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in keys]
            if missing:
                raise ValueError(f"{path}: missing array(s) {', '.join(missing)} (found "
                                 f"{', '.join(sorted(keys)) or 'none'})")
            if ("x_val" in keys) != ("y_val" in keys):
                raise ValueError(f"{path}: x_val and y_val must be given together")
            wanted = [f"{x}_{part}" for part in ("train", "test", "val") for x in "xy" if f"{x}_{part}" in keys]
            check_input_size(sum(archive.getinfo(f"{k}.npy").file_size for k in wanted), str(path))
            arrays = {}
            for key in wanted:
                try:
                    arrays[key] = _read_member(archive, key, path)
                except _ARCHIVE_ERRORS as err:
                    if isinstance(err, ValueError) and str(err).startswith(str(path)):
                        raise
                    raise ValueError(f"{path}: cannot read {key} ({one_line(err)})") from None
    return arrays


def load_npz(path: Path, *, size: SizeLike = None, val_fraction: float = 0.1, split_seed: int = 0) -> Dataset:
    path, size = Path(path), resolve_size(size)
    arrays = _npz_arrays(path)
    parts = ["train", "test"] + (["val"] if "x_val" in arrays else [])
    loaded: Dict[str, Split] = {}
    for part in parts:
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim == 0 or y.ndim == 0:
            raise ValueError(f"{path}: x_{part} and y_{part} must be arrays, not scalars")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{path}: x_{part} has {x.shape[0]} images but y_{part} has {y.shape[0]} labels")
        images = to_float_images(_nchw(x, f"x_{part}", path), f"{path} (x_{part})")
        labels = to_labels(y, f"{path} (y_{part})")
        if images.shape[0] == 0:
            raise ValueError(f"{path}: x_{part} is empty")
        loaded[part] = Split(images=_resize(images, size), labels=labels)
    if "val" in loaded:
        train, val = loaded["train"], loaded["val"]
    else:
        train, val = _carve_val(loaded["train"].images, loaded["train"].labels, val_fraction, split_seed, path)
    return _finish(path.stem, "npz", path, train, val, loaded["test"])


# ----------------------------------------------------------------------------------------
# MNIST idx

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an idx file (MNIST format, optionally gzipped) with ``ndim`` dimensions.

    The data are read up to the size the header declares (which must be within the input
    ceiling) and no further: a file, or a gzip stream, holding more or less is refused.
    """
    path = Path(path)
    with open_input(path) as handle:
        try:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=handle, mode="rb") as stream:
                    return _read_idx_stream(stream, path, ndim, None)
            return _read_idx_stream(handle, path, ndim, os.fstat(handle.fileno()).st_size)
        except (OSError, EOFError, zlib.error) as err:
            raise ValueError(f"{path}: cannot read ({one_line(err)})") from None


def _read_idx_stream(stream, path: Path, ndim: int, file_size: Optional[int]) -> np.ndarray:
    magic = stream.read(4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
        raise ValueError(f"{path}: not an idx file (bad magic number)")
    code, got_ndim = magic[2], magic[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown idx data type code 0x{code:02X}")
    if got_ndim != ndim:
        raise ValueError(f"{path}: expected an idx file with {ndim} dimension(s), got {got_ndim}")
    raw = stream.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise ValueError(f"{path}: truncated idx header")
    dims = struct.unpack(">" + "I" * ndim, raw)
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize  # exact: Python integers do not overflow
    check_input_size(expected, f"{path} (header shape {dims})")
    header = 4 + 4 * ndim
    if file_size is not None and file_size - header != expected:
        raise ValueError(f"{path}: header says shape {dims} ({expected} bytes of data) but the file holds "
                         f"{file_size - header} bytes")
    data = read_exactly(stream, expected, str(path), exact=False)
    if len(data) != expected or stream.read(1):
        held = f"{len(data)} bytes" if len(data) != expected else "more"
        raise ValueError(f"{path}: header says shape {dims} ({expected} bytes of data) but the "
                         f"{'stream' if file_size is None else 'file'} holds {held}")
    return np.frombuffer(data, dtype=dtype).reshape(dims)


def _find_mnist_file(folder: Path, base: str) -> Path:
    dotted = base.replace("-idx", ".idx")  # e.g. train-images.idx3-ubyte (a common re-packaging)
    for name in (base, base + ".gz", dotted, dotted + ".gz"):
        if os.path.lexists(folder / name):  # a FIFO or device is refused when read
            return folder / name
    raise FileNotFoundError(f"{folder}: missing MNIST file {base} (or {base}.gz)")


def _is_mnist(folder: Path) -> bool:
    with os.scandir(folder) as listing:
        return any(entry.name.startswith(("train-images", "t10k-images", "train-labels", "t10k-labels"))
                   for entry in listing)


def load_mnist(folder: Path, *, size: SizeLike = None, val_fraction: float = 0.1, split_seed: int = 0) -> Dataset:
    folder, size = Path(folder), resolve_size(size)
    files = {key: _find_mnist_file(folder, base) for key, base in MNIST_FILES.items()}
    splits = {}
    for part in ("train", "test"):
        images_file, labels_file = files[f"{part}_images"], files[f"{part}_labels"]
        x = read_idx(images_file, 3)
        y = read_idx(labels_file, 1)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{labels_file}: {y.shape[0]} labels but {images_file.name} holds {x.shape[0]} images")
        if x.shape[0] == 0:
            raise ValueError(f"{images_file}: no images")
        images = to_float_images(np.asarray(x)[:, None], str(images_file))
        splits[part] = (_resize(images, size), to_labels(np.asarray(y), str(labels_file)))
    train, val = _carve_val(*splits["train"], val_fraction, split_seed, files["train_images"])
    test = Split(images=splits["test"][0], labels=splits["test"][1])
    return _finish("mnist", "mnist", folder, train, val, test)


# ----------------------------------------------------------------------------------------
# CIFAR-10 python batches

_SAFE_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only admits the numpy constructors a CIFAR batch needs."""

    def find_class(self, module: str, name: str):  # noqa: D401
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_pickle(path: Path) -> dict:
    # Unpickled from memory: the unpickler asks a file for as many bytes as a crafted length
    # claims, while a BytesIO returns only what the (bounded) file holds.
    data = read_input(path)
    try:
        obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
            IndexError, KeyError, OSError, struct.error, RecursionError, OverflowError, LookupError) as err:
        raise ValueError(f"{path}: not a readable CIFAR batch pickle ({one_line(err)})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    # Python 2 pickles (the official files) have bytes keys; normalise to str.
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _read_cifar_batch(path: Path) -> Tuple[Tensor, Tensor]:
    batch = _read_pickle(path)
    if "data" not in batch or "labels" not in batch:
        raise ValueError(f"{path}: a CIFAR-10 batch needs 'data' and 'labels' entries, found {sorted(batch)}")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: 'data' must have shape (N, 3072), got {data.shape}")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(f"{path}: {labels.shape[0] if labels.ndim else 0} labels for {data.shape[0]} images")
    if data.shape[0] == 0:
        raise ValueError(f"{path}: the batch is empty")
    images = to_float_images(data.reshape(-1, 3, 32, 32), str(path))
    return images, to_labels(labels, str(path))


def _is_cifar(folder: Path) -> bool:
    return any((folder / name).exists() for name in CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,))


def load_cifar10(folder: Path, *, size: SizeLike = None, val_fraction: float = 0.1, split_seed: int = 0) -> Dataset:
    folder, size = Path(folder), resolve_size(size)
    if (folder / "cifar-10-batches-py").is_dir():
        folder = folder / "cifar-10-batches-py"
    for name in CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,):
        if not os.path.lexists(folder / name):  # a FIFO or device is refused when read
            raise FileNotFoundError(f"{folder}: missing CIFAR-10 file {name}")
    parts = [_read_cifar_batch(folder / name) for name in CIFAR_TRAIN_FILES]
    train_images = torch.cat([p[0] for p in parts])
    train_labels = torch.cat([p[1] for p in parts])
    test_images, test_labels = _read_cifar_batch(folder / CIFAR_TEST_FILE)
    names: Optional[List[str]] = None
    meta_file = folder / "batches.meta"
    if os.path.lexists(meta_file):
        meta = _read_pickle(meta_file)
        raw = meta.get("label_names")
        if raw is None or not isinstance(raw, (list, tuple)):
            raise ValueError(f"{meta_file}: expected a 'label_names' list")
        names = [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in raw]
    elif max(int(train_labels.max()), int(test_labels.max())) < 10:
        names = CIFAR10_CLASSES
    train, val = _carve_val(_resize(train_images, size), train_labels, val_fraction, split_seed, folder)
    test = Split(images=_resize(test_images, size), labels=test_labels)
    return _finish("cifar10", "cifar10", folder, train, val, test, names)


# ----------------------------------------------------------------------------------------
# folders of class subfolders

GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}


def _list_class_folders(root: Path) -> List[Path]:
    folders = []
    with os.scandir(root) as listing:  # a file's kind comes with the listing: no stat per file
        for entry in listing:
            if entry.name.startswith("."):
                continue
            try:
                is_folder = entry.is_dir()  # (follows a symbolic link)
            except OSError:
                is_folder = Path(entry.path).is_dir()  # (its rules for a link it cannot follow)
            if is_folder:
                folders.append(Path(entry.path))
    return sorted(folders)


def _has_images(folder: Path) -> bool:
    """Whether :func:`_list_images` lists any file below ``folder`` (stops at the first)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if any(not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS) for name in filenames):
            return True
    return False


def _list_images(folder: Path) -> List[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                files.append(Path(dirpath) / name)
    return files


_BYTES_PER_BAND = {"I": 4, "F": 4, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}


def _decoded_size(image: Any) -> int:
    return image.size[0] * image.size[1] * len(image.getbands()) * _BYTES_PER_BAND.get(image.mode, 1)


@contextlib.contextmanager
def open_image(path: Path, where: Optional[str] = None) -> Iterator[Any]:
    """The PIL image at ``path`` with only its header read (a regular file within the input
    ceiling); ``ValueError`` naming ``where`` (default the path) and the file when unreadable."""
    from PIL import Image  # lazy: pillow is an optional dependency

    with open_input(path, _image_label(path, where)) as handle:
        try:
            image = Image.open(handle)
        except Exception as err:  # PIL raises many kinds (UnidentifiedImageError, OSError, SyntaxError...)
            # PIL names the open handle (its descriptor number), not the file, which is named before.
            detail = "cannot identify image file" if isinstance(err, Image.UnidentifiedImageError) else one_line(err)
            raise ValueError(f"{_unreadable(path, where)} ({type(err).__name__}: {detail})") from None
        with image:
            yield image


def load_image(image: Any, path: Path, where: Optional[str] = None, already: int = 0) -> Any:
    """Decode an image from :func:`open_image` in place, once its dimensions show that it fits
    within the input ceiling together with ``already`` bytes decoded before it; usable until
    :func:`open_image`'s block ends (:func:`decode_image` keeps a copy)."""
    width, height = image.size
    check_input_size(already + _decoded_size(image), f"{_image_label(path, where)} ({width}x{height} {image.mode}"
                                                     f"{', with the images before it' if already else ''})")
    try:
        image.load()
        return image
    except Exception as err:  # PIL raises many kinds (OSError, SyntaxError, DecompressionBombError...)
        raise ValueError(f"{_unreadable(path, where)} ({type(err).__name__}: {one_line(err)})") from None


def decode_image(image: Any, path: Path, where: Optional[str] = None, already: int = 0) -> Any:
    """Decode an image from :func:`open_image` into memory (:func:`load_image`), as a copy that
    outlives the file."""
    return load_image(image, path, where, already).copy()


def draft_scale(image: Any, at_least: Tuple[int, int]) -> int:
    """Ask the decoder of ``image`` (from :func:`open_image`, not yet decoded) for its smallest
    version whose sides are each at least ``at_least`` ``(width, height)``, and return that
    version's scale ``s``: 1, 2, 4 or 8. A JPEG is then decoded at ``1/s`` of each side, by
    libjpeg's DCT scaling (PIL's ``Image.draft``), for a fraction of a full decode's time and
    memory; other formats decode whole (``s`` = 1). The decoded image holds the picture's
    ``(0, 0, width / s, height / s)`` region (its sides rounded up: the last row and column are
    partial), which is what a resize of it reads (:func:`to_array`'s ``box``)."""
    full_width = image.size[0]
    wanted = (max(1, int(at_least[0])), max(1, int(at_least[1])))
    drafted = image.draft(image.mode, wanted)  # None: the format decodes whole (all but JPEG)
    if not drafted:
        return 1
    return max(1, round(full_width / drafted[1][2]))


def decoded_region(full_size: Tuple[int, int], scale: int) -> Optional[Tuple[float, float, float, float]]:
    """The picture's region ``(0, 0, width / scale, height / scale)`` of a decode at ``1/scale``
    (:func:`draft_scale`) of a picture of ``full_size`` ``(width, height)``, as :func:`to_array`'s
    ``box``; ``None`` for a whole decode."""
    return None if scale == 1 else (0.0, 0.0, full_size[0] / scale, full_size[1] / scale)


def _image_label(path: Path, where: Optional[str]) -> str:
    return str(path) if where is None else f"{where}: image {str(path)!r}"


def _unreadable(path: Path, where: Optional[str]) -> str:
    return f"{path}: cannot read image" if where is None else f"{where}: cannot read image {str(path)!r}"


def _image_headers(files: Sequence[Path]) -> List[Tuple[str, Tuple[int, int]]]:
    """``(mode, (width, height))`` of each file, from its header alone."""
    headers = []
    for file in files:
        with open_image(file) as image:
            headers.append((image.mode, image.size))
    return headers


def flatten_colour(image: Any, color: str) -> Any:
    """The colour step of :mod:`contrastkit.data.preprocess` before ``color`` (``"L"`` or
    ``"RGB"``): transparent pixels (RGBA, LA, PA, a palette's transparency) composited over
    white, palette / CMYK / YCbCr / LAB / HSV / 1-bit images converted (to RGB, a 1-bit one to L
    for grey); other modes as they are (:func:`to_array` rescales 16- and 32-bit ones)."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if image.mode in ("P", "CMYK", "YCbCr", "LAB", "HSV", "1"):
        return image.convert("RGB" if color == "RGB" or image.mode != "1" else "L")
    return image


def _read_images(files: Sequence[Path], color: str, size: Tuple[int, int]) -> np.ndarray:
    """``files`` as ``(n, C, H, W)`` uint8 of ``size`` ``(H, W)``, each decoded at the smallest
    size that keeps ``size`` (:func:`draft_scale`) and converted before the next is read, by the
    colour and stretch steps a streamed class folder and an export's contract use
    (:mod:`contrastkit.data.preprocess`)."""
    height, width = size
    channels = 1 if color == "L" else 3
    check_input_size(len(files) * channels * height * width, f"{len(files)} images of {channels}x{height}x{width}")
    out = np.empty((len(files), channels, height, width), dtype=np.uint8)
    for i, file in enumerate(files):
        with open_image(file) as image:
            box = decoded_region(image.size, draft_scale(image, (width, height)))
            out[i] = to_array([flatten_colour(load_image(image, file), color)], color, size, box=box)[0]
    return out


#: The PIL resampling filter of every resize of an image file (``Image.BILINEAR``); an
#: export's input contract names it (:mod:`contrastkit.data.preprocess`).
RESAMPLE = "bilinear"


def pil_resample() -> Any:
    """PIL's constant for :data:`RESAMPLE`."""
    from PIL import Image

    return getattr(Image, RESAMPLE.upper())


def to_array(images, color: str, size: Tuple[int, int],
             box: Optional[Tuple[float, float, float, float]] = None) -> np.ndarray:
    """PIL ``images`` as ``(n, C, H, W)`` uint8 of ``size`` ``(H, W)`` in ``color``; ``box``: only
    that region of each (left, top, right, bottom, in its pixels) is resized (PIL's ``box``)."""
    from PIL import Image

    h, w = size
    channels = 1 if color == "L" else 3
    check_input_size(len(images) * channels * h * w, f"{len(images)} images of {channels}x{h}x{w}")
    out = np.empty((len(images), channels, h, w), dtype=np.uint8)
    for i, img in enumerate(images):
        if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            # PIL's own conversion of high-bit images to 8 bits clips; rescale instead
            # (16-bit by its full range, 32-bit int/float by the image's maximum).
            arr = np.asarray(img, dtype=np.float64)
            top = 65535.0 if img.mode.startswith("I;16") else max(float(arr.max()), 1.0)
            img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8))
        converted = img if img.mode == color else img.convert(color)
        if box is not None or converted.size != (w, h):
            converted = converted.resize((w, h), pil_resample(), box=box)
        arr = np.asarray(converted, dtype=np.uint8)
        out[i] = arr[None] if color == "L" else arr.transpose(2, 0, 1)
    return out


def _scan_tree(root: Path, class_names: Optional[List[str]] = None) -> Tuple[List[Path], List[int], List[str]]:
    folders = _list_class_folders(root)
    if not folders:
        raise ValueError(f"{root}: no class subfolders (expected {root}/<class>/<image files>)")
    names = [f.name for f in folders]
    if class_names is not None:
        extra = sorted(set(names) - set(class_names))
        if extra:
            raise ValueError(f"{root}: class folder(s) {', '.join(extra)} do not exist in the training folder")
    else:
        class_names = names
    files, labels = [], []
    for folder in folders:
        found = _list_images(folder)
        if not found:
            raise ValueError(f"{folder}: class folder holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
        files.extend(found)
        labels.extend([class_names.index(folder.name)] * len(found))
    return files, labels, class_names


def scan_image_tree(root: Path) -> Tuple[Dict[str, Tuple[List[Path], List[int]]], List[str]]:
    """The file index of an image folder: ``({part: (files, labels)}, class_names)`` with parts
    ``train``, ``test`` (and ``val``) when ``root`` has ``train/`` and ``test/`` folders, else
    one part ``all``. Nothing is decoded."""
    root = Path(root)
    if (root / "train").is_dir() and (root / "test").is_dir():
        train_files, train_labels, names = _scan_tree(root / "train")
        parts = {"train": (train_files, train_labels)}
        for part in ("val", "test"):
            if (root / part).is_dir():
                files, labels, _ = _scan_tree(root / part, names)
                parts[part] = (files, labels)
        return parts, names
    files, labels, names = _scan_tree(root)
    return {"all": (files, labels)}, names


def load_image_folder(root: Path, *, size: SizeLike = None, val_fraction: float = 0.1, test_fraction: float = 0.2,
                      split_seed: int = 0, color: Optional[str] = None) -> Dataset:
    """Load ``root/<class>/*`` or ``root/{train,val,test}/<class>/*`` images.

    ``color`` is ``"L"`` (grayscale), ``"RGB"``, or ``None``: grayscale when every image is
    grayscale, else RGB. ``size`` ``None`` keeps the common size when all images share one
    and resizes to 32x32 otherwise.
    """
    root = Path(root)
    if color is not None and color not in ("L", "RGB"):
        raise ValueError(f"color must be None, 'L' or 'RGB', got {color!r}")
    target = resolve_size(size)
    parts, names = scan_image_tree(root)
    has_parts = "all" not in parts
    every = [header for files, _ in parts.values() for header in _image_headers(files)]
    if color is None:
        color = "L" if all(mode in GRAY_MODES for mode, _ in every) else "RGB"
    if target is None:
        sizes = Counter((height, width) for _, (width, height) in every)
        target = next(iter(sizes)) if len(sizes) == 1 else (32, 32)
    tensors = {}
    for part, (files, _) in parts.items():
        images = to_float_images(_read_images(files, color, target), str(root))
        tensors[part] = (images, torch.tensor(parts[part][1], dtype=torch.int64))
    if has_parts:
        if "val" in tensors:
            train, val = Split(*tensors["train"]), Split(*tensors["val"])
        else:
            train, val = _carve_val(*tensors["train"], val_fraction, split_seed, root / "train")
        test = Split(*tensors["test"])
    else:
        test_fraction = check_fraction(test_fraction, "test_fraction")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
        images, labels = tensors["all"]
        idx = stratified_split(labels.numpy(), [1 - val_fraction - test_fraction, val_fraction, test_fraction],
                               split_seed)
        if any(i.size == 0 for i in idx):
            raise ValueError(f"{root}: {labels.numel()} images are too few for non-empty train/val/test splits "
                             f"(val_fraction={val_fraction}, test_fraction={test_fraction})")
        train, val, test = (subset(images, labels, i) for i in idx)
    return _finish(root.name or "images", "imagefolder", root, train, val, test, names)


# ----------------------------------------------------------------------------------------
# dispatch

def detect_format(path: Path) -> str:
    """``"npz"``, ``"cifar10"``, ``"mnist"``, ``"imagefolder"`` (class subfolders of images) or
    ``"collection"`` (unlabeled images: a ``.txt`` / ``.csv`` list of paths, or a folder whose
    images are not sorted into two or more class folders, :mod:`contrastkit.data.collection`)
    for ``path``; ValueError otherwise.

    A folder is a class tree when it holds no image of its own and two or more subfolders
    (or ``train/`` and ``test/``); loose images at its top, or a single subfolder, make it a
    collection, read whole and recursively, so that no image is left out without a word."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() == ".npz":
            return "npz"
        if path.suffix.lower() in (".txt", ".csv"):
            return "collection"
        raise ValueError(f"{path}: unsupported data file (expected a .npz archive, a .txt / .csv list of images "
                         "or a folder)")
    if not path.is_dir():
        if os.path.exists(path):
            raise ValueError(f"{path} is neither a regular file nor a folder (a device, FIFO or socket)")
        raise FileNotFoundError(f"{path}: no such file or folder")
    if (path / "cifar-10-batches-py").is_dir() or _is_cifar(path):
        return "cifar10"
    if _is_mnist(path):
        return "mnist"
    # Loose images: every entry named like an image that is not a folder, as a collection lists it
    # (a FIFO, a device or a link to nothing among them: named as unreadable when read, not ignored).
    with os.scandir(path) as listing:
        loose = any(not entry.name.startswith(".") and entry.name.lower().endswith(IMAGE_EXTENSIONS) and
                    not Path(entry.path).is_dir() for entry in listing)
    folders = _list_class_folders(path)
    if not loose and (len(folders) >= 2 or ((path / "train").is_dir() and (path / "test").is_dir())):
        return "imagefolder"
    if loose or any(_has_images(folder) for folder in folders):
        return "collection"
    raise ValueError(f"{path}: cannot recognise the data format: expected class subfolders of images, MNIST idx "
                     f"files, CIFAR-10 batches or a .npz file")


#: The labelled kinds :func:`detect_format` names, each read whole by :func:`load_labelled`.
LABELLED_KINDS = ("npz", "cifar10", "mnist", "imagefolder")


def load_path(path: Union[str, os.PathLike], **options: Any) -> Dataset:
    """Load the labelled data set at ``path``: its format detected by :func:`detect_format`,
    then :func:`load_labelled` (options as there). ``--data`` does not come here: it is
    resolved by the data-source registry (:func:`contrastkit.data.open_data`), which detects
    the format once and opens the kind it found; this is the same reading for a caller who
    has a path and wants it held in memory. An unlabeled collection is refused (it is streamed:
    :func:`contrastkit.data.open_collection`)."""
    kind = detect_format(Path(path))
    if kind == "collection":
        raise ValueError(f"{path} is an unlabeled image collection: open it with contrastkit.data.open_data or "
                         "open_collection (it is streamed)")
    return load_labelled(kind, path, **options)


def load_labelled(kind: str, path: Union[str, os.PathLike], *, size: SizeLike = None, val_fraction: float = 0.1,
                  test_fraction: float = 0.2, split_seed: int = 0, color: Optional[str] = None) -> Dataset:
    """Load the data set at ``path``, of the format ``kind`` (one of :data:`LABELLED_KINDS`, as
    :func:`detect_format` named it), held in memory.

    Args:
        size: resize every image to ``size`` (int or ``(H, W)``), bilinear with antialiasing;
            ``None`` keeps the stored size (image folders of mixed sizes: 32x32).
        val_fraction: share of the training data carved out (per class) for validation when
            the data have no validation split.
        test_fraction: share held out for testing, for an image folder without ``train/`` and
            ``test/`` subfolders only.
        split_seed: seed of those carve-outs (fixed default, independent of training seeds).
        color: image folders only: ``"L"``, ``"RGB"`` or ``None`` (grayscale if all images are).
    """
    if kind not in LABELLED_KINDS:
        raise ValueError(f"kind must be one of {LABELLED_KINDS}, got {kind!r}")
    path = Path(path)
    val_fraction = check_fraction(val_fraction, "val_fraction")
    size_hw = resolve_size(size)
    if isinstance(split_seed, bool) or not isinstance(split_seed, (int, np.integer)) or split_seed < 0:
        raise ValueError(f"split_seed must be a non-negative integer, got {split_seed!r}")
    if kind != "imagefolder" and color is not None:
        raise ValueError(f"color applies to image folders only; {path} holds {kind} data")
    with memory_guard(str(path)):
        if kind == "npz":
            return load_npz(path, size=size_hw, val_fraction=val_fraction, split_seed=split_seed)
        if kind == "cifar10":
            return load_cifar10(path, size=size_hw, val_fraction=val_fraction, split_seed=split_seed)
        if kind == "mnist":
            return load_mnist(path, size=size_hw, val_fraction=val_fraction, split_seed=split_seed)
        return load_image_folder(path, size=size_hw, val_fraction=val_fraction, test_fraction=test_fraction,
                                 split_seed=split_seed, color=color)
