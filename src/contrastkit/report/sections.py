"""What the report pages share: the page itself (title, where and when it was written), the
verdicts of a study, settings as key-value lists, embedded plot files and result tables."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from contrastkit import layout
from contrastkit._io import read_json
from contrastkit.studies.verdicts import FAILS, HOLDS

from .document import Page
from .reading import mean_std

__all__ = ["GENERATOR", "MAX_TABLE_ROWS", "MAX_IMAGE_BYTES", "PLOT_CAPTIONS", "report_page", "status_badge",
           "verdicts_section", "settings_pairs", "png_files", "embed_pngs", "csv_table", "plus_minus"]

#: Marks a page as a contrastkit report, so a later report may replace it without ``--force``.
GENERATOR = "contrastkit report"
#: Rows shown of a long table (the run's epochs, a results CSV); a note says how many there are.
MAX_TABLE_ROWS = 500
#: A plot file larger than this is named, not embedded.
MAX_IMAGE_BYTES = 8 * 1024 * 1024

# Known plot files of a sweep / experiment, in display order, with what they show.
PLOT_CAPTIONS = {
    layout.ACCURACY_PLOT: "Linear-probe accuracy against the temperature (mean ± std over seeds).",
    layout.UNIFORMITY_PLOT: "Uniformity of the embedding against the temperature (lower: more uniform).",
    layout.TOLERANCE_PLOT: "Tolerance (mean similarity of same-class pairs) against the temperature.",
    layout.UNIFORMITY_TOLERANCE_PLOT: "The uniformity-tolerance dilemma: each point is one setting.",
    layout.SIMILARITY_PROFILE_PLOT: "Positive similarity against the 10 most similar negatives, per temperature.",
    layout.POSITIVE_PAIRS_PLOT: "Linear-probe accuracy per positive-pair definition and baseline (mean ± std over seeds).",
    layout.BUDGETS_ACCURACY_PLOT: "NT-Xent probe accuracy against the temperature, one curve per training budget.",
    layout.BUDGETS_UNIFORMITY_PLOT: "Uniformity of z against the temperature, one curve per training budget.",
    layout.BUDGETS_TOLERANCE_PLOT: "Tolerance of z against the temperature, one curve per training budget.",
    layout.BEST_TAU_PLOT: "The best temperature (mean probe accuracy) against the budget in image-steps.",
}


def report_page(title: str, folder: Path, *facts: str) -> Page:
    """An empty report page on ``folder``; its subtitle is the folder, ``facts`` and the time (UTC)."""
    written = f"report written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    return Page(title, " · ".join([str(folder.resolve()), *facts, written]), generator=GENERATOR)


def status_badge(page: Page, status: str) -> str:
    """A verdict's status as a badge: green when it holds, red when it does not, amber otherwise."""
    kind = "good" if status == HOLDS else "bad" if status == FAILS else "warn"
    return page.badge(status or "?", kind)


def verdicts_section(page: Page, folder: Path) -> None:
    """The study's ``verdicts.json`` (claim, status, evidence, rule), if the folder has one."""
    path = folder / layout.VERDICTS
    if not path.is_file():
        return
    verdicts = read_json(path)
    if not isinstance(verdicts, list):
        raise ValueError(f"{path} must hold a list of verdicts")
    rows = []
    for item in verdicts:
        if not isinstance(item, dict):
            continue
        badge = status_badge(page, str(item.get("status", "")))
        rows.append(f"<tr><td>{badge}</td><td><strong>{page.text(item.get('claim', ''))}"
                    f"</strong><br><span class=\"note\">{page.text(item.get('evidence', ''))}</span>"
                    + (f"<br><span class=\"note\">rule: {page.text(item['rule'])}</span>" if item.get("rule") else "")
                    + "</td></tr>")
    page.section("Verdicts", page.paragraph("Computed from the results, by the rule shown under each claim."),
                 '<div class="scroll"><table><tbody>' + "".join(rows) + "</tbody></table></div>",
                 section_id="verdicts")


def settings_pairs(settings: Dict[str, Any]) -> List[Tuple[str, str]]:
    """``(key, value)`` pairs to show: numbers as they are, nested values as JSON, None as '–'."""
    pairs = []
    for key, value in settings.items():
        if value is None:
            value = "–"
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        pairs.append((key, value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)))
    return pairs


def png_files(folder: Path) -> List[Path]:
    """The folder's PNG files: the known plots in :data:`PLOT_CAPTIONS` order, then the others by name."""
    known = [folder / name for name in PLOT_CAPTIONS if (folder / name).is_file()]
    others = sorted(p for p in folder.glob("*.png") if p.name not in PLOT_CAPTIONS)
    return known + others


def embed_pngs(page: Page, files: Sequence[Path]) -> List[str]:
    """Each file as an embedded figure; one too large or not a PNG is named in a note instead."""
    parts = []
    for path in files:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            parts.append(page.paragraph(f"{path.name} is {size / 1e6:.1f} MB: left out of the report."))
            continue
        data = path.read_bytes()
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            parts.append(page.paragraph(f"{path.name} is not a PNG image: left out of the report."))
            continue
        caption = PLOT_CAPTIONS.get(path.name, path.stem.replace("_", " "))
        parts.append(page.image(data, f"{caption} ({path.name})", caption))
    return parts


def csv_table(page: Page, header: Sequence[str], rows: Sequence[Dict[str, Any]], caption: str) -> str:
    """The rows of a results CSV (the first :data:`MAX_TABLE_ROWS`) as a table."""
    shown = rows[:MAX_TABLE_ROWS]
    numeric = [all(isinstance(r.get(h), float) or r.get(h) is None for r in shown) and
               any(isinstance(r.get(h), float) for r in shown) for h in header]
    note = f" (first {MAX_TABLE_ROWS} of {len(rows)} rows)" if len(rows) > MAX_TABLE_ROWS else ""
    return page.table(header, [[_cell(r.get(h)) for h in header] for r in shown], numeric=numeric,
                      caption=caption + note)


def _cell(value: Any) -> Any:
    """A CSV cell as shown: integers as integers, other numbers to 4 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return value


def plus_minus(values: Sequence[float]) -> str:
    """'mean ± std' to 3 decimals ('mean' for one value, '–' for none)."""
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.3f} ± {std:.3f}" if len(values) > 1 else f"{mean:.3f}"
