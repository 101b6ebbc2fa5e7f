"""contrastkit.compat.lightly against the installed lightly (the ``test`` and ``compat-test``
extras pin it): the same signatures and defaults; the same values and gradients in float32 and
float64 for NT-Xent, DCL and DCL-W over several B, D and temperatures, a negative temperature
included; the memory bank drawn, used and updated as the peer's over several steps; the
options under two processes; a float64 loop written here from the formulas checks both;
gradcheck; and a SimCLR training step run unchanged with the import swapped."""

import inspect
import math

import pytest
import torch

lightly = pytest.importorskip("lightly", reason="lightly is not installed (pip install 'contrastkit[compat-test]')")

from lightly import loss as peer  # noqa: E402

from contrastkit.compat import lightly as compat  # noqa: E402

KINDS = ("NTXentLoss", "DCLLoss", "DCLWLoss")


@pytest.mark.parametrize("kind", KINDS)
def test_the_signatures_and_defaults_are_the_peers(kind):
    ours, theirs = getattr(compat, kind), getattr(peer, kind)
    assert inspect.signature(ours.__init__).parameters.keys() == inspect.signature(theirs.__init__).parameters.keys()
    for name, parameter in inspect.signature(theirs.__init__).parameters.items():
        assert inspect.signature(ours.__init__).parameters[name].default == parameter.default, name
    assert list(inspect.signature(ours.forward).parameters) == list(inspect.signature(theirs.forward).parameters)


def _views(b, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    out0 = torch.randn(b, d, generator=g, dtype=dtype)
    return out0, out0 + 0.7 * torch.randn(b, d, generator=g, dtype=dtype)


def _both(kind, options, out0, out1):
    """The peer's and ours: (value, gradient of out0, gradient of out1)."""
    results = []
    for module in (peer, compat):
        a, b = out0.clone().requires_grad_(), out1.clone().requires_grad_()
        loss = getattr(module, kind)(**options)(a, b)
        loss.backward()
        results.append((loss.detach(), a.grad, b.grad))
    return results


def _reference(out0, out1, tau, decoupled, weights=None):
    """float64 loop: the mean over the 2B anchors of w * (-s_pos / tau) + log sum over the
    candidates (the anchor left out; its positive too where ``decoupled``) of exp(s / tau)."""
    z = torch.nn.functional.normalize(torch.cat([out0, out1]).double(), dim=1)
    b = out0.shape[0]
    total = 0.0
    for i in range(2 * b):
        p = (i + b) % (2 * b)
        others = [float(z[i] @ z[j]) / tau for j in range(2 * b) if j != i and not (decoupled and j == p)]
        top = max(others)
        w = 1.0 if weights is None else float(weights[i % b])
        total += -w * float(z[i] @ z[p]) / tau + top + math.log(sum(math.exp(v - top) for v in others))
    return total / (2 * b)


def _tolerance(dtype, tau):
    """The logits' rounding (|s / tau| up to 1 / 0.05 = 20) times a few ulps of the dtype."""
    eps = torch.finfo(dtype).eps
    return 64 * eps / min(abs(tau), 1.0)


CASES = [(b, d, tau) for b, d in ((2, 3), (17, 8), (128, 32)) for tau in (0.05, 0.1, 0.5, -0.3)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b, d, tau", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_gradients_equal_the_peer(kind, b, d, tau, dtype):
    out0, out1 = _views(b, d, dtype, seed=b + d)
    (theirs, their0, their1), (ours, our0, our1) = _both(kind, {"temperature": tau}, out0, out1)
    tolerance = _tolerance(dtype, tau)
    assert float(ours) == pytest.approx(float(theirs), rel=tolerance, abs=tolerance)
    for mine, peers in ((our0, their0), (our1, their1)):
        assert torch.allclose(mine, peers, rtol=10 * tolerance, atol=10 * tolerance / b)
    if b <= 17:
        weights = None
        if kind == "DCLWLoss":
            weights = compat.negative_mises_fisher_weights(*(torch.nn.functional.normalize(x.double(), dim=1)
                                                             for x in (out0, out1)))
        exact = 1e-12 / min(abs(tau), 1.0) if dtype == torch.float64 else tolerance
        assert float(ours) == pytest.approx(_reference(out0, out1, tau, kind != "NTXentLoss", weights),
                                            rel=exact, abs=exact)


def test_a_weight_function_of_the_users_equals_the_peer():
    out0, out1 = _views(9, 5, torch.float64, seed=4)
    options = {"temperature": 0.2, "weight_fn": lambda a, b: torch.sum((a - b) ** 2, dim=1)}
    (theirs, their0, their1), (ours, our0, our1) = _both("DCLLoss", options, out0, out1)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-12)
    assert torch.allclose(our0, their0, rtol=1e-10, atol=1e-13) and torch.allclose(our1, their1, rtol=1e-10, atol=1e-13)


def test_large_batches_take_the_tiled_path_and_equal_the_peer():
    """B = 2,048: 4,096 anchors, beyond the dense path's size; the same values and gradients."""
    out0, out1 = _views(2048, 16, torch.float64, seed=8)
    for kind in ("NTXentLoss", "DCLLoss"):
        (theirs, their0, _), (ours, our0, _) = _both(kind, {"temperature": 0.1}, out0, out1)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-11)
        assert torch.allclose(our0, their0, rtol=1e-8, atol=1e-14)


