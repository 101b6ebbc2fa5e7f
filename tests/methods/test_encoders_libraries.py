"""Encoders from timm and torchvision (the classifier removed, the CIFAR stem, any channel count),
local weights with their key report, and the clear errors: an unknown model, a stem a family does
not have, a shape mismatch naming the key, a missing package naming the extra."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from _tiny_run import TINY_ARGS
from contrastkit.cli import main
from contrastkit.extras import MissingExtraError
from contrastkit.models import (ResNet18, encoder_from_spec, load_encoder_weights, prepare_encoder,
                                remove_classifier)
from contrastkit.train import evaluate_run

timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'contrastkit[timm]')")
torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (pip install 'contrastkit[torchvision]')")


def _seeded(spec, in_channels, options=None, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return encoder_from_spec(spec, in_channels, options or {}).eval()


def _layer1_side(model, side):
    """The side of ``layer1``'s feature map for a ``side x side`` image."""
    seen = []
    handle = model.layer1.register_forward_hook(lambda module, inputs, output: seen.append(output.shape[-1]))
    with torch.no_grad():
        model(torch.rand(1, model.conv1.in_channels, side, side))
    handle.remove()
    return seen[0]


# -- the models ----------------------------------------------------------------------------

def test_torchvision_resnet18_with_the_cifar_stem_is_the_builtin_network():
    library = _seeded("torchvision:resnet18", 3, {"cifar_stem": True})
    builtin = ResNet18(3)
    shapes = sorted(tuple(p.shape) for p in library.parameters())
    assert shapes == sorted(tuple(p.shape) for p in builtin.parameters())  # same layers, other names
    assert _layer1_side(library, 32) == 32  # the stem keeps 32x32 ...
    assert _layer1_side(_seeded("torchvision:resnet18", 3), 32) == 8  # ... where ImageNet's cuts it to 8x8
    assert library(torch.rand(2, 3, 32, 32)).shape == (2, 512)


def test_timm_takes_in_chans_and_the_cifar_stem():
    model = _seeded("timm:resnet18", 1, {"cifar_stem": True})
    assert tuple(model.conv1.weight.shape) == (64, 1, 3, 3) and isinstance(model.maxpool, nn.Identity)
    assert _layer1_side(model, 16) == 16
    assert model(torch.rand(2, 1, 16, 16)).shape == (2, 512)  # num_classes=0: pooled features


def test_torchvision_grayscale_sums_the_rgb_filters():
    rgb, gray = _seeded("torchvision:resnet18", 3), _seeded("torchvision:resnet18", 1)
    assert torch.equal(gray.conv1.weight, rgb.conv1.weight.sum(dim=1, keepdim=True))
    x = torch.rand(2, 1, 32, 32)
    with torch.no_grad():  # a gray image gives what the same image in R, G and B gives
        torch.testing.assert_close(gray(x), rgb(x.repeat(1, 3, 1, 1)), rtol=1e-4, atol=1e-5)
    assert _seeded("torchvision:resnet18", 4).conv1.weight.shape[1] == 4


@pytest.mark.parametrize("name, replaced, features", [
    ("resnet18", "fc", 512),
    ("mobilenet_v3_small", "classifier.3", 1024),  # the hidden layer before the logits stays
])
def test_torchvision_classifier_is_removed(name, replaced, features):
    model = torchvision.models.get_model(name)
    assert remove_classifier(model) == replaced
    assert prepare_encoder(model.eval(), (3, 32, 32)).out_dim == features


def test_a_model_without_a_linear_classifier_is_refused():
    with pytest.raises(ValueError, match="squeezenet1_0.*no linear classification layer"):
        encoder_from_spec("torchvision:squeezenet1_0", 3)


@pytest.mark.parametrize("spec", ["timm:vit_tiny_patch16_224", "torchvision:mobilenet_v3_small"])
def test_the_cifar_stem_is_refused_for_other_families(spec):
    with pytest.raises(ValueError, match=f"cifar_stem applies to ResNet-family models.*{spec}"):
        encoder_from_spec(spec, 3, {"cifar_stem": True})


def test_unknown_models_and_bad_options_are_named():
    with pytest.raises(ValueError, match=r"timm has no model 'resnet181' \(did you mean resnet18"):
        encoder_from_spec("timm:resnet181", 3)
    with pytest.raises(ValueError, match="torchvision has no model 'resnet_18'"):
        encoder_from_spec("torchvision:resnet_18", 3)
    with pytest.raises(TypeError, match=r"torchvision:resnet18: bad encoder options \['depth'\]"):
        encoder_from_spec("torchvision:resnet18", 3, {"depth": 3})
    with pytest.raises(ValueError, match="num_classes is not taken"):
        encoder_from_spec("timm:resnet18", 3, {"num_classes": 10})
    with pytest.raises(TypeError, match="cifar_stem must be true or false"):
        encoder_from_spec("timm:resnet18", 3, {"cifar_stem": "yes"})


