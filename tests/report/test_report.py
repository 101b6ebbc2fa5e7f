"""``contrastkit report`` on run, sweep and experiment folders written here in the formats of
``contrastkit pretrain`` (config.json, metrics.jsonl, summary.json), ``contrastkit sweep``
(sweep.csv, sweep.json, verdicts.json, plots) and ``contrastkit experiment``."""

import base64
import csv
import io
import json
import math
import os
import re
import struct
import zlib
from pathlib import Path

import pytest

from contrastkit.cli import main
from contrastkit.records import FORMAT_VERSION, VERSION_KEY
from contrastkit.report import detect_kind, report_after_run, report_html, write_report

# ---------------------------------------------------------------- fixtures in the tools' formats


def tiny_png(width=3, height=2, rgb=(36, 87, 197)):
    """A valid PNG written by hand (so the test does not trust the code under test to make one)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


SUMMARY = {
    "probe_accuracy": 0.8733, "probe_val_accuracy": 0.861, "probe_c": 1.0, "knn_accuracy": 0.8412,
    "random_init_probe_accuracy": 0.6517, "random_init_knn_accuracy": 0.5981,
    "raw_pixel_probe_accuracy": 0.7025, "raw_pixel_knn_accuracy": 0.6644,
    "final_loss": 3.2179, "epochs": 3, "steps": 15, "method": "simclr", "data": "glyphlab", "encoder": "small",
    "views": "augment", "final_temperature": 0.2, "temperature_schedule": "constant", "train_seconds": 41.7,
    "eval_seconds": 6.2, "seconds": 48.9, "images_per_second": 1149.6, "beats_baselines": True,
    "representation": {
        "z": {"alignment": 0.4127, "uniformity": -3.0518, "tolerance": 0.3904, "positive_similarity": 0.7936,
              "top_negative_similarity": [0.9021, 0.8713, 0.8544, 0.8390, 0.8258, 0.8151, 0.8047, 0.7950,
                                          0.7868, 0.7783],
              "penalty_entropy": 4.0922, "penalty_entropy_max": 4.8442, "effective_rank": 21.37},
        "h": {"alignment": 0.2855, "uniformity": -2.4391, "tolerance": 0.5617, "positive_similarity": 0.8572,
              "top_negative_similarity": [0.9588, 0.9460, 0.9371, 0.9302, 0.9247, 0.9193, 0.9148, 0.9109,
                                          0.9070, 0.9038],
              "penalty_entropy": 4.3310, "penalty_entropy_max": 4.8442, "effective_rank": 17.92},
    },
}


def write_run(folder: Path, *, summary=True, metrics=True, schedule=False, corrupt_tail=False):
    """A run folder; ``metrics=False, summary=False`` is a run that has just started (no plots:
    cheap to report, for the tests about files and the CLI)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"data": "glyphlab", "data_options": {}, "method": "simclr", "encoder": "small", "views": "augment",
              "temperature": 0.2, "learnable_temperature": False, "epochs": 3, "batch_size": 64, "optimizer": "adamw",
              "lr": 0.002, "weight_decay": 0.0001, "warmup_fraction": 0.05, "seed": 0, "knn_k": 20,
              "log_every": 2, "eval_every": 1, "out": str(folder),
              "temperature_schedule": "cosine:0.1:0.5" if schedule else "constant"}
    derived = {"batch_size": 64, "steps_per_epoch": 5, "total_steps": 15, "warmup_steps": 1, "device": "cpu",
               "dataset": {"name": "glyphlab", "num_classes": 3, "image_shape": [1, 32, 32],
                           "sizes": {"train": 360, "val": 120, "test": 120}},
               "parameters": 93411, "versions": {"contrastkit": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11.7"}}
    (folder / "config.json").write_text(json.dumps({"config": config, "derived": derived}, indent=2))
    if not metrics:
        return folder
    lines, step = [], 0
    for epoch in range(1, 4):
        losses = []
        for batch in range(5):
            step += 1
            tau = 0.1 + 0.2 * (1 + math.cos(math.pi * (step - 1) / 15)) if schedule else 0.2
            if schedule:
                lines.append({"kind": "tau", "step": step, "tau": tau})
            loss = 4.6 - 0.09 * step + 0.03 * math.sin(step)
            losses.append(loss)
            if step % 2 == 0 or batch == 4:
                lines.append({"kind": "step", "epoch": epoch, "step": step, "loss": loss, "tau": tau,
                              "lr": 0.002 * (1 + math.cos(math.pi * step / 15)) / 2, "images_per_second": 1100 + step})
        record = {"kind": "epoch", "epoch": epoch, "step": step, "loss": sum(losses) / 5, "tau": tau,
                  "lr": 0.002 * (1 + math.cos(math.pi * step / 15)) / 2, "train_seconds": 13.9 * epoch,
                  "val_knn_accuracy": 0.70 + 0.05 * epoch}
        record["val_geometry"] = {s: {"alignment": 0.6 - 0.05 * epoch, "uniformity": -2.0 - 0.3 * epoch,
                                      "tolerance": 0.6 - 0.05 * epoch} for s in ("z", "h")}
        lines.append(record)
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if corrupt_tail:
        text += '{"kind": "step", "epoch": 4, "st'
    (folder / "metrics.jsonl").write_text(text)
    if summary:
        (folder / "summary.json").write_text(json.dumps(SUMMARY, indent=2, sort_keys=True))
    return folder


SWEEP_TAUS = (0.1, 0.2, 0.5)


def sweep_rows():
    rows = []
    for seed in range(2):
        for loss, method in (("nt_xent", "simclr"), ("hard_negative", "hard_negative")):
            for i, tau in enumerate(SWEEP_TAUS):
                probe = 0.80 + 0.04 * i - 0.06 * (i == 2) + 0.01 * seed + (0.02 if loss == "hard_negative" else 0)
                row = {"loss": loss, "method": method, "tau": tau, "seed": seed, "probe_accuracy": round(probe, 4),
                       "knn_accuracy": round(probe - 0.03, 4), "final_loss": round(3.0 + tau, 4),
                       "random_init_probe_accuracy": 0.65 + 0.01 * seed if (loss == "nt_xent" and i == 0) else "",
                       "raw_pixel_probe_accuracy": 0.70 if (loss == "nt_xent" and i == 0) else "",
                       "train_seconds": 40.0 + i, "run": f"{loss}-tau{tau:g}-seed{seed}",
                       "z_uniformity": round(-3.5 + tau, 4), "z_tolerance": round(0.3 + 0.4 * tau, 4)}
                row.update({f"z_top_negative_{k}": round(0.9 - 0.01 * k, 4) for k in range(1, 11)})
                rows.append(row)
        rows.append({"loss": "simple", "method": "simple", "tau": "", "seed": seed, "probe_accuracy": 0.61 + 0.01 * seed,
                     "knn_accuracy": 0.58, "final_loss": -0.4, "random_init_probe_accuracy": "",
                     "raw_pixel_probe_accuracy": "", "train_seconds": 39.0, "run": f"simple-seed{seed}",
                     "z_uniformity": -1.2, "z_tolerance": 0.8,
                     **{f"z_top_negative_{k}": 0.95 for k in range(1, 11)}})
    return rows


VERDICTS = [
    {"claim": "accuracy is reverse-U in tau", "status": "holds",
     "evidence": "peak at tau 0.2 (0.845) above both ends", "rule": "interior maximum beyond one std"},
    {"claim": "the simple loss trains far worse", "status": "does not hold here",
     "evidence": "simple 0.615 vs NT-Xent 0.845", "rule": "gap larger than the larger std"},
    {"claim": "hard-negative mining is less sensitive to tau", "status": "inconclusive",
     "evidence": "range 0.08 vs 0.08", "rule": "smaller range beyond noise"},
]


def write_sweep(folder: Path, *, plots=True):
    folder.mkdir(parents=True, exist_ok=True)
    rows = sweep_rows()
    header = list(rows[0])
    with open(folder / "sweep.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    (folder / "sweep.json").write_text(json.dumps({"data": "glyphlab", "temperatures": list(SWEEP_TAUS), "seeds": 2,
                                                   "epochs": 40, "batch_size": 32, "views": "augment"}))
    (folder / "verdicts.json").write_text(json.dumps(VERDICTS))
    if plots:
        for name in ("accuracy_vs_tau.png", "uniformity_tolerance.png"):
            (folder / name).write_bytes(tiny_png())
    (folder / "runs").mkdir(exist_ok=True)
    return folder, rows


