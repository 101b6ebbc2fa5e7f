"""The index of an unlabeled collection (contrastkit.data.collection) kept compactly and
listed without a stat per file: it gives what the straightforward listing gave (a walk of
Path objects, os.path.relpath, a dict of identities, sorted Paths; written out below as the
reference) on small trees of every kind of entry: the same files in the same order, the same
split of each, the same files left out with the same reasons, the same errors."""

from __future__ import annotations

import csv
import io
import os
import stat
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contrastkit._io import escape_undecodable, file_kind, is_utf8_name, open_input
from contrastkit.data import open_collection, open_data
from contrastkit.data.collection import collection_files, hash_fraction, split_by_hash
from contrastkit.data.files import IMAGE_EXTENSIONS, detect_format

pytestmark = pytest.mark.skipif(os.name == "nt", reason="symbolic links, hard links and byte file names are POSIX")

#: A 1x1 grey PNG.
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b550000000a49444154789c63680000"
                    "0082008177cd72b60000000049454e44ae426082")


# -- the reference: the listing as it was written before the index was kept compactly ---------------

def _reference_walk(source: Path, left_out: Dict[str, str], bad_files: str) -> List[Path]:
    files: List[Path] = []
    folders_read: Dict[Tuple[int, int], str] = {}
    files_read: Dict[Tuple[int, int], str] = {}
    start = os.stat(source)
    stack = [(source, (start.st_dev, start.st_ino))]
    while stack:
        folder, key = stack.pop()
        if key in folders_read:
            left_out[escape_undecodable(folder)] = (f"the folder {escape_undecodable(folders_read[key])}, already "
                                                    "read (reached again through a symbolic link): read once")
            continue
        folders_read[key] = str(folder)
        try:
            with os.scandir(folder) as listing:
                entries = sorted((entry for entry in listing if not entry.name.startswith(".")),
                                 key=lambda entry: entry.name)
        except OSError as err:
            left_out[escape_undecodable(folder)] = f"folder cannot be listed ({err.strerror or err}): left out"
            continue
        below = []
        for entry in entries:
            try:
                is_folder = entry.is_dir()
            except OSError:
                is_folder = False
            if is_folder:
                try:
                    info = entry.stat()
                except OSError as err:
                    left_out[escape_undecodable(entry.path)] = f"folder cannot be read ({err.strerror or err})"
                    continue
                below.append((Path(entry.path), (info.st_dev, info.st_ino)))
                continue
            if not entry.name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            if entry.is_symlink():
                try:
                    info = entry.stat()
                except OSError:
                    reason = f"a symbolic link to nothing ({escape_undecodable(os.readlink(entry.path))} does not exist)"
                    if bad_files == "fail":
                        raise ValueError(f"{escape_undecodable(entry.path)}: {reason}") from None
                    left_out[escape_undecodable(entry.path)] = reason
                    continue
                identity = (info.st_dev, info.st_ino)
            else:
                identity = (key[0], entry.inode())
            if identity in files_read:
                left_out[escape_undecodable(entry.path)] = (f"the same file as {escape_undecodable(files_read[identity])}"
                                                            " (a link to it): read once")
                continue
            files_read[identity] = entry.path
            files.append(Path(entry.path))
        stack.extend(reversed(below))
    return files


