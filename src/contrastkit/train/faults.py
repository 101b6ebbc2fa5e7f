"""What a pretraining run does when its machine, its cluster or its numbers fail.

* **Preemption** (:class:`StopSignals`). Schedulers stop a job with ``SIGTERM`` (SLURM,
  Kubernetes, spot instances) or ``SIGUSR1`` (SLURM's ``--signal``) and kill it after a grace
  period. While :func:`~contrastkit.train.pretrain` trains, either signal is only recorded: the
  step in progress finishes, the run writes its checkpoint at that step (in the middle of an
  epoch too: the checkpoint holds the position in the epoch) and raises :class:`Preempted`,
  which the command line turns into exit status :data:`PREEMPTED_EXIT` (75, ``EX_TEMPFAIL``
  of ``sysexits.h``: "try again later"). Under torchrun every rank asks the others after each
  step (``Parallel.any`` of ``contrastkit.train.parallel``), so all ranks stop after the same
  step, whichever received the signal first. During the final evaluation the checkpoint is
  already complete: a signal raises :class:`Preempted` at once (``--resume`` evaluates again).
* **A restarted torchrun group** (:func:`restart_resumes`). ``torchrun --max-restarts N``
  restarts every rank when one dies; the restarted run finds the checkpoint its own launch
  wrote (it records ``TORCHELASTIC_RUN_ID``) and resumes from it without ``--resume``. With
  restarts allowed the run checkpoints before its first step, so a restart finds one unless a
  rank died while the run was being set up: then the folder's manifest, which records the
  launch that started it, says the folder is this launch's own start, and the restarted run
  starts over in it (:func:`own_start_launch`; replacing only the files that manifest lists,
  as ``--force`` does). So does ``--resume`` of a job requeued by its scheduler under the same
  launch (SLURM keeps the job id) after such a start.
* **Two runs on one folder** (:class:`RunLock`). The run holds ``OUT/contrastkit.lock``
  (its process id, host and start time) while it works; a second run on ``OUT`` is refused
  naming the holder. The lock is an ``flock`` on that file where the file system has one (the
  kernel drops it when the holder dies, however it dies); elsewhere a lock whose process no
  longer runs on this host is stale and taken over.
* **A non-finite loss** (:class:`StepFaults`, ``on_nan``). The loss of every step is read after
  its backward pass, before the update (one wait for the device per step). ``"stop"``: the run
  stops there, its weights not updated, naming the step, the loss and the last good checkpoint
  (:class:`NonFiniteLoss`). ``"skip"``: a step whose loss is not finite (on any rank) does not
  update the weights; the step still counts (the schedules go on) and the run's summary says
  how many were skipped (``skipped_steps``). What the forward pass itself changed (BatchNorm
  statistics, MoCo's key network and queue) stays; if that made the model's state non-finite
  the run stops.
* **A full disk** while writing a checkpoint: the write goes to a temporary file that is
  removed on failure, the previous checkpoint stays intact, and the run stops with one
  ``CheckpointWriteError`` (an ``OSError`` keeping the ``errno``) naming both (:func:`write_failed`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from contrastkit import layout
from contrastkit._io import DISK_FULL, WriteFailed
from contrastkit.data import loader

from .checkpoint import CheckpointWriteError, load_checkpoint

__all__ = ["PREEMPTED_EXIT", "STOP_SIGNALS", "Preempted", "ReadoutFailed", "NonFiniteLoss", "CheckpointWriteError", "StopSignals",
           "RunLock", "RunGuard", "StepFaults", "launch_id", "restart_resumes", "own_start_launch", "restarts_allowed",
           "write_failed", "disk_full"]

#: The exit status of a run stopped by a preemption signal after its checkpoint, ``EX_TEMPFAIL``
#: of ``sysexits.h`` ("a temporary failure, the user is invited to retry", with ``--resume``).
PREEMPTED_EXIT = 75
#: The signals that stop a run at the end of its current step (the data loaders' workers ignore
#: them: ``contrastkit.data.loader.ignore_stop_signals``).
STOP_SIGNALS = loader.STOP_SIGNALS

_RUN_ID = "TORCHELASTIC_RUN_ID"
_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"


class Preempted(Exception):
    """The run stopped on a preemption signal; its checkpoint holds step ``step``.

    ``exit_status`` (:data:`PREEMPTED_EXIT`) is what ``contrastkit pretrain`` exits with."""

    exit_status = PREEMPTED_EXIT

    def __init__(self, signal_name: str, step: int, checkpoint: str, rank: Optional[int] = None) -> None:
        where = f"rank {rank}: " if rank is not None else ""
        super().__init__(f"{where}stopped by {signal_name} after step {step}; the checkpoint {checkpoint} holds it: "
                         f"continue with --resume (exit status {PREEMPTED_EXIT})")
        self.signal_name, self.step, self.checkpoint, self.rank = signal_name, step, checkpoint, rank

    def __reduce__(self) -> Any:  # picklable (a study's worker process hands it back)
        return type(self), (self.signal_name, self.step, self.checkpoint, self.rank)


class ReadoutFailed(Exception):
    """Training finished and its last checkpoint is written, but the read-out after it failed
    (``part``, e.g. "the raw-pixel baseline", and why): the message says where the weights are
    and how to run the read-out again. ``exit_status`` 1."""

    exit_status = 1

    def __init__(self, reason: str, checkpoint: str, out: str) -> None:
        super().__init__(f"training finished (its weights are in {checkpoint}) but {reason}, so no summary.json was "
                         f"written: run the read-out again with `contrastkit probe {out}` (--save keeps its numbers "
                         "in probe.json; --no-baselines skips the raw-pixel and random-init baselines)")
        self.reason, self.checkpoint, self.out = reason, checkpoint, out

    def __reduce__(self) -> Any:  # picklable (a study's worker process hands it back)
        return type(self), (self.reason, self.checkpoint, self.out)


class NonFiniteLoss(ValueError):
    """The training loss was not finite (``on_nan="stop"``); the message names the step, the
    loss and the last good checkpoint."""

    def __init__(self, message: str, step: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.loss = step, loss

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.step, self.loss)


# ------------------------------------------------------------------------------ signals


class StopSignals:
    """A context that records :data:`STOP_SIGNALS` while it is active (the previous handlers
    come back on exit). Only the main thread can install handlers: elsewhere nothing is
    installed and a signal does what it did before."""

    def __init__(self) -> None:
        self.received: Optional[str] = None
        self._previous: Dict[int, Any] = {}
        self._raise: Optional[Callable[[str], Preempted]] = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: Any) -> None:
        self.received = signal.Signals(number).name
        if self._raise is not None:
            raise self._raise(self.received)

    def raise_from_now(self, stop: Callable[[str], Preempted]) -> None:
        """From now on a signal raises ``stop(signal name)`` at once (nothing is left to
        checkpoint); if one came already, raise it now."""
        self._raise = stop
        if self.received is not None:
            raise stop(self.received)


# ------------------------------------------------------------------------------ the folder lock


class RunLock:
    """The lock a run holds on its output folder (:data:`contrastkit.layout.LOCK`).

    :meth:`acquire` creates the folder if needed and refuses, with ``FileExistsError`` naming
    the holder, a folder another live run holds. :meth:`release` removes the lock file, and
    the folder when the lock was all there was in it."""

    def __init__(self, folder: str, handle: int, created_folder: bool) -> None:
        self.folder, self.path = folder, layout.RunFolder(folder).lock
        self._handle: Optional[int] = handle
        self._created_folder = created_folder

    @classmethod
    def acquire(cls, folder: str) -> "RunLock":
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise FileExistsError(f"output path {folder} exists and is not a folder")
        created = not os.path.isdir(folder)
        os.makedirs(folder, exist_ok=True)
        path = layout.RunFolder(folder).lock
        for _ in range(100):  # another process may remove or replace the file between our calls
            handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _lock(handle, path)
                if _same_file(handle, path):
                    _write_holder(handle)
                    return cls(folder, handle, created)
            except BaseException:
                os.close(handle)
                raise
            os.close(handle)
        raise FileExistsError(f"could not take the lock {path}: other processes keep replacing it")

    def release(self) -> None:
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self.path)  # before unlocking: a waiting run then makes a fresh file
        os.close(self._handle)
        self._handle = None
        if self._created_folder:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only when empty: a run refused before it wrote anything


def _lock(handle: int, path: str) -> None:
    """Lock the open lock file ``handle`` (``FileExistsError`` naming the holder when a live run
    holds it). Without ``flock`` the process id in the file decides; two runs started in the
    same instant could then both pass."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the process id alone says whether the holder lives
        fcntl = None
    if fcntl is not None:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            raise FileExistsError(_in_use(path, _read_holder(path))) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
    holder = _read_holder(path)
    if holder and holder.get("pid") != os.getpid() and not _holder_is_gone(holder):
        raise FileExistsError(_in_use(path, holder))
    # no holder, or a stale one: the file is ours to rewrite


