"""The temperature has one owner: the Temperature module (cap, floor, setter), the module
twins that keep whatever temperature they are given, and one parsed schedule per run."""

import inspect
import json
import math
import os

import pytest
import torch

import contrastkit.temperature as schedules
from contrastkit import losses as L
from contrastkit.losses import MIN_TEMPERATURE, Temperature, nt_xent_views
from contrastkit.methods import resolve_for_data
from loss_catalog import twins
from contrastkit.train import PretrainConfig, pretrain

TINY_RUN = dict(data="glyphlab", data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 12, "size": 28},
                epochs=1, batch_size=8, device="cpu", log_every=1)


# --- the cap: a learnable tau at the floor keeps its gradient ---------------------------------

def _views(seed=0, n=32, d=8, noise=1.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, generator=g)
    return a, a + noise * torch.randn(n, d, generator=g)


def test_learnable_tau_at_the_floor_has_a_gradient():
    # exp(float32(log 100)) rounds above 100: capping the scale there cut the gradient even at
    # the start of a run initialised at the floor.
    t = Temperature(MIN_TEMPERATURE, learnable=True)
    nt_xent_views(*_views(), temperature=t()).backward()
    assert float(t.log_scale.grad) != 0.0
    assert t.value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)


def test_beyond_the_cap_clamp_brings_the_parameter_back_and_the_gradient_with_it():
    t = Temperature(0.07, learnable=True)
    with torch.no_grad():
        t.log_scale.fill_(math.log(200.0))
    assert t.value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)  # the value is capped
    assert t.clamp_() is t
    assert float(t.log_scale.detach()) == pytest.approx(math.log(100.0))
    assert t.value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)  # clamp_ does not move tau
    nt_xent_views(*_views(), temperature=t()).backward()
    assert float(t.log_scale.grad) != 0.0
    parameter = t.log_scale
    t.clamp_()
    assert t.log_scale is parameter  # in place: the optimizer still holds the same parameter


def test_learnable_tau_recovers_from_the_cap():
    # 200 Adam steps on identical, nearly collapsed views push tau to the cap; then views whose
    # loss is lowest near tau = 0.12 must bring it back (with the old cap it stayed at 0.0100).
    g = torch.Generator().manual_seed(0)
    near = torch.ones(32, 8) + 0.05 * torch.randn(32, 8, generator=g)
    a, b = _views()
    grid = torch.linspace(0.02, 1.0, 981)
    best = float(grid[torch.stack([nt_xent_views(a, b, temperature=float(tau)) for tau in grid]).argmin()])
    assert 0.1 < best < 0.15
    t = Temperature(0.07, learnable=True)
    optimizer = torch.optim.Adam(t.parameters(), lr=0.05)
    for step in range(400):
        loss = nt_xent_views(near, near, temperature=t()) if step < 200 else nt_xent_views(a, b, temperature=t())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t.clamp_()
        if step == 199:
            assert t.value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)  # it did reach the cap
    assert t.value == pytest.approx(best, rel=0.1)


def test_temperature_gradcheck_below_the_cap():
    t = Temperature(0.2, learnable=True).double()
    a, b = (x.double() for x in _views(n=6, d=3))

    def loss(log_scale):
        return nt_xent_views(a, b, temperature=torch.func.functional_call(t, {"log_scale": log_scale}, ()))

    for tau in (0.9, 0.2, 0.011):
        x = torch.tensor(math.log(1.0 / tau), dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(loss, (x,))


# --- the floor and the setter -----------------------------------------------------------------

def test_one_floor():
    assert MIN_TEMPERATURE == 0.01
    assert Temperature().min_value == MIN_TEMPERATURE
    assert schedules.LearnableSchedule().max_scale == 1.0 / MIN_TEMPERATURE
    Temperature(MIN_TEMPERATURE)  # the floor itself is allowed
    with pytest.raises(ValueError, match="below 1 / max_scale"):
        Temperature(MIN_TEMPERATURE * 0.99)


@pytest.mark.parametrize("learnable", [False, True])
def test_set_(learnable):
    t = Temperature(0.2, learnable=learnable)
    state = t.log_scale
    assert t.set_(0.5) is t and t.value == pytest.approx(0.5)
    assert t.log_scale is state and t.learnable == learnable
    # the same float32 the loop used to write into log_scale: runs give the same numbers
    assert float(t.set_(0.13).log_scale.detach()) == float(torch.tensor(math.log(1.0 / 0.13), dtype=torch.float32))
    assert t.set_(MIN_TEMPERATURE).value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)
    with pytest.raises(ValueError, match="tau 0.005 is below 1 / max_scale = 0.01"):
        t.set_(0.005)
    with pytest.raises(ValueError, match="tau must be positive"):
        t.set_(0.0)
    with pytest.raises(TypeError, match="tau must be a number"):
        t.set_("0.2")
    assert t.value == pytest.approx(MIN_TEMPERATURE, rel=1e-6)  # refused values change nothing


