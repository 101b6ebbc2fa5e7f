"""The temperature methods and Kukleva et al.'s schedule as ``--temperature-schedule`` forms:
parsing, configuration errors, training runs through each, and an exact resume of the
per-sample state."""

from __future__ import annotations

import json
import math

import pytest
import torch

from _tiny_run import tiny_config
from contrastkit import losses as L
from contrastkit.temperature import KuklevaSchedule, parse_schedule
from contrastkit.temperature_methods import get_temperature_method, parse_temperature_method
from contrastkit.temperature_methods import temperature_method_names
from contrastkit.train import PretrainConfig, pretrain


@pytest.mark.parametrize("spec, kind, settings", [
    ("macl", "macl", {"temperature": 0.1, "alpha": 0.5, "threshold": 0.0}),
    ("macl:0.2,1,0.3", "macl", {"temperature": 0.2, "alpha": 1.0, "threshold": 0.3}),
    ("dual", "dual", {"intra_temperature": 0.1, "inter_temperature": 1.0}),
    ("dual:0.2,0.5", "dual", {"intra_temperature": 0.2, "inter_temperature": 0.5}),
    ("individual", "individual", {"initial": 0.1, "rho": 0.4, "tau_min": 0.05, "tau_max": 1.0}),
    ("individual:0.2,0.3", "individual", {"initial": 0.2, "rho": 0.3, "tau_min": 0.05, "tau_max": 1.0}),
    ("network:0.2,0.3,0.1,0.5", "network", {"initial": 0.2, "rho": 0.3, "tau_min": 0.1, "tau_max": 0.5}),
])
def test_forms(spec, kind, settings):
    schedule = parse_temperature_method(spec)
    assert schedule.kind == kind
    assert schedule.config() == {"kind": kind, **settings}
    module = schedule.build(10, 4)
    assert isinstance(module, L.AdaptiveTemperatureLoss) and type(module) is get_temperature_method(kind).loss
    assert module.needs_indices == (kind in ("individual", "network"))
    assert schedule.initial == module.initial_value


@pytest.mark.parametrize("spec, message", [
    ("macl:0,1", "temperature must be positive"),
    ("macl:0.1,2", "alpha must lie in"),
    ("dual:0.1", "expected dual or dual:INTRA_TEMPERATURE,INTER_TEMPERATURE"),
    ("individual:0.2,0.4,0.1", "expected individual"),
    ("network:0.01", "initial must lie inside"),
    ("kukleva:1", "expected kukleva"),
    ("kukleva:0.5,0.1", "tau_min must be <= tau_max"),
])
def test_bad_forms_name_the_schedule(spec, message):
    parse = parse_schedule if spec.startswith("kukleva") else parse_temperature_method
    with pytest.raises(ValueError, match=message):
        parse(spec)


def test_kukleva_is_lightlys_periodic_cosine_of_the_epoch():
    scheduler = pytest.importorskip("lightly.utils.scheduler")
    schedule = parse_schedule("kukleva:0.1,1.0,3").bind(epochs=12)
    steps_per_epoch = 5
    for step in range(12 * steps_per_epoch):
        epoch = step // steps_per_epoch
        expected = scheduler.cosine_schedule(epoch, 12, start_value=1.0, end_value=0.1, period=6)
        assert schedule(step, 12 * steps_per_epoch) == pytest.approx(expected, rel=1e-12)
    assert schedule(0, 60) == 1.0 and schedule(15, 60) == pytest.approx(0.1)  # epoch T = 3: tau-
    defaults = KuklevaSchedule()
    assert (defaults.tau_min, defaults.tau_max, defaults.half_period) == (0.1, 1.0, 200)
    with pytest.raises(ValueError, match="bind"):
        KuklevaSchedule()(3, 10)


@pytest.mark.parametrize("spec", temperature_method_names())
def test_methods_other_than_simclr_refuse_a_temperature_method(tmp_path, spec):
    with pytest.raises(ValueError, match="applies to the methods whose loss is NT-Xent on two views"):
        tiny_config(tmp_path, method="dcl", temperature_method=spec).resolved()
    with pytest.raises(ValueError, match="sets its own temperatures"):
        tiny_config(tmp_path, temperature_method=spec, learnable_temperature=True).resolved()


