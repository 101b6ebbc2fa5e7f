"""Image-text tar shards (img2dataset's layout: ``KEY.jpg|png``, ``KEY.txt``, ``KEY.cls``):
``contrastkit shard`` writes them from an image-text CSV, the image-text methods train from them
as a stream, each image with its own caption (in the training batches, the read-out and the
last batch's record), resume exactly in the middle of an epoch, and name the samples they
cannot read."""

import csv
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
import torch

from contrastkit import layout
from contrastkit.cli import main
from contrastkit.data import find_data_source, open_data, open_tar_shards, split_of_key
from contrastkit.models.text import WordTokenizer
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.train.faults import Preempted

from _shards import write_image_tree
from _tiny_run import preempted_at_backward, without_timings
from test_stream_training import _weights

_WORDS = ["red", "green", "blue", "round", "square", "small", "large", "bright", "dark", "plain"]


def _caption(label, i):
    return f"a {_WORDS[i % len(_WORDS)]} picture of class{label}, number {i}"


def _pair_csv(root, *, classes=3, per_class=16):
    """Generated images of ``classes`` colours, listed in ``root/pairs.csv`` with a caption
    each and the class name as the label; ``{source path: caption}``."""
    write_image_tree(str(root / "images"), classes=classes, per_class=per_class, size=16)
    captions = {}
    with open(root / "pairs.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image", "text", "label"])
        for label in range(classes):
            for i in range(per_class):
                source = f"images/class{label}/{i:03d}.png"
                captions[source] = _caption(label, i)
                writer.writerow([source, captions[source], f"class{label}"])
    return str(root / "pairs.csv"), captions


def _members(folder):
    """``{key: {ext: bytes}}`` of every shard in ``folder``."""
    samples = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(folder, name)) as tar:
                for member in tar:
                    stem, _, ext = member.name.partition(".")
                    samples.setdefault(f"{name}/{stem}", {})[ext] = tar.extractfile(member).read()
    return samples


@pytest.fixture(scope="module")
def pair_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    pairs, captions = _pair_csv(root)
    out = root / "shards"
    assert main(["shard", pairs, str(out), "--shard-size", "8", "--quiet"]) == 0
    return str(out), captions


def _source_captions(folder):
    """``{key: caption}`` of the shards, each caption looked up by the sample's source file."""
    return {key: members["txt"].decode() for key, members in _members(folder).items()}


def _config(data, out, **overrides):
    options = dict(data=data, method="convirt", data_options={"size": 16}, epochs=2, batch_size=8, out=str(out),
                   device="cpu", log_every=1, checkpoint_every=0)
    options.update(overrides)
    return PretrainConfig(**options)


def test_image_text_shards_pair_each_image_with_its_own_caption(pair_shards):
    folder, captions = pair_shards
    members = _members(folder)
    by_source = {json.loads(m["json"])["source"]: key for key, m in members.items()}
    assert {source: members[key]["txt"].decode() for source, key in by_source.items()} == captions
    assert find_data_source(folder, pairs=True).name == "tar-shard-pairs"
    assert find_data_source(folder).name == "tar-shards"  # the image methods read the same shards as images
    data = open_data(folder, paired=True, size=16)
    assert data.paired and data.class_prompts == {f"class{i}": [f"class{i}"] for i in range(3)}
    keys = _source_captions(folder)
    for split in (data.val, data.test, data.readout_train):
        assert split.texts == [keys[sample.key] for sample in split.samples] and len(split.texts) == len(split)
    # every training caption, in the shards' order, is what the run's tokenizer is built from
    train_keys = [key for key in sorted(keys) if split_of_key(key) == "train"]
    assert data.train.texts == [keys[key] for key in train_keys]
    data.train.set_epoch(0)
    for image, label, key, text in (next(iter(data.train)) for _ in range(1)):
        assert text == keys[key] and label == int(members[key]["cls"]) and image.shape == (3, 16, 16)
    assert open_data(folder, size=16).train.texts is None  # read as images, the captions are not read


