"""Which errors of a command are the user's to fix, and how they read on one line.

contrastkit reports bad input by raising ValueError (a value, a file's contents), TypeError
(a value of the wrong kind: "temperature must be a number, got str"), :class:`UsageError`
(options that do not go together) or an ``OSError`` about a file the user named; the command
line prints those as one line. A TypeError is also how Python reports a bug (a call with the
wrong arguments, ``None[0]``, ``1 + "a"``), so a TypeError counts as the user's only when a
``raise`` statement in contrastkit's own code raised it: a TypeError that Python or another
library raised keeps its traceback. A full disk or an exceeded quota (``ENOSPC``, ``EDQUOT``)
and a read-only file system (``EROFS``) are the user's to fix too, wherever they happened.
"""

from __future__ import annotations

import dis
import errno
import types

from contrastkit._io import DISK_FULL  # (a full disk or quota: the one definition, shared with the trainer)
from contrastkit.commands.common import UsageError

__all__ = ["FILE_ERRORS", "DISK_FULL", "READ_ONLY", "is_user_error", "raised_by_contrastkit", "first_line"]

#: The errors about a file or folder the user named (missing, a folder, not allowed, in the way).
FILE_ERRORS = (FileNotFoundError, IsADirectoryError, PermissionError, FileExistsError)
#: The ``errno`` of an ``OSError`` that says the file system of a file to write is read-only (an
#: ``--out`` on a read-only mount, not a permission: root meets it too).
READ_ONLY = (errno.EROFS,)


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` reports a mistake in the user's input (see the module's description)."""
    if isinstance(err, (UsageError, ValueError) + FILE_ERRORS):
        return True
    if isinstance(err, OSError) and err.errno in DISK_FULL + READ_ONLY:
        return True
    return isinstance(err, TypeError) and raised_by_contrastkit(err)


def raised_by_contrastkit(err: BaseException) -> bool:
    """Whether a ``raise`` statement in a contrastkit module raised ``err`` (the innermost frame of
    its traceback); not when Python raised it inside contrastkit's code, or another library did."""
    trace = err.__traceback__
    if trace is None:
        return False
    while trace.tb_next is not None:
        trace = trace.tb_next
    module = trace.tb_frame.f_globals.get("__name__", "")
    if module != "contrastkit" and not module.startswith("contrastkit."):
        return False
    return _is_raise(trace.tb_frame.f_code, trace.tb_lasti)


def _is_raise(code: types.CodeType, offset: int) -> bool:
    # A raise statement is the one instruction RAISE_VARARGS; an operation that fails is another
    # (a call, a subscript, an addition).
    return any(instruction.offset == offset and instruction.opname == "RAISE_VARARGS"
               for instruction in dis.get_instructions(code))


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
