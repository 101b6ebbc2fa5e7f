"""Unlabeled image collections (contrastkit.data.collection): what is read, how images are
brought to one shape, stable splits, and damaged files skipped by name or stopping the run."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from contrastkit.data import load_dataset, make_loader, open_collection, open_data, skipped_files
from contrastkit.data.collection import SPLITS, hash_fraction, split_by_hash
from contrastkit.data.files import detect_format
from contrastkit.data.streaming import BadItemError


def _image(path, size=(20, 30), color=(200, 30, 30), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.zeros((size[0], size[1], 3), dtype=np.uint8)
    array[:] = color
    Image.fromarray(array).convert(mode).save(path)
    return path


def _tree(root, count=12, suffix=".png"):
    return [_image(root / f"img{i:03d}{suffix}", color=((10 * i) % 256, (5 * i) % 256, (255 - 10 * i) % 256))
            for i in range(count)]


def _all_files(dataset):
    return sorted(split.path(i) for _, split in dataset.splits() for i in range(len(split)))


def test_a_flat_folder_is_an_unlabeled_collection_of_all_its_images(tmp_path):
    files = _tree(tmp_path / "photos", 30)
    assert detect_format(tmp_path / "photos") == "collection"
    data = load_dataset(tmp_path / "photos")
    assert data.num_classes == 0 and data.class_names == [] and data.streamed
    assert _all_files(data) == sorted(str(f) for f in files)
    assert all(split.labels is None for _, split in data.splits())


def test_loose_images_next_to_a_subfolder_are_all_read(tmp_path):
    """3,000 loose images next to one subfolder of 10 were read as a one-class tree; now every
    file counts (scaled down: 30 loose, 10 in a subfolder, 5 in a nested one)."""
    root = tmp_path / "mixed"
    loose = _tree(root, 30)
    nested = _tree(root / "one", 10, ".jpg") + _tree(root / "one" / "deeper", 5)
    data = open_data(root)
    assert len(_all_files(data)) == len(loose) + len(nested) == 45


def test_a_single_subfolder_is_a_collection_and_class_trees_keep_their_meaning(tmp_path):
    _tree(tmp_path / "single" / "cats", 12)
    assert detect_format(tmp_path / "single") == "collection"
    for c in ("a", "b"):
        _tree(tmp_path / "tree" / c, 12)
    assert detect_format(tmp_path / "tree") == "imagefolder"
    assert load_dataset(tmp_path / "tree").num_classes == 2
    forced = open_data(tmp_path / "tree", unlabeled=True)
    assert forced.num_classes == 0 and len(_all_files(forced)) == 24


def test_a_list_file_names_images_relative_to_itself(tmp_path):
    files = _tree(tmp_path / "pics", 15)
    listing = tmp_path / "list.txt"
    listing.write_text("# my images\n" + "\n".join(os.path.relpath(f, tmp_path) for f in files) + "\n\n")
    assert _all_files(open_data(listing)) == sorted(str(f) for f in files)
    table = tmp_path / "list.csv"
    table.write_text("path,note\n" + "\n".join(f"{os.path.relpath(f, tmp_path)},x" for f in files[:12]) + "\n")
    assert len(_all_files(open_data(table))) == 12
    (tmp_path / "bad.txt").write_text("pics/img000.png\npics/missing.png\n")
    with pytest.raises(ValueError, match=r"bad.txt: line 2: no such image file 'pics/missing.png'"):
        open_data(tmp_path / "bad.txt")


def test_the_split_of_a_file_does_not_move_when_files_are_added(tmp_path):
    root = tmp_path / "grow"
    _tree(root, 40)
    before = open_collection(root)
    membership = {split.path(i): name for name, split in before.splits() for i in range(len(split))}
    _tree(root / "more", 60)
    after = open_collection(root)
    again = {split.path(i): name for name, split in after.splits() for i in range(len(split))}
    assert all(again[path] == name for path, name in membership.items())
    assert len(again) == 100 and {name for name in again.values()} == {"train", "val", "test"}


@settings(max_examples=200, deadline=None)
@given(names=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12), min_size=3,
                      max_size=30, unique=True),
       fractions=st.tuples(st.floats(0.01, 0.45), st.floats(0.01, 0.45)), seed=st.randoms())
def test_every_split_of_three_or_more_names_has_one_and_only_lent_names_leave_their_hash_split(names, fractions, seed):
    val_fraction, test_fraction = fractions
    parts = split_by_hash(names, val_fraction, test_fraction)
    by_hash = ["test" if hash_fraction(n) < test_fraction else "val" if hash_fraction(n) < test_fraction + val_fraction
               else "train" for n in names]
    assert set(parts) == set(SPLITS)
    moved = [n for n, got, hashed in zip(names, parts, by_hash) if got != hashed]
    assert len(moved) == len(set(SPLITS) - set(by_hash))  # one lent name per split empty by hash
    shuffled = list(names)
    seed.shuffle(shuffled)  # a function of the names, not of their order
    assert dict(zip(shuffled, split_by_hash(shuffled, val_fraction, test_fraction))) == dict(zip(names, parts))


def test_three_files_of_which_none_falls_in_val_by_hash_fill_every_split(tmp_path):
    # f1.png and sub/f3.png fall in test by hash, f0.png in train: val borrows the test file nearer its range.
    root = tmp_path / "three"
    for name in ("f0.png", "f1.png", "sub/f3.png"):
        _image(root / name)
    data = open_collection(root)
    assert [[os.path.relpath(s.path(i), root) for i in range(len(s))] for _, s in data.splits()] == \
        [["f0.png"], ["sub/f3.png"], ["f1.png"]]


def test_fewer_than_three_files_are_refused_naming_the_folder(tmp_path):
    _tree(tmp_path / "two", 2)
    with pytest.raises(ValueError, match=r"two: 2 images in all: a collection needs at least 3"):
        open_collection(tmp_path / "two")


def _listed(data, root):
    return sorted(os.path.relpath(split.path(i), root) for _, split in data.splits() for i in range(len(split)))


def _left_out(data, root):
    return {os.path.relpath(line.split("\t")[0], root): line.split("\t")[1] for line in skipped_files(data)}


def test_a_linked_folder_is_read_once_and_a_link_back_to_a_parent_is_named_not_followed(tmp_path):
    outside = tmp_path / "elsewhere"
    _tree(outside, 4)
    root = tmp_path / "photos"
    _tree(root, 3)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "again").symlink_to(outside, target_is_directory=True)  # the same folder a second time
    (outside / "loop").symlink_to(outside, target_is_directory=True)  # a link to its own folder
    data = open_collection(root)
    assert _listed(data, root) == sorted([f"img{i:03d}.png" for i in range(3)] +
                                         [f"again/img{i:03d}.png" for i in range(4)])
    left_out = _left_out(data, root)
    assert set(left_out) == {"again/loop", "linked"}, left_out
    assert all("already read" in reason for reason in left_out.values()), left_out


@pytest.mark.parametrize("link, target, reason", [
    ("zz-copy.png", "photos/img001.png", "the same file as {target} (a link to it): read once"),
    ("gone.png", "moved-away.png", "a symbolic link to nothing ({target} does not exist)"),
])
def test_a_link_to_an_image_already_listed_or_to_nothing_is_left_out_and_named(tmp_path, link, target, reason):
    root = tmp_path / "photos"
    _tree(root, 4)
    (root / link).symlink_to(tmp_path / target)
    data = open_collection(root)
    assert _listed(data, root) == [f"img{i:03d}.png" for i in range(4)]
    assert _left_out(data, root) == {link: reason.format(target=tmp_path / target)}


def test_fail_stops_at_a_link_to_nothing_naming_it(tmp_path):
    root = tmp_path / "photos"
    _tree(root, 4)
    (root / "gone.png").symlink_to(tmp_path / "moved-away.png")
    with pytest.raises(ValueError, match=r"gone.png: a symbolic link to nothing"):
        open_collection(root, bad_files="fail")


def test_every_image_kind_becomes_one_square_shape_by_the_stated_rules(tmp_path):
    root = tmp_path / "kinds"
    # a wide image: left half red, right half blue; the centre crop keeps both, the middle columns
    wide = np.zeros((40, 80, 3), dtype=np.uint8)
    wide[:, :40] = (255, 0, 0)
    wide[:, 40:] = (0, 0, 255)
    root.mkdir()
    Image.fromarray(wide).save(root / "wide.png")
    Image.fromarray(np.full((30, 30), 128, dtype=np.uint8)).save(root / "gray.png")
    rgba = np.zeros((30, 30, 4), dtype=np.uint8)  # fully transparent: white after compositing
    Image.fromarray(rgba, "RGBA").save(root / "clear.png")
    Image.fromarray(wide).convert("P").save(root / "palette.png")
    Image.fromarray(wide).convert("CMYK").save(root / "cmyk.tiff")
    Image.fromarray(np.full((30, 30), 65535, dtype=np.uint16)).save(root / "deep.png")
    Image.fromarray(wide).save(root / "web.webp", lossless=True)
    Image.fromarray(wide).save(root / "bitmap.bmp")
    collection = open_collection(root, size=16, val_fraction=0.01, test_fraction=0.01, bad_files="fail")
    items = {}
    for _, split in collection.splits():
        for i in range(len(split)):
            image, label = split[i]
            assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 16, 16) and label == -1
            items[os.path.basename(split.path(i))] = image
    assert items["wide.png"][:, :, :8].float().mean(dim=(1, 2)).tolist()[0] > 200   # red on the left
    assert items["wide.png"][:, :, 8:].float().mean(dim=(1, 2)).tolist()[2] > 200   # blue on the right
    assert int(items["clear.png"].min()) == 255                                     # over white
    assert items["gray.png"].unique().tolist() == [128]
    assert int(items["deep.png"].min()) == 255                                       # 16-bit full range
    for name in ("palette.png", "cmyk.tiff", "web.webp", "bitmap.bmp"):
        assert items[name][0, :, :4].float().mean() > 150 and items[name][2, :, -4:].float().mean() > 150, name


def test_a_grayscale_collection_has_one_channel(tmp_path):
    for i in range(12):
        _image(tmp_path / "g" / f"{i}.png", mode="L")
    assert open_collection(tmp_path / "g").image_shape == (1, 32, 32)


def _damaged(root):
    _tree(root, 20)
    good = (root / "img003.png").read_bytes()
    (root / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "empty.jpg").write_bytes(b"")
    (root / "text.png").write_text("not an image")
    Image.fromarray(np.zeros((300, 300, 3), dtype=np.uint8)).save(root / "huge.png")
    return {"truncated.png", "empty.jpg", "text.png", "huge.png"}


def test_damaged_files_are_skipped_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTRASTKIT_MAX_INPUT_BYTES", "100000")  # the 300x300 RGB image is over it
    damaged = _damaged(tmp_path / "d")
    data = open_collection(tmp_path / "d", val_fraction=0.01, test_fraction=0.01)
    seen = 0
    for _, split in data.splits():
        for images, indices in make_loader(split, batch_size=7, workers=0):
            assert images.shape[0] == indices.shape[0]
            seen += images.shape[0]
    assert seen == 20
    named = {os.path.basename(line.split("\t")[0]) for line in skipped_files(data)}
    assert named == damaged
    assert all("cannot read image" in line or "input ceiling" in line for line in skipped_files(data))


def test_fail_stops_at_a_damaged_file_naming_it(tmp_path):
    _damaged(tmp_path / "d")
    data = open_collection(tmp_path / "d", val_fraction=0.01, test_fraction=0.01, bad_files="fail")
    with pytest.raises(BadItemError, match=r"(truncated|empty|text)\.(png|jpg)"):
        for _, split in data.splits():
            for _batch in make_loader(split, batch_size=64, workers=0):
                pass


def test_bad_options_are_one_clear_error(tmp_path):
    _tree(tmp_path / "p", 12)
    with pytest.raises(ValueError, match="bad_files must be one of"):
        open_data(tmp_path / "p", bad_files="ignore")
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
        open_collection(tmp_path / "p", size=0)
    with pytest.raises(ValueError, match="skip applies to unlabeled collections"):
        open_data("digits", bad_files="skip")
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="cannot recognise"):
        open_data(tmp_path / "none")


def test_item_dataset_gives_unlabeled_items_the_no_label_whether_held_or_streamed(tmp_path):
    # The contract (contrastkit.data.item_dataset): items (image, label); a split without labels
    # gives every item NO_LABEL (-1), never a class id, held images as streamed ones.
    from contrastkit.data import NO_LABEL, Split, item_dataset
    from contrastkit.data.paired import PairedSplit

    images = torch.rand(5, 3, 8, 8)
    held = item_dataset(PairedSplit(images=images, texts=[f"text {i}" for i in range(5)]))  # pairs without labels
    streamed = item_dataset(open_collection(_tree(tmp_path / "photos", 12)[0].parent).train)
    labelled = item_dataset(Split(images=images, labels=torch.tensor([2, 0, 1, 1, 0])))
    assert len(held) == 5 and torch.equal(held[3][0], images[3])
    for items in (held, streamed):
        batch_images, batch_labels = next(iter(torch.utils.data.DataLoader(items, batch_size=4)))
        assert batch_images.shape[0] == 4 and batch_labels.tolist() == [NO_LABEL] * 4
        assert batch_labels.dtype == torch.int64
    assert [int(labelled[i][1]) for i in range(5)] == [2, 0, 1, 1, 0]


def test_a_damaged_file_read_for_a_picture_is_left_out_and_named(tmp_path):
    from contrastkit.data.loader import read_present_images

    _tree(tmp_path / "photos", 12)
    data = open_collection(tmp_path / "photos")
    split = data.train
    broken = 1
    with open(split.path(broken), "wb"):
        pass  # emptied after the index was read, as a file damaged on disk
    images, read = read_present_images(split, torch.tensor([0, broken, 2]))
    assert read.tolist() == [0, 2] and images.shape[0] == 2
    assert [line.split("\t")[0] for line in skipped_files(data)] == [split.path(broken)]


# -- files that vanish or change after the collection was indexed -------------------------------

def _vanish(path, how):
    if how == "removed":
        os.remove(path)
    else:  # overwritten by something that no longer decodes
        with open(path, "wb") as handle:
            handle.write(b"half a photo")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["removed", "overwritten"])
def test_a_file_gone_or_changed_after_indexing_is_skipped_and_named(tmp_path, workers, how):
    """A file deleted while a --workers 2 run read the folder stopped the run with "Caught
    FileNotFoundError in DataLoader worker process 0.", naming no file."""
    _tree(tmp_path / "p", 16)
    data = open_collection(tmp_path / "p", val_fraction=0.01, test_fraction=0.01)
    gone = data.train.path(3)
    _vanish(gone, how)  # after the index was built, before the first read
    seen = sum(int(indices.numel()) for _, indices in make_loader(data.train, batch_size=4, workers=workers))
    assert seen == len(data.train) - 1
    (line,) = skipped_files(data)
    path, reason = line.split("\t")
    assert path == gone and "cannot read image" in reason
    if how == "removed":
        assert "no such file" in reason


