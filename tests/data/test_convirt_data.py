"""Paired data: generated reports are deterministic and true of their scenes; CSV pairs load
and bad pair files fail with messages naming the file, line and problem."""

import re

import numpy as np
import pytest
import torch

from contrastkit.data.glyphlab import clean_scenes, load_glyphlab
from contrastkit.data import load_paired
from contrastkit.data.paired import PairedSplit

SMALL = dict(train_scenes=60, val_scenes=30, test_scenes=90)

_NUMBERS = {w: i for i, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                        "nine", "ten"])}


def _one(patterns, text, what):
    """The single category whose pattern occurs in ``text`` (word boundaries)."""
    found = {name for name, pattern in patterns.items() if re.search(pattern, text)}
    assert len(found) == 1, f"{what}: expected exactly one of {list(patterns)} in {text!r}, found {found}"
    return found.pop()


def parse_report(text):
    """Facts read back from a report with this test's own vocabulary."""
    orientation = _one({
        "vertical": r"\bvertical(ly)?\b|\bup-and-down\b",
        "horizontal": r"\bhorizontal(ly)?\b|\bflat-lying\b",
        "rising": r"\b(rising|ascending|forward-slash) diagonal\b",
        "falling": r"\b(falling|descending|backslash) diagonal\b",
    }, text, "orientation")
    thickness = _one({
        "thin": r"\b(thin|slender|fine)\b",
        "medium": r"\b(medium|medium-width|moderate)\b",
        "thick": r"\b(thick|bold|wide)\b",
    }, text, "thickness")
    row = "top" if re.search(r"\b(top|upper)\b", text) else "bottom" if re.search(r"\b(bottom|lower)\b", text) \
        else "middle"
    col = "left" if re.search(r"\bleft\b", text) else "right" if re.search(r"\bright\b", text) else "centre"
    counts = re.findall(r"\b(\w+) (?:distractor marks|small marks|clutter marks|distractors)\b", text)
    assert len(counts) == 1, f"clutter count not found once in {text!r}"
    clutter = int(counts[0]) if counts[0].isdigit() else _NUMBERS[counts[0]]
    return dict(orientation=orientation, thickness=thickness, row=row, col=col, clutter=clutter)


