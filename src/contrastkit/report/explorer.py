"""The interactive temperature explorer: one static HTML page, no network needed.

The page shows one query against a set of candidates (as on the course page P10): the user
edits the similarities (sliders and number fields, candidates can be added and removed), picks
the positive, and moves the temperature on a log scale; logits, probabilities, the loss, the
gradients ``dL/ds_j``, Wang & Liu's penalty distribution over the negatives with its entropy,
and the references and limits of the temperature lemma (textbook, section 30.2) update at
once. Its JavaScript implements the single-row case of :func:`contrastkit.analysis.explain`
with the same formulas in double precision (the test suite checks the page against the
library in a real browser). A second panel, the sigmoid view, shows the same row under
SigLIP's sigmoid loss with a bias slider: the single-row case of
:func:`contrastkit.analysis.explain_sigmoid`, checked the same way.

On a run (``contrastkit explore RUN``, :func:`write_run_explorer`; the run's report links to
it) the page opens on real rows: three anchors of the run's last training batch
(``RUN/last_batch.pt``, :mod:`contrastkit.train.last_batch`), those with the lowest, median and
highest ``p+``, each against every candidate of its denominator (the positive first, then the
negatives from the most similar), at the run's ``tau``, with the images of the query, the
positive and the hardest negatives (:func:`run_presets`). The page computes them with the same
formulas as :func:`contrastkit.analysis.explain` on the same row.

Everything is inline (CSS, JavaScript, data); a Content-Security-Policy in the page forbids
any network access, so it works offline and from ``file://``.
"""

from __future__ import annotations

import html
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from .document import is_generated_by, write_page

__all__ = ["PRESETS", "GENERATOR", "explorer_html", "write_explorer", "is_explorer_page", "ExplorerServer",
           "run_presets", "write_run_explorer"]

#: Marks a file as written by contrastkit, so that it may be replaced without ``--force``.
GENERATOR = "contrastkit explore"

