"""contrastkit.compat.pml against the installed pytorch-metric-learning (the ``test`` and
``compat-test`` extras pin it): the same signatures and defaults; the same values and
gradients in float32 and float64 over labelled batches, ``ref_emb``, a miner's triplets and
hand-made pairs with repeats, a negative temperature included; the peer's zero losses; a
float64 loop written here from the formulas checks both; gradcheck, the temperature's
gradient included."""

import inspect
import math

import pytest
import torch

pml = pytest.importorskip("pytorch_metric_learning",
                          reason="pytorch-metric-learning is not installed (pip install 'contrastkit[compat-test]')")

from pytorch_metric_learning import losses as peer  # noqa: E402
from pytorch_metric_learning import miners  # noqa: E402

from contrastkit.compat import pml as compat  # noqa: E402

KINDS = ("NTXentLoss", "SupConLoss")


@pytest.mark.parametrize("kind", KINDS)
def test_the_signatures_and_defaults_are_the_peers(kind):
    ours, theirs = getattr(compat, kind), getattr(peer, kind)
    assert inspect.signature(ours.__init__).parameters["temperature"].default == \
        inspect.signature(theirs.__init__).parameters["temperature"].default
    assert list(inspect.signature(ours.forward).parameters) == list(inspect.signature(theirs.forward).parameters)


def _unit(x):
    return torch.nn.functional.normalize(x.double(), dim=1)


def _pairs(labels, ref_labels, same_set):
    positive = [(a, p) for a in range(len(labels)) for p in range(len(ref_labels))
                if labels[a] == ref_labels[p] and not (same_set and a == p)]
    negative = [(a, n) for a in range(len(labels)) for n in range(len(ref_labels)) if labels[a] != ref_labels[n]]
    return positive, negative


def _ntxent_reference(x, ref, positive, negative, tau):
    """Mean over the positive pairs of -log(e^{s_ap} / (e^{s_ap} + sum of the anchor's negatives))."""
    s = _unit(x) @ _unit(ref).T / tau
    losses = []
    for a, p in positive:
        others = [float(s[a, n]) for a2, n in negative if a2 == a]
        top = max([float(s[a, p])] + others)
        denominator = math.exp(float(s[a, p]) - top) + sum(math.exp(v - top) for v in others)
        losses.append(-(float(s[a, p]) - top - math.log(denominator)))
    return sum(losses) / len(losses)


def _supcon_reference(x, ref, positive, negative, tau):
    """Mean over the anchors with a loss above 0 of -mean over positives of log softmax over pos+neg."""
    s = _unit(x) @ _unit(ref).T / tau
    per_anchor = []
    for a in range(x.shape[0]):
        pos = sorted({p for a1, p in positive if a1 == a})
        everyone = sorted(set(pos) | {n for a2, n in negative if a2 == a})
        if not pos:
            continue
        lse = torch.logsumexp(s[a, everyone], 0)
        per_anchor.append(-float(sum(s[a, p] - lse for p in pos)) / len(pos))
    kept = [v for v in per_anchor if v > 0]
    return sum(kept) / len(kept)


