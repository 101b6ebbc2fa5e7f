"""The report page of a pretraining run (``contrastkit pretrain``): its result, the warnings of
its batch diagnostics, the read-out against the baselines, the pictures of its own images
(views, neighbors, map, one real batch: :mod:`.run_pictures`), the training curves, the
representation metrics, everything else in ``summary.json``, and the configuration. Each
section is one function; a section the run has no data for is left out."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from contrastkit import layout, records

from .document import Page, fmt
from .images import PICTURE_CSS
from .figures import geometry_figure, profile_figure, readout_figure, tau_histogram_figure, training_figure
from .reading import BASELINES, READOUTS, REPRESENTATION_KEYS, number, read_metrics
from .run_pictures import batch_section, map_section, neighbors_section, views_section, warnings_section
from .sections import MAX_TABLE_ROWS, report_page, settings_pairs

__all__ = ["RunFiles", "read_run", "run_page"]


@dataclass
class RunFiles:
    """What a run folder holds; a file not written yet reads as empty."""

    summary: Dict[str, Any]  # summary.json
    config: Dict[str, Any]  # config.json's "config" (or the whole file, if it has no such key)
    derived: Dict[str, Any]  # config.json's "derived"
    records: List[Dict[str, Any]]  # metrics.jsonl
    unreadable_lines: int  # of metrics.jsonl
    has_metrics: bool  # whether metrics.jsonl exists (it may have no records yet)


def read_run(folder: Path) -> RunFiles:
    """Read the run's summary, configuration and metrics; ValueError if a JSON file holds no object."""
    run = layout.RunFolder(folder)
    summary = records.read_summary(run.summary) if os.path.isfile(run.summary) else None
    stored = layout.read_run_record(folder) if os.path.isfile(run.config) else None
    lines, bad_lines = read_metrics(Path(run.metrics)) if os.path.isfile(run.metrics) else ([], 0)
    if stored is not None and not isinstance(stored, dict):
        raise ValueError(f"{folder / layout.CONFIG} must hold a JSON object")
    config = (stored or {}).get("config", stored or {})
    derived = (stored or {}).get("derived", {}) if isinstance(stored, dict) else {}
    return RunFiles(summary or {}, config, derived, lines, bad_lines, os.path.isfile(run.metrics))


def run_page(folder: Path, *, pictures: bool = True, explorer_link: Optional[str] = None) -> Page:
    """The report page of the run folder ``folder``; ``pictures``: with the pictures of its
    images (they read its checkpoint and data); ``explorer_link``: where the explorer page on
    its last batch is, relative to the page."""
    run = read_run(folder)
    method = run.summary.get("method", run.config.get("method", "?"))
    data = run.summary.get("data", run.config.get("data", "?"))
    page = report_page(f"Pretraining run: {method} on {data}", folder)
    _result_section(page, run)
    warnings_section(page, run.records)
    _readout_section(page, run.summary)
    if pictures:
        _picture_sections(page, folder, explorer_link)
    _training_section(page, run)
    _representation_section(page, run.summary)
    _summary_section(page, run.summary)
    _configuration_section(page, run)
    return page


