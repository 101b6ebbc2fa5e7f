"""View makers: two views of each sample in a batch, produced on the training device.

``make_views(ds, mode, device, strength)`` returns a :class:`ViewMaker`; calling it with a
split and a batch of indices returns ``(view_a, view_b)``, each ``(b, C, H, W)`` float32 in
``[0, 1]`` on ``device``. Row ``i`` of ``view_a`` and row ``i`` of ``view_b`` are the positive
pair of sample ``indices[i]``; labels are never used to form pairs.

Modes:

``"augment"``
    Two independent SimCLR augmentations of the canonical image (kornia, batched):
    random resized crop -> horizontal flip -> colour jitter (p = 0.8; brightness/contrast only
    for 1-channel data) -> random grayscale (p = 0.2, RGB only) -> Gaussian blur (p = 0.5).
``"A"``
    Two different noise realisations of the same scene (the textbook's exercise F5,
    section 30.2: definition A).
``"B"``
    One realisation and a different realisation rotated by 90 degrees (``torch.rot90``,
    counter-clockwise) -- definition B.

``strength`` is one knob from identity (0) to the full default augmentation (1) and beyond
(up to 2): colour-jitter magnitudes scale with it, the crop's minimum area and the
flip/grayscale/blur probabilities interpolate towards identity as it goes to 0. The default
is 1 for ``"augment"`` and 0 (no augmentation on top of the noise) for ``"A"``/``"B"``; with
``strength > 0`` the A/B views are additionally augmented (before B's rotation).

All randomness (realisation choice and kornia's parameters) comes from torch's global CPU
generator, so ``torch.manual_seed`` or a restored ``torch.get_rng_state()`` reproduces it, on
any device: the augmentations draw their parameters on the host and apply them where the
images are (kornia moves its random generator with ``.to(device)``; the view maker does not
move it), which also keeps kornia's checks of its parameters from waiting for a GPU.

A view maker may hold a split's images on its device (``hold_split``, what
``--data-on-device`` does; :mod:`contrastkit.data.on_device`): uint8 where lossless, read
through :func:`~contrastkit.data.unit_float`, so the views are the same as from the host.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from contrastkit.data.base import Dataset, Split
from contrastkit.data.streaming import unit_float
from contrastkit.losses.validation import require

MODES = ("augment", "A", "B")

# Per-source augmentation defaults at strength 1. ``crop_scale`` is RandomResizedCrop's area
# range; ``flip`` says whether a horizontal flip preserves the label.
_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # The bar spans >= 45% of the side and is centred away from the border, so a crop keeping
    # >= 60% of the area always keeps a long piece of it; the aspect-ratio change (3/4..4/3)
    # moves a 45-degree bar to at most ~53 degrees, still diagonal. A flip maps 45 <-> 135
    # degrees, both "diagonal", and keeps vertical/horizontal: label-preserving.
    "glyphlab": dict(crop_scale=(0.6, 1.0), flip=True),
    # Mirrored digits are not digits (and 2/5, 6/9-like confusions appear): no flip.
    "digits": dict(crop_scale=(0.5, 1.0), flip=False),
    "mnist": dict(crop_scale=(0.5, 1.0), flip=False),
    # SimCLR's CIFAR-10 recipe (with a less extreme minimum crop for 32x32 images).
    "cifar10": dict(crop_scale=(0.2, 1.0), flip=True),
}
_RGB_DEFAULT = dict(crop_scale=(0.2, 1.0), flip=True)
# Single-channel data of unknown kind: treat like handwriting (no flip, milder crops).
_GRAY_DEFAULT = dict(crop_scale=(0.5, 1.0), flip=False)

# Cached device copies larger than this are not kept; batches are moved instead.
_CACHE_LIMIT_BYTES = 2 << 30


def _check_strength(strength: object) -> float:
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength) \
            or not (0.0 <= float(strength) <= 2.0):
        raise ValueError(f"strength must be a number in [0, 2], got {strength!r}")
    return float(strength)


def _build_augmentation(channels: int, height: int, width: int, strength: float,
                        crop_scale: Tuple[float, float], flip: bool) -> Optional[torch.nn.Module]:
    """The kornia pipeline for one view, or ``None`` at strength 0 (identity)."""
    if strength == 0.0:
        return None
    import kornia.augmentation as K  # lazy: kornia is an optional dependency

    s = strength
    level = min(s, 1.0)
    lo = 1.0 - (1.0 - crop_scale[0]) * level
    steps = [K.RandomResizedCrop((height, width), scale=(lo, crop_scale[1]), ratio=(3 / 4, 4 / 3),
                                    cropping_mode="resample")]
    if flip:
        steps.append(K.RandomHorizontalFlip(p=0.5 * level))
    # SimCLR's colour distortion with s = 0.5 (its CIFAR-10 setting) at strength 1.
    if channels == 3:
        steps.append(K.ColorJitter(0.4 * s, 0.4 * s, 0.4 * s, min(0.1 * s, 0.5), p=0.8))
        steps.append(K.RandomGrayscale(p=0.2 * level))
    else:
        steps.append(K.ColorJitter(0.4 * s, 0.4 * s, 0.0, 0.0, p=0.8))
    kernel = max(3, int(0.1 * min(height, width)) | 1)  # ~10% of the side, odd (SimCLR)
    steps.append(K.RandomGaussianBlur((kernel, kernel), (0.1, 2.0 if kernel > 3 else 1.0), p=0.5 * level))
    return torch.nn.Sequential(*steps)


#: Pixel values (rows x C x H x W) one kornia augmentation call takes at most: 2,048 rows of
#: 3 x 32 x 32 (1,024 CIFAR pairs), 41 rows of 3 x 224 x 224. Each call holds about ten float
#: copies of its input, ~250 MiB at this size; a 16,384-pair CIFAR batch in one call held 3.9 GiB.
AUGMENT_CALL_VALUES = 2048 * 3 * 32 * 32


def augment_rows(image_shape: Sequence[int]) -> int:
    """Rows of ``image_shape`` ``(C, H, W)`` a view maker augments in one kornia call
    (:data:`AUGMENT_CALL_VALUES`; at least one)."""
    c, h, w = (int(v) for v in image_shape)
    return max(1, AUGMENT_CALL_VALUES // (c * h * w))


class ViewMaker:
    """Callable ``(split, indices) -> (view_a, view_b)``; build it with :func:`make_views`."""

    def __init__(self, dataset: Dataset, mode: str, device: torch.device, strength: float,
                 crop_scale: Tuple[float, float], flip: bool) -> None:
        self.dataset_name = dataset.name
        self.mode = mode
        self.device = device
        self.strength = strength
        self.crop_scale = crop_scale
        self.flip = flip
        c, h, w = dataset.image_shape
        self.image_shape = (int(c), int(h), int(w))
        # Not moved to the device: its random generator stays on the host (module docstring).
        self._augment = _build_augmentation(c, h, w, strength, crop_scale, flip)
        self._cache: Dict[int, Tuple[Split, Tensor]] = {}
        self._held: Dict[int, Tuple[Split, Tensor]] = {}

    @property
    def config(self) -> Dict[str, Any]:
        """The resolved settings, JSON-serialisable (for a run's config file)."""
        return dict(mode=self.mode, strength=self.strength, crop_scale=list(self.crop_scale),
                    flip=self.flip, device=str(self.device))

    def __repr__(self) -> str:
        return f"ViewMaker(dataset={self.dataset_name!r}, " + ", ".join(
            f"{k}={v!r}" for k, v in self.config.items()) + ")"

    def _data(self, split: Split) -> Tensor:
        """What the views of ``split`` are made from: its images, or its noise realisations."""
        data = split.images if self.mode == "augment" else split.realisations
        if data is None:
            raise ValueError(f"views {self.mode!r} need noise realisations, but this split has none")
        return data

    def device_images(self, split: Split, workers: int = 0) -> Any:
        """What :meth:`hold_split` would hold for ``split``: a
        :class:`~contrastkit.data.on_device.DeviceImages` of its images (or realisations)."""
        from .on_device import DeviceImages

        return DeviceImages(self._data(split), self.device, workers=workers)

    def hold_split(self, split: Split, images: Tensor) -> None:
        """Make the views of ``split`` from ``images`` from now on: its images (or noise
        realisations), uint8 or float, held on this view maker's device
        (:meth:`DeviceImages.load <contrastkit.data.on_device.DeviceImages.load>`)."""
        data = self._data(split)
        if tuple(images.shape) != tuple(data.shape) or images.device != self.device:
            raise ValueError(f"held images of shape {tuple(images.shape)} on {images.device} do not stand for this "
                             f"split's {tuple(data.shape)} on {self.device}")
        self._held[id(split)] = (split, images)

    def _source(self, split: Split) -> Tensor:
        held = self._held.get(id(split))
        if held is not None and held[0] is split:
            return held[1]
        data = self._data(split)
        if data.device == self.device:
            return data
        cached = self._cache.get(id(split))
        if cached is not None and cached[0] is split:
            return cached[1]
        if data.numel() * data.element_size() > _CACHE_LIMIT_BYTES:
            return data
        moved = data.to(self.device)
        self._cache[id(split)] = (split, moved)
        return moved

    def _check_indices(self, split: Split, indices: object) -> Tensor:
        if not isinstance(indices, Tensor):
            raise TypeError(f"indices must be a torch.Tensor of int64, got {type(indices).__name__}")
        if indices.dtype in (torch.bool,) or indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"indices must have an integer dtype, got {indices.dtype}")
        if indices.dim() != 1 or indices.numel() == 0:
            raise ValueError(f"indices must be a non-empty 1-D tensor, got shape {tuple(indices.shape)}")
        n = len(split)

        def detail() -> str:
            return f"indices must lie in [0, {n}) for this split, got range [{int(indices.min())}, {int(indices.max())}]"

        # Checked where the indices lie: on an accelerator without waiting for it (validation.require).
        require((indices.min() >= 0) & (indices.max() < n), f"indices must lie in [0, {n}) for this split", detail)
        return indices.long()

    def __call__(self, split: Split, indices: Tensor) -> Tuple[Tensor, Tensor]:
        if not isinstance(split, Split):
            raise TypeError(f"split must be a contrastkit.data.Split, got {type(split).__name__}")
        if tuple(split.images.shape[1:]) != self.image_shape:
            raise ValueError(f"split images have shape {tuple(split.images.shape[1:])}, but these views were "
                             f"made for {self.image_shape}")
        indices = self._check_indices(split, indices)
        source = self._source(split)
        idx = indices.to(source.device, non_blocking=True)
        if self.mode == "augment":
            batch = source[idx]
            view_a, view_b = batch, batch
        else:
            r = source.shape[1]
            # Two distinct realisations per sample: first uniform, second uniform among the rest.
            first = torch.randint(0, r, (idx.numel(),))
            second = (first + torch.randint(1, r, (idx.numel(),))) % r
            view_a = source[idx, first.to(source.device, non_blocking=True)]
            view_b = source[idx, second.to(source.device, non_blocking=True)]
        return self._finish(view_a, view_b)

    def views_of(self, images: Tensor) -> Tuple[Tensor, Tensor]:
        """``(view_a, view_b)`` of a batch of images ``(b, C, H, W)``, uint8 (0..255) or float
        in ``[0, 1]``, from anywhere (a streamed batch); mode ``"augment"`` only."""
        if self.mode != "augment":
            raise ValueError(f"views {self.mode!r} need noise realisations; a batch of images has none")
        if images.dim() != 4 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(f"images must have shape (b, {', '.join(map(str, self.image_shape))}), "
                             f"got {tuple(images.shape)}")
        images = images.to(self.device, non_blocking=True)
        return self._finish(images, images)

    def _finish(self, view_a: Tensor, view_b: Tensor) -> Tuple[Tensor, Tensor]:
        # uint8 (held or decoded) images to [0, 1] floats, on the device
        same = view_b is view_a  # one batch for both views: converted once
        view_a = unit_float(view_a.to(self.device, non_blocking=True))
        view_b = view_a if same else unit_float(view_b.to(self.device, non_blocking=True))
        if self._augment is not None:
            # One kornia call on both views: parameters are drawn per row, so the two halves
            # are independent augmentations, and the per-call overhead is paid once. A call
            # holds several float copies of its input (crop, jitter, blur), so a large batch is
            # augmented in place in calls of at most augment_rows(...) rows: its peak memory
            # stays that of one call, and batches that fit in one call are unchanged.
            both = torch.cat([view_a, view_b])
            rows = augment_rows(self.image_shape)
            if both.shape[0] <= rows:
                both = self._augment(both)
            else:
                for start in range(0, both.shape[0], rows):
                    both[start:start + rows] = self._augment(both[start:start + rows])
            view_a, view_b = both.chunk(2)
        if self.mode == "B":
            view_b = torch.rot90(view_b, k=1, dims=(-2, -1))
        # kornia keeps values in range for these ops; clamp guards interpolation overshoot.
        return view_a.clamp_(0.0, 1.0).contiguous(), view_b.clamp_(0.0, 1.0).contiguous()


