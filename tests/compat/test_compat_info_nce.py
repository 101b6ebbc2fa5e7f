"""contrastkit.compat.info_nce against the installed info-nce-pytorch (the ``test`` and
``compat-test`` extras pin it): the same signatures and defaults, the same values and gradients
in float32 and float64 for every negative mode and reduction, a negative temperature included,
on batches the tiled path computes too; a float64 reference written here from the paper's
formula checks both."""

import inspect

import pytest
import torch

peer = pytest.importorskip("info_nce", reason="info-nce-pytorch is not installed (pip install 'contrastkit[compat-test]')")

from contrastkit.compat import info_nce as compat  # noqa: E402


def test_the_signatures_and_defaults_are_the_peers():
    assert inspect.signature(compat.InfoNCE.__init__) .parameters.keys() == \
        inspect.signature(peer.InfoNCE.__init__).parameters.keys()
    for name, parameter in inspect.signature(peer.InfoNCE.__init__).parameters.items():
        assert inspect.signature(compat.InfoNCE.__init__).parameters[name].default == parameter.default, name
    assert list(inspect.signature(compat.InfoNCE.forward).parameters) == list(inspect.signature(peer.InfoNCE.forward).parameters)
    ours, theirs = inspect.signature(compat.info_nce).parameters, inspect.signature(peer.info_nce).parameters
    assert list(ours) == list(theirs) and all(ours[n].default == theirs[n].default for n in theirs)


def _reference(query, positive, negatives, temperature, mode):
    """Per-query -log softmax of the positive among the candidates (float64, a loop per query)."""
    q = torch.nn.functional.normalize(query.double(), dim=-1)
    p = torch.nn.functional.normalize(positive.double(), dim=-1)
    losses = []
    for i in range(q.shape[0]):
        if negatives is None:
            candidates, target = p, i
        else:
            n = torch.nn.functional.normalize(negatives.double(), dim=-1)
            others = n[i] if mode == "paired" else n
            candidates, target = torch.cat([p[i:i + 1], others]), 0
        logits = candidates @ q[i] / temperature
        losses.append(torch.logsumexp(logits, 0) - logits[target])
    return torch.stack(losses)


CASES = [(n, d, tau, mode, with_negatives) for n, d in ((4, 3), (33, 16), (600, 8)) for tau in (0.05, 0.1, 1.0, -0.5)
         for mode, with_negatives in (("unpaired", False), ("unpaired", True), ("paired", True))]


@pytest.mark.parametrize("n, d, tau, mode, with_negatives", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients_equal_the_peers(n, d, tau, mode, with_negatives, dtype):
    g = torch.Generator().manual_seed(n * 31 + d)
    query = torch.randn(n, d, generator=g, dtype=dtype)
    positive = query + 0.5 * torch.randn(n, d, generator=g, dtype=dtype)
    shape = (n, 5, d) if mode == "paired" else (7, d)
    negatives = torch.randn(*shape, generator=g, dtype=dtype) if with_negatives else None
    expected = _reference(query, positive, negatives, tau, mode)
    # float32: the logits' rounding (|s / tau| up to 20 at tau = 0.05) times a few ulps.
    tolerance = 1e-12 if dtype == torch.float64 else 64 * torch.finfo(torch.float32).eps / min(abs(tau), 1.0)
    for reduction in ("none", "mean", "sum"):
        inputs = [t.clone().requires_grad_() if t is not None else None for t in (query, positive, negatives)]
        peers = [t.clone().requires_grad_() if t is not None else None for t in (query, positive, negatives)]
        ours = compat.InfoNCE(temperature=tau, reduction=reduction, negative_mode=mode)(*inputs)
        theirs = peer.InfoNCE(temperature=tau, reduction=reduction, negative_mode=mode)(*peers)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        reduced = {"none": expected, "mean": expected.mean(), "sum": expected.sum()}[reduction]
        scale = 1.0 if reduction != "sum" else n
        assert torch.allclose(ours.double(), reduced, rtol=tolerance, atol=tolerance * scale), reduction
        assert torch.allclose(ours, theirs, rtol=2 * tolerance, atol=2 * tolerance * scale), reduction
        ours.sum().backward()
        theirs.sum().backward()
        for mine, other in zip(inputs, peers):
            if mine is not None:
                assert torch.allclose(mine.grad, other.grad, rtol=4 * tolerance, atol=4 * tolerance * scale), reduction


def test_the_tiled_path_gives_the_peers_loss_on_a_batch_it_tiles():
    g = torch.Generator().manual_seed(5)
    query, positive = torch.randn(2048, 32, generator=g), torch.randn(2048, 32, generator=g)
    ours = compat.info_nce(query, positive, temperature=0.07)
    assert torch.allclose(ours, peer.info_nce(query, positive, temperature=0.07), rtol=1e-5)


@pytest.mark.parametrize("temperature", [0, 0.0, float("nan"), float("inf"), "0.1"])
def test_a_temperature_the_peer_turns_into_nan_is_refused_by_name(temperature):
    query = torch.randn(4, 3)
    with pytest.raises(ValueError, match="temperature"):
        compat.InfoNCE(temperature=temperature)(query, query)


def test_a_zero_or_non_finite_row_is_refused_by_name_where_the_peer_gives_a_number_or_nan():
    query, positive = torch.randn(4, 3), torch.randn(4, 3)
    query[1] = 0
    assert torch.isfinite(peer.InfoNCE()(query, positive))  # the peer compares a zero vector
    with pytest.raises(ValueError, match="query has 1 zero-norm row"):
        compat.InfoNCE()(query, positive)
    query[1, 0] = float("nan")
    assert torch.isnan(peer.InfoNCE()(query, positive))
    with pytest.raises(ValueError, match="query contains 1 NaN"):
        compat.InfoNCE()(query, positive)