def _picture_sections(page: Page, folder: Path, explorer_link: Optional[str]) -> None:
    """Views, neighbors, map and one real batch, from the run's last batch, checkpoint and data
    (a run without a checkpoint has none of them; one whose data cannot be read says why)."""
    from contrastkit.train.last_batch import read_last_batch

    started = time.perf_counter()
    notes = []
    try:
        batch = read_last_batch(str(folder))
    except ValueError as err:
        batch, notes = None, [str(err)]
    held = None
    if os.path.isfile(layout.RunFolder(folder).last_checkpoint):
        from .pictures import PICTURE_ERRORS, held_out_pictures

        try:
            held = held_out_pictures(str(folder))
        except PICTURE_ERRORS as err:
            notes.append(f"no pictures of held-out images: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
    if batch is None and held is None and not notes:
        return
    page.add_style(PICTURE_CSS)
    for note in notes:
        page.section("Pictures", page.paragraph(note, "warning"), section_id="pictures-note")
    if batch is not None:
        views_section(page, batch)
    if held is not None:
        neighbors_section(page, held)
        map_section(page, held)
    if batch is not None:
        batch_section(page, batch, explorer_link=explorer_link)
    page.timings["pictures"] = time.perf_counter() - started


def _result_section(page: Page, run: RunFiles) -> None:
    """The headline numbers and whether the encoder beats both baselines; a note if unfinished."""
    if not run.summary:
        page.section("Result", page.paragraph("No summary.json yet: the run has not finished its evaluation. "
                                              "The curves below show its progress so far.", "warning"),
                     section_id="result")
        return
    summary = run.summary
    parts = [page.cards(_headline_cards(summary, run.config))]
    judged = [("beats_baselines", "on the linear probe (test split), same probe for all three.")]
    if records.VIEW_RETRIEVAL_TOP1 in summary:  # without labels: judged by view retrieval
        judged.insert(0, ("beats_baselines_view_retrieval", "on view retrieval top-1 (two views of the held-out "
                                                            "test images), same views for all three."))
    for key, note in judged:
        if summary.get(key) is not None:  # None: a run without baselines (or without labels)
            parts.append("<p>" + (page.badge("beats both baselines", "good") if summary[key]
                                  else page.badge("does not beat both baselines", "bad"))
                         + f" <span class=\"note\">{note}</span></p>")
    page.section("Result", *parts, section_id="result")


def _headline_cards(summary: Dict[str, Any], config: Dict[str, Any]) -> List[Tuple[str, Any, str]]:
    """``(label, value, note)`` of each headline number the summary has."""
    cards = []
    for label, key in (("view retrieval top-1", records.VIEW_RETRIEVAL_TOP1),
                       ("linear probe accuracy", records.PROBE_ACCURACY)):
        value = number(summary.get(key))
        if value is not None:  # the read-out a run is judged by, its baselines' numbers beside it
            base = [f"{name.split()[0]} {fmt(summary.get(records.baseline_key(key, baseline)), 3)}"
                    for name, baseline in BASELINES[1:]
                    if number(summary.get(records.baseline_key(key, baseline))) is not None]
            cards.append((label, value, " · ".join(base) or "no baselines in this run"))
    if number(summary.get(records.KNN_ACCURACY)) is not None:
        cards.append(("kNN accuracy", summary[records.KNN_ACCURACY], f"weighted, k = {config.get('knn_k', '?')}"))
    if number(summary.get("final_loss")) is not None:
        cards.append(("final training loss", summary["final_loss"], "mean over the last epoch"))
    if number(summary.get("final_temperature")) is not None:
        cards.append(("final temperature τ", summary["final_temperature"],
                      str(summary.get("temperature_method") or summary.get("temperature_schedule") or
                          ("learnable" if config.get("learnable_temperature") else "fixed"))))
    if summary.get("epochs") is not None:
        cards.append(("epochs · steps", f"{summary.get('epochs')} · {summary.get('steps', '?')}", ""))
    if number(summary.get("train_seconds")) is not None:
        speed = number(summary.get("images_per_second"))
        cards.append(("training time (s)", summary["train_seconds"],
                      f"{speed:.0f} images/s" if speed is not None else ""))
    return cards


#: Which way is better on each row of the label-free read-out (``max`` / ``min``); a row not
#: here (the effective rank, the held-out loss of different encoders) has no best.
_LABEL_FREE_BETTER = {records.VIEW_RETRIEVAL_TOP1: max, "view_retrieval_top5": max, "alignment": min,
                      "uniformity": min}


def _label_free_section(page: Page, summary: Dict[str, Any]) -> None:
    """The read-out without labels (view retrieval, alignment, uniformity, effective rank,
    held-out loss) for the encoder and the baselines, the best marked where a row has one, and
    the verdict line the results table prints."""
    from contrastkit.metrics.readout import LABEL_FREE_ROWS

    rows, best = [], []
    for label, key in LABEL_FREE_ROWS:
        values = [number(summary.get(records.baseline_key(key, baseline))) for _, baseline in BASELINES]
        if all(v is None for v in values):
            continue
        rows.append([label] + values)
        pick = _LABEL_FREE_BETTER.get(key)
        top = pick(v for v in values if v is not None) if pick else None
        best.append([False] + [pick is not None and v is not None and v == top for v in values])
    if not rows:
        return
    samples = summary.get("label_free_samples")
    parts = [page.table(["read-out without labels (test split)"] + [label for label, _ in BASELINES], rows,
                        numeric=[False, True, True, True], best=best, digits=3,
                        caption=f"Two augmented views of {samples if samples is not None else 'the'} held-out test "
                                "images, frozen features h (the raw pixels of the same views); view retrieval: how "
                                "often an image's second view finds its first among all first views. Best per row "
                                "in green where a row has one.")]
    verdict = records.verdict_line(summary, records.VIEW_RETRIEVAL_TOP1, "view retrieval top-1")
    if verdict is not None:  # (the result's badge says whether it beats both)
        parts.append(page.paragraph(verdict[0]))
    page.section("Read-out without labels, against the baselines", *parts, section_id="readout-label-free")


def _readout_section(page: Page, summary: Dict[str, Any]) -> None:
    """Each read-out's test accuracy for the encoder and the baselines, the best per row marked."""
    _label_free_section(page, summary)
    rows, best = [], []
    for label, key in READOUTS:
        values = [number(summary.get(records.baseline_key(key, baseline))) for _, baseline in BASELINES]
        if all(v is None for v in values):
            continue
        top = max(v for v in values if v is not None)
        rows.append([label] + [v if v is not None else None for v in values])
        best.append([False] + [v is not None and v == top for v in values])
    if not rows:
        return
    parts = [page.table(["read-out (test split)"] + [label for label, _ in BASELINES], rows,
                        numeric=[False, True, True, True], best=best, digits=3,
                        caption="Frozen encoder features (h); the linear probe's C is chosen on the "
                                "validation split. Best per row in green.")]
    figure = readout_figure(summary)
    if figure is not None:
        parts.append(page.figure(figure, "Test accuracy of each read-out.", "bar chart of read-out accuracies"))
    extra = [(k, summary[k]) for k in ("probe_val_accuracy", "probe_c") if k in summary]
    if extra:
        parts.append(page.key_values(extra))
    page.section("Read-out against the baselines", *parts, section_id="readout")


def _training_section(page: Page, run: RunFiles) -> None:
    """Curves and the per-epoch table from ``metrics.jsonl``."""
    parts = []
    figure = training_figure(run.records)
    if figure is not None:
        batch = any(r.get("positive_probability") is not None for r in run.records)
        online = any(key in r for r in run.records for key in records.ONLINE_KEYS)
        parts.append(page.figure(figure, "Loss, temperature and learning rate over training steps (from metrics.jsonl)"
                                 + ("; the batch panels are read from each logged step's own batch: mean p+, mean "
                                    "effective negatives e^H (of the number of negatives, dotted) and the mean "
                                    "similarity of the positive, the hardest negative and all negatives" if batch
                                    else "")
                                 + ("; the validation panel shows the online read-out measured at the end of every "
                                    "epoch (dashed: the online probe and kNN monitor, or without labels the view "
                                    "retrieval of held-out images) beside the val read-out of the --eval-every "
                                    "epochs (solid)" if online else "") + ".",
                                 "training curves"))
    elif run.records or run.has_metrics:
        parts.append(page.paragraph("metrics.jsonl has no step or epoch records yet."))
    if run.unreadable_lines:
        parts.append(page.paragraph(f"{run.unreadable_lines} unreadable line(s) in metrics.jsonl were skipped "
                                    "(an interrupted run can leave a partial last line).", "warning"))
    figure = tau_histogram_figure(run.records)
    if figure is not None:
        parts.append(page.figure(figure, "The temperature method's per-anchor temperatures over training: for each "
                                         "epoch, the share of its anchors (every anchor of every step) in each "
                                         "temperature bin, and their mean, minimum and maximum (tau_histogram "
                                         "records of metrics.jsonl).", "per-anchor temperatures over epochs"))
    epochs = records.of_kind(run.records, records.EPOCH)
    figure = geometry_figure(epochs)
    if figure is not None:
        parts.append(page.figure(figure, "Representation geometry on the validation split during training "
                                         "(z: projection, h: encoder output).", "representation metrics over epochs"))
    if epochs:
        parts.append("<h3>Per epoch</h3>" + _epoch_table(page, epochs))
    if parts:
        page.section("Training", *parts, section_id="training")


#: The per-epoch read-out columns of the epoch table, each shown when some epoch has it.
_EPOCH_COLUMNS = (("val_knn_accuracy", "val kNN accuracy"), ("val_probe_accuracy", "val probe accuracy"),
                  (records.ONLINE_PROBE_ACCURACY, "online probe"), (records.ONLINE_KNN_ACCURACY, "online kNN"),
                  (records.ONLINE_VIEW_RETRIEVAL_TOP1, "online view retrieval top-1"))


def _epoch_table(page: Page, epochs: Sequence[Dict[str, Any]]) -> str:
    """Loss, tau, learning rate (and the val and online read-out numbers) of the last epochs."""
    header = ["epoch", "step", "loss", "τ", "learning rate"]
    columns = [(key, title) for key, title in _EPOCH_COLUMNS if any(number(r.get(key)) is not None for r in epochs)]
    header += [title for _, title in columns]
    rows = []
    for r in epochs[-MAX_TABLE_ROWS:]:
        row = [r.get("epoch"), r.get("step"), number(r.get("loss")), number(r.get("tau")), number(r.get("lr"))]
        row += [number(r.get(key)) for key, _ in columns]
        rows.append(row)
    return page.table(header, rows, numeric=[True] * len(header))


def _representation_section(page: Page, summary: Dict[str, Any]) -> None:
    """The representation metrics of each space (z, h) on the test split, and their similarity profile."""
    representation = summary.get("representation")
    if not isinstance(representation, dict) or not representation:
        return
    spaces = [s for s in ("z", "h") if isinstance(representation.get(s), dict)] or \
             [s for s, v in representation.items() if isinstance(v, dict)]
    if not spaces:
        page.section("Representation", page.key_values(settings_pairs(representation)),
                     section_id="representation")
        return
    rows = []
    for label, key, meaning in REPRESENTATION_KEYS:
        values = [number(representation[s].get(key)) for s in spaces]
        if any(v is not None for v in values):
            rows.append([label] + values + [meaning])
    parts = [page.table(["metric (test split)"] + [f"{s}" for s in spaces] + ["meaning"], rows,
                        numeric=[False] + [True] * len(spaces) + [False],
                        caption="z: projection (what the loss sees); h: encoder output "
                                "(what the probe reads).")]
    figure = profile_figure({s: representation[s] for s in spaces})
    if figure is not None:
        parts.append(page.figure(figure, "Positive-pair similarity against the most similar negatives "
                                         "(Wang & Liu's profile).", "similarity profile"))
    page.section("Representation", *parts, section_id="representation")


def _summary_section(page: Page, summary: Dict[str, Any]) -> None:
    """Everything else the summary holds, so that no number is hidden."""
    shown = {records.baseline_key(key, baseline) for _, key in READOUTS for _, baseline in BASELINES} | {
        "representation", "probe_val_accuracy", "probe_c"}
    rest = [(k, v) for k, v in sorted(summary.items()) if k not in shown]
    if rest:
        page.section(layout.SUMMARY, page.key_values(settings_pairs(dict(rest))), section_id="summary")


def _configuration_section(page: Page, run: RunFiles) -> None:
    """The run's configuration and the values derived from it, side by side."""
    parts = []
    if run.config:
        parts.append("<h3>Configuration</h3>" + page.key_values(settings_pairs(run.config)))
    if run.derived:
        parts.append("<h3>Derived</h3>" + page.key_values(settings_pairs(run.derived)))
    if parts:
        page.section("Configuration", '<div class="columns">' + "".join(f"<div>{p}</div>" for p in parts) + "</div>",
                     section_id="configuration")
