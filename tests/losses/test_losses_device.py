"""Device-agnostic loss tests: every loss gives on ``--test-device`` (CPU by default; set
``--test-device cuda`` or ``CONTRASTKIT_TEST_DEVICE=cuda`` on a GPU machine) the value and the
gradients, the temperature's included, of the same loss in float64 on the CPU, on the dense
and on the tiled path."""

import pytest
import torch

import contrastkit.losses as ck

N, D, TAU = 24, 8, 0.3

# name -> (loss of (a, b, tau, chunk_size), tolerance in float32)
LOSSES = {
    "nt_xent_views": lambda a, b, tau, chunk: ck.nt_xent_views(a, b, temperature=tau, chunk_size=chunk),
    "info_nce": lambda a, b, tau, chunk: ck.info_nce(a, b, temperature=tau, chunk_size=chunk),
    "bidirectional_info_nce": lambda a, b, tau, chunk: ck.bidirectional_info_nce(a, b, temperature=tau,
                                                                                 chunk_size=chunk),
    "supcon": lambda a, b, tau, chunk: ck.supcon(torch.cat([a, b]), torch.arange(2 * N, device=a.device) % 5,
                                                 temperature=tau, chunk_size=chunk),
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(N, D, generator=g, dtype=torch.float64)
    return a, a + 0.5 * torch.randn(N, D, generator=g, dtype=torch.float64)


def _value_and_grads(loss, a, b, tau, chunk):
    a, b, tau = (t.detach().clone().requires_grad_() for t in (a, b, tau))
    value = loss(a, b, tau, chunk)
    value.backward()
    return [t.detach().cpu().double() for t in (value, a.grad, b.grad, tau.grad)]


@pytest.mark.parametrize("chunk", [None, 8], ids=["dense", "tiled"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_on_the_test_device_matches_float64_cpu(test_device, name, chunk):
    a, b = _inputs()
    tau = torch.tensor(TAU, dtype=torch.float64)
    expected = _value_and_grads(LOSSES[name], a, b, tau, chunk)
    got = _value_and_grads(LOSSES[name], *(t.to(test_device, torch.float32) for t in (a, b, tau)), chunk)
    for what, e, g in zip(("value", "grad a", "grad b", "grad tau"), expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {what}: {m}")
