"""Search a run's collection (``contrastkit neighbors RUN QUERY...``): the images of a data set
nearest to each query under the run's encoder, by cosine similarity of ``h``.

**Features.** ``h`` is the encoder's output, what the linear probe and ``contrastkit embed``
read (:func:`~contrastkit.metrics.readout.extract_features`), not ``z``, the projection head's
output that the loss sees: the head learns to discard what the augmentations change (colour,
crop position), so ``z`` keeps less of what tells images apart, and the representation before
the head is the better one for downstream tasks (Chen, Kornblith, Norouzi & Hinton, "A Simple
Framework for Contrastive Learning of Visual Representations", ICML 2020, section 4.2 and
figure 8: a linear classifier on ``h`` beats one on ``z`` by more than 10 points). Rows are
L2-normalised, so the similarity is the cosine, the quantity the contrastive loss compares.

**The collection.** By default every image of the run's own data set (train, val and test, in
that order, as the run read them: the same loader, options and subsets); ``split`` picks one
split, ``data`` (with ``data_options``) another data set for the same encoder. Each image of the
collection has a *row* (its place in that order) and an id ``SPLIT:INDEX``; its ``name`` is the
one ``contrastkit embed`` gives the row: the image file where the data know it (an image
folder read lazily), else the index.

**Damaged files.** An unlabeled collection skips the files it cannot read (``bad_files="skip"``,
its default): they have no embedding, hence no row. The rows are the images embedded, numbered
in that order as ``contrastkit embed`` numbers its rows (row ``r`` of both is the same image),
and their number is the collection's size (``rows``); the skipped files are named
(``contrastkit.train.embed.SkippedRow``: ``SPLIT:INDEX``, file, reason; ``skipped``),
never returned as neighbors, and a query naming one (``SPLIT:INDEX``) is refused in one line
naming it (a ``ROW`` is always an image embedded). ``SPLIT:INDEX`` names an image by its place
in its split, skipped files included, so it does not move when a file is damaged or repaired.

**Queries.** Each query is one of

* ``SPLIT:INDEX``, e.g. ``test:12``: image 12 of the test split of the same data (whether or
  not that split is in the collection);
* ``ROW``, e.g. ``12``: row 12 of the collection;
* anything else: an image file, decoded and resized as the data set's images are (an unlabeled
  collection's own rules; only that file is read; name a file called ``12`` as ``./12``).

A query that is an image of the collection (``SPLIT:INDEX`` of a collected split, or ``ROW``)
is left out of its own neighbors, which would otherwise start with itself at similarity 1; an
image file is compared with every image (a file of the collection finds itself first).

**Search.** ``index="exact"`` (the default): :func:`contrastkit.metrics.search.nearest`, exact,
in chunks (memory ``O(chunk^2)``, never ``queries x collection``), ties broken by the smaller
row. ``index="faiss"``: a FAISS ``IndexFlatIP`` over the normalised features (the same exhaustive
search; needs ``pip install 'contrastkit[faiss]'``), saved in the run folder as
``neighbors/KEY.faiss`` (:func:`contrastkit.layout.neighbor_index_files`), ``KEY`` the SHA-256
of the encoder's weights (:func:`~contrastkit.train.baselines.encoder_digest`) and of the
collection's images and labels (:func:`~contrastkit.train.baselines.data_digest`). A later
search of an unchanged run and collection reuses it: its images are read once for the digest
but not encoded. The index and its description (``KEY.json``) are listed in the run's manifest,
so ``pretrain --force`` removes them; a file the manifest does not list unchanged is never
read back nor replaced. When an index is saved, those of another checkpoint of the run are
removed.

**Picture.** ``picture=PATH.png``: the queries and their neighbors as thumbnails
(:mod:`contrastkit.train.neighbor_picture`), written atomically and listed in the manifest of
its folder; an existing file is replaced only when it is a picture this function wrote,
unchanged since (listed in the folder's manifest, marked in its PNG metadata).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from contrastkit import __version__, layout
from contrastkit._io import atomic_file, read_json, write_json
from contrastkit.data import (BadItemError, ImageFolderDataset, indexed_image_batches, item_dataset, skips_bad_files,
                              unit_float)
from contrastkit.run_writer import FolderWriter, RunWriter
from contrastkit.metrics.readout import extract_features
from contrastkit.metrics.search import (DEFAULT_CHUNK, Neighbors, faiss_flat_index, faiss_nearest, import_faiss,
                                        nearest, read_faiss_index, write_faiss_index)

from .baselines import data_digest, encoder_digest
from .embed import SPLITS, SkippedRow, _item_name, left_out_files, skipped_note, skipped_rows
from .neighbor_picture import Thumbnail, neighbor_picture_png
from .runs import load_run
from .setup import limit_threads, resolve_device

__all__ = ["INDEXES", "DEFAULT_K", "ImageRef", "Neighbor", "QueryNeighbors", "NeighborSearch",
           "find_neighbors"]

#: What ``index`` accepts.
INDEXES = ("exact", "faiss")
#: Neighbors per query unless asked otherwise.
DEFAULT_K = 8

_SPLIT_NAMES = ("train", "val", "test")
_ITEM_QUERY = re.compile(r"(train|val|test):([0-9]+)")
_ROW_QUERY = re.compile(r"[0-9]+")
_INDEX_FORMAT = "contrastkit-neighbor-index/1"
#: The PNG text field that marks a picture as this module's (checked before replacing one).
_PICTURE_MARK = ("Source", "contrastkit neighbors")


@dataclass(frozen=True)
class ImageRef:
    """One image: a query or a neighbor. ``id`` is ``SPLIT:INDEX`` (or the file a query names);
    ``name`` as ``contrastkit embed`` names the row (the image file where known, else the index);
    ``label`` and ``class_name`` ``None`` where the data have no labels."""

    id: str
    split: Optional[str]
    index: Optional[int]
    name: str
    label: Optional[int]
    class_name: Optional[str]


@dataclass(frozen=True)
class Neighbor:
    """A neighbor of a query: its ``rank`` (1 = nearest), collection ``row``, cosine
    ``similarity`` of ``h`` and the image."""

    rank: int
    row: int
    similarity: float
    image: ImageRef


@dataclass(frozen=True)
class QueryNeighbors:
    """One query as given (``query``), the image it names, its collection ``row`` when it is one
    (then left out of its own neighbors) and its ``neighbors``, nearest first."""

    query: str
    image: ImageRef
    row: Optional[int]
    neighbors: List[Neighbor]


@dataclass
class NeighborSearch:
    """What :func:`find_neighbors` found: the ``run`` and ``checkpoint``, the collection (``data``,
    its ``splits``, its number of ``rows``: the images embedded, and the ``skipped`` files),
    ``k``, the ``index`` (``exact`` / ``faiss``; for
    FAISS the ``index_file`` and whether it was ``index_reused``), the ``picture`` written (or
    ``None``) and the ``queries``."""

    run: str
    checkpoint: str
    data: str
    splits: Tuple[str, ...]
    rows: int
    k: int
    index: str
    index_file: Optional[str]
    index_reused: bool
    picture: Optional[str]
    queries: List[QueryNeighbors] = field(default_factory=list)
    #: The damaged files an unlabeled collection skipped in the collection's splits (never
    #: embedded, so never a neighbor nor a query, and not counted in ``rows``).
    skipped: List[SkippedRow] = field(default_factory=list)
    #: The files the collection's listing left out, in no split (``{file: reason}``).
    left_out: Dict[str, str] = field(default_factory=dict)
    #: The quantity compared, the cosine similarity of the encoder's output h (see the module's description).
    similarity: str = "cosine of h"

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON-ready values (``contrastkit neighbors --json``)."""
        result = asdict(self)
        result["splits"] = list(self.splits)
        return result


