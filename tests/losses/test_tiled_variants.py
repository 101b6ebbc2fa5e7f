"""The tiled paths of every catalogued loss that has one (tests/loss_catalog.py), and of the
simple, hard-negative, debiased and HCL losses in depth.

Every tiled loss is checked against its dense path (values and gradients, the temperature
included, at chunk sizes that divide the batch, that do not, and that exceed it; the tiled
kernel it runs), by gradcheck, and for bad ``chunk_size``. The simple, hard-negative, debiased
and HCL losses are also checked against an independent float64 loop reference written here, for
memory (no ``N x N`` tensor is ever allocated, seen by a dispatch hook), across two gloo
processes (gathered, tiled and ring paths against one process on the concatenated batch), and
through a tiny ``pretrain`` run whose large-batch dispatch takes the tiled path.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import distributed_workers as W
from contrastkit import losses as L
from contrastkit.losses import tiled
from contrastkit.losses._tiles import top_k_mask
from loss_catalog import CATALOG, cases

#: Every catalogued loss with a tiled path (takes chunk_size).
TILED = cases(tiled=True)
#: The losses whose tiled paths this file was written for: checked against the loop references
#: below, for memory and on two processes (on two views, z_a and z_b, of an encoder).
VARIANTS = ("simple_loss", "hard_negative_nt_xent", "hard_negative_nt_xent[quantile]", "debiased_nt_xent", "hcl")
# Their settings, the catalog's (the loop references take them).
WEIGHT = CATALOG["simple_loss"].options["negative_weight"]
TOP_K = CATALOG["hard_negative_nt_xent"].options["top_k"]
QUANTILE = CATALOG["hard_negative_nt_xent[quantile]"].options["quantile"]
TAU_PLUS = CATALOG["debiased_nt_xent"].options["tau_plus"]
assert CATALOG["hcl"].options["tau_plus"] == TAU_PLUS
BETA = CATALOG["hcl"].options["beta"]
# The tiled kernels each tiled loss runs (the simple and sigmoid losses need none): a tiled
# catalog case missing here fails test_every_tiled_loss_names_its_kernels.
KERNELS = {
    "info_nce": {"cross_logsumexp"}, "info_nce[bank]": {"cross_logsumexp"},
    "bidirectional_info_nce": {"cross_logsumexp"},
    "nt_xent": {"self_logsumexp"}, "nt_xent_views": {"self_logsumexp"}, "supcon": {"self_logsumexp"},
    "supcon[in]": {"self_logsumexp", "masked_logsumexp"},
    "macl_nt_xent": {"self_logsumexp"}, "dual_temperature_nt_xent": {"self_logsumexp"},
    "dcl": {"masked_logsumexp"}, "debiased_nt_xent": {"masked_logsumexp"}, "hcl": {"masked_logsumexp"},
    "robust_nt_xent": {"masked_logsumexp"},
    "hard_negative_nt_xent": {"topk_logsumexp"}, "hard_negative_nt_xent[quantile]": {"topk_logsumexp"},
    "simple_loss": set(), "sigmoid_loss": set(),
}


def test_every_tiled_loss_names_its_kernels():
    assert set(KERNELS) == set(TILED) and set(VARIANTS) <= set(TILED)


def loss_of(name, tensors, tau, **options):
    """The catalogued loss ``name`` of its ``tensors`` at ``tau``, with ``options``."""
    return CATALOG[name](tensors, tau, **options)


# --------------------------------------------------------------------------- loop references


def _rows(z_a, z_b):
    z = torch.cat([z_a, z_b]).double()
    return z / z.norm(dim=1, keepdim=True)


def _anchor_terms(z_a, z_b):
    """Per anchor i of the 2N stacked views: its rows' similarities, its positive, its negatives."""
    z, n = _rows(z_a, z_b), z_a.shape[0]
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        sims = [torch.dot(z[i], z[j]) for j in range(2 * n)]
        yield sims[p], [(j, sims[j]) for j in range(2 * n) if j not in (i, p)]


