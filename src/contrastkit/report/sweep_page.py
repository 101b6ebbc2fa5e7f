"""The report page of a temperature sweep (``contrastkit sweep``): its verdicts, mean ± std per
(loss, tau), the study's plots, per tau the neighbors of the same queries and the batch
diagnostics (:mod:`.sweep_pictures`), every run and the sweep's settings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from contrastkit import layout
from contrastkit._io import read_json
from contrastkit.records import KNN_ACCURACY, PROBE_ACCURACY, RANDOM_INIT, RAW_PIXEL, baseline_key

from .document import Page
from .figures import accuracy_vs_tau_figure
from .reading import number, read_csv
from .sections import (PLOT_CAPTIONS, csv_table, embed_pngs, plus_minus, png_files, report_page, settings_pairs,
                       verdicts_section)
from .sweep_pictures import sweep_picture_sections

__all__ = ["sweep_page"]

#: The columns of sweep.csv summarised per setting, when present: (label, column).
SUMMARISED_COLUMNS = (("probe accuracy", PROBE_ACCURACY), ("kNN accuracy", KNN_ACCURACY),
                      ("final loss", "final_loss"), ("uniformity (z)", "z_uniformity"),
                      ("tolerance (z)", "z_tolerance"))
#: The baselines' columns of sweep.csv: (label, column).
BASELINE_COLUMNS = (("random-init encoder", baseline_key(PROBE_ACCURACY, RANDOM_INIT)),
                    ("raw pixels", baseline_key(PROBE_ACCURACY, RAW_PIXEL)))

Groups = Dict[Tuple[str, Optional[float]], List[Dict[str, Any]]]


def sweep_page(folder: Path, *, pictures: bool = True) -> Page:
    """The report page of the sweep folder ``folder``; ValueError if its sweep.csv has no runs.
    ``pictures``: with the neighbors and batch diagnostics of each temperature (:mod:`.sweep_pictures`)."""
    header, rows = read_csv(folder / layout.SWEEP_TABLE)
    if not rows:
        raise ValueError(f"{folder / layout.SWEEP_TABLE} has no runs yet")
    settings = read_json(folder / layout.SWEEP_SETTINGS) if (folder / layout.SWEEP_SETTINGS).is_file() else {}
    data = settings.get("data", rows[0].get("data", "?")) if isinstance(settings, dict) else "?"
    page = report_page(f"Temperature sweep on {data}", folder, f"{len(rows)} runs")
    verdicts_section(page, folder)
    groups = _groups(rows)
    _settings_table_section(page, header, rows, groups)
    _plots_section(page, folder, header, groups)
    if pictures:
        sweep_picture_sections(page, folder, rows)
    page.section("Every run", csv_table(page, header, rows, layout.SWEEP_TABLE), section_id="runs")
    if isinstance(settings, dict) and settings:
        page.section("Settings", page.key_values(settings_pairs(settings)), section_id="configuration")
    return page


def _groups(rows: List[Dict[str, Any]]) -> Groups:
    """The runs of each (loss, tau); tau None for a loss without a temperature."""
    groups: Groups = {}
    for row in rows:
        loss = str(row.get("loss") or row.get("method") or "run")
        groups.setdefault((loss, number(row.get("tau"))), []).append(row)
    return groups


def _settings_table_section(page: Page, header: List[str], rows: List[Dict[str, Any]], groups: Groups) -> None:
    """Mean ± std over seeds per (loss, tau), losses in the order of sweep.csv, then the baselines."""
    first_seen = {loss: i for i, (loss, _) in reversed(list(enumerate(groups)))}
    order = sorted(groups, key=lambda g: (first_seen[g[0]], math.inf if g[1] is None else g[1]))
    columns = [(label, key) for label, key in SUMMARISED_COLUMNS if key in header]
    table = []
    for loss, tau in order:
        group = groups[(loss, tau)]
        table.append([loss, "–" if tau is None else f"{tau:g}", len(group)] +
                     [plus_minus([r[key] for r in group if isinstance(r.get(key), float)]) for _, key in columns])
    for label, key in BASELINE_COLUMNS:
        values = [r[key] for r in rows if isinstance(r.get(key), float)]
        if values:
            table.append([f"baseline: {label}", "–", len(values), plus_minus(values)] + ["–"] * (len(columns) - 1))
    page.section("Results per setting",
                 page.table(["loss", "τ", "runs"] + [label for label, _ in columns], table,
                            numeric=[False, True, True] + [True] * len(columns),
                            caption="Mean ± standard deviation over seeds (test split)."),
                 section_id="settings-table")


def _plots_section(page: Page, folder: Path, header: List[str], groups: Groups) -> None:
    """The study's own plots; accuracy against tau is drawn here from sweep.csv if the study has none."""
    figures = embed_pngs(page, png_files(folder))
    if not (folder / layout.ACCURACY_PLOT).is_file() and PROBE_ACCURACY in header:
        figure = accuracy_vs_tau_figure(groups)
        if figure is not None:
            figures.insert(0, page.figure(figure, PLOT_CAPTIONS[layout.ACCURACY_PLOT] + f" (drawn from {layout.SWEEP_TABLE})",
                                          "probe accuracy against temperature"))
    if figures:
        page.section("Plots", '<div class="figures">' + "".join(figures) + "</div>", section_id="plots")
