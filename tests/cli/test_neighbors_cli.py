"""contrastkit neighbors end to end on a tiny run: the neighbors are those of a brute force over
the run's h (as contrastkit embed writes it), printed, as JSON and drawn; bad input is one line,
exit status 2, naming what is wrong."""

import json
import os
import struct

import numpy as np
import pytest

from _tiny_run import TINY_GLYPHLAB, tiny_config
from contrastkit.cli import main
from contrastkit.manifest import Manifest, file_sha256
from contrastkit.train import pretrain
from contrastkit.train.embed import export_embeddings

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


def test_neighbors_are_those_of_a_brute_force_over_the_runs_h(run_dir, embedded, tmp_path, capsys):
    h, labels, splits = embedded
    picture = tmp_path / "pic.png"
    found = _search(capsys, run_dir, "test:3", "5", "val:0", "--k", "6", "--out", picture)
    assert found["rows"] == ROWS and found["splits"] == ["train", "val", "test"] and found["k"] == 6
    assert found["index"] == "exact" and found["similarity"] == "cosine of h" and found["data"] == "glyphlab"
    for query, row in zip(found["queries"], (START["test"] + 3, 5, START["val"])):
        assert query["row"] == row  # an image of the collection: left out of its own neighbors
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
    assert width > 6 * 100 and height > 3 * 150  # 3 rows of a query and 6 neighbors
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


