"""contrastkit neighbors end to end on a tiny run: the neighbours are those of a brute force over
the run's h (as contrastkit embed writes it), printed, as JSON and drawn; bad input is one line,
exit status 2, naming what is wrong."""

import json
import struct

import numpy as np
import pytest

from _tiny_run import TINY_GLYPHLAB, tiny_config
from contrastkit.cli import main
from contrastkit.manifest import Manifest, file_sha256
from contrastkit.train import pretrain
from contrastkit.train.export import export_embeddings

SIZES = {split: TINY_GLYPHLAB[f"{split}_scenes"] for split in ("train", "val", "test")}  # 16, 9, 12
ROWS = sum(SIZES.values())
START = {"train": 0, "val": SIZES["train"], "test": SIZES["train"] + SIZES["val"]}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("run")
    pretrain(tiny_config(out), progress=False, baselines=False)
    return out


@pytest.fixture(scope="module")
def embedded(run_dir, tmp_path_factory):
    """h of every row (train, val, test), labels and splits, as contrastkit embed writes them."""
    path = tmp_path_factory.mktemp("embed") / "all.npz"
    export_embeddings(str(run_dir), str(path), progress=False)
    with np.load(path, allow_pickle=False) as archive:
        return archive["h"].astype(np.float64), archive["labels"], archive["splits"].tolist()


def _brute_force(h, query_row, k, rows=None):
    """The k rows nearest to ``query_row`` by cosine in float64 (itself left out), ties by row."""
    rows = list(range(h.shape[0])) if rows is None else rows
    unit = h / np.linalg.norm(h, axis=1, keepdims=True)
    similarities = {row: float(unit[query_row] @ unit[row]) for row in rows if row != query_row}
    order = sorted(similarities, key=lambda row: (-similarities[row], row))[:k]
    return order, [similarities[row] for row in order]