def test_schedules_apply_to_a_temperature():
    t = Temperature(0.3)
    assert schedules.ConstantSchedule(0.2).apply(t, 0, 5) is None and t.value == pytest.approx(0.3)
    assert schedules.LearnableSchedule(0.2).apply(t, 0, 5) is None and t.value == pytest.approx(0.3)
    cosine = schedules.CosineSchedule(0.05, 0.5)
    assert cosine.apply(t, 0, 11) == pytest.approx(0.5) and t.value == pytest.approx(0.5)
    assert cosine.apply(t, 10, 11) == pytest.approx(0.05) and t.value == pytest.approx(0.05)


def test_a_linear_ramp_down_to_the_floor_stays_on_it():
    # 0.11 + (0.01 - 0.11) * 1.0 rounds below 0.01; the ramp must end on its end value.
    ramp = schedules.LinearSchedule(0.11, MIN_TEMPERATURE)
    assert ramp(9, 10) == MIN_TEMPERATURE
    assert all(MIN_TEMPERATURE <= ramp(s, 97) <= 0.11 for s in range(97))
    ramp.apply(Temperature(), 9, 10)


# --- the module twins keep the temperature they are given -------------------------------------

#: The twins whose temperature is the one they are given, from the catalog. SigmoidLoss owns
#: SigLIP's scale t' and bias b as its own parameters (tests/losses/test_losses_sigmoid.py).
OWN_PARAMETERS = {"SigmoidLoss"}
TWINS_WITH_TEMPERATURE = sorted(name for name, case in twins("twin").items()
                                if case.temperature == "learnable" and name not in OWN_PARAMETERS)
CASE_OF = twins("twin")


def _inputs(name):
    case = CASE_OF[name]
    return case.tensors(6, 4, dtype=torch.float32, seed=3), dict(case.options)


def _function(name):
    """The twin's function at a given temperature, with the case's options."""
    return lambda args, temperature: CASE_OF[name](args, temperature)


def test_the_list_covers_every_twin():
    modules = {name for name in L.__all__ if isinstance(getattr(L, name), type)
               and issubclass(getattr(L, name), torch.nn.Module) and name != "Temperature"}
    # SimpleLoss has no temperature; SigmoidLoss owns SigLIP's scale t' and bias b as its own
    # parameters (tests/test_losses_sigmoid.py); the temperature methods compute their own
    # temperatures from their settings and state (tests/losses/test_adaptive_temperatures.py).
    methods = {"AdaptiveTemperatureLoss", "MACLNTXentLoss", "DualTemperatureNTXentLoss", "IndividualTemperatureLoss", "TemperatureNetworkLoss"}
    assert modules == set(TWINS_WITH_TEMPERATURE) | {"SimpleLoss"} | OWN_PARAMETERS | methods


@pytest.mark.parametrize("name", TWINS_WITH_TEMPERATURE)
def test_a_parameter_temperature_is_registered_and_trained(name):
    args, options = _inputs(name)
    tau = torch.nn.Parameter(torch.tensor(0.3))
    loss_fn = getattr(L, name)(temperature=tau, **options)
    assert any(p is tau for p in loss_fn.parameters())
    loss = loss_fn(*args)
    assert torch.equal(loss.detach(), _function(name)(args, 0.3).detach())
    loss.backward()
    assert tau.grad is not None and float(tau.grad) != 0.0


@pytest.mark.parametrize("name", TWINS_WITH_TEMPERATURE)
def test_a_temperature_module_is_a_submodule(name):
    args, options = _inputs(name)
    t = Temperature(0.3, learnable=True)
    loss_fn = getattr(L, name)(t, **options)
    assert [p for p in loss_fn.parameters()] == [t.log_scale] and loss_fn.temperature is t
    loss_fn(*args).backward()
    assert float(t.log_scale.grad) != 0.0


