"""A data source in one file, as a user's package would write it: ``--data toy:N`` is N tiny
generated images per class (two classes: bright left half, bright right half), held in memory.

The tests register it in process (``register_data_source(SOURCE)``) and, for the command
line, through the entry-point group ``contrastkit.data_sources`` (``toy = toy_source:SOURCE``).
An iterable variant (``toy-stream:N``, :data:`ITERABLE_SOURCE`) follows the iterable contract
(:mod:`contrastkit.data.iterable`), which the training loop refuses for now.
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
    """A training split read front to back (the iterable contract), in shards of 4 samples."""

    bad_files = "fail"

    def __init__(self, per_class):
        self.images, self.labels = toy_images(per_class)
        self.image_shape = tuple(self.images.shape[1:])
        self.skipped = {}
        self.rank, self.world_size, self.epoch, self.position = 0, 1, 0, 0

    def set_share(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch):
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        order = torch.randperm(len(self.labels), generator=torch.Generator().manual_seed(self.epoch))
        share = order[self.rank::self.world_size]
        for i in share[self.position:].tolist():
            self.position += 1
            yield self.images[i], int(self.labels[i]), f"shard-{i // 4}/{i}"

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.epoch, self.position = state["epoch"], state["position"]


class ToyStreamData:
    def __init__(self, per_class):
        held = load_toy(per_class)
        self.name, self.class_names, self.image_shape = "toy-stream", held.class_names, held.image_shape
        self.train, self.val, self.test = ToyStream(per_class), held.val, held.test

    @property
    def num_classes(self):
        return len(self.class_names)


ITERABLE_SOURCE = DataSource("toy-stream", detect=lambda data: data.startswith("toy-stream:"),
                             open=lambda request: ToyStreamData(int(request.data[len("toy-stream:"):])),
                             description="toy-stream:N, the toy images read front to back")
