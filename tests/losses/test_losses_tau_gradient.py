"""dL/dtau by autograd agrees with central finite differences, for every loss with a
temperature, on the dense and the tiled path, with tau given as a float64 tensor.

A loss that builds part of itself from ``float(tau)`` (as the floor of the debiased loss once
did) loses that part of the gradient silently; only a comparison with the loss's own values
at ``tau +/- h`` sees it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from contrastkit import losses as L
from loss_catalog import NOT_LOSSES, cases

TAU = 0.5
STEP = 1e-6
EYE = torch.eye(4, dtype=torch.float64)  # the floor of the debiased estimator binds here

# name -> (function of tau, tileable): every catalogued loss with a learnable temperature, on the
# catalog's inputs, and the two losses whose floor binds on EYE (its gradient once went missing).
CASES = {name: ((lambda case, tensors: lambda t, **k: case(tensors, t, **k))(case, case.tensors(6, 5)), case.tiled)
         for name, case in cases(temperature="learnable").items()}
CASES.update({
    "debiased_nt_xent[floor]": (lambda t, **k: L.debiased_nt_xent(EYE, EYE, temperature=t, tau_plus=0.3, **k), True),
    "hcl[floor]": (lambda t, **k: L.hcl(EYE, EYE, temperature=t, tau_plus=0.3, beta=1.0, **k), True),
})
#: Losses whose temperatures are settings (numbers, no gradient: MACL's base tau_0 and dual's
#: two), and what is not a loss; tests/losses/test_adaptive_temperatures.py.
SETTINGS_ONLY = {case.function_name for case in cases(temperature="settings").values()} | set(NOT_LOSSES)
PATHS = [(name, "dense") for name in CASES] + [(name, "tiled") for name, (_, tileable) in CASES.items() if tileable]


def test_every_loss_with_a_temperature_is_covered():
    # simple_loss is the tau -> infinity limit and has no temperature.
    functions = {name for name in L.__all__ if name[0].islower() and name != "views_positive_index"}
    assert functions - {"simple_loss"} - SETTINGS_ONLY == {name.split("[")[0] for name in CASES}


def finite_difference(loss, tau: float) -> float:
    return (float(loss(torch.tensor(tau + STEP, dtype=torch.float64)))
            - float(loss(torch.tensor(tau - STEP, dtype=torch.float64)))) / (2 * STEP)


@pytest.mark.parametrize("name,path", PATHS)
def test_temperature_gradient_matches_finite_differences(name, path):
    function, _ = CASES[name]
    options = {"chunk_size": 4} if path == "tiled" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nt_xent on 6 rows is not degenerate; others may be
        loss = lambda t: function(t, **options)  # noqa: E731
        tau = torch.tensor(TAU, dtype=torch.float64, requires_grad=True)
        (autograd,) = torch.autograd.grad(loss(tau), tau)
        expected = finite_difference(loss, TAU)
    assert float(autograd) == pytest.approx(expected, rel=1e-6, abs=1e-8)


def test_debiased_floor_reproduction():
    """The reported case: z = I_4, tau_plus = 0.3, tau = 0.5; the floor binds for every anchor,
    so the loss is softplus(log(M) - 1/tau - 1/tau) and dL/dtau = sigmoid(.) * 2 / tau^2."""
    for loss in (lambda t: L.debiased_nt_xent(EYE, EYE, temperature=t, tau_plus=0.3),
                 lambda t: L.hcl(EYE, EYE, temperature=t, tau_plus=0.3, beta=1.0)):
        tau = torch.tensor(TAU, dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(loss(tau), tau)
        exact = torch.sigmoid(torch.tensor(6.0, dtype=torch.float64).log() - 4.0) * 2 / TAU ** 2
        assert float(grad) == pytest.approx(float(exact), rel=1e-12)
        assert float(grad) == pytest.approx(0.79210, abs=1e-5)
