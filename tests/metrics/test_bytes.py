"""The exact integer path of the read-out on 8-bit features (contrastkit.metrics.bytes): its
products equal float64 references, long sums are split without changing them, the kNN's
predictions equal a float64 reference's, and the probe's numbers equal the float path's and a
converged scikit-learn fit's on real CIFAR-10 pixels."""

import numpy as np
import pytest
import torch

from contrastkit.data import compact_images
from contrastkit.metrics import bytes as bytes_module, knn_predict, linear_probe, pixel_features, probe as probe_module
from contrastkit.metrics.bytes import (bytes_times, centred, column_statistics, gram, integer_matmul, row_digits,
                                       row_sums, times_bytes)


def _pixels(rng, n, d):
    return rng.integers(0, 256, (n, d), dtype=np.uint8)


@pytest.fixture
def short_sums(monkeypatch):
    """Sums of at most 7 products per integer product, so that every splitting loop runs."""
    monkeypatch.setattr(bytes_module, "SUM_CHUNK", 7)
    monkeypatch.setattr(probe_module, "SUM_CHUNK", 7)
    monkeypatch.setattr(bytes_module, "_GRAM_ROWS", 5)


@pytest.mark.parametrize("fallback", [False, True])
def test_integer_matmul_is_the_exact_product(monkeypatch, fallback):
    if fallback:  # a torch without the int8 kernel
        monkeypatch.delattr(torch, "_int_mm", raising=False)
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.integers(-128, 128, (37, 300), dtype=np.int8))
    b = torch.from_numpy(rng.integers(-128, 128, (300, 23), dtype=np.int8))
    product = integer_matmul(a, b)
    assert product.dtype == torch.int32
    assert torch.equal(product.long(), a.long() @ b.long())


def test_centring_is_exact():
    pixels = np.arange(256, dtype=np.uint8)[None, :]
    assert torch.equal(centred(pixels).long(), torch.arange(256)[None, :] - 128)


def test_digits_write_a_float_matrix_to_31_bits():
    v = torch.randn(6, 500, dtype=torch.float64) * torch.logspace(-8, 8, 6, dtype=torch.float64)[:, None]
    v[2] = 0.0  # an all-zero row
    digits, scale = row_digits(v)
    assert digits.dtype == torch.int8 and digits.shape == (24, 500)
    rebuilt = sum(digits[j * 6:(j + 1) * 6].double() * 256.0 ** j for j in range(4)) * scale[:, None]
    assert torch.all((rebuilt - v).abs() <= v.abs().amax(1, keepdim=True) * 2.0 ** -31)
    assert torch.equal(rebuilt[2], v[2])


@pytest.mark.parametrize("split", [False, True])
def test_products_with_pixels_equal_float64(request, split):
    if split:
        request.getfixturevalue("short_sums")
    rng = np.random.default_rng(1)
    q = centred(_pixels(rng, 41, 29))
    v = torch.randn(29, 5, dtype=torch.float64)
    g = torch.randn(5, 41)
    reference_v = (q.double() @ v).T
    reference_g = g.double() @ q.double()
    scale_v = q.double().abs() @ v.abs()
    assert torch.all((bytes_times(q.T.contiguous(), v) - reference_v).abs() <= 1e-8 * scale_v.amax(0)[:, None])
    assert torch.all((times_bytes(g, q) - reference_g).abs() <= 1e-8 * (g.double().abs() @ q.double().abs()).amax(1)[:, None])
    sums, squares = row_sums(q)
    assert torch.equal(sums, q.long().sum(1)) and torch.equal(squares, (q.long() ** 2).sum(1))
    assert torch.equal(gram(q), q.double().T @ q.double())
    mean, variance = column_statistics(q)
    p = q.double() + 128
    assert torch.allclose(mean, p.mean(0), rtol=1e-15, atol=0) and torch.allclose(variance, p.var(0, unbiased=False), rtol=1e-12)


def _knn_reference(memory, labels, queries, k, temperature, classes):
    """Weighted kNN on float64 cosines of the integer pixels."""
    m, q = memory.astype(np.float64), queries.astype(np.float64)
    cos = (q @ m.T) / np.maximum(np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(m, axis=1)[None, :], 1e-300)
    order = np.argsort(-cos, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(cos, order, 1)
    votes = np.zeros((len(q), classes))
    np.add.at(votes, (np.repeat(np.arange(len(q)), k), labels[order].ravel()), np.exp((top - top[:, :1]) / temperature).ravel())
    return votes.argmax(1)


@pytest.mark.parametrize("split", [False, True])
def test_the_knn_on_bytes_gives_the_float64_predictions(monkeypatch, request, split):
    if split:
        request.getfixturevalue("short_sums")
    monkeypatch.setattr(probe_module, "BYTE_PATH_VALUES", 0)
    monkeypatch.setattr(probe_module, "_BYTE_KNN_BYTES", 8 * 600 * 7)  # blocks of 7 queries
    rng = np.random.default_rng(2)
    memory, queries = _pixels(rng, 600, 48), _pixels(rng, 50, 48)
    memory[3] = 0  # a black image: cosine 0 with everything, as in the float path
    queries[4] = 0
    labels = rng.integers(0, 4, 600)
    taken = []
    monkeypatch.setattr(probe_module, "integer_matmul", lambda a, b: taken.append(1) or integer_matmul(a, b))
    predicted = knn_predict(memory, labels, queries, k=15, temperature=0.07)
    assert taken  # the integer path ran
    assert np.array_equal(predicted, _knn_reference(memory, labels, queries, 15, 0.07, 4))
    as_float = knn_predict(memory.astype(np.float32) / 255, labels, queries.astype(np.float32) / 255, k=15)
    assert np.array_equal(predicted, as_float)
    # more neighbours asked for than there are memory rows: all of them vote
    assert np.array_equal(knn_predict(memory[:9], labels[:9], queries, k=20),
                          _knn_reference(memory[:9], labels[:9], queries, 9, 0.07, 4))


def test_small_byte_features_are_read_as_the_images_floats():
    """Below BYTE_PATH_VALUES uint8 features give exactly the numbers of their k / 255 floats."""
    rng = np.random.default_rng(3)
    centres = rng.integers(60, 190, (3, 40))
    labels = rng.integers(0, 3, 900)
    x = np.clip(centres[labels] + rng.normal(0, 70, (900, 40)), 0, 255).astype(np.uint8)
    splits = [(x[a:b], labels[a:b]) for a, b in ((0, 500), (500, 700), (700, 900))]
    as_bytes = linear_probe(*splits[0], *splits[1], *splits[2])
    as_float = linear_probe(*[(s[0].astype(np.float32) / 255, s[1]) for s in splits][0],
                            *[(s[0].astype(np.float32) / 255, s[1]) for s in splits][1],
                            *[(s[0].astype(np.float32) / 255, s[1]) for s in splits][2])
    assert as_bytes == as_float


def test_pixel_features_are_bytes_for_8_bit_images_only():
    images = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8).float().div_(255.0)
    features = pixel_features(images)
    assert features.dtype == np.uint8 and features.shape == (5, 48)
    assert np.array_equal(features, (images.reshape(5, -1) * 255).round().numpy().astype(np.uint8))
    assert torch.equal(compact_images(images), torch.from_numpy(features).reshape(images.shape))
    images[0, 0, 0, 0] = 0.5  # not k / 255: the floats are kept
    features = pixel_features(images)
    assert features.dtype == np.float32 and np.array_equal(features, images.reshape(5, -1).numpy())