@pytest.mark.parametrize("workers", [0, 2])
def test_fail_stops_at_a_file_removed_after_indexing_naming_it(tmp_path, workers):
    _tree(tmp_path / "p", 16)
    data = open_collection(tmp_path / "p", val_fraction=0.01, test_fraction=0.01, bad_files="fail")
    gone = data.train.path(5)
    os.remove(gone)
    with pytest.raises(BadItemError) as caught:
        for _batch in make_loader(data.train, batch_size=4, workers=workers):
            pass
    message = str(caught.value)
    # The error's traceback holds the loader and its persistent workers: freed now, they end at
    # once; left to a garbage collection in pytest's teardown, each worker waited out torch's
    # 5 s join twice (20 s of the suite).
    del caught
    assert gone in message and "no such file" in message and "\n" not in message


def test_a_file_that_comes_back_before_the_main_process_looks_is_still_named(tmp_path, monkeypatch):
    """What a worker could not read is named by the worker's reason: the main process does not
    read the file again (it may have come back, or changed again, in between)."""
    from contrastkit.data import loader as loader_module

    _tree(tmp_path / "p", 16)
    data = open_collection(tmp_path / "p", val_fraction=0.01, test_fraction=0.01)
    gone = data.train.path(2)
    saved = (tmp_path / "p" / os.path.basename(gone)).read_bytes()
    os.remove(gone)
    real_iter = loader_module.DataLoader.__iter__

    def iterate_then_restore(self):
        for batch in real_iter(self):
            with open(gone, "wb") as handle:  # back, readable, before the batch is looked at
                handle.write(saved)
            yield batch

    monkeypatch.setattr(loader_module.DataLoader, "__iter__", iterate_then_restore)
    seen = sum(int(indices.numel()) for _, indices in make_loader(data.train, batch_size=4, workers=0))
    assert seen == len(data.train) - 1
    assert [line.split("\t")[0] for line in skipped_files(data)] == [gone]