def test_a_picture_on_a_read_only_file_system_is_refused_before_the_search(run_dir, tmp_path, monkeypatch, capsys):
    import contrastkit.train.neighbors as neighbors_module

    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, result):
            self.f_flag = result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(neighbors_module.os, "statvfs", lambda folder: ReadOnly(real_statvfs(folder)))
    monkeypatch.setattr(neighbors_module, "_write_picture", lambda *args: pytest.fail("searched and drew first"))
    searched = []
    real_load = neighbors_module.load_run
    monkeypatch.setattr(neighbors_module, "load_run", lambda *a, **k: searched.append(1) or real_load(*a, **k))
    picture = tmp_path / "pic.png"
    assert main(["neighbors", str(run_dir), "0", "--out", str(picture)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"Read-only file system: the picture cannot be written (--out {picture})" in error
    assert searched == [] and not picture.exists()


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


# ------------------------------------------------------------------------------ a collection with damaged files

DAMAGED = ("zero.jpg", "notimage.png")  # both land in train (by the hash of their names)


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory, one_torch_thread):
    """A run on a folder of 12 tiny images and two damaged files, which the run skipped; the
    ``(split, index)`` of each file of the collection."""
    from _data_fixtures import write_collection
    from contrastkit.data import open_collection

    folder = write_collection(tmp_path_factory.mktemp("photos") / "photos", 12, DAMAGED)
    out = tmp_path_factory.mktemp("damaged") / "run"
    pretrain(tiny_config(out, data=str(folder), data_options={"size": 16}, batch_size=4), progress=False,
             baselines=False)
    assert sorted(line.split("\t")[0] for line in (out / "skipped.txt").read_text().splitlines()) == \
        sorted(str(folder / name) for name in DAMAGED)
    where = {split.relative_path(i): (name, i) for name, split in open_collection(folder, size=16).splits()
             for i in range(len(split))}
    return out, folder, where


def _embedded_rows(run_dir, tmp_path):
    """h and ``split:index`` of each row of contrastkit embed's output of the run."""
    import csv

    assert main(["embed", str(run_dir), "--out", str(tmp_path / "h.npy"), "--quiet"]) == 0
    with open(tmp_path / "h.csv", newline="") as handle:
        ids = [f"{row['split']}:{row['index']}" for row in csv.DictReader(handle)]
    return np.load(tmp_path / "h.npy").astype(np.float64), ids


def test_skipped_files_are_named_never_neighbors_and_rows_are_embeds(damaged_run, tmp_path, capsys):
    run_dir, folder, where = damaged_run
    h, ids = _embedded_rows(run_dir, tmp_path)
    capsys.readouterr()
    listed, embedded = len(where), len(where) - len(DAMAGED)
    assert h.shape[0] == embedded == 12
    skipped_ids = sorted(f"{where[name][0]}:{where[name][1]}" for name in DAMAGED)
    last = max(where.values(), key=lambda item: (("train", "val", "test").index(item[0]), item[1]))
    query_file = tmp_path / "query.jpg"
    query_file.write_bytes((folder / "p001.jpg").read_bytes())
    readable_train = next(f"train:{i}" for name, (split, i) in sorted(where.items())
                          if split == "train" and name not in DAMAGED)
    last_id = f"{last[0]}:{last[1]}"  # the last row of the listing: past the embedded rows' count
    found = _search(capsys, run_dir, query_file, readable_train, last_id, "--k", "4", "--no-picture")
    assert found["rows"] == embedded
    assert sorted(f"{s['split']}:{s['index']}" for s in found["skipped"]) == skipped_ids
    assert sorted(s["name"] for s in found["skipped"]) == sorted(DAMAGED)
    assert all("cannot read image" in s["reason"] for s in found["skipped"])
    for query in found["queries"]:
        assert not {n["image"]["id"] for n in query["neighbors"]} & set(skipped_ids)
        assert all(ids[n["row"]] == n["image"]["id"] for n in query["neighbors"])  # the rows of embed
    file_query, train_query, last_query = found["queries"]
    assert file_query["row"] is None and file_query["neighbors"][0]["image"]["name"] == "p001.jpg"
    assert file_query["neighbors"][0]["similarity"] == pytest.approx(1.0, abs=1e-5)
    for query, query_id in ((train_query, readable_train), (last_query, last_id)):
        assert ids[query["row"]] == query_id
        expected_rows, expected_similarities = _brute_force(h, query["row"], 4)
        assert [n["row"] for n in query["neighbors"]] == expected_rows
        np.testing.assert_allclose([n["similarity"] for n in query["neighbors"]], expected_similarities,
                                   rtol=0, atol=1e-6)
    # The printed header counts the images embedded and names the skipped ones.
    assert main(["neighbors", str(run_dir), "test:0", "--k", "2", "--no-picture"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"the 2 nearest of {embedded} images (train+val+test of {folder}; {listed - embedded} damaged "
                      "files skipped, not embedded) by cosine similarity of h, exact search")
    assert sorted(line.split()[1] for line in out[1:3]) == skipped_ids and out[1].startswith("skipped ")
    assert sorted(line.split()[2] for line in out[1:3]) == sorted(DAMAGED)


def test_a_file_query_reads_only_the_query_file(damaged_run, tmp_path, capsys):
    run_dir, folder, _ = damaged_run
    query_file = tmp_path / "query.png"
    query_file.write_bytes((folder / "p004.png").read_bytes())
    picture = tmp_path / "pic.png"
    # Every embedded image is a neighbor: the picture reads each of them, never a damaged file.
    found = _search(capsys, run_dir, query_file, "--k", "12", "--out", picture)
    assert found["picture"] == str(picture) and picture.is_file()
    names = [n["image"]["name"] for n in found["queries"][0]["neighbors"]]
    assert len(set(names)) == 12 and not set(names) & set(DAMAGED) and names[0] == "p004.png"
    assert main(["neighbors", str(run_dir), str(query_file), "--k", "13", "--no-picture"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "k=13 is more than the 12 images of the collection" in error
    assert "2 damaged files skipped" in error


def test_a_query_naming_a_skipped_file_is_refused_in_one_line(damaged_run, capsys):
    run_dir, folder, where = damaged_run
    for name in DAMAGED:
        split, index = where[name]
        for extra in ((), ("--split", "val")):  # in the collection, or not
            assert main(["neighbors", str(run_dir), "test:0", f"{split}:{index}", *extra, "--k", "1",
                         "--no-picture"]) == 2
            error = capsys.readouterr().err.strip()
            assert error.count("\n") == 0 and error.startswith("contrastkit neighbors: error: ")
            assert f"query '{split}:{index}': {split}:{index} ({name}) is a damaged file" in error, error
            assert "cannot read image" in error


def test_a_list_whose_first_row_is_not_an_image(damaged_run, tmp_path, capsys):
    run_dir, folder, _ = damaged_run
    (tmp_path / "a_passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    import shutil

    shutil.copytree(folder, tmp_path / "photos")  # beside the list: a_passwd comes first in path order
    images = sorted(p.relative_to(tmp_path) for p in (tmp_path / "photos").rglob("p*") if p.is_file())
    (tmp_path / "list.txt").write_text("\n".join(["a_passwd", *map(str, images)]) + "\n")
    data = ["--data", str(tmp_path / "list.txt"), "--data-option", "size=16"]
    from contrastkit.data import open_collection

    assert open_collection(tmp_path / "list.txt").train.relative_path(0) == "a_passwd"  # train:0, as listed
    found = _search(capsys, run_dir, "0", *data, "--k", "3", "--no-picture")
    assert found["rows"] == len(images)
    assert [(s["split"], s["index"], s["name"]) for s in found["skipped"]] == [("train", 0, "a_passwd")]
    query = found["queries"][0]
    assert query["row"] == 0 and query["image"]["id"] == "train:1"  # row 0: the first image embedded
    assert query["image"]["name"] != "a_passwd"
    assert all(n["image"]["name"] != "a_passwd" for n in query["neighbors"])
    assert main(["neighbors", str(run_dir), "train:0", *data, "--no-picture"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "query 'train:0': train:0 (a_passwd) is a damaged file" in error


def test_faiss_over_a_collection_with_skipped_files(damaged_run, tmp_path, capsys):
    pytest.importorskip("faiss", reason="FAISS is not installed (pip install 'contrastkit[faiss]')")
    run_dir, _, _ = damaged_run
    exact = _search(capsys, run_dir, "test:0", "5", "--k", "5", "--no-picture")
    built = _search(capsys, run_dir, "test:0", "5", "--k", "5", "--no-picture", "--index", "faiss")
    reused = _search(capsys, run_dir, "test:0", "5", "--k", "5", "--no-picture", "--index", "faiss")
    assert not built["index_reused"] and reused["index_reused"]
    for found in (built, reused):
        assert found["rows"] == exact["rows"] == 12 and found["skipped"] == exact["skipped"]
        assert [[n["row"] for n in q["neighbors"]] for q in found["queries"]] == \
            [[n["row"] for n in q["neighbors"]] for q in exact["queries"]]
    key = os.path.basename(built["index_file"])[:-len(".faiss")]
    description = json.loads((run_dir / "neighbors" / f"{key}.json").read_text())
    assert description["rows"] == 12 and description["skipped"] == 2


def test_embed_names_the_skipped_rows_as_neighbors_does(damaged_run, tmp_path, capsys):
    run_dir, _, where = damaged_run
    skipped_ids = sorted(f"{where[name][0]}:{where[name][1]}" for name in DAMAGED)
    assert main(["embed", str(run_dir), "--out", str(tmp_path / "e.npz"), "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == 12
    neighbors = _search(capsys, run_dir, "0", "--k", "1", "--no-picture")
    assert result["skipped"] == neighbors["skipped"]
    assert sorted(f"{s['split']}:{s['index']}" for s in result["skipped"]) == skipped_ids
    sidecar = json.loads((tmp_path / "e.npz.contrastkit.json").read_text())
    assert sidecar["rows"] == 12 and sidecar["skipped"] == result["skipped"]
    with np.load(tmp_path / "e.npz", allow_pickle=False) as archive:
        assert archive["h"].shape[0] == 12 and not set(archive["names"].tolist()) & set(DAMAGED)
    assert main(["embed", str(run_dir), "--out", str(tmp_path / "t.npy"), "--split", "train", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    train_rows = sum(split == "train" for split, _ in where.values()) - len(DAMAGED)
    assert out[0].startswith(f"wrote {train_rows} rows (h ") and out[0].endswith("; 2 damaged files skipped, not embedded")
    assert sorted(line.split()[1] for line in out[1:]) == skipped_ids and len(out) == 3


def test_a_collection_of_damaged_files_only_is_one_line(damaged_run, tmp_path, capsys):
    run_dir, _, _ = damaged_run
    for i in range(6):
        (tmp_path / f"f{i}.png").write_text("text, not pixels")
    (tmp_path / "bad.txt").write_text("\n".join(f"f{i}.png" for i in range(6)) + "\n")
    data = ["--data", str(tmp_path / "bad.txt"), "--data-option", "size=16"]
    for argv in (["neighbors", str(run_dir), "0", "--k", "1", "--no-picture", *data],
                 ["embed", str(run_dir), "--out", str(tmp_path / "e.npz"), "--quiet", *data]):
        assert main(argv) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and "is a damaged file (6 damaged files skipped, not embedded)" in error, error
        assert "cannot read image" in error
    assert not (tmp_path / "e.npz").exists() and not (tmp_path / "e.npz.contrastkit.json").exists()


def test_file_names_with_a_newline_or_a_tab_stay_on_their_line(tmp_path_factory, one_torch_thread, capsys):
    """The text output is one line per image whatever the files are called: a control character in
    a name (a newline, a tab) is written \\xNN, as in skipped.txt; --json keeps the names as they are."""
    from _data_fixtures import write_collection

    folder = write_collection(tmp_path_factory.mktemp("named") / "photos", 10, damaged=("zero\nlines.jpg",))
    (folder / "p001.jpg").rename(folder / "two\nlines.jpg")
    (folder / "p002.png").rename(folder / "a\ttab.png")
    out = tmp_path_factory.mktemp("named-run") / "run"
    pretrain(tiny_config(out, data=str(folder), data_options={"size": 16}, batch_size=4), progress=False,
             baselines=False)
    capsys.readouterr()
    found = _search(capsys, out, folder / "two\nlines.jpg", "--k", "10", "--no-picture")
    names = {n["image"]["name"] for n in found["queries"][0]["neighbors"]}
    assert {"two\nlines.jpg", "a\ttab.png"} <= names and [s["name"] for s in found["skipped"]] == ["zero\nlines.jpg"]
    assert main(["neighbors", str(out), str(folder / "two\nlines.jpg"), "--k", "10", "--no-picture"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The header, one skipped line, a blank line, the query's line and its 10 neighbors: 14 lines.
    assert len(lines) == 14, lines
    assert lines[1].startswith("skipped ") and "zero\\x0alines.jpg" in lines[1]
    assert lines[3].startswith(str(folder / "two\\x0alines.jpg"))
    assert sum("two\\x0alines.jpg" in line for line in lines[4:]) == 1
    assert sum("a\\x09tab.png" in line for line in lines[4:]) == 1
