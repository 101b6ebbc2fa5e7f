"""Where tar shards can be: a folder, a brace pattern, a ``.txt`` list of shards, and URLs
read through fsspec (``file://`` and ``memory://`` here; ``s3://`` and the others need their
own fsspec packages): every form reads the same samples, labels and images; a shard that
cannot be opened is named with the storage's error in one line. And the layout is
WebDataset's: the ``webdataset`` package reads what ``contrastkit shard`` writes, and
contrastkit reads what ``webdataset.ShardWriter`` writes."""

import io
import json
import os

import numpy as np
import pytest

from contrastkit.data import find_data_source, open_data, open_tar_shards, write_shards
from contrastkit.data.shards import shard_urls

from _shards import write_image_tree

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (pip install 'contrastkit[shards]')")
pytest.importorskip("braceexpand", reason="braceexpand is not installed (pip install 'contrastkit[shards]')")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    tree = write_image_tree(str(root / "tree"), classes=3, per_class=8, size=12)
    out = str(root / "shards")
    write_shards(tree, out, shard_size=5)
    return out


def _everything(data):
    """key -> (label, image bytes as read) of every held-out and read-out sample, and the
    training stream's sample count and keys."""
    opened = open_data(data, size=12)
    seen = {}
    for split in (opened.val, opened.test):
        for i in range(len(split)):
            image, label = split[i]
            seen[split.path(i)] = (label, image.numpy().tobytes())
    train = sorted(s.key for samples in opened.train.by_shard for s in samples)
    return seen, train, opened.class_names


def _memory_copy(folder, prefix):
    memory = fsspec.filesystem("memory")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".tar") or name == "classes.txt":
            with open(os.path.join(folder, name), "rb") as handle:
                memory.pipe(f"{prefix}/{name}", handle.read())
    return memory


def test_every_form_of_naming_the_shards_reads_the_same_samples(written, tmp_path):
    expected = _everything(written)
    assert len(expected[1]) + len(expected[0]) == 24 and expected[2] == ["class0", "class1", "class2"]
    pattern = os.path.join(written, "{00000..00004}.tar")
    listing = tmp_path / "shards.txt"
    listing.write_text("# the shards\n" + "".join(f"{os.path.relpath(os.path.join(written, f'{i:05d}.tar'), tmp_path)}\n"
                                                 for i in range(5)), encoding="utf-8")
    _memory_copy(written, "/ck-test-shards")
    forms = [pattern, str(listing), "file://" + os.path.abspath(written) + "/", "file://" + pattern,
             "memory://ck-test-shards/", "memory://ck-test-shards/{00000..00004}.tar"]
    for data in forms:
        assert find_data_source(data).name == "tar-shards", data
        assert len(shard_urls(data)[0]) == 5, data
        assert _everything(data) == expected, data


def test_a_pretrain_run_streams_from_memory(written, tmp_path):
    from contrastkit.cli import main

    _memory_copy(written, "/ck-run-shards")
    out = str(tmp_path / "run")
    assert main(["pretrain", "--data", "memory://ck-run-shards/", "--data-option", "size=12", "--epochs", "1",
                 "--batch-size", "4", "--out", out, "--quiet", "--no-report"]) == 0
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["derived"]["stream"]["train_samples"] == open_tar_shards("memory://ck-run-shards/").train.num_samples


def test_a_shard_that_cannot_be_opened_is_named_with_the_storage_error(written, tmp_path):
    with pytest.raises(ValueError, match=r"shard memory://nowhere/00000.tar cannot be opened \(FileNotFoundError"):
        open_tar_shards("memory://nowhere/{00000..00001}.tar")
    with pytest.raises(ValueError, match=r"memory://nowhere-at-all/ cannot be listed \(FileNotFoundError"):
        open_tar_shards("memory://nowhere-at-all/")
    with pytest.raises(ValueError, match=r"shard nosuchprotocol://bucket/a.tar cannot be opened \(ValueError: "
                                         r"Protocol not known: nosuchprotocol\)"):
        open_tar_shards("nosuchprotocol://bucket/a.tar")
    missing = tmp_path / "list.txt"
    missing.write_text(os.path.join(written, "00000.tar") + "\n" + str(tmp_path / "gone.tar") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="shard .*gone.tar cannot be opened .*No such file"):
        open_tar_shards(str(missing))
    not_a_list = tmp_path / "images.txt"
    not_a_list.write_text("a.png\nb.tar\n", encoding="utf-8")
    assert find_data_source(str(not_a_list)).name == "collection"  # a list of images, not of shards


def test_webdataset_reads_what_contrastkit_shard_writes_and_the_other_way(written, tmp_path):
    webdataset = pytest.importorskip("webdataset", reason="webdataset is not installed (its interoperability test)")
    from PIL import Image

    pattern = os.path.join(written, "{00000..00004}.tar")
    samples = list(webdataset.WebDataset(pattern, shardshuffle=False))
    assert len(samples) == 24
    first = samples[0]
    assert first["__key__"] == "000000" and sorted(k for k in first if not k.startswith("__")) == ["cls", "json", "png"]
    assert json.loads(first["json"])["key"] == first["__key__"] and int(first["cls"]) == 0

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    rng = np.random.default_rng(0)
    with webdataset.ShardWriter(str(theirs / "part-%04d.tar"), maxcount=7) as sink:
        for i in range(20):
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(buffer, format="JPEG")
            sink.write({"__key__": f"sample{i:04d}", "jpg": buffer.getvalue(), "cls": str(i % 2).encode(),
                        "txt": f"caption {i}".encode()})
    opened = open_data(str(theirs), size=12)
    held = {opened.val.path(i) for i in range(len(opened.val))} | {opened.test.path(i) for i in range(len(opened.test))}
    assert opened.train.num_samples + len(held) == 20 and opened.class_names == ["0", "1"]
    assert all(key.startswith("part-000") for key in held)
