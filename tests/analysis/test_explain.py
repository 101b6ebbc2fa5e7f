"""contrastkit.analysis.explain / sweep: SPEC numbers recomputed with plain math, limits,
gradients against autograd through the loss core, properties, validation and export."""

from __future__ import annotations

import csv
import doctest
import io
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import contrastkit.analysis.explanation as explain_module
from contrastkit.analysis import Explanation, Sweep, explain, sweep
from contrastkit.losses import contrastive_loss

# --------------------------------------------------------------------------- plain-math references


def ref_probabilities(scores, tau, skip=()):
    """Softmax of scores / tau over the kept indices, with math.exp (no torch)."""
    keep = [j for j in range(len(scores)) if j not in skip]
    top = max(scores[j] / tau for j in keep)
    weights = {j: math.exp(scores[j] / tau - top) for j in keep}
    total = sum(weights.values())
    return [weights.get(j, 0.0) / total for j in range(len(scores))]


def ref_loss(scores, tau, positive, skip=()):
    """-s_+/tau + log sum exp(s_j/tau), shifted by the max for stability (plain math)."""
    keep = [j for j in range(len(scores)) if j not in skip]
    top = max(scores[j] / tau for j in keep)
    return top + math.log(sum(math.exp(scores[j] / tau - top) for j in keep)) - scores[positive] / tau


SPEC1 = [1.0, 0.5, 0.0]
SPEC3 = [[0.879, -0.06, -0.06, -0.06], [-0.06, 0.879, -0.06, -0.06],
         [-0.06, -0.06, 0.879, 0.724], [-0.06, -0.06, 0.724, 0.879]]


# --------------------------------------------------------------------------- SPEC §1


