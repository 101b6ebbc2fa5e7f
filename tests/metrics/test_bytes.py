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


def _without_kernel(monkeypatch, how):
    """A torch without the int8 kernel: no ``_int_mm`` at all, or one whose CPU kernel fails."""
    monkeypatch.setattr(bytes_module, "_KERNEL", [])
    if how == "missing":
        monkeypatch.delattr(torch, "_int_mm", raising=False)
    else:
        def failing(a, b):
            raise RuntimeError("no CPU kernel")
        monkeypatch.setattr(torch, "_int_mm", failing, raising=False)


@pytest.mark.parametrize("fallback", [None, "missing", "failing"])
def test_integer_matmul_is_the_exact_product(monkeypatch, fallback):
    if fallback:
        _without_kernel(monkeypatch, fallback)
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.integers(-128, 128, (37, 300), dtype=np.int8))
    b = torch.from_numpy(rng.integers(-128, 128, (300, 23), dtype=np.int8))
    product = integer_matmul(a, b)
    assert product.dtype == torch.int32
    assert torch.equal(product.long(), a.long() @ b.long())
    assert bytes_module.integer_kernel() is (fallback is None)


def test_without_the_kernel_8_bit_features_take_the_float_path(monkeypatch):
    _without_kernel(monkeypatch, "failing")
    monkeypatch.setattr(probe_module, "BYTE_PATH_VALUES", 0)
    monkeypatch.setattr(probe_module, "_byte_knn", None)  # called, it would fail
    monkeypatch.setattr(probe_module, "_ByteRows", None)
    rng = np.random.default_rng(4)
    memory, queries, labels = _pixels(rng, 300, 20), _pixels(rng, 40, 20), rng.integers(0, 3, 300)
    assert np.array_equal(knn_predict(memory, labels, queries, k=5),
                          knn_predict(memory.astype(np.float32) / 255, labels, queries.astype(np.float32) / 255, k=5))
    result = linear_probe(memory[:200], labels[:200], memory[200:], labels[200:], queries, labels[:40])
    assert 0 <= result.test_accuracy <= 1


def test_centring_is_exact():
    pixels = np.arange(256, dtype=np.uint8)[None, :]
    assert torch.equal(centred(pixels).long(), torch.arange(256)[None, :] - 128)


def test_digits_write_a_float_matrix_to_31_bits():
    v = torch.randn(7, 500, dtype=torch.float64) * torch.logspace(-8, 8, 7, dtype=torch.float64)[:, None]
    v[2] = 0.0  # an all-zero row
    v[5, 3] = float("nan")  # a non-finite row: NaN scale, NaN products
    digits, scale = row_digits(v)
    assert digits.dtype == torch.int8 and digits.shape == (28, 500)
    rebuilt = sum(digits[j * 7:(j + 1) * 7].double() * 256.0 ** j for j in range(4)) * scale[:, None]
    finite = [0, 1, 2, 3, 4, 6]
    assert torch.all((rebuilt - v)[finite].abs() <= v[finite].abs().amax(1, keepdim=True) / (2 * 127 * 256 ** 3))
    assert torch.equal(rebuilt[2], v[2])
    assert torch.isnan(scale[5]) and not torch.isnan(scale[finite]).any()
    assert torch.isnan(bytes_times(centred(_pixels(np.random.default_rng(0), 3, 500)).T.contiguous(), v.T)[5]).all()


@pytest.mark.parametrize("split", [False, True])
def test_products_with_pixels_equal_float64(request, split):
    if split:
        request.getfixturevalue("short_sums")
    rng = np.random.default_rng(1)
    q = centred(_pixels(rng, 41, 29))
    v = torch.randn(29, 5, dtype=torch.float64)
    g = torch.randn(5, 41)
    shift = torch.randn(29, dtype=torch.float64) * 30
    centred_q = q.double() - shift
    reference_v = (centred_q @ v).T
    reference_g = g.double() @ centred_q
    scale_v = centred_q.abs() @ v.abs()
    assert torch.all((bytes_times(q.T.contiguous(), v, shift) - reference_v).abs() <= 1e-8 * scale_v.amax(0)[:, None])
    assert torch.all((times_bytes(g, q, shift) - reference_g).abs()
                     <= 1e-8 * (g.double().abs() @ centred_q.abs()).amax(1)[:, None])
    # a feature equal to its shift in every row adds exactly nothing
    q[:, 4] = 7
    shift[4] = 7.0
    assert torch.equal(times_bytes(g, q, shift)[:, 4], torch.zeros(5, dtype=torch.float64))
    alone = torch.zeros_like(v)
    alone[4] = v[4]
    assert torch.equal(bytes_times(q.T.contiguous(), alone, shift), torch.zeros(5, 41, dtype=torch.float64))
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
    # more neighbors asked for than there are memory rows: all of them vote
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


def test_the_second_moment_of_byte_rows_is_that_of_the_standardised_pixels():
    from contrastkit.metrics.probe import _ByteRows

    rng = np.random.default_rng(5)
    pixels = np.clip(rng.normal(40, 25, (301, 17)), 0, 255).astype(np.uint8)  # means far from 128
    pixels[:, 6] = 200  # a constant column
    rows = _ByteRows(pixels)
    x = torch.from_numpy(pixels).double()
    std = x.std(0, unbiased=False)
    standardised = (x - x.mean(0)) / torch.where(std > 0, std, torch.full_like(std, 255.0))
    for step in (1, 3):
        sample = standardised[::step]
        assert torch.allclose(rows.second_moment(step), sample.T @ sample / sample.shape[0], rtol=1e-12, atol=1e-12)


def test_pixel_features_are_bytes_for_8_bit_images_only():
    images = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8).float().div_(255.0)
    features = pixel_features(images)
    assert features.dtype == np.uint8 and features.shape == (5, 48)
    assert np.array_equal(features, (images.reshape(5, -1) * 255).round().numpy().astype(np.uint8))
    assert torch.equal(compact_images(images), torch.from_numpy(features).reshape(images.shape))
    images[0, 0, 0, 0] = 0.5  # not k / 255: the floats are kept
    features = pixel_features(images)
    assert features.dtype == np.float32 and np.array_equal(features, images.reshape(5, -1).numpy())
    # uint8 images in several batches (the read-out's batches hold 256): the same bytes
    many = torch.randint(0, 256, (600, 1, 3, 3), dtype=torch.uint8)
    assert np.array_equal(pixel_features(many), many.reshape(600, -1).numpy())
    assert np.array_equal(pixel_features(many.float().div_(255.0)), many.reshape(600, -1).numpy())


def test_the_encoders_read_the_baselines_pixels_as_they_read_the_split():
    """The raw-pixel baseline decodes the splits; the encoders then read its pixels: their
    numbers are those of a read-out without the raw pixels."""
    from contrastkit.data import load_dataset
    from contrastkit.metrics import evaluate_encoders

    data = load_dataset("glyphlab", seed=0)
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(data.image_shape)), 16))
    with_pixels = evaluate_encoders(data, encoder, torch.device("cpu"))
    without = evaluate_encoders(data, encoder, torch.device("cpu"), raw_pixels=False)
    assert {k: v for k, v in with_pixels.items() if not k.startswith("raw_pixel_")} == without
    assert "raw_pixel_probe_accuracy" in with_pixels
