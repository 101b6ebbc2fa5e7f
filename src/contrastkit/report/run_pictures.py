"""The pictures of a run's report: what the model was shown, what it learned and what the
temperature did, on the run's own images.

* **Views** (:func:`views_section`): training images with the two augmented views the run made
  of them (an image with its text for image-text pairs), from ``RUN/last_batch.pt``.
* **Neighbors** (:func:`neighbors_section`): fixed held-out queries and their nearest held-out
  images under the trained encoder, next to the random-init encoder's; a neighbor of the
  query's class is marked.
* **Map** (:func:`map_section`): a 2-D t-SNE map of the held-out sample, coloured by class,
  with thumbnails for a sample of points.
* **One real batch** (:func:`batch_section`): the last training batch's similarity matrix,
  each anchor's ``p+`` and effective number of negatives at the run's ``tau``, and the anchor
  with the lowest ``p+`` with its hardest negatives as images.

The held-out data come from :mod:`.pictures`; every ``<img>`` names the image it shows in its
``data-split`` / ``data-index`` (and ``data-view``) attributes.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

import numpy as np

from contrastkit.metrics.batch import IMAGE, QUEUED, TEXT, VIEW_A, VIEW_B
from contrastkit.records import STEP

from .document import Page, fmt
from .figures import batch_figure, map_figure
from .images import thumbnail, to_hwc
from .pictures import NEIGHBORS, HeldOutPictures

__all__ = ["views_section", "neighbors_section", "map_section", "batch_section", "warnings_section",
           "MAP_THUMBNAILS", "VIEW_NAMES"]

#: Points of the map drawn as thumbnails (evenly over the sample).
MAP_THUMBNAILS = 40
#: How a row or column of a batch is named in captions.
VIEW_NAMES = {VIEW_A: "view A", VIEW_B: "view B", IMAGE: "image", TEXT: "text", QUEUED: "queued key"}


def _figure_html(image_html: str, caption: str) -> str:
    """An image with its caption; `` · `` in the caption starts a new line."""
    lines = "<br>".join(html.escape(part) for part in caption.split(" · "))
    return f"<figure>{image_html}<figcaption>{lines}</figcaption></figure>"


# ------------------------------------------------------------------------------ views

def views_section(page: Page, batch: Any) -> None:
    """The first elements of the last training batch with their views (or image and text)."""
    tiles = []
    paired = batch.text(batch.shown[0]) is not None if batch.shown else False
    for item in batch.shown:
        index = int(batch.indices[item])
        label = batch.label_name(item)
        parts = []
        source = batch.source(item)
        if source is not None and not paired:
            parts.append(_figure_html(thumbnail(source, alt=f"training image {index}",
                                                attributes={"split": "train", "index": index, "view": "source"},
                                                css_class="thumb big"), "image"))
        for view in (VIEW_A, VIEW_B, IMAGE):
            picture = batch.picture(item, view)
            if picture is not None:
                name = VIEW_NAMES[view]
                parts.append(_figure_html(thumbnail(picture, alt=f"{name} of training image {index}",
                                                    attributes={"split": "train", "index": index, "view": name},
                                                    css_class="thumb big"), name if not paired else "image"))
        text = batch.text(item)
        caption = f"train #{index}" + (f" · {label}" if label else "")
        if text is not None:
            caption += f" · “{text}”"
        tiles.append(f'<div class="tile"><div class="row">{"".join(parts)}</div>'
                     f'<div class="cap">{html.escape(caption)}</div></div>')
    if not tiles:
        return
    what = ("each image with the text it is paired with" if paired else
            "each training image with the two augmented views the run made of it at that step, as the model saw them")
    page.section("Views: what the model was shown",
                 page.paragraph(f"The first {len(tiles)} elements of the run's last training batch (step "
                                f"{batch.step}; batches are shuffled, so these are random training images): {what}."),
                 f'<div class="tiles">{"".join(tiles)}</div>', section_id="views")


# ------------------------------------------------------------------------------ neighbors

def _held_thumb(held: HeldOutPictures, position: int, css: str, title: str = "") -> str:
    index = int(held.indices[position])
    return thumbnail(held.images[position], alt=f"{held.split} image {index}", title=title,
                     attributes={"split": held.split, "index": index}, css_class=css)


def _precision(held: HeldOutPictures, features: Optional[np.ndarray], k: int = NEIGHBORS) -> Optional[float]:
    """Share of the ``k`` nearest neighbors of every sample image that share its class."""
    if features is None or held.labels is None or len(held.labels) <= k:
        return None
    similarity = features @ features.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = np.argpartition(-similarity, k, axis=1)[:, :k]
    return float((held.labels[nearest] == held.labels[:, None]).mean())


def _neighbor_cells(held: HeldOutPictures, query: int, neighbors: Sequence[int], features: np.ndarray,
                     encoder: str) -> str:
    """The ``<td>`` of one query's neighbors under one encoder (same class marked)."""
    label = held.label(query)
    cells = []
    same = 0
    for position in neighbors:
        similarity = float(features[position] @ features[query])
        match = label is not None and held.label(position) == label
        same += match
        name = held.label_name(position)
        caption = (("✓ " if match else "") + (name or "")).strip() or f"#{int(held.indices[position])}"
        cells.append(_figure_html(_held_thumb(held, position, "thumb same" if match else "thumb other",
                                              f"{encoder}: cosine {similarity:.3f}"), caption))
    count = f'<div class="note">{same}/{len(neighbors)} same class</div>' if label is not None else ""
    return f'<td class="gap"><div class="strip">{"".join(cells)}</div>{count}</td>'


