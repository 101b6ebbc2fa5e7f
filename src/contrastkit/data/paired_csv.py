"""A user's image-text pairs from a CSV file (:func:`load_pair_csv`)."""

from __future__ import annotations

import csv
import io
import os
import stat
from array import array
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch

from contrastkit._io import check_input_size, escape_line, file_digest, memory_guard, one_line
from contrastkit.data.base import check_fraction, check_positive_int
from contrastkit.data.collection_index import (CollectionChangedError, change_counts, change_line,
                                               check_collection_changed, compare_names, digests, paths_arrays,
                                               read_record, unreadable_note, write_record)
from contrastkit.data.paired import PairedDataset, PairedSplit

__all__ = ["load_pair_csv", "read_pair_rows", "read_pairs", "PairRows", "PairCsvSplit", "RecordedPairs"]


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
                  val_fraction: float = 0.1, test_fraction: float = 0.2, split_seed: int = 0,
                  stream: bool = False, index: Optional[Union[str, os.PathLike]] = None,
                  collection_changed: str = "stop") -> PairedDataset:
    """Read (image path, text) pairs from a CSV file with a header row.

    Columns: ``image`` and ``text`` (required), ``label`` and ``split`` (optional). Image paths
    are relative to the CSV's folder unless absolute; images are resized to ``size x size``
    (bilinear) and converted to ``channels`` (1 or 3; default: 1 when every image is
    grayscale, else 3). Without a ``split`` column, distinct images (distinct files: two rows
    naming one file, however spelled, are one image) are shuffled with ``split_seed`` and cut
    into ``val_fraction`` / ``test_fraction`` / rest; rows sharing an image stay together. With
    a ``label`` column, labels are class names (sorted alphabetically to indices) and each class
    name is its own zero-shot prompt.

    ``stream``: hold the image paths and the texts only and decode each image when a batch asks
    for it (in the ``DataLoader``'s workers), a
    :class:`~contrastkit.data.paired.StreamingPairedDataset` with the same splits: what a CSV
    of more rows than memory holds images is read as (a million rows open in seconds,
    ``benchmarks/results/million_files.md``). The colour is then decided from the first 32
    rows' images (grayscale when they all are), as an unlabeled collection's is; an image that
    cannot be read stops the run naming its file and line when it is reached.

    ``index``: a file where the CSV's rows were recorded (a run's ``collection-index.npz``,
    :class:`RecordedPairs`), read instead of the CSV while the CSV is unchanged (its SHA-256);
    a CSV whose rows changed does what ``collection_changed`` says (``"stop"``: a
    :class:`~contrastkit.data.collection_index.CollectionChangedError` naming the rows added and
    gone, ``"reindex"``: the CSV as it is now, ``"keep"``: the recorded rows still in it). The
    data set's ``index``, ``index_state`` and ``index_note`` say what is to be recorded and how
    it was found, as :func:`~contrastkit.data.collection.open_collection`'s do.

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
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be true or false, got {stream!r}")
    check_collection_changed(collection_changed)
    options = {"val_fraction": float(val_fraction), "test_fraction": float(test_fraction),
               "split_seed": int(split_seed)}
    with memory_guard(str(path)):
        record, state, note = _rows_of(path, index, collection_changed, options)
        rows = record.rows
        group, first = _images_of_rows(rows)
        if record.split_of_row is None:
            record.split_of_row = _split_of_rows(rows, group, first, val_fraction, test_fraction, split_seed)
        dataset = (_streamed if stream else _held)(rows, group, record.split_of_row, size, channels)
    dataset.index, dataset.index_state, dataset.index_note = record, state, note
    return dataset


def _rows_of(path: Path, index: Optional[Union[str, os.PathLike]], collection_changed: str,
             options: Dict[str, Any]) -> Tuple["RecordedPairs", str, Optional[str]]:
    """The CSV's rows to read, as a record (with each row's split where a record decides it),
    how they were found (``"listed"``, ``"recorded"``, ``"verified"``, ``"reindexed"``,
    ``"kept"``) and a line for the user when they changed. A row that was recorded keeps its
    split, so does an image that was (by its file, else by its path); an image new since the
    record goes where the SHA-1 of its path falls (:func:`~contrastkit.data.collection.hash_fraction`),
    as a collection's files do."""
    digest = file_digest(path)
    recorded = None if index is None or not os.path.isfile(index) else RecordedPairs.read(index, path, options)
    note = unreadable_note(index, path) if recorded is None else None
    if recorded is not None and recorded.sha256 == digest:
        return recorded, "recorded", None
    rows = read_pairs(path)
    if recorded is None:
        return RecordedPairs(rows, digest, options), "listed", note
    added, gone = compare_names(recorded.rows.keys, rows.keys)
    if (added or gone) and collection_changed == "stop":
        raise CollectionChangedError(change_line(str(path), os.fspath(index), added, gone, len(recorded.rows),
                                                 unit="row", shown=_shown_key))
    shown = escape_line(str(path))
    change = change_counts(added, gone, unit="row")
    if not added and not gone or collection_changed == "reindex":  # (the same rows, reordered or respelled)
        fresh = RecordedPairs(rows, digest, options)
        if rows.splits is None:
            fresh.split_of_row = _recorded_splits(rows, recorded, options)
        return (fresh, "verified", None) if not added and not gone else \
            (fresh, "reindexed", f"{shown} changed since it was indexed ({change}): read again, each image recorded "
                                 "in its split")
    still = np.isin(digests(recorded.rows.keys()), digests(rows.keys()))  # the recorded rows still in the CSV
    kept = RecordedPairs(recorded.rows.take(np.flatnonzero(still)), digest, options)
    kept.split_of_row = None if recorded.split_of_row is None else recorded.split_of_row[still]
    return kept, "kept", (f"{shown} changed since it was indexed ({change}): reading the {len(kept.rows):,} "
                          "recorded rows still in it" + (", not those added" if added else ""))


