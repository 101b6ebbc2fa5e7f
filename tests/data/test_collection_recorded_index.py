"""A collection's listing recorded once and read back (contrastkit.data.collection_index):
read from the record while the collection is unchanged (no listing: counted), a change seen
from the folders' times or the list's digest and confirmed by listing again, and the three
ways on from a change (stop naming it, reindex, keep the recorded files still there)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from PIL import Image

from contrastkit.data import CollectionChangedError, collection, open_collection, open_data
from contrastkit.data.collection_index import RecordedIndex


def _image(path, shade=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 7, 3), shade, dtype=np.uint8)).save(path)


def _tree(root, count=20):
    for i in range(count):
        _image(root / ("sub" if i % 3 else "") / f"img{i:02d}.png", 10 * i)
    return root


def _settle(root, ago=60):
    """Put every folder's time ``ago`` seconds back: a collection left alone since it was written
    (a folder modified within RACY_SECONDS of its listing is listed again to be sure)."""
    past = time.time() - ago
    for folder, _, _ in os.walk(root):
        os.utime(folder, (past, past))


@pytest.fixture
def listings(monkeypatch):
    """How many times a folder is walked and a list file read (the listing itself)."""
    counts = {"walk": 0, "list": 0}
    walk, read_list = collection._walk, collection._read_list

    def counted_walk(*args, **kwargs):
        counts["walk"] += 1
        return walk(*args, **kwargs)

    def counted_list(*args, **kwargs):
        counts["list"] += 1
        return read_list(*args, **kwargs)

    monkeypatch.setattr(collection, "_walk", counted_walk)
    monkeypatch.setattr(collection, "_read_list", counted_list)
    return counts


def _files(dataset):
    return {name: [split.path(i) for i in range(len(split))] for name, split in dataset.splits()}


def _recorded(source, index, **options):
    dataset = open_collection(source, index=index, **options)
    dataset.index.write(index)
    return dataset


def test_an_unchanged_folder_is_read_from_its_record_without_listing_it(tmp_path, listings):
    root = _tree(tmp_path / "photos")
    os.symlink("photos/sub", tmp_path / "photos" / "linked")  # a folder reached through a link, and a link to nothing
    os.symlink("nowhere.png", tmp_path / "photos" / "gone.png")
    _settle(root)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    assert first.index_state == "listed" and listings["walk"] == 1
    again = open_collection(root, index=index)
    assert listings["walk"] == 1 and again.index_state == "recorded" and again.index_note is None
    assert _files(again) == _files(first) and again.left_out == first.left_out and again.left_out
    assert again.image_shape == first.image_shape
    assert again.train.skipped == first.train.skipped  # the left-out files are named with the skipped ones
    assert again.train[0][0].shape == first.train[0][0].shape
    # Through the data source (--data) as well, and from another current folder.
    os.chdir(tmp_path / "photos")
    moved = open_data(".", unlabeled=True, index=str(index))
    assert moved.index_state == "recorded" and listings["walk"] == 1
    assert sorted(moved.train.path(i) for i in range(len(moved.train))) == \
        sorted(os.path.relpath(path, root) for path in _files(first)["train"])
    assert moved.train.relative_path(0) == first.train.relative_path(0)


def test_a_folder_modified_just_before_its_listing_is_listed_again_and_found_unchanged(tmp_path, listings):
    root = _tree(tmp_path / "photos")  # (its folders' times: now, within RACY_SECONDS of the listing)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    again = open_collection(root, index=index)
    assert listings["walk"] == 2 and again.index_state == "verified" and _files(again) == _files(first)


@pytest.mark.parametrize("change", ["added", "removed", "folder removed", "hidden file added"])
def test_a_change_is_seen_from_the_folders_times_and_confirmed_by_the_files(tmp_path, listings, change):
    root = _tree(tmp_path / "photos")
    _settle(root)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    if change == "added":
        _image(root / "sub" / "new.png")
    elif change == "removed":
        os.remove(root / "sub" / "img01.png")
    elif change == "folder removed":
        for name in os.listdir(root / "sub"):
            os.remove(root / "sub" / name)
        os.rmdir(root / "sub")
    else:
        _image(root / ".thumbnail.png")  # not part of the collection: its folder's time moved, its files did not
    if change == "hidden file added":
        again = open_collection(root, index=index)
        assert again.index_state == "verified" and _files(again) == _files(first) and listings["walk"] == 2
        return
    with pytest.raises(CollectionChangedError) as raised:
        open_collection(root, index=index)
    message = str(raised.value)
    assert "\n" not in message and str(root) in message and str(index) in message
    assert "--collection-changed reindex" in message and "--collection-changed keep" in message
    if change == "added":
        assert "1 image file added (e.g. " in message and "new.png" in message and "gone" not in message
    else:
        gone = 1 if change == "removed" else sum(1 for i in range(20) if i % 3)  # (the files of sub/)
        assert f"{gone:,} gone (e.g. " in message and "added" not in message


def test_reindex_lists_the_changed_folder_again_and_each_file_keeps_its_split(tmp_path):
    root = _tree(tmp_path / "photos")
    _settle(root)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    os.remove(root / "sub" / "img01.png")
    _image(root / "sub" / "new.png")
    again = open_collection(root, index=index, collection_changed="reindex")
    assert again.index_state == "reindexed"
    assert again.index_note == (f"{root} changed since it was indexed (1 image file added, 1 gone): listed again, "
                                "20 files")
    before = {path: name for name, paths in _files(first).items() for path in paths}
    after = {path: name for name, paths in _files(again).items() for path in paths}
    assert set(after) == set(before) - {str(root / "sub" / "img01.png")} | {str(root / "sub" / "new.png")}
    assert all(after[path] == before[path] for path in after if path in before)


def test_keep_reads_the_recorded_files_still_there_and_names_those_gone(tmp_path, listings):
    root = _tree(tmp_path / "photos")
    _settle(root)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    gone = root / "sub" / "img01.png"
    os.remove(gone)
    _image(root / "sub" / "new.png")
    _settle(root, 30)  # (changed a while ago)
    kept = open_collection(root, index=index, collection_changed="keep")
    assert kept.index_state == "kept" and "reading the 19 recorded files still there, not those added" in kept.index_note
    expected = {name: [path for path in paths if path != str(gone)] for name, paths in _files(first).items()}
    assert _files(kept) == expected
    assert "gone since the collection was indexed" in kept.left_out[str(gone)]
    assert str(gone) in kept.train.skipped  # named in the run's skipped.txt
    # Recorded with the folders' times as they are now: the next reader finds it as kept, without listing.
    kept.index.write(index)
    walks = listings["walk"]
    later = open_collection(root, index=index)
    assert later.index_state == "recorded" and listings["walk"] == walks and _files(later) == expected


def test_an_unchanged_list_is_read_from_its_record_and_a_changed_one_is_compared(tmp_path, listings):
    root = _tree(tmp_path / "photos")
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"photos/{path.relative_to(root)}\n" for path in sorted(root.rglob("*.png"))))
    index = tmp_path / "index.npz"
    first = _recorded(listing, index)
    assert listings["list"] == 1
    listing.write_text(listing.read_text())  # saved again, the same lines: its digest, not its time, decides
    again = open_collection(listing, index=index)
    assert again.index_state == "recorded" and listings["list"] == 1 and _files(again) == _files(first)
    listing.write_text("# my photos\n" + listing.read_text())  # another text, the same files
    assert open_collection(listing, index=index).index_state == "verified" and listings["list"] == 2
    listing.write_text(listing.read_text().replace("photos/img00.png\n", ""))
    with pytest.raises(CollectionChangedError, match=r"1 gone \(e\.g\. .*img00\.png\)"):
        open_collection(listing, index=index)


def test_a_record_of_another_collection_or_other_options_or_a_damaged_one_is_not_used(tmp_path, listings):
    root = _tree(tmp_path / "photos")
    other = _tree(tmp_path / "other", 5)
    _settle(root)
    index = tmp_path / "index.npz"
    first = _recorded(root, index)
    assert open_collection(other, index=index).index_state == "listed"
    assert open_collection(other, index=index).index_note is None  # (another collection's record: nothing to say)
    assert open_collection(root, index=index, val_fraction=0.3).index_state == "listed"
    assert open_collection(root, index=index, bad_files="fail").index_state == "listed"
    for damage in (b"", b"PK\x03\x04 not an archive", index.read_bytes()[: len(index.read_bytes()) // 2]):
        index.write_bytes(damage)
        damaged = open_collection(root, index=index)
        assert damaged.index_state == "listed" and _files(damaged) == _files(first)
        assert damaged.index_note.startswith(f"{index} cannot be read") and "\n" not in damaged.index_note
    assert RecordedIndex.read(tmp_path / "missing.npz") is None


def test_collection_changed_is_one_of_its_three_values(tmp_path):
    root = _tree(tmp_path / "photos")
    with pytest.raises(ValueError, match="collection_changed must be one of stop, reindex, keep, got 'ask'"):
        open_collection(root, collection_changed="ask")


def test_a_recorded_flat_folder_is_not_looked_at_again_to_tell_its_format(tmp_path, monkeypatch, listings):
    root = tmp_path / "photos"
    for i in range(8):
        _image(root / f"img{i}.png", 20 * i)
    _settle(root)
    index = tmp_path / "index.npz"
    first = open_data(str(root), index=str(index))
    assert first.index_state == "listed"  # (no record yet: its format decided by a look at its entries)
    first.index.write(index)
    from contrastkit.data import files

    def no_look(path):
        raise AssertionError(f"{path}'s format looked at again (every entry of a flat folder read)")

    monkeypatch.setattr(files, "detect_format", no_look)
    again = open_data(str(root), index=str(index))
    assert again.index_state == "recorded" and _files(again) == _files(first) and listings["walk"] == 1


def test_a_folder_put_back_with_its_former_modification_time_is_still_a_change(tmp_path, listings):
    import shutil

    root = _tree(tmp_path / "photos")
    _settle(root)
    index = tmp_path / "index.npz"
    _recorded(root, index)
    before, root_before = os.stat(root / "sub").st_mtime_ns, os.stat(root).st_mtime_ns
    shutil.copytree(root / "sub", tmp_path / "copy")
    os.remove(tmp_path / "copy" / "img01.png")
    shutil.rmtree(root / "sub")
    os.rename(tmp_path / "copy", root / "sub")
    os.utime(root / "sub", ns=(before, before))  # (cp -a, rsync -t: the former time put back)
    os.utime(root, ns=(root_before, root_before))  # every folder's modification time as recorded
    with pytest.raises(CollectionChangedError, match="1 gone"):
        open_collection(root, index=index)