def test_the_memory_bank_is_the_peers_over_several_steps():
    """The same draw from the same seed, the same loss and gradients each step, the same ring
    (a batch that reaches the end is cut, the pointer restarts) and no update without a gradient."""
    modules = []
    for module in (peer, compat):
        torch.manual_seed(3)
        modules.append(getattr(module, "NTXentLoss")(temperature=0.2, memory_bank_size=(20, 6)))
    assert torch.equal(modules[0].memory_bank.bank, modules[1].bank)
    for step, b in enumerate((8, 8, 7, 8, 3)):
        out0, out1 = _views(b, 6, torch.float32, seed=step)
        found = []
        for criterion in modules:
            a, p = out0.clone().requires_grad_(step != 3), out1.clone()
            loss = criterion(a, p)
            if step != 3:
                loss.backward()
            found.append((loss.detach(), a.grad))
        assert float(found[1][0]) == pytest.approx(float(found[0][0]), rel=1e-5)
        if step != 3:
            assert torch.allclose(found[1][1], found[0][1], rtol=1e-4, atol=1e-6)
        assert torch.allclose(modules[1].bank, modules[0].memory_bank.bank, atol=1e-7)
        assert int(modules[1].bank_ptr) == int(modules[0].memory_bank.bank_ptr)
    assert int(modules[1].bank_ptr) != 0  # the ring went round and on


def test_the_memory_bank_in_float64_and_with_a_negative_temperature():
    """float64 views: the bank is used in their dtype (the peer's float32 bank fails there)."""
    torch.manual_seed(0)
    ours = compat.NTXentLoss(temperature=0.3, memory_bank_size=(10, 4))
    out0, out1 = _views(5, 4, torch.float64, seed=1)
    z0, z1 = (torch.nn.functional.normalize(x, dim=1) for x in (out0, out1))
    bank = ours.bank.double()
    for tau in (0.3, -0.3):
        ours.temperature = tau
        logits = torch.cat([(z0 * z1).sum(1, keepdim=True), z0 @ bank.T], dim=1) / tau
        expected = torch.nn.functional.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
        assert float(ours(out0, out1)) == pytest.approx(float(expected), rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck(kind):
    """DCL-W's weight carries no gradient (the peer detaches it): its weighted path is checked
    with weights that do not depend on the inputs."""
    out0, out1 = _views(5, 3, torch.float64, seed=2)
    weights = torch.tensor([0.5, 1.5, 2.0, -0.5, 1.0], dtype=torch.float64)
    for tau in (0.3, -0.3):
        criterion = compat.DCLLoss(temperature=tau, weight_fn=lambda a, b: weights) if kind == "DCLWLoss" \
            else getattr(compat, kind)(temperature=tau)
        assert torch.autograd.gradcheck(criterion, (out0.clone().requires_grad_(), out1.clone().requires_grad_()))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="temperature must be a finite number of magnitude at least 1e-8"):
        compat.NTXentLoss(temperature=1e-9)
    with pytest.raises(ValueError, match="does not give \\(num_features, dim\\)"):
        compat.NTXentLoss(memory_bank_size=4096)
    with pytest.raises(ValueError, match="memory_bank_size must be 0 or"):
        compat.NTXentLoss(memory_bank_size=(-1, 3))
    out0, out1 = _views(4, 3, torch.float32, seed=0)
    out0[1, 2] = float("nan")
    with pytest.raises(ValueError, match="out0 has non-finite entries"):
        compat.DCLLoss()(out0, out1)
    with pytest.raises(ValueError, match="the same shape"):
        compat.NTXentLoss()(out1, out1[:3])
    with pytest.raises(ValueError, match="one weight per row"):
        compat.DCLLoss(weight_fn=lambda a, b: torch.ones(7))(out1, out1 + 1)


def test_gathered_options_under_two_processes_equal_the_peer(tmp_path):
    import distributed_workers as W
    import lightly_compat_workers as L

    b, d = 6, 5
    results = W.spawn(L.compare_worker, 2, tmp_path, 11, b, d)
    for rank, found in enumerate(results):
        their_losses, our_losses, their_bank, our_bank = found.pop("bank")
        # float32 inputs: three steps' losses and the bank they leave (both ranks' keys in it)
        assert torch.allclose(our_losses, their_losses, rtol=1e-5), rank
        assert torch.allclose(our_bank, their_bank, atol=1e-7), rank
        for kind, (theirs, ours, their0, their1, our0, our1) in found.items():
            assert float(ours) == pytest.approx(float(theirs), rel=1e-12), (rank, kind)
            assert torch.allclose(our0, their0, rtol=1e-9, atol=1e-13), (rank, kind)
            assert torch.allclose(our1, their1, rtol=1e-9, atol=1e-13), (rank, kind)
    # Both ranks' views reached each rank: the gathered loss differs from a rank's own.
    assert float(results[0]["NTXentLoss"][1]) != float(results[1]["NTXentLoss"][1])


def test_a_simclr_training_step_runs_unchanged_with_the_import_swapped():
    """The training step of lightly's SimCLR example (a backbone, lightly's projection head,
    NTXentLoss, SGD), once with the peer's loss and once with ours from the same start: the
    same weights after three steps."""
    from lightly.models.modules import SimCLRProjectionHead

    def train(loss_class):
        torch.manual_seed(0)
        backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 32), torch.nn.ReLU())
        model = torch.nn.Sequential(backbone, SimCLRProjectionHead(32, 32, 16))
        criterion = loss_class(temperature=0.5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.06)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            images = torch.rand(16, 3, 8, 8, generator=g)
            x0, x1 = images + 0.1 * torch.randn(images.shape, generator=g), images.flip(-1)
            loss = criterion(model(x0), model(x1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()], float(loss)

    theirs, their_loss = train(peer.NTXentLoss)
    ours, our_loss = train(compat.NTXentLoss)
    assert our_loss == pytest.approx(their_loss, rel=1e-5)
    for mine, peers in zip(ours, theirs):
        assert torch.allclose(mine, peers, rtol=1e-4, atol=1e-6)
    assert not torch.equal(ours[1], train(compat.DCLLoss)[0][1])  # the step does depend on the loss
