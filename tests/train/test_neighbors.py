"""contrastkit.train.neighbors: the FAISS index saved in the run folder and reused only while the
checkpoint and the data are unchanged; streamed image folders (files as queries and names); the
picture; real CIFAR-10 images when the shared data are present."""

import io
import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch

from _tiny_run import tiny_config
from contrastkit.cli import main
from contrastkit.manifest import Manifest, file_sha256
from contrastkit.train import pretrain
from contrastkit.train.neighbor_picture import MAX_QUERIES_SHOWN, Thumbnail, neighbor_picture_png
from contrastkit.train.neighbors import find_neighbors

from _data_fixtures import CIFAR_TARBALL, cifar_subset

faiss = pytest.importorskip("faiss", reason="FAISS is not installed (pip install 'contrastkit[faiss]')")



@pytest.fixture
def run_dir(tmp_path, one_torch_thread):
    """A two-epoch tiny run (so that checkpoints/previous.pt holds other weights)."""
    out = tmp_path / "run"
    pretrain(tiny_config(out, epochs=2), progress=False, baselines=False)
    return out


def _indexes(run_dir):
    folder = run_dir / "neighbors"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _rows(search):
    return [[n.row for n in q.neighbors] for q in search.queries]


def test_the_faiss_index_is_saved_listed_and_reused_while_nothing_changes(run_dir):
    first = find_neighbors(str(run_dir), ["test:3", "7"], k=5, index="faiss", device="cpu")
    assert not first.index_reused and first.index_file and os.path.isfile(first.index_file)
    key = os.path.basename(first.index_file)[:-len(".faiss")]
    assert _indexes(run_dir) == [f"{key}.faiss", f"{key}.json"]
    listed = Manifest(run_dir).files
    for name in (f"neighbors/{key}.faiss", f"neighbors/{key}.json"):
        assert listed[name]["sha256"] == file_sha256(run_dir / name)
    description = json.loads((run_dir / "neighbors" / f"{key}.json").read_text())
    assert description["rows"] == 37 and description["splits"] == ["train", "val", "test"]
    assert description["index"] == "IndexFlatIP" and description["key"] == key

    again = find_neighbors(str(run_dir), ["test:3", "7"], k=5, index="faiss", device="cpu")
    assert again.index_reused and again.index_file == first.index_file
    assert _rows(again) == _rows(first)
    assert [[n.similarity for n in q.neighbors] for q in again.queries] == \
        [[n.similarity for n in q.neighbors] for q in first.queries]
    # The exact search finds the same similarities, rank by rank (the order of near-ties aside).
    exact = find_neighbors(str(run_dir), ["test:3", "7"], k=5, device="cpu")
    np.testing.assert_allclose([[n.similarity for n in q.neighbors] for q in exact.queries],
                               [[n.similarity for n in q.neighbors] for q in first.queries], rtol=0, atol=1e-5)

    # Another collection of the same encoder: another index, next to the first.
    split = find_neighbors(str(run_dir), ["test:3"], k=3, index="faiss", split="train", device="cpu")
    assert not split.index_reused and split.index_file != first.index_file
    assert len(_indexes(run_dir)) == 4
    assert find_neighbors(str(run_dir), ["test:3"], k=3, index="faiss", split="train", device="cpu").index_reused
    # Other data (another test split): not reused.
    other = find_neighbors(str(run_dir), ["test:1"], k=3, index="faiss", data="glyphlab", device="cpu",
                           data_options={"train_scenes": 16, "val_scenes": 9, "test_scenes": 5, "size": 28})
    assert not other.index_reused and other.rows == 30


def test_another_checkpoint_builds_its_own_index_and_the_old_ones_go(run_dir):
    last = find_neighbors(str(run_dir), ["0"], k=3, index="faiss", device="cpu")
    previous = run_dir / "checkpoints" / "previous.pt"
    earlier = find_neighbors(str(run_dir), ["0"], k=3, index="faiss", device="cpu", checkpoint=str(previous))
    assert not earlier.index_reused and earlier.index_file != last.index_file
    # The index of the other weights can never be reused: removed, and dropped from the manifest.
    assert not os.path.exists(last.index_file)
    assert _indexes(run_dir) == sorted(os.path.basename(earlier.index_file[:-len(".faiss")]) + suffix
                                       for suffix in (".faiss", ".json"))
    assert not any(last.index_file.endswith(name) for name in Manifest(run_dir).files)
    back = find_neighbors(str(run_dir), ["0"], k=3, index="faiss", device="cpu")
    assert not back.index_reused and back.index_file == last.index_file and _rows(back) == _rows(last)


