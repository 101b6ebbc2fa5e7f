"""A run records its unlabeled collection's listing (collection-index.npz) and the commands that
read the run again (pretrain --resume, embed, neighbors, probe) read it instead of listing the
collection (the listings counted); a collection changed since is named in one line and the user
chooses (--collection-changed reindex / keep)."""

from __future__ import annotations

import csv
import json
import os
import time

from PIL import Image

from _data_fixtures import write_collection
from contrastkit.cli import main
from contrastkit.data import collection
from contrastkit.data.collection_index import RecordedIndex

_SMALL = ["--image-size", "16", "--device", "cpu", "--quiet"]


def _settle(root, ago):
    """Every folder's time ``ago`` seconds back (a collection not touched just before it is read)."""
    past = time.time() - ago
    for folder, _, _ in os.walk(root):
        os.utime(folder, (past, past))


def _rows(path):
    with open(path, newline="") as handle:
        return [row["name"] for row in csv.DictReader(handle)]


def test_the_commands_on_a_run_read_its_recorded_listing_and_a_change_is_the_users_choice(tmp_path, capsys,
                                                                                         monkeypatch):
    photos = write_collection(tmp_path / "photos", 40, ())
    _settle(photos, 60)
    walks = []
    real_walk = collection._walk
    monkeypatch.setattr(collection, "_walk", lambda *args, **kwargs: walks.append(1) or real_walk(*args, **kwargs))
    run = tmp_path / "run"
    pretrain = ["pretrain", "--data", str(photos), "--out", str(run), "--batch-size", "8", "--no-report",
                "--no-baselines", *_SMALL]
    assert main([*pretrain, "--epochs", "1"]) == 0 and len(walks) == 1
    manifest = json.loads((run / "contrastkit-manifest.json").read_text())["files"]
    assert "collection-index.npz" in manifest and len(RecordedIndex.read(run / "collection-index.npz")) == 40

    assert main(["pretrain", "--out", str(run), "--resume", "--epochs", "2", "--no-report", "--quiet"]) == 0
    assert main(["embed", str(run), "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    assert main(["neighbors", str(run), "train:0", "--k", "2", "--no-picture", "--json"]) == 0
    assert main(["probe", str(run), "--no-baselines", "--json"]) == 0
    assert len(walks) == 1, "a command listed the collection instead of reading the run's record"
    assert len(_rows(tmp_path / "h.csv")) == 40
    capsys.readouterr()

    Image.new("RGB", (20, 20), (90, 10, 10)).save(photos / "new.png")
    _settle(photos, 30)
    assert main(["embed", str(run), "--out", str(tmp_path / "h2.npy"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "new.png" in error and "1 image file added" in error, error
    assert "--collection-changed reindex" in error and "--collection-changed keep" in error
    assert not (tmp_path / "h2.npy").exists()

    assert main(["embed", str(run), "--out", str(tmp_path / "h2.npy"), "--quiet", "--collection-changed", "keep"]) == 0
    assert "reading the 40 recorded files still there, not those added" in capsys.readouterr().err
    assert "new.png" not in _rows(tmp_path / "h2.csv") and len(_rows(tmp_path / "h2.csv")) == 40

    listed = len(walks)
    assert main(["pretrain", "--out", str(run), "--resume", "--epochs", "3", "--no-report", "--quiet",
                 "--collection-changed", "reindex"]) == 0
    assert "(1 image file added): listed again, 41 files" in capsys.readouterr().err
    assert len(RecordedIndex.read(run / "collection-index.npz")) == 41  # the run's record is the new listing
    assert main(["embed", str(run), "--out", str(tmp_path / "h3.npy"), "--quiet"]) == 0
    assert "new.png" in _rows(tmp_path / "h3.csv") and len(walks) == listed + 1  # (the reindex's listing alone)


def test_a_collection_written_just_before_the_run_is_confirmed_at_its_end(tmp_path, capsys, monkeypatch):
    # The folders' times are within seconds of the first listing (as when a script writes the
    # collection and starts the run), so that listing cannot tell a later change by them; the
    # run's end lists it again, as if ten seconds later, and records that.
    import types

    photos = write_collection(tmp_path / "photos", 24, ())
    clock = iter([0, 10 * 10**9])
    monkeypatch.setattr(collection, "time", types.SimpleNamespace(time_ns=lambda: time.time_ns() + next(clock)))
    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(photos), "--out", str(run), "--batch-size", "8", "--epochs", "1",
                 "--no-report", "--no-baselines", *_SMALL]) == 0
    walks = []
    real_walk = collection._walk
    monkeypatch.setattr(collection, "_walk", lambda *args, **kwargs: walks.append(1) or real_walk(*args, **kwargs))
    assert main(["embed", str(run), "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    assert walks == [] and len(_rows(tmp_path / "h.csv")) == 24


def test_collection_changed_without_resume_is_refused_in_one_line(tmp_path, capsys):
    photos = write_collection(tmp_path / "photos", 12, ())
    assert main(["pretrain", "--data", str(photos), "--out", str(tmp_path / "run"), "--collection-changed", "keep",
                 "--epochs", "1", *_SMALL]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith("error: --collection-changed keep applies to --resume (a new run lists its data as it is "
                          "now)") and "\n" not in error, error
