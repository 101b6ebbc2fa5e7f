"""The contract of an iterable (sharded) data source: what it must give so that a run can
shuffle it, split it among processes, resume it exactly, hold out val and test, and report
the samples it could not read.

A map-style split (:class:`~contrastkit.data.DataSplit`) is read by sample index: the run
draws a permutation per epoch, each rank and worker reads its indices, and a checkpoint needs
only the epoch and the step. Data kept as shards (tar or parquet files of many samples, read
front to back) have no cheap index; their source gives an :class:`IterableDataSplits`
instead, whose training split is an :class:`IterableSplit`:

* **Samples.** Iterating yields ``(image, label, key)``: ``image`` ``(C, H, W)`` uint8, or
  float in ``[0, 1]``, of the split's ``image_shape``; ``label`` an int class id or
  :data:`~contrastkit.data.NO_LABEL` (-1); ``key`` a string naming the sample uniquely and
  stably (e.g. ``"shard-00042.tar/img_0193"``), by which it is split, skipped and named.
* **Shares.** :meth:`IterableSplit.set_share` tells the split which share of each epoch this
  process reads (``rank`` of ``world_size`` under torchrun); within a process the
  ``DataLoader`` workers split that share further among themselves
  (``torch.utils.data.get_worker_info()``, e.g. shard ``i`` to worker ``i % workers``), so
  each sample of an epoch is read by exactly one worker of one rank. Every rank must yield
  the same number of samples per epoch (drop or repeat to the smallest share), or the
  collective steps of the ranks would fall out of step.
* **Order and epochs.** :meth:`IterableSplit.set_epoch` is called before each epoch; the
  order (shard order, a shuffle buffer) is a function of ``(seed, epoch)`` alone, never of
  the global RNG, which the views draw from.
* **Resume.** :meth:`IterableSplit.state_dict` gives, at a step boundary, what
  :meth:`IterableSplit.load_state_dict` needs to continue with exactly the samples not yet
  yielded, in the same order: the epoch, the position (shard and offset, or the number of
  samples this share has yielded) and the shuffle buffer's state (its contents' keys, or the
  generator state to rebuild it). The state is plain data (ints, strings, lists, dicts),
  written into the run's checkpoint per rank; it must not depend on the number of workers,
  which may differ on resume (count positions per share, and let workers skip to theirs).
* **Held-out splits.** ``val`` and ``test`` are read whole, in order, more than once (the
  probe, kNN and the held-out loss), so they are map-style :class:`~contrastkit.data.DataSplit`
  objects: held-out shards opened by index, or samples set aside by key.
  :func:`split_of_key` is the rule to set them aside by: a sample is in val or test by the
  SHA-1 of its key (the rule of unlabeled collections, :mod:`contrastkit.data.collection`), so
  adding shards never moves a sample between splits; the training split then yields only the
  keys :func:`split_of_key` puts in ``"train"``.
* **Skipped samples.** A sample that cannot be read is reported the way a collection reports
  a damaged file: with ``bad_files == "skip"`` the split leaves it out and records
  ``skipped[key] = reason`` (the dict :func:`~contrastkit.data.skipped_files` and
  :func:`~contrastkit.data.add_skipped` read, written to the run's ``skipped.txt``); with
  ``"fail"`` it raises :class:`~contrastkit.data.BadItemError` naming the key. A worker's
  record reaches the main process with the batch (as :class:`~contrastkit.data.DamagedItem`).

The training loop of this release reads splits by sample index only: it refuses an iterable
data set in one line naming it (:func:`check_indexed`). A source of this kind can already be
registered (:func:`~contrastkit.data.register_data_source`), opened and iterated.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Protocol, Tuple, runtime_checkable

from torch import Tensor

__all__ = ["IterableSplit", "IterableDataSplits", "is_iterable_data", "check_indexed", "split_of_key"]


@runtime_checkable
class IterableSplit(Protocol):
    """A split read front to back (see the module's contract): ``image_shape`` ``(C, H, W)``,
    ``bad_files`` (``"skip"`` or ``"fail"``), ``skipped`` (``{key: reason}``)."""

    image_shape: Tuple[int, int, int]
    bad_files: str
    skipped: Dict[str, str]

    def set_share(self, rank: int, world_size: int) -> None:
        """Read the share ``rank`` of ``world_size`` of each epoch from now on."""

    def set_epoch(self, epoch: int) -> None:
        """Yield epoch ``epoch`` (its order a function of the seed and ``epoch``) next."""

    def __iter__(self) -> Iterator[Tuple[Tensor, int, str]]:
        """This process's (this worker's) samples ``(image, label, key)`` of the epoch."""

    def state_dict(self) -> Dict[str, Any]:
        """Plain data to continue exactly from here (epoch, position, shuffle buffer)."""

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`): the samples not yet yielded, in order."""


@runtime_checkable
class IterableDataSplits(Protocol):
    """A data set whose ``train`` is an :class:`IterableSplit` and whose ``val`` and ``test``
    are map-style :class:`~contrastkit.data.DataSplit` objects; ``name``, ``class_names``,
    ``num_classes``, ``image_shape`` as for :class:`~contrastkit.data.DataSplits`."""

    name: str
    train: Any
    val: Any
    test: Any


def is_iterable_data(dataset: Any) -> bool:
    """Whether ``dataset``'s training split is an :class:`IterableSplit` (read front to back,
    not by index)."""
    return isinstance(getattr(dataset, "train", None), IterableSplit)


def check_indexed(dataset: Any, what: str) -> None:
    """Refuse, in one line naming ``what`` and the data set, an iterable data set where only
    splits read by sample index can be used (this release's training loop)."""
    if is_iterable_data(dataset):
        raise ValueError(f"{what} reads the training split by sample index (to shuffle, split among processes and "
                         f"resume); the data set {getattr(dataset, 'name', type(dataset).__name__)!r} is iterable "
                         "(contrastkit.data.IterableSplit), which it cannot read yet")


def split_of_key(key: str, val_fraction: float = 0.1, test_fraction: float = 0.2) -> str:
    """``"train"``, ``"val"`` or ``"test"``: the split of the sample ``key`` by the SHA-1 of the
    key (test below ``test_fraction`` of the hash range, val the next ``val_fraction``), the
    rule of unlabeled collections: stable as samples are added."""
    from .base import check_fraction
    from .collection import hash_fraction

    val_fraction = check_fraction(val_fraction, "val_fraction")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction + test_fraction}")
    position = hash_fraction(key)
    return "test" if position < test_fraction else "val" if position < test_fraction + val_fraction else "train"
