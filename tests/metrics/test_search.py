"""contrastkit.metrics.search: the exact chunked search against a float64 brute force, ties broken
by row whatever the chunks, memory bounded by the chunk, and FAISS's flat index agreeing with it."""

import builtins
import sys

import numpy as np
import pytest
import torch

from contrastkit.metrics.search import (FaissMissingError, Neighbors, faiss_flat_index, faiss_nearest, import_faiss,
                                        nearest, read_faiss_index, unit_rows, write_faiss_index)


def _reference(queries, collection, k, exclude=None, normalize=True):
    """Every similarity in float64, sorted by value (descending) then row (ascending)."""
    q, c = queries.double(), collection.double()
    if normalize:
        q, c = unit_rows(q), unit_rows(c)
    similarities = q @ c.T
    if exclude is not None:
        for i, row in enumerate(exclude.tolist()):
            if row >= 0:
                similarities[i, row] = float("-inf")
    # A stable sort of the negated values: equal values keep their row order.
    rows = torch.sort(-similarities, dim=1, stable=True).indices[:, :k]
    return rows, similarities.gather(1, rows)


def _assert_nearest(indices, queries, collection, k, exclude=None):
    """``indices`` ``(m, k)`` are the ``k`` nearest rows in order, up to the rounding of a float32
    search: the float64 similarity of the row found at each rank equals the float64 k-th largest
    within the error of a float32 cosine of unit rows (``2 d eps32``), and every row is unique.
    Rows whose similarities are further apart than that come out in the reference's order exactly;
    two that nearly tie may swap on another CPU's kernels (or chunking), which is no error."""
    sorted_rows, ordered = _reference(queries, collection, k, exclude=exclude)
    q, c = unit_rows(queries.double()), unit_rows(collection.double())
    got = (q @ c.T).gather(1, indices)
    tolerance = 2 * queries.shape[1] * float(torch.finfo(torch.float32).eps)
    torch.testing.assert_close(got, ordered, rtol=0, atol=tolerance)
    assert all(len(set(row)) == k for row in indices.tolist())
    separated = torch.ones_like(ordered, dtype=torch.bool)  # rank r is decided if it is apart from both sides
    gaps = (ordered[:, :-1] - ordered[:, 1:]) > tolerance
    separated[:, :-1] &= gaps
    separated[:, 1:] &= gaps
    assert torch.equal(indices[separated], sorted_rows[separated])


def _data(seed, queries=37, rows=203, dim=16):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(queries, dim, generator=generator), torch.randn(rows, dim, generator=generator)


@pytest.mark.parametrize("chunk", [1, 5, 64, 4096])
def test_exact_search_equals_a_float64_brute_force(chunk):
    queries, collection = _data(0)
    found = nearest(queries, collection, 7, chunk=chunk)
    assert isinstance(found, Neighbors)
    rows, similarities = _reference(queries, collection, 7)
    assert found.indices.dtype == torch.int64 and found.indices.shape == (37, 7)
    _assert_nearest(found.indices, queries, collection, 7)
    torch.testing.assert_close(found.similarities.double(), similarities, rtol=0, atol=1e-6)
    assert bool((found.similarities[:, :-1] >= found.similarities[:, 1:]).all())


def test_a_chunk_smaller_than_the_collection_gives_the_one_chunk_result():
    queries, collection = _data(1, queries=300, rows=1000, dim=32)
    whole = nearest(queries, collection, 10, chunk=4096)  # one block: all 300 queries x 1000 rows
    for chunk in (16, 128, 999):
        part = nearest(queries, collection, 10, chunk=chunk)
        _assert_nearest(part.indices, queries, collection, 10)
        torch.testing.assert_close(part.similarities, whole.similarities, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 1000])