def test_convirt_trains_from_image_text_shards_on_the_command_line(pair_shards, tmp_path):
    folder, _ = pair_shards
    out = tmp_path / "run"
    assert main(["pretrain", "--method", "convirt", "--data", folder, "--data-option", "size=16", "--epochs", "1",
                 "--batch-size", "8", "--device", "cpu", "--quiet", "--no-report", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["retrieval_pairs"] == len(open_tar_shards(folder, paired=True).test)
    assert 0.0 <= summary["retrieval_i2t_recall@1"] <= 1.0 and 0.0 <= summary["zero_shot_accuracy"] <= 1.0
    keys = _source_captions(folder)
    tokenizer = WordTokenizer.load(layout.RunFolder(str(out)).tokenizer)
    expected = WordTokenizer.build([keys[key] for key in sorted(keys) if split_of_key(key) == "train"])
    assert tokenizer.vocabulary == expected.vocabulary  # from every training caption, not a sample of them
    # the last batch's record: each row's caption is its own sample's
    last = torch.load(out / "last_batch.pt", map_location="cpu", weights_only=False)
    assert last["texts"] and all(text == keys[last["keys"][int(row)]] for row, text in last["texts"].items())
    # embed reads the run's shards again: a row for every sample, named by its key
    assert main(["embed", str(out), "--out", str(tmp_path / "rows.npz")]) == 0
    assert sorted(str(name) for name in np.load(tmp_path / "rows.npz")["names"]) == sorted(keys)


def test_each_step_reads_the_captions_of_its_own_images(pair_shards, tmp_path, monkeypatch):
    """The token ids a training step is given are those of its batch's captions, key for key
    (the batch maker is asked for the batch the loop handed over, of the same split)."""
    from contrastkit.methods import convirt

    folder, _ = pair_shards
    keys = _source_captions(folder)
    events = []
    real_hold, real_call = convirt.PairedBatches.hold, convirt.PairedBatches.__call__

    def hold(self, split, batch):
        events.append(("hold", self.tokenizer.encode([keys[key] for key in batch.keys])[0]))
        return real_hold(self, split, batch)

    def call(self, split, indices):
        images, (ids, mask) = real_call(self, split, indices)
        events.append(("call", ids.cpu()))
        return images, (ids, mask)

    monkeypatch.setattr(convirt.PairedBatches, "hold", hold)
    monkeypatch.setattr(convirt.PairedBatches, "__call__", call)
    summary = pretrain(_config(folder, tmp_path / "run", epochs=1), progress=False, baselines=False)
    holds = [i for i, (kind, _) in enumerate(events) if kind == "hold"]
    assert len(holds) == summary["steps"] >= 3
    for i in holds:
        assert events[i + 1][0] == "call" and torch.equal(events[i + 1][1], events[i][1])


@pytest.mark.parametrize("method", ["convirt", "siglip"])
def test_a_pair_stream_preempted_mid_epoch_resumes_to_the_uninterrupted_run(pair_shards, tmp_path, monkeypatch,
                                                                            method):
    folder, _ = pair_shards
    straight = pretrain(_config(folder, tmp_path / "straight", method=method), progress=False, baselines=False)
    steps_per_epoch = straight["steps"] // 2
    assert steps_per_epoch >= 3
    restore = preempted_at_backward(monkeypatch, steps_per_epoch + 2)
    with pytest.raises(Preempted):
        pretrain(_config(folder, tmp_path / "stopped", method=method), progress=False, baselines=False)
    restore()
    stopped = torch.load(tmp_path / "stopped" / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert (stopped["epoch"], stopped["epoch_step"]) == (1, 2)
    resumed = pretrain(_config(folder, tmp_path / "stopped", method=method), resume=True, progress=False,
                       baselines=False)
    assert without_timings(resumed) == without_timings(straight)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "stopped")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


def _copy_with(folder, target, edit):
    """The shards of ``folder`` copied to ``target``, ``edit(key, members)`` changing each
    sample's members (a dict ext -> bytes) in place; the keys whose members it changed."""
    os.makedirs(target)
    changed = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".tar"):
            continue
        samples = {}
        with tarfile.open(os.path.join(folder, name)) as tar:
            for member in tar:
                stem, _, ext = member.name.partition(".")
                samples.setdefault(stem, {})[ext] = tar.extractfile(member).read()
        with tarfile.open(os.path.join(target, name), "w") as tar:
            for stem, members in samples.items():
                before = dict(members)
                edit(f"{name}/{stem}", members)
                if members != before:
                    changed.append(f"{name}/{stem}")
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{stem}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    shutil.copy(os.path.join(folder, "classes.txt"), target)
    return changed


def test_a_sample_without_a_caption_or_with_a_damaged_image_is_skipped_and_named(pair_shards, tmp_path):
    folder, _ = pair_shards
    train_keys = sorted(key for key in _source_captions(folder) if split_of_key(key) == "train")
    no_caption, bad_image = train_keys[0], train_keys[1]

    def edit(key, members):
        if key == no_caption:
            del members["txt"]
        if key == bad_image:
            members["png"] = b"not a PNG file" * 8

    damaged = tmp_path / "damaged"
    assert sorted(_copy_with(folder, str(damaged), edit)) == sorted([no_caption, bad_image])
    opened = open_tar_shards(str(damaged), paired=True, size=16)
    assert no_caption not in {sample.key for sample in opened.readout_train.samples}
    assert "no .txt member" in opened.train.skipped[no_caption]
    assert open_tar_shards(str(damaged), size=16).train.num_samples == opened.train.num_samples + 1  # images alone
    with pytest.raises(ValueError, match=f"{no_caption} is no caption"):
        open_tar_shards(str(damaged), paired=True, size=16, bad_files="fail")
    out = tmp_path / "run"
    # A batch that divides the training samples: the one epoch reads every one of them.
    batch = next(b for b in range(8, 1, -1) if opened.train.num_samples % b == 0)
    pretrain(_config(str(damaged), out, epochs=1, batch_size=batch), progress=False, baselines=False)
    named = {line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines()}
    assert {no_caption, bad_image} <= named
