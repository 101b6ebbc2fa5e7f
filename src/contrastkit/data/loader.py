"""Reading a split in batches: the ``DataLoader`` of a run and of the read-out.

The order of the images is not the loader's: :class:`EpochBatchSampler` yields, for each
epoch, the same batches of indices the in-memory path draws (a permutation seeded by
``(seed, epoch)``; under torchrun ``DistributedSampler``'s share of it). Workers only decode,
so a run's randomness (the views, drawn on the training device) does not depend on how many
there are, and a resumed run needs no worker state.

>>> data = stream_image_folder("cifar10-jpeg")                        # doctest: +SKIP
>>> loader = make_loader(data.train, batch_size=256, workers=4)       # doctest: +SKIP
>>> images, indices = next(iter(loader))    # (256, 3, 32, 32) uint8, (256,) int64  # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing.util
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from contrastkit.data.base import check_positive_int
from contrastkit.data.collection import skip_item, skips_bad_files
from contrastkit.data.streaming import BadItemError, in_memory

__all__ = ["EpochBatchSampler", "EpochKeys", "DeviceIndexBatches", "make_loader", "read_images", "read_present_images",
           "DamagedItem", "SkippingItems", "collate_skipping", "record_damaged", "STOP_SIGNALS", "ignore_stop_signals"]

#: The signals that stop a run at the end of its current step (a scheduler's preemption; the
#: training process handles them: ``contrastkit.train.faults``).
STOP_SIGNALS = ("SIGTERM", "SIGUSR1")


def ignore_stop_signals(worker_id: int) -> None:
    """A ``DataLoader`` ``worker_init_fn``: the worker ignores :data:`STOP_SIGNALS`. A scheduler
    (SLURM, torchrun's agent) signals every process of the job, the loader's workers too; a
    worker that died of it would stop the training process with "DataLoader worker is killed"
    before the step it is in could finish and be checkpointed. The training process ends its
    workers itself (and a worker exits when its parent is gone)."""
    import signal

    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


#: How long a daemonic child may take to end on SIGTERM at this process's exit before it is killed.
WORKER_EXIT_SECONDS = 2.0


def _end_workers_at_exit() -> None:
    """At exit, Python's multiprocessing sends SIGTERM to the daemonic processes this one
    started (a ``DataLoader``'s workers) and then waits for each to end. The workers of
    :func:`ignore_stop_signals` ignore SIGTERM, so a process that ended with a loader's workers
    still running (an error kept with its traceback keeps the loader's iterator, and so its
    workers) waited for them forever. Run as multiprocessing's last exit finalizer (after a
    pool's own, just before it signals its children), this sends that SIGTERM itself and kills
    each child still running ``WORKER_EXIT_SECONDS`` later."""
    import multiprocessing
    import time

    children = [child for child in multiprocessing.active_children() if child.daemon]
    for child in children:
        child.terminate()
    deadline = time.monotonic() + WORKER_EXIT_SECONDS
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()


# Exit priority 0: the last of the finalizers multiprocessing runs at exit before it ends its
# daemonic children (a Pool's, priority 15, first).
multiprocessing.util.Finalize(None, _end_workers_at_exit, exitpriority=0)


class EpochBatchSampler(Sampler):
    """The batches of one epoch of training: ``steps`` batches of ``batch_size`` indices of a
    split of ``n`` items, in the order of the epoch set by :meth:`set_epoch` (the last partial
    batch dropped).

    One process: ``torch.randperm(n)`` from a generator seeded with ``seed * 100_003 + epoch``.
    Under torchrun (``world_size > 1``): ``DistributedSampler``'s share of rank ``rank``
    (``shuffle=True, seed, drop_last=True``), in batches of ``batch_size`` (this rank's share
    of the global batch). The sampler runs in the main process, so workers never see it.
    ``set_epoch(epoch, start=k)`` starts the epoch at its batch ``k`` (a run resumed from a
    checkpoint written in the middle of the epoch): the batches before it are not drawn again.
    """

    def __init__(self, n: int, batch_size: int, seed: int, *, rank: int = 0, world_size: int = 1) -> None:
        if n < 1 or batch_size < 1:
            raise ValueError(f"n and batch_size must be >= 1, got {n}, {batch_size}")
        self.n, self.batch_size, self.seed = int(n), int(batch_size), int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch = int(epoch)
        self.start = check_positive_int(start, "start", 0)

    def order(self) -> Tensor:
        """This process's indices of the epoch, in order."""
        if self.world_size > 1:
            from torch.utils.data import DistributedSampler

            sampler = DistributedSampler(range(self.n), num_replicas=self.world_size, rank=self.rank,
                                         shuffle=True, seed=self.seed, drop_last=True)
            sampler.set_epoch(self.epoch)
            return torch.tensor(list(sampler), dtype=torch.long)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.n, generator=generator)

    def __len__(self) -> int:
        share = self.n // self.world_size if self.world_size > 1 else self.n
        return max(share // self.batch_size - self.start, 0)

    def __iter__(self) -> Iterator[List[int]]:
        order = self.order()
        for step in range(self.start, self.start + len(self)):
            yield order[step * self.batch_size:(step + 1) * self.batch_size].tolist()


class DeviceIndexBatches:
    """The batches of an :class:`EpochBatchSampler` as index tensors on ``device``: each
    epoch's order is copied there once and a batch is a slice of it, so a step copies nothing
    from the host. What a run iterates when its training images are held on the device
    (:mod:`contrastkit.data.on_device`); the batches are the sampler's own."""

    def __init__(self, sampler: EpochBatchSampler, device: Union[torch.device, str]) -> None:
        self.sampler, self.device = sampler, torch.device(device)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Tensor]:
        order = self.sampler.order().to(self.device)
        size = self.sampler.batch_size
        for step in range(len(self.sampler)):
            yield order[step * size:(step + 1) * size]


class _Indices(torch.utils.data.Dataset):
    """Item ``i`` is ``i``: the loader of an in-memory split yields index batches only."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class EpochKeys(Sampler):
    """The batches of ``sampler`` with each index ``i`` as the key ``(i, epoch)``, ``epoch`` the
    sampler's (its ``epoch`` attribute when the epoch's batches are drawn; 0 without one): for
    a split whose items depend on the epoch (``keyed_by_epoch``: views drawn in the workers,
    :mod:`contrastkit.data.transform_views`), which persistent workers could not learn otherwise."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    @property
    def epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", 0))

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[List[Tuple[int, int]]]:
        epoch = self.epoch
        for batch in self.sampler:
            yield [(int(i), epoch) for i in batch]