#: The examples of the source texts (the course page P10, the textbook's section 30.2, the
#: ConVIRT tutorial, Wang & Liu 2021; see docs/sources.md), loaded by the page's preset
#: buttons. The first preset is shown when the page opens. ``positive`` indexes ``similarities``.
PRESETS: List[Dict[str, Any]] = [
    {
        "id": "s1-example", "group": "Course page P10", "title": "(1, 0.5, 0), τ = 0.5",
        "labels": ["c1", "c2", "c3"], "similarities": [1.0, 0.5, 0.0], "positive": 0, "temperature": 0.5,
        "note": "Course page P10, worked example: three candidates, the first positive, τ = 0.5, "
                "so the logits are (2, 1, 0).",
    },
    {
        "id": "s1-block-tau1", "group": "Course page P10", "title": "(0.8, 0.4, 0.2), τ = 1",
        "labels": ["c1", "c2", "c3"], "similarities": [0.8, 0.4, 0.2], "positive": 0, "temperature": 1.0,
        "note": "Course page P10, temperature block at τ = 1: compare with τ = 0.5 and τ = 0.1; "
                "the ranking never changes.",
    },
    {
        "id": "s1-block-tau05", "group": "Course page P10", "title": "τ = 0.5",
        "labels": ["c1", "c2", "c3"], "similarities": [0.8, 0.4, 0.2], "positive": 0, "temperature": 0.5,
        "note": "Course page P10, temperature block at τ = 0.5: the distribution sharpens towards "
                "the positive.",
    },
    {
        "id": "s1-block-tau01", "group": "Course page P10", "title": "τ = 0.1",
        "labels": ["c1", "c2", "c3"], "similarities": [0.8, 0.4, 0.2], "positive": 0, "temperature": 0.1,
        "note": "Course page P10, temperature block at τ = 0.1: p+ is close to 1, so 1 − p+ and "
                "the positive's gradient shrink although τ is small.",
    },
    {
        "id": "s2-f2", "group": "Textbook 30.2, exercise F2", "title": "S01 = 0.9, S02 = −0.1",
        "labels": ["S01", "S02"], "similarities": [0.9, -0.1], "positive": 0, "temperature": 0.1,
        "note": "Textbook section 30.2, exercise F2, row 0 of N = 3 with p(0) = 1: the positive is "
                "the unique maximum, so L → 0 as τ → 0 and L → log 2 as τ → ∞.",
    },
    {
        "id": "s2-f2-above", "group": "Textbook 30.2, exercise F2", "title": "S02 = 0.95 (A > B)",
        "labels": ["S01", "S02"], "similarities": [0.9, 0.95], "positive": 0, "temperature": 0.1,
        "note": "F2 variant: a negative beats the positive (A > B), so L → +∞ as τ → 0 while τ·L → A − B = 0.05.",
    },
    {
        "id": "s2-f2-tie", "group": "Textbook 30.2, exercise F2", "title": "S02 = 0.9 (tie)",
        "labels": ["S01", "S02"], "similarities": [0.9, 0.9], "positive": 0, "temperature": 0.1,
        "note": "F2 variant: the negative ties with the positive (A = B, m = 2), so L → log 2 at every τ.",
    },
    {
        "id": "s3-row3", "group": "ConVIRT tutorial", "title": "Row 3, τ = 0.1",
        "labels": ["report 1", "report 2", "report 3", "report 4"],
        "similarities": [-0.06, -0.06, 0.879, 0.724], "positive": 2, "temperature": 0.1,
        "note": "ConVIRT tutorial, image 3 against the four reports (image-to-text), τ = 0.1 as in ConVIRT: "
                "report 4 is a hard negative (0.724).",
    },
    {
        "id": "s4-hardness", "group": "Wang & Liu: hardness", "title": "8 candidates, τ = 0.2",
        "labels": ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"],
        "similarities": [0.9, 0.8, 0.7, 0.5, 0.3, 0.1, -0.2, -0.5], "positive": 0, "temperature": 0.2,
        "note": "Wang & Liu (CVPR 2021): the penalty on the negatives is a Boltzmann distribution; lower τ "
                "concentrates it on the hardest ones (entropy falls), higher τ spreads it evenly.",
    },
]

PathLike = Union[str, "os.PathLike[str]"]


def _asset(name: str) -> str:
    return resources.files("contrastkit.report").joinpath("assets", name).read_text(encoding="utf-8")


def _json_for_script(data: Any) -> str:
    # Inside <script> only "</" can end the element early.
    return json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")


#: The temperature methods whose maths the page computes in the browser (its copy of
#: :func:`contrastkit.analysis.explain_methods` for one row; their settings and names are the
#: registry's, :func:`explorer_methods`).
EXPLORER_METHODS = ("macl", "dual", "individual", "network")


def explorer_methods() -> Dict[str, Dict[str, Any]]:
    """``{name: {"label": ..., "settings": {...}}}`` of :data:`EXPLORER_METHODS`, from their
    records (:mod:`contrastkit.temperature_methods`): the defaults and names the page uses."""
    from contrastkit.temperature_methods import get_temperature_method

    return {name: {"label": get_temperature_method(name).label,
                   "settings": {k: float(v) for k, v in get_temperature_method(name).defaults.items()}}
            for name in EXPLORER_METHODS}


def _method_rows() -> str:
    """The summary table's row of each method of :data:`EXPLORER_METHODS` (its record's label)."""
    rows = []
    for name, method in explorer_methods().items():
        cells = "".join(f'<td class="num" id="m-{column}-{name}"></td>'
                        for column in ("tau", "weight", "p", "pull", "eff"))
        rows.append(f'          <tr><th scope="row">{html.escape(method["label"])}</th>{cells}</tr>')
    return "\n".join(rows)


