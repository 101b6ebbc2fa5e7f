"""Folder manifests: the record of every file contrastkit wrote in a folder, so that ``--force``
deletes exactly those files and nothing a user keeps next to them.

Every folder contrastkit writes into (a pretraining run, a sweep or experiment, a folder a
report or the explorer page is written to) holds ``contrastkit-manifest.json``::

    {"format": "contrastkit-manifest", "version": 1, "kind": "run",
     "files": {"config.json": {"size": 1234, "sha256": "9f86d0..."},
               "metrics.jsonl": {"writing": true}},
     "nested": ["runs/nt_xent-tau0.1-seed0"]}

``files`` maps a path inside the folder (``/``-separated) to the size and SHA-256 of what
contrastkit wrote there. A writer marks its file ``writing`` before it starts and records the
size and hash when it is done (:meth:`Manifest.writing`), so a process killed mid-write leaves
the mark, and the file counts as contrastkit's whatever its content. ``nested`` lists
sub-folders that have manifests of their own (the runs of a study). ``launch``, only in a run
started under torchrun, is the launch (``TORCHELASTIC_RUN_ID``) that started the folder's run:
a group that torchrun restarts before the run's first checkpoint knows the folder as its own
start (``contrastkit.train.faults.own_start_launch``), as does a requeued job's
``--resume`` under the same launch. The manifest is rewritten
atomically (a temporary file, then ``os.replace``) after every change, re-read first, so that
two writers of one folder (a report written while the run trains) keep each other's entries.

What ``--force`` deletes (:func:`plan_removal`, then :meth:`RemovalPlan.apply`):

* the files listed in the manifest whose size and SHA-256 still match (or that are marked
  ``writing``), and, in each nested folder, the same through its own manifest, then the
  nested manifest; then every folder that became empty (never the folder itself);
* nothing else: not a file the manifest does not list, not a folder wholesale, never anything
  reached through a symbolic link. A run's lock file (:data:`contrastkit.layout.LOCK`) is not
  deleted either, and does not make a folder without a manifest count as the user's.

It deletes nothing at all and raises ``FileExistsError`` naming what is in the way when the
folder is not empty but has no manifest (a folder written by an older contrastkit, or not by
contrastkit); when a listed file was changed since it was written, or replaced by a symbolic
link or a folder; when a listed path or a nested folder goes through a symbolic link
(contrastkit never writes links: a link is the user's, and is neither followed nor removed);
when a nested folder that is not empty has no manifest; or when a file the new run will write
exists and is not listed. A manifest that cannot be read, or that lists a path outside its
folder (absolute, with ``..``, or with a backslash), is refused with ``ValueError``.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from contrastkit import _io, layout

__all__ = ["MANIFEST", "FORMAT", "VERSION", "Manifest", "RemovalPlan", "plan_removal",
           "file_sha256"]

#: The manifest's file name inside every folder contrastkit writes.
MANIFEST = layout.MANIFEST
FORMAT = "contrastkit-manifest"
VERSION = 1
#: A manifest is a few kilobytes (a study of a thousand runs stays far below): a larger one is
#: not read.
MAX_MANIFEST_BYTES = 16 * 2**20
_CHUNK = 2**20
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_SHOWN = 5  # names listed in a message


def file_sha256(path: "str | os.PathLike[str]") -> str:
    """The SHA-256 of the file at ``path`` as 64 hex digits (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _some(names: Sequence[str]) -> str:
    """``a, b, c`` or ``a, b, c, d, e and 7 more``."""
    shown = ", ".join(names[:_SHOWN])
    return shown if len(names) <= _SHOWN else f"{shown} and {len(names) - _SHOWN} more"


def _check_name(name: Any, where: str) -> str:
    """A manifest path: relative, ``/``-separated, inside the folder; else ``ValueError``."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{where} lists an invalid path {name!r}")
    parts = name.split("/")
    if ("\\" in name or name.startswith("/") or PureWindowsPath(name).drive
            or any(part in ("", ".", "..") for part in parts)):
        raise ValueError(f"{where} lists the path {name!r}, which is not a plain path inside its folder "
                         "(absolute, '..', '.', empty parts or backslashes); it was not written by "
                         "contrastkit: delete the folder's files by hand or choose another --out")
    if name == MANIFEST:
        raise ValueError(f"{where} lists itself")
    return name


def _name(name: "str | os.PathLike[str]") -> str:
    """A caller's relative path (``os.sep`` or ``/``) as the manifest spells it."""
    text = os.fspath(name)
    if os.sep != "/":
        text = text.replace(os.sep, "/")
    return _check_name(text, "a writer")


def _symlink_on_the_way(root: str, name: str) -> Optional[str]:
    """The first folder of ``name`` (inside ``root``) that is a symbolic link, if any."""
    parts = name.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if os.path.islink(os.path.join(root, *parts[:depth])):
            return prefix
    return None


class Manifest:
    """The manifest of ``folder`` (``folder/contrastkit-manifest.json``).

    The object holds no state but the folder: every method reads the file, and every change
    re-reads, updates and atomically rewrites it. Names are paths relative to ``folder``
    (``"checkpoints/last.pt"``). ``kind`` (``"run"``, ``"sweep"``, ``"folder"``, ...) is
    stored when the manifest is created and only says what the folder is.
    """

    def __init__(self, folder: "str | os.PathLike[str]", kind: str = "folder") -> None:
        self.folder = os.fspath(folder)
        self.kind = kind

    @property
    def path(self) -> str:
        return os.path.join(self.folder, MANIFEST)

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def __repr__(self) -> str:
        return f"Manifest({self.folder!r})"

    # -- reading ------------------------------------------------------------------------
    def read(self) -> Dict[str, Any]:
        """The manifest as a dict (``format``, ``version``, ``kind``, ``files``, ``nested``);
        an empty one when there is no file. ``ValueError`` naming the file when it is not a
        valid manifest."""
        data = self._load()
        return self._empty() if data is None else data

    @property
    def files(self) -> Dict[str, Dict[str, Any]]:
        """Listed path -> ``{"size", "sha256"}`` or ``{"writing": True}``."""
        return self.read()["files"]

    @property
    def nested(self) -> List[str]:
        """The listed sub-folders that have manifests of their own."""
        return self.read()["nested"]

    @property
    def launch(self) -> Optional[str]:
        """The torchrun launch that started the folder's run (:meth:`reset`), or ``None``."""
        return self.read().get("launch")

    def check(self) -> List[str]:
        """What no longer matches: one line per listed file that is missing, changed, or not
        a plain file any more (an empty list for an intact folder; files marked ``writing``
        are not checked)."""
        problems = []
        for name, entry in sorted(self.files.items()):
            problem = _changed(self.folder, name, entry)
            if problem is not None:
                problems.append(f"{name}: {problem}")
        return problems

    def _empty(self) -> Dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "files": {}, "nested": []}

    def _load(self) -> Optional[Dict[str, Any]]:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{self.path} is not a plain file (a symbolic link or a special file); "
                             "contrastkit does not read it")
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{self.path} is {info.st_size} bytes, more than a manifest can be "
                             f"({MAX_MANIFEST_BYTES} bytes); it was not written by contrastkit")
        with open(self.path, "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{self.path} is not a valid manifest ({err}); delete the folder's files "
                             "by hand or choose another --out") from None
        return self._validate(data)

    def _validate(self, data: Any) -> Dict[str, Any]:
        where = self.path
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{where} is not a contrastkit manifest")
        if data.get("version") != VERSION:
            raise ValueError(f"{where} has manifest version {data.get('version')!r}; this contrastkit "
                             f"reads version {VERSION}")
        files, nested = data.get("files"), data.get("nested", [])
        if not isinstance(files, dict) or not isinstance(nested, list):
            raise ValueError(f"{where} is malformed: 'files' must be an object and 'nested' a list")
        for name, entry in files.items():
            _check_name(name, where)
            writing = isinstance(entry, dict) and entry.get("writing") is True
            recorded = (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                        and not isinstance(entry.get("size"), bool) and entry["size"] >= 0
                        and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"]))
            if not (writing or recorded):
                raise ValueError(f"{where} is malformed: the entry for {name!r} needs a size and a "
                                 "SHA-256 (64 hex digits)")
        for name in nested:
            _check_name(name, where)
        kind = data.get("kind") if isinstance(data.get("kind"), str) else self.kind
        launch = data.get("launch")
        if launch is not None and not isinstance(launch, str):
            raise ValueError(f"{where} is malformed: 'launch' must be a string")
        return {"format": FORMAT, "version": VERSION, "kind": kind, "files": dict(files),
                "nested": list(dict.fromkeys(nested)), **({"launch": launch} if launch is not None else {})}

    # -- writing ------------------------------------------------------------------------
    def _save(self, data: Dict[str, Any]) -> None:
        if self.folder:
            os.makedirs(self.folder, exist_ok=True)
        # The process id keeps two writers of one folder off each other's temporary file.
        with _io.atomic_file(self.path, tmp=f"{self.path}.{os.getpid()}.tmp", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")

    def _update(self, change: Any) -> None:
        data = self.read()
        change(data)
        self._save(data)

    def reset(self, launch: Optional[str] = None) -> None:
        """Start an empty manifest of this ``kind`` (the folder's files are left as they are);
        ``launch``: the torchrun launch starting the folder's run (:attr:`launch`)."""
        self._save({**self._empty(), **({"launch": launch} if launch is not None else {})})

    def record(self, *names: "str | os.PathLike[str]", sha256: Optional[Mapping[str, str]] = None) -> None:
        """List ``names`` with their current size and SHA-256; a name that is not a plain file
        (missing, say) is dropped from the list. ``sha256`` may give a digest the writer
        already computed (``{name: hexdigest}``), so that a large file is not read again."""
        known = {_name(k): v for k, v in (sha256 or {}).items()}
        entries = {}
        for name in map(_name, names):
            path = os.path.join(self.folder, *name.split("/"))
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                entries[name] = None
                continue
            if not stat.S_ISREG(info.st_mode) or _symlink_on_the_way(self.folder, name):
                entries[name] = None
                continue
            digest = known.get(name) or file_sha256(path)
            entries[name] = {"size": info.st_size, "sha256": digest}

        def change(data: Dict[str, Any]) -> None:
            for name, entry in entries.items():
                if entry is None:
                    data["files"].pop(name, None)
                else:
                    data["files"][name] = entry
        self._update(change)

    def mark_writing(self, *names: "str | os.PathLike[str]") -> List[str]:
        """Mark ``names`` (and each ``NAME.tmp``, the temporary file of contrastkit's atomic
        writers) as being written, before a writer starts; returns the marked names, to pass
        to :meth:`record` when it is done. A process killed in between leaves the marks: the
        files count as contrastkit's whatever their content."""
        marked = [n for name in map(_name, names) for n in (name, f"{name}.tmp")]

        def mark(data: Dict[str, Any]) -> None:
            for name in marked:
                data["files"][name] = {"writing": True}
        self._update(mark)
        return marked

    @contextlib.contextmanager
    def writing(self, *names: "str | os.PathLike[str]") -> Iterator[Dict[str, str]]:
        """:meth:`mark_writing`, run the body, then :meth:`record` the names, also when the
        body raises. The body may put digests it computed into the dict it receives
        (``{name: sha256}``)."""
        marked = self.mark_writing(*names)
        known: Dict[str, str] = {}
        try:
            yield known
        except BaseException:
            # The body's error is the one to report: a record that fails after it (on the full
            # disk that stopped the body) does not replace it.
            with contextlib.suppress(OSError):
                self.record(*marked, sha256=known)
            raise
        self.record(*marked, sha256=known)

    def write_json(self, name: str, data: Any) -> None:
        """Write ``data`` to ``folder/name`` as indented, key-sorted JSON, atomically, and record it."""
        with self.writing(name):
            _io.write_json(os.path.join(self.folder, *_name(name).split("/")), data)

    def write_csv(self, name: str, rows: List[Dict[str, Any]]) -> None:
        """Write ``rows`` (dicts with the same keys) to ``folder/name`` as CSV with a header,
        atomically, and record it."""
        with self.writing(name):
            _io.write_csv(os.path.join(self.folder, *_name(name).split("/")), rows)

    def adopt(self, names: Iterable[str]) -> None:
        """Record those of ``names`` that exist as plain files and are not listed yet (a run
        of an older contrastkit, without a manifest, that the user resumes)."""
        listed = self.files
        self.record(*[n for n in map(_name, names) if n not in listed
                      and os.path.isfile(os.path.join(self.folder, *n.split("/")))])

    def unchanged(self, name: "str | os.PathLike[str]", entry: Optional[Mapping[str, Any]]) -> bool:
        """Whether ``name``, listed as ``entry`` (``None``: not listed), was written completely
        and is still what contrastkit wrote: a plain file reached through no symbolic link, of
        the recorded size and SHA-256."""
        return (isinstance(entry, Mapping) and "sha256" in entry
                and _changed(self.folder, _name(name), entry) is None)

    def add_nested(self, *names: "str | os.PathLike[str]") -> None:
        """List the sub-folders ``names`` as folders with manifests of their own."""
        added = [_name(name) for name in names]

        def change(data: Dict[str, Any]) -> None:
            data["nested"].extend(name for name in added if name not in data["nested"])
        if added:
            self._update(change)

def _changed(root: str, name: str, entry: Mapping[str, Any]) -> Optional[str]:
    """Why the listed file ``name`` is no longer what contrastkit wrote, or ``None`` (``None``
    too for a missing file; see :meth:`Manifest.check` for that case)."""
    link = _symlink_on_the_way(root, name)
    if link is not None:
        return f"reached through the symbolic link {link}"
    try:
        info = os.lstat(os.path.join(root, *name.split("/")))
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(info.st_mode):
        return "now a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "no longer a plain file"
    if entry.get("writing"):
        return None
    if info.st_size != entry["size"] or file_sha256(os.path.join(root, *name.split("/"))) != entry["sha256"]:
        return "changed since contrastkit wrote it"
    return None


def _signature(info: os.stat_result) -> Tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass
class _Doomed:
    path: str
    entry: Optional[Mapping[str, Any]]  # None: a nested manifest or a temporary, not hashed
    signature: Tuple[int, int, int, int]


class RemovalPlan:
    """What ``--force`` will delete in ``folder``, checked (made by :func:`plan_removal`).

    :attr:`files` are the paths to delete, :attr:`folders` the folders to remove if they
    are empty afterwards.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.doomed: List[Any] = []  # _Doomed: a path, its entry and its stat signature
        self.folders: List[str] = []

    @property
    def files(self) -> List[str]:
        """The paths :meth:`apply` deletes."""
        return [d.path for d in self.doomed]

    def apply(self) -> None:
        """Delete the planned files, then the folders that became empty, deepest first.

        Every file is checked again first (a file whose size, modification time or inode
        changed since the plan is hashed again); if one changed, nothing is deleted and
        ``FileExistsError`` says which."""
        changed = []
        for doomed in self.doomed:
            try:
                info = os.lstat(doomed.path)
            except FileNotFoundError:
                continue
            name = _relative(self.folder, doomed.path)
            moved = not stat.S_ISREG(info.st_mode) or _symlink_on_the_way(self.folder, name) is not None
            if moved or (doomed.entry is not None and _signature(info) != doomed.signature
                         and _changed(self.folder, name, doomed.entry) is not None):
                changed.append(name)
        if changed:
            raise FileExistsError(f"{self.folder}: {_some(changed)} changed while --force was checking the "
                                  "folder; nothing was deleted")
        for doomed in self.doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(doomed.path)
        for folder in sorted(set(self.folders), key=lambda f: (-f.count(os.sep), f)):
            with contextlib.suppress(OSError):  # not empty (the user's files), or gone
                if not os.path.islink(folder):
                    os.rmdir(folder)


def _relative(root: str, path: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _plan_into(plan: RemovalPlan, folder: str, problems: List[str], top: bool) -> None:
    root = plan.folder
    manifest = Manifest(folder)
    data = manifest._load()
    if data is None:
        # A run's lock (held, or left by a killed run) is neither the user's nor deleted here.
        entries = sorted(set(os.listdir(folder)) - {layout.LOCK})
        if not entries:
            return
        if top:
            raise FileExistsError(
                f"{folder} is not empty and has no {MANIFEST}, so contrastkit cannot tell the files it "
                f"wrote from yours (it holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: "
                f"{_some(entries)}); nothing was deleted. A folder written by an older contrastkit "
                "has no manifest either: delete what you no longer need by hand, or choose another --out")
        problems.append(f"{_relative(root, folder)}/ (no {MANIFEST}; holds {_some(entries)})")
        return
    for name, entry in sorted(data["files"].items()):
        path = os.path.join(folder, *name.split("/"))
        shown = _relative(root, path)
        problem = _changed(folder, name, entry)
        if problem == "missing":
            continue
        if problem is not None:
            problems.append(f"{shown} ({problem})")
            continue
        plan.doomed.append(_Doomed(path, entry, _signature(os.lstat(path))))
        parts = name.split("/")
        plan.folders.extend(os.path.join(folder, *parts[:depth]) for depth in range(1, len(parts)))
    for name in data["nested"]:
        path = os.path.join(folder, *name.split("/"))
        shown = _relative(root, path)
        link = _symlink_on_the_way(folder, name)
        if link is not None or os.path.islink(path):
            problems.append(f"{shown}/ (a symbolic link, or reached through one)")
            continue
        if not os.path.lexists(path):
            continue
        if not os.path.isdir(path):
            problems.append(f"{shown} (no longer a folder)")
            continue
        _plan_into(plan, path, problems, top=False)
        parts = name.split("/")
        plan.folders.extend(os.path.join(folder, *parts[:depth]) for depth in range(1, len(parts) + 1))
    if not top:
        plan.doomed.append(_Doomed(manifest.path, None, _signature(os.lstat(manifest.path))))


def plan_removal(folder: "str | os.PathLike[str]", *, will_write: Iterable[str] = ()) -> RemovalPlan:
    """Check what ``--force`` would delete in ``folder`` (the rules are in the module's
    docstring), deleting nothing; :meth:`RemovalPlan.apply` then deletes it.

    ``will_write`` are the files (relative paths) the caller writes next: one that exists and
    is not in the plan is in the way (contrastkit would overwrite a file it did not write).
    Raises ``FileExistsError`` (what is in the way, and how to proceed) or ``ValueError``
    (a manifest that is unreadable or lists paths outside its folder).
    """
    folder = os.fspath(folder)
    plan = RemovalPlan(folder)
    if not os.path.lexists(folder):
        return plan
    if not os.path.isdir(folder):
        raise FileExistsError(f"{folder} exists and is not a folder")
    problems: List[str] = []
    _plan_into(plan, folder, problems, top=True)
    doomed = set(plan.files)
    for name in map(_name, will_write):
        path = os.path.join(folder, *name.split("/"))
        link = _symlink_on_the_way(folder, name)
        if link is not None:
            problems.append(f"{link} (a symbolic link where contrastkit writes a folder)")
        elif os.path.lexists(path) and path not in doomed:
            problems.append(f"{name} (not listed in the manifest, so not contrastkit's to replace)")
    if problems:
        problems = list(dict.fromkeys(problems))
        raise FileExistsError(
            f"--force in {folder} refused, nothing was deleted: {_some(problems)}. contrastkit deletes only "
            "the files it wrote, unchanged, and never follows a symbolic link: move these out of the "
            "folder or delete them by hand, or choose another --out")
    return plan