class _WithIndex(torch.utils.data.Dataset):
    """Item ``i`` (or key ``(i, epoch)``) of a streamed split is ``(image, i, "")`` (its label is
    in ``split.labels``, its text in ``split.texts``); a bad item (:class:`BadItemError`) is
    ``(zeros, -1 - i, why)``, for the main process to raise or record: by the worker's own
    reason, since the file may read differently by the time the main process looks (a file
    removed or changed while a run reads the folder)."""

    def __init__(self, split: Any) -> None:
        self.split = split
        self.blank = torch.zeros(tuple(getattr(split, "item_shape", split.image_shape)),
                                 dtype=getattr(split, "item_dtype", torch.uint8))

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, key: Any) -> Tuple[Tensor, int, str]:
        index = key[0] if isinstance(key, tuple) else key
        try:
            return self.split[key][0], index, ""
        except BadItemError as error:
            return self.blank, -1 - index, str(error)


class _StreamLoader:
    """Iterates a ``DataLoader`` of :class:`_WithIndex` items and raises, in this process, the
    error of an item a worker could not use (by reading it again here); a split that skips
    damaged files (an unlabeled collection's default) has the item dropped from its batch and
    recorded instead (:mod:`contrastkit.data.collection`). A batch that loses every image is
    left out, or with ``keep_emptied`` yielded with 0 rows (a training loop that counts its
    batches: the ranks of a data-parallel run step together)."""

    def __init__(self, loader: DataLoader, split: Any, keep_emptied: bool = False) -> None:
        self.loader, self.split, self.keep_emptied = loader, split, keep_emptied
        self.skip = skips_bad_files(split)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Tuple[Tensor, Tensor]]:
        for images, indices, reasons in self.loader:
            bad = indices < 0
            if bool(bad.any()):
                marked = [(-1 - int(i), reason) for i, reason in zip(indices.tolist(), reasons) if i < 0]
                if not self.skip:
                    index, reason = marked[0]
                    self.split[self._key(index)]  # raises the item's own error (UnreadableImageError, ...)
                    raise BadItemError(reason)  # it read this time (back, or changed again): the worker's reason
                for index, reason in marked:
                    skip_item(self.split, index, BadItemError(reason))
                images, indices = images[~bad], indices[~bad]
                if indices.numel() == 0 and not self.keep_emptied:
                    continue
            yield images, indices

    def _key(self, index: int) -> Any:
        """The key the workers read item ``index`` by (with the epoch for a keyed split)."""
        sampler = self.loader.batch_sampler
        return (index, sampler.epoch) if isinstance(sampler, EpochKeys) else index