def test_a_changed_index_file_is_neither_reused_nor_replaced(run_dir):
    first = find_neighbors(str(run_dir), ["test:2"], k=4, index="faiss", device="cpu")
    with open(first.index_file, "r+b") as handle:  # damage the vectors, keep the size
        handle.seek(-8, os.SEEK_END)
        handle.write(b"\x00" * 8)
    damaged = open(first.index_file, "rb").read()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = find_neighbors(str(run_dir), ["test:2"], k=4, index="faiss", device="cpu")
    messages = " ".join(str(w.message) for w in caught)
    assert "not listed unchanged" in messages and "not saved" in messages
    assert not again.index_reused and again.index_file is None and _rows(again) == _rows(first)
    assert open(first.index_file, "rb").read() == damaged  # not contrastkit's any more: left alone


def test_a_damaged_checkpoint_is_refused_and_nothing_is_written(run_dir, capsys):
    last = run_dir / "checkpoints" / "last.pt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0xFF
    last.write_bytes(bytes(data))
    before = sorted(p.name for p in run_dir.iterdir())
    manifest = (run_dir / "contrastkit-manifest.json").read_bytes()
    for index in ("exact", "faiss"):
        assert main(["neighbors", str(run_dir), "0", "--index", index]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and str(last) in error
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no picture, no index folder
    assert (run_dir / "contrastkit-manifest.json").read_bytes() == manifest


def test_pretrain_force_removes_the_picture_and_the_indexes(run_dir, capsys):
    assert main(["neighbors", str(run_dir), "0", "--index", "faiss", "--k", "2"]) == 0
    capsys.readouterr()
    assert (run_dir / "neighbors.png").is_file() and len(_indexes(run_dir)) == 2
    user_file = run_dir / "notes.txt"
    user_file.write_text("mine")
    pretrain(tiny_config(run_dir), force=True, progress=False, baselines=False)
    assert not (run_dir / "neighbors.png").exists() and not (run_dir / "neighbors").exists()
    assert user_file.read_text() == "mine"


# ------------------------------------------------------------------------------ a streamed image folder

@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory, one_torch_thread):
    """A run on a class-folder tree of PNG files, streamed: its rows are named by their files."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (folder / name).mkdir()
        for i in range(12):
            pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels, mode="RGB").save(folder / name / f"img_{i:03d}.png")
    out = tmp_path_factory.mktemp("streamed") / "run"
    pretrain(tiny_config(out, data=str(folder), data_options={"stream": True}), progress=False, baselines=False)
    return out, folder


def test_a_file_finds_its_copy_in_a_streamed_collection(streamed_run, tmp_path):
    run_dir, folder = streamed_run
    original = folder / "dog" / "img_004.png"
    copy = tmp_path / "query.png"
    shutil.copyfile(original, copy)
    search = find_neighbors(str(run_dir), [str(copy), str(original)], k=3, device="cpu",
                            picture=str(tmp_path / "p.png"))
    for query in search.queries:
        assert query.row is None and query.image.split is None  # a file: compared with every image
        best = query.neighbors[0]
        assert best.image.name == str(original) and best.image.class_name == "dog"
        assert best.similarity == pytest.approx(1.0, abs=1e-5)
    names = [n.image.name for q in search.queries for n in q.neighbors]
    assert all(os.path.isfile(name) and name.startswith(str(folder)) for name in names)
    assert json.loads(json.dumps(search.to_dict()))["queries"][0]["query"] == str(copy)
    # Its row by SPLIT:INDEX leaves it out.
    first = search.queries[0].neighbors[0].image
    by_index = find_neighbors(str(run_dir), [first.id], k=3, device="cpu")
    assert by_index.queries[0].row == search.queries[0].neighbors[0].row
    assert first.id not in [n.image.id for n in by_index.queries[0].neighbors]


def test_faiss_over_a_streamed_collection_with_workers(streamed_run):
    run_dir, _ = streamed_run
    exact = find_neighbors(str(run_dir), ["test:0", "val:1"], k=4, device="cpu", workers=2, batch_size=5)
    built = find_neighbors(str(run_dir), ["test:0", "val:1"], k=4, device="cpu", index="faiss", workers=2)
    reused = find_neighbors(str(run_dir), ["test:0", "val:1"], k=4, device="cpu", index="faiss")
    assert not built.index_reused and reused.index_reused and _rows(reused) == _rows(built)
    np.testing.assert_allclose([[n.similarity for n in q.neighbors] for q in exact.queries],
                               [[n.similarity for n in q.neighbors] for q in built.queries], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------ the picture

def test_the_picture_shows_at_most_its_rows_and_says_so():
    from PIL import Image

    grey, rgb = torch.rand(1, 8, 8), torch.rand(3, 8, 8)
    rows = [(Thumbnail(grey, "query", 0), [Thumbnail(rgb, "1. 0.9", 0), Thumbnail(grey, "2. 0.8", 1)])] * 40
    png = neighbor_picture_png(rows, "forty queries", metadata={"Source": "test"})
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG" and image.text["Source"] == "test"
        width, height = image.size
    few = neighbor_picture_png(rows[:2], "two queries")
    with Image.open(io.BytesIO(few)) as image:
        assert image.size[0] == width and image.size[1] < height / 10
    assert height > MAX_QUERIES_SHOWN * 150 and height < 41 * 180 + 100
    with pytest.raises(ValueError, match="at least one query"):
        neighbor_picture_png([], "none")


@pytest.mark.parametrize("neighbors", [1, 4])
def test_a_long_caption_is_shortened_from_the_left_inside_its_own_cell(neighbors):
    """A file query's caption (its name) was centred under the first thumbnail and cut off by
    the picture's left edge; a long neighbor name ran into the next caption."""
    from contrastkit.train.neighbor_picture import _neighbor_figure

    long_name = "holiday-2024-summer-camera-roll-export-" * 3 + "IMG_0042.jpg"
    rows = [(Thumbnail(torch.rand(3, 8, 8), f"query\n{long_name}"),
             [Thumbnail(torch.rand(3, 8, 8), f"{rank + 1}. 0.9\n{long_name}\nclass 3") for rank in range(neighbors)])]
    figure = _neighbor_figure(rows, "long names")
    renderer = figure.canvas.get_renderer()
    row = figure.axes  # one query: one row of axes
    extents = [ax.xaxis.label.get_window_extent(renderer) for ax in row if ax.xaxis.label.get_text()]
    assert len(extents) == 1 + neighbors
    assert all(0 <= box.x0 and box.x1 <= figure.bbox.width for box in extents)  # inside the picture
    assert all(left.x1 <= right.x0 for left, right in zip(extents, extents[1:]))  # no caption runs into the next
    for ax in row:
        text = ax.xaxis.label.get_text()
        if text:
            name = text.splitlines()[1]
            assert name.startswith("…") and name.endswith("IMG_0042.jpg"), name  # the name's end is kept
    short = _neighbor_figure([(Thumbnail(torch.rand(3, 8, 8), "query\na.png"), [Thumbnail(torch.rand(3, 8, 8), "1. 0.9")])],
                             "short names")
    assert short.axes[0].xaxis.label.get_text() == "query\na.png"  # what fits is left whole