def _recorded_splits(rows: "PairRows", recorded: "RecordedPairs", options: Dict[str, Any]) -> np.ndarray:
    """Each row's split: its image's recorded split, the image found by its file (device,
    inode), else by its path; an image not recorded, by the SHA-1 of its first row's path."""
    from contrastkit.data.collection import hash_fraction

    group, first = _images_of_rows(rows)
    old = recorded.rows
    old_split = recorded.split_of_row if recorded.split_of_row is not None else np.zeros(len(old), dtype=np.int8)
    split = np.full(len(first), -1, dtype=np.int8)
    for found, known in ((_identities(rows.files[first]), _identities(old.files)),
                         (digests(rows.images.item_bytes(int(row)) for row in first),
                          digests(old.images.items_bytes()))):
        order = np.argsort(known, kind="stable")
        at = np.minimum(np.searchsorted(known[order], found), len(known) - 1)
        hit = (known[order][at] == found) & (split < 0)
        split[hit] = old_split[order[at[hit]]]
    test, val = options["test_fraction"], options["test_fraction"] + options["val_fraction"]
    for image in np.flatnonzero(split < 0):
        place = hash_fraction(rows.images.item(int(first[image])))
        split[image] = _SPLIT_NAMES.index("test" if place < test else "val" if place < val else "train")
    return split[group]


def _identities(files: np.ndarray) -> np.ndarray:
    """Each ``(device, inode)`` row of ``files`` as one 16-byte value (``S16``), to sort and search."""
    return np.ascontiguousarray(files, dtype=np.uint64).view("S16").reshape(-1)


#: The device number that marks an identity made from a hard-linked file's real path (no device has it).
_HARD_LINKED = 2**64 - 1

#: A CSV row: image path, text, label, split, and where it is ("FILE, line N").
_Row = Tuple[Path, str, Optional[str], Optional[str], str]