def make_views(dataset: Dataset, mode: str = "augment", device: Union[torch.device, str, None] = None,
               strength: Optional[float] = None, *, crop_scale: Optional[Tuple[float, float]] = None,
               flip: Optional[bool] = None) -> ViewMaker:
    """Build the view maker for ``dataset``.

    Args:
        dataset: a :class:`Dataset` from :func:`contrastkit.data.load_dataset`.
        mode: ``"augment"``, ``"A"`` or ``"B"`` (see the module docstring). ``"A"``/``"B"``
            need noise realisations (GlyphLab) and raise ``ValueError`` otherwise.
        device: where the views are produced (default CPU).
        strength: augmentation strength in ``[0, 2]``; ``None`` means 1 for ``"augment"`` and
            0 for ``"A"``/``"B"``.
        crop_scale: override the per-data-set RandomResizedCrop area range ``(lo, hi)`` at
            strength 1, ``0 < lo <= hi <= 1``.
        flip: override whether horizontal flips are used.

    Returns a :class:`ViewMaker`; ``views(split, indices)`` -> ``(view_a, view_b)``, two
    ``(b, C, H, W)`` float32 tensors in ``[0, 1]`` on ``device``.
    """
    if not isinstance(dataset, Dataset) and not getattr(dataset, "streamed", False):
        raise TypeError(f"dataset must be a contrastkit.data.Dataset or StreamingDataset, got "
                        f"{type(dataset).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode in ("A", "B") and not dataset.has_realisations:
        raise ValueError(f"views {mode!r} pair two noise realisations of the same scene, but data set "
                         f"{dataset.name!r} has no realisations (only glyphlab has them); use mode='augment'")
    c, h, w = dataset.image_shape
    if mode == "B" and h != w:
        raise ValueError(f"views 'B' rotate by 90 degrees and need square images, got {h}x{w}")
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for, but CUDA is not available")
    strength = (1.0 if mode == "augment" else 0.0) if strength is None else _check_strength(strength)
    defaults = _DEFAULTS.get(dataset.source) or (_RGB_DEFAULT if c == 3 else _GRAY_DEFAULT)
    if crop_scale is None:
        crop_scale = defaults["crop_scale"]
    else:
        try:
            lo, hi = (float(v) for v in crop_scale)
        except (TypeError, ValueError):
            raise ValueError(f"crop_scale must be a pair (lo, hi), got {crop_scale!r}") from None
        if not (0.0 < lo <= hi <= 1.0):
            raise ValueError(f"crop_scale must satisfy 0 < lo <= hi <= 1, got {crop_scale!r}")
        crop_scale = (lo, hi)
    flip = bool(defaults["flip"]) if flip is None else bool(flip)
    return ViewMaker(dataset, mode, device, strength, tuple(crop_scale), flip)
