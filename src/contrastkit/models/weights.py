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

Every file of the user's that contrastkit reads with ``torch.load`` (weights, a run's
checkpoints) goes through :func:`load_tensors`, which reads with ``weights_only=True`` and says
in its own words why a file cannot be read: damaged, or pickling an object (named). torch's
own message advises loading such a file with ``weights_only=False``, which runs whatever code
the file holds, and is never passed on.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from contrastkit._io import one_line, open_input
from contrastkit.extras import import_extra
from contrastkit.manifest import file_sha256

__all__ = ["WeightsReport", "read_state_dict", "load_encoder_weights", "NESTED_KEYS", "TensorFileError",
           "load_tensors"]

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


class TensorFileError(ValueError):
    """A file :func:`load_tensors` cannot read. ``reason``: why, in a few words (never torch's
    advice to load with ``weights_only=False``); ``pickled_class``: the class or function the
    file pickles when that is why (the file holds more than tensors), else ``None``."""

    def __init__(self, reason: str, pickled_class: Optional[str] = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pickled_class = pickled_class


# What torch's weights-only unpickler says when a file pickles a class it does not allow.
_PICKLED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNPICKLER_SAYS = re.compile(r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)", re.S)
# torch.save writes a zip archive (local file header "PK\3\4"); before torch 1.6 a pickle of
# protocol 2 (PROTO opcode 0x80, then the protocol) followed by the tensors' bytes.
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOLS = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))


def _head(source: Union[str, BinaryIO], size: int) -> bytes:
    if isinstance(source, str):
        with open(source, "rb") as handle:
            return handle.read(size)
    start = source.tell()
    head = source.read(size)
    source.seek(start)
    return head


def _why_unreadable(err: BaseException) -> TensorFileError:
    message = str(err)
    pickled = _PICKLED_GLOBAL.search(message)
    if pickled:
        return TensorFileError(f"it pickles {pickled.group(1)}, an object rather than tensors, containers or numbers",
                               pickled.group(1))
    said = _UNPICKLER_SAYS.search(message)
    detail = " ".join(said.group(1).split()) if said else one_line(err).split(". ")[0]  # torch's first sentence
    if "weights_only" in detail or "trust" in detail or not detail:  # torch's advice, not a reason
        detail = ""
    return TensorFileError(f"damaged: {type(err).__name__}" + (f": {detail}" if detail else ""))


def load_tensors(source: "Union[str, os.PathLike[str], BinaryIO]") -> Any:
    """``torch.load(source, map_location="cpu", weights_only=True)``: what a ``torch.save`` file
    holds, when that is tensors, containers and numbers only (no code runs while reading).

    Raises:
        TensorFileError: (a ``ValueError``) the file is not a ``torch.save`` file, is damaged,
            or pickles an object (``pickled_class`` names it); the message is a few words to
            put after the file's name, never torch's advice to load with ``weights_only=False``.
        OSError: the file cannot be opened.
    """
    if not hasattr(source, "read"):
        source = os.fspath(source)
    head = _head(source, 4)  # type: ignore[arg-type]
    if not (head.startswith(_ZIP_MAGIC) or head[:2] in _PICKLE_PROTOCOLS):
        raise TensorFileError("damaged or another kind of file: it is neither the zip archive torch.save writes "
                              "nor an older torch.save pickle")
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as err:  # torch raises many types for a damaged file (UnpicklingError, IndexError, ...)
        raise _why_unreadable(err) from None


def read_state_dict(path: "str | os.PathLike[str]") -> Dict[str, Tensor]:
    """The tensors of the weights file ``path`` by key (see the module's description);
    ``FileNotFoundError`` / ``ValueError`` naming the file when it is missing, cannot be read
    without running code, or holds no tensors."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"encoder weights file {path} does not exist")
    with open_input(path, f"encoder weights file {path}") as handle:  # a FIFO, /dev/zero: refused unread
        return _read_tensors(path, handle)


def _read_tensors(path: str, handle: BinaryIO) -> Dict[str, Tensor]:
    """:func:`read_state_dict` of the file ``path``, opened as ``handle``."""
    if path.lower().endswith(".safetensors"):
        safetensors = import_extra("safetensors.torch", "safetensors", f"--encoder-weights {path}", "safetensors")
        try:
            return dict(safetensors.load_file(path, device="cpu"))
        except Exception as err:  # safetensors raises its own SafetensorError on a damaged file
            raise ValueError(f"encoder weights file {path} is not a readable .safetensors file ({_line(err)})") from None
    try:
        stored = load_tensors(handle)
    except TensorFileError as err:
        if err.pickled_class is not None:
            raise ValueError(f"encoder weights file {path} holds more than tensors ({err.reason}; contrastkit does "
                             "not unpickle objects, as that could run code): save module.state_dict() with "
                             "torch.save, or a .safetensors file") from None
        raise ValueError(f"encoder weights file {path} is not a readable PyTorch/safetensors weights file "
                         f"({err.reason})") from None
    except OSError as err:
        raise ValueError(f"encoder weights file {path} cannot be read ({_line(err)})") from None
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
