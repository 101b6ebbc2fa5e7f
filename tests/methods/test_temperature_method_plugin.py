"""A temperature method plugs in with one file and its registration (toy_temperature_method.py):
it trains in ``contrastkit pretrain``'s loop and under Lightning, ``explain --methods`` explains
it and ``experiment temperature-methods`` lists and runs it, with nothing else written for it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys

import pytest
import torch

from _tiny_run import tiny_config, train_only
from contrastkit.cli import main
from contrastkit.temperature_methods import temperature_method_names, unregister_temperature_method

HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None


@pytest.fixture
def toy():
    """The toy method registered for one test (its module imported afresh: the import registers it)."""
    sys.modules.pop("toy_temperature_method", None)
    module = importlib.import_module("toy_temperature_method")
    yield module
    unregister_temperature_method("toy")
    sys.modules.pop("toy_temperature_method", None)


def test_without_its_file_the_toy_is_unknown():
    assert "toy" not in temperature_method_names()
    with pytest.raises(ValueError, match="unknown temperature method 'toy'"):
        tiny_config("unused", temperature_method="toy").resolved()


def test_its_form_defaults_and_state_come_from_its_loss(toy):
    spec = toy.TOY
    assert spec.defaults == {"temperature": 0.3, "growth": 1.1}  # ToyTemperatureLoss's signature
    assert spec.form == "toy or toy:TEMPERATURE[,GROWTH]" and spec.keeps_sample_state
    assert temperature_method_names()[-1] == "toy"
    from dataclasses import replace

    from contrastkit.temperature_methods import register_temperature_method

    with pytest.raises(ValueError, match="'cosine' names a temperature schedule"):
        register_temperature_method(replace(spec, name="cosine"))
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_temperature_method(replace(spec, summary="another toy"))


def test_it_trains_in_the_loop(tmp_path, toy):
    out = tmp_path / "run"
    train_only(tiny_config(out, temperature_method="toy:0.25,1.5", epochs=1))
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]
    # 16 training scenes, batches of 8: every scene trained once, its tau grown once.
    assert state["temperature_method.steps"].tolist() == [1] * 16
    assert torch.allclose(state["temperature_method.tau"], torch.full((16,), 0.25 * 1.5), rtol=1e-6)
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        steps = [r for r in map(json.loads, handle) if r["kind"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(r["loss"]) for r in steps)
    assert steps[0]["tau"] == pytest.approx(0.25, rel=1e-6)  # the anchors' mean tau at the first step


@pytest.mark.skipif(not HAS_LIGHTNING, reason="the lightning extra is not installed")
@pytest.mark.filterwarnings("ignore:.*LeafSpec")
def test_it_trains_under_lightning(tmp_path, toy):
    import lightning

    from contrastkit.data import load_dataset
    from contrastkit.integrations.lightning import ContrastiveDataModule, ContrastiveModule
    from contrastkit.train import PretrainConfig

    data = ContrastiveDataModule(load_dataset("glyphlab", train_scenes=32, val_scenes=8, test_scenes=8),
                                 batch_size=16)
    module = ContrastiveModule(PretrainConfig(data="glyphlab", batch_size=16, temperature_method="toy:0.2,2",
                                              seed=0), data)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                                max_steps=2, limit_val_batches=1, val_check_interval=2)
    trainer.fit(module, data)
    assert trainer.global_step == 2 and math.isfinite(float(trainer.callback_metrics["loss"]))
    loss = module.model.temperature_method
    assert type(loss).__name__ == "ToyTemperatureLoss"
    # Two steps of 16 of the 32 scenes, each scene once (a shuffled epoch): its tau doubled once.
    assert loss.steps.tolist() == [1] * 32 and torch.allclose(loss.tau, torch.full((32,), 0.4))


def test_explain_methods_explains_it(toy, capsys):
    assert main(["explain", "0.8", "0.4", "0.2", "--methods", "--plain"]) == 0
    printed = capsys.readouterr().out
    assert "Toy: Toy (a test of contrastkit): tau grows by a factor each time its sample trains" in printed
    assert "Toy: InfoNCE at the starting temperature (a sample not trained yet)." in printed
    assert main(["explain", "0.8", "0.4", "0.2", "--method", "toy:0.5", "--json"]) == 0
    (view,) = json.loads(capsys.readouterr().out)["methods"]
    assert view["method"] == "toy" and view["settings"] == {"temperature": 0.5, "growth": 1.1}
    assert view["temperatures"] == [0.5]


def test_the_temperature_methods_study_lists_and_runs_it(tmp_path, toy, capsys):
    from contrastkit import studies
    from contrastkit.studies import TEMPERATURE_METHODS

    assert TEMPERATURE_METHODS.settings()["methods"] == ["macl", "dual", "individual", "network", "toy"]
    with pytest.raises(SystemExit):
        main(["experiment", "--help"])
    assert "macl dual individual network toy" in " ".join(capsys.readouterr().out.split())
    result = studies.run_experiment("temperature-methods", str(tmp_path / "study"), progress=False, seeds=1,
                                    epochs=1, batch_size=20, train_limit=40, eval_every=1, temperatures=[0.2],
                                    methods=["toy"], jobs=2)  # two worker processes, the toy known to both
    assert {row["method"] for row in result.rows} == {"fixed", "toy"}
    (verdict,) = result.verdicts
    assert verdict.claim == "Toy (a test of contrastkit) beats the best fixed tau"
    toy_run = next(s for s in result.specs if s.row == "toy")
    assert toy_run.summary["temperature_method"] == "toy"