# -- file names that are not UTF-8 ---------------------------------------------------------------

def _latin1_name(folder):
    """A PNG named with the Latin-1 byte of 'é' (b'caf\\xe9.png'), as old cameras and zip files
    leave them on Linux."""
    name = os.fsencode(str(folder)) + b"/caf\xe9.png"
    shutil.copyfile(os.fsencode(str(folder / "img000.png")), name)
    return os.fsdecode(name)


@pytest.mark.skipif(os.name == "nt", reason="Windows file names are Unicode")
def test_a_file_name_that_is_not_utf8_is_skipped_and_named_with_its_bytes_escaped(tmp_path):
    """One such name made the whole folder unusable ("'utf-8' codec can't encode character
    '\\udce9' ... surrogates not allowed"), naming no file."""
    _tree(tmp_path / "p", 16)
    odd = _latin1_name(tmp_path / "p")
    data = open_collection(tmp_path / "p")
    assert odd not in _all_files(data) and len(_all_files(data)) == 16
    (line,) = skipped_files(data)
    line.encode("utf-8")  # writable as it stands: skipped.txt is UTF-8
    path, reason = line.split("\t")
    assert path == str(tmp_path / "p") + "/caf\\xe9.png"
    assert "not valid UTF-8" in reason and "b'caf\\xe9.png'" in reason


