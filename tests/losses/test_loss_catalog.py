"""The loss catalog (tests/loss_catalog.py) lists every public loss, and says true things of each:
a loss left out of it would be left out of every test that draws from it."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

import reference as ref
from contrastkit import losses as L
from loss_catalog import CATALOG, EXTRA_TWINS, INPUT_KINDS, NOT_LOSSES, missing_from_catalog, twins


def test_every_public_loss_is_in_the_catalog():
    assert missing_from_catalog(L) == {}


def test_a_planted_loss_is_reported():
    def planted_loss(z_a, z_b, *, temperature):
        return L.nt_xent_views(z_a, z_b, temperature=temperature)

    class PlantedLoss(torch.nn.Module):
        pass

    namespace = types.SimpleNamespace(**{name: getattr(L, name) for name in L.__all__})
    namespace.planted_loss, namespace.PlantedLoss = planted_loss, PlantedLoss
    namespace.__all__ = [*L.__all__, "planted_loss", "PlantedLoss", "PLANTED_CONSTANT"]
    namespace.PLANTED_CONSTANT = 0.5  # not a loss: not reported
    assert missing_from_catalog(namespace) == {"planted_loss": planted_loss, "PlantedLoss": PlantedLoss}


def test_the_exclusions_are_public_names_and_not_cases():
    assert set(NOT_LOSSES) <= set(L.__all__)
    covered = {case.function_name for case in CATALOG.values()} | set(twins())
    assert not set(NOT_LOSSES) & covered


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_the_catalog_says_true_things(name):
    case = CATALOG[name]
    assert case.function is getattr(L, case.function_name) and case.inputs in INPUT_KINDS
    parameters = inspect.signature(case.function).parameters
    assert case.tiled <= ("chunk_size" in parameters)  # a tiled case can be asked for tiles
    assert case.distributed <= ("distributed" in parameters)
    assert set(case.options) <= set(parameters)
    assert case.reference is None or callable(getattr(ref, case.reference))
    if case.twin:
        assert issubclass(getattr(L, case.twin), torch.nn.Module)
    tensors = case.tensors(6, 5)
    assert all(tensors[i].is_floating_point() for i in case.grads)
    leaves = [t.clone().requires_grad_() if i in case.grads else t for i, t in enumerate(tensors)]
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    loss = case(leaves, tau)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    for i in case.grads:
        assert leaves[i].grad is not None and float(leaves[i].grad.abs().max()) > 0, (name, i)
    assert (tau.grad is not None) == (case.temperature == "learnable"), name
    per_row = case(leaves, tau, reduction="none")
    assert per_row.shape[0] in (case.anchors * 6, 6)  # per anchor, or per pair (bidirectional)


def test_extra_twins_name_methods_of_catalog_losses():
    for twin, name in EXTRA_TWINS.items():
        assert issubclass(getattr(L, twin), L.AdaptiveTemperatureLoss) and name in CATALOG


@pytest.mark.parametrize("name", sorted(name for name, case in CATALOG.items() if case.stop_gradient))
def test_a_stop_gradient_loss_fails_gradcheck(name):
    """What ``stop_gradient`` says: its gradient is not its value's derivative (so the tests that
    gradcheck every loss leave it out rightly)."""
    case = CATALOG[name]
    tensors = case.tensors(5, 3)

    def loss(*values):
        given = list(tensors)
        for i, value in zip(case.grads, values):
            given[i] = value
        return case(given, None)
    varied = tuple(tensors[i].clone().requires_grad_() for i in case.grads)
    assert not torch.autograd.gradcheck(loss, varied, raise_exception=False)
