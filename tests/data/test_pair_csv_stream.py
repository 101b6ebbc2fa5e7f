"""An image-text CSV read compactly (contrastkit.data.paired_csv.read_pairs: no tuple, Path or
line string per row) and, with the data option stream=true, as streamed pairs whose images are
decoded when a batch asks for them: the same splits, texts, labels and pixels as the held
form, a bad image named by its file and line when it is reached, and convirt trains from it."""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from contrastkit.cli import main
from contrastkit.data import BadItemError, load_paired, open_data
from contrastkit.data import paired_csv
from contrastkit.data.paired_csv import read_pair_rows, read_pairs


def _pairs(root, count=30, gray=False):
    """``count`` images with a caption and a label each, one of them named twice (two spellings
    of one file: one image, in one split); the CSV's path."""
    rng = np.random.default_rng(0)
    lines = ["image,text,label"]
    for i in range(count):
        array = (rng.random((10, 12, 3)) * 255).astype(np.uint8)
        image = Image.fromarray(array).convert("L" if gray else "RGB")
        (root / "images").mkdir(exist_ok=True)
        image.save(root / "images" / f"{i:03d}.png")
        lines.append(f"images/{i:03d}.png,picture number {i},{'odd' if i % 2 else 'even'}")
    lines.append("./images//000.png,the first picture again,even")
    (root / "pairs.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root / "pairs.csv"


def _split_rows(dataset):
    return {name: (list(split.texts), [int(label) for label in split.labels]) for name, split in dataset.splits()}


@pytest.mark.parametrize("gray", [False, True])
def test_streamed_pairs_are_the_held_pairs_read_when_asked_for(tmp_path, gray):
    path = _pairs(tmp_path, gray=gray)
    held = load_paired(path, size=8, split_seed=3)
    streamed = open_data(str(path), paired=True, stream=True, size=8, split_seed=3)
    assert type(streamed).__name__ == "StreamingPairedDataset" and streamed.streamed
    assert _split_rows(streamed) == _split_rows(held) and streamed.class_names == held.class_names
    assert streamed.image_shape == held.image_shape == ((1,) if gray else (3,)) + (8, 8)
    for name, split in held.splits():
        for i in range(len(split)):
            image, text = getattr(streamed, name)[i]
            assert image.dtype == torch.uint8 and text == split.texts[i]
            assert torch.equal(image.float().div(255.0), split.images[i])
    both = [name for name, split in held.splits() for text in split.texts if "first picture" in text
            or text == "picture number 0"]
    assert len(both) == 2 and both[0] == both[1]  # one file named two ways: one image, in one split


def test_the_rows_are_held_without_an_object_per_row_but_its_text(tmp_path):
    path = _pairs(tmp_path, 6)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1] + lines[1:7] * 1 + [f"images/{i % 6:03d}.png,caption {i},odd"
                                                          for i in range(3000)]) + "\n")
    gc.collect()
    before = len(gc.get_objects())
    rows = read_pairs(path)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert len(rows) == 3006 and grown < 100, grown  # (the texts are str: not tracked by the collector)
    assert read_pair_rows(path)[1] == (path.parent / "images" / "001.png", "picture number 1", "odd", None,
                                       f"{path}, line 3")


def test_a_streamed_image_that_cannot_be_read_is_named_by_its_file_and_line_when_reached(tmp_path):
    path = _pairs(tmp_path)
    streamed = open_data(str(path), paired=True, stream=True, size=8)
    target = streamed.train.dataset.image_path(1)  # (the CaptionedDataset's rows: a PairCsvSplit)
    with open(target, "wb") as handle:
        handle.write(b"not an image")
    with pytest.raises(BadItemError, match=rf"pairs\.csv, line \d+: cannot read image '{target}'"):
        streamed.train[1]


def test_a_large_csv_refused_held_names_the_option_that_streams_it(tmp_path, monkeypatch):
    path = _pairs(tmp_path)
    monkeypatch.setenv("CONTRASTKIT_MAX_INPUT_BYTES", "5000")  # the CSV fits, its 31 images held do not
    with pytest.raises(ValueError, match="stream=true"):
        load_paired(path, size=8)
    assert len(open_data(str(path), paired=True, stream=True, size=8).train) > 0