class PairRows:
    """The rows of a pair CSV held compactly: ``images`` (a
    :class:`~contrastkit.data.collection.PathList` of the image paths, joined to the CSV's
    folder), ``texts``, ``labels`` (class-name codes into ``label_names``, int64, or ``None``),
    ``splits`` (each row's index in ``train, val, test`` from a ``split`` column, int8, or
    ``None``), ``lines`` (each row's line in the file) and ``files`` (each image's identity,
    ``(device, inode)``: rows naming one file are one image). No Python object per row but its
    text."""

    def __init__(self, path: Path, images: Any, texts: List[str], labels: Optional[np.ndarray],
                 label_names: List[str], splits: Optional[np.ndarray], lines: np.ndarray, files: np.ndarray) -> None:
        self.path, self.images, self.texts = path, images, texts
        self.labels, self.label_names, self.splits = labels, label_names, splits
        self.lines, self.files = lines, files

    def __len__(self) -> int:
        return len(self.texts)

    def where(self, row: int) -> str:
        """``"FILE, line N"`` of row ``row``."""
        return f"{self.path}, line {int(self.lines[row])}"

    def image(self, row: int) -> Path:
        return Path(self.images[row])

    def keys(self) -> Iterator[bytes]:
        """Each row as one byte string (image path, text, label, split, tab-separated): what
        tells two readings of a CSV apart."""
        for row in range(len(self)):
            label = "" if self.labels is None else self.label_names[self.labels[row]]
            split = "" if self.splits is None else _SPLIT_NAMES[self.splits[row]]
            yield b"\t".join((self.images.item_bytes(row), self.texts[row].encode("utf-8"), label.encode("utf-8"),
                               split.encode("utf-8")))

    def take(self, at: np.ndarray) -> "PairRows":
        """The rows at ``at`` (indices), in that order."""
        return PairRows(self.path, self.images.take(at), [self.texts[i] for i in at],
                        None if self.labels is None else self.labels[at], self.label_names,
                        None if self.splits is None else self.splits[at], self.lines[at], self.files[at])

    def row(self, row: int) -> _Row:
        """Row ``row`` as :func:`read_pair_rows` gives it."""
        return (self.image(row), self.texts[row], None if self.labels is None else self.label_names[self.labels[row]],
                None if self.splits is None else _SPLIT_NAMES[self.splits[row]], self.where(row))


def _shown_key(key: bytes) -> str:
    """A row of :meth:`PairRows.keys` as a message shows it: ``image 'text'``."""
    image, text = key.split(b"\t")[:2]
    return f"{os.fsdecode(image)} {text.decode('utf-8')!r}"


class RecordedPairs:
    """An image-text CSV's rows as a run records them (``OUT/collection-index.npz``, written by
    :func:`contrastkit.data.collection_index.write_record`): the :class:`PairRows`, the SHA-256
    of the CSV they were read from, the split options (``val_fraction``, ``test_fraction``,
    ``split_seed``) and each row's split (``split_of_row``, int8 into ``train, val, test``;
    ``None`` until it is decided)."""

    def __init__(self, rows: PairRows, sha256: str, options: Dict[str, Any],
                 split_of_row: Optional[np.ndarray] = None) -> None:
        self.rows, self.sha256, self.options, self.split_of_row = rows, sha256, dict(options), split_of_row

    def write(self, path: Union[str, os.PathLike]) -> None:
        rows = self.rows
        texts = [text.encode("utf-8") for text in rows.texts]
        arrays = {"images_data": rows.images.data, "images_offsets": rows.images.offsets,
                  "texts_data": np.frombuffer(b"".join(texts), dtype=np.uint8),
                  "texts_offsets": np.concatenate([[0], np.cumsum([len(text) for text in texts], dtype=np.int64)]),
                  "lines": rows.lines, "files": rows.files, "split_of_row": self.split_of_row}
        if rows.labels is not None:
            arrays["labels"] = rows.labels
        if rows.splits is not None:
            arrays["splits"] = rows.splits
        write_record(path, {"kind": "pairs", "source": os.path.abspath(rows.path), "csv": str(rows.path),
                            "sha256": self.sha256, "label_names": rows.label_names, "options": self.options}, arrays)

    @classmethod
    def read(cls, path: Union[str, os.PathLike], csv_path: Path, options: Dict[str, Any]) -> Optional["RecordedPairs"]:
        """The rows recorded at ``path`` when they are those of the CSV ``csv_path`` named as it
        is now (its image paths were joined to its folder as named then), split with
        ``options``; else ``None``."""
        from contrastkit.data.collection import PathList

        record = read_record(path)
        if record is None:
            return None
        meta, arrays = record
        try:
            if meta.get("kind") != "pairs" or meta["source"] != os.path.abspath(csv_path) \
                    or meta["csv"] != str(csv_path) or meta["options"] != options:
                return None
            images, texts = (arrays["images_data"], arrays["images_offsets"]), (arrays["texts_data"],
                                                                               arrays["texts_offsets"])
            if not paths_arrays(*images) or not paths_arrays(*texts):
                return None
            count = len(images[1]) - 1
            buffer, ends = texts[0].tobytes(), texts[1].tolist()
            decoded = [buffer[start:end].decode("utf-8") for start, end in zip(ends, ends[1:])]
            labels, splits, split_of_row = arrays.get("labels"), arrays.get("splits"), arrays["split_of_row"]
            names = [str(name) for name in meta["label_names"]]

            def codes(values: Optional[np.ndarray], top: int) -> bool:
                return values is None or (values.shape == (count,) and (not count or 0 <= values.min() <= values.max()
                                                                        < top))

            if len(decoded) != count or arrays["lines"].shape != (count,) or arrays["files"].shape != (count, 2) \
                    or not codes(labels, len(names)) or not codes(splits, 3) or not codes(split_of_row, 3):
                return None
            rows = PairRows(csv_path, PathList(*images), decoded, labels, names, splits, arrays["lines"],
                            arrays["files"])
            return cls(rows, str(meta["sha256"]), options, split_of_row)
        except (KeyError, TypeError, ValueError, UnicodeDecodeError):
            return None


