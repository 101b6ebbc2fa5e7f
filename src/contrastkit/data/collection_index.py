"""A collection's index recorded once and read back: the files of each split, what was left
out, the colour, and a fingerprint that tells whether the collection changed since.

Listing a collection of a million files takes seconds to tens of seconds
(``benchmarks/results/million_files.md``); a run records its listing in its folder
(``collection-index.npz``) and ``pretrain --resume``, ``embed``, ``neighbors`` and ``probe``
read it back instead of listing again. Whether the collection is still the one indexed is told
by what lists change cheaply, not by listing it again:

* **a folder**: the modification and change times and the inode of every folder the listing
  read (the collection's and each one below it). Adding, removing or renaming a file or a
  sub-folder changes its folder's times; a folder that is gone, replaced by another (a new
  inode), or whose times moved, is a change. A folder modified within :data:`RACY_SECONDS`
  before it was listed may have changed again within the same tick of the file system's clock
  (git's "racy" files): it counts as changed. The change time cannot be set back (``touch
  -d`` and a copy that keeps times set it to now), so a folder put back in place with its old
  modification time is seen too. A file's content is not part of the index (a file replaced
  by another image is read as it now is), nor is a file outside the collection that a link in
  it names (removed, it is a damaged file when it is read).
* **a list file**: the SHA-256 of the list. A file the list names that was removed since is a
  damaged file when it is read (skipped and named under ``bad_files="skip"``), as it is while a
  run reads a collection.

A change seen that way is confirmed by listing the collection again and comparing the files:
only a collection whose files differ (some added, some gone) is reported as changed
(:class:`CollectionChangedError`), and the caller chooses (``collection_changed``, one of
:data:`COLLECTION_CHANGED`): ``"stop"`` (the error, naming both choices), ``"reindex"`` (the
new listing) or ``"keep"`` (the recorded files, those gone left out and named).

The file is a NumPy ``.npz`` archive read without pickle: per split the paths' bytes and their
offsets (a ``contrastkit.data.collection.PathList``'s two arrays), the folders' names and
times, and one JSON record (``meta``) of the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from contrastkit._io import atomic_file, escape_line

__all__ = ["COLLECTION_CHANGED", "RACY_SECONDS", "INDEX_VERSION", "CollectionChangedError", "Fingerprint",
           "RecordedIndex", "check_collection_changed", "compare_names", "change_line", "recorded_source",
           "write_record", "read_record", "paths_arrays", "unreadable_note", "digests", "change_counts"]

#: What a collection that changed since its index was recorded does (an error naming the
#: change and the two choices, a new listing, or the recorded files still there).
COLLECTION_CHANGED = ("stop", "reindex", "keep")
#: A folder modified this soon before it was listed is listed again to be sure (2 s, the
#: coarsest file-system clock in use, FAT's).
RACY_SECONDS = 2.0
#: The version of the file's layout (a file of another version is not read, and the collection is listed).
INDEX_VERSION = 1
_SPLITS = ("train", "val", "test")


def check_collection_changed(value: Any, name: str = "collection_changed") -> str:
    """``value`` as one of :data:`COLLECTION_CHANGED`; a ``ValueError`` naming ``name`` otherwise."""
    if value not in COLLECTION_CHANGED:
        raise ValueError(f"{name} must be one of {', '.join(COLLECTION_CHANGED)}, got {value!r}")
    return value


class CollectionChangedError(ValueError):
    """The collection is not the one its recorded index lists (files added or gone); the
    message is one line naming the change and the two ways on."""


@dataclass
class Fingerprint:
    """What tells whether a collection changed since it was listed: ``kind`` ``"folder"``
    (``folders``: each folder read, as its path's bytes relative to the collection, ``b""`` for
    the collection itself, its modification and change times in ns and its inode;
    ``listed_at_ns``: the clock when the listing started) or ``"list"`` (``list_sha256``: the
    list file's SHA-256)."""

    kind: str
    listed_at_ns: int = 0
    folders: List[Tuple[bytes, int, int, int]] = field(default_factory=list)
    list_sha256: Optional[str] = None

    def changed_folders(self, root: str) -> List[str]:
        """The folders (their paths under ``root``) that are gone, replaced, or whose times
        differ from the recorded ones, or that were modified too soon before the listing to
        tell (:meth:`racy`); one ``stat`` per folder."""
        racy_after = self._racy_after()
        changed = []
        for relative, mtime, ctime, inode in self.folders:
            path = os.path.join(root, os.fsdecode(relative)) if relative else root
            try:
                now = os.stat(path)
            except OSError:
                changed.append(path)
                continue
            if (now.st_mtime_ns, now.st_ctime_ns, now.st_ino) != (mtime, ctime, inode) or mtime >= racy_after:
                changed.append(path)
        return changed

    def racy(self) -> bool:
        """Whether a folder was modified too soon before the listing for its time to tell a
        later change (:data:`RACY_SECONDS`): such a listing is confirmed by listing again."""
        racy_after = self._racy_after()
        return any(mtime >= racy_after for _, mtime, _, _ in self.folders)

    def _racy_after(self) -> int:
        return self.listed_at_ns - int(RACY_SECONDS * 1e9)


@dataclass
class RecordedIndex:
    """A collection's listing as it is recorded: ``source`` (the folder or list file, an
    absolute path), ``root`` (the folder the paths are named relative to, as it was given:
    the collection, or the list's folder) and ``relative`` (whether the paths are held after
    the prefix ``root/``, rather than as whole paths), ``splits`` (``{split: (data, offsets)}``: each split's paths after
    ``prefix``, a ``contrastkit.data.collection.PathList``'s arrays), ``left_out``
    (``{escaped path: reason}``), ``color`` (``"L"`` or ``"RGB"``), the fractions and
    ``bad_files`` it was split and listed with, and its :class:`Fingerprint`."""

    source: str
    root: str
    relative: bool
    prefix: str
    splits: Dict[str, Tuple[np.ndarray, np.ndarray]]
    left_out: Dict[str, str]
    color: str
    val_fraction: float
    test_fraction: float
    bad_files: str
    fingerprint: Fingerprint

    def write(self, path: "str | os.PathLike[str]") -> None:
        """Write the index to ``path`` (:func:`write_record`)."""
        meta = {"source": self.source, "root": self.root, "relative": self.relative,
                "prefix": self.prefix, "left_out": self.left_out,
                "color": self.color, "val_fraction": self.val_fraction, "test_fraction": self.test_fraction,
                "bad_files": self.bad_files, "kind": self.fingerprint.kind,
                "listed_at_ns": self.fingerprint.listed_at_ns, "list_sha256": self.fingerprint.list_sha256}
        arrays: Dict[str, np.ndarray] = {}
        for name in _SPLITS:
            arrays[f"{name}_data"], arrays[f"{name}_offsets"] = self.splits[name]
        names = [folder[0] for folder in self.fingerprint.folders]
        arrays["folder_data"] = np.frombuffer(b"".join(names), dtype=np.uint8)
        arrays["folder_offsets"] = np.concatenate([[0], np.cumsum([len(name) for name in names], dtype=np.int64)])
        for at, name, kind in ((1, "folder_mtimes", np.int64), (2, "folder_ctimes", np.int64),
                               (3, "folder_inodes", np.uint64)):
            arrays[name] = np.array([folder[at] for folder in self.fingerprint.folders], dtype=kind)
        write_record(path, meta, arrays)

    @classmethod
    def read(cls, path: "str | os.PathLike[str]") -> Optional["RecordedIndex"]:
        """The index in ``path``; ``None`` when the file is damaged or of another layout
        version (the collection is then listed again, as if there were none)."""
        record = read_record(path)
        if record is None or record[0].get("kind") not in ("folder", "list"):
            return None
        meta, archive = record
        try:
            splits = {}
            for name in _SPLITS:
                data, offsets = archive[f"{name}_data"], archive[f"{name}_offsets"]
                if not paths_arrays(data, offsets):
                    return None
                splits[name] = (data, offsets)
            folder_data, folder_offsets = archive["folder_data"].tobytes(), archive["folder_offsets"]
            times = zip(archive["folder_mtimes"].tolist(), archive["folder_ctimes"].tolist(),
                        archive["folder_inodes"].tolist())
            folders = [(folder_data[start:end], *folder)
                       for start, end, folder in zip(folder_offsets[:-1].tolist(), folder_offsets[1:].tolist(), times)]
            fingerprint = Fingerprint(str(meta["kind"]), int(meta["listed_at_ns"]), folders, meta["list_sha256"])
            left_out = {str(key): str(value) for key, value in dict(meta["left_out"]).items()}
            return cls(str(meta["source"]), str(meta["root"]), bool(meta["relative"]), str(meta["prefix"]), splits, left_out, str(meta["color"]),
                       float(meta["val_fraction"]), float(meta["test_fraction"]), str(meta["bad_files"]), fingerprint)
        except (ValueError, KeyError, TypeError):
            return None

    def describes(self, source: str, val_fraction: float, test_fraction: float, bad_files: str) -> bool:
        """Whether this is the index of the collection ``source`` (an absolute path) opened with
        these options (the splits depend on the fractions, what is left out on ``bad_files``)."""
        return (self.source == source and self.val_fraction == val_fraction and self.test_fraction == test_fraction
                and self.bad_files == bad_files)

    def names(self) -> Iterable[bytes]:
        """Every recorded path's bytes (``prefix`` included), split by split."""
        prefix = os.fsencode(self.prefix)
        for name in _SPLITS:
            data, offsets = self.splits[name]
            buffer, ends = data.tobytes(), offsets.tolist()
            for start, end in zip(ends, ends[1:]):
                yield prefix + buffer[start:end]

    def __len__(self) -> int:
        return sum(len(offsets) - 1 for _, offsets in self.splits.values())


def write_record(path: "str | os.PathLike[str]", meta: Dict[str, Any], arrays: Dict[str, np.ndarray]) -> None:
    """Write a data set's record to ``path``: the JSON-able ``meta`` (its ``version``, and its
    ``kind``: ``"folder"``, ``"list"``, ``"pairs"``, added) and the named ``arrays``, as an
    ``.npz`` archive read without pickle, atomically (an interrupted write leaves the former file)."""
    meta = {**meta, "version": INDEX_VERSION}
    with atomic_file(path, "wb") as handle:
        np.savez(handle, meta=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8), **arrays)


