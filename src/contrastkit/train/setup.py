"""Where a run computes: its device and CPU threads (training, re-evaluation, export)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

__all__ = ["resolve_device", "limit_threads", "resolve_threads"]


def resolve_threads(threads: int) -> int:
    """The CPU threads a run with ``threads`` uses: ``threads`` itself, or for ``0`` (the
    default of ``PretrainConfig.threads``) the cores this process may run on
    (``os.sched_getaffinity``, which honours ``taskset`` and container CPU sets), else torch's
    own choice where the platform has no affinity call.

    On a CPU shared with other jobs, OpenMP threads that spin-wait for each other can make a
    multi-threaded step several times slower than a 1-thread one (benchmarks/RESULTS_train.md);
    ``OMP_WAIT_POLICY=PASSIVE`` in the environment, or ``threads=1``, avoids that.
    """
    if threads:
        return int(threads)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return torch.get_num_threads()


@contextlib.contextmanager
def limit_threads(threads: int) -> Iterator[None]:
    """Run with :func:`resolve_threads` ``(threads)`` CPU threads for torch and for the
    BLAS/OpenMP pools scikit-learn uses; the previous settings come back afterwards."""
    threads = resolve_threads(threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # comes with scikit-learn; without it only torch is limited
            yield
        else:
            with threadpool_limits(limits=threads):
                yield
    finally:
        torch.set_num_threads(previous)


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; anything else must be a valid, present device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {name!r} is not a valid torch device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device