@pytest.mark.skipif(os.name == "nt", reason="Windows file names are Unicode")
def test_fail_refuses_a_folder_with_a_name_that_is_not_utf8_naming_the_bytes(tmp_path):
    _tree(tmp_path / "p", 16)
    _latin1_name(tmp_path / "p")
    with pytest.raises(ValueError) as caught:
        open_collection(tmp_path / "p", bad_files="fail")
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "p")) and "b'caf\\xe9.png'" in message and "\n" not in message


# -- list files -----------------------------------------------------------------------------

def test_a_list_naming_one_file_twice_is_refused_by_its_lines(tmp_path):
    """A list naming one file twice trained it twice, silently."""
    files = _tree(tmp_path / "pics", 12)
    names = [os.path.relpath(f, tmp_path) for f in files]
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(names[:5] + ["./" + names[2]] + names[5:]) + "\n")
    with pytest.raises(ValueError) as caught:
        open_data(listing)
    message = str(caught.value)
    assert message.startswith(f"{listing}: lines 3 and 6 ") and repr(names[2]) in message
    assert repr("./" + names[2]) in message and "\n" not in message


def test_a_device_in_a_list_is_named_for_what_it_is(tmp_path):
    """/dev/zero in a list was reported as "no such image file"."""
    files = _tree(tmp_path / "pics", 12)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(os.path.relpath(f, tmp_path) for f in files) + "\n/dev/zero\n")
    with pytest.raises(ValueError, match=r"list.txt: line 13: '/dev/zero' is a character device, not a regular "
                                         r"image file"):
        open_data(listing)
    (tmp_path / "sub").mkdir()
    listing.write_text("pics/img000.png\nsub\n")
    with pytest.raises(ValueError, match=r"line 2: 'sub' is a folder, not a regular image file"):
        open_data(listing)


