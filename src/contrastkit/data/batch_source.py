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

from contrastkit.data.base import NO_LABEL
from contrastkit.data.loader import ignore_stop_signals
from contrastkit.data.collection import skips_bad_files
from contrastkit.data.iterable import DamagedSample
from contrastkit.data.loader import DeviceIndexBatches, EpochBatchSampler, make_loader
from contrastkit.data.streaming import BadItemError

__all__ = ["StepBatch", "IndexBatchSource", "StreamBatchSource"]


class StepBatch(NamedTuple):
    """What one training step reads.

    ``indices``: ``(b,)`` int64, the samples' indices in the training split (on the host, or on
    the device when the split is held there); ``on_device``: the same on the training device;
    ``images``: the decoded images ``(b, C, H, W)`` (or the items the loader made, e.g. views
    made in the workers), ``None`` when the batch maker reads the images by index itself;
    ``labels``: ``(b,)`` int64 on the device, or ``None`` for data without labels; ``keys``:
    the samples' keys (a stream's), else ``None``; ``texts``: the samples' captions (a stream
    of image-text pairs), else ``None``. A batch may have fewer rows than the source's batch
    size, even 0, when damaged files were skipped."""

    indices: Tensor
    on_device: Tensor
    images: Optional[Tensor]
    labels: Optional[Tensor]
    keys: Optional[List[str]] = None
    texts: Optional[List[str]] = None


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
        # Batches may come short of readable images when damaged files are skipped.
        self.short_batches = not hold and skips_bad_files(items)
        labels = getattr(split, "labels", None)
        self.labels = labels.to(self.device) if labels is not None else None  # paired data may lack labels
        # Damaged samples met here and not recorded in the split: none, the loader records them there.
        self.skipped: Dict[str, str] = {}

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

    def check_position(self, state: Optional[Dict[str, Any]]) -> None:
        """Any position fits (the step in the epoch is all there is)."""

    def close(self) -> None:
        """End the loader's worker processes (before an evaluation starts its own)."""
        self.loader = None


