"""A temperature per anchor row: every loss against the float64 loop references of
``tests/reference.py`` (each anchor divided by its own ``tau``), on the dense and the tiled
path, gradcheck with the per-anchor ``tau`` among the inputs, and the bad inputs refused.

The tiled kernels whose tiles serve rows and columns (two views, both directions) take the
inverse temperatures themselves; they are checked here against the reference and, with odd
sizes and tile edges, against the dense path's gradients of the embeddings and of ``tau``.
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

import reference as ref
from contrastkit import losses as L
from loss_catalog import CATALOG, cases

N, D = 5, 3
TILES = {"dense": {}, "tiled": {"chunk_size": 3}}


@pytest.fixture(autouse=True)
def _quiet_few_rows():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def taus(count, seed=0, low=0.05, high=2.0):
    """``count`` temperatures spread over ``[low, high]`` (log-uniform)."""
    u = torch.rand(count, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
    return torch.exp(torch.log(torch.tensor(low)) + u * (torch.log(torch.tensor(high)) - torch.log(torch.tensor(low))))


def views(seed=0, n=N):
    a, b = randn(n, D, seed=seed), randn(n, D, seed=seed + 1)
    return a, b, ref.normalized(ref.rows(torch.cat([a, b])))


# ---------------------------------------------------------------- values against the references


@pytest.mark.parametrize("path", sorted(TILES))
def test_info_nce(path):
    q, p = randn(N, D, seed=1), randn(N, D, seed=2)
    tau = taus(N)
    expected = ref.info_nce(ref.normalized(ref.rows(q)), ref.normalized(ref.rows(p)), tau=tau.tolist())
    got = L.info_nce(q, p, temperature=tau, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
@pytest.mark.parametrize("mode", ["unpaired", "paired"])
def test_info_nce_bank(path, mode):
    if mode == "paired" and path == "tiled":
        pytest.skip("paired negatives have no tiled path")
    q, p = randn(N, D, seed=1), randn(N, D, seed=2)
    neg = randn(7, D, seed=3) if mode == "unpaired" else randn(N, 4, D, seed=3)
    bank = ref.normalized(ref.rows(neg)) if mode == "unpaired" else [ref.normalized(ref.rows(b)) for b in neg]
    tau = taus(N, seed=1)
    expected = ref.info_nce(ref.normalized(ref.rows(q)), ref.normalized(ref.rows(p)), bank, tau.tolist(),
                            paired=mode == "paired")
    got = L.info_nce(q, p, neg, temperature=tau, negative_mode=mode, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
def test_nt_xent_any_map(path):
    z = randn(6, D, seed=4)
    pairs = [3, 4, 5, 0, 1, 2]
    tau = taus(6, seed=2)
    expected = ref.nt_xent(ref.normalized(ref.rows(z)), pairs, tau.tolist())
    got = L.nt_xent(z, torch.tensor(pairs), temperature=tau, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
def test_nt_xent_views(path):
    a, b, z = views(5)
    tau = taus(2 * N, seed=3)
    expected = ref.nt_xent(z, ref.views_index(N), tau.tolist())
    got = L.nt_xent_views(a, b, temperature=tau, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    mean = L.nt_xent_views(a, b, temperature=tau, **TILES[path])
    assert float(mean) == pytest.approx(ref.mean(expected), rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
@pytest.mark.parametrize("weight", [0.0, 0.25, 0.75, 1.0])
def test_bidirectional(path, weight):
    v, u = randn(N, D, seed=6), randn(N, D, seed=7)
    tau = taus(2 * N, seed=4)
    expected = ref.bidirectional(ref.normalized(ref.rows(v)), ref.normalized(ref.rows(u)), tau.tolist(), weight)
    got = L.bidirectional_info_nce(v, u, temperature=tau, weight=weight, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
@pytest.mark.parametrize("variant", ["out", "in"])
def test_supcon(path, variant):
    z = randn(7, D, seed=8)
    labels = [0, 1, 0, 2, 1, 0, 3]
    tau = taus(7, seed=5)
    expected = ref.supcon(ref.normalized(ref.rows(z)), labels, tau.tolist(), variant)
    got = L.supcon(z, torch.tensor(labels), temperature=tau, variant=variant, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx([0.0 if e is None else e for e in expected], rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("path", sorted(TILES))
def test_supcon_views(path):
    z = randn(4, 2, D, seed=9)
    tau = taus(8, seed=6)
    expected = ref.supcon(ref.normalized(ref.rows(z.reshape(8, D))), [0, 0, 1, 1, 0, 0, 2, 2], tau.tolist(), "out")
    got = L.supcon(z, torch.tensor([0, 1, 0, 2]), temperature=tau, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
def test_dcl(path):
    a, b, z = views(12)
    tau = taus(2 * N, seed=7)
    expected = ref.dcl(z, ref.views_index(N), tau.tolist())
    got = L.dcl(a, b, temperature=tau, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
@pytest.mark.parametrize("k", [1, 3, 8])
def test_hard_negative(path, k):
    a, b, z = views(16)
    tau = taus(2 * N, seed=8)
    expected = ref.hard_negative(z, ref.views_index(N), tau.tolist(), k)
    got = L.hard_negative_nt_xent(a, b, temperature=tau, top_k=k, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_debiased_and_hcl(path, beta):
    a, b, z = views(18)
    tau = taus(2 * N, seed=9, low=0.2, high=1.0)
    expected = ref.debiased(z, ref.views_index(N), tau.tolist(), 0.1, beta)
    got = L.hcl(a, b, temperature=tau, tau_plus=0.1, beta=beta, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-10)


def test_debiased_floor_per_anchor():
    # Identical negatives and a strong prior: the floor M exp(-1 / tau_i) binds, each anchor at its own tau.
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    tau = torch.tensor([0.3, 0.5, 0.8, 0.4, 1.0, 0.6], dtype=torch.float64)
    expected = ref.debiased(ref.rows(torch.cat([a, a])), ref.views_index(3), tau.tolist(), 0.9, 0.0)
    got = L.debiased_nt_xent(a, a, temperature=tau, tau_plus=0.9, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-10)


def test_similarity_and_contrastive_loss():
    s = randn(6, 6, seed=22)
    pairs = [3, 4, 5, 0, 1, 2]
    tau = taus(6, seed=10)
    expected = ref.similarity(ref.rows(s), pairs, tau.tolist(), True)
    got = L.similarity_loss(s, torch.tensor(pairs), temperature=tau, exclude_diagonal=True, reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    wide = randn(4, 7, seed=23)
    expected = ref.similarity(ref.rows(wide), [6, 0, 2, 2], tau[:4].tolist(), False)
    got = L.contrastive_loss(wide, torch.tensor([6, 0, 2, 2]), temperature=tau[:4], reduction="none")
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("path", sorted(TILES))
def test_sigmoid(path):
    image, text = randn(N, D, seed=30), randn(N, D, seed=31)
    tau = taus(N, seed=11, low=0.1, high=1.0)
    expected = ref.sigmoid(ref.normalized(ref.rows(image)), ref.normalized(ref.rows(text)), tau.tolist(), -2.0)
    got = L.sigmoid_loss(image, text, temperature=tau, bias=-2.0, reduction="none", **TILES[path])
    assert got.tolist() == pytest.approx(expected, rel=1e-12)


def test_equal_per_anchor_temperatures_are_the_scalar():
    a, b = randn(40, 6, seed=40), randn(40, 6, seed=41)
    for chunk in (None, 7):
        scalar = L.nt_xent_views(a, b, temperature=0.3, chunk_size=chunk)
        same = L.nt_xent_views(a, b, temperature=torch.full((80,), 0.3, dtype=torch.float64), chunk_size=chunk)
        assert float(same) == pytest.approx(float(scalar), rel=1e-13)


# ---------------------------------------------------------------- the tiled kernels on odd sizes


@pytest.mark.parametrize("n, chunk", [(1, 1), (2, 1), (5, 2), (13, 4), (40, 7), (48, 16)])
@pytest.mark.parametrize("case", ["views", "bidirectional", "supcon_out", "supcon_in"])
def test_tiled_matches_dense_with_gradients(case, n, chunk):
    a = randn(n, 4, seed=50).requires_grad_()
    b = randn(n, 4, seed=51).requires_grad_()
    labels = torch.arange(n) % 3
    count = n if case.startswith("supcon") else 2 * n
    tau = taus(count, seed=n).requires_grad_()

    def run(chunk_size):
        for t in (a, b, tau):
            t.grad = None
        if case == "views":
            losses = L.nt_xent_views(a, b, temperature=tau, reduction="none", chunk_size=chunk_size)
        elif case == "bidirectional":
            losses = L.bidirectional_info_nce(a, b, temperature=tau, weight=0.3, reduction="none",
                                              chunk_size=chunk_size)
        else:
            losses = L.supcon(a, labels, temperature=tau, variant=case[-3:].strip("_"), reduction="none",
                              chunk_size=chunk_size)
        weights = torch.linspace(0.5, 1.5, losses.shape[0], dtype=losses.dtype)
        (losses * weights).sum().backward()
        return [losses.detach()] + [t.grad.clone() for t in (a, b, tau) if t.grad is not None]

    for dense, tiled in zip(run(None), run(chunk)):
        torch.testing.assert_close(tiled, dense, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype, rtol, tau_rtol", [(torch.float32, 1e-5, 1e-3), (torch.float64, 1e-10, 1e-10)])
def test_shared_shift_fallback_is_exact(dtype, rtol, tau_rtol, monkeypatch):
    """On the CPU a tile shared by rows and columns is shifted by its maximum times each
    anchor's scale; rows of very different norm or a tiny tau make that unsafe, and the exact
    per-row and per-column maxima must take over. Typical inputs stay on the shared shift.

    In float32 the unnormalised rows (norms near 30, logits near 10^4) leave ``tau``'s
    gradient ``sum_j p_ij S_ij / tau_i^2`` about 1e-4 relative rounding on either path (``p``
    rebuilt from ``exp(l - lse)`` with ``l`` and ``lse`` near 10^4): checked to 1e-3 there."""
    from contrastkit.losses import _tiles

    calls = []
    original = _tiles.scaled_col_stats
    monkeypatch.setattr(_tiles, "scaled_col_stats", lambda *a: calls.append(1) or original(*a))
    a = randn(24, 6, seed=70).to(dtype)
    b = randn(24, 6, seed=71).to(dtype)

    def check(tau, normalize, chunk):
        for case in ("views", "bidirectional"):
            run = (lambda t, c: L.nt_xent_views(a, b, temperature=t, normalize=normalize, reduction="none",
                                                chunk_size=c)) if case == "views" else \
                  (lambda t, c: L.bidirectional_info_nce(a, b, temperature=t, normalize=normalize, reduction="none",
                                                         chunk_size=c))
            dense_tau, tiled_tau = tau.clone().requires_grad_(), tau.clone().requires_grad_()
            dense, tiled = run(dense_tau, None), run(tiled_tau, chunk)
            torch.testing.assert_close(tiled, dense, rtol=rtol, atol=rtol * float(dense.abs().max()))
            weights = torch.linspace(0.5, 1.5, dense.shape[0], dtype=dtype)
            (dense_grad,) = torch.autograd.grad((dense * weights).sum(), dense_tau)
            (tiled_grad,) = torch.autograd.grad((tiled * weights).sum(), tiled_tau)
            torch.testing.assert_close(tiled_grad, dense_grad, rtol=tau_rtol,
                                       atol=tau_rtol * float(dense_grad.abs().max()))

    check(taus(48, seed=72, low=0.1, high=0.5).to(dtype), True, 6)
    assert not calls, "typical inputs should take the shared shift"
    with torch.no_grad():
        a[::5] *= 30.0
    check(taus(48, seed=73, low=0.1, high=0.5).to(dtype), False, 5)
    assert calls, "the fallback was not exercised"
    calls.clear()
    check(taus(48, seed=74, low=0.003, high=1.0).to(dtype), True, 8)
    assert calls


# ---------------------------------------------------------------- gradcheck with tau among the inputs


def leaf(*shape, seed):
    return randn(*shape, seed=seed).requires_grad_(True)


def tau_leaf(count, seed):
    return taus(count, seed=seed, low=0.2, high=1.5).requires_grad_(True)


def catalogued(name, seed, n=4, d=3):
    """(loss, inputs) of the catalog's ``name`` (tests/loss_catalog.py) on its own inputs and
    options: the differentiable inputs and one temperature per anchor row as leaves."""
    case = CATALOG[name]
    tensors = case.tensors(n, d, seed=seed)

    def loss(*values, **options):
        given = list(tensors)
        for i, value in zip(case.grads, values):
            given[i] = value
        return case(given, values[-1], **options)
    return loss, lambda: tuple(tensors[i].clone().requires_grad_() for i in case.grads) + (
        tau_leaf(case.anchors * n, seed),)


# Catalog name -> (loss, inputs): every catalogued loss that takes a temperature per anchor row
# (test_every_loss_with_a_temperature_is_covered), hand-made where written before the catalog.
GRADCHECK = {
    "info_nce": (lambda q, p, t, **k: L.info_nce(q, p, temperature=t, **k), lambda: (leaf(4, 3, seed=1),
                 leaf(4, 3, seed=2), tau_leaf(4, 1))),
    "info_nce[bank]": (lambda q, p, n, t, **k: L.info_nce(q, p, n, temperature=t, **k),
                       lambda: (leaf(4, 3, seed=1), leaf(4, 3, seed=2), leaf(5, 3, seed=3), tau_leaf(4, 2))),
    "info_nce[paired]": (lambda q, p, n, t, **k: L.info_nce(q, p, n, temperature=t, negative_mode="paired"),
                         lambda: (leaf(4, 3, seed=1), leaf(4, 3, seed=2), leaf(4, 2, 3, seed=3), tau_leaf(4, 3))),
    "nt_xent": (lambda z, t, **k: L.nt_xent(z, torch.tensor([2, 3, 0, 1]), temperature=t, **k),
                lambda: (leaf(4, 3, seed=4), tau_leaf(4, 4))),
    "nt_xent_views": (lambda a, b, t, **k: L.nt_xent_views(a, b, temperature=t, **k),
                      lambda: (leaf(4, 3, seed=5), leaf(4, 3, seed=6), tau_leaf(8, 5))),
    "bidirectional_info_nce": (lambda v, u, t, **k: L.bidirectional_info_nce(v, u, temperature=t, weight=0.75, **k),
                               lambda: (leaf(4, 3, seed=7), leaf(4, 3, seed=8), tau_leaf(8, 6))),
    "supcon": (lambda z, t, **k: L.supcon(z, torch.tensor([0, 1, 0, 1, 2]), temperature=t, **k),
               lambda: (leaf(5, 3, seed=9), tau_leaf(5, 7))),
    "supcon[in]": (lambda z, t, **k: L.supcon(z, torch.tensor([0, 1, 0, 1, 1]), temperature=t, variant="in", **k),
                   lambda: (leaf(5, 3, seed=9), tau_leaf(5, 8))),
    "dcl": (lambda a, b, t, **k: L.dcl(a, b, temperature=t, **k),
            lambda: (leaf(3, 3, seed=11), leaf(3, 3, seed=12), tau_leaf(6, 9))),
    "hard_negative_nt_xent": (lambda a, b, t, **k: L.hard_negative_nt_xent(a, b, temperature=t, top_k=2, **k),
                              lambda: (leaf(3, 3, seed=15), leaf(3, 3, seed=16), tau_leaf(6, 10))),
    "hcl": (lambda a, b, t, **k: L.hcl(a, b, temperature=t, tau_plus=0.1, beta=1.0, **k),
            lambda: (leaf(3, 3, seed=19), leaf(3, 3, seed=20), tau_leaf(6, 11))),
    "similarity_loss": (lambda s, t, **k: L.similarity_loss(s, torch.tensor([1, 0, 3, 2]), temperature=t,
                                                            exclude_diagonal=True),
                        lambda: (leaf(4, 4, seed=10), tau_leaf(4, 12))),
    "sigmoid_loss": (lambda x, y, t, **k: L.sigmoid_loss(x, y, t, -1.0, **k),
                     lambda: (leaf(4, 3, seed=13), leaf(4, 3, seed=14), tau_leaf(4, 13))),
    # On the catalog's inputs and options.
    "contrastive_loss": catalogued("contrastive_loss", 14),
    "hard_negative_nt_xent[quantile]": catalogued("hard_negative_nt_xent[quantile]", 15),
    "debiased_nt_xent": catalogued("debiased_nt_xent", 16),
    "robust_nt_xent": catalogued("robust_nt_xent", 17),
}
# A tiled catalog case is gradchecked on its tiled path too.
GRADCHECK_PATHS = [(name, "dense") for name in GRADCHECK] + [
    (name, "tiled") for name in sorted(GRADCHECK) if CATALOG[name].tiled]


#: The functions the value tests above check against a reference; robust_nt_xent's, which takes
#: one temperature per anchor by design, is tests/losses/test_adaptive_temperatures.py's.
REFERENCED = {"info_nce", "nt_xent", "nt_xent_views", "bidirectional_info_nce", "supcon", "dcl",
              "hard_negative_nt_xent", "debiased_nt_xent", "hcl", "similarity_loss", "contrastive_loss",
              "sigmoid_loss"}


def test_every_loss_with_a_temperature_is_covered():
    # simple_loss is the tau -> infinity limit and has no temperature; MACL's and dual
    # temperature's temperatures are settings: the catalog's per_anchor is False for them.
    per_anchor = cases(per_anchor=True)
    assert {case.function_name for case in per_anchor.values()} - {"robust_nt_xent"} == REFERENCED
    assert set(GRADCHECK) == set(per_anchor)


@pytest.mark.parametrize("name, path", GRADCHECK_PATHS)
def test_gradcheck(name, path):
    fn, inputs = GRADCHECK[name]
    options = {"chunk_size": 2} if path == "tiled" else {}
    assert torch.autograd.gradcheck(lambda *x: fn(*x, **options), inputs(), eps=1e-6, atol=1e-7)


def test_gradcheck_the_scaled_kernels():
    from contrastkit.losses import tiled

    x, scale = leaf(7, 3, seed=60), tau_leaf(7, 60)
    assert torch.autograd.gradcheck(lambda x, s: tiled.self_logsumexp(x, 3, scale=s), (x, scale))
    a, b = leaf(5, 3, seed=61), leaf(4, 3, seed=62)
    rows, cols = tau_leaf(5, 61), tau_leaf(4, 62)
    assert torch.autograd.gradcheck(lambda a, b, r, c: tiled.cross_logsumexp(a, b, 2, row_scale=r, col_scale=c),
                                    (a, b, rows, cols))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("tau, error, message", [
    (torch.full((9,), 0.5, dtype=torch.float64), ValueError, "has 9 values but the loss has 10 anchor rows"),
    (torch.full((2, 5), 0.5, dtype=torch.float64), ValueError, "one value per anchor row"),
    (torch.tensor([0.5] * 9 + [0.0], dtype=torch.float64), ValueError, "positive and finite in every entry"),
    (torch.tensor([0.5] * 9 + [float("nan")], dtype=torch.float64), ValueError, "positive and finite"),
    (torch.ones(10, dtype=torch.long), TypeError, "temperature must have a floating dtype"),
])
def test_bad_per_anchor_temperatures_name_the_argument(tau, error, message):
    a, b = randn(N, D, seed=1), randn(N, D, seed=2)
    for chunk in (None, 3):
        with pytest.raises(error, match=message):
            L.nt_xent_views(a, b, temperature=tau, chunk_size=chunk)


def test_a_per_anchor_temperature_on_another_device_is_refused():
    a, b = randn(N, D, seed=1), randn(N, D, seed=2)
    with pytest.raises(ValueError, match="temperature is on meta but the embeddings are on cpu"):
        L.info_nce(a, b, temperature=torch.ones(N, dtype=torch.float64, device="meta"))


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    torch.set_num_threads(2)
    from contrastkit.losses import bidirectional_info_nce, nt_xent_views
    n, d = 4096, 32                      # 2n = 8192 rows: the dense logits alone take 256 MiB
    z_a = torch.randn(n, d, requires_grad=True)
    z_b = torch.randn(n, d, requires_grad=True)
    tau = (0.05 + torch.rand(2 * n)).requires_grad_()
    (z_a @ z_b[:256].T).sum()            # start the thread pool before measuring
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + 160 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    nt_xent_views(z_a, z_b, temperature=tau, chunk_size=1024).backward()
    bidirectional_info_nce(z_a, z_b, temperature=tau, weight=0.5, chunk_size=1024).backward()
    assert torch.isfinite(z_a.grad).all() and torch.isfinite(tau.grad).all() and bool((tau.grad != 0).all())
    print("TILED_OK", flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux-only")
def test_tiled_per_anchor_path_never_allocates_the_full_matrix():
    """Under an address-space limit 160 MiB above the process size (the 2N x 2N logits alone
    take 256 MiB), the per-anchor tiled losses and their gradients (tau's included) run."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600)
    assert "TILED_OK" in out.stdout, out.stdout + out.stderr
