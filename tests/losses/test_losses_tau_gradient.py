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

TAU = 0.5
STEP = 1e-6


def rows(n, d=5, seed=0):
    return torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


A, B = rows(6, seed=1), rows(6, seed=2)
BANK, PAIRED = rows(4, seed=3), rows(24, seed=4).reshape(6, 4, 5)
LABELS = torch.tensor([0, 0, 1, 1, 2, 0])
PAIRS = torch.tensor([1, 0, 3, 2, 5, 4])
EYE = torch.eye(4, dtype=torch.float64)  # the floor of the debiased estimator binds here

# name -> (function of tau, tileable): every loss of contrastkit.losses with a temperature.
CASES = {
    "contrastive_loss": (lambda t, **k: L.contrastive_loss(A @ B.T, torch.arange(6), temperature=t), False),
    "similarity_loss": (lambda t, **k: L.similarity_loss(A @ A.T, PAIRS, temperature=t, exclude_diagonal=True),
                        False),
    "info_nce": (lambda t, **k: L.info_nce(A, B, temperature=t, **k), True),
    "info_nce[bank]": (lambda t, **k: L.info_nce(A, B, BANK, temperature=t, **k), True),
    "info_nce[paired]": (lambda t, **k: L.info_nce(A, B, PAIRED, temperature=t, negative_mode="paired"), False),
    "nt_xent": (lambda t, **k: L.nt_xent(A, PAIRS, temperature=t, **k), True),
    "nt_xent_views": (lambda t, **k: L.nt_xent_views(A, B, temperature=t, **k), True),
    "bidirectional_info_nce": (lambda t, **k: L.bidirectional_info_nce(A, B, temperature=t, weight=0.75, **k),
                               True),
    "supcon": (lambda t, **k: L.supcon(A, LABELS, temperature=t, **k), True),
    "supcon[in]": (lambda t, **k: L.supcon(A, LABELS, temperature=t, variant="in", **k), True),
    "dcl": (lambda t, **k: L.dcl(A, B, temperature=t, **k), True),
    "hard_negative_nt_xent": (lambda t, **k: L.hard_negative_nt_xent(A, B, temperature=t, top_k=3), False),
    "debiased_nt_xent": (lambda t, **k: L.debiased_nt_xent(A, B, temperature=t, tau_plus=0.1), False),
    "debiased_nt_xent[floor]": (lambda t, **k: L.debiased_nt_xent(EYE, EYE, temperature=t, tau_plus=0.3), False),
    "hcl": (lambda t, **k: L.hcl(A, B, temperature=t, tau_plus=0.1, beta=0.5), False),
    "hcl[floor]": (lambda t, **k: L.hcl(EYE, EYE, temperature=t, tau_plus=0.3, beta=1.0), False),
    "sigmoid_loss": (lambda t, **k: L.sigmoid_loss(A, B, temperature=t, bias=-2.0, **k), True),
    # Without moving estimates (u = the batch's own), iSogCLR's gradient is the objective's own.
    "robust_nt_xent": (lambda t, **k: L.robust_nt_xent(A, B, t, rho=0.3, **k).loss, True),
}
#: Losses whose temperatures are settings (numbers, no gradient: MACL's base tau_0 and dual's
#: two), and MACL's temperature formula (not a loss); tests/losses/test_adaptive_temperatures.py.
SETTINGS_ONLY = {"macl_nt_xent", "dual_temperature_nt_xent", "macl_temperature", "value_checks"}  # value_checks: a switch
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
