"""nn.Module twins, the Temperature module, and the import contract of contrastkit.losses."""

import inspect
import math
import subprocess
import sys

import pytest
import torch

from contrastkit import losses as L
from contrastkit.losses import functional as F

from loss_catalog import twins

#: Module twin -> its function, from the catalog (the temperature methods are not twins).
FUNCTION_OF = {name: case.function for name, case in sorted(twins("twin").items())}
TWINS = {name: function.__name__ for name, function in FUNCTION_OF.items()}


def test_every_function_has_a_twin_and_a_documented_example():
    for module_name, function_name in TWINS.items():
        assert issubclass(getattr(L, module_name), torch.nn.Module)
        doc = getattr(L, function_name).__doc__
        assert "Example" in doc and ">>>" in doc, function_name
        # no softmax, no denominator: the simple loss, and SigLIP's pairwise sigmoids
        assert "enominator" in doc or function_name in ("simple_loss", "sigmoid_loss"), function_name
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
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'temperature'"):
        L.NTXentViews()
    with pytest.raises(ValueError, match="temperature"):
        L.InfoNCE(temperature=-1)


# --- the twins' signatures are the functions' ---------------------------------------------------

#: The options a call may override: where the loss is called, not what it computes.
CALL_OPTIONS = {"reduction", "distributed", "distributed_mode"}


def _parameters(callable_, kinds):
    return [p for p in inspect.signature(callable_).parameters.values() if p.kind in kinds and p.name != "self"]


POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def test_every_twin_is_checked_here():
    twins = {name for name in L.__all__ if isinstance(getattr(L, name), type)
             and issubclass(getattr(L, name), torch.nn.Module) and name != "Temperature"
             and not issubclass(getattr(L, name), L.AdaptiveTemperatureLoss)}  # temperature methods, not twins
    assert twins == set(FUNCTION_OF)


@pytest.mark.parametrize("name", sorted(FUNCTION_OF))
def test_forward_names_the_function_s_tensors(name):
    module, function = getattr(L, name), FUNCTION_OF[name]
    tensors = [(p.name, p.default) for p in _parameters(module.forward, POSITIONAL)]
    expected = [(p.name, p.default) for p in _parameters(function, POSITIONAL)
                if p.name not in ("temperature", "bias")]  # sigmoid_loss's are positional
    assert tensors == expected and tensors, name
    assert all(p.annotation in ("Tensor", "Optional[Tensor]") for p in _parameters(module.forward, POSITIONAL))
    assert inspect.signature(module.forward).return_annotation == "Tensor"
    # Keyword-only overrides, each None (the constructor's value) by default; no **kwargs.
    overrides = _parameters(module.forward, (inspect.Parameter.KEYWORD_ONLY,))
    assert {p.name for p in overrides} <= CALL_OPTIONS and all(p.default is None for p in overrides)
    assert "reduction" in {p.name for p in overrides}
    assert {p.name for p in overrides} == CALL_OPTIONS & set(inspect.signature(function).parameters)
    assert not _parameters(module.forward, (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL))


@pytest.mark.parametrize("name", sorted(FUNCTION_OF))
def test_constructor_lists_the_function_s_options_with_its_defaults(name):
    module, function = getattr(L, name), FUNCTION_OF[name]
    options = {p.name: p.default for p in _parameters(module, (inspect.Parameter.KEYWORD_ONLY,))}
    expected = {p.name: p.default for p in _parameters(function, (inspect.Parameter.KEYWORD_ONLY,))
                if p.name != "temperature"}
    if name == "SigmoidLoss":  # owns tau and b as parameters; scale= is refused with a message
        assert options.pop("learnable_temperature") is True and options.pop("learnable_bias") is True
        assert options.pop("scale") is None and options.pop("learnable_scale") is None
    assert options == expected
    assert all(p.annotation is not inspect.Parameter.empty for p in _parameters(module, (inspect.Parameter.KEYWORD_ONLY,)))
    positional = [p.name for p in _parameters(module, POSITIONAL)]
    assert positional == {"SimpleLoss": [], "SigmoidLoss": ["temperature", "bias"]}.get(name, ["temperature"])
    assert not _parameters(module, (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL))


@pytest.mark.parametrize("name", sorted(FUNCTION_OF))
def test_a_misspelt_option_fails_at_construction(name):
    args = () if name in ("SimpleLoss", "SigmoidLoss") else (0.1,)
    options = {"exclude_diagonal": False} if name == "SimilarityLoss" else {}
    with pytest.raises(TypeError, match=rf"^{name}\.__init__\(\) got an unexpected keyword argument 'reduciton'$"):
        getattr(L, name)(*args, reduciton="sum", **options)


def test_call_overrides_are_explicit_keywords():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    loss_fn = L.HCL(0.3, beta=0.5)
    torch.testing.assert_close(loss_fn(a, b, reduction="none"),
                               F.hcl(a, b, temperature=0.3, beta=0.5, reduction="none"), rtol=0, atol=0)
    assert loss_fn.reduction == "mean" and loss_fn(a, b).shape == ()  # for that call only
    torch.testing.assert_close(loss_fn(a, b, distributed=False, distributed_mode="local"), loss_fn(a, b))
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        loss_fn(a, b, beta=1.0)  # what the loss computes is fixed at construction
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        loss_fn(a, b, temperature=0.7)  # the module's own (the Lightning integration relies on it)
    with pytest.raises(TypeError, match="positional argument"):
        loss_fn(a, b, "none")


def test_shared_docstring_paragraphs():
    for name in FUNCTION_OF:
        doc = inspect.getdoc(getattr(L, name))
        assert f":func:`~contrastkit.losses.{FUNCTION_OF[name].__name__}`" in doc or name == "SigmoidLoss", name
        assert "Example:" in doc and ">>>" in doc, name
        assert ("``temperature`` (required)" in doc) == (name not in ("SimpleLoss", "SigmoidLoss")), name
    assert inspect.getdoc(L.NTXentViews).index("``temperature`` (required)") < inspect.getdoc(L.NTXentViews).index(
        "Example:")


def test_repr_shows_the_temperature_and_the_options_that_differ():
    assert repr(L.HCL(0.5, beta=2.0)) == "HCL(temperature=0.5, beta=2.0)"
    assert repr(L.SimilarityLoss(0.1, exclude_diagonal=True)) == "SimilarityLoss(temperature=0.1, exclude_diagonal=True)"
    assert repr(L.SimpleLoss()) == "SimpleLoss()"


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
