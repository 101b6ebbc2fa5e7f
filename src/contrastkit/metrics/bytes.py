"""Exact integer products for 8-bit features (raw pixel intensities 0..255).

The read-out's raw-pixel baseline holds its features as uint8 when the images are 8-bit
(:func:`~contrastkit.metrics.pixel_features`). On those the kNN's similarities and the linear
probe's two products per evaluation (``X W`` and ``G^T X``) are computed in integer arithmetic:
the pixels centred to int8 (``p - 128``, exact), multiplied in int8 with int32 sums (VNNI-class
CPUs do four times the multiply-adds of float32 per instruction and read a quarter of the
bytes), and the float operand written exactly enough as int8 digits:

* ``int8 x int8`` products are exact: each sum of ``K`` products is at most ``K 128^2`` in
  magnitude, within int32 for ``K <= 131,071`` (longer sums are split, :data:`SUM_CHUNK`).
* A float matrix ``V`` (``m x k``) is scaled column by column to integers of magnitude at most
  ``127 * 256^3`` (31 bits, finer than float32's 24-bit significand) and written in four
  balanced base-256 digits in ``[-128, 127]``; ``q V`` is then four integer products combined in
  float64. The only rounding is that of ``V`` to its integers: ``|error| <= max|V_col| / (2 *
  127 * 256^3)`` per entry (about ``2.3e-10`` of the column's largest), below what a float32
  product of the same operands rounds away.

:func:`integer_matmul` is ``torch._int_mm`` (the int8 matrix product torch's own quantisation
uses) where this torch has it (:func:`integer_kernel`), else an exact float64 product; without
it the read-out takes its float path.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["CENTRE", "SUM_CHUNK", "integer_kernel", "integer_matmul", "centred", "row_digits", "bytes_times", "times_bytes",
           "row_sums", "column_statistics", "gram"]

#: uint8 values are centred by this to fit int8.
CENTRE = 128
#: The longest sum of int8 products one int32 holds with room to spare (131,071 would).
SUM_CHUNK = 65536
#: Rows per Gram product when sums of squares are taken.
_GRAM_ROWS = 128
#: Integers a float column is scaled to: four balanced base-256 digits hold up to 127 * 256^3.
_DIGITS = 4
_LIMIT = 127 * 256 ** (_DIGITS - 1)


_KERNEL: List[bool] = []


def integer_kernel() -> bool:
    """Whether this torch multiplies int8 matrices on the CPU (``torch._int_mm``), checked once.
    Without it the read-out reads 8-bit features as float32 (its float path)."""
    if not _KERNEL:
        mm = getattr(torch, "_int_mm", None)
        try:
            works = mm is not None and torch.equal(
                mm(torch.ones(17, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8)),
                torch.full((17, 8), 8, dtype=torch.int32))
        except RuntimeError:
            works = False
        _KERNEL.append(bool(works))
    return _KERNEL[0]


def integer_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of int8 matrices ``(m, K)`` and ``(K, n)`` as int32, exact for ``K <= SUM_CHUNK``
    (the callers split longer sums); an exact float64 product where :func:`integer_kernel` is false."""
    if a.device.type == "cpu" and integer_kernel():
        return torch._int_mm(a, b)
    return (a.double() @ b.double()).to(torch.int32)  # |sums| < 2^31 are exact in float64


def centred(pixels: np.ndarray) -> Tensor:
    """uint8 ``(n, d)`` as int8 ``p - CENTRE`` (contiguous)."""
    if pixels.dtype != np.uint8:
        raise TypeError(f"centred() takes uint8 pixels, got {pixels.dtype}")
    return torch.from_numpy(np.ascontiguousarray(pixels)).view(torch.int8) ^ torch.tensor(-CENTRE, dtype=torch.int8)


def row_digits(v: Tensor) -> Tuple[Tensor, Tensor]:
    """``v`` ``(r, c)`` float as int8 digits ``(4 r, c)`` (digit ``j`` of row ``i`` at ``j r + i``)
    and the row scales ``(r,)`` float64: ``v[i] ~ scale[i] * sum_j 256^j digit_j[i]``, within
    ``max |v[i]| / (2 * 127 * 256^3)`` of it. Computed in float64, exact for these integers (below
    2^31). A row with a non-finite value gets the scale NaN (its products are NaN)."""
    v = v.double()
    top = v.abs().amax(1)
    finite = torch.isfinite(v).all(1)
    scale = torch.where(top > 0, top / _LIMIT, torch.ones_like(top))
    v = torch.where(finite[:, None], v, torch.zeros_like(v))
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    rest = torch.round(v / torch.where(finite, scale, torch.ones_like(scale))[:, None])
    parts = []
    for _ in range(_DIGITS):
        digit = rest - 256.0 * torch.floor((rest + 128.0) / 256.0)  # in [-128, 127]
        parts.append(digit)
        rest = (rest - digit) / 256.0
    return torch.cat(parts, 0).to(torch.int8), scale


