"""The torch read-out gives the numbers of the scikit-learn / float64 read-out it replaced."""

import warnings

import numpy as np
import pytest

from contrastkit.metrics import knn_predict, linear_probe
from contrastkit.train.setup import limit_threads

pytest.importorskip("sklearn")


@pytest.fixture(autouse=True)
def _one_thread():
    with limit_threads(1):
        yield


def _overlapping_clusters(rng, sizes, classes=4, dim=24):
    # Overlapping classes (spread comparable to the centre distance) and correlated features:
    # the optimum of every C is finite and the probe accuracy is well below 1.
    centres = rng.normal(size=(classes, dim)) * 1.5
    mixing = np.eye(dim) + 0.8 * rng.normal(size=(dim, dim)) / np.sqrt(dim)
    out = []
    for n in sizes:
        labels = rng.integers(0, classes, size=n)
        out.append(((centres[labels] + 3.0 * rng.normal(size=(n, dim))) @ mixing * 7.0 + 3.0, labels))
    return out


def _sklearn_probe(train, val, test, grid):
    """The former read-out: StandardScaler, LogisticRegression (L-BFGS, multinomial), float64,
    converged tightly so the comparison is with the optimum, not with an early stop."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train[0])
    by_c, test_by_c = {}, {}
    for c in grid:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = LogisticRegression(C=c, max_iter=10000, tol=1e-8).fit(scaler.transform(train[0]), train[1])
        by_c[c] = float((model.predict(scaler.transform(val[0])) == val[1]).mean())
        test_by_c[c] = float((model.predict(scaler.transform(test[0])) == test[1]).mean())
    return by_c, test_by_c


def test_probe_matches_scikit_learn_within_the_probe_tolerance():
    rng = np.random.default_rng(3)
    train, val, test = _overlapping_clusters(rng, (400, 300, 300))
    grid = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
    result = linear_probe(*train, *val, *test, c_grid=grid)
    by_c, test_by_c = _sklearn_probe(train, val, test, grid)
    # Tolerance: 1% of the split (3 of 300 samples) per C; in practice they agree to a sample.
    for c in grid:
        assert abs(result.val_accuracy_by_c[c] - by_c[c]) <= 0.01, (c, result.val_accuracy_by_c, by_c)
    assert abs(result.test_accuracy - test_by_c[result.best_c]) <= 0.01
    assert 0.4 < result.test_accuracy < 0.95  # a problem where the probe is informative


def test_probe_accepts_float32_and_float64_alike():
    rng = np.random.default_rng(4)
    train, val, test = _overlapping_clusters(rng, (200, 100, 100))
    as64 = linear_probe(*train, *val, *test)
    as32 = linear_probe(train[0].astype(np.float32), train[1], val[0].astype(np.float32), val[1],
                        test[0].astype(np.float32), test[1])
    assert as32.best_c == as64.best_c
    assert abs(as32.test_accuracy - as64.test_accuracy) <= 0.01


def _knn_float64(memory_x, memory_y, query_x, k, temperature, classes):
    """The former kNN: float64 numpy, the whole (m, n) similarity matrix at once."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    similarity = unit(query_x) @ unit(memory_x).T
    neighbors = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    neighbor_sim = np.take_along_axis(similarity, neighbors, axis=1)
    weights = np.exp((neighbor_sim - neighbor_sim.max(axis=1, keepdims=True)) / temperature)
    votes = np.zeros((query_x.shape[0], classes))
    np.add.at(votes, (np.arange(query_x.shape[0])[:, None], memory_y[neighbors]), weights)
    return votes.argmax(axis=1)


@pytest.mark.parametrize("block", [7, 1024])
def test_knn_matches_the_float64_reference(monkeypatch, block):
    from contrastkit.metrics import probe

    monkeypatch.setattr(probe, "KNN_BLOCK", block)  # several blocks, and one
    rng = np.random.default_rng(5)
    (memory_x, memory_y), (query_x, query_y) = _overlapping_clusters(rng, (500, 120), classes=5, dim=16)
    for k, temperature in ((20, 0.07), (5, 0.5), (1, 0.07)):
        expected = _knn_float64(memory_x, memory_y, query_x, k, temperature, 5)
        got = knn_predict(memory_x, memory_y, query_x, k=k, temperature=temperature, num_classes=5)
        # float32 similarities may reorder two neighbors whose cosines agree to ~1e-7.
        assert (got == expected).mean() >= 0.99, (k, temperature)