@pytest.mark.parametrize("spec, modules, extra", [
    ("timm:resnet18", ["timm"], "timm"),
    ("torchvision:resnet18", ["torchvision", "torchvision.models"], "torchvision"),
])
def test_a_missing_package_names_the_extra(monkeypatch, tmp_path, capsys, spec, modules, extra):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import of it fails as if it were not installed
    with pytest.raises(MissingExtraError, match=rf"pip install 'contrastkit\[{extra}\]'"):
        encoder_from_spec(spec, 3)
    code = main(["pretrain", *TINY_ARGS, "--encoder", spec, "--epochs", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"contrastkit[{extra}]" in err and "Traceback" not in err


def test_the_core_imports_neither_library():
    code = ("import sys, contrastkit.train, contrastkit.models, contrastkit.methods, contrastkit.cli\n"
            "from contrastkit.models import encoder_from_spec\n"
            "encoder_from_spec('resnet18', 3)\n"
            "print(sorted(m for m in ('timm', 'torchvision', 'onnx', 'onnxruntime', 'safetensors') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.strip() == "[]"


# -- local weights -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def imagenet_resnet18(tmp_path_factory):
    """A torchvision ResNet-18 state dict with its classifier, as a training script saves it:
    nested under 'state_dict', every key prefixed 'module.' (DistributedDataParallel)."""
    full = torchvision.models.resnet18()
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save({"epoch": 90, "state_dict": {f"module.{k}": v for k, v in full.state_dict().items()}}, path)
    return path, full.state_dict()


def test_local_weights_load_with_a_key_report(imagenet_resnet18):
    path, state = imagenet_resnet18
    encoder = _seeded("torchvision:resnet18", 3)
    report = load_encoder_weights(encoder, path)
    assert report.prefix == "module." and report.missing == ()
    assert report.unexpected == ("module.fc.weight", "module.fc.bias")
    assert set(report.loaded) == set(encoder.state_dict()) and len(report.sha256) == 64
    for key, value in encoder.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert "2 unexpected (ignored): module.fc.weight, module.fc.bias" in report.summary()


def test_safetensors_weights_report_what_they_lack(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    source = _seeded("timm:resnet18", 3, seed=1).state_dict()
    kept = {k: v for k, v in source.items() if not k.startswith("layer4.")}
    safetensors.save_file(kept, str(tmp_path / "partial.safetensors"))
    encoder = _seeded("timm:resnet18", 3, seed=2)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    report = load_encoder_weights(encoder, tmp_path / "partial.safetensors")
    assert report.prefix == "" and report.unexpected == ()
    assert set(report.missing) == {k for k in source if k.startswith("layer4.")}
    after = encoder.state_dict()
    assert all(torch.equal(after[k], kept[k]) for k in kept)
    assert all(torch.equal(after[k], before[k]) for k in report.missing)  # left at their initialisation


def test_a_shape_mismatch_is_refused_naming_the_key(imagenet_resnet18):
    path, _ = imagenet_resnet18
    encoder = _seeded("torchvision:resnet18", 3, {"cifar_stem": True})
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    with pytest.raises(ValueError, match=r"module\.conv1\.weight has shape \(64, 3, 7, 7\), the encoder's "
                                         r"conv1\.weight has shape \(64, 3, 3, 3\)"):
        load_encoder_weights(encoder, path)
    assert all(torch.equal(v, before[k]) for k, v in encoder.state_dict().items())  # nothing loaded


def test_weights_files_that_cannot_serve_are_refused(tmp_path):
    encoder = nn.Sequential(nn.Conv2d(1, 2, 3))
    with pytest.raises(FileNotFoundError, match="nothing.pt does not exist"):
        load_encoder_weights(encoder, tmp_path / "nothing.pt")
    torch.save(nn.Linear(2, 2), tmp_path / "module.pt")  # a pickled module, not a state dict
    with pytest.raises(ValueError, match="module.pt holds more than tensors"):
        load_encoder_weights(encoder, tmp_path / "module.pt")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"none of its 1 keys \(fc.weight\) is a key of the encoder"):
        load_encoder_weights(encoder, tmp_path / "other.pt")
    (tmp_path / "bad.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="bad.safetensors is not a readable .safetensors file"):
        load_encoder_weights(encoder, tmp_path / "bad.safetensors")


def test_a_run_starts_from_local_weights_and_probe_needs_them_only_for_the_baseline(tmp_path, capsys,
                                                                                   one_torch_thread):
    import custom_encoders

    start = custom_encoders.tiny_conv(1, width=6)
    torch.save({"model": {f"encoder.module.{k}": v for k, v in start.state_dict().items()}}, tmp_path / "w.pt")
    out = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--encoder", "custom_encoders:tiny_conv", "--encoder-option", "width=6",
                 "--encoder-weights", str(tmp_path / "w.pt"), "--epochs", "1", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "encoder weights" in captured.err and "4 tensors loaded (file keys without the prefix 'encoder.module.')" \
        in captured.err
    record = json.loads((out / "config.json").read_text())
    assert record["config"]["encoder_weights"] == str(tmp_path / "w.pt")
    assert record["derived"]["encoder_weights"]["missing"] == [] and record["derived"]["encoder_weights"]["loaded"]
    summary = json.loads(captured.out)
    # The baseline is the encoder at the weights it started from: the same numbers again.
    again = evaluate_run(str(out), device="cpu", baseline_cache="off")
    assert again["random_init_probe_accuracy"] == summary["random_init_probe_accuracy"]
    (tmp_path / "w.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"started from the encoder weights .*w.pt, which are gone.*--no-baselines"):
        evaluate_run(str(out), device="cpu")
    trained = evaluate_run(str(out), device="cpu", baselines=False)  # the checkpoint holds the weights
    assert trained["probe_accuracy"] == summary["probe_accuracy"]
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "w.pt")  # another file under the same name
    with pytest.raises(ValueError, match="changed since"):
        evaluate_run(str(out), device="cpu")
