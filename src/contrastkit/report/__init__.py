"""Pictures of contrastkit's results: self-contained HTML reports and the temperature explorer.

:func:`write_explorer` writes the interactive temperature explorer (one static page);
:func:`write_report` turns a run, sweep or experiment folder into one HTML file with its
plots embedded. Neither needs a network; matplotlib is imported only when a report is drawn.
"""

from .explorer import PRESETS, ExplorerServer, explorer_html, is_explorer_page, write_explorer

__all__ = ["PRESETS", "ExplorerServer", "explorer_html", "is_explorer_page", "write_explorer"]