def _reference_list(source: Path) -> List[Path]:
    root = source.parent
    files: List[Path] = []
    seen: Dict[Tuple[int, int], Tuple[int, str]] = {}
    repeated: List[str] = []
    number = 0
    try:
        with open_input(source) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
            rows = csv.reader(handle) if source.suffix.lower() == ".csv" else ([line] for line in handle)
            for number, row in enumerate(rows, 1):
                entry = (row[0] if row else "").strip()
                if not entry or entry.startswith("#") or (number == 1 and entry.lower() in ("path", "image")):
                    continue
                path = Path(entry) if os.path.isabs(entry) else root / entry
                try:
                    info = os.stat(path)
                except (OSError, ValueError):
                    raise ValueError(f"{source}: line {number}: no such image file {entry!r}") from None
                if not stat.S_ISREG(info.st_mode):
                    raise ValueError(f"{source}: line {number}: {entry!r} is {file_kind(info.st_mode)}, not a "
                                     "regular image file")
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    line, first = seen[key]
                    named = f"both name {first!r}" if first == entry else f"name the same file ({first!r} and {entry!r})"
                    repeated.append(f"lines {line} and {number} {named}")
                    continue
                seen[key] = (number, entry)
                files.append(path)
    except UnicodeDecodeError:
        raise ValueError(f"{source}: line {number + 1} is not UTF-8 text (save the list as UTF-8)") from None
    if repeated:
        more = f" (and {len(repeated) - 1} more repeated entries)" if len(repeated) > 1 else ""
        raise ValueError(f"{source}: {repeated[0]}{more}; a list names each image once (a repeated one would be "
                         "trained on more often than the others)")
    if not files:
        raise ValueError(f"{source}: lists no image files")
    return files


def _reference_index(source, bad_files: str):
    source = Path(source)
    left_out: Dict[str, str] = {}
    if not source.is_dir():
        return source.parent, _reference_list(source), left_out
    files = _reference_walk(source, left_out, bad_files)
    if not files:
        if left_out:
            first, reason = next(iter(left_out.items()))
            raise ValueError(f"{source}: no image file to read in it or below it ({len(left_out)} left out, "
                             f"e.g. {first}: {reason})")
        raise ValueError(f"{source}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in it or below it")
    named = []
    for path in files:
        relative = os.path.relpath(path, source)
        if is_utf8_name(relative):
            named.append(path)
            continue
        if bad_files == "fail":
            raise ValueError(f"{source}: the file name {os.fsencode(relative)!r} is not valid UTF-8, so a run's "
                             "outputs could not name it (rename it, or let bad_files=skip leave it out)")
        left_out[escape_undecodable(path)] = (f"file name is not valid UTF-8 ({os.fsencode(relative)!r}): left out, "
                                              "since a run's outputs could not name it")
    if not named:
        raise ValueError(f"{source}: none of its {len(files)} image file names is valid UTF-8 (e.g. "
                         f"{os.fsencode(os.path.relpath(files[0], source))!r}): rename them")
    return source, named, left_out


def _reference_split_by_hash(names, val_fraction=0.1, test_fraction=0.2):
    splits = ("train", "val", "test")
    bounds = {"test": (0.0, test_fraction), "val": (test_fraction, test_fraction + val_fraction),
              "train": (test_fraction + val_fraction, 1.0)}
    positions = [hash_fraction(name) for name in names]
    parts = [next(part for part, (_, high) in bounds.items() if p < high or part == "train") for p in positions]
    members = {part: [i for i, got in enumerate(parts) if got == part] for part in splits}
    for part in splits:
        if members[part]:
            continue
        donor = max(splits, key=lambda other: (len(members[other]), -splits.index(other)))
        low, high = bounds[part]
        lent = min(members[donor], key=lambda i: (max(low - positions[i], positions[i] - high, 0.0), names[i]))
        members[donor].remove(lent)
        members[part].append(lent)
        parts[lent] = part
    return parts


def _reference_open(source, bad_files="skip", val_fraction=0.1, test_fraction=0.2):
    """``({split: [path, ...]}, {split: [relative path, ...]}, left_out as a list of items)``."""
    root, files, left_out = _reference_index(source, bad_files)
    if len(files) < 3:
        raise ValueError(f"{source}: {len(files)} image{'s' if len(files) != 1 else ''} in all: a collection needs "
                         "at least 3, one each for the train, val and test splits (add images)")
    relative = [os.path.relpath(path, root) for path in files]
    parts: Dict[str, List[Path]] = {"train": [], "val": [], "test": []}
    for path, part in zip(files, _reference_split_by_hash(relative, val_fraction, test_fraction)):
        parts[part].append(path)
    paths = {part: [str(p) for p in sorted(found)] for part, found in parts.items()}
    return paths, {part: [os.path.relpath(p, root) for p in found] for part, found in paths.items()}, \
        list(left_out.items())