def neighbors_section(page: Page, held: HeldOutPictures, *, note: str = "") -> None:
    """Each query's nearest held-out images under the trained and the random-init encoder."""
    trained = held.neighbors(True)
    untrained = held.neighbors(False)
    rows = []
    for q, query in enumerate(held.queries):
        name = held.label_name(query)
        cells = [f'<th scope="row">{_figure_html(_held_thumb(held, query, "thumb big anchor"), name or "query")}</th>',
                 _neighbor_cells(held, query, trained[q], held.trained, "trained")]
        if untrained:
            cells.append(_neighbor_cells(held, query, untrained[q], held.untrained, "random init"))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    header = ["query", f"{NEIGHBORS} nearest, trained encoder"] + (
        [f"{NEIGHBORS} nearest, random-init encoder"] if untrained else [])
    table = ('<div class="scroll"><table class="pictures"><thead><tr>'
             + "".join(f'<th scope="col">{html.escape(h)}</th>' for h in header) + "</tr></thead><tbody>"
             + "".join(rows) + "</tbody></table></div>")
    parts = [page.paragraph(f"{len(held.queries)} fixed query images of the {held.split} split and their "
                            f"{NEIGHBORS} nearest neighbors among a sample of {len(held.indices)} {held.split} images "
                            "(cosine similarity of the encoder's output h, what the probe reads)"
                            + ("; a neighbor of the query's class has a green frame and a ✓" if held.labels is not None
                               else "") + "." + (f" {note}" if note else ""))]
    trained_precision = _precision(held, held.trained)
    if trained_precision is not None:
        base = _precision(held, held.untrained)
        parts.append(page.cards([("same-class neighbors, trained", trained_precision,
                                  f"share of the {NEIGHBORS} nearest, over all {len(held.indices)} sample images"),
                                 ("same-class neighbors, random init", base if base is not None else "–",
                                  "the same network at its initialisation")]))
    parts.append(table)
    page.section("Neighbors: what the encoder finds similar", *parts, section_id="neighbors")


# ------------------------------------------------------------------------------ map

