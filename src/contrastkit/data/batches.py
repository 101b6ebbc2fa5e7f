"""The images of a training batch for a run's batch makers: the loop hands a streamed batch's
decoded images over (``hold``) so that they are not read twice; held images are indexed where
they lie."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from contrastkit.data.loader import read_images
from contrastkit.data.streaming import in_memory, unit_float

__all__ = ["HeldImages", "StreamedViews", "PairedImages"]


class HeldImages:
    """The images of a streamed batch for a batch maker: those of the training batch handed
    over by the loop (:meth:`hold`), instead of read again; any other batch (a held-out one)
    read by ``read`` (default :func:`read_images`). ``images(split, indices)`` -> ``(b, C, H, W)``
    as decoded (uint8 or float), or whatever the loader's items are (``(b, 2, C, H, W)`` views
    made in the workers, :mod:`contrastkit.data.transform_views`)."""

    def __init__(self, read: Callable[[Any, Tensor], Tensor] = read_images) -> None:
        self._held: Optional[Tuple[Tensor, Dict[int, int], Tensor]] = None
        self._read = read

    def hold(self, indices: Tensor, images: Tensor) -> None:
        """The decoded ``images`` of the training batch ``indices`` (from the loader)."""
        self._held = (indices, {int(i): row for row, i in enumerate(indices.tolist())}, images)

    def __call__(self, split: Any, indices: Tensor) -> Tensor:
        if self._held is not None:
            held_indices, rows, held = self._held
            if indices is held_indices or torch.equal(indices.cpu(), held_indices.cpu()):
                return held  # the whole training batch, as every step without micro-batches asks
            wanted = indices.tolist()
            if all(i in rows for i in wanted):  # the batch or a part of it (micro-batches)
                return held[torch.tensor([rows[i] for i in wanted], dtype=torch.long, device=held.device)]
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

    def hold(self, indices: Tensor, images: Tensor) -> None:
        """The decoded ``images`` of the training batch ``indices`` (from the loader)."""
        self.images.hold(indices, images)

    def __call__(self, split: Any, indices: Tensor) -> Tuple[Tensor, Tensor]:
        if in_memory(split):
            return self.views(split, indices)
        return self.views.views_of(self.images(split, indices))


class PairedImages:
    """The images of a batch of image-text pairs on ``device``: ``images(split, indices,
    device)`` -> ``(b, C, H, W)`` float in ``[0, 1]``.

    Held images: when the split has noise realisations, each pair draws one at random (torch's
    global generator, so a checkpointed RNG state reproduces it); otherwise the canonical image.
    Streamed images are those of the training batch the loop hands over (:meth:`hold`), else
    read for the batch."""

    def __init__(self) -> None:
        self._streamed = HeldImages()

    def hold(self, indices: Tensor, images: Tensor) -> None:
        """The decoded ``images`` of the streamed training batch ``indices`` (from the loader)."""
        self._streamed.hold(indices, images)

    def __call__(self, split: Any, indices: Tensor, device: torch.device) -> Tensor:
        if not in_memory(split):
            return unit_float(self._streamed(split, indices).to(device, non_blocking=True))
        if getattr(split, "realisations", None) is not None:
            which = torch.randint(0, split.realisations.shape[1], (indices.shape[0],))
            return split.realisations[indices, which].to(device)
        return split.images[indices].to(device)