def _same_file(handle: int, path: str) -> bool:
    """Whether ``path`` is still the file we locked (the holder may have removed it meanwhile)."""
    try:
        return os.path.samestat(os.fstat(handle), os.stat(path))
    except FileNotFoundError:
        return False


def _write_holder(handle: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(handle, 0)
    os.lseek(handle, 0, os.SEEK_SET)
    os.write(handle, (json.dumps(record) + "\n").encode("utf-8"))


def _read_holder(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            holder = json.loads(handle.read(4096) or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _holder_is_gone(holder: Dict[str, Any]) -> bool:
    """A holder on this host whose process no longer runs (a lock from another host cannot be
    judged from here: it counts as live)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it runs, as another user
    return False


def _in_use(path: str, holder: Dict[str, Any]) -> str:
    who = ", ".join(f"{key} {holder[key]}" for key in ("pid", "host", "started") if key in holder) or "unknown"
    folder = os.path.dirname(path)
    return (f"output folder {folder} is in use by another run ({who}); wait for it to end or pass another --out "
            f"(if no run uses it, delete {path})")


class RunGuard:
    """What one run holds for its whole life: the stop signals and (rank 0) the folder lock,
    both given back on exit."""

    def __init__(self) -> None:
        self.signals = StopSignals()
        self.lock: Optional[RunLock] = None

    def hold(self, folder: str) -> None:
        """Take the lock on the output folder ``folder`` (refused while another run holds it)."""
        self.lock = RunLock.acquire(folder)

    def __enter__(self) -> "RunGuard":
        self.signals.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.lock is not None:
                self.lock.release()
        finally:
            self.signals.__exit__(*exc)


# ------------------------------------------------------------------------------ torchrun restarts


def launch_id() -> Optional[str]:
    """The torchrun launch this process belongs to (``TORCHELASTIC_RUN_ID``; ``None`` without torchrun)."""
    return os.environ.get(_RUN_ID) or None


def restarts_allowed() -> bool:
    """Whether torchrun restarts this group when a rank dies (``--max-restarts`` above 0)."""
    try:
        return int(os.environ.get(_MAX_RESTARTS, "0")) > 0
    except ValueError:
        return False


def _restarted() -> bool:
    """Whether torchrun restarted this group (``TORCHELASTIC_RESTART_COUNT > 0``) of a launch."""
    try:
        return int(os.environ.get(_RESTART_COUNT, "0")) > 0 and launch_id() is not None
    except ValueError:
        return False


def restart_resumes(folder: str) -> Optional[Dict[str, Any]]:
    """On a restart of a torchrun group (``TORCHELASTIC_RESTART_COUNT > 0``), the checkpoint in
    ``folder`` that this same launch wrote (it then resumes from it without ``--resume``); else
    ``None``. A checkpoint of another launch is left to the usual rules (refused without
    ``--resume`` or ``--force``)."""
    path = layout.RunFolder(folder).last_checkpoint
    if not _restarted() or not os.path.isfile(path):
        return None
    state = load_checkpoint(path)
    return state if state.get("launch") == launch_id() else None


def own_start_launch(resume: bool) -> Optional[str]:
    """The launch whose own start a run on a folder with no checkpoint of its own starts over
    (``RunWriter.check_new_run``'s ``launch``: a folder whose manifest records this torchrun
    launch as its start, with no checkpoint ever completed, is started over as ``--force``
    would, replacing only the files the manifest lists, unchanged; one changed since, or a file
    of the user's where the run writes, still refuses it; the user's other files stay); ``None``
    where the usual rules apply.

    Without ``resume``: on a restart of a torchrun group (a rank died while the run was being
    set up). With ``resume``: a job that a scheduler requeued after its ranks died while the
    run was being set up passes ``--resume`` with the same launch (SLURM keeps the job id, the
    ``--rdzv-id`` of docs/distributed.md's script), and finds nothing to resume. A folder
    another launch started (an earlier torchrun, a run by hand), or an unreadable manifest, is
    left to the usual rules; so is ``--resume`` without torchrun."""
    return launch_id() if resume or _restarted() else None


# ------------------------------------------------------------------------------ each step


class StepFaults:
    """A run's per-step fault handling: the stop signals (agreed on by every rank), the
    non-finite losses (``on_nan``) and the batches left too short by damaged files
    (:meth:`agree_short`). The counters live in the checkpoint."""

    def __init__(self, on_nan: str, parallel: Any, signals: StopSignals, checkpoint: str) -> None:
        self.on_nan, self.parallel, self.signals, self.checkpoint = on_nan, parallel, signals, checkpoint
        self.stop: Optional[str] = None          # the signal every rank agreed to stop on
        self.kept = True                         # whether the last step's update was applied
        self.skipped = 0                         # steps skipped in the whole run (on_nan="skip")
        self.epoch_skipped = 0                   # ... in the current epoch
        self.short = 0                           # steps skipped: a batch short of readable images on some rank
        self.epoch_short = 0                     # ... in the current epoch
        self.last_checkpoint: Optional[Tuple[int, int]] = None  # (step, epochs done) of the last good one
        # on_nan="stop" in one process reads nothing back in a step (on an accelerator a read
        # waits for the step): the first non-finite step and its loss are kept on the device and
        # read at logging steps and before every checkpoint (:meth:`check_deferred`). Skipping a
        # step's update, or agreeing with other ranks, needs the loss read at each step.
        self.defers = on_nan == "stop" and not parallel.active
        self._first_bad: Optional[torch.Tensor] = None   # step of the first non-finite loss (0: none)
        self._bad_loss: Optional[torch.Tensor] = None

    def keep_update(self, loss: torch.Tensor, step: int) -> bool:
        """After the backward pass of step ``step`` (counted from 1), before its update: whether
        to apply it. A non-finite loss raises :class:`NonFiniteLoss` with ``on_nan="stop"``.
        Every rank calls it at the same point (under torchrun the ranks agree here)."""
        loss = loss.detach()
        if self.defers:
            self._note_nonfinite(loss, step)
            self._agreed(self.signals.received is not None)
            self.kept = True
            return True
        bad = not bool(torch.isfinite(loss).all())  # the one read of the loss per step
        stop, bad = self.parallel.any(self.signals.received is not None, bad)
        self._agreed(stop)
        if bad and self.on_nan == "stop":
            found = [value for value in self.parallel.gather_objects(float(loss)) if not math.isfinite(value)]
            raise self.nonfinite(step, found[0] if found else float("nan"))
        self.kept = not bad
        return self.kept

    def _note_nonfinite(self, loss: torch.Tensor, step: int) -> None:
        if self._first_bad is None:
            self._first_bad = torch.zeros((), dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        first = ~torch.isfinite(loss).all() & (self._first_bad == 0)
        self._first_bad = torch.where(first, torch.full_like(self._first_bad, step), self._first_bad)
        self._bad_loss = torch.where(first, loss.to(self._bad_loss.dtype), self._bad_loss)

    def check_deferred(self, step: int) -> None:
        """With ``defers``: raise :class:`NonFiniteLoss` if a loss up to step ``step`` was not
        finite (one read; called at logging steps and before each checkpoint, so no checkpoint
        holds a state a non-finite step updated)."""
        if self._first_bad is None:
            return
        first = int(self._first_bad)
        if first:
            raise self.nonfinite(first, float(self._bad_loss), stopped_at=step)

    def agree_short(self, short: bool) -> bool:
        """Before a step's forward pass: whether to skip it because this rank's batch, or under
        a process group any rank's, was left with too few readable images (``short``: damaged
        files skipped). The ranks agree in one all-reduce of two flags, the stop signal's with
        it (the step reaches no :meth:`keep_update`); a single process asks nothing of anyone.
        Every rank calls it at the same point; a skipped step is counted (``short``)."""
        if self.parallel.active:
            stop, short = self.parallel.any(self.signals.received is not None, short)
            self._agreed(stop)
        if short:
            self.short += 1
            self.epoch_short += 1
        return bool(short)

    def agree_stop(self) -> bool:
        """Whether to stop now (after a checkpoint: a signal that came while it was written stops
        the run there, not a step later). Every rank calls it at the same point."""
        self._agreed(*self.parallel.any(self.signals.received is not None))
        return self.stop is not None

    def _agreed(self, stop: bool) -> None:
        if stop and self.stop is None:
            self.stop = self.signals.received or "a signal another rank received"

    def count_skip(self, model: torch.nn.Module, step: int, loss: float) -> None:
        """Count a skipped step; stop when the model's own state is no longer finite (the forward
        pass changed it), since skipping updates cannot mend that."""
        self.skipped += 1
        self.epoch_skipped += 1
        broken = [name for name, value in model.state_dict().items()
                  if value.is_floating_point() and not bool(torch.isfinite(value).all())]
        if any(self.parallel.any(bool(broken))):
            raise NonFiniteLoss(f"the loss became {loss} at step {step} and the model's state is no longer finite "
                                f"({', '.join(broken[:3]) or 'on another rank'}); skipping updates cannot mend it: "
                                f"{self._last_good()}", step, loss)

    def start_epoch(self) -> None:
        self.epoch_skipped = 0
        self.epoch_short = 0

    def nonfinite(self, step: int, loss: float, stopped_at: Optional[int] = None) -> NonFiniteLoss:
        """The error of a run stopped by the non-finite loss ``loss`` of step ``step``
        (``stopped_at``: the step the run stopped at, when the loss was read there)."""
        where = ("the run stopped before its update" if stopped_at is None or stopped_at == step else
                 f"the run stopped at step {stopped_at}, where the loss is read, writing no checkpoint after step {step}")
        return NonFiniteLoss(f"the training loss became {loss} at step {step}; {where}: "
                             f"{self._last_good()}. Lower --lr or raise --temperature and start over, "
                             "or continue with --resume --on-nan skip to drop the updates of such steps",
                             step, loss)

    def all_skipped(self, epoch: int, step: int) -> NonFiniteLoss:
        """The error of a run whose every step of epoch ``epoch`` was skipped (nothing trains)."""
        return NonFiniteLoss(f"every step of epoch {epoch} (up to step {step}) had a non-finite loss and was skipped: "
                             f"{self._last_good()}. Lower --lr or raise --temperature and start over",
                             step, float("nan"))

    def held_out_damaged(self, err: BaseException, epoch: int) -> ValueError:
        """The error of a run that the online read-out stopped at the end of epoch ``epoch``:
        it read a damaged file (a val image, or a training image of the kNN monitor's memory)
        under ``--bad-files fail`` (``err`` names the file)."""
        return ValueError(f"{err} (read by the online read-out at the end of epoch {epoch}; {self._last_good()}; "
                          "with --no-online-probe a held-out file is read only after training)")

    def _last_good(self) -> str:
        if self.last_checkpoint is None:
            return "no checkpoint was written before it"
        step, epochs = self.last_checkpoint
        return f"the last good checkpoint is {self.checkpoint} (step {step}, {epochs} epoch(s) done), unchanged"

    def state(self) -> Dict[str, Any]:
        return {"skipped_steps": self.skipped, "epoch_skipped": self.epoch_skipped,
                "short_batches": self.short, "epoch_short_batches": self.epoch_short}

    def load_state(self, state: Dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped_steps", 0))
        self.epoch_skipped = int(state.get("epoch_skipped", 0))
        self.short = int(state.get("short_batches", 0))
        self.epoch_short = int(state.get("epoch_short_batches", 0))


def write_failed(err: CheckpointWriteError, step: int, last_good: Optional[Tuple[int, int]]) -> CheckpointWriteError:
    """The one error a run stops with when writing its checkpoint at step ``step`` failed."""
    reason = err.cause.strerror or str(err.cause)
    if err.replaced:
        held = f"the checkpoint of step {step} was already in place and loads"
    elif last_good is not None:
        held = f"the previous checkpoint (step {last_good[0]}, {last_good[1]} epoch(s) done) is intact"
    else:
        held = "no earlier checkpoint exists"
    hint = "free some space, then continue with --resume" if err.errno in DISK_FULL \
        else "continue with --resume once it can be written"
    return CheckpointWriteError(err.path, err.cause, err.replaced,
                                f"could not write the checkpoint {err.path} at step {step}: {reason}; {held}; {hint}")


def disk_full(err: OSError, step: Optional[int], last_good: Optional[Tuple[int, int]],
              trained: bool = False, resume: bool = False) -> OSError:
    """The one error a run stops with when the disk filled up while it wrote a file other than
    its checkpoint (``err`` names the file), at step
    ``step`` (``None``: before the first step, on resume the first of this invocation): what is
    safe, and what to do once space is freed. ``trained``: training had finished (the read-out,
    the summary or the report was being written); ``resume``: the invocation was a ``--resume``."""
    if step is None:
        held = "free some space, then run the same command again" + ("" if resume else " with --force (the folder "
                                                                      "holds only what this run wrote)")
    elif last_good is None:
        held = "no checkpoint was written yet; free some space, then start again with --force"
    elif trained:
        held = (f"training finished and its checkpoint (step {last_good[0]}) is complete; free some space, then "
                "--resume evaluates it again")
    else:
        held = (f"the checkpoint of step {last_good[0]} ({last_good[1]} epoch(s) done) is intact; free some space, "
                "then continue with --resume")
    when = "before training started" if step is None else f"at step {step}"
    return WriteFailed(getattr(err, "path", "") or str(err.filename or ""), getattr(err, "cause", err),
                       f"{err} {when}; {held}")
