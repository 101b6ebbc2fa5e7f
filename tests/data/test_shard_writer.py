"""``contrastkit shard`` / :func:`contrastkit.data.write_shards`: what ``--data`` reads back from
the shards equals the source, image for image and label for label (class trees with parts,
unlabeled collections, image-text CSVs); the layout (img2dataset's keys and members, index and
classes files); resizing; resuming after a kill; never writing over what contrastkit did not
write; damaged files left out and named; parallel writing gives the same bytes."""

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pytest

from contrastkit.cli import main
from contrastkit.data import open_data, write_shards
from contrastkit.data import shard_writer
from contrastkit.data.preprocess import SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

from _shards import write_image_tree


def _members(path):
    with tarfile.open(path, "r:") as tar:
        return {member.name: tar.extractfile(member).read() for member in tar}


def _samples(folder):
    """key -> {extension: bytes} over every shard of a shard set (in name order)."""
    samples = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar"):
            for member, data in _members(os.path.join(folder, name)).items():
                key, _, ext = member.partition(".")
                samples.setdefault(f"{name}/{key}", {})[ext] = data
    return samples


def _tree_with_parts(root):
    write_image_tree(os.path.join(root, "train"), classes=3, per_class=7, size=12, seed=1)
    write_image_tree(os.path.join(root, "test"), classes=3, per_class=3, size=12, seed=2)
    return root


def test_a_class_tree_with_parts_reads_back_image_for_image_and_label_for_label(tmp_path):
    tree = _tree_with_parts(str(tmp_path / "tree"))
    out = str(tmp_path / "shards")
    written = write_shards(tree, out, shard_size=8)
    assert written.kind == "imagefolder" and sorted(written.parts) == ["test", "train"]
    assert [os.path.basename(p) for p in written.parts["train"].shards] == ["00000.tar", "00001.tar", "00002.tar"]
    assert written.parts["train"].samples == 21 and written.parts["test"].samples == 9
    for part, per_class in (("train", 7), ("test", 3)):
        folder = os.path.join(out, part)
        samples = _samples(folder)
        assert len(samples) == 3 * per_class
        # img2dataset's keys: the shard's number and the sample's place in it (shard size 8: one digit)
        assert sorted(samples)[:2] == ["00000.tar/000000", "00000.tar/000001"]
        assert "00001.tar/000010" in samples
        with open(os.path.join(folder, "classes.txt"), encoding="utf-8") as handle:
            assert handle.read().split() == ["class0", "class1", "class2"]
        for key, members in samples.items():
            assert sorted(members) == ["cls", "json", "png"]
            record = json.loads(members["json"])
            assert record["source"].startswith(f"{part}/")  # named relative to the source
            with open(os.path.join(tree, *record["source"].split("/")), "rb") as handle:
                assert members["png"] == handle.read()  # the file's bytes, unchanged
            assert int(members["cls"]) == int(record["source"].split("/")[1][len("class"):])
            assert record["class"] == record["source"].split("/")[1]
            assert record["key"] == key.split("/")[1] and (record["width"], record["height"]) == (12, 12)
        index = json.loads(open(os.path.join(folder, "index.json"), encoding="utf-8").read())
        assert index["samples"] == 3 * per_class and [s["name"] for s in index["shards"]][0] == "00000.tar"
    # What --data reads back: every sample, its label, and the source image's pixels.
    data = open_data(os.path.join(out, "train"), size=12)
    keys = {key: members for key, members in _samples(os.path.join(out, "train")).items()}
    preprocessing = ImagePreprocessing("RGB", (12, 12), SHORTER_SIDE_THEN_CENTRE_CROP)
    read = 0
    for split in (data.val, data.test):
        for i in range(len(split)):
            image, label = split[i]
            record = json.loads(keys[split.path(i)]["json"])
            source = os.path.join(tree, *record["source"].split("/"))
            assert np.array_equal(image.numpy(), preprocessing.read(source))
            assert label == int(keys[split.path(i)]["cls"])
            read += 1
    assert read + data.train.num_samples == 21
    assert data.class_names == ["class0", "class1", "class2"]


def _write_png(path, width, height, value=90, mode="RGB"):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    channels = 3 if mode == "RGB" else 1
    pixels = np.full((height, width, channels), value, dtype=np.uint8).squeeze()
    Image.fromarray(pixels, mode=mode).save(path)


