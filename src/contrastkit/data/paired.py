"""Paired image-text data for ConVIRT-style training: :class:`PairedDataset` with three splits.

Built-in sources (:func:`contrastkit.data.load_paired` ``(name_or_path, seed, **options)``; the
generators are :mod:`contrastkit.data.paired_texts`, the CSV reader :mod:`contrastkit.data.paired_csv`):

``"glyphlab-text"``
    GlyphLab scenes (:mod:`contrastkit.data.glyphlab`), each paired with a generated text
    report stating four facts of the scene in varied phrasing and varied order:

    * orientation of the bar: ``vertical``, ``horizontal``, ``rising`` diagonal (about 45
      degrees, like a forward slash) or ``falling`` diagonal (about 135 degrees, a backslash);
    * position of the bar's centre in a 3 x 3 grid: row ``top/middle/bottom`` by thirds of the
      image height, column ``left/centre/right`` by thirds of the width;
    * thickness: ``thin/medium/thick`` by thirds of the generator's thickness range
      ``[1.6, 3.2]`` pixels at 32 x 32 (scaled with the image size);
    * clutter: the exact number of distractor marks (2..5 by default).

    The facts are read from the generator's own scene parameters
    (:func:`contrastkit.data.glyphlab.clean_scenes`), so every report is true of its scene.
    Reports are deterministic from ``seed`` (their random stream is independent of the
    scenes', so the images equal ``load_dataset("glyphlab", seed)`` for the same options).
``"digits-text"``
    scikit-learn's digits (:mod:`contrastkit.data.digits`), each paired with a short text
    naming the digit in varied phrasing ("a handwritten seven", "the digit 7", ...).
a ``.csv`` path
    User data: a CSV file with a header row and columns ``image`` (a path, relative to the
    CSV's folder unless absolute) and ``text``, optionally ``label`` (a class name, enabling
    zero-shot and probe evaluation) and ``split`` (``train``/``val``/``test``). See
    :func:`~contrastkit.data.paired_csv.load_pair_csv`.

Splits are by scene (GlyphLab), by the loader's stratified split (digits), or by image path
(CSV: all rows of one image land in the same split), so no image appears in two splits.

A user's own map-style ``torch.utils.data.Dataset`` of ``(image, text)`` items is read item by
item instead (:func:`contrastkit.data.as_streaming_pairs`): a :class:`StreamingPairedDataset`,
whose splits hold the texts (read once) but never the images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from contrastkit.data.base import Dataset, Split

__all__ = ["PairedSplit", "PairedDataset", "StreamingPairedDataset", "check_texts", "PAIRED_BUILTIN"]

#: Built-in paired data set names.
PAIRED_BUILTIN = ("glyphlab-text", "digits-text")


def check_texts(texts: Any, what: str) -> List[str]:
    """``texts`` as a list of non-empty strings; ``ValueError`` naming ``what[i]`` otherwise
    (``TypeError`` when ``texts`` is not a sequence of them)."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{what} must be a list of strings, got {type(texts).__name__}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what}[{i}] is empty or not a string: {text!r}")
    return texts


@dataclass
class PairedSplit:
    """One split of paired data: image ``i`` and text ``i`` form pair ``i``.

    Attributes:
        images: ``(n, C, H, W)`` float32 in ``[0, 1]``.
        texts: ``n`` non-empty strings.
        labels: ``(n,)`` int64 class indices (for zero-shot / probe evaluation) or ``None``.
        realisations: ``(n, R, C, H, W)`` noise realisations of each image, or ``None``.
        groups: ``(n,)`` int64 scene / image id, or ``None``; groups never cross splits.
        facts: per-pair dicts of the facts the text states (GlyphLab), or ``None``.
    """

    images: Tensor
    texts: List[str]
    labels: Optional[Tensor] = None
    realisations: Optional[Tensor] = None
    groups: Optional[Tensor] = None
    facts: Optional[List[Dict[str, Any]]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.images, Tensor) or self.images.dim() != 4 or self.images.dtype != torch.float32:
            raise ValueError(f"PairedSplit.images must be a float32 (n, C, H, W) tensor, got "
                             f"{getattr(self.images, 'dtype', type(self.images).__name__)} "
                             f"{tuple(getattr(self.images, 'shape', ()))}")
        self.texts = check_texts(self.texts, "PairedSplit.texts")
        n = int(self.images.shape[0])
        if len(self.texts) != n:
            raise ValueError(f"PairedSplit has {n} images but {len(self.texts)} texts; they must pair one to one")
        for name in ("labels", "groups"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Tensor) or value.dtype != torch.int64
                                      or tuple(value.shape) != (n,)):
                raise ValueError(f"PairedSplit.{name} must be an int64 tensor of shape ({n},), got "
                                 f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}")
        if self.realisations is not None:
            r = self.realisations
            if r.dim() != 5 or r.shape[0] != n or r.shape[2:] != self.images.shape[1:]:
                raise ValueError(f"PairedSplit.realisations must have shape (n, R, C, H, W) with n = {n}, "
                                 f"got {tuple(r.shape)}")
        if self.facts is not None and len(self.facts) != n:
            raise ValueError(f"PairedSplit has {n} images but {len(self.facts)} fact records")

    def __len__(self) -> int:
        return int(self.images.shape[0])