def ref_simple(z_a, z_b, weight):
    losses = [-pos + weight * sum(s for _, s in negs) / len(negs) for pos, negs in _anchor_terms(z_a, z_b)]
    return sum(losses) / len(losses)


def ref_hard_negative(z_a, z_b, tau, k):
    losses = []
    for pos, negs in _anchor_terms(z_a, z_b):
        # the k largest; at a tie the lowest column first
        hardest = sorted(negs, key=lambda js: (-float(js[1].detach()), js[0]))[:k]
        denominator = torch.exp(pos / tau) + sum(torch.exp(s / tau) for _, s in hardest)
        losses.append(-pos / tau + torch.log(denominator))
    return sum(losses) / len(losses)


def ref_debiased(z_a, z_b, tau, tau_plus, beta=0.0):
    losses = []
    for pos, negs in _anchor_terms(z_a, z_b):
        m = len(negs)
        positive = torch.exp(pos / tau)
        exps = [torch.exp(s / tau) for _, s in negs]
        weights = [torch.exp(beta * s / tau) for _, s in negs]
        mean_weight = sum(weights) / m
        mass = sum(w / mean_weight * e for w, e in zip(weights, exps))
        floor = m * torch.exp(-1.0 / torch.as_tensor(tau, dtype=torch.float64))
        ng = torch.maximum((mass - tau_plus * m * positive) / (1.0 - tau_plus), floor)
        losses.append(-torch.log(positive / (positive + ng)))
    return sum(losses) / len(losses)


REFERENCES = {
    "simple_loss": lambda a, b, t: ref_simple(a, b, WEIGHT),
    "hard_negative_nt_xent": lambda a, b, t: ref_hard_negative(a, b, t, TOP_K),
    "hard_negative_nt_xent[quantile]": lambda a, b, t: ref_hard_negative(
        a, b, t, max(1, math.ceil((1 - QUANTILE) * (2 * a.shape[0] - 2)))),
    "debiased_nt_xent": lambda a, b, t: ref_debiased(a, b, t, TAU_PLUS),
    "hcl": lambda a, b, t: ref_debiased(a, b, t, TAU_PLUS, BETA),
}
assert set(REFERENCES) == set(VARIANTS)  # the other losses' loop references: tests/reference.py


# --------------------------------------------------------------------------- helpers


def inputs(name, n, d=5, dtype=torch.float64, seed=0, tau=0.3):
    """The catalog's tensors of ``name`` for ``n`` pairs (those with gradients as leaves), and ``tau``."""
    case = CATALOG[name]
    tensors = [t.requires_grad_() if i in case.grads else t
               for i, t in enumerate(case.tensors(n, d, dtype=dtype, seed=seed))]
    return tensors, torch.tensor(tau, dtype=dtype, requires_grad=True)


def differentiable(name, tensors, tau):
    """The inputs a gradient is taken of: those of the catalog's ``grads``, and ``tau``."""
    return [tensors[i] for i in CATALOG[name].grads] + [tau]


def value_and_grads(name, tensors, tau, **options):
    loss = loss_of(name, tensors, tau, **options)
    grads = torch.autograd.grad(loss, differentiable(name, tensors, tau), allow_unused=True)
    return loss.detach(), grads


