"""Half precision and autocast: the log-sum-exp runs in float32, the loss stays finite and
within 1e-2 relative of float64 computed on the same (rounded) inputs, down to tau = 0.01."""

import pytest
import torch

from contrastkit import losses as L
from loss_catalog import CATALOG

N, D = 64, 32


def pair(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(N, D, generator=g)
    b = a + 0.3 * torch.randn(N, D, generator=g)  # correlated views: a realistic, low loss
    return a.to(dtype), b.to(dtype)


def inputs(case, dtype):
    return case.tensors(N, D, dtype=dtype, noise=0.3)  # correlated views: a realistic, low loss


# Every catalogued loss at each temperature; a loss whose temperatures are its own settings once.
TAUS = [1.0, 0.1, 0.02, 0.01]
HALF = [pytest.param(name, tau, id=f"{name}-{tau}") for name in sorted(CATALOG) for tau in TAUS
        if CATALOG[name].temperature == "learnable"] + [
    pytest.param(name, None, id=f"{name}-own") for name in sorted(CATALOG) if CATALOG[name].temperature != "learnable"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,tau", HALF)
def test_half_precision_matches_float64(name, dtype, tau):
    case = CATALOG[name]
    tensors = inputs(case, dtype)
    first = case.grads[0]
    leaves = [t.requires_grad_() if i == first else t for i, t in enumerate(tensors)]
    loss = case(leaves, tau)
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss)
    expected = case([t.detach().double() if t.is_floating_point() else t for t in tensors], tau)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-2, abs=1e-4)
    loss.backward()
    grad = leaves[first].grad
    assert grad.dtype == dtype and torch.isfinite(grad.float()).all()


@pytest.mark.parametrize("tau", [0.1, 0.01])
def test_autocast_region(tau):
    a, b = pair(torch.float32)
    linear = torch.nn.Linear(D, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        za, zb = linear(a), linear(b)
        assert za.dtype == torch.bfloat16
        loss = L.nt_xent_views(za, zb, temperature=tau)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    expected = L.nt_xent_views(za.detach().double(), zb.detach().double(), temperature=tau)
    # abs: at tau = 0.01 these views are almost perfectly separated (loss ~ 1e-11)
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-2, abs=1e-4)
    loss.backward()
    assert torch.isfinite(linear.weight.grad).all()


def test_float32_small_temperature_is_finite_where_naive_exp_overflows():
    # exp(1 / 0.005) overflows float32; the log-sum-exp form does not.
    assert not torch.isfinite(torch.exp(torch.tensor(1 / 0.005, dtype=torch.float32)))
    for name, case in CATALOG.items():
        assert torch.isfinite(case(inputs(case, torch.float32), 0.005)), name


