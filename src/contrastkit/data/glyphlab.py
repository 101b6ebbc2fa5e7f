"""GlyphLab: procedurally generated grayscale scenes with a three-class orientation label.

Each scene holds one *glyph* -- a long bright bar -- whose orientation is the class:

    0 ``vertical``    bar at 90 degrees (+- ``jitter``)
    1 ``horizontal``  bar at 0 degrees (+- ``jitter``)
    2 ``diagonal``    bar at 45 or 135 degrees (+- ``jitter``)

The bar's position (centre in the central half of each axis), length, thickness and
brightness vary, the background has a random level
and a linear gradient, and 2..5 *distractor* marks (dots and short strokes of random
orientation, dimmer and at most a third as long as the shortest bar) add clutter that does not
decide the class. A scene is rendered once without noise; its ``R`` *noise realisations* add
independent Gaussian pixel noise and are clipped to ``[0, 1]``.

Everything is drawn from ``numpy.random.SeedSequence(seed)``: train, val and test scenes come
from three independent child streams (so changing the number of training scenes leaves the
val and test scenes unchanged), and within a split the scene geometry and the noise use two
further streams (so changing ``noise`` or ``realisations`` leaves the scenes unchanged).
Scenes are split by construction: a scene id (``Split.groups``) belongs to exactly one split.

A horizontal flip keeps every class (it maps 45 to 135 degrees, both ``diagonal``); a 90-degree
rotation swaps ``vertical`` and ``horizontal`` -- which is why pair definition B of the
textbook's exercise F5 (section 30.2; one view rotated by 90 degrees) is expected to hurt the
orientation probe.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from contrastkit.data.base import Dataset, Split, check_positive_int

CLASS_NAMES = ["vertical", "horizontal", "diagonal"]

#: Bar angle(s) in degrees per class, measured counter-clockwise from the +x (column) axis
#: with y pointing up the image.
CLASS_ANGLES = {0: (90.0,), 1: (0.0,), 2: (45.0, 135.0)}

_SPLIT_KEYS = ("train", "val", "test")

#: The bar's centre lies in [CENTRE_BOX, 1 - CENTRE_BOX] times the side, in both directions.
CENTRE_BOX = 0.25


def _segment_coverage(xx: np.ndarray, yy: np.ndarray, x0: np.ndarray, y0: np.ndarray,
                      x1: np.ndarray, y1: np.ndarray, thickness: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of thick segments, one per scene: ``(n, S, S)``.

    ``xx, yy`` are pixel-centre coordinates ``(S, S)``; endpoints and thickness are ``(n,)``.
    A pixel at distance ``d`` from the segment gets ``clip(thickness/2 + 0.5 - d, 0, 1)``.
    """
    x0, y0, x1, y1, thickness = (a.astype(np.float32)[:, None, None] for a in (x0, y0, x1, y1, thickness))
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    # Projection parameter of each pixel onto the segment, clamped to the segment.
    rx, ry = xx - x0, yy - y0
    t = (rx * dx + ry * dy) / np.maximum(length2, np.float32(1e-12))
    np.clip(t, 0.0, 1.0, out=t)
    ex, ey = rx - t * dx, ry - t * dy
    dist = np.sqrt(ex * ex + ey * ey)
    return np.clip(thickness / 2.0 + 0.5 - dist, 0.0, 1.0)


