"""The files of an export (``contrastkit embed``, ``contrastkit export``) in a user's folder:
what may be replaced, and the marker that records what was written.

An export writes its files by role (``files``: role -> path, one of them the ``marker``, a JSON
file next to them) into a folder of the user's. Every file is listed in the folder's manifest
(:mod:`contrastkit.manifest`): an existing file is replaced only with ``force``, and only when
the manifest lists it with the size and SHA-256 it still has (a file a user put there since
under the same name is never touched). The marker lists the files it wrote, so a later export
to the same name also replaces the files an earlier one wrote beyond this one's (``embed
--projection``'s ``z``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from torch import nn

from contrastkit import __version__, layout
from contrastkit._io import write_json
from contrastkit.manifest import file_sha256
from contrastkit.run_writer import FolderWriter

__all__ = ["check_targets", "replaceable_files", "remove_earlier_export", "mark_export", "finish_export",
           "projection_head"]


def _folder(files: Dict[str, str]) -> str:
    return os.path.dirname(os.path.abspath(files["marker"]))


def check_targets(files: Dict[str, str], force: bool, command: str) -> None:
    """Refuse before any work: a missing output folder, or an existing file that ``force`` may
    not replace (one the folder's manifest does not list as it is now); ``command`` (e.g.
    ``"contrastkit embed"``) is named in the message."""
    folder = _folder(files)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder {folder} does not exist")
    existing = [path for path in files.values() if os.path.lexists(path)]
    if not existing:
        return
    if not force:
        raise FileExistsError(f"{existing[0]} exists; pass --force to replace an earlier {command} output")
    listed = replaceable_files(files)
    for path in existing:
        if path != files["marker"] and os.path.basename(path) not in listed:
            raise FileExistsError(f"{path} exists and was not written by contrastkit (the folder's manifest "
                                  f"{layout.MANIFEST} does not list it as it is now); not replacing it")


def replaceable_files(files: Dict[str, str]) -> List[str]:
    """This export's files -- ``files``, and those its earlier marker names -- that the
    folder's manifest lists and that are still as contrastkit wrote them (same size and
    SHA-256): a file a user put there since under the same name is not one of them, and nothing
    else the manifest lists (a run's files, another export's) is."""
    folder = _folder(files)
    mine = {os.path.basename(path) for path in files.values()}
    try:
        with open(files["marker"], encoding="utf-8") as handle:
            earlier = json.load(handle).get("files", [])
        mine.update(name for name in earlier if isinstance(name, str))
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # no earlier marker, or not one of ours: only ``files`` are candidates
    return FolderWriter(folder).unchanged(sorted(name for name in mine if "/" not in name))


def remove_earlier_export(files: Dict[str, str]) -> None:
    """With ``force``: an earlier export's files (only those the manifest lists unchanged) go first."""
    folder = _folder(files)
    for name in replaceable_files(files):
        os.remove(os.path.join(folder, name))


def mark_export(files: Dict[str, str]) -> List[str]:
    """Mark every file of ``files`` as being written in the folder's manifest, before they
    appear (a crash from here on leaves them contrastkit's); returns the marked names for
    :func:`finish_export`."""
    return FolderWriter(_folder(files)).mark_writing(*(os.path.basename(path) for path in files.values()))


def finish_export(files: Dict[str, str], marked: List[str], facts: Dict[str, Any]) -> Dict[str, str]:
    """Write the marker (``facts`` with the version, and the names, sizes and SHA-256 of the
    files other than the marker) and record every file in the folder's manifest; returns the
    digests by file name."""
    written = [path for role, path in files.items() if role != "marker"]
    digests = {os.path.basename(path): file_sha256(path) for path in written}
    write_json(files["marker"], {
        **facts, "version": __version__,
        "files": sorted(os.path.basename(path) for path in written),
        "sizes": {os.path.basename(path): os.path.getsize(path) for path in written},
        "sha256": digests,
    })
    FolderWriter(_folder(files)).record(*marked, sha256=digests)
    return digests


def projection_head(model: nn.Module) -> nn.Module:
    """The projection head of a run's model (``head``, or ``image_head`` of the image-text
    methods); ``ValueError`` when it has none."""
    head = getattr(model, "head", None) or getattr(model, "image_head", None)
    if head is None:
        raise ValueError(f"the run's model ({type(model).__name__}) has no projection head to export")
    return head