def read_record(path: "str | os.PathLike[str]", *, meta_only: bool = False
                ) -> Optional[Tuple[Dict[str, Any], Dict[str, np.ndarray]]]:
    """``(meta, arrays)`` of the record at ``path`` (:func:`write_record`; ``meta_only``: the
    arrays are not read); ``None`` when there is none, it is damaged, or of another layout
    version (the data are then read again, as if there were no record)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("version") != INDEX_VERSION:
                return None
            arrays = {} if meta_only else {name: archive[name] for name in archive.files if name != "meta"}
        return meta, arrays
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def unreadable_note(index: "Optional[str | os.PathLike[str]]", source: Any) -> Optional[str]:
    """The line that says a record at ``index`` is there but cannot be read (damaged, or of
    another version), so that ``source`` is read again without telling a change since the
    record; ``None`` when there is no file at ``index`` or it can be read."""
    if index is None or not os.path.isfile(index) or read_record(index, meta_only=True) is not None:
        return None
    return (f"{index} cannot be read (damaged, or written by another version): {escape_line(str(source))} is read "
            "again, and a change since it was recorded cannot be told")


def paths_arrays(data: np.ndarray, offsets: np.ndarray) -> bool:
    """Whether ``(data, offsets)`` are a ``contrastkit.data.collection.PathList``'s
    arrays (uint8 bytes, int64 offsets from 0 to their length, never decreasing)."""
    return bool(data.dtype == np.uint8 and data.ndim == 1 and offsets.dtype == np.int64 and offsets.ndim == 1
                and len(offsets) and offsets[0] == 0 and offsets[-1] == len(data) and not np.any(np.diff(offsets) < 0))


def recorded_source(path: "str | os.PathLike[str]") -> Optional[str]:
    """The data (a collection, an image-text CSV: its absolute path) whose listing the record
    at ``path`` holds, its JSON alone read; ``None`` when there is none to read."""
    record = read_record(path, meta_only=True)
    return None if record is None else str(record[0].get("source"))


def compare_names(recorded: Callable[[], Iterable[bytes]], listed: Callable[[], Iterable[bytes]]
                  ) -> Tuple[List[bytes], List[bytes]]:
    """``(added, gone)``: the paths listed that the recorded ones lack, in the listing's order,
    and the recorded ones that the listing lacks, in their order; each argument a function that
    gives a new pass over its paths' bytes. The paths are compared by their 128-bit BLAKE2b
    digests (16 bytes a path, however long: a million paths compared in ~32 MB; two different
    paths share a digest with a probability of about 2^-128 a pair)."""
    known, found = digests(recorded()), digests(listed())
    added_at = set(np.flatnonzero(~np.isin(found, known)).tolist())
    gone_at = set(np.flatnonzero(~np.isin(known, found)).tolist())
    added = [name for position, name in enumerate(listed()) if position in added_at] if added_at else []
    gone = [name for position, name in enumerate(recorded()) if position in gone_at] if gone_at else []
    return added, gone


def digests(names: Iterable[bytes]) -> np.ndarray:
    """The 16-byte BLAKE2b digest of each of ``names``, as an ``S16`` array (what
    :func:`compare_names` compares)."""
    buffer = bytearray()
    for name in names:
        buffer += hashlib.blake2b(name, digest_size=16).digest()
    return np.frombuffer(buffer, dtype="S16")


def change_counts(added: List[bytes], gone: List[bytes], unit: str = "image file") -> str:
    """``"N image files added, M gone"`` (``unit``: what is counted; a part without any is left out)."""
    parts = [f"{len(added):,} {unit}{'s' if len(added) != 1 else ''} added"] if added else []
    return ", ".join(parts + ([f"{len(gone):,} gone"] if gone else []))


def change_line(source: str, index_file: str, added: List[bytes], gone: List[bytes], recorded: int,
                unit: str = "image file", shown: Optional[Callable[[bytes], str]] = None) -> str:
    """The one line that names a changed collection (``unit``: what it lists, ``"image
    file"``, ``"row"``; an example of each change, ``shown(item)``, by default its path, written
    as one line) and the two ways on."""
    shown = shown or os.fsdecode
    parts = []
    if added:
        parts.append(f"{len(added):,} {unit}{'s' if len(added) != 1 else ''} added (e.g. "
                     f"{escape_line(shown(added[0]))})")
    if gone:
        parts.append(f"{len(gone):,} gone (e.g. {escape_line(shown(gone[0]))})")
    return (f"{escape_line(source)} changed since it was indexed in {index_file}: {', '.join(parts)}; "
            f"--collection-changed reindex lists it again, --collection-changed keep reads the "
            f"{recorded - len(gone):,} recorded {unit}s still there")
