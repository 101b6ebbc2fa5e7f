"""Pretraining on an unlabeled image collection from the command line: the label-free read-out
with both baselines, damaged files skipped by name (or stopping the run), a labelled evaluation
set, and the run's other machinery (resume, --force, --config, micro-batches, embed)."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from _data_fixtures import write_collection, write_image_folder
from contrastkit.cli import main

LABEL_FREE = ("view_retrieval_top1", "view_retrieval_top5", "alignment", "uniformity", "effective_rank",
              "heldout_loss")


def _collection(root, damaged=True):
    return write_collection(root, 48, ("zero.jpg", "fake.png") if damaged else ())  # zero.jpg: train; fake.png: test


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
    args = [arg for arg in _args(data, tmp_path / "run", "--workers", "2") if arg != "--no-report"]
    code, out = _run(capsys, args)
    assert code == 0, out.err
    # The report's pictures read the held-out split, where fake.png lies: skipped there too.
    assert "no report written" not in out.err and (tmp_path / "run" / "report.html").is_file()
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


def _weights(out):
    return torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)["model"]


class _Stop(Exception):
    pass


def test_a_resumed_collection_run_ends_with_the_uninterrupted_weights(tmp_path, capsys):
    from contrastkit.train import PretrainConfig, pretrain

    data = _collection(tmp_path / "photos")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    options = dict(data=str(data), epochs=2, batch_size=8, device="cpu", workers=1, log_every=1)
    reference = pretrain(PretrainConfig(out=str(straight), **options), progress=False)

    def stop_after_epoch_one(epoch, record):
        raise _Stop

    with pytest.raises(_Stop):  # interrupted after epoch 1's checkpoint (the same 2-epoch schedule)
        pretrain(PretrainConfig(out=str(resumed), **options), progress=False, on_epoch_end=stop_after_epoch_one)
    code, out = _run(capsys, ["pretrain", "--out", str(resumed), "--resume", "--quiet", "--no-report", "--json"])
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["epochs"] == 2 and summary["skipped_files"] == 2  # zero.jpg met again in epoch 2
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert summary["final_loss"] == reference["final_loss"]
    assert summary["view_retrieval_top1"] == reference["view_retrieval_top1"]


def test_force_removes_the_skipped_list_of_the_run_it_replaces(tmp_path, capsys):
    data = _collection(tmp_path / "photos")
    out_dir = tmp_path / "run"
    assert _run(capsys, _args(data, out_dir))[0] == 0
    assert (out_dir / "skipped.txt").is_file()
    (out_dir / "my_notes.txt").write_text("mine")
    for name in ("zero.jpg", "fake.png"):  # the user repaired the collection
        (data / name).unlink()
    code, out = _run(capsys, _args(data, out_dir, "--force"))
    assert code == 0, out.err
    assert json.loads(out.out)["skipped_files"] == 0
    assert not (out_dir / "skipped.txt").exists()  # listed in the manifest: the earlier run's, removed
    assert (out_dir / "my_notes.txt").read_text() == "mine"  # never the user's
    assert "skipped.txt" not in json.dumps(json.loads((out_dir / "contrastkit-manifest.json").read_text()))


def test_a_config_file_reruns_the_collection_with_its_data_settings(tmp_path, capsys):
    # A class tree read as unlabeled, resized to 16 pixels, stopping at a damaged file.
    write_image_folder(tmp_path / "tree", classes=("a", "b"), per_class=20, mode="RGB", sizes=((20, 24),))
    first = tmp_path / "first"
    code, out = _run(capsys, _args(tmp_path / "tree", first, "--unlabeled", "--image-size", "16", "--bad-files",
                                   "fail"))
    assert code == 0, out.err
    code, out = _run(capsys, ["pretrain", "--config", str(first / "config.yaml"), "--out", str(tmp_path / "again"),
                              "--quiet", "--no-report", "--json"])
    assert code == 0, out.err
    records = [json.loads((folder / "config.json").read_text()) for folder in (first, tmp_path / "again")]
    assert records[0]["derived"]["dataset"] == records[1]["derived"]["dataset"]
    assert records[1]["derived"]["dataset"]["num_classes"] == 0
    assert records[1]["derived"]["dataset"]["image_shape"] == [3, 16, 16]
    config = records[1]["config"]
    assert config["unlabeled"] is True and config["bad_files"] == "fail"
    assert json.loads(out.out)["final_loss"] == json.loads((first / "summary.json").read_text())["final_loss"]


def test_micro_batches_on_a_collection_train_like_the_full_batch(tmp_path, capsys):
    # GroupNorm: no batch statistics, so cached-gradient micro-batches must give the full batch's
    # steps, also for the batch that lost zero.jpg (7 rows: micro-batches of 1, the divisor of 7).
    data = _collection(tmp_path / "photos")
    runs = {}
    for micro in (None, "4"):
        out_dir = tmp_path / f"micro{micro}"
        extra = ("--norm", "group", "--log-every", "1") + (("--micro-batch", micro) if micro else ())
        code, out = _run(capsys, _args(data, out_dir, *extra))
        assert code == 0, out.err
        with open(out_dir / "metrics.jsonl", encoding="utf-8") as handle:
            losses = [r["loss"] for r in map(json.loads, handle) if r["kind"] == "step"]
        runs[micro] = losses, _weights(out_dir)
        assert "zero.jpg" in (out_dir / "skipped.txt").read_text()  # met in training: a batch lost it
    (losses, weights), (micro_losses, micro_weights) = runs[None], runs["4"]
    assert len(losses) >= 3 and micro_losses == pytest.approx(losses, rel=1e-5, abs=1e-6)
    for key in weights:  # float32 rounding, amplified by Adam on near-zero gradients (as in test_accumulation)
        torch.testing.assert_close(micro_weights[key], weights[key], rtol=1e-4, atol=2e-4, msg=key)


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


def _remove_after_indexing(monkeypatch, count=2):
    """Open the collection as the run does, then remove the first ``count`` files its first
    training batch reads (seed 0, batch 8: :class:`EpochBatchSampler`'s order), before anything
    reads them: a photo folder cleaned up while a run reads it. Returns their paths."""
    from contrastkit.data import EpochBatchSampler, collection

    import functools

    real_open = collection.open_collection
    removed = []

    @functools.wraps(real_open)  # the data source reads the options open_collection takes from its signature
    def open_then_remove(*args, **options):
        data = real_open(*args, **options)
        first_batch = EpochBatchSampler(len(data.train), 8, seed=0).order()[:count].tolist()
        for i in first_batch:
            removed.append(data.train.path(i))
            os.remove(data.train.path(i))
        return data

    monkeypatch.setattr(collection, "open_collection", open_then_remove)
    return removed


def test_files_removed_while_a_run_with_workers_reads_them_are_skipped_and_named(tmp_path, capsys, monkeypatch):
    """The run stopped with "Caught FileNotFoundError in DataLoader worker process 0.", naming no
    file and writing no skipped.txt, although the policy was skip."""
    removed = _remove_after_indexing(monkeypatch)
    data = _collection(tmp_path / "photos", damaged=False)
    code, out = _run(capsys, _args(data, tmp_path / "run", "--workers", "2", "--no-baselines"))
    assert code == 0, out.err
    assert json.loads(out.out)["skipped_files"] == 2
    skipped = (tmp_path / "run" / "skipped.txt").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in skipped) == sorted(removed)
    assert all("no such file" in line for line in skipped)


def test_fail_stops_at_a_file_removed_while_the_run_reads_it_in_one_line(tmp_path, capsys, monkeypatch):
    removed = _remove_after_indexing(monkeypatch, count=1)
    data = _collection(tmp_path / "photos", damaged=False)
    code, out = _run(capsys, _args(data, tmp_path / "run", "--workers", "2", "--bad-files", "fail",
                                   "--no-baselines"))
    error = out.err.strip()
    assert code == 2 and error.count("\n") == 0 and removed[0] in error and "no such file" in error, error


@pytest.mark.skipif(os.name == "nt", reason="Windows file names are Unicode")
def test_a_file_name_that_is_not_utf8_is_skipped_and_listed_escaped(tmp_path, capsys):
    """One such name made the folder unusable ("'utf-8' codec can't encode character '\\udce9'
    ... surrogates not allowed"). The folder's own name may be anything: the report escapes it."""
    from pathlib import Path

    data = _collection(Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/fotos-\xe9t\xe9")), damaged=False)
    with open(os.fsencode(str(data)) + b"/caf\xe9.png", "wb") as handle:
        handle.write((data / "p001.jpg").read_bytes())
    code, out = _run(capsys, [arg for arg in _args(data, tmp_path / "run", "--no-baselines") if arg != "--no-report"])
    assert code == 0, out.err
    assert json.loads(out.out)["skipped_files"] == 1
    assert "no report written" not in out.err and (tmp_path / "run" / "report.html").is_file()
    (line,) = (tmp_path / "run" / "skipped.txt").read_text(encoding="utf-8").splitlines()
    assert line.startswith(f"{tmp_path}/fotos-\\xe9t\\xe9/caf\\xe9.png\t") and "not valid UTF-8" in line
    capsys.readouterr()
    assert main(["embed", str(tmp_path / "run"), "--out", str(tmp_path / "h.npy"), "--split", "all"]) == 0
    assert len((tmp_path / "h.csv").read_text(encoding="utf-8").splitlines()) == 48 + 1  # the header
    # embed and neighbors name the file their listing left out (they said nothing of it)
    escaped = f"{tmp_path}/fotos-\\xe9t\\xe9/caf\\xe9.png"
    printed = capsys.readouterr().out.splitlines()
    assert "1 file left out when the collection was listed" in printed[0], printed
    assert any(line.startswith(f"left out  {escaped}  (") and "not valid UTF-8" in line for line in printed), printed
    assert main(["embed", str(tmp_path / "run"), "--out", str(tmp_path / "h.npy"), "--split", "all", "--force",
                 "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["left_out"]) == [escaped]
    assert main(["neighbors", str(tmp_path / "run"), "0", "--k", "2", "--no-picture"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "1 file left out when the collection was listed" in printed[0], printed
    assert any(line.startswith(f"left out  {escaped}  (") for line in printed), printed


def test_a_folder_of_only_unreadable_files_is_refused_naming_it(tmp_path, capsys):
    """ "batch size 2, chosen for 2 training images", then "torch.cat(): expected a non-empty
    list of Tensors"."""
    data = tmp_path / "broken"
    data.mkdir()
    for i in range(24):
        (data / f"scan{i:02d}.png").write_text("not pixels")
    args = [arg for arg in _args(data, tmp_path / "run", "--no-baselines") if arg not in ("--batch-size", "8")]
    code, out = _run(capsys, args)
    error = out.err.strip().splitlines()[-1]
    assert code == 2 and error.startswith("contrastkit pretrain: error: ") and "Traceback" not in out.err
    assert str(data) in error and "no image could be read" in error
    assert str(tmp_path / "run" / "skipped.txt") in error
    listed = (tmp_path / "run" / "skipped.txt").read_text().splitlines()
    assert listed and all(os.path.basename(line.split("\t")[0]).startswith("scan") for line in listed)


def test_the_printed_label_free_table_ends_with_its_verdict(tmp_path, capsys):
    data = _collection(tmp_path / "photos", damaged=False)
    code, out = _run(capsys, [arg for arg in _args(data, tmp_path / "run") if arg != "--json"])
    assert code == 0, out.err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    verdicts = [line for line in out.out.splitlines() if line.startswith("view retrieval top-1: the pretrained")]
    assert len(verdicts) == 1, out.out
    lost = any(words in verdicts[0] for words in ("but not", "neither", "does not beat"))
    assert lost == (not summary["beats_baselines_view_retrieval"]), verdicts[0]  # as the summary judges it
    assert f"({summary['view_retrieval_top1']:.3f})" in verdicts[0] or \
        f"({summary['view_retrieval_top1']:.6g})" in verdicts[0]


def _held_out_names(count=200):
    """A file name that the split by hash puts in val, and one it puts in test."""
    from contrastkit.data.collection import split_by_hash

    names = [f"held{i}.png" for i in range(count)]
    parts = dict(zip(names, split_by_hash(names, 0.1, 0.2)))
    return next(n for n in names if parts[n] == "val"), next(n for n in names if parts[n] == "test")


def test_damaged_files_in_val_and_test_are_named_as_training_ones_are(tmp_path, capsys):
    """A damaged file that fell in val was never read (an unlabeled run reads no val without
    --eval-every), so the run said skipped_files 0 of it."""
    data = _collection(tmp_path / "photos", damaged=False)
    in_val, in_test = _held_out_names()
    (data / in_val).write_bytes(b"not an image")
    (data / in_test).write_bytes(b"")
    code, out = _run(capsys, _args(data, tmp_path / "run", "--no-baselines"))
    assert code == 0, out.err
    assert json.loads(out.out)["skipped_files"] == 2
    listed = (tmp_path / "run" / "skipped.txt").read_text().splitlines()
    assert sorted(os.path.basename(line.split("\t")[0]) for line in listed) == sorted([in_val, in_test])
    code, out = _run(capsys, _args(data, tmp_path / "strict", "--no-baselines", "--bad-files", "fail",
                                   "--no-online-probe"))
    error = out.err.strip()
    assert code == 2 and error.count("\n") == 0 and in_val in error, error
    assert "held-out file, read after training" in error and "checkpoint of step" in error, error
    # The online read-out (on by default) reads val at the first epoch's end: the run stops there.
    code, out = _run(capsys, _args(data, tmp_path / "early", "--no-baselines", "--bad-files", "fail"))
    error = out.err.strip()
    assert code == 2 and error.count("\n") == 0 and in_val in error, error
    assert ("(read by the online read-out at the end of epoch 1; no checkpoint was written before it; with "
            "--no-online-probe a held-out file is read only after training)") in error, error
