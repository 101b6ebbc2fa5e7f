"""Building blocks of contrastkit's self-contained HTML pages.

A page is one file: styles inline, images as base64 ``data:`` URIs, no script, no link to
anything. A ``<meta name="generator">`` tag marks pages contrastkit wrote, so that they can be
replaced without ``--force`` while any other file at the same path is left alone.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import sys
import webbrowser
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from contrastkit._io import atomic_file, escape_undecodable
from contrastkit.run_writer import FolderWriter

__all__ = ["Page", "check_target", "is_generated_by", "write_page", "figure_png", "fmt", "open_in_browser"]

PathLike = Union[str, "os.PathLike[str]"]

_CSS = """
:root { --bg: #f6f7f9; --card: #fff; --ink: #1d2430; --muted: #5b6472; --line: #dde1e7; --accent: #2457c5;
        --good: #1a8a4a; --bad: #b3261e; --warn: #a66a00;
        font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
        color: var(--ink); background: var(--bg); }
* { box-sizing: border-box; }
body { margin: 0; padding: 0 1rem 2rem; line-height: 1.45; }
header, main, footer { max-width: 1180px; margin: 0 auto; }
header { padding: 1.2rem 0 0.3rem; }
h1 { font-size: 1.5rem; margin: 0 0 0.25rem; }
h2 { font-size: 1.12rem; margin: 0 0 0.7rem; }
h3 { font-size: 0.95rem; margin: 0.9rem 0 0.4rem; }
.sub { color: var(--muted); margin: 0; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 1rem 1.1rem;
          margin-top: 1rem; box-shadow: 0 1px 2px rgba(20, 30, 50, 0.04); }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(10.5rem, 1fr)); gap: 0.7rem; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 0.55rem 0.75rem; background: #fbfcfd; }
