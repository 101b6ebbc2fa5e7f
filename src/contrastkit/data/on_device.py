"""The training images held whole on the training device (``--data-on-device``).

When a data set fits, holding all of its training images on the device (a GPU's memory) lets
every step index its batch where the images lie and make the views there: no image crosses from
the host during training, and a streamed data set is decoded once instead of every epoch.

* Images are held as uint8 (one byte per value, a quarter of float32) where that is lossless:
  images decoded from files always are; images held in memory as float32 when every value is
  ``k / 255`` (data read from 8-bit files: CIFAR-10, MNIST, image folders). Other float images
  (generated ones, GlyphLab's noise realisations) are held as float32. The views read them
  through :func:`~contrastkit.data.unit_float`, so held and host images give identical views.
* :func:`choose_on_device` decides ``auto`` / ``on`` / ``off`` from the images' size and the
  device's free memory (:func:`device_free_bytes`) and says why; ``auto`` holds them on an
  accelerator when they take at most :data:`AUTO_SHARE` of its free memory (the rest is for the
  model, its activations and the views), never on the CPU, where held images are already in
  the device's memory and streamed ones keep being decoded by the workers in parallel.
* :class:`DeviceImages` is what a batch maker would hold for one split: its size before
  anything is moved, :meth:`DeviceImages.load` to put it on the device (a streamed split
  decoded through the run's loader workers, once).
* :func:`hold_on_device` does all of it for a run's training split and batch maker.

Batch makers take held images with ``hold_split(split, images)``
(:class:`~contrastkit.data.ViewMaker`, :class:`~contrastkit.data.batches.StreamedViews`,
:class:`~contrastkit.data.PairedImages`) and say what they would hold with
``device_images(split, workers)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor

from contrastkit._io import available_memory

from .loader import make_loader
from .streaming import in_memory, unit_float

__all__ = ["AUTO_SHARE", "OnDevicePlan", "DeviceImages", "choose_on_device", "needs_size", "device_free_bytes",
           "hold_on_device", "compact_images"]

#: The share of the device's free memory the held training images may take under ``auto``.
AUTO_SHARE = 0.25

#: Rows converted or compared at a time (bounds the temporary float copies on the host).
_CHUNK_ROWS = 4096


def _mib(nbytes: float) -> str:
    if nbytes < 2**20:
        return f"{nbytes / 2**10:,.1f} KiB"
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:,.2f} GiB"


@dataclass(frozen=True)
class OnDevicePlan:
    """Whether the training images are held on the device (``hold``), why (``reason``, one
    line, as the run prints it), and how many bytes they take (``nbytes``)."""

    hold: bool
    reason: str
    nbytes: int

    @property
    def message(self) -> str:
        """``"data on device: on (...)"``: what a run prints."""
        return f"data on device: {'on' if self.hold else 'off'} ({self.reason})"

    def record(self) -> dict:
        """JSON-ready, for the run's ``config.json``."""
        return {"held": self.hold, "reason": self.reason, "bytes": int(self.nbytes)}