# ------------------------------------------------------------------------------ CIFAR-10 (when present)



@pytest.mark.skipif(not CIFAR_TARBALL, reason="the CIFAR-10 JPEG tarball (shared/data/cifar10-jpeg.tar.gz next to "
                                              "the checkout, or $CONTRASTKIT_CIFAR10_TARBALL) is not present")
def test_cifar10_jpegs_a_copy_finds_its_original_exact_and_faiss(tmp_path, one_torch_thread, capsys):
    data = cifar_subset(tmp_path / "cifar", per_class=12)
    run_dir = tmp_path / "run"
    pretrain(tiny_config(run_dir, data=str(data), data_options={"stream": True}, batch_size=16),
             progress=False, baselines=False)
    original = sorted((data / "ship").iterdir())[3]
    copy = tmp_path / "query.jpg"
    shutil.copyfile(original, copy)
    for index in ("exact", "faiss"):
        assert main(["neighbors", str(run_dir), str(copy), "test:5", "--k", "5", "--index", index, "--json",
                     "--out", str(tmp_path / f"{index}.png")]) == 0
        found = json.loads(capsys.readouterr().out)
        best = found["queries"][0]["neighbors"][0]
        assert best["image"]["name"] == str(original) and best["image"]["class_name"] == "ship"
        assert best["similarity"] == pytest.approx(1.0, abs=1e-5)
        assert found["rows"] == 120 and (tmp_path / f"{index}.png").is_file()