def expected_facts(params, size):
    """Facts computed here from the generator's raw parameters (thirds of the image for the
    position; thirds of the documented thickness range 1.6..3.2 px at 32 px for thickness)."""
    out = []
    for angle, cx, cy, thick, n in zip(params["angle"], params["cx"], params["cy"], params["thickness"],
                                       params["n_distractors"]):
        a = angle % 180.0
        if a < 22.5 or a >= 157.5:
            orientation = "horizontal"
        elif a < 67.5:
            orientation = "rising"  # counter-clockwise from +x with y up: '/' shape
        elif a < 112.5:
            orientation = "vertical"
        else:
            orientation = "falling"
        t = thick * 32.0 / size
        thickness = "thin" if t < 1.6 + 1.6 / 3 else "medium" if t < 1.6 + 3.2 / 3 else "thick"
        row = ("top", "middle", "bottom")[min(2, int(cy * 3 // size))]
        col = ("left", "centre", "right")[min(2, int(cx * 3 // size))]
        out.append(dict(orientation=orientation, thickness=thickness, row=row, col=col, clutter=int(n)))
    return out


@pytest.fixture(scope="module")
def glyph_text():
    return load_paired("glyphlab-text", seed=3, **SMALL)


def test_every_report_is_true_of_its_scene(glyph_text):
    seen = {"orientation": set(), "thickness": set(), "row": set(), "col": set(), "clutter": set()}
    for key, split in glyph_text.splits():
        _, labels, params = clean_scenes(3, key, SMALL[f"{key}_scenes"], size=32)
        truth = expected_facts(params, 32)
        assert torch.equal(split.labels, torch.from_numpy(labels))
        for text, facts in zip(split.texts, truth):
            assert parse_report(text) == facts, text
            for name, value in facts.items():
                seen[name].add(value)
        # The class label agrees with the stated orientation.
        for label, facts in zip(labels, truth):
            assert {"vertical": 0, "horizontal": 1, "rising": 2, "falling": 2}[facts["orientation"]] == label
    # Every category occurs, so a changed generator range cannot silently empty a bin.
    assert seen["orientation"] == {"vertical", "horizontal", "rising", "falling"}
    assert seen["thickness"] == {"thin", "medium", "thick"}
    assert seen["clutter"] == {2, 3, 4, 5}
    assert seen["row"] == {"top", "middle", "bottom"} and seen["col"] == {"left", "centre", "right"}


def test_reports_are_deterministic_and_varied(glyph_text):
    again = load_paired("glyphlab-text", seed=3, **SMALL)
    other = load_paired("glyphlab-text", seed=4, **SMALL)
    for (_, a), (_, b) in zip(glyph_text.splits(), again.splits()):
        assert a.texts == b.texts
        assert torch.equal(a.images, b.images)
    assert glyph_text.train.texts != other.train.texts
    # Varied phrasing: many distinct sentence shapes once the facts are masked out.
    shapes = {re.sub(r"\w+", "w", t) for t in glyph_text.train.texts}
    assert len(shapes) >= 5
    assert len(set(glyph_text.train.texts)) > 0.9 * len(glyph_text.train)


def test_images_are_the_glyphlab_scenes(glyph_text):
    plain = load_glyphlab(3, **SMALL)
    for (_, paired), (_, base) in zip(glyph_text.splits(), plain.splits()):
        assert torch.equal(paired.images, base.images)
        assert torch.equal(paired.groups, base.groups)
    groups = [set(s.groups.tolist()) for _, s in glyph_text.splits()]
    assert not (groups[0] & groups[1]) and not (groups[0] & groups[2]) and not (groups[1] & groups[2])


def test_zero_shot_prompts_use_the_training_vocabulary(glyph_text):
    from contrastkit.models.text import WordTokenizer

    tok = WordTokenizer.build(glyph_text.train.texts)
    prompts = [p for ps in glyph_text.class_prompts.values() for p in ps]
    assert tok.unknown_fraction(prompts) == 0.0
    assert set(glyph_text.class_prompts) == set(glyph_text.class_names)


def test_digits_text_names_the_digit():
    ds = load_paired("digits-text", seed=0)
    for _, split in ds.splits():
        for text, label in zip(split.texts, split.labels.tolist()):
            words = re.findall(r"\w+", text)
            named = [w for w in words if w.isdigit()] + [str(_NUMBERS[w]) for w in words if w in _NUMBERS]
            assert named == [str(label)], text
    assert load_paired("digits-text", seed=0).train.texts == ds.train.texts


# ---------------------------------------------------------------------------------------
# CSV pairs


def _write_images(folder, n, mode="L"):
    from PIL import Image

    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        shape = (12, 12) if mode == "L" else (12, 12, 3)
        Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode).save(folder / f"im{i}.png")
        names.append(f"im{i}.png")
    return names


def _write_csv(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_csv_pairs_load_and_split_by_image(tmp_path):
    names = _write_images(tmp_path, 10)
    rows = ["image,text,label"] + [f"{n},a picture number {i},{'odd' if i % 2 else 'even'}" for i, n in enumerate(names)]
    rows += [f"{names[0]},a second report for the first picture,even"]
    ds = load_paired(_write_csv(tmp_path / "pairs.csv", rows), size=16, val_fraction=0.2, test_fraction=0.2)
    assert ds.image_shape == (1, 16, 16)
    assert sum(len(s) for _, s in ds.splits()) == 11
    assert ds.class_names == ["even", "odd"]
    assert (len(ds.val), len(ds.test)) in {(2, 2), (3, 2), (2, 3)}
    # Both rows of im0 land in the same split.
    where = [key for key, s in ds.splits() for t in s.texts if "first picture" in t or t == "a picture number 0"]
    assert len(where) == 2 and where[0] == where[1]
    text_to_label = {t: int(label) for _, s in ds.splits() for t, label in zip(s.texts, s.labels)}
    assert text_to_label["a picture number 3"] == 1 and text_to_label["a picture number 4"] == 0
    assert ds.to_dataset().num_classes == 2


def test_csv_split_column_and_rgb(tmp_path):
    names = _write_images(tmp_path, 3, mode="RGB")
    rows = ["image,split,text", f"{names[0]},train,one", f"{names[1]},val,two", f"{names[2]},test,three"]
    ds = load_paired(_write_csv(tmp_path / "p.csv", rows), size=12)
    assert ds.image_shape == (3, 12, 12)
    assert ds.train.texts == ["one"] and ds.val.texts == ["two"] and ds.test.texts == ["three"]
    assert not ds.has_labels


@pytest.mark.parametrize("rows, error, message", [
    (["image,text", "im0.png,fine", "missing.png,a text"], FileNotFoundError, r"line 3: image 'missing.png' not found"),
    (["image,text", "im0.png,fine", "im1.png,  "], ValueError, r"line 3: empty text for image 'im1.png'"),
    (["image,text", "im0.png,fine", "im1.png,a,b"], ValueError, r"line 3: expected 2 fields \(image,text\), got 3"),
    (["image,caption", "im0.png,fine"], ValueError, r"lacks column\(s\) text"),
    (["image,text"], ValueError, r"no \(image, text\) rows"),
    (["image,text,split", "im0.png,a,train", "im1.png,b,holdout"], ValueError, r"line 3: split must be one of"),
    (["image,text,split", "im0.png,a,train", "im0.png,b,test"], ValueError, r"assigned to both 'train' and 'test'"),
])
def test_bad_pair_files_name_file_line_and_problem(tmp_path, rows, error, message):
    _write_images(tmp_path, 2)
    path = _write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(error, match=message) as info:
        load_paired(path)
    assert "bad.csv" in str(info.value)


def test_unreadable_image_and_missing_file(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = _write_csv(tmp_path / "p.csv", ["image,text", "broken.png,words"])
    with pytest.raises(ValueError, match=r"p.csv, line 2: cannot read image"):
        load_paired(path)
    with pytest.raises(FileNotFoundError, match="no paired data"):
        load_paired(tmp_path / "nope.csv")
    with pytest.raises(TypeError, match="unknown option"):
        load_paired("glyphlab-text", train_scene=3)


def test_paired_split_rejects_count_mismatch_and_empty_text():
    images = torch.zeros(3, 1, 8, 8)
    with pytest.raises(ValueError, match="3 images but 2 texts"):
        PairedSplit(images=images, texts=["a", "b"])
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        PairedSplit(images=images, texts=["a", " ", "c"])
    with pytest.raises(ValueError, match="labels"):
        PairedSplit(images=images, texts=["a", "b", "c"], labels=torch.zeros(2, dtype=torch.int64))
