"""A simulated disk under one folder, for a child process that runs a command (imported there:
its ``open`` is replaced, which no test process should see).

:func:`install` makes every file opened for writing under ``folder`` (through ``open`` /
``io.open``, which ``pathlib``, ``csv``, ``json``, PIL and torch's file writes use) share a
``budget`` of bytes: the write that crosses it writes what fits and raises ``OSError(ENOSPC)``
as the kernel's would (naming no file), and so does every write after it, as a full disk stays
full (``budget`` -1: no limit, only counted). With ``mode`` ``"read-only"`` opening a file there
to write, or making a folder there, raises ``OSError(EROFS)`` naming it. What is written
elsewhere, or by code that does not go through Python's ``open`` (a library's own C writer),
is not held to it.
"""

import builtins
import errno
import io
import os

__all__ = ["install"]


def install(folder, mode="full", budget=-1):
    """Put ``folder`` on the simulated disk; returns ``(state, undo)``: ``state["written"]``
    counts the bytes written under it, ``state["opened"]`` lists ``[file relative to folder,
    bytes written before it was opened, bytes written to it]`` per opening; ``undo()`` restores
    the real ``open`` and ``mkdir``."""
    root = os.path.realpath(folder)
    state = {"left": budget, "written": 0, "opened": []}
    real_open, real_makedirs, real_mkdir = io.open, os.makedirs, os.mkdir

    def under(path):
        try:
            path = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return path == root or path.startswith(root + os.sep)

    class Disk:
        """A file opened for writing under ``folder``."""

        def __init__(self, handle, name):
            self._handle = handle
            self._event = [name, state["written"], 0]
            state["opened"].append(self._event)

        def write(self, data):
            size = len(data)
            state["written"] += size
            self._event[2] += size
            if budget >= 0 and size > state["left"]:
                fits, state["left"] = max(state["left"], 0), 0
                if fits:
                    self._handle.write(data[:fits])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            state["left"] -= size
            return self._handle.write(data)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def __enter__(self):
            self._handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

        def __iter__(self):
            return iter(self._handle)

        def __getattr__(self, name):
            return getattr(self._handle, name)

    def disk_open(file, mode_="r", *args, **kwargs):
        writes = isinstance(file, (str, bytes, os.PathLike)) and any(m in mode_ for m in "wax+") and under(file)
        if writes and mode == "read-only":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(file))
        handle = real_open(file, mode_, *args, **kwargs)
        return Disk(handle, os.path.relpath(os.path.realpath(os.fsdecode(file)), root)) if writes else handle

    def refusing(real):
        def make(path, *args, **kwargs):
            if under(path) and not os.path.isdir(path):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
            return real(path, *args, **kwargs)
        return make

    builtins.open = io.open = disk_open
    if mode == "read-only":
        os.makedirs, os.mkdir = refusing(real_makedirs), refusing(real_mkdir)

    def undo():
        builtins.open = io.open = real_open
        os.makedirs, os.mkdir = real_makedirs, real_mkdir

    return state, undo