def map_section(page: Page, held: HeldOutPictures) -> None:
    """The t-SNE map of the held-out sample, coloured by class, with thumbnails for a sample."""
    if held.embedding is None:
        return
    n = len(held.indices)
    chosen = sorted({int(round(i * (n - 1) / max(MAP_THUMBNAILS - 1, 1))) for i in range(min(MAP_THUMBNAILS, n))})
    thumbs = [(position, to_hwc(held.images[position])) for position in chosen]
    figure = map_figure(held.embedding, None if held.labels is None else held.labels.tolist(), held.class_names,
                        thumbs, held.map_method)
    caption = (f"{held.map_method} (scikit-learn) of the trained encoder's h for {n} {held.split} images"
               + (", coloured by class" if held.labels is not None else "")
               + f"; {len(chosen)} of them drawn as thumbnails. Nearby points are images the encoder finds "
                 "similar; the axes and the distances between far clusters carry no meaning.")
    page.section("Map: the held-out images as the encoder arranges them",
                 page.figure(figure, caption, f"{held.map_method} map of held-out embeddings"),
                 f'<p class="note" data-map-points="{n}" data-map-method="{html.escape(held.map_method)}" '
                 f'data-map-thumbnails="{len(chosen)}">Thumbnails: {html.escape(held.split)} images '
                 + ", ".join(f"#{int(held.indices[p])}" for p in chosen) + ".</p>",
                 section_id="map")


# ------------------------------------------------------------------------------ one real batch

def _candidate_figure(batch: Any, row: int, column: int, caption: str, css: str) -> str:
    item, view = batch.column_item(row, column)
    if view == TEXT:
        text = batch.text(item) or "(text)"
        return (f'<figure class="text-candidate" data-split="train" data-index="{int(batch.indices[item])}" '
                f'data-view="text"><div class="tile" style="max-width:12rem">{html.escape(text)}</div>'
                f'<figcaption>{"<br>".join(html.escape(p) for p in caption.split(" · "))}</figcaption></figure>')
    picture = batch.picture(item, view) if item >= 0 else None
    if picture is None:
        what = "a queued key of an earlier step (no image)" if view == QUEUED else "not kept"
        return f'<figure><div class="tile" style="width:80px;height:80px">{html.escape(what)}</div>' \
               f'<figcaption>{"<br>".join(html.escape(p) for p in caption.split(" · "))}</figcaption></figure>'
    index = int(batch.indices[item])
    name = VIEW_NAMES.get(view, "")
    label = batch.label_name(item)
    return _figure_html(thumbnail(picture, alt=f"{name} of training image {index}", css_class=f"thumb big {css}",
                                  attributes={"split": "train", "index": index, "view": name}),
                        caption + (f" · {label}" if label else ""))


