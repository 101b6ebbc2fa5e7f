"""contrastkit embed: a run's h (and z) of a data set, equal to what the probe reads; nothing a user wrote replaced."""

import csv
import json

import numpy as np
import pytest
import torch

from _tiny_run import TINY_GLYPHLAB, tiny_config
from contrastkit.cli import main
from contrastkit.data import load_dataset
from contrastkit.train import extract_features, pretrain
from contrastkit.train.runs import load_run
from contrastkit.train.embed import export_embeddings


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("run")
    pretrain(tiny_config(out), progress=False, baselines=False)
    return out


def _probe_features(run_dir, split):
    """h as the probe computes it: extract_features on the run's encoder, rebuilt from the folder."""
    saved = load_run(str(run_dir))
    dataset = saved.load_data()
    model = saved.build_model(dataset.image_shape[0], torch.device("cpu"))
    return extract_features(model.encoder, getattr(dataset, split).images, torch.device("cpu")), model, dataset


def test_test_split_equals_the_probes_features(run_dir, tmp_path, capsys):
    out = tmp_path / "emb.npy"
    assert main(["embed", str(run_dir), "--split", "test", "--projection", "--out", str(out), "--quiet",
                 "--batch-size", "5"]) == 0
    assert "wrote 12 rows" in capsys.readouterr().out
    h = np.load(out)
    expected, model, dataset = _probe_features(run_dir, "test")
    assert h.dtype == np.float32 and h.shape == expected.shape
    assert np.array_equal(h.astype(np.float64), expected)  # the same numbers, not just close
    with torch.no_grad():
        model.eval()
        z = model.head(torch.from_numpy(expected).float()).numpy()
    # z in batches of 5 vs one batch of 12: the head's matrix products may round differently.
    np.testing.assert_allclose(np.load(tmp_path / "emb_z.npy"), z, rtol=1e-5, atol=1e-7)
    with open(tmp_path / "emb.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["label"]) for r in rows] == dataset.test.labels.tolist()
    assert [(r["split"], int(r["index"])) for r in rows] == [("test", i) for i in range(12)]
    marker = json.loads((tmp_path / "emb.npy.contrastkit.json").read_text())
    assert marker["written_by"] == "contrastkit embed" and sorted(marker["files"]) == ["emb.csv", "emb.npy", "emb_z.npy"]
    # Every file is in the folder's manifest with its size and SHA-256 (what --force may replace).
    from contrastkit.manifest import Manifest, file_sha256

    listed = Manifest(tmp_path).files
    for name in ("emb.csv", "emb.npy", "emb_z.npy", "emb.npy.contrastkit.json"):
        assert listed[name] == {"size": (tmp_path / name).stat().st_size, "sha256": file_sha256(tmp_path / name)}
    assert not any(name.endswith(".tmp") for name in listed)


def test_npz_of_all_splits_and_of_other_data(run_dir, tmp_path):
    result = export_embeddings(str(run_dir), str(tmp_path / "all.npz"), progress=False)
    with np.load(tmp_path / "all.npz", allow_pickle=False) as archive:
        assert sorted(archive.files) == ["h", "labels", "names", "splits"]
        h, splits, labels = archive["h"], archive["splits"], archive["labels"]
    sizes = [TINY_GLYPHLAB[f"{s}_scenes"] for s in ("train", "val", "test")]
    assert result.rows == h.shape[0] == sum(sizes) and list(splits).count("val") == sizes[1]
    expected, _, dataset = _probe_features(run_dir, "train")
    assert np.array_equal(h[:sizes[0]].astype(np.float64), expected)
    assert labels[:sizes[0]].tolist() == dataset.train.labels.tolist()
    other = dict(TINY_GLYPHLAB, test_scenes=5)
    export_embeddings(str(run_dir), str(tmp_path / "other.npz"), data="glyphlab", data_options=other,
                      split="test", progress=False)
    with np.load(tmp_path / "other.npz") as archive:
        assert archive["h"].shape[0] == 5
    assert load_dataset("glyphlab", seed=0, **other).test.images.shape[0] == 5


def test_a_users_file_is_never_overwritten(run_dir, tmp_path, capsys):
    mine = tmp_path / "emb.npy"
    mine.write_bytes(b"my own data")
    for extra in ([], ["--force"]):
        assert main(["embed", str(run_dir), "--out", str(mine), "--quiet", *extra]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and str(mine) in error
    assert mine.read_bytes() == b"my own data"
    assert not (tmp_path / "emb.csv").exists()
    # A user's file next to an earlier export, under a name the export did not write, stays too.
    ours = tmp_path / "ours.npy"
    assert main(["embed", str(run_dir), "--out", str(ours), "--projection", "--quiet"]) == 0
    assert main(["embed", str(run_dir), "--out", str(ours), "--quiet"]) == 2  # exists: needs --force
    (tmp_path / "ours.csv").unlink()
    (tmp_path / "ours.csv").write_text("a user's table\n")
    assert main(["embed", str(run_dir), "--out", str(ours), "--quiet", "--force"]) == 2
    assert (tmp_path / "ours.csv").read_text() == "a user's table\n"
    (tmp_path / "ours.csv").unlink()
    assert main(["embed", str(run_dir), "--out", str(ours), "--quiet", "--force", "--split", "val"]) == 0
    assert np.load(ours).shape[0] == TINY_GLYPHLAB["val_scenes"]
    assert not (tmp_path / "ours_z.npy").exists()  # the earlier export's z, no longer asked for, is gone


def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    cases = [
        (["embed", str(tmp_path / "folder"), "--out", str(tmp_path / "x.npz")], "config.json is missing"),
        (["embed", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.npz")], "does not exist"),
        (["embed", str(run_dir), "--out", str(tmp_path / "no" / "x.npz")], "output folder"),
        (["embed", str(run_dir), "--out", str(tmp_path / "x.npz"), "--data-option", "size=28"], "--data-option"),
        (["embed", str(run_dir), "--out", str(tmp_path / "x.npz"), "--data", str(tmp_path / "missing.npz")],
         "missing.npz"),
        (["embed", str(run_dir), "--out", str(tmp_path / "x.npz"), "--workers", "-1"], "workers must be"),
    ]
    for argv, message in cases:
        assert main(argv + ["--quiet"]) == 2, argv
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and message in error, error
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "no").exists()


# -- a streamed data set and a user's own encoder -----------------------------------------

@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory, one_torch_thread):
    """A run trained on a class-folder tree of PNG and JPEG files, streamed (``stream=true``)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (folder / name).mkdir()
        for i in range(14):
            pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels, mode="RGB").save(folder / name / f"img_{i:03d}.{'jpg' if i % 3 == 0 else 'png'}")
    out = tmp_path_factory.mktemp("streamed") / "run"
    pretrain(tiny_config(out, data=str(folder), data_options={"stream": True}), progress=False, baselines=False)
    return out, folder


def _streamed_probe_features(run_dir, split):
    """h as the read-out computes it for a streamed split (batches through its loader)."""
    
    saved = load_run(str(run_dir))
    dataset = saved.load_data()
    model = saved.build_model(dataset.image_shape, torch.device("cpu"))
    part = getattr(dataset, split)
    return extract_features(model.encoder, part, torch.device("cpu")), part


def _image_paths(part):
    """The file of each item of a streamed split (a subset of an image folder's index)."""
    return [part.dataset.path(i) for i in part.indices]


def test_a_streamed_runs_test_split_equals_the_probes_features(streamed_run, tmp_path, capsys):
    run_dir, folder = streamed_run
    out = tmp_path / "emb.npy"
    assert main(["embed", str(run_dir), "--split", "test", "--out", str(out), "--quiet", "--batch-size", "4"]) == 0
    capsys.readouterr()
    expected, part = _streamed_probe_features(run_dir, "test")
    h = np.load(out)
    assert h.shape == expected.shape and np.array_equal(h, expected)
    with open(tmp_path / "emb.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["label"]) for r in rows] == part.labels.tolist()
    assert [r["name"] for r in rows] == _image_paths(part)
    assert {r["name"].rsplit(".", 1)[1] for r in rows} == {"png", "jpg"}
    names = load_run(str(run_dir)).load_data().class_names
    assert all(r["name"].startswith(str(folder / names[int(r["label"])])) for r in rows)


def test_a_streamed_run_exports_every_split_from_python_with_workers(streamed_run, tmp_path):
    run_dir, folder = streamed_run
    result = export_embeddings(str(run_dir), str(tmp_path / "all.npz"), progress=False, batch_size=5, workers=2)
    with np.load(tmp_path / "all.npz", allow_pickle=False) as archive:
        h, names, splits = archive["h"], archive["names"].tolist(), archive["splits"].tolist()
    start = 0
    for split in ("train", "val", "test"):
        expected, part = _streamed_probe_features(run_dir, split)
        assert np.array_equal(h[start:start + len(part)], expected), split
        assert names[start:start + len(part)] == _image_paths(part) and splits.count(split) == len(part)
        start += len(part)
    assert result.rows == h.shape[0] == start == 42
    assert sorted(names) == sorted(str(path) for path in folder.glob("*/*"))


def test_a_runs_factory_encoder_is_rebuilt_without_its_options(tmp_path, capsys, one_torch_thread):
    from _tiny_run import TINY_ARGS

    run_dir = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--encoder", "custom_encoders:tiny_conv", "--encoder-option", "width=6",
                 "--epochs", "1", "--out", str(run_dir)]) == 0
    out = tmp_path / "emb.npz"
    assert main(["embed", str(run_dir), "--split", "test", "--projection", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    expected, model, _ = _probe_features(run_dir, "test")
    assert load_run(str(run_dir)).state["model"]["encoder.module.net.0.weight"].shape[0] == 6  # width=6 recorded
    with np.load(out) as archive:
        assert archive["h"].shape == (12, 6) and np.array_equal(archive["h"], expected)
        with torch.no_grad():
            model.eval()
            z = model.head(torch.from_numpy(expected)).numpy()
        np.testing.assert_allclose(archive["z"], z, rtol=1e-5, atol=1e-7)


def test_force_in_a_run_folder_replaces_only_the_export(tmp_path):
    """An export inside the run folder shares the run's manifest: --force replaces the export's
    files and leaves every run file (also listed there, unchanged) alone."""
    run = tmp_path / "run"
    pretrain(tiny_config(run), progress=False, baselines=False)
    before = {p.name for p in run.iterdir()}
    out = run / "h.npz"
    assert main(["embed", str(run), "--out", str(out), "--quiet"]) == 0
    other = run / "other.npy"
    assert main(["embed", str(run), "--out", str(other), "--quiet"]) == 0
    assert main(["embed", str(run), "--out", str(out), "--quiet", "--force", "--split", "val"]) == 0
    left = {p.name for p in run.iterdir()}
    assert before <= left, before - left  # config.json, summary.json, metrics.jsonl, ... all still there
    assert {"h.npz", "other.npy", "other.csv"} <= left
    assert np.load(out)["h"].shape[0] == TINY_GLYPHLAB["val_scenes"]


def test_out_of_an_existing_folder_is_refused(run_dir, tmp_path, capsys):
    folder = tmp_path / "embeddings"
    folder.mkdir()
    assert main(["embed", str(run_dir), "--out", str(folder), "--quiet"]) == 2  # was embeddings.npy beside it
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"contrastkit embed: error: --out {folder} is a folder: give a file name such as "
                                f"{folder / 'embeddings.npz'}"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embeddings"] and not any(folder.iterdir())
