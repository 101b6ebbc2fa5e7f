"""Paired image-text data for ConVIRT-style training: :class:`PairedDataset` with three splits.

Built-in sources (``load_paired(name_or_path, seed, **options)``):

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
    :func:`load_pair_csv`.

Splits are by scene (GlyphLab), by the loader's stratified split (digits), or by image path
(CSV: all rows of one image land in the same split), so no image appears in two splits.

A user's own map-style ``torch.utils.data.Dataset`` of ``(image, text)`` items is read item by
item instead (:func:`contrastkit.data.as_streaming_pairs`): a :class:`StreamingPairedDataset`,
whose splits hold the texts (read once) but never the images.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from contrastkit._io import check_input_size, memory_guard, one_line, read_input
from contrastkit.data.base import Dataset, Split, check_fraction, check_positive_int

__all__ = [
    "PairedSplit", "PairedDataset", "StreamingPairedDataset", "check_texts", "load_paired", "load_glyphlab_text",
    "load_digits_text", "load_pair_csv", "glyphlab_facts", "glyphlab_report", "PAIRED_BUILTIN",
]

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


def load_paired(name_or_path: Union[str, os.PathLike], seed: int = 0, **options: Any) -> PairedDataset:
    """Load paired image-text data: ``"glyphlab-text"``, ``"digits-text"`` or a ``.csv`` path.

    ``seed`` drives the generated texts (and GlyphLab's scenes); ``options`` go to the loader
    (:func:`load_glyphlab_text`, :func:`load_digits_text`, :func:`load_pair_csv`).

    Raises:
        FileNotFoundError: the CSV or an image it names does not exist.
        ValueError: malformed pairs (the message names the file and row) or bad options.
        TypeError: an option the loader does not know.
    """
    from contrastkit.data import _call_with_options

    if isinstance(name_or_path, str) and name_or_path.lower() in PAIRED_BUILTIN:
        if name_or_path.lower() == "glyphlab-text":
            return _call_with_options(load_glyphlab_text, "glyphlab-text", options, seed=seed)
        return _call_with_options(load_digits_text, "digits-text", options, seed=seed)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"paired data must be a name or a CSV path, got {type(name_or_path).__name__}")
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no paired data {str(name_or_path)!r}: not a built-in name "
                                f"({', '.join(PAIRED_BUILTIN)}) and no such file")
    if path.is_dir() or path.suffix.lower() != ".csv":
        raise ValueError(f"paired data {str(path)!r}: expected a .csv file of (image, text) rows")
    return _call_with_options(load_pair_csv, str(path), options, path=path)


# ----------------------------------------------------------------------------------------
# GlyphLab reports

#: Bounds of the generator's bar thickness at 32 x 32 (``render_scenes``: uniform(1.6, 3.2)
#: pixels times size / 32); the thin / medium / thick bins are its thirds.
GLYPH_THICKNESS_RANGE = (1.6, 3.2)

_ORIENTATION_PHRASES = {
    "vertical": ["vertical", "vertically oriented", "up-and-down"],
    "horizontal": ["horizontal", "horizontally oriented", "flat-lying"],
    "rising": ["rising diagonal", "ascending diagonal", "forward-slash diagonal"],
    "falling": ["falling diagonal", "descending diagonal", "backslash diagonal"],
}
_THICKNESS_PHRASES = {
    "thin": ["thin", "slender", "fine"],
    "medium": ["medium", "medium-width", "moderate"],
    "thick": ["thick", "bold", "wide"],
}
_ROW_WORDS = {"top": ["top", "upper"], "middle": ["middle", "centre"], "bottom": ["bottom", "lower"]}
_COL_WORDS = {"left": ["left"], "centre": ["centre", "middle"], "right": ["right"]}
_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                 "eighteen", "nineteen", "twenty"]
_NOUNS = ["bar", "stroke", "line", "glyph"]
_CLUTTER_NOUNS = ["distractor marks", "small marks", "clutter marks", "distractors"]

#: Text templates; every one states all four facts. Fields: {o} orientation, {t} thickness,
#: {p} position phrase, {n} clutter count, {noun} the bar, {cn} clutter noun.
_TEMPLATES = [
    "a {t} {o} {noun} {p}, with {n} {cn}.",
    "{p}: one {o} {noun}, {t}. {n} {cn} around it.",
    "the scene shows a {o} {noun} of {t} width {p}. there are {n} {cn}.",
    "{n} {cn} surround a {t} {o} {noun} {p}.",
    "report: {o} {noun} {p}; thickness {t}; clutter {n} {cn}.",
    "there is a {t} {noun}, {o}, {p}, and {n} {cn} in the background.",
    "{o} {noun} {p}. it is {t}. {n} {cn} are scattered around.",
]


def _position_phrase(row: str, col: str, rng: np.random.Generator) -> str:
    if row == "middle" and col == "centre":
        return str(rng.choice(["in the centre", "in the middle", "at the centre of the image"]))
    r = str(rng.choice(_ROW_WORDS[row]))
    c = str(rng.choice(_COL_WORDS[col]))
    style = int(rng.integers(0, 3))
    if style == 0:
        return f"in the {r} {c}"
    if style == 1:
        return f"at the {r} {c} of the image"
    return f"in the {r} {c} area"


def glyphlab_facts(params: Dict[str, np.ndarray], size: int) -> List[Dict[str, Any]]:
    """The reported facts of each scene from the generator's parameters.

    ``params`` is the dict of :func:`contrastkit.data.glyphlab.render_scenes` (``angle`` in
    degrees counter-clockwise from +x with y up, ``cx``/``cy`` column/row of the bar centre in
    pixels, ``thickness`` in pixels, ``n_distractors``). Returns one dict per scene with keys
    ``orientation`` (vertical/horizontal/rising/falling), ``row`` (top/middle/bottom),
    ``col`` (left/centre/right), ``thickness`` (thin/medium/thick), ``clutter`` (int).
    """
    s = float(size)
    lo, hi = (v * s / 32.0 for v in GLYPH_THICKNESS_RANGE)
    facts = []
    for angle, cx, cy, thick, n in zip(params["angle"], params["cx"], params["cy"], params["thickness"],
                                       params["n_distractors"]):
        a = float(angle) % 180.0
        # Classes sit at 0, 45, 90, 135 degrees (+- jitter < 20): nearest of the four.
        nearest = min((abs(a - c), c) for c in (0.0, 45.0, 90.0, 135.0, 180.0))[1]
        orientation = {0.0: "horizontal", 180.0: "horizontal", 45.0: "rising", 90.0: "vertical",
                       135.0: "falling"}[nearest]
        third = (hi - lo) / 3.0
        thickness = "thin" if thick < lo + third else ("medium" if thick < lo + 2 * third else "thick")
        row = ["top", "middle", "bottom"][min(2, int(3 * float(cy) / s))]
        col = ["left", "centre", "right"][min(2, int(3 * float(cx) / s))]
        facts.append(dict(orientation=orientation, row=row, col=col, thickness=thickness, clutter=int(n)))
    return facts


def glyphlab_report(facts: Dict[str, Any], rng: np.random.Generator) -> str:
    """One text report stating ``facts`` (see :func:`glyphlab_facts`), phrasing drawn from ``rng``."""
    template = _TEMPLATES[int(rng.integers(0, len(_TEMPLATES)))]
    n = int(facts["clutter"])
    count = _NUMBER_WORDS[n] if (rng.random() < 0.5 and n < len(_NUMBER_WORDS)) else str(n)
    return template.format(
        o=rng.choice(_ORIENTATION_PHRASES[facts["orientation"]]),
        t=rng.choice(_THICKNESS_PHRASES[facts["thickness"]]),
        p=_position_phrase(facts["row"], facts["col"], rng),
        n=count, noun=rng.choice(_NOUNS), cn=rng.choice(_CLUTTER_NOUNS),
    )


#: Zero-shot prompts for GlyphLab's three orientation classes (vocabulary of the reports).
GLYPHLAB_PROMPTS = {
    "vertical": ["a vertical bar", "a vertical stroke", "a vertical line", "a vertically oriented glyph"],
    "horizontal": ["a horizontal bar", "a horizontal stroke", "a horizontal line", "a horizontally oriented glyph"],
    "diagonal": ["a rising diagonal bar", "a falling diagonal bar", "a rising diagonal stroke",
                 "a falling diagonal stroke"],
}


def _text_stream(seed: int, index: int) -> np.random.Generator:
    # Keyed apart from GlyphLab's own streams (spawn keys 0..2 of SeedSequence(seed)).
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(1000 + index,)))


def load_glyphlab_text(seed: int = 0, *, train_scenes: int = 1200, val_scenes: int = 200, test_scenes: int = 300,
                       size: int = 32, realisations: int = 2, noise: float = 0.15, jitter: float = 8.0,
                       clutter: Tuple[int, int] = (2, 5)) -> PairedDataset:
    """GlyphLab scenes paired with generated reports (deterministic from ``seed``).

    Options are those of :func:`contrastkit.data.glyphlab.load_glyphlab` (defaults differ in
    the scene counts: 1200 / 200 / 300, since image-text training needs more pairs than the
    120-scene probe experiment). Pair ``i`` of a split is scene ``i``: its realisation 0 (all
    realisations are kept in ``realisations``) and one report; labels are the orientation
    class (vertical / horizontal / diagonal).
    """
    from contrastkit.data.glyphlab import clean_scenes, load_glyphlab

    base = load_glyphlab(seed, train_scenes=train_scenes, val_scenes=val_scenes, test_scenes=test_scenes,
                         size=size, realisations=realisations, noise=noise, jitter=jitter, clutter=clutter)
    counts = dict(train=train_scenes, val=val_scenes, test=test_scenes)
    splits: Dict[str, PairedSplit] = {}
    for index, (key, split) in enumerate(base.splits()):
        _, labels, params = clean_scenes(seed, key, counts[key], size=size, jitter=jitter, clutter=clutter)
        if not np.array_equal(labels, split.labels.numpy()):  # the two draws must be the same scenes
            raise RuntimeError(f"glyphlab-text: scene parameters of the {key} split do not match its images")
        facts = glyphlab_facts(params, size)
        rng = _text_stream(seed, index)
        texts = [glyphlab_report(f, rng) for f in facts]
        splits[key] = PairedSplit(images=split.images, texts=texts, labels=split.labels,
                                  realisations=split.realisations, groups=split.groups, facts=facts)
    return PairedDataset(name="glyphlab-text", train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=list(base.class_names), class_prompts=dict(GLYPHLAB_PROMPTS),
                         source="glyphlab")


# ----------------------------------------------------------------------------------------
# digits texts

_DIGIT_TEMPLATES = ["a handwritten {w}", "the digit {d}", "the number {w}", "a {w}", "digit {d}, written by hand",
                    "an image of a {w}", "handwritten digit {d}", "{w}"]


def digit_text(digit: int, rng: np.random.Generator) -> str:
    """A short text naming ``digit`` (0..9), phrasing drawn from ``rng``."""
    template = _DIGIT_TEMPLATES[int(rng.integers(0, len(_DIGIT_TEMPLATES)))]
    return template.format(w=_NUMBER_WORDS[digit], d=digit)


def load_digits_text(seed: int = 0, *, size: int = 32, val_fraction: float = 0.15, test_fraction: float = 0.25,
                     split_seed: int = 0) -> PairedDataset:
    """scikit-learn's digits paired with short texts naming the digit (deterministic from ``seed``).

    The split is :func:`contrastkit.data.digits.load_digits`'s (stratified, ``split_seed``).
    """
    from contrastkit.data.digits import load_digits

    base = load_digits(size=size, val_fraction=val_fraction, test_fraction=test_fraction, split_seed=split_seed)
    splits = {}
    for index, (key, split) in enumerate(base.splits()):
        rng = _text_stream(seed, index)
        texts = [digit_text(int(d), rng) for d in split.labels.tolist()]
        splits[key] = PairedSplit(images=split.images, texts=texts, labels=split.labels)
    prompts = {str(d): [f"the digit {d}", f"a handwritten {_NUMBER_WORDS[d]}", f"the number {_NUMBER_WORDS[d]}"]
               for d in range(10)}
    return PairedDataset(name="digits-text", train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=list(base.class_names), class_prompts=prompts, source="digits")


# ----------------------------------------------------------------------------------------
# user CSV

_SPLIT_NAMES = ("train", "val", "test")


def _read_image(path: Path, size: int, channels: int, where: str) -> np.ndarray:
    from PIL import Image  # lazy: optional dependency

    from contrastkit.data.files import decode_image, open_image

    with open_image(path, where) as image:
        img = decode_image(image, path, where)
    try:
        img = img.convert("L" if channels == 1 else "RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        array = np.asarray(img, dtype=np.uint8)
    except (OSError, ValueError) as err:
        raise ValueError(f"{where}: cannot read image {str(path)!r}: {one_line(err)}") from None
    return array[None] if channels == 1 else array.transpose(2, 0, 1)


def _is_gray(path: Path, where: str) -> bool:
    from contrastkit.data.files import open_image

    with open_image(path, where) as image:
        return image.mode in ("1", "L", "LA", "I", "I;16", "F")


def load_pair_csv(path: Union[str, os.PathLike], *, size: int = 32, channels: Optional[int] = None,
                  val_fraction: float = 0.1, test_fraction: float = 0.2, split_seed: int = 0) -> PairedDataset:
    """Read (image path, text) pairs from a CSV file with a header row.

    Columns: ``image`` and ``text`` (required), ``label`` and ``split`` (optional). Image paths
    are relative to the CSV's folder unless absolute; images are resized to ``size x size``
    (bilinear) and converted to ``channels`` (1 or 3; default: 1 when every image is
    grayscale, else 3). Without a ``split`` column, distinct images are shuffled with
    ``split_seed`` and cut into ``val_fraction`` / ``test_fraction`` / rest; rows sharing an
    image stay together. With a ``label`` column, labels are class names (sorted
    alphabetically to indices) and each class name is its own zero-shot prompt.

    Raises:
        FileNotFoundError: the CSV, or an image a row names (message gives file, line, path).
        ValueError: missing columns, a row with the wrong number of fields, an empty text or
            image field, an unknown split, an empty split, an unreadable image.
    """
    path = Path(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"pair file {str(path)!r} does not exist")
    size = check_positive_int(size, "size", minimum=4)
    if channels is not None and channels not in (1, 3):
        raise ValueError(f"channels must be 1, 3 or None (auto), got {channels!r}")
    with memory_guard(str(path)):
        return _load_pair_csv(path, size, channels, val_fraction, test_fraction, split_seed)


#: A CSV row: image path, text, label, split, and where it is ("FILE, line N").
_Row = Tuple[Path, str, Optional[str], Optional[str], str]


def _read_rows(path: Path) -> Tuple[Dict[str, int], List[_Row]]:
    """The columns and the (image path, text, label, split, where) rows of a pair CSV."""
    try:
        text = read_input(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return _parse_rows(path, reader)
    except csv.Error as err:
        raise ValueError(f"{path}, line {reader.line_num}: {one_line(err)}") from None


def _parse_rows(path: Path, reader: Any) -> Tuple[Dict[str, int], List[_Row]]:
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{path}: empty file; expected a header row with columns image,text")
    columns = [h.strip().lower() for h in header]
    missing = [c for c in ("image", "text") if c not in columns]
    if missing:
        raise ValueError(f"{path}: header {header} lacks column(s) {', '.join(missing)}; "
                         "expected image,text[,label][,split]")
    col = {name: columns.index(name) for name in ("image", "text", "label", "split") if name in columns}
    rows = []
    for fields in reader:
        where = f"{path}, line {reader.line_num}"
        if not fields or all(not f.strip() for f in fields):
            continue  # blank line
        if len(fields) != len(columns):
            raise ValueError(f"{where}: expected {len(columns)} fields ({','.join(columns)}), got {len(fields)}")
        image, text = fields[col["image"]].strip(), fields[col["text"]].strip()
        if not image:
            raise ValueError(f"{where}: empty image path")
        if not text:
            raise ValueError(f"{where}: empty text for image {image!r}")
        image_path = Path(image) if os.path.isabs(image) else path.parent / image
        if not os.path.lexists(image_path):  # a FIFO or device is refused when read
            raise FileNotFoundError(f"{where}: image {image!r} not found (looked for {str(image_path)!r})")
        label = fields[col["label"]].strip() if "label" in col else None
        if label is not None and not label:
            raise ValueError(f"{where}: empty label (give every row a label or drop the column)")
        split = fields[col["split"]].strip().lower() if "split" in col else None
        if split is not None and split not in _SPLIT_NAMES:
            raise ValueError(f"{where}: split must be one of {', '.join(_SPLIT_NAMES)}, got {split!r}")
        rows.append((image_path, text, label, split, where))
    if not rows:
        raise ValueError(f"{path}: no (image, text) rows after the header")
    return col, rows


def _load_pair_csv(path: Path, size: int, channels: Optional[int], val_fraction: float, test_fraction: float,
                   split_seed: int) -> PairedDataset:
    col, rows = _read_rows(path)
    if channels is None:
        channels = 1 if all(_is_gray(image_path, where) for image_path, _, _, _, where in rows) else 3
    check_input_size(len(rows) * channels * size * size * 5,  # uint8 images, then as float32
                     f"{path}: {len(rows)} rows of {channels}x{size}x{size} images")

    # Group rows by image so that one image never lands in two splits.
    image_ids: Dict[str, int] = {}
    for image_path, *_ in rows:
        image_ids.setdefault(str(image_path.resolve()), len(image_ids))
    group = np.array([image_ids[str(r[0].resolve())] for r in rows], dtype=np.int64)
    if "split" in col:
        assignment = {}
        for g, (_, _, _, split, where) in zip(group, rows):
            if assignment.setdefault(int(g), split) != split:
                raise ValueError(f"{where}: image {str(rows[int(np.flatnonzero(group == g)[0])][0])!r} "
                                 f"is assigned to both {assignment[int(g)]!r} and {split!r}")
        split_of_row = [r[3] for r in rows]
    else:
        val_fraction = check_fraction(val_fraction, "val_fraction")
        test_fraction = check_fraction(test_fraction, "test_fraction")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
        n_groups = len(image_ids)
        order = np.random.default_rng(int(split_seed)).permutation(n_groups)
        n_val, n_test = int(round(val_fraction * n_groups)), int(round(test_fraction * n_groups))
        part = np.empty(n_groups, dtype=object)
        part[order[:n_test]] = "test"
        part[order[n_test:n_test + n_val]] = "val"
        part[order[n_test + n_val:]] = "train"
        split_of_row = [str(part[g]) for g in group]

    class_names = sorted({r[2] for r in rows}) if "label" in col else []
    images = np.stack([_read_image(r[0], size, channels, r[4]) for r in rows])
    images_t = torch.from_numpy(images).float().div_(255.0)
    splits = {}
    for key in _SPLIT_NAMES:
        idx = [i for i, s in enumerate(split_of_row) if s == key]
        if not idx:
            raise ValueError(f"{path}: the {key} split is empty ({len(image_ids)} distinct images in "
                             f"{len(rows)} rows); add rows or a split column")
        labels = (torch.tensor([class_names.index(rows[i][2]) for i in idx], dtype=torch.int64)
                  if class_names else None)
        splits[key] = PairedSplit(images=images_t[idx].contiguous(), texts=[rows[i][1] for i in idx],
                                  labels=labels, groups=torch.from_numpy(group[idx]))
    prompts = {name: [name] for name in class_names}
    return PairedDataset(name=path.stem, train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=class_names, class_prompts=prompts, source="csv")
