"""The bounded linear probe (stopping rules, evaluation cap, early stop along the C grid) gives
the test accuracy of a converged scikit-learn fit under the same protocol, on real features;
its early stop keeps the protocol; a fit stopped at its cap is said so."""

import warnings

import numpy as np
import pytest
import torch

from contrastkit.metrics import ProbeCapWarning, linear_probe, probe as probe_module
from contrastkit.data import compact_images
from contrastkit.metrics.probe import _ByteRows as ByteRows, _walk_grid
from contrastkit.train.setup import limit_threads

from _data_fixtures import CIFAR_TARBALL, cifar_subset

GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
NEEDS_CIFAR = pytest.mark.skipif(not CIFAR_TARBALL, reason="the CIFAR-10 JPEG tarball (shared/data/cifar10-jpeg.tar.gz "
                                 "next to the checkout, or $CONTRASTKIT_CIFAR10_TARBALL) is absent")


@pytest.fixture(autouse=True)
def _one_thread():
    with limit_threads(1):
        yield


def _sklearn_test_accuracy(train, val, test, grid=GRID):
    """The converged reference: StandardScaler + LogisticRegression for every C of the grid, C
    with the best val accuracy (the smallest on ties), its test accuracy. Newton-CG in float64 to
    a largest gradient entry of 1e-8: a second-order method, ~20 iterations where scikit-learn's
    L-BFGS takes ~1,000 on these weakly regularised fits (a few seconds, not minutes)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train[0])
    best = None
    for c in sorted(grid):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = LogisticRegression(C=c, solver="newton-cg", max_iter=1000, tol=1e-8)
            model.fit(scaler.transform(train[0]), train[1])
        val_accuracy = float((model.predict(scaler.transform(val[0])) == val[1]).mean())
        if best is None or val_accuracy > best[0]:
            best = (val_accuracy, c, float((model.predict(scaler.transform(test[0])) == test[1]).mean()))
    return best


# -- real features: CIFAR-10 images as 28x28 grayscale -------------------------------------

@pytest.fixture(scope="module")
def cifar_gray(tmp_path_factory):
    """3,000 CIFAR-10 test images (300 a class) as 1x28x28 grayscale in [0, 1], shuffled, with labels."""
    if not CIFAR_TARBALL:
        pytest.skip("the CIFAR-10 JPEG tarball is absent")
    from contrastkit.data import load_dataset

    folder = cifar_subset(tmp_path_factory.mktemp("cifar") / "cifar10", per_class=300)
    data = load_dataset(str(folder), size=28, color="L", test_fraction=0.2, val_fraction=0.1)
    images = torch.cat([data.train.images, data.val.images, data.test.images])
    labels = torch.cat([data.train.labels, data.val.labels, data.test.labels]).numpy()
    order = np.random.default_rng(0).permutation(len(labels))
    return data, images[order], labels[order]


def _splits(features, labels, sizes=(1200, 600, 1200)):
    """Train / val / test of ``sizes`` rows: 0.002 of the test split is 2.4 images."""
    bounds = np.cumsum((0,) + sizes)
    return [(features[a:b], labels[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _encoder_features(data, images, trained):
    from contrastkit.data import make_views
    from contrastkit.methods import build_model
    from contrastkit.metrics import extract_features
    from contrastkit.train import PretrainConfig

    torch.manual_seed(0)
    model = build_model(PretrainConfig(batch_size=64).resolved(), data.image_shape)
    if trained:  # 20 SimCLR steps on the training images: features unlike the random ones
        views = make_views(data, mode="augment", device="cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
        generator = torch.Generator().manual_seed(0)
        for _ in range(20):
            indices = torch.randint(0, len(data.train), (64,), generator=generator)
            loss = model.loss(*views(data.train, indices))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return extract_features(model.encoder, images, torch.device("cpu"))


@NEEDS_CIFAR
@pytest.mark.parametrize("features", ["raw pixels", "8-bit raw pixels", "random-init encoder", "trained encoder"])
def test_the_bounded_probe_gives_the_converged_test_accuracy_on_real_features(cifar_gray, features, monkeypatch):
    data, images, labels = cifar_gray
    if features == "raw pixels":  # at 14x14 (means of 2x2), so that the reference takes seconds
        x = torch.nn.functional.avg_pool2d(images, 2).reshape(len(images), -1).numpy()
    elif features == "8-bit raw pixels":  # every other pixel (14x14) as uint8: the exact integer path
        x = compact_images(images[:, :, ::2, ::2].reshape(len(images), -1)).numpy()
        assert x.dtype == np.uint8
        monkeypatch.setattr(probe_module, "BYTE_PATH_VALUES", 0)
        taken = []
        monkeypatch.setattr(probe_module, "_ByteRows", lambda *a: taken.append(1) or ByteRows(*a))
    else:
        x = _encoder_features(data, images, trained=features == "trained encoder")
    train, val, test = _splits(x, labels)
    result = linear_probe(*train, *val, *test, c_grid=GRID)
    if features == "8-bit raw pixels":
        assert taken
        train, val, test = [(split.astype(np.float32) / 255, y) for split, y in (train, val, test)]
        # the float path's number, to the protocol's tolerance (each stops where its own rounding lets it)
        assert abs(result.test_accuracy - linear_probe(*train, *val, *test, c_grid=GRID).test_accuracy) <= 0.002
    _, reference_c, reference = _sklearn_test_accuracy(train, val, test)
    assert abs(result.test_accuracy - reference) <= 0.002, (features, result, reference_c, reference)
    assert result.capped_c == []  # converged by its own rules, not stopped by the cap
    assert 0.15 < result.test_accuracy < 0.6  # informative, far from separable: chance is 0.1


# -- the protocol ---------------------------------------------------------------------------

def _scripted(values):
    """``val_accuracy_of`` for :func:`_walk_grid` that returns ``values`` in order and logs the C asked."""
    asked = []

    def val_accuracy_of(c):
        asked.append(c)
        return values[len(asked) - 1]
    return val_accuracy_of, asked


@pytest.mark.parametrize("values, fitted, best", [
    ((0.3, 0.5, 0.4, 0.3, 0.9, 0.9), 4, 0.01),     # two falls in a row: C = 10 and 100 never fitted
    ((0.3, 0.5, 0.4, 0.45, 0.6, 0.2), 6, 10.0),    # a fall, a rise, a new best: the walk goes on
    ((0.3, 0.5, 0.5, 0.4, 0.4, 0.3), 6, 0.01),     # ties are no fall; the smallest C wins a tie
    ((0.5, 0.4, 0.3, 0.2, 0.1, 0.0), 3, 0.001),    # best at the first C
    ((0.1, 0.2, 0.3, 0.4, 0.5, 0.6), 6, 100.0),    # rising to the end: every C
])
def test_the_grid_walk_stops_after_two_falls_in_a_row_only(values, fitted, best):
    val_accuracy_of, asked = _scripted(values)
    best_c, by_c = _walk_grid(GRID, val_accuracy_of, patience=2)
    assert asked == list(GRID[:fitted]) and list(by_c) == asked
    assert best_c == best


def test_without_patience_the_whole_grid_is_walked():
    val_accuracy_of, asked = _scripted((0.5, 0.4, 0.3, 0.2, 0.1, 0.9))
    best_c, _ = _walk_grid(GRID, val_accuracy_of, patience=None)
    assert asked == list(GRID) and best_c == 100.0


def _overlapping(rng, n, classes=4, dim=24):
    centres = rng.normal(size=(classes, dim)) * 1.5
    labels = rng.integers(0, classes, size=n)
    return centres[labels] + 3.0 * rng.normal(size=(n, dim)), labels


def test_the_early_stop_picks_the_c_of_the_whole_grid_and_reads_the_test_split_once(monkeypatch):
    rng = np.random.default_rng(7)
    train, val, test = (_overlapping(rng, n) for n in (400, 300, 300))
    scored = []
    original = probe_module._MultinomialProbe.predict

    def predict(self, x):
        scored.append(x.shape[0])
        return original(self, x)

    monkeypatch.setattr(probe_module._MultinomialProbe, "predict", predict)
    bounded = linear_probe(*train, *val, *test[:1], test[1], c_grid=GRID)
    walked = len(bounded.val_accuracy_by_c)
    assert walked < len(GRID)  # val fell twice in a row: the walk stopped
    assert scored == [300] * walked + [300]  # val once per fitted C, then the test split once
    whole = linear_probe(*train, *val, *test, c_grid=GRID, patience=None)
    assert bounded.best_c == whole.best_c and bounded.test_accuracy == whole.test_accuracy
    assert bounded.val_accuracy_by_c == {c: whole.val_accuracy_by_c[c] for c in bounded.val_accuracy_by_c}
    # Test labels never steer the walk.
    shuffled = linear_probe(*train, *val, test[0], (test[1] + 1) % 4, c_grid=GRID)
    assert shuffled.val_accuracy_by_c == bounded.val_accuracy_by_c and shuffled.best_c == bounded.best_c


# -- the cap ----------------------------------------------------------------------------------

def test_a_fit_stopped_at_its_cap_is_named_and_warned_about():
    rng = np.random.default_rng(8)
    train, val, test = (_overlapping(rng, n) for n in (400, 300, 300))
    with pytest.warns(ProbeCapWarning, match="stopped at its cap of 3 evaluations"):
        capped = linear_probe(*train, *val, *test, c_grid=GRID, max_evaluations=3)
    assert capped.capped_c and set(capped.capped_c) <= set(capped.val_accuracy_by_c)
    assert all(capped.evaluations_by_c[c] <= 3 for c in capped.val_accuracy_by_c)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProbeCapWarning)
        free = linear_probe(*train, *val, *test, c_grid=GRID)
    assert free.capped_c == [] and max(free.evaluations_by_c.values()) < probe_module.PROBE_MAX_EVALUATIONS


def test_the_cap_scales_with_the_data():
    cap = probe_module.probe_evaluation_cap
    small, large = cap(120, 1024, 3), cap(45_000, 3_072, 10)
    assert small == probe_module.PROBE_MAX_EVALUATIONS  # a tiny problem: the ceiling
    assert probe_module.PROBE_MIN_EVALUATIONS <= large < small
    assert cap(45_000, 784, 10) > large  # fewer features: cheaper evaluations, more of them


@pytest.mark.parametrize("n, d, rank", [(40, 300, 40), (40, 300, 12), (30, 200, 30)])
def test_fewer_images_than_features_give_the_fit_of_the_whole_feature_space(monkeypatch, n, d, rank):
    # The probe fits in the training rows' span when 2 n <= d; forced off, the same grid must reach
    # the same optimum (it lies in that span). rank < n: duplicated directions.
    #
    # Compared: the objective each fit reached, at every C. Not the accuracies: the weakly
    # regularised fits (C = 100) stop where float32 logits no longer resolve the objective, a few
    # 1e-6 to 6e-5 of it apart (seen across CPU kernels and thread counts), and a val image that
    # lies that close to a class boundary flips with the rounding (0.5667 against 0.5833 on one
    # CPU, equal on another). A basis that loses a direction of the rows raises the objective by
    # 1e-3 to 0.57 of itself (the rank-deficient and the n = 30 sets).
    from contrastkit.metrics import probe as probe_module

    generator = np.random.default_rng(n + d + rank)
    mix = generator.normal(size=(rank, d))
    def split(m):
        x = generator.normal(size=(m, rank)) @ mix + 0.01 * generator.normal(size=(m, d)) * (rank == n)
        return x.astype(np.float32), (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    train, val, test = split(n), split(60), split(60)
    train[0][:, 5] = 3.0  # a constant feature

    objectives: list = []
    fit = probe_module._MultinomialProbe.fit

    def recording_fit(model, c, max_evaluations, trace=None):
        fit(model, c, max_evaluations, trace)
        loss, _, _ = model._loss_and_gradients(model.weight, model.bias, 1.0 / (c * model.data.n))
        objectives.append((c, float(loss), model.data.d))

    monkeypatch.setattr(probe_module._MultinomialProbe, "fit", recording_fit)
    grid = (0.01, 1.0, 100.0)
    probe_module.linear_probe(*train, *val, *test, c_grid=grid, patience=None)
    reduced, objectives[:] = list(objectives), []
    monkeypatch.setattr(probe_module, "_row_space", lambda *splits: splits)
    probe_module.linear_probe(*train, *val, *test, c_grid=grid, patience=None)
    whole = list(objectives)
    assert [c for c, _, _ in reduced] == [c for c, _, _ in whole] == list(grid)
    assert all(features <= n for _, _, features in reduced) and all(features == d for _, _, features in whole)
    for (c, at_reduced, _), (_, at_whole, _) in zip(reduced, whole):
        assert at_reduced == pytest.approx(at_whole, rel=2e-4), c
