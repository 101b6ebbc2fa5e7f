"""The temperature schedule and the temperature method are functions of a resolved
configuration's fields, not state beside them: a copy made with ``dataclasses.replace`` or
through ``from_dict(to_dict())`` has the same schedule as the resolved configuration."""

import dataclasses
from dataclasses import replace

import pytest

from contrastkit.methods import PretrainConfig

CASES = [
    {},
    {"temperature": 0.3},
    {"learnable_temperature": True, "temperature": 0.2},
    {"temperature_schedule": "learnable:0.25"},
    {"temperature_schedule": "cosine:0.05,0.5"},
    {"temperature_schedule": "kukleva:0.1,1.0,5", "epochs": 7},
    {"temperature_schedule": "linear:0.05,0.5"},
    {"method": "siglip", "data": "glyphlab-text"},
    {"temperature_method": "macl"},
    {"temperature_method": "dual"},
]


def _trace(schedule, total=50):
    return (schedule.kind, schedule.learnable, [round(schedule.value(step, total), 12) for step in range(0, total, 7)]
            if schedule.kind != "learnable" else schedule.lowest)


@pytest.mark.parametrize("options", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_a_copy_made_any_way_has_the_resolved_schedule(options):
    resolved = PretrainConfig(**options).resolved()
    expected = _trace(resolved.schedule)
    assert _trace(replace(resolved).schedule) == expected
    assert _trace(PretrainConfig.from_dict(resolved.to_dict()).schedule) == expected
    assert _trace(replace(resolved, out="elsewhere").resolved().schedule) == expected  # resolving twice: the same


def test_an_unresolved_configuration_has_no_schedule_yet():
    with pytest.raises(ValueError, match="call PretrainConfig.resolved\\(\\) first"):
        PretrainConfig().schedule


def test_a_configuration_fitted_to_its_data_holds_only_its_fields_and_a_separate_record():
    """What the data decide is a record beside the configuration (DataChoices), not state
    inside it: the fitted configuration's attributes are its fields, and a copy of it trains
    the same (the batch, the queue)."""
    from dataclasses import fields

    from contrastkit.methods import default_batch_size, resolve_for_data

    batch, reason = default_batch_size(5000)
    resolved = PretrainConfig(method="moco").resolved()
    fitted, choices = resolve_for_data(resolved, 5000)
    assert set(vars(fitted)) == {f.name for f in fields(PretrainConfig)}
    assert (fitted.batch_size, choices.batch_size, choices.batch_reason) == (batch, batch, reason)
    assert fitted.queue_size == choices.queue_size == batch * min(16, 5000 // batch - 1)  # MoCo's default
    assert choices.record() == {"train_size": 5000, "batch_size": {"value": batch, "reason": reason}}
    assert choices.describe() == f"batch size {batch}, chosen for {reason}; --batch-size sets it"
    copy = PretrainConfig.from_dict(fitted.to_dict())
    assert (copy.batch_size, copy.queue_size) == (fitted.batch_size, fitted.queue_size)
    given = resolve_for_data(PretrainConfig(batch_size=64).resolved(), 5000)[1]
    assert given.record() == {} and given.describe() is None and given.batch_size == 64 and given.queue_size is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.batch_size = 32  # an immutable record


def test_resolve_for_data_refuses_what_no_step_can_take_before_the_queue_divides_by_it():
    """A split of fewer than 2 images, or a step's batch that the processes cannot share, is
    refused in words before MoCo's queue is sized from the step's batch (no division by 0)."""
    from contrastkit.methods import resolve_for_data

    moco = PretrainConfig(method="moco", batch_size=8).resolved()
    with pytest.raises(ValueError, match=r"the training split of glyphlab has 0 image\(s\); at least 2 are needed"):
        resolve_for_data(moco, 0)
    with pytest.raises(ValueError, match=r"the training split of glyphlab has 1 image\(s\)"):
        resolve_for_data(moco, 1)
    with pytest.raises(ValueError, match=r"the batch size 6 must be a multiple of the number of processes \(4\)"):
        resolve_for_data(moco, 6, world_size=4)  # the step takes the whole split of 6
    fitted, choices = resolve_for_data(moco, 6, world_size=2)
    assert (choices.step_batch, choices.queue_size, fitted.batch_size) == (6, 6, 8)  # config.json keeps the given 8


@pytest.mark.parametrize("options", [{"temperature_schedule": "cosine:0.1,0.5"},
                                     {"temperature_method": "individual"}], ids=["schedule", "per-sample-state"])
def test_a_copy_of_a_resolved_configuration_trains_the_same_run(tmp_path, options):
    """The issue's test: the run of a resolved configuration, of its ``replace()`` copy and of
    ``from_dict(to_dict())`` end with the same weights after their 2 steps: nothing the run
    needs lives beside the fields."""
    import os

    import torch

    from _tiny_run import tiny_config, train_only

    resolved = tiny_config(tmp_path / "a", **options).resolved()
    copies = {"a": resolved, "b": replace(resolved, out=str(tmp_path / "b")),
              "c": PretrainConfig.from_dict({**resolved.to_dict(), "out": str(tmp_path / "c")})}
    weights = {}
    for name, config in copies.items():
        train_only(config)
        weights[name] = torch.load(os.path.join(config.out, "checkpoints", "last.pt"), map_location="cpu",
                                   weights_only=False)["model"]
    for name in ("b", "c"):
        assert weights[name].keys() == weights["a"].keys()
        assert all(torch.equal(weights[name][key], weights["a"][key]) for key in weights["a"]), name