# ------------------------------------------------------------------------------ the collection

class _Collection:
    """The splits ``names`` of ``dataset`` in that order. Its rows are the images a pass over
    them (:meth:`batches`, then :meth:`settle`) embedded, in that order: a damaged file an
    unlabeled collection skips has no row (it is in ``skipped``), so row ``r`` is row ``r`` of
    ``contrastkit embed``'s output of the same splits. ``listed``: the images of the splits,
    skipped ones included; ``rows``: those embedded (``listed`` until a pass says otherwise)."""

    def __init__(self, dataset: Any, names: Sequence[str], description: str) -> None:
        self.dataset = dataset
        self.names = tuple(names)
        self.splits = {name: getattr(dataset, name) for name in _SPLIT_NAMES}
        self.listed = sum(len(self.splits[name]) for name in self.names)
        #: Whether a pass may leave images out (an unlabeled collection skipping damaged files).
        self.may_skip = any(skips_bad_files(self.splits[name]) for name in self.names)
        self.rows = self.listed
        self.skipped: List[SkippedRow] = []
        self.description = description
        self.class_names = list(getattr(dataset, "class_names", []) or [])
        self._came: Dict[str, List[torch.Tensor]] = {}
        self._row_split = np.zeros(0, dtype=np.int64)   # (rows,) position of its split in names
        self._row_index = np.zeros(0, dtype=np.int64)   # (rows,) its index in that split
        self._row_by_index: Dict[str, np.ndarray] = {}  # split -> (len(split),) its row, -1 if skipped

    def batches(self, name: str, read: "_Reading") -> Iterator[torch.Tensor]:
        """The image batches of split ``name`` (as the read-out reads them), noting which images came."""
        came = self._came[name] = []
        for batch, indices in indexed_image_batches(self.splits[name], read.batch_size, read.workers):
            came.append(indices.reshape(-1).long())
            yield batch

    def settle(self) -> None:
        """Number the rows by the pass just made over every collected split (:meth:`batches`)."""
        split_codes, indices, self.skipped, self._row_by_index = [], [], [], {}
        rows = 0
        for code, name in enumerate(self.names):
            parts = self._came.get(name) or [torch.zeros(0, dtype=torch.int64)]
            came = torch.cat(parts).numpy().astype(np.int64)
            row_by_index = np.full(len(self.splits[name]), -1, dtype=np.int64)
            row_by_index[came] = np.arange(rows, rows + came.shape[0])
            self._row_by_index[name] = row_by_index
            split_codes.append(np.full(came.shape[0], code, dtype=np.int64))
            indices.append(came)
            self.skipped.extend(skipped_rows(name, self.splits[name], came))
            rows += came.shape[0]
        self._row_split, self._row_index = np.concatenate(split_codes), np.concatenate(indices)
        self.rows = rows

    def skipped_note(self) -> str:
        """``"; N damaged files skipped, not embedded"`` when the pass skipped any, else ``""``."""
        return f"; {skipped_note(len(self.skipped))}" if self.skipped else ""

    def locate(self, row: int) -> Tuple[str, int]:
        """``(split, index)`` of collection row ``row`` (after :meth:`settle`)."""
        return self.names[int(self._row_split[row])], int(self._row_index[row])

    def row_of(self, split: str, index: int) -> Optional[int]:
        """The collection row of image ``index`` of ``split`` (after :meth:`settle`), or ``None`` if
        the split is not collected or the image was skipped."""
        if split not in self._row_by_index:
            return None
        row = int(self._row_by_index[split][index])
        return None if row < 0 else row

    def describe(self, split: str, index: int) -> ImageRef:
        part = self.splits[split]
        labels = getattr(part, "labels", None)
        label = None if labels is None else int(labels[index])
        class_name = self.class_names[label] if label is not None and 0 <= label < len(self.class_names) else None
        return ImageRef(f"{split}:{index}", split, index, _item_name(part, index), label, class_name)


