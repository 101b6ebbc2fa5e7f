"""Images of the data in a report page: small PNG files written here (zlib, no imaging library)
and embedded as ``data:`` URIs, with the CSS of the picture grids.

A thumbnail is the image itself, at its own resolution (a 32x32 CIFAR-10 image is a 32x32
PNG); the page scales it up with ``image-rendering: pixelated``, so what is shown is what the
model saw, pixel for pixel. The ``data-*`` attributes of each ``<img>`` say which image of
which split it is, so a reader (or a test) can check it against the data.
"""

from __future__ import annotations

import base64
import html
import struct
import zlib
from typing import Any, Dict, Optional

import numpy as np

__all__ = ["png_bytes", "to_hwc", "thumbnail", "PICTURE_CSS"]


def to_hwc(image: Any) -> np.ndarray:
    """An image as ``(H, W, C)`` uint8, ``C`` 1 or 3: from a ``(C, H, W)`` tensor (uint8, or
    float in [0, 1]) or an ``(H, W)`` / ``(H, W, C)`` array."""
    if hasattr(image, "detach"):
        array = image.detach().cpu().numpy()
        if array.ndim == 3:
            array = np.transpose(array, (1, 2, 0))
    else:
        array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3):
        raise ValueError(f"an image must be (C, H, W) or (H, W[, C]) with 1 or 3 channels, got shape {array.shape}")
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float64), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    return np.ascontiguousarray(array)


def png_bytes(image: Any) -> bytes:
    """The PNG file of an image (see :func:`to_hwc`): 8-bit grayscale or RGB, lossless."""
    array = to_hwc(image)
    height, width, channels = array.shape
    color_type = 0 if channels == 1 else 2

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = np.concatenate([np.zeros((height, 1), dtype=np.uint8), array.reshape(height, width * channels)], axis=1)
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))


def thumbnail(image: Any, *, alt: str, attributes: Optional[Dict[str, Any]] = None, css_class: str = "thumb",
              title: str = "") -> str:
    """An ``<img>`` of ``image`` as an embedded PNG; ``attributes`` become ``data-*`` attributes."""
    data = base64.b64encode(png_bytes(image)).decode("ascii")
    extra = "".join(f' data-{html.escape(str(k))}="{html.escape(str(v), quote=True)}"'
                    for k, v in (attributes or {}).items())
    tip = f' title="{html.escape(title, quote=True)}"' if title else ""
    return (f'<img class="{html.escape(css_class)}" src="data:image/png;base64,{data}" '
            f'alt="{html.escape(alt, quote=True)}"{tip}{extra}>')


#: The styles of the picture sections (added to a page that has pictures).
PICTURE_CSS = """
img.thumb { width: 64px; height: 64px; object-fit: contain; image-rendering: pixelated; border: 3px solid transparent;
            border-radius: 4px; background: #fff; display: block; }
img.thumb.big { width: 80px; height: 80px; }
img.thumb.same { border-color: var(--good); }
img.thumb.other { border-color: #e3e6ea; }
img.thumb.anchor { border-color: var(--accent); }
img.thumb.positive { border-color: var(--good); }
img.thumb.negative { border-color: var(--bad); }
.tiles { display: flex; flex-wrap: wrap; gap: 0.6rem; }
.tile { border: 1px solid var(--line); border-radius: 8px; padding: 0.35rem; background: #fbfcfd; font-size: 0.78rem; }
.tile .row { display: flex; gap: 0.25rem; }
.tile .cap { color: var(--muted); text-align: center; max-width: 16rem; }
.strip { display: flex; gap: 0.25rem; align-items: flex-start; }
.strip figure, .tile figure { margin: 0; }
.strip figcaption, .tile figcaption { font-size: 0.72rem; text-align: center; margin: 0.1rem 0 0; }
table.pictures td, table.pictures th { vertical-align: middle; padding: 0.25rem 0.4rem; }
table.pictures .gap { border-left: 2px solid var(--line); }
.mark { color: var(--good); font-weight: 700; }
.warnings li { margin: 0.2rem 0; }
"""
