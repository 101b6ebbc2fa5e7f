"""Counting the reads of a tensor's value by Python (each a host sync on an accelerator), for the
tests of code that must not synchronise: on the CPU the same calls show where a GPU would wait."""

import contextlib
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch

READS = ("item", "__bool__", "__float__", "__int__", "tolist")
#: Every way Python code reads a tensor's value back: ``.item()``, ``bool(t)`` / ``if t``,
#: ``float(t)``, ``int(t)``, ``t`` as an index, ``.tolist()``, ``.cpu()``, ``.numpy()`` and
#: printing or formatting it.
SYNC_READS = READS + ("__index__", "cpu", "numpy", "__repr__", "__str__", "__format__")


@contextlib.contextmanager
def counted_reads():
    """Every call of :data:`READS` on any tensor while the block runs, by name, in order."""
    calls = []
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name):
        def wrapper(self, *args, **kwargs):
            calls.append(name)
            return saved[name](self, *args, **kwargs)
        return wrapper

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield calls
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


@dataclass
class Read:
    """One read of :data:`SYNC_READS`: its ``name``, the ``tensor`` read (kept alive, so that
    identity comparisons hold), where it was called from (``file``, ``line``) and ``tag`` (what
    the recorder's ``tag`` held then, e.g. the training step)."""

    name: str
    tensor: Any
    file: str
    line: int
    tag: Any

    @property
    def where(self) -> str:
        short = self.file.split("site-packages/")[-1].split("/src/")[-1]
        return f"{self.name} at {short}:{self.line}"


class ReadRecorder:
    """While :attr:`on`, records every outermost read of :data:`SYNC_READS` (a read inside
    another, e.g. ``print`` formatting a tensor, counts once) as a :class:`Read` in
    :attr:`reads`, tagged with :attr:`tag`."""

    def __init__(self) -> None:
        self.on = False
        self.tag: Any = None
        self.reads = []
        self._local = threading.local()


@contextlib.contextmanager
def recorded_reads():
    """A :class:`ReadRecorder` whose recording the caller switches on and off (``recorder.on``);
    the tensor methods are patched for the block."""
    recorder = ReadRecorder()
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_READS}

    def recording(name):
        def wrapper(self, *args, **kwargs):
            depth = getattr(recorder._local, "depth", 0)
            if recorder.on and depth == 0:
                caller = sys._getframe(1)
                recorder.reads.append(Read(name, self, caller.f_code.co_filename, caller.f_lineno, recorder.tag))
            recorder._local.depth = depth + 1
            try:
                return saved[name](self, *args, **kwargs)
            finally:
                recorder._local.depth = depth
        return wrapper

    for name in SYNC_READS:
        setattr(torch.Tensor, name, recording(name))
    try:
        yield recorder
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)