@dataclass
class PairedDataset:
    """Paired image-text data with ``train``, ``val`` and ``test`` splits.

    ``class_names`` is empty when the data carry no labels; ``class_prompts`` maps each class
    name to texts describing it, used for zero-shot classification (class embedding = mean
    of its prompts' normalised embeddings).
    """

    name: str
    train: PairedSplit
    val: PairedSplit
    test: PairedSplit
    class_names: List[str] = field(default_factory=list)
    class_prompts: Dict[str, List[str]] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        self.source = self.source or self.name
        shape = _images_shape(self.train)
        for split_name, split in self.splits():
            if len(split) == 0:
                raise ValueError(f"{self.name}: the {split_name} split is empty")
            if _images_shape(split) != shape:
                raise ValueError(f"{self.name}: {split_name} images have shape {_images_shape(split)}, "
                                 f"expected {shape}")
            if self.class_names and split.labels is None:
                raise ValueError(f"{self.name}: {split_name} has no labels but class_names are given")
            if split.labels is not None and self.class_names and (
                    int(split.labels.min()) < 0 or int(split.labels.max()) >= len(self.class_names)):
                raise ValueError(f"{self.name}: {split_name} labels must lie in [0, {len(self.class_names)})")
        for name in self.class_prompts:
            if name not in self.class_names:
                raise ValueError(f"{self.name}: prompt class {name!r} is not one of {self.class_names}")

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        return _images_shape(self.train)  # type: ignore[return-value]

    @property
    def channels(self) -> int:
        return self.image_shape[0]

    @property
    def num_classes(self) -> int:
        """Number of classes (0 when the data carry no labels)."""
        return len(self.class_names)

    @property
    def has_labels(self) -> bool:
        return bool(self.class_names)

    def splits(self) -> List[Tuple[str, PairedSplit]]:
        """``[("train", train), ("val", val), ("test", test)]``."""
        return [("train", self.train), ("val", self.val), ("test", self.test)]

    def to_dataset(self) -> Dataset:
        """The images and labels as a plain :class:`~contrastkit.data.Dataset` (for linear probes).

        Raises ``ValueError`` when the data carry no labels.
        """
        if not self.has_labels:
            raise ValueError(f"{self.name}: no labels, so no image classification data set")

        def plain(split: PairedSplit) -> Split:
            real = split.realisations if split.realisations is not None and split.realisations.shape[1] >= 2 else None
            return Split(images=split.images, labels=split.labels, realisations=real, groups=split.groups)

        return Dataset(name=self.name, class_names=list(self.class_names), train=plain(self.train),
                       val=plain(self.val), test=plain(self.test), image_shape=self.image_shape,
                       source=self.source)

    def summary(self) -> str:
        """One line: name, image shape, split sizes and classes."""
        c, h, w = self.image_shape
        sizes = ", ".join(f"{name} {len(split)}" for name, split in self.splits())
        classes = f", {len(self.class_names)} classes" if self.class_names else ", no labels"
        streamed = " (streamed)" if getattr(self, "streamed", False) else ""
        return f"{self.name}: {c}x{h}x{w} images{streamed} paired with texts; {sizes} pairs{classes}"


def _images_shape(split: Any) -> Tuple[int, ...]:
    """``(C, H, W)`` of a paired split's images: held (``images``) or streamed (``image_shape``)."""
    images = getattr(split, "images", None)
    return tuple(int(s) for s in (images.shape[1:] if isinstance(images, Tensor) else split.image_shape))


@dataclass
class StreamingPairedDataset(PairedDataset):
    """Paired image-text data read item by item: the streamed twin of :class:`PairedDataset`
    (same fields and checks), built by :func:`contrastkit.data.as_streaming_pairs`.

    Each split is a map-style data set whose item ``i`` is ``(image (C, H, W), text)``, with
    ``texts`` (all of them, read once), ``labels`` (int64 ``(n,)`` or ``None``) and
    ``image_shape``; the images are decoded when asked for (in ``DataLoader`` workers), never
    held together. No noise realisations, no facts.
    """

    streamed: ClassVar[bool] = True
    has_realisations: ClassVar[bool] = False

    def to_dataset(self) -> Dataset:
        """Not available: a streamed data set is never held as one tensor (its splits already
        carry their ``labels`` for the probe)."""
        raise ValueError(f"{self.name}: streamed pairs have no in-memory image classification data set; "
                         "the run's probe reads the streamed splits and their labels")
