"""Unlabeled image collections: a folder of images without class structure (flat or nested,
read recursively) or a list file of image paths, streamed like class folders.

What is held per image is its path alone (:class:`PathList`: one byte buffer of the names
and their offsets, shared by forked workers); images are decoded in the ``DataLoader``'s
workers. Opening a collection lists it (each folder once, with ``os.scandir``: no ``stat`` per
file), splits it by name and decodes the headers of its first 32 files, nothing else: a
million files open in well under a minute (``benchmarks/results/million_files.md``). The rules:

* **Files**: every file below the folder whose name ends in an image extension
  (:data:`~contrastkit.data.files.IMAGE_EXTENSIONS`: JPEG, PNG, WebP, BMP, TIFF, GIF, PNM),
  hidden files and folders excepted, each read once: symbolic links to folders are followed
  unless the folder was already read (a loop among them), a link to a file already listed is
  left out and a link to nothing too, each named (:func:`skipped_files`); a ``.txt`` or ``.csv`` list holds one path a line
  (relative to the list's folder unless absolute; a CSV's first column, a header ``path`` or
  ``image`` skipped; blank lines and ``#`` comments skipped).
* **Colour**: grayscale (1 channel) when the first 32 files (in path order) are all grayscale,
  else RGB (3 channels); ``color="L"`` / ``"RGB"`` forces it. Palette images are expanded,
  CMYK converted to RGB, transparent pixels (RGBA, LA, a palette's transparency) composited
  over white, 16-bit images rescaled by their full range and 32-bit ones by their maximum.
* **Size**: the shorter side resized to ``size`` (bilinear, antialiased), then the centre
  ``size x size`` square cropped (what torchvision's ``Resize`` + ``CenterCrop`` does for
  evaluation); ``size`` defaults to 32, the built-in encoders' natural size. These rules are
  defined once, in :mod:`contrastkit.data.preprocess` (which an export's input contract states).
* **Splits**: a file belongs to val or test by a hash of its path relative to the collection
  (SHA-1, ``val_fraction`` / ``test_fraction`` of the hash range), never by its position, so
  adding files never moves a file between splits; a collection too small to put a file in
  every split that way lends each empty split the file nearest its share of the hash range
  (:func:`split_by_hash`), so from 3 files on no split is empty.
* **Damaged files** (unreadable, truncated, empty, not an image, over the pixel ceiling):
  ``bad_files="skip"`` (the default here) drops them from their batch, counts and names them
  (:func:`skipped_files`); ``"fail"`` stops at the first, naming it. A file removed, made
  unreadable or overwritten by something that does not decode after the collection was
  indexed (while a run reads it) is a damaged file like any other; a file overwritten by
  another image is read as it now is (what is held is the path, not the content).
* **File names that are not UTF-8** (bytes such as ``b'caf\\xe9.png'`` on Linux): they could
  not be written in a run's outputs (skipped.txt, the names of ``contrastkit embed``), so
  ``"skip"`` leaves them out when the collection is indexed and names them with the bytes
  escaped (``caf\\xe9.png``); ``"fail"`` refuses the folder, naming the bytes.
* **List files**: an entry that is not a regular file (a folder, ``/dev/zero``) or names a file
  another line names (a duplicate, however spelled) is refused, naming the line(s).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import stat
import time
from array import array
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from contrastkit._io import escape_line, escape_undecodable, file_digest, file_kind, open_input
from contrastkit.data.base import NO_LABEL, check_fraction, check_positive_int
from contrastkit.data.collection_index import (CollectionChangedError, Fingerprint, RecordedIndex, change_counts,
                                               change_line, check_collection_changed, compare_names, unreadable_note)
from contrastkit.data.streaming import BadItemError, read_image_file

__all__ = ["ImageCollection", "CollectionDataset", "PathList", "open_collection", "collection_files",
           "is_collection_source", "BAD_FILES", "DEFAULT_SIZE", "MAX_SIZE", "check_image_size", "skipped_files", "skipped_reasons",
           "skipped_reason", "add_skipped", "skips_bad_files", "hash_fraction", "split_by_hash", "SPLITS", "list_entry_path"]

#: What a damaged file does: dropped from its batch and named, or the run stops.
BAD_FILES = ("skip", "fail")
#: The side of a collection's images when no size is given (the built-in encoders' input).
DEFAULT_SIZE = 32
#: The largest side a collection's images are brought to. A 4096 x 4096 RGB image is 48 MiB
#: decoded and 192 MiB as the float32 an encoder reads, and a step holds two views of every
#: image of its batch: far beyond that, not even a batch of two fits in a large machine's memory.
MAX_SIZE = 4096
#: Files whose modes decide a collection's colour.
_COLOR_SAMPLE = 32
_LIST_SUFFIXES = (".txt", ".csv")


def is_collection_source(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` is a list file of image paths (``.txt`` / ``.csv``)."""
    return Path(path).is_file() and Path(path).suffix.lower() in _LIST_SUFFIXES


def check_image_size(size: Any, name: str = "size") -> int:
    """``size`` as the side of a collection's images: an integer from 1 to :data:`MAX_SIZE`;
    a ``ValueError`` naming ``name`` otherwise (before any memory is asked for)."""
    size = check_positive_int(size, name)
    if size > MAX_SIZE:
        raise ValueError(f"{name} {size} is over the ceiling of {MAX_SIZE} pixels a side: two views of a batch of "
                         f"{size}x{size} images would not fit in memory (images are resized to it; "
                         f"{DEFAULT_SIZE} is the built-in encoders' size)")
    return size


