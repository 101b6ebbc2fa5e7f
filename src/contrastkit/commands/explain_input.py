"""What ``contrastkit explain`` is asked: similarities typed on the command line or a similarity
matrix file (.npy, CSV or whitespace-separated text), the positives, the temperatures and the
sigmoid loss's bias, checked and parsed into a :class:`Request`. Nothing here imports torch, so
a mistake is reported before the library loads."""

from __future__ import annotations

import argparse
import io
import math
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from contrastkit._io import memory_guard, open_input, read_exactly, read_npy_header
from contrastkit.commands.errors import first_line

__all__ = ["DEFAULT_SCORES", "DEFAULT_TAU", "Request", "request_from_args", "parse_bias", "load_matrix"]

# The worked example of the course page P10: one query, three candidates, the first is the positive.
DEFAULT_SCORES = (1.0, 0.5, 0.0)
DEFAULT_TAU = 0.5


def _split_list(tokens: Sequence[str], what: str) -> List[str]:
    """The items of numbers separated by commas and/or spaces; an empty item between commas
    (``1,,2``, a trailing ``,``) is refused rather than skipped, as it may be a lost number."""
    text = " ".join(tokens)
    items: List[str] = []
    if not text.strip():
        return items
    for part in text.split(","):
        if not part.strip():
            raise ValueError(f"{what} list {text.strip()!r} has an empty entry (two commas in a row, or a "
                             "comma at an end)")
        items.extend(part.split())
    return items


def _parse_floats(tokens: Sequence[str], what: str) -> List[float]:
    values = []
    for part in _split_list(tokens, what):
        try:
            values.append(float(part))
        except ValueError:
            raise ValueError(f"{what} {part!r} is not a number") from None
    return values


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {text!r}") from None


def _parse_taus(text: Optional[str]) -> List[float]:
    if text is None:
        return [DEFAULT_TAU]
    taus = _parse_floats([text], "--tau value")
    if not taus:
        raise ValueError("--tau is empty: give a temperature such as 0.5 or a list such as 1,0.5,0.1")
    for tau in taus:
        if not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"--tau values must be positive and finite, got {tau:g}")
    return taus


def _parse_positive_map(text: str) -> List[int]:
    parts = _split_list([text], "--positives") if text.strip(", ") else []
    if not parts:
        raise ValueError("--positives is empty: give one column per row, e.g. 1,0,3,2")
    return [_parse_int(p, "--positives entry") for p in parts]


def _read_npy(handle, what: str) -> np.ndarray:
    """A real matrix from a .npy file whose header is checked (dtype, and a declared size that
    matches the file) before its data are read."""
    header = read_npy_header(handle, what)
    if header.kind == "c":
        raise ValueError(f"{what}: holds complex numbers ({header.descr}); similarities must be real "
                         "(save the real part if that is what you mean)")
    held = os.fstat(handle.fileno()).st_size - header.data_offset
    if held != header.nbytes:
        raise ValueError(f"{what}: its header declares shape {header.shape} ({header.nbytes} bytes of "
                         f"{header.descr}) but the file holds {held} bytes")
    data = np.frombuffer(read_exactly(handle, header.nbytes, what), dtype=np.dtype(header.descr))
    return data.reshape(header.shape, order="F" if header.fortran_order else "C")