def test_convirt_trains_from_a_streamed_csv_without_holding_its_images(tmp_path, capsys, monkeypatch):
    path = _pairs(tmp_path, 40)

    def never(*args, **kwargs):
        raise AssertionError("the images were held")

    monkeypatch.setattr(paired_csv, "_held", never)
    out = tmp_path / "run"
    code = main(["pretrain", "--method", "convirt", "--data", str(path), "--data-option", "stream=true",
                 "--data-option", "size=16", "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--quiet",
                 "--no-report", "--no-baselines", "--json", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert np.isfinite(summary["final_loss"]) and summary["steps"] >= 1
    assert os.path.isfile(out / "checkpoints" / "last.pt")


@pytest.fixture
def csv_reads(monkeypatch):
    """How many times a CSV's rows are read and parsed."""
    calls = []
    real = paired_csv.read_pairs
    monkeypatch.setattr(paired_csv, "read_pairs", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    return calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_recorded_csv_is_read_from_its_record_while_it_is_unchanged(tmp_path, csv_reads, stream):
    from contrastkit.data import CollectionChangedError

    path = _pairs(tmp_path)
    index = tmp_path / "index.npz"
    first = load_paired(path, size=8, index=str(index), stream=stream)
    assert first.index_state == "listed" and len(csv_reads) == 1
    first.index.write(index)
    path.write_bytes(path.read_bytes())  # saved again as it was: its SHA-256, not its time, decides
    again = load_paired(path, size=8, index=str(index), stream=stream)
    assert again.index_state == "recorded" and len(csv_reads) == 1 and _split_rows(again) == _split_rows(first)
    assert again.class_names == first.class_names
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1] + lines[2:] + ["images/001.png,a new caption,odd"]) + "\n")
    with pytest.raises(CollectionChangedError) as raised:
        load_paired(path, size=8, index=str(index), stream=stream)
    message = str(raised.value)
    assert "\n" not in message and "1 row added (e.g. " in message and "'a new caption'" in message
    assert "1 gone (e.g. " in message and "'picture number 0'" in message and "--collection-changed keep" in message
    kept = load_paired(path, size=8, index=str(index), stream=stream, collection_changed="keep")
    texts = [text for _, split in kept.splits() for text in split.texts]
    assert kept.index_state == "kept" and "picture number 0" not in texts and "a new caption" not in texts
    assert len(texts) == len(lines) - 2
    again = load_paired(path, size=8, index=str(index), stream=stream, collection_changed="reindex")
    texts = [text for _, split in again.splits() for text in split.texts]
    assert again.index_state == "reindexed" and "a new caption" in texts and "picture number 0" not in texts


def test_convirt_resume_and_embed_read_the_csv_the_run_recorded(tmp_path, csv_reads):
    path = _pairs(tmp_path, 40)
    out = tmp_path / "run"
    run = ["pretrain", "--method", "convirt", "--data", str(path), "--data-option", "stream=true", "--data-option",
           "size=16", "--batch-size", "8", "--device", "cpu", "--quiet", "--no-report", "--no-baselines",
           "--out", str(out)]
    assert main([*run, "--epochs", "1"]) == 0 and len(csv_reads) == 1
    assert main(["pretrain", "--out", str(out), "--resume", "--epochs", "2", "--quiet", "--no-report"]) == 0
    assert main(["embed", str(out), "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    assert len(csv_reads) == 1, "a command read the CSV's rows again instead of the run's record"
    assert np.load(tmp_path / "h.npy").shape[0] == 41


def _former_split_of_texts(path, val_fraction, test_fraction, seed):
    """The split of each row's text by the rule the CSV has always been split by, written out
    independently: rows grouped by their image's resolved path (Path.resolve), the images in
    the order of their first row shuffled with the seed and cut test, val, train."""
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ids = {}
    group = [ids.setdefault(str((path.parent / row["image"]).resolve()), len(ids)) for row in rows]
    order = np.random.default_rng(seed).permutation(len(ids))
    n_val, n_test = int(round(val_fraction * len(ids))), int(round(test_fraction * len(ids)))
    part = {}
    for position, image in enumerate(order):
        part[int(image)] = "test" if position < n_test else "val" if position < n_test + n_val else "train"
    return {row["text"]: part[g] for row, g in zip(rows, group)}


def _split_of_texts(dataset):
    return {text: name for name, split in dataset.splits() for text in split.texts}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_splits_follow_the_former_rule_with_links_and_respelled_paths(tmp_path, seed):
    path = _pairs(tmp_path, 24)
    images = tmp_path / "images"
    os.link(images / "003.png", images / "hard.png")  # a hard link: another image, as it has always been
    os.symlink("005.png", images / "soft.png")  # a symbolic link: the same image
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("images/hard.png,the hard link,odd\nimages/soft.png,the symbolic link,odd\n"
                     "images/../images/007.png,seven respelled,odd\n")
    expected = _former_split_of_texts(path, 0.2, 0.3, seed)
    for stream in (False, True):
        dataset = load_paired(path, size=8, val_fraction=0.2, test_fraction=0.3, split_seed=seed, stream=stream)
        assert _split_of_texts(dataset) == expected


def test_rows_keep_their_splits_when_the_csv_changes(tmp_path):
    path = _pairs(tmp_path, 40)
    index = tmp_path / "index.npz"
    first = load_paired(path, size=8, index=str(index))
    first.index.write(index)
    before = _split_of_texts(first)
    lines = path.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    path.write_text("\n".join([header] + rows[::-1]) + "\n")  # the same rows in another order
    verified = load_paired(path, size=8, index=str(index))
    assert verified.index_state == "verified" and _split_of_texts(verified) == before
    path.write_text("\n".join([header] + rows[1:] + ["images/039.png,another caption of 39,odd",
                                                     "images/new.png,a new image,odd"]) + "\n")
    _image = Image.fromarray(np.zeros((10, 12, 3), dtype=np.uint8))
    _image.save(tmp_path / "images" / "new.png")
    kept = load_paired(path, size=8, index=str(index), collection_changed="keep")
    assert _split_of_texts(kept) == {text: split for text, split in before.items() if text != "picture number 0"}
    again = load_paired(path, size=8, index=str(index), collection_changed="reindex")
    after = _split_of_texts(again)
    assert {text: after[text] for text in before if text in after} == \
        {text: split for text, split in before.items() if text != "picture number 0"}
    assert after["another caption of 39"] == before["picture number 39"]  # a recorded image keeps its split
    assert after["a new image"] in ("train", "val", "test")
