"""Data sources by registry: each ``--data`` resolved once, by the first registered source
that recognises it; a new source is one file (``toy_source.py``), found by the command line
through the entry-point group ``contrastkit.data_sources``; an iterable source is refused by
the training loop in one line."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import toy_source
from _data_fixtures import write_image_folder, write_mnist

import contrastkit.data.files as files
from contrastkit.data import (DataSource, data_sources, find_data_source, is_iterable_data, open_data,
                              register_data_source, split_of_key, unregister_data_source)
from contrastkit.train import PretrainConfig, pretrain

SRC = str(Path(__file__).resolve().parents[2] / "src")
HERE = str(Path(__file__).resolve().parent)


@pytest.fixture
def toy():
    register_data_source(toy_source.SOURCE)
    register_data_source(toy_source.ITERABLE_SOURCE)
    yield
    unregister_data_source("toy")
    unregister_data_source("toy-stream")


def test_every_storage_kind_is_a_registered_source_in_a_fixed_order():
    names = [source.name for source in data_sources()]
    assert names[:11] == ["glyphlab", "digits", "npz", "cifar10", "mnist", "tar-shards", "imagefolder", "collection",
                          "glyphlab-text", "digits-text", "pair-csv"]
    assert all(source.description for source in data_sources())


def _counting(monkeypatch):
    calls = []
    real = files.detect_format

    def counted(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(files, "detect_format", counted)
    return calls


@pytest.mark.parametrize("options", [dict(workers=0), dict(workers=2), dict(workers=0, stream=True)])
def test_detect_format_runs_once_per_data_for_an_image_folder(tmp_path, monkeypatch, options):
    write_image_folder(tmp_path / "tree", classes=("a", "b"), per_class=6)
    calls = _counting(monkeypatch)
    dataset = open_data(tmp_path / "tree", **options)
    assert dataset.num_classes == 2
    assert calls == [str(tmp_path / "tree")]


def test_detect_format_runs_once_for_the_other_kinds(tmp_path, monkeypatch):
    write_mnist(tmp_path / "mnist", n_train=40, n_test=10)
    write_image_folder(tmp_path / "photos", classes=("only",), per_class=12)  # one subfolder: a collection
    for path in (tmp_path / "mnist", tmp_path / "photos"):
        calls = _counting(monkeypatch)
        open_data(path)
        assert calls == [str(path)], path
    (tmp_path / "empty").mkdir()
    calls = _counting(monkeypatch)
    with pytest.raises(ValueError, match="cannot recognise"):
        open_data(tmp_path / "empty")
    assert len(calls) == 1


def test_a_toy_source_in_one_file_opens_and_trains_in_process(toy, tmp_path):
    assert find_data_source("toy:6").name == "toy"
    assert find_data_source("glyphlab").name == "glyphlab"  # built-ins keep their meaning
    dataset = open_data("toy:6", seed=1)
    assert (dataset.name, len(dataset.train), dataset.image_shape) == ("toy", 12, (1, 12, 12))
    with pytest.raises(TypeError, match="unknown option.*'colour'.*for toy"):
        open_data("toy:6", colour="RGB")
    with pytest.raises(ValueError, match="stream=true reads each image when a batch asks for it.*'toy:6' is none"):
        open_data("toy:6", stream=True)
    summary = pretrain(PretrainConfig(data="toy:6", epochs=1, batch_size=8, out=str(tmp_path / "run"), device="cpu",
                                      log_every=1), progress=False, baselines=False)
    assert summary["epochs"] == 1 and summary["data"] == "toy"


def test_a_name_no_source_recognises_lists_the_installed_sources(toy):
    with pytest.raises(FileNotFoundError, match=r"no data set 'tyo:6'.*\(glyphlab, digits\).*installed sources: toy"):
        open_data("tyo:6")


def test_one_source_owns_a_name():
    with pytest.raises(ValueError, match="'digits' is already registered"):
        register_data_source(DataSource("digits", detect=lambda data: False, open=lambda request: None))
    assert find_data_source("digits").description.startswith("digits:")


def test_an_iterable_source_in_one_file_trains_and_resumes_by_the_contract(toy, tmp_path, monkeypatch):
    dataset = open_data("toy-stream:4")
    assert is_iterable_data(dataset) and not is_iterable_data(open_data("toy:4"))
    dataset.train.set_epoch(0)
    first = [key for _, _, key in itertools.islice(iter(dataset.train), 8)]
    assert sorted(first) == sorted(f"shard-{i // 4}/{i}" for i in range(8))  # one pass: each sample once
    again = open_data("toy-stream:4").train
    again.load_state_dict({"epoch": 0, "workers": 1, "consumed": [3]})
    assert [key for _, _, key in itertools.islice(iter(again), 5)] == first[3:]  # the contract's exact resume
    # Each step's views are made of the images the stream gave for that batch (its read-out
    # sample is held in memory, but a stream's batch positions are no indices into it).
    from contrastkit.data.batches import StreamedViews
    from contrastkit.data.views import ViewMaker

    held, viewed = [], []
    real_hold, real_views_of = StreamedViews.hold, ViewMaker.views_of
    monkeypatch.setattr(StreamedViews, "hold", lambda self, split, batch: (
        held.append(torch.stack([dataset.train.images[int(key.rsplit("/", 1)[1])] for key in batch.keys])),
        real_hold(self, split, batch))[1])
    monkeypatch.setattr(ViewMaker, "views_of", lambda self, images: (viewed.append(images.clone()),
                                                                     real_views_of(self, images))[1])
    summary = pretrain(PretrainConfig(data="toy-stream:4", epochs=2, batch_size=4, out=str(tmp_path / "run"),
                                      device="cpu"), progress=False, baselines=False)
    assert (summary["epochs"], summary["steps"]) == (2, 4)
    assert len(held) == 4 and all(torch.equal(viewed[i].float(), images.float()) for i, images in enumerate(held))


def test_a_plugin_that_fails_to_load_is_one_error_naming_its_entry_point(monkeypatch):
    import importlib.metadata

    import contrastkit.data.sources as sources

    broken = importlib.metadata.EntryPoint(name="shards", value="no_such_package_of_shards:SOURCE",
                                           group=sources.ENTRY_POINT_GROUP)
    not_a_source = importlib.metadata.EntryPoint(name="odd", value="toy_source:toy_images",
                                                 group=sources.ENTRY_POINT_GROUP)
    monkeypatch.setattr(sources, "_plugins_loaded", False)
    for point, message in ((broken, "plug-in 'shards' .*no_such_package_of_shards:SOURCE.* failed to load: "
                                    "ModuleNotFoundError"),
                           (not_a_source, "plug-in 'odd' .* names a function, not a contrastkit.data.DataSource")):
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group, point=point: [point])
        with pytest.raises(ValueError, match=message):
            open_data("digits")
        with pytest.raises(ValueError, match=message):  # every time, not only the first
            data_sources()
    monkeypatch.undo()
    assert find_data_source("digits").name == "digits"


def test_split_of_key_is_the_collections_hash_rule():
    keys = [f"shard-{i // 100}/{i}" for i in range(2000)]
    parts = [split_of_key(key, 0.1, 0.2) for key in keys]
    assert parts == [split_of_key(key, 0.1, 0.2) for key in keys]
    share = {part: parts.count(part) / len(keys) for part in ("train", "val", "test")}
    # 2000 draws: a share's standard deviation is at most sqrt(0.25 / 2000) = 0.011; allow 4 of them
    assert abs(share["test"] - 0.2) < 0.045 and abs(share["val"] - 0.1) < 0.045
    with pytest.raises(ValueError, match="val_fraction \\+ test_fraction must be < 1"):
        split_of_key("a", 0.5, 0.5)


def test_a_toy_source_installed_as_an_entry_point_trains_from_the_command_line(tmp_path):
    site = tmp_path / "site"
    info = site / "toy_source_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-source-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[contrastkit.data_sources]\ntoy = toy_source:SOURCE\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, HERE, str(site)])}
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "contrastkit", "pretrain", "--data", "toy:6", "--epochs", "1",
                           "--batch-size", "8", "--device", "cpu", "--quiet", "--no-report", "--no-baselines",
                           "--json", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["data"] == "toy" and summary["epochs"] == 1
    assert json.loads((out / "config.json").read_text())["config"]["data"] == "toy:6"
    # without the plug-in installed, the same --data is one line naming it
    env["PYTHONPATH"] = os.pathsep.join([SRC, HERE])
    done = subprocess.run([sys.executable, "-m", "contrastkit", "pretrain", "--data", "toy:6", "--epochs", "1",
                           "--device", "cpu", "--quiet", "--out", str(tmp_path / "other")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "contrastkit pretrain: error: no data set 'toy:6': not a built-in name (glyphlab, digits) and no such file "
        "or folder"]
