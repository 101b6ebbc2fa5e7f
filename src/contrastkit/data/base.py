"""The data set interface shared by every loader: :class:`Dataset` with three :class:`Split` s.

Images are float32 tensors in ``[0, 1]`` with shape ``(n, C, H, W)``; labels are int64 with
shape ``(n,)``. Everything is held in memory: the data sets this package targets (GlyphLab,
digits, MNIST, CIFAR-10) are small enough, and keeping them as tensors lets the view makers
index and augment whole batches on the training device.
"""

from __future__ import annotations

import inspect

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

#: The label of an item of a split without labels (an unlabeled collection's items; held images
#: without labels as :func:`~contrastkit.data.item_dataset` gives them): never a class id.
NO_LABEL = -1


def _check_unit_range(x: Tensor, name: str) -> None:
    if x.numel() == 0:
        return
    low, high = torch.aminmax(x)
    if not (float(low) >= 0.0 and float(high) <= 1.0):  # also catches NaN
        raise ValueError(f"{name} must lie in [0, 1] (no NaN), got range [{float(low):.4g}, {float(high):.4g}]")


@dataclass
class Split:
    """One split (train, val or test) of a data set.

    Attributes:
        images: ``(n, C, H, W)`` float32 in ``[0, 1]``, one canonical image per sample
            (for GlyphLab: realisation 0 of the scene).
        labels: ``(n,)`` int64 class indices in ``[0, num_classes)``.
        realisations: ``(n, R, C, H, W)`` float32 in ``[0, 1]`` with ``R >= 2`` independent
            noise realisations of each sample, or ``None`` for data without them.
        groups: ``(n,)`` int64 group (scene) id of each sample, or ``None``. Groups never
            cross splits; for GlyphLab one group is one scene.
    """

    images: Tensor
    labels: Tensor
    realisations: Optional[Tensor] = None
    groups: Optional[Tensor] = None

    def __post_init__(self) -> None:
        images, labels = self.images, self.labels
        if not isinstance(images, Tensor) or images.dim() != 4:
            raise ValueError(f"Split.images must be a 4-D (n, C, H, W) tensor, got "
                             f"{type(images).__name__} {tuple(getattr(images, 'shape', ()))}")
        if images.dtype != torch.float32:
            raise TypeError(f"Split.images must be float32, got {images.dtype}")
        if not isinstance(labels, Tensor) or labels.dim() != 1 or labels.dtype != torch.int64:
            raise ValueError("Split.labels must be a 1-D int64 tensor, got "
                             f"{getattr(labels, 'dtype', type(labels).__name__)} "
                             f"{tuple(getattr(labels, 'shape', ()))}")
        _check_unit_range(images, "Split.images")
        n = images.shape[0]
        if labels.shape[0] != n:
            raise ValueError(f"Split has {n} images but {labels.shape[0]} labels")
        if self.realisations is not None:
            r = self.realisations
            if r.dim() != 5 or r.shape[0] != n or r.shape[2:] != images.shape[1:] or r.shape[1] < 2:
                raise ValueError(f"Split.realisations must have shape (n, R>=2, C, H, W) = "
                                 f"({n}, R, {', '.join(map(str, images.shape[1:]))}), got {tuple(r.shape)}")
            if r.dtype != torch.float32:
                raise TypeError(f"Split.realisations must be float32, got {r.dtype}")
            _check_unit_range(r, "Split.realisations")
        if self.groups is not None:
            g = self.groups
            if g.dim() != 1 or g.shape[0] != n or g.dtype != torch.int64:
                raise ValueError(f"Split.groups must be a 1-D int64 tensor of length {n}, got "
                                 f"{g.dtype} {tuple(g.shape)}")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_realisations(self) -> int:
        """``R``, the number of noise realisations per sample (0 when there are none)."""
        return 0 if self.realisations is None else int(self.realisations.shape[1])


