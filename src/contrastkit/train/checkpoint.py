"""Checkpoints that load with ``torch.load(weights_only=True)``, checked on load, never lost.

Everything is stored as tensors, numbers, strings, lists and dicts (RNG states included), so
loading never unpickles arbitrary objects. Next to each checkpoint ``X`` lies ``X.sha256``,
its SHA-256 recorded when it was written (``sha256sum -c`` reads it), and the checkpoint
written before it is kept: ``last.pt`` is preceded by ``previous.pt`` (file names in
:mod:`contrastkit.layout`).

Writing (:func:`save_checkpoint`) goes through a temporary file and a sequence of
``os.replace`` calls ordered so that, whenever the process dies (kill -9, power cut), the
checkpoint file matches a digest recorded next to it and a resume finds the last completed
checkpoint or the one being written. A write that fails (a full disk, a quota) removes its
temporary file and raises :class:`CheckpointWriteError`, the checkpoint before it untouched. Loading (:func:`load_checkpoint`) refuses, with one
``ValueError`` naming the file, a file whose digest does not match, a symbolic link, a file
over the input ceiling (:func:`contrastkit._io.max_input_bytes`), and content that is not a
complete checkpoint: format tags, non-negative integer epoch and step, RNG states that the
generators accept.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from contrastkit import layout
from contrastkit._io import atomic_file, file_digest, os_error_of, memory_guard, one_line, open_input, read_exactly, stream_digest
from contrastkit.models import TensorFileError, load_tensors

__all__ = ["FORMAT", "VERSION", "CheckpointWriteError", "save_checkpoint", "load_checkpoint", "previous_checkpoint", "digest_file",
           "rng_state", "set_rng_state"]

FORMAT = "contrastkit-pretrain"
VERSION = 1
_REQUIRED = ("format", "version", "config", "model", "optimizer", "scheduler", "rng", "epoch", "step")
_DIGEST_LINE = re.compile(r"([0-9a-f]{64}) [ *](.+)")
_MAX_DIGEST_FILE = 4096
_MT_WORDS = 624  # the Mersenne Twister's state words (numpy's keys, python's state less its index)


class _CheckpointError(ValueError):
    """A checkpoint file that cannot be used (a previous one may still be)."""


class CheckpointWriteError(OSError):
    """Writing the checkpoint ``path`` failed with the ``OSError`` ``cause`` (its ``errno`` is
    kept: ``ENOSPC`` for a full disk). ``replaced``: the new checkpoint had already taken the
    old one's place (it loads); otherwise the old one is untouched and the partial file removed.
    ``message`` replaces the default one-line description."""

    def __init__(self, path: str, cause: OSError, replaced: bool, message: Optional[str] = None) -> None:
        reason = cause.strerror or str(cause)
        super().__init__(cause.errno, message or f"could not write the checkpoint {path}: {reason}")
        self.path, self.cause, self.replaced = path, cause, replaced

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> Any:  # picklable (a study's worker process hands it back)
        return type(self), (self.path, self.cause, self.replaced, self.strerror)


def rng_state() -> Dict[str, Any]:
    """torch (CPU and CUDA), numpy and python RNG states as tensors and lists."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                  "position": int(position), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": list(python_state), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore(state: Any, set_torch: Callable[[Any], Any], set_numpy: Callable[[Any], Any],
             set_python: Callable[[Any], Any]) -> None:
    """Hand each part of a :func:`rng_state` dict to its setter, checking what the setters
    would take silently (numpy keys wrap around to uint32, a float epoch truncates...)."""
    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise ValueError("expected a dict with torch, numpy and python entries")
    if not isinstance(state["torch"], torch.Tensor) or state["torch"].dtype != torch.uint8:
        raise ValueError("the torch entry is not a uint8 tensor")
    set_torch(state["torch"])
    numpy_state = state["numpy"]
    keys = numpy_state["keys"] if isinstance(numpy_state, dict) else None
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or tuple(keys.shape) != (_MT_WORDS,) \
            or int(keys.min()) < 0 or int(keys.max()) >= 2**32:
        raise ValueError(f"the numpy keys are not {_MT_WORDS} 32-bit words")
    for name, kind in (("position", int), ("has_gauss", int), ("cached_gaussian", float)):
        if type(numpy_state[name]) is not kind:
            raise ValueError(f"numpy {name} is not a{'n int' if kind is int else ' float'}")
    set_numpy((numpy_state["kind"], keys.numpy().astype(np.uint32), numpy_state["position"],
               numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python_state = state["python"]
    words = python_state["state"] if isinstance(python_state, dict) else None
    if not isinstance(words, list) or len(words) != _MT_WORDS + 1 \
            or not all(type(w) is int and 0 <= w < 2**32 for w in words):
        raise ValueError(f"the python state is not {_MT_WORDS + 1} 32-bit words")
    gauss = python_state["gauss_next"]
    if gauss is not None and type(gauss) is not float:
        raise ValueError("python gauss_next is neither None nor a float")
    set_python((python_state["version"], tuple(words), gauss))
    cuda = state.get("cuda")
    if cuda is not None and not (isinstance(cuda, list) and all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)):
        raise ValueError("the cuda entry is not a list of uint8 tensors")


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    _restore(state, torch.set_rng_state, np.random.set_state, random.setstate)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_rng(state: Any) -> None:
    """Raise ``ValueError`` unless :func:`set_rng_state` would accept ``state`` (tried on
    fresh generators, so the global ones are not touched)."""
    try:
        _restore(state, torch.Generator().set_state, np.random.RandomState().set_state, random.Random().setstate)
    except (TypeError, ValueError, RuntimeError, KeyError, IndexError, OverflowError, AttributeError) as err:
        raise ValueError(one_line(err)) from None


# ------------------------------------------------------------------------------ files


def previous_checkpoint(path: "str | os.PathLike[str]") -> str:
    """Where the checkpoint written before ``path`` is kept: ``previous.pt`` next to a
    ``last.pt``, ``NAME.previous.pt`` next to any other ``NAME.pt``."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    if name == layout.LAST_CHECKPOINT:
        return os.path.join(folder, layout.PREVIOUS_CHECKPOINT)
    stem, ext = os.path.splitext(name)
    return os.path.join(folder, f"{stem}.previous{ext}")


def digest_file(path: "str | os.PathLike[str]") -> str:
    """The file holding the SHA-256 recorded for the checkpoint ``path``."""
    return os.fspath(path) + layout.DIGEST_SUFFIX


def _refuse_links(path: str) -> None:
    """A checkpoint, or the run's checkpoints/ folder, must not be a symbolic link: writes
    would land elsewhere and reads would follow whatever the link points to now."""
    if os.path.islink(path):
        raise _CheckpointError(f"checkpoint {path} is a symbolic link (to {os.readlink(path)}); contrastkit reads "
                               "and writes checkpoints as regular files only: pass the file itself")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) == layout.CHECKPOINTS and os.path.islink(folder):
        raise _CheckpointError(f"checkpoint folder {os.path.dirname(path) or folder} is a symbolic link (to "
                               f"{os.readlink(folder)}); make it a real folder holding the checkpoints")


def _write_atomically(path: str, data: bytes) -> None:
    with atomic_file(path, "wb", sync=True) as handle:
        handle.write(data)


def _write_digests(path: str, digests: List[str]) -> None:
    name = os.path.basename(path)
    _write_atomically(digest_file(path), "".join(f"{d}  {name}\n" for d in digests).encode("ascii"))


def _recorded_digests(path: str) -> Optional[List[str]]:
    """The digests recorded for ``path`` (more than one only while it is being replaced), or
    ``None`` when none were (a checkpoint from before they were recorded, or copied alone)."""
    sidecar = digest_file(path)
    if not os.path.lexists(sidecar):
        return None
    try:
        with open_input(sidecar) as handle:
            text = read_exactly(handle, _MAX_DIGEST_FILE, sidecar, exact=False).decode("ascii")
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise _CheckpointError(f"checkpoint digest file {sidecar} is unreadable ({one_line(err)}); "
                               "it should hold the SHA-256 recorded when the checkpoint was written") from None
    digests = [m.group(1) for m in (_DIGEST_LINE.fullmatch(line) for line in text.splitlines()) if m]
    if not digests:
        raise _CheckpointError(f"checkpoint digest file {sidecar} holds no SHA-256 line")
    return digests


def _intact_digest(path: str) -> Optional[str]:
    """``path``'s SHA-256 when it exists and matches a digest recorded for it, else ``None``."""
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        recorded = _recorded_digests(path)
        digest = file_digest(path)
    except (ValueError, OSError):
        return None
    return digest if recorded is None or digest in recorded else None


def _keep_as_previous(path: str, previous: str) -> None:
    """Make ``previous`` a copy of ``path`` atomically (a hard link where the filesystem has them)."""
    if os.path.isfile(previous) and os.path.samefile(path, previous):
        return  # already linked there by a write that died before replacing `path`
    tmp = f"{previous}.tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp, previous)


def _sync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # e.g. Windows, where folders cannot be opened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str, payload: Dict[str, Any]) -> None:
    """Write ``payload`` (plus format tags) to ``path`` with its SHA-256 in ``path.sha256``,
    keeping the checkpoint it replaces as :func:`previous_checkpoint` (``previous.pt``).

    The new checkpoint is written to ``path.tmp`` and flushed to disk; then, when the current
    ``path`` is intact, its digest is recorded for ``previous.pt`` and it is linked there;
    ``path.sha256`` lists the new and the old digest while ``path.tmp`` replaces ``path``, and
    the new one alone after. A process killed at any point leaves ``path`` matching its
    digests (and ``previous.pt`` matching its own or being replaced by a copy of ``path``).
    """
    path = os.fspath(path)
    _refuse_links(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, **payload}
    tmp = f"{path}.tmp"
    replaced = False
    try:
        with open(tmp, "wb") as handle:
            torch.save(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        new = file_digest(tmp)
        old = _intact_digest(path)
        if old is not None:
            previous = previous_checkpoint(path)
            _write_digests(previous, [old])
            _keep_as_previous(path, previous)
            _write_digests(path, [new, old])  # either file is `path` while it is being replaced
        else:
            _write_digests(path, [new])
        os.replace(tmp, path)
        replaced = True
        if old is not None:
            _write_digests(path, [new])
        _sync_folder(folder)
    except (OSError, RuntimeError) as err:
        # (torch.save reports a failed write into the file as a RuntimeError raised from the OSError)
        cause = os_error_of(err)
        if cause is None:
            raise
        if not replaced:  # the partial file goes (on a full disk it holds the space the user needs)
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise CheckpointWriteError(path, cause, replaced) from err


# ------------------------------------------------------------------------------ loading


def _check_archive(handle: Any, path: str) -> None:
    """torch writes checkpoints as uncompressed zip archives; refuse any entry that would make
    torch read beyond the file (sizes are checked against the file, before torch reads them)."""
    size = os.fstat(handle.fileno()).st_size
    try:
        with zipfile.ZipFile(handle) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, KeyError,
            UnicodeDecodeError) as err:
        raise _CheckpointError(f"checkpoint {path} is corrupt or unreadable (not a torch zip archive: "
                               f"{one_line(err)})") from None
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size != entry.compress_size \
                or entry.header_offset + entry.compress_size > size:
            raise _CheckpointError(f"checkpoint {path} is corrupt or unreadable (archive entry {entry.filename!r} "
                                   "is compressed or reaches beyond the end of the file)")
    handle.seek(0)


def _check_number(data: Dict[str, Any], key: str, path: str, kind: type, optional: bool = False) -> None:
    if optional and key not in data:
        return
    value = data[key]
    ok = type(value) is int if kind is int else type(value) in (int, float)
    if not ok or value < 0 or value != value:
        raise _CheckpointError(f"checkpoint {path} is damaged: {key} is {value!r}, not a non-negative "
                               f"{'integer' if kind is int else 'number'}")


def _check_content(data: Any, path: str) -> Dict[str, Any]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _CheckpointError(f"checkpoint {path} is not a contrastkit pretraining checkpoint")
    if data.get("version") != VERSION:
        raise _CheckpointError(f"checkpoint {path} has format version {data.get('version')!r}; "
                               f"this contrastkit reads version {VERSION}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise _CheckpointError(f"checkpoint {path} is incomplete: missing {missing}")
    for key in ("config", "model", "optimizer", "scheduler"):
        if not isinstance(data[key], dict):
            raise _CheckpointError(f"checkpoint {path} is damaged: {key} is a {type(data[key]).__name__}, "
                                   "not a dict")
    _check_number(data, "epoch", path, int)
    _check_number(data, "step", path, int)
    _check_number(data, "world_size", path, int, optional=True)
    _check_number(data, "train_seconds", path, float, optional=True)
    _check_number(data, "epoch_step", path, int, optional=True)
    _check_number(data, "skipped_steps", path, int, optional=True)
    _check_number(data, "short_batches", path, int, optional=True)
    _check_number(data, "epoch_short_batches", path, int, optional=True)
    sums = data.get("epoch_loss_sums", [])
    if not isinstance(sums, list) or not all(type(v) in (int, float) for v in sums):
        raise _CheckpointError(f"checkpoint {path} is damaged: epoch_loss_sums is not a list of numbers")
    losses = data.get("epoch_losses", [])
    if not isinstance(losses, list) or not all(type(v) in (int, float) for v in losses):
        raise _CheckpointError(f"checkpoint {path} is damaged: epoch_losses is not a list of numbers")
    states = {"rng": data["rng"]}
    if "rng_per_rank" in data:
        per_rank = data["rng_per_rank"]
        if not isinstance(per_rank, list) or len(per_rank) != data.get("world_size", len(per_rank)):
            raise _CheckpointError(f"checkpoint {path} is damaged: rng_per_rank is not one RNG state per process")
        states.update({f"rng_per_rank[{i}]": s for i, s in enumerate(per_rank)})
    for name, state in states.items():
        try:
            _check_rng(state)
        except ValueError as err:
            raise _CheckpointError(f"checkpoint {path} has an invalid RNG state in {name} ({err})") from None
    return data


def _load_one(path: str) -> Dict[str, Any]:
    """Read, verify and check one checkpoint file."""
    _refuse_links(path)
    recorded = _recorded_digests(path)
    with memory_guard(f"checkpoint {path}"), open_input(path, f"checkpoint {path}") as handle:
        digest = stream_digest(handle)
        handle.seek(0)
        matches = recorded is None or digest in recorded
        try:
            _check_archive(handle, path)
            try:
                data = load_tensors(handle)
            except TensorFileError as err:
                raise _CheckpointError(f"checkpoint {path} is corrupt or unreadable ({err.reason})") from None
            _check_content(data, path)
        except _CheckpointError as err:
            if matches:
                raise
            raise _CheckpointError(f"{err}; it differs from the SHA-256 recorded in {digest_file(path)} "
                                   "when it was written") from None
    if not matches:
        raise _CheckpointError(f"checkpoint {path} is damaged: its SHA-256 differs from the one recorded in "
                               f"{digest_file(path)} when it was written (the file changed since)")
    if recorded is None:
        warnings.warn(f"checkpoint {path} has no recorded SHA-256 ({digest_file(path)}): its integrity "
                      "cannot be checked", stacklevel=3)
    return data


def load_checkpoint(path: str, *, fallback: bool = False) -> Dict[str, Any]:
    """Load and check a checkpoint written by :func:`save_checkpoint`.

    Raises ``FileNotFoundError`` if ``path`` is missing and one ``ValueError`` naming ``path``
    if it is a symbolic link (or lies in a symlinked ``checkpoints/`` folder), over the input
    ceiling, differs from the SHA-256 recorded when it was written, is truncated or corrupt,
    is not a contrastkit pretraining checkpoint, or holds a bad epoch, step or RNG state. When
    the checkpoint written before it (:func:`previous_checkpoint`) is intact, the message says
    so and how to use it; with ``fallback=True`` it is loaded instead, with a warning.
    """
    path = os.fspath(path)
    try:
        if not os.path.lexists(path):
            raise FileNotFoundError(f"no checkpoint at {path}")
        return _load_one(path)
    except (_CheckpointError, FileNotFoundError) as err:
        previous = previous_checkpoint(path)
        if os.path.islink(path) or not os.path.isfile(previous):
            raise
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kept = _load_one(previous)
        except (ValueError, OSError):
            raise err from None
        if fallback:
            warnings.warn(f"{err}; falling back to the previous checkpoint {previous} (epoch {kept['epoch']})",
                          stacklevel=2)
            return kept
        message = (f"{err}; the previous checkpoint {previous} (epoch {kept['epoch']}) is intact: load it instead "
                   f"(e.g. probe with --checkpoint {previous}), or to resume from it rename it and its "
                   f"{layout.DIGEST_SUFFIX} file to {os.path.basename(path)} and "
                   f"{os.path.basename(digest_file(path))}")
        raise type(err)(message) from None