def test_a_collection_and_an_image_text_csv_with_splits(tmp_path):
    photos = tmp_path / "photos"
    for i in range(5):
        _write_png(str(photos / "deep" / f"p{i}.png"), 10, 8, value=20 * i)
    written = write_shards(str(photos), str(tmp_path / "unlabeled"), shard_size=2)
    assert written.kind == "collection" and list(written.parts) == ["all"]
    samples = _samples(str(tmp_path / "unlabeled"))
    assert len(samples) == 5 and all(sorted(m) == ["json", "png"] for m in samples.values())
    assert sorted(json.loads(m["json"])["source"] for m in samples.values()) == [f"deep/p{i}.png" for i in range(5)]
    assert not os.path.exists(tmp_path / "unlabeled" / "classes.txt")

    rows = ["image,text,label,split"] + [f"photos/deep/p{i}.png,a photo number {i},{'cat' if i % 2 else 'dog'},"
                                         f"{'test' if i == 4 else 'train'}" for i in range(5)]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    written = write_shards(str(tmp_path / "pairs.csv"), str(tmp_path / "paired"), shard_size=3)
    assert written.kind == "pair-csv" and sorted(written.parts) == ["test", "train"]
    train = _samples(str(tmp_path / "paired" / "train"))
    assert len(train) == 4 and all(sorted(m) == ["cls", "json", "png", "txt"] for m in train.values())
    captions = {json.loads(m["json"])["source"]: (m["txt"].decode(), int(m["cls"])) for m in train.values()}
    assert captions["photos/deep/p1.png"] == ("a photo number 1", 0)  # classes in sorted order: cat 0, dog 1
    assert captions["photos/deep/p2.png"] == ("a photo number 2", 1)
    assert (tmp_path / "paired" / "train" / "classes.txt").read_text(encoding="utf-8").split() == ["cat", "dog"]


def test_resize_stores_the_shorter_side_and_keeps_what_is_small(tmp_path):
    from PIL import Image

    source = tmp_path / "tree"
    _write_png(str(source / "a" / "wide.png"), 300, 200)
    _write_png(str(source / "a" / "small.png"), 40, 30)
    big = Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8))
    (source / "b").mkdir()
    big.save(str(source / "b" / "photo.JPG"), format="JPEG")
    _write_png(str(source / "b" / "gray.png"), 90, 120, mode="L")
    write_shards(str(source), str(tmp_path / "out"), resize=64)
    stored = {}
    for members in _samples(str(tmp_path / "out")).values():
        record = json.loads(members["json"])
        ext = next(e for e in members if e not in ("json", "cls"))
        with Image.open(io.BytesIO(members[ext])) as image:
            stored[record["source"]] = (ext, image.size, image.mode, record)
    assert stored["a/wide.png"][:3] == ("png", (96, 64), "RGB")
    assert stored["a/wide.png"][3]["original_width"] == 300 and stored["a/wide.png"][3]["width"] == 96
    assert stored["a/small.png"][:2] == ("png", (40, 30))  # already small: the file's bytes
    assert stored["b/photo.JPG"][:3] == ("jpg", (85, 64), "RGB")  # 640 x 480 -> 85.3 x 64, a JPEG again
    assert stored["b/gray.png"][:3] == ("png", (64, 85), "L")


def _digests(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if name.endswith(".tar")}