@pytest.mark.parametrize("name", TWINS_WITH_TEMPERATURE)
def test_a_tensor_temperature_keeps_its_graph(name):
    args, options = _inputs(name)
    log_tau = torch.tensor(math.log(0.3), requires_grad=True)
    loss_fn = getattr(L, name)(temperature=log_tau.exp(), **options)
    assert not list(loss_fn.parameters()) and "temperature" not in loss_fn.state_dict()
    loss_fn(*args).backward()
    assert log_tau.grad is not None and float(log_tau.grad) != 0.0
    fixed = getattr(L, name)(temperature=torch.tensor(0.3), **options)
    assert torch.allclose(fixed(*args), _function(name)(args, 0.3))
    assert fixed.extra_repr().startswith("temperature=0.3")


@pytest.mark.parametrize("name", TWINS_WITH_TEMPERATURE)
def test_the_temperature_is_the_module_s_own(name):
    # A call cannot replace it: the Lightning integration passes its model's temperature only to
    # losses whose forward names it, and a loss module keeps its own.
    args, options = _inputs(name)
    loss_fn = getattr(L, name)(temperature=0.3, **options)
    assert torch.equal(loss_fn(*args), _function(name)(args, 0.3))
    assert "temperature" not in inspect.signature(loss_fn.forward).parameters
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        loss_fn(*args, temperature=0.7)


def test_bad_temperatures_are_refused_at_construction():
    with pytest.raises(ValueError, match="one value per anchor row"):
        L.NTXentViews(temperature=torch.nn.Parameter(torch.ones(2, 2)))
    with pytest.raises(ValueError, match="temperature must be positive"):
        L.NTXentViews(temperature=torch.nn.Parameter(torch.tensor(-0.1)))
    with pytest.raises(TypeError, match="temperature must be a number"):
        L.NTXentViews(temperature="0.1")
    with pytest.raises(TypeError, match=r"SimpleLoss.__init__\(\) takes 1 positional argument but 2 were given"):
        L.SimpleLoss(0.5)  # it has no temperature
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        L.SimpleLoss(temperature=0.5)


# --- one schedule per run, parsed once ----------------------------------------------------------

def test_the_resolved_config_holds_the_parsed_schedule():
    c = PretrainConfig(temperature_schedule="cosine:0.05,0.5").resolved()
    assert isinstance(c.schedule, schedules.CosineSchedule) and c.schedule.config()["tau_max"] == 0.5
    assert resolve_for_data(c, 100)[0].schedule.config() == c.schedule.config()  # made from the fields, the same
    learnable = PretrainConfig(learnable_temperature=True, temperature=0.3).resolved().schedule
    assert isinstance(learnable, schedules.LearnableSchedule) and learnable.initial == 0.3
    with pytest.raises(ValueError, match="resolve"):
        PretrainConfig().schedule
    with pytest.raises(ValueError, match="a learnable temperature must start at >= 0.01"):
        PretrainConfig(learnable_temperature=True, temperature=0.005).resolved()


def test_a_run_parses_its_schedule_not_per_step_sets_tau_and_clamps_after_each_step(tmp_path, monkeypatch):
    import contrastkit.train.loop as loop

    parsed, clamped = [], []
    parse = schedules.parse_schedule
    monkeypatch.setattr(schedules, "parse_schedule", lambda *a, **k: parsed.append(a) or parse(*a, **k))
    if hasattr(loop, "parse_schedule"):
        monkeypatch.setattr(loop, "parse_schedule", schedules.parse_schedule)
    clamp = Temperature.clamp_
    monkeypatch.setattr(Temperature, "clamp_", lambda self: clamped.append(1) or clamp(self))
    out = tmp_path / "run"
    summary = pretrain(PretrainConfig(**TINY_RUN, out=str(out), temperature_schedule=f"linear:0.11,{MIN_TEMPERATURE}"),
                       progress=False)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        taus = [r["tau"] for r in map(json.loads, handle) if r["kind"] == "tau"]
    assert len(parsed) == 2, parsed  # checked once when resolving, made once for the trainer: never per step
    assert len(clamped) == len(taus) >= 2
    assert taus[0] == 0.11 and taus[-1] == MIN_TEMPERATURE
    assert summary["final_temperature"] == pytest.approx(MIN_TEMPERATURE, rel=1e-6)
