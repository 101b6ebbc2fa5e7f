"""Small file helpers shared by every layer (standard library only).

Every writer goes through a temporary file and ``os.replace``, so an interrupted write leaves
the previous file intact rather than a truncated one. Every reader of user input goes through
:func:`open_input`, which bounds what is read (see "bounded reading" below).
"""

from __future__ import annotations

import ast
import contextlib
import csv
import errno
import hashlib
import json
import math
import os
import re
import stat
import struct
from typing import Any, BinaryIO, Dict, Iterator, List, NamedTuple, Optional, Tuple


#: The ``errno`` values of an ``OSError`` that says the disk (or the user's quota on it) is full.
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class WriteFailed(OSError):
    """Writing the file ``path`` failed with the ``OSError`` ``cause`` part-way (its ``errno`` is
    kept: ``ENOSPC`` for a full disk, ``EDQUOT`` for a quota): the message names the file, which
    an error of a write or a flush does not; the temporary file is gone and ``path`` is as it was."""

    def __init__(self, path: str, cause: OSError, message: Optional[str] = None) -> None:
        super().__init__(cause.errno, message or f"could not write {path}: {cause.strerror or cause}")
        self.path, self.cause = path, cause

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> Any:  # picklable (a worker process hands it back)
        return type(self), (self.path, self.cause, self.strerror)


@contextlib.contextmanager
def atomic_file(path: "str | os.PathLike[str]", mode: str = "w", *, tmp: "Optional[str | os.PathLike[str]]" = None,
                sync: bool = False, **open_args: Any) -> Iterator[Any]:
    """Write ``path`` through a temporary file (default ``path.tmp``) that replaces it when the
    block ends (flushed to disk first with ``sync``). When anything fails (a full disk, an
    interruption), the temporary file is removed, ``path`` is left as it was, and an ``OSError``
    that names no file is raised as :class:`WriteFailed`, naming ``path``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp" if tmp is None else os.fspath(tmp)
    try:
        with open(tmp, mode, **open_args) as handle:
            yield handle
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        cause = os_error_of(err) if isinstance(err, (OSError, RuntimeError)) else None
        named = None if cause is None else _named(path, cause)
        if named is not None and named is not cause:
            raise named from err
        raise


def os_error_of(err: BaseException) -> Optional[OSError]:
    """The ``OSError`` behind ``err``: ``err`` itself, or the one a library's own error was
    raised while handling (``torch.save`` into a file reports a failed write, a full disk, as a
    ``RuntimeError`` whose context is the ``OSError``); ``None`` when there is none."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        # (a cause given; else the error being handled, unless the raise said "from None")
        err = err.__cause__ if err.__cause__ is not None else (None if err.__suppress_context__ else err.__context__)
        seen += 1
    return None


def _named(path: str, err: OSError) -> OSError:
    return WriteFailed(path, err) if err.filename is None and not isinstance(err, WriteFailed) else err


@contextlib.contextmanager
def naming_writes(path: str, errnos: Optional[Tuple[int, ...]] = None) -> Iterator[None]:
    """An ``OSError`` of the block that names no file (of ``errnos`` only, when given: e.g.
    :data:`DISK_FULL`) is raised as :class:`WriteFailed` naming ``path``, the file written."""
    try:
        yield
    except OSError as err:
        named = _named(path, err) if errnos is None or err.errno in errnos else err
        if named is err:
            raise
        raise named from err


class AppendedFile:
    """A text file opened to append to (:func:`append_file`): an ``OSError`` of a write, a flush
    or the close (a full disk) is raised as :class:`WriteFailed`, naming the file."""

    def __init__(self, path: str, **open_args: Any) -> None:
        self.path = path
        self._handle = open(path, "a", **open_args)

    def write(self, text: str) -> int:
        with naming_writes(self.path):
            return self._handle.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with naming_writes(self.path):
            self._handle.flush()

    def close(self) -> None:
        with naming_writes(self.path):
            self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def fileno(self) -> int:
        return self._handle.fileno()

    def __enter__(self) -> "AppendedFile":
        return self

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        try:
            self.close()
        except OSError:
            if kind is None:  # an error already on its way is the one to report
                raise


