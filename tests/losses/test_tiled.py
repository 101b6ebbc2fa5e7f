"""The tiled (memory-linear) path agrees with the dense path and with loop references.

The dense path builds the full similarity matrix with ordinary autograd ops; the tiled path
never does. They share only input validation, so agreement of losses and of every gradient
(embeddings and temperature) is a real check of the tiled kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from contrastkit.losses import (
    NTXentViews,
    Temperature,
    bidirectional_info_nce,
    dcl,
    info_nce,
    nt_xent,
    nt_xent_views,
    supcon,
)
from contrastkit.losses import _tiles, tiled

import reference as ref

RTOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> None:
    """Elementwise agreement to ``rtol`` relative to the largest magnitude of ``expected``.

    A quantity that is exactly 0 in exact arithmetic (N = 1: the only candidate is the
    positive) is compared on the scale of the logits (1 / tau = 10) instead.
    """
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    if scale < 100 * rtol:
        scale = 10.0
    torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=rtol * max(scale, 1e-30))


def loss_and_grads(fn, inputs, **kwargs):
    """Loss (reduction none, then mean) and the gradients of every input needing one."""
    for x in inputs:
        x.grad = None
    per_anchor = fn(*inputs, reduction="none", **kwargs)
    weights = torch.linspace(0.5, 1.5, per_anchor.shape[0], dtype=per_anchor.dtype)
    # A non-uniform upstream gradient checks the per-row weighting of the backward pass.
    (per_anchor * weights).sum().backward()
    grads = [x.grad.clone() for x in inputs if x.requires_grad]
    mean = fn(*[x.detach() for x in inputs], **kwargs)
    return [per_anchor.detach(), mean] + grads


def compare(fn, inputs, chunk, rtol, **kwargs):
    dense = loss_and_grads(fn, inputs, chunk_size=None, **kwargs)
    tiled_ = loss_and_grads(fn, inputs, chunk_size=chunk, **kwargs)
    assert len(dense) == len(tiled_)
    for d, t in zip(dense, tiled_):
        assert d.dtype == t.dtype and d.shape == t.shape
        assert_close_rel(t, d, rtol)


def leaf(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=dtype) * scale).requires_grad_()


def learnable_tau(dtype, value=0.1):
    return torch.tensor(value, dtype=dtype, requires_grad=True)


SIZES = [(1, 1), (1, 3), (2, 1), (3, 2), (5, 3), (13, 4), (40, 7), (40, 80), (48, 16)]


@pytest.fixture(autouse=True)
def _quiet_few_rows():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", SIZES)
def test_nt_xent_views_tiled_matches_dense(dtype, n, chunk):
    z_a, z_b, tau = leaf(n, 8, dtype=dtype, seed=n), leaf(n, 8, dtype=dtype, seed=n + 1), learnable_tau(dtype)
    compare(lambda a, b, t, **k: nt_xent_views(a, b, temperature=t, **k), [z_a, z_b, tau], chunk, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weight", [0.0, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("n,chunk", [(1, 1), (2, 1), (5, 3), (13, 4), (40, 7), (33, 64)])
def test_bidirectional_tiled_matches_dense(dtype, weight, n, chunk):
    v, u, tau = leaf(n, 8, dtype=dtype, seed=n), leaf(n, 8, dtype=dtype, seed=n + 7), learnable_tau(dtype, 0.07)
    compare(lambda a, b, t, **k: bidirectional_info_nce(a, b, temperature=t, weight=weight, **k),
            [v, u, tau], chunk, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(1, 1), (4, 3), (13, 5), (40, 16)])
def test_info_nce_in_batch_tiled_matches_dense(dtype, n, chunk):
    q, p, tau = leaf(n, 8, dtype=dtype, seed=n), leaf(n, 8, dtype=dtype, seed=n + 3), learnable_tau(dtype)
    compare(lambda a, b, t, **k: info_nce(a, b, temperature=t, **k), [q, p, tau], chunk, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,bank,chunk", [(1, 1, 1), (4, 29, 3), (13, 7, 5), (20, 50, 16)])
@pytest.mark.parametrize("bank_grad", [False, True])
def test_info_nce_negative_bank_tiled_matches_dense(dtype, n, bank, chunk, bank_grad):
    q, p = leaf(n, 8, dtype=dtype, seed=n), leaf(n, 8, dtype=dtype, seed=n + 3)
    negatives = leaf(bank, 8, dtype=dtype, seed=bank).requires_grad_(bank_grad)
    tau = learnable_tau(dtype)
    compare(lambda a, b, c, t, **k: info_nce(a, b, c, temperature=t, **k), [q, p, negatives, tau],
            chunk, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(2, 1), (7, 3), (30, 8)])
def test_nt_xent_any_positive_map_tiled_matches_dense(dtype, n, chunk):
    z, tau = leaf(2 * n, 8, dtype=dtype, seed=n), learnable_tau(dtype)
    index = torch.randperm(2 * n, generator=torch.Generator().manual_seed(n)).reshape(n, 2)
    positive = torch.empty(2 * n, dtype=torch.long)
    positive[index[:, 0]], positive[index[:, 1]] = index[:, 1], index[:, 0]
    compare(lambda a, t, **k: nt_xent(a, positive, temperature=t, **k), [z, tau], chunk, RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(6, 1), (9, 4), (31, 8)])
def test_supcon_out_tiled_matches_dense(dtype, n, chunk):
    z, tau = leaf(n, 8, dtype=dtype, seed=n), learnable_tau(dtype)
    labels = torch.arange(n) % 4
    labels[-1] = 99  # a singleton class: an anchor without positives (left out of the mean)
    compare(lambda a, t, **k: supcon(a, labels, temperature=t, **k), [z, tau], chunk, RTOL[dtype])


def test_supcon_views_tiled_matches_dense():
    z, tau = leaf(6, 2, 8, dtype=torch.float64), learnable_tau(torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 3])
    compare(lambda a, t, **k: supcon(a, labels, temperature=t, **k), [z, tau], 5, RTOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(1, 1), (6, 1), (9, 4), (31, 8)])
def test_supcon_in_tiled_matches_dense(dtype, n, chunk):
    z, tau = leaf(n, 8, dtype=dtype, seed=n), learnable_tau(dtype)
    labels = torch.arange(n) % 4
    labels[-1] = 99  # a singleton class: an anchor without positives (left out of the mean)
    if n == 1:  # no anchor has a positive: only "none" and "sum" are defined
        for reduction in ("none", "sum"):
            dense = supcon(z, labels, temperature=tau, variant="in", reduction=reduction)
            assert float(dense.sum()) == 0.0
            assert torch.equal(supcon(z, labels, temperature=tau, variant="in", reduction=reduction, chunk_size=1),
                               dense)
        return
    compare(lambda a, t, **k: supcon(a, labels, temperature=t, variant="in", **k), [z, tau], chunk, RTOL[dtype])


def test_supcon_in_views_tiled_matches_dense():
    z, tau = leaf(6, 2, 8, dtype=torch.float64), learnable_tau(torch.float64)
    labels = torch.tensor([0, 1, 0, 2, 1, 3])
    compare(lambda a, t, **k: supcon(a, labels, temperature=t, variant="in", **k), [z, tau], 5,
            RTOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,chunk", [(2, 1), (3, 2), (13, 4), (40, 7), (40, 80)])
def test_dcl_tiled_matches_dense(dtype, n, chunk):
    z_a, z_b, tau = leaf(n, 8, dtype=dtype, seed=n), leaf(n, 8, dtype=dtype, seed=n + 1), learnable_tau(dtype)
    compare(lambda a, b, t, **k: dcl(a, b, temperature=t, **k), [z_a, z_b, tau], chunk, RTOL[dtype])


def test_dcl_tiled_keeps_precision_when_the_positive_dominates():
    """The positive is left out inside the tiles, not subtracted from the full log-sum-exp
    afterwards (that would cancel catastrophically when the positive holds nearly all the mass)."""
    z_a = leaf(16, 8, dtype=torch.float32, seed=3)
    z_b = (z_a.detach() + 1e-3 * torch.randn(16, 8, generator=torch.Generator().manual_seed(4))).requires_grad_()
    compare(lambda a, b, **k: dcl(a, b, temperature=0.02, **k), [z_a, z_b], 5, RTOL[torch.float32])


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_chunk_size_validation(bad, error):
    z = torch.randn(4, 3)
    for call in (lambda: nt_xent_views(z, z, temperature=0.1, chunk_size=bad),
                 lambda: bidirectional_info_nce(z, z, temperature=0.1, chunk_size=bad),
                 lambda: info_nce(z, z, temperature=0.1, chunk_size=bad)):
        with pytest.raises(error, match="chunk_size"):
            call()


def test_tiled_matches_loop_reference_float64():
    """Independent float64 loops (tests/reference.py), not the dense torch path."""
    z_a, z_b = leaf(7, 5, dtype=torch.float64, seed=1), leaf(7, 5, dtype=torch.float64, seed=2)
    stacked = ref.normalized(ref.rows(torch.cat([z_a, z_b]).detach()))
    expected = ref.nt_xent(stacked, ref.views_index(7), 0.2)
    got = nt_xent_views(z_a, z_b, temperature=0.2, reduction="none", chunk_size=3)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    v, u = ref.normalized(ref.rows(z_a.detach())), ref.normalized(ref.rows(z_b.detach()))
    expected = ref.bidirectional(v, u, 0.1, 0.75)
    got = bidirectional_info_nce(z_a, z_b, temperature=0.1, weight=0.75, reduction="none", chunk_size=2)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    expected = ref.dcl(stacked, ref.views_index(7), 0.2)  # the positive left out inside the tiles
    got = dcl(z_a, z_b, temperature=0.2, reduction="none", chunk_size=3)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    labels = [0, 1, 0, 2, 1, 0, 3]  # SupCon L_in; class 3 alone: no positive, reported as 0
    expected = [v or 0.0 for v in ref.supcon(ref.normalized(ref.rows(z_a.detach())), labels, 0.2, "in")]
    got = supcon(z_a, torch.tensor(labels), temperature=0.2, variant="in", reduction="none", chunk_size=2)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_computed_in_float32(dtype):
    z_a64, z_b64 = leaf(37, 16, dtype=torch.float64, seed=4), leaf(37, 16, dtype=torch.float64, seed=5)
    z_a, z_b = z_a64.detach().to(dtype).requires_grad_(), z_b64.detach().to(dtype).requires_grad_()
    for fn in (lambda a, b, **k: nt_xent_views(a, b, temperature=0.1, **k),
               lambda a, b, **k: bidirectional_info_nce(a, b, temperature=0.1, weight=0.75, **k),
               lambda a, b, **k: info_nce(a, b, temperature=0.1, **k)):
        expected = fn(z_a.detach().double(), z_b.detach().double())  # fp64 on the same rounded inputs
        got = fn(z_a, z_b, chunk_size=8)
        assert got.dtype == torch.float32
        assert abs(float(got) - float(expected)) <= 1e-2 * abs(float(expected))
        a64, b64 = z_a.detach().double().requires_grad_(), z_b.detach().double().requires_grad_()
        fn(a64, b64).backward()
        z_a.grad = z_b.grad = None
        got.backward()
        for g, e in ((z_a.grad, a64.grad), (z_b.grad, b64.grad)):
            assert g.dtype == dtype
            assert float((g.double() - e).abs().max()) <= 1e-2 * float(e.abs().max())


def test_autocast_does_not_lower_the_tiled_precision():
    z_a, z_b = torch.randn(20, 8), torch.randn(20, 8)
    plain = nt_xent_views(z_a, z_b, temperature=0.05, chunk_size=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = nt_xent_views(z_a, z_b, temperature=0.05, chunk_size=6)
    assert cast.dtype == torch.float32
    assert torch.allclose(cast, plain, rtol=1e-6)


def test_backward_inside_autocast_stays_in_full_precision():
    z_a, z_b = leaf(20, 8, dtype=torch.float32, seed=1), leaf(20, 8, dtype=torch.float32, seed=2)
    bidirectional_info_nce(z_a, z_b, temperature=0.05, chunk_size=6).backward()
    expected = z_a.grad.clone()
    z_a.grad = z_b.grad = None
    loss = bidirectional_info_nce(z_a, z_b, temperature=0.05, chunk_size=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss.backward()
    assert_close_rel(z_a.grad, expected, 1e-6)


def test_learnable_temperature_module_gets_the_same_gradient():
    z_a, z_b = leaf(30, 8, dtype=torch.float32, seed=8), leaf(30, 8, dtype=torch.float32, seed=9)
    grads = []
    for chunk in (None, 7):
        temperature = Temperature(0.07, learnable=True)
        loss = NTXentViews(temperature, chunk_size=chunk)(z_a, z_b)
        loss.backward()
        grads.append(temperature.log_scale.grad.clone())
    assert grads[0] != 0
    assert_close_rel(grads[1], grads[0], 1e-5)


def test_temperature_gradient_matches_finite_difference():
    z_a, z_b = leaf(9, 4, dtype=torch.float64, seed=3), leaf(9, 4, dtype=torch.float64, seed=6)
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    bidirectional_info_nce(z_a, z_b, temperature=tau, weight=0.75, chunk_size=4).backward()
    h = 1e-6
    plus = bidirectional_info_nce(z_a, z_b, temperature=0.3 + h, weight=0.75, chunk_size=4)
    minus = bidirectional_info_nce(z_a, z_b, temperature=0.3 - h, weight=0.75, chunk_size=4)
    assert abs(float(tau.grad) - float(plus - minus) / (2 * h)) < 1e-7


@pytest.mark.parametrize("n,chunk", [(5, 2), (7, 3)])
def test_gradcheck_kernels(n, chunk):
    x = leaf(n, 3, dtype=torch.float64, seed=n)
    y = leaf(n + 2, 3, dtype=torch.float64, seed=n + 1)
    assert torch.autograd.gradcheck(lambda a: tiled.self_logsumexp(a, chunk), (x,))
    assert torch.autograd.gradcheck(lambda a, b: tiled.cross_logsumexp(a, b, chunk), (x, y))
    assert torch.autograd.gradcheck(lambda a, b: tiled.cross_logsumexp(a, b, chunk, columns=False)[0], (x, y))
    exclude = torch.tensor([[i, (i + 1) % n] for i in range(n)])
    assert torch.autograd.gradcheck(lambda a, b: tiled.masked_logsumexp(a, b, chunk, exclude=exclude), (x, y))
    labels = (torch.arange(n) % 2, torch.arange(n + 2) % 3)
    assert torch.autograd.gradcheck(lambda a, b: tiled.masked_logsumexp(a, b, chunk, labels=labels), (x, y))
    assert torch.autograd.gradcheck(
        lambda a, b: tiled.masked_logsumexp(a, b, chunk, labels=labels, keep="other"), (x, y))
    offset = leaf(n, 1, dtype=torch.float64, seed=n + 2).detach().reshape(-1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b, o: tiled.pair_softplus_sum(a, b, o, chunk, labels=labels), (x, y, offset))


def _pair_softplus_loop(a, c, offset, a_labels, c_labels, own: bool):
    """``sum_{j: same label, j != i if own} log(1 + exp(offset_i - a_i . c_j))`` per row, in
    Python floats."""
    out = []
    for i, row in enumerate(ref.rows(a)):
        terms = [ref.log_sum_exp([0.0, float(offset[i]) - ref.dot(row, col)]) for j, col in enumerate(ref.rows(c))
                 if int(a_labels[i]) == int(c_labels[j]) and not (own and i == j)]
        out.append(sum(terms))
    return out


@pytest.mark.parametrize("own", [True, False], ids=["one-set", "two-sets"])
def test_the_negatives_log_sum_exp_and_the_pair_softplus_sum_equal_loops(own):
    """pytorch-metric-learning's NT-Xent in tiles: each anchor's log-sum-exp over the other
    classes (``keep="other"``), then one softplus per positive pair against it; an offset of
    ``-inf`` (an anchor without a negative) costs 0."""
    a = leaf(11, 4, dtype=torch.float64, seed=21).detach()
    c = a if own else leaf(9, 4, dtype=torch.float64, seed=22).detach()
    a_labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])
    c_labels = a_labels if own else torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    exclude = torch.arange(11)[:, None] if own else None
    negatives = tiled.masked_logsumexp(a, c, 3, labels=(a_labels, c_labels), keep="other")
    expected = [ref.log_sum_exp([ref.dot(row, col) for j, col in enumerate(ref.rows(c))
                                 if int(a_labels[i]) != int(c_labels[j])]) for i, row in enumerate(ref.rows(a))]
    assert torch.allclose(negatives, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=0)
    offset = negatives.clone()
    offset[4] = float("-inf")  # nothing to compare with: every pair of anchor 4 costs 0
    pairs = tiled.pair_softplus_sum(a, c, offset, 3, labels=(a_labels, c_labels), exclude=exclude)
    expected = _pair_softplus_loop(a, c, offset, a_labels, c_labels, own)
    assert float(pairs[4]) == 0.0
    assert torch.allclose(pairs, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="keep must be 'same' or 'other'"):
        tiled.masked_logsumexp(a, c, 3, labels=(a_labels, c_labels), keep="different")


def test_gradcheck_public_losses_with_temperature():
    z_a, z_b = leaf(5, 3, dtype=torch.float64, seed=1), leaf(5, 3, dtype=torch.float64, seed=2)
    tau = learnable_tau(torch.float64, 0.5)
    assert torch.autograd.gradcheck(
        lambda a, b, t: nt_xent_views(a, b, temperature=t, chunk_size=3), (z_a, z_b, tau))
    assert torch.autograd.gradcheck(
        lambda a, b, t: bidirectional_info_nce(a, b, temperature=t, weight=0.75, chunk_size=2), (z_a, z_b, tau))
    assert torch.autograd.gradcheck(
        lambda a, b, t: info_nce(a, b, b[:3] * 2, temperature=t, chunk_size=2), (z_a, z_b, tau))
    assert torch.autograd.gradcheck(lambda a, b, t: dcl(a, b, temperature=t, chunk_size=3), (z_a, z_b, tau))
    labels = torch.tensor([0, 1, 0, 1, 2])  # class 2 alone: an anchor without positives
    assert torch.autograd.gradcheck(
        lambda a, t: supcon(a, labels, temperature=t, variant="in", chunk_size=2), (z_a, tau))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_axis_shift_fallback_is_exact(dtype, monkeypatch):
    """Rows of very different norm (normalize=False) or a tiny temperature make one shared
    shift per tile unsafe; the fallback must kick in and stay exact."""
    calls = []
    original = _tiles.col_stats
    monkeypatch.setattr(_tiles, "col_stats", lambda *a: calls.append(1) or original(*a))
    scale = torch.ones(24, 1, dtype=dtype)
    scale[::5] = 30.0
    z_a, z_b = leaf(24, 6, dtype=dtype, seed=1), leaf(24, 6, dtype=dtype, seed=2)
    with torch.no_grad():
        z_a.mul_(scale)
    compare(lambda a, b, **k: nt_xent_views(a, b, temperature=0.1, normalize=False, **k),
            [z_a, z_b], 5, RTOL[dtype])
    assert calls, "the fallback was not exercised"
    calls.clear()
    compare(lambda a, b, **k: bidirectional_info_nce(a, b, temperature=0.1, normalize=False, **k),
            [z_a, z_b], 5, RTOL[dtype])
    assert calls
    calls.clear()
    compare(lambda a, b, **k: nt_xent_views(a, b, temperature=0.005, **k), [z_a, z_b], 8, RTOL[dtype])
    assert calls


def test_shared_shift_path_used_for_typical_inputs(monkeypatch):
    calls = []
    original = _tiles.col_stats
    monkeypatch.setattr(_tiles, "col_stats", lambda *a: calls.append(1) or original(*a))
    z_a, z_b = leaf(64, 16, dtype=torch.float32, seed=1), leaf(64, 16, dtype=torch.float32, seed=2)
    compare(lambda a, b, **k: nt_xent_views(a, b, temperature=0.1, **k), [z_a, z_b], 16, 1e-5)
    assert not calls  # 8 x 8 tiles, 28 off-diagonal ones, all on the one-exponential path


def test_automatic_dispatch(monkeypatch):
    used = []
    real_self, real_cross = tiled.self_logsumexp, tiled.cross_logsumexp
    monkeypatch.setattr(tiled, "self_logsumexp", lambda *a, **k: used.append("self") or real_self(*a, **k))
    monkeypatch.setattr(tiled, "cross_logsumexp", lambda *a, **k: used.append("cross") or real_cross(*a, **k))
    z = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    nt_xent_views(z, z.flip(0), temperature=0.1)
    bidirectional_info_nce(z, z.flip(0), temperature=0.1)
    assert used == []  # small: dense
    monkeypatch.setattr(tiled, "DENSE_MAX_ENTRIES", 40 * 40 - 1)
    dense_value = nt_xent(z, torch.arange(40) ^ 1, temperature=0.1, chunk_size=None)
    assert used == ["self"]
    bidirectional_info_nce(z, z.flip(0), temperature=0.1)
    assert used == ["self", "cross"]
    monkeypatch.setattr(tiled, "DENSE_MAX_ENTRIES", 40 * 40)
    assert torch.allclose(nt_xent(z, torch.arange(40) ^ 1, temperature=0.1), dense_value, rtol=1e-6)
    assert used == ["self", "cross"]


def test_double_backward_is_refused_clearly():
    z = leaf(6, 3, dtype=torch.float64)
    loss = nt_xent_views(z, z.flip(0), temperature=0.5, chunk_size=4)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, z, create_graph=True)


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    torch.set_num_threads(2)
    from contrastkit.losses import nt_xent_views, tiled
    n, d = 4096, 32                      # 2n = 8192 rows: the dense logits alone take 256 MiB
    z_a = torch.randn(n, d, requires_grad=True)
    z_b = torch.randn(n, d, requires_grad=True)
    (z_a @ z_b[:256].T).sum()            # start the thread pool before measuring
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    limit = vm + 160 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    nt_xent_views(z_a, z_b, temperature=0.1, chunk_size=1024).backward()
    assert torch.isfinite(z_a.grad).all()
    print("TILED_OK", flush=True)
    tiled.DENSE_MAX_ENTRIES = 2**62       # force the dense path under the same limit
    try:
        nt_xent_views(z_a, z_b, temperature=0.1).backward()
        print("DENSE_OK")
    except (RuntimeError, MemoryError) as err:
        print("DENSE_FAILED", type(err).__name__)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux-only")
def test_tiled_path_never_allocates_the_full_matrix():
    """Under an address-space limit 160 MiB above the process size, the tiled loss and its
    gradient run at 2N = 8192 rows while the dense path (256 MiB of logits) fails."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=300)
    assert "TILED_OK" in out.stdout, out.stdout + out.stderr
    assert "DENSE_FAILED" in out.stdout, out.stdout + out.stderr