@dataclass(frozen=True)
class _Query:
    text: str
    image: Optional[ImageRef]       # None for a ROW query until the rows are numbered (_resolve_query)
    row: Optional[int]              # its collection row, when it is an image of the collection
    file_image: Optional[torch.Tensor] = None  # (C, H, W) float in [0, 1], for a file query
    asked_row: Optional[int] = None  # the row a ROW query names


def _parse_query(text: str, collection: _Collection) -> _Query:
    """A query (see the module's description) checked against the data before the collection
    is read (a ROW query is checked against the rows after it: :func:`_resolve_query`); one-line
    errors name it. A ``SPLIT:INDEX`` query that is a damaged file is refused here, reading that
    one file."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"a query must be a non-empty string (an image file, SPLIT:INDEX or ROW), got {text!r}")
    item = _ITEM_QUERY.fullmatch(text)
    if item:
        split, index = item.group(1), int(item.group(2))
        part = collection.splits[split]
        size = len(part)
        if index >= size:
            raise ValueError(f"query {text!r}: the {split} split of {collection.dataset.name} has {size} images"
                             + (f" (indices 0 to {size - 1})" if size else ""))
        if skips_bad_files(part):
            try:
                item_dataset(part)[index]
            except BadItemError as err:
                raise ValueError(_skipped_query(text, SkippedRow(split, index, _item_name(part, index),
                                                                 str(err)))) from None
        return _Query(text, collection.describe(split, index), None)
    if _ROW_QUERY.fullmatch(text):
        row = int(text)
        if not collection.may_skip:  # the rows are known before the pass: refused before any work
            _check_row(text, row, collection.listed, collection)
        return _Query(text, None, None, asked_row=row)
    if not os.path.isfile(text):
        raise FileNotFoundError(f"query {text!r} is no image file, nor SPLIT:INDEX (e.g. test:12) nor a row of the "
                                f"collection (e.g. 12)")
    return _Query(text, ImageRef(text, None, None, text, None, None), None, _read_image_file(text, collection))


def _resolve_query(query: _Query, collection: _Collection) -> _Query:
    """``query`` with its collection row, once the rows are numbered (after the collection's pass,
    or before it where nothing can be skipped): a ROW query's image, a SPLIT:INDEX query's row."""
    if query.asked_row is not None:
        _check_row(query.text, query.asked_row, collection.rows, collection)
        return replace(query, image=collection.describe(*collection.locate(query.asked_row)), row=query.asked_row)
    if query.image is None or query.image.split not in collection.names:
        return query  # a file, or an image of a split outside the collection
    split, index = query.image.split, int(query.image.index)  # type: ignore[arg-type]
    row = collection.row_of(split, index)
    if row is None:  # it read when parsed, not in the pass: the pass decides
        skipped = next(s for s in collection.skipped if (s.split, s.index) == (split, index))
        raise ValueError(_skipped_query(query.text, skipped))
    return replace(query, row=row)


def _check_row(text: str, row: int, rows: int, collection: _Collection) -> None:
    if row >= rows:
        raise ValueError(f"query {text!r}: the collection ({collection.description}) has {rows} images "
                         f"(rows 0 to {rows - 1}{collection.skipped_note()}); SPLIT:INDEX names an image of a split")


def _skipped_query(text: str, skipped: SkippedRow) -> str:
    return (f"query {text!r}: {skipped.split}:{skipped.index} ({skipped.name}) is a damaged file, skipped and not "
            f"embedded: {skipped.reason}")


def _read_image_file(path: str, collection: _Collection) -> torch.Tensor:
    """The image file ``path`` as the data set's images are: its channels (grey or RGB) and
    size (an unlabeled collection's own rules: resized and centre-cropped), ``(C, H, W)``
    float in ``[0, 1]``. Only that file is read."""
    channels, height, width = (int(v) for v in collection.dataset.image_shape)
    if channels not in (1, 3):
        raise ValueError(f"query {path!r}: the data set's images have {channels} channels; an image file can "
                         "be compared with images of 1 (grey) or 3 (RGB) channels only")
    read_image = getattr(collection.dataset, "read_image", None)  # a collection's rules (CollectionDataset)
    try:
        if callable(read_image):
            image = read_image(path)
        else:
            image, _ = ImageFolderDataset([path], [0], color="L" if channels == 1 else "RGB",
                                          size=(height, width))[0]
    except ValueError as err:  # UnreadableImageError: the file named, and why
        raise ValueError(f"query {path!r}: {str(err).splitlines()[0]}") from None
    return unit_float(image)


class _ImageReader:
    """Images of the data set by ``(split, index)`` (thumbnails, queries), read one at a time
    (:func:`~contrastkit.data.item_dataset`)."""

    def __init__(self, collection: _Collection, read: "_Reading") -> None:
        self.collection, self.read = collection, read

    def images(self, wanted: Sequence[Tuple[str, int]]) -> Dict[Tuple[str, int], torch.Tensor]:
        found: Dict[Tuple[str, int], torch.Tensor] = {}
        for split in _SPLIT_NAMES:
            indices = sorted({index for name, index in wanted if name == split})
            if indices:
                found.update(((split, i), image) for i, image in self._from_split(split, indices).items())
        return found

    def _from_split(self, split: str, indices: Sequence[int]) -> Dict[int, torch.Tensor]:
        items = item_dataset(self.collection.splits[split])
        return {i: unit_float(torch.as_tensor(items[i][0])) for i in indices}


# ------------------------------------------------------------------------------ features

@dataclass(frozen=True)
class _Reading:
    """How images are read and encoded: per forward pass, decoding processes, device."""

    batch_size: int
    workers: int
    device: torch.device


def _batches_encoded(collection: _Collection, encoder: nn.Module, read: _Reading,
                     into: List[np.ndarray]) -> Iterator[Tuple[Iterator[torch.Tensor], Any]]:
    """Per collected split: ``(its image batches, its labels)`` as :func:`data_digest` reads
    them, each batch's ``h`` appended to ``into`` on the way (one pass for both)."""
    def encoded(name: str) -> Iterator[torch.Tensor]:
        for batch in collection.batches(name, read):
            into.append(_encode(encoder, batch, read, collection))
            yield batch

    for name in collection.names:
        yield encoded(name), _labels_for_digest(collection.splits[name])


def _labels_for_digest(part: Any) -> torch.Tensor:
    labels = getattr(part, "labels", None)
    return torch.full((0,), -1, dtype=torch.int64) if labels is None else labels


def _encode(encoder: nn.Module, images: torch.Tensor, read: _Reading, collection: _Collection) -> np.ndarray:
    """``h`` of one batch of images (the read-out's feature extractor)."""
    try:
        return extract_features(encoder, images, read.device, int(images.shape[0]))
    except RuntimeError as err:  # e.g. images of a size the encoder was not built for
        raise ValueError(f"the encoder cannot read the images of {collection.description} "
                         f"({tuple(images.shape[1:])}): {str(err).splitlines()[0]}") from None


def _collection_features(collection: _Collection, encoder: nn.Module, read: _Reading,
                         with_digest: bool) -> Tuple[torch.Tensor, Optional[str]]:
    """``h`` of every collected image ``(rows, d)`` float32, and (``with_digest``) the
    collection's :func:`data_digest`, from one pass over the images, which numbers the rows."""
    chunks: List[np.ndarray] = []
    if with_digest:
        digest: Optional[str] = data_digest(_batches_encoded(collection, encoder, read, chunks))
    else:
        digest = None
        for name in collection.names:
            for batch in collection.batches(name, read):
                chunks.append(_encode(encoder, batch, read, collection))
    _settle(collection)
    return torch.from_numpy(np.concatenate(chunks)), digest


def _settle(collection: _Collection) -> None:
    """Number the collection's rows after a pass; a collection left with no image is refused."""
    collection.settle()
    if collection.rows == 0:
        raise ValueError(f"every image of the collection ({collection.description}) is a damaged file "
                         f"({skipped_note(len(collection.skipped))}), e.g. {collection.skipped[0].reason}")


# ------------------------------------------------------------------------------ the FAISS index

@dataclass
class _FaissIndex:
    index: Any
    file: Optional[str]
    reused: bool


def _saved_indexes(run_dir: str) -> Dict[str, Dict[str, Any]]:
    """The run's FAISS indexes whose description is listed unchanged in its manifest: key -> description."""
    writer = RunWriter(run_dir)
    try:
        listed = writer.listed()
    except ValueError:  # an unreadable manifest vouches for nothing
        return {}
    found = {}
    for name in listed:
        folder, _, file = name.partition("/")
        if folder != layout.NEIGHBOR_INDEXES or not file.endswith(".json"):
            continue
        key = file[:-len(".json")]
        if layout.neighbor_index_files(key)[1] != name or not writer.unchanged([name]):
            continue
        try:
            description = read_json(os.path.join(run_dir, *name.split("/")))
        except (OSError, ValueError):
            continue
        if (isinstance(description, dict) and description.get("format") == _INDEX_FORMAT
                and description.get("key") == key):
            found[key] = description
    return found


def _index_key(encoder: str, data: str, splits: Sequence[str]) -> str:
    material = {"format": _INDEX_FORMAT, "encoder": encoder, "data": data, "splits": list(splits),
                "features": "h, L2-normalised", "index": "IndexFlatIP"}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _faiss_index(run_dir: str, collection: _Collection, encoder: nn.Module, read: _Reading,
                 chunk: int) -> _FaissIndex:
    """The run's saved index of this encoder and collection, or a new one (then saved)."""
    encoder_key = encoder_digest(encoder, read.device)
    saved = _saved_indexes(run_dir)
    features: Optional[torch.Tensor] = None
    if any(description.get("encoder") == encoder_key for description in saved.values()):
        # One of this encoder's indexes may fit: the images' digest decides, before any encoding.
        data_key = data_digest((collection.batches(name, read), _labels_for_digest(collection.splits[name]))
                               for name in collection.names)
        _settle(collection)
    else:
        features, data_key = _collection_features(collection, encoder, read, with_digest=True)
    assert data_key is not None
    key = _index_key(encoder_key, data_key, collection.names)
    index_name, description_name = layout.neighbor_index_files(key)
    index_path = os.path.join(run_dir, *index_name.split("/"))
    if key in saved:
        index = _read_saved_index(run_dir, index_name, collection.rows)
        if index is not None:
            return _FaissIndex(index, index_path, True)
    if features is None:
        features, _ = _collection_features(collection, encoder, read, with_digest=False)
    index = faiss_flat_index(features, chunk=chunk)
    description = {"format": _INDEX_FORMAT, "key": key, "encoder": encoder_key, "data": data_key,
                   "collection": collection.description, "splits": list(collection.names),
                   "rows": collection.rows, "skipped": len(collection.skipped), "dim": int(features.shape[1]),
                   "index": "IndexFlatIP",
                   "features": "h, L2-normalised", "written_by": f"contrastkit {__version__} neighbors"}
    written = _save_index(run_dir, index, index_name, description_name, description)
    if written:
        _remove_other_checkpoints_indexes(run_dir, saved, encoder_key)
    return _FaissIndex(index, index_path if written else None, False)


def _read_saved_index(run_dir: str, name: str, rows: int) -> Any:
    """The saved index ``name`` when the manifest lists it unchanged and it holds ``rows`` rows;
    else ``None`` (with a warning saying why it is not used)."""
    path = os.path.join(run_dir, *name.split("/"))
    try:
        if not RunWriter(run_dir).unchanged([name]):
            warnings.warn(f"{path} is not listed unchanged in {layout.MANIFEST}; not reusing it", stacklevel=3)
            return None
        index = read_faiss_index(path)
    except (OSError, ValueError) as err:
        warnings.warn(f"{path} cannot be reused ({err}); building the index again", stacklevel=3)
        return None
    if int(index.ntotal) != rows:
        warnings.warn(f"{path} holds {index.ntotal} rows, not the collection's {rows}; building the index again",
                      stacklevel=3)
        return None
    return index


def _save_index(run_dir: str, index: Any, index_name: str, description_name: str,
                description: Dict[str, Any]) -> bool:
    """Write the index and its description into the run folder, listed in its manifest; a file
    in the way that is not contrastkit's, or a folder that cannot be written, is a warning (the
    search goes on with the index in memory). Returns whether the index was written."""
    paths = [os.path.join(run_dir, *name.split("/")) for name in (index_name, description_name)]
    writer = RunWriter(run_dir)
    try:
        writer.listed()  # an unreadable manifest: not written
        for name, path in zip((index_name, description_name), paths):
            if os.path.lexists(path) and not writer.unchanged([name]):
                raise FileExistsError(f"{path} exists and is not listed unchanged in {layout.MANIFEST}")
        os.makedirs(os.path.dirname(paths[0]), exist_ok=True)
        with writer.writing(index_name, description_name):
            write_faiss_index(index, f"{paths[0]}.tmp")
            os.replace(f"{paths[0]}.tmp", paths[0])
            write_json(paths[1], description)
    except (OSError, ValueError) as err:
        warnings.warn(f"the FAISS index is not saved in {run_dir} ({err}); it is built again next time", stacklevel=3)
        return False
    return True


def _remove_other_checkpoints_indexes(run_dir: str, saved: Dict[str, Dict[str, Any]], encoder_key: str) -> None:
    """Delete the saved indexes of other encoder weights (an earlier checkpoint of the run):
    they can no longer be reused. Only files the manifest lists unchanged."""
    writer = RunWriter(run_dir)
    try:
        for key, description in saved.items():
            if description.get("encoder") == encoder_key:
                continue
            names = writer.unchanged(layout.neighbor_index_files(key))
            for name in names:
                os.remove(os.path.join(run_dir, *name.split("/")))
            writer.record(*names)  # gone: dropped from the manifest
    except (OSError, ValueError) as err:
        warnings.warn(f"earlier FAISS indexes in {run_dir} are not removed ({err})", stacklevel=3)


# ------------------------------------------------------------------------------ the picture

def _check_picture_target(path: str) -> None:
    """Refuse before any work: not a .png, a missing folder, or a file in the way that is not a
    picture this module wrote (unchanged, by the folder's manifest)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).lower().endswith(".png"):
        raise ValueError(f"the picture (--out) must be a .png file, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder {folder} does not exist (--out {path})")
    if hasattr(os, "statvfs") and os.statvfs(folder).f_flag & os.ST_RDONLY:  # before the search, not after
        raise OSError(errno.EROFS, f"{os.strerror(errno.EROFS)}: the picture cannot be written (--out {path})",
                      folder)
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) or os.path.islink(path):
        raise FileExistsError(f"{path} is a folder or a symbolic link; choose another --out")
    if not (FolderWriter(folder).unchanged([os.path.basename(path)]) and _is_our_picture(path)):
        raise FileExistsError(f"{path} exists and is not a picture contrastkit neighbors wrote (unchanged, by the "
                              f"folder's {layout.MANIFEST}); not replacing it: choose another --out")


def _is_our_picture(path: str) -> bool:
    try:
        from PIL import Image

        with Image.open(path) as image:
            return dict(getattr(image, "text", {}) or {}).get(_PICTURE_MARK[0]) == _PICTURE_MARK[1]
    except Exception:  # not a PNG PIL reads: not ours
        return False


def _caption_id(image: ImageRef) -> str:
    return os.path.basename(image.id) if image.split is None else image.id


def _caption_class(image: ImageRef) -> str:
    return image.class_name or ("" if image.label is None else f"class {image.label}")


def _write_picture(path: str, found: List[QueryNeighbors], queries: List[_Query], reader: _ImageReader,
                   title: str) -> None:
    wanted = [(n.image.split, n.image.index) for q in found for n in q.neighbors]
    wanted += [(q.image.split, q.image.index) for q in queries if q.file_image is None]
    images = reader.images([(split, index) for split, index in wanted if split is not None and index is not None])
    rows = []
    for query, result in zip(queries, found):
        image = query.file_image if query.file_image is not None else images[(query.image.split, query.image.index)]
        head = Thumbnail(image, "\n".join(part for part in ("query", _caption_id(result.image),
                                                            _caption_class(result.image)) if part), result.image.label)
        cells = []
        for neighbor in result.neighbors:
            caption = "\n".join(part for part in (f"{neighbor.rank}. {neighbor.similarity:.3f}",
                                                  _caption_id(neighbor.image), _caption_class(neighbor.image)) if part)
            cells.append(Thumbnail(images[(neighbor.image.split, neighbor.image.index)], caption, neighbor.image.label))
        rows.append((head, cells))
    png = neighbor_picture_png(rows, title, metadata=dict([_PICTURE_MARK]))
    folder = os.path.dirname(os.path.abspath(path))
    with FolderWriter(folder).writing(os.path.basename(path)):
        with atomic_file(path, "wb") as handle:
            handle.write(png)


# ------------------------------------------------------------------------------ the search

def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def find_neighbors(run_dir: str, queries: Sequence[str], *, k: int = DEFAULT_K, data: Optional[str] = None,
                   data_options: Optional[Dict[str, Any]] = None, split: str = "all", index: str = "exact",
                   picture: Optional[str] = None, checkpoint: Optional[str] = None, chunk: int = DEFAULT_CHUNK,
                   device: str = "auto", batch_size: int = 256, threads: Optional[int] = None,
                   workers: Optional[int] = None, collection_changed: str = "stop") -> NeighborSearch:
    """The ``k`` images of the collection nearest to each query, by cosine similarity of the
    encoder's ``h`` (the rules are in the module's description).

    Args:
        run_dir: a ``contrastkit pretrain`` output folder.
        queries: image files, ``SPLIT:INDEX`` or collection rows (strings).
        k: neighbors per query.
        data, data_options: another data set to search (default: the run's own, with its options).
        split: the collection: ``train``, ``val``, ``test`` or ``all`` (the three, in that order).
        index: ``exact`` (torch, chunked) or ``faiss`` (a FAISS flat index, saved in the run folder).
        picture: a ``.png`` to draw the queries and their neighbors in (``None``: no picture).
        checkpoint: another checkpoint of the run (default ``checkpoints/last.pt``).
        chunk: rows compared at once in the exact search (memory ``chunk x chunk`` similarities).
        device, batch_size, threads, workers: where and how the images are encoded (threads and
            workers default to the run's settings).
        collection_changed: what the run's unlabeled collection does when its files changed
            since the run recorded its listing (``"stop"``, ``"reindex"``, ``"keep"``:
            :meth:`~contrastkit.train.runs.SavedRun.load_data`).

    Raises:
        FileNotFoundError: ``run_dir`` is not a run, a query file or the picture's folder is missing.
        FileExistsError: ``picture`` exists and is not an earlier picture of this function.
        ValueError: a bad option or query, ``k`` larger than the collection (without the query).
        FaissMissingError: ``index="faiss"`` without FAISS installed.
    """
    if isinstance(queries, str) or not isinstance(queries, Sequence) or not queries:
        raise ValueError("queries must be a non-empty list of image files, SPLIT:INDEX or collection rows")
    k = _check_int(k, "k", 1)
    chunk = _check_int(chunk, "chunk", 1)
    batch_size = _check_int(batch_size, "batch_size", 1)
    if workers is not None:
        _check_int(workers, "workers", 0)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if index not in INDEXES:
        raise ValueError(f"index must be one of {', '.join(INDEXES)}, got {index!r}")
    if index == "faiss":
        import_faiss()  # before any work: a missing extra is said at once
    if picture is not None:
        _check_picture_target(picture)
    saved = load_run(run_dir, checkpoint=checkpoint)
    with limit_threads(saved.config.threads if threads is None else threads):
        read = _Reading(batch_size, saved.config.workers if workers is None else workers, resolve_device(device))
        dataset = saved.load_data(data, data_options, collection_changed=collection_changed)
        model = saved.build_model(saved.image_shape if saved.image_shape else dataset.image_shape, read.device)
        if saved.image_shape and dataset.image_shape[0] != saved.image_shape[0]:
            raise ValueError(f"{data or saved.config.data} has {dataset.image_shape[0]}-channel images; the run "
                             f"in {run_dir} was trained on {saved.image_shape[0]} channels")
        names = _SPLIT_NAMES if split == "all" else (split,)
        data_name = data or saved.config.data
        collection = _Collection(dataset, names, f"{'+'.join(names)} of {data_name}")
        if collection.listed == 0:
            raise ValueError(f"the collection ({collection.description}) has no images")
        parsed = [_parse_query(text, collection) for text in queries]
        excluded = any(query.asked_row is not None or (query.image is not None and query.image.split in names)
                       for query in parsed)
        if not collection.may_skip:  # the rows are known before the pass: refused before any work
            _check_k(k, collection, excluded)
        encoder = model.encoder
        reader = _ImageReader(collection, read)
        if index == "faiss":
            found_index = _faiss_index(saved.folder, collection, encoder, read, chunk)
            features = None
        else:
            found_index = None
            features, _ = _collection_features(collection, encoder, read, with_digest=False)
        parsed = [_resolve_query(query, collection) for query in parsed]
        _check_k(k, collection, excluded)
        query_features = _query_features(parsed, collection, encoder, read, reader, features, found_index)
        exclude = torch.tensor([-1 if q.row is None else q.row for q in parsed], dtype=torch.int64)
        if found_index is None:
            assert features is not None
            result: Neighbors = nearest(query_features, features, k, chunk=chunk, exclude=exclude)
        else:
            result = faiss_nearest(found_index.index, query_features, k, exclude=exclude)
        found = [QueryNeighbors(query.text, query.image, query.row,
                                [Neighbor(rank + 1, row, similarity, collection.describe(*collection.locate(row)))
                                 for rank, (row, similarity) in enumerate(zip(rows, similarities))])
                 for query, rows, similarities in zip(parsed, result.indices.tolist(), result.similarities.tolist())]
        search = NeighborSearch(os.path.abspath(run_dir), os.path.abspath(saved.checkpoint), data_name, tuple(names),
                                collection.rows, k, index, found_index.file if found_index else None,
                                bool(found_index and found_index.reused), None, found, list(collection.skipped),
                                left_out_files(collection.dataset))
        if picture is not None:
            title = (f"{os.path.basename(os.path.abspath(run_dir))}: the {k} nearest images of "
                     f"{collection.description} ({collection.rows} images{collection.skipped_note()}) by cosine "
                     f"similarity of h, {index} search")
            _write_picture(picture, found, parsed, reader, title)
            search.picture = os.path.abspath(picture)
        return search


def _check_k(k: int, collection: _Collection, excluded: bool) -> None:
    """``k`` no more than the collection's images, less the query where one is in it."""
    if k > collection.rows - excluded:
        others = " besides the query itself" if excluded else ""
        raise ValueError(f"k={k} is more than the {collection.rows - excluded} images of the collection "
                         f"({collection.description}{collection.skipped_note()}){others}")


def _query_features(parsed: List[_Query], collection: _Collection, encoder: nn.Module, read: _Reading,
                    reader: _ImageReader, features: Optional[torch.Tensor],
                    found_index: Optional[_FaissIndex]) -> torch.Tensor:
    """``h`` of each query ``(q, d)``: a collected image's own row (the numbers its neighbors
    were compared with); other images encoded, in batches."""
    to_encode = [i for i, q in enumerate(parsed) if q.row is None]
    from_data = reader.images([(parsed[i].image.split, parsed[i].image.index) for i in to_encode
                               if parsed[i].file_image is None])
    encoded: Dict[int, torch.Tensor] = {}
    for start in range(0, len(to_encode), read.batch_size):
        block = to_encode[start:start + read.batch_size]
        images = torch.stack([parsed[i].file_image if parsed[i].file_image is not None
                              else from_data[(parsed[i].image.split, parsed[i].image.index)] for i in block])
        for i, row in zip(block, _encode(encoder, images, read, collection)):
            encoded[i] = torch.from_numpy(np.array(row))
    rows = []
    for i, query in enumerate(parsed):
        if query.row is None:
            rows.append(encoded[i])
        elif features is not None:
            rows.append(features[query.row])
        else:
            assert found_index is not None
            rows.append(torch.from_numpy(np.asarray(found_index.index.reconstruct(int(query.row)), dtype=np.float32)))
    return torch.stack(rows).float()
