"""A data source in one file, as a user's package would write it: ``--data toy:N`` is N tiny
generated images per class (two classes: bright left half, bright right half), held in memory.

The tests register it in process (``register_data_source(SOURCE)``) and, for the command
line, through the entry-point group ``contrastkit.data_sources`` (``toy = toy_source:SOURCE``).
An iterable variant (``toy-stream:N``, :data:`ITERABLE_SOURCE`) follows the iterable contract
(:mod:`contrastkit.data.iterable`), a second implementation of it beside tar shards.
"""

import torch

from contrastkit.data import DataSource, Dataset, Split, call_with_options

SIZE = 12


def toy_images(per_class, seed=0):
    """``(2 * per_class, 1, SIZE, SIZE)`` float32 images in [0, 1] and their labels."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(2 * per_class, 1, SIZE, SIZE, generator=generator) * 0.3
    labels = torch.arange(2).repeat_interleave(per_class)
    images[labels == 0, :, :, : SIZE // 2] += 0.7
    images[labels == 1, :, :, SIZE // 2:] += 0.7
    return images.clamp(0, 1), labels


def load_toy(per_class, seed=0):
    splits = []
    for offset in range(3):
        images, labels = toy_images(per_class, seed * 3 + offset)
        splits.append(Split(images, labels))
    return Dataset("toy", ["left", "right"], *splits)


def open_toy(request):
    per_class = int(request.data[len("toy:"):])
    return call_with_options(load_toy, "toy", request.options, per_class=per_class, seed=request.seed)


SOURCE = DataSource("toy", detect=lambda data: data.startswith("toy:"), open=open_toy,
                    description="toy:N, N generated images per class")


class ToyStream:
    """A training split read front to back (the iterable contract), in shards of 4 samples
    dealt to the readers (processes x workers); each reader reads its samples pass after pass."""

    bad_files = "fail"

    def __init__(self, per_class):
        self.images, self.labels = toy_images(per_class)
        self.image_shape = tuple(self.images.shape[1:])
        self.num_samples = len(self.labels)
        self.skipped = {}
        self.rank, self.world_size, self.epoch = 0, 1, 0
        self.workers, self.consumed, self.first_worker = 1, [0], 0

    def set_share(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch):
        self.epoch, self.consumed, self.first_worker = epoch, [0] * self.workers, 0

    def _samples(self, worker):
        readers, reader = self.world_size * self.workers, self.rank + self.world_size * worker
        mine = [i for i in range(self.num_samples) if (i // 4) % readers == reader]
        passes = 0
        while True:
            order = torch.randperm(len(mine), generator=torch.Generator().manual_seed(self.epoch * 1000 + passes))
            yield from (mine[j] for j in order.tolist())
            passes += 1

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = (self.first_worker + (info.id if info is not None else 0)) % self.workers
        samples = self._samples(worker)
        for _ in range(self.consumed[worker]):
            next(samples)
        for i in samples:
            yield self.images[i], int(self.labels[i]), f"shard-{i // 4}/{i}"

    def state_dict(self):
        return {"epoch": self.epoch, "workers": self.workers, "consumed": list(self.consumed),
                "first_worker": self.first_worker}

    def load_state_dict(self, state):
        self.epoch, self.workers = state["epoch"], state["workers"]
        self.consumed, self.first_worker = list(state["consumed"]), state.get("first_worker", 0)


class ToyStreamData:
    def __init__(self, per_class):
        held = load_toy(per_class)
        self.name, self.class_names, self.image_shape = "toy-stream", held.class_names, held.image_shape
        self.train, self.val, self.test = ToyStream(per_class), held.val, held.test

    @property
    def num_classes(self):
        return len(self.class_names)

    def readout(self, workers=0):
        """All of the (small) stream as the read-out's training sample."""
        return Dataset("toy-stream", self.class_names, Split(self.train.images, self.train.labels), self.val, self.test)


ITERABLE_SOURCE = DataSource("toy-stream", detect=lambda data: data.startswith("toy-stream:"),
                             open=lambda request: ToyStreamData(int(request.data[len("toy-stream:"):])),
                             description="toy-stream:N, the toy images read front to back")