def bytes_times(q_t: Tensor, v: Tensor, shift: Optional[Tensor] = None) -> Tensor:
    """``((q - shift) V)^T`` for centred pixels given transposed, ``q_t`` int8 ``(d, n)``, ``v``
    float ``(d, k)`` and a per-feature ``shift`` ``(d,)`` (default 0): ``(k, n)`` float64. The
    shift's term is taken digit by digit, from ``V`` as its digits write it."""
    vd, scale = row_digits(v.T)
    k = v.shape[1]
    total = torch.zeros(4 * k, q_t.shape[1], dtype=torch.float64)
    for start in range(0, q_t.shape[0], SUM_CHUNK):
        total += integer_matmul(vd[:, start:start + SUM_CHUNK], q_t[start:start + SUM_CHUNK]).double()
    if shift is not None:  # digit by digit, before the digits are combined
        total -= (vd.double() @ shift.double())[:, None]
    return _combine_rows(total, k, scale)


def _combine_rows(products: Tensor, k: int, scale: Tensor) -> Tensor:
    """Digit products ``(4 k, r)`` back to ``(k, r)`` float64 (``scale`` per row)."""
    total = torch.zeros(k, products.shape[1], dtype=torch.float64)
    for j in range(_DIGITS):
        total += products[j * k:(j + 1) * k] * float(256 ** j)
    return total * scale[:, None]


def times_bytes(g: Tensor, q: Tensor, shift: Optional[Tensor] = None) -> Tensor:
    """``G (q - 1 shift^T)`` for ``g`` float ``(k, n)``, centred pixels ``q`` int8 ``(n, d)`` and
    a per-feature ``shift`` ``(d,)`` (default 0): ``(k, d)`` float64, the shift's term taken digit
    by digit from ``G`` as its digits write it: a feature equal to its shift in every row (a
    constant column) gives exactly 0."""
    gd, scale = row_digits(g)
    k = g.shape[0]
    total = torch.zeros(4 * k, q.shape[1], dtype=torch.float64)
    for start in range(0, q.shape[0], SUM_CHUNK):
        total += integer_matmul(gd[:, start:start + SUM_CHUNK], q[start:start + SUM_CHUNK]).double()
    if shift is not None:  # digit by digit: sum_n digit_n * shift is exact where q equals it
        total -= gd.sum(1, dtype=torch.int64).double()[:, None] * shift.double()
    return _combine_rows(total, k, scale)


def _square_sums(q: Tensor) -> Tensor:
    """``sum_j q_ij^2`` per row of int8 ``q`` ``(n, d)``, exact int64: the diagonals of the Gram
    products of blocks of ``_GRAM_ROWS`` rows (integer matrix products run several times faster
    than torch's integer reductions on CPU; ``_GRAM_ROWS`` times the work of the squares)."""
    squares = torch.zeros(q.shape[0], dtype=torch.int64)
    for start in range(0, q.shape[0], _GRAM_ROWS):
        block = q[start:start + _GRAM_ROWS]
        for first in range(0, q.shape[1], SUM_CHUNK):
            part = block[:, first:first + SUM_CHUNK]
            squares[start:start + _GRAM_ROWS] += integer_matmul(part, part.T.contiguous()).diagonal()
    return squares


def _sums(q: Tensor) -> Tensor:
    """``sum_j q_ij`` per row of int8 ``q`` ``(n, d)``, exact int64 (a product with ones)."""
    total = torch.zeros(q.shape[0], dtype=torch.int64)
    for first in range(0, q.shape[1], SUM_CHUNK):
        part = q[:, first:first + SUM_CHUNK]
        total += integer_matmul(part, torch.ones(part.shape[1], 1, dtype=torch.int8))[:, 0]
    return total


def row_sums(q: Tensor) -> Tuple[Tensor, Tensor]:
    """Per row of centred pixels ``q`` int8 ``(n, d)``: ``sum q`` and ``sum q^2``, exact int64."""
    return _sums(q), _square_sums(q)


def column_statistics(q: Tensor) -> Tuple[Tensor, Tensor]:
    """Mean and population variance (float64, ``(d,)``) of the columns of the pixels ``q + 128``
    given centred, ``q`` int8 ``(n, d)``: each the correctly rounded value of the exact one
    (integer sums; the variance's numerator ``n sum q^2 - (sum q)^2`` in Python's unbounded
    integers)."""
    n = q.shape[0]
    sums = torch.zeros(q.shape[1], dtype=torch.int64)
    squares = torch.zeros(q.shape[1], dtype=torch.int64)
    for start in range(0, n, SUM_CHUNK):
        block_sums, block_squares = row_sums(q[start:start + SUM_CHUNK].T.contiguous())
        sums += block_sums
        squares += block_squares
    mean = torch.tensor([(s + CENTRE * n) / n for s in sums.tolist()], dtype=torch.float64)
    variance = torch.tensor([(n * s2 - s * s) / (n * n) for s, s2 in zip(sums.tolist(), squares.tolist())],
                            dtype=torch.float64)
    return mean, variance


def gram(q: Tensor) -> Tensor:
    """``q^T q`` ``(d, d)`` float64 of centred pixels ``q`` int8 ``(n, d)``, exact."""
    total = torch.zeros(q.shape[1], q.shape[1], dtype=torch.float64)
    for start in range(0, q.shape[0], SUM_CHUNK):
        block = q[start:start + SUM_CHUNK]
        total += integer_matmul(block.T.contiguous(), block).double()
    return total
