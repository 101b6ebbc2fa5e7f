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
  stably (e.g. ``"shard-00042.tar/img_0193"``), by which it is split, skipped and named. A
  split of image-text pairs (``paired`` true) yields ``(image, label, key, text)``, ``text``
  the sample's caption; its ``texts`` are every training caption (the run's tokenizer is built
  from them), and its held-out splits and read-out sample carry ``texts`` as lists.
* **Shares.** :meth:`IterableSplit.set_share` tells the split which share of each epoch this
  process reads (``rank`` of ``world_size`` under torchrun); within a process the
  ``DataLoader`` workers split that share further among themselves
  (``torch.utils.data.get_worker_info()``, e.g. shard ``i`` to worker ``i % workers``), so
  each sample of a pass is read by exactly one worker of one rank.
* **Epochs.** A worker's iteration does not end: it reads its shards pass after pass (each
  pass in a new order), and the reader takes what an epoch needs. An epoch is
  ``num_samples // world_size`` samples per rank (``num_samples``: the training samples of
  one pass over the whole split, declared by the split or counted when it is opened), so
  every rank takes the same number of steps and the learning-rate and temperature schedules
  know the run's length before it starts (open_clip asks ``--train-num-samples`` for the
  same reason); a rank whose shards hold fewer samples repeats some.
* **Order.** :meth:`IterableSplit.set_epoch` is called before each epoch; the order (which
  shards a worker reads, a shuffle buffer) is a function of ``(seed, epoch)`` alone, never of
  the global RNG, which the views draw from.
* **Resume.** The position is what each worker has consumed: :meth:`IterableSplit.load_state_dict`
  takes ``{"epoch", "workers", "consumed": [samples per worker], "first_worker"}`` (the
  ``DataLoader``'s worker ``j`` reads as worker ``(first_worker + j) % workers``, so that a
  resumed epoch's batches keep their order) and the split continues exactly there, replaying
  its shuffle buffer rather than storing it; :meth:`IterableSplit.state_dict` gives the
  position last set. The batch composition depends on the number of workers (each batch is
  one worker's), so **a run resumes with the ``--workers`` it started with**: another number
  is refused naming the option. The state is plain data written into the checkpoint per rank.
* **Held-out splits.** ``val`` and ``test`` are read whole, in order, more than once (the
  probe, kNN and the held-out loss), so they are map-style :class:`~contrastkit.data.DataSplit`
  objects: held-out shards opened by index, or samples set aside by key.
  :func:`split_of_key` is the rule to set them aside by: a sample is in val or test by the
  SHA-1 of its key (the rule of unlabeled collections, :mod:`contrastkit.data.collection`), so
  adding shards never moves a sample between splits; the training split then yields only the
  keys :func:`split_of_key` puts in ``"train"``.
* **The read-out's training features.** The kNN monitor and the linear probe read a bounded,
  seeded, map-style sample of the training split: the data set's ``readout()`` gives the
  map-style data set they read (``train``: that sample; ``val``, ``test``), the same at every
  epoch and on resume, and its size is recorded in the run's ``config.json``.
* **Skipped samples.** A sample that cannot be read is yielded as a :class:`DamagedSample`
  (its key and why) in its place, so that positions stay countable and the record reaches the
  main process with the batch: with ``bad_files == "skip"`` the reader leaves it out of the
  batch and records ``skipped[key] = reason`` (the run names it in ``skipped.txt``); with
  ``"fail"`` it raises :class:`~contrastkit.data.BadItemError` naming the key.

The training loop reads such a data set through
:class:`~contrastkit.data.batch_source.StreamBatchSource`; what cannot work on a stream
(holding the training images on the device, a per-sample temperature method, views made in
the workers) is refused before any work, naming the option.
:mod:`contrastkit.data.shards` is the reference source: a folder of tar shards.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, NamedTuple, Protocol, Tuple, runtime_checkable

__all__ = ["IterableSplit", "IterableDataSplits", "DamagedSample", "is_iterable_data", "check_indexed", "split_of_key"]


class DamagedSample(NamedTuple):
    """A sample of a stream that could not be read, yielded in its place: its ``key`` and why
    (``reason``, which names the key)."""

    key: str
    reason: str


@runtime_checkable
class IterableSplit(Protocol):
    """A split read front to back (see the module's contract): ``image_shape`` ``(C, H, W)``,
    ``num_samples`` (the training samples of one pass), ``bad_files`` (``"skip"`` or
    ``"fail"``), ``skipped`` (``{key: reason}``)."""

    image_shape: Tuple[int, int, int]
    num_samples: int
    bad_files: str
    skipped: Dict[str, str]

    def set_share(self, rank: int, world_size: int) -> None:
        """Read the share ``rank`` of ``world_size`` of each epoch from now on."""

    def set_epoch(self, epoch: int) -> None:
        """Yield epoch ``epoch`` (its order a function of the seed and ``epoch``) next."""

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        """This worker's samples ``(image, label, key)`` (``(image, label, key, text)`` for image-text
        pairs) or :class:`DamagedSample`, without end."""

    def state_dict(self) -> Dict[str, Any]:
        """Plain data to continue exactly from here (epoch, position, shuffle buffer)."""

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`): the samples not yet yielded, in order."""


@runtime_checkable
class IterableDataSplits(Protocol):
    """A data set whose ``train`` is an :class:`IterableSplit` and whose ``val`` and ``test``
    are map-style :class:`~contrastkit.data.DataSplit` objects; ``name``, ``class_names``,
    ``num_classes``, ``image_shape`` as for :class:`~contrastkit.data.DataSplits`; ``readout()``
    the map-style data set the read-out reads (``train`` a bounded, seeded sample of the
    training split)."""

    name: str
    train: Any
    val: Any
    test: Any

    def readout(self) -> Any:
        """A map-style data set: ``train`` a bounded, seeded sample of the stream, ``val``, ``test``."""


def is_iterable_data(dataset: Any) -> bool:
    """Whether ``dataset``'s training split is an :class:`IterableSplit` (read front to back,
    not by index)."""
    return isinstance(getattr(dataset, "train", None), IterableSplit)


def check_indexed(dataset: Any, what: str) -> None:
    """Refuse, in one line naming ``what`` and the data set, an iterable data set where only
    splits read by sample index can be used (e.g. the Lightning data module)."""
    if is_iterable_data(dataset):
        raise ValueError(f"{what} reads the training split by sample index (to shuffle, split among processes and "
                         f"resume); the data set {getattr(dataset, 'name', type(dataset).__name__)!r} is iterable "
                         "(contrastkit.data.IterableSplit), which it cannot read; contrastkit pretrain can")


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