def _opened(source, **options):
    data = open_collection(source, **options)
    paths = {name: [split.path(i) for i in range(len(split))] for name, split in data.splits()}
    relative = {name: [split.relative_path(i) for i in range(len(split))] for name, split in data.splits()}
    return paths, relative, list(data.left_out.items())


# -- the trees -------------------------------------------------------------------------------------

def _write(path: Path, data: bytes = PNG) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _every_kind_of_entry(root: Path) -> Path:
    """A tree of every entry a listing meets: names that sort differently as strings and as
    paths (``a-c.png`` and ``a/b.png``, ``a.png`` and ``a/``), a folder's files before and
    after its sub-folders by name, hidden files and folders, files not named like images, upper
    case suffixes, a folder named like an image, a link to a folder (read once), a loop back to
    a parent, a link to a file and a hard link to one already listed, links to nothing, names
    that are not UTF-8, at three depths."""
    for name in ("b.png", "a-c.png", "a.png", "A.PNG", "z.jpg", "a+.png", "a b.png", "0.png", "é.png", "zz.webp"):
        _write(root / name)
    _write(root / ".hidden.png")
    _write(root / "notes.txt", b"not an image")
    _write(root / "image.png.txt", b"not an image")
    for name in ("a/b.png", "a/a.png", "a/0/deep.png", "a/0/deeper/x.png", "a/z/last.jpg", "a-c/in.png",
                 "a/.git/x.png", ".cache/x.png", "folder.png/inner.png", "m/n/o/p.png", "m/n/a.png", "m/b.png"):
        _write(root / name)
    os.symlink(root / "a", root / "link_to_a")  # read again through a link: left out
    os.symlink(root / "m", root / "0_link_to_m")  # sorts first: m is read here, then m itself is left out
    os.symlink(root, root / "a" / "0" / "up")  # a loop back to the top
    os.symlink(root / "b.png", root / "alias.png")  # a link to a file already listed
    os.symlink(root / "m" / "b.png", root / "0_alias.png")  # a link read before the file it names
    os.symlink(root / "missing.png", root / "dangling.png")
    os.symlink(root / "gone", root / "a" / "dangling.jpg")
    os.link(root / "a" / "b.png", root / "a" / "z" / "hard.png")  # a hard link to a file already listed
    _write(root / os.fsdecode(b"caf\xe9.png"))
    _write(root / "m" / os.fsdecode(b"n\xff.png"))
    return root


def test_a_tree_of_every_kind_of_entry_is_indexed_as_the_straightforward_listing(tmp_path):
    root = _every_kind_of_entry(tmp_path / "tree")
    assert _opened(root) == _reference_open(root)
    # (the fractions that leave a split empty lend it a file, by the same rule)
    assert _opened(root, val_fraction=1e-9, test_fraction=1e-9) == \
        _reference_open(root, val_fraction=1e-9, test_fraction=1e-9)
    data = open_collection(root)
    assert len(data.left_out) == 10 and sum(len(split) for _, split in data.splits()) == 20


def test_the_current_folder_and_a_relative_path_are_indexed_as_before(tmp_path, monkeypatch):
    _every_kind_of_entry(tmp_path / "tree")
    monkeypatch.chdir(tmp_path / "tree")
    assert _opened(".") == _reference_open(".")
    monkeypatch.chdir(tmp_path)
    assert _opened("tree") == _reference_open("tree")
    assert _opened("./tree/../tree") == _reference_open("./tree/../tree")


def test_a_tree_refused_under_fail_is_refused_as_before(tmp_path):
    root = _every_kind_of_entry(tmp_path / "tree")
    with pytest.raises(ValueError) as before:
        _reference_index(root, "fail")
    with pytest.raises(ValueError, match="symbolic link to nothing") as now:
        open_collection(root, bad_files="fail")
    assert str(now.value) == str(before.value)
    for link in (root / "dangling.png", root / "a" / "dangling.jpg"):
        link.unlink()
    with pytest.raises(ValueError) as before:
        _reference_index(root, "fail")
    with pytest.raises(ValueError, match="not valid UTF-8") as now:
        open_collection(root, bad_files="fail")
    assert str(now.value) == str(before.value)


