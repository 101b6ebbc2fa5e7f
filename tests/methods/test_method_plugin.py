"""A new method is one subclass in one file: a toy method defined and registered here trains end
to end (library, trainer, CLI, re-evaluation) without touching any other module."""

from __future__ import annotations

import json

import pytest
import torch

from contrastkit import losses
from contrastkit.cli import main
from contrastkit.methods import (PretrainConfig, TwoViewMethod, get_method, method_names, register_method,
                                 unregister_method)
from contrastkit.train import evaluate_run, pretrain

from _tiny_run import TINY_ARGS, tiny_config


class AlignUniform(TwoViewMethod):
    """Wang & Isola's alignment + uniformity objective on the normalised ``z`` (a loss no
    built-in method uses)."""

    name = "toy_align_uniform"
    default_temperature = 0.5  # reported only: the objective has no temperature
    cached_gradients = False

    def objective(self, model, embeddings, labels):
        z_a, z_b = (torch.nn.functional.normalize(z, dim=1) for z in embeddings)
        align = (z_a - z_b).pow(2).sum(1).mean()
        z = torch.cat([z_a, z_b])
        uniform = torch.pdist(z).pow(2).mul(-2).exp().mean().log()
        return align + uniform


@pytest.fixture
def toy_method():
    register_method(AlignUniform)
    try:
        yield get_method(AlignUniform.name)
    finally:
        unregister_method(AlignUniform.name)
    assert AlignUniform.name not in method_names()


def test_a_registered_method_completes_its_config_with_its_own_facts(toy_method):
    config = PretrainConfig(method=toy_method.name).resolved()
    assert config.temperature == 0.5 and not config.paired and config.views == "augment"
    with pytest.raises(ValueError, match="micro-batch"):
        PretrainConfig(method=toy_method.name, micro_batch=4).resolved()
    with pytest.raises(ValueError, match="already registered"):
        register_method(type("Other", (TwoViewMethod,), {"name": toy_method.name, "default_temperature": 0.1}))


def test_a_registered_method_trains_end_to_end_and_is_re_evaluated(toy_method, tmp_path):
    summary = pretrain(tiny_config(tmp_path / "run", method=toy_method.name, epochs=2), progress=False)
    assert summary["method"] == toy_method.name
    assert summary["epochs"] == 2 and 0.0 <= summary["probe_accuracy"] <= 1.0
    assert "representation" in summary  # the two-view methods' geometry came with the base class
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["config"]["method"] == toy_method.name
    again = evaluate_run(str(tmp_path / "run"), device="cpu", baselines=False)
    assert again["probe_accuracy"] == pytest.approx(summary["probe_accuracy"], abs=1e-9)


def test_the_cli_offers_a_registered_method(toy_method, tmp_path, capsys):
    assert main(["pretrain", *TINY_ARGS, "--method", toy_method.name, "--epochs", "1",
                 "--out", str(tmp_path / "cli"), "--no-baselines", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == toy_method.name


def test_an_unregistered_name_is_one_clear_error():
    with pytest.raises(ValueError, match="method must be one of"):
        PretrainConfig(method="toy_align_uniform").resolved()
