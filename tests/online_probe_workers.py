"""Worker functions for tests/distributed/test_online_probe_distributed.py (imported by spawned
processes): the online probe trained on each rank's share of the batches, and its epoch numbers
read by each rank's share of the val images and of the kNN's memory; the online view retrieval
read by each rank's share of each batch of views."""

from __future__ import annotations

import torch

from contrastkit.data.base import Dataset, Split
from contrastkit.train import online
from contrastkit.train.online import OnlineProbe, OnlineViewRetrieval
from contrastkit.train.parallel import Parallel

SHAPE, FEATURES, CLASSES, SEED = (1, 4, 4), 6, 3, 5
BATCH, STEPS = 8, 3
#: Fewer than the training images: the kNN's memory is a sample, split over the ranks.
BANK = 10


def data() -> Dataset:
    g = torch.Generator().manual_seed(SEED)

    def split(n: int) -> Split:
        return Split(torch.rand(n, *SHAPE, generator=g), torch.randint(0, CLASSES, (n,), generator=g))

    return Dataset("tiny", [str(c) for c in range(CLASSES)], split(14), split(7), split(3), SHAPE)


def encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, FEATURES), torch.nn.Tanh())


def steps():
    """``STEPS`` global batches ``(view_a, view_b, labels)``, the same on every process."""
    g = torch.Generator().manual_seed(SEED + 1)
    return [(torch.rand(BATCH, *SHAPE, generator=g), torch.rand(BATCH, *SHAPE, generator=g),
             torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(STEPS)]


def trained(rank: int, world: int):
    """The probe after ``STEPS`` steps on this rank's share of each batch, and its epoch numbers."""
    online.KNN_BANK = BANK
    net, dataset = encoder(), data()
    probe = OnlineProbe(FEATURES, CLASSES, torch.device("cpu"), seed=SEED, knn_k=3, knn_temperature=0.1,
                        parallel=Parallel(rank, world))
    probe.attach(net)
    share = BATCH // world
    for view_a, view_b, labels in steps():
        rows = slice(rank * share, (rank + 1) * share)
        with probe.capturing():
            net(torch.cat([view_a[rows], view_b[rows]]))
        probe.train_step(labels[rows])
    numbers = probe.evaluate(net, dataset)
    return {"numbers": numbers, "head": {k: v.clone() for k, v in probe.head.state_dict().items()}}


class NoisyViews:
    """Two views of each image: the image plus Gaussian noise (drawn from the global CPU RNG, as
    the augmentations draw theirs)."""

    def views_of(self, images):
        return images + 0.3 * torch.randn_like(images), images + 0.3 * torch.randn_like(images)


#: Images whose views are made and read at a time: the 7 val images span 3 batches.
VIEW_BATCH = 3


def retrieval(rank: int, world: int):
    """The online view retrieval's numbers, this rank reading its share of each batch of views."""
    return OnlineViewRetrieval(NoisyViews(), torch.device("cpu"), seed=SEED, parallel=Parallel(rank, world),
                               batch_size=VIEW_BATCH).evaluate(encoder(), data())


def mismatched(rank: int, world: int):
    """The view retrieval when rank 1 reads one val image fewer (a file it skipped as damaged,
    or changed since rank 0 read it): its numbers, and the warnings it gave."""
    import warnings

    dataset = data()
    if rank == 1:
        dataset = Dataset("tiny", dataset.class_names, dataset.train,
                          Split(dataset.val.images[:-1], dataset.val.labels[:-1]), dataset.test, SHAPE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numbers = OnlineViewRetrieval(NoisyViews(), torch.device("cpu"), seed=SEED, parallel=Parallel(rank, world),
                                      batch_size=VIEW_BATCH).evaluate(encoder(), dataset)
    return {"numbers": numbers, "warnings": [str(w.message) for w in caught]}


def damaged(rank: int, world: int) -> str:
    """The error each rank raises when rank 1's share of the kNN's memory holds a damaged file
    (only rank 1 reads it: the others must not wait for it in the next collective)."""
    from contrastkit.data import BadItemError

    probe = OnlineProbe(FEATURES, CLASSES, torch.device("cpu"), seed=SEED, knn_k=3, knn_temperature=0.1,
                        parallel=Parallel(rank, world))
    features = probe._features

    def reading(encoder, split, rows, workers):
        if rank == 1:
            raise BadItemError("photos/broken.jpg: cannot read image")
        return features(encoder, split, rows, workers)

    probe._features = reading
    try:
        probe.evaluate(encoder(), data())
    except BadItemError as err:
        return str(err)
    return "no error"


def worker(rank: int, world: int):
    return {**trained(rank, world), "views": retrieval(rank, world), "damaged": damaged(rank, world),
            "mismatched": mismatched(rank, world)}