# Small per-anchor losses in float32, dense and tiled: each loss against float64 on the same
# rounded inputs, next to F.cross_entropy on the same float32 logits. Near-duplicate views at
# tau = 0.05 give losses from about 2e-6 to 1e-3, where ``lse - l_pos`` rounds at the size of the
# logits (20) and log(1 + small) at 1.
SMALL = {
    "info_nce": (lambda q, p, t, r, c: L.info_nce(q, p, temperature=t, reduction=r, chunk_size=c),
                 lambda q, p, t: [(q @ p.T / t, torch.arange(q.shape[0]), 1.0)]),
    "info_nce[bank]": (lambda q, p, t, r, c: L.info_nce(q, p, p.flip(0)[: q.shape[0] // 2], temperature=t,
                                                       reduction=r, chunk_size=c),
                      lambda q, p, t: [(torch.cat([(q * p).sum(1, keepdim=True), q @ p.flip(0)[: q.shape[0] // 2].T],
                                                  dim=1) / t, torch.zeros(q.shape[0], dtype=torch.long), 1.0)]),
    "bidirectional_info_nce": (lambda q, p, t, r, c: L.bidirectional_info_nce(q, p, temperature=t, weight=0.75,
                                                                              reduction=r, chunk_size=c),
                      lambda q, p, t: [(q @ p.T / t, torch.arange(q.shape[0]), 0.75),
                                       (p @ q.T / t, torch.arange(q.shape[0]), 0.25)]),
    "nt_xent_views": (lambda q, p, t, r, c: L.nt_xent_views(q, p, temperature=t, reduction=r, chunk_size=c),
                      lambda q, p, t: [_views_logits(q, p, t) + (1.0,)]),
    "nt_xent": (lambda q, p, t, r, c: L.nt_xent(torch.cat([q, p]), L.views_positive_index(q.shape[0]), temperature=t,
                                                reduction=r, chunk_size=c),
                lambda q, p, t: [_views_logits(q, p, t) + (1.0,)]),
}
#: The catalog's losses not compared with F.cross_entropy here, and why.
NOT_SMALL = {
    "contrastive_loss": "takes the similarities, not embeddings: its F.cross_entropy logits are not written here",
    "similarity_loss": "takes the similarities, not embeddings: its F.cross_entropy logits are not written here",
    "info_nce[paired]": "one bank per query: its F.cross_entropy logits are not written here",
    "supcon": "several positives per anchor: not one cross-entropy",
    "supcon[in]": "several positives per anchor: not one cross-entropy",
    "dcl": "its positive is not in the denominator: not a cross-entropy",
    "simple_loss": "no softmax (no temperature)",
    "hard_negative_nt_xent": "a cross-entropy over the selected negatives only",
    "hard_negative_nt_xent[quantile]": "a cross-entropy over the selected negatives only",
    "debiased_nt_xent": "a debiased negative mass, not a cross-entropy",
    "hcl": "a reweighted debiased negative mass, not a cross-entropy",
    "sigmoid_loss": "pairwise sigmoids, not a softmax",
    "macl_nt_xent": "reweighted anchors at a temperature of its own",
    "dual_temperature_nt_xent": "reweighted anchors at temperatures of its own",
    "robust_nt_xent": "iSogCLR's objective, not a cross-entropy",
}


def _views_logits(q, p, t):
    z = torch.cat([q, p])
    logits = (z @ z.T / t).fill_diagonal_(float("-inf"))
    n = q.shape[0]
    return logits, torch.cat([torch.arange(n, 2 * n), torch.arange(n)])


ANCHORS = {name: CATALOG[name].anchors * N for name in SMALL}


def test_every_catalogued_loss_is_compared_or_said_why_not():
    assert set(SMALL) | set(NOT_SMALL) == set(CATALOG) and not set(SMALL) & set(NOT_SMALL)


@pytest.mark.parametrize("per_anchor", [False, True], ids=["one-tau", "tau-per-anchor"])
@pytest.mark.parametrize("chunk", [None, 16], ids=["dense", "tiled"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_float32_small_losses_keep_their_digits(name, chunk, per_anchor):
    given, logits_of = SMALL[name]

    def loss(q, p, t, r, c):  # the same 0.05 as one temperature, or as one per anchor
        return given(q, p, torch.full((ANCHORS[name],), t, dtype=q.dtype) if per_anchor else t, r, c)
    ours_worst = theirs_worst = 0.0
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        q = torch.nn.functional.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
        p = torch.nn.functional.normalize(q + 0.05 * torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
        q, p = q.float().double(), p.float().double()  # the float32 inputs, exactly
        reference = loss(q, p, 0.05, "none", None)
        assert float(reference.min()) < 1e-4  # the case this test is for
        ours = loss(q.float(), p.float(), 0.05, "none", chunk).double()
        theirs = sum(weight * torch.nn.functional.cross_entropy(logits, target, reduction="none").double()
                     for logits, target, weight in logits_of(q.float(), p.float(), 0.05))
        ours_worst = max(ours_worst, float(((ours - reference).abs() / reference).max()))
        theirs_worst = max(theirs_worst, float(((theirs - reference).abs() / reference).max()))
    # Measured: 5e-6 for contrastkit, 2e-2 to 5e-2 for F.cross_entropy (its log(1 + small)) and,
    # for the former lse - l_pos, 0.2 to 0.4 dense and up to 1.7 tiled
    # (benchmarks/results/float32_small_losses.md).
    assert ours_worst <= theirs_worst
    assert ours_worst < 1e-4


def test_float32_small_losses_keep_their_digits_in_the_ring(tmp_path):
    """The ring exchange (``distributed_mode="local"`` with tiles) on two processes: the same
    digits as one process, against float64 on the same rounded inputs."""
    import distributed_workers as W
    import precision_workers as P

    for rank, found in enumerate(W.spawn(P.ring_worker, 2, tmp_path, 32, D, 0.05)):
        for name, (reference, ours) in found.items():
            assert float(reference.min()) < 1e-4, (rank, name)  # the case this test is for
            assert float(((ours - reference).abs() / reference).max()) < 1e-4, (rank, name)
