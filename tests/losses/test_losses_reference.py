"""Every loss against an independent loop-based float64 reference, and gradcheck."""

import math

import pytest
import torch

import reference as ref
from contrastkit import losses as L
from loss_catalog import CATALOG, cases


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


N, D = 5, 3


@pytest.mark.parametrize("tau", [0.07, 0.5, 2.0])
@pytest.mark.parametrize("normalize", [True, False])
def test_info_nce_in_batch(tau, normalize):
    q, p = randn(N, D, seed=1), randn(N, D, seed=2)
    prep = ref.normalized if normalize else (lambda m: m)
    expected = ref.info_nce(prep(ref.rows(q)), prep(ref.rows(p)), tau=tau)
    got = L.info_nce(q, p, temperature=tau, normalize=normalize, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", ["unpaired", "paired"])
def test_info_nce_explicit_negatives(mode):
    q, p = randn(N, D, seed=1), randn(N, D, seed=2)
    neg = randn(7, D, seed=3) if mode == "unpaired" else randn(N, 4, D, seed=3)
    neg_rows = ref.normalized(ref.rows(neg)) if mode == "unpaired" else [
        ref.normalized(ref.rows(b)) for b in neg]
    expected = ref.info_nce(ref.normalized(ref.rows(q)), ref.normalized(ref.rows(p)), neg_rows, 0.2,
                            paired=mode == "paired")
    got = L.info_nce(q, p, neg, temperature=0.2, negative_mode=mode, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


def test_nt_xent_any_positive_map():
    z = randn(6, D)
    pairs = [3, 4, 5, 0, 1, 2]
    expected = ref.nt_xent(ref.normalized(ref.rows(z)), pairs, 0.3)
    got = L.nt_xent(z, torch.tensor(pairs), temperature=0.3, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    pairs2 = [5, 2, 1, 4, 3, 0]
    got2 = L.nt_xent(z, pairs2, temperature=0.3, reduction="sum")
    assert float(got2) == pytest.approx(sum(ref.nt_xent(ref.normalized(ref.rows(z)), pairs2, 0.3)), rel=1e-12)


def test_nt_xent_views_is_the_plus_minus_n_map():
    a, b = randn(N, D, seed=4), randn(N, D, seed=5)
    z = ref.normalized(ref.rows(torch.cat([a, b])))
    expected = ref.nt_xent(z, ref.views_index(N), 0.1)
    got = L.nt_xent_views(a, b, temperature=0.1, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert float(L.nt_xent_views(a, b, temperature=0.1)) == pytest.approx(sum(expected) / (2 * N), rel=1e-12)


@pytest.mark.parametrize("weight", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_bidirectional(weight):
    v, u = randn(N, D, seed=6), randn(N, D, seed=7)
    expected = ref.bidirectional(ref.normalized(ref.rows(v)), ref.normalized(ref.rows(u)), 0.1, weight)
    got = L.bidirectional_info_nce(v, u, temperature=0.1, weight=weight, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("variant", ["out", "in"])
def test_supcon(variant):
    z = randn(7, D, seed=8)
    labels = [0, 1, 0, 2, 1, 0, 3]  # label 2 and 3 have a single member: no positive
    expected = ref.supcon(ref.normalized(ref.rows(z)), labels, 0.2, variant)
    got = L.supcon(z, torch.tensor(labels), temperature=0.2, variant=variant, reduction="none")
    assert got.tolist() == pytest.approx([0.0 if e is None else e for e in expected], rel=1e-12)
    valid = [e for e in expected if e is not None]
    mean = L.supcon(z, torch.tensor(labels), temperature=0.2, variant=variant)
    assert float(mean) == pytest.approx(sum(valid) / len(valid), rel=1e-12)
    assert math.isfinite(float(mean))


def test_supcon_multiview_input():
    z = randn(4, 2, D, seed=9)
    labels = torch.tensor([0, 1, 0, 2])
    flat = z.reshape(8, D)
    expected = ref.supcon(ref.normalized(ref.rows(flat)), [0, 0, 1, 1, 0, 0, 2, 2], 0.5, "out")
    got = L.supcon(z, labels, temperature=0.5, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


def test_supcon_reduces_to_nt_xent_views_with_instance_labels():
    a, b = randn(N, D, seed=10), randn(N, D, seed=11)
    labels = torch.arange(N).repeat(2)
    assert float(L.supcon(torch.cat([a, b]), labels, temperature=0.2)) == pytest.approx(
        float(L.nt_xent_views(a, b, temperature=0.2)), rel=1e-12)


def test_dcl():
    a, b = randn(N, D, seed=12), randn(N, D, seed=13)
    expected = ref.dcl(ref.normalized(ref.rows(torch.cat([a, b]))), ref.views_index(N), 0.2)
    assert L.dcl(a, b, temperature=0.2, reduction="none").tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("lam", [0.0, 1.0, 2.5])
def test_simple_loss(lam):
    a, b = randn(N, D, seed=14), randn(N, D, seed=15)
    expected = ref.simple(ref.normalized(ref.rows(torch.cat([a, b]))), ref.views_index(N), lam)
    got = L.simple_loss(a, b, negative_weight=lam, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("k", [1, 3, 8, 100])
def test_hard_negative_top_k(k):
    a, b = randn(N, D, seed=16), randn(N, D, seed=17)
    expected = ref.hard_negative(ref.normalized(ref.rows(torch.cat([a, b]))), ref.views_index(N), 0.2, k)
    got = L.hard_negative_nt_xent(a, b, temperature=0.2, top_k=k, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


def test_hard_negative_quantile_and_all_negatives():
    a, b = randn(N, D, seed=16), randn(N, D, seed=17)
    z = ref.normalized(ref.rows(torch.cat([a, b])))
    # 2N - 2 = 8 negatives; quantile 0.75 keeps ceil(0.25 * 8) = 2
    expected = ref.hard_negative(z, ref.views_index(N), 0.2, 2)
    got = L.hard_negative_nt_xent(a, b, temperature=0.2, quantile=0.75, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    every = L.hard_negative_nt_xent(a, b, temperature=0.2, top_k=8)
    assert float(every) == pytest.approx(float(L.nt_xent_views(a, b, temperature=0.2)), rel=1e-12)


@pytest.mark.parametrize("tau", [0.1, 0.5])
@pytest.mark.parametrize("tau_plus", [0.0, 0.1, 0.3])
def test_debiased(tau, tau_plus):
    a, b = randn(N, D, seed=18), randn(N, D, seed=19)
    expected = ref.debiased(ref.normalized(ref.rows(torch.cat([a, b]))), ref.views_index(N), tau, tau_plus, 0.0)
    got = L.debiased_nt_xent(a, b, temperature=tau, tau_plus=tau_plus, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-10)


def test_debiased_floor_binds():
    # identical negatives and a strong prior: the estimator goes below the floor
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    expected = ref.debiased(ref.normalized(ref.rows(torch.cat([a, a]))), ref.views_index(3), 0.5, 0.9, 0.0)
    got = L.debiased_nt_xent(a, a, temperature=0.5, tau_plus=0.9, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 3.0])
def test_hcl(beta):
    a, b = randn(N, D, seed=20), randn(N, D, seed=21)
    expected = ref.debiased(ref.normalized(ref.rows(torch.cat([a, b]))), ref.views_index(N), 0.5, 0.1, beta)
    got = L.hcl(a, b, temperature=0.5, tau_plus=0.1, beta=beta, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("tau", [0.07, 0.5, 2.0])
@pytest.mark.parametrize("exclude_diagonal", [True, False])
def test_similarity_loss(tau, exclude_diagonal):
    s = randn(6, 6, seed=22)
    pairs = [3, 4, 5, 0, 1, 2]
    expected = ref.similarity(ref.rows(s), pairs, tau, exclude_diagonal)
    got = L.similarity_loss(s, torch.tensor(pairs), temperature=tau, exclude_diagonal=exclude_diagonal,
                            reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    total = L.similarity_loss(s, torch.tensor(pairs), temperature=tau, exclude_diagonal=exclude_diagonal,
                              reduction="sum")
    assert float(total) == pytest.approx(sum(expected), rel=1e-12)
    if not exclude_diagonal:  # a cross-modal (N, K) matrix
        wide = randn(4, 7, seed=23)
        expected = ref.similarity(ref.rows(wide), [6, 0, 2, 2], tau, False)
        got = L.similarity_loss(wide, torch.tensor([6, 0, 2, 2]), temperature=tau, exclude_diagonal=False)
        assert float(got) == pytest.approx(ref.mean(expected), rel=1e-12)


def test_similarity_loss_is_contrastive_loss(monkeypatch):
    # One code path: similarity_loss is contrastive_loss with one positive per anchor and, for
    # exclude_diagonal, the diagonal out of the denominator mask.
    import contrastkit.losses.infonce as infonce

    s, pairs = randn(5, 5, seed=24).requires_grad_(), torch.tensor([1, 0, 3, 4, 2])
    got = L.similarity_loss(s, pairs, temperature=0.3, exclude_diagonal=True, reduction="none")
    mask = ~torch.eye(5, dtype=torch.bool)
    assert torch.equal(got, L.contrastive_loss(s, pairs, temperature=0.3, denominator_mask=mask, reduction="none"))
    calls = []
    monkeypatch.setattr(infonce, "contrastive_loss", lambda *a, **k: calls.append(k) or L.contrastive_loss(*a, **k))
    L.similarity_loss(s, pairs, temperature=0.3, exclude_diagonal=False)
    assert len(calls) == 1 and calls[0]["denominator_mask"] is None


# ---------------------------------------------------------------- gradcheck (float64)


def leaf(*shape, seed):
    return randn(*shape, seed=seed).requires_grad_(True)


def catalogued(name, n=4, d=3):
    """The catalog's inputs and options of ``name`` (tests/loss_catalog.py) for gradcheck: the
    differentiable inputs as leaves, and a temperature leaf where it takes one."""
    case = CATALOG[name]
    tensors = case.tensors(n, d)
    learnable = case.temperature == "learnable"
    varied = tuple(tensors[i].clone().requires_grad_() for i in case.grads) + (
        (torch.tensor(0.4, dtype=torch.float64, requires_grad=True),) if learnable else ())

    def loss(*values):
        given = list(tensors)
        for i, value in zip(case.grads, values):
            given[i] = value
        return case(given, values[-1] if learnable else None)
    return loss, varied


# Catalog name (or function[setting]) -> (loss, inputs), hand-made where the inputs matter (a
# positive map, labels with a class of one); every catalogued loss whose gradient is its value's
# has an entry (test_every_catalogued_loss_is_gradchecked).
GRADCHECK_CASES = {
    "info_nce": lambda: (lambda q, p: L.info_nce(q, p, temperature=0.3), (leaf(4, 3, seed=1), leaf(4, 3, seed=2))),
    "info_nce[bank]": lambda: (lambda q, p, n: L.info_nce(q, p, n, temperature=0.3),
                               (leaf(4, 3, seed=1), leaf(4, 3, seed=2), leaf(5, 3, seed=3))),
    "info_nce[paired]": lambda: (lambda q, p, n: L.info_nce(q, p, n, temperature=0.3, negative_mode="paired"),
                                 (leaf(4, 3, seed=1), leaf(4, 3, seed=2), leaf(4, 2, 3, seed=3))),
    "nt_xent": lambda: (lambda z: L.nt_xent(z, torch.tensor([2, 3, 0, 1]), temperature=0.3), (leaf(4, 3, seed=4),)),
    "nt_xent_views": lambda: (lambda a, b: L.nt_xent_views(a, b, temperature=0.3),
                              (leaf(3, 3, seed=5), leaf(3, 3, seed=6))),
    "bidirectional_info_nce": lambda: (lambda v, u: L.bidirectional_info_nce(v, u, temperature=0.3, weight=0.75),
                                       (leaf(4, 3, seed=7), leaf(4, 3, seed=8))),
    "supcon": lambda: (lambda z: L.supcon(z, torch.tensor([0, 1, 0, 1, 2]), temperature=0.3), (leaf(5, 3, seed=9),)),
    "supcon[in]": lambda: (lambda z: L.supcon(z, torch.tensor([0, 1, 0, 1, 1]), temperature=0.3, variant="in"),
                           (leaf(5, 3, seed=9),)),
    "similarity_loss": lambda: (lambda s: L.similarity_loss(s, torch.tensor([1, 0, 3, 2]), temperature=0.3,
                                                            exclude_diagonal=True), (leaf(4, 4, seed=10),)),
    "dcl": lambda: (lambda a, b: L.dcl(a, b, temperature=0.3), (leaf(3, 3, seed=11), leaf(3, 3, seed=12))),
    "simple_loss": lambda: (lambda a, b: L.simple_loss(a, b, negative_weight=0.7),
                            (leaf(3, 3, seed=13), leaf(3, 3, seed=14))),
    "hard_negative_nt_xent": lambda: (lambda a, b: L.hard_negative_nt_xent(a, b, temperature=0.3, top_k=2),
                                      (leaf(3, 3, seed=15), leaf(3, 3, seed=16))),
    "debiased_nt_xent": lambda: (lambda a, b: L.debiased_nt_xent(a, b, temperature=0.5, tau_plus=0.1),
                                 (leaf(3, 3, seed=17), leaf(3, 3, seed=18))),
    "hcl": lambda: (lambda a, b: L.hcl(a, b, temperature=0.5, tau_plus=0.1, beta=1.0),
                    (leaf(3, 3, seed=19), leaf(3, 3, seed=20))),
    "nt_xent_views[temperature]": lambda: (
        lambda a, b, t: L.nt_xent_views(a, b, temperature=t),
        (leaf(3, 3, seed=21), leaf(3, 3, seed=22), torch.tensor(0.4, dtype=torch.float64, requires_grad=True))),
    # On the catalog's inputs and options, with the temperature among the inputs.
    "contrastive_loss": lambda: catalogued("contrastive_loss"),
    "hard_negative_nt_xent[quantile]": lambda: catalogued("hard_negative_nt_xent[quantile]"),
    "sigmoid_loss": lambda: catalogued("sigmoid_loss"),
    "robust_nt_xent": lambda: catalogued("robust_nt_xent"),
}


def test_every_catalogued_loss_is_gradchecked():
    # MACL's and dual temperature's stop-gradient weights are no derivative: the catalog says so.
    assert set(cases(stop_gradient=None)) <= set(GRADCHECK_CASES)
    assert {name.split("[")[0] for name in GRADCHECK_CASES} <= {case.function_name for case in CATALOG.values()}


@pytest.mark.parametrize("name", sorted(GRADCHECK_CASES))
def test_gradcheck(name):
    fn, inputs = GRADCHECK_CASES[name]()
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)