def _method_options() -> str:
    """The candidates' method choice: one option per method of :data:`EXPLORER_METHODS`."""
    return "\n".join(f'          <option value="{name}">{html.escape(method["label"])}</option>'
                     for name, method in explorer_methods().items())


def explorer_html(*, presets: Optional[Sequence[Dict[str, Any]]] = None) -> str:
    """The explorer page as one self-contained HTML string (UTF-8 text).

    Args:
        presets: the examples offered as buttons (default :data:`PRESETS`; the first is shown
            when the page opens). Each has ``id``, ``group``, ``title``, ``note``, ``labels``,
            ``similarities``, ``positive`` and ``temperature``.
    """
    from contrastkit import __version__

    chosen = list(PRESETS if presets is None else presets)
    if not chosen:
        raise ValueError("presets is empty: the page needs at least one example to show")
    page = _asset("explorer.html")
    # JS/CSS last: their text must not be searched for placeholders.
    for key, value in (("GENERATOR", GENERATOR), ("VERSION", __version__),
                       ("PRESETS", _json_for_script(chosen)), ("METHODS", _json_for_script(explorer_methods())),
                       ("METHOD_ROWS", _method_rows()), ("METHOD_OPTIONS", _method_options()),
                       ("CSS", _asset("explorer.css")), ("JS", _asset("explorer.js"))):
        page = page.replace("{{" + key + "}}", value)
    return page


def is_explorer_page(path: PathLike) -> bool:
    """Whether ``path`` is a page written by :func:`write_explorer` (so it may be replaced)."""
    return is_generated_by(path, GENERATOR)


def write_explorer(path: PathLike = "contrastkit-explorer.html", *, force: bool = False,
                   presets: Optional[Sequence[Dict[str, Any]]] = None) -> Path:
    """Write the explorer page (with ``presets``, default :data:`PRESETS`) to ``path`` and return the path.

    An existing file is replaced only if it is an explorer page written earlier, or with
    ``force=True``; anything else raises ``FileExistsError``. The file is written atomically.
    """
    return write_page(path, explorer_html(presets=presets), generator=GENERATOR, force=force)


def _data_uri(image: Any) -> Optional[str]:
    if image is None:
        return None
    import base64

    from .images import png_bytes

    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode("ascii")


def run_presets(batch: Any) -> List[Dict[str, Any]]:
    """The explorer's rows from a run's last batch (a :class:`~contrastkit.train.last_batch.LastBatch`):
    for the anchors of lowest, median and highest ``p+`` (in that order), the similarities to
    every candidate of the anchor's denominator (the positive first, then the negatives from the
    most similar), the positive at index 0, the run's ``tau``; ``images`` (data URIs, or
    ``None``) of the candidates whose image the batch kept, ``query_image`` of the anchor.
    ``row`` / ``columns`` say where the row lies in the batch's matrix."""
    from contrastkit.metrics.batch import QUEUED, TEXT

    if batch.similarities is None:
        raise ValueError(f"{batch.path} keeps no similarity matrix: the batch was too large")
    similarities = batch.similarities.double()
    k = similarities.shape[1]
    names = {0: "A", 1: "B", 2: "image", TEXT: "text", QUEUED: "queued key"}
    long_names = {0: "view A", 1: "view B", 2: "image", TEXT: "text", QUEUED: "queued key"}
    p_positive = batch.explanation().positive_probability
    presets = []
    for role, row in batch.anchors.items():
        positive = int(batch.positive[row])
        others = [c for c in range(k) if c != positive and not (batch.exclude_diagonal and c == row)]
        others.sort(key=lambda c: (-float(similarities[row, c]), c))
        columns = [positive] + others
        labels, images = [], []
        for rank, column in enumerate(columns):
            item, view = batch.column_item(row, column)
            if item < 0:
                label = f"{names.get(view, 'candidate')} {column}"
            else:
                index = int(batch.indices[item])
                name = batch.label_name(item)
                label = f"{names.get(view, 'candidate')} #{index}" + (f" {name}" if name else "")
            labels.append(("+ " if rank == 0 else "") + label)
            images.append(_data_uri(batch.picture(item, view)) if item >= 0 else None)
        item, view = batch.row_item(row)
        index = int(batch.indices[item])
        name = batch.label_name(item)
        query = f"query: anchor {row}, {long_names.get(view, '')} of training image #{index}" + (f" ({name})" if name else "")
        presets.append({
            "id": f"run-{role}", "group": f"This run's last batch (step {batch.step})",
            "title": f"{role} p+ ({p_positive[row]:.3g})", "labels": labels,
            "similarities": [float(similarities[row, c]) for c in columns], "positive": 0,
            "temperature": batch.temperature, "images": images,
            "query_image": _data_uri(batch.picture(item, view)), "query_label": query,
            "row": int(row), "columns": [int(c) for c in columns],
            "note": f"A real row of the run ({batch.method}, step {batch.step}): {query}, against the {len(columns)} "
                    f"candidates of its denominator ({batch.description}), at the run's τ = {batch.temperature:.4g}. "
                    f"Its p+ is the {role} of the batch's {similarities.shape[0]} anchors.",
        })
    return presets


