"""nn.Module twins, the Temperature module, and the import contract of contrastkit.losses."""

import math
import subprocess
import sys

import pytest
import torch

from contrastkit import losses as L
from contrastkit.losses import functional as F

TWINS = {
    "InfoNCE": "info_nce", "NTXent": "nt_xent", "NTXentViews": "nt_xent_views",
    "BidirectionalInfoNCE": "bidirectional_info_nce", "SupCon": "supcon", "SimilarityLoss": "similarity_loss",
    "DCL": "dcl", "SimpleLoss": "simple_loss", "HardNegativeNTXent": "hard_negative_nt_xent",
    "DebiasedNTXent": "debiased_nt_xent", "HCL": "hcl",
}


def test_every_function_has_a_twin_and_a_documented_example():
    for module_name, function_name in TWINS.items():
        assert issubclass(getattr(L, module_name), torch.nn.Module)
        doc = getattr(F, function_name).__doc__
        assert "Example" in doc and ">>>" in doc, function_name
        assert "enominator" in doc or function_name == "simple_loss", function_name
        assert "(N, d)" in doc or "(N, K)" in doc, function_name


def test_modules_match_functions():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    assert torch.equal(L.NTXentViews(temperature=0.2)(a, b), F.nt_xent_views(a, b, temperature=0.2))
    assert torch.equal(L.BidirectionalInfoNCE(0.1, weight=0.75)(a, b),
                       F.bidirectional_info_nce(a, b, temperature=0.1, weight=0.75))
    assert torch.equal(L.HardNegativeNTXent(0.3, top_k=2)(a, b), F.hard_negative_nt_xent(a, b, temperature=0.3, top_k=2))
    assert torch.equal(L.SimpleLoss(negative_weight=2.0)(a, b), F.simple_loss(a, b, negative_weight=2.0))
    assert torch.equal(L.SupCon(0.1)(a, torch.tensor([0, 1, 0, 1, 2, 2])),
                       F.supcon(a, torch.tensor([0, 1, 0, 1, 2, 2]), temperature=0.1))
    with pytest.raises(TypeError, match="needs a temperature"):
        L.NTXentViews()
    with pytest.raises(ValueError, match="temperature"):
        L.InfoNCE(temperature=-1)


def test_temperature_fixed_and_learnable():
    fixed = L.Temperature(0.5)
    assert fixed.value == pytest.approx(0.5) and not list(fixed.parameters())
    learnable = L.Temperature(learnable=True)
    assert learnable.value == pytest.approx(0.07, rel=1e-6)
    (param,) = learnable.parameters()
    assert float(param.detach()) == pytest.approx(math.log(1 / 0.07), rel=1e-6)
    # the scale 1/tau is clamped at 100
    with torch.no_grad():
        param.fill_(10.0)
    assert learnable.value == pytest.approx(0.01, rel=1e-6)
    with pytest.raises(ValueError, match="below 1 / max_scale"):
        L.Temperature(0.001)
    with pytest.raises(ValueError, match="initial"):
        L.Temperature(0.0)


def test_learnable_temperature_is_trained_through_the_loss_module():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 4, generator=g)
    b = a + 0.01 * torch.randn(8, 4, generator=g)
    loss_fn = L.NTXentViews(temperature=L.Temperature(0.5, learnable=True))
    (param,) = loss_fn.parameters()
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=0.5)
    before = loss_fn.temperature.value
    for _ in range(5):
        optimizer.zero_grad()
        loss_fn(a, b).backward()
        optimizer.step()
    # nearly identical views: the loss falls as tau falls, so tau must decrease
    assert loss_fn.temperature.value < before
    assert param.grad is not None and torch.isfinite(param.grad)


def test_losses_import_needs_torch_only():
    code = (
        "import sys; from contrastkit import losses; "
        "heavy = [m for m in ('matplotlib', 'sklearn', 'kornia', 'rich', 'scipy', 'PIL') if m in sys.modules]; "
        "print(heavy); assert not heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