class StreamBatchSource:
    """The batches of an iterable training ``stream`` (:class:`~contrastkit.data.IterableSplit`):
    each batch one ``DataLoader`` worker's ``batch_size`` consecutive samples, batch ``i`` of an
    epoch from worker ``i % workers``, ``steps_per_epoch`` batches an epoch on every rank.

    Its position at a step is each worker's consumed samples (:meth:`state_dict`), which follow
    from the step and the number of workers; a resume with another ``workers`` is refused by
    name. A damaged sample (:class:`~contrastkit.data.DamagedSample`) is left out of its batch
    and recorded in ``skipped`` (``bad_files="skip"``), or raises
    :class:`~contrastkit.data.BadItemError` naming its key. A batch's ``indices`` are its
    samples' positions in this rank's epoch (what the batch maker holds its images by); its
    ``keys`` name them and, for a stream of image-text pairs, its ``texts`` are their captions.
    """

    def __init__(self, stream: Any, *, batch_size: int, steps_per_epoch: int, seed: int, rank: int = 0,
                 world_size: int = 1, workers: int = 0, device: Union[torch.device, str] = "cpu") -> None:
        self.stream, self.batch_size, self.steps_per_epoch = stream, int(batch_size), int(steps_per_epoch)
        self.seed, self.workers, self.device = int(seed), int(workers), torch.device(device)
        self.readers = max(1, self.workers)
        stream.set_share(rank, world_size)
        self.check_readers(stream, world_size, self.workers)
        self.short_batches = getattr(stream, "bad_files", "fail") == "skip"
        self.skipped: Dict[str, str] = {}
        self.epoch, self.start, self.step = 0, 0, 0
        self.loader: Any = None

    @staticmethod
    def check_readers(stream: Any, world_size: int, workers: int) -> None:
        """Refuse, naming ``--workers``, more readers (processes x workers) than ``stream`` can feed."""
        needed = getattr(stream, "readers_needed", None)
        problem = needed(world_size * max(1, workers)) if needed is not None else None
        if problem is not None:
            raise ValueError(f"{problem}: lower --workers (now {workers}) or write the data in more shards")

    def check_position(self, state: Optional[Dict[str, Any]]) -> None:
        """Refuse a position (:meth:`state_dict`) written with another number of workers, naming
        ``--workers``: each batch is one worker's samples, so the batches depend on it."""
        if state is not None and int(state.get("workers", self.readers)) != self.readers:
            written = int(state["workers"])
            raise ValueError(f"the run was checkpointed reading its stream with --workers "
                             f"{written if written > 1 else '0 or 1'}; resume it with the same number (now "
                             f"{self.workers}): each batch is one worker's samples, so the batches depend on it")

    def _consumed(self, step: int) -> List[int]:
        """Each worker's consumed samples after ``step`` batches of the epoch."""
        return [len(range(worker, step, self.readers)) * self.batch_size for worker in range(self.readers)]

    def set_epoch(self, epoch: int, start: int = 0, state: Optional[Dict[str, Any]] = None) -> None:
        """Read epoch ``epoch`` from its batch ``start``; ``state`` (from :meth:`state_dict` at
        that step, when resuming) must have been written with the same number of workers."""
        self.check_position(state)
        self.epoch, self.start, self.step = int(epoch), int(start), int(start)
        self.stream.set_epoch(self.epoch)
        self.stream.load_state_dict({"epoch": self.epoch, "workers": self.readers, "consumed": self._consumed(start),
                                     "first_worker": start % self.readers})
        remaining = [len(range(worker, self.steps_per_epoch, self.readers)) - len(range(worker, start, self.readers))
                     for worker in range(self.readers)]
        quotas = [remaining[(start + j) % self.readers] for j in range(self.readers)]
        from torch.utils.data import DataLoader

        # New workers each epoch: they copy the stream's position when the epoch starts.
        self.loader = DataLoader(_WorkerBatches(self.stream, self.batch_size, quotas), batch_size=None,
                                 num_workers=self.workers, pin_memory=self.device.type == "cuda",
                                 generator=torch.Generator().manual_seed(self.seed),
                                 worker_init_fn=ignore_stop_signals)

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start

    def __iter__(self) -> Iterator[StepBatch]:
        for images, labels, keys, texts, damaged in self.loader:
            for sample in damaged:
                if getattr(self.stream, "bad_files", "fail") != "skip":
                    raise BadItemError(sample.reason)
                self.skipped[sample.key] = sample.reason
            rows = len(keys)
            first = self.step * self.batch_size
            indices = torch.arange(first, first + rows, dtype=torch.long)
            self.step += 1
            labelled = rows and bool((labels != NO_LABEL).all())
            yield StepBatch(indices, indices.to(self.device, non_blocking=True), images,
                            labels.to(self.device, non_blocking=True) if labelled else None, list(keys),
                            None if texts is None else list(texts))

    def record(self) -> Dict[str, Any]:
        """What a run's ``config.json`` records of its stream: the samples of one pass
        (``train_samples``, what the schedules count), its shards, the shuffle buffer, the
        readers (``workers``) and the steps an epoch takes."""
        return {"train_samples": int(self.stream.num_samples), "steps_per_epoch": self.steps_per_epoch,
                "workers": self.readers, "shards": len(getattr(self.stream, "shards", ())) or None,
                "shuffle_buffer": getattr(self.stream, "shuffle_buffer", None)}

    def state_dict(self) -> Dict[str, Any]:
        """The position after the batches yielded so far: ``epoch``, ``workers``, ``consumed``."""
        return {"epoch": self.epoch, "workers": self.readers, "consumed": self._consumed(self.step)}

    def close(self) -> None:
        """End the loader's worker processes."""
        self.loader = None


class _WorkerBatches(torch.utils.data.IterableDataset):
    """In each ``DataLoader`` worker ``j``: ``quotas[j]`` batches of ``batch_size`` consecutive
    samples of the stream (``(images, labels, keys, texts, damaged)``: ``texts`` the captions of
    a stream of image-text pairs, else ``None``; damaged samples left out of the images and
    listed)."""

    def __init__(self, stream: Any, batch_size: int, quotas: List[int]) -> None:
        self.stream, self.batch_size, self.quotas = stream, batch_size, quotas

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        quota = self.quotas[info.id if info is not None else 0]
        if quota <= 0:
            return
        samples = iter(self.stream)
        paired = bool(getattr(self.stream, "paired", False))
        for _ in range(quota):
            images, labels, keys, texts, damaged = [], [], [], [], []
            for _ in range(self.batch_size):
                item = next(samples)
                if isinstance(item, DamagedSample):
                    damaged.append(item)
                    continue
                images.append(item[0])
                labels.append(int(item[1]))
                keys.append(str(item[2]))
                if paired:
                    texts.append(str(item[3]))
            stacked = torch.stack(images) if images else torch.zeros((0,), dtype=torch.uint8)
            yield stacked, torch.tensor(labels, dtype=torch.long), keys, texts if paired else None, damaged