def append_file(path: "str | os.PathLike[str]", **open_args: Any) -> AppendedFile:
    """``path`` opened to append text to (:class:`AppendedFile`: its write errors name it)."""
    return AppendedFile(os.fspath(path), **open_args)


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented, key-sorted JSON, atomically (:func:`atomic_file`)."""
    with atomic_file(path, encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")


def write_csv(path: str, rows: List[Dict[str, Any]]) -> None:
    """Write rows (dicts with the same keys) as CSV with a header, atomically (:func:`atomic_file`)."""
    with atomic_file(path, newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_json(path: Any, *, hint: str = "") -> Any:
    """Read JSON from a regular file within the input ceiling (:func:`read_input`); a corrupt
    file raises ``ValueError`` naming the file and the line."""
    data = read_input(path)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}){hint}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}: {err.msg}){hint}") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply{hint}") from None



# ------------------------------------------------------------------------------ bounded reading
#
# Every input contrastkit reads (data files, similarity matrices, checkpoints) is opened with
# open_input: a regular file no larger than the ceiling, refused before a byte is read when it
# is a device such as /dev/zero, a FIFO or a socket. Readers then trust no size they have not
# checked: what a header declares must match what the file holds, and a compressed stream is
# read up to its declared size and no further.

#: Environment variable that sets the ceiling, in bytes (suffixes K, M, G, T for powers of 1024).
MAX_INPUT_BYTES_ENV = "CONTRASTKIT_MAX_INPUT_BYTES"
#: Default ceiling on one input (a file, a decompressed stream, the arrays of an archive, the
#: decoded images of a folder): 4 GiB, room for real data sets such as CIFAR-100's 60 000
#: images as float32 (0.74 GB) or STL-10's labelled images.
DEFAULT_MAX_INPUT_BYTES = 4 * 2**30

_SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_CHUNK = 2**20


def max_input_bytes() -> int:
    """The ceiling in bytes: ``$CONTRASTKIT_MAX_INPUT_BYTES`` (e.g. ``500M``, ``8G``) or 4 GiB."""
    text = os.environ.get(MAX_INPUT_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_INPUT_BYTES
    number, suffix = text.upper().rstrip("IB"), ""
    if number and number[-1] in _SIZE_SUFFIXES:
        number, suffix = number[:-1], number[-1]
    try:
        value = int(float(number) * _SIZE_SUFFIXES[suffix])
    except (ValueError, OverflowError):
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_INPUT_BYTES_ENV}={text!r} is not a size in bytes (e.g. 500000000, 500M or 8G)")
    return value


def _human(nbytes: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} bytes"


def check_input_size(nbytes: int, what: str, *, declared: bool = True) -> None:
    """Refuse ``nbytes`` (what an input holds or, with ``declared``, what its header says it
    holds) above the ceiling, with a ``ValueError`` naming ``what``."""
    limit = max_input_bytes()
    if nbytes > limit:
        says = "declares" if declared else "holds"
        raise ValueError(f"{what} {says} {_human(nbytes)} of data, more than the input ceiling of "
                         f"{_human(limit)} (raise {MAX_INPUT_BYTES_ENV} to read it)")


def file_kind(mode: int) -> str:
    """What a file of ``os.stat`` mode ``mode`` is, in words, when it is not a regular file:
    ``"a folder"``, ``"a character device"`` (``/dev/zero``), ``"a FIFO (named pipe)"``, ..."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_input(path: "str | os.PathLike[str]", what: Optional[str] = None) -> BinaryIO:
    """Open ``path`` for reading in binary mode, refusing (``ValueError`` naming ``what``,
    default the path) anything but a regular file within the ceiling, before reading.

    The file is opened non-blocking, so a FIFO is refused instead of waiting for a writer,
    and checked on the open descriptor, so what is read is what was checked.
    """
    what = os.fspath(path) if what is None else what
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no such file") from None
    except PermissionError:
        raise PermissionError(f"{what}: permission denied") from None
    except OSError as err:
        raise ValueError(f"{what}: cannot open ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} is {file_kind(info.st_mode)}, not a regular file; contrastkit reads "
                             "inputs from regular files only")
        check_input_size(info.st_size, what, declared=False)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_input(path: "str | os.PathLike[str]", what: Optional[str] = None) -> bytearray:
    """The whole content of a regular file within the ceiling (see :func:`open_input`)."""
    with open_input(path, what) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = read_exactly(handle, size, os.fspath(path) if what is None else what, exact=False)
        if handle.read(1):
            raise ValueError(f"{os.fspath(path) if what is None else what} grew while it was read")
    return data


def read_exactly(stream: BinaryIO, nbytes: int, what: str, *, exact: bool = True) -> bytearray:
    """Read ``nbytes`` from ``stream`` in chunks, never more; a shorter stream is a
    ``ValueError`` (``exact``) or returned as it is. The buffer is writable, so arrays made
    on it with ``numpy.frombuffer`` are too."""
    buffer = bytearray()
    while len(buffer) < nbytes:
        chunk = stream.read(min(_CHUNK, nbytes - len(buffer)))
        if not chunk:
            if exact:
                raise ValueError(f"{what} is truncated: {nbytes} bytes expected, {len(buffer)} found")
            break
        buffer += chunk
    return buffer