def batch_section(page: Page, batch: Any, *, explorer_link: Optional[str] = None) -> None:
    """The last training batch: the matrix, each anchor's p+ and e^H, the lowest-p+ anchor."""
    if batch.similarities is None:
        page.section("One real batch", page.paragraph(
            f"The last batch ({batch.shape[0]} x {batch.shape[1]} similarities) was too large to keep; "
            "see the batch diagnostics in the training curves."), section_id="batch")
        return
    e = batch.explanation()
    p_positive = e.positive_probability
    lowest = int(batch.anchors.get("lowest", int(np.argmin(p_positive))))
    negatives = int(e.in_denominator[0].sum()) - 1
    figure = batch_figure(batch.similarities.numpy(), batch.positive.tolist(), batch.exclude_diagonal,
                          p_positive.tolist(), e.effective_negatives.tolist(), negatives, lowest, batch.temperature)
    m, k = batch.shape
    parts = [page.paragraph(f"The run's last training batch (step {batch.step}, method {batch.method}): "
                            f"{batch.description}. At the run's τ = {batch.temperature:.4g} each anchor's loss is "
                            "a choice of its positive among its candidates (the course page P10): p+ is the "
                            "probability the softmax gives the positive, e^H the effective number of negatives, the "
                            "exponential of the entropy of Wang & Liu's (2021) penalty distribution over them (1: "
                            f"only the hardest negative counts; {negatives}: all weigh the same)."),
             page.cards([("mean p+", float(p_positive.mean()), f"over {m} anchors; lowest {p_positive.min():.3f}"),
                         ("mean effective negatives", float(e.effective_negatives.mean()), f"of {negatives}"),
                         ("mean loss", float(e.losses.mean()), f"log of {negatives + 1} candidates: "
                                                                f"{float(e.log_n[0]):.3f}"),
                         ("τ", batch.temperature, f"step {batch.step}")]),
             page.figure(figure, "Left: the batch's cosine similarities, positives circled, the lowest-p+ anchor's row "
                                 "marked. Right: each anchor's p+ against its effective number of negatives.",
                         "similarity matrix and per-anchor p+ against effective negatives")]
    row = lowest
    positive = int(e.positive[row])
    negative_columns = [int(c) for c in np.argsort(-np.where(e.in_denominator[row] & (np.arange(k) != positive),
                                                             e.similarities[row], -np.inf), kind="stable")[:8]]
    item, view = batch.row_item(row)
    strip = [_candidate_figure_row(batch, row, item, view),
             _candidate_figure(batch, row, positive, f"positive · s {e.similarities[row, positive]:.3f} · "
                                                     f"p {e.probabilities[row, positive]:.3f}", "positive")]
    strip += [_candidate_figure(batch, row, c, f"s {e.similarities[row, c]:.3f} · p {e.probabilities[row, c]:.3f} · "
                                               f"r {e.penalty[row, c]:.2f}", "negative") for c in negative_columns]
    parts.append("<h3>The anchor with the lowest p+ and its hardest negatives</h3>"
                 + page.paragraph(f"Anchor {row}: p+ = {p_positive[row]:.4f}, loss {e.losses[row]:.3f}, effective "
                                  f"negatives {e.effective_negatives[row]:.2f}. Under each candidate: its similarity s, "
                                  "its probability p and, for a negative, its share r of the penalty (how much of the "
                                  "gradient on the negatives it takes).")
                 + f'<div class="strip" id="lowest-anchor">{"".join(strip)}</div>')
    if explorer_link:
        parts.append(f'<p><a href="{html.escape(explorer_link, quote=True)}">Open the lowest, median and highest-p+ '
                     "anchors of this batch in the temperature explorer</a> (move τ and see what it does to these "
                     "real rows).</p>")
    page.section("One real batch: what the temperature does", *parts, section_id="batch")


def _candidate_figure_row(batch: Any, row: int, item: int, view: int) -> str:
    picture = batch.picture(item, view)
    if picture is None:
        return f'<figure><div class="tile">anchor {row}</div></figure>'
    index = int(batch.indices[item])
    name = VIEW_NAMES.get(view, "")
    label = batch.label_name(item)
    return _figure_html(thumbnail(picture, alt=f"anchor: {name} of training image {index}", css_class="thumb big anchor",
                                  attributes={"split": "train", "index": index, "view": name}),
                        f"anchor · {name}" + (f" · {label}" if label else ""))


# ------------------------------------------------------------------------------ warnings

def warnings_section(page: Page, records: Sequence[dict]) -> None:
    """The failures the batch diagnostics showed during training, each with its first and last step."""
    from contrastkit.metrics.batch import WARNINGS

    seen = {}
    for record in records:
        if record.get("kind") != STEP:
            continue
        for kind in record.get("warnings") or []:
            first, last, count = seen.get(kind, (record.get("step"), record.get("step"), 0))
            seen[kind] = (first, record.get("step"), count + 1)
    if not seen:
        return
    logged = sum(1 for r in records if r.get("kind") == STEP)
    items = "".join(f'<li data-warning="{html.escape(kind)}">{page.badge("warning", "bad")} '
                    f"{html.escape(WARNINGS.get(kind, kind))}: at {count} of {logged} logged steps "
                    f"(steps {fmt(first)} to {fmt(last)})</li>" for kind, (first, last, count) in seen.items())
    page.section("Warnings from the batch diagnostics",
                 page.paragraph("Read from each logged step's own batch (metrics.jsonl); see the batch panels of the "
                                "training curves.", "warning"),
                 f'<ul class="warnings">{items}</ul>', section_id="warnings")
