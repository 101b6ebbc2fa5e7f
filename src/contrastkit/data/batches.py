"""The images of a training batch for a run's batch makers: the loop hands a streamed batch
over (``hold(split, batch)``, the training split and its
:class:`~contrastkit.data.batch_source.StepBatch`) so that its decoded images are not read
twice; held images are indexed where they lie. With ``--data-on-device`` the whole training
split's images are held on the device (``hold_split``, :mod:`contrastkit.data.on_device`) and a
batch is indexed there."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from contrastkit.data.loader import read_images
from contrastkit.data.iterable import IterableSplit
from contrastkit.data.streaming import in_memory, unit_float

__all__ = ["HeldImages", "StreamedViews", "PairedImages", "reading_held_batches"]


def _indexed(split: Any) -> bool:
    """Whether a batch of ``split`` is read by index from the images it holds as one tensor:
    never a stream's (:class:`~contrastkit.data.IterableSplit`), whatever it holds, since its
    batches are what its reader gave, not positions in a tensor."""
    return in_memory(split) and not isinstance(split, IterableSplit)


class HeldImages:
    """The images of a streamed batch for a batch maker: those of the training batch handed
    over by the loop (:meth:`hold`), instead of read again; any other batch (a held-out one, of
    another split) read by ``read`` (default :func:`read_images`). ``images(split, indices)`` ->
    ``(b, C, H, W)`` as decoded (uint8 or float), or whatever the loader's items are
    (``(b, 2, C, H, W)`` views made in the workers, :mod:`contrastkit.data.transform_views`)."""

    def __init__(self, read: Callable[[Any, Tensor], Tensor] = read_images) -> None:
        self._held: Optional[Tuple[Any, Tensor, Tensor]] = None
        self._rows: Optional[Dict[int, int]] = None
        self._split: Optional[Tuple[Any, Tensor]] = None
        self._read = read

    def hold(self, split: Any, indices: Tensor, images: Tensor) -> None:
        """The decoded ``images`` of the batch ``indices`` of the training ``split`` (from the
        loader). Only a batch of that split is answered from them: the same indices of a
        held-out split (or a stream's positions, which restart at 0 each epoch) are other images."""
        self._held, self._rows = (split, indices, images), None  # rows: only if a part is asked for

    def rows(self, split: Any, indices: Tensor) -> Optional[Tensor]:
        """The rows of the held batch that ``indices`` of ``split`` are (``(b,)`` int64, the whole
        batch as every step without micro-batches asks, or a part of it), or ``None`` when they are
        not all in it."""
        if self._held is None or self._held[0] is not split:
            return None
        held_indices = self._held[1]
        if indices is held_indices or torch.equal(indices.cpu(), held_indices.cpu()):
            return torch.arange(held_indices.shape[0])
        if self._rows is None:
            self._rows = {int(i): row for row, i in enumerate(held_indices.tolist())}
        wanted = indices.tolist()
        if all(i in self._rows for i in wanted):  # a part of the batch (micro-batches)
            return torch.tensor([self._rows[i] for i in wanted], dtype=torch.long)
        return None

    def hold_split(self, split: Any, images: Tensor) -> None:
        """All the images of ``split``, in its order, held on the device (``--data-on-device``):
        a batch of it is indexed there."""
        if images.shape[0] != len(split):
            raise ValueError(f"held images have {images.shape[0]} rows; the split has {len(split)}")
        self._split = (split, images)

    def __call__(self, split: Any, indices: Tensor) -> Tensor:
        if self._split is not None and self._split[0] is split:
            held_split = self._split[1]
            return held_split[indices.to(held_split.device, non_blocking=True)]
        rows = self.rows(split, indices)
        if rows is not None:
            assert self._held is not None
            held = self._held[2]
            if torch.equal(rows, torch.arange(held.shape[0])):
                return held  # the whole training batch: no copy
            return held[rows.to(held.device, non_blocking=True)]
        return self._read(split, indices)


class StreamedViews:
    """The batch maker of a run over streamed data: ``views(split, indices)`` as the in-memory
    :class:`~contrastkit.data.ViewMaker` takes it, the images of a streamed batch from
    :class:`HeldImages` (the loop hands the training batch over with :meth:`hold`). The views
    themselves are the wrapped view maker's (``views_of``: batched kornia on the training
    device)."""

    def __init__(self, views: Any) -> None:
        self.views = views
        self.images = HeldImages()

    @property
    def config(self) -> Dict[str, Any]:
        return self.views.config

    def hold(self, split: Any, batch: Any) -> None:
        """The training ``split``'s batch ``batch`` (a :class:`~contrastkit.data.batch_source.StepBatch`
        whose ``images`` the loader decoded)."""
        self.images.hold(split, batch.indices, batch.images)

    def device_images(self, split: Any, workers: int = 0) -> Any:
        """What :meth:`hold_split` would hold for ``split`` on the views' device
        (:class:`~contrastkit.data.on_device.DeviceImages`: a streamed split decoded once)."""
        if _indexed(split):
            return self.views.device_images(split, workers)
        from .on_device import DeviceImages

        return DeviceImages(split, self.views.device, workers=workers)

    def hold_split(self, split: Any, images: Tensor) -> None:
        """Make the views of ``split`` from ``images``, all its images held on the device."""
        if _indexed(split):
            self.views.hold_split(split, images)
        else:
            self.images.hold_split(split, images)

    def __call__(self, split: Any, indices: Tensor) -> Tuple[Tensor, Tensor]:
        if _indexed(split):
            return self.views(split, indices)
        return self.views.views_of(self.images(split, indices))


def reading_held_batches(batches: Any) -> Any:
    """``batches`` as the batch maker of a stream, whose batches exist only as the loader
    decoded them (there is no index to read them by): itself when it takes them (``hold``),
    else a view maker wrapped in ``StreamedViews`` (e.g. one made for a stream's in-memory
    read-out sample)."""
    return batches if hasattr(batches, "hold") else StreamedViews(batches)


class PairedImages:
    """The images of a batch of image-text pairs on ``device``: ``images(split, indices,
    device)`` -> ``(b, C, H, W)`` float in ``[0, 1]``.

    Held images: when the split has noise realisations, each pair draws one at random (torch's
    global generator, so a checkpointed RNG state reproduces it); otherwise the canonical image.
    Streamed images are those of the training batch the loop hands over (:meth:`hold`), else
    read for the batch."""

    def __init__(self) -> None:
        self._streamed = HeldImages()
        self._held: Optional[Tuple[Any, Tensor]] = None

    def hold(self, split: Any, indices: Tensor, images: Tensor) -> None:
        """The decoded ``images`` of the streamed batch ``indices`` of the training ``split``
        (from the loader)."""
        self._streamed.hold(split, indices, images)

    def held_rows(self, split: Any, indices: Tensor) -> Optional[Tensor]:
        """The rows of the held batch that ``indices`` of ``split`` are, or ``None``
        (``HeldImages.rows``)."""
        return self._streamed.rows(split, indices)

    @staticmethod
    def _source(split: Any) -> Tensor:
        realisations = getattr(split, "realisations", None)
        return realisations if realisations is not None else split.images

    def device_images(self, split: Any, device: torch.device, workers: int = 0) -> Any:
        """What :meth:`hold_split` would hold for ``split`` on ``device``: its realisations or
        images (:class:`~contrastkit.data.on_device.DeviceImages`; a streamed split decoded once)."""
        from .on_device import DeviceImages

        return DeviceImages(self._source(split) if _indexed(split) else split, device, workers=workers)

    def hold_split(self, split: Any, images: Tensor) -> None:
        """Read the images of ``split`` from ``images``, all of them held on the device."""
        if not _indexed(split):
            self._streamed.hold_split(split, images)
        elif tuple(images.shape) != tuple(self._source(split).shape):
            raise ValueError(f"held images of shape {tuple(images.shape)} do not stand for this split's "
                             f"{tuple(self._source(split).shape)}")
        else:
            self._held = (split, images)

    def __call__(self, split: Any, indices: Tensor, device: torch.device) -> Tensor:
        if not _indexed(split):
            return unit_float(self._streamed(split, indices).to(device, non_blocking=True))
        source = self._source(split)
        if self._held is not None and self._held[0] is split:
            source = self._held[1]
            indices = indices.to(source.device, non_blocking=True)
        if getattr(split, "realisations", None) is not None:
            which = torch.randint(0, split.realisations.shape[1], (indices.shape[0],))
            return unit_float(source[indices, which.to(source.device, non_blocking=True)].to(device))
        return unit_float(source[indices].to(device))