def _search(capsys, *argv):
    assert main(["neighbors", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_neighbours_are_those_of_a_brute_force_over_the_runs_h(run_dir, embedded, tmp_path, capsys):
    h, labels, splits = embedded
    picture = tmp_path / "pic.png"
    found = _search(capsys, run_dir, "test:3", "5", "val:0", "--k", "6", "--out", picture)
    assert found["rows"] == ROWS and found["splits"] == ["train", "val", "test"] and found["k"] == 6
    assert found["index"] == "exact" and found["similarity"] == "cosine of h" and found["data"] == "glyphlab"
    for query, row in zip(found["queries"], (START["test"] + 3, 5, START["val"])):
        assert query["row"] == row  # an image of the collection: left out of its own neighbours
        expected_rows, expected_similarities = _brute_force(h, row, 6)
        assert [n["row"] for n in query["neighbors"]] == expected_rows
        np.testing.assert_allclose([n["similarity"] for n in query["neighbors"]], expected_similarities,
                                   rtol=0, atol=1e-6)
        assert [n["rank"] for n in query["neighbors"]] == [1, 2, 3, 4, 5, 6]
        for neighbor in query["neighbors"]:
            image = neighbor["image"]
            assert image["split"] == splits[neighbor["row"]] and image["label"] == labels[neighbor["row"]]
            assert image["id"] == f"{image['split']}:{image['index']}"
            assert neighbor["row"] == START[image["split"]] + image["index"]
            assert image["class_name"] in ("vertical", "horizontal", "diagonal")
    assert found["queries"][1]["image"]["id"] == "train:5"  # row 5 of the collection
    # The picture: a PNG, listed in its folder's manifest with its size and hash.
    assert found["picture"] == str(picture)
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 6 * 100 and height > 3 * 150  # 3 rows of a query and 6 neighbours
    assert Manifest(tmp_path).files["pic.png"] == {"size": len(data), "sha256": file_sha256(picture)}


def test_the_printed_table(run_dir, capsys):
    assert main(["neighbors", str(run_dir), "test:3", "--k", "2", "--no-picture"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"the 2 nearest of {ROWS} images (train+val+test of glyphlab) by cosine similarity of h, "
                      "exact search")
    assert out[2].startswith("test:3  ") and out[2].split()[-1] in ("vertical", "horizontal", "diagonal")
    ranks = [line.split() for line in out[3:5]]
    assert [r[0] for r in ranks] == ["1", "2"] and all(":" in r[2] for r in ranks)
    assert float(ranks[0][1]) >= float(ranks[1][1])
    assert not any(line.startswith("wrote") for line in out)


def test_a_split_collection_and_queries_from_outside_it(run_dir, embedded, capsys):
    h, _, _ = embedded
    train_rows = list(range(SIZES["train"]))
    found = _search(capsys, run_dir, "test:0", "test:11", "--split", "train", "--k", str(SIZES["train"]),
                    "--no-picture")
    assert found["rows"] == SIZES["train"] and found["splits"] == ["train"]
    for query, test_index in zip(found["queries"], (0, 11)):
        assert query["row"] is None  # not in the collection: nothing left out, k may be all 16
        expected, similarities = _brute_force(h, START["test"] + test_index, SIZES["train"], rows=train_rows)
        assert [n["row"] for n in query["neighbors"]] == expected
        np.testing.assert_allclose([n["similarity"] for n in query["neighbors"]], similarities, rtol=0, atol=1e-5)


def test_the_default_picture_is_the_run_folders_and_is_replaced_by_the_next(run_dir, capsys):
    picture = run_dir / "neighbors.png"
    assert main(["neighbors", str(run_dir), "0", "--k", "3"]) == 0
    assert f"wrote {picture}" in capsys.readouterr().out
    first = picture.read_bytes()
    assert Manifest(run_dir).files["neighbors.png"]["sha256"] == file_sha256(picture)
    assert main(["neighbors", str(run_dir), "1", "2", "--k", "3"]) == 0  # its own earlier picture: replaced
    capsys.readouterr()
    assert picture.read_bytes() != first
    assert Manifest(run_dir).files["neighbors.png"]["sha256"] == file_sha256(picture)


def test_a_file_that_is_not_its_picture_is_never_overwritten(run_dir, tmp_path, capsys):
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"a user's picture")
    assert main(["neighbors", str(run_dir), "0", "--out", str(mine)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and str(mine) in error and "not replacing it" in error
    assert mine.read_bytes() == b"a user's picture"
    # contrastkit's picture, changed since: not replaced either.
    ours = tmp_path / "ours.png"
    assert main(["neighbors", str(run_dir), "0", "--out", str(ours)]) == 0
    with open(ours, "ab") as handle:
        handle.write(b"edited")
    assert main(["neighbors", str(run_dir), "0", "--out", str(ours)]) == 2
    assert "not replacing it" in capsys.readouterr().err
    # Another contrastkit PNG (listed unchanged in the manifest, e.g. a sweep's plot) is not its picture either.
    from PIL import Image

    plot = tmp_path / "plot.png"
    Image.new("RGB", (4, 4)).save(plot)
    Manifest(tmp_path).record("plot.png")
    assert main(["neighbors", str(run_dir), "0", "--out", str(plot)]) == 2
    assert "not replacing it" in capsys.readouterr().err
    assert Manifest(tmp_path).files["plot.png"]["sha256"] == file_sha256(plot)


def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("not an image\n")
    run = str(run_dir)
    cases = [
        ([str(tmp_path / "nothing"), "0"], "run folder"),
        ([str(tmp_path / "folder"), "0"], "config.json is missing"),
        ([run, str(tmp_path / "missing.png")], "missing.png' is no image file, nor SPLIT:INDEX"),
        ([run, str(tmp_path / "notes.txt")], "notes.txt': "),
        ([run, "test:12"], "query 'test:12': the test split of glyphlab has 12 images (indices 0 to 11)"),
        ([run, str(ROWS)], f"query '{ROWS}': the collection (train+val+test of glyphlab) has {ROWS} images"),
        ([run, "-1"], "'-1' is no image file"),
        ([run, "0", "--k", "0"], "--k must be at least 1, got 0"),
        ([run, "0", "--k", str(ROWS)], f"k={ROWS} is more than the {ROWS - 1} images of the collection"),
        ([run, "test:0", "--split", "val", "--k", "10"], "k=10 is more than the 9 images of the collection (val of"),
        ([run, "0", "--chunk", "0"], "--chunk must be at least 1"),
        ([run, "0", "--out", str(tmp_path / "pic.jpg")], "must be a .png file"),
        ([run, "0", "--out", str(tmp_path / "no" / "pic.png")], "output folder"),
        ([run, "0", "--data-option", "size=28"], "--data-option applies to --data"),
        ([run, "0", "--no-picture", "--out", str(tmp_path / "p.png")], "--no-picture"),
        ([run, "0", "--data", str(tmp_path / "missing.npz")], "missing.npz"),
        ([run, "0", "--workers", "-1"], "workers must be"),
    ]
    for argv, message in cases:
        assert main(["neighbors", *argv]) == 2, argv
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and message in error, (argv, error)
        assert error.startswith("contrastkit neighbors: error: ")
    assert not (tmp_path / "pic.png").exists() and not (tmp_path / "no").exists()


def test_faiss_missing_is_one_line_naming_the_extra(run_dir, monkeypatch, capsys):
    import builtins
    import sys

    real_import = builtins.__import__

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("No module named 'faiss'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "faiss", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_faiss)
    assert main(["neighbors", str(run_dir), "0", "--index", "faiss", "--no-picture"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "pip install 'contrastkit[faiss]'" in error
    assert not (run_dir / "neighbors").exists()


def test_help_lists_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "neighbors" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["neighbors", "--help"])
    text = capsys.readouterr().out
    assert "SPLIT:INDEX" in text and "--index {exact,faiss}" in text
