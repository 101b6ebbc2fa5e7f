"""Bring your own encoder: the built-ins, factories by path, modules as objects, the dry-forward
checks, and the rebuild of a run's encoder by ``probe`` without repeating its options."""

import json

import pytest
import torch
from torch import nn

import custom_encoders
from _tiny_run import TINY_GLYPHLAB, tiny_config
from contrastkit.cli import main
from contrastkit.models import (PooledEncoder, ResNet50, SmallViT, describe_encoder, encoder_from_spec,
                                load_factory, prepare_encoder)
from contrastkit.train import PretrainConfig, evaluate_run, pretrain
from contrastkit.methods import build_model

NUMBERS = ("probe_accuracy", "knn_accuracy", "random_init_probe_accuracy")


def _config_json(out):
    with open(out / "config.json", encoding="utf-8") as handle:
        return json.load(handle)["config"]


def _summary(out):
    with open(out / "summary.json", encoding="utf-8") as handle:
        return json.load(handle)


# -- built-ins -----------------------------------------------------------------------------

def test_resnet50_and_vit_builtins_shapes():
    x = torch.rand(2, 3, 32, 32)
    resnet = ResNet50(3, width=8)
    assert resnet(x).shape == (2, 32 * 8) and resnet.out_dim == 256
    vit = SmallViT(3, dim=32, depth=1, heads=2)
    assert vit(x).shape == (2, 32)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in vit.modules())  # no batch statistics
    vit.eval()
    a, b = vit(x), vit(torch.cat([x[:1], torch.rand(1, 3, 32, 32)]))
    assert torch.allclose(a[0], b[0], atol=1e-6)  # a row does not depend on the rest of the batch
    with pytest.raises(ValueError, match="32x32"):
        prepare_encoder(SmallViT(1), (1, 28, 28), name="'vit'")


def test_builtin_options_reach_the_constructor():
    model = build_model(PretrainConfig(encoder="resnet50", encoder_options={"width": 4}).resolved(), (3, 16, 16))
    assert model.encoder.out_dim == 128 and model.head.net[0].in_features == 128
    with pytest.raises(TypeError, match="resnet18"):
        encoder_from_spec("resnet18", 3, {"depth": 3})


# -- factories and objects -----------------------------------------------------------------

def test_factory_paths_resolve_and_bad_ones_are_named():
    assert load_factory("custom_encoders:tiny_conv") is custom_encoders.tiny_conv
    with pytest.raises(ValueError, match="cannot import module 'no_such_package.models'"):
        load_factory("no_such_package.models:net")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_factory("custom_encoders:missing")
    with pytest.raises(ValueError, match="package.module:factory"):
        load_factory("custom_encoders")
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        encoder_from_spec("custom_encoders:not_a_module", 1)
    # in_channels is passed when the factory takes it and the options do not set it
    assert encoder_from_spec("custom_encoders:tiny_conv", 3, {"width": 2}).net[0].in_channels == 3


def test_describe_encoder_records_an_importable_class_else_an_object():
    assert describe_encoder(custom_encoders.TinyConv(), 1) == "custom_encoders:TinyConv"
    assert describe_encoder(custom_encoders.TinyConv(3), 3) == "custom_encoders:TinyConv"  # in_channels passed
    assert describe_encoder(custom_encoders.TinyConv(1, width=9), 1) == "object:custom_encoders.TinyConv"

    class Local(nn.Module):
        def forward(self, x):
            return x.flatten(1)

    assert describe_encoder(Local(), 1).startswith("object:")


