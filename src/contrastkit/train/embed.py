"""Embeddings out of a run folder (``contrastkit embed``): ``h`` (encoder output, what the
linear probe reads) and optionally ``z`` (the projection head's output, not normalised) of
every image of a data set, with its split, label and name.

The encoder is rebuilt from the run folder (``contrastkit.train.runs.load_run``).
Each split is read as the read-out reads it (:func:`~contrastkit.data.image_batches`:
slices of an in-memory split, or a streamed split decoded one batch at a time in ``workers``
processes, never whole) and ``h`` computed by :func:`~contrastkit.metrics.readout.extract_features`
(the probe's own feature extractor, so the numbers are the probe's), then streamed into the
output: no more than one batch of images and features is held in memory. A row's ``name`` is
its image file where the split knows it (an image folder, streamed), else its index. A damaged
file an unlabeled collection skips (``bad_files="skip"``, its default) has no row: the rows are
the images embedded, in order, and the skipped ones are named (:class:`SkippedRow`, found by
:func:`skipped_rows`) in the result, the sidecar and the command's output. Files (see
:func:`contrastkit.layout.embedding_files`): ``OUT.npz`` with ``h``, ``z``, ``labels``,
``splits``, ``names``; or ``OUT.npy`` (``h``), ``OUT_z.npy`` (``z``) and ``OUT.csv`` (``split,
index, label, name`` per row). A sidecar (``OUT.npz.contrastkit.json`` or
``OUT.npy.contrastkit.json``) records what was written and from which run; every file is
listed in the output folder's manifest (:mod:`contrastkit.manifest`): an existing file is
replaced only with ``force`` and only if the manifest lists it with the size and SHA-256 it
still has.
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import Subset

from contrastkit import layout
from contrastkit._io import DISK_FULL, atomic_file, naming_writes

from contrastkit.data import check_positive_int, indexed_image_batches, skipped_reason
from contrastkit.metrics.readout import extract_features

from .export_files import check_targets, finish_export, mark_export, projection_head, remove_earlier_export
from .runs import load_run
from .setup import limit_threads, resolve_device

__all__ = ["SPLITS", "EmbeddingExport", "SkippedRow", "export_embeddings", "skipped_rows", "skipped_note",
           "left_out_files", "left_out_note"]

#: What ``split`` accepts (``all``: train, val and test, in that order).
SPLITS = ("train", "val", "test", "all")


@dataclass(frozen=True)
class SkippedRow:
    """An image of a split that has no embedding: a damaged file an unlabeled collection
    skipped. ``split`` and ``index`` say where it is (``SPLIT:INDEX``), ``name`` is its name as
    :func:`export_embeddings` names rows (the file relative to the collection), ``reason`` why it
    could not be read (the file named)."""

    split: str
    index: int
    name: str
    reason: str


def skipped_rows(name: str, split: Any, embedded: Iterable[int]) -> List[SkippedRow]:
    """The images of ``split`` (called ``name``) that a pass over it left out, in index order:
    those not in ``embedded`` (the item indices :func:`~contrastkit.data.indexed_image_batches`
    yielded), i.e. the damaged files an unlabeled collection skipped. The one account of which
    rows were skipped, for ``contrastkit embed`` and ``contrastkit neighbors``."""
    came = np.zeros(len(split), dtype=bool)
    came[np.fromiter(embedded, dtype=np.int64)] = True
    return [SkippedRow(name, int(i), _item_name(split, int(i)), skipped_reason(split, int(i)) or "not read")
            for i in np.flatnonzero(~came)]


def left_out_files(dataset: Any) -> Dict[str, str]:
    """The files ``dataset``'s listing left out (an unlabeled collection's ``left_out``:
    ``{file: reason}``), for ``contrastkit embed`` and ``contrastkit neighbors`` to name."""
    return dict(getattr(dataset, "left_out", None) or {})


def left_out_note(count: int) -> str:
    """How a count of files left out at listing is said, in every output that counts images."""
    return f"{count} file{'' if count == 1 else 's'} left out when the collection was listed"


def skipped_note(count: int) -> str:
    """How a count of skipped rows is said (``"2 damaged files skipped, not embedded"``), the
    same in every output that counts images."""
    return f"{count} damaged file{'' if count == 1 else 's'} skipped, not embedded"


@dataclass
class EmbeddingExport:
    """What :func:`export_embeddings` wrote: ``files`` by role (``archive`` or ``h`` / ``z`` /
    ``rows``, and ``marker``), the number of ``rows`` (the images embedded) and the widths of
    ``h`` and ``z`` (``z_dim`` ``None`` without the projection); ``skipped``: the damaged files
    an unlabeled collection skipped, which have no row."""

    files: Dict[str, str]
    rows: int
    h_dim: int
    z_dim: Optional[int]
    splits: Tuple[str, ...]
    skipped: List[SkippedRow] = field(default_factory=list)
    #: The files an unlabeled collection's listing left out, in no split and so never embedded
    #: (``{file: reason}``: a name that is not UTF-8, a link to nothing, a second link).
    left_out: Dict[str, str] = field(default_factory=dict)


def export_embeddings(run_dir: str, out: str, *, data: Optional[str] = None,
                      data_options: Optional[Dict[str, Any]] = None, split: str = "all",
                      projection: bool = False, checkpoint: Optional[str] = None, force: bool = False,
                      device: str = "auto", batch_size: int = 256, threads: Optional[int] = None,
                      workers: Optional[int] = None, progress: Optional[bool] = None,
                      collection_changed: str = "stop") -> EmbeddingExport:
    """Write the embeddings of ``data`` (default: the run's own data set and options) under
    the encoder of the run in ``run_dir``.

    Args:
        run_dir: a ``contrastkit pretrain`` output folder.
        out: ``PATH.npz`` (one archive) or ``PATH.npy`` / ``PATH`` (``.npy`` files + ``.csv``).
        data, data_options: another data set for the same encoder (its loader options; the
            run's own options when ``data`` is not given).
        split: ``train``, ``val``, ``test`` or ``all``.
        projection: also write ``z``, the projection head's output.
        checkpoint: another checkpoint of the run (default ``checkpoints/last.pt``).
        force: replace the files of an earlier export (only files its marker lists).
        threads, workers: CPU threads, and processes decoding a streamed split's images
            (default: the run's settings).
        progress: show a progress bar; ``None``: when stderr is a terminal.
        collection_changed: what the run's unlabeled collection does when its files changed
            since the run recorded its listing (``"stop"``, ``"reindex"``, ``"keep"``:
            :meth:`~contrastkit.train.runs.SavedRun.load_data`); unchanged, it is read from
            the record, not listed again.

    Raises:
        FileNotFoundError: ``run_dir`` is not a run, or the folder of ``out`` does not exist.
        FileExistsError: an output file exists (without ``force``, or not written by an export).
        ValueError: a bad option, or data whose images the encoder cannot read.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    check_positive_int(batch_size, "batch_size")
    if workers is not None:
        check_positive_int(workers, "workers", 0)
    files = layout.embedding_files(out, projection)
    check_targets(files, force, "contrastkit embed")
    saved = load_run(run_dir, checkpoint=checkpoint)
    with limit_threads(saved.config.threads if threads is None else threads):
        torch_device = resolve_device(device)
        dataset = saved.load_data(data, data_options, collection_changed=collection_changed)
        model = saved.build_model(saved.image_shape if saved.image_shape else dataset.image_shape, torch_device)
        if saved.image_shape and dataset.image_shape[0] != saved.image_shape[0]:
            raise ValueError(f"{data or saved.config.data} has {dataset.image_shape[0]}-channel images; the run "
                             f"in {run_dir} was trained on {saved.image_shape[0]} channels")
        names = ("train", "val", "test") if split == "all" else (split,)
        head = projection_head(model) if projection else None
        read = _Reading(batch_size, saved.config.workers if workers is None else workers)
        with naming_writes(out, DISK_FULL):  # a full disk under the output (numpy's and zip's errors name no file)
            return _write(files, dataset, names, model.encoder, head, torch_device, read, progress,
                          {"run": os.path.abspath(run_dir), "checkpoint": os.path.abspath(saved.checkpoint),
                           "data": data or saved.config.data, "split": split})


@dataclass(frozen=True)
class _Reading:
    """How the splits are read: images per forward pass, and decoding processes."""

    batch_size: int
    workers: int


def _chunks(split: Any, read: _Reading) -> Iterator[Tuple[torch.Tensor, List[int], np.ndarray, List[str]]]:
    """``(images, indices, labels, names)`` of consecutive batches of ``split``, read as the read-out
    reads it (labels -1 where the data have none; names: see :func:`_item_name`)."""
    labels = getattr(split, "labels", None)
    for batch, indices in indexed_image_batches(split, read.batch_size, read.workers):
        n = int(batch.shape[0])
        batch_labels = (np.full(n, -1, dtype=np.int64) if labels is None
                        else np.asarray(labels[indices].cpu().numpy(), dtype=np.int64))
        yield batch, indices.tolist(), batch_labels, [_item_name(split, int(i)) for i in indices.tolist()]


def _item_name(split: Any, index: int) -> str:
    """Item ``index``'s image file where the split knows it (an image folder read lazily, or a
    ``Subset`` of one: :class:`~contrastkit.data.ImageFolderDataset` ``.path``; an unlabeled
    collection's path relative to it), else the index."""
    while isinstance(split, Subset):
        split, index = split.dataset, int(split.indices[index])
    path = getattr(split, "relative_path", None) or getattr(split, "path", None)
    return str(path(index)) if callable(path) else str(index)


class _Columns:
    """Streams float32 rows into a ``.npy`` file whose width is known at the first batch."""

    def __init__(self, path: str, rows: int) -> None:
        self.path, self.rows, self.filled, self.width = path, rows, 0, 0
        self.array: Optional[np.memmap] = None

    def add(self, values: np.ndarray) -> None:
        if self.array is None:
            self.array = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float32,
                                                   shape=(self.rows, values.shape[1]))
            self.width = int(values.shape[1])
        self.array[self.filled:self.filled + values.shape[0]] = values
        self.filled += values.shape[0]

    def close(self) -> None:
        if self.array is not None:
            self.array.flush()
            if self.filled < self.rows:  # damaged files an unlabeled collection skipped: fewer rows
                shorter = np.lib.format.open_memmap(self.path + ".part", mode="w+", dtype=np.float32,
                                                    shape=(self.filled, self.width))
                for start in range(0, self.filled, 65536):
                    stop = min(start + 65536, self.filled)
                    shorter[start:stop] = self.array[start:stop]
                shorter.flush()
                del shorter
                os.replace(self.path + ".part", self.path)
            del self.array
            self.array = None


def _write(files: Dict[str, str], dataset: Any, names: Sequence[str], encoder: nn.Module,
           head: Optional[nn.Module], device: torch.device, read: _Reading, progress: Optional[bool],
           facts: Dict[str, Any]) -> EmbeddingExport:
    splits = [(name, getattr(dataset, name)) for name in names]
    total = sum(len(split) for _, split in splits)
    if total == 0:
        raise ValueError(f"{facts['data']} has no images in the {facts['split']} split")
    work = tempfile.mkdtemp(prefix=".embed-", dir=os.path.dirname(os.path.abspath(files["marker"])))
    try:
        h = _Columns(os.path.join(work, "h.npy"), total)
        z = _Columns(os.path.join(work, "z.npy"), total) if head is not None else None
        rows_path = os.path.join(work, "rows.csv")
        labels: List[np.ndarray] = []
        row_splits: List[str] = []
        row_names: List[str] = []
        skipped: List[SkippedRow] = []
        with open(rows_path, "w", newline="", encoding="utf-8") as handle, _Bar(progress, total) as bar:
            writer = csv.writer(handle)
            writer.writerow(("split", "index", "label", "name"))
            for name, split in splits:
                embedded: List[int] = []
                for images, indices, batch_labels, batch_names in _chunks(split, read):
                    embedded.extend(indices)
                    features = _features(encoder, images, device, facts)
                    h.add(features.astype(np.float32))
                    if z is not None:
                        z.add(_project(head, features, device))
                    writer.writerows((name, index, int(label), label_name) for index, label, label_name
                                     in zip(indices, batch_labels, batch_names))
                    labels.append(batch_labels)
                    row_splits.extend([name] * len(batch_names))
                    row_names.extend(batch_names)
                    bar.advance(len(batch_names))
                missing = skipped_rows(name, split, embedded)
                skipped.extend(missing)
                bar.advance(len(missing))  # the bar counts the images read, embedded or not
        total = h.filled  # less than the splits' sizes where damaged files were skipped
        if total == 0:
            raise ValueError(f"every image of {'+'.join(names)} of {facts['data']} is a damaged file "
                             f"({skipped_note(len(skipped))}), e.g. {skipped[0].reason}")
        h.close()
        if z is not None:
            z.close()
        remove_earlier_export(files)
        marked = mark_export(files)
        if "archive" in files:
            _zip(files["archive"], {"h": h.path, **({"z": z.path} if z is not None else {})},
                 {"labels": np.concatenate(labels), "splits": np.array(row_splits), "names": np.array(row_names)})
        else:
            os.replace(h.path, files["h"])
            if z is not None:
                os.replace(z.path, files["z"])
            os.replace(rows_path, files["rows"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    finish_export(files, marked, {
        "written_by": "contrastkit embed", **facts, "rows": total,
        "h_dim": h.width, "z_dim": z.width if z is not None else None,
        "skipped": [asdict(row) for row in skipped], "left_out": left_out_files(dataset),
    })
    return EmbeddingExport(files, total, h.width, z.width if z is not None else None, tuple(names), skipped,
                           left_out_files(dataset))


def _features(encoder: nn.Module, images: torch.Tensor, device: torch.device, facts: Dict[str, Any]) -> np.ndarray:
    """``h`` of one batch (already read: one forward pass)."""
    try:
        return extract_features(encoder, images, device, int(images.shape[0]))
    except RuntimeError as err:  # e.g. images of a size the encoder was not built for
        raise ValueError(f"the encoder of {facts['run']} cannot read the images of {facts['data']} "
                         f"({tuple(images.shape[1:])}): {str(err).splitlines()[0]}") from None


@torch.no_grad()
def _project(head: nn.Module, features: np.ndarray, device: torch.device) -> np.ndarray:
    """``z`` of float64 copies of float32 ``h`` (exact: the same numbers the head would see)."""
    was_training = head.training
    head.eval()
    try:
        return head(torch.from_numpy(features).float().to(device)).cpu().numpy().astype(np.float32)
    finally:
        head.train(was_training)


def _zip(path: str, npy_files: Dict[str, str], arrays: Dict[str, np.ndarray]) -> None:
    """An ``.npz`` (what :func:`numpy.savez` writes) from ``.npy`` files on disk and small arrays."""
    with atomic_file(path, "wb") as handle, \
            zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, source in npy_files.items():
            archive.write(source, arcname=f"{name}.npy")
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


class _Bar:
    """A rich progress bar over the rows (a no-op when disabled)."""

    def __init__(self, enabled: Optional[bool], total: int) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = total

    def __enter__(self) -> "_Bar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("embed"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self.task = self.progress.add_task("embed", total=self.total)
            self.progress.start()
        return self

    def advance(self, rows: int) -> None:
        if self.enabled:
            self.progress.update(self.task, advance=rows)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.progress.stop()
