"""contrastkit export on a tiny run: the formats and their suffixes, the file guard shared with
embed (nothing a user wrote is replaced), an export that disagrees with the encoder is not kept,
and the optional packages (a missing one named; ONNX without onnxruntime written unchecked)."""

import json
import sys

import pytest

from _tiny_run import tiny_config
from contrastkit.cli import main
from contrastkit.extras import MissingExtraError
from contrastkit.manifest import Manifest, file_sha256
from contrastkit.train import export_model, pretrain


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("run") / "run"
    pretrain(tiny_config(out), progress=False, baselines=False)
    return out


def test_the_contract_and_the_manifest(run_dir, tmp_path):
    result = export_model(str(run_dir), str(tmp_path / "enc"), format="torchscript")
    assert result.files == {"model": str(tmp_path / "enc.pt"), "marker": str(tmp_path / "enc.pt.contrastkit.json")}
    assert result.input_shape == (1, 28, 28) and result.h_dim == 128 and result.z_dim is None
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    contract = json.loads((tmp_path / "enc.pt.contrastkit.json").read_text())
    assert contract["input"]["channels"] == 1 and contract["input"]["mean"] == [0.0] and contract["input"]["std"] == [1.0]
    assert contract["encoder"] == "small" and contract["files"] == ["enc.pt"]
    listed = Manifest(tmp_path).files
    for name in ("enc.pt", "enc.pt.contrastkit.json"):
        assert listed[name] == {"size": (tmp_path / name).stat().st_size, "sha256": file_sha256(tmp_path / name)}


def test_a_users_file_is_never_replaced(run_dir, tmp_path, capsys):
    user = tmp_path / "mine.onnx"
    user.write_text("the user's own model")
    for extra in ([], ["--force"]):
        assert main(["export", str(run_dir), "--out", str(user), *extra]) == 2
        assert "mine.onnx exists" in capsys.readouterr().err
        assert user.read_text() == "the user's own model"
    out = tmp_path / "enc.pt"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert main(["export", str(run_dir), "--out", str(out)]) == 2  # an earlier export: only with --force
    assert "pass --force" in capsys.readouterr().err
    out.write_bytes(out.read_bytes() + b"changed by the user")
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 2  # changed since: not ours any more
    assert "not written by contrastkit" in capsys.readouterr().err
    out.unlink()
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0


def test_formats_and_suffixes(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.onnx"), "--format", "torchscript"]) == 2
    assert "has the suffix of the onnx format" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.bin")]) == 2
    assert "give --format" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_onnx_without_onnxruntime_is_written_and_said_unchecked(run_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'contrastkit[onnx]')")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.onnx")]) == 0
    assert "not checked" in capsys.readouterr().out
    assert json.loads((tmp_path / "enc.onnx.contrastkit.json").read_text())["check"] is None


