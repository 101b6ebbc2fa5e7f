"""The read-out metrics: linear probe with C chosen on val, weighted kNN."""

import math

import numpy as np
import pytest

from contrastkit.metrics import knn_accuracy, knn_predict, linear_probe
from contrastkit.train.setup import limit_threads


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny problems: extra threads only add synchronisation cost on a shared CPU.
    with limit_threads(1):
        yield


def _centres(classes, dim, rng):
    return rng.normal(size=(classes, dim)) * 5.0


def _clusters(n_per_class, centres, spread, rng):
    labels = np.repeat(np.arange(centres.shape[0]), n_per_class)
    return centres[labels] + spread * rng.normal(size=(labels.size, centres.shape[1])), labels


def test_probe_separable_features_is_near_perfect():
    rng = np.random.default_rng(0)
    centres = _centres(4, 16, rng)
    splits = [_clusters(n, centres, 1.0, rng) for n in (50, 20, 50)]
    result = linear_probe(*splits[0], *splits[1], *splits[2])
    assert result.test_accuracy >= 0.97
    assert result.best_c in result.val_accuracy_by_c


def test_probe_random_labels_is_at_chance():
    rng = np.random.default_rng(1)
    n, classes = 600, 4
    x = [rng.normal(size=(n, 20)) for _ in range(3)]
    y = [rng.integers(0, classes, size=n) for _ in range(3)]
    result = linear_probe(x[0], y[0], x[1], y[1], x[2], y[2])
    # Chance is 1/4; the binomial standard deviation at n=600 is 0.018, so 0.08 is > 4 sd.
    assert abs(result.test_accuracy - 1 / classes) < 0.08


def test_probe_picks_c_on_val_not_test():
    rng = np.random.default_rng(2)
    centres = _centres(3, 8, rng)
    train = _clusters(30, centres, 3.0, rng)
    val = _clusters(10, centres, 3.0, rng)
    test_x, test_y = _clusters(10, centres, 3.0, rng)
    a = linear_probe(*train, *val, test_x, test_y, c_grid=(0.01, 1.0))
    b = linear_probe(*train, *val, test_x, (test_y + 1) % 3, c_grid=(0.01, 1.0))
    assert a.best_c == b.best_c and a.val_accuracy == b.val_accuracy  # test labels do not steer C


def test_probe_rejects_bad_input():
    x = np.zeros((4, 3))
    y = np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match="train_x"):
        linear_probe(np.zeros(4), y, x, y, x, y)
    with pytest.raises(ValueError, match="val_x has 2 features"):
        linear_probe(x, y, np.zeros((4, 2)), y, x, y)
    with pytest.raises(ValueError, match="single class"):
        linear_probe(x, np.zeros(4, dtype=int), x, y, x, y)
    with pytest.raises(ValueError, match="NaN"):
        linear_probe(np.full((4, 3), np.nan), y, x, y, x, y)
    with pytest.raises(TypeError, match="integer"):
        linear_probe(x, y.astype(float), x, y, x, y)
    with pytest.raises(ValueError, match="c_grid"):
        linear_probe(np.eye(4, 3), y, x, y, x, y, c_grid=(0.0,))


def test_knn_weighted_vote_worked_example():
    # Memory on the unit circle; query at angle 0. Cosines: 1 (class 0), cos 0.5 (class 1),
    # cos 0.6 (class 1), cos 2.5 (class 0, not among k=3).
    angles = np.array([0.0, 0.5, 0.6, 2.5])
    memory = np.stack([np.cos(angles), np.sin(angles)], 1) * np.array([[3.0], [1.0], [2.0], [1.0]])
    labels = np.array([0, 1, 1, 0])
    query = np.array([[2.0, 0.0]])
    for temperature in (0.07, 0.5, 5.0):
        vote0 = math.exp(1.0 / temperature)
        vote1 = math.exp(math.cos(0.5) / temperature) + math.exp(math.cos(0.6) / temperature)
        expected = 0 if vote0 > vote1 else 1
        assert knn_predict(memory, labels, query, k=3, temperature=temperature)[0] == expected
    # The two regimes really differ: sharp votes follow the nearest neighbor, soft the majority.
    assert knn_predict(memory, labels, query, k=3, temperature=0.07)[0] == 0
    assert knn_predict(memory, labels, query, k=3, temperature=5.0)[0] == 1


def test_knn_accuracy_on_clusters_and_k_capped():
    rng = np.random.default_rng(3)
    centres = _centres(3, 8, rng)
    train = _clusters(20, centres, 0.5, rng)
    test = _clusters(10, centres, 0.5, rng)
    assert knn_accuracy(*train, *test, k=200) >= 0.95  # k larger than memory is capped
    with pytest.raises(ValueError, match="k must be"):
        knn_predict(*train, test[0], k=0)
    with pytest.raises(ValueError, match="num_classes"):
        knn_predict(*train, test[0], num_classes=2)


def test_a_probe_fit_stopped_at_its_cap_is_in_the_summary_and_printed(tmp_path, monkeypatch, capsys):
    """Every fit capped at 2 evaluations: the run's summary names the C values for the trained
    encoder and both baselines, and the table printed at the end warns."""
    import json

    from contrastkit.cli import main
    from contrastkit.metrics import probe

    from _tiny_run import TINY_ARGS

    monkeypatch.setattr(probe, "PROBE_MIN_EVALUATIONS", 2)
    monkeypatch.setattr(probe, "PROBE_MAX_EVALUATIONS", 2)
    out = tmp_path / "run"
    argv = ["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(out),
            "--baseline-cache", "off"]
    with pytest.warns(probe.ProbeCapWarning):
        assert main(argv) == 0
    printed = capsys.readouterr().out
    with open(out / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    for prefix, name in (("", "pretrained encoder"), ("random_init_", "random-init encoder"),
                         ("raw_pixel_", "raw pixels")):
        capped = summary[prefix + "probe_capped_c"]
        assert capped and summary[prefix + "probe_c"] in probe.DEFAULT_C_GRID
        assert f"the linear probe of the {name} stopped at its evaluation cap" in " ".join(printed.split())
    # Unconstrained, nothing is capped and nothing is said.
    monkeypatch.undo()
    assert main([*argv[:-2], "--baseline-cache", "off", "--force"]) == 0
    with open(out / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["probe_capped_c"] == summary["raw_pixel_probe_capped_c"] == []
    assert "evaluation cap" not in capsys.readouterr().out
