"""Nearest neighbors by cosine similarity: exact and memory-bounded in torch, or through a
FAISS index (optional).

:func:`nearest` compares every query with every row of a collection, ``chunk`` queries against
``chunk`` collection rows at a time, and keeps a running top ``k`` per query, so its memory is
``O(chunk * chunk + queries * k)``, never ``queries x collection``. The result is exact: the
``k`` largest similarities of each query, best first, ties broken by the smaller collection
row; and it does not depend on ``chunk`` (a tie between two rows in different chunks is broken
the same way as within one).

:func:`faiss_flat_index` and :func:`faiss_nearest` do the same search through FAISS (Johnson,
Douze & Jegou, "Billion-scale similarity search with GPUs", IEEE Transactions on Big Data 2019;
https://github.com/facebookresearch/faiss): an ``IndexFlatIP`` over the L2-normalised rows is
an exhaustive inner-product search, so it finds the same neighbors (up to float32 rounding of
the similarities, and the order of exact ties, which FAISS does not define). FAISS is imported
only when one of these functions is called; without it they raise :class:`FaissMissingError`,
a one-line ``ImportError`` naming the extra to install (``pip install 'contrastkit[faiss]'``).

Conventions: ``queries`` ``(q, d)`` and ``collection`` ``(n, d)`` floating tensors on one
device; with ``normalize=True`` (the default) rows are L2-normalised first, so similarities
are cosines. A zero row (an encoder whose every unit is off for an image) cannot be normalised:
it is kept as zeros, so its similarity to everything is 0 (a search over thousands of images
should not stop at one such row). ``exclude`` ``(q,)`` int64 names, for each query, one
collection row left out of its neighbors (the query itself, when it is a row of the
collection), ``-1`` for none.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["Neighbors", "DEFAULT_CHUNK", "FAISS_EXTRA", "FaissMissingError", "nearest", "unit_rows", "import_faiss",
           "faiss_flat_index", "faiss_nearest", "write_faiss_index", "read_faiss_index"]

#: Rows of the queries and of the collection compared at once (a 4096 x 4096 float32 block is 64 MiB).
DEFAULT_CHUNK = 4096
#: The optional dependency group that installs FAISS (``pip install 'contrastkit[faiss]'``).
FAISS_EXTRA = "faiss"


class Neighbors(NamedTuple):
    """The ``k`` nearest collection rows of each query, best first."""

    #: ``(q, k)`` int64: rows of the collection.
    indices: Tensor
    #: ``(q, k)``: their similarities to the query (cosines with ``normalize=True``), descending.
    similarities: Tensor


class FaissMissingError(ImportError):
    """FAISS is not installed; the message names the extra that installs it."""


# ------------------------------------------------------------------------------ checks

def _check_rows(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have 2 dimensions (rows, features), got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    return x


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _check_search(queries: object, collection_rows: int, collection_dim: int, k: object,
                  exclude: Optional[object], device: torch.device) -> "tuple[int, Optional[Tensor]]":
    """``k`` and ``exclude`` checked against ``queries`` and a collection of ``collection_rows``
    rows of ``collection_dim`` features."""
    assert isinstance(queries, Tensor)
    if queries.shape[1] != collection_dim:
        raise ValueError(f"queries have {queries.shape[1]} features per row but the collection has {collection_dim}")
    k = _check_int(k, "k", 1)
    excluded: Optional[Tensor] = None
    if exclude is not None:
        if (not isinstance(exclude, Tensor) or exclude.dtype != torch.int64
                or tuple(exclude.shape) != (queries.shape[0],)):
            raise ValueError(f"exclude must be an int64 tensor of shape ({queries.shape[0]},), one collection row "
                             f"(or -1) per query, got {exclude!r:.80}")
        if bool(((exclude < -1) | (exclude >= collection_rows)).any()):
            raise ValueError(f"exclude holds a row outside -1 .. {collection_rows - 1}")
        excluded = exclude.to(device)
    available = collection_rows - (1 if excluded is not None and bool((excluded >= 0).any()) else 0)
    if k > available:
        others = " other than a query itself" if available < collection_rows else ""
        raise ValueError(f"k must be at most the {available} rows of the collection{others}, got {k}")
    return k, excluded


def unit_rows(x: Tensor) -> Tensor:
    """``x`` ``(n, d)`` with each row divided by its L2 norm, in float32 (or float64 for float64
    input); zero rows stay zero."""
    x = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return x / torch.where(norms > 0, norms, torch.ones_like(norms))


# ------------------------------------------------------------------------------ exact search

def _top_k(similarities: Tensor, k: int) -> "tuple[Tensor, Tensor]":
    """The ``k`` largest entries of each row of ``similarities`` ``(b, c)``, best first, ties
    broken by the smaller column: ``(values (b, k), columns (b, k))``.

    ``torch.topk`` finds them, but where more entries equal the ``k``-th value than fit (the
    ``k+1``-th equals it), it may pick any of them; in those rows (rare: exact ties) the entries
    strictly above the ``k``-th value are taken, and the first ones equal to it, by column, fill
    the rest."""
    extra = 1 if similarities.shape[1] > k else 0  # the (k+1)-th tells whether a tie crosses the cut
    values, columns = torch.topk(similarities, k + extra, dim=1)
    tied_rows = torch.nonzero(values[:, k - 1] == values[:, -1], as_tuple=True)[0] if extra else values[:0, 0].long()
    values, columns = values[:, :k].contiguous(), columns[:, :k].contiguous()
    kth = values[:, -1:]
    if tied_rows.numel():
        rows = similarities[tied_rows]
        above, equal = rows > kth[tied_rows], rows == kth[tied_rows]
        needed = k - above.sum(dim=1, keepdim=True)
        chosen = above | (equal & (equal.cumsum(dim=1) <= needed))
        chosen_columns = torch.nonzero(chosen, as_tuple=True)[1].view(-1, k)
        columns[tied_rows] = chosen_columns
        values[tied_rows] = rows.gather(1, chosen_columns)
    return _by_value_then_index(values, columns, k)


def _by_value_then_index(values: Tensor, rows: Tensor, k: int) -> "tuple[Tensor, Tensor]":
    """The first ``k`` of each row's candidates ``(values, rows)`` sorted by value, descending,
    then by row, ascending."""
    by_row = torch.sort(rows, dim=1, stable=True).indices
    values, rows = values.gather(1, by_row), rows.gather(1, by_row)
    by_value = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
    return values.gather(1, by_value), rows.gather(1, by_value)


def _merge(best: Optional["tuple[Tensor, Tensor]"], found: "tuple[Tensor, Tensor]", k: int) -> "tuple[Tensor, Tensor]":
    """The top ``k`` of two candidate lists ``(values, rows)`` of distinct rows, ties by row."""
    if best is None:
        return found
    return _by_value_then_index(torch.cat([best[0], found[0]], dim=1), torch.cat([best[1], found[1]], dim=1), k)


@torch.no_grad()
def nearest(queries: Tensor, collection: Tensor, k: int, *, chunk: int = DEFAULT_CHUNK,
            exclude: Optional[Tensor] = None, normalize: bool = True) -> Neighbors:
    """The ``k`` rows of ``collection`` most similar to each query, exactly.

    Args:
        queries: ``(q, d)`` floating tensor.
        collection: ``(n, d)`` floating tensor on the same device.
        k: neighbors per query, ``1 <= k <= n`` (``n - 1`` when a row is excluded).
        chunk: queries, and collection rows, compared at once: memory is one ``(chunk, chunk)``
            block of similarities and a few ``(chunk, k)`` lists, whatever ``q`` and ``n``.
        exclude: ``(q,)`` int64, a collection row to leave out per query (``-1``: none).
        normalize: L2-normalise rows first (cosine similarity); ``False``: plain inner products.

    Returns:
        :class:`Neighbors`: ``indices`` ``(q, k)`` int64 and ``similarities`` ``(q, k)`` (float32,
        float64 for float64 input), each row sorted by similarity, descending; equal
        similarities in increasing row order. The same for every ``chunk``.
    """
    _check_rows(queries, "queries")
    _check_rows(collection, "collection")
    if queries.device != collection.device:
        raise ValueError(f"queries are on {queries.device} but the collection is on {collection.device}")
    chunk = _check_int(chunk, "chunk", 1)
    k, excluded = _check_search(queries, collection.shape[0], collection.shape[1], k, exclude, queries.device)
    dtype = torch.float64 if torch.float64 in (queries.dtype, collection.dtype) else torch.float32
    prepare = unit_rows if normalize else (lambda x: x)
    found_values, found_rows = [], []
    for q_start in range(0, queries.shape[0], chunk):
        block = prepare(queries[q_start:q_start + chunk].to(dtype))
        best: Optional["tuple[Tensor, Tensor]"] = None
        for c_start in range(0, collection.shape[0], chunk):
            rows = prepare(collection[c_start:c_start + chunk].to(dtype))
            similarities = block @ rows.T  # (b, c)
            if excluded is not None:
                local = excluded[q_start:q_start + chunk] - c_start
                inside = torch.nonzero((local >= 0) & (local < rows.shape[0]), as_tuple=True)[0]
                similarities[inside, local[inside]] = float("-inf")
            values, columns = _top_k(similarities, min(k, rows.shape[0]))
            best = _merge(best, (values, columns + c_start), k)
            del similarities
        assert best is not None
        found_values.append(best[0])
        found_rows.append(best[1])
    return Neighbors(torch.cat(found_rows), torch.cat(found_values))


# ------------------------------------------------------------------------------ FAISS

def import_faiss() -> Any:
    """The ``faiss`` module, or :class:`FaissMissingError` saying how to install it."""
    try:
        import faiss  # noqa: F401  (optional: pip install 'contrastkit[faiss]')
    except ImportError:
        raise FaissMissingError(f"--index faiss needs the faiss-cpu package: pip install 'contrastkit[{FAISS_EXTRA}]' "
                                "(or leave out --index for the exact search, which needs nothing more)") from None
    return faiss


def _float32_rows(x: Tensor, normalize: bool) -> np.ndarray:
    rows = unit_rows(x) if normalize else x
    return np.ascontiguousarray(rows.detach().to("cpu", torch.float32).numpy())


def _faiss_threads(faiss: Any) -> None:
    # FAISS's OpenMP would take every core of the machine; it gets what torch was given.
    faiss.omp_set_num_threads(max(1, torch.get_num_threads()))


def faiss_flat_index(collection: Tensor, *, normalize: bool = True, chunk: int = DEFAULT_CHUNK) -> Any:
    """A FAISS ``IndexFlatIP`` (exhaustive inner-product search) over the rows of ``collection``
    ``(n, d)``, L2-normalised with ``normalize`` (cosine similarity), added ``chunk`` rows at a
    time (no float32 copy of the whole collection besides the index's own)."""
    faiss = import_faiss()
    _check_rows(collection, "collection")
    chunk = _check_int(chunk, "chunk", 1)
    _faiss_threads(faiss)
    index = faiss.IndexFlatIP(int(collection.shape[1]))
    for start in range(0, collection.shape[0], chunk):
        index.add(_float32_rows(collection[start:start + chunk], normalize))
    return index


def faiss_nearest(index: Any, queries: Tensor, k: int, *, exclude: Optional[Tensor] = None,
                  normalize: bool = True) -> Neighbors:
    """The ``k`` nearest rows of a FAISS ``index`` (as :func:`faiss_flat_index` builds it) for
    each of ``queries`` ``(q, d)``, as :func:`nearest` returns them (on the CPU; similarities
    float32; the order of exact ties is FAISS's). ``exclude`` as in :func:`nearest`."""
    faiss = import_faiss()
    _check_rows(queries, "queries")
    k, excluded = _check_search(queries, int(index.ntotal), int(index.d), k, exclude, torch.device("cpu"))
    _faiss_threads(faiss)
    extra = 0 if excluded is None or not bool((excluded >= 0).any()) else 1
    similarities, rows = index.search(_float32_rows(queries, normalize), k + extra)
    if extra:  # drop each query's excluded row, or (when it is not among them) the last one
        left_out = np.where(excluded.numpy() >= 0, excluded.numpy(), int(index.ntotal))[:, None]
        kept_first = np.argsort(rows == left_out, axis=1, kind="stable")[:, :k]
        rows = np.take_along_axis(rows, kept_first, axis=1)
        similarities = np.take_along_axis(similarities, kept_first, axis=1)
    return Neighbors(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)),
                     torch.from_numpy(np.ascontiguousarray(similarities, dtype=np.float32)))


def write_faiss_index(index: Any, path: "str | os.PathLike[str]") -> None:
    """Write a FAISS ``index`` to the file ``path`` (FAISS's own format)."""
    import_faiss().write_index(index, os.fspath(path))


def read_faiss_index(path: "str | os.PathLike[str]") -> Any:
    """The FAISS index in the file ``path``; ``ValueError`` naming it when FAISS cannot read it."""
    faiss = import_faiss()
    try:
        return faiss.read_index(os.fspath(path))
    except RuntimeError as err:  # FAISS reports a bad file as a RuntimeError with a C++ trace
        raise ValueError(f"{path} is not a FAISS index FAISS can read ({str(err).strip().splitlines()[0]})") from None
