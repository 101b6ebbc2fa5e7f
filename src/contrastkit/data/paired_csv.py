"""A user's image-text pairs from a CSV file (:func:`load_pair_csv`)."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from contrastkit._io import check_input_size, memory_guard, one_line, read_input
from contrastkit.data.base import check_fraction, check_positive_int
from contrastkit.data.paired import PairedDataset, PairedSplit

__all__ = ["load_pair_csv", "read_pair_rows"]


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


def read_pair_rows(path: Union[str, os.PathLike]) -> List[_Row]:
    """The ``(image path, text, label or None, split or None, where)`` rows of a pair CSV
    (``image,text[,label][,split]``), every image path checked to exist; a ``ValueError`` or
    ``FileNotFoundError`` naming the file and line otherwise. Nothing is decoded."""
    return _read_rows(Path(path))[1]


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