def _records(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.mark.parametrize("spec", ["macl", "dual", "individual", "network", "kukleva:0.1,1.0,1"])
def test_a_run_trains_through_each_form(tmp_path, spec):
    out = tmp_path / "run"
    option = "temperature_schedule" if spec.startswith("kukleva") else "temperature_method"
    summary = pretrain(tiny_config(out, **{option: spec}, epochs=2), progress=False, baselines=False)
    assert math.isfinite(summary["final_loss"])
    records = _records(out)
    taus = [r["tau"] for r in records if r["kind"] == "step"]
    assert all(math.isfinite(t) and t > 0 for t in taus)
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]
    if spec in ("individual", "network"):
        assert state["temperature_method.log_u"].shape == (16,)  # one estimate per training scene
        assert bool(torch.isfinite(state["temperature_method.log_u"]).all())  # every scene seen in 2 epochs
    if spec == "individual":
        assert bool((state["temperature_method.tau"] != 0.1).any())
    if spec.startswith("kukleva"):
        assert taus[0] == 1.0 and taus[-1] == pytest.approx(0.1)  # T = 1 epoch: tau+ then tau-


class _Interrupt(Exception):
    pass


def _interrupt(epoch, record):
    if epoch == 1:
        raise _Interrupt()


@pytest.mark.parametrize("spec", ["individual", "network"])
def test_resume_keeps_the_per_sample_state_exactly(tmp_path, spec):
    straight = tmp_path / "straight"
    pretrain(tiny_config(straight, temperature_method=spec, epochs=2), progress=False, baselines=False)
    resumed = tmp_path / "resumed"
    config = tiny_config(resumed, temperature_method=spec, epochs=2)
    with pytest.raises(_Interrupt):
        pretrain(config, progress=False, baselines=False, on_epoch_end=_interrupt)
    pretrain(PretrainConfig(**config.to_dict()), resume=True, progress=False, baselines=False)
    a = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and any(key.startswith("temperature_method.") for key in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("form", ["macl", "dual:0.1,0.5", "individual"])
def test_a_temperature_method_given_as_a_schedule_is_refused_naming_its_option(tmp_path, capsys, form):
    """A temperature method has its own option; given as --temperature-schedule (or as
    temperature_schedule in a configuration file) it is refused in one line naming it."""
    from contrastkit.cli import main

    with pytest.raises(ValueError, match=f"is a temperature method.*--temperature-method {form}"):
        tiny_config(tmp_path, temperature_schedule=form).resolved()
    out = str(tmp_path / "out")
    assert main(["pretrain", "--temperature-schedule", form, "--epochs", "1", "--out", out]) == 2
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"temperature_schedule": form, "epochs": 1}), encoding="utf-8")
    assert main(["pretrain", "--config", str(config), "--out", out]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(f"--temperature-method {form}" in err for err in errors)
    assert not (tmp_path / "out").exists()


def test_a_temperature_method_takes_no_schedule_of_tau(tmp_path):
    with pytest.raises(ValueError, match="sets its own temperatures: drop temperature_schedule 'cosine:0.1,0.5'"):
        tiny_config(tmp_path, temperature_method="macl", temperature_schedule="cosine:0.1,0.5").resolved()
    with pytest.raises(ValueError, match=r"'cosine:0.1,0.5' is a schedule of tau \(--temperature-schedule\), not a temperature method"):
        tiny_config(tmp_path, temperature_method="cosine:0.1,0.5").resolved()
    resolved = tiny_config(tmp_path, temperature_method="dual:0.2,0.5").resolved()
    assert (resolved.temperature_method, resolved.temperature_schedule, resolved.temperature) == ("dual:0.2,0.5", None,
                                                                                                    0.2)


def test_a_run_recorded_before_the_temperature_method_option_reads_back(tmp_path):
    """A run folder whose config.json holds the method as its temperature_schedule (as
    contrastkit wrote it before --temperature-method) reads back as that method's run."""
    from contrastkit.train.checkpoint import load_checkpoint, save_checkpoint
    from contrastkit.train.runs import load_run

    from _tiny_run import train_only

    out = tmp_path / "run"
    train_only(tiny_config(out, temperature_method="dual:0.2,0.5", epochs=1))
    path = out / "config.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["config"]["temperature_method"] == "dual:0.2,0.5"
    old = {key: value for key, value in record["config"].items() if key != "temperature_method"}
    path.write_text(json.dumps({**record, "config": {**old, "temperature_schedule": "dual:0.2,0.5"}}), encoding="utf-8")
    checkpoint = out / "checkpoints" / "last.pt"
    state = load_checkpoint(str(checkpoint))
    state["config"] = {**old, "temperature_schedule": "dual:0.2,0.5"}  # the checkpoint as it was written then
    save_checkpoint(str(checkpoint), state)
    run = load_run(str(out))
    assert (run.config.temperature_method, run.config.temperature_schedule) == ("dual:0.2,0.5", None)
    model = run.build_model((1, 28, 28), torch.device("cpu"))
    assert type(model.temperature_method) is L.DualTemperatureNTXentLoss