EXPERIMENT_ROWS = [  # results.csv of `contrastkit experiment positive-pairs`: one row per run
    ("pairs A", 0, 0.9167, 0.9000, 2.8731), ("pairs B", 0, 0.5417, 0.5250, 2.9110),
    ("random init", 0, 0.6250, 0.6083, None), ("raw pixels", 0, 0.6667, 0.6500, None),
    ("pairs A", 1, 0.9000, 0.8917, 2.8805), ("pairs B", 1, 0.5833, 0.5583, 2.9042),
    ("random init", 1, 0.6417, 0.6167, None), ("raw pixels", 1, 0.6667, 0.6500, None),
]


def write_experiment(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiment.json").write_text(json.dumps({"data_options": {}, "seeds": 2, "temperature": 0.2,
                                                        "epochs": 150, "batch_size": 40, "device": "auto"}))
    with open(folder / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["setting", "seed", "probe_accuracy", "knn_accuracy", "final_loss", "run"])
        for setting, seed, probe, knn, loss in EXPERIMENT_ROWS:
            run = f"{setting.split()[-1]}-seed{seed}" if setting.startswith("pairs") else f"A-seed{seed}"
            writer.writerow([setting, seed, probe, knn, "" if loss is None else loss, run])
    (folder / "verdicts.json").write_text(json.dumps([{"claim": "B (90-degree rotation) is weaker than A",
                                                       "status": "holds", "evidence": "0.562 vs 0.908",
                                                       "rule": "gap beyond the larger std"}]))
    (folder / "positive_pairs.png").write_bytes(tiny_png(rgb=(217, 72, 15)))
    (folder / "runs").mkdir()
    return folder