.card .label { color: var(--muted); font-size: 0.8rem; }
.card .value { font-size: 1.35rem; font-weight: 650; font-variant-numeric: tabular-nums; }
.card .note { color: var(--muted); font-size: 0.78rem; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 0.2rem 0 0.4rem; }
th, td { padding: 0.3rem 0.65rem; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
thead th { font-size: 0.82rem; color: var(--muted); font-weight: 600; border-bottom: 2px solid var(--line); }
td.num, th.num { text-align: right; white-space: nowrap; }
td.best { font-weight: 700; color: var(--good); }
caption { caption-side: bottom; text-align: left; padding-top: 0.3rem; }
.scroll { overflow-x: auto; }
figure { margin: 0.4rem 0 0.8rem; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
figcaption { color: var(--muted); font-size: 0.86rem; margin-top: 0.25rem; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(30rem, 1fr)); gap: 0.4rem 1rem; }
.badge { display: inline-block; border-radius: 999px; padding: 0.05rem 0.55rem; font-size: 0.78rem; font-weight: 700;
         color: #fff; background: var(--muted); white-space: nowrap; }
.badge.good { background: var(--good); } .badge.bad { background: var(--bad); } .badge.warn { background: var(--warn); }
.note { color: var(--muted); font-size: 0.88rem; }
.warning { color: var(--bad); }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 0.15rem 1rem; margin: 0; font-size: 0.9rem; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; font-variant-numeric: tabular-nums; word-break: break-word; }
.columns { display: grid; grid-template-columns: repeat(auto-fit, minmax(22rem, 1fr)); gap: 0 1.5rem; }
code { font-size: 0.88em; }
footer { color: var(--muted); font-size: 0.82rem; margin-top: 1rem; }
"""


def fmt(value: Any, digits: int = 4) -> str:
    """A number for a table: ``digits`` significant digits, integers as they are, None as '–'."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if 1e-4 <= abs(value) < 1e6:
            decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
            return f"{value:.{decimals}f}"
        return f"{value:.{digits - 1}e}"
    return str(value)


def figure_png(figure: Any, dpi: int = 110) -> bytes:
    """A matplotlib ``Figure`` as PNG bytes (Agg canvas, no pyplot state touched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


class Page:
    """An HTML page assembled from sections; every text passed in is escaped."""

    def __init__(self, title: str, subtitle: str = "", *, generator: str) -> None:
        self.title = title
        self.subtitle = subtitle
        self.generator = generator
        self._parts: List[str] = []
        self._styles: List[str] = []
        #: Seconds spent on parts of the page (``pictures``), for whoever measures it.
        self.timings: Dict[str, float] = {}

    def add_style(self, css: str) -> None:
        """Styles the page needs beyond the common ones (added once, after them)."""
        if css not in self._styles:
            self._styles.append(css)

    # -- building blocks (return HTML strings, to be placed inside a section)

    @staticmethod
    def text(value: Any) -> str:
        return html.escape(str(value), quote=True)

    def paragraph(self, text: str, css_class: str = "note") -> str:
        return f'<p class="{css_class}">{self.text(text)}</p>'

    def table(self, header: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric: Sequence[bool] = (),
              best: Optional[Sequence[Sequence[bool]]] = None, caption: str = "", digits: int = 4) -> str:
        """Cells that are numbers are formatted with :func:`fmt`; ``best[i][j]`` highlights a cell."""
        rows = [list(r) for r in rows]
        numeric = list(numeric) or [isinstance(c, (int, float)) and not isinstance(c, bool)
                                    for c in (rows[0] if rows else [])]
        out = ['<div class="scroll"><table>']
        if caption:
            out.append(f'<caption class="note">{self.text(caption)}</caption>')
        num = ' class="num"'
        out.append("<thead><tr>" + "".join(
            f'<th scope="col"{num if j < len(numeric) and numeric[j] else ""}>{self.text(h)}</th>'
            for j, h in enumerate(header)) + "</tr></thead><tbody>")
        for i, row in enumerate(rows):
            cells = []
            for j, cell in enumerate(row):
                classes = []
                if j < len(numeric) and numeric[j]:
                    classes.append("num")
                if best is not None and best[i][j]:
                    classes.append("best")
                attr = f' class="{" ".join(classes)}"' if classes else ""
                value = fmt(cell, digits) if isinstance(cell, (int, float)) or cell is None else str(cell)
                tag = "th" if j == 0 else "td"
                scope = ' scope="row"' if j == 0 else ""
                cells.append(f"<{tag}{scope}{attr}>{self.text(value)}</{tag}>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</tbody></table></div>")
        return "".join(out)

    def key_values(self, pairs: Iterable[Sequence[Any]]) -> str:
        def shown(value: Any) -> str:  # settings as written (0.0001, not 0.0001000)
            if isinstance(value, float) and math.isfinite(value):
                return f"{value:.6g}"
            return fmt(value) if isinstance(value, (int, float)) else str(value)

        items = "".join(f"<dt>{self.text(k)}</dt><dd>{self.text(shown(v))}</dd>" for k, v in pairs)
        return f'<dl class="kv">{items}</dl>'

    def image(self, png: bytes, caption: str, alt: str) -> str:
        data = base64.b64encode(png).decode("ascii")
        return (f'<figure><img src="data:image/png;base64,{data}" alt="{self.text(alt)}">'
                f"<figcaption>{self.text(caption)}</figcaption></figure>")

    def figure(self, figure: Any, caption: str, alt: str) -> str:
        return self.image(figure_png(figure), caption, alt)

    def cards(self, cards: Iterable[Sequence[Any]]) -> str:
        """``(label, value, note)`` triples shown as large numbers."""
        out = []
        for label, value, note in cards:
            shown = fmt(value, 3) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            out.append(f'<div class="card"><div class="label">{self.text(label)}</div>'
                       f'<div class="value">{self.text(shown)}</div><div class="note">{self.text(note)}</div></div>')
        return '<div class="cards">' + "".join(out) + "</div>"

    @staticmethod
    def badge(text: str, kind: str = "") -> str:
        return f'<span class="badge {kind}">{html.escape(text)}</span>'

    # -- sections

    def section(self, title: str, *parts: str, section_id: str = "") -> None:
        ident = f' id="{self.text(section_id)}"' if section_id else ""
        self._parts.append(f"<section{ident}><h2>{self.text(title)}</h2>{''.join(parts)}</section>")

    def render(self, footer: str = "") -> str:
        from contrastkit import __version__

        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<meta name=\"generator\" content=\"{self.text(self.generator)}\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">\n"
            f"<title>{self.text(self.title)}</title>\n<style>{_CSS}{''.join(self._styles)}</style>\n</head>\n<body>\n"
            f"<header><h1>{self.text(self.title)}</h1><p class=\"sub\">{self.text(self.subtitle)}</p></header>\n"
            "<main>\n" + "\n".join(self._parts) + "\n</main>\n"
            f"<footer>Written by <code>{self.text(self.generator)}</code> (contrastkit {self.text(__version__)}). "
            f"{self.text(footer)}</footer>\n</body>\n</html>\n"
        )


def is_generated_by(path: PathLike, generator: str) -> bool:
    """Whether ``path`` is a page whose generator tag is ``generator`` (written by contrastkit)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return f'<meta name="generator" content="{html.escape(generator, quote=True)}">' in head


def check_target(path: PathLike, *, generator: str, force: bool = False, option: str = "--out") -> Path:
    """``path`` as a Path if a page may be written there (see :func:`write_page`), else the error."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{option} {target} is a directory; give a file name ending in .html")
    if not target.parent.exists():
        raise FileNotFoundError(f"{option} {target}: the folder {target.parent} does not exist")
    if target.exists() and not force and not is_generated_by(target, generator):
        raise FileExistsError(f"{target} exists and was not written by contrastkit; pass --force to replace it")
    return target


def write_page(path: PathLike, text: str, *, generator: str, force: bool = False, option: str = "--out") -> Path:
    """Write ``text`` to ``path`` atomically; refuse to replace a file another program wrote.

    An existing file is replaced only when its generator tag is ``generator`` or ``force`` is
    true; otherwise ``FileExistsError``. ``option`` names the command-line option in messages.
    The page is recorded in the manifest of its folder (:mod:`contrastkit.manifest`; one is
    started if the folder has none), so that ``--force`` on that folder may delete it.
    """
    target = check_target(path, generator=generator, force=force, option=option)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    # Recorded in the folder's manifest (a run or study folder's, or one started for the page).
    with FolderWriter(target.parent).writing(target.name, temporary.name):
        with atomic_file(target, tmp=temporary, encoding="utf-8") as handle:
            handle.write(escape_undecodable(text))  # a data folder whose name is not UTF-8: its bytes escaped
    return target


def _has_display() -> bool:
    # Without a display, webbrowser falls back to console browsers that take over the terminal.
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def open_in_browser(url: str) -> bool:
    """Open ``url`` in the user's web browser; where that is not possible, say where the page is."""
    if not _has_display():
        print(f"no display found: open {url} in a web browser")
        return False
    try:
        opened = webbrowser.open(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        print(f"could not start a web browser: open {url} yourself")
    return bool(opened)