def load_matrix(path: str) -> np.ndarray:
    """Read a similarity matrix from .npy or from CSV/whitespace-separated text (``#`` comments).

    Only a regular file within the input ceiling is read (``$CONTRASTKIT_MAX_INPUT_BYTES``,
    see :func:`contrastkit._io.max_input_bytes`); a device, FIFO, complex or non-numeric
    array is refused before its data are read.
    """
    what = f"--matrix {path}"
    if not os.path.lexists(path):
        raise FileNotFoundError(f"--matrix file not found: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"--matrix {path} is a directory, not a file")
    try:
        lower = path.lower()
        if lower.endswith(".npz"):
            raise ValueError("a .npz archive holds several arrays; save the matrix alone as .npy or CSV")
        with memory_guard(what), open_input(path, what) as handle:
            if lower.endswith(".npy"):
                data = _read_npy(handle, what)
            else:
                text = read_exactly(handle, os.fstat(handle.fileno()).st_size, what, exact=False).decode("utf-8")
                delimiter = "," if "," in text else None
                data = np.loadtxt(io.StringIO(text), delimiter=delimiter, comments="#", ndmin=2, dtype=np.float64)
            data = np.asarray(data, dtype=np.float64)
    except (ValueError, TypeError, OSError, UnicodeDecodeError) as err:
        message = first_line(err)
        if message.startswith(what):  # already names the file
            raise ValueError(message) from None
        raise ValueError(f"{what}: cannot read a numeric matrix: {message}") from None
    if data.ndim != 2 or data.shape[0] != data.shape[1]:
        raise ValueError(f"--matrix {path}: expected a square (N, N) similarity matrix, got shape {data.shape}")
    return data


@dataclass
class Request:
    """What to explain, in the arguments of :func:`contrastkit.analysis.explain`."""

    similarities: object  # the scores of one query (a list) or a square matrix (an array)
    positive: object  # the positive's index, or each row's positive column
    exclude_diagonal: bool  # NT-Xent's self-similarity left out of the denominator (--positives)
    taus: List[float]
    is_matrix: bool
    row: Optional[int]  # --row: the anchor whose every candidate is shown
    description: str  # what was given, for the headings


def request_from_args(args: argparse.Namespace) -> Request:
    """The request of ``contrastkit explain``'s arguments; ValueError (or FileNotFoundError for a
    missing --matrix file) naming the option that is wrong."""
    taus = _parse_taus(args.tau)
    if args.matrix is None:
        for flag, value in (("--positives", args.positives), ("--diagonal", args.diagonal), ("--row", args.row)):
            if value:
                raise ValueError(f"{flag} needs --matrix FILE")
        scores = _parse_floats(args.scores, "similarity")
        if not args.scores:
            scores = list(DEFAULT_SCORES)
            description = "worked example (course page P10)"
        else:
            description = "one query"
        if not scores:
            raise ValueError("no similarities given")
        positive = 0 if args.positive is None else _parse_int(args.positive, "--positive")
        if not 0 <= positive < len(scores):
            raise ValueError(f"--positive must be in [0, {len(scores)}) for {len(scores)} candidates, got {positive}")
        return Request(scores, positive, False, taus, False, None, description)
    if args.scores:
        raise ValueError("give either similarities S... or --matrix FILE, not both")
    if args.positive is not None:
        raise ValueError("--positive is for a single row; with --matrix use --positives MAP or --diagonal")
    if not args.positives and not args.diagonal:
        raise ValueError("--matrix needs --positives MAP (self-similarity, diagonal excluded) or --diagonal")
    matrix = load_matrix(args.matrix)
    n = matrix.shape[0]
    if args.diagonal:
        positive, exclude, kind = list(range(n)), False, "positives on the diagonal"
    else:
        positive = _parse_positive_map(args.positives)
        if len(positive) != n:
            raise ValueError(f"--positives has {len(positive)} entries but the matrix has {n} rows")
        bad = [p for p in positive if not 0 <= p < n]
        if bad:
            raise ValueError(f"--positives has columns out of range [0, {n}): {bad[:5]}")
        selfs = [i for i, p in enumerate(positive) if p == i]
        if selfs:
            raise ValueError(f"--positives maps rows {selfs[:5]} to themselves; the diagonal is excluded "
                             "with --positives (use --diagonal for positives on the diagonal)")
        exclude, kind = True, "diagonal excluded"
    row = None
    if args.row is not None:
        row = _parse_int(args.row, "--row")
        if not 0 <= row < n:
            raise ValueError(f"--row must be in [0, {n}), got {row}")
    return Request(matrix, positive, exclude, taus, True, row, f"{n}x{n} matrix from {args.matrix}, {kind}")


def parse_bias(args: argparse.Namespace) -> Optional[float]:
    """The --bias of the sigmoid loss, or None when it is not given (the library's default applies:
    SigLIP's initialisation)."""
    if args.bias is None:
        return None
    if not args.sigmoid:
        raise ValueError("--bias needs --sigmoid")
    values = _parse_floats([args.bias], "--bias")
    if len(values) != 1 or not math.isfinite(values[0]):
        raise ValueError(f"--bias must be one finite number, got {args.bias!r}")
    return values[0]