# ---------------------------------------------------------------- checks shared by every report


def embedded_pngs(page):
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    decoded = [base64.b64decode(data, validate=True) for data in images]
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") for png in decoded)
    return decoded


def assert_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    assert '<meta name="generator" content="contrastkit report">' in page
    assert not re.search(r"https?://", page), "no URL of any kind"
    assert "<script" not in page.lower() and "<link" not in page.lower()
    for attribute in re.findall(r'\b(?:src|href)="([^"]*)"', page):
        assert attribute.startswith("data:image/png;base64,"), attribute


# ---------------------------------------------------------------- run


def test_run_report_shows_config_curves_readout_and_representation(tmp_path):
    run = write_run(tmp_path / "run")
    assert detect_kind(run) == "run"
    path = write_report(run)
    assert path == run / "report.html"
    page = path.read_text(encoding="utf-8")
    assert_self_contained(page)
    # Read-out table: every accuracy to 3 decimals, the best of each row highlighted.
    for key in ("probe_accuracy", "random_init_probe_accuracy", "raw_pixel_probe_accuracy", "knn_accuracy",
                "random_init_knn_accuracy", "raw_pixel_knn_accuracy"):
        assert f">{SUMMARY[key]:.3f}<" in page, key
    assert f'<td class="num best">{SUMMARY["probe_accuracy"]:.3f}</td>' in page
    assert f'<td class="num best">{SUMMARY["knn_accuracy"]:.3f}</td>' in page
    assert "beats both baselines" in page
    # Representation metrics of z and h, to 4 significant digits.
    for shown in ("0.4127", "-3.052", "0.3904", "21.37", "0.2855", "-2.439", "0.5617", "17.92", "4.844"):
        assert f'<td class="num">{shown}</td>' in page, shown
    # Configuration and derived values.
    assert "<dd>constant</dd>" in page and "<dd>adamw</dd>" in page and "<dd>93411</dd>" in page
    # Curves (training, read-out bars, similarity profile, validation geometry) as PNG.
    assert len(embedded_pngs(page)) == 4
    # The per-epoch table has the epoch means of metrics.jsonl.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 3
    for record in epochs:
        assert f'<td class="num">{record["loss"]:.3f}</td>' in page