def assert_same(actual, expected, rtol, atol):
    (value, grads), (ref_value, ref_grads) = actual, expected
    torch.testing.assert_close(value, ref_value.to(value.dtype), rtol=rtol, atol=atol)
    whats = [f"input {i}" for i in range(len(grads) - 1)] + ["temperature"]
    for grad, ref_grad, what in zip(grads, ref_grads, whats):
        if ref_grad is None:
            assert grad is None or float(grad.abs().max()) == 0.0, what
            continue
        assert float(ref_grad.abs().max()) > 0, what  # a gradient that can be wrong
        torch.testing.assert_close(grad, ref_grad.to(grad.dtype), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Which tiled kernels ran (a spy on each)."""
    calls = []
    for kernel in ("topk_logsumexp", "masked_logsumexp", "self_logsumexp", "cross_logsumexp"):
        real = getattr(tiled, kernel)
        monkeypatch.setattr(tiled, kernel, (lambda name, f: lambda *a, **k: calls.append(name) or f(*a, **k))(kernel, real))
    return calls


# --------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_and_tiled_match_the_loop_reference(name):
    tensors, tau = inputs(name, 6)
    reference = REFERENCES[name](*tensors, tau)
    ref_grads = torch.autograd.grad(reference, differentiable(name, tensors, tau), allow_unused=True)
    for chunk in (None, 4):
        assert_same(value_and_grads(name, tensors, tau, chunk_size=chunk), (reference.detach(), ref_grads),
                    rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-10, 1e-12), (torch.float32, 1e-5, 1e-6)])
@pytest.mark.parametrize("name", sorted(TILED))
def test_tiled_equals_dense_at_every_chunk_size(name, dtype, rtol, atol, kernel_calls):
    n = 7  # 2N = 14 rows
    tensors, tau = inputs(name, n, dtype=dtype, seed=1)
    dense = value_and_grads(name, tensors, tau)
    assert kernel_calls == []  # small batch, no chunk_size: the dense path
    for chunk in (1, 3, 5, 14, 64):  # 3 and 5 do not divide 14; 14 and 64 are one tile
        del kernel_calls[:]
        assert_same(value_and_grads(name, tensors, tau, chunk_size=chunk), dense, rtol, atol)
        assert set(kernel_calls) == KERNELS[name]
    # reduction="none" too: per anchor (per pair for the bidirectional loss, its two directions weighted)
    per_anchor = loss_of(name, tensors, tau, reduction="none")
    tiled_per_anchor = loss_of(name, tensors, tau, reduction="none", chunk_size=3)
    anchors = 1 if CATALOG[name].function is L.bidirectional_info_nce else CATALOG[name].anchors
    assert per_anchor.shape == (anchors * n,)
    torch.testing.assert_close(tiled_per_anchor, per_anchor, rtol=rtol, atol=atol)


# The losses whose gradient is their value's: a stop-gradient weight is no derivative (their
# tiled gradient is checked against the dense one above).
@pytest.mark.parametrize("name", sorted(cases(tiled=True, stop_gradient=None)))
def test_gradcheck_of_the_tiled_path(name):
    case = CATALOG[name]
    tensors, tau = inputs(name, 5, d=3, seed=2)
    varied = [tensors[i] for i in case.grads] + ([tau] if case.temperature == "learnable" else [])

    def loss(*values):  # the loss of the varied inputs (the others as made), at the varied tau
        given = list(tensors)
        for i, value in zip(case.grads, values):
            given[i] = value
        return loss_of(name, given, values[-1] if case.temperature == "learnable" else None, chunk_size=3)
    assert torch.autograd.gradcheck(loss, tuple(varied))


def test_the_debiased_floor_acts_on_the_whole_negative_sum():
    """With a large tau_plus the debiased mass goes below the floor M e^{-1/tau} for some anchors
    and not for others; the tiled path clamps the same totals as the dense one and the loop."""
    (z_a, z_b), tau = inputs("hcl", 6, seed=5, tau=0.5)
    tau_plus = 0.2
    for beta in (0.0, BETA):
        reference = ref_debiased(z_a, z_b, tau, tau_plus, beta)
        ref_grads = torch.autograd.grad(reference, [z_a, z_b, tau])
        for chunk in (None, 4):
            loss = L.hcl(z_a, z_b, temperature=tau, tau_plus=tau_plus, beta=beta, chunk_size=chunk)
            grads = torch.autograd.grad(loss, [z_a, z_b, tau])
            assert_same((loss.detach(), grads), (reference.detach(), ref_grads), rtol=1e-10, atol=1e-12)
    # without reweighting the floor binds for some anchors only (else this would not test it)
    log_floor = math.log(10) - 1 / 0.5
    z = _rows(z_a, z_b).detach()
    sims = (z @ z.T) / 0.5
    n = z_a.shape[0]
    binds = []
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        negs = [j for j in range(2 * n) if j not in (i, p)]
        mass = sims[i, negs].exp().sum() - tau_plus * len(negs) * sims[i, p].exp()
        binds.append(bool(mass <= 0) or float(torch.log(mass / (1 - tau_plus))) < log_floor)
    assert any(binds) and not all(binds)


def test_hard_negative_tie_rule_is_the_same_on_both_paths():
    """Exact ties at the cut (duplicated rows): both paths keep the lowest column indices,
    which is what the loop reference does; the selection keeps exactly k entries."""
    base = torch.tensor([[1.0, 0.2, 0.0], [0.9, -0.3, 0.1], [0.0, 1.0, 0.0]], dtype=torch.float64)
    z_a = base[[0, 1, 1, 2, 2]].clone().requires_grad_()
    z_b = base[[0, 0, 1, 2, 1]].clone().requires_grad_()
    tau = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    for k in (1, 2, 3, 5):
        reference = ref_hard_negative(z_a, z_b, tau, k)
        ref_grads = torch.autograd.grad(reference, [z_a, z_b, tau])
        for chunk in (None, 2, 4):
            loss = L.hard_negative_nt_xent(z_a, z_b, temperature=tau, top_k=k, chunk_size=chunk)
            grads = torch.autograd.grad(loss, [z_a, z_b, tau])
            assert_same((loss.detach(), grads), (reference.detach(), ref_grads), rtol=1e-10, atol=1e-12)
    scores = torch.tensor([[3.0, 1.0, 1.0, float("-inf"), 1.0, 0.0]])
    assert top_k_mask(scores, 2).tolist() == [[True, True, False, False, False, False]]
    assert top_k_mask(scores, 3).tolist() == [[True, True, True, False, False, False]]
    assert top_k_mask(scores, 4).tolist() == [[True, True, True, False, True, False]]


def test_the_doctest_values_are_unchanged():
    import math

    z = torch.eye(4)
    # Identical orthonormal views: every anchor's positive has cos 1, its hardest negative cos 0,
    # so with tau = 1 and one negative: -log(e / (e + 1)) = log(1 + e^-1).
    expected = math.log1p(math.exp(-1.0))
    assert abs(float(L.hard_negative_nt_xent(z, z, temperature=1.0, top_k=1, chunk_size=2)) - expected) < 1e-6
    assert abs(float(L.hard_negative_nt_xent(z, z, temperature=1.0, top_k=1)) - expected) < 1e-6  # dense
    # Simple loss: -cos(positive) + mean cos(negatives) = -1 + 0.
    assert float(L.simple_loss(z[:2], z[:2].clone(), chunk_size=1)) == -1.0


# --------------------------------------------------------------------------- memory


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten operation returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest_allocation(name, n, d, **options):
    tensors, tau = inputs(name, n, d=d, dtype=torch.float32, seed=3)
    z_a = tensors[0]
    with _LargestTensor() as mode:
        loss = loss_of(name, tensors, tau, **options)
        loss.backward()
    assert torch.isfinite(z_a.grad).all()
    return mode.largest


@pytest.mark.parametrize("name", VARIANTS)
def test_the_tiled_path_never_allocates_an_n_by_n_tensor(name):
    n, d, chunk = 600, 16, 96  # 2N = 1200 rows: the matrix has 1.44M entries
    rows = 2 * n
    largest = _largest_allocation(name, n, d, chunk_size=chunk)
    # a few (2N, d) buffers, and the tiles / whole-row blocks of about chunk^2 entries
    assert largest <= max(rows * d, chunk * chunk, rows) * 4, largest
    assert largest < rows * rows // 20
    # the hook sees the dense path's matrix (so it could see the tiled path's)
    assert _largest_allocation(name, 40, d) >= 80 * 80


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError),
                                       ("4", TypeError)])
@pytest.mark.parametrize("name", sorted(TILED))
def test_bad_chunk_size_gives_one_clear_error(name, bad, error):
    tensors, tau = inputs(name, 4)
    with pytest.raises(error, match="chunk_size"):
        loss_of(name, tensors, tau, chunk_size=bad)


# --------------------------------------------------------------------------- two processes

SEED, SIZES = 7, (3, 5)  # uneven batches
TILE = 3
DISTRIBUTED_REDUCTIONS = ("mean", "sum")


def _encoder_loss(model, name, data, reduction, **options):
    model.zero_grad()
    z_a, z_b, tau = model(data[0], data[1])
    loss = loss_of(name, (z_a, z_b), tau, reduction=reduction, **options)
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def ranks_worker(rank, world, seed, sizes):
    data = W.batches(seed, sizes)[rank]
    model = W.Encoder()
    results = {}
    for name in VARIANTS:
        for mode in W.MODES:
            for chunk in (None, TILE):
                for reduction in DISTRIBUTED_REDUCTIONS:
                    value, grads = _encoder_loss(model, name, data, reduction, chunk_size=chunk,
                                                 distributed=True, distributed_mode=mode)
                    results[(name, mode, chunk, reduction)] = (value, W._average(grads))
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return W.spawn(ranks_worker, 2, tmp_path_factory.mktemp("tiled_variants"), SEED, SIZES)


@pytest.mark.parametrize("reduction", DISTRIBUTED_REDUCTIONS)
@pytest.mark.parametrize("chunk", [None, TILE])
@pytest.mark.parametrize("mode", W.MODES)
@pytest.mark.parametrize("name", VARIANTS)
def test_two_processes_equal_one_on_the_global_batch(two_ranks, name, mode, chunk, reduction):
    """Gathered-dense (chunk None), gathered-tiled (global) and the ring form (local with
    tiles) against one process on the concatenated batch: values and parameter gradients,
    the learnable temperature included."""
    ref_value, ref_grads = _encoder_loss(W.Encoder(), name, W.concatenated(W.batches(SEED, SIZES)), reduction)
    values = torch.stack([r[(name, mode, chunk, reduction)][0] for r in two_ranks])
    combined = values.mean() if mode == "local" else values
    torch.testing.assert_close(combined, ref_value.expand_as(combined), rtol=1e-10, atol=1e-10)
    expected = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"} | (
        set() if name == "simple_loss" else {"temperature.log_scale"})
    assert set(ref_grads) == expected
    for r in two_ranks:
        grads = r[(name, mode, chunk, reduction)][1]
        assert set(grads) == expected
        for key, ref_grad in ref_grads.items():
            assert float(ref_grad.abs().max()) > 1e-6
            torch.testing.assert_close(grads[key], ref_grad, rtol=1e-10, atol=1e-10, msg=lambda m: f"{key}: {m}")


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize("method", ["hard_negative", "simple"])
def test_pretrain_with_a_large_batch_takes_the_tiled_path(tmp_path, monkeypatch, method, kernel_calls):
    """The methods leave the choice to the losses' automatic dispatch, as the other methods
    do: above DENSE_MAX_ENTRIES (lowered here, so that a tiny run counts as a large batch)
    they take the tiled path, and train as the dense path does."""
    from _tiny_run import tiny_config

    from contrastkit.train import pretrain

    dense = pretrain(tiny_config(tmp_path / "dense", method=method), progress=False)
    assert kernel_calls == []
    monkeypatch.setattr(tiled, "DENSE_MAX_ENTRIES", 0)
    spy = []
    if method == "simple":  # its tiled path needs no kernel: spy on the matrix-free losses
        from contrastkit.losses import variants

        real = variants._Simple.tiled_losses
        monkeypatch.setattr(variants._Simple, "tiled_losses", lambda *a: spy.append(1) or real(*a))
    tiled_run = pretrain(tiny_config(tmp_path / "tiled", method=method), progress=False)
    assert (kernel_calls if method == "hard_negative" else spy), "the tiled path was not taken"
    if method == "hard_negative":
        assert set(kernel_calls) == {"topk_logsumexp"}
    assert tiled_run["final_loss"] == pytest.approx(dense["final_loss"], rel=1e-4)
