"""The report page of a study over training budgets (``contrastkit sweep --budgets``): each
claim's verdict at every budget and where it changes, the cross-budget table and plots, and the
budgets' own study folders (each has its own report: ``contrastkit report OUT/budget-SIZExEPOCHS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from contrastkit import layout
from contrastkit._io import read_json

from .document import Page
from .reading import read_csv
from .sections import csv_table, embed_pngs, png_files, report_page, settings_pairs, status_badge

__all__ = ["budgets_page"]


def budgets_page(folder: Path) -> Page:
    """The report page of the study-over-budgets folder ``folder`` (``budgets.json``)."""
    settings = read_json(folder / layout.BUDGETS_SETTINGS)
    if not isinstance(settings, dict):
        raise ValueError(f"{folder / layout.BUDGETS_SETTINGS} must hold a JSON object")
    budgets = [str(b) for b in settings.get("budgets", [])]
    page = report_page(f"Study over training budgets on {settings.get('data', '?')}", folder,
                       f"{len(budgets)} budgets (training images x epochs): {', '.join(budgets)}")
    by_budget_path = folder / layout.VERDICTS_BY_BUDGET
    by_budget: Dict[str, Any] = read_json(by_budget_path) if by_budget_path.is_file() else {}
    if not isinstance(by_budget, dict):
        raise ValueError(f"{by_budget_path} must hold a JSON object")
    claims = [c for c in by_budget.get("claims", []) if isinstance(c, dict)]
    if claims:
        names = [str(b.get("name", b.get("budget", "?"))) for b in by_budget.get("budgets", []) if isinstance(b, dict)]
        rows = []
        for claim in claims:
            statuses = {str(e.get("budget")): str(e.get("status", "")) for e in claim.get("by_budget", [])
                        if isinstance(e, dict)}
            cells = "".join(f"<td>{status_badge(page, statuses.get(name, ''))}</td>" for name in names)
            rows.append(f"<tr><td><strong>{page.text(claim.get('claim', ''))}</strong><br><span class=\"note\">"
                        f"{'changes: ' if claim.get('changes') else ''}{page.text(claim.get('where', ''))}</span></td>"
                        f"{cells}</tr>")
        head = "".join(f"<th scope=\"col\">{page.text(name)}</th>" for name in names)
        page.section("Verdicts by budget",
                     page.paragraph("Each budget's own verdicts (the evidence and the rule are in its folder's "
                                    f"{layout.VERDICTS} and report); a claim whose status is not the same at every "
                                    "budget says where it changes."),
                     f'<div class="scroll"><table><thead><tr><th scope="col">claim</th>{head}</tr></thead><tbody>'
                     + "".join(rows) + "</tbody></table></div>", section_id="verdicts")
    for warning in by_budget.get("warnings", []):
        page.section("Warning", page.paragraph(str(warning)))
    if (folder / layout.BUDGETS_TABLE).is_file():
        header, table_rows = read_csv(folder / layout.BUDGETS_TABLE)
        page.section("Means per budget and setting", csv_table(page, header, table_rows, layout.BUDGETS_TABLE),
                     section_id="results")
    figures = embed_pngs(page, png_files(folder))
    if figures:
        page.section("Plots", '<div class="figures">' + "".join(figures) + "</div>", section_id="plots")
    links: List[str] = []
    for budget in budgets:
        sub = folder / layout.budget_folder(budget)
        report = sub / layout.REPORT
        address = page.text(report.relative_to(folder).as_posix())
        target = (f'<a href="{address}">{page.text(sub.name)}/{layout.REPORT}</a>'
                  if report.is_file() else f"{page.text(sub.name)}/ (its report: contrastkit report {page.text(sub)})")
        links.append(f"<li>{page.text(budget)}: {target}</li>")
    page.section("Each budget's study", "<ul>" + "".join(links) + "</ul>", section_id="budgets")
    page.section("Settings", page.key_values(settings_pairs(settings)), section_id="configuration")
    return page
