"""The temperature schedule and the temperature method are functions of a resolved
configuration's fields, not state beside them: a copy made with ``dataclasses.replace`` or
through ``from_dict(to_dict())`` has the same schedule as the resolved configuration."""

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

    from contrastkit.methods import default_batch_size

    batch, reason = default_batch_size(5000)
    resolved = PretrainConfig(method="moco").resolved()
    choices = resolved.data_choices(5000)
    fitted = resolved.fit_to_data(5000).with_queue(choices.batch_size, 5000)
    assert set(vars(fitted)) == {f.name for f in fields(PretrainConfig)}
    assert (fitted.batch_size, choices.batch_size, choices.batch_reason) == (batch, batch, reason)
    assert fitted.queue_size == batch * min(16, 5000 // batch - 1)  # MoCo's default, a multiple of the batch
    assert choices.record() == {"train_size": 5000, "batch_size": {"value": batch, "reason": reason}}
    assert choices.describe() == f"batch size {batch}, chosen for {reason}; --batch-size sets it"
    copy = PretrainConfig.from_dict(fitted.to_dict())
    assert (copy.batch_size, copy.queue_size) == (fitted.batch_size, fitted.queue_size)
    given = PretrainConfig(batch_size=64).resolved().data_choices(5000)
    assert given.record() == {} and given.describe() is None and given.batch_size == 64


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