@dataclass
class Dataset:
    """A named data set with ``train``, ``val`` and ``test`` splits of the same image shape.

    ``image_shape`` is ``(C, H, W)``; ``num_classes == len(class_names)``; labels index
    ``class_names``.
    """

    name: str
    class_names: List[str]
    train: Split
    val: Split
    test: Split
    image_shape: Tuple[int, int, int] = field(default=(0, 0, 0))
    #: What kind of data this is ("glyphlab", "digits", "imagefolder", "mnist", "cifar10",
    #: "npz"); picks the augmentation defaults. Defaults to ``name``.
    source: str = ""

    def __post_init__(self) -> None:
        self.source = self.source or self.name
        self.class_names = [str(c) for c in self.class_names]
        shape = tuple(int(s) for s in self.train.images.shape[1:])
        if self.image_shape == (0, 0, 0):
            self.image_shape = shape  # type: ignore[assignment]
        for split_name, split in self.splits():
            if tuple(split.images.shape[1:]) != tuple(self.image_shape):
                raise ValueError(f"{self.name}: {split_name} images have shape "
                                 f"{tuple(split.images.shape[1:])}, expected {tuple(self.image_shape)}")
            if len(split) == 0:
                raise ValueError(f"{self.name}: the {split_name} split is empty")
            if int(split.labels.min()) < 0 or int(split.labels.max()) >= self.num_classes:
                raise ValueError(f"{self.name}: {split_name} labels must lie in [0, {self.num_classes}), "
                                 f"got range [{int(split.labels.min())}, {int(split.labels.max())}]")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def channels(self) -> int:
        return int(self.image_shape[0])

    @property
    def has_realisations(self) -> bool:
        return all(split.realisations is not None for _, split in self.splits())

    def splits(self) -> List[Tuple[str, Split]]:
        """``[("train", train), ("val", val), ("test", test)]``."""
        return [("train", self.train), ("val", self.val), ("test", self.test)]

    def summary(self) -> str:
        """One line: name, shape, classes and split sizes."""
        c, h, w = self.image_shape
        sizes = ", ".join(f"{name} {len(split)}" for name, split in self.splits())
        extra = f", {self.train.num_realisations} realisations each" if self.has_realisations else ""
        return f"{self.name}: {c}x{h}x{w} images, {self.num_classes} classes; {sizes}{extra}"


# ----------------------------------------------------------------------------------------
# helpers shared by the loaders

def to_float_images(array: np.ndarray, source: str) -> Tensor:
    """Convert an ``(n, C, H, W)`` uint8 or float array to float32 in ``[0, 1]``.

    uint8 is divided by 255; floats must already lie in ``[0, 1]`` (a float array in
    ``[0, 255]`` is rejected rather than guessed at).
    """
    if array.dtype == np.uint8:
        return torch.from_numpy(np.array(array, dtype=np.uint8, copy=True)).float().div_(255.0)
    if np.issubdtype(array.dtype, np.floating):
        if array.size and not np.isfinite(array).all():
            raise ValueError(f"{source}: images contain NaN or infinite values")
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            raise ValueError(f"{source}: float images must lie in [0, 1], got range "
                             f"[{float(array.min()):.4g}, {float(array.max()):.4g}] (store uint8 for 0..255)")
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ValueError(f"{source}: integer images must lie in [0, 255], got range "
                             f"[{int(array.min())}, {int(array.max())}]")
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).div_(255.0)
    raise ValueError(f"{source}: unsupported image dtype {array.dtype}")


def to_labels(array: np.ndarray, source: str) -> Tensor:
    """Convert a 1-D (or ``(n, 1)``) integer label array to an int64 tensor."""
    array = np.asarray(array)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{source}: labels must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) \
                and np.all(array == np.round(array)):
            array = array.astype(np.int64)
        else:
            raise ValueError(f"{source}: labels must be integers, got dtype {array.dtype}")
    if array.size and array.min() < 0:
        raise ValueError(f"{source}: labels must be non-negative, got {int(array.min())}")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))


