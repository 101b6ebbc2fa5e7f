"""``explain_methods``: each temperature method on a row of similarities, against loops written
from the papers' equations, and against the losses themselves on a real batch."""

from __future__ import annotations

import math

import pytest
import torch

import reference as ref
from contrastkit import losses as L
from contrastkit.analysis import explain_methods, robust_temperature

ROW = [0.8, 0.4, 0.2, 0.55, -0.3]


def softmax(logits):
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = sum(weights)
    return [w / total for w in weights]


def infonce_gradient(row, positive, tau):
    p = softmax([v / tau for v in row])
    return [((p[j] - 1) if j == positive else p[j]) / tau for j in range(len(row))], p


def kl_to_uniform(row, positive, tau):
    negatives = [v for j, v in enumerate(row) if j != positive]
    q = softmax([v / tau for v in negatives])
    return sum(x * math.log(x * len(q)) for x in q if x > 0)


def robust_objective(row, positive, tau, rho):
    negatives = [v - row[positive] for j, v in enumerate(row) if j != positive]
    return tau * math.log(ref.mean([math.exp(h / tau) for h in negatives])) + tau * rho


@pytest.mark.parametrize("positive", [0, 3])
def test_macl_view(positive):
    c = explain_methods(ROW, temperature=0.3, positive=positive, methods=["macl:0.2,0.5,0.1"])
    view = c.views[0]
    tau = 0.2 * (1 + 0.5 * (ROW[positive] - 0.1))  # one row: the alignment is its positive's similarity
    assert view.temperatures.tolist() == pytest.approx([tau], rel=1e-14)
    gradient, p = infonce_gradient(ROW, positive, tau)
    weight = 1 / (1 - p[positive])
    assert view.weights.tolist() == pytest.approx([weight], rel=1e-12)
    assert view.gradients[0].tolist() == pytest.approx([weight * g for g in gradient], rel=1e-12)
    assert float(view.positive_pull[0]) == pytest.approx(1 / tau, rel=1e-12)
    assert view.explanation.probabilities[0].tolist() == pytest.approx(p, rel=1e-12)


def test_dual_view():
    c = explain_methods(ROW, temperature=0.3, methods=["dual:0.1,0.8"])
    view = c.views[0]
    gradient, p_alpha = infonce_gradient(ROW, 0, 0.1)
    _, p_beta = infonce_gradient(ROW, 0, 0.8)
    weight = (1 - p_beta[0]) / (1 - p_alpha[0])
    assert view.temperatures.tolist() == [0.1]
    assert view.weights.tolist() == pytest.approx([weight], rel=1e-12)
    assert view.gradients[0].tolist() == pytest.approx([weight * g for g in gradient], rel=1e-12)
    assert float(view.positive_pull[0]) == pytest.approx((1 - p_beta[0]) / 0.1, rel=1e-12)


@pytest.mark.parametrize("method", ["individual", "network"])
def test_robust_views_take_the_objectives_optimum(method):
    c = explain_methods(ROW, temperature=0.3, methods=[f"{method}:0.1,0.3,0.02,2.0"])
    view = c.views[0]
    tau = float(view.temperatures[0])
    assert 0.02 < tau < 2.0
    assert kl_to_uniform(ROW, 0, tau) == pytest.approx(0.3, abs=1e-9)
    step = 1e-5 * tau  # the optimum: the objective rises on both sides
    assert robust_objective(ROW, 0, tau - step, 0.3) > robust_objective(ROW, 0, tau, 0.3)
    assert robust_objective(ROW, 0, tau + step, 0.3) > robust_objective(ROW, 0, tau, 0.3)
    assert float(view.explanation.effective_negatives[0]) == pytest.approx(4 * math.exp(-0.3), rel=1e-8)
    for j in range(len(ROW)):  # dF/ds_j at that tau, by central differences
        up, down = list(ROW), list(ROW)
        up[j] += 1e-6
        down[j] -= 1e-6
        numeric = (robust_objective(up, 0, tau, 0.3) - robust_objective(down, 0, tau, 0.3)) / 2e-6
        assert float(view.gradients[0, j]) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_robust_temperature_is_clipped_to_its_bounds():
    # Two equal negatives are uniform at every tau: the objective grows with tau, the lower bound wins.
    assert robust_temperature([0.9, 0.1, 0.1], rho=0.4, tau_min=0.05, tau_max=1.0).tolist() == [0.05]
    # A tiny rho wants a near-uniform penalty, far above the upper bound.
    assert robust_temperature(ROW, rho=1e-6, tau_min=0.05, tau_max=0.5).tolist() == [0.5]
    taus = robust_temperature([[0.0, 0.9, 0.2, 0.1], [0.9, 0.0, 0.5, 0.4], [0.2, 0.5, 0.0, 0.8], [0.1, 0.4, 0.8, 0.0]],
                              rho=0.2, tau_min=0.01, tau_max=5.0, positive=[1, 0, 3, 2], exclude_diagonal=True)
    for i, tau in enumerate(taus):  # each row on its own: its negatives are the two others
        row = [[0.0, 0.9, 0.2, 0.1], [0.9, 0.0, 0.5, 0.4], [0.2, 0.5, 0.0, 0.8], [0.1, 0.4, 0.8, 0.0]][i]
        kept = [v for j, v in enumerate(row) if j != i]
        positive = [1, 0, 3, 2][i]
        assert kl_to_uniform(kept, kept.index(row[positive]), tau) == pytest.approx(0.2, abs=1e-9)


def test_the_views_agree_with_the_losses_on_a_batch():
    """On a batch's self-similarity matrix (SimCLR's two views), MACL's and dual's views give
    the per-anchor losses that macl_nt_xent and dual_temperature_nt_xent return."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, generator=g, dtype=torch.float64)
    b = a + 0.5 * torch.randn(4, 3, generator=g, dtype=torch.float64)
    z = torch.nn.functional.normalize(torch.cat([a, b]), dim=1)
    positives = L.views_positive_index(4).tolist()
    c = explain_methods((z @ z.T).numpy(), temperature=0.2, positive=positives, exclude_diagonal=True,
                        methods=["macl", "dual:0.2,0.7"])
    macl, dual = c.views
    assert (macl.weights * macl.explanation.losses).tolist() == pytest.approx(
        L.macl_nt_xent(a, b, reduction="none").tolist(), rel=1e-10)
    assert (dual.weights * dual.explanation.losses).tolist() == pytest.approx(
        L.dual_temperature_nt_xent(a, b, intra_temperature=0.2, inter_temperature=0.7, reduction="none").tolist(),
        rel=1e-10)
    assert c.fixed.explanation.losses.tolist() == pytest.approx(
        L.nt_xent_views(a, b, temperature=0.2, reduction="none").tolist(), rel=1e-12)


def test_records_and_json():
    c = explain_methods(ROW, temperature=0.3)
    assert [v.method for v in c] == ["fixed", "macl", "dual", "individual", "network"]
    records = c.anchor_records()
    assert len(records) == 5 and set(records[0]) >= {"method", "temperature", "weight", "positive_pull"}
    assert '"methods"' in c.to_json()


@pytest.mark.parametrize("methods, message", [
    (["cosine:0.1,1"], "not a temperature method"),
    (["macl:0.1,1.0,1.0"], "not positive"),
    (["nothing"], "unknown temperature method 'nothing'"),
])
def test_bad_methods(methods, message):
    with pytest.raises(ValueError, match=message):
        explain_methods([-0.9, 0.5, 0.2], temperature=0.3, methods=methods)
