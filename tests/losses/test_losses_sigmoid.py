"""The sigmoid (SigLIP) loss: loop reference, gradcheck, tiled = dense, ring = one process,
half precision, bad input, memory, and the module twin.

The dense path is ordinary autograd on the ``N x N`` logits; the tiled and ring paths are
custom autograd functions that recompute their tiles in the backward pass. They share only
input validation, so their agreement (losses and every gradient, to 1e-10 in float64) checks
the hand-written backward; the loop reference below shares no code with either.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import distributed_sigmoid_workers as SW
import distributed_workers as W
from contrastkit.losses import SigmoidLoss, Temperature, sigmoid_loss
from contrastkit.losses import sigmoid as S
from contrastkit.losses import tiled

TOL = dict(rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- loop reference


def reference_row_losses(image, text, tau: float, bias: float, normalize: bool = True):
    """``loss_i = sum_j -log sigmoid(z_ij (s_ij / tau + b))`` with plain floats and ``math``."""

    def rows(x):
        out = [[float(v) for v in row] for row in x.tolist()]
        if normalize:
            out = [[v / math.sqrt(sum(w * w for w in row)) for v in row] for row in out]
        return out

    def minus_log_sigmoid(m: float) -> float:  # log(1 + e^-m), stable for either sign of m
        return max(-m, 0.0) + math.log1p(math.exp(-abs(m)))

    xs, ys = rows(image), rows(text)
    losses = []
    for i, x in enumerate(xs):
        total = 0.0
        for j, y in enumerate(ys):
            logit = sum(a * b for a, b in zip(x, y)) / tau + bias
            total += minus_log_sigmoid(logit if i == j else -logit)
        losses.append(total)
    return losses


def pair(n: int, d: int, dtype=torch.float64, seed: int = 0, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(n, d, generator=g, dtype=dtype) * scale
    text = image + 0.5 * torch.randn(n, d, generator=g, dtype=dtype) * scale
    return image.requires_grad_(), text.requires_grad_()


def scalar(value: float, dtype=torch.float64):
    return torch.tensor(value, dtype=dtype, requires_grad=True)


def test_reference_worked_example():
    # Two orthogonal pairs, tau = 1, b = 0: each row has log(1 + e^-1) + log 2.
    x = torch.eye(2, dtype=torch.float64)
    expected = math.log1p(math.exp(-1.0)) + math.log(2.0)
    assert reference_row_losses(x, x, 1.0, 0.0) == pytest.approx([expected, expected], rel=1e-15)
    assert float(sigmoid_loss(x, x, 1.0, 0.0)) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("chunk", [None, 1, 3, 7])
@pytest.mark.parametrize("n, d, tau, bias, normalize", [
    (1, 3, 0.1, -10.0, True), (2, 2, 1.0, 0.0, True), (7, 4, 0.1, -10.0, True), (9, 5, 0.05, 3.0, True),
    (6, 3, 0.5, -1.0, False), (8, 6, 0.01, -10.0, True),
])
def test_matches_loop_reference(n, d, tau, bias, normalize, chunk):
    image, text = pair(n, d, seed=n)
    expected = torch.tensor(reference_row_losses(image, text, tau, bias, normalize), dtype=torch.float64)
    options = dict(normalize=normalize, chunk_size=chunk)
    per_image = sigmoid_loss(image, text, tau, bias, reduction="none", **options)
    torch.testing.assert_close(per_image, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sigmoid_loss(image, text, tau, bias, **options), expected.mean(), rtol=1e-12, atol=0)
    torch.testing.assert_close(sigmoid_loss(image, text, tau, bias, reduction="sum", **options), expected.sum(),
                               rtol=1e-12, atol=0)


def test_mean_divides_by_the_number_of_pairs():
    # The paper's -(1/N) sum_ij: divided by N pairs, not by the N^2 terms of the double sum.
    image, text = pair(5, 3)
    rows = reference_row_losses(image, text, 0.1, -10.0)
    assert float(sigmoid_loss(image, text).detach()) == pytest.approx(sum(rows) / 5, rel=1e-12)


def test_default_temperature_and_bias_are_siglips_initialisation():
    image, text = pair(6, 4)
    torch.testing.assert_close(sigmoid_loss(image, text), sigmoid_loss(image, text, 0.1, -10.0), **TOL)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("chunk", [None, 2, 3])
def test_gradcheck_with_temperature_and_bias(chunk):
    image, text = pair(5, 3)
    inputs = (image, text, scalar(0.4), scalar(-1.0))
    assert torch.autograd.gradcheck(lambda x, y, t, b: sigmoid_loss(x, y, t, b, chunk_size=chunk), inputs)
    weights = torch.linspace(0.5, 1.5, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, y, t, b: sigmoid_loss(x, y, t, b, chunk_size=chunk, reduction="none") @ weights, inputs)


def test_gradcheck_tiled_kernel_directly():
    a, b = pair(7, 3, seed=3)
    assert torch.autograd.gradcheck(lambda x, y, c: S._SigmoidTiles.apply(x, y, c, 3, None, (7,)), (a, b, scalar(-0.5)))


def loss_and_grads(inputs, reduction="none", **options):
    for x in inputs:
        x.grad = None
    losses = sigmoid_loss(*inputs, reduction=reduction, **options)
    # A non-uniform upstream gradient checks the per-row weighting of the backward pass.
    weights = torch.linspace(0.5, 1.5, losses.shape[0], dtype=losses.dtype)
    (losses * weights).sum().backward()
    return [losses.detach()] + [x.grad.clone() for x in inputs]


@pytest.mark.parametrize("n, chunk", [(1, 1), (2, 1), (5, 2), (13, 4), (13, 5), (13, 12), (13, 13), (13, 40),
                                      (40, 7), (64, 16)])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_tiled_matches_dense(n, chunk, dtype, rtol):
    image, text = pair(n, 6, dtype=dtype, seed=n)
    inputs = [image, text, scalar(0.07, dtype), scalar(-4.0, dtype)]
    dense = loss_and_grads(inputs, chunk_size=None)
    tiled_ = loss_and_grads(inputs, chunk_size=chunk)
    for name, d, t in zip(("losses", "image", "text", "temperature", "bias"), dense, tiled_):
        assert d.dtype == t.dtype and d.shape == t.shape
        assert float(d.abs().max()) > 0
        torch.testing.assert_close(t, d, rtol=rtol, atol=rtol * float(d.abs().max()), msg=lambda m: f"{name}: {m}")


def test_tiled_without_normalisation_and_frozen_inputs():
    image, text = pair(11, 4, scale=0.7)
    text = text.detach()
    for chunk in (None, 4):
        image.grad = None
        loss = sigmoid_loss(image, text, 0.5, 1.0, normalize=False, chunk_size=chunk)
        loss.backward()
        if chunk is None:
            dense_loss, dense_grad = loss.detach(), image.grad.clone()
    torch.testing.assert_close(loss.detach(), dense_loss, **TOL)
    torch.testing.assert_close(image.grad, dense_grad, **TOL)


def test_temperature_module_and_tensor_agree():
    image, text = pair(6, 4)
    module = Temperature(0.2, learnable=True).double()
    for chunk in (None, 4):
        module.zero_grad()
        sigmoid_loss(image, text, module, -2.0, chunk_size=chunk).backward()
        tau = module().detach().requires_grad_()
        sigmoid_loss(image, text, tau, -2.0, chunk_size=chunk).backward()
        # d/d log_scale = d/d tau * d tau / d log_scale = -tau * d/d tau
        torch.testing.assert_close(module.log_scale.grad, -tau.detach() * tau.grad, **TOL)


def test_automatic_dispatch(monkeypatch):
    used = []
    apply = S._SigmoidTiles.apply
    monkeypatch.setattr(S._SigmoidTiles, "apply", lambda *a: used.append(a[3]) or apply(*a))
    image, text = pair(40, 8)
    dense = sigmoid_loss(image, text)
    assert used == []
    monkeypatch.setattr(tiled, "DENSE_MAX_ENTRIES", 40 * 40 - 1)
    torch.testing.assert_close(sigmoid_loss(image, text), dense, **TOL)
    assert used == [tiled.DEFAULT_CHUNK_SIZE]
    monkeypatch.setattr(tiled, "DENSE_MAX_ENTRIES", 40 * 40)
    sigmoid_loss(image, text)
    assert used == [tiled.DEFAULT_CHUNK_SIZE]


def test_double_backward_is_refused_on_the_tiled_path():
    image, text = pair(6, 3)
    loss = sigmoid_loss(image, text, chunk_size=4)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, image, create_graph=True)


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("chunk", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_finite_and_accurate(dtype, chunk):
    image, text = pair(48, 32, seed=5)
    exact = sigmoid_loss(image, text, 0.1, -10.0).detach()
    low_image, low_text = image.detach().to(dtype).requires_grad_(), text.detach().to(dtype).requires_grad_()
    loss = sigmoid_loss(low_image, low_text, 0.1, -10.0, chunk_size=chunk)
    assert loss.dtype == torch.float32
    loss.backward()
    assert low_image.grad.dtype == dtype and torch.isfinite(low_image.grad).all() and torch.isfinite(low_text.grad).all()
    assert abs(float(loss.detach()) - float(exact)) <= 1e-2 * abs(float(exact))


@pytest.mark.parametrize("chunk", [None, 16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_finite_at_temperature_0_01(dtype, chunk):
    # Logits up to |1 / 0.01 + b| = 110: exp would overflow in half precision, logsigmoid does not.
    image, text = pair(48, 32, seed=6)
    exact = sigmoid_loss(image, text, 0.01, -10.0).detach()
    low_image = image.detach().to(dtype).requires_grad_()
    tau, bias = scalar(0.01, torch.float32), scalar(-10.0, torch.float32)
    loss = sigmoid_loss(low_image, text.detach().to(dtype), tau, bias, chunk_size=chunk)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(low_image.grad).all()
    assert torch.isfinite(tau.grad) and torch.isfinite(bias.grad)
    assert abs(float(loss.detach()) - float(exact)) <= 1e-2 * abs(float(exact))


def test_extreme_logits_stay_finite_and_exact():
    # Unnormalised rows of norm ~100: logits ~1e4, where a naive log(sigmoid(x)) gives -inf.
    image, text = pair(6, 4, dtype=torch.float32, scale=50.0)
    expected = sum(reference_row_losses(image, text, 1.0, 0.0, normalize=False)) / 6
    for chunk in (None, 4):
        loss = sigmoid_loss(image, text, 1.0, 0.0, normalize=False, chunk_size=chunk)
        assert torch.isfinite(loss)
        assert float(loss.detach()) == pytest.approx(expected, rel=1e-4)


def test_autocast_does_not_lower_the_precision():
    image, text = pair(20, 8, dtype=torch.float32)
    outside = [sigmoid_loss(image, text, 0.1, -10.0, chunk_size=c) for c in (None, 6)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = [sigmoid_loss(image, text, 0.1, -10.0, chunk_size=c) for c in (None, 6)]
    for a, b in zip(inside, outside):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------- bad input


def _good():
    return torch.randn(4, 3), torch.randn(4, 3)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, y: sigmoid_loss(x, y[:3]), ValueError, "text has shape"),
    (lambda x, y: sigmoid_loss(x, y[:, :2]), ValueError, "text has shape"),
    (lambda x, y: sigmoid_loss(x[:0], y[:0]), ValueError, "image is empty"),
    (lambda x, y: sigmoid_loss(x[0], y[0]), ValueError, "image must have 2 dimensions"),
    (lambda x, y: sigmoid_loss(x.tolist(), y), TypeError, "image must be a torch.Tensor"),
    (lambda x, y: sigmoid_loss(x, y.long()), TypeError, "text must have a floating dtype"),
    (lambda x, y: sigmoid_loss(x, y.double()), TypeError, "text has dtype"),
    (lambda x, y: sigmoid_loss(x, y.index_fill(0, torch.tensor([1]), float("nan"))), ValueError,
     "text contains 3 NaN"),
    (lambda x, y: sigmoid_loss(x, y, 0.0), ValueError, "temperature must be positive"),
    (lambda x, y: sigmoid_loss(x, y, -0.1), ValueError, "temperature must be positive"),
    (lambda x, y: sigmoid_loss(x, y, float("inf")), ValueError, "temperature must be positive and finite"),
    (lambda x, y: sigmoid_loss(x, y, torch.tensor([0.1, 0.2])), ValueError, "temperature has 2 values but the loss has"),
    (lambda x, y: sigmoid_loss(x, y, torch.ones(3, 1)), ValueError, "one value per anchor row"),
    (lambda x, y: sigmoid_loss(x, y, "0.1"), TypeError, "temperature must be a number"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, float("nan")), ValueError, "bias must be finite"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, float("-inf")), ValueError, "bias must be finite"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, torch.tensor(float("inf"))), ValueError, "bias must be finite"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, torch.zeros(2)), ValueError, "bias must be a scalar"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, torch.tensor(1)), TypeError, "bias must have a floating dtype"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, True), TypeError, "bias must be a number"),
    (lambda x, y: sigmoid_loss(x, y, 0.1, "-10"), TypeError, "bias must be a number"),
    (lambda x, y: sigmoid_loss(x.index_fill(0, torch.tensor([2]), 0.0), y), ValueError, "image has 1 zero-norm"),
    (lambda x, y: sigmoid_loss(x, y, reduction="average"), ValueError, "reduction must be one of"),
    (lambda x, y: sigmoid_loss(x, y, chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (lambda x, y: sigmoid_loss(x, y, chunk_size=2.0), TypeError, "chunk_size must be an int"),
    (lambda x, y: sigmoid_loss(x, y, distributed=True), ValueError, "distributed=True needs an initialised"),
    (lambda x, y: sigmoid_loss(x, y, distributed="yes"), TypeError, "distributed must be"),
])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(*_good())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(temperature=0.0), ValueError, "temperature must be positive"),
    (dict(temperature=float("nan")), ValueError, "temperature must be positive"),
    (dict(bias=float("inf")), ValueError, "bias must be finite"),
    (dict(bias=torch.zeros(3)), ValueError, "bias must be a scalar"),
    (dict(learnable_temprature=False), TypeError, "unexpected keyword argument 'learnable_temprature'"),
    (dict(reduce="sum"), TypeError, "unexpected keyword argument 'reduce'"),
])
def test_module_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SigmoidLoss(**kwargs)


# --------------------------------------------------------------------------- module twin


@pytest.mark.parametrize("kwargs", [dict(scale=10.0), dict(scale=4.0, bias=-2.0), dict(learnable_scale=False)])
def test_module_scale_is_refused_with_the_temperature_to_pass(kwargs):
    # SigmoidLoss took SigLIP's t as scale=; it now takes tau = 1 / t as every loss does.
    with pytest.raises(TypeError, match=r"temperature=1/scale \(SigLIP's t = 10 is temperature=0.1\)"):
        SigmoidLoss(**kwargs)


def test_module_twin_initialisation_and_parameters():
    loss_fn = SigmoidLoss()
    params = dict(loss_fn.named_parameters())
    assert set(params) == {"log_scale", "bias"}
    assert params["log_scale"].item() == pytest.approx(math.log(10.0))
    assert params["bias"].item() == -10.0
    assert loss_fn.temperature == pytest.approx(0.1)
    fixed = SigmoidLoss(learnable_temperature=False, learnable_bias=False)
    assert list(fixed.parameters()) == [] and set(dict(fixed.named_buffers())) == {"log_scale", "bias"}
    half = SigmoidLoss(learnable_bias=False)
    assert set(dict(half.named_parameters())) == {"log_scale"}
    assert "temperature=0.1," in repr(loss_fn) and "bias=-10" in repr(loss_fn)
    assert "chunk_size=3" in repr(SigmoidLoss(0.2, chunk_size=3)) and "temperature=0.2" in repr(SigmoidLoss(0.2))


@pytest.mark.parametrize("chunk", [None, 3])
def test_module_twin_equals_the_function_with_t_equal_exp_t_prime(chunk):
    image, text = pair(7, 4)
    loss_fn = SigmoidLoss(temperature=0.25, bias=-2.0, chunk_size=chunk).double()
    loss = loss_fn(image, text)
    loss.backward()
    # the parameters hold float32 roundings of log 4 and -2 (cast to float64 by .double())
    tau, bias = torch.exp(-loss_fn.log_scale.detach()).requires_grad_(), scalar(-2.0)
    expected = sigmoid_loss(image.detach(), text.detach(), tau, bias, chunk_size=chunk)
    expected.backward()
    torch.testing.assert_close(loss, expected, **TOL)
    torch.testing.assert_close(loss_fn.bias.grad, bias.grad, **TOL)
    # tau = exp(-t'), so d/dt' = -tau * d/dtau
    torch.testing.assert_close(loss_fn.log_scale.grad, -tau.detach() * tau.grad, **TOL)
    assert float(loss_fn.log_scale.grad.abs()) > 1e-6 and float(loss_fn.bias.grad.abs()) > 1e-6
    per_image = loss_fn(image, text, reduction="none")
    assert per_image.shape == (7,)


@pytest.mark.parametrize("chunk", [None, 3])
def test_module_temperature_is_the_functional_tau(chunk):
    # SigmoidLoss(temperature=0.1) is sigmoid_loss at tau = 0.1 (SigLIP's t = 10), stored as
    # t' = log(1 / tau) in float32: equal up to that rounding, gradients included.
    image, text = pair(7, 4)
    loss_fn = SigmoidLoss(temperature=0.1, bias=-10.0, chunk_size=chunk).double()
    tau, bias = scalar(0.1), scalar(-10.0)
    expected = sigmoid_loss(image, text, tau, bias, chunk_size=chunk)
    expected.backward()
    loss = loss_fn(image.detach(), text.detach())
    loss.backward()
    rounding = dict(rtol=1e-5, atol=0.0)
    torch.testing.assert_close(loss, expected.detach(), **rounding)
    assert float(loss_fn.log_scale.detach()) == pytest.approx(math.log(10.0), rel=1e-7)
    # tau = exp(-t'): d/dt' = -tau * d/dtau, the gradient that trains SigLIP's temperature
    torch.testing.assert_close(loss_fn.log_scale.grad, -0.1 * tau.grad, **rounding)
    torch.testing.assert_close(loss_fn.bias.grad, bias.grad, **rounding)
    assert float(loss_fn.log_scale.grad.abs()) > 1e-3
    frozen = SigmoidLoss(temperature=0.1, learnable_temperature=False).double()
    assert set(dict(frozen.named_parameters())) == {"bias"}
    torch.testing.assert_close(frozen(image.detach(), text.detach()), expected.detach(), **rounding)


def test_module_call_overrides_reduction_only_by_keyword():
    image, text = pair(5, 3)
    loss_fn = SigmoidLoss(temperature=0.5, bias=-1.0).double()
    per_image = loss_fn(image, text, reduction="none")
    torch.testing.assert_close(per_image, sigmoid_loss(image, text, loss_fn.temperature, -1.0, reduction="none"),
                               rtol=1e-6, atol=0.0)
    assert loss_fn.reduction == "mean" and loss_fn(image, text).shape == ()
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'"):
        loss_fn(image, text, chunk_size=2)  # what the loss computes is fixed at construction
    with pytest.raises(TypeError, match="positional argument"):
        loss_fn(image, text, "none")


def test_module_twin_gradcheck():
    image, text = pair(5, 3)
    loss_fn = SigmoidLoss(temperature=0.5, bias=-1.0, chunk_size=2).double()

    def f(x, y, log_scale, bias):
        return torch.func.functional_call(loss_fn, {"log_scale": log_scale, "bias": bias}, (x, y))

    assert torch.autograd.gradcheck(f, (image, text, scalar(math.log(2.0)), scalar(-1.0)))


# --------------------------------------------------------------------------- memory


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    torch.set_num_threads(2)
    from contrastkit.losses import sigmoid_loss, tiled
    n, d = 8192, 32                      # the dense logits alone take 256 MiB
    image = torch.randn(n, d, requires_grad=True)
    text = torch.randn(n, d, requires_grad=True)
    tau = torch.tensor(0.1, requires_grad=True)
    bias = torch.tensor(-10.0, requires_grad=True)
    (image @ text[:256].T).sum()         # start the thread pool before measuring
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    limit = vm + 160 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    sigmoid_loss(image, text, tau, bias, chunk_size=1024).backward()
    assert torch.isfinite(image.grad).all() and torch.isfinite(tau.grad) and torch.isfinite(bias.grad)
    print("TILED_OK", flush=True)
    tiled.DENSE_MAX_ENTRIES = 2**62       # force the dense path under the same limit
    try:
        sigmoid_loss(image, text, tau, bias).backward()
        print("DENSE_OK")
    except (RuntimeError, MemoryError) as err:
        print("DENSE_FAILED", type(err).__name__)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux-only")
def test_tiled_path_never_allocates_the_full_matrix():
    """Under an address-space limit 160 MiB above the process size, the tiled loss and all its
    gradients run at N = 8192 pairs, while the dense path (256 MiB of logits) fails."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=300)
    assert "TILED_OK" in out.stdout, out.stdout + out.stderr
    assert "DENSE_FAILED" in out.stdout, out.stdout + out.stderr


