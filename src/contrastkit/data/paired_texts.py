"""The generated texts of the built-in paired data sets: GlyphLab reports (``glyphlab-text``)
and digit names (``digits-text``); see :mod:`contrastkit.data.paired` for what they state."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from contrastkit.data.paired import PairedDataset, PairedSplit

__all__ = ["load_glyphlab_text", "load_digits_text", "glyphlab_facts", "glyphlab_report", "digit_text",
           "GLYPHLAB_PROMPTS", "GLYPH_THICKNESS_RANGE"]


# ----------------------------------------------------------------------------------------
# GlyphLab reports

#: Bounds of the generator's bar thickness at 32 x 32 (``render_scenes``: uniform(1.6, 3.2)
#: pixels times size / 32); the thin / medium / thick bins are its thirds.
GLYPH_THICKNESS_RANGE = (1.6, 3.2)

_ORIENTATION_PHRASES = {
    "vertical": ["vertical", "vertically oriented", "up-and-down"],
    "horizontal": ["horizontal", "horizontally oriented", "flat-lying"],
    "rising": ["rising diagonal", "ascending diagonal", "forward-slash diagonal"],
    "falling": ["falling diagonal", "descending diagonal", "backslash diagonal"],
}
_THICKNESS_PHRASES = {
    "thin": ["thin", "slender", "fine"],
    "medium": ["medium", "medium-width", "moderate"],
    "thick": ["thick", "bold", "wide"],
}
_ROW_WORDS = {"top": ["top", "upper"], "middle": ["middle", "centre"], "bottom": ["bottom", "lower"]}
_COL_WORDS = {"left": ["left"], "centre": ["centre", "middle"], "right": ["right"]}
_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                 "eighteen", "nineteen", "twenty"]
_NOUNS = ["bar", "stroke", "line", "glyph"]
_CLUTTER_NOUNS = ["distractor marks", "small marks", "clutter marks", "distractors"]

#: Text templates; every one states all four facts. Fields: {o} orientation, {t} thickness,
#: {p} position phrase, {n} clutter count, {noun} the bar, {cn} clutter noun.
_TEMPLATES = [
    "a {t} {o} {noun} {p}, with {n} {cn}.",
    "{p}: one {o} {noun}, {t}. {n} {cn} around it.",
    "the scene shows a {o} {noun} of {t} width {p}. there are {n} {cn}.",
    "{n} {cn} surround a {t} {o} {noun} {p}.",
    "report: {o} {noun} {p}; thickness {t}; clutter {n} {cn}.",
    "there is a {t} {noun}, {o}, {p}, and {n} {cn} in the background.",
    "{o} {noun} {p}. it is {t}. {n} {cn} are scattered around.",
]


def _position_phrase(row: str, col: str, rng: np.random.Generator) -> str:
    if row == "middle" and col == "centre":
        return str(rng.choice(["in the centre", "in the middle", "at the centre of the image"]))
    r = str(rng.choice(_ROW_WORDS[row]))
    c = str(rng.choice(_COL_WORDS[col]))
    style = int(rng.integers(0, 3))
    if style == 0:
        return f"in the {r} {c}"
    if style == 1:
        return f"at the {r} {c} of the image"
    return f"in the {r} {c} area"


def glyphlab_facts(params: Dict[str, np.ndarray], size: int) -> List[Dict[str, Any]]:
    """The reported facts of each scene from the generator's parameters.

    ``params`` is the dict of :func:`contrastkit.data.glyphlab.render_scenes` (``angle`` in
    degrees counter-clockwise from +x with y up, ``cx``/``cy`` column/row of the bar centre in
    pixels, ``thickness`` in pixels, ``n_distractors``). Returns one dict per scene with keys
    ``orientation`` (vertical/horizontal/rising/falling), ``row`` (top/middle/bottom),
    ``col`` (left/centre/right), ``thickness`` (thin/medium/thick), ``clutter`` (int).
    """
    s = float(size)
    lo, hi = (v * s / 32.0 for v in GLYPH_THICKNESS_RANGE)
    facts = []
    for angle, cx, cy, thick, n in zip(params["angle"], params["cx"], params["cy"], params["thickness"],
                                       params["n_distractors"]):
        a = float(angle) % 180.0
        # Classes sit at 0, 45, 90, 135 degrees (+- jitter < 20): nearest of the four.
        nearest = min((abs(a - c), c) for c in (0.0, 45.0, 90.0, 135.0, 180.0))[1]
        orientation = {0.0: "horizontal", 180.0: "horizontal", 45.0: "rising", 90.0: "vertical",
                       135.0: "falling"}[nearest]
        third = (hi - lo) / 3.0
        thickness = "thin" if thick < lo + third else ("medium" if thick < lo + 2 * third else "thick")
        row = ["top", "middle", "bottom"][min(2, int(3 * float(cy) / s))]
        col = ["left", "centre", "right"][min(2, int(3 * float(cx) / s))]
        facts.append(dict(orientation=orientation, row=row, col=col, thickness=thickness, clutter=int(n)))
    return facts


def glyphlab_report(facts: Dict[str, Any], rng: np.random.Generator) -> str:
    """One text report stating ``facts`` (see :func:`glyphlab_facts`), phrasing drawn from ``rng``."""
    template = _TEMPLATES[int(rng.integers(0, len(_TEMPLATES)))]
    n = int(facts["clutter"])
    count = _NUMBER_WORDS[n] if (rng.random() < 0.5 and n < len(_NUMBER_WORDS)) else str(n)
    return template.format(
        o=rng.choice(_ORIENTATION_PHRASES[facts["orientation"]]),
        t=rng.choice(_THICKNESS_PHRASES[facts["thickness"]]),
        p=_position_phrase(facts["row"], facts["col"], rng),
        n=count, noun=rng.choice(_NOUNS), cn=rng.choice(_CLUTTER_NOUNS),
    )


#: Zero-shot prompts for GlyphLab's three orientation classes (vocabulary of the reports).
GLYPHLAB_PROMPTS = {
    "vertical": ["a vertical bar", "a vertical stroke", "a vertical line", "a vertically oriented glyph"],
    "horizontal": ["a horizontal bar", "a horizontal stroke", "a horizontal line", "a horizontally oriented glyph"],
    "diagonal": ["a rising diagonal bar", "a falling diagonal bar", "a rising diagonal stroke",
                 "a falling diagonal stroke"],
}


def _text_stream(seed: int, index: int) -> np.random.Generator:
    # Keyed apart from GlyphLab's own streams (spawn keys 0..2 of SeedSequence(seed)).
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(1000 + index,)))


def load_glyphlab_text(seed: int = 0, *, train_scenes: int = 1200, val_scenes: int = 200, test_scenes: int = 300,
                       size: int = 32, realisations: int = 2, noise: float = 0.15, jitter: float = 8.0,
                       clutter: Tuple[int, int] = (2, 5)) -> PairedDataset:
    """GlyphLab scenes paired with generated reports (deterministic from ``seed``).

    Options are those of :func:`contrastkit.data.glyphlab.load_glyphlab` (defaults differ in
    the scene counts: 1200 / 200 / 300, since image-text training needs more pairs than the
    120-scene probe experiment). Pair ``i`` of a split is scene ``i``: its realisation 0 (all
    realisations are kept in ``realisations``) and one report; labels are the orientation
    class (vertical / horizontal / diagonal).
    """
    from contrastkit.data.glyphlab import clean_scenes, load_glyphlab

    base = load_glyphlab(seed, train_scenes=train_scenes, val_scenes=val_scenes, test_scenes=test_scenes,
                         size=size, realisations=realisations, noise=noise, jitter=jitter, clutter=clutter)
    counts = dict(train=train_scenes, val=val_scenes, test=test_scenes)
    splits: Dict[str, PairedSplit] = {}
    for index, (key, split) in enumerate(base.splits()):
        _, labels, params = clean_scenes(seed, key, counts[key], size=size, jitter=jitter, clutter=clutter)
        if not np.array_equal(labels, split.labels.numpy()):  # the two draws must be the same scenes
            raise RuntimeError(f"glyphlab-text: scene parameters of the {key} split do not match its images")
        facts = glyphlab_facts(params, size)
        rng = _text_stream(seed, index)
        texts = [glyphlab_report(f, rng) for f in facts]
        splits[key] = PairedSplit(images=split.images, texts=texts, labels=split.labels,
                                  realisations=split.realisations, groups=split.groups, facts=facts)
    return PairedDataset(name="glyphlab-text", train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=list(base.class_names), class_prompts=dict(GLYPHLAB_PROMPTS),
                         source="glyphlab")


# ----------------------------------------------------------------------------------------
# digits texts

_DIGIT_TEMPLATES = ["a handwritten {w}", "the digit {d}", "the number {w}", "a {w}", "digit {d}, written by hand",
                    "an image of a {w}", "handwritten digit {d}", "{w}"]


def digit_text(digit: int, rng: np.random.Generator) -> str:
    """A short text naming ``digit`` (0..9), phrasing drawn from ``rng``."""
    template = _DIGIT_TEMPLATES[int(rng.integers(0, len(_DIGIT_TEMPLATES)))]
    return template.format(w=_NUMBER_WORDS[digit], d=digit)


def load_digits_text(seed: int = 0, *, size: int = 32, val_fraction: float = 0.15, test_fraction: float = 0.25,
                     split_seed: int = 0) -> PairedDataset:
    """scikit-learn's digits paired with short texts naming the digit (deterministic from ``seed``).

    The split is :func:`contrastkit.data.digits.load_digits`'s (stratified, ``split_seed``).
    """
    from contrastkit.data.digits import load_digits

    base = load_digits(size=size, val_fraction=val_fraction, test_fraction=test_fraction, split_seed=split_seed)
    splits = {}
    for index, (key, split) in enumerate(base.splits()):
        rng = _text_stream(seed, index)
        texts = [digit_text(int(d), rng) for d in split.labels.tolist()]
        splits[key] = PairedSplit(images=split.images, texts=texts, labels=split.labels)
    prompts = {str(d): [f"the digit {d}", f"a handwritten {_NUMBER_WORDS[d]}", f"the number {_NUMBER_WORDS[d]}"]
               for d in range(10)}
    return PairedDataset(name="digits-text", train=splits["train"], val=splits["val"], test=splits["test"],
                         class_names=list(base.class_names), class_prompts=prompts, source="digits")