def _batch(n, d, classes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(classes, (n,), generator=g)
    centres = torch.randn(classes, d, generator=g, dtype=dtype)
    return centres[labels] + 0.8 * torch.randn(n, d, generator=g, dtype=dtype), labels


def _both(kind, tau, x, **call):
    """The peer's and ours: (value, gradient with respect to the embeddings)."""
    results = []
    for module in (peer, compat):
        inputs = x.clone().requires_grad_()
        options = {key: (value.clone().requires_grad_() if key == "ref_emb" else value) for key, value in call.items()}
        loss = getattr(module, kind)(temperature=tau)(inputs, **options)
        loss.backward()
        results.append((loss.detach(), inputs.grad))
    return results


def _tolerance(dtype, tau):
    """Against the peer: the logits' rounding (|s / tau| up to 1 / 0.05 = 20) times a few ulps,
    and the peer's own loss of digits: it takes the log of a ratio near 1 (a pair's probability)
    where contrastkit takes a softplus, which costs it up to ~1e-10 relative in float64 on the
    small losses of tau = 0.05 (measured: 1.4e-11 absolute on a loss of 0.05)."""
    return 1e-9 if dtype == torch.float64 else 128 * torch.finfo(torch.float32).eps / min(abs(tau), 1.0)


# The largest batch is 100: the peer's NTXentLoss takes time of about N^4 with labels (0.3 s at
# N = 100, 5 s at 200, per call); 100 rows of 10 classes already give every anchor several
# positives, and contrastkit takes its dense path at 200 as at 100 (it tiles only above
# DENSE_MAX_ENTRIES).
CASES = [(n, d, classes, tau) for n, d, classes in ((6, 3, 2), (33, 16, 4), (100, 8, 10)) for tau in (0.05, 0.07, 0.5, -0.3)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n, d, classes, tau", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_labelled_batches_equal_the_peer(kind, n, d, classes, tau, dtype):
    x, labels = _batch(n, d, classes, dtype, seed=n + classes)
    (theirs, their_grad), (ours, our_grad) = _both(kind, tau, x, labels=labels)
    tolerance = _tolerance(dtype, tau)
    assert float(ours) == pytest.approx(float(theirs), rel=tolerance, abs=tolerance)
    assert torch.allclose(our_grad, their_grad, rtol=tolerance * 10, atol=tolerance * 10 / n)
    if n <= 33:  # the loop reference, float64: contrastkit agrees with it to float64 rounding
        positive, negative = _pairs(labels.tolist(), labels.tolist(), True)
        reference = (_ntxent_reference if kind == "NTXentLoss" else _supcon_reference)(x, x, positive, negative, tau)
        exact = 1e-12 / min(abs(tau), 1.0) if dtype == torch.float64 else tolerance
        assert float(ours) == pytest.approx(reference, rel=exact, abs=exact)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_embeddings_equal_the_peer(kind, dtype):
    x, labels = _batch(20, 8, 3, dtype, seed=1)
    ref, ref_labels = _batch(31, 8, 3, dtype, seed=2)
    (theirs, their_grad), (ours, our_grad) = _both(kind, 0.1, x, labels=labels, ref_emb=ref, ref_labels=ref_labels)
    tolerance = _tolerance(dtype, 0.1)
    assert float(ours) == pytest.approx(float(theirs), rel=tolerance)
    assert torch.allclose(our_grad, their_grad, rtol=tolerance * 10, atol=tolerance)
    positive, negative = _pairs(labels.tolist(), ref_labels.tolist(), False)
    reference = (_ntxent_reference if kind == "NTXentLoss" else _supcon_reference)(x, ref, positive, negative, 0.1)
    assert float(ours) == pytest.approx(reference, rel=tolerance)


@pytest.mark.parametrize("kind", KINDS)
def test_a_miners_triplets_and_pairs_with_repeats_equal_the_peer(kind):
    x, labels = _batch(40, 8, 4, torch.float64, seed=3)
    triplets = miners.TripletMarginMiner(margin=0.5, type_of_triplets="all")(x, labels)
    assert len(triplets[0]) > 10
    (theirs, their_grad), (ours, our_grad) = _both(kind, 0.2, x, labels=labels, indices_tuple=triplets)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-11)
    assert torch.allclose(our_grad, their_grad, rtol=1e-9, atol=1e-12)
    # Pairs given by hand, one positive pair twice and a negative pair three times.
    pairs = (torch.tensor([0, 0, 0, 5]), torch.tensor([1, 1, 2, 6]), torch.tensor([0, 0, 0, 5, 7]),
             torch.tensor([9, 9, 9, 8, 3]))
    same = [(int(a), int(p)) for a, p in zip(pairs[0], pairs[1])]
    other = [(int(a), int(n)) for a, n in zip(pairs[2], pairs[3])]
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 5] + [6] * 30)  # consistent with the pairs above
    (theirs, their_grad), (ours, our_grad) = _both(kind, 0.2, x, labels=labels, indices_tuple=pairs)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-11)
    assert torch.allclose(our_grad, their_grad, rtol=1e-9, atol=1e-12)
    if kind == "NTXentLoss":  # repeats count in the peer's pair loss
        assert float(ours) == pytest.approx(_ntxent_reference(x, x, same, other, 0.2), rel=1e-11)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("call", [{"labels": [3, 3, 3, 3]}, {"labels": [0, 1, 2, 3]},
                                  {"labels": [0, 0, 1], "indices_tuple": ([0], [1], [0], [2])}],
                         ids=["no-negative", "no-positive", "one-pair-of-each"])
