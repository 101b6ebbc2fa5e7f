"""``contrastkit pretrain --no-baselines``: the random-init and raw-pixel read-outs are skipped
(summary.json holds none of their numbers), and the table and the report say so instead of
judging against baselines that were not computed."""

import json

from _tiny_run import TINY_ARGS
from contrastkit.cli import main


def test_no_baselines_skips_both_and_the_report_still_renders(tmp_path, capsys, one_torch_thread):
    out = tmp_path / "run"
    argv = [arg for arg in TINY_ARGS if arg != "--no-report"]
    assert main(["pretrain", *argv, "--epochs", "1", "--out", str(out), "--no-baselines"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and f"report: {out / 'report.html'}" in captured.out
    assert "does not beat both baselines" not in captured.out  # nothing was compared
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["probe_accuracy"] <= 1.0 and 0.0 <= summary["knn_accuracy"] <= 1.0
    assert not [key for key in summary if key.startswith(("random_init_", "raw_pixel_"))]
    assert summary.get("beats_baselines") is None
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "no baselines in this run" in page and "does not beat both baselines" not in page
    assert "Read-out against the baselines" in page  # the trained encoder's own read-out is still tabled
    # The same flag from a config file.
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"no-baselines": True}))
    again = tmp_path / "again"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(again), "--config", str(config)]) == 0
    capsys.readouterr()
    assert not [key for key in json.loads((again / "summary.json").read_text()) if key.startswith("raw_pixel_")]


def test_resume_refuses_a_metrics_record_of_an_unknown_format_version(tmp_path, capsys, one_torch_thread):
    """A run whose metrics.jsonl holds a record of a newer format version is not resumed (its
    records would be rewritten by one that does not know them): one line naming the file and
    line, and the file as it was."""
    from contrastkit.records import FORMAT_VERSION, VERSION_KEY

    out = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(out), "--no-baselines"]) == 0
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), VERSION_KEY: FORMAT_VERSION + 1})
    metrics.write_text("\n".join(lines) + "\n")
    before = metrics.read_text()
    capsys.readouterr()
    assert main(["pretrain", *TINY_ARGS, "--epochs", "2", "--out", str(out), "--no-baselines", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{metrics} line 1: a metrics record of format version {FORMAT_VERSION + 1}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert metrics.read_text() == before