@pytest.mark.parametrize("only", ["links to nothing", "names that are not UTF-8", "nothing named like an image"])
def test_a_folder_with_nothing_to_read_is_refused_as_before(tmp_path, only):
    root = tmp_path / "tree"
    root.mkdir()
    if only == "links to nothing":
        os.symlink(root / "gone.png", root / "a.png")
        os.symlink(root / "gone.png", root / "b.png")
    elif only == "names that are not UTF-8":
        _write(root / os.fsdecode(b"\xff1.png"))
        _write(root / "sub" / os.fsdecode(b"\xfe2.png"))
    else:
        _write(root / "notes.txt", b"text")
    with pytest.raises(ValueError) as before:
        _reference_index(root, "skip")
    with pytest.raises(ValueError) as now:
        open_collection(root)
    assert str(now.value) == str(before.value)


def _list_files(tmp_path: Path) -> Path:
    root = _every_kind_of_entry(tmp_path / "tree")
    _write(tmp_path / "elsewhere" / "far.png")
    return root


@pytest.mark.parametrize("suffix", [".txt", ".csv"])
def test_a_list_file_is_indexed_as_before(tmp_path, suffix):
    """Entries relative to the list (with ./, .. and doubled separators), absolute ones, a CSV
    header, comments and blank lines."""
    root = _list_files(tmp_path)
    entries = ["path", "tree/b.png", "# a comment", "", "./tree/a-c.png", "tree/a/b.png", "tree//a/0/deep.png",
               "tree/a/../z.jpg", "elsewhere/far.png", str(root / "a.png"), str(root / "m" / "n" / "a.png"),
               "  tree/é.png  ", "tree/a b.png", "tree/a/a.png"]
    listing = tmp_path / f"list{suffix}"
    listing.write_text("\n".join(entries) + "\n", encoding="utf-8")
    assert _opened(listing) == _reference_open(listing)


def test_a_list_of_absolute_paths_and_one_of_mixed_paths_are_indexed_as_before(tmp_path, monkeypatch):
    root = _list_files(tmp_path)
    names = ["b.png", "a-c.png", "a/b.png", "a/0/deep.png", "A.PNG", "m/n/o/p.png", "a+.png", "0.png"]
    absolute = tmp_path / "absolute.txt"
    absolute.write_text("".join(f"{root / name}\n" for name in names))
    assert _opened(absolute) == _reference_open(absolute)
    # A list named by a relative path holds relative paths next to absolute ones: Path's order.
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("".join(f"{root / name}\n" if i % 2 else f"tree/{name}\n" for i, name in enumerate(names)) +
                     "-x.png\n")
    _write(tmp_path / "-x.png")
    monkeypatch.chdir(tmp_path)
    assert _opened("mixed.txt") == _reference_open("mixed.txt")


@pytest.mark.parametrize("lines, error", [
    (["tree/b.png", "tree/a.png", "tree/b.png"], "both name"),
    (["tree/b.png", "tree/alias.png", "tree/a/b.png", "tree/a/z/hard.png", "tree/a.png", "tree/./a.png"],
     "name the same file"),
    (["tree/b.png", "tree/missing.png"], "no such image file"),
    (["tree/b.png", "tree/a"], "is a folder"),
    (["# only a comment", ""], "lists no image files"),
])
def test_a_list_refused_is_refused_with_the_same_error(tmp_path, lines, error):
    _list_files(tmp_path)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as before:
        _reference_open(listing)
    with pytest.raises(ValueError, match=error) as now:
        open_collection(listing)
    assert str(now.value) == str(before.value)


def test_collection_files_gives_the_listing_in_walk_order(tmp_path):
    root = _every_kind_of_entry(tmp_path / "tree")
    for name in (os.fsdecode(b"caf\xe9.png"), os.path.join("m", os.fsdecode(b"n\xff.png")), "dangling.png",
                 os.path.join("a", "dangling.jpg")):
        os.unlink(root / name)
    assert collection_files(root) == (root, _reference_index(root, "fail")[1])


