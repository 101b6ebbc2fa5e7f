"""Two views per image made by a per-image transform in the ``DataLoader`` workers, instead of
batched kornia on the training device.

The transform is any callable from one image, a ``(C, H, W)`` tensor (uint8 as streamed data
are decoded, float in ``[0, 1]`` for float data), to one view of the same kind: typically a
``torchvision.transforms.v2`` pipeline (``v2.Compose([v2.RandomResizedCrop(32), ...,
v2.ToDtype(torch.float32, scale=True)])``). It is applied twice to each image of a training
batch, in the workers, so the CPU augmentation runs in parallel with the training step.

The views of item ``i`` in epoch ``e`` are drawn from torch's (and Python's ``random``)
generator seeded with ``(seed, e, i)`` and restored afterwards: they depend on nothing else, not
on the number of workers nor on which worker reads the item, so a resumed run (on CPU) ends
with the weights of an uninterrupted one, and the training's own random stream is untouched.

No torchvision is imported here: the transform is the caller's object.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor

from contrastkit.data.batches import HeldImages
from contrastkit.data.streaming import BadItemError, in_memory, unit_float

__all__ = ["ViewItems", "TransformViews", "view_seed"]

#: Epoch key of the views drawn outside training (the held-out geometry's): fixed, so every
#: evaluation of a run sees the same views.
HELD_OUT_EPOCH = 0


def view_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of the views of item ``index`` in ``epoch`` of a run seeded ``seed`` (distinct
    for every ``(epoch, index)`` with ``index < 2**31``)."""
    return ((int(seed) * 1_000_003 + int(epoch)) * 2_654_435_761 + int(index)) % 2**63


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Torch's default CPU generator and Python's ``random`` seeded with ``seed``, restored after."""
    torch_state, python_state = torch.default_generator.get_state(), random.getstate()
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.default_generator.set_state(torch_state)
        random.setstate(python_state)


def _describe(transform: Any) -> str:
    """One line naming the transform (for errors and the run's record)."""
    text = " ".join(repr(transform).split())
    return text if len(text) <= 300 else text[:297] + "..."


class ViewItems(torch.utils.data.Dataset):
    """A split whose item ``(i, epoch)`` is ``(views, label)``: ``views`` ``(2, C, H, W)``, the
    transform applied twice to image ``i`` under :func:`view_seed` (an ``int`` key is epoch 0).

    Item 0's views set the shape and dtype every view must have (uint8, or float32 in
    ``[0, 1]``); they must be those of the split's images, which the read-out reads. A view
    that breaks this raises :class:`~contrastkit.data.BadItemError` naming the item.
    """

    #: :func:`~contrastkit.data.make_loader` keys this split's items by the epoch too (``EpochKeys``).
    keyed_by_epoch = True

    def __init__(self, split: Any, transform: Callable[[Tensor], Any], seed: int) -> None:
        if not callable(transform):
            raise TypeError(f"transform must be callable (a torchvision.transforms.v2 pipeline or any function "
                            f"from a (C, H, W) image tensor to a view), got {type(transform).__name__}")
        self.split, self.transform, self.seed = split, transform, int(seed)
        self.image_shape = tuple(int(s) for s in split.image_shape)
        self.labels = getattr(split, "labels", None)
        self._dtype: Optional[torch.dtype] = None
        first = self.views(0, HELD_OUT_EPOCH)
        if tuple(first.shape[1:]) != self.image_shape:
            raise ValueError(f"transform: its views have shape {tuple(first.shape[1:])}, the data's images "
                             f"{self.image_shape}; they must be the same (the encoder reads the views in training "
                             "and the images in the read-out): crop to the images' size (e.g. "
                             "RandomResizedCrop to it), or resize the images in the data set itself")
        self._dtype = first.dtype
        #: ``(2, C, H, W)`` and the dtype of an item's views (the loader's blank for a bad item).
        self.item_shape: Tuple[int, ...] = tuple(first.shape)
        self.item_dtype = first.dtype

    def __len__(self) -> int:
        return len(self.split)

    def image(self, index: int) -> Tensor:
        """Image ``index`` of the split as the transform receives it (``(C, H, W)``)."""
        return self.split.images[index] if in_memory(self.split) else self.split[index][0]

    def views(self, index: int, epoch: int) -> Tensor:
        """The two views ``(2, C, H, W)`` of image ``index`` in ``epoch``."""
        image = self.image(index)
        with _seeded(view_seed(self.seed, epoch, index)):
            pair = [self._checked(self.transform(image), index) for _ in range(2)]
        return torch.stack(pair)

    def _checked(self, view: Any, index: int) -> Tensor:
        what = f"transform {_describe(self.transform)}: item {index}'s view"
        if not isinstance(view, Tensor):
            raise BadItemError(f"{what} is a {type(view).__name__}; it must be a (C, H, W) tensor (end a "
                               "torchvision pipeline with v2.ToImage() / v2.ToDtype(torch.float32, scale=True))")
        view = view.as_subclass(Tensor)  # a torchvision tv_tensors.Image is a plain image here
        if view.dim() != 3:
            raise BadItemError(f"{what} has shape {tuple(view.shape)}; it must be (C, H, W)")
        if view.dtype != torch.uint8:
            if not view.is_floating_point():
                raise BadItemError(f"{what} is {view.dtype}; it must be uint8 or float in [0, 1]")
            view = view.float()
            if view.numel() and not (float(view.min()) >= 0.0 and float(view.max()) <= 1.0):
                raise BadItemError(f"{what} has values outside [0, 1] (or NaN); leave normalisation out of the "
                                   "transform: the encoder reads images in [0, 1], in training and in the read-out")
        if self._dtype is not None:
            if view.dtype != self._dtype or tuple(view.shape) != self.item_shape[1:]:
                raise BadItemError(f"{what} is {view.dtype} {tuple(view.shape)}, item 0's {self._dtype} "
                                   f"{self.item_shape[1:]}; every view must have the same shape and dtype")
        return view.contiguous()

    def __getitem__(self, key: Any) -> Tuple[Tensor, Any]:
        index, epoch = key if isinstance(key, tuple) else (key, HELD_OUT_EPOCH)
        label = None if self.labels is None else int(self.labels[index])
        return self.views(int(index), int(epoch)), label


class TransformViews:
    """The batch maker of a run whose views a per-image transform makes in the workers:
    ``views(split, indices) -> (view_a, view_b)``, each ``(b, C, H, W)`` float32 in ``[0, 1]``
    on ``device``.

    The training loader reads :meth:`training_items` (the views made in its workers) and hands
    each batch over with :meth:`hold`; any other batch (the held-out geometry's) is made here,
    item by item, with the same transform (under the epoch key 0, the same at every evaluation).
    """

    def __init__(self, transform: Callable[[Tensor], Any], *, seed: int = 0,
                 device: Optional[torch.device] = None) -> None:
        if not callable(transform):
            raise TypeError(f"transform must be callable (a torchvision.transforms.v2 pipeline or any function "
                            f"from a (C, H, W) image tensor to a view), got {type(transform).__name__}")
        self.transform, self.seed = transform, int(seed)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._items: Dict[int, Tuple[Any, ViewItems]] = {}
        self.pairs = HeldImages(read=self._make_pairs)
    @property
    def config(self) -> Dict[str, Any]:
        """What the run records of its views (``config.json``'s ``derived.views``)."""
        return {"mode": "transform", "transform": _describe(self.transform), "made_in": "DataLoader workers",
                "device": str(self.device)}

    def training_items(self, split: Any) -> torch.utils.data.Dataset:
        """``split`` as the training loader reads it: items ``(views, label)``."""
        cached = self._items.get(id(split))
        if cached is None or cached[0] is not split:
            cached = (split, ViewItems(split, self.transform, self.seed))
            self._items[id(split)] = cached
        return cached[1]

    def hold(self, split: Any, batch: Any) -> None:
        """The views ``(b, 2, C, H, W)`` the loader made of the training ``split``'s batch
        ``batch`` (a :class:`~contrastkit.data.batch_source.StepBatch`, its ``images`` the views)."""
        self.pairs.hold(split, batch.indices, batch.images)

    def _make_pairs(self, split: Any, indices: Tensor) -> Tensor:
        """The views ``(b, 2, C, H, W)`` of a batch the loader did not make, made here."""
        items = self.training_items(split)
        return torch.stack([items.views(int(i), HELD_OUT_EPOCH) for i in indices.tolist()])

    def __call__(self, split: Any, indices: Tensor) -> Tuple[Tensor, Tensor]:
        pairs = unit_float(self.pairs(split, indices).to(self.device, non_blocking=True))
        return pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