#: The read-out of a run on an unlabeled collection (no probe, no kNN): the raw pixels find views
#: better than the pretrained encoder, which beats the random-init one.
LABEL_FREE = {"view_retrieval_top1": 0.412, "view_retrieval_top5": 0.7, "alignment": 0.31, "uniformity": -2.9,
              "effective_rank": 11.2, "heldout_loss": 2.85, "label_free_samples": 91,
              "random_init_view_retrieval_top1": 0.103, "random_init_view_retrieval_top5": 0.3,
              "random_init_alignment": 0.05, "random_init_uniformity": -0.4, "random_init_effective_rank": 3.1,
              "random_init_heldout_loss": 4.1, "raw_pixel_view_retrieval_top1": 0.5,
              "raw_pixel_view_retrieval_top5": 0.8, "raw_pixel_alignment": 0.6, "raw_pixel_uniformity": -1.2,
              "raw_pixel_effective_rank": 31.6, "raw_pixel_heldout_loss": 3.9, "beats_baselines_view_retrieval": False}


def test_the_report_of_an_unlabeled_run_shows_its_read_out_and_verdict(tmp_path):
    from contrastkit.report.document import fmt

    run = write_run(tmp_path / "run")
    summary = {key: value for key, value in SUMMARY.items()
               if not key.endswith(("probe_accuracy", "knn_accuracy")) and key not in ("probe_val_accuracy", "probe_c")}
    summary.update(LABEL_FREE, beats_baselines=None, skipped_files=0)
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    page = write_report(run).read_text(encoding="utf-8")
    assert "Read-out without labels, against the baselines" in page
    for key in ("view_retrieval_top1", "random_init_view_retrieval_top1", "raw_pixel_view_retrieval_top1",
                "effective_rank", "raw_pixel_effective_rank", "heldout_loss"):
        assert f">{fmt(LABEL_FREE[key], 3)}<" in page, key  # 3 significant digits, as the read-out table
    # Best per row where a row has one: top-1 higher (the raw pixels), alignment lower (random init).
    assert f'<td class="num best">{fmt(0.5, 3)}</td>' in page and f'<td class="num best">{fmt(0.05, 3)}</td>' in page
    assert f'<td class="num best">{fmt(31.6, 3)}</td>' not in page  # the effective rank has no best
    assert ("view retrieval top-1: the pretrained encoder (0.412) beats the random-init encoder (0.103) but not "
            "the raw pixels (0.500)") in page
    assert page.count("does not beat both baselines") == 1  # the result's badge
    assert "on view retrieval top-1 (two views of the held-out test images)" in page
    assert "on the linear probe" not in page


def test_run_report_is_replaced_but_a_user_file_is_not(tmp_path):
    run = write_run(tmp_path / "run", metrics=False, summary=False)
    write_report(run)
    write_report(run)  # our own report: replaced without asking
    user = tmp_path / "mine.html"
    user.write_text("my page")
    with pytest.raises(FileExistsError, match="--force"):
        write_report(run, user)
    assert user.read_text() == "my page"
    write_report(run, user, force=True)
    assert user.read_text().startswith("<!DOCTYPE html>")
    # no temporary left; the report is recorded in the folder's manifest
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "contrastkit-manifest.json", "report.html"]


def test_unfinished_run_and_partial_last_line(tmp_path):
    run = write_run(tmp_path / "run", summary=False, corrupt_tail=True)
    page = report_html(run)
    assert_self_contained(page)
    assert "No summary.json yet" in page
    assert "1 unreadable line(s) in metrics.jsonl were skipped" in page
    assert len(embedded_pngs(page)) == 2  # training curves and validation geometry


def test_temperature_schedule_is_drawn_from_tau_records(tmp_path):
    from contrastkit.report.figures import training_figure
    from contrastkit.report.reading import read_metrics

    run = write_run(tmp_path / "run", schedule=True)
    records, bad = read_metrics(run / "metrics.jsonl")
    figure = training_figure(records)
    tau_axis = next(ax for ax in figure.axes if ax.get_title() == "Temperature τ")
    x, y = tau_axis.lines[0].get_data()
    # One point per step from the "tau" records (15) and the step records (every 2nd + epoch ends).
    expected = sorted((r["step"], r["tau"]) for r in records if r["kind"] in ("tau", "step"))
    assert list(x) == [s for s, _ in expected] and list(y) == pytest.approx([t for _, t in expected])
    assert max(y) == pytest.approx(0.5) and min(y) > 0.1
    assert bad == 0


def _with_online_numbers(run, numbers_of_epoch):
    """``run``'s metrics.jsonl with each epoch record given ``numbers_of_epoch(epoch)``."""
    lines = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "epoch":
            record.update(numbers_of_epoch(record["epoch"]))
        lines.append(json.dumps(record))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("labelled", [True, False])
def test_the_online_read_out_is_drawn_per_epoch_and_tabled(tmp_path, labelled):
    from contrastkit.report.figures import training_figure
    from contrastkit.report.reading import read_metrics

    run = write_run(tmp_path / "run")
    if labelled:
        numbers = {e: {"online_probe_accuracy": 0.31 + e / 10, "online_knn_accuracy": 0.27 + e / 10} for e in (1, 2, 3)}
        columns = {"online_probe_accuracy": "online probe", "online_knn_accuracy": "online kNN"}
    else:
        numbers = {e: {"online_view_retrieval_top1": 0.123 * e, "online_view_retrieval_top5": 0.3} for e in (1, 2, 3)}
        columns = {"online_view_retrieval_top1": "online view retrieval top-1"}
    _with_online_numbers(run, numbers.get)
    page = write_report(run).read_text(encoding="utf-8")
    assert "the validation panel shows the online read-out measured at the end of every epoch" in page
    for title in columns.values():
        assert f'<th scope="col" class="num">{title}</th>' in page
    for epoch in (1, 2, 3):
        for key in columns:
            assert f'<td class="num">{numbers[epoch][key]:.4f}</td>' in page, (epoch, key)
    # The figure's validation panel: each online curve is the epochs' numbers, beside the val kNN.
    figure = training_figure(read_metrics(run / "metrics.jsonl")[0])
    panel = next(ax for ax in figure.axes if ax.get_title() == "Validation read-out per epoch")
    curves = {line.get_label(): line.get_data() for line in panel.lines}
    for key, title in columns.items():
        x, y = curves[title]
        assert list(x) == [1, 2, 3] and list(y) == pytest.approx([numbers[e][key] for e in (1, 2, 3)])
    assert "val kNN" in curves


# ---------------------------------------------------------------- sweep


def test_sweep_report(tmp_path):
    folder, rows = write_sweep(tmp_path / "sweep")
    assert detect_kind(folder) == "sweep"
    page = report_html(folder)
    assert_self_contained(page)
    # Mean +/- std per (loss, tau), recomputed here.
    for loss in ("nt_xent", "hard_negative"):
        for tau in SWEEP_TAUS:
            values = [r["probe_accuracy"] for r in rows if r["loss"] == loss and r["tau"] == tau]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            assert f"{mean:.3f} ± {std:.3f}" in page, (loss, tau)
    simple = [r["probe_accuracy"] for r in rows if r["loss"] == "simple"]
    assert f"{sum(simple) / 2:.3f} ± " in page
    assert "baseline: random-init encoder" in page and "0.655 ± 0.007" in page  # (0.65, 0.66)
    # Verdicts with their status, every run, the study's plots embedded as they are.
    for verdict in VERDICTS:
        assert verdict["claim"] in page and verdict["evidence"] in page
    assert page.count('class="badge good">holds<') == 1 and 'class="badge bad">does not hold here<' in page
    assert all(r["run"] in page for r in rows)
    assert embedded_pngs(page).count(tiny_png()) == 2