def test_the_peers_zero_losses_are_kept(kind, call):
    x = torch.randn(len(call["labels"]), 5, dtype=torch.float64)
    call = {key: torch.tensor(value) if key == "labels" else tuple(torch.tensor(v) for v in value)
            for key, value in call.items()}
    (theirs, their_grad), (ours, our_grad) = _both(kind, 0.1, x, **call)
    assert float(theirs) == 0.0 and float(ours) == 0.0
    assert torch.equal(our_grad, torch.zeros_like(x)) and torch.equal(their_grad, torch.zeros_like(x))


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_with_the_temperature(kind):
    x, labels = _batch(9, 4, 3, torch.float64, seed=5)
    ref, ref_labels = _batch(7, 4, 3, torch.float64, seed=6)
    for call in ({"labels": labels}, {"labels": labels, "ref_emb": ref, "ref_labels": ref_labels}):
        def loss(inputs, tau):
            module = getattr(compat, kind)(temperature=tau)
            return module(inputs, **call)

        inputs = x.clone().requires_grad_()
        tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(loss, (inputs, tau))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="temperature must be a finite number other than 0"):
        compat.NTXentLoss(temperature=0.0)
    with pytest.raises(TypeError, match="reducer of pytorch-metric-learning are not offered"):
        compat.SupConLoss(reducer=object())
    x = torch.randn(4, 3)
    x[1] = 0
    with pytest.raises(ValueError, match="embeddings has a zero-norm row"):
        compat.NTXentLoss()(x, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="labels .* are required without indices_tuple"):
        compat.SupConLoss()(torch.randn(4, 3))


@pytest.mark.parametrize("tau", [0.05, -0.3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_tiled_ntxent_equals_the_peer(tau, dtype, monkeypatch):
    """The memory-linear form (contrastkit's tiles, here of 7 rows so that a batch of 40 has
    many): the peer's values and gradients, with ``ref_emb`` too."""
    monkeypatch.setattr(compat, "_tiles", lambda rows, columns, dtype: 7)
    x, labels = _batch(40, 8, 4, dtype, seed=11)
    ref, ref_labels = _batch(23, 8, 4, dtype, seed=12)
    tolerance = _tolerance(dtype, tau)
    for call in ({"labels": labels}, {"labels": labels, "ref_emb": ref, "ref_labels": ref_labels}):
        (theirs, their_grad), (ours, our_grad) = _both("NTXentLoss", tau, x, **call)
        assert float(ours) == pytest.approx(float(theirs), rel=tolerance, abs=tolerance)
        assert torch.allclose(our_grad, their_grad, rtol=tolerance * 10, atol=tolerance * 10 / 40)


def test_the_tiled_ntxent_gradcheck_with_the_temperature(monkeypatch):
    monkeypatch.setattr(compat, "_tiles", lambda rows, columns, dtype: 4)
    x, labels = _batch(9, 4, 3, torch.float64, seed=5)
    inputs = x.clone().requires_grad_()
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, t: compat.NTXentLoss(temperature=t)(z, labels), (inputs, tau))


def test_a_labelled_batch_above_the_dense_size_runs_in_tiles(monkeypatch):
    """N = 1,100 (1.2 million pairs, above contrastkit's dense size; the peer would build a
    1,100 x 1.2 million matrix): the tiles are taken, and give the dense form's numbers (which
    the tests above hold to the peer's)."""
    x, labels = _batch(1100, 16, 5, torch.float64, seed=13)
    calls = []
    kernel = compat.losses.tiled.pair_softplus_sum
    monkeypatch.setattr(compat.losses.tiled, "pair_softplus_sum", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    tiled_input = x.clone().requires_grad_()
    tiled_loss = compat.NTXentLoss(temperature=0.1)(tiled_input, labels)
    tiled_loss.backward()
    assert calls == [1]
    monkeypatch.setattr(compat, "_tiles", lambda rows, columns, dtype: None)
    dense_input = x.clone().requires_grad_()
    dense_loss = compat.NTXentLoss(temperature=0.1)(dense_input, labels)
    dense_loss.backward()
    assert calls == [1]
    assert float(tiled_loss) == pytest.approx(float(dense_loss), rel=1e-12)
    assert torch.allclose(tiled_input.grad, dense_input.grad, rtol=1e-9, atol=1e-15)
