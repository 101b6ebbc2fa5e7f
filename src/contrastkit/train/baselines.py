"""The read-out's baselines, computed once per data set and read-out protocol.

A run's ``summary.json`` compares the trained encoder with two baselines read out by the same
protocol: the raw pixels, and the same network at its random initialisation. Neither depends on
the training run: the raw pixels' numbers depend on the data and the protocol only, the
random-init encoder's also on the untrained network (its architecture and the seed's weights).
Yet every run recomputed them, and on 60,000 images they cost more than a training epoch (the
raw-pixel kNN alone is a 10,000 x 45,000 x C*H*W product). So they are kept, one small JSON file
per baseline (:func:`contrastkit.layout.baseline_file`), named by the SHA-256 of everything that
decides their numbers:

* the data: every split's images (the float32 values the read-out sees) and labels;
* the protocol: the C grid and the probe's stopping rules and cap (``probe_settings``), kNN
  ``k`` and temperature, the number of classes, and the source of the read-out's code (a
  change to it recomputes);
* for the random-init baseline: the encoder's class, its ``repr``, every tensor of its state
  (weights and buffers) and the device type it runs on;
* the versions of contrastkit and torch.

A baseline read from the cache has the numbers computed the first time, exactly; computing it
again with another thread count would give the same numbers to the probe's tolerance (float
reductions in another order), so the thread count is not part of the name. Files are written
atomically (two processes computing one baseline write the same content); a file that cannot be
read is reported, left alone and the baseline recomputed. Nothing here deletes a file: remove the
``baselines`` folder to empty the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from contrastkit import layout
from contrastkit.data import image_batches
from contrastkit.layout import CACHE_AUTO, CACHE_OFF, check_cache_setting as check_setting
from contrastkit.metrics import probe as probe_module

__all__ = ["CACHE_AUTO", "CACHE_OFF", "BaselineCache", "DataBaselines", "check_setting", "data_digest", "encoder_digest",
           "readout_protocol"]

#: What a cache file holds (checked on reading).
_FORMAT = "contrastkit-baseline/1"


def _source_digest(*modules: Any) -> str:
    """SHA-256 of the modules' source files (their version string where a source is missing)."""
    digest = hashlib.sha256()
    for module in modules:
        try:
            with open(module.__file__, "rb") as handle:
                digest.update(handle.read())
        except (OSError, TypeError):
            digest.update(str(getattr(module, "__name__", module)).encode())
    return digest.hexdigest()


def readout_protocol(knn_k: int, knn_temperature: float, num_classes: int) -> Dict[str, Any]:
    """What decides a baseline's numbers besides its features (part of every cache name)."""
    from contrastkit import __version__
    from contrastkit.data import on_device as on_device_module
    from contrastkit.metrics import bytes as bytes_module
    from contrastkit.metrics import readout as readout_module

    # Read from the module at call time: what the probe will use now.
    return {**probe_module.probe_settings(), "knn_k": int(knn_k), "knn_temperature": float(knn_temperature),
            "num_classes": int(num_classes), "code": _source_digest(probe_module, readout_module, bytes_module, on_device_module),
            "contrastkit": __version__, "torch": torch.__version__}


def _update(digest: "hashlib._Hash", tensor: torch.Tensor) -> None:
    array = tensor.detach().cpu().contiguous().numpy()
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(memoryview(array).cast("B"))


def data_digest(splits: Iterable[Tuple[Iterable[torch.Tensor], torch.Tensor]]) -> str:
    """SHA-256 of a data set as the read-out sees it: for each split, its image batches
    (float32, in order; the batching does not change the digest) and its ``(n,)`` labels."""
    digest = hashlib.sha256()
    for batches, labels in splits:
        count = 0
        for batch in batches:
            count += batch.shape[0]
            array = batch.detach().float().cpu().contiguous().numpy()
            digest.update(memoryview(array).cast("B"))
        digest.update(f"|{count} images|".encode())
        _update(digest, torch.as_tensor(labels).long())
    return digest.hexdigest()


def encoder_digest(encoder: nn.Module, device: torch.device) -> str:
    """SHA-256 of an untrained encoder: its class, ``repr``, state tensors and device type."""
    kind = type(encoder)
    digest = hashlib.sha256(f"{kind.__module__}.{kind.__qualname__}\n{encoder!r}\n{device.type}".encode())
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        _update(digest, tensor)
    return digest.hexdigest()