def collection_files(source: Union[str, os.PathLike]) -> Tuple[Path, List[Path]]:
    """``(root, files)``: the collection's folder (paths are named relative to it) and its image
    files in path order. A folder is walked recursively; a list file is read line by line. A
    file name that is not UTF-8 is refused (:func:`open_collection` with ``bad_files="skip"``
    leaves such files out instead)."""
    root, files, _, _, _ = _index(source, "fail")
    return root, [Path(files[i]) for i in range(len(files))]


class PathList:
    """File paths held compactly: a common ``prefix`` (``str``) and one byte buffer of every
    path's remaining file-system bytes (``data``, uint8) with their ``n + 1`` int64 ``offsets``.
    No Python object is kept per path (a million paths cost their bytes and 8 more each), and a
    forked ``DataLoader`` worker shares the two arrays' pages. ``paths[i]`` is
    ``prefix + paths.item(i)``; a byte that is not UTF-8 reads back surrogate-escaped, as
    ``os.fsdecode`` gives it."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray, prefix: str = "") -> None:
        self.data = np.asarray(data, dtype=np.uint8)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.prefix = prefix

    @classmethod
    def of(cls, paths: Iterable[Union[str, os.PathLike]], prefix: str = "") -> "PathList":
        """The paths ``prefix + path`` of ``paths`` (each given without the prefix)."""
        data, ends = bytearray(), array("q", [0])
        for path in paths:
            data += os.fsencode(path)
            ends.append(len(data))
        return cls._from(data, ends, prefix)

    @classmethod
    def _from(cls, data: bytearray, ends: "array[int]", prefix: str) -> "PathList":
        # (the arrays are views of the buffers, which are not changed afterwards: no copy)
        return cls(np.frombuffer(data, dtype=np.uint8), np.frombuffer(ends, dtype=np.int64), prefix)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def item_bytes(self, index: int) -> bytes:
        """The bytes of path ``index`` after the prefix."""
        return self.data[self.offsets[index]:self.offsets[index + 1]].tobytes()

    def item(self, index: int) -> str:
        """Path ``index`` without the prefix."""
        return os.fsdecode(self.item_bytes(index))

    def __getitem__(self, index: int) -> str:
        return self.prefix + self.item(index)

    def items_bytes(self) -> Iterator[bytes]:
        """The bytes of every path after the prefix, in order."""
        data, offsets = self.data.tobytes(), self.offsets.tolist()
        return (data[start:end] for start, end in zip(offsets, offsets[1:]))

    def take(self, indices: np.ndarray) -> "PathList":
        """The paths at ``indices`` (an int array), in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        lengths = (self.offsets[1:] - self.offsets[:-1])[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        step = 1 << 16  # gathered a block of paths at a time: a byte index per block's byte, not the whole's
        for first in range(0, len(indices), step):
            counts = lengths[first:first + step]
            begin, end = int(offsets[first]), int(offsets[first + len(counts)])
            within = np.arange(end - begin, dtype=np.int64) - np.repeat(offsets[first:first + len(counts)] - begin,
                                                                        counts)
            data[begin:end] = self.data[np.repeat(self.offsets[indices[first:first + step]], counts) + within]
        return PathList(data, offsets, self.prefix)


def _index(source: Union[str, os.PathLike], bad_files: str
           ) -> Tuple[Path, PathList, bool, Dict[str, str], Fingerprint]:
    """:func:`collection_files` (the paths held as a :class:`PathList`), whether they are held
    as their names relative to the root after the prefix ``root/`` (a folder's, a list's of
    plain relative paths) rather than as whole paths, the files left out (``{escaped path:
    reason}``, non-UTF-8 names under ``bad_files="skip"``) and what tells later whether the
    collection changed (:class:`~contrastkit.data.collection_index.Fingerprint`)."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    source = Path(source)
    left_out: Dict[str, str] = {}
    if source.is_dir():
        fingerprint = Fingerprint("folder", time.time_ns())
        files, undecodable = _walk(source, left_out, bad_files, fingerprint.folders)
        if not len(files):
            if left_out:
                first, reason = next(iter(left_out.items()))
                raise ValueError(f"{source}: no image file to read in it or below it ({len(left_out)} left out, "
                                 f"e.g. {first}: {reason})")
            raise ValueError(f"{source}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it or below it")
        if not undecodable:
            return source, files, True, left_out, fingerprint
        for index in undecodable:  # (the folder's own name may be anything: it is never written)
            relative = files.item(index)
            if bad_files == "fail":
                raise ValueError(f"{source}: the file name {os.fsencode(relative)!r} is not valid UTF-8, so a run's "
                                 "outputs could not name it (rename it, or let bad_files=skip leave it out)")
            left_out[escape_undecodable(files[index])] = (f"file name is not valid UTF-8 ({os.fsencode(relative)!r}): "
                                                          "left out, since a run's outputs could not name it")
        if len(undecodable) == len(files):
            raise ValueError(f"{source}: none of its {len(files)} image file names is valid UTF-8 (e.g. "
                             f"{os.fsencode(files.item(0))!r}): rename them")
        return source, files.take(np.setdiff1d(np.arange(len(files)), undecodable)), True, left_out, fingerprint
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file or folder")
    fingerprint = Fingerprint("list", list_sha256=file_digest(source))
    return (source.parent, *_read_list(source), left_out, fingerprint)


def _entry_path(folder: str, name: str) -> str:
    """The path ``os.scandir(folder)`` gives the entry ``name`` (``./name`` in ``.``)."""
    return os.path.join(folder, name)


def _walk(source: Path, left_out: Dict[str, str], bad_files: str = "skip",
          folders: Optional[List[Tuple[bytes, int, int, int]]] = None) -> Tuple[PathList, List[int]]:
    """The image files below the folder ``source`` in path order (each folder's files by name,
    then its sub-folders by name), hidden files and folders excepted, every file and folder read
    once however it is reached: a symbolic link to a folder is followed unless that folder was
    already read (a link to one of its own parents, a loop, among them), and a link to a file
    (or a hard link) already listed, or a link to nothing, is left out; each of these is named
    with its reason in ``left_out`` (``{escaped path: reason}``). Under ``bad_files="fail"`` a
    link to nothing, a damaged entry, stops the listing in a ``ValueError`` naming it.

    Returns the files as a :class:`PathList` of their names relative to ``source`` (prefix
    ``source/``) and the indices of those whose name is not UTF-8. Each folder is listed once
    (``os.scandir``: a file's kind and inode come with the listing, a ``stat`` is made only for
    links and folders); what is kept per file while listing is its name's bytes and its
    identity, and the files reached twice are found by sorting the identities afterwards.

    ``folders``: a list that receives each folder read (its path's bytes relative to
    ``source``, ``b""`` for ``source``) with its modification and change times in ns and its
    inode, as its ``stat`` gave them before it was listed
    (:class:`~contrastkit.data.collection_index.Fingerprint`)."""
    from contrastkit.data.files import IMAGE_EXTENSIONS

    root = str(source)
    names, ends = bytearray(), array("q", [0])
    devices, inodes = array("Q"), array("Q")  # each listed file's identity: (device, inode)
    undecodable: List[int] = []
    # What was left out while listing, after how many files: the same-file links are found
    # afterwards and put back in between, so left_out keeps the order of one pass.
    events: List[Tuple[int, str, str]] = []
    folders_read: Dict[Tuple[int, int], str] = {}

    def add(relative: str, device: int, inode: int) -> None:
        nonlocal names
        try:
            encoded = relative.encode("utf-8")
        except UnicodeEncodeError:
            encoded = os.fsencode(relative)
            undecodable.append(len(devices))
        names += encoded
        ends.append(len(names))
        devices.append(device)
        inodes.append(inode)

    start = os.stat(source)
    stack: List[Tuple[str, str, Tuple[int, ...]]] = [
        (root, "", (start.st_dev, start.st_ino, start.st_mtime_ns, start.st_ctime_ns))]
    while stack:
        folder, relative, (device, inode, mtime, ctime) = stack.pop()
        key = (device, inode)
        if key in folders_read:
            events.append((len(devices), escape_undecodable(folder),
                           f"the folder {escape_undecodable(folders_read[key])}, already read (reached again "
                           "through a symbolic link): read once"))
            continue
        folders_read[key] = folder
        if folders is not None:
            folders.append((os.fsencode(relative.rstrip(os.sep)), mtime, ctime, inode))
        plain: List[str] = []  # files named like images, not links: their names and inodes
        plain_inodes = array("Q")
        others: List[Tuple[str, str, Any]] = []  # folders and links named like images (few): looked at once each
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    name = entry.name
                    if name.startswith("."):
                        continue
                    try:
                        is_folder = entry.is_dir()  # (follows a symbolic link)
                    except OSError:
                        is_folder = False
                    if is_folder:
                        try:
                            info = entry.stat()
                            others.append((name, "folder", (info.st_dev, info.st_ino, info.st_mtime_ns,
                                                            info.st_ctime_ns)))
                        except OSError as err:
                            others.append((name, "unreadable", err))
                        continue
                    if not name.lower().endswith(IMAGE_EXTENSIONS):
                        continue
                    if entry.is_symlink():
                        try:
                            info = entry.stat()
                            others.append((name, "link", (info.st_dev, info.st_ino)))
                        except OSError:  # a link to nothing (or a loop of links)
                            others.append((name, "dangling", None))
                        continue
                    plain.append(name)
                    plain_inodes.append(entry.inode())  # (free: read with the folder's listing)
        except OSError as err:  # e.g. a sub-folder without read permission
            events.append((len(devices), escape_undecodable(folder),
                           f"folder cannot be listed ({err.strerror or err}): left out"))
            continue
        # The entries by name: the files merged with the rest.
        order = sorted(range(len(plain)), key=plain.__getitem__)
        others.sort(key=lambda other: other[0])
        below = []
        waiting = iter(others)
        other = next(waiting, None)
        for index in order + [None]:
            name = plain[index] if index is not None else None
            while other is not None and (name is None or other[0] < name):
                other_name, kind, info = other
                path = _entry_path(folder, other_name)
                if kind == "folder":
                    below.append((other_name if folder == "." else path, f"{relative}{other_name}{os.sep}", info))
                elif kind == "unreadable":
                    events.append((len(devices), escape_undecodable(path),
                                   f"folder cannot be read ({info.strerror or info})"))
                elif kind == "link":
                    add(relative + other_name, *info)
                else:
                    reason = f"a symbolic link to nothing ({escape_undecodable(os.readlink(path))} does not exist)"
                    if bad_files == "fail":
                        raise ValueError(f"{escape_undecodable(path)}: {reason}") from None
                    events.append((len(devices), escape_undecodable(path), reason))
                other = next(waiting, None)
            if name is not None:
                add(relative + name, key[0], plain_inodes[index])
        stack.extend(reversed(below))  # sub-folders by name, each after the one before it and all below it
    files = PathList._from(names, ends, "" if root == "." else os.path.join(root, ""))
    del names
    kept, repeats = _first_of_each(np.frombuffer(devices, dtype=np.uint64), np.frombuffer(inodes, dtype=np.uint64))

    def first_path(index: int) -> str:  # a file's path as its folder's listing gives it
        relative = files.item(index)
        return relative if root == "." and os.sep in relative else _entry_path(root, relative)

    repeated = iter(repeats)
    repeat = next(repeated, None)
    for count, path, reason in events + [(len(devices) + 1, "", "")]:
        while repeat is not None and repeat[0] < count:
            again, first = repeat
            left_out[escape_undecodable(first_path(again))] = \
                f"the same file as {escape_undecodable(first_path(first))} (a link to it): read once"
            repeat = next(repeated, None)
        if path:
            left_out[path] = reason
    if len(kept) == len(files):
        return files, undecodable
    places = np.searchsorted(kept, undecodable)
    undecodable = [int(i) for i, at in zip(places, undecodable) if i < len(kept) and kept[i] == at]
    return files.take(kept), undecodable


def _first_of_each(devices: np.ndarray, inodes: np.ndarray) -> Tuple[np.ndarray, List[Tuple[int, int]]]:
    """Of files by position with the identities ``(devices[i], inodes[i])``: the positions of
    the first file of each identity (ascending), and ``(position, position of its first)`` of
    every other, by position."""
    count = len(devices)
    order = np.lexsort((np.arange(count), inodes, devices))
    first = np.ones(count, dtype=bool)
    first[1:] = (devices[order][1:] != devices[order][:-1]) | (inodes[order][1:] != inodes[order][:-1])
    if first.all():
        return np.arange(count), []
    group_start = np.maximum.accumulate(np.where(first, np.arange(count), 0))
    again = order[~first]
    firsts = order[group_start][~first]
    by_position = np.argsort(again)
    return np.sort(order[first]), list(zip(again[by_position].tolist(), firsts[by_position].tolist()))


def _list_entries(source: Path) -> Iterator[Tuple[int, str]]:
    """``(line, entry)`` of each path a ``.txt`` / ``.csv`` list names: a line's text, or a CSV
    row's first field, stripped; blank lines, ``#`` comments and a first line ``path`` or
    ``image`` (a header) skipped. A ``ValueError`` naming the line that is not UTF-8 or not a
    CSV row."""
    number = 0
    try:
        with open_input(source) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
            rows = csv.reader(handle) if source.suffix.lower() == ".csv" else ([line] for line in handle)
            for number, row in enumerate(rows, 1):
                entry = (row[0] if row else "").strip()
                if not entry or entry.startswith("#") or (number == 1 and entry.lower() in ("path", "image")):
                    continue
                yield number, entry
    except UnicodeDecodeError:
        raise ValueError(f"{source}: line {number + 1} is not UTF-8 text (save the list as UTF-8)") from None
    except csv.Error as err:  # e.g. a quoted field running past the csv module's field size limit
        raise ValueError(f"{source}: line {number + 1} is not a CSV row ({err})") from None


def _read_list(source: Path) -> Tuple[PathList, bool]:
    """The image files a ``.txt`` / ``.csv`` list names (in line order), each a regular file
    named once; the list itself a regular file within the input ceiling. What is kept per line
    while reading is the path's bytes and the file's identity; a file named twice (however
    spelled) is found by sorting the identities afterwards. Also whether the files are held as
    their names relative to the list's folder (the prefix ``folder/``: every entry a plain
    relative path, the common case) rather than as whole paths."""
    root = source.parent
    prefix = "" if str(root) == "." else os.path.join(str(root), "")
    relative = os.sep == "/"  # (every entry so far a plain relative path: held after the prefix)
    data, ends = bytearray(), array("q", [0])
    devices, inodes, lines = array("Q"), array("Q"), array("q")
    for number, entry in _list_entries(source):
        if relative and not entry.startswith("/") and not _ODD_RELATIVE_PART.search(f"/{entry}/"):
            path, held = prefix + entry, entry
        else:
            path = held = list_entry_path(entry, root)
            if relative:  # whole paths from here on, and those before given the prefix
                relative = False
                data, ends = _prefixed(PathList._from(data, ends, ""), prefix)
        try:
            info = os.stat(path)
        except (OSError, ValueError):  # missing, a broken link, a name with a NUL byte, too long
            raise ValueError(f"{source}: line {number}: no such image file {_shown(entry)}") from None
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{source}: line {number}: {_shown(entry)} is {file_kind(info.st_mode)}, not a "
                             "regular image file")
        devices.append(info.st_dev)
        inodes.append(info.st_ino)
        lines.append(number)
        data += os.fsencode(held)
        ends.append(len(data))
    kept, repeats = _first_of_each(np.frombuffer(devices, dtype=np.uint64), np.frombuffer(inodes, dtype=np.uint64))
    if repeats:
        again, first = (lines[i] for i in repeats[0])
        entries = {}
        for number, entry in _list_entries(source):
            if number in (first, again):
                entries[number] = entry
                if len(entries) == 2:
                    break
        named = f"both name {_shown(entries[again])}" if entries[first] == entries[again] else \
            f"name the same file ({_shown(entries[first])} and {_shown(entries[again])})"
        more = f" (and {len(repeats) - 1} more repeated entries)" if len(repeats) > 1 else ""
        raise ValueError(f"{source}: lines {first} and {again} {named}{more}; a list names each image once (a repeated "
                         "one would be trained on more often than the others)")
    if not len(lines):
        raise ValueError(f"{source}: lists no image files")
    return PathList._from(data, ends, prefix if relative else ""), relative


def _prefixed(files: PathList, prefix: str) -> Tuple[bytearray, "array[int]"]:
    """The buffer and the ends of ``files`` each preceded by ``prefix``."""
    data, ends, before = bytearray(), array("q", [0]), os.fsencode(prefix)
    for item in files.items_bytes():
        data += before + item
        ends.append(len(data))
    return data, ends


#: A part of a path that ``Path`` drops or keeps apart: empty (``a//b``), ``.`` or, for a
#: relative name, ``..`` (the path given a leading and a trailing separator).
_ODD_PART = re.compile(r"/\.?/")
_ODD_RELATIVE_PART = re.compile(r"/\.{0,2}/")


def list_entry_path(entry: str, root: Path) -> str:
    """The path an entry of a list file (or a CSV's image field) names: ``str(Path(entry))``
    for an absolute entry, else ``str(root / entry)``, ``root`` the list's folder. The string is
    joined directly when ``Path`` would leave it as it is (no empty or ``.`` part, no ``//``
    root), which a million lines cost a million ``Path`` objects less."""
    absolute = os.path.isabs(entry)
    if os.sep == "/" and not _ODD_PART.search(entry + "/" if absolute else f"/{entry}/"):
        if absolute:
            return entry
        folder = str(root)
        return entry if folder == "." else os.path.join(folder, entry)
    return str(Path(entry) if absolute else root / entry)


_SHOWN_ENTRY = 200  # characters of a list entry an error shows


def _shown(entry: str) -> str:
    """An entry of a list file as an error names it: quoted, cut short when long."""
    if len(entry) <= _SHOWN_ENTRY:
        return repr(entry)
    return f"{entry[:_SHOWN_ENTRY]!r}... ({len(entry)} characters)"


def hash_fraction(relative: str) -> float:
    """Where the name ``relative`` (a path relative to its collection, or a sample's key) falls
    in ``[0, 1)``: the first 8 bytes of the SHA-1 of its UTF-8 (``/`` separators). What puts a
    file, or a sample of an iterable source (:func:`~contrastkit.data.split_of_key`), in val or test."""
    # os.fsencode: a name's UTF-8 bytes (those of every name that reaches here are valid UTF-8)
    return _hash_fraction(os.fsencode(relative.replace(os.sep, "/")))


def _hash_fraction(name: bytes) -> float:
    """:func:`hash_fraction` of a name's UTF-8 bytes (``/`` separators)."""
    return int.from_bytes(hashlib.sha1(name).digest()[:8], "big") / 2.0 ** 64


#: The splits of a collection, in the order the hash range gives them (test lowest).
SPLITS = ("train", "val", "test")


def split_by_hash(names: Sequence[str], val_fraction: float = 0.1, test_fraction: float = 0.2) -> List[str]:
    """The split (``"train"``, ``"val"`` or ``"test"``) of each of ``names`` (paths relative
    to the collection, or sample keys), a function of the names alone.

    Each name falls in test when its :func:`hash_fraction` is below ``test_fraction``, in val
    when it is below ``test_fraction + val_fraction``, else in train: adding names never moves
    a name between splits. A small collection can leave a split without a name that way (3
    names all fall in train 34 % of the time at the default fractions); then, while a split is
    empty, it takes from the largest split (ties: train, val, test) the name whose position is
    nearest its own share of the hash range (ties: the lower name). So from 3 names on every
    split has one, the names so lent being the only ones that may move as names are added,
    back to where their hash puts them once their split has names of its own. Fewer than 3
    names cannot fill three splits: a ``ValueError``."""
    if len(names) < len(SPLITS):
        raise ValueError(f"{len(names)} names cannot fill the {len(SPLITS)} splits train, val and test")
    positions = np.fromiter((hash_fraction(name) for name in names), dtype=np.float64, count=len(names))
    return [SPLITS[code] for code in _split_codes(positions, names.__getitem__, val_fraction, test_fraction)]


def _split_codes(positions: np.ndarray, name: Callable[[int], str], val_fraction: float,
                 test_fraction: float) -> np.ndarray:
    """:func:`split_by_hash` as the index in :data:`SPLITS` of each name (int8, ``(n,)``), from
    the names' hash positions ``(n,)`` float64; ``name(i)``, name ``i``, is asked only to break
    a tie between names lent to an empty split."""
    bounds = {"test": (0.0, test_fraction), "val": (test_fraction, test_fraction + val_fraction),
              "train": (test_fraction + val_fraction, 1.0)}
    test, val, train = (SPLITS.index(part) for part in ("test", "val", "train"))
    codes = np.where(positions < bounds["test"][1], test,
                     np.where(positions < bounds["val"][1], val, train)).astype(np.int8)
    counts = np.bincount(codes, minlength=len(SPLITS))
    for part, label in enumerate(SPLITS):
        if counts[part]:
            continue
        donor = max(range(len(SPLITS)), key=lambda other: (counts[other], -other))
        low, high = bounds[label]
        members = np.flatnonzero(codes == donor)
        distance = np.maximum(np.maximum(low - positions[members], positions[members] - high), 0.0)
        nearest = members[distance == distance.min()]
        lent = min(nearest.tolist(), key=name)
        codes[lent] = part
        counts[donor] -= 1
        counts[part] += 1
    return codes


def _relative(path: str, root: str) -> str:
    """``os.path.relpath(path, root)``, without its two ``abspath`` calls for a path that is
    ``root`` joined with plain names (what a collection holds, a million of them)."""
    if root == ".":
        rest = "" if path.startswith(os.sep) else path
    else:
        prefix = os.path.join(root, "")
        rest = path[len(prefix):] if path.startswith(prefix) else ""
    if rest and (not _ODD_RELATIVE_PART.search(f"/{rest}/") if os.sep == "/" else
                 all(part not in ("", ".", "..") for part in rest.split(os.sep))):
        return rest
    return os.path.relpath(path, root)


def _relative_names(files: PathList, root: str, relative: bool) -> Iterator[bytes]:
    """The bytes of each file's name relative to the collection (``/`` separators), in order;
    ``relative``: the files are held as those names (after the prefix ``root/``)."""
    if relative:
        names = files.items_bytes()
    else:
        names = (os.fsencode(_relative(os.fsdecode(path), root)) for path in files.items_bytes())
    return names if os.sep == "/" else (name.replace(os.fsencode(os.sep), b"/") for name in names)


def _path_order(files: PathList, relative: bool) -> np.ndarray:
    """The order ``sorted`` puts the files' ``Path`` objects in (by their parts), as indices;
    ``relative``: the files are held as their names after one prefix."""
    separator = os.fsencode(os.sep)
    if not relative and len(files):  # whole paths: are they all of one kind?
        starts = files.offsets[:-1]
        absolute = files.data[starts] == separator[0]
        doubled = absolute & (np.diff(files.offsets) > 1) & \
            (files.data[np.minimum(starts + 1, len(files.data) - 1)] == separator[0])
        if (absolute.any() and not absolute.all()) or doubled.any():
            # relative and absolute paths mixed, or a root '//': Path's own order, as before
            return np.argsort(np.array([Path(files[i]) for i in range(len(files))], dtype=object), kind="stable")

    # Paths of one kind compare part by part: as their bytes with each separator made the lowest byte.
    def keys() -> Iterator[bytes]:
        return (name.replace(separator, b"\0") for name in files.items_bytes())

    previous = b""
    for key in keys():  # a flat folder, or a tree whose folders hold files or folders: already in order
        if key < previous:
            return np.argsort(np.array(list(keys()), dtype=object), kind="stable")
        previous = key
    return np.arange(len(files))


class ImageCollection(torch.utils.data.Dataset):
    """One split of an unlabeled collection: item ``i`` is ``(image, NO_LABEL)`` (-1), ``image``
    ``(C, size, size)`` uint8 (the rules of :mod:`contrastkit.data.collection`); ``labels`` is
    ``None``. Only the paths are held."""

    labels = None

    def __init__(self, files: Sequence[Union[str, os.PathLike]], root: Union[str, os.PathLike], *, color: str,
                 size: int, bad_files: str = "skip") -> None:
        if color not in ("L", "RGB"):
            raise ValueError(f"color must be 'L' or 'RGB', got {color!r}")
        if bad_files not in BAD_FILES:
            raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
        #: The paths, held compactly (shared by forked workers).
        self.files = files if isinstance(files, PathList) else PathList.of(str(f) for f in files)
        self.root = str(root)
        self.color, self.size, self.bad_files = color, int(size), bad_files
        #: The damaged files met so far in this process (path -> reason).
        self.skipped: Dict[str, str] = {}

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        return (1 if self.color == "L" else 3, self.size, self.size)

    def __len__(self) -> int:
        return len(self.files)

    def path(self, index: int) -> str:
        """The file of item ``index``."""
        return self.files[index]

    def relative_path(self, index: int) -> str:
        """The file of item ``index`` relative to the collection (its name in exports)."""
        return _relative(self.path(index), self.root)

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

        preprocessing = ImagePreprocessing(self.color, (self.size, self.size), SHORTER_SIDE_THEN_CENTRE_CROP)
        return read_image_file(preprocessing, self.path(index)), NO_LABEL

    def record_skipped(self, index: int, reason: str) -> None:
        """Note that item ``index`` was dropped (``bad_files="skip"``)."""
        self.skipped[self.path(index)] = reason


def fit_image(path: Path, color: str, size: int) -> np.ndarray:
    """The image at ``path`` as ``(C, size, size)`` uint8 by the collection's rules; a
    ``ValueError`` naming the file when it cannot be read (or is over the pixel ceiling)."""
    from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

    return ImagePreprocessing(color, (size, size), SHORTER_SIDE_THEN_CENTRE_CROP).read(path)


class CollectionDataset:
    """An unlabeled collection's three splits (:class:`ImageCollection`), with the names a run
    reads: ``name``, ``class_names`` (none), ``num_classes`` (0), ``image_shape``; streamed."""

    streamed = True
    source = "collection"
    has_realisations = False
    #: Its listing as it is to be recorded (a :class:`~contrastkit.data.collection_index.RecordedIndex`),
    #: how it was found and a line for the user when the collection changed (:func:`open_collection`).
    index: Optional[RecordedIndex] = None
    index_state = "listed"
    index_note: Optional[str] = None

    def __init__(self, name: str, train: ImageCollection, val: ImageCollection, test: ImageCollection,
                 left_out: Optional[Dict[str, str]] = None) -> None:
        self.name = name
        #: The files the listing left out (``{escaped path: reason}``: a name that is not UTF-8, a
        #: link to nothing, a second link to a file or folder already listed), in no split.
        self.left_out: Dict[str, str] = dict(left_out or {})
        self.class_names: List[str] = []
        self.train, self.val, self.test = train, val, test
        self.image_shape = train.image_shape
        for split_name, split in self.splits():
            if len(split) == 0:
                raise ValueError(f"{name}: the {split_name} split is empty ({len(train) + len(val) + len(test)} "
                                 "images in all: too few for the val and test fractions)")

    @property
    def num_classes(self) -> int:
        return 0

    def splits(self) -> List[Tuple[str, ImageCollection]]:
        return [("train", self.train), ("val", self.val), ("test", self.test)]

    def read_image(self, path: Union[str, os.PathLike]) -> Tensor:
        """Any image file read by the collection's rules (its colour, resize and centre crop), as
        its images are: ``(C, size, size)`` uint8; a ``ValueError`` naming the file when it
        cannot be read (e.g. a query compared with the collection's images)."""
        channels, size, _ = self.image_shape
        return torch.from_numpy(fit_image(Path(path), "L" if channels == 1 else "RGB", size))

    def summary(self) -> str:
        c, h, w = self.image_shape
        sizes = ", ".join(f"{name} {len(split)}" for name, split in self.splits())
        return f"{self.name}: {c}x{h}x{w} images (streamed, unlabeled); {sizes}"


def check_unlabeled_options(val_fraction: float, test_fraction: float, color: Optional[str],
                            bad_files: str) -> Tuple[float, float]:
    """The options of image files split by the SHA-1 of their names (a collection, tar shards)
    checked, each refused naming it: the val and test fractions (returned), the colour
    (``None``, ``"L"``, ``"RGB"``) and ``bad_files``."""
    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    if color is not None and color not in ("L", "RGB"):
        raise ValueError(f"color must be None, 'L' or 'RGB', got {color!r}")
    if bad_files not in BAD_FILES:
        raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
    return val_fraction, test_fraction


def open_collection(source: Union[str, os.PathLike], *, size: Optional[int] = None, val_fraction: float = 0.1,
                    test_fraction: float = 0.2, color: Optional[str] = None, bad_files: str = "skip",
                    index: Optional[Union[str, os.PathLike]] = None,
                    collection_changed: str = "stop") -> CollectionDataset:
    """The unlabeled collection at ``source`` (a folder, or a ``.txt`` / ``.csv`` list of image
    paths) by the rules of :mod:`contrastkit.data.collection`. Only the file index is read.

    ``index``: a file where the collection's listing was recorded (a run's
    ``collection-index.npz``, :mod:`contrastkit.data.collection_index`). When it holds this
    collection's listing (the same path, fractions and ``bad_files``) and the collection did not
    change since, the files, splits and colour are read from it instead of listing the
    collection; a collection whose files changed does what ``collection_changed`` says
    (``"stop"``: a :class:`~contrastkit.data.collection_index.CollectionChangedError` naming the
    change, ``"reindex"``: listed again, ``"keep"``: the recorded files, those gone left out).
    The data set's ``index`` is its listing as it is to be recorded, ``index_state`` how it was
    found (``"listed"``; ``"recorded"``, read from ``index``; ``"verified"``, listed again
    because a folder's time moved, and the same files; ``"reindexed"``; ``"kept"``) and
    ``index_note`` a line for the user when the collection changed (else ``None``)."""
    from contrastkit.data.files import GRAY_MODES, open_image

    size = DEFAULT_SIZE if size is None else check_image_size(size, "size")
    val_fraction, test_fraction = check_unlabeled_options(val_fraction, test_fraction, color, bad_files)
    check_collection_changed(collection_changed)
    absolute = os.path.abspath(source)
    recorded = None if index is None or not os.path.isfile(index) else RecordedIndex.read(index)
    unreadable = unreadable_note(index, source) if recorded is None else None
    is_folder = os.path.isdir(source)
    root_now = str(Path(source) if is_folder else Path(source).parent)
    if recorded is not None and not (recorded.describes(absolute, val_fraction, test_fraction, bad_files)
                                     and (recorded.fingerprint.kind == "folder") == is_folder
                                     and (recorded.relative or recorded.root == root_now)):
        recorded = None  # another collection's, this one's with other options, or whole paths named otherwise
    if recorded is not None and recorded.relative:  # the paths after the collection as it is named now
        recorded.root, recorded.prefix = root_now, "" if root_now == "." else os.path.join(root_now, "")
    name = Path(source).stem if Path(source).is_file() else (Path(source).resolve().name or "images")
    if recorded is not None and not _changed_since(recorded, source):
        parts = {part: PathList(data, offsets, recorded.prefix) for part, (data, offsets) in recorded.splits.items()}
        return _dataset(name, parts, recorded, color or recorded.color, size, bad_files, "recorded", None)
    root, files, relative, left_out, fingerprint = _index(source, bad_files)
    state, note = "listed", unreadable
    if recorded is not None:
        prefix = os.fsencode(files.prefix)
        added, gone = compare_names(recorded.names, lambda: (prefix + item for item in files.items_bytes()))
        color = color or recorded.color  # (the run's encoder reads images of this colour)
        if not added and not gone:
            state = "verified"
        elif collection_changed == "stop":
            raise CollectionChangedError(change_line(str(source), os.fspath(index), added, gone, len(recorded)))
        elif collection_changed == "reindex":
            state = "reindexed"
            note = (f"{escape_line(str(source))} changed since it was indexed ({change_counts(added, gone)}): listed again, "
                    f"{len(files):,} files")
        else:
            kept = _without(recorded, set(gone))
            for path in gone:
                kept.left_out[escape_undecodable(os.fsdecode(path))] = (
                    f"gone since the collection was indexed in {os.fspath(index)}: left out (--collection-changed keep)")
            kept.fingerprint = fingerprint  # (the files added since are left out by choice, not as a change)
            note = (f"{escape_line(str(source))} changed since it was indexed ({change_counts(added, gone)}): reading the "
                    f"{len(kept):,} recorded files still there" + (", not those added" if added else ""))
            parts = {part: PathList(data, offsets, kept.prefix) for part, (data, offsets) in kept.splits.items()}
            return _dataset(name, parts, kept, color, size, bad_files, "kept", note)
    if color is None:
        modes = []
        for position in range(min(_COLOR_SAMPLE, len(files))):
            try:
                with open_image(Path(files[position])) as image:
                    modes.append(image.mode)
            except (ValueError, OSError):
                continue  # a damaged (or already removed) file decides nothing
        color = "L" if modes and all(mode in GRAY_MODES for mode in modes) else "RGB"
    if len(files) < len(SPLITS):
        raise ValueError(f"{source}: {len(files)} image{'s' if len(files) != 1 else ''} in all: a collection needs "
                         "at least 3, one each for the train, val and test splits (add images)")
    # The split of each file from its relative name alone; each split's files in path order.
    names = _relative_names(files, str(root), relative)
    positions = np.fromiter((_hash_fraction(name) for name in names), dtype=np.float64, count=len(files))
    codes = _split_codes(positions, lambda position: _relative(files[position], str(root)), val_fraction,
                         test_fraction)
    del positions
    order = _path_order(files, relative)
    codes = codes[order]
    parts = {part: files.take(order[codes == code]) for code, part in enumerate(SPLITS)}
    listing = RecordedIndex(absolute, str(root), relative, files.prefix, {part: (paths.data, paths.offsets) for part, paths in parts.items()},
                            left_out, color, val_fraction, test_fraction, bad_files, fingerprint)
    return _dataset(name, parts, listing, color, size, bad_files, state, note)


def _changed_since(recorded: RecordedIndex, source: Union[str, os.PathLike]) -> bool:
    """Whether the collection may have changed since ``recorded`` was listed (its fingerprint:
    a folder's time, a list's SHA-256); a collection that may have is listed again and compared."""
    if recorded.fingerprint.kind == "folder":
        return bool(recorded.fingerprint.changed_folders(os.fspath(source)))
    try:
        return file_digest(source) != recorded.fingerprint.list_sha256
    except (OSError, ValueError):
        return True


def _without(recorded: RecordedIndex, gone: set) -> RecordedIndex:
    """``recorded`` with the paths ``gone`` (bytes, the prefix included) taken out of its splits."""
    prefix = os.fsencode(recorded.prefix)
    splits = {}
    for part, (data, offsets) in recorded.splits.items():
        paths = PathList(data, offsets, recorded.prefix)
        keep = np.fromiter((prefix + item not in gone for item in paths.items_bytes()), dtype=bool, count=len(paths))
        kept = paths.take(np.flatnonzero(keep))
        splits[part] = (kept.data, kept.offsets)
    return RecordedIndex(recorded.source, recorded.root, recorded.relative, recorded.prefix, splits, dict(recorded.left_out), recorded.color,
                         recorded.val_fraction, recorded.test_fraction, recorded.bad_files, recorded.fingerprint)


def _dataset(name: str, parts: Dict[str, PathList], listing: RecordedIndex, color: str, size: int, bad_files: str,
             state: str, note: Optional[str]) -> CollectionDataset:
    """The data set of the splits ``parts`` (its ``index``, ``index_state``, ``index_note``: see
    :func:`open_collection`)."""
    splits = {part: ImageCollection(parts[part], listing.root, color=color, size=size, bad_files=bad_files)
              for part in SPLITS}
    splits["train"].skipped.update(listing.left_out)  # named with the damaged files the run meets
    dataset = CollectionDataset(name, splits["train"], splits["val"], splits["test"], listing.left_out)
    listing.color = color
    dataset.index, dataset.index_state, dataset.index_note = listing, state, note
    return dataset


def _base_split(split: Any) -> Any:
    while hasattr(split, "dataset") and not hasattr(split, "record_skipped"):
        split = split.dataset
    return split


def _base_index(split: Any, index: int) -> int:
    while hasattr(split, "dataset") and hasattr(split, "indices") and not hasattr(split, "record_skipped"):
        index = int(split.indices[index])
        split = split.dataset
    return index


def skips_bad_files(split: Any) -> bool:
    """Whether a damaged item of ``split`` is dropped from its batch rather than an error."""
    return getattr(_base_split(split), "bad_files", "fail") == "skip"


def skip_item(split: Any, index: int, error: BadItemError) -> None:
    """Record item ``index`` of ``split`` as skipped (its file and why)."""
    _base_split(split).record_skipped(_base_index(split, index), str(error))


def skipped_reason(split: Any, index: int) -> Optional[str]:
    """Why item ``index`` of ``split`` (a collection's split, or a ``Subset`` of one) was
    skipped as damaged in this process (the file named), or ``None`` if it was not."""
    base = _base_split(split)
    skipped = getattr(base, "skipped", None)
    if not skipped:
        return None
    return skipped.get(base.path(_base_index(split, index)))


def skipped_reasons(dataset: Any) -> Dict[str, str]:
    """``{path: reason}`` of every damaged file met in ``dataset``'s splits in this process."""
    found: Dict[str, str] = {}
    for _, split in dataset.splits():
        found.update(getattr(_base_split(split), "skipped", {}) or {})
    return found


def add_skipped(dataset: Any, found: Dict[str, str]) -> None:
    """Add to ``dataset``'s record the damaged files another process met (``{path: reason}``,
    e.g. :func:`skipped_reasons` of the other ranks under torchrun, which each read their own
    share of the training split); a file already recorded keeps its reason."""
    if not found:
        return
    base = _base_split(dataset.train)
    if not hasattr(base, "skipped"):
        raise ValueError(f"{getattr(dataset, 'name', 'the data set')} is not an unlabeled collection: it skips no "
                         "files")
    known = skipped_reasons(dataset)
    base.skipped.update((path, reason) for path, reason in found.items() if path not in known)


def skipped_files(dataset: Any) -> List[str]:
    """``"path<TAB>reason"`` of every damaged file a run met in ``dataset``'s splits, sorted, one
    line each: a byte of a path that is not UTF-8, and a control character (a newline or a tab
    in a file name), written ``\\xNN``."""
    return [f"{escape_line(path)}\t{escape_line(reason)}" for path, reason in sorted(skipped_reasons(dataset).items())]
