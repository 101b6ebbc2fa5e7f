"""One contract for a data set and its splits, whatever holds the images.

Every storage kind contrastkit reads (images held in memory as one tensor, images streamed from
files or from a user's ``torch.utils.data.Dataset``, image-text pairs of either kind) is a
:class:`DataSplits` of three :class:`DataSplit` objects; the rest of contrastkit reads them only
through this module's functions (:func:`image_batches`, :func:`limit_split`, :func:`item_dataset`,
:func:`training_views`, :class:`~contrastkit.data.batches.PairedImages`, :func:`data_record`) and :func:`open_data`, the
one entry point that opens any ``--data``. Whether a split is held or streamed is asked here and
nowhere else: a new storage kind is added in :mod:`contrastkit.data` alone.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, Optional, Protocol, Tuple, Union, runtime_checkable

import torch
from torch import Tensor

from .base import NO_LABEL, stratified_subset, stratified_subset_indices
from .batches import StreamedViews
from .loader import make_loader
from .streaming import as_streaming, in_memory, is_streaming, subset_split, unit_float

__all__ = ["DataSplit", "DataSplits", "open_data", "as_data", "image_batches", "indexed_image_batches", "limit_split", "limit_splits",
           "item_dataset", "reads_files", "training_views", "data_record", "read_held_out_files"]


@runtime_checkable
class DataSplit(Protocol):
    """One split (train, val or test) of any storage: ``len(split)`` samples, ``labels``
    ``(n,)`` int64 class ids or ``None``, ``image_shape`` ``(C, H, W)``; a paired split also
    has ``texts`` (``n`` strings). Its images are read with :func:`image_batches` (in order)
    or, for training, through :func:`~contrastkit.data.make_loader`."""

    labels: Optional[Tensor]

    def __len__(self) -> int: ...


@runtime_checkable
class DataSplits(Protocol):
    """A data set: ``train``, ``val``, ``test`` :class:`DataSplit` objects, ``name``,
    ``class_names`` (empty without labels), ``num_classes``, ``image_shape`` ``(C, H, W)``."""

    name: str
    train: Any
    val: Any
    test: Any

    @property
    def num_classes(self) -> int: ...


def open_data(data: Union[str, os.PathLike], *, seed: int = 0, workers: int = 0, paired: bool = False,
              unlabeled: bool = False, bad_files: Optional[str] = None, eval_data: Optional[str] = None,
              index: Optional[Union[str, os.PathLike]] = None, collection_changed: str = "stop",
              **options: Any) -> Any:
    """The one entry point that opens any ``--data``: the first registered data source
    (:mod:`contrastkit.data.sources`) whose ``detect`` recognises ``data`` opens it, as a
    :class:`DataSplits` (or, for a source of that kind, an iterable data set:
    :mod:`contrastkit.data.iterable`). A path's format is looked at once.

    Args:
        data: for images, ``"glyphlab"``, ``"digits"``, a path (:func:`~contrastkit.data.load_dataset`)
            or what a registered source recognises; with ``paired``, ``"glyphlab-text"``,
            ``"digits-text"`` or a ``.csv`` of image, text rows (``contrastkit.data.load_paired``).
        seed: the generated data sets' seed (real data ignore it).
        workers: DataLoader worker processes the run will use: a folder of class subfolders is
            streamed (only its file index held, :func:`~contrastkit.data.stream_image_folder`)
            when ``workers > 0`` or the option ``stream=true`` asks for it (``stream=false``
            loads it whole).
        unlabeled: read a folder as an unlabeled collection even when it has class subfolders
            (:func:`~contrastkit.data.collection.open_collection`); a flat or nested folder
            without class structure, or a ``.txt`` / ``.csv`` list of image paths, is one anyway.
        bad_files: ``"skip"`` (an unlabeled collection's default) or ``"fail"``: what a damaged
            image file does (collections only; the other kinds stop at a damaged file).
        eval_data: held-out data that a source takes its val and test splits from (labelled
            tar shards: :func:`~contrastkit.data.open_tar_shards`'s ``held_out``); the other
            sources leave it to the run's read-out.
        index, collection_changed: where an unlabeled collection's listing was recorded (a
            run's ``collection-index.npz``), read instead of listing the collection while it is
            unchanged, and what a collection whose files changed since does (``"stop"``,
            ``"reindex"``, ``"keep"``: :func:`~contrastkit.data.collection.open_collection`).
        options: the loader's options.
    """
    from .collection import BAD_FILES
    from .sources import DataRequest, find_data_source, open_source

    if bad_files is not None and bad_files not in BAD_FILES:
        raise ValueError(f"bad_files must be one of {BAD_FILES}, got {bad_files!r}")
    stream = options.pop("stream", None)
    if stream is not None and not isinstance(stream, bool):
        raise ValueError(f"data option stream must be true or false, got {stream!r}")
    if index is not None and not paired and not unlabeled and os.path.exists(index):
        from .collection_index import recorded_source
        from .sources import is_data_name

        # The collection a run recorded is one: its format is not looked at again (that reads
        # every entry of a flat folder, to tell it from class folders).
        unlabeled = not is_data_name(os.fspath(data)) and \
            recorded_source(index) == os.path.abspath(os.path.expanduser(os.fspath(data)))
    source = find_data_source(data, pairs=paired, unlabeled=unlabeled)
    request = DataRequest(data=os.fspath(data), seed=seed, workers=workers, stream=stream, bad_files=bad_files,
                          options=options, eval_data=eval_data,
                          index=None if index is None else os.fspath(index), collection_changed=collection_changed)
    return open_source(source, request)


def as_data(dataset: Any) -> Any:
    """A data set as a run reads it: a contrastkit data set (any storage) as it is; a user's
    map-style ``torch.utils.data.Dataset`` of ``(image, label)`` (a torchvision data set such
    as ``ImageFolder``, ``CIFAR10``, ``STL10``, ``FakeData``: PIL images or tensors, labels
    from its ``targets`` / ``labels``, class names from its ``classes``), or a dict of them with
    the key ``train`` (and ``val``, ``test``: e.g. ``CIFAR10(root, train=False)`` as ``test``),
    streamed (:func:`~contrastkit.data.as_streaming`: items read in the ``DataLoader``
    workers). Anything else is a ``TypeError`` saying what is accepted."""
    if hasattr(dataset, "train") and hasattr(dataset, "image_shape"):
        return dataset
    if isinstance(dataset, dict):
        unknown = sorted(set(dataset) - {"train", "val", "test"})
        if unknown or "train" not in dataset:
            raise ValueError(f"a dict of data sets needs the key 'train' (and optionally 'val', 'test'), got "
                             f"{sorted(dataset)}")
        for key, value in dataset.items():
            _check_data_object(value, f"dataset[{key!r}]")
        return as_streaming(**dataset)
    _check_data_object(dataset, "dataset")
    return as_streaming(dataset)


def _check_data_object(dataset: Any, what: str) -> None:
    """``TypeError`` naming ``what`` for an object that is not a map-style data set (a path, an
    array, a data set class instead of an instance, an iterable-style data set)."""
    accepted = ("a contrastkit data set, a map-style torch.utils.data.Dataset of (image, label) (e.g. a "
                "torchvision data set object) or a dict of them with keys 'train', 'val', 'test'")
    if isinstance(dataset, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} takes a data set object; {dataset!r} is a path: give it as the data (config.data, "
                        f"--data) instead, or pass {accepted}")
    if isinstance(dataset, type):
        raise TypeError(f"{what} is the class {dataset.__name__}, not a data set: pass an instance (e.g. "
                        f"{dataset.__name__}(root, ...))")
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError(f"{what} is an iterable-style data set ({type(dataset).__name__}); contrastkit reads items "
                        "by index (map-style, with __getitem__ and __len__), to shuffle, split and resume")
    if isinstance(dataset, Tensor) or hasattr(dataset, "__array_interface__") or \
            not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(f"{what} must be {accepted}; got {type(dataset).__name__} (not a map-style data set)")


def image_batches(images: Any, batch_size: int = 256, workers: int = 0) -> Iterator[Tensor]:
    """Consecutive batches of a split's images (or of an ``(n, C, H, W)`` tensor), in order, the
    last one partial: ``(b, C, H, W)`` float in ``[0, 1]``, slices of held images or streamed
    items decoded ``batch_size`` at a time in ``workers`` processes (never the whole split at
    once). The one way the read-out and ``contrastkit embed`` read a split. A damaged file an
    unlabeled collection skips is left out (:func:`indexed_image_batches` says which rows came)."""
    for batch, _ in indexed_image_batches(images, batch_size, workers):
        yield batch


def indexed_image_batches(images: Any, batch_size: int = 256, workers: int = 0) -> Iterator[Tuple[Tensor, Tensor]]:
    """:func:`image_batches` with each batch's item indices ``(b,)`` int64 (all of them, in
    order, except the damaged files an unlabeled collection skipped)."""
    if isinstance(images, Tensor):
        held: Optional[Tensor] = images
    else:
        held = images.images if in_memory(images) else None
    if held is not None:
        for i in range(0, held.shape[0], batch_size):
            yield held[i:i + batch_size], torch.arange(i, min(i + batch_size, held.shape[0]))
        return
    for batch, indices in make_loader(images, batch_size=batch_size, workers=workers):
        yield unit_float(batch), indices


def read_held_out_files(dataset: Any, *, batch_size: int = 256, workers: int = 0) -> int:
    """Read once every image of the val and test splits of an unlabeled collection (a
    ``source == "collection"`` data set) or of tar shards (``"tar-shards"``), whose files a run otherwise reads in part (the
    label-free read-out takes the first 2,000 of test) or not at all (val, without
    ``--eval-every``): a damaged file is then recorded and named with the training ones
    (``bad_files="skip"``), or raises :class:`~contrastkit.data.BadItemError` naming it
    (``"fail"``), as a training file does. Other data sets: nothing is read. Returns the number
    of images read."""
    if getattr(dataset, "source", None) not in ("collection", "tar-shards") or getattr(dataset, "held_out_read", False):
        return 0
    read = 0
    for split in (dataset.val, dataset.test):
        if in_memory(split):  # held images were read when the data set was loaded
            continue
        for batch, _ in make_loader(split, batch_size=batch_size, workers=workers):
            read += int(batch.shape[0])
    return read


def limit_split(split: Any, n: int, seed: int) -> Any:
    """A class-stratified subset of ``n`` samples of ``split`` drawn with ``seed``
    (:func:`~contrastkit.data.stratified_subset`): held images are copied, a streamed split
    keeps its file index (nothing decoded)."""
    if in_memory(split):
        return stratified_subset(split, n, seed)
    labels = getattr(split, "labels", None)
    return subset_split(split, stratified_subset_indices(None if labels is None else labels.tolist(),
                                                         len(split), n, seed))


def limit_splits(dataset: Any, *, train: Optional[int] = None, val: Optional[int] = None,
                 test: Optional[int] = None, seed: int = 0) -> Any:
    """``dataset`` with each split cut to ``train`` / ``val`` / ``test`` samples (``None``:
    kept whole) by :func:`limit_split`. The data set is returned unchanged when no limit
    applies; otherwise a shallow copy with the cut splits."""
    import copy

    limits = {"train": train, "val": val, "test": test}
    if all(limit is None or limit >= len(getattr(dataset, name)) for name, limit in limits.items()):
        return dataset
    limited = copy.copy(dataset)
    for name, limit in limits.items():
        if limit is not None:
            setattr(limited, name, limit_split(getattr(dataset, name), limit, seed))
    return limited


def item_dataset(split: Any, *, with_index: bool = False) -> torch.utils.data.Dataset:
    """``split`` as a map-style ``torch.utils.data.Dataset`` of ``(image, label)`` items (held
    images as float tensors, streamed ones as decoded), for a ``DataLoader`` of one's own;
    ``with_index``: items ``(image, label, i)``, ``i`` the item's index in ``split`` (a loader
    then batches the sample indices a per-sample temperature method keeps its state by).

    A split without labels (``labels`` is ``None``: an unlabeled collection, held images
    without labels such as image-text pairs without a ``label`` column) gives every item the
    label :data:`NO_LABEL` (-1), never a class id: the same items whether the images are held
    or streamed, so a loader of either batches ``(images, labels)`` alike."""
    if in_memory(split):
        labels = getattr(split, "labels", None)
        if labels is None:
            labels = torch.full((len(split),), NO_LABEL, dtype=torch.int64)
        index = (torch.arange(len(split), dtype=torch.int64),) if with_index else ()
        return torch.utils.data.TensorDataset(split.images, labels, *index)
    return _WithItsIndex(split) if with_index else split


class _WithItsIndex(torch.utils.data.Dataset):
    """Item ``i`` of a streamed split as ``(image, label, i)`` (an unreadable item raises as the
    split does)."""

    def __init__(self, split: Any) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> Tuple[Any, Any, int]:
        image, label = self.split[index][:2]
        return image, label, int(index)


def reads_files(split: Any) -> bool:
    """Whether a loader over ``split`` decodes its items (so that pinned host memory helps on
    a GPU); held images are indexed where they lie."""
    return not in_memory(split)


def training_views(dataset: Any, mode: str = "augment", device: Union[torch.device, str, None] = None,
                   strength: Optional[float] = None, *, transform: Optional[Callable[[Tensor], Any]] = None,
                   seed: int = 0) -> Any:
    """The batch maker of a run's two views: :func:`~contrastkit.data.make_views` (batched
    kornia on ``device``), reading a streamed batch's images from the loader
    (``contrastkit.data.batches.StreamedViews``: the loop hands them over with ``hold``).

    With ``transform`` (a ``torchvision.transforms.v2`` pipeline, or any callable from a
    ``(C, H, W)`` image tensor to a view), the views are that transform applied twice per
    image in the ``DataLoader`` workers instead, drawn under ``seed``
    (:class:`~contrastkit.data.TransformViews`: the training loader reads its
    ``training_items``); ``mode`` must then be ``"augment"`` and ``strength`` ``None``."""
    if transform is not None:
        from .transform_views import TransformViews

        if mode != "augment":
            raise ValueError(f"views {mode!r} pair noise realisations; a transform makes two augmentations of "
                             "each image (views 'augment')")
        if strength is not None:
            raise ValueError("the view strength tunes the kornia views; with a transform, set the augmentation "
                             "in the transform itself")
        return TransformViews(transform, seed=seed, device=None if device is None else torch.device(device))
    from .views import make_views

    views = make_views(dataset, mode=mode, device=device, strength=strength)
    return StreamedViews(views) if is_streaming(dataset) else views


def data_record(dataset: Any) -> Dict[str, Any]:
    """What a run's ``config.json`` records of its data: name, kind (``source``: what decides
    how image files are sized, :func:`~contrastkit.data.preprocessing_of`), classes, image
    shape, split sizes and whether the images were streamed."""
    return {"name": dataset.name, "source": str(getattr(dataset, "source", "") or dataset.name),
            "num_classes": int(dataset.num_classes),
            "image_shape": list(dataset.image_shape),
            "sizes": {s: len(getattr(dataset, s)) for s in ("train", "val", "test")},
            "streamed": is_streaming(dataset)}