@given(st.lists(st.text(alphabet="ab/-.é0", min_size=1, max_size=6), min_size=3, max_size=12, unique=True),
       st.sampled_from([(0.1, 0.2), (0.0, 0.0), (0.5, 0.4), (0.0, 0.9)]))
def test_split_by_hash_gives_each_name_the_split_it_gave(names, fractions):
    assert split_by_hash(names, *fractions) == _reference_split_by_hash(names, *fractions)


def test_path_list_reads_back_what_it_was_given_and_takes_in_any_order():
    from contrastkit.data.collection import PathList

    paths = ["a/b.png", "", os.fsdecode(b"caf\xe9.png"), "é/x.png", "z" * 300]
    held = PathList.of(paths, prefix="root/")
    assert len(held) == 5 and [held[i] for i in range(5)] == [f"root/{p}" for p in paths]
    assert held.data.nbytes == sum(len(os.fsencode(p)) for p in paths)  # no width fixed by the longest
    taken = held.take(np.array([4, 0, 2, 0]))
    assert [taken[i] for i in range(4)] == [f"root/{paths[i]}" for i in (4, 0, 2, 0)]
    assert len(held.take(np.array([], dtype=np.int64))) == 0 and len(PathList.of([])) == 0


def test_a_collection_holds_its_paths_compactly(tmp_path):
    """One long name among short ones: the former fixed-width byte array took each path at the
    longest one's width."""
    root = tmp_path / "photos"
    for i in range(40):
        _write(root / f"{i:02d}.png")
    _write(root / ("x" * 200 + ".png"))
    data = open_collection(root)
    held = sum(split.files.data.nbytes for _, split in data.splits())
    assert held == 40 * len("00.png") + 204


def test_opening_a_flat_folder_stats_a_few_paths_not_each_file(tmp_path, monkeypatch):
    """The format's detection and the listing read each file's kind from the folder's listing
    (os.scandir): the former detection stat'ed every entry (Path.is_dir), a million calls for a
    million files."""
    root = tmp_path / "photos"
    for i in range(300):
        _write(root / f"{i:03d}.png")
    calls = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):
        calls.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    assert detect_format(root) == "collection"
    data = open_data(root)
    assert sum(len(split) for _, split in data.splits()) == 300
    assert len(calls) < 100, calls  # (the format's checks, a few dozen whatever the folder holds)


_NAMES = ("b.png", "a-c.png", "a/b.png", "a/0/deep.png", "A.PNG", "m/n/o/p.png", "a+.png", "0.png", "a b.png")


def _spelled(name: str, how: int, root: Path) -> str:
    """``tree/name`` spelled one of the ways a list may spell it."""
    parts = ["tree", *name.split("/")]
    if how == 1:
        return "./" + "/".join(parts)
    if how == 2:
        return "//".join(parts)
    if how == 3:
        return "/".join(parts[:-1] + ["..", parts[-2], parts[-1]]) if len(parts) > 2 else "tree/./" + name
    if how == 4:
        return str(root / name)
    if how == 5:
        return str(root / name).replace("/", "//", 2)
    return "/".join(parts)


@pytest.fixture(scope="module")
def listed_tree(tmp_path_factory):
    return _every_kind_of_entry(tmp_path_factory.mktemp("listed") / "tree")


@given(st.lists(st.tuples(st.sampled_from(_NAMES), st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5])), min_size=1,
                max_size=12))
def test_a_list_of_paths_spelled_any_way_is_indexed_as_before(listed_tree, tmp_path_factory, entries):
    """Plain relative paths (held as names after the list's folder), then any other spelling
    (./, doubled separators, .., absolute, a '//' root): whole paths from there on."""
    listing = tmp_path_factory.mktemp("list") / "list.txt"
    os.symlink(listed_tree, listing.parent / "tree")
    listing.write_text("".join(_spelled(name, how, listed_tree) + "\n" for name, how in entries))
    try:
        expected = _reference_open(listing)
    except ValueError as error:
        with pytest.raises(ValueError) as now:
            open_collection(listing)
        assert str(now.value) == str(error)
        return
    assert _opened(listing) == expected