def test_a_missing_package_names_the_extra(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'contrastkit\[safetensors\]'"):
        export_model(str(run_dir), str(tmp_path / "enc.safetensors"))
    assert main(["export", str(run_dir), "--out", str(tmp_path / "enc.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "contrastkit[safetensors]" in err
    assert not any(tmp_path.iterdir())


def test_an_export_that_disagrees_with_the_encoder_is_not_kept(tmp_path, one_torch_thread):
    run = tmp_path / "run"
    pretrain(tiny_config(run, encoder="custom_encoders:BatchSizeDependent"), progress=False, baselines=False)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="disagrees with the PyTorch encoder.*not written"):
        export_model(str(run), str(out / "enc.pt"))
    assert sorted(p.name for p in out.iterdir()) == []  # nothing left behind, not even a manifest entry


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_out_of_an_existing_folder_is_refused(run_dir, tmp_path, capsys, fmt):
    folder = tmp_path / "models"
    folder.mkdir()
    for argv in (["--format", fmt], []):  # with a format, the model went to models.onnx beside the folder
        assert main(["export", str(run_dir), "--out", str(folder), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [f"contrastkit export: error: --out {folder} is a folder: give a file name such "
                                    f"as {folder / 'model'}{'.pt' if fmt == 'torchscript' and argv else '.onnx'}"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"] and not any(folder.iterdir())


def test_the_input_contract_reproduces_embed_on_a_photo_folder(tmp_path, capsys, one_torch_thread):
    """The contract of a collection's run states its resize-and-crop rule, and
    ``preprocess_image`` applied by it feeds the ONNX model what ``embed`` feeds the encoder;
    stretching the photos to the size instead (the rule left out) gives other embeddings."""
    import csv

    import numpy as np
    from PIL import Image

    from _data_fixtures import write_collection
    from contrastkit.data import preprocess_image
    from contrastkit.data.collection import fit_image
    from contrastkit.train.export import TOLERANCE

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'contrastkit[onnx]')")
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'contrastkit[onnx]')")
    from contrastkit.data.collection import split_by_hash

    photos = write_collection(tmp_path / "photos", 48, damaged=())  # 24 x 28..32 pixels: wider than high
    # Photos large enough to be decoded at 1/8 of each side (160 x 120 for a 16 px input), in test.
    candidates = [f"big{i:02d}.jpg" for i in range(40)]
    big = [name for name, part in zip(candidates, split_by_hash(candidates, 0.1, 0.2)) if part == "test"][:3]
    rng = np.random.default_rng(3)
    for name in big:
        Image.fromarray((rng.random((120, 160, 3)) * 255).astype(np.uint8)).save(photos / name, quality=90)
    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(photos), "--out", str(run), "--epochs", "1", "--batch-size", "8",
                 "--image-size", "16", "--device", "cpu", "--quiet", "--no-report", "--no-baselines", "--json"]) == 0
    assert main(["embed", str(run), "--split", "test", "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "enc.onnx")]) == 0
    capsys.readouterr()
    embedded = np.load(tmp_path / "h.npy")
    with open(tmp_path / "h.csv", encoding="utf-8") as handle:
        names = [row["name"] for row in csv.DictReader(handle)]
    contract = json.loads((tmp_path / "enc.onnx.contrastkit.json").read_text())
    stated = contract["input"]
    assert stated["resize"] == "shorter-side-then-centre-crop" and stated["height"] == stated["width"] == 16
    assert "CenterCrop(16)" in stated["resize_rule"] and stated["interpolation"].startswith("bilinear")
    assert stated["channel_order"] == "RGB" and stated["range"] == [0.0, 1.0] and stated["mean"] == [0.0] * 3
    assert "Image.draft" in stated["jpeg_decode"] and set(big) <= set(names)
    session = ort.InferenceSession(str(tmp_path / "enc.onnx"), providers=["CPUExecutionProvider"])

    def run_onnx(images):
        return session.run(["h"], {"images": images})[0]

    files = [photos / name for name in names]
    inputs = np.concatenate([preprocess_image(path, contract) for path in files])
    assert inputs.dtype == np.float32 and inputs.shape == (len(files), 3, 16, 16)
    # What the run's data gives for the same files, as the model reads it: exactly the same input.
    read = np.stack([fit_image(path, "RGB", 16) for path in files]).astype(np.float32) / np.float32(255)
    assert np.array_equal(inputs, read)
    h = run_onnx(inputs)
    # The same network on the same input in another runtime: within the bound the export was
    # checked to (the summation order of each kernel differs, nothing else).
    assert h.shape == embedded.shape
    assert np.all(np.abs(h - embedded) <= TOLERANCE * (1 + np.abs(embedded))), np.abs(h - embedded).max()
    squashed = np.stack([np.asarray(Image.open(path).convert("RGB").resize((16, 16), Image.BILINEAR))
                         for path in files]).transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)
    h_squashed = run_onnx(squashed)
    def relative(a):  # per image: the largest difference from embed's h, as the tolerance measures it
        return (np.abs(a - embedded) / (1 + np.abs(embedded))).max(axis=1)

    off, runtimes = relative(h_squashed), relative(h)
    # Every image's embedding moves beyond the export's tolerance and by far more than the two
    # runtimes differ on the same input.
    assert np.all(off > TOLERANCE) and off.min() > 10 * runtimes.max(), (off, runtimes)

    def cosine_gap(a):  # 1 - the cosine of each row with embed's, in float64
        a, b = a.astype(np.float64), embedded.astype(np.float64)
        return 1 - (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    assert cosine_gap(h_squashed).min() > 10 * max(cosine_gap(h).max(), 1e-12)