def test_a_killed_writing_is_finished_by_the_same_command_and_parallel_writing_is_the_same(tmp_path, monkeypatch):
    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=9, size=8)
    whole = str(tmp_path / "whole")
    write_shards(tree, whole, shard_size=4)
    expected = _digests(whole)
    assert len(expected) == 5

    interrupted = str(tmp_path / "interrupted")
    original, calls = shard_writer._write_shard, []

    def killed_after_two(job):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(job.path)
        return original(job)

    monkeypatch.setattr(shard_writer, "_write_shard", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        write_shards(tree, interrupted, shard_size=4)
    monkeypatch.setattr(shard_writer, "_write_shard", original)
    assert sorted(_digests(interrupted)) == ["00000.tar", "00001.tar"]
    assert not [name for name in os.listdir(interrupted) if name.endswith(".tmp")]
    again = write_shards(tree, interrupted, shard_size=4)
    assert again.kept == 2 and _digests(interrupted) == expected
    assert json.load(open(os.path.join(interrupted, "index.json"))) == json.load(open(os.path.join(whole, "index.json")))

    # A shard changed since it was written is written again, not trusted.
    with open(os.path.join(interrupted, "00001.tar"), "ab") as handle:
        handle.write(b"\0" * 512)
    assert write_shards(tree, interrupted, shard_size=4).kept == 4 and _digests(interrupted) == expected

    parallel = str(tmp_path / "parallel")
    write_shards(tree, parallel, shard_size=4, workers=2)
    assert _digests(parallel) == expected


def test_what_contrastkit_did_not_write_is_never_written_over(tmp_path):
    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=3, size=8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's", encoding="utf-8")
    with pytest.raises(FileExistsError, match="output folder .*mine is not empty"):
        write_shards(tree, str(mine))
    with pytest.raises(FileExistsError):
        write_shards(tree, str(mine), force=True)  # no manifest: nothing of contrastkit's to replace
    assert (mine / "notes.txt").read_text(encoding="utf-8") == "the user's"

    out = str(tmp_path / "out")
    write_shards(tree, out, shard_size=4)
    with pytest.raises(ValueError, match="holds a shard set with other settings .*shard_size: stored 4 vs now 2"):
        write_shards(tree, out, shard_size=2)
    os.remove(os.path.join(tree, "class1", "002.png"))  # the source changed: not the shards' source any more
    _write_png(os.path.join(tree, "class1", "new.png"), 8, 8)
    with pytest.raises(ValueError, match="other settings .*listing"):
        write_shards(tree, out, shard_size=4)
    (tmp_path / "out" / "notes.txt").write_text("the user's too", encoding="utf-8")
    written = write_shards(tree, out, shard_size=2, force=True)
    assert len(written.parts["all"].shards) == 3 and sorted(_digests(out)) == ["00000.tar", "00001.tar", "00002.tar"]
    assert (tmp_path / "out" / "notes.txt").read_text(encoding="utf-8") == "the user's too"


def test_damaged_images_are_left_out_and_named_or_stop_the_writing(tmp_path):
    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=3, size=8)
    damaged = os.path.join(tree, "class1", "broken.png")
    with open(damaged, "wb") as handle:
        handle.write(b"not a PNG at all" * 8)
    written = write_shards(tree, str(tmp_path / "out"), shard_size=4)
    assert written.parts["all"].samples == 6 and list(written.parts["all"].left_out) == ["class1/broken.png"]
    index = json.load(open(tmp_path / "out" / "index.json"))
    assert any("class1/broken.png" in shard["left_out"] for shard in index["shards"])
    assert all("broken" not in json.loads(m["json"])["source"] for m in _samples(str(tmp_path / "out")).values())
    with pytest.raises(ValueError, match="broken.png: .*cannot"):
        write_shards(tree, str(tmp_path / "strict"), bad_files="fail")


def test_bad_arguments_and_sources_are_refused_by_name(tmp_path):
    tree = write_image_tree(str(tmp_path / "tree"), classes=2, per_class=2, size=8)
    with pytest.raises(ValueError, match="shard_size"):
        write_shards(tree, str(tmp_path / "a"), shard_size=0)
    with pytest.raises(ValueError, match="resize"):
        write_shards(tree, str(tmp_path / "a"), resize=0)
    with pytest.raises(FileNotFoundError, match="nowhere.* no such file"):
        write_shards(str(tmp_path / "nowhere"), str(tmp_path / "a"))
    with pytest.raises(ValueError, match="glyphlab is read as 'glyphlab' data; contrastkit shard writes shards of image files"):
        write_shards("glyphlab", str(tmp_path / "a"))


def test_the_command_writes_keeps_and_refuses_by_name(tmp_path, capsys):
    tree = write_image_tree(str(tmp_path / "tree"), classes=3, per_class=10, size=16)
    out = str(tmp_path / "shards")
    assert main(["shard", tree, out, "--shard-size", "10", "--quiet"]) == 0
    assert "wrote 30 samples in 3 shards to" in capsys.readouterr().out
    assert main(["shard", tree, out, "--shard-size", "10", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kept"] == 3 and result["parts"]["all"]["samples"] == 30
    assert main(["shard", tree, out, "--shard-size", "0"]) == 2
    assert "shard_size" in capsys.readouterr().err
