"""A child Python process under a memory limit, for tests that feed contrastkit hostile input:
an unbounded read then fails the test (a MemoryError, a dead child or no answer in time)
instead of exhausting the machine.

The child first imports what every call needs (torch, numpy, PIL, contrastkit's readers, CLI
and trainer), measures its private data size (``VmData``: heap, anonymous mappings, the
writable data of loaded libraries) and only then sets ``RLIMIT_DATA`` to that baseline plus
:data:`DATA_BUDGET` = 1 GiB. The limit is relative because the baseline depends on the torch
build: a CPU build maps about 0.8 GiB of address space at import, a CUDA-enabled one (PyPI's
Linux wheel) over 3 GiB, of which about 0.7 GiB is private data, so a fixed address-space
limit (``RLIMIT_AS``) of 2 GiB starves one build and is loose for the other.
``RLIMIT_DATA`` counts what a parser allocates (malloc, numpy and torch buffers, Python
objects), touched or not, so a loader that believed a header claiming gigabytes fails at the
allocation, as it did under an address-space limit; it does not count file-backed shared
mappings (bounded by the file, which :data:`CEILING` bounds) or code.
``tests/test_bounded_child.py`` shows that an unbounded allocation is caught.

The input ceiling in the child is :data:`CEILING`, so that what contrastkit legitimately reads
always fits under the limit.

The child answers calls (one JSON line each) of the functions in ``calls`` below; each
answer says whether the call returned or which exception it raised, with its message.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional

import pytest

import contrastkit

DATA_BUDGET = 2**30
CEILING = 256 * 2**20
SRC = os.path.dirname(os.path.dirname(os.path.abspath(contrastkit.__file__)))
#: This folder: the children import the test helpers from it (``_disk``).
TESTS = os.path.dirname(os.path.abspath(__file__))

_CHILD = textwrap.dedent('''
    import resource, sys, os
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the code under test prints goes to stderr, not into the answers
    import contextlib, io, json, traceback, warnings
    import numpy, PIL.Image, torch
    torch.set_num_threads(1)
    import contrastkit.cli, contrastkit.commands.explain_input, contrastkit.data.files
    import contrastkit.data.paired_csv, contrastkit.models.weights, contrastkit.train, contrastkit.train.checkpoint

    def status(key):
        with open("/proc/self/status") as lines:
            for line in lines:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} in /proc/self/status")

    # the limit counts from what the imports left: the same budget whatever the torch build maps
    limit = status("VmData") + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    resident_at_start = status("VmRSS")

    def cli(*argv):
        from contrastkit.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exit:  # argparse's usage error: its usage and one error line, status 2
                code = exit.code
        return {"rc": code, "out": out.getvalue(), "err": err.getvalue()}

    def cli_on_disk(out, mode, budget, *argv):
        """:func:`cli` with the folder ``out`` on a simulated disk (``tests/_disk.py``) that is
        read-only (``mode`` "read-only") or has ``budget`` bytes free (``mode`` "full")."""
        import _disk
        _, undo = _disk.install(out, mode, budget)
        try:
            return cli(*argv)
        finally:
            undo()

    def load_path(path, options):
        from contrastkit.data.files import load_path
        ds = load_path(path, **options)
        return [len(ds.train), len(ds.val), len(ds.test), list(ds.image_shape)]

    def open_and_read(path, options):
        """Open ``path`` as ``--data`` (open_data) and decode every image of every split:
        ``{"rows": {split: images read}, "sizes": {split: len}, "skipped": skipped_files lines}``."""
        from contrastkit.data import image_batches, open_data, skipped_files
        ds = open_data(path, **options)
        rows = {name: sum(int(batch.shape[0]) for batch in image_batches(getattr(ds, name), batch_size=16))
                for name in ("train", "val", "test")}
        skipped = skipped_files(ds) if hasattr(ds, "splits") else []
        return {"rows": rows, "sizes": {name: len(getattr(ds, name)) for name in rows}, "skipped": skipped}

    def read_state_dict(path):
        from contrastkit.models.weights import read_state_dict
        return len(read_state_dict(path))

    def load_pair_csv(path, options):
        from contrastkit.data.paired_csv import load_pair_csv
        ds = load_pair_csv(path, **options)
        return [len(ds.train), len(ds.val), len(ds.test)]

    def read_idx(path, ndim):
        from contrastkit.data.files import read_idx
        from pathlib import Path
        return list(read_idx(Path(path), ndim).shape)

    def load_matrix(path):
        from contrastkit.commands.explain_input import load_matrix
        return list(load_matrix(path).shape)

    def load_checkpoint(path):
        from contrastkit.train.checkpoint import load_checkpoint
        return load_checkpoint(path)["epoch"]

    def pretrain(config):
        from contrastkit.train import PretrainConfig, pretrain
        return pretrain(PretrainConfig(**config), progress=False)["epochs"]

    def peak():
        """How far the resident memory rose above the child's start, at most (bytes)."""
        return status("VmHWM") - resident_at_start

    def hog(kind, step, stop):
        """Allocate without bound, as a careless parser would, until the limit stops it; stops
        itself (returns the bytes held) at ``stop`` bytes so a missing limit fails the test, not
        the machine."""
        held = []
        while sum(len(chunk) for chunk in held) < stop:
            if kind == "bytearray":
                held.append(bytearray(step))
            elif kind == "numpy":
                held.append(numpy.zeros(step, dtype=numpy.uint8))
            else:
                held.append(torch.empty(step, dtype=torch.uint8).numpy())
        return sum(len(chunk) for chunk in held)

    def budget():
        """Bytes the child may still allocate: the limit minus its data size now."""
        return resource.getrlimit(resource.RLIMIT_DATA)[0] - status("VmData")

    calls = dict(cli=cli, cli_on_disk=cli_on_disk, load_path=load_path, open_and_read=open_and_read, read_state_dict=read_state_dict,
                 load_pair_csv=load_pair_csv, read_idx=read_idx,
                 load_matrix=load_matrix, load_checkpoint=load_checkpoint, pretrain=pretrain, peak=peak,
                 hog=hog, budget=budget)
    answers.write("ready\\n")
    for line in sys.stdin:
        name, args = json.loads(line)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                answer = {"returned": calls[name](*args)}
            except BaseException as err:  # a MemoryError is a finding, not a reason to stop
                answer = {"raised": type(err).__name__, "classes": [c.__name__ for c in type(err).__mro__],
                          "message": str(err),
                          "traceback": traceback.format_exc()[-3000:]}
        answer["warnings"] = [str(w.message) for w in caught]
        answers.write(json.dumps(answer) + "\\n")