@pytest.mark.parametrize("module, message", [
    (custom_encoders.WrongShape(), r"WrongShape.*\(2,\); expected \(N, D\)"),
    (custom_encoders.NotFinite(), "NotFinite.*not finite"),
    (custom_encoders.Noisy(), "Noisy.*differ"),
])
def test_bad_encoders_get_one_clear_error_naming_them(tmp_path, module, message):
    with pytest.raises(ValueError, match=message):
        pretrain(tiny_config(tmp_path / "run"), encoder=module, progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused during set-up, before any step


def test_dry_forward_pools_trailing_dims_and_leaves_the_rng_and_statistics_alone():
    encoder = custom_encoders.TinyConv(3, width=5)
    before = torch.get_rng_state()
    prepared = prepare_encoder(encoder, (3, 8, 8))
    assert torch.equal(before, torch.get_rng_state())
    assert isinstance(prepared, PooledEncoder) and prepared.out_dim == 5
    assert prepared(torch.rand(4, 3, 8, 8)).shape == (4, 5)
    small = build_model(PretrainConfig().resolved(), (1, 16, 16)).encoder
    assert int(small.features[1].num_batches_tracked) == 0 and small.training


# -- end to end ----------------------------------------------------------------------------

def test_factory_trains_and_probes_through_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--data", "glyphlab", *sum((["--data-option", f"{k}={v}"] for k, v in TINY_GLYPHLAB.items()), []),
                 "--encoder", "custom_encoders:tiny_conv", "--encoder-option", "width=6", "--epochs", "1",
                 "--batch-size", "8", "--out", str(out), "--quiet", "--device", "cpu", "--no-report"])
    assert code == 0
    capsys.readouterr()
    stored = _config_json(out)
    assert stored["encoder"] == "custom_encoders:tiny_conv" and stored["encoder_options"] == {"width": 6}
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert state["model"]["encoder.module.net.0.weight"].shape[0] == 6  # the option reached the factory
    assert main(["probe", str(out), "--json", "--device", "cpu"]) == 0  # no --encoder-option repeated
    again = json.loads(capsys.readouterr().out)
    summary = _summary(out)
    for key in NUMBERS:
        assert again[key] == summary[key], key


@pytest.mark.parametrize("spec, expected", [
    ("no_such_package.nets:resnet", "cannot import module 'no_such_package.nets'"),
    ("custom_encoders:nope", "has no attribute 'nope'"),
    ("custom_encoders:WrongShape", "expected"),
    ("nonsense", "encoder must be one of"),
])
def test_cli_bad_encoder_is_one_line_exit_2(tmp_path, capsys, spec, expected):
    code = main(["pretrain", "--encoder", spec, "--epochs", "1", "--out", str(tmp_path / "run"), "--quiet",
                 "--device", "cpu", *sum((["--data-option", f"{k}={v}"] for k, v in TINY_GLYPHLAB.items()), [])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_module_object_trains_in_place_and_probe_rebuilds_it_by_class(tmp_path):
    encoder = custom_encoders.TinyConv(in_channels=1)
    initial = {k: v.clone() for k, v in encoder.state_dict().items()}
    out = tmp_path / "run"
    summary = pretrain(tiny_config(out), encoder=encoder, progress=False)
    assert _config_json(out)["encoder"] == "custom_encoders:TinyConv"
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]
    for key, value in encoder.state_dict().items():  # the caller's module holds the trained weights
        assert torch.equal(value, state[f"encoder.module.{key}"]), key
    assert not all(torch.equal(initial[k], v) for k, v in encoder.state_dict().items())
    again = evaluate_run(str(out), device="cpu")  # rebuilt as TinyConv() from the recorded class path
    for key in NUMBERS:
        assert again[key] == summary[key], key


def test_module_that_cannot_be_rebuilt_needs_encoder_again(tmp_path):
    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 3, 3)

        def forward(self, x):
            return self.conv(x)

    def initial():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            return Local()

    out = tmp_path / "run"
    summary = pretrain(tiny_config(out), encoder=initial(), progress=False)
    assert _config_json(out)["encoder"].startswith("object:")
    with pytest.raises(ValueError, match=r"pass the module again \(encoder=...\)"):
        evaluate_run(str(out), device="cpu")
    # the random-init baseline of such a run starts from the module passed: the same one again
    again = evaluate_run(str(out), device="cpu", encoder=initial())
    for key in NUMBERS:
        assert again[key] == summary[key], key
    # an importable class whose defaults build another architecture is recorded as an object too
    out2 = tmp_path / "wide"
    pretrain(tiny_config(out2), encoder=custom_encoders.TinyConv(1, width=7), progress=False, baselines=False)
    assert _config_json(out2)["encoder"] == "object:custom_encoders.TinyConv"
    with pytest.raises(ValueError, match=r"custom_encoders.TinyConv.*encoder=\.\.\."):
        evaluate_run(str(out2), device="cpu")


def test_vit_builtin_trains(tmp_path):
    config = tiny_config(tmp_path / "run", encoder="vit", data_options=dict(TINY_GLYPHLAB, size=32),
                         encoder_options={"dim": 32, "depth": 1, "heads": 2})
    summary = pretrain(config, progress=False, baselines=False)
    assert summary["encoder"] == "vit" and 0.0 <= summary["probe_accuracy"] <= 1.0