def render_scenes(labels: np.ndarray, size: int, rng: np.random.Generator, *,
                  jitter: float = 8.0, clutter: Tuple[int, int] = (2, 5)) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """Render noiseless scenes for the given labels.

    Returns ``(images, params)``: ``images`` is ``(n, size, size)`` float32 in ``[0, 1]`` with
    row 0 at the top of the image; ``params`` holds the per-scene bar geometry in pixel units
    (``angle`` in degrees counter-clockwise from +x with y up, ``length``, ``thickness``,
    ``cx``, ``cy`` (column, row), ``intensity``, ``background``) and ``n_distractors``.
    """
    n = int(labels.shape[0])
    s = float(size)
    unit = s / 32.0  # sizes below are designed at 32x32 and scale with the image
    # --- the glyph (bar) ---
    base = np.empty(n)
    for cls, angles in CLASS_ANGLES.items():
        mask = labels == cls
        choice = rng.integers(0, len(angles), size=n)
        base[mask] = np.asarray(angles)[choice[mask]]
    angle = base + rng.uniform(-jitter, jitter, size=n)
    length = rng.uniform(0.45, 0.75, size=n) * s
    thickness = rng.uniform(1.6, 3.2, size=n) * unit
    intensity = rng.uniform(0.75, 1.0, size=n)
    rad = np.deg2rad(angle)
    ux, uy = np.cos(rad), -np.sin(rad)  # image rows grow downwards, so y flips sign
    margin = 1.5 * unit + thickness / 2
    half_x = np.abs(ux) * length / 2 + margin
    half_y = np.abs(uy) * length / 2 + margin
    # The centre stays in the central box [CENTRE_BOX * s, (1 - CENTRE_BOX) * s] (so that a crop
    # keeping most of the image keeps the bar's centre) and the whole bar inside the image.
    cx = rng.uniform(np.maximum(half_x, CENTRE_BOX * s), np.minimum(s - half_x, (1 - CENTRE_BOX) * s))
    cy = rng.uniform(np.maximum(half_y, CENTRE_BOX * s), np.minimum(s - half_y, (1 - CENTRE_BOX) * s))
    # --- background: level + linear gradient in a random direction ---
    background = rng.uniform(0.0, 0.25, size=n)
    grad_amp = rng.uniform(0.0, 0.15, size=n)
    grad_dir = rng.uniform(0.0, 2 * np.pi, size=n)
    coords = np.arange(size, dtype=np.float32) + 0.5
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    ramp = ((xx[None] - s / 2) * np.cos(grad_dir)[:, None, None]
            + (yy[None] - s / 2) * np.sin(grad_dir)[:, None, None]) / s
    img = (background[:, None, None] + grad_amp[:, None, None] * ramp).astype(np.float32)
    # --- distractors, drawn under the bar ---
    lo, hi = clutter
    n_distractors = rng.integers(lo, hi + 1, size=n)
    for k in range(hi):
        present = k < n_distractors
        is_dot = rng.random(n) < 0.4
        d_len = np.where(is_dot, 0.0, rng.uniform(0.06, 0.15, size=n) * s)
        d_ang = rng.uniform(0.0, np.pi, size=n)
        d_thick = np.where(is_dot, rng.uniform(2.0, 3.5, size=n), rng.uniform(1.0, 2.0, size=n)) * unit
        d_int = rng.uniform(0.4, 0.65, size=n)
        dcx = rng.uniform(1.0, s - 1.0, size=n)
        dcy = rng.uniform(1.0, s - 1.0, size=n)
        hx, hy = np.cos(d_ang) * d_len / 2, -np.sin(d_ang) * d_len / 2
        # Parameters are drawn for every scene (so streams do not depend on counts), but
        # only scenes with a k-th distractor are rendered.
        at = np.flatnonzero(present)
        if at.size:
            cov = _segment_coverage(xx, yy, (dcx - hx)[at], (dcy - hy)[at], (dcx + hx)[at], (dcy + hy)[at],
                                    d_thick[at])
            img[at] = img[at] * (1 - cov) + d_int[at, None, None] * cov
    hx, hy = ux * length / 2, uy * length / 2
    cov = _segment_coverage(xx, yy, cx - hx, cy - hy, cx + hx, cy + hy, thickness)
    img = img * (1 - cov) + intensity[:, None, None] * cov
    img = np.clip(img, 0.0, 1.0).astype(np.float32)
    params = dict(angle=angle, length=length, thickness=thickness, cx=cx, cy=cy,
                  intensity=intensity, background=background, n_distractors=n_distractors)
    return img, params