def test_ties_are_broken_by_the_smaller_row_across_chunks(chunk):
    """Small integer vectors: the inner products are exact integers, so many rows tie exactly,
    within a chunk and across chunks; the order must be (similarity desc, row asc) for every chunk."""
    generator = torch.Generator().manual_seed(2)
    collection = torch.randint(0, 3, (60, 4), generator=generator).float()
    queries = torch.randint(0, 3, (25, 4), generator=generator).float()
    queries[0] = 0.0  # every similarity 0: the first k rows
    found = nearest(queries, collection, 9, chunk=chunk, normalize=False)
    rows, similarities = _reference(queries, collection, 9, normalize=False)
    assert torch.equal(found.indices, rows)
    assert torch.equal(found.similarities.double(), similarities)
    assert found.indices[0].tolist() == list(range(9))
    tied = (similarities[:, :-1] == similarities[:, 1:]).sum()
    assert tied > 50  # the data do tie, a lot


def test_an_excluded_row_is_never_a_neighbor():
    queries, collection = _data(3)
    exclude = torch.full((37,), -1, dtype=torch.int64)
    exclude[::2] = torch.arange(0, 37, 2) * 5
    nearest_rows = nearest(queries, collection, 1).indices[:, 0]
    exclude[1] = nearest_rows[1]  # a query's own nearest row, left out: the second comes first
    found = nearest(queries, collection, 6, chunk=16, exclude=exclude)
    _assert_nearest(found.indices, queries, collection, 6, exclude=exclude)
    assert not bool((found.indices == exclude[:, None]).any())
    assert found.indices[1, 0] == nearest(queries[1:2], collection, 2).indices[0, 1]
    # A collection row that is a query itself: exclude it and k may be n - 1 at most.
    everything = nearest(collection[:4], collection, 202, exclude=torch.arange(4))
    assert all(i not in everything.indices[i].tolist() for i in range(4))