def test_spec1_worked_example():
    e = explain(SPEC1, temperature=0.5)
    assert isinstance(e, Explanation) and e.single_row
    z = math.exp(2) + math.exp(1) + math.exp(0)
    expected = [math.exp(2) / z, math.exp(1) / z, 1 / z]
    np.testing.assert_allclose(e.logits[0], [2.0, 1.0, 0.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(e.probabilities[0], expected, rtol=1e-13)
    assert e.loss == pytest.approx(-math.log(expected[0]), rel=1e-13)
    # the course page's printed digits (SPEC §1), cited
    np.testing.assert_allclose(e.probabilities[0], [0.6652409558, 0.2447284711, 0.0900305732], atol=5e-11)
    assert e.loss == pytest.approx(0.4076059644, abs=5e-11)
    assert e.probabilities.sum() == pytest.approx(1.0, abs=1e-15)


def test_spec1_gradients_analytic():
    e = explain(SPEC1, temperature=0.5)
    p = ref_probabilities(SPEC1, 0.5)
    np.testing.assert_allclose(e.gradients[0], [(p[0] - 1) / 0.5, p[1] / 0.5, p[2] / 0.5], rtol=1e-13)
    assert e.positive_gradient[0] == pytest.approx((p[0] - 1) / 0.5, rel=1e-13)


@pytest.mark.parametrize("tau, cited", [(1.0, 0.4506), (0.5, 0.5713), (0.1, 0.9796)])
def test_spec1_temperature_block(tau, cited):
    s = [0.8, 0.4, 0.2]
    e = explain(s, temperature=tau)
    expected = ref_probabilities(s, tau)
    np.testing.assert_allclose(e.probabilities[0], expected, rtol=1e-12)
    assert round(float(e.probabilities[0, 0]), 4) == cited
    # the ranking never changes, the distribution only sharpens
    assert list(np.argsort(-e.probabilities[0])) == [0, 1, 2]


def test_temperature_block_sharpens_and_gradient_is_not_monotone():
    s = [0.8, 0.4, 0.2]
    taus = [1.0, 0.5, 0.1]
    result = sweep(s, temperatures=taus)
    p_plus = [float(r.probabilities[0, 0]) for r in result]
    assert p_plus == sorted(p_plus)  # sharper as tau falls
    # "lower temperature means larger gradient" fails here: |dL/ds+| at 0.1 < at 0.5 (SPEC §1)
    magnitude = {tau: (1 - ref_probabilities(s, tau)[0]) / tau for tau in taus}
    assert magnitude[0.1] < magnitude[0.5]
    for r, tau in zip(result, taus):
        assert abs(r.gradients[0, 0]) == pytest.approx(magnitude[tau], rel=1e-12)


def test_constant_shift_changes_no_probability():
    a = explain(SPEC1, temperature=0.5)
    b = explain([x + 3.25 for x in SPEC1], temperature=0.5)
    np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-12)
    np.testing.assert_allclose(a.penalty, b.penalty, rtol=1e-12)


# --------------------------------------------------------------------------- penalty (SPEC §4)


def test_penalty_hardest_negative_and_references():
    e = explain(SPEC1, temperature=0.5)
    p = ref_probabilities(SPEC1, 0.5)
    r = [0.0, p[1] / (1 - p[0]), p[2] / (1 - p[0])]
    np.testing.assert_allclose(e.penalty[0], r, rtol=1e-12)
    entropy = -(r[1] * math.log(r[1]) + r[2] * math.log(r[2]))
    assert e.penalty_entropy[0] == pytest.approx(entropy, rel=1e-12)
    assert e.effective_negatives[0] == pytest.approx(math.exp(entropy), rel=1e-12)
    assert int(e.hardest_negative[0]) == 1
    assert e.hardest_margin[0] == pytest.approx(0.5)
    assert e.log_n[0] == pytest.approx(math.log(3), rel=1e-15)
    # every negative at the mean negative similarity 0.25: logits (2, 0.5, 0.5)
    uniform = -2 + math.log(math.exp(2) + 2 * math.exp(0.5))
    assert e.loss_uniform_negatives[0] == pytest.approx(uniform, rel=1e-12)
    assert e.loss_uniform_negatives[0] <= e.losses[0]


def test_penalty_uses_negatives_only_with_excluded_diagonal():
    z = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
    s = z @ z.T
    e = explain(s, temperature=0.5, positive=[1, 0, 3, 2], exclude_diagonal=True)
    for i, p in enumerate([1, 0, 3, 2]):
        negatives = [j for j in range(4) if j not in (i, p)]
        z_neg = sum(math.exp(s[i, j] / 0.5) for j in negatives)
        for j in range(4):
            expected = math.exp(s[i, j] / 0.5) / z_neg if j in negatives else 0.0
            assert e.penalty[i, j] == pytest.approx(expected, rel=1e-12, abs=0)
        assert e.probabilities[i, i] == 0 and e.gradients[i, i] == 0
        assert not e.in_denominator[i, i]


# --------------------------------------------------------------------------- SPEC §2


def test_spec2_matrix_losses_with_diagonal_excluded():
    z = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])
    s = (z @ z.T).tolist()
    positives = [1, 0, 3, 2]
    e = explain(s, temperature=1.0, positive=positives, exclude_diagonal=True)
    expected = [ref_loss(s[i], 1.0, positives[i], skip=(i,)) for i in range(4)]
    np.testing.assert_allclose(e.losses, expected, rtol=1e-12)
    # SPEC §2 prints [0.8189, 0.9344, 0.8189, 0.9344]; rows 0 and 2 agree, rows 1 and 3 are a slip
    # in the text: row 1 is (S10, S12, S13) = (0.8, 0.6, 0.96), -0.8 + log(e^0.8 + e^0.6 + e^0.96) = 1.0960.
    assert round(expected[0], 4) == 0.8189 and round(expected[1], 4) == 1.0960
    assert e.loss == pytest.approx(sum(expected) / 4, rel=1e-12)
    np.testing.assert_allclose(e.limit_infinity, [math.log(3)] * 4, rtol=1e-15)
    # row 1: the negative 3 (0.96) beats the positive (0.8): A > B
    assert math.isinf(e.limit_zero[1]) and e.limit_zero_rate[1] == pytest.approx(0.16)
    assert e.limit_zero[0] == 0 and e.limit_zero_rate[0] == 0