''')


class BoundedWorker:
    """One child process under the limit; :meth:`call` runs a function there."""

    def __init__(self, ceiling: int = CEILING, env: Optional[Dict[str, str]] = None) -> None:
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, TESTS]), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                        MALLOC_ARENA_MAX="2", CONTRASTKIT_MAX_INPUT_BYTES=str(ceiling), **(env or {}))
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD, str(DATA_BUDGET)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env=self.env)
        assert self._read_line(120) == "ready", "the bounded child did not start"

    def _read_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise AssertionError(f"no answer within {timeout} s: an unbounded read or a hang")
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise AssertionError(f"the bounded child died (exit status {code}): a crash or the memory limit")
        return line.strip()

    def call(self, name: str, *args: Any, timeout: float = 60) -> Dict[str, Any]:
        """``{"returned": value}`` or ``{"raised": type name, "message": ..., "traceback": ...}``,
        plus ``"warnings"``. A child that died or hung in an earlier call is replaced first."""
        if self.process.poll() is not None:
            self._start()
        self.process.stdin.write(json.dumps([name, list(args)]) + "\n")
        self.process.stdin.flush()
        return json.loads(self._read_line(timeout))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def worker():
    """A :class:`BoundedWorker` shared by the tests of a module (import this fixture)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the bounded child needs Linux (/proc/self/status, RLIMIT_DATA on every mapping)")
    child = BoundedWorker()
    yield child
    child.close()


def fuzz_settings(examples: int = 15):
    """Few examples, no deadline (each one is a round trip to the child);
    ``CONTRASTKIT_FUZZ_EXAMPLES=500`` runs a deeper search."""
    from hypothesis import HealthCheck, settings

    return settings(max_examples=int(os.environ.get("CONTRASTKIT_FUZZ_EXAMPLES", examples)), deadline=None,
                    suppress_health_check=list(HealthCheck))


def assert_clean(answer: Dict[str, Any], names: str, allowed=("ValueError", "FileNotFoundError")) -> None:
    """The call returned, or raised one of ``allowed`` whose one-line message names ``names``."""
    if "returned" in answer:
        return
    assert set(answer["classes"]) & set(allowed), answer.get("traceback", answer)
    message = answer["message"]
    assert "\n" not in message.strip() and names in message, message


def assert_cli_error(answer: Dict[str, Any], command: str, names: str) -> str:
    """The CLI call exited with status 2 after one error line naming ``names``; returns it."""
    assert "returned" in answer, answer.get("traceback", answer)
    result = answer["returned"]
    assert result["rc"] == 2, result
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1, result["err"]
    assert lines[0].startswith(f"contrastkit {command}: error: ") and names in lines[0], lines[0]
    assert "Traceback" not in result["err"]
    return lines[0]


# ------------------------------------------------------------------------------ damaged files

def damage(data: bytes, header: int = 64):
    """A hypothesis strategy of ``data`` damaged as a careless copy or a hostile user would:
    truncated, bits flipped (anywhere, or in the first ``header`` bytes where sizes are
    declared), a big-endian 32-bit field in the header overwritten, garbage appended, or the
    file grown past the input ceiling (``("oversize", data)``: write it sparse)."""
    from hypothesis import strategies as st

    n = len(data)

    def flipped(spots):
        out = bytearray(data)
        for position, bit in spots:
            out[position] ^= 1 << bit
        return ("bytes", bytes(out))

    def field(spot):
        position, value = spot
        out = bytearray(data)
        out[position:position + 4] = value.to_bytes(4, "big")
        return ("bytes", bytes(out))

    bits = st.integers(0, 7)
    return st.one_of(
        st.integers(0, n - 1).map(lambda cut: ("bytes", data[:cut])),
        st.lists(st.tuples(st.integers(0, n - 1), bits), min_size=1, max_size=6).map(flipped),
        st.lists(st.tuples(st.integers(0, min(n, header) - 1), bits), min_size=1, max_size=3).map(flipped),
        st.tuples(st.integers(0, max(0, min(n, header) - 4)), st.integers(0, 2**32 - 1)).map(field),
        st.binary(min_size=1, max_size=256).map(lambda tail: ("bytes", data + tail)),
        st.just(("oversize", data)),
    )


def write_damaged(path, damaged) -> bytes:
    """Write what :func:`damage` drew to ``path``; returns the bytes (an oversize file is
    ``data`` then zeros up to one byte over :data:`CEILING`, sparse on disk)."""
    kind, data = damaged
    with open(path, "wb") as handle:
        handle.write(data)
        if kind == "oversize":
            handle.truncate(CEILING + 1)
    return data
