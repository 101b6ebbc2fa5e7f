"""Host synchronisations of a loss call, counted structurally on the CPU.

A host sync is a read of a tensor's value by Python: ``Tensor.item``, ``__bool__``,
``__float__``, ``__int__``, ``tolist``. The losses read values only where
``validation.reads_are_free`` says so (a CPU tensor); the tests below make it say ``False``,
which runs on the CPU exactly the code an accelerator runs, and count the reads: none, with
``validate=True`` (the checks go to ``torch._assert_async``) and with ``validate=False``, on
the dense and tiled paths, forward and backward.
"""

from __future__ import annotations


import pytest
import torch

import contrastkit.losses as L
from contrastkit.losses import validation

from _host_reads import counted_reads
from loss_catalog import CATALOG, cases



def _pair(n=12, d=5):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, d, generator=g).requires_grad_(), torch.randn(n, d, generator=g).requires_grad_())


#: Host reads found when this test took every catalogued loss, not fixed yet: each case fails
#: (strictly: it fails the run once fixed, so that the mark goes).
#: Every catalogued loss, on its dense path and on its tiled path where it has one.
CALLS = [pytest.param(name, chunk, id=f"{name}-{chunk}")
         for name in sorted(CATALOG) for chunk in ((None, 5) if CATALOG[name].tiled else (None,))]


def _leaves(case, n=12, d=5):
    return [t.requires_grad_() if i in case.grads else t for i, t in enumerate(case.tensors(n, d, torch.float32))]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("name,chunk", CALLS)
def test_no_host_sync_on_accelerator_paths(name, chunk, validate, monkeypatch):
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    case = CATALOG[name]
    tensors = _leaves(case)
    tau = torch.tensor(0.1, requires_grad=True)  # a learnable temperature must not be read either
    kwargs = {"chunk_size": chunk, "validate": validate} if case.tiled else {"validate": validate}
    with counted_reads() as reads:
        loss = case(tensors, tau, **kwargs)
        loss.backward()
    assert reads == [], f"{name} (chunk_size={chunk}, validate={validate}) read tensor values: {reads}"
    with_checks = case([t.detach() for t in tensors], 0.1, **{k: v for k, v in kwargs.items() if k != "validate"})
    assert torch.allclose(loss.detach(), with_checks), "validate=False changed the value"


def test_counter_sees_the_checks():
    # The counter can fail: with validation on, the CPU reads values for its detailed errors.
    a, b = _pair()
    with counted_reads() as reads:
        L.nt_xent_views(a, b, temperature=0.1)
    assert reads


def test_device_checks_still_fail(monkeypatch):
    # On the accelerator path a bad value fails inside torch._assert_async (on the CPU it
    # raises at once; on CUDA at the next synchronising operation).
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    a, b = _pair()
    bad = a.detach().clone()
    bad[0, 0] = float("inf")
    with pytest.raises(RuntimeError, match="z_a contains NaN or infinite"):
        L.nt_xent_views(bad, b, temperature=0.1)
    with pytest.raises(RuntimeError, match="zero-norm"):
        L.nt_xent_views(torch.zeros_like(b), b, temperature=0.1)


def test_validate_false_skips_only_value_checks():
    a, b = _pair()
    bad = a.detach().clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="z_a contains 1 NaN"):
        L.nt_xent_views(bad, b, temperature=0.1)
    assert torch.isnan(L.nt_xent_views(bad, b, temperature=0.1, validate=False))
    with pytest.raises(ValueError, match="shape"):  # structure is still checked
        L.nt_xent_views(a, b[:3], temperature=0.1, validate=False)
    with pytest.raises(TypeError, match="validate"):
        L.nt_xent_views(a, b, temperature=0.1, validate="no")


def test_module_twin_takes_validate(monkeypatch):
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    a, b = _pair()
    with counted_reads() as reads:
        L.NTXentViews(temperature=0.1, validate=False)(a, b).backward()
    assert reads == []


#: Every catalogued loss that takes one learnable temperature per anchor row, dense and tiled.
PER_ANCHOR = [pytest.param(name, chunk, id=f"{name}-{chunk}")
              for name, case in sorted(cases(temperature="learnable", per_anchor=True).items())
              for chunk in ((None, 5) if case.tiled else (None,))]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("name,chunk", PER_ANCHOR)
def test_no_host_sync_with_a_temperature_per_anchor(name, chunk, validate, monkeypatch):
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    case = CATALOG[name]
    tensors = _leaves(case)
    tau = (0.05 + torch.rand(case.anchors * 12, generator=torch.Generator().manual_seed(1))).requires_grad_()
    kwargs = {"chunk_size": chunk} if case.tiled else {}
    with counted_reads() as reads:
        case(tensors, tau, validate=validate, **kwargs).backward()
    assert reads == [], f"{name} (chunk_size={chunk}, validate={validate}) read tensor values: {reads}"
    assert tau.grad is not None and bool(torch.isfinite(tau.grad).all())