def read_pair_rows(path: Union[str, os.PathLike]) -> List[_Row]:
    """The ``(image path, text, label or None, split or None, where)`` rows of a pair CSV
    (``image,text[,label][,split]``), every image path checked to exist; a ``ValueError`` or
    ``FileNotFoundError`` naming the file and line otherwise. Nothing is decoded. A large CSV is
    better read as :func:`read_pairs` (no tuple per row)."""
    rows = read_pairs(path)
    return [rows.row(i) for i in range(len(rows))]


def read_pairs(path: Union[str, os.PathLike]) -> PairRows:
    """The rows of a pair CSV (``image,text[,label][,split]``) as :class:`PairRows`, every
    image path checked to exist; a ``ValueError`` or ``FileNotFoundError`` naming the file and
    line otherwise. Nothing is decoded; the file is read as a stream, within the input ceiling."""
    from contrastkit._io import open_input

    path = Path(path)
    try:
        with open_input(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle)
            try:
                return _parse_rows(path, reader)
            except csv.Error as err:
                raise ValueError(f"{path}, line {reader.line_num}: {one_line(err)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text ({_first_undecodable(path)})") from None


def _first_undecodable(path: Path) -> str:
    """Where the first byte that is not UTF-8 lies in the file ``path``: ``"line N, byte B"``
    (B counted from the file's start)."""
    from contrastkit._io import read_input

    data = bytes(read_input(path))
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        return f"line {line}, byte {err.start}"
    return "a byte"


