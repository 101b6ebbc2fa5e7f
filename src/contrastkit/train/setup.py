"""Where a run computes: its device and CPU threads (training, re-evaluation, export)."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Iterator, Optional

import torch
from torch import nn

__all__ = ["resolve_device", "limit_threads", "resolve_threads", "compile_encoder", "compile_failure", "eager_calls"]


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


def _cxx_compiler() -> str:
    """The C++ compiler torch.compile's inductor backend would build its kernels with (``$CXX``,
    else ``g++``, ``clang++`` or ``c++`` on the PATH), or ``""`` when there is none."""
    for name in (os.environ.get("CXX", ""), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    return ""


def compile_encoder(encoder: nn.Module) -> nn.Module:
    """Compile ``encoder`` in place for the training steps (``nn.Module.compile``: torch.compile
    with the inductor backend, on CPU and CUDA alike): its parameters and state-dict keys stay
    the module's own, so checkpoints, ``probe`` and ``embed`` read it as an uncompiled one.
    The first step pays the compilation (seconds to minutes; cached on disk by torch for the
    next run). ``ValueError`` when this torch or machine cannot compile: torch older than 2.6,
    or no C++ compiler for inductor's kernels."""
    if not hasattr(nn.Module, "compile") or not hasattr(torch.compiler, "set_stance"):
        raise ValueError(f"--compile needs torch >= 2.6 (nn.Module.compile, torch.compiler.set_stance); this is "
                         f"torch {torch.__version__}")
    if not _cxx_compiler():
        raise ValueError("--compile needs a C++ compiler for torch.compile's inductor kernels (none of $CXX, g++, "
                         "clang++, c++ is on the PATH): install one (e.g. apt install g++) or train without --compile")
    encoder.compile()
    return encoder


def compile_failure(err: BaseException) -> Optional[ValueError]:
    """The one-line error for ``err`` when it is torch.compile failing to build the encoder's
    kernels (dynamo's ``BackendCompilerFailed``, inductor's errors: a toolchain that cannot build
    for this CPU, an operator inductor cannot lower), else ``None``. Raised from the training step
    of a ``--compile`` run, so that the user reads what failed and what to do instead of torch's
    traceback (``contrastkit --traceback`` still shows it)."""
    module = type(err).__module__ or ""
    if not (module.startswith("torch._dynamo") or module.startswith("torch._inductor")):
        return None
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line for line in lines if not line.startswith("backend=")), lines[0] if lines else "")
    return ValueError(f"--compile: torch.compile could not build the encoder's kernels on this machine "
                      f"({type(err).__name__}: {cause[:300]}); train without --compile")


@contextlib.contextmanager
def eager_calls(enabled: bool = True) -> Iterator[None]:
    """Run compiled modules eagerly inside (``torch.compiler.set_stance("force_eager")``): the
    read-out calls the encoder on other batch sizes and without gradients, which would each
    compile again for a handful of calls. A no-op when ``enabled`` is false."""
    if not enabled:
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield
