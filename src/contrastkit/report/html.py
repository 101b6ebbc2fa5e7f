"""``contrastkit report``: one self-contained HTML file for a run, a sweep or an experiment folder.

The kind of folder is read from its files:

* a pretraining run (``contrastkit pretrain``): ``config.json``, ``metrics.jsonl``,
  ``summary.json`` -> configuration, loss / temperature / learning-rate curves, the read-out
  table against the baselines, representation metrics when present;
* a temperature sweep (``contrastkit sweep``): ``sweep.csv`` (+ ``sweep.json``,
  ``verdicts.json`` and its plots) -> verdicts, mean +/- std per setting, the study's plots,
  every run;
* an experiment (``contrastkit experiment ...``): ``experiment.json``, ``verdicts.json`` or
  result tables (``*.csv``) -> its settings, verdicts, tables and plots.

Plots are drawn with matplotlib's Agg canvas (imported here, lazily) and embedded as base64
PNG; the page has no script and refers to nothing outside itself.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from contrastkit import layout
from contrastkit._io import read_json as _read_json

from .document import Page, check_target, fmt, write_page

__all__ = ["GENERATOR", "REPORT_NAME", "detect_kind", "report_html", "write_report", "report_after_run"]

#: Marks a page as a contrastkit report, so a later report may replace it without ``--force``.
GENERATOR = "contrastkit report"
#: File name of a report written inside the folder it describes.
REPORT_NAME = layout.REPORT
RUN_FILES = layout.RUN_MARKERS
MAX_TABLE_ROWS = 500
MAX_IMAGE_BYTES = 8 * 1024 * 1024

PathLike = Union[str, "os.PathLike[str]"]

# Known plot files of a sweep / experiment, in display order, with what they show.
PLOT_CAPTIONS = {
    layout.ACCURACY_PLOT: "Linear-probe accuracy against the temperature (mean ± std over seeds).",
    layout.UNIFORMITY_PLOT: "Uniformity of the embedding against the temperature (lower: more uniform).",
    layout.TOLERANCE_PLOT: "Tolerance (mean similarity of same-class pairs) against the temperature.",
    layout.UNIFORMITY_TOLERANCE_PLOT: "The uniformity-tolerance dilemma: each point is one setting.",
    layout.SIMILARITY_PROFILE_PLOT: "Positive similarity against the 10 most similar negatives, per temperature.",
    layout.POSITIVE_PAIRS_PLOT: "Linear-probe accuracy per positive-pair definition and baseline (mean ± std over seeds).",
}
GROUP_COLUMNS = ("setting", "loss", "method")  # a results table is summarised per value of the first present
NOT_AGGREGATED = ("seed", "run", "tau")
READOUTS = (("linear probe accuracy", "probe_accuracy"), ("kNN accuracy", "knn_accuracy"))
BASELINES = (("pretrained encoder", ""), ("random-init encoder", "random_init_"), ("raw pixels", "raw_pixel_"))
REPRESENTATION_KEYS = (
    ("alignment", "alignment", "E||f(x) − f(y)||² over positive pairs; lower is better aligned"),
    ("uniformity", "uniformity", "log E exp(−2||f(x) − f(y)||²); lower is more uniform"),
    ("tolerance", "tolerance", "mean similarity of same-class pairs; higher is more tolerant"),
    ("positive similarity", "positive_similarity", "mean similarity of the two views"),
    ("penalty entropy", "penalty_entropy", "entropy of the penalty over negatives on real batches (nats)"),
    ("penalty entropy max", "penalty_entropy_max", "log(2b − 2): all negatives weigh the same"),
    ("effective rank", "effective_rank", "exp of the entropy of the normalised singular values"),
)


# --------------------------------------------------------------------------- reading


def _read_metrics(path: Path) -> Tuple[List[Dict[str, Any]], int]:
    """Records of ``metrics.jsonl`` and the number of unreadable lines (an interrupted run may
    leave a partial last line)."""
    records, bad = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                bad += 1
    return records, bad


def _number(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(float(value)) else float(value)
    try:
        parsed = float(str(value).strip())
    except ValueError:
        return None
    return None if math.isnan(parsed) else parsed


def _read_csv(path: Path) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Header and rows; a cell that parses as a number becomes a float, an empty one None."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:
            raise ValueError(f"{path} is empty: expected a header line")
        header = list(reader.fieldnames)
        rows = []
        for row in reader:
            parsed: Dict[str, Any] = {}
            for key in header:
                cell = row.get(key)
                if cell is None or cell == "":
                    parsed[key] = None
                else:
                    value = _number(cell)
                    parsed[key] = value if value is not None else cell
            rows.append(parsed)
    return header, rows


def _folder(path: PathLike) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(f"folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file; give the folder of a run, a sweep or an experiment")
    return folder


def detect_kind(path: PathLike) -> str:
    """``"run"``, ``"sweep"`` or ``"experiment"`` from the folder's files; ValueError if none."""
    folder = _folder(path)
    if (folder / layout.SWEEP_TABLE).is_file():
        return "sweep"
    if any((folder / name).is_file() for name in RUN_FILES):
        return "run"
    if (folder / layout.EXPERIMENT_SETTINGS).is_file() or (folder / layout.VERDICTS).is_file() or any(folder.glob("*.csv")):
        return "experiment"
    raise ValueError(
        f"{folder} is not a contrastkit run, sweep or experiment folder: expected summary.json, metrics.jsonl "
        f"or config.json (contrastkit pretrain), sweep.csv (contrastkit sweep), or experiment.json, "
        f"verdicts.json or result .csv files (contrastkit experiment)")


# --------------------------------------------------------------------------- plots


def _figure(width: float, height: float, *, left: float = 0.75, bottom: float = 0.55, top: float = 0.35,
            right: float = 0.2, rows: int = 1) -> Any:
    """A Figure with margins in inches (constrained layout would double the drawing time)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           wspace=0.28, hspace=0.75 if rows > 1 else 0.2)
    return figure


def _style(ax: Any) -> None:
    ax.grid(True, color="#e6e9ee", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _training_figure(records: Sequence[Dict[str, Any]]) -> Optional[Any]:
    steps = [r for r in records if r.get("kind") == "step" and _number(r.get("step")) is not None]
    epochs = [r for r in records if r.get("kind") == "epoch" and _number(r.get("step")) is not None]
    taus = [r for r in records if r.get("kind") in ("step", "tau") and _number(r.get("tau")) is not None
            and _number(r.get("step")) is not None]
    validation = [r for r in epochs if _number(r.get("val_knn_accuracy")) is not None]
    panels = []
    if steps or epochs:
        panels.append("loss")
    if taus:
        panels.append("tau")
    if any(_number(r.get("lr")) is not None for r in steps):
        panels.append("lr")
    if validation:
        panels.append("val")
    if not panels:
        return None
    from matplotlib.ticker import MaxNLocator

    columns = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / columns)
    figure = _figure(10.5 if columns == 2 else 6.5, 3.1 * rows, rows=rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes, panels):
        _style(ax)
        if panel == "loss":
            if steps:
                ax.plot([r["step"] for r in steps if _number(r.get("loss")) is not None],
                        [r["loss"] for r in steps if _number(r.get("loss")) is not None],
                        color="#9db4e6", linewidth=1, label="logged step")
            if epochs:
                ax.plot([r["step"] for r in epochs], [r["loss"] for r in epochs], color="#2457c5",
                        marker="o", markersize=3.5, linewidth=2, label="epoch mean")
            ax.set_title("Training loss")
            ax.set_ylabel("loss")
            ax.legend(frameon=False, fontsize=8)
        elif panel == "tau":
            ordered = sorted(taus, key=lambda r: r["step"])
            ax.plot([r["step"] for r in ordered], [r["tau"] for r in ordered], color="#d9480f", linewidth=2)
            values = [r["tau"] for r in ordered]
            if max(values) / max(min(values), 1e-12) > 20:
                ax.set_yscale("log")
            elif max(values) == min(values):  # a fixed tau: show it against zero, not magnified rounding
                ax.set_ylim(0, 1.5 * max(values) if max(values) > 0 else 1)
            ax.set_title("Temperature τ")
            ax.set_ylabel("τ")
        elif panel == "lr":
            ax.plot([r["step"] for r in steps if _number(r.get("lr")) is not None],
                    [r["lr"] for r in steps if _number(r.get("lr")) is not None], color="#5c940d", linewidth=2)
            ax.set_title("Learning rate")
            ax.set_ylabel("learning rate")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        else:
            ax.plot([r["epoch"] for r in validation], [r["val_knn_accuracy"] for r in validation],
                    color="#7b3fc4", marker="o", markersize=3.5, linewidth=2)
            ax.set_title("Validation kNN accuracy")
            ax.set_ylabel("accuracy")
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            continue
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return figure


def _readout_figure(summary: Dict[str, Any]) -> Optional[Any]:
    series = []
    for label, prefix in BASELINES:
        values = [_number(summary.get(prefix + key)) for _, key in READOUTS]
        if any(v is not None for v in values):
            series.append((label, values))
    if not series:
        return None
    figure = _figure(6.5, 2.8, left=1.65, top=0.45)
    ax = figure.subplots()
    _style(ax)
    colors = {"pretrained encoder": "#2457c5", "random-init encoder": "#adb5bd", "raw pixels": "#f0a400"}
    height = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        positions = [r + (i - (len(series) - 1) / 2) * height for r in range(len(READOUTS))]
        shown = [v if v is not None else 0.0 for v in values]
        bars = ax.barh(positions, shown, height=height * 0.92, color=colors.get(label, "#868e96"), label=label)
        for bar, value in zip(bars, values):
            if value is not None:
                ax.text(bar.get_width() + 0.01, bar.get_y() + bar.get_height() / 2, f"{value:.3f}",
                        va="center", fontsize=8)
    ax.set_yticks(range(len(READOUTS)), [label for label, _ in READOUTS])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.1)
    ax.set_xlabel("test accuracy")
    ax.legend(frameon=False, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(series))
    return figure


def _profile_figure(representation: Dict[str, Any]) -> Optional[Any]:
    spaces = [(space, metrics) for space, metrics in representation.items()
              if isinstance(metrics, dict) and isinstance(metrics.get("top_negative_similarity"), list)
              and metrics["top_negative_similarity"]]
    if not spaces:
        return None
    figure = _figure(8.5, 3.0, right=2.3)
    ax = figure.subplots()
    _style(ax)
    colors = ["#2457c5", "#d9480f", "#1a8a4a", "#7b3fc4"]
    for (space, metrics), color in zip(spaces, colors):
        negatives = [_number(v) for v in metrics["top_negative_similarity"]]
        ranks = list(range(1, len(negatives) + 1))
        ax.plot(ranks, negatives, marker="o", markersize=3.5, color=color, linewidth=1.8,
                label=f"{space}: k-th most similar negative")
        positive = _number(metrics.get("positive_similarity"))
        if positive is not None:
            ax.axhline(positive, color=color, linestyle="--", linewidth=1.3, label=f"{space}: positive pair")
    ax.set_xlabel("rank of the negative")
    ax.set_ylabel("cosine similarity")
    ax.set_xticks(range(1, max(len(m["top_negative_similarity"]) for _, m in spaces) + 1))
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def _geometry_figure(epochs: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """Validation geometry over training (epoch records with ``val_geometry``)."""
    points = [(r["epoch"], r["val_geometry"]) for r in epochs
              if isinstance(r.get("val_geometry"), dict) and _number(r.get("epoch")) is not None]
    if not points:
        return None
    from matplotlib.ticker import MaxNLocator

    keys = [k for _, k, _ in REPRESENTATION_KEYS if k in ("alignment", "uniformity", "tolerance")]
    figure = _figure(10.5, 3.0)
    axes = figure.subplots(1, len(keys), squeeze=False).ravel()
    for ax, key in zip(axes, keys):
        _style(ax)
        for space, color in (("z", "#2457c5"), ("h", "#d9480f")):
            series = [(e, _number(g.get(space, {}).get(key))) for e, g in points if isinstance(g.get(space), dict)]
            series = [(e, v) for e, v in series if v is not None]
            if series:
                ax.plot([e for e, _ in series], [v for _, v in series], marker="o", markersize=3, color=color,
                        label=space)
        ax.set_title(key)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(frameon=False, fontsize=8)
    return figure


def _accuracy_vs_tau_figure(groups: Dict[Tuple[str, Optional[float]], List[Dict[str, Any]]]) -> Optional[Any]:
    curves: Dict[str, List[Tuple[float, float, float]]] = {}
    flat: Dict[str, Tuple[float, float]] = {}
    for (loss, tau), rows in groups.items():
        values = [r["probe_accuracy"] for r in rows if _number(r.get("probe_accuracy")) is not None]
        if not values:
            continue
        mean, std = _mean_std(values)
        if tau is None:
            flat[loss] = (mean, std)
        else:
            curves.setdefault(loss, []).append((tau, mean, std))
    if not curves and not flat:
        return None
    figure = _figure(6.5, 3.6)
    ax = figure.subplots()
    _style(ax)
    palette = ["#2457c5", "#d9480f", "#1a8a4a", "#7b3fc4"]
    for (loss, points), color in zip(curves.items(), palette):
        points.sort()
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, color=color, linewidth=2, label=loss)
    for (loss, (mean, std)), color in zip(flat.items(), ["#868e96", "#a66a00"]):
        ax.axhline(mean, color=color, linestyle="--", label=f"{loss} (no τ)")
        ax.axhspan(mean - std, mean + std, color=color, alpha=0.12)
    if curves:
        from matplotlib.ticker import NullFormatter

        taus = sorted({p[0] for points in curves.values() for p in points})
        ax.set_xscale("log")
        ax.set_xticks(taus, [f"{tau:g}" for tau in taus])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("temperature τ")
    ax.set_ylabel("linear-probe accuracy (test)")
    ax.legend(frameon=False, fontsize=8)
    return figure


def _mean_std(values: Sequence[float]) -> Tuple[float, float]:
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _pm(values: Sequence[float]) -> str:
    if not values:
        return "–"
    mean, std = _mean_std(values)
    return f"{mean:.3f} ± {std:.3f}" if len(values) > 1 else f"{mean:.3f}"


# --------------------------------------------------------------------------- shared sections


def _verdicts_section(page: Page, folder: Path) -> None:
    path = folder / layout.VERDICTS
    if not path.is_file():
        return
    verdicts = _read_json(path)
    if not isinstance(verdicts, list):
        raise ValueError(f"{path} must hold a list of verdicts")
    rows = []
    for item in verdicts:
        if not isinstance(item, dict):
            continue
        status = str(item.get("status", ""))
        kind = "good" if status == "holds" else "bad" if status.startswith("does not") else "warn"
        rows.append(f"<tr><td>{page.badge(status or '?', kind)}</td><td><strong>{page.text(item.get('claim', ''))}"
                    f"</strong><br><span class=\"note\">{page.text(item.get('evidence', ''))}</span>"
                    + (f"<br><span class=\"note\">rule: {page.text(item['rule'])}</span>" if item.get("rule") else "")
                    + "</td></tr>")
    page.section("Verdicts", page.paragraph("Computed from the results, by the rule shown under each claim."),
                 '<div class="scroll"><table><tbody>' + "".join(rows) + "</tbody></table></div>",
                 section_id="verdicts")


def _settings_pairs(settings: Dict[str, Any]) -> List[Tuple[str, str]]:
    pairs = []
    for key, value in settings.items():
        if value is None:
            value = "–"
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        pairs.append((key, value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)))
    return pairs


def _png_files(folder: Path) -> List[Path]:
    known = [folder / name for name in PLOT_CAPTIONS if (folder / name).is_file()]
    others = sorted(p for p in folder.glob("*.png") if p.name not in PLOT_CAPTIONS)
    return known + others


def _embed_pngs(page: Page, files: Sequence[Path]) -> List[str]:
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


def _csv_table(page: Page, header: Sequence[str], rows: Sequence[Dict[str, Any]], caption: str) -> str:
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


# --------------------------------------------------------------------------- run


def _run_page(folder: Path) -> Page:
    run = layout.RunFolder(folder)
    summary = _read_json(run.summary) if os.path.isfile(run.summary) else None
    stored = _read_json(run.config) if os.path.isfile(run.config) else None
    records, bad_lines = _read_metrics(Path(run.metrics)) if os.path.isfile(run.metrics) else ([], 0)
    if summary is not None and not isinstance(summary, dict):
        raise ValueError(f"{folder / 'summary.json'} must hold a JSON object")
    if stored is not None and not isinstance(stored, dict):
        raise ValueError(f"{folder / 'config.json'} must hold a JSON object")
    config = (stored or {}).get("config", stored or {})
    derived = (stored or {}).get("derived", {}) if isinstance(stored, dict) else {}
    summary = summary or {}

    method = summary.get("method", config.get("method", "?"))
    data = summary.get("data", config.get("data", "?"))
    title = f"Pretraining run: {method} on {data}"
    subtitle = f"{folder.resolve()} · report written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    page = Page(title, subtitle, generator=GENERATOR)

    # Headline.
    if summary:
        cards = []
        probe = _number(summary.get("probe_accuracy"))
        if probe is not None:
            base = [f"{label.split()[0]} {fmt(summary.get(prefix + 'probe_accuracy'), 3)}"
                    for label, prefix in BASELINES[1:] if _number(summary.get(prefix + "probe_accuracy")) is not None]
            cards.append(("linear probe accuracy", probe, " · ".join(base) or "no baselines in this run"))
        if _number(summary.get("knn_accuracy")) is not None:
            cards.append(("kNN accuracy", summary["knn_accuracy"], f"weighted, k = {config.get('knn_k', '?')}"))
        if _number(summary.get("final_loss")) is not None:
            cards.append(("final training loss", summary["final_loss"], "mean over the last epoch"))
        if _number(summary.get("final_temperature")) is not None:
            cards.append(("final temperature τ", summary["final_temperature"],
                          str(summary.get("temperature_schedule") or
                              ("learnable" if config.get("learnable_temperature") else "fixed"))))
        if summary.get("epochs") is not None:
            cards.append(("epochs · steps", f"{summary.get('epochs')} · {summary.get('steps', '?')}", ""))
        if _number(summary.get("train_seconds")) is not None:
            speed = _number(summary.get("images_per_second"))
            cards.append(("training time (s)", summary["train_seconds"],
                          f"{speed:.0f} images/s" if speed is not None else ""))
        parts = [page.cards(cards)]
        if summary.get("beats_baselines") is not None:  # None: a run without baselines
            parts.append("<p>" + (page.badge("beats both baselines", "good") if summary["beats_baselines"]
                                  else page.badge("does not beat both baselines", "bad"))
                         + " <span class=\"note\">on the linear probe (test split), same probe for all three.</span></p>")
        page.section("Result", *parts, section_id="result")
    else:
        page.section("Result", page.paragraph("No summary.json yet: the run has not finished its evaluation. "
                                              "The curves below show its progress so far.", "warning"),
                     section_id="result")

    # Read-out table against the baselines.
    rows, best = [], []
    for label, key in READOUTS:
        values = [_number(summary.get(prefix + key)) for _, prefix in BASELINES]
        if all(v is None for v in values):
            continue
        top = max(v for v in values if v is not None)
        rows.append([label] + [v if v is not None else None for v in values])
        best.append([False] + [v is not None and v == top for v in values])
    if rows:
        parts = [page.table(["read-out (test split)"] + [label for label, _ in BASELINES], rows,
                            numeric=[False, True, True, True], best=best, digits=3,
                            caption="Frozen encoder features (h); the linear probe's C is chosen on the "
                                    "validation split. Best per row in green.")]
        figure = _readout_figure(summary)
        if figure is not None:
            parts.append(page.figure(figure, "Test accuracy of each read-out.", "bar chart of read-out accuracies"))
        extra = [(k, summary[k]) for k in ("probe_val_accuracy", "probe_c") if k in summary]
        if extra:
            parts.append(page.key_values(extra))
        page.section("Read-out against the baselines", *parts, section_id="readout")

    # Training curves.
    parts = []
    figure = _training_figure(records)
    if figure is not None:
        parts.append(page.figure(figure, "Loss, temperature and learning rate over training steps (from metrics.jsonl).",
                                 "training curves"))
    elif records or os.path.isfile(run.metrics):
        parts.append(page.paragraph("metrics.jsonl has no step or epoch records yet."))
    if bad_lines:
        parts.append(page.paragraph(f"{bad_lines} unreadable line(s) in metrics.jsonl were skipped "
                                    "(an interrupted run can leave a partial last line).", "warning"))
    epochs = [r for r in records if r.get("kind") == "epoch"]
    figure = _geometry_figure(epochs)
    if figure is not None:
        parts.append(page.figure(figure, "Representation geometry on the validation split during training "
                                         "(z: projection, h: encoder output).", "representation metrics over epochs"))
    if epochs:
        header = ["epoch", "step", "loss", "τ", "learning rate"]
        has_val = any(_number(r.get("val_knn_accuracy")) is not None for r in epochs)
        if has_val:
            header.append("val kNN accuracy")
        table_rows = []
        for r in epochs[-MAX_TABLE_ROWS:]:
            row = [r.get("epoch"), r.get("step"), _number(r.get("loss")), _number(r.get("tau")), _number(r.get("lr"))]
            if has_val:
                row.append(_number(r.get("val_knn_accuracy")))
            table_rows.append(row)
        parts.append("<h3>Per epoch</h3>" + page.table(header, table_rows, numeric=[True] * len(header)))
    if parts:
        page.section("Training", *parts, section_id="training")

    # Representation metrics.
    representation = summary.get("representation")
    if isinstance(representation, dict) and representation:
        spaces = [s for s in ("z", "h") if isinstance(representation.get(s), dict)] or \
                 [s for s, v in representation.items() if isinstance(v, dict)]
        parts = []
        if spaces:
            rows = []
            for label, key, meaning in REPRESENTATION_KEYS:
                values = [_number(representation[s].get(key)) for s in spaces]
                if any(v is not None for v in values):
                    rows.append([label] + values + [meaning])
            parts.append(page.table(["metric (test split)"] + [f"{s}" for s in spaces] + ["meaning"], rows,
                                    numeric=[False] + [True] * len(spaces) + [False],
                                    caption="z: projection (what the loss sees); h: encoder output "
                                            "(what the probe reads)."))
            figure = _profile_figure({s: representation[s] for s in spaces})
            if figure is not None:
                parts.append(page.figure(figure, "Positive-pair similarity against the most similar negatives "
                                                 "(Wang & Liu's profile).", "similarity profile"))
        else:
            parts.append(page.key_values(_settings_pairs(representation)))
        page.section("Representation", *parts, section_id="representation")

    # Everything else the summary holds, so no number is hidden.
    shown = {prefix + key for _, key in READOUTS for _, prefix in BASELINES} | {
        "representation", "probe_val_accuracy", "probe_c"}
    rest = [(k, v) for k, v in sorted(summary.items()) if k not in shown]
    if rest:
        page.section(layout.SUMMARY, page.key_values(_settings_pairs(dict(rest))), section_id="summary")

    # Configuration.
    parts = []
    if config:
        parts.append("<h3>Configuration</h3>" + page.key_values(_settings_pairs(config)))
    if derived:
        parts.append("<h3>Derived</h3>" + page.key_values(_settings_pairs(derived)))
    if parts:
        page.section("Configuration", '<div class="columns">' + "".join(f"<div>{p}</div>" for p in parts) + "</div>",
                     section_id="configuration")
    return page


# --------------------------------------------------------------------------- sweep


def _sweep_page(folder: Path) -> Page:
    header, rows = _read_csv(folder / layout.SWEEP_TABLE)
    if not rows:
        raise ValueError(f"{folder / 'sweep.csv'} has no runs yet")
    settings = _read_json(folder / layout.SWEEP_SETTINGS) if (folder / layout.SWEEP_SETTINGS).is_file() else {}
    title = f"Temperature sweep on {settings.get('data', rows[0].get('data', '?')) if isinstance(settings, dict) else '?'}"
    page = Page(title, f"{folder.resolve()} · {len(rows)} runs · report written "
                       f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", generator=GENERATOR)
    _verdicts_section(page, folder)

    # Mean +/- std per (loss, tau).
    groups: Dict[Tuple[str, Optional[float]], List[Dict[str, Any]]] = {}
    for row in rows:
        loss = str(row.get("loss") or row.get("method") or "run")
        groups.setdefault((loss, _number(row.get("tau"))), []).append(row)
    first_seen = {loss: i for i, (loss, _) in reversed(list(enumerate(groups)))}
    order = sorted(groups, key=lambda g: (first_seen[g[0]], math.inf if g[1] is None else g[1]))
    columns = [("probe accuracy", "probe_accuracy"), ("kNN accuracy", "knn_accuracy"),
               ("final loss", "final_loss"), ("uniformity (z)", "z_uniformity"), ("tolerance (z)", "z_tolerance")]
    columns = [(label, key) for label, key in columns if key in header]
    table = []
    for loss, tau in order:
        group = groups[(loss, tau)]
        table.append([loss, "–" if tau is None else f"{tau:g}", len(group)] +
                     [_pm([r[key] for r in group if isinstance(r.get(key), float)]) for _, key in columns])
    for label, key in (("random-init encoder", "random_init_probe_accuracy"), ("raw pixels", "raw_pixel_probe_accuracy")):
        values = [r[key] for r in rows if isinstance(r.get(key), float)]
        if values:
            table.append([f"baseline: {label}", "–", len(values), _pm(values)] + ["–"] * (len(columns) - 1))
    parts = [page.table(["loss", "τ", "runs"] + [label for label, _ in columns], table,
                        numeric=[False, True, True] + [True] * len(columns),
                        caption="Mean ± standard deviation over seeds (test split).")]
    page.section("Results per setting", *parts, section_id="settings-table")

    # Plots: the study's own, else accuracy against tau drawn here from sweep.csv.
    figures = _embed_pngs(page, _png_files(folder))
    if not (folder / layout.ACCURACY_PLOT).is_file() and "probe_accuracy" in header:
        figure = _accuracy_vs_tau_figure(groups)
        if figure is not None:
            figures.insert(0, page.figure(figure, PLOT_CAPTIONS[layout.ACCURACY_PLOT] + f" (drawn from {layout.SWEEP_TABLE})",
                                          "probe accuracy against temperature"))
    if figures:
        page.section("Plots", '<div class="figures">' + "".join(figures) + "</div>", section_id="plots")

    page.section("Every run", _csv_table(page, header, rows, layout.SWEEP_TABLE), section_id="runs")
    if isinstance(settings, dict) and settings:
        page.section("Settings", page.key_values(_settings_pairs(settings)), section_id="configuration")
    return page


# --------------------------------------------------------------------------- experiment


def _experiment_page(folder: Path) -> Page:
    settings = _read_json(folder / layout.EXPERIMENT_SETTINGS) if (folder / layout.EXPERIMENT_SETTINGS).is_file() else {}
    if not isinstance(settings, dict):
        raise ValueError(f"{folder / 'experiment.json'} must hold a JSON object")
    name = settings.get("experiment") or settings.get("name") or folder.name
    page = Page(f"Experiment: {name}", f"{folder.resolve()} · report written "
                                       f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", generator=GENERATOR)
    _verdicts_section(page, folder)
    tables = []
    for path in sorted(folder.glob("*.csv")):
        header, rows = _read_csv(path)
        summary = _grouped_table(page, header, rows)
        if summary:
            tables.append(f"<h3>{page.text(path.name)}: mean ± std per setting</h3>" + summary)
        tables.append(f"<h3>{page.text(path.name)}</h3>" + (_csv_table(page, header, rows, path.name) if rows
                                                            else page.paragraph("no rows")))
    if tables:
        page.section("Results", *tables, section_id="results")
    figures = _embed_pngs(page, _png_files(folder))
    if figures:
        page.section("Plots", '<div class="figures">' + "".join(figures) + "</div>", section_id="plots")
    if settings:
        page.section("Settings", page.key_values(_settings_pairs(settings)), section_id="configuration")
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
    table = [[name, len(group)] + [_pm([r[c] for r in group if isinstance(r.get(c), float)]) for c in numeric]
             for name, group in groups.items()]
    return page.table([key, "runs"] + numeric, table, numeric=[False, True] + [True] * len(numeric),
                      caption="Mean ± standard deviation over the runs of each setting.")


# --------------------------------------------------------------------------- entry points


def report_html(path: PathLike) -> str:
    """The report of the run, sweep or experiment folder ``path`` as one HTML string."""
    folder = _folder(path)
    kind = detect_kind(folder)
    builder = {"run": _run_page, "sweep": _sweep_page, "experiment": _experiment_page}[kind]
    files = sorted(p.name for p in folder.iterdir() if p.name != REPORT_NAME)
    return builder(folder).render(footer=f"Folder kind: {kind}. Files: {', '.join(files)}.")


def write_report(path: PathLike, out: Optional[PathLike] = None, *, force: bool = False) -> Path:
    """Write the report of folder ``path`` to ``out`` (default ``path/report.html``) and return it.

    A file at ``out`` is replaced only if it is an earlier contrastkit report, or with
    ``force=True``; otherwise ``FileExistsError``.
    """
    folder = _folder(path)
    target = Path(out) if out is not None else folder / REPORT_NAME
    check_target(target, generator=GENERATOR, force=force)  # before the (slower) drawing
    return write_page(target, report_html(folder), generator=GENERATOR, force=force)


def report_after_run(run_dir: PathLike, *, stream: Optional[TextIO] = None) -> Optional[Path]:
    """Write ``run_dir/report.html`` at the end of a training run; a problem is printed as a
    one-line warning and never fails the run (its results are already on disk)."""
    stream = sys.stderr if stream is None else stream
    try:
        return write_report(run_dir)
    except (OSError, ValueError, ImportError, RuntimeError) as err:
        print(f"warning: no report written for {run_dir}: {err}", file=stream)
        return None