@pytest.mark.parametrize("negative, limit_zero, rate", [
    (-0.1, 0.0, 0.0),              # positive is the unique max: log 1 = 0
    (0.95, math.inf, 0.05),        # A > B: diverges, tau * loss -> A - B
    (0.9, math.log(2), 0.0),       # exact tie of two: log 2
])
def test_spec2_f2_limits(negative, limit_zero, rate):
    # F2: row 0 of N = 3 with p(0) = 1, S01 = 0.9, S02 as given; the row's candidates are (S01, S02).
    row = [0.9, negative]
    e = explain(row, temperature=1.0)
    assert e.limit_zero[0] == limit_zero
    assert e.limit_zero_rate[0] == pytest.approx(rate, abs=1e-15)
    assert e.limit_infinity[0] == pytest.approx(math.log(2), rel=1e-15)  # log(N - 1) = log 2
    # the same in matrix form, diagonal excluded (row 0 only matters; rows 1, 2 get some positive)
    s = [[1.0, 0.9, negative], [0.9, 1.0, 0.3], [negative, 0.3, 1.0]]
    m = explain(s, temperature=1.0, positive=[1, 0, 1], exclude_diagonal=True)
    assert m.limit_zero[0] == limit_zero and m.limit_infinity[0] == pytest.approx(math.log(2))


@pytest.mark.parametrize("row, positive", [
    ([0.9, -0.1], 0), ([0.9, 0.95], 0), ([0.9, 0.9], 0), ([0.3, 0.7, 0.7, 0.1], 1),
    ([0.2, 0.2, 0.2, 0.2], 3), ([0.5, -0.4, 0.1, 0.8, 0.8], 0), ([-0.3, 0.0, 0.6], 2),
])
def test_limits_match_float64_loss_at_extreme_temperatures(row, positive):
    e = explain(row, temperature=1.0, positive=positive)
    small, large = 1e-4, 1e7
    # the loss core in float64, and plain math, at extreme temperatures
    core_small = float(contrastive_loss(torch.tensor([row], dtype=torch.float64), torch.tensor([positive]),
                                        temperature=small))
    core_large = float(contrastive_loss(torch.tensor([row], dtype=torch.float64), torch.tensor([positive]),
                                        temperature=large))
    assert core_small == pytest.approx(ref_loss(row, small, positive), rel=1e-9)
    if math.isinf(e.limit_zero[0]):  # diverges like (A - B) / tau
        assert core_small > 100 and core_small > ref_loss(row, 10 * small, positive) * 5
    else:
        assert core_small == pytest.approx(e.limit_zero[0], abs=1e-9)
    assert small * core_small == pytest.approx(e.limit_zero_rate[0], abs=small * math.log(len(row)) + 1e-12)
    assert core_large == pytest.approx(e.limit_infinity[0], abs=1e-6)
    # and explain's own loss at those temperatures
    assert explain(row, temperature=small, positive=positive).losses[0] == pytest.approx(core_small, rel=1e-12)
    assert explain(row, temperature=large, positive=positive).losses[0] == pytest.approx(core_large, rel=1e-12)


# --------------------------------------------------------------------------- SPEC §3


def test_spec3_sweep():
    taus = [0.01, 0.1, 1.0]
    result = sweep(SPEC3, temperatures=taus, positive=range(4))
    assert isinstance(result, Sweep) and result.temperatures == tuple(taus)
    expected = [sum(ref_loss(SPEC3[i], tau, i) for i in range(4)) / 4 for tau in taus]
    np.testing.assert_allclose(result.losses, expected, rtol=1e-6, atol=1e-14)
    assert [round(x, 4) for x in expected] == [0.0, 0.0964, 0.8732]  # cited from SPEC §3
    # row 3 at tau = 0.1: distribution [0, 0, 0.825, 0.175] (cited); reference log 4
    p = result[1].probabilities[2]
    np.testing.assert_allclose(p, ref_probabilities(SPEC3[2], 0.1), rtol=1e-12)
    assert [round(float(x), 3) for x in p] == [0.0, 0.0, 0.825, 0.175]
    np.testing.assert_allclose(result[1].log_n, [math.log(4)] * 4, rtol=1e-15)


# --------------------------------------------------------------------------- gradients vs autograd


def _autograd(s, positive, tau, exclude_diagonal):
    x = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    n, k = x.shape
    mask = ~torch.eye(n, dtype=torch.bool) if exclude_diagonal else None
    # sum of per-row losses: row i's gradient is dl_i/ds_i (rows are independent variables)
    contrastive_loss(x, torch.tensor(positive), temperature=tau, denominator_mask=mask, reduction="sum").backward()
    return x.grad.numpy()