def _parse_rows(path: Path, reader: Any) -> PairRows:
    from contrastkit.data.collection import PathList, list_entry_path

    header = next(reader, None)
    if header is None:
        raise ValueError(f"{path}: empty file; expected a header row with columns image,text")
    columns = [h.strip().lower() for h in header]
    missing = [c for c in ("image", "text") if c not in columns]
    if missing:
        raise ValueError(f"{path}: header {header} lacks column(s) {', '.join(missing)}; "
                         "expected image,text[,label][,split]")
    col = {name: columns.index(name) for name in ("image", "text", "label", "split") if name in columns}
    image_at, text_at = col["image"], col["text"]
    label_at, split_at = col.get("label"), col.get("split")
    folder = path.parent
    data, ends = bytearray(), array("q", [0])
    texts: List[str] = []
    label_codes: Dict[str, int] = {}
    labels, splits, lines = array("q"), array("b"), array("q")
    devices, inodes = array("Q"), array("Q")
    linked: Dict[str, int] = {}
    for fields in reader:
        if not fields or all(not f.strip() for f in fields):
            continue  # blank line
        number = reader.line_num
        if len(fields) != len(columns):
            raise ValueError(f"{path}, line {number}: expected {len(columns)} fields ({','.join(columns)}), "
                             f"got {len(fields)}")
        image, text = fields[image_at].strip(), fields[text_at].strip()
        if not image:
            raise ValueError(f"{path}, line {number}: empty image path")
        if not text:
            raise ValueError(f"{path}, line {number}: empty text for image {image!r}")
        image_path = list_entry_path(image, folder)
        try:
            info = os.stat(image_path)
        except (OSError, ValueError):
            try:  # a link to nothing is refused when it is read, as before
                info = os.lstat(image_path)
            except (OSError, ValueError):
                raise FileNotFoundError(f"{path}, line {number}: image {image!r} not found (looked for "
                                        f"{image_path!r})") from None
        device, inode = info.st_dev, info.st_ino
        if info.st_nlink > 1 and stat.S_ISREG(info.st_mode):
            # A file with hard links: one image per path it is reached by once links are
            # followed (os.path.realpath), as rows have always been grouped; two hard links are
            # two images.
            device, inode = _HARD_LINKED, linked.setdefault(os.path.realpath(image_path), len(linked))
        if label_at is not None:
            label = fields[label_at].strip()
            if not label:
                raise ValueError(f"{path}, line {number}: empty label (give every row a label or drop the column)")
            labels.append(label_codes.setdefault(label, len(label_codes)))
        if split_at is not None:
            split = fields[split_at].strip().lower()
            if split not in _SPLIT_NAMES:
                raise ValueError(f"{path}, line {number}: split must be one of {', '.join(_SPLIT_NAMES)}, got "
                                 f"{split!r}")
            splits.append(_SPLIT_NAMES.index(split))
        data += os.fsencode(image_path)
        ends.append(len(data))
        texts.append(text)
        lines.append(number)
        devices.append(device)
        inodes.append(inode)
    if not texts:
        raise ValueError(f"{path}: no (image, text) rows after the header")
    names = sorted(label_codes)
    codes = None
    if label_at is not None:  # codes in the order of the sorted names
        rank = np.empty(len(names), dtype=np.int64)
        rank[[label_codes[name] for name in names]] = np.arange(len(names))
        codes = rank[np.frombuffer(labels, dtype=np.int64)]
    files = np.stack([np.frombuffer(devices, dtype=np.uint64), np.frombuffer(inodes, dtype=np.uint64)], axis=1)
    return PairRows(path, PathList(np.frombuffer(data, dtype=np.uint8), np.frombuffer(ends, dtype=np.int64)), texts,
                    codes, names, None if split_at is None else np.frombuffer(splits, dtype=np.int8),
                    np.frombuffer(lines, dtype=np.int64), files)


