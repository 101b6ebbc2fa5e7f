"""Streamed data: splits read item by item through ``torch.utils.data`` instead of held whole.

:class:`ImageFolderDataset` holds only the file index of a class-folder tree (the paths, as
one numpy byte array so that forked workers share its pages, and the labels); each image is
decoded by Pillow when it is asked for, in the ``DataLoader``'s workers. :class:`StreamingDataset`
puts three such splits (or any map-style ``torch.utils.data.Dataset`` returning
``(image, label)``) together with the names the training loop reads (``image_shape``,
``class_names``, ``num_classes``), like the in-memory :class:`~contrastkit.data.Dataset`.
:func:`as_streaming_pairs` does the same for data sets of ``(image, text)`` pairs
(:class:`CaptionedDataset` splits, a ``contrastkit.data.paired.StreamingPairedDataset``):
the texts are read once up front (the tokenizer is built from them), the images never.

They are read in batches by :mod:`contrastkit.data.loader` (decoded in ``DataLoader``
workers), and a run's batch makers take a streamed batch's images from
:mod:`contrastkit.data.batches`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Subset

from contrastkit.data.base import Split, check_fraction, stratified_split

__all__ = ["ImageFolderDataset", "StreamingDataset", "LabelledDataset", "CaptionedDataset", "BadItemError",
           "UnreadableImageError", "read_image_file", "stream_image_folder", "as_streaming", "as_streaming_pairs", "is_streaming",
           "in_memory", "subset_split", "unit_float"]


def unit_float(images: "torch.Tensor") -> "torch.Tensor":
    """A batch as the models read it: uint8 images (0..255, what streamed loaders deliver) as
    float32 in ``[0, 1]``; float images as float32, values unchanged."""
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()


class BadItemError(ValueError):
    """An item of a streamed split cannot be used (an unreadable image, an item that is not
    ``(image, label)`` / ``(image, text)``, an image of another shape); the message names the
    item (or its file) and what was wrong.

    A worker does not raise it (torch would re-raise it wrapped in the worker's traceback, and
    the other workers would be torn down mid-write): it marks the item, and the loader raises
    it in the main process (:func:`~contrastkit.data.loader.make_loader`), one line.
    """


class UnreadableImageError(BadItemError):
    """An image of a streamed folder cannot be read; the message names the file (a
    :class:`BadItemError`, raised in the main process)."""


def read_image_file(preprocessing: Any, path: str) -> Tensor:
    """The indexed image file ``path`` read by ``preprocessing`` (an
    :class:`~contrastkit.data.preprocess.ImagePreprocessing`) as ``(C, H, W)`` uint8; an
    :class:`UnreadableImageError` naming the file and why when it cannot be (damaged, not an
    image, over the pixel ceiling, gone since it was indexed, not readable, an I/O error)."""
    try:
        return torch.from_numpy(preprocessing.read(path))
    except ValueError as err:
        raise UnreadableImageError(str(err)) from None
    except FileNotFoundError:  # removed (or renamed) after the files were indexed
        raise UnreadableImageError(f"{path}: cannot read image (no such file: removed or renamed after the "
                                   "files were indexed)") from None
    except PermissionError:
        raise UnreadableImageError(f"{path}: cannot read image (permission denied)") from None
    except OSError as err:  # e.g. an I/O error of a disk or a network share
        raise UnreadableImageError(f"{path}: cannot read image ({type(err).__name__}: "
                                   f"{err.strerror or err})") from None


# -- the file index ------------------------------------------------------------------------

class ImageFolderDataset(torch.utils.data.Dataset):
    """Map-style data set of image files, decoded on access: item ``i`` is
    ``(image, label)``, ``image`` ``(C, H, W)`` uint8, ``label`` an int.

    Args:
        files: the image paths.
        labels: their class indices.
        color: ``"L"`` (1 channel) or ``"RGB"`` (3 channels).
        size: ``(H, W)``; an image of another size is resized (bilinear).

    Only the index is held: ``files`` as one numpy byte array, ``labels`` as an int64 tensor.
    An unreadable file raises :class:`UnreadableImageError` naming it.
    """

    def __init__(self, files: Sequence[Union[str, os.PathLike]], labels: Sequence[int], *, color: str,
                 size: Tuple[int, int]) -> None:
        if color not in ("L", "RGB"):
            raise ValueError(f"color must be 'L' or 'RGB', got {color!r}")
        if len(files) != len(labels):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        # One byte array, not a list of str: forked workers then share the pages instead of
        # copying them as reference counts change.
        self.files = np.array([os.fsencode(str(f)) for f in files], dtype=np.bytes_)
        self.labels = torch.as_tensor(list(labels), dtype=torch.int64)
        self.color = color
        self.size = (int(size[0]), int(size[1]))

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        return (1 if self.color == "L" else 3, *self.size)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def path(self, index: int) -> str:
        """The file of item ``index``."""
        return os.fsdecode(self.files[index])

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        from contrastkit.data.preprocess import STRETCH, ImagePreprocessing  # the one reader of image files

        return read_image_file(ImagePreprocessing(self.color, self.size, STRETCH), self.path(index)), \
            int(self.labels[index])


class LabelledDataset(torch.utils.data.Dataset):
    """A user's map-style data set of ``(image, label)`` items as a split: ``labels`` (int64,
    from the data set's ``targets`` or ``labels`` attribute, else read once item by item) and
    items ``(image, label)`` with ``image`` a ``(C, H, W)`` tensor (uint8, or float in
    ``[0, 1]``; PIL images and numpy ``HWC`` arrays are converted)."""

    def __init__(self, dataset: Any, what: str = "dataset") -> None:
        _check_map_style(dataset, what)
        self.dataset = dataset
        self.what = what
        known = _labels_attribute(dataset)
        if known is None:
            known = [dataset[i][1] for i in range(len(dataset))]
        self.labels = torch.as_tensor(np.asarray(known), dtype=torch.int64).reshape(-1)
        if self.labels.shape[0] != len(dataset):
            raise ValueError(f"{what}: needs one non-negative integer label per item, got {self.labels.shape[0]} "
                             f"labels for {len(dataset)} items")
        if int(self.labels.min()) < 0:
            raise ValueError(f"{what}: needs one non-negative integer label per item, got {int(self.labels.min())} "
                             "(an unlabeled split, such as STL10's 'unlabeled', marks its items -1: give the "
                             "images as a folder with --unlabeled, or a labelled split)")
        first = self[0][0]
        self.image_shape = tuple(int(s) for s in first.shape)
        self.item_dtype = first.dtype  # the loader's blank for a bad item matches the others
        if len(self.image_shape) != 3:
            raise ValueError(f"{what}: item 0's image has shape {self.image_shape}; expected (C, H, W)")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        image, label = _two_fields(self.dataset[index], self.what, index, "label")
        return _as_image_tensor(image, f"{self.what} item {index}", getattr(self, "image_shape", None)), int(label)


class CaptionedDataset(torch.utils.data.Dataset):
    """A user's map-style data set of ``(image, text)`` items as a streamed paired split.

    Item ``i`` is ``(image, text)``: ``image`` a ``(C, H, W)`` tensor (uint8, or float in
    ``[0, 1]``; PIL images and numpy ``HWC`` arrays are converted), every one of item 0's
    shape; ``text`` a non-empty ``str``. Held: ``texts`` (the data set's ``texts`` attribute,
    else read once item by item, each image decoded and dropped), ``labels`` (int64, from a
    ``targets`` or ``labels`` attribute, else ``None``: the pairs alone) and ``image_shape``
    (item 0's); never the images. A bad item raises :class:`BadItemError` naming its index.
    """

    def __init__(self, dataset: Any, what: str = "dataset") -> None:
        from contrastkit.data.paired import check_texts

        n = _check_map_style(dataset, what)
        self.dataset, self.what = dataset, what
        self.image_shape: Optional[Tuple[int, ...]] = None
        self.image_shape = tuple(int(s) for s in self._item(0)[0].shape)
        known = getattr(dataset, "texts", None)
        if known is None:  # one pass over the items: the texts are kept, each image dropped
            self.texts = [self._item(i)[1] for i in range(n)]
        else:
            self.texts = check_texts(known, f"{what}.texts")
            if len(self.texts) != n:
                raise ValueError(f"{what}: {len(self.texts)} texts for {n} items")
        labels = _labels_attribute(dataset)
        self.labels: Optional[Tensor] = None
        if labels is not None:
            self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).reshape(-1)
            if self.labels.shape[0] != n or int(self.labels.min()) < 0:
                raise ValueError(f"{what}: its labels (targets) must be one non-negative integer per item")

    def __len__(self) -> int:
        return len(self.dataset)

    def _item(self, index: int) -> Tuple[Tensor, str]:
        image, text = _two_fields(self.dataset[index], self.what, index, "text")
        if not isinstance(text, str) or not text.strip():
            shown = repr(text) if isinstance(text, str) else type(text).__name__
            raise BadItemError(f"{self.what}: item {index}'s text must be a non-empty str, got {shown}")
        return _as_image_tensor(image, f"{self.what} item {index}", self.image_shape), text

    def __getitem__(self, index: int) -> Tuple[Tensor, str]:
        return self._item(index)


def _check_map_style(dataset: Any, what: str) -> int:
    """The length of a user's map-style data set; ``TypeError`` / ``ValueError`` naming ``what``
    when it is not one, or is empty."""
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"{what} must be a map-style torch.utils.data.Dataset (with __getitem__ and "
                        f"__len__), got {type(dataset).__name__}")
    n = len(dataset)
    if n == 0:
        raise ValueError(f"{what} is empty")
    return n


def _class_names(dataset: Any, needed: int) -> Optional[List[str]]:
    """A data set's ``classes`` attribute as names (a torchvision data set's: ``ImageFolder``'s
    folder names, ``CIFAR10``'s ``airplane`` ...), when it names at least ``needed`` classes."""
    names = getattr(dataset, "classes", None)
    if isinstance(names, (list, tuple)) and len(names) >= needed and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def _labels_attribute(dataset: Any) -> Any:
    """A data set's ``targets`` attribute, else its ``labels`` one, else ``None``."""
    known = getattr(dataset, "targets", None)
    return getattr(dataset, "labels", None) if known is None else known


def _two_fields(item: Any, what: str, index: int, second: str) -> Tuple[Any, Any]:
    """``(image, second)`` of item ``index``; :class:`BadItemError` when it is not a pair."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        shown = f"a {type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) else type(item).__name__
        raise BadItemError(f"{what}: item {index} must be (image, {second}), got {shown}")
    return item[0], item[1]


def _as_image_tensor(image: Any, what: str, shape: Optional[Tuple[int, ...]] = None) -> Tensor:
    """An item's image as a ``(C, H, W)`` tensor (uint8, or float32 in ``[0, 1]``), of ``shape``
    when given; :class:`BadItemError` naming ``what`` otherwise."""
    if not isinstance(image, Tensor):
        kind = type(image).__name__
        if hasattr(image, "mode") and hasattr(image, "size"):  # a PIL image
            image = np.asarray(image.convert("RGB" if image.mode not in ("L", "1") else "L"))
        try:
            array = np.asarray(image)
        except (TypeError, ValueError):  # e.g. a ragged list
            array = np.asarray(None)
        if array.ndim == 2:
            array = array[:, :, None]
        if array.ndim != 3 or array.dtype.kind not in "uif":
            raise BadItemError(f"{what}: the image must be a (C, H, W) tensor, a PIL image or an HWC array, "
                               f"got {kind}")
        image = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    if image.dim() != 3:
        raise BadItemError(f"{what}: the image must be (C, H, W), got shape {tuple(image.shape)}")
    if shape is not None and tuple(image.shape) != tuple(shape):
        raise BadItemError(f"{what}: the image has shape {tuple(image.shape)}, item 0's {tuple(shape)}; "
                           "every image must have the same")
    if image.dtype != torch.uint8:
        if not image.is_floating_point():
            raise BadItemError(f"{what}: the image must be uint8 or float in [0, 1], got {image.dtype}")
        if image.numel() and not (float(image.min()) >= 0.0 and float(image.max()) <= 1.0):
            raise BadItemError(f"{what}: float images must lie in [0, 1] (no NaN)")
        image = image.float()
    return image


# -- data sets of streamed splits ------------------------------------------------------------

class StreamingDataset:
    """Train / val / test splits read item by item; the streamed twin of
    :class:`~contrastkit.data.Dataset` (same ``name``, ``class_names``, ``num_classes``,
    ``image_shape``, ``source``, ``splits()``, ``summary()``). Each split is a
    map-style data set of ``(image, label)`` with a ``labels`` int64 tensor."""

    has_realisations = False
    streamed = True

    def __init__(self, name: str, class_names: Sequence[str], train: Any, val: Any, test: Any, *,
                 source: str = "imagefolder") -> None:
        self.name = name
        self.class_names = [str(c) for c in class_names]
        self.train, self.val, self.test = train, val, test
        self.source = source
        shapes = {tuple(_split_shape(s)) for s in (train, val, test)}
        if len(shapes) != 1:
            raise ValueError(f"{name}: the splits' images differ in shape: {sorted(shapes)}")
        self.image_shape: Tuple[int, int, int] = shapes.pop()  # type: ignore[assignment]
        for split_name, split in self.splits():
            if len(split) == 0:
                raise ValueError(f"{name}: the {split_name} split is empty")
            if int(split.labels.max()) >= self.num_classes:
                raise ValueError(f"{name}: {split_name} labels must lie in [0, {self.num_classes})")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def splits(self) -> List[Tuple[str, Any]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]

    def summary(self) -> str:
        c, h, w = self.image_shape
        sizes = ", ".join(f"{name} {len(split)}" for name, split in self.splits())
        return f"{self.name}: {c}x{h}x{w} images (streamed), {self.num_classes} classes; {sizes}"


class _SubsetSplit(Subset):
    """A ``Subset`` that keeps the split interface (``labels``, ``image_shape``; ``texts`` of
    a paired split)."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        super().__init__(dataset, [int(i) for i in indices])
        labels = getattr(dataset, "labels", None)
        self.labels = None if labels is None else labels[torch.as_tensor(self.indices, dtype=torch.long)]
        self.image_shape = dataset.image_shape
        texts = getattr(dataset, "texts", None)
        if texts is not None:
            self.texts = [texts[i] for i in self.indices]


def subset_split(split: Any, indices: Sequence[int]) -> Any:
    """The samples ``indices`` of a streamed split, keeping the split interface (``labels``,
    ``image_shape``, and ``texts`` for pairs); nothing is decoded."""
    return _SubsetSplit(split, indices)


def _split_shape(split: Any) -> Tuple[int, ...]:
    return tuple(split.image_shape)


def _carve(split: Any, fractions: Sequence[float], split_seed: int, source: str) -> List[_SubsetSplit]:
    """Parts of ``split`` of ``fractions``, stratified by label (uniformly at random without labels)."""
    labels = split.labels.numpy() if split.labels is not None else np.zeros(len(split), dtype=np.int64)
    parts = stratified_split(labels, list(fractions), split_seed)
    if any(part.size == 0 for part in parts):
        raise ValueError(f"{source}: {len(split)} images are too few for non-empty splits of fractions "
                         f"{[round(f, 4) for f in fractions]}")
    return [_SubsetSplit(split, part) for part in parts]


def in_memory(split: Any) -> bool:
    """Whether ``split`` holds its images as one tensor (a :class:`~contrastkit.data.Split`, or
    a paired split), rather than reading them item by item."""
    return isinstance(split, Split) or isinstance(getattr(split, "images", None), Tensor)


def is_streaming(dataset: Any) -> bool:
    """Whether ``dataset`` is read item by item (a :class:`StreamingDataset`)."""
    return bool(getattr(dataset, "streamed", False))


def stream_image_folder(root: Union[str, os.PathLike], *, size: Any = None, val_fraction: float = 0.1,
                        test_fraction: float = 0.2, split_seed: int = 0,
                        color: Optional[str] = None) -> StreamingDataset:
    """The class-folder tree at ``root`` as a :class:`StreamingDataset`: only the file index
    is read now, the images when they are asked for.

    The layout and the splits are those of :func:`~contrastkit.data.load_dataset` for an image folder
    (``root/<class>/*`` split three ways, or ``root/{train,val,test}/<class>/*`` with val carved
    from train; stratified, ``split_seed``), so both give the same train/val/test membership.
    ``color`` ``None`` and ``size`` ``None`` take the first image's (grayscale or RGB, its size);
    the images are not all opened up front to find out.
    """
    from PIL import Image

    from contrastkit.data.files import GRAY_MODES, resolve_size, scan_image_tree

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder")
    if color is not None and color not in ("L", "RGB"):
        raise ValueError(f"color must be None, 'L' or 'RGB', got {color!r}")
    val_fraction = check_fraction(val_fraction, "val_fraction")
    parts, names = scan_image_tree(root)
    has_parts = "all" not in parts
    first = next(iter(parts.values()))[0][0]
    try:
        with Image.open(first) as img:
            first_mode, (first_w, first_h) = img.mode, img.size
    except Exception as err:
        raise UnreadableImageError(f"{first}: cannot read image ({type(err).__name__}: {err})") from None
    color = color or ("L" if first_mode in GRAY_MODES else "RGB")
    target = resolve_size(size) or (first_h, first_w)
    splits = {part: ImageFolderDataset(files, labels, color=color, size=target)
              for part, (files, labels) in parts.items()}
    if has_parts:
        if "val" in splits:
            train, val = splits["train"], splits["val"]
        else:
            train, val = _carve(splits["train"], [1.0 - val_fraction, val_fraction], split_seed, str(root / "train"))
        test = splits["test"]
    else:
        test_fraction = check_fraction(test_fraction, "test_fraction")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
        train, val, test = _carve(splits["all"], [1 - val_fraction - test_fraction, val_fraction, test_fraction],
                                  split_seed, str(root))
    return StreamingDataset(root.name or "images", names, train, val, test, source="imagefolder")


def as_streaming(train: Any, val: Any = None, test: Any = None, *, class_names: Optional[Sequence[str]] = None,
                 name: str = "dataset", val_fraction: float = 0.1, test_fraction: float = 0.2,
                 split_seed: int = 0) -> Any:
    """A :class:`StreamingDataset` of a user's map-style data sets of ``(image, label)``.

    Without ``val`` (and ``test``), they are carved out of ``train`` (stratified by label,
    ``split_seed``). ``class_names`` default to ``train``'s ``classes`` attribute (a torchvision
    data set's), else ``"0"`` ... up to the largest label. Data sets of ``(image, text)`` pairs (a ``texts`` attribute, or item 0's second element a
    ``str``) go to :func:`as_streaming_pairs`, with the same options.
    """
    if _has_texts(train):
        return as_streaming_pairs(train, val, test, class_names=class_names, name=name,
                                  val_fraction=val_fraction, test_fraction=test_fraction, split_seed=split_seed)
    splits = _three_splits({"train": LabelledDataset(train, "train")}, val, test, LabelledDataset,
                           val_fraction, test_fraction, split_seed)
    top = max(int(s.labels.max()) for s in splits.values())
    if class_names is None:  # the training set's own names (torchvision's classes), else the label numbers
        own = _class_names(train, top + 1)
        class_names = own if own is not None else [str(i) for i in range(top + 1)]
    return StreamingDataset(name, class_names, splits["train"], splits["val"], splits["test"], source=name)


def as_streaming_pairs(train: Any, val: Any = None, test: Any = None, *,
                       class_names: Optional[Sequence[str]] = None,
                       class_prompts: Optional[Dict[str, List[str]]] = None, name: str = "pairs",
                       val_fraction: float = 0.1, test_fraction: float = 0.2, split_seed: int = 0) -> Any:
    """A ``contrastkit.data.paired.StreamingPairedDataset`` of a user's map-style data
    sets of ``(image, text)`` pairs (each a :class:`CaptionedDataset` split), for ``convirt``
    and ``siglip``.

    The texts are read once now (the run's tokenizer is built from the training texts): from a
    ``texts`` attribute, else from one pass over the items; the images are decoded when a
    batch asks for them (in ``DataLoader`` workers). Labels, optional, come from a ``targets``
    or ``labels`` attribute (all splits or none); with them the run also reads out the image
    probe and zero-shot accuracy. Without ``val`` (and ``test``), they are carved out of
    ``train`` (stratified by label, else uniformly; ``split_seed``): pass them when several
    items share an image, so that it stays in one split. ``class_names`` default to ``"0"``
    ... up to the largest label, ``class_prompts`` (zero-shot texts per class name) to each
    class name itself (as the CSV loader does).

    >>> pairs = as_streaming_pairs(my_train, test=my_test)    # doctest: +SKIP
    >>> pretrain(PretrainConfig(method="convirt", data="glyphlab-text"), dataset=pairs)   # doctest: +SKIP
    """
    from contrastkit.data.paired import StreamingPairedDataset

    splits = _three_splits({"train": CaptionedDataset(train, "train")}, val, test, CaptionedDataset,
                           val_fraction, test_fraction, split_seed)
    labelled = [key for key, split in splits.items() if split.labels is not None]
    if labelled and len(labelled) != len(splits):
        raise ValueError(f"labels (a targets or labels attribute) must be given for all splits or none; "
                         f"{', '.join(labelled)} have them, {', '.join(k for k in splits if k not in labelled)} not")
    if not labelled and class_names:
        raise ValueError("class_names were given but the pairs carry no labels (a targets or labels attribute)")
    if labelled and class_names is None:
        top = max(int(s.labels.max()) for s in splits.values())
        class_names = [str(i) for i in range(top + 1)]
    names = [str(c) for c in (class_names or [])]
    prompts = {c: [c] for c in names} if class_prompts is None else {str(k): list(v) for k, v in class_prompts.items()}
    return StreamingPairedDataset(name=name, train=splits["train"], val=splits["val"], test=splits["test"],
                                  class_names=names, class_prompts=prompts, source=name)


def _has_texts(dataset: Any) -> bool:
    """Whether a user's data set holds ``(image, text)`` pairs: a ``texts`` attribute, or item
    0's second element a ``str`` (anything else is left to the (image, label) path's checks)."""
    if getattr(dataset, "texts", None) is not None:
        return True
    try:
        if not len(dataset):
            return False
        item = dataset[0]
    except Exception:  # not a map-style data set: LabelledDataset says so
        return False
    return isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], str)


def _three_splits(splits: Dict[str, Any], val: Any, test: Any, wrap: Any, val_fraction: float,
                  test_fraction: float, split_seed: int) -> Dict[str, Any]:
    """``splits`` (with ``train``) completed with ``val`` and ``test``: the given ones wrapped
    by ``wrap``, the missing ones carved out of ``train``."""
    for what, given in (("val", val), ("test", test)):
        if given is not None:
            splits[what] = wrap(given, what)
    val_fraction = check_fraction(val_fraction, "val_fraction")
    if "test" not in splits:
        test_fraction = check_fraction(test_fraction, "test_fraction")
        rest = 1.0 - test_fraction
        kept, splits["test"] = _carve(splits["train"], [rest, test_fraction], split_seed, "train")
        splits["train"] = kept
    if "val" not in splits:
        splits["train"], splits["val"] = _carve(splits["train"], [1.0 - val_fraction, val_fraction], split_seed,
                                                "train")
    return splits
