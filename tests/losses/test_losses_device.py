"""Device-agnostic loss tests: every loss gives on ``--test-device`` (CPU by default; set
``--test-device cuda`` or ``CONTRASTKIT_TEST_DEVICE=cuda`` on a GPU machine) the value and the
gradients, the temperature's included, of the same loss in float64 on the CPU, on the dense
and on the tiled path: every loss of the catalog (tests/loss_catalog.py)."""

import pytest
import torch

from loss_catalog import CATALOG

N, D, TAU = 24, 8, 0.3
# Every catalogued loss on its dense path, and on its tiled path where it has one.
PATHS = [pytest.param(name, None, id=f"{name}-dense") for name in sorted(CATALOG)] + [
    pytest.param(name, 8, id=f"{name}-tiled") for name in sorted(CATALOG) if CATALOG[name].tiled]


def _value_and_grads(case, tensors, tau, chunk):
    leaves = [t.detach().clone().requires_grad_() if i in case.grads else t for i, t in enumerate(tensors)]
    tau = tau.detach().clone().requires_grad_(case.temperature == "learnable")
    value = case(leaves, tau, chunk_size=chunk) if chunk else case(leaves, tau)
    value.backward()
    grads = [leaves[i].grad for i in case.grads] + ([tau.grad] if case.temperature == "learnable" else [])
    return [t.detach().cpu().double() for t in (value, *grads)]


@pytest.mark.parametrize("name,chunk", PATHS)
def test_loss_on_the_test_device_matches_float64_cpu(test_device, name, chunk):
    case = CATALOG[name]
    tensors = case.tensors(N, D)
    tau = torch.tensor(TAU, dtype=torch.float64)
    expected = _value_and_grads(case, tensors, tau, chunk)
    got = _value_and_grads(case, case.tensors(N, D, dtype=torch.float32, device=test_device),
                           tau.to(test_device, torch.float32), chunk)
    what = ["value"] + [f"grad of input {i}" for i in case.grads] + ["grad tau"]
    for what, e, g in zip(what, expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {what}: {m}")
