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



def _pair(n=12, d=5):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, d, generator=g).requires_grad_(), torch.randn(n, d, generator=g).requires_grad_())


CALLS = {
    "nt_xent_views": lambda a, b, **k: L.nt_xent_views(a, b, temperature=0.1, **k),
    "nt_xent": lambda a, b, **k: L.nt_xent(torch.cat([a, b]), L.views_positive_index(a.shape[0]),
                                           temperature=0.1, **k),
    "info_nce": lambda a, b, **k: L.info_nce(a, b, temperature=0.1, **k),
    "bidirectional": lambda a, b, **k: L.bidirectional_info_nce(a, b, temperature=0.1, **k),
    "supcon_in": lambda a, b, **k: L.supcon(a, torch.arange(a.shape[0]) % 3, temperature=0.1, variant="in", **k),
    "supcon_out": lambda a, b, **k: L.supcon(a, torch.arange(a.shape[0]) % 3, temperature=0.1, **k),
    "dcl": lambda a, b, **k: L.dcl(a, b, temperature=0.1, **k),
    "sigmoid": lambda a, b, **k: L.sigmoid_loss(a, b, **k),
}


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_no_host_sync_on_accelerator_paths(name, chunk, validate, monkeypatch):
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    a, b = _pair()
    tau = torch.tensor(0.1, requires_grad=True)  # a learnable temperature must not be read either
    kwargs = {"chunk_size": chunk, "validate": validate}
    call = CALLS[name]
    with counted_reads() as reads:
        if name == "sigmoid":
            loss = L.sigmoid_loss(a, b, temperature=tau, **kwargs)
        else:
            loss = call(a, b, **kwargs)
        loss.backward()
    assert reads == [], f"{name} (chunk_size={chunk}, validate={validate}) read tensor values: {reads}"
    with_checks = call(a.detach(), b.detach(), chunk_size=chunk)
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


#: Each call with one learnable temperature per anchor row (2N for two views, N for one direction).
PER_ANCHOR = {
    "nt_xent_views": (lambda a, b, t, **k: L.nt_xent_views(a, b, temperature=t, **k), 2),
    "bidirectional": (lambda a, b, t, **k: L.bidirectional_info_nce(a, b, temperature=t, **k), 2),
    "info_nce": (lambda a, b, t, **k: L.info_nce(a, b, temperature=t, **k), 1),
    "supcon_in": (lambda a, b, t, **k: L.supcon(a, torch.arange(a.shape[0]) % 3, temperature=t, variant="in", **k),
                  1),
    "dcl": (lambda a, b, t, **k: L.dcl(a, b, temperature=t, **k), 2),
    "sigmoid": (lambda a, b, t, **k: L.sigmoid_loss(a, b, t, **k), 1),
}


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("chunk", [None, 5])
@pytest.mark.parametrize("name", sorted(PER_ANCHOR))
def test_no_host_sync_with_a_temperature_per_anchor(name, chunk, validate, monkeypatch):
    monkeypatch.setattr(validation, "reads_are_free", lambda x: False)
    a, b = _pair()
    call, per_row = PER_ANCHOR[name]
    tau = (0.05 + torch.rand(per_row * a.shape[0], generator=torch.Generator().manual_seed(1))).requires_grad_()
    with counted_reads() as reads:
        call(a, b, tau, chunk_size=chunk, validate=validate).backward()
    assert reads == [], f"{name} (chunk_size={chunk}, validate={validate}) read tensor values: {reads}"
    assert tau.grad is not None and bool(torch.isfinite(tau.grad).all())