def _images_of_rows(rows: PairRows) -> Tuple[np.ndarray, np.ndarray]:
    """``(group, first)``: each row's image id (the distinct files numbered in the order of their
    first row, int64) and each image's first row."""
    _, first, inverse = np.unique(rows.files, axis=0, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    ids = np.empty(len(first), dtype=np.int64)
    ids[by_first] = np.arange(len(first))
    return ids[inverse.reshape(-1)], first[by_first]


def _split_of_rows(rows: PairRows, group: np.ndarray, first: np.ndarray, val_fraction: float, test_fraction: float,
                   split_seed: int) -> np.ndarray:
    """Each row's split (index in ``train, val, test``): its ``split`` column (an image's rows
    all in its first row's split), or the images (``group``, ``first``: :func:`_images_of_rows`)
    shuffled with ``split_seed`` and cut by the fractions; the rows of one image are never in
    two splits."""
    if rows.splits is not None:
        first_split = rows.splits[first]
        clash = np.flatnonzero(first_split[group] != rows.splits)
        if len(clash):
            row = int(clash[0])
            raise ValueError(f"{rows.where(row)}: image {str(rows.image(int(first[group[row]])))!r} is assigned to "
                             f"both {_SPLIT_NAMES[first_split[group[row]]]!r} and {_SPLIT_NAMES[rows.splits[row]]!r}")
        return rows.splits.astype(np.int8)
    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    n_groups = len(first)
    order = np.random.default_rng(int(split_seed)).permutation(n_groups)
    n_val, n_test = int(round(val_fraction * n_groups)), int(round(test_fraction * n_groups))
    part = np.empty(n_groups, dtype=np.int8)
    part[order[:n_test]] = _SPLIT_NAMES.index("test")
    part[order[n_test:n_test + n_val]] = _SPLIT_NAMES.index("val")
    part[order[n_test + n_val:]] = _SPLIT_NAMES.index("train")
    return part[group]


def _split_rows(rows: PairRows, split_of_row: np.ndarray, images: int) -> Dict[str, np.ndarray]:
    """The rows of each split (indices, in file order); an empty split is a ``ValueError``
    (``images``: the distinct images, which it names)."""
    parts = {}
    for code, key in enumerate(_SPLIT_NAMES):
        parts[key] = np.flatnonzero(split_of_row == code)
        if not len(parts[key]):
            raise ValueError(f"{rows.path}: the {key} split is empty ({images} distinct images in {len(rows)} rows); "
                             "add rows or a split column")
    return parts


def _held(rows: PairRows, group: np.ndarray, split_of_row: np.ndarray, size: int,
          channels: Optional[int]) -> PairedDataset:
    path = rows.path
    if channels is None:
        channels = 1 if all(_is_gray(rows.image(i), rows.where(i)) for i in range(len(rows))) else 3
    check_input_size(len(rows) * channels * size * size * 5,  # uint8 images, then as float32
                     f"{path}: {len(rows)} rows of {channels}x{size}x{size} images (--data-option stream=true reads "
                     "each image when a batch asks for it)")
    parts = _split_rows(rows, split_of_row, int(group.max()) + 1)
    images = np.stack([_read_image(rows.image(i), size, channels, rows.where(i)) for i in range(len(rows))])
    images_t = torch.from_numpy(images).float().div_(255.0)
    splits = {}
    for key, idx in parts.items():
        labels = None if rows.labels is None else torch.from_numpy(rows.labels[idx].copy())
        splits[key] = PairedSplit(images=images_t[idx].contiguous(), texts=[rows.texts[i] for i in idx],
                                  labels=labels, groups=torch.from_numpy(group[idx]))
    class_names = rows.label_names
    prompts = {name: [name] for name in class_names}
    return PairedDataset(name=path.stem, train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=class_names, class_prompts=prompts, source="csv")


class PairCsvSplit(torch.utils.data.Dataset):
    """One split of a pair CSV read item by item: item ``i`` is ``(image, text)``, ``image``
    ``(C, size, size)`` uint8 decoded when asked for (resized as :func:`load_pair_csv` does),
    ``text`` a ``str``; ``texts`` and ``labels`` (int64 or ``None``) held. An image that cannot
    be read raises :class:`~contrastkit.data.streaming.BadItemError` naming its file and line."""

    def __init__(self, rows: PairRows, indices: np.ndarray, size: int, channels: int) -> None:
        self.rows, self.indices = rows, indices  # (the rows shared by the three splits: no copy of their paths)
        self.texts = [rows.texts[i] for i in indices]
        self.labels = None if rows.labels is None else rows.labels[indices].copy()
        self.size, self.channels = size, channels

    def __len__(self) -> int:
        return len(self.texts)

    def image_path(self, index: int) -> str:
        """The image file of item ``index``."""
        return self.rows.images[int(self.indices[index])]

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, str]:
        from contrastkit.data.streaming import BadItemError

        row = int(self.indices[index])
        try:
            image = _read_image(self.rows.image(row), self.size, self.channels, self.rows.where(row))
        except (OSError, ValueError) as err:
            raise BadItemError(one_line(err)) from None
        return torch.from_numpy(image if image.flags.writeable else image.copy()), self.texts[index]


#: Rows whose images decide a streamed CSV's colour.
_COLOR_SAMPLE = 32


def _streamed(rows: PairRows, group: np.ndarray, split_of_row: np.ndarray, size: int, channels: Optional[int]) -> Any:
    from contrastkit.data.streaming import as_streaming_pairs

    if channels is None:
        sample = range(min(_COLOR_SAMPLE, len(rows)))
        channels = 1 if all(_is_gray(rows.image(i), rows.where(i)) for i in sample) else 3
    parts = {key: PairCsvSplit(rows, idx, size, channels)
             for key, idx in _split_rows(rows, split_of_row, int(group.max()) + 1).items()}
    names = rows.label_names
    return as_streaming_pairs(parts["train"], parts["val"], parts["test"], class_names=names or None,
                              name=rows.path.stem)