def test_sweep_without_plots_draws_accuracy_against_tau(tmp_path):
    from contrastkit.report.figures import accuracy_vs_tau_figure

    folder, rows = write_sweep(tmp_path / "sweep", plots=False)
    page = report_html(folder)
    pngs = embedded_pngs(page)
    assert len(pngs) == 1 and "drawn from sweep.csv" in page
    groups = {}
    for row in rows:
        groups.setdefault((row["loss"], row["tau"] if row["tau"] != "" else None), []).append(row)
    figure = accuracy_vs_tau_figure(groups)
    ax = figure.axes[0]
    nt_xent = next(c for c in ax.containers if c.get_label() == "nt_xent")  # errorbar: line, caps, bars
    x, y = nt_xent.lines[0].get_data()
    assert list(x) == list(SWEEP_TAUS)
    for tau, mean in zip(x, y):
        values = [r["probe_accuracy"] for r in rows if r["loss"] == "nt_xent" and r["tau"] == tau]
        assert mean == pytest.approx(sum(values) / len(values))


# ---------------------------------------------------------------- experiment


def test_experiment_report(tmp_path):
    folder = write_experiment(tmp_path / "positive-pairs")
    assert detect_kind(folder) == "experiment"
    page = report_html(folder)
    assert_self_contained(page)
    assert "Experiment: positive-pairs" in page
    # Mean +/- std per setting, recomputed here (sample std over the two seeds).
    for setting in ("pairs A", "pairs B", "random init", "raw pixels"):
        values = [probe for s, _, probe, _, _ in EXPERIMENT_ROWS if s == setting]
        mean = sum(values) / 2
        std = abs(values[0] - values[1]) / math.sqrt(2)
        assert f"{mean:.3f} ± {std:.3f}" in page, setting
    for shown in ("0.9167", "0.5417", "2.873"):  # every run, 4 significant digits
        assert f">{shown}<" in page
    assert "B (90-degree rotation) is weaker than A" in page
    assert embedded_pngs(page) == [tiny_png(rgb=(217, 72, 15))]


# ---------------------------------------------------------------- errors and the CLI