@pytest.mark.parametrize("exclude_diagonal", [False, True])
@pytest.mark.parametrize("tau", [0.05, 0.3, 2.0])
def test_gradients_equal_autograd_through_loss_core(exclude_diagonal, tau):
    rng = np.random.default_rng(7)
    n = 6
    s = rng.uniform(-1, 1, size=(n, n))
    positive = [1, 0, 3, 2, 5, 4]
    e = explain(s, temperature=tau, positive=positive, exclude_diagonal=exclude_diagonal)
    np.testing.assert_allclose(e.gradients, _autograd(s, positive, tau, exclude_diagonal), rtol=1e-10, atol=1e-14)


@settings(max_examples=60, deadline=None)
@given(
    row=st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=9),
    positive_seed=st.integers(0, 100),
    tau=st.floats(0.02, 20.0),
)
def test_positive_gradient_balances_negatives_and_matches_autograd(row, positive_seed, tau):
    positive = positive_seed % len(row)
    e = explain(row, temperature=tau, positive=positive)
    g = e.gradients[0]
    negatives = [j for j in range(len(row)) if j != positive]
    assert g[positive] <= 0 and all(g[j] >= 0 for j in negatives)
    # plain-math reference for |dL/ds+| = (1 - p+)/tau, with 1 - p+ summed over the negatives
    # (1 - p+ itself would cancel catastrophically when p+ is near 1)
    top = max(row) / tau
    weights = [math.exp(x / tau - top) for x in row]
    expected = math.fsum(weights[j] for j in negatives) / math.fsum(weights) / tau
    assert abs(g[positive]) == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert math.fsum(g[j] for j in negatives) == pytest.approx(expected, rel=1e-9, abs=1e-300)
    np.testing.assert_allclose(g, _autograd([row], [positive], tau, False)[0], rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    negatives=st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=8),
    positive_score=st.floats(-1, 1, allow_nan=False),
    tau=st.floats(0.05, 10.0),
    factor=st.floats(1.05, 10.0),
)
def test_penalty_entropy_strictly_increases_with_tau(negatives, positive_score, tau, factor):
    if max(negatives) - min(negatives) < 1e-3:  # constant negatives: the entropy is log n at every tau
        negatives = negatives[:-1] + [negatives[-1] + (0.5 if negatives[-1] < 0 else -0.5)]
    row = [positive_score] + negatives
    low, high = explain(row, temperature=tau), explain(row, temperature=tau * factor)
    assert low.penalty_entropy[0] < high.penalty_entropy[0]
    assert 1.0 <= low.effective_negatives[0] <= len(negatives) + 1e-9
    np.testing.assert_allclose(low.penalty[0].sum(), 1.0, rtol=1e-12)


def test_constant_negatives_have_maximal_penalty_entropy():
    e = explain([0.9, 0.2, 0.2, 0.2], temperature=0.07)
    assert e.penalty_entropy[0] == pytest.approx(math.log(3), rel=1e-12)
    assert e.effective_negatives[0] == pytest.approx(3.0, rel=1e-12)


def test_precision_when_positive_dominates():
    # 1 - p+ = 1 - exp(-loss) would round to 0 here; the gradient keeps its true size
    e = explain([1.0, 0.0], temperature=0.02)  # 1 - p+ = 1 / (1 + e^50)
    assert e.gradients[0, 0] == pytest.approx(-1 / (1 + math.exp(50)) / 0.02, rel=1e-9)
    assert e.gradients[0, 1] == pytest.approx(-e.gradients[0, 0], rel=1e-9)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(similarities=[1, 0.5, 0], temperature=0), ValueError, "temperature must be positive"),
    (dict(similarities=[1, 0.5, 0], temperature=-1), ValueError, "temperature must be positive"),
    (dict(similarities=[1, 0.5, 0], temperature=float("nan")), ValueError, "temperature"),
    (dict(similarities=[1, 0.5, 0], temperature="hot"), TypeError, "temperature"),
    (dict(similarities=[1, float("nan"), 0], temperature=1), ValueError, "NaN or infinite"),
    (dict(similarities=["a", "b"], temperature=1), TypeError, "similarities must be numbers"),
    (dict(similarities="1 2 3", temperature=1), TypeError, "string"),
    (dict(similarities=[1, 0.5, 0], temperature=1, positive=3), ValueError, "out of range"),
    (dict(similarities=[1, 0.5, 0], temperature=1, positive=-1), ValueError, "out of range"),
    (dict(similarities=[1, 0.5, 0], temperature=1, positive=True), TypeError, "positive must be an int"),
    (dict(similarities=[1, 0.5, 0], temperature=1, positive=[0]), TypeError, "positive must be an int"),
    (dict(similarities=[1.0], temperature=1), ValueError, "at least one negative"),
    (dict(similarities=[], temperature=1), ValueError, "empty"),
    (dict(similarities=[[[1.0]]], temperature=1), ValueError, "shape"),
    (dict(similarities=[[1, 0], [0, 1]], temperature=1), TypeError, "one column per row"),
    (dict(similarities=[[1, 0], [0, 1]], temperature=1, positive=[0]), ValueError, "shape"),
    (dict(similarities=[[1, 0, 0], [0, 1, 0]], temperature=1, positive=[1, 0], exclude_diagonal=True),
     ValueError, "square"),
    (dict(similarities=np.eye(4), temperature=1, positive=[0, 1, 3, 2], exclude_diagonal=True),
     ValueError, "themselves"),
    (dict(similarities=[[1.0, 0.2], [0.2, 1.0]], temperature=1, positive=[1, 0], exclude_diagonal=True),
     ValueError, "at least one negative"),
    (dict(similarities=[1, 0.5, 0], temperature=1, exclude_diagonal=True), ValueError, "no diagonal"),
    (dict(similarities=[1, 0.5, 0], temperature=1e-310), ValueError, "too small"),
])
def test_bad_input_raises_clear_error(kwargs, error, match):
    with pytest.raises(error, match=match):
        explain(**kwargs)