def stream_digest(stream: BinaryIO) -> str:
    """Hex SHA-256 of what ``stream`` holds from its position on, read in chunks."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: stream.read(_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: "str | os.PathLike[str]", what: Optional[str] = None) -> str:
    """Hex SHA-256 of a regular file within the ceiling (:func:`open_input`)."""
    with open_input(path, what) as handle:
        return stream_digest(handle)


def escape_undecodable(text: "str | os.PathLike[str]") -> str:
    """A path (or text holding paths) as text that can be written anywhere (UTF-8 files, JSON, a
    terminal): a byte of a file name that is not UTF-8 (held by Python as a surrogate escape)
    written ``\\xNN``, e.g. the Latin-1 name ``b'caf\\xe9.png'`` as ``caf\\xe9.png``; any other
    text unchanged."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def escape_line(text: "str | os.PathLike[str]") -> str:
    """:func:`escape_undecodable`, and a control character (a newline, a tab, a carriage
    return... that a file name may hold) written ``\\xNN`` too: text that stays one field of
    one line in a line-oriented file such as skipped.txt (``path<TAB>reason``)."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7f else c for c in escape_undecodable(text))


def is_utf8_name(path: "str | os.PathLike[str]") -> bool:
    """Whether every byte of the file name ``path`` decodes as UTF-8 (so that it can be written
    as it is in UTF-8 text: skipped.txt, a CSV of embedding names, JSON)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def one_line(err: BaseException) -> str:
    """An exception's message on one line (third-party messages may span several), or its
    type's name when it has none."""
    return " ".join(str(err).split()) or type(err).__name__


def available_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (Linux ``MemAvailable``), or ``None``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextlib.contextmanager
def memory_guard(what: str) -> Iterator[None]:
    """Turn running out of memory while reading ``what`` into one ``ValueError`` naming it
    (torch reports a failed CPU allocation as a ``RuntimeError``)."""
    try:
        yield
    except MemoryError:
        raise ValueError(f"{what}: not enough memory to read it (lower {MAX_INPUT_BYTES_ENV} to refuse "
                         "such inputs up front, or free memory)") from None
    except RuntimeError as err:
        if "allocate" not in str(err) and "not enough memory" not in str(err):
            raise
        raise ValueError(f"{what}: not enough memory to read it (lower {MAX_INPUT_BYTES_ENV} to refuse "
                         "such inputs up front, or free memory)") from None


class NpyHeader(NamedTuple):
    """What a ``.npy`` header declares: ``descr`` (e.g. ``'<f8'``), ``kind`` (``b`` bool,
    ``i``/``u`` integers, ``f`` float, ``c`` complex), ``shape``, ``fortran_order``, the data's
    size ``nbytes`` and its offset ``data_offset`` from the start of the array."""

    descr: str
    kind: str
    shape: Tuple[int, ...]
    fortran_order: bool
    nbytes: int
    data_offset: int


_NPY_DESCR = re.compile(r"[<>|=]?([biufc])(\d{1,2})")
_NPY_MAX_HEADER = 100_000


def read_npy_header(stream: BinaryIO, what: str) -> NpyHeader:
    """Parse the header of a ``.npy`` array at the stream's position, with no numpy: only
    plain numeric dtypes are accepted (no objects, strings or records), and the sizes it
    declares are computed exactly (a product of dimensions cannot overflow)."""
    magic = stream.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        raise ValueError(f"{what}: not a .npy array (no NumPy header)")
    major = magic[6]
    if major not in (1, 2, 3):
        raise ValueError(f"{what}: unknown .npy format version {major}.{magic[7]}")
    size_bytes = 2 if major == 1 else 4
    raw = stream.read(size_bytes)
    if len(raw) < size_bytes:
        raise ValueError(f"{what}: truncated .npy header")
    length = struct.unpack("<H" if major == 1 else "<I", raw)[0]
    if length > _NPY_MAX_HEADER:
        raise ValueError(f"{what}: .npy header of {length} bytes is implausibly long")
    text = read_exactly(stream, length, f"{what} (.npy header)")
    try:
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
        raise ValueError(f"{what}: unreadable .npy header") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"{what}: a .npy header must hold exactly descr, fortran_order and shape")
    descr, shape, fortran = header["descr"], header["shape"], header["fortran_order"]
    match = _NPY_DESCR.fullmatch(descr) if isinstance(descr, str) else None
    if match is None:
        raise ValueError(f"{what}: holds {descr!r} data, not plain numbers (bool, integer or float)")
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"{what}: .npy shape {shape!r} is not a tuple of non-negative integers")
    if not isinstance(fortran, bool):
        raise ValueError(f"{what}: .npy fortran_order {fortran!r} is not a boolean")
    itemsize = int(match.group(2))
    nbytes = math.prod(shape) * itemsize
    return NpyHeader(descr, match.group(1), shape, fortran, nbytes, 8 + size_bytes + length)