def make_loader(split: Any, *, batch_size: int = 256, workers: int = 0, batch_sampler: Optional[Sampler] = None,
                pin_memory: bool = False, seed: int = 0, keep_emptied: bool = False) -> Any:
    """A ``DataLoader`` over ``split``.

    An in-memory :class:`~contrastkit.data.Split` yields batches of indices ``(b,)`` int64 (the
    images are indexed where they lie, on the training device); a streamed split yields
    ``(images, indices)``, ``images`` ``(b, C, H, W)`` uint8 (or float) decoded in ``workers``
    processes (persistent, so an epoch does not pay their start-up again). ``batch_sampler``
    (e.g. :class:`EpochBatchSampler`) sets the batches; by default consecutive batches of
    ``batch_size`` in order, the last one partial. The loader draws its base seed from its own
    generator (``seed``), never from torch's global RNG, which the views use. An image that
    cannot be read raises :class:`UnreadableImageError` naming it, a bad item of a user's data
    set :class:`BadItemError` naming its index, in this process. A split that skips damaged
    files leaves them out of their batch; a batch left with none is not yielded, or with
    ``keep_emptied`` yielded with 0 rows (so that each batch the sampler draws is one item).
    """
    if in_memory(split):
        dataset: torch.utils.data.Dataset = _Indices(len(split))
        workers = 0  # nothing to decode
    else:
        dataset = _WithIndex(split)
    check_positive_int(workers, "workers", 0)
    # Held images are indexed where they lie: only decoded items are worth pinning.
    options: Dict[str, Any] = dict(num_workers=workers, pin_memory=pin_memory and not in_memory(split),
                                   generator=torch.Generator().manual_seed(seed), worker_init_fn=ignore_stop_signals)
    if workers:
        options.update(persistent_workers=True, prefetch_factor=2)
    if batch_sampler is not None:
        if getattr(split, "keyed_by_epoch", False):
            batch_sampler = EpochKeys(batch_sampler)
        loader = DataLoader(dataset, batch_sampler=batch_sampler, **options)
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=False, **options)
    return loader if in_memory(split) else _StreamLoader(loader, split, keep_emptied)


def read_images(split: Any, indices: Tensor) -> Tensor:
    """The images of ``indices`` of a split, stacked ``(b, C, H, W)``: read in this process
    (for the few held-out batches an evaluation draws; training reads through the loader). A
    damaged file a collection skips is left out (:func:`read_present_images` says which came)."""
    return read_present_images(split, indices)[0]


def read_present_images(split: Any, indices: Tensor) -> Tuple[Tensor, Tensor]:
    """``(images, read)``: :func:`read_images` and the indices ``(b,)`` int64 it read, in order:
    all of ``indices`` except the damaged files an unlabeled collection skips (dropped and
    named, as the loader does)."""
    indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
    if in_memory(split):
        return split.images[indices.to(split.images.device)], indices
    if not skips_bad_files(split):
        return torch.stack([split[int(i)][0] for i in indices.tolist()]), indices
    images, read = [], []
    for i in indices.tolist():
        try:
            images.append(split[int(i)][0])
            read.append(int(i))
        except BadItemError as error:
            skip_item(split, int(i), error)
    if not images:
        raise ValueError(f"every one of the {indices.numel()} image file(s) asked for is damaged (skipped)")
    return torch.stack(images), torch.tensor(read, dtype=torch.long)


# -- items of a loader of one's own (the Lightning data module) ---------------------------

class DamagedItem(NamedTuple):
    """An item a worker could not read: its ``split`` (name), ``index`` and why (the file named)."""

    split: str
    index: int
    reason: str


class SkippingItems(torch.utils.data.Dataset):
    """The items ``(image, label)`` of ``items`` (:func:`~contrastkit.data.item_dataset` of the
    split called ``name``), or a :class:`DamagedItem` where an item cannot be read
    (:class:`BadItemError`), for :func:`collate_skipping` to leave out of its batch."""

    def __init__(self, items: Any, name: str) -> None:
        self.items, self.name = items, name

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.items[index]
        except BadItemError as error:
            return DamagedItem(self.name, int(index), str(error))


def collate_skipping(items: Sequence[Any], *, fields: int = 2) -> Tuple[Any, ...]:
    """``(images, labels, damaged)``: the readable items of :class:`SkippingItems` batched as
    ``default_collate`` does (``(b, C, H, W)``, ``(b,)``; ``b`` may be 0) and the damaged ones,
    to be recorded in the main process (:func:`record_damaged`). ``fields``: the items' length
    (3 for items ``(image, label, index)``: ``(images, labels, indices, damaged)``)."""
    from torch.utils.data import default_collate

    damaged = [item for item in items if isinstance(item, DamagedItem)]
    good = [item for item in items if not isinstance(item, DamagedItem)]
    if good:
        batched = tuple(default_collate(good))
    else:
        batched = (torch.zeros((0,), dtype=torch.uint8),) + (torch.zeros((0,), dtype=torch.int64),) * (fields - 1)
    return (*batched, damaged)


def record_damaged(splits: Dict[str, Any], damaged: Sequence[DamagedItem]) -> None:
    """Record the :class:`DamagedItem` s of a batch as skipped in their split (of ``splits``,
    by name): named by :func:`~contrastkit.data.skipped_files` as the loader of a run names them."""
    for item in damaged:
        skip_item(splits[item.split], item.index, BadItemError(item.reason))
