"""The picture of a neighbor search (``contrastkit neighbors``): one row per query, the query
first, then its neighbors, best first, each a thumbnail with a caption (its rank and cosine
similarity, its name, and its class when the data have labels; a neighbor of the query's own
class is captioned in green, one of another class in red).

Drawn with matplotlib's Agg canvas (imported when a picture is drawn, so the pyplot backend of
the caller is never touched); returned as PNG bytes, for the caller to write.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["Thumbnail", "MAX_QUERIES_SHOWN", "MAX_NEIGHBORS_SHOWN", "neighbor_picture_png"]

#: At most this many queries (rows) and neighbors per query (columns) are drawn; the text and
#: JSON output hold them all.
MAX_QUERIES_SHOWN = 32
MAX_NEIGHBORS_SHOWN = 16

_CELL_WIDTH, _CELL_HEIGHT, _CAPTION_HEIGHT = 1.3, 1.8, 0.55  # inches per thumbnail, of which its caption
_AGREE, _DISAGREE, _NEUTRAL = "#1a7f37", "#cf222e", "#24292f"


@dataclass(frozen=True)
class Thumbnail:
    """One image of the picture: ``image`` ``(C, H, W)`` float in ``[0, 1]`` and its caption
    lines; ``label`` (a class index, or ``None``) decides a neighbor's caption colour."""

    image: torch.Tensor
    caption: str
    label: Optional[int] = None


def _pixels(image: torch.Tensor) -> "tuple[np.ndarray, Optional[str]]":
    """``(H, W)`` (one channel: grey) or ``(H, W, 3)`` values in ``[0, 1]``, and the colour map."""
    array = image.detach().float().clamp(0.0, 1.0).cpu().numpy()
    if array.shape[0] == 3:
        return np.transpose(array, (1, 2, 0)), None
    return array[0], "gray"  # one channel (or an unusual count: its first channel, in grey)


def neighbor_picture_png(rows: Sequence[Tuple[Thumbnail, Sequence[Thumbnail]]], title: str,
                         metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The PNG of ``rows`` (each a query and its neighbors, best first) under ``title``, with
    the text fields ``metadata``; only the first :data:`MAX_QUERIES_SHOWN` queries and
    :data:`MAX_NEIGHBORS_SHOWN` neighbors of each are drawn (the title says when some are left
    out). A caption line wider than its cell is shortened from the left (``…2024/IMG_0042.jpg``),
    so that it stays under its own thumbnail and inside the picture."""
    figure = _neighbor_figure(rows, title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata=dict(metadata or {}))
    return buffer.getvalue()


def _neighbor_figure(rows: Sequence[Tuple[Thumbnail, Sequence[Thumbnail]]], title: str) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("a neighbor picture needs at least one query")
    shown = [(query, list(neighbors[:MAX_NEIGHBORS_SHOWN])) for query, neighbors in rows[:MAX_QUERIES_SHOWN]]
    left_out = []
    if len(rows) > len(shown):
        left_out.append(f"the first {len(shown)} of {len(rows)} queries")
    if any(len(neighbors) > MAX_NEIGHBORS_SHOWN for _, neighbors in rows):
        left_out.append(f"the first {MAX_NEIGHBORS_SHOWN} neighbors of each")
    if left_out:
        title = f"{title}\n(shown: {' and '.join(left_out)}; the text and JSON output list them all)"
    columns = 1 + max(len(neighbors) for _, neighbors in shown)
    width = _CELL_WIDTH * columns
    title = "\n".join(textwrap.fill(line, max(40, int(width * 13))) for line in title.splitlines())
    title_height = 0.25 + 0.17 * (title.count("\n") + 1)
    height = _CELL_HEIGHT * len(shown) + title_height
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    # Each cell: the thumbnail, then room for three caption lines below it.
    figure.subplots_adjust(left=0.1 / width, right=1 - 0.1 / width, bottom=_CAPTION_HEIGHT / height,
                           top=1 - title_height / height, wspace=0.12,
                           hspace=_CAPTION_HEIGHT / (_CELL_HEIGHT - _CAPTION_HEIGHT))
    axes = figure.subplots(len(shown), columns, squeeze=False)
    for row, (query, neighbors) in enumerate(shown):
        for column in range(columns):
            ax = axes[row][column]
            ax.set_xticks([])
            ax.set_yticks([])
            cell = query if column == 0 else neighbors[column - 1] if column - 1 < len(neighbors) else None
            if cell is None:
                ax.axis("off")
                continue
            pixels, cmap = _pixels(cell.image)
            ax.imshow(pixels, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
            colour = _NEUTRAL
            if column > 0 and query.label is not None and cell.label is not None:
                colour = _AGREE if cell.label == query.label else _DISAGREE
            ax.set_xlabel(cell.caption, fontsize=7, color=colour, linespacing=1.1)
            for spine in ax.spines.values():
                spine.set_edgecolor("#0969da" if column == 0 else "#d0d7de")
                spine.set_linewidth(2.5 if column == 0 else 0.8)
    figure.suptitle(title, fontsize=9, y=1 - 0.12 / height, va="top")
    _fit_captions(figure, axes)
    return figure


def _fit_captions(figure: Any, axes: Any) -> None:
    """Shorten each caption line that is wider than its cell (the column's pitch, and no more
    than twice the room between the thumbnail's centre and the picture's edge): its start is
    replaced by an ellipsis, since a file's name ends a path."""
    renderer = figure.canvas.get_renderer()
    width = figure.bbox.width
    boxes = [[ax.get_window_extent(renderer) for ax in row] for row in axes]
    pitch = boxes[0][1].x0 - boxes[0][0].x0 if len(boxes[0]) > 1 else boxes[0][0].width
    for row, row_boxes in zip(axes, boxes):
        for ax, box in zip(row, row_boxes):
            label = ax.xaxis.label
            if not label.get_text():
                continue
            centre = (box.x0 + box.x1) / 2
            room = 0.96 * min(pitch, 2 * centre, 2 * (width - centre))
            properties = label.get_fontproperties()

            def fits(line: str) -> bool:
                return renderer.get_text_width_height_descent(line, properties, ismath=False)[0] <= room

            lines = []
            for line in label.get_text().split("\n"):
                cut = 0
                while not fits(line[cut:] if cut == 0 else "…" + line[cut:]) and cut < len(line) - 1:
                    cut += 1
                lines.append(line if cut == 0 else "…" + line[cut:])
            label.set_text("\n".join(lines))