# --------------------------------------------------------------------------- distributed (gloo)


SEED = 11
EQUAL, UNEVEN = (4, 4), (2, 3, 4)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return EQUAL, W.spawn(SW.suite_worker, 2, tmp_path_factory.mktemp("sigmoid2"), SEED, EQUAL)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return UNEVEN, W.spawn(SW.suite_worker, 3, tmp_path_factory.mktemp("sigmoid3"), SEED, UNEVEN)


@pytest.fixture(params=["two_ranks", "three_ranks"], ids=["2-ranks-equal", "3-ranks-uneven"])
def ranks(request):
    return request.getfixturevalue(request.param)


def single_process(variant: str, sizes, reduction: str):
    """The loss and parameter gradients on the concatenated batch, one process, dense."""
    return SW.loss_and_grads(variant, W.concatenated(W.batches(SEED, sizes)), reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("path", list(SW.PATHS))
@pytest.mark.parametrize("variant", SW.VARIANTS)
def test_ring_equals_single_process(ranks, variant, path, reduction):
    sizes, results = ranks
    ref_value, ref_grads = single_process(variant, sizes, reduction)
    values = torch.stack([r["losses"][(variant, path, reduction)][0] for r in results])
    torch.testing.assert_close(values.mean(), ref_value, **TOL)  # what DDP's averaging assumes
    for r in results:
        grads = r["losses"][(variant, path, reduction)][1]
        assert set(grads) == set(ref_grads) and len(ref_grads) >= 6  # tower, tau (or t') and b
        for key, ref_grad in ref_grads.items():
            assert float(ref_grad.abs().max()) > 1e-6, "a vanishing reference gradient would test nothing"
            torch.testing.assert_close(grads[key], ref_grad, **TOL, msg=lambda m: f"{key}: {m}")


def test_equal_batches_mean_is_the_mean_over_own_images(two_ranks):
    sizes, results = two_ranks
    ref_rows, _ = single_process("functional", sizes, "none")
    for rank, r in enumerate(results):
        own = ref_rows[sum(sizes[:rank]):sum(sizes[:rank + 1])]
        torch.testing.assert_close(r["losses"][("functional", "dense", "mean")][0], own.mean(), **TOL)


@pytest.mark.parametrize("path", list(SW.PATHS))
@pytest.mark.parametrize("variant", SW.VARIANTS)
def test_ring_per_image_losses_are_this_ranks_rows(ranks, variant, path):
    sizes, results = ranks
    ref_rows, _ = single_process(variant, sizes, "none")
    for rank, r in enumerate(results):
        expected = ref_rows[sum(sizes[:rank]):sum(sizes[:rank + 1])]
        torch.testing.assert_close(r["losses"][(variant, path, "none")][0], expected, **TOL)


def test_every_distributed_call_used_the_ring(ranks):
    sizes, results = ranks
    calls = len(SW.VARIANTS) * len(SW.PATHS) * len(SW.REDUCTIONS)
    for r in results:
        tiles = r["losses"]["ring_calls"]
        assert len(tiles) == calls
        # untiled: the largest rank's block is one tile; tiled: the requested size
        assert set(tiles) == {max(sizes), SW.TILE}


def test_distributed_errors_are_raised_on_every_rank(two_ranks):
    for rank, r in enumerate(two_ranks[1]):
        for case, message in r["errors"].items():
            assert message is not None and not message.startswith("UNEXPECTED"), (rank, case, message)