class BaselineCache:
    """The baselines kept in ``root`` (``None``: no cache, every baseline computed).

    Build one from a ``baseline_cache`` setting with :meth:`from_setting`."""

    def __init__(self, root: Optional[str]) -> None:
        self.root = None if root is None else os.fspath(root)
        self.hits = []  # what came from the cache in this object's life, in order

    @classmethod
    def from_setting(cls, setting: str) -> "BaselineCache":
        """``"auto"`` (the default root), ``"off"`` (none) or a folder (:func:`check_setting`)."""
        setting = check_setting(setting)
        if setting == CACHE_OFF:
            return cls(None)
        return cls(layout.default_cache_root() if setting == CACHE_AUTO else setting)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @staticmethod
    def key(kind: str, data: str, protocol: Dict[str, Any], encoder: Optional[str] = None) -> str:
        """The name of a baseline: ``kind`` (``raw_pixel`` / ``random_init``), the data digest,
        the protocol and (random-init) the encoder digest."""
        material = {"kind": kind, "data": data, "protocol": protocol, "encoder": encoder}
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def lookup(self, key: str) -> Optional[Dict[str, Any]]:
        """The numbers stored under ``key``, or ``None`` (absent, or unreadable: then a warning)."""
        if self.root is None:
            return None
        path = layout.baseline_file(self.root, key)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                stored = json.load(handle)
            if stored.get("format") != _FORMAT or stored.get("key") != key or not isinstance(stored.get("numbers"), dict):
                raise ValueError("not a contrastkit baseline of this name")
        except (OSError, ValueError, AttributeError) as err:
            warnings.warn(f"baseline cache file {path} cannot be used ({err}); computing the baseline "
                          f"(the file is left as it is: remove it to cache this baseline again)", stacklevel=2)
            return None
        return stored["numbers"]

    def store(self, key: str, kind: str, numbers: Dict[str, Any]) -> None:
        """Write ``numbers`` under ``key`` atomically; a cache that cannot be written is a
        warning, not a failure (the run has its numbers). An existing file is never replaced."""
        if self.root is None:
            return
        path = layout.baseline_file(self.root, key)
        if os.path.exists(path):
            return
        record = {"format": _FORMAT, "key": key, "kind": kind, "numbers": numbers}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=os.path.dirname(path))
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    json.dump(record, out, indent=2, sort_keys=True)
                    out.write("\n")
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)  # our own temporary file, never a finished one
                raise
        except OSError as err:
            warnings.warn(f"baseline cache {self.root} cannot be written ({err}); the baseline is not cached",
                          stacklevel=2)

    def get_or_compute(self, key: Optional[str], kind: str, compute: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        """The stored numbers of ``key``, or ``compute()`` stored under it (``key`` ``None``: just
        compute)."""
        if key is not None:
            numbers = self.lookup(key)
            if numbers is not None:
                self.hits.append(kind)
                return numbers
        numbers = compute()
        if key is not None:
            self.store(key, kind, numbers)  # Python floats: JSON round-trips them exactly
        return numbers

    def for_data(self, dataset: Any, *, knn_k: int, knn_temperature: float, device: torch.device,
                 workers: int = 0) -> "DataBaselines":
        """The baselines of ``dataset`` under this read-out protocol, as
        :func:`~contrastkit.metrics.readout.evaluate_encoders` asks for them."""
        return DataBaselines(self, dataset, readout_protocol(knn_k, knn_temperature, dataset.num_classes),
                             device, workers)


class DataBaselines:
    """A :class:`BaselineCache` bound to one data set and protocol (a
    :class:`~contrastkit.metrics.readout.BaselineStore`): the data digest is computed once, on
    the first baseline asked for, and only when the cache is enabled."""

    def __init__(self, cache: BaselineCache, dataset: Any, protocol: Dict[str, Any], device: torch.device,
                 workers: int) -> None:
        self.cache, self.dataset, self.protocol, self.device, self.workers = cache, dataset, protocol, device, workers
        self._data: Optional[str] = None

    def _data_digest(self) -> str:
        if self._data is None:
            splits = (self.dataset.train, self.dataset.val, self.dataset.test)
            self._data = data_digest((image_batches(split, workers=self.workers), split.labels) for split in splits)
        return self._data

    def numbers(self, kind: str, compute: Callable[[], Dict[str, Any]],
                encoder: Optional[nn.Module] = None) -> Dict[str, Any]:
        key = None
        if self.cache.enabled:
            key = self.cache.key(kind, self._data_digest(), self.protocol,
                                 None if encoder is None else encoder_digest(encoder, self.device))
        return self.cache.get_or_compute(key, kind, compute)
