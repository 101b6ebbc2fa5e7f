"""Pretraining on an unlabeled image collection from the command line: the label-free read-out
with both baselines, damaged files skipped by name (or stopping the run), a labelled evaluation
set, and the run's other machinery (resume, --force, --config, micro-batches, embed)."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
from PIL import Image

from contrastkit.cli import main

LABEL_FREE = ("view_retrieval_top1", "view_retrieval_top5", "alignment", "uniformity", "effective_rank",
              "heldout_loss")


def _collection(root, count=48, damaged=True):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for i in range(count):
        array = (rng.random((24, 28 + i % 5, 3)) * 60).astype(np.uint8)
        array[:, : array.shape[1] // 2] = (200 * (i % 3 == 0), 200 * (i % 3 == 1), 200 * (i % 3 == 2))
        folder = root / "nested" if i % 5 == 0 else root
        folder.mkdir(exist_ok=True)
        Image.fromarray(array).save(folder / f"p{i:03d}.{'jpg' if i % 2 else 'png'}")
    if damaged:
        (root / "zero.jpg").write_bytes(b"")
        (root / "fake.png").write_text("text, not pixels")
    return root


def _args(data, out, *extra):
    # 16x16 images (the collection's default is 32): the raw-pixel baseline's features are 768
    # numbers, not 3,072, which is most of a read-out's cost on images this small.
    return ["pretrain", "--data", str(data), "--out", str(out), "--epochs", "1", "--batch-size", "8",
            "--image-size", "16", "--device", "cpu", "--quiet", "--no-report", "--json", *extra]


def _run(capsys, args):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured


def test_a_flat_folder_pretrains_with_the_label_free_read_out(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    code, out = _run(capsys, _args(data, tmp_path / "run", "--workers", "2"))
    assert code == 0, out.err
    summary = json.loads(out.out)
    for key in LABEL_FREE:
        for prefix in ("", "random_init_", "raw_pixel_"):
            assert np.isfinite(summary[prefix + key]), prefix + key
    assert "probe_accuracy" not in summary and summary["beats_baselines"] is None
    assert isinstance(summary["beats_baselines_view_retrieval"], bool)
    assert summary["skipped_files"] == 2
    skipped = (tmp_path / "run" / "skipped.txt").read_text().splitlines()
    assert sorted(os.path.basename(line.split("\t")[0]) for line in skipped) == ["fake.png", "zero.jpg"]
    assert "skipped 2 damaged image file(s)" in out.err
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["derived"]["dataset"]["num_classes"] == 0 and stored["derived"]["dataset"]["streamed"]
    manifest = json.loads((tmp_path / "run" / "contrastkit-manifest.json").read_text())
    assert "skipped.txt" in json.dumps(manifest)


def test_bad_files_fail_stops_naming_the_file(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    code, out = _run(capsys, _args(data, tmp_path / "run", "--bad-files", "fail"))
    assert code == 2
    error = out.err.strip()
    assert error.count("\n") == 0 and ("zero.jpg" in error or "fake.png" in error), error


def test_eval_data_adds_the_probe_and_knn_on_a_labelled_set(tmp_path, capsys):
    data = _collection(tmp_path / "photos", damaged=False)
    rng = np.random.default_rng(1)
    for c in range(2):
        for i in range(15):
            array = (rng.random((30, 30, 3)) * 50).astype(np.uint8)
            array[:, :15] = (220, 0, 0) if c else (0, 0, 220)
            (tmp_path / "labelled" / f"class{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(tmp_path / "labelled" / f"class{c}" / f"{i}.png")
    code, out = _run(capsys, _args(data, tmp_path / "run", "--eval-data", str(tmp_path / "labelled")))
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["eval_data"] == "labelled" and 0 <= summary["probe_accuracy"] <= 1
    assert {"knn_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy"} <= set(summary)
    assert "view_retrieval_top1" in summary


def test_resume_force_config_and_micro_batches_work_on_a_collection(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    out_dir = tmp_path / "run"
    assert _run(capsys, _args(data, out_dir))[0] == 0
    code, out = _run(capsys, ["pretrain", "--out", str(out_dir), "--resume", "--epochs", "2", "--quiet",
                              "--no-report", "--json"])
    assert code == 0, out.err
    assert json.loads(out.out)["epochs"] == 2
    code, out = _run(capsys, _args(data, out_dir, "--force", "--micro-batch", "4"))
    assert code == 0, out.err
    code, out = _run(capsys, ["pretrain", "--config", str(out_dir / "config.yaml"), "--out", str(tmp_path / "again"),
                              "--quiet", "--no-report", "--json"])
    assert code == 0, out.err
    assert json.loads(out.out)["skipped_files"] == 2


def test_a_method_that_needs_labels_is_refused(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    code, out = _run(capsys, _args(data, tmp_path / "run", "--method", "supcon"))
    assert code == 2 and "needs class labels" in out.err and out.err.strip().count("\n") == 0


def test_embed_names_rows_by_their_path_in_the_collection(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    assert _run(capsys, _args(data, tmp_path / "run"))[0] == 0
    assert main(["embed", str(tmp_path / "run"), "--out", str(tmp_path / "h.npy"), "--split", "all"]) == 0
    with open(tmp_path / "h.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    names = {row["name"] for row in rows}
    assert len(rows) == 48 and "nested/p000.png" in names and not any(os.path.isabs(n) for n in names)
    assert np.load(tmp_path / "h.npy").shape[0] == 48
