"""Pictures of contrastkit's results: self-contained HTML reports and the temperature explorer.

:func:`write_report` turns a run, sweep or experiment folder into one HTML file with its plots
embedded (:func:`report_after_run` is what ``contrastkit pretrain`` calls at the end of a run);
a run's report shows pictures of its own images (views, neighbors, a map, one real batch) and
a sweep's the neighbors of the same queries per temperature. :func:`write_explorer` writes the
interactive temperature explorer (one static page), :func:`write_run_explorer` the same on real
rows of a run's last batch (:func:`run_presets`). Neither page needs a network; matplotlib is
imported only when a report is drawn.
"""

from .explorer import PRESETS, ExplorerServer, explorer_html, is_explorer_page, run_presets, write_explorer, write_run_explorer
from .html import detect_kind, report_after_run, report_html, write_report

__all__ = ["PRESETS", "ExplorerServer", "explorer_html", "is_explorer_page", "write_explorer", "run_presets",
           "write_run_explorer",
           "detect_kind", "report_after_run", "report_html", "write_report"]
