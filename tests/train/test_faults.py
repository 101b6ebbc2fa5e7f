"""A non-finite loss (``--on-nan stop|skip``) and the output folder's lock, in-process.

The non-finite loss is injected by making the training step's loss NaN at one step (the loss
times NaN: its gradients are NaN too, as a diverged loss's are).
"""

import errno
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from contrastkit import layout
from contrastkit.cli import main
from contrastkit.train import faults, pretrain
from contrastkit.train.checkpoint import CheckpointWriteError, load_checkpoint
from contrastkit.train.faults import NonFiniteLoss, RunLock
from contrastkit.train.parallel import LossForward

from _tiny_run import TINY_ARGS, tiny_config

# 16 images in batches of 4: 4 steps an epoch; 2 epochs.
NAN_ARGS = [arg for arg in TINY_ARGS if arg != "--no-report"] + ["--batch-size", "4", "--epochs", "2",
                                                                 "--no-report", "--no-baselines", "--threads", "1"]


def _nan_at(monkeypatch, *steps):
    """Make the loss of the training steps ``steps`` (counted from 1 in this process) NaN."""
    real, calls = LossForward.forward, [0]

    def forward(self, batch, labels, **step):
        calls[0] += 1
        loss = real(self, batch, labels, **step)
        return loss * float("nan") if calls[0] in steps else loss

    monkeypatch.setattr(LossForward, "forward", forward)
    return calls


def _records(out, kind):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == kind]


