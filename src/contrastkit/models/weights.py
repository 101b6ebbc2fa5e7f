"""Starting an encoder from local weights (``--encoder-weights FILE``).

A weights file is a state dict saved by ``torch.save`` (``.pt``, ``.pth``, ``.bin``, ...,
read with ``weights_only=True``: tensors and containers only, no code runs), possibly nested
under ``state_dict`` or ``model`` (as training scripts and contrastkit's own checkpoints keep
it), or a ``.safetensors`` file (needs the safetensors package, ``pip install
'contrastkit[safetensors]'``).

The file's keys are matched to the encoder's: as they are, or without one prefix shared by
the keys that match once it is removed (``module.`` of DistributedDataParallel, ``encoder.`` of
a contrastkit checkpoint, ``backbone.`` ...), whichever matches more. Every matched tensor must
have the encoder's shape (a mismatch is refused naming the key); keys of the encoder that the
file lacks keep their initialisation (*missing*), keys of the file the encoder lacks are
ignored (*unexpected*, e.g. the classifier ``fc.weight`` of an ImageNet checkpoint), and both
are reported (:class:`WeightsReport`). A file none of whose keys match is refused.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from contrastkit._io import open_input
from contrastkit.extras import import_extra
from contrastkit.manifest import file_sha256

__all__ = ["WeightsReport", "read_state_dict", "load_encoder_weights", "NESTED_KEYS"]

#: Where a checkpoint may keep its state dict, looked for in this order (and again inside).
NESTED_KEYS = ("state_dict", "model")
_SHOWN = 5  # keys named in a one-line report


@dataclass(frozen=True)
class WeightsReport:
    """What :func:`load_encoder_weights` did: the file (``path``, ``sha256``), the encoder keys
    it set (``loaded``), the encoder keys it left at their initialisation (``missing``), the
    file's keys it ignored (``unexpected``, as the file spells them) and the ``prefix``
    removed from the file's keys (``""``: none)."""

    path: str
    sha256: str
    loaded: Tuple[str, ...]
    missing: Tuple[str, ...]
    unexpected: Tuple[str, ...]
    prefix: str = ""

    def summary(self) -> str:
        """One line: how many tensors were loaded, and the missing and unexpected keys."""
        prefix = f" (file keys without the prefix {self.prefix!r})" if self.prefix else ""
        return (f"encoder weights {self.path}: {len(self.loaded)} tensors loaded{prefix}; "
                f"{len(self.missing)} missing (left at their initialisation){_some(self.missing)}; "
                f"{len(self.unexpected)} unexpected (ignored){_some(self.unexpected)}")

    def to_dict(self) -> Dict[str, Any]:
        """A JSON record (lists for the key tuples)."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


def _some(keys: Sequence[str]) -> str:
    if not keys:
        return ""
    shown = ", ".join(keys[:_SHOWN])
    return f": {shown}" + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def read_state_dict(path: "str | os.PathLike[str]") -> Dict[str, Tensor]:
    """The tensors of the weights file ``path`` by key (see the module's description);
    ``FileNotFoundError`` / ``ValueError`` naming the file when it is missing, cannot be read
    without running code, or holds no tensors."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"encoder weights file {path} does not exist")
    with open_input(path, f"encoder weights file {path}") as handle:  # a FIFO, /dev/zero: refused unread
        return _read_tensors(path, handle)


def _read_tensors(path: str, handle: Any) -> Dict[str, Tensor]:
    """:func:`read_state_dict` of the file ``path`` opened as ``handle``."""
    if path.lower().endswith(".safetensors"):
        safetensors = import_extra("safetensors.torch", "safetensors", f"--encoder-weights {path}", "safetensors")
        try:
            return dict(safetensors.load_file(path, device="cpu"))
        except Exception as err:  # safetensors raises its own SafetensorError on a damaged file
            raise ValueError(f"encoder weights file {path} is not a readable .safetensors file ({_line(err)})") from None
    try:
        stored = torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"encoder weights file {path} holds more than tensors (torch.load with weights_only=True "
                         f"refused it: {_line(err)}); save module.state_dict() with torch.save, or a .safetensors "
                         "file") from None
    except MemoryError:
        raise  # not a damaged file's doing: never reported as one
    except Exception as err:  # a damaged file: torch's readers raise many kinds (IndexError, KeyError, ...)
        raise ValueError(f"encoder weights file {path} cannot be read as a torch.save file or .safetensors "
                         f"({_line(err)})") from None
    tensors = _state_dict(stored)
    if not tensors:
        raise ValueError(f"encoder weights file {path} holds no tensors (expected a state dict, possibly under "
                         f"{' or '.join(map(repr, NESTED_KEYS))}, or a .safetensors file)")
    return tensors


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _state_dict(stored: Any) -> Dict[str, Tensor]:
    """The tensors of a loaded object: a dict of tensors, or one nested under ``NESTED_KEYS``."""
    while isinstance(stored, dict):
        nested = next((stored[key] for key in NESTED_KEYS if isinstance(stored.get(key), dict)), None)
        if nested is None:  # a state dict's values are tensors: a dict under these keys is a nested one
            break
        stored = nested
    if not isinstance(stored, dict):
        return {}
    return {str(key): value for key, value in stored.items() if isinstance(value, Tensor)}


def _best_prefix(keys: Sequence[str], own: Dict[str, Tensor]) -> str:
    """The prefix whose removal makes most of ``keys`` the encoder's keys, when that is more
    than match as they are; else ``""``."""
    direct = sum(key in own for key in keys)
    counts: Counter = Counter()
    for key in keys:
        parts = key.split(".")
        for cut in range(1, len(parts)):
            if ".".join(parts[cut:]) in own:
                counts[".".join(parts[:cut]) + "."] += 1
                break
    if not counts:
        return ""
    prefix, hits = counts.most_common(1)[0]
    return prefix if hits > direct else ""


def load_encoder_weights(module: nn.Module, path: "str | os.PathLike[str]") -> WeightsReport:
    """Copy the tensors of the weights file ``path`` into ``module`` (in place) and report
    what matched (:class:`WeightsReport`; see the module's description).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file that cannot be read, no key that matches, or a matched key whose
            shape differs from the encoder's (named, with both shapes).
    """
    path = os.path.abspath(os.fspath(path))
    tensors = read_state_dict(path)
    own = module.state_dict()
    prefix = _best_prefix(list(tensors), own)
    matched: Dict[str, Tensor] = {}
    unexpected: List[str] = []
    for key, value in tensors.items():
        name = key[len(prefix):] if prefix and key.startswith(prefix) else (None if prefix else key)
        if name is None or name not in own:
            unexpected.append(key)
            continue
        if tuple(value.shape) != tuple(own[name].shape):
            raise ValueError(f"encoder weights file {path}: {key} has shape {tuple(value.shape)}, the encoder's "
                             f"{name} has shape {tuple(own[name].shape)} (another architecture, width or number "
                             "of input channels?); nothing was loaded")
        matched[name] = value
    if not matched:
        raise ValueError(f"encoder weights file {path}: none of its {len(tensors)} keys ({_some(list(tensors))[2:]}) "
                         f"is a key of the encoder ({_some(list(own))[2:]}); nothing was loaded")
    module.load_state_dict(matched, strict=False)
    missing = tuple(key for key in own if key not in matched)
    return WeightsReport(path, file_sha256(path), tuple(matched), missing, tuple(unexpected), prefix)
