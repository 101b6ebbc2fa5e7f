"""Temperature schedules: endpoints, midpoints computed from the formulas, parsing, errors."""

import math

import pytest
import torch

from contrastkit.losses import Temperature, nt_xent_views
from contrastkit.temperature import (
    ConstantSchedule,
    CosineSchedule,
    LearnableSchedule,
    LinearSchedule,
    StepSchedule,
    parse_schedule,
)


def test_constant():
    s = ConstantSchedule(0.2)
    assert [s(i, 5) for i in range(5)] == [0.2] * 5


def test_cosine_endpoints_and_midpoint():
    s = CosineSchedule(0.05, 0.5)
    assert s(0, 101) == pytest.approx(0.5)      # starts at tau_max
    assert s(100, 101) == pytest.approx(0.05)   # ends at tau_min
    # e / T = 1/2: cos(pi/2) = 0 -> tau_min + (tau_max - tau_min) / 2
    assert s(50, 101) == pytest.approx(0.275)
    # e / T = 1/4: 0.05 + 0.225 * (1 + sqrt(2)/2)
    assert s(25, 101) == pytest.approx(0.05 + 0.225 * (1 + math.sqrt(0.5)))
    values = [s(i, 101) for i in range(101)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_cosine_with_period_cycles():
    s = CosineSchedule(0.1, 0.3, period=10)
    assert s(0, 100) == pytest.approx(0.3)
    assert s(5, 100) == pytest.approx(0.1)       # half a cycle
    assert s(10, 100) == pytest.approx(0.3)      # a full cycle later
    assert s(20, 100) == pytest.approx(0.3)


def test_linear_ramp_endpoints_and_midpoint():
    s = LinearSchedule(0.1, 0.5)
    assert s(0, 11) == pytest.approx(0.1)
    assert s(10, 11) == pytest.approx(0.5)
    assert s(5, 11) == pytest.approx(0.3)
    assert s(0, 1) == pytest.approx(0.1)         # a one-step run uses the start value


def test_step_segments():
    s = StepSchedule([0.1, 0.2, 0.4])
    assert [s(i, 6) for i in range(6)] == [0.1, 0.1, 0.2, 0.2, 0.4, 0.4]
    s = StepSchedule([0.1, 0.5], milestones=[0.3])
    assert [s(i, 10) for i in range(10)] == [0.1] * 3 + [0.5] * 7


def test_learnable_returns_a_trainable_module():
    s = LearnableSchedule(0.07)
    assert s.learnable and isinstance(s.module, Temperature)
    assert s.value(0, 10) == pytest.approx(0.07, rel=1e-6)
    z = torch.randn(6, 3)
    loss = nt_xent_views(z, z + 0.1, temperature=s(0, 10))
    loss.backward()
    assert s.module.log_scale.grad is not None and float(s.module.log_scale.grad) != 0.0
    assert not ConstantSchedule(0.1).learnable


@pytest.mark.parametrize("spec, cls, config", [
    ("constant", ConstantSchedule, {"tau": 0.1}),
    ("constant:0.3", ConstantSchedule, {"tau": 0.3}),
    ("cosine:0.05,0.5", CosineSchedule, {"tau_min": 0.05, "tau_max": 0.5, "period": None}),
    ("cosine:0.05,0.5,40", CosineSchedule, {"tau_min": 0.05, "tau_max": 0.5, "period": 40}),
    ("linear:0.05,0.5", LinearSchedule, {"start": 0.05, "end": 0.5}),
    ("step:0.05,0.1,0.2", StepSchedule, {"values": [0.05, 0.1, 0.2], "milestones": [1 / 3, 2 / 3]}),
    ("step:0.05,0.5@0.25", StepSchedule, {"values": [0.05, 0.5], "milestones": [0.25]}),
    ("learnable", LearnableSchedule, {"initial": 0.1, "max_scale": 100.0}),
])
def test_parse(spec, cls, config):
    s = parse_schedule(spec, temperature=0.1)
    assert isinstance(s, cls)
    got = s.config()
    assert got.pop("kind") == spec.split(":")[0]
    assert set(got) == set(config)
    for key, expected in config.items():
        assert got[key] == (expected if expected is None else pytest.approx(expected)), key


@pytest.mark.parametrize("spec, message", [
    ("warm", "unknown temperature schedule"),
    ("cosine:0.5", "expected cosine"),
    ("cosine:0.5,0.05", "tau_min must be <= tau_max"),
    ("cosine:0.05,0.5,2.5", "whole number"),
    ("linear:0.1,x", "expected numbers"),
    ("linear:0,1", "start must be positive"),
    ("step:", "expected step"),
    ("step:0.1,0.2@0.5,0.7", "milestones must have"),
    ("step:0.1,0.2,0.3@0.6,0.4", "strictly increasing"),
    ("constant:-1", "tau must be positive"),
    ("", "must be one of"),
])
def test_parse_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_schedule(spec, temperature=0.1)


def test_constant_without_temperature():
    with pytest.raises(ValueError, match="needs a temperature"):
        parse_schedule("constant")


def test_step_arguments_checked():
    s = LinearSchedule(0.1, 0.2)
    with pytest.raises(ValueError, match="step must lie in"):
        s(5, 5)
    with pytest.raises(ValueError, match="total_steps must be >= 1"):
        s(0, 0)
    with pytest.raises(TypeError, match="step must be an int"):
        s(0.5, 5)