def test_a_nan_loss_stops_naming_the_step_the_loss_and_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _nan_at(monkeypatch, 6)  # epoch 2, its second step (not a logged one: logged are 4 and 8)
    code = main(["pretrain", *NAN_ARGS, "--log-every", "4", "--out", str(out)])
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("contrastkit")]
    assert len(lines) == 1
    message = lines[0]
    # the step, the loss, the checkpoint
    assert "became nan at step 6" in message
    assert f"{out / 'checkpoints' / 'last.pt'} (step 4, 1 epoch(s) done), unchanged" in message
    assert "--on-nan skip" in message
    state = load_checkpoint(str(out / "checkpoints" / "last.pt"))
    assert (state["step"], state["epoch"]) == (4, 1)
    assert all(torch.isfinite(value).all() for value in state["model"].values() if value.is_floating_point())
    assert not (out / "summary.json").exists() and not (out / layout.LOCK).exists()
    assert [r["step"] for r in _records(out, "epoch")] == [4]  # no record of the diverged epoch

    # The way on that the message gives: resume, skipping such steps (the same step's loss is NaN again).
    _nan_at(monkeypatch, 2)
    assert main(["pretrain", "--out", str(out), "--resume", "--on-nan", "skip", "--quiet", "--json",
                 "--no-report", "--no-baselines"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_steps"] == 1 and summary["steps"] == 8
    assert [r["step"] for r in _records(out, "skipped")] == [6]
    assert 6 not in [r["step"] for r in _records(out, "step")]


def test_skip_drops_the_update_of_each_nan_step_and_counts_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _nan_at(monkeypatch, 2, 7)
    summary = pretrain(tiny_config(out, epochs=2, batch_size=4, on_nan="skip", threads=1), progress=False,
                       baselines=False)
    assert summary["skipped_steps"] == 2 and summary["steps"] == 8
    assert all(value == value for value in (summary["final_loss"], summary["probe_accuracy"]))
    state = load_checkpoint(str(out / "checkpoints" / "last.pt"))
    # The optimizer applied 6 updates of the 8 steps; the weights stayed finite.
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {6}
    assert all(torch.isfinite(value).all() for value in state["model"].values() if value.is_floating_point())
    assert state["skipped_steps"] == 2
    skipped = _records(out, "skipped")
    assert [(r["epoch"], r["step"], r["loss"]) for r in skipped] == [(1, 2, "nan"), (2, 7, "nan")]
    # The epoch losses are the means of the kept steps' losses.
    steps = _records(out, "step")
    for epoch in (1, 2):
        kept = [r["loss"] for r in steps if r["epoch"] == epoch]
        assert len(kept) == 3
        epoch_loss = [r["loss"] for r in _records(out, "epoch") if r["epoch"] == epoch][0]
        assert epoch_loss == pytest.approx(sum(kept) / 3, rel=1e-6)


def test_on_nan_and_checkpoint_every_are_checked(tmp_path):
    with pytest.raises(ValueError, match="on_nan must be one of"):
        tiny_config(tmp_path, on_nan="ignore").resolved()
    with pytest.raises(ValueError, match="checkpoint_every"):
        tiny_config(tmp_path, checkpoint_every=-1).resolved()


# ------------------------------------------------------------------------------ the folder lock


def test_a_second_lock_on_a_folder_is_refused_naming_the_holder_and_released_cleanly(tmp_path):
    folder = tmp_path / "new" / "run"
    held = RunLock.acquire(str(folder))
    holder = json.loads((folder / layout.LOCK).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(FileExistsError, match=f"in use by another run \\(pid {os.getpid()}"):
        RunLock.acquire(str(folder))  # another open file: flock refuses it as it would another process
    held.release()
    assert not folder.exists()  # the lock had created the folder and was all there was in it
    again = RunLock.acquire(str(folder))
    (folder / "kept.txt").write_text("a user's file")
    again.release()
    assert sorted(os.listdir(folder)) == ["kept.txt"]


def test_an_output_path_that_is_a_file_is_refused_and_kept(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not a folder"):
        RunLock.acquire(str(path))
    assert path.read_text() == "mine"


def test_force_is_refused_while_another_run_holds_the_folder(tmp_path):
    out = tmp_path / "run"
    summary = pretrain(tiny_config(out, batch_size=8, threads=1), progress=False, baselines=False)
    assert "skipped_steps" not in summary  # counted only where steps may be skipped (--on-nan skip)
    before = sorted(os.listdir(out))
    held = RunLock.acquire(str(out))
    try:
        with pytest.raises(FileExistsError, match="in use by another run"):
            pretrain(tiny_config(out, batch_size=8, threads=1), force=True, progress=False, baselines=False)
    finally:
        held.release()
    assert sorted(os.listdir(out)) == before  # nothing was deleted


def test_the_folder_stays_locked_until_the_report_is_written(tmp_path, monkeypatch):
    """A --force run started while pretrain writes its report is refused: the report belongs to
    the summary beside it (the lock was once released before the report, and a second run's
    summary ended up next to the first run's report)."""
    import contrastkit.report as report_module

    out = tmp_path / "run"
    seen = []

    def report_while_another_run_tries(folder, *args, **kwargs):
        try:
            RunLock.acquire(str(folder)).release()
            seen.append("taken")
        except FileExistsError as err:
            seen.append(str(err))
        return None

    monkeypatch.setattr(report_module, "report_after_run", report_while_another_run_tries)
    argv = [arg for arg in TINY_ARGS if arg != "--no-report"]  # the report is what is watched
    assert main(["pretrain", *argv, "--epochs", "1", "--out", str(out), "--no-baselines", "--json"]) == 0
    assert len(seen) == 1 and "in use by another run" in seen[0], seen
    RunLock.acquire(str(out)).release()  # and released once pretrain returned


def test_a_read_out_that_fails_after_training_names_its_part_the_weights_and_the_rerun(tmp_path, monkeypatch,
                                                                                        capsys):
    from contrastkit.metrics import readout

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 19327352832 bytes.\nmore lines")

    monkeypatch.setattr(readout, "pixel_features", out_of_memory)
    out = tmp_path / "run"
    assert main(["pretrain", *TINY_ARGS, "--epochs", "1", "--out", str(out)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"contrastkit pretrain: training finished (its weights are in "
                               f"{out / 'checkpoints' / 'last.pt'}) but the read-out of the raw-pixel baseline failed "
                               "(RuntimeError: [enforce fail"), lines[0]
    assert f"`contrastkit probe {out}`" in lines[0] and "--no-baselines" in lines[0]
    assert (out / "checkpoints" / "last.pt").is_file() and not (out / "summary.json").exists()
    assert main(["probe", str(out)]) == 1  # the same part, in one line
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["contrastkit probe: the read-out of the raw-pixel baseline failed (RuntimeError: [enforce fail at "
                     "alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                     "19327352832 bytes.)"], lines
    monkeypatch.undo()
    assert main(["probe", str(out), "--no-baselines", "--json"]) == 0  # and the rerun it names works


def test_a_lock_left_behind_is_neither_deleted_nor_in_the_way_of_force(tmp_path):
    # A study makes a run's folder before its run starts; a run killed there leaves only its lock.
    from contrastkit.manifest import plan_removal

    only_lock = tmp_path / "only-lock"
    _write_lock(only_lock, pid=1, host="elsewhere", started="then")
    assert plan_removal(only_lock, will_write=layout.RUN_FILES).files == []
    (only_lock / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds 1 entry: notes.txt\)"):
        plan_removal(only_lock, will_write=layout.RUN_FILES)


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock (some network file systems): the process id decides."""
    fcntl = pytest.importorskip("fcntl")

    def flock(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", flock)


def _write_lock(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / layout.LOCK).write_text(json.dumps(holder))


def test_without_flock_a_stale_lock_is_taken_over_and_a_live_one_refused(tmp_path, no_flock):
    host = socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)
    stale = tmp_path / "stale"
    _write_lock(stale, pid=dead, host=host, started="then")
    lock = RunLock.acquire(str(stale))
    assert json.loads((stale / layout.LOCK).read_text())["pid"] == os.getpid()
    lock.release()

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / "live"
        _write_lock(live, pid=sleeper.pid, host=host, started="now")
        with pytest.raises(FileExistsError, match=f"pid {sleeper.pid}, host {host}"):
            RunLock.acquire(str(live))
    finally:
        sleeper.kill()
        sleeper.wait()
    elsewhere = tmp_path / "elsewhere"
    _write_lock(elsewhere, pid=dead, host=host + "-another-node", started="now")
    with pytest.raises(FileExistsError, match="if no run uses it, delete"):
        RunLock.acquire(str(elsewhere))  # a process on another host cannot be judged from here


def test_the_stops_carry_their_facts_across_processes():
    # A study's worker process hands its run's error back pickled.
    stop = pickle.loads(pickle.dumps(faults.Preempted("SIGUSR1", 3, "ckpt", rank=1)))
    assert (stop.exit_status, stop.signal_name, stop.step, stop.rank) == (faults.PREEMPTED_EXIT, "SIGUSR1", 3, 1) \
        and faults.PREEMPTED_EXIT == 75
    assert "rank 1: stopped by SIGUSR1 after step 3" in str(stop)
    diverged = pickle.loads(pickle.dumps(NonFiniteLoss("the loss became inf", 7, float("inf"))))
    assert (str(diverged), diverged.step, diverged.loss) == ("the loss became inf", 7, float("inf"))
    full = pickle.loads(pickle.dumps(CheckpointWriteError("ckpt", OSError(errno.ENOSPC, "No space"), False)))
    assert full.errno == errno.ENOSPC and str(full) == "could not write the checkpoint ckpt: No space"


class _Died(BaseException):
    """A rank that dies (nothing in the run catches it)."""


def _torchrun_start(monkeypatch, launch, start):
    """This process as the rank of torchrun launch ``launch``, in its ``start``-th start of the
    group, with restarts allowed."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", launch)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(start))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")


def test_a_restart_before_the_first_checkpoint_starts_its_own_run_over_keeping_the_users_files(
        tmp_path, monkeypatch, capsys):
    from _tiny_run import without_timings
    from contrastkit.manifest import Manifest
    from contrastkit.train import loop

    _torchrun_start(monkeypatch, "launch-a", 0)
    reference = pretrain(tiny_config(tmp_path / "reference", threads=1), progress=False, baselines=False)

    out = tmp_path / "run"
    real = loop._write_checkpoint

    def die(*args, **kwargs):  # the group dies while the run is set up: no checkpoint yet
        (out / "notes.txt").write_text("mine")  # a file of the user's, put there meanwhile
        raise _Died

    monkeypatch.setattr(loop, "_write_checkpoint", die)
    with pytest.raises(_Died):
        pretrain(tiny_config(out, threads=1), progress=False, baselines=False)
    monkeypatch.setattr(loop, "_write_checkpoint", real)
    assert not (out / "checkpoints" / "last.pt").exists()
    spare = tmp_path / "spare"  # the same unfinished start, for the refusals below
    shutil.copytree(out, spare)
    capsys.readouterr()

    # The restarted group of the launch that started it: the run starts over, as one never stopped.
    _torchrun_start(monkeypatch, "launch-a", 1)
    summary = pretrain(tiny_config(out, threads=1), progress=False, baselines=False)
    assert f"torchrun restarted the group before the run's first checkpoint: starting the run over in {out}" \
        in capsys.readouterr().err
    assert without_timings(summary) == without_timings(reference)
    assert (out / "notes.txt").read_text() == "mine"
    assert "notes.txt" not in Manifest(out).files
    ours = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    theirs = [json.loads(line) for line in (tmp_path / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"], r["loss"]) for r in ours] == [(r["kind"], r["step"], r["loss"]) for r in theirs]

    # Another launch (a torchrun started again by hand), or this launch's first start, finds a
    # folder that is not its own restart's: refused as before, nothing deleted.
    before = sorted(path.name for path in spare.rglob("*"))
    for launch, start in (("launch-b", 1), ("launch-a", 0)):
        _torchrun_start(monkeypatch, launch, start)
        with pytest.raises(FileExistsError, match="is not empty"):
            pretrain(tiny_config(spare, threads=1), progress=False, baselines=False)
    # A listed file changed since the run wrote it is no longer contrastkit's to replace.
    _torchrun_start(monkeypatch, "launch-a", 1)
    (spare / "config.yaml").write_text((spare / "config.yaml").read_text() + "# my note\n")
    with pytest.raises(FileExistsError, match=r"config.yaml \(changed since contrastkit wrote it\)"):
        pretrain(tiny_config(spare, threads=1), progress=False, baselines=False)
    assert sorted(path.name for path in spare.rglob("*")) == before