def _balanced_labels(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` labels with class counts differing by at most one, in random order."""
    labels = np.arange(n) % len(CLASS_NAMES)
    return labels[rng.permutation(n)]


def load_glyphlab(seed: int = 0, *, train_scenes: int = 120, val_scenes: int = 60, test_scenes: int = 300,
                  size: int = 32, realisations: int = 2, noise: float = 0.15, jitter: float = 8.0,
                  clutter: Tuple[int, int] = (2, 5)) -> Dataset:
    """Generate the GlyphLab data set (deterministic from ``seed``).

    Args:
        seed: non-negative integer; the same seed and options give bit-identical tensors.
        train_scenes, val_scenes, test_scenes: number of scenes per split (>= 1 each). The
            defaults 120 / 60 / 300 follow the 120 training scenes of the textbook's exercise F5.
        size: image side in pixels (>= 28); geometry scales with it.
        realisations: ``R >= 2`` noise realisations per scene.
        noise: standard deviation of the Gaussian pixel noise (>= 0; 0 gives noiseless
            realisations, useful for inspection).
        jitter: maximum deviation in degrees of the bar from its class angle (0 <= jitter < 20;
            class angles are 45 degrees apart, so bars of different classes stay more than
            5 degrees apart and decidable by eye).
        clutter: ``(min, max)`` number of distractor marks per scene.

    Returns a :class:`Dataset` with ``image_shape (1, size, size)``; each split has
    ``images`` = realisation 0, ``realisations`` ``(n, R, 1, size, size)`` and ``groups`` =
    scene ids (train ``0..``, then val, then test; unique across splits).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    counts = [check_positive_int(train_scenes, "train_scenes"), check_positive_int(val_scenes, "val_scenes"),
              check_positive_int(test_scenes, "test_scenes")]
    size = check_positive_int(size, "size", minimum=28)
    realisations = check_positive_int(realisations, "realisations", minimum=2)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not (0.0 <= float(noise) <= 1.0):
        raise ValueError(f"noise must be a number in [0, 1], got {noise!r}")
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not (0.0 <= float(jitter) < 20.0):
        raise ValueError(f"jitter must be a number in [0, 20) degrees, got {jitter!r}")
    try:
        lo, hi = (int(v) for v in clutter)
    except (TypeError, ValueError):
        raise ValueError(f"clutter must be a pair (min, max) of integers, got {clutter!r}") from None
    if not (0 <= lo <= hi <= 20):
        raise ValueError(f"clutter must satisfy 0 <= min <= max <= 20, got {clutter!r}")

    split_streams = np.random.SeedSequence(int(seed)).spawn(len(_SPLIT_KEYS))
    splits: Dict[str, Split] = {}
    first_id = 0
    for key, count, stream in zip(_SPLIT_KEYS, counts, split_streams):
        scene_seq, noise_seq = stream.spawn(2)
        scene_rng, noise_rng = np.random.default_rng(scene_seq), np.random.default_rng(noise_seq)
        labels = _balanced_labels(count, scene_rng)
        clean, _ = render_scenes(labels, size, scene_rng, jitter=float(jitter), clutter=(lo, hi))
        noisy = clean[:, None] + np.float32(noise) * noise_rng.standard_normal(
            (count, realisations, size, size), dtype=np.float32)
        noisy = np.clip(noisy, 0.0, 1.0)
        real = torch.from_numpy(noisy).unsqueeze(2)  # (n, R, 1, S, S)
        splits[key] = Split(
            images=real[:, 0].clone(),
            labels=torch.from_numpy(labels.astype(np.int64)),
            realisations=real,
            groups=torch.arange(first_id, first_id + count, dtype=torch.int64),
        )
        first_id += count
    return Dataset(name="glyphlab", class_names=list(CLASS_NAMES), train=splits["train"],
                   val=splits["val"], test=splits["test"], image_shape=(1, size, size))


def clean_scenes(seed: int = 0, split: str = "train", count: Optional[int] = None, *, size: int = 32,
                 jitter: float = 8.0, clutter: Tuple[int, int] = (2, 5),
                 train_scenes: int = 120, val_scenes: int = 60, test_scenes: int = 300):
    """The noiseless renders and geometry of one split's scenes, as :func:`load_glyphlab` draws them.

    Returns ``(images (n, size, size) float32, labels (n,) int64, params)``; useful to inspect
    the generator or check labels independently of the noise.
    """
    if split not in _SPLIT_KEYS:
        raise ValueError(f"split must be one of {_SPLIT_KEYS}, got {split!r}")
    counts = dict(train=train_scenes, val=val_scenes, test=test_scenes)
    n = check_positive_int(counts[split] if count is None else count, "count")
    stream = np.random.SeedSequence(int(seed)).spawn(len(_SPLIT_KEYS))[_SPLIT_KEYS.index(split)]
    scene_rng = np.random.default_rng(stream.spawn(2)[0])
    labels = _balanced_labels(n, scene_rng)
    images, params = render_scenes(labels, size, scene_rng, jitter=jitter, clutter=clutter)
    return images, labels.astype(np.int64), params
