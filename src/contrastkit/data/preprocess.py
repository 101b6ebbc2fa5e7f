"""How an image file becomes what the encoder reads: the one definition of the preprocessing
that training, the read-out and ``contrastkit embed`` apply to image files, and that an export's
input contract carries (:meth:`ImagePreprocessing.contract`) for code that runs the exported
model without contrastkit.

The steps, in order:

1. **Colour**: transparent pixels (RGBA, LA, a palette's transparency) composited over white,
   palette / CMYK / other modes converted, 16-bit images rescaled by their full range and 32-bit
   ones by their maximum (not clipped), then ``L`` (1 channel) or ``RGB`` (3 channels, in that
   order).
2. **Size**, by the data's rule (``resize``):

   * ``shorter-side-then-centre-crop`` (unlabeled collections): the shorter side resized to
     ``S`` keeping the aspect ratio (each side ``round(side * S / shorter)``, at least ``S``),
     then the centre ``S x S`` square cropped (offsets ``(side - S) // 2``), what torchvision's
     ``Resize(S)`` + ``CenterCrop(S)`` does for evaluation. Beyond an aspect ratio of 16:1
     (:data:`CROP_FIRST_RATIO`) only the region the crop keeps is resized, on the same pixel grid
     (PIL's ``box``; each value within 1 of resizing the whole), so that a 1,000,000 x 1 strip
     costs what a square does;
   * ``stretch`` (class folders): resized to ``H x W`` whatever its aspect ratio;
   * ``none`` (data held as arrays): the image must already be ``H x W``.

   Resizing is PIL's ``Image.resize`` with the filter :data:`contrastkit.data.files.RESAMPLE`
   names (antialiased when shrinking, as PIL's filters are), in
   :func:`contrastkit.data.files.to_array`, which also does the 16- and 32-bit rescaling.

   A JPEG file is decoded at the smallest of libjpeg's DCT scales ``s`` (1/2, 1/4 or 1/8 of each
   side) whose sides are still at least what the resize makes of the whole picture (PIL's
   ``Image.draft(mode, (width, height))``), and the picture's region ``(0, 0, width / s,
   height / s)`` of that decode is what is resized. A 12-megapixel photo read at 64 px is then an
   1/8 decode, several times faster than a full one; the pixels differ from a full decode's by a
   few levels of 255 (the DCT's own downscale replaces part of the resize's;
   ``benchmarks/results/decode_at_size.md`` measures it). Other formats are decoded whole.
3. **Scale**: 8-bit values divided by 255, float32 in ``[0, 1]``; **normalisation**: none (mean
   0, std 1 per channel), which is what the encoders train on.

:func:`preprocess_image` applies an export's contract to a PIL image or a file and returns the
model's input, ``(1, C, H, W)`` float32 NCHW.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from contrastkit._io import one_line
from contrastkit.data.files import (RESAMPLE, decoded_region, draft_scale, flatten_colour, load_image, open_image,
                                   to_array)

__all__ = ["ImagePreprocessing", "preprocess_image", "preprocessing_of", "RESAMPLE", "RESIZE_RULES",
           "SHORTER_SIDE_THEN_CENTRE_CROP", "STRETCH", "NO_RESIZE", "CROP_FIRST_RATIO"]

SHORTER_SIDE_THEN_CENTRE_CROP = "shorter-side-then-centre-crop"
#: Under the shorter-side rule, an image whose resized whole would hold more than this many times
#: the pixels of its centre crop (an aspect ratio beyond 16:1) has only the crop's region resized.
CROP_FIRST_RATIO = 16
STRETCH = "stretch"
NO_RESIZE = "none"
#: How each rule sizes an image, as the input contract says it.
RESIZE_RULES = {
    SHORTER_SIDE_THEN_CENTRE_CROP: "resize the shorter side to S keeping the aspect ratio (each side "
                                   "round(side * S / shorter side), at least S), then crop the centre S x S square "
                                   "(top = (height - S) // 2, left = (width - S) // 2): torchvision's Resize(S) + "
                                   "CenterCrop(S)",
    STRETCH: "resize to height x width whatever the aspect ratio",
    NO_RESIZE: "none: the run's data set holds images of this size (arrays); give images of height x width",
}
#: 8-bit pixel values are divided by this.
PIXEL_SCALE = 255.0
ImageLike = Union[str, "os.PathLike[str]", Any]


@dataclass(frozen=True)
class ImagePreprocessing:
    """The preprocessing of image files to ``(C, H, W)`` (see the module's description):
    ``color`` ``"L"`` or ``"RGB"``, ``size`` ``(H, W)`` (``S x S`` for the crop rule),
    ``resize`` one of ``contrastkit.data.preprocess.RESIZE_RULES`` (``shorter-side-then-centre-crop``,
    ``stretch``, ``none``)."""

    color: str
    size: Tuple[int, int]
    resize: str

    def __post_init__(self) -> None:
        if self.color not in ("L", "RGB"):
            raise ValueError(f"color must be 'L' or 'RGB', got {self.color!r}")
        if self.resize not in RESIZE_RULES:
            raise ValueError(f"resize must be one of {', '.join(RESIZE_RULES)}, got {self.resize!r}")
        object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))

    @property
    def channels(self) -> int:
        return 1 if self.color == "L" else 3

    def decode_size(self, full_size: Tuple[int, int]) -> Tuple[int, int]:
        """The smallest ``(width, height)`` a decode of a picture of ``full_size`` ``(width,
        height)`` must keep for this preprocessing: what its resize makes of the whole picture
        (the picture's own size where nothing is resized, or where only the crop's region is)."""
        height, width = self.size
        if self.resize == STRETCH:
            return width, height
        if self.resize == NO_RESIZE:
            return full_size
        resized = self._shorter_side_size(full_size)
        if resized[0] * resized[1] > CROP_FIRST_RATIO * height * height:
            return full_size
        return resized[1], resized[0]

    def _shorter_side_size(self, full_size: Tuple[int, int]) -> Tuple[int, int]:
        side = self.size[0]
        width, height = full_size
        scale = side / min(width, height)
        return max(side, round(height * scale)), max(side, round(width * scale))

    def read(self, path: "Union[str, os.PathLike[str]]", *, full_decode: bool = False) -> np.ndarray:
        """The image file at ``path`` as ``(C, H, W)`` uint8 (steps 1 and 2). A JPEG is decoded at
        the smallest of libjpeg's DCT scales (1/2, 1/4, 1/8 of each side) whose sides are still
        at least :meth:`decode_size`, and the picture's region of it is resized on the same pixel
        grid (``contrastkit.data.files.draft_scale``); ``full_decode`` decodes it whole, as
        other formats are. A ``ValueError`` names the file when it cannot be read."""
        path = Path(path)
        with open_image(path) as opened:
            full_size = opened.size
            scale = 1 if full_decode else draft_scale(opened, self.decode_size(full_size))
            return self.fit(load_image(opened, path), str(path), full_size=full_size, scale=scale)

    def read_bytes(self, data: bytes, name: str, *, full_decode: bool = False) -> np.ndarray:
        """:meth:`read` of an image file's bytes ``data`` (e.g. a member of a tar shard), named
        ``name`` in a ``ValueError`` when they cannot be read."""
        import io

        from PIL import Image  # lazy: pillow is an optional dependency

        try:
            opened = Image.open(io.BytesIO(data))
        except Exception as err:  # PIL raises many kinds (UnidentifiedImageError, OSError, SyntaxError...)
            detail = "cannot identify image file" if isinstance(err, Image.UnidentifiedImageError) else one_line(err)
            raise ValueError(f"{name}: cannot read image ({type(err).__name__}: {detail})") from None
        with opened:
            full_size = opened.size
            scale = 1 if full_decode else draft_scale(opened, self.decode_size(full_size))
            return self.fit(load_image(opened, Path(name)), name, full_size=full_size, scale=scale)

    def fit(self, image: Any, name: str = "the image", *, full_size: Optional[Tuple[int, int]] = None,
            scale: int = 1) -> np.ndarray:
        """A decoded PIL ``image`` as ``(C, H, W)`` uint8 (steps 1 and 2). ``scale`` > 1: ``image``
        is a picture of ``full_size`` ``(width, height)`` decoded at ``1/scale`` of each side
        (:meth:`read`); the sizes are those of the whole picture, and its region of ``image`` is
        what is resized."""
        image = flatten_colour(image, self.color)
        height, width = self.size
        if full_size is None or scale == 1:
            full_size, scale = image.size, 1
        whole = decoded_region(full_size, scale)  # the picture's region of a reduced decode
        if self.resize == STRETCH:
            return to_array([image], self.color, (height, width), box=whole)[0]
        if self.resize == NO_RESIZE:
            if image.size != (width, height):
                raise ValueError(f"{name} is {image.size[0]}x{image.size[1]}, not {width}x{height}: the run's "
                                 "data set holds images of that size, and the contract resizes none")
            return to_array([image], self.color, (height, width))[0]
        side = height
        image_width, image_height = full_size
        resized = self._shorter_side_size(full_size)
        top, left = (resized[0] - side) // 2, (resized[1] - side) // 2
        if resized[0] * resized[1] > CROP_FIRST_RATIO * side * side:
            # An extreme aspect ratio (a panorama strip, a 1,000,000 x 1 image): resized whole it would
            # be many times the crop (32,000,000 x 32 for that one). Only the region the centre crop
            # keeps is resized, on the same pixel grid with the same filter (each value within 1 of
            # the whole image resized, then cropped).
            x_ratio = image_width / resized[1] / scale
            y_ratio = image_height / resized[0] / scale
            box = (left * x_ratio, top * y_ratio, (left + side) * x_ratio, (top + side) * y_ratio)
            return to_array([image], self.color, (side, side), box=box)[0]
        array = to_array([image], self.color, resized, box=whole)[0]
        return np.ascontiguousarray(array[:, top:top + side, left:left + side])

    def __call__(self, image: ImageLike) -> np.ndarray:
        """A PIL image, or the image file at a path, as the model's input: ``(1, C, H, W)``
        float32 in ``[0, 1]`` (all three steps)."""
        if isinstance(image, (str, os.PathLike)):
            return self._to_input(self.read(image))
        return self._to_input(self.fit(image))

    @staticmethod
    def _to_input(array: np.ndarray) -> np.ndarray:
        return (array.astype(np.float32) / np.float32(PIXEL_SCALE))[None]

    def contract(self) -> Dict[str, Any]:
        """The preprocessing as an export's input contract states it (JSON values)."""
        height, width = self.size
        return {"resize": self.resize, "resize_rule": RESIZE_RULES[self.resize].replace("S", str(height))
                if self.resize == SHORTER_SIDE_THEN_CENTRE_CROP else RESIZE_RULES[self.resize],
                "interpolation": f"{RESAMPLE} (PIL Image.resize with Image.{RESAMPLE.upper()}, antialiased when "
                                 "shrinking)",
                "jpeg_decode": "at the smallest DCT scale s of 1/2, 1/4, 1/8 whose sides are at least what the "
                               "resize makes of the whole picture (PIL Image.draft(mode, (width, height))), the "
                               "region (0, 0, width / s, height / s) of it resized; other formats decoded whole",
                "color": self.color, "channel_order": "L" if self.color == "L" else "RGB",
                "height": height, "width": width, "layout": "NCHW", "dtype": "float32",
                "scale": f"8-bit pixel values divided by {PIXEL_SCALE:g}", "range": [0.0, 1.0],
                "normalisation": "none (what the encoder trained on): mean 0 and std 1 per channel",
                "mean": [0.0] * self.channels, "std": [1.0] * self.channels,
                "reference": "contrastkit.data.preprocess_image(image_or_file, contract)"}

    @classmethod
    def from_contract(cls, contract: Mapping[str, Any]) -> "ImagePreprocessing":
        """The preprocessing an export's input contract states: the contract's ``input``
        mapping, or the whole ``FILE.contrastkit.json`` record."""
        stated = contract.get("input", contract)
        stated = stated.get("preprocessing", stated)
        try:
            return cls(str(stated["color"]), (int(stated["height"]), int(stated["width"])), str(stated["resize"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not an input contract of contrastkit export (its preprocessing lacks or has a bad "
                             f"{err})") from None


def preprocess_image(image: ImageLike, contract: "Union[Mapping[str, Any], str, os.PathLike[str]]") -> np.ndarray:
    """``image`` (a PIL image, or the path of an image file) as an exported model's input:
    ``(1, C, H, W)`` float32 NCHW in ``[0, 1]``, by the export's input ``contract`` (the
    ``FILE.contrastkit.json`` record, its path, or its ``input`` mapping). This is what
    ``contrastkit embed`` feeds the encoder for the same file."""
    if isinstance(contract, (str, os.PathLike)):
        from contrastkit._io import read_json

        contract = read_json(os.fspath(contract))
        if not isinstance(contract, Mapping):
            raise ValueError("an input contract is a JSON object")
    return ImagePreprocessing.from_contract(contract)(image)


def preprocessing_of(image_shape: Tuple[int, ...], source: str) -> Optional[ImagePreprocessing]:
    """The preprocessing of image files that a data set of ``source``'s kind (a data set's
    ``source``: ``"collection"``, ``"imagefolder"``, ...) applies to give images of
    ``image_shape`` ``(C, H, W)``: unlabeled collections and tar shards crop, class folders stretch, data held
    as arrays resize nothing; ``None`` when ``C`` is neither 1 nor 3."""
    channels, height, width = (int(s) for s in image_shape)
    if channels not in (1, 3):
        return None
    rule = {"collection": SHORTER_SIDE_THEN_CENTRE_CROP, "tar-shards": SHORTER_SIDE_THEN_CENTRE_CROP,
            "imagefolder": STRETCH}.get(source, NO_RESIZE)
    return ImagePreprocessing("L" if channels == 1 else "RGB", (height, width), rule)