def test_a_strip_of_extreme_aspect_ratio_costs_what_a_square_does(tmp_path, monkeypatch):
    """A 1,000,000 x 1 PNG (3 MB) resized whole to a shorter side of 32 would be a 32,000,000 x 32
    image (3 GB): only the region its centre crop keeps is resized. Under a 64 MiB input ceiling
    the whole resize is refused; the crop's region is not."""
    from contrastkit.data.files import pil_resample
    from contrastkit.data.preprocess import CROP_FIRST_RATIO, SHORTER_SIDE_THEN_CENTRE_CROP, ImagePreprocessing

    monkeypatch.setenv("CONTRASTKIT_MAX_INPUT_BYTES", "64M")
    strip = np.zeros((1, 1_000_000, 3), dtype=np.uint8)
    strip[0, 500_000 - 8:500_000 + 8] = (200, 100, 50)  # the middle, which the crop keeps
    root = tmp_path / "strips"
    root.mkdir()
    Image.fromarray(strip).save(root / "strip.png")
    _tree(root, 3)
    data = open_collection(root, size=32)
    [image] = [split[i][0] for _, split in data.splits() for i in range(len(split))
               if split.path(i) == str(root / "strip.png")]
    assert image.shape == (3, 32, 32) and image[:, 16, 16].tolist() == [200, 100, 50]
    # Just past the ratio, the crop's region resized is the whole resized and cropped, within 1.
    rng = np.random.default_rng(0)
    wide = Image.fromarray(rng.integers(0, 256, (20, 20 * CROP_FIRST_RATIO + 7, 3), dtype=np.uint8))
    rule = ImagePreprocessing("RGB", (16, 16), SHORTER_SIDE_THEN_CENTRE_CROP)
    scale = 16 / 20
    whole = np.asarray(wide.resize((round(wide.size[0] * scale), 16), pil_resample()))
    left = (whole.shape[1] - 16) // 2
    expected = whole[:, left:left + 16].transpose(2, 0, 1).astype(int)
    assert np.abs(rule.fit(wide).astype(int) - expected).max() <= 1
