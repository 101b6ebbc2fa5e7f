"""--logger csv,tensorboard: the scalars of metrics.jsonl and the summary, in CSV and TensorBoard files."""

import csv
import json
import shutil
import subprocess
import sys

import pytest

from _tiny_run import tiny_config
from contrastkit.cli import main
from contrastkit.metrics.batch import DIAGNOSTICS
from contrastkit.train import PretrainConfig, pretrain
from contrastkit.train import loggers as loggers_module
from contrastkit.train.loggers import Loggers, flatten_scalars, probe_table_markdown


def _records(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _csv_rows(out):
    with open(out / "metrics.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, one_torch_thread):
    out = tmp_path_factory.mktemp("logged")
    loggers = ["csv", "tensorboard"] if _has_tensorboard() else ["csv"]
    summary = pretrain(tiny_config(out, epochs=2, eval_every=1, loggers=loggers), progress=False)
    return out, summary


def _has_tensorboard():
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def test_csv_holds_every_step_epoch_val_and_summary_number(logged_run):
    out, summary = logged_run
    rows = _csv_rows(out)
    records = _records(out)
    steps = [r for r in records if r["kind"] == "step"]
    train = {(int(r["step"]), r["name"]): float(r["value"]) for r in rows if r["group"] == "train"}
    # The step's own numbers and its batch diagnostics (contrastkit.metrics.batch), every logged step.
    names = ("loss", "tau", "lr", "images_per_second") + DIAGNOSTICS + ("negatives",)
    assert len(train) == len(names) * len(steps)
    for record in steps:
        for name in names:
            assert train[(record["step"], name)] == record[name]
    val = {(int(r["epoch"]), r["name"]): float(r["value"]) for r in rows if r["group"] == "val"}
    for record in (r for r in records if r["kind"] == "epoch"):
        assert val[(record["epoch"], "knn_accuracy")] == record["val_knn_accuracy"]
        assert val[(record["epoch"], "geometry/h/uniformity")] == record["val_geometry"]["h"]["uniformity"]
    final = {r["name"]: float(r["value"]) for r in rows if r["group"] == "summary"}
    for prefix in ("", "random_init_", "raw_pixel_"):
        for key in ("probe_accuracy", "knn_accuracy"):
            assert final[prefix + key] == summary[prefix + key]
    assert final["representation/z/alignment"] == summary["representation"]["z"]["alignment"]
    assert all(int(r["step"]) == summary["steps"] for r in rows if r["group"] == "summary")


def _events(folder):
    """The event files under ``folder`` read by tensorboard's own reader (skips without it)."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (the [tensorboard] extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return events


def test_tensorboard_event_file_reads_back_with_tensorboards_reader(logged_run):
    out, summary = logged_run
    events = _events(out / "tensorboard")
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "train/tau", "train/lr", "train/images_per_second", "epoch/loss",
                "val/knn_accuracy", "val/geometry/h/tolerance", "summary/probe_accuracy",
                "summary/random_init_probe_accuracy", "summary/raw_pixel_knn_accuracy",
                "summary/representation/h/uniformity"):
        assert tag in tags, tag
    steps = [r for r in _records(out) if r["kind"] == "step"]
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [r["step"] for r in steps]
    assert [e.value for e in losses] == pytest.approx([r["loss"] for r in steps], rel=1e-6)  # float32 in the file
    (probe,) = events.Scalars("summary/probe_accuracy")
    assert probe.step == summary["steps"] and probe.value == pytest.approx(summary["probe_accuracy"], rel=1e-6)
    assert "summary/probe_table/text_summary" in events.Tags()["tensors"]
    # The online read-out (on by default) of every epoch, at the epoch's last step.
    epochs = [r for r in _records(out) if r["kind"] == "epoch"]
    for key in ("online_probe_accuracy", "online_knn_accuracy"):
        logged = events.Scalars("online/" + key[len("online_"):])
        assert [e.step for e in logged] == [r["step"] for r in epochs]
        assert [e.value for e in logged] == pytest.approx([r[key] for r in epochs], rel=1e-6)


def test_cli_logger_csv_and_tensorboard_end_to_end(tmp_path, capsys, one_torch_thread):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (the [tensorboard] extra)")
    from _tiny_run import TINY_ARGS

    out = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(out), "--logger", "csv,tensorboard",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    steps = [r for r in _records(out) if r["kind"] == "step"]
    rows = _csv_rows(out)
    assert [float(r["value"]) for r in rows if r["group"] == "train" and r["name"] == "loss"] == [r["loss"] for r in steps]
    assert {r["name"]: float(r["value"]) for r in rows if r["group"] == "summary"}["probe_accuracy"] == summary["probe_accuracy"]
    events = _events(out / "tensorboard")
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in steps]
    (probe,) = events.Scalars("summary/probe_accuracy")
    assert probe.step == summary["steps"] and probe.value == pytest.approx(summary["probe_accuracy"], rel=1e-6)
    assert json.loads((out / "config.json").read_text())["config"]["loggers"] == ["csv", "tensorboard"]


class _Interrupt(Exception):
    pass


def test_resume_keeps_one_row_per_step(tmp_path, one_torch_thread):
    # A crash during epoch 2, before its checkpoint: the rows and events of steps 3-4 were
    # written, the checkpoint is epoch 1's. The resumed run must drop them and write them again.
    out = tmp_path / "run"
    loggers = ["csv", "tensorboard"] if _has_tensorboard() else ["csv"]
    config = tiny_config(out, epochs=2, loggers=loggers)
    checkpoint = out / "checkpoints" / "last.pt"

    digest = out / "checkpoints" / "last.pt.sha256"

    def crash_in_epoch_two(epoch, record):  # the checkpoint and its SHA-256 go back to epoch 1's
        if epoch == 1:
            shutil.copy(checkpoint, tmp_path / "epoch1.pt")
            shutil.copy(digest, tmp_path / "epoch1.pt.sha256")
        else:
            shutil.copy(tmp_path / "epoch1.pt", checkpoint)
            shutil.copy(tmp_path / "epoch1.pt.sha256", digest)
            raise _Interrupt

    with pytest.raises(_Interrupt):
        pretrain(config, progress=False, on_epoch_end=crash_in_epoch_two)
    assert [int(r["step"]) for r in _csv_rows(out) if r["name"] == "loss" and r["group"] == "train"] == [1, 2, 3, 4]
    pretrain(config, resume=True, progress=False)
    steps = [int(r["step"]) for r in _csv_rows(out) if r["group"] == "train" and r["name"] == "loss"]
    assert steps == [1, 2, 3, 4]
    assert [int(r["epoch"]) for r in _csv_rows(out) if r["group"] == "epoch" and r["name"] == "loss"] == [1, 2]
    if _has_tensorboard():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(out / "tensorboard"))
        events.Reload()
        assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]


def test_loggers_option_and_its_bad_values(tmp_path):
    assert PretrainConfig(loggers="csv, csv").resolved().loggers == ["csv"]
    with pytest.raises(ValueError, match="unknown logger 'wandb'"):
        PretrainConfig(loggers=["wandb"]).resolved()
    with pytest.raises(TypeError, match="loggers"):
        PretrainConfig(loggers=3).resolved()


def test_tensorboard_missing_is_one_clear_error(monkeypatch, tmp_path, capsys):
    real = loggers_module.importlib.util.find_spec
    monkeypatch.setattr(loggers_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'contrastkit\[tensorboard\]'"):
        PretrainConfig(loggers=["tensorboard"]).resolved()
    assert main(["pretrain", "--logger", "tensorboard", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "tensorboard" in error
    assert not (tmp_path / "x").exists()  # refused before any work


def test_the_core_does_not_import_tensorboard():
    code = ("import sys, contrastkit.train, contrastkit.cli, contrastkit.train.loggers; "
            "print(any(m.startswith(('tensorboard', 'torch.utils.tensorboard')) for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_flattening_and_the_fan_out():
    assert dict(flatten_scalars({"a": 1, "b": {"c": 2.5, "d": None}, "e": True, "f": "x", "g": float("nan")})) \
        == {"a": 1.0, "b/c": 2.5}

    class Recorder:
        def __init__(self):
            self.calls = []

        def log_scalars(self, group, scalars, *, step, epoch):
            self.calls.append((group, dict(scalars), step, epoch))

        def log_summary(self, summary, *, step):
            self.calls.append(("table", step))

        def flush(self):
            pass

        def close(self):
            self.calls.append("closed")

    recorder = Recorder()
    fan_out = Loggers([recorder])
    fan_out.record({"kind": "epoch", "epoch": 2, "step": 8, "loss": 1.5, "val_knn_accuracy": 0.5})
    fan_out.summary({"probe_accuracy": 0.75, "method": "simclr"}, step=8, epoch=2)
    fan_out.close()
    assert recorder.calls == [("epoch", {"loss": 1.5}, 8, 2), ("val", {"knn_accuracy": 0.5}, 8, 2),
                              ("summary", {"probe_accuracy": 0.75}, 8, 2), ("table", 8), "closed"]
    assert "| linear probe accuracy | 0.750 | - | - |" in probe_table_markdown({"probe_accuracy": 0.75})
    assert probe_table_markdown({}) == ""


def test_a_collection_run_logs_its_label_free_read_out(tmp_path, capsys, one_torch_thread):
    from _data_fixtures import write_collection

    data = write_collection(tmp_path / "photos", 40, damaged=("zero.jpg",))
    out = tmp_path / "run"
    loggers = "csv,tensorboard" if _has_tensorboard() else "csv"
    assert main(["pretrain", "--data", str(data), "--epochs", "2", "--eval-every", "1", "--batch-size", "8",
                 "--device", "cpu", "--log-every", "1", "--quiet", "--no-report", "--json", "--logger", loggers,
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = _csv_rows(out)
    final = {r["name"]: float(r["value"]) for r in rows if r["group"] == "summary"}
    names = ("view_retrieval_top1", "view_retrieval_top5", "alignment", "uniformity", "effective_rank", "heldout_loss")
    for prefix in ("", "random_init_", "raw_pixel_"):
        for name in names:
            assert final[prefix + name] == summary[prefix + name], prefix + name
    assert final["skipped_files"] == 1 and "probe_accuracy" not in final
    val = {(int(r["epoch"]), r["name"]) for r in rows if r["group"] == "val"}
    assert {(1, "geometry/h/uniformity"), (2, "geometry/z/alignment")} <= val  # every evaluation epoch
    assert len([r for r in rows if r["group"] == "train" and r["name"] == "loss"]) == summary["steps"]
    if _has_tensorboard():
        events = _events(out / "tensorboard")
        (top1,) = events.Scalars("summary/view_retrieval_top1")
        assert top1.value == pytest.approx(summary["view_retrieval_top1"], rel=1e-6)
        (base,) = events.Scalars("summary/random_init_heldout_loss")
        assert base.value == pytest.approx(summary["random_init_heldout_loss"], rel=1e-6)
        tensors = events.Tags()["tensors"]
        assert "summary/label_free_table/text_summary" in tensors and "summary/probe_table/text_summary" not in tensors


def test_the_label_free_table_shows_each_encoder():
    from contrastkit.train.loggers import label_free_table_markdown

    assert label_free_table_markdown({"probe_accuracy": 0.5}) == ""
    table = label_free_table_markdown({"view_retrieval_top1": 0.25, "random_init_view_retrieval_top1": 0.125,
                                       "raw_pixel_view_retrieval_top1": 0.5})
    assert "| view retrieval top-1 | 0.250 | 0.125 | 0.500 |" in table
    assert "| held-out loss | - | - | - |" in table
