"""Write any image data contrastkit reads from files as tar shards in WebDataset's layout, as
img2dataset writes them (``contrastkit shard SOURCE OUT``, :func:`write_shards`).

**Sources**: a class-folder tree (labelled; with ``train/`` and ``test/`` folders each part
becomes its own shard set, ``OUT/train``, ``OUT/test``, and ``OUT/val`` if there is one), an
unlabeled collection (a folder of images without class structure, or a ``.txt`` / ``.csv`` list
of image paths) and an image-text CSV (``image,text[,label][,split]``: the captions as
``.txt`` members; with a ``split`` column each split its own shard set).

**Layout** of a shard set (img2dataset's, https://github.com/rom1504/img2dataset): shards
``00000.tar``, ``00001.tar``, ... of ``shard_size`` samples each, in the source's order; sample
``i`` of shard ``s`` has the key ``{s:05d}{i:0Wd}`` (``W`` the digits of ``shard_size - 1``) and
the members ``KEY.<ext>`` (the image: the file's bytes unchanged, its extension lower-cased, or
resized), ``KEY.cls`` (its class id, labelled data), ``KEY.txt`` (its caption, image-text data)
and ``KEY.json`` (``key``, ``source``: the file's path relative to the source, ``width`` /
``height`` as stored, ``original_width`` / ``original_height``, and ``class`` / ``caption``
where they apply). Beside them ``classes.txt`` (labelled: line ``i`` names class id ``i``) and
``index.json`` (every shard with its samples, and the files left out with the reason). In
``OUT``: ``shards.json`` (the settings) and contrastkit's manifest.

**Resize** (``resize=S``): an image whose shorter side is above ``S`` is stored with its
shorter side ``S`` and its aspect ratio kept (each side ``round(side * S / shorter)``), what the
input contract's shorter-side rule does before its centre crop
(:mod:`contrastkit.data.preprocess`), so a run at size ``S`` or below reads the same pixels
without decoding the camera-size original; re-encoded as JPEG (quality 95) when the file was a
JPEG, else as PNG. An image already small enough is stored as it is.

**Resume**: each shard is written whole to a temporary file and renamed, and recorded in the
manifest with its SHA-256; writing into ``OUT`` again with the same settings keeps the shards
the manifest vouches for and writes the others (after a kill, the same command finishes the
job). Other settings are refused unless ``force``, which deletes only what contrastkit wrote;
``OUT`` holding files contrastkit did not write is refused.

**Damaged files**: an image that cannot be read is left out and named in ``index.json`` and
the result (``bad_files="skip"``, the default) or stops the writing naming it (``"fail"``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from contrastkit import layout
from contrastkit._io import atomic_file, one_line
from contrastkit.data.base import check_positive_int
from contrastkit.manifest import file_sha256

__all__ = ["write_shards", "ShardSetResult", "ShardsWritten", "SHARD_FORMAT_VERSION"]

#: The layout's version, stored in ``shards.json``.
SHARD_FORMAT_VERSION = 1
_JPEG_QUALITY = 95
_JPEG_SUFFIXES = (".jpg", ".jpeg")


@dataclass(frozen=True)
class _Item:
    """One sample of the source: its image file, its name relative to the source, its class id
    (``None``: unlabeled) and caption (``None``: none)."""

    path: str
    name: str
    label: Optional[int] = None
    text: Optional[str] = None


@dataclass
class ShardSetResult:
    """One shard set written: its folder, shards, samples and the files left out (name -> reason)."""

    folder: str
    shards: List[str]
    samples: int
    left_out: Dict[str, str] = field(default_factory=dict)


@dataclass
class ShardsWritten:
    """What :func:`write_shards` wrote: the source's kind, one :class:`ShardSetResult` per part
    (``"all"`` when the source has no parts), and how many shards were kept from an earlier,
    interrupted writing."""

    kind: str
    parts: Dict[str, ShardSetResult]
    kept: int = 0


# ------------------------------------------------------------------------------ the source


def _source_items(source: str) -> Tuple[str, Dict[str, List[_Item]], List[str]]:
    """``(kind, {part: items}, class_names)`` of a source contrastkit reads from image files."""
    from contrastkit.data.sources import find_data_source

    path = Path(source).expanduser()
    try:
        kind = find_data_source(source, pairs=True).name
    except (ValueError, OSError):
        kind = None
    if kind != "pair-csv":
        kind = find_data_source(source).name  # what is not data is named here
    if kind == "imagefolder":
        return kind, *_tree_items(path)
    if kind == "collection":
        return kind, *_collection_items(path)
    if kind == "pair-csv":
        return kind, *_pair_items(path)
    raise ValueError(f"{source} is read as {kind!r} data; contrastkit shard writes shards of image files: a "
                     "class-folder tree, an unlabeled collection (a folder or a .txt / .csv list of images) or an "
                     "image-text CSV")


def _tree_items(root: Path) -> Tuple[Dict[str, List[_Item]], List[str]]:
    from contrastkit.data.files import scan_image_tree

    parts, names = scan_image_tree(root)
    return {part: [_Item(str(f), _relative(f, root), int(label)) for f, label in zip(files, labels)]
            for part, (files, labels) in parts.items()}, list(names)


def _collection_items(source: Path) -> Tuple[Dict[str, List[_Item]], List[str]]:
    from contrastkit.data.collection import collection_files

    root, files = collection_files(source)
    return {"all": [_Item(str(f), _relative(f, root)) for f in files]}, []


def _pair_items(path: Path) -> Tuple[Dict[str, List[_Item]], List[str]]:
    from contrastkit.data.paired_csv import read_pair_rows

    rows = read_pair_rows(path)
    labelled = rows[0][2] is not None
    names = sorted({row[2] for row in rows}) if labelled else []
    ids = {name: number for number, name in enumerate(names)}
    parts: Dict[str, List[_Item]] = {}
    for image, text, label, split, _where in rows:
        parts.setdefault(split or "all", []).append(
            _Item(str(image), _relative(Path(image), path.parent), ids[label] if labelled else None, text))
    return parts, names


def _listing_digest(parts: Dict[str, List[_Item]]) -> str:
    """The SHA-256 of what the source lists (each sample's part, name, label and caption): a
    source that changed since an interrupted writing is not resumed into the same shards."""
    digest = hashlib.sha256()
    for part, items in sorted(parts.items()):
        for item in items:
            digest.update(json.dumps([part, item.name, item.label, item.text]).encode("utf-8"))
    return digest.hexdigest()


def _relative(path: Path, root: Path) -> str:
    relative = os.path.relpath(path, root)
    return (relative if not relative.startswith("..") else str(path)).replace(os.sep, "/")


# ------------------------------------------------------------------------------ one shard


def _key_width(shard_size: int) -> int:
    return len(str(shard_size - 1))


class _Unreadable(Exception):
    """An image that cannot be read (the message names it)."""


def _image_member(item: _Item, resize: Optional[int]) -> Tuple[bytes, str, Dict[str, int]]:
    """The image's stored bytes, extension and sizes; :class:`_Unreadable` naming it if it
    cannot be read."""
    from contrastkit.data.files import decode_image, flatten_colour, open_image, pil_resample

    path = Path(item.path)
    suffix = path.suffix.lower()
    try:
        with open_image(path) as opened:
            width, height = opened.size
            shorter = min(width, height)
            if resize is None or shorter <= resize:
                decode_image(opened, path)  # read whole once: a damaged file is left out here, not in training
                with open(path, "rb") as handle:
                    data = handle.read()
                return data, suffix, {"width": width, "height": height, "original_width": width,
                                      "original_height": height}
            new = (max(resize, round(width * resize / shorter)), max(resize, round(height * resize / shorter)))
            opened.draft(opened.mode, new)  # JPEG: decode at the smallest DCT scale still >= the new size
            image = decode_image(opened, path)
    except (ValueError, OSError) as err:
        raise _Unreadable(one_line(err)) from None
    keep_alpha = image.mode in ("RGBA", "LA") or "transparency" in image.info
    jpeg = suffix in _JPEG_SUFFIXES and not keep_alpha
    if jpeg:
        image = flatten_colour(image, "L" if image.mode in ("L", "1", "I", "I;16", "F") else "RGB")
    resized = image.resize(new, pil_resample())
    buffer = io.BytesIO()
    if jpeg:
        resized.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    else:
        resized.save(buffer, format="PNG")
    return buffer.getvalue(), (suffix if jpeg else ".png"), {"width": new[0], "height": new[1],
                                                              "original_width": width, "original_height": height}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


@dataclass(frozen=True)
class _ShardJob:
    path: str
    number: int
    items: Tuple[_Item, ...]
    key_width: int
    resize: Optional[int]
    class_names: Tuple[str, ...]
    bad_files: str


def _write_shard(job: _ShardJob) -> Tuple[str, str, List[str], Dict[str, str]]:
    """Write one shard (through a temporary file); ``(path, sha256, keys, left_out)``."""
    keys: List[str] = []
    left_out: Dict[str, str] = {}
    with atomic_file(job.path, "wb") as handle:
        with tarfile.open(fileobj=handle, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for offset, item in enumerate(job.items):
                key = f"{job.number:05d}{offset:0{job.key_width}d}"
                try:
                    data, suffix, sizes = _image_member(item, job.resize)
                except _Unreadable as err:
                    if job.bad_files == "fail":
                        raise ValueError(f"{err} (bad_files=fail; skip leaves it out and names it)") from None
                    left_out[item.name] = str(err)
                    continue
                record: Dict[str, Any] = {"key": key, "source": item.name, **sizes}
                _add(tar, key + suffix, data)
                if item.label is not None:
                    _add(tar, key + ".cls", str(item.label).encode("ascii"))
                    record["class"] = job.class_names[item.label]
                if item.text is not None:
                    _add(tar, key + ".txt", item.text.encode("utf-8"))
                    record["caption"] = item.text
                _add(tar, key + ".json", json.dumps(record, sort_keys=True).encode("utf-8"))
                keys.append(key)
    return job.path, file_sha256(job.path), keys, left_out


# ------------------------------------------------------------------------------ the whole set


def write_shards(source: Union[str, os.PathLike], out: Union[str, os.PathLike], *, shard_size: int = 1000,
                 resize: Optional[int] = None, workers: int = 0, force: bool = False, bad_files: str = "skip",
                 progress: Optional[Callable[[int, int], None]] = None) -> ShardsWritten:
    """Write ``source`` as tar shards in ``out`` (the module's layout and rules).

    Args:
        source: a class-folder tree, an unlabeled collection (folder or list file) or an
            image-text CSV.
        out: the folder written (created); one shard set, or one per part of the source.
        shard_size: samples per shard (img2dataset's ``number_sample_per_shard``; 1000 by default).
        resize: ``None`` (the files' bytes unchanged) or ``S``: the shorter side at most ``S``.
        workers: processes writing shards in parallel (0: this one).
        force: start over in an ``out`` that holds shards written with other settings (deletes
            only the files contrastkit wrote there).
        bad_files: ``"skip"`` (an unreadable image is left out and named) or ``"fail"``.
        progress: called ``progress(done, total)`` with shards written so far.
    """
    from contrastkit.run_writer import prepare_folder

    shard_size = check_positive_int(shard_size, "shard_size", 1)
    if resize is not None:
        resize = check_positive_int(resize, "resize", 1)
    workers = check_positive_int(workers, "workers", 0)
    if bad_files not in ("skip", "fail"):
        raise ValueError(f"bad_files must be 'skip' or 'fail', got {bad_files!r}")
    out = os.fspath(Path(out).expanduser())
    kind, parts, class_names = _source_items(os.fspath(source))
    folders = {part: ("" if list(parts) == ["all"] else part) for part in parts}
    plan: List[Tuple[str, _ShardJob]] = []
    for part, items in parts.items():
        if not items:
            continue
        for number in range(math.ceil(len(items) / shard_size)):
            name = _join(folders[part], layout.shard_name(number))
            first = number * shard_size
            plan.append((part, _ShardJob(os.path.join(out, *name.split("/")), number,
                                         tuple(items[first:first + shard_size]), _key_width(shard_size), resize,
                                         tuple(class_names), bad_files)))
    names = [_relative(Path(job.path), Path(out)) for _, job in plan]
    settings = {"version": SHARD_FORMAT_VERSION, "source": os.path.abspath(os.fspath(source)), "kind": kind,
                "shard_size": shard_size, "resize": resize, "bad_files": bad_files,
                "samples": {part: len(items) for part, items in parts.items()}, "listing": _listing_digest(parts)}
    settings_path = os.path.join(out, layout.SHARD_SETTINGS)
    resume = os.path.isfile(settings_path) and not force
    owned = [layout.SHARD_SETTINGS] + names + [_join(folder, name) for folder in set(folders.values())
                                                for name in (layout.SHARD_INDEX, layout.SHARD_CLASSES)]
    writer = prepare_folder(out, resume=resume, force=force, owned=owned, settings=settings,
                            settings_file=layout.SHARD_SETTINGS, kind="shards", what="shard set",
                            not_empty="write the shards into a new or empty folder")
    done = set(writer.unchanged(names)) if resume else set()
    todo = [job for (_, job), name in zip(plan, names) if name not in done]
    for folder in set(folders.values()):
        os.makedirs(os.path.join(out, folder), exist_ok=True)
    results: Dict[str, Tuple[List[str], Dict[str, str]]] = {}
    finished = len(plan) - len(todo)
    if progress is not None:
        progress(finished, len(plan))

    def record(outcome: Tuple[str, str, List[str], Dict[str, str]]) -> None:
        nonlocal finished
        path, sha256, keys, left_out = outcome
        name = _relative(Path(path), Path(out))
        writer.record(name, sha256={name: sha256})
        results[name] = (keys, left_out)
        finished += 1
        if progress is not None:
            progress(finished, len(plan))

    writer.mark_writing(*[_relative(Path(job.path), Path(out)) for job in todo])
    if workers and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            for outcome in pool.map(_write_shard, todo):
                record(outcome)
    else:
        for job in todo:
            record(_write_shard(job))
    return _finish(out, writer, kind, plan, names, folders, class_names, results, len(plan) - len(todo))


def _finish(out: str, writer: Any, kind: str, plan: Sequence[Tuple[str, _ShardJob]], names: Sequence[str],
            folders: Dict[str, str], class_names: Sequence[str], results: Dict[str, Tuple[List[str], Dict[str, str]]],
            kept: int) -> ShardsWritten:
    """Write each set's ``index.json`` (and ``classes.txt``); a kept shard's keys are read back
    from the index of the interrupted writing, or from the shard itself."""
    from contrastkit._io import read_json

    written: Dict[str, ShardSetResult] = {}
    for part, folder in folders.items():
        index_name = _join(folder, layout.SHARD_INDEX)
        earlier: Dict[str, Any] = {}
        if os.path.isfile(os.path.join(out, index_name)) and writer.unchanged([index_name]):
            earlier = {entry["name"]: entry for entry in read_json(os.path.join(out, index_name)).get("shards", [])}
        shards, left_out, count = [], {}, 0
        for (job_part, job), name in zip(plan, names):
            if job_part != part:
                continue
            shard = name.rsplit("/", 1)[-1]
            if name in results:
                keys, dropped = results[name]
            elif shard in earlier:
                keys, dropped = earlier[shard]["keys"], earlier[shard].get("left_out", {})
            else:
                keys, dropped = _keys_in(job.path), {}
            shards.append({"name": shard, "samples": len(keys), "keys": keys, "left_out": dropped})
            left_out.update(dropped)
            count += len(keys)
        index = {"version": SHARD_FORMAT_VERSION, "samples": count, "shards": shards}
        writer.write_json(index_name, index)
        if class_names:
            with writer.writing(_join(folder, layout.SHARD_CLASSES)):
                with atomic_file(os.path.join(out, folder, layout.SHARD_CLASSES), "w", encoding="utf-8") as handle:
                    handle.writelines(f"{name}\n" for name in class_names)
        written[part] = ShardSetResult(os.path.join(out, folder) if folder else out,
                                       [os.path.join(out, *n.split("/")) for (p, _), n in zip(plan, names) if p == part],
                                       count, left_out)
    return ShardsWritten(kind, written, kept)


def _keys_in(path: str) -> List[str]:
    with tarfile.open(path, "r:") as tar:
        return [member.name[:-len(".json")] for member in tar if member.name.endswith(".json")]


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name