def test_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="is not a contrastkit run, sweep or experiment folder"):
        detect_kind(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        write_report(tmp_path / "file.txt")
    run = write_run(tmp_path / "run")
    (run / "summary.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"summary\.json is not valid JSON"):
        write_report(run)
    with pytest.raises(IsADirectoryError):
        write_report(write_run(tmp_path / "run2"), tmp_path)
    (run / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        write_report(run)


def test_report_after_run_warns_instead_of_failing(tmp_path):
    run = write_run(tmp_path / "run", metrics=False, summary=False)
    assert report_after_run(run) == run / "report.html"
    (run / "report.html").write_text("someone else's file")
    stream = io.StringIO()
    assert report_after_run(run, stream=stream) is None
    assert stream.getvalue().startswith("warning: no report written for ") and "--force" in stream.getvalue()
    assert (run / "report.html").read_text() == "someone else's file"


@pytest.mark.parametrize("no_report", [False, True])
def test_pretrain_writes_the_report_unless_told_not_to(tmp_path, capsys, monkeypatch, no_report):
    import contrastkit.train

    def fake_pretrain(config, on_summary=None, **kwargs):  # the run's files, without the minutes of training
        write_run(Path(config.out), metrics=False, summary=False)
        summary = dict(SUMMARY)
        if on_summary is not None:  # where pretrain calls it: summary.json written, the folder still held
            on_summary(summary)
        return summary

    monkeypatch.setattr(contrastkit.train, "pretrain", fake_pretrain)
    out = tmp_path / "run"
    argv = ["pretrain", "--out", str(out), "--quiet"] + (["--no-report"] if no_report else [])
    assert main(argv) == 0
    assert (out / "report.html").is_file() is (not no_report)
    assert (f"report: {out / 'report.html'}" in capsys.readouterr().out) is (not no_report)


def test_cli(tmp_path, capsys, monkeypatch):
    run = write_run(tmp_path / "run", metrics=False, summary=False)
    assert main(["report", str(run)]) == 0
    assert f"wrote {run / 'report.html'} (run report)" in capsys.readouterr().out
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(run), "--out", str(out)]) == 0 and out.is_file()
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    monkeypatch.setenv("DISPLAY", ":0")
    assert main(["report", str(run), "--open"]) == 0 and opened == [(run / "report.html").resolve().as_uri()]
    capsys.readouterr()
    for argv, message in (([str(tmp_path / "nope")], "does not exist"),
                          ([str(tmp_path)], "is not a contrastkit run, sweep or experiment folder"),
                          ([str(run), "--out", str(tmp_path / "no" / "r.html")], "does not exist")):
        assert main(["report", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("contrastkit report: error: ") and message in err and len(err.splitlines()) == 1


def test_cli_refuses_records_of_an_unknown_format_version(tmp_path, capsys):
    """A summary.json or a metrics.jsonl line of a newer format version is refused in one line
    naming the file and the version, before any page is written."""
    newer = FORMAT_VERSION + 1
    run = write_run(tmp_path / "run", metrics=False)
    (run / "summary.json").write_text(json.dumps({**SUMMARY, VERSION_KEY: newer}))
    lines = write_run(tmp_path / "lines", summary=False)
    with open(lines / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"kind": "step", "epoch": 4, "step": 16, "loss": 1.0, VERSION_KEY: newer}) + "\n")
    last = len((lines / "metrics.jsonl").read_text().splitlines())  # the line written above
    for folder, named in ((run, f"{run / 'summary.json'}: a summary"),
                          (lines, f"{lines / 'metrics.jsonl'} line {last}: a metrics record")):
        assert main(["report", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"contrastkit report: error: {named} of format version {newer}") and \
            len(err.splitlines()) == 1, err
        assert not (folder / "report.html").exists()


# ---------------------------------------------------------------- the page, to the byte

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_FOLDERS = {  # file in tests/golden -> how its folder is written
    "report_run.golden": lambda folder: write_run(folder),
    "report_run_unfinished.golden": lambda folder: write_run(folder, summary=False, corrupt_tail=True),
    "report_sweep.golden": lambda folder: write_sweep(folder),
    "report_sweep_without_plots.golden": lambda folder: write_sweep(folder, plots=False),
    "report_experiment.golden": lambda folder: write_experiment(folder),
}


def normalised(page, folder):
    """The page without what changes from one machine or minute to the next: the folder's path,
    the time it was written, contrastkit's version and the PNG bytes (matplotlib's drawing
    varies with its version; the images are checked by the tests above)."""
    from contrastkit import __version__

    for path in sorted({str(folder.resolve()), str(folder)}, key=len, reverse=True):
        page = page.replace(path, "{FOLDER}")
    page = re.sub(r"report written \d{4}-\d\d-\d\d \d\d:\d\d UTC", "report written {TIME} UTC", page)
    page = page.replace(f"(contrastkit {__version__})", "(contrastkit {VERSION})")
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,{PNG}", page)


@pytest.mark.parametrize("name", sorted(GOLDEN_FOLDERS))
def test_page_is_unchanged(tmp_path, name):
    """Every page, but for the parts :func:`normalised` takes out, as the tests/golden file has it.
    The golden files were written by the report code before it was split into one module per
    page; CONTRASTKIT_WRITE_GOLDEN=1 writes them anew after an intended change to a page."""
    folder = tmp_path / name.removesuffix(".golden")
    GOLDEN_FOLDERS[name](folder)
    page = normalised(report_html(folder), folder)
    if os.environ.get("CONTRASTKIT_WRITE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        (GOLDEN / name).write_text(page, encoding="utf-8")
    assert page == (GOLDEN / name).read_text(encoding="utf-8")