def device_free_bytes(device: Union[torch.device, str]) -> Optional[int]:
    """Free memory of ``device`` in bytes: ``torch.cuda.mem_get_info`` on a CUDA device, the
    host's available memory on the CPU; ``None`` where it is not known."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return available_memory()
    return None


def needs_size(setting: str, device: Union[torch.device, str]) -> bool:
    """Whether :func:`choose_on_device` needs the images' size for ``setting`` on ``device``
    (``off``, and ``auto`` on the CPU, decide without it: nothing is measured)."""
    return not (setting == "off" or (setting == "auto" and torch.device(device).type == "cpu"))


def choose_on_device(setting: str, nbytes: Optional[int], device: Union[torch.device, str],
                     free_bytes: Optional[int]) -> OnDevicePlan:
    """The decision of ``--data-on-device`` ``setting`` for training images of ``nbytes`` on
    ``device`` with ``free_bytes`` free (``None``: unknown). ``on`` is refused with a
    ``ValueError`` when the images do not fit in the free memory; ``auto`` then streams.
    ``nbytes`` may be ``None`` for ``off``, and for ``auto`` on the CPU (nothing is measured)."""
    device = torch.device(device)
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"data_on_device must be auto, on or off, got {setting!r}")
    if setting == "off":
        return OnDevicePlan(False, "--data-on-device off", nbytes or 0)
    if setting == "auto" and device.type == "cpu":
        return OnDevicePlan(False, "auto: the device is the CPU, which holds the images already or streams them "
                                   "in its workers; --data-on-device on holds them there", nbytes or 0)
    if nbytes is None:
        raise ValueError(f"data_on_device {setting!r} on {device} needs the size of the images")
    size = _mib(nbytes)
    free = f"{_mib(free_bytes)} free on {device}" if free_bytes is not None else f"free memory of {device} unknown"
    if free_bytes is not None and nbytes > free_bytes:
        if setting == "on":
            raise ValueError(f"--data-on-device on: the training images take {size}, more than the {free}; "
                             "use --data-on-device auto or off")
        return OnDevicePlan(False, f"auto: the training images take {size}, more than the {free}", nbytes)
    if setting == "on":
        return OnDevicePlan(True, f"asked for: {size}, {free}", nbytes)
    if free_bytes is None:
        return OnDevicePlan(False, f"auto: {free}; --data-on-device on holds the {size} anyway", nbytes)
    if nbytes > AUTO_SHARE * free_bytes:
        return OnDevicePlan(False, f"auto: the training images take {size}, more than a quarter of the {free}",
                            nbytes)
    return OnDevicePlan(True, f"auto: {size}, at most a quarter of the {free}", nbytes)


def compact_images(images: Tensor) -> Tensor:
    """float32 ``images`` as uint8 when that is lossless (every value ``k / 255``: ``unit_float``
    of the uint8 copy gives them back exactly), else (and any other dtype) as they are.
    Compared in chunks of rows, so the temporary copies stay small."""
    if images.dtype != torch.float32:
        return images
    compact = torch.empty(images.shape, dtype=torch.uint8, device=images.device)
    for start in range(0, images.shape[0], _CHUNK_ROWS):
        part = images[start:start + _CHUNK_ROWS]
        as_bytes = part.mul(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)
        if not torch.equal(unit_float(as_bytes), part):
            return images
        compact[start:start + _CHUNK_ROWS] = as_bytes
    return compact


class DeviceImages:
    """What a batch maker would hold on ``device`` for one split: ``source`` is the split's held
    images or noise realisations (a tensor, kept compact: uint8 where lossless) or a streamed
    split (decoded through :func:`~contrastkit.data.make_loader` with ``workers`` processes when
    loaded). ``nbytes`` is known before anything is moved; :meth:`load` moves or decodes."""

    def __init__(self, source: Any, device: Union[torch.device, str], *, workers: int = 0) -> None:
        self.device = torch.device(device)
        self.workers = int(workers)
        if isinstance(source, Tensor):
            self._host: Optional[Tensor] = compact_images(source)
            self._split = None
            self.nbytes = self._host.numel() * self._host.element_size()
        else:
            if in_memory(source):
                raise TypeError("DeviceImages takes a held split's tensor (images or realisations), not the split")
            self._host, self._split = None, source
            self.nbytes = len(source) * math.prod(source.image_shape) * _item_size(source)

    def load(self) -> Tensor:
        """The images on the device, ``(n, ...)``, in the split's order. A streamed split whose
        damaged files its collection skips raises ``ValueError`` (every row needs its image)."""
        if self._host is not None:
            return self._host.to(self.device)
        return _decode(self._split, self.device, self.workers)


def _item_size(split: Any) -> int:
    """Bytes per value of a streamed split's images: 1 for decoded files (uint8), else item 0's."""
    try:
        first = split[0][0]
    except Exception:  # noqa: BLE001 - an unreadable item 0: the decoders' uint8 is the estimate
        return 1
    return first.element_size() if isinstance(first, Tensor) else 1


def _decode(split: Any, device: torch.device, workers: int, batch_size: int = 512) -> Tensor:
    held: Optional[Tensor] = None
    filled = 0
    for images, indices in make_loader(split, batch_size=batch_size, workers=workers):
        if held is None:
            held = torch.empty((len(split), *images.shape[1:]), dtype=images.dtype, device=device)
        held[indices.to(device)] = images.to(device)
        filled += int(indices.numel())
    missing = len(split) - filled
    if held is None or missing:
        raise ValueError(f"{missing} image(s) of the training split could not be read (skipped as damaged): "
                         "the images held on the device need every row; --data-on-device off streams around them")
    return held


def hold_on_device(setting: str, batches: Any, split: Any, device: Union[torch.device, str], *,
                   workers: int = 0) -> OnDevicePlan:
    """Decide ``--data-on-device`` ``setting`` for the training ``split`` and, if it says so,
    hand the batch maker ``batches`` the split's images held on ``device``
    (``batches.hold_split(split, batches.device_images(split, workers).load())``); returns the
    decision. A batch maker without ``device_images`` (a caller's own) holds nothing: ``on`` is
    then refused; so is ``on`` for a streamed split with damaged files, which ``auto`` streams."""
    device = torch.device(device)
    if not needs_size(setting, device):
        return choose_on_device(setting, None, device, None)
    if not (hasattr(batches, "device_images") and hasattr(batches, "hold_split")):
        if setting == "on":
            raise ValueError("--data-on-device on: the batch maker given to pretrain (views=) cannot hold the images "
                             "on the device (it has no device_images / hold_split)")
        return OnDevicePlan(False, "auto: the batch maker given to pretrain (views=) does not hold images on the "
                                   "device", 0)
    wanted = batches.device_images(split, workers)
    plan = choose_on_device(setting, wanted.nbytes, device, device_free_bytes(device))
    if plan.hold:
        try:
            batches.hold_split(split, wanted.load())
        except ValueError as err:
            if setting == "on":
                raise ValueError(f"--data-on-device on: {err}") from None
            return OnDevicePlan(False, f"auto: {err}", plan.nbytes)
    return plan