def stratified_split(labels: Sequence[int], fractions: Sequence[float], seed: int) -> List[np.ndarray]:
    """Split sample indices into parts of the given fractions, keeping class proportions.

    Part ``k > 0`` gets ``fraction_k * n`` samples rounded half up, and part 0 the rest. Each class is
    shuffled with ``numpy.random.default_rng(seed)``; sample ``j`` of a class of size ``n_c``
    gets the key ``(j + 0.5) / n_c``, and the samples, sorted by key, are cut into consecutive
    blocks. Every class thus lands in each part in proportion (within one sample), and even
    classes smaller than ``1 / fraction`` contribute to the small parts in turn.
    Returns sorted index arrays, one per fraction.
    """
    labels = np.asarray(labels)
    if len(fractions) < 1 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {list(fractions)}")
    n = labels.shape[0]
    rng = np.random.default_rng(seed)
    keys = np.empty(n, dtype=np.float64)
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        order = idx[rng.permutation(idx.size)]
        keys[order] = (np.arange(idx.size) + 0.5) / idx.size
    # Random tie-break between classes with equal keys.
    ranked = np.lexsort((rng.random(n), keys))
    sizes = [int(math.floor(f * n + 0.5)) for f in fractions[1:]]  # half up, not to even
    first = max(n - sum(sizes), 0)
    bounds = np.cumsum([0, first] + sizes)
    return [np.sort(ranked[bounds[k]:min(bounds[k + 1], n)]) for k in range(len(fractions))]


def check_fraction(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def check_positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def subset(images: Tensor, labels: Tensor, index: np.ndarray) -> Split:
    idx = torch.from_numpy(np.asarray(index, dtype=np.int64))
    return Split(images=images[idx].contiguous(), labels=labels[idx].contiguous())


def stratified_subset_indices(labels: Optional[Sequence[int]], n_total: int, n: int, seed: int) -> np.ndarray:
    """Which ``n`` of ``n_total`` samples a stratified subset keeps (sorted indices).

    With ``labels`` (``n_total`` class ids) every class keeps its share of ``n`` (within one
    sample), drawn by ``stratified_split`` (this module) with ``seed``; without labels a uniform draw.
    ``n >= n_total`` keeps everything. The same ``(labels, n, seed)`` always keep the same
    samples, so a streamed data set can subset its file index with the labels alone.
    """
    n = check_positive_int(n, "n")
    if n >= n_total:
        return np.arange(n_total)
    if labels is None:
        return np.sort(np.random.default_rng(seed).permutation(n_total)[:n])
    labels = np.asarray(labels)
    if labels.shape != (n_total,):
        raise ValueError(f"labels must have shape ({n_total},), got {labels.shape}")
    # Part 1 of the split gets round(fraction * n_total) = n samples.
    return stratified_split(labels, [1.0 - n / n_total, n / n_total], seed)[1]


def stratified_subset(split: Any, n: int, seed: int) -> Any:
    """The subset of ``n`` samples of ``split`` (a :class:`Split` or any split
    dataclass whose per-sample fields are tensors or lists of length ``len(split)``, e.g.
    a paired split), stratified by its ``labels`` (uniform when it has none), seeded and
    deterministic (:func:`stratified_subset_indices`). ``n >= len(split)`` returns ``split``."""
    total = len(split)
    labels = getattr(split, "labels", None)
    keep = stratified_subset_indices(None if labels is None else labels.cpu().numpy(), total, n, seed)
    if keep.size == total:
        return split
    index = torch.from_numpy(keep)
    changes = {}
    for item in dataclasses.fields(split):
        value = getattr(split, item.name)
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == total:
            changes[item.name] = value[index].contiguous()
        elif isinstance(value, list) and len(value) == total:
            changes[item.name] = [value[i] for i in keep.tolist()]
    return dataclasses.replace(split, **changes)


def call_with_options(loader: Callable[..., Any], what: str, options: Dict[str, Any], **fixed: Any) -> Any:
    """Call ``loader`` with ``options``, rejecting unknown option names with a clear message (``what``
    names the data set)."""
    accepted = [name for name, p in inspect.signature(loader).parameters.items()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name not in fixed]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(map(repr, unknown))} for {what}; "
                        f"accepted: {', '.join(accepted)}")
    return loader(**fixed, **options)
