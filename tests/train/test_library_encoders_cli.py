"""A timm ResNet-18 and a torchvision ResNet-18 (CIFAR stem, grayscale) through the command line:
pretrain, probe, embed, neighbors, resume and export, each rebuilt from what the run recorded; the
ONNX export agrees with the PyTorch encoder under onnxruntime, the TorchScript and safetensors
exports rebuild the same features."""

import json
import shutil

import numpy as np
import pytest
import torch

from contrastkit.cli import main
from contrastkit.data import image_batches
from contrastkit.models import encoder_from_spec
from contrastkit.train.runs import load_run

pytest.importorskip("timm", reason="timm is not installed (pip install 'contrastkit[timm]')")
pytest.importorskip("torchvision", reason="torchvision is not installed (pip install 'contrastkit[torchvision]')")

# 16x16 digits, 32 training images in batches of 16: two steps of a ResNet-18 on a CPU.
DATA = ["--data", "digits", "--data-option", "size=16", "--train-limit", "32", "--val-limit", "20",
        "--test-limit", "20"]
RUN = [*DATA, "--epochs", "1", "--batch-size", "16", "--device", "cpu", "--threads", "1", "--quiet",
       "--no-report", "--no-baselines", "--encoder-option", "cifar_stem=true"]


@pytest.fixture(scope="module", params=["timm:resnet18", "torchvision:resnet18"])
def run_dir(request, tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp(request.param.replace(":", "-")) / "run"
    assert main(["pretrain", *RUN, "--encoder", request.param, "--out", str(out)]) == 0
    return out


def _test_images(run_dir):
    """The run's test images as the encoder reads them: ``(n, 1, 16, 16)`` float32 in [0, 1]."""
    return torch.cat(list(image_batches(load_run(str(run_dir)).load_data().test, 256)))


def test_the_run_records_its_encoder_and_probe_rebuilds_it(run_dir, capsys):
    capsys.readouterr()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["encoder"] in ("timm:resnet18", "torchvision:resnet18")
    assert config["encoder_options"] == {"cifar_stem": True}
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert tuple(state["encoder.conv1.weight"].shape) == (64, 1, 3, 3)  # CIFAR stem, one channel
    assert not any(key.startswith("encoder.fc.") for key in state)  # no classifier
    assert main(["probe", str(run_dir), "--json", "--no-baselines", "--device", "cpu"]) == 0
    again = json.loads(capsys.readouterr().out)
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("probe_accuracy", "knn_accuracy"):
        assert again[key] == summary[key], key


def test_embed_and_the_onnx_export_agree_under_onnxruntime(run_dir, tmp_path, capsys):
    runtime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'contrastkit[onnx]')")
    assert main(["embed", str(run_dir), "--split", "test", "--projection", "--out", str(tmp_path / "h.npy"),
                 "--quiet"]) == 0
    assert main(["export", str(run_dir), "--format", "onnx", "--projection", "--out", str(tmp_path / "enc")]) == 0
    assert "checked against the PyTorch encoder with onnxruntime" in capsys.readouterr().out
    contract = json.loads((tmp_path / "enc.onnx.contrastkit.json").read_text())
    assert contract["input"]["shape"] == ["batch", 1, 16, 16] and contract["input"]["range"] == [0.0, 1.0]
    assert contract["outputs"]["h"]["shape"] == ["batch", 512] and contract["outputs"]["z"]["shape"] == ["batch", 64]
    session = runtime.InferenceSession(str(tmp_path / "enc.onnx"), providers=["CPUExecutionProvider"])
    h, z = session.run(["h", "z"], {"images": _test_images(run_dir).numpy()})
    assert h.shape == (20, 512)  # another batch size than the one traced
    np.testing.assert_allclose(h, np.load(tmp_path / "h.npy"), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, np.load(tmp_path / "h_z.npy"), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_torchscript_and_safetensors_exports_give_the_same_features(run_dir, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    assert main(["embed", str(run_dir), "--split", "test", "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    h = np.load(tmp_path / "h.npy")
    images = _test_images(run_dir)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.pt"), "--format", "torchscript"]) == 0
    traced = torch.jit.load(str(tmp_path / "enc.pt"))
    with torch.no_grad():
        np.testing.assert_allclose(traced(images).numpy(), h, rtol=1e-5, atol=1e-5)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.safetensors")]) == 0
    contract = json.loads((tmp_path / "enc.safetensors.contrastkit.json").read_text())
    # The file's keys are the library model's own: the architecture the contract names reads it strictly.
    encoder = encoder_from_spec(contract["encoder"], contract["input"]["channels"], contract["encoder_options"])
    encoder.load_state_dict(safetensors.load_file(str(tmp_path / "enc.safetensors")), strict=True)
    with torch.no_grad():
        np.testing.assert_allclose(encoder.eval()(images).numpy(), h, rtol=1e-5, atol=1e-5)


def test_neighbors_and_resume_rebuild_the_encoder(run_dir, tmp_path, capsys):
    assert main(["neighbors", str(run_dir), "test:0", "--k", "3", "--out", str(tmp_path / "n.png"),
                 "--device", "cpu"]) == 0
    assert "test:0" in capsys.readouterr().out
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert main(["pretrain", "--out", str(copy), "--resume", "--epochs", "2", "--quiet", "--no-report",
                 "--no-baselines"]) == 0
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["encoder"] == json.loads((run_dir / "summary.json").read_text())["encoder"]