def test_probe_is_converged_where_there_are_fewer_images_than_features(monkeypatch):
    """GlyphLab's raw pixels: 120 training images of 1,024 pixels, separable, so the weakly
    regularised fits have far optima; a fit stopped early (as at tolerance 1e-4 or 1e-5) scored
    C = 100 higher on val than its optimum does, and val picked it."""
    from contrastkit.data import load_dataset

    data = load_dataset("glyphlab")
    splits = [(s.images.reshape(len(s), -1).numpy(), s.labels.numpy()) for s in (data.train, data.val, data.test)]
    grid = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
    result = linear_probe(*splits[0], *splits[1], *splits[2], c_grid=grid)
    by_c, test_by_c = _sklearn_probe(*splits, grid)
    for c in grid:
        assert abs(result.val_accuracy_by_c[c] - by_c[c]) <= 0.01, (c, result.val_accuracy_by_c, by_c)
    best = min(c for c in grid if by_c[c] == max(by_c.values()))
    assert abs(result.test_accuracy - test_by_c[best]) <= 0.01, (result, test_by_c, best)


@pytest.mark.parametrize("rows", ["float", "bytes"])
def test_probe_objective_and_gradients_match_a_float64_autograd_reference(rows):
    """The written-out cross-entropy and gradients (log1p / expm1 form) against autograd of the
    textbook form in float64, with confidently right, confidently wrong and uncertain samples;
    on float features and on 8-bit ones in exact integer arithmetic (standardised by their columns)."""
    import torch

    from contrastkit.metrics.probe import _ByteRows, _FloatRows, _MultinomialProbe

    torch.manual_seed(0)
    n, d, k = 64, 12, 4
    y = torch.randint(0, k, (n,))
    if rows == "float":
        x = torch.randn(n, d)
        probe = _MultinomialProbe(_FloatRows(x), y, k)
    else:
        pixels = torch.randint(0, 256, (n, d), dtype=torch.uint8)
        pixels[:, 3] = 17  # a constant column: divided by 1 in units of k / 255
        pixels[:, 5] = torch.randint(0, 12, (n,), dtype=torch.uint8)  # a dark column, its mean far from 128
        x = pixels.double()
        std = x.std(0, unbiased=False)
        x = ((x - x.mean(0)) / torch.where(std > 0, std, torch.full_like(std, 255.0))).float()
        probe = _MultinomialProbe(_ByteRows(pixels.numpy()), y, k)
    for scale in (0.1, 3.0, 30.0):  # logits of size ~0.3, ~10 and ~100
        weight = (torch.randn(d, k, dtype=torch.float64) * scale).requires_grad_()
        bias = torch.randn(k, dtype=torch.float64).requires_grad_()
        penalty = 0.01
        logits = x.double() @ weight + bias
        reference = torch.nn.functional.cross_entropy(logits, y) + 0.5 * penalty * weight.pow(2).sum()
        reference.backward()
        loss, grad_weight, grad_bias = probe._loss_and_gradients(weight.detach(), bias.detach(), penalty)
        # float32 logits: relative agreement to ~1e-5 of the largest term.
        assert abs(loss.item() - reference.item()) <= 1e-5 * max(1.0, reference.item()), scale
        assert torch.allclose(grad_weight, weight.grad, rtol=1e-4, atol=1e-5 * scale), scale
        assert torch.allclose(grad_bias, bias.grad, rtol=1e-4, atol=1e-6), scale
        if rows == "bytes":  # the constant column's gradient is its penalty alone, exactly
            assert torch.equal(grad_weight[3], penalty * weight.detach()[3]), scale


def test_probe_cross_entropy_keeps_the_digits_of_confident_samples():
    """A sample right by a margin of 20 has CE ~ 2e-9 and p_y - 1 ~ -2e-9; float32's textbook
    form returns 0 for both, the written-out form the float64 value."""
    import torch

    from contrastkit.metrics.probe import _FloatRows, _MultinomialProbe

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1])
    probe = _MultinomialProbe(_FloatRows(x), y, 2)
    weight = torch.tensor([[20.0, 0.0], [0.0, 20.0]], dtype=torch.float64)
    loss, grad_weight, _ = probe._loss_and_gradients(weight, torch.zeros(2, dtype=torch.float64), 0.0)
    expected = torch.nn.functional.softplus(torch.tensor(-20.0, dtype=torch.float64)).item()  # log(1 + e^-20)
    assert abs(loss.item() - expected) <= 1e-6 * expected
    assert grad_weight[0, 0].item() < 0 and abs(grad_weight[0, 0].item() + expected / 2) <= 1e-6 * expected