def write_run_explorer(run_dir: PathLike, out: Optional[PathLike] = None, *, force: bool = False) -> Path:
    """Write the explorer on the rows of the run in ``run_dir`` (:func:`run_presets`, then the
    texts' examples) to ``out`` (default ``run_dir/explorer.html``); a run without a kept last
    batch is a ``ValueError``."""
    from contrastkit import layout
    from contrastkit.train.last_batch import read_last_batch

    batch = read_last_batch(os.fspath(run_dir))
    if batch is None:
        raise ValueError(f"{run_dir} has no {layout.LAST_BATCH}: the run has not finished, or was written by an "
                         "older contrastkit (train it again to keep its last batch)")
    target = layout.RunFolder(run_dir).explorer if out is None else out
    return write_explorer(target, force=force, presets=run_presets(batch) + PRESETS)


class _PageHandler(BaseHTTPRequestHandler):
    """Serves the one page at ``/`` (and ``/index.html``); nothing else, no directory listing."""

    page: bytes = b""
    server_version = "contrastkit"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._respond(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._respond(send_body=False)

    def _respond(self, send_body: bool) -> None:
        route = self.path.split("?", 1)[0].split("#", 1)[0]
        if route in ("/", "/index.html"):
            body, status, kind = self.page, 200, "text/html; charset=utf-8"
        else:
            body, status, kind = b"not found\n", 404, "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # keep the terminal quiet
        pass


class ExplorerServer:
    """The explorer page over HTTP on ``127.0.0.1`` only.

    ``port=0`` picks a free port; :attr:`url` is where the page is; ``presets``: the page's
    examples (default :data:`PRESETS`; a run's rows: :func:`run_presets`). Use :meth:`serve_for`
    (blocking, stops after ``seconds``) or :meth:`start` / :meth:`stop` (a background thread).
    """

    host = "127.0.0.1"

    def __init__(self, port: int = 0, *, presets: Optional[Sequence[Dict[str, Any]]] = None) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        handler = type("ExplorerPageHandler", (_PageHandler,),
                       {"page": explorer_html(presets=presets).encode("utf-8")})
        try:
            self._httpd = ThreadingHTTPServer((self.host, port), handler)
        except OSError as err:
            raise ValueError(f"cannot serve on {self.host}:{port}: {err.strerror or err}") from None
        self._httpd.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> "ExplorerServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="contrastkit-explorer", daemon=True)
        self._thread.start()
        return self

    def serve_for(self, seconds: float) -> None:
        """Serve until ``seconds`` have passed (or KeyboardInterrupt), then close."""
        self.start()
        try:
            assert self._thread is not None
            self._thread.join(timeout=seconds)
        finally:
            self.stop()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "ExplorerServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