def test_zero_rows_have_similarity_zero():
    collection = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]])
    found = nearest(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), collection, 3)
    assert found.indices.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert found.similarities.tolist() == [[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]


def test_memory_is_one_chunk_by_chunk_block(monkeypatch):
    """No product larger than chunk x chunk is formed, whatever the numbers of queries and rows."""
    shapes = []
    matmul = torch.Tensor.__matmul__

    def recording(self, other):
        result = matmul(self, other)
        shapes.append(tuple(result.shape))
        return result

    monkeypatch.setattr(torch.Tensor, "__matmul__", recording)
    queries, collection = _data(4, queries=500, rows=3000, dim=8)
    found = nearest(queries, collection, 5, chunk=128)
    assert shapes and max(r * c for r, c in shapes) <= 128 * 128
    assert len(shapes) == 4 * 24  # ceil(500 / 128) query blocks x ceil(3000 / 128) collection blocks
    monkeypatch.undo()
    assert torch.equal(found.indices, nearest(queries, collection, 5).indices)


def test_float64_input_is_searched_in_float64():
    queries, collection = _data(5)
    found = nearest(queries.double(), collection.double(), 3)
    assert found.similarities.dtype == torch.float64
    torch.testing.assert_close(found.similarities, _reference(queries, collection, 3)[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("call, error, message", [
    (lambda q, c: nearest(q, c, 0), ValueError, "k must be at least 1"),
    (lambda q, c: nearest(q, c, 204), ValueError, "k must be at most the 203 rows"),
    (lambda q, c: nearest(q, c, 203, exclude=torch.zeros(37, dtype=torch.int64)), ValueError,
     "202 rows of the collection other than a query itself"),
    (lambda q, c: nearest(q, c, 2.0), TypeError, "k must be an int"),
    (lambda q, c: nearest(q, c, 2, chunk=0), ValueError, "chunk must be at least 1"),
    (lambda q, c: nearest(q[:, :3], c, 2), ValueError, "queries have 3 features per row but the collection has 16"),
    (lambda q, c: nearest(q, c[:0], 2), ValueError, "collection is empty"),
    (lambda q, c: nearest(q.numpy(), c, 2), TypeError, "queries must be a torch.Tensor"),
    (lambda q, c: nearest(q, c.long(), 2), TypeError, "collection must have a floating dtype"),
    (lambda q, c: nearest(q, c[0], 2), ValueError, "collection must have 2 dimensions"),
    (lambda q, c: nearest(q.index_fill(0, torch.tensor([3]), float("nan")), c, 2), ValueError, "NaN or infinite"),
    (lambda q, c: nearest(q, c, 2, exclude=torch.zeros(36, dtype=torch.int64)), ValueError, "exclude must be"),
    (lambda q, c: nearest(q, c, 2, exclude=torch.full((37,), 203)), ValueError, "exclude holds a row outside"),
])
def test_bad_input_is_refused_naming_the_argument(call, error, message):
    queries, collection = _data(6)
    with pytest.raises(error, match=message):
        call(queries, collection)


# ------------------------------------------------------------------------------ FAISS

def test_without_faiss_the_error_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("No module named 'faiss'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "faiss", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_faiss)
    with pytest.raises(FaissMissingError, match=r"pip install 'contrastkit\[faiss\]'") as raised:
        faiss_flat_index(torch.randn(4, 2))
    assert isinstance(raised.value, ImportError) and "\n" not in str(raised.value)


def test_the_core_never_imports_faiss():
    """Importing the package, its command line and the search module leaves FAISS unloaded."""
    import subprocess

    code = ("import sys, contrastkit, contrastkit.cli, contrastkit.metrics.search, contrastkit.train.neighbors, "
            "contrastkit.commands.neighbors; print('faiss' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


faiss = pytest.importorskip("faiss", reason="FAISS is not installed (pip install 'contrastkit[faiss]')")


@pytest.mark.parametrize("excluding", [False, True])
def test_faiss_flat_index_agrees_with_the_exact_search_including_order(excluding):
    """Tie-free data: of 400 random queries, those whose 11 best similarities (float64) are all
    more than 1e-4 apart, far above float32 rounding; FAISS finds the same rows in the same
    order, with the same similarities to rounding."""
    pool, collection = _data(7, queries=400, rows=2500, dim=24)
    exclude = torch.arange(400, dtype=torch.int64) * 6 if excluding else None
    _, best = _reference(pool, collection, 11, exclude=exclude)
    tie_free = ((best[:, :-1] - best[:, 1:]) > 1e-4).all(dim=1)
    queries = pool[tie_free]
    exclude = exclude[tie_free] if excluding else None
    assert queries.shape[0] >= 100
    exact = nearest(queries, collection, 10, chunk=256, exclude=exclude)
    index = faiss_flat_index(collection, chunk=1000)
    assert isinstance(index, faiss.IndexFlatIP) and index.ntotal == 2500
    approximate = faiss_nearest(index, queries, 10, exclude=exclude)
    assert torch.equal(approximate.indices, exact.indices)
    torch.testing.assert_close(approximate.similarities, exact.similarities, rtol=0, atol=1e-5)
    if excluding:
        assert not bool((approximate.indices == exclude[:, None]).any())


def test_a_saved_faiss_index_reads_back_the_same(tmp_path):
    queries, collection = _data(8, rows=500)
    index = faiss_flat_index(collection)
    write_faiss_index(index, tmp_path / "x.faiss")
    again = read_faiss_index(tmp_path / "x.faiss")
    assert torch.equal(faiss_nearest(again, queries, 4).indices, faiss_nearest(index, queries, 4).indices)
    (tmp_path / "bad.faiss").write_bytes(b"not an index")
    with pytest.raises(ValueError, match="bad.faiss is not a FAISS index"):
        read_faiss_index(tmp_path / "bad.faiss")
    with pytest.raises(ValueError, match="k must be at most the 500 rows"):
        faiss_nearest(index, queries, 501)
    assert import_faiss() is faiss
