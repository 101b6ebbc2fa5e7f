"""Atomic checkpoints that load with ``torch.load(weights_only=True)``.

Everything is stored as tensors, numbers, strings, lists and dicts (RNG states included), so
loading never unpickles arbitrary objects.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict

import numpy as np
import torch

__all__ = ["FORMAT", "VERSION", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]

FORMAT = "contrastkit-pretrain"
VERSION = 1
_REQUIRED = ("format", "version", "config", "model", "optimizer", "scheduler", "rng", "epoch", "step")


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


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["state"]), python_state["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str, payload: Dict[str, Any]) -> None:
    """Write ``payload`` (plus format tags) to ``path`` atomically: a temporary file in the
    same folder, flushed to disk, then ``os.replace`` (a crash leaves the old file intact)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, **payload}
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as handle:
        torch.save(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Load and check a checkpoint written by :func:`save_checkpoint`.

    Raises ``FileNotFoundError`` if ``path`` is missing and ``ValueError`` naming ``path`` if
    it is truncated, corrupt, or not a contrastkit pretraining checkpoint.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types (RuntimeError, UnpicklingError, EOFError, ...)
        raise ValueError(f"checkpoint {path} is corrupt or unreadable ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no detail'})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} is not a contrastkit pretraining checkpoint")
    if data.get("version") != VERSION:
        raise ValueError(f"checkpoint {path} has format version {data.get('version')!r}; "
                         f"this contrastkit reads version {VERSION}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ValueError(f"checkpoint {path} is incomplete: missing {missing}")
    return data
