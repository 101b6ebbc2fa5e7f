"""Where a training loop's batches come from: one object per run, whatever the data are.

A batch source yields, for each step of an epoch, a :class:`StepBatch`: the samples'
indices (what a batch maker reads by, and a per-sample temperature method keys its state by),
their decoded images when a ``DataLoader`` decoded them, their labels on the training device
and, for a stream, their keys. It knows its number of steps per epoch, starts an epoch with
:meth:`IndexBatchSource.set_epoch` (at a given step, with the position a checkpoint kept) and
gives that position with :meth:`IndexBatchSource.state_dict`.

:class:`IndexBatchSource` reads a map-style split by sample index: each epoch a permutation
seeded by ``(seed, epoch)`` (:class:`~contrastkit.data.EpochBatchSampler`), this rank's
share under torchrun, in batches of this rank's size; the images either held on the device
(a batch is a slice of the epoch's order there, :class:`~contrastkit.data.DeviceIndexBatches`)
or decoded by a ``DataLoader`` in worker processes. Its position is the step in the epoch, so
its :meth:`~IndexBatchSource.state_dict` is ``None``: the checkpoint's step count says it all.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Union

import torch
from torch import Tensor

from contrastkit.data.collection import skips_bad_files
from contrastkit.data.loader import DeviceIndexBatches, EpochBatchSampler, make_loader

__all__ = ["StepBatch", "IndexBatchSource"]


class StepBatch(NamedTuple):
    """What one training step reads.

    ``indices``: ``(b,)`` int64, the samples' indices in the training split (on the host, or on
    the device when the split is held there); ``on_device``: the same on the training device;
    ``images``: the decoded images ``(b, C, H, W)`` (or the items the loader made, e.g. views
    made in the workers), ``None`` when the batch maker reads the images by index itself;
    ``labels``: ``(b,)`` int64 on the device, or ``None`` for data without labels; ``keys``:
    the samples' keys (a stream's), else ``None``. A batch may have fewer rows than the
    source's batch size, even 0, when damaged files were skipped."""

    indices: Tensor
    on_device: Tensor
    images: Optional[Tensor]
    labels: Optional[Tensor]
    keys: Optional[List[str]] = None


class IndexBatchSource:
    """The batches of a map-style training ``split`` read by sample index (module docstring).

    Args:
        split: the training split (``len``, ``labels`` ``(n,)`` or ``None``).
        batch_size: this rank's batch (its share of the global one).
        seed: seeds the epochs' orders (with the epoch) and the loader's workers.
        rank, world_size: this process's share under torchrun.
        items: what the loader reads (default ``split``; e.g. items of two views made in
            the workers, :class:`~contrastkit.data.TransformViews`).
        workers: decoding worker processes of a streamed split.
        device: the training device (labels and indices are put there).
        hold: the training images are held on the device: no loader, no copy per step.
    """

    def __init__(self, split: Any, *, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 items: Any = None, workers: int = 0, device: Union[torch.device, str] = "cpu",
                 hold: bool = False) -> None:
        self.split = split
        self.device = torch.device(device)
        self.sampler = EpochBatchSampler(len(split), batch_size, seed, rank=rank, world_size=world_size)
        self.steps_per_epoch = len(self.sampler)
        items = split if items is None else items
        self.loader: Any
        if hold:  # the epoch's order on the device, a batch a slice of it
            self.loader = DeviceIndexBatches(self.sampler, self.device)
        else:
            # A batch that lost every image is still handed over: each rank then counts the
            # sampler's batches, and every rank skips that step together.
            self.loader = make_loader(items, batch_sampler=self.sampler, workers=workers,
                                      pin_memory=self.device.type == "cuda", seed=seed, keep_emptied=True)
        #: batches may come short of readable images (damaged files skipped)
        self.short_batches = not hold and skips_bad_files(items)
        labels = getattr(split, "labels", None)
        self.labels = labels.to(self.device) if labels is not None else None  # paired data may lack labels

    def set_epoch(self, epoch: int, start: int = 0, state: Optional[Dict[str, Any]] = None) -> None:
        """Yield epoch ``epoch`` next (its order seeded by ``(seed, epoch)``, nothing else), from
        its batch ``start`` (a run resumed in the middle of the epoch; ``state``, what
        :meth:`state_dict` gave there, is ``None`` for this source)."""
        self.sampler.set_epoch(epoch, start=start)

    def __len__(self) -> int:
        """The batches left in the epoch set by :meth:`set_epoch`."""
        return len(self.loader)

    def __iter__(self) -> Iterator[StepBatch]:
        for item in self.loader:
            if isinstance(item, Tensor):  # the images are read by index where they lie
                indices, images = item, None
            else:  # decoded by the loader: the images and their indices
                images, indices = item
            on_device = indices.to(self.device, non_blocking=True)
            yield StepBatch(indices, on_device, images, None if self.labels is None else self.labels[on_device])

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """``None``: the position in the epoch is its step, which the checkpoint keeps."""
        return None

    def close(self) -> None:
        """End the loader's worker processes (before an evaluation starts its own)."""
        self.loader = None
