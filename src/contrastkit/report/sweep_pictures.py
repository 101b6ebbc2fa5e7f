"""The pictures of a temperature sweep's report: per ``tau``, the neighbors of the same held-out
queries and the batch diagnostics, side by side.

One run per temperature is shown: the first loss of ``sweep.csv`` (NT-Xent) at its lowest seed,
so the columns differ in ``tau`` alone. Every run of a sweep trains on the same data, so the
held-out sample and its queries (:mod:`.pictures`) are drawn once, from the first of them, and
each run's trained encoder is applied to the same images; the random-init encoder (the same
network at the first run's initialisation) is the reference column.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from contrastkit import layout
from contrastkit.records import STEP

from .document import Page
from .figures import diagnostics_by_tau_figure
from .images import PICTURE_CSS, thumbnail
from .pictures import PICTURE_ERRORS, HeldOutPictures, encode, held_out_pictures, nearest
from .reading import number, read_metrics

__all__ = ["sweep_picture_sections", "runs_per_tau", "SWEEP_NEIGHBORS"]

#: Neighbors per query and temperature (fewer than a run's report: the columns sit side by side).
SWEEP_NEIGHBORS = 4


def runs_per_tau(folder: Path, rows: Sequence[Dict[str, Any]]) -> List[Tuple[float, Path]]:
    """``(tau, run folder)`` of one finished run per temperature: the first loss of the table
    (in its order) at its lowest seed, whose folder holds a checkpoint; by increasing ``tau``."""
    losses = [str(r.get("loss")) for r in rows if number(r.get("tau")) is not None]
    if not losses:
        return []
    first = losses[0]
    chosen: Dict[float, Tuple[float, Path]] = {}
    for row in rows:
        tau, seed = number(row.get("tau")), number(row.get("seed"))
        if str(row.get("loss")) != first or tau is None or not row.get("run"):
            continue
        run = folder / layout.RUNS / str(row["run"])
        if not os.path.isfile(layout.RunFolder(run).last_checkpoint):
            continue
        key = seed if seed is not None else 0.0
        if tau not in chosen or key < chosen[tau][0]:
            chosen[tau] = (key, run)
    return [(tau, run) for tau, (_, run) in sorted(chosen.items())]


def _cell(held: HeldOutPictures, query: int, features: np.ndarray, k: int, encoder: str) -> Tuple[str, int]:
    label = held.label(query)
    same = 0
    images = []
    for position in nearest(features, query, k):
        match = label is not None and held.label(position) == label
        same += match
        index = int(held.indices[position])
        images.append(thumbnail(held.images[position], alt=f"{held.split} image {index}",
                                title=f"{encoder}: {held.label_name(position)} (cosine "
                                      f"{float(features[position] @ features[query]):.3f})",
                                attributes={"split": held.split, "index": index, "encoder": encoder},
                                css_class="thumb small same" if match else "thumb small other"))
    note = f'<div class="note">{same}/{k}</div>' if label is not None else ""
    return f'<td class="gap"><div class="mini">{"".join(images)}</div>{note}</td>', same


def _precision(held: HeldOutPictures, features: np.ndarray, k: int) -> Optional[float]:
    if held.labels is None or len(held.labels) <= k:
        return None
    similarity = features @ features.T
    np.fill_diagonal(similarity, -np.inf)
    top = np.argpartition(-similarity, k, axis=1)[:, :k]
    return float((held.labels[top] == held.labels[:, None]).mean())


SWEEP_CSS = """
img.thumb.small { width: 44px; height: 44px; border-width: 2px; }
.mini { display: grid; grid-template-columns: repeat(2, 44px); gap: 3px; }
"""


def sweep_picture_sections(page: Page, folder: Path, rows: Sequence[Dict[str, Any]]) -> None:
    """The neighbors of the same queries per temperature and the batch diagnostics per
    temperature (nothing when no run of the sweep has a checkpoint)."""
    runs = runs_per_tau(folder, rows)
    if not runs:
        return
    page.add_style(PICTURE_CSS)
    page.add_style(SWEEP_CSS)
    _neighbors_by_tau(page, runs)
    _diagnostics_by_tau(page, runs)


def _neighbors_by_tau(page: Page, runs: List[Tuple[float, Path]]) -> None:
    from contrastkit.train.runs import load_run
    from contrastkit.train.setup import limit_threads, resolve_device

    k = SWEEP_NEIGHBORS
    try:
        held = held_out_pictures(str(runs[0][1]), with_map=False)
        device = resolve_device("auto")
        columns: List[Tuple[str, np.ndarray]] = []
        if held.untrained is not None:
            columns.append(("random init", held.untrained))
        for tau, run in runs:
            saved = load_run(str(run))
            with limit_threads(saved.config.threads):
                features = held.trained if run == runs[0][1] else encode(saved, held.images, device)
            columns.append((f"τ = {tau:g}", features))
    except PICTURE_ERRORS as err:
        page.section("Neighbors per temperature", page.paragraph(
            f"no pictures of held-out images: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            "warning"), section_id="neighbors-by-tau")
        return
    header = ["query"] + [name for name, _ in columns]
    precision = [_precision(held, features, k) for _, features in columns]
    body = []
    for query in held.queries:
        index = int(held.indices[query])
        cells = [f'<th scope="row"><figure>{thumbnail(held.images[query], alt=f"{held.split} image {index}", attributes={"split": held.split, "index": index}, css_class="thumb anchor")}'
                 f"<figcaption>{html.escape(held.label_name(query) or 'query')}</figcaption></figure></th>"]
        for name, features in columns:
            cells.append(_cell(held, query, features, k, name)[0])
        body.append("<tr>" + "".join(cells) + "</tr>")
    footer = ""
    if any(p is not None for p in precision):
        footer = ('<tr><th scope="row" class="note">same class, all images</th>'
                  + "".join(f'<td class="gap num">{"–" if p is None else f"{p:.3f}"}</td>' for p in precision) + "</tr>")
    table = ('<div class="scroll"><table class="pictures" id="neighbors-by-tau-table"><thead><tr>'
             + "".join(f'<th scope="col">{html.escape(h)}</th>' for h in header) + "</tr></thead><tbody>"
             + "".join(body) + footer + "</tbody></table></div>")
    names = ", ".join(f"τ = {tau:g}: {run.name}" for tau, run in runs)
    page.section("Neighbors per temperature: the same queries, side by side",
                 page.paragraph(f"{len(held.queries)} fixed query images of the {held.split} split and their {k} "
                                f"nearest neighbors among the same {len(held.indices)} {held.split} images under each "
                                f"temperature's trained encoder (runs {names}) and under the random-init encoder "
                                "(cosine similarity of h). A neighbor of the query's class has a green frame; the "
                                f"last row is the share of same-class neighbors over all {len(held.indices)} images."),
                 table, section_id="neighbors-by-tau")


DIAGNOSTIC_COLUMNS = (("mean p+", "positive_probability", 3), ("lowest p+", "min_positive_probability", 3),
                      ("effective negatives", "effective_negatives", 1), ("positive similarity", "positive_similarity", 3),
                      ("hardest negative similarity", "hardest_negative_similarity", 3),
                      ("mean negative similarity", "negative_similarity", 3))


def _diagnostics_by_tau(page: Page, runs: List[Tuple[float, Path]]) -> None:
    series: Dict[float, List[Dict[str, Any]]] = {}
    table = []
    for tau, run in runs:
        path = Path(layout.RunFolder(run).metrics)
        records = [r for r in (read_metrics(path)[0] if path.is_file() else []) if r.get("kind") == STEP]
        series[tau] = records
        last = next((r for r in reversed(records) if number(r.get("positive_probability")) is not None), None)
        if last is None:
            continue
        warnings = sorted({kind for r in records for kind in (r.get("warnings") or [])})
        row: List[Any] = [f"{tau:g}", run.name, int(last.get("step", 0))]
        for _, key, digits in DIAGNOSTIC_COLUMNS:
            value = number(last.get(key))
            row.append("–" if value is None else f"{value:.{digits}f}" + (
                f" of {int(last['negatives'])}" if key == "effective_negatives" and last.get("negatives") else ""))
        row.append(", ".join(warnings) or "–")
        table.append(row)
    if not table:
        return
    parts = [page.table(["τ", "run", "step"] + [label for label, _, _ in DIAGNOSTIC_COLUMNS] + ["warnings"], table,
                        numeric=[True, False, True] + [True] * len(DIAGNOSTIC_COLUMNS) + [False],
                        caption="The last logged step's batch diagnostics of each temperature's run (metrics.jsonl): "
                                "at a low τ the hardest negatives take the penalty (few effective negatives), at a "
                                "high τ every negative weighs the same.")]
    figure = diagnostics_by_tau_figure(series)
    if figure is not None:
        parts.append(page.figure(figure, "Mean p+ and mean effective number of negatives of each logged step's own "
                                         "batch, one line per temperature.", "batch diagnostics per temperature"))
    page.section("Batch diagnostics per temperature", *parts, section_id="diagnostics-by-tau")