def test_bad_sweep_temperatures():
    with pytest.raises(ValueError, match="empty"):
        sweep(SPEC1, temperatures=[])
    with pytest.raises(ValueError, match=r"temperatures\[1\]"):
        sweep(SPEC1, temperatures=[0.5, 0.0])
    with pytest.raises(TypeError, match="sequence"):
        sweep(SPEC1, temperatures=0.5)


def test_accepts_tensors_and_arrays():
    t = torch.tensor(SPEC1, dtype=torch.float32, requires_grad=True)
    a = explain(t, temperature=0.5)
    b = explain(np.array(SPEC1), temperature=np.float64(0.5))
    np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-7)
    assert a.probabilities.dtype == np.float64


# --------------------------------------------------------------------------- export


def test_json_export_round_trips_and_is_strict():
    e = explain([0.9, 0.95], temperature=0.1)
    data = json.loads(e.to_json())
    assert data["limit_zero"] == ["Infinity"]  # strict JSON: no bare Infinity
    assert "Infinity" not in e.to_json().replace('"Infinity"', "")
    for name in ("logits", "probabilities", "gradients", "penalty", "penalty_entropy", "effective_negatives",
                 "hardest_negative", "hardest_margin", "log_n", "limit_zero_rate", "limit_infinity", "losses"):
        assert np.allclose(np.array(data[name], dtype=float), getattr(e, name)), name
    assert data["loss"] == e.loss
    s = sweep(SPEC1, temperatures=[1.0, 0.5])
    data = json.loads(s.to_json())
    assert data["temperatures"] == [1.0, 0.5] and len(data["results"]) == 2
    assert data["losses"] == pytest.approx([ref_loss(SPEC1, t, 0) for t in (1.0, 0.5)], rel=1e-12)


def test_csv_export(tmp_path):
    s = sweep(SPEC3, temperatures=[0.1, 1.0], positive=range(4))
    rows = list(csv.DictReader(io.StringIO(s.to_csv())))
    assert len(rows) == 2 * 4
    assert float(rows[2]["loss"]) == pytest.approx(ref_loss(SPEC3[2], 0.1, 2), rel=1e-12)
    assert rows[0]["temperature"] == "0.1" and rows[0]["anchor"] == "0"
    candidates = list(csv.DictReader(io.StringIO(s.to_csv(table="candidates"))))
    assert len(candidates) == 2 * 4 * 4
    assert {"probability", "gradient", "penalty", "is_positive"} <= set(candidates[0])
    path = tmp_path / "sweep.csv"
    s.to_csv(path)
    assert path.read_text() == s.to_csv()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        s.to_csv(path)
    s.to_csv(path, table="candidates", overwrite=True)
    assert path.read_text() == s.to_csv(table="candidates")
    with pytest.raises(ValueError, match="table"):
        s.to_csv(table="rows")


def test_docstring_examples():
    failures, tried = doctest.testmod(explain_module, verbose=False)
    assert tried >= 2 and failures == 0
