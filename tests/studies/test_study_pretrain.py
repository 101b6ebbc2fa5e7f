"""Temperature schedules and representation metrics inside ``contrastkit.train.pretrain``."""

import json
import math
import os

import pytest
import torch

from contrastkit.data import load_dataset, make_views
from contrastkit.temperature import CosineSchedule
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.methods.geometry import geometry


def tiny(train_scenes=32, test_scenes=15):
    return dict(data="glyphlab", data_options=dict(train_scenes=train_scenes, val_scenes=9, test_scenes=test_scenes,
                                                   size=28), device="cpu")


def records(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def cosine_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cosine"))
    config = PretrainConfig(epochs=2, batch_size=8, eval_every=1, temperature_schedule="cosine:0.05,0.5", out=out,
                            **tiny())
    summary = pretrain(config, progress=False, baselines=False)
    return out, summary


def test_scheduled_tau_is_logged_every_step_and_used(cosine_run):
    out, summary = cosine_run
    taus = [r for r in records(out) if r["kind"] == "tau"]
    total = 2 * (32 // 8)
    assert [r["step"] for r in taus] == list(range(1, total + 1))
    expected = CosineSchedule(0.05, 0.5)
    assert [r["tau"] for r in taus] == pytest.approx([expected.value(s, total) for s in range(total)])
    assert taus[0]["tau"] == pytest.approx(0.5) and taus[-1]["tau"] == pytest.approx(0.05)
    # the model's temperature followed the schedule (float32 storage of log(1/tau))
    assert summary["final_temperature"] == pytest.approx(0.05, rel=1e-6)
    assert summary["temperature_schedule"] == "cosine:0.05,0.5"
    with open(os.path.join(out, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)["config"]
    assert config["temperature"] == pytest.approx(0.5)  # the schedule's first value


def test_representation_metrics_in_summary_and_at_each_evaluation(cosine_run):
    out, summary = cosine_run
    geometry_ = summary["representation"]
    assert geometry_["samples"] == 15
    for space in ("h", "z"):
        metrics = geometry_[space]
        assert 0.0 <= metrics["alignment"] <= 4.0
        assert metrics["uniformity"] <= 0.0
        assert -1.0 <= metrics["tolerance"] <= 1.0
        assert len(metrics["top_negative_similarity"]) == 10
        assert 0.0 < metrics["penalty_entropy"] <= metrics["penalty_entropy_max"] + 1e-9
        assert metrics["penalty_entropy_max"] == pytest.approx(math.log(2 * 8 - 2))
        assert 1.0 <= metrics["effective_rank"]
    epochs = [r for r in records(out) if r["kind"] == "epoch"]
    assert len(epochs) == 2 and all("h" in r["val_geometry"] and "z" in r["val_geometry"] for r in epochs)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        assert json.load(handle)["representation"] == json.loads(json.dumps(geometry_))


def test_geometry_leaves_training_rng_alone_and_repeats():
    from contrastkit.methods import build_model

    ds = load_dataset("glyphlab", **tiny(16, 12)["data_options"])
    model = build_model(PretrainConfig(epochs=1, batch_size=4).resolved(), 1)
    views = make_views(ds, mode="augment")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = geometry(model, ds.test, views, torch.device("cpu"), temperature=0.2, batch_size=4)
    assert torch.equal(torch.get_rng_state(), before)
    second = geometry(model, ds.test, views, torch.device("cpu"), temperature=0.2, batch_size=4)
    assert first == second
    assert model.training  # mode restored


@pytest.mark.parametrize("options, message", [
    ({"temperature_schedule": "cosine:0.005,0.5"}, "below the supported minimum 0.01"),
    ({"temperature_schedule": "linear:0.1,0.5", "learnable_temperature": True}, "cannot follow the schedule"),
    ({"temperature_schedule": "sometimes"}, "unknown temperature schedule"),
])
def test_config_rejects_bad_schedules(options, message):
    with pytest.raises(ValueError, match=message):
        PretrainConfig(**options).resolved()


def test_config_learnable_and_constant_forms():
    c = PretrainConfig(temperature_schedule="learnable:0.1").resolved()
    assert c.learnable_temperature and c.temperature == 0.1 and c.temperature_schedule == "learnable"
    c = PretrainConfig(learnable_temperature=True, temperature=0.3).resolved()
    assert c.temperature_schedule == "learnable" and c.temperature == 0.3
    c = PretrainConfig(temperature_schedule="constant:0.4").resolved()
    assert c.temperature == 0.4 and c.temperature_schedule == "constant"
    assert c.resolved().to_dict() == c.to_dict()  # resolving twice changes nothing (resume compares)


def test_simple_and_hard_negative_methods_train(tmp_path):
    for method in ("simple", "hard_negative"):
        out = str(tmp_path / method)
        summary = pretrain(PretrainConfig(method=method, epochs=1, batch_size=8, out=out, **tiny(16, 9)),
                           progress=False, baselines=False)
        assert summary["method"] == method and math.isfinite(summary["final_loss"])
        assert "random_init_probe_accuracy" not in summary and summary["beats_baselines"] is None
        assert not any(r["kind"] == "tau" for r in records(out))  # constant tau: not logged per step


def test_pretrain_command_takes_a_schedule(tmp_path, capsys):
    from contrastkit.cli import main

    out = str(tmp_path / "run")
    args = ["pretrain", "--data", "glyphlab", "--data-option", "train_scenes=16", "--data-option", "val_scenes=9",
            "--data-option", "test_scenes=12", "--data-option", "size=28", "--epochs", "2", "--batch-size", "8",
            "--temperature-schedule", "linear:0.1,0.3", "--out", out, "--quiet", "--json", "--device", "cpu"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["temperature_schedule"] == "linear:0.1,0.3"
    # 4 steps: 0.1, 0.1 + 0.2/3, 0.1 + 0.4/3, 0.3
    assert [r["tau"] for r in records(out) if r["kind"] == "tau"] == pytest.approx([0.1, 0.1 + 0.2 / 3,
                                                                                    0.1 + 0.4 / 3, 0.3])
    assert "h" in summary["representation"]
    assert main(args[:-6] + ["--temperature-schedule", "cosine:0.5", "--out", str(tmp_path / "bad")]) == 2
    assert "expected cosine" in capsys.readouterr().err
