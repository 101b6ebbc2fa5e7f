"""The report page of an experiment (``contrastkit experiment ...``): its verdicts, each result
table with mean ± std per setting, its plots and its settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence

from contrastkit import layout
from contrastkit._io import read_json

from .document import Page
from .reading import read_csv
from .sections import csv_table, embed_pngs, plus_minus, png_files, report_page, settings_pairs, verdicts_section

__all__ = ["experiment_page"]

GROUP_COLUMNS = ("setting", "loss", "method")  # a results table is summarised per value of the first present
NOT_AGGREGATED = ("seed", "run", "tau")


def experiment_page(folder: Path) -> Page:
    """The report page of the experiment folder ``folder``."""
    settings = read_json(folder / layout.EXPERIMENT_SETTINGS) if (folder / layout.EXPERIMENT_SETTINGS).is_file() else {}
    if not isinstance(settings, dict):
        raise ValueError(f"{folder / layout.EXPERIMENT_SETTINGS} must hold a JSON object")
    name = settings.get("experiment") or settings.get("name") or folder.name
    page = report_page(f"Experiment: {name}", folder)
    verdicts_section(page, folder)
    tables = []
    for path in sorted(folder.glob("*.csv")):
        header, rows = read_csv(path)
        summary = _grouped_table(page, header, rows)
        if summary:
            tables.append(f"<h3>{page.text(path.name)}: mean ± std per setting</h3>" + summary)
        tables.append(f"<h3>{page.text(path.name)}</h3>" + (csv_table(page, header, rows, path.name) if rows
                                                            else page.paragraph("no rows")))
    if tables:
        page.section("Results", *tables, section_id="results")
    figures = embed_pngs(page, png_files(folder))
    if figures:
        page.section("Plots", '<div class="figures">' + "".join(figures) + "</div>", section_id="plots")
    if settings:
        page.section("Settings", page.key_values(settings_pairs(settings)), section_id="configuration")
    return page


def _grouped_table(page: Page, header: Sequence[str], rows: Sequence[Dict[str, Any]]) -> str:
    """Mean ± std of every numeric column per value of the grouping column (one row per run)."""
    key = next((c for c in GROUP_COLUMNS if c in header), None)
    if key is None or not rows:
        return ""
    numeric = [c for c in header if c not in NOT_AGGREGATED and c != key
               and any(isinstance(r.get(c), float) for r in rows)
               and all(isinstance(r.get(c), float) or r.get(c) is None for r in rows)]
    if not numeric:
        return ""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get(key)), []).append(row)
    table = [[name, len(group)] + [plus_minus([r[c] for r in group if isinstance(r.get(c), float)]) for c in numeric]
             for name, group in groups.items()]
    return page.table([key, "runs"] + numeric, table, numeric=[False, True] + [True] * len(numeric),
                      caption="Mean ± standard deviation over the runs of each setting.")
