"""The pretraining loop, in stages: set-up (:func:`_set_up`: data, model, optimizer, run
folder, the checkpointed state on resume), the training step (:func:`_train_step`), the end of
an epoch (:func:`_end_epoch`: its record, the val numbers, the checkpoint) and the evaluation
(:func:`_summarise`). What depends on the method (its data, batches, model, loss and its own
numbers) is asked of its :class:`~contrastkit.methods.Method`; the loop never looks at
the method's name.

Outputs in ``config.out``: ``config.json`` (resolved configuration), ``config.yaml`` (the same
options as a ``--config`` file), ``metrics.jsonl`` (one JSON record per logged step and per
epoch; with ``loggers`` also ``metrics.csv`` / ``tensorboard/``, :mod:`.loggers`),
``checkpoints/last.pt`` (written atomically each epoch, every ``checkpoint_every`` steps and at
a preemption signal; :mod:`.faults`) and ``summary.json`` (final numbers;
with ``eval_every`` also those of the epoch the val probe selected,
:mod:`contrastkit.train.selection`),
each recorded in the folder's manifest (:mod:`contrastkit.manifest`) as it is written, so that
``--force`` deletes exactly these. While it works the run holds ``contrastkit.lock`` in the folder.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import random
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from contrastkit import layout, records
from contrastkit.losses import value_checks
from contrastkit import __version__
from contrastkit._io import DISK_FULL
from contrastkit.run_writer import FolderStart, RunWriter

from contrastkit.data import (BadItemError, DataSplits, IndexBatchSource, OnDevicePlan, StepBatch, StreamBatchSource,
                              add_skipped, as_data, data_record, hold_on_device, is_iterable_data, read_held_out_files,
                              CollectionChangedError, check_collection_changed, reading_held_batches, skipped_files,
                              skipped_reasons)
from contrastkit.distributed import rank_seed
from contrastkit.methods import (RESUME_MAY_CHANGE, method_data, DataChoices, EvalContext, Method, PretrainConfig, average_gradients,
                                 build_lr_scheduler, build_model, build_optimizer, get_method, limit_data,
                                 resolve_for_data, warmup_cosine)
from contrastkit.methods.config import ABSENT_FROM_OLD_RECORDS
from contrastkit.methods.optimization import warmup_steps
from contrastkit.methods.precision import StepPrecision, channels_last_batch
from contrastkit.methods.step import after_optimizer_step, before_loss, keeps_sample_state
from contrastkit.methods.tap import BatchTap
from contrastkit.metrics.batch import batch_warnings, diagnostics_record
from contrastkit.metrics.readout import ReadoutPartFailed, extract_features
from contrastkit.metrics.temperatures import TemperatureHistogram
from contrastkit.models import OBJECT_PREFIX, describe_encoder, unwrap_encoder

from .checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint
from .faults import (Preempted, ReadoutFailed, RunGuard, StepFaults, disk_full, launch_id, restart_resumes,
                     restarts_allowed, own_start_launch, write_failed)
from .evaluate import evaluate_model, readout_views
from .last_batch import save_last_batch
from .loggers import Loggers, open_loggers
from .online import OnlineProbe, OnlineViewRetrieval
from .parallel import LossForward, Parallel, setup
from .runs import tell_index_note
from .selection import SELECTION_SCORES, val_probe_accuracy
from .state import Trainables, TrainState
from .setup import compile_encoder, compile_failure, eager_calls, limit_threads, resolve_device

__all__ = ["pretrain", "warmup_cosine", "OUTPUT_FILES"]

OUTPUT_FILES = layout.RUN_OUTPUTS


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_resumable(state: Dict[str, Any], config: PretrainConfig, path: str) -> None:
    stored = state["config"]
    if not isinstance(stored, dict):
        raise ValueError(f"checkpoint {path} has no readable configuration")
    # A key added since the checkpoint was written has its default there, or what its absence meant.
    stored = {**PretrainConfig().to_dict(), **ABSENT_FROM_OLD_RECORDS, **stored}
    current = config.to_dict()
    differing = sorted(key for key in set(stored) | set(current)
                       if key not in RESUME_MAY_CHANGE and stored.get(key) != current.get(key))
    if differing:
        details = ", ".join(f"{key}: checkpoint {stored.get(key)!r} vs now {current.get(key)!r}" for key in differing)
        raise ValueError(f"checkpoint {path} was written by a different configuration ({details}); "
                         "resume with the same options or start over with --force")
    if int(state["epoch"]) > config.epochs:
        raise ValueError(f"checkpoint {path} already has {state['epoch']} epochs, more than --epochs {config.epochs}")


class _Progress:
    """rich progress bar (loss, tau, images/s, ETA); a no-op when disabled."""

    def __init__(self, enabled: bool, total: int, completed: int) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  tau {task.fields[tau]}  {task.fields[speed]} img/s"
                       "{task.fields[online]}"),
            TimeRemainingColumn(), transient=False,
        )
        self.task = self.progress.add_task("pretrain", total=total, completed=completed,
                                           epoch="-", loss="-", tau="-", speed="-", online="")
        self.progress.start()

    def warn(self, message: str) -> None:
        """A one-line warning in the run's output (above the bar when there is one)."""
        if self.enabled:
            self.progress.console.print(message, style="yellow", markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)

    def update(self, advance: int, **fields: str) -> None:
        if self.enabled:
            self.progress.update(self.task, advance=advance, **fields)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()


def pretrain(
    config: PretrainConfig,
    *,
    resume: bool = False,
    force: bool = False,
    progress: Optional[bool] = None,
    dataset: Any = None,
    views: Any = None,
    on_epoch_end: Optional[Callable[[int, Dict[str, Any]], None]] = None,
    baselines: bool = True,
    encoder: Optional[torch.nn.Module] = None,
    transform: Optional[Callable[[torch.Tensor], Any]] = None,
    on_summary: Optional[Callable[[Dict[str, Any]], None]] = None,
    collection_changed: str = "stop",
) -> Optional[Dict[str, Any]]:
    """Train ``config.method`` on ``config.data`` and evaluate it; returns the summary dict
    (also written to ``config.out/summary.json``).

    Args:
        config: the run's options (validated and completed here).
        resume: continue from ``config.out/checkpoints/last.pt``.
        force: start over in a non-empty ``config.out`` (deletes the files a run writes).
        progress: show the rich progress bar; ``None`` means "if stderr is a terminal".
        dataset, views: an already loaded data set and batch maker (by default the method's
            :meth:`~contrastkit.methods.Method.load_data` / ``batches``:
            ``contrastkit.data.load_dataset`` / ``make_views`` from the config for the
            two-view methods). ``dataset`` may also be any map-style
            ``torch.utils.data.Dataset`` of ``(image, label)`` (val and test are carved out of
            it) or a dict of them with keys ``train`` (and ``val``, ``test``): it is then
            streamed (:func:`contrastkit.data.as_streaming`), as an image folder is with
            ``config.workers > 0``. For ``convirt`` and ``siglip`` the same with items
            ``(image, text)`` (:func:`contrastkit.data.as_streaming_pairs`: the texts read once,
            the images decoded in the workers).
        on_epoch_end: called as ``on_epoch_end(epoch, record)`` after each epoch's checkpoint
            (on every rank under torchrun).
        baselines: also evaluate the random-init and raw-pixel baselines (a sweep of many
            runs on the same data may skip them).
        encoder: any ``nn.Module`` mapping ``(N, C, H, W)`` to ``(N, D)`` or ``(N, D, ...)``
            (pooled), used instead of ``config.encoder``. The run records its class path
            (``config.encoder``), so ``contrastkit probe`` can rebuild it when the class can be
            imported with no arguments; otherwise pass it again to
            :func:`~contrastkit.train.evaluate_run`. At the end ``encoder`` holds the trained
            weights.
        transform: a per-image augmentation that makes the two views in the ``DataLoader``
            workers instead of the kornia views on the training device (the two-view methods):
            a ``torchvision.transforms.v2`` pipeline, or any callable from one ``(C, H, W)``
            image tensor (uint8 as decoded, float in ``[0, 1]`` for float data) to a view of the
            same shape, uint8 or float in ``[0, 1]`` (no normalisation: the encoder reads
            ``[0, 1]`` images). It is applied twice per image of a training batch, under a
            seed of ``(seed, epoch, item)``, so the views do not depend on ``config.workers``
            and a resumed run stays exact; pass the same transform again to resume.
        on_summary: called as ``on_summary(summary)`` on rank 0 once ``summary.json`` is
            written, while the run still holds its folder's lock (``contrastkit pretrain``
            writes ``report.html`` there, so that no other run can take the folder before the
            report of this one is written).
        collection_changed: what ``resume`` does when the run's unlabeled collection changed
            (files added or gone) since the run recorded its listing in
            ``collection-index.npz``: ``"stop"`` (an error naming the change), ``"reindex"``
            (the collection listed again and recorded) or ``"keep"`` (the recorded files still
            there); an unchanged collection is read from the record, not listed again.

    Batches come from a ``torch.utils.data.DataLoader`` over the training split whose batch
    sampler (:class:`~contrastkit.data.EpochBatchSampler`) yields the epoch's shuffled
    indices; a streamed split is decoded in ``config.workers`` worker processes, the views
    are made from the decoded batch on the training device.

    The per-epoch shuffling uses its own generator seeded from ``(seed, epoch)``; the views
    draw from torch's global RNG, whose state (with numpy's and python's) is checkpointed,
    so a resumed run on CPU ends with the same weights as an uninterrupted one.

    Under ``torchrun`` (``WORLD_SIZE > 1``) the processes train one model data-parallel
    (:mod:`contrastkit.train.parallel`): ``batch_size`` is the global batch, split evenly over
    the ranks by a ``DistributedSampler``; only rank 0 writes files and evaluates, and the
    other ranks return ``None``. Resuming needs the same number of processes.
    """
    if encoder is not None and not isinstance(encoder, torch.nn.Module):
        raise TypeError(f"encoder must be a torch.nn.Module, got {type(encoder).__name__}")
    check_collection_changed(collection_changed)
    if collection_changed != "stop" and not resume:
        raise ValueError(f"--collection-changed {collection_changed} applies to --resume (a new run lists its data "
                         "as it is now)")
    config = config.resolved()
    with limit_threads(config.threads), RunGuard() as guard:
        return _pretrain(config, resume, force, progress, dataset, views, on_epoch_end, baselines, encoder,
                         transform, guard, on_summary, collection_changed)


def _pretrain(config: PretrainConfig, resume: bool, force: bool, progress: Optional[bool], dataset: Any,
              views: Any, on_epoch_end: Optional[Callable[[int, Dict[str, Any]], None]],
              baselines: bool = True, encoder: Optional[torch.nn.Module] = None,
              transform: Optional[Callable[[torch.Tensor], Any]] = None,
              guard: Optional[RunGuard] = None,
              on_summary: Optional[Callable[[Dict[str, Any]], None]] = None,
              collection_changed: str = "stop") -> Optional[Dict[str, Any]]:
    # A full disk before the first step: a folder with a checkpoint is continued with --resume,
    # never started over with --force.
    with _on_full_disk(lambda err: disk_full(
            err, None, None, resume=resume or os.path.isfile(layout.RunFolder(config.out).last_checkpoint))):
        run = _set_up(config, resume, force, dataset, views, encoder, transform, guard or RunGuard(),
                      collection_changed)
        if run.plan.parallel.is_main:
            run.writer.write_config_file(run.plan.config.to_dict())
            run.writer.mark_logger_files(run.plan.config.loggers)  # recorded when the loggers close
            run.monitor.loggers = open_loggers(run.plan.config.loggers, run.folder, resume_step=run.state.step if run.resumed else None)
    try:
        with _on_full_disk(lambda err: disk_full(err, run.state.step, run.faults.last_checkpoint)):
            _train(run, progress, on_epoch_end)
        # The checkpoint is complete: a preemption signal from now on stops the run at once.
        run.guard.signals.raise_from_now(lambda name: _preempted(run, name))
        run.data.source.close()  # ends the persistent workers before the evaluation starts its own
        # Each rank met the damaged files of its own share of the batches: rank 0 names them all.
        add_skipped(run.data.dataset, run.data.source.skipped)
        met_by_rank = run.plan.parallel.gather_objects(skipped_reasons(run.data.dataset))
        if run.plan.parallel.is_main:
            for found in met_by_rank[1:]:
                add_skipped(run.data.dataset, found)
        if not run.plan.parallel.is_main:
            run.plan.parallel.barrier()  # rank 0 evaluates and writes the summary
            _leave_group(run)
            _return_encoder(run, encoder)
            return None
        with _after_training(run):
            with eager_calls(run.plan.config.compile):
                summary = _summarise(run, baselines)
    except BaseException:
        # The error on its way is the one to report: closing the loggers on the full disk that
        # stopped the run fails too, and must not replace it.
        with contextlib.suppress(OSError):
            _close_loggers(run)
        raise
    with _after_training(run):
        _close_loggers(run)
        _confirm_listing(run)
        run.writer.write_summary(summary)
        if on_summary is not None:
            on_summary(summary)  # (rank 0 alone gets here; the folder's lock is held until pretrain returns)
    run.plan.parallel.barrier()
    _leave_group(run)
    _return_encoder(run, encoder)
    return summary


def _confirm_listing(run: "_Training") -> None:
    """A collection's listing recorded within seconds of a change to its folders (a collection
    written just before the run) cannot tell a later change by the folders' times, so every
    command would list it again: now, at the run's end, it is listed once more and, the same
    files, recorded again (rank 0, while the run holds its folder). A collection that changed
    during the run keeps the record it trained from (the next command names the change)."""
    listing = run.data.listing
    racy = getattr(getattr(listing, "fingerprint", None), "racy", None)
    if racy is None or not racy():
        return
    try:
        opened = method_data(run.plan.method, run.plan.config, index=run.folder.collection_index)
    except CollectionChangedError:
        return
    if getattr(opened, "index_state", None) == "verified":
        run.writer.write_collection_index(opened.index.write)


def _close_loggers(run: "_Training") -> None:
    run.monitor.loggers.close()
    if run.plan.parallel.is_main:
        run.writer.record_logger_files()


@contextlib.contextmanager
def _on_full_disk(stop: Callable[[OSError], OSError]) -> Any:
    """A full disk while the block writes a file other than the checkpoint (whose own error,
    :func:`.faults.write_failed`, says what is safe): the run stops with ``stop(err)``, the one
    error that says at which point and what to do (:func:`.faults.disk_full`)."""
    try:
        yield
    except OSError as err:
        if err.errno not in DISK_FULL or isinstance(err, CheckpointWriteError):
            raise
        raise stop(err) from err


def _after_training(run: "_Training") -> Any:
    """:func:`_on_full_disk` while the read-out, the summary or the report is written: the
    trained checkpoint is complete, and ``--resume`` evaluates it again."""
    return _on_full_disk(lambda err: disk_full(err, run.state.step, run.faults.last_checkpoint, trained=True))


def _leave_group(run: "_Training") -> None:
    """Free the run's DDP wrapper, then leave the process group (where the run joined it).

    A reference cycle keeps the wrapper, and through it the group's backend, alive past
    ``destroy_process_group`` until the next garbage collection, or the interpreter's shutdown,
    where freeing the backend's threads can abort a rank that finished its work."""
    if run.plan.parallel.active:
        run.trainables.step_loss = None
        gc.collect()
    run.plan.parallel.teardown()


def _preempted(run: "_Training", signal_name: Optional[str] = None) -> Preempted:
    """The stop of a run whose checkpoint holds its current step."""
    return Preempted(signal_name or run.faults.stop or "a signal", run.state.step, run.folder.last_checkpoint,
                     rank=run.plan.parallel.rank if run.plan.parallel.active else None)


def _return_encoder(run: "_Training", encoder: Optional[torch.nn.Module]) -> None:
    """The caller's encoder module gets the trained weights (after the baseline was built)."""
    if encoder is not None:
        encoder.load_state_dict(unwrap_encoder(run.trainables.model.encoder).state_dict())


@dataclass(frozen=True)
class _Plan:
    """What a run settles before its first step and keeps: the configuration completed by the
    data, the method, where it runs and the batches' and steps' counts."""

    config: PretrainConfig
    method: Method
    parallel: Parallel
    device: torch.device
    batch_size: int         # global batch
    rank_batch: int         # this rank's share of it
    steps_per_epoch: int
    total_steps: int
    data_choices: DataChoices  # what the data decided (resolve_for_data: the batch size and why, the queue)
    warmup_steps: int = 0   # settled with the learning-rate schedule (_build_trainables)


@dataclass
class _Data:
    """What a run reads: the data set the read-out reads (``dataset``; of a stream, its
    map-style read-out), the method's batch maker, the text tokenizer (paired methods), the
    training batches and whether the training images are held on the device."""

    dataset: DataSplits
    batches: Any            # the method's batch maker: batches(split, indices) -> batch
    tokenizer: Any          # the run's text tokenizer (paired methods), else None
    stream: Any             # the training split when it is a stream (contrastkit.data.iterable), else None
    source: Any = None      # IndexBatchSource or StreamBatchSource (set_epoch before each epoch)
    on_device: Optional[OnDevicePlan] = None
    # An unlabeled collection's listing to record in the run folder (None: none, or the recorded one, unchanged)
    listing: Any = None

    @property
    def training_split(self) -> Any:
        """The split the training batches are of (the stream, or the training split read by
        index): what the batch maker is handed a batch of and asked for it by."""
        return self.stream if self.stream is not None else self.dataset.train


@dataclass
class _Monitor:
    """What a run watches while it trains (rank 0 writes it): the loggers, the logged steps'
    batch tap, the per-anchor temperatures' histogram and the warnings printed."""

    loggers: Loggers = field(default_factory=Loggers)  # --logger; metrics.jsonl is separate
    tap: BatchTap = field(default_factory=BatchTap)  # what the logged steps' loss saw
    # A temperature method's per-anchor temperatures over the epoch (None: one tau for all anchors).
    tau_histogram: Optional[TemperatureHistogram] = None
    warned: Dict[str, int] = field(default_factory=dict)  # warning kind -> the first step it was printed
    previous_steps: List[Dict[str, Any]] = field(default_factory=list)  # the last step records written


@dataclass
class _Training:
    """One pretraining invocation, by concern: its plan, its data, what the optimizer changes
    (:class:`~.state.Trainables`), the counters its checkpoint restores
    (:class:`~.state.TrainState`), its folder's writer, its fault handling and its monitor."""

    plan: _Plan
    data: _Data
    trainables: Trainables
    state: TrainState
    writer: RunWriter       # every file of the run folder is written through it (rank 0)
    faults: StepFaults      # stop signals, non-finite losses, short batches
    guard: RunGuard         # the stop signals and the folder lock (.faults)
    started: float          # when this invocation started
    resumed: bool           # continues a checkpoint (--resume, or a restarted torchrun group)
    monitor: _Monitor = field(default_factory=_Monitor)
    epoch_started: float = 0.0  # when this invocation started the epoch in progress

    @property
    def folder(self) -> layout.RunFolder:
        return self.writer.folder

    def eval_context(self) -> EvalContext:
        return EvalContext(self.trainables.model, self.data.dataset, self.data.batches, self.plan.device,
                           self.plan.config, self.plan.batch_size)


# -- set-up -------------------------------------------------------------------------------

def _set_up(config: PretrainConfig, resume: bool, force: bool, dataset: Any, views: Any,
            encoder: Optional[torch.nn.Module] = None,
            transform: Optional[Callable[[torch.Tensor], Any]] = None, guard: Optional[RunGuard] = None,
            collection_changed: str = "stop") -> _Training:
    """Everything before the first step, by concern: where the run works (process group,
    device, the folder's lock) and whether it resumes or starts over (:func:`_restart_policy`);
    its data (:func:`_open_data`); its plan (:func:`_plan`); the model and its training forward
    (:func:`_build_model`); the training batches (:func:`_batch_source`); the optimizer and its
    schedule (:func:`_build_trainables`); on resume the checkpointed state (:func:`_restore`);
    last, the folder (:func:`_start_folder`), so that a refusal anywhere before leaves it as it was."""
    guard = guard or RunGuard()
    started = time.perf_counter()
    method = get_method(config.method)
    device, parallel = _where(config)
    precision = StepPrecision(config.precision, device)  # an unsupported precision is refused before any work
    writer = RunWriter(config.out)
    start, restart_state = _restart_policy(config, resume, force, parallel, guard, writer)
    _seed_everything(config.seed)
    config, data = _open_data(config, method, parallel, start.resume, dataset, views, transform, encoder,
                              collection_changed, writer.folder)
    plan = _plan(config, method, parallel, device, _sample_count(data))
    config = plan.config
    if data.batches is None:
        data.batches = method.batches(data.dataset, config, device, data.tokenizer, transform=transform)
        if data.stream is not None:  # made for the read-out's sample; the training batches are the loader's
            data.batches = reading_held_batches(data.batches)
    model, step_loss = _build_model(plan, data, encoder, start)
    data.source, data.on_device = _batch_source(plan, data)
    faults = StepFaults(config.on_nan, parallel, guard.signals, writer.folder.last_checkpoint)
    plan, trainables = _build_trainables(plan, data, model, step_loss, precision, encoder)
    trainables.online = _online_probe(plan, data, model)
    monitor = _Monitor(tau_histogram=TemperatureHistogram(device)
                       if getattr(model, "temperature_method", None) is not None else None)
    run = _Training(plan, data, trainables, TrainState(faults), writer, faults, guard, started, start.resume, monitor)
    if start.resume:
        _restore(run, restart_state)
    _start_folder(run, start)
    return run


def _where(config: PretrainConfig) -> Tuple[torch.device, Parallel]:
    """The training device and the process group (under torchrun: joined, a GPU per rank)."""
    device = resolve_device(config.device)
    parallel = setup(device)
    if parallel.active and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return device, parallel


def _restart_policy(config: PretrainConfig, resume: bool, force: bool, parallel: Parallel, guard: RunGuard,
                    writer: RunWriter) -> Tuple[FolderStart, Optional[Dict[str, Any]]]:
    """Take the folder's lock (a folder another run holds is refused) and decide, on rank 0 for
    every rank, whether the run resumes or starts over (:meth:`RunWriter.check_new_run`):
    ``(start, restart_state)``, ``restart_state`` the checkpoint a restarted torchrun group
    resumes from (:func:`.faults.restart_resumes`; rank 0's, ``None`` on the others)."""
    parallel.run_on_main(lambda: guard.hold(config.out))
    restart_state = parallel.run_on_main(lambda: restart_resumes(config.out))

    def decide() -> Tuple[bool, FolderStart]:
        if restart_state is not None:  # the checkpoint this launch wrote: resumed without --resume
            return True, writer.check_new_run(True, False)
        # A restart before the first checkpoint: the folder this launch started (its manifest says
        # so); so is --resume of a requeued job (the same launch) that never reached its first checkpoint.
        return False, writer.check_new_run(resume, force, launch=own_start_launch(resume))

    restarted, start = parallel.run_on_main(decide, share=True)
    if parallel.is_main:
        if restarted and not resume:
            print(f"torchrun restarted the group: resuming from {writer.folder.last_checkpoint} "
                  f"(step {restart_state['step']})", file=sys.stderr, flush=True)
        elif start.own_start_over and not resume:
            print(f"torchrun restarted the group before the run's first checkpoint: starting the run over in "
                  f"{config.out}", file=sys.stderr, flush=True)
        elif start.own_start_over:
            print(f"--resume: {config.out} holds no checkpoint; this launch ({launch_id()}) started it and stopped "
                  "before the run's first checkpoint: starting the run over in it", file=sys.stderr, flush=True)
    return start, restart_state


def _open_data(config: PretrainConfig, method: Method, parallel: Parallel, resume: bool, dataset: Any, views: Any,
               transform: Any, encoder: Optional[torch.nn.Module], collection_changed: str,
               folder: layout.RunFolder) -> Tuple[PretrainConfig, _Data]:
    """The run's data (``dataset``, the caller's, or ``config.data`` opened by the method), cut
    to its subsets and checked against the method; a stream's read-out sample for the
    read-out. The configuration records a caller's encoder (how to rebuild it). A resumed run
    reads an unlabeled collection from the listing it recorded while the collection is
    unchanged (``collection_changed``: what a change does); the listing to record is kept."""
    if dataset is None:
        opened = method_data(method, config, index=folder.collection_index if resume else None,
                             collection_changed=collection_changed)
        if parallel.is_main:
            tell_index_note(opened)
    else:
        opened = as_data(dataset)
    listing = getattr(opened, "index", None) if getattr(opened, "index_state", "recorded") != "recorded" else None
    if config.eval_data is not None and opened.num_classes and getattr(opened, "held_out", None) is None:
        raise ValueError(f"--eval-data judges an encoder trained on unlabeled data, or gives labelled tar shards "
                         f"their held-out shards; {config.data} has class labels and its own val and test splits "
                         "(leave --eval-data out)")
    stream = opened.train if is_iterable_data(opened) else None
    full = opened
    if stream is not None:  # the read-out reads a bounded sample of the stream, map-style
        _check_streamable(config, views, transform, stream, parallel.world_size)
        opened = opened.readout(config.workers)
    dataset = limit_data(opened, config)
    if config.paired and getattr(dataset.train, "texts", None) is None:
        raise ValueError(f"{config.method} trains on (image, text) pairs; the data set's items are (image, label) "
                         "(pass paired data: contrastkit.data.as_streaming_pairs, or items (image, str))")
    if method.needs_labels and not dataset.num_classes:
        raise ValueError(f"{config.method} needs class labels; the data set {dataset.name!r} has none")
    if encoder is not None:  # record how to rebuild it: its class path, or that it was an object
        config = replace(config, encoder=describe_encoder(encoder, dataset.image_shape[0]), encoder_options={})
    if views is not None and transform is not None:
        raise ValueError("pass views (a batch maker of your own) or transform (views made in the workers), not both")
    # A stream's tokenizer is built from every training caption, not the read-out's sample of them.
    tokenizer = method.run_tokenizer(dataset if stream is None else full, config.out, resume)
    return config, _Data(dataset, views, tokenizer, stream, listing=listing)


def _sample_count(data: _Data) -> int:
    """The training samples of an epoch: the split's, or a stream's count of one pass."""
    return len(data.dataset.train) if data.stream is None else int(data.stream.num_samples)


def _plan(config: PretrainConfig, method: Method, parallel: Parallel, device: torch.device, n_train: int) -> _Plan:
    """The batch sizes and the steps: what the data decide (the batch size not given, the
    queue, :func:`~contrastkit.methods.resolve_for_data`); the last partial batch of an epoch is
    dropped (a fixed batch size), under torchrun from each rank's share."""
    config, choices = resolve_for_data(config, n_train, world_size=parallel.world_size)
    batch_size = choices.step_batch
    rank_batch = batch_size // parallel.world_size
    steps_per_epoch = (n_train // parallel.world_size) // rank_batch
    total_steps = steps_per_epoch * config.epochs
    return _Plan(config, method, parallel, device, batch_size, rank_batch, steps_per_epoch, total_steps, choices)


def _build_model(plan: _Plan, data: _Data, encoder: Optional[torch.nn.Module],
                 start: FolderStart) -> Tuple[torch.nn.Module, Any]:
    """The model at its initialisation (from ``encoder``, a caller's module, or the configured
    one) and its training forward (DDP-wrapped under torchrun)."""
    config, parallel, device = plan.config, plan.parallel, plan.device
    model = build_model(config, data.dataset.image_shape, data.tokenizer, encoder=encoder,
                        train_size=plan.data_choices.train_size).to(device)
    if model.weights_report is not None and parallel.is_main:
        _check_weights_unchanged(config, model.weights_report, start)
        print(model.weights_report.summary(), file=sys.stderr, flush=True)
    if config.compile:  # the training steps' encoder; the read-out calls it eagerly (eager_calls)
        compile_encoder(model.encoder)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    step_loss: Any = LossForward(model, plan.method)
    if parallel.active:
        model.distributed = True
        step_loss = torch.nn.parallel.DistributedDataParallel(step_loss)
        torch.manual_seed(rank_seed(config.seed, parallel.rank))  # different views on each rank
    return model, step_loss


def _build_trainables(plan: _Plan, data: _Data, model: torch.nn.Module, step_loss: Any, precision: StepPrecision,
                      encoder: Optional[torch.nn.Module]) -> Tuple[_Plan, Trainables]:
    """The optimizer and the learning-rate schedule (the plan gets its warm-up steps); a
    temperature method that keeps a state per training sample is refused on a stream."""
    config = plan.config
    if data.stream is not None and keeps_sample_state(model):
        raise ValueError(f"--temperature-method {config.temperature_method} keeps a state per training sample, by "
                         "its index; a stream's samples have no index (choose a method without per-sample state)")
    optimizer = build_optimizer(model, config)
    scheduler = build_lr_scheduler(optimizer, config, plan.total_steps)
    plan = replace(plan, warmup_steps=warmup_steps(config, plan.total_steps))
    return plan, Trainables(model, optimizer, scheduler, precision, step_loss=step_loss, schedule=config.schedule,
                            given_encoder=encoder if config.encoder.startswith(OBJECT_PREFIX) else None)


def _online_probe(plan: _Plan, data: _Data, model: torch.nn.Module) -> Optional[Any]:
    """The online read-out (``--online-probe``): on labelled data the online probe and kNN
    monitor, its hook on the encoder; on images without labels the online view retrieval;
    ``None`` without the option and for image-text pairs without labels."""
    config = plan.config
    _check_select_by(config, data.dataset, plan.method)
    if not config.online_probe:
        return None
    if data.dataset.num_classes:
        online: Any = OnlineProbe(model.encoder.out_dim, data.dataset.num_classes, plan.device, seed=config.seed,
                                  knn_k=config.knn_k, knn_temperature=config.knn_temperature, parallel=plan.parallel)
    elif not plan.method.paired:
        online = OnlineViewRetrieval(readout_views(config, data.dataset, plan.device), plan.device, seed=config.seed,
                                     parallel=plan.parallel)
    else:
        return None
    online.attach(model.encoder)
    return online


def _check_select_by(config: PretrainConfig, dataset: Any, method: Method) -> None:
    """A ``select_by`` the data can give, or a ``ValueError`` naming what can (the
    configuration checked the rest, :meth:`PretrainConfig.resolved`)."""
    labelled = bool(dataset.num_classes)
    if config.select_by in ("online_probe", "online_knn") and not labelled:
        raise ValueError(f"--select-by {config.select_by} needs class labels, and {dataset.name} has none: select by "
                         + ("val_probe (image-text pairs have no online read-out)" if method.paired
                            else "online_view_retrieval"))
    if config.select_by == "online_view_retrieval" and (labelled or method.paired):
        raise ValueError(f"--select-by online_view_retrieval is for images without labels; {dataset.name} "
                         + ("has class labels: select by online_probe, online_knn or val_probe" if labelled
                            else "holds image-text pairs: select by val_probe"))


def _batch_source(plan: _Plan, data: _Data) -> Tuple[Any, OnDevicePlan]:
    """The training batches (a stream's, or the split's by index) and whether the training
    images are held on the device (``--data-on-device``)."""
    config, parallel, device = plan.config, plan.parallel, plan.device
    if data.stream is not None:
        on_device = OnDevicePlan(False, "a stream is read front to back", 0)
        source: Any = StreamBatchSource(data.stream, batch_size=plan.rank_batch, steps_per_epoch=plan.steps_per_epoch,
                                        seed=config.seed, rank=parallel.rank, world_size=parallel.world_size,
                                        workers=config.workers, device=device)
    else:
        views, train = data.batches, data.dataset.train
        # a batch maker whose views the workers make says what they read (items of two views)
        items = views.training_items(train) if hasattr(views, "training_items") else train
        on_device = hold_on_device(config.data_on_device, views, train, device, workers=config.workers)
        source = IndexBatchSource(train, batch_size=plan.rank_batch, seed=config.seed, rank=parallel.rank,
                                  world_size=parallel.world_size, items=items, workers=config.workers,
                                  device=device, hold=on_device.hold)
    if parallel.is_main and (config.data_on_device != "auto" or device.type != "cpu"):
        # The default on the CPU holds nothing and measures nothing: config.json records it, quietly.
        print(on_device.message, file=sys.stderr, flush=True)
    return source, on_device


def _start_folder(run: _Training, start: FolderStart) -> None:
    """Rank 0 opens the run folder (:meth:`RunWriter.start`: with ``--force`` the previous
    run's files deleted; the torchrun launch recorded, so that a restarted group knows its own
    start; the method's own files; on resume the metrics cut back to the checkpoint;
    ``config.json``) and says what the data chose."""
    plan, method, model = run.plan, run.plan.method, run.trainables.model
    config = plan.config

    def open_folder() -> None:
        told = plan.data_choices.describe()
        if told is not None:
            print(f"{told} ({plan.steps_per_epoch:,} steps an epoch, {plan.total_steps:,} in {config.epochs} epochs, "
                  f"{plan.warmup_steps:,} of warm-up)", file=sys.stderr, flush=True)
        # What the data chose; a resumed run keeps the record of the run it continues (its saved
        # configuration, batch size included, is the one it resumes with).
        derived = _derived(run, plan.data_choices.record() or (_recorded_defaults(start) if start.resume else {}))
        run.writer.start(start, launch=launch_id(), method_files=lambda folder: method.save_run_files(model, folder),
                         config=config.to_dict(), derived=derived,
                         resumed_at=(run.state.epoch, run.state.step) if start.resume else None)
        if run.data.listing is not None:
            run.writer.write_collection_index(run.data.listing.write)

    plan.parallel.run_on_main(open_folder)


def _check_streamable(config: PretrainConfig, views: Any, transform: Any, stream: Any, world_size: int) -> None:
    """Refuse, before any work and one line each naming the option, what cannot read a stream
    (an iterable training split, :mod:`contrastkit.data.iterable`)."""
    StreamBatchSource.check_readers(stream, world_size, config.workers)
    if config.data_on_device == "on":
        raise ValueError(f"--data-on-device on holds the training images on the device; {config.data} is a stream, "
                         "read front to back (leave --data-on-device at auto or off)")
    if config.train_limit is not None:
        raise ValueError(f"--train-limit draws a subset of a split read by index; {config.data} is a stream (an epoch "
                         "is its sample count: write a smaller stream, or lower --epochs)")
    if transform is not None:
        raise ValueError("transform= makes the views in the DataLoader workers of a split read by index; a stream's "
                         "views are made on the training device (the kornia views: leave transform out)")
    if views is not None:
        raise ValueError("views= (a batch maker of your own) reads the training split by index; a stream has none "
                         "(leave views out)")


def _recorded_defaults(start: FolderStart) -> Dict[str, Any]:
    """``derived.defaults`` of the run a resume continues (``{}`` for a run that recorded none)."""
    recorded = start.previous.get("defaults")
    return recorded if isinstance(recorded, dict) else {}


def _restore(run: _Training, state: Optional[Dict[str, Any]] = None) -> None:
    """Continue from ``checkpoints/last.pt`` (``state``: already loaded): weights, optimizer,
    schedule, RNG, counters and the position in the epoch in progress."""
    path = run.folder.last_checkpoint
    if state is None:
        state = load_checkpoint(path)  # a damaged last.pt is refused, naming previous.pt and how to use it
    _check_resumable(state, run.plan.config, path)
    run.state.load_state_dict(state, run.plan.parallel.rank, run.plan.parallel.world_size, path)
    run.data.source.check_position(run.state.data)  # e.g. a stream's position is for the --workers it was read with
    run.trainables.load_state_dict(state, path, run.plan.config.precision)


def _check_weights_unchanged(config: PretrainConfig, report: Any, start: FolderStart) -> None:
    """A resumed run reads its ``encoder_weights`` file again (its starting-point baseline is
    built from it): the file must be the one the run started from."""
    recorded = start.previous.get("encoder_weights") or {}
    if isinstance(recorded, dict) and recorded.get("sha256") not in (None, report.sha256):
        raise ValueError(f"the encoder weights file {report.path} changed since the run in {config.out} started from "
                         "it (SHA-256 differs); resume with the file as it was")


def _derived(run: _Training, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """``config.json``'s ``derived``: what the run worked out from its configuration and data;
    ``defaults``: what the data chose and why (:meth:`DataChoices.record
    <contrastkit.methods.config.DataChoices.record>`; ``{}`` when every such option was given);
    for a run started from a weights file, what that file gave the encoder."""
    dataset = run.data.dataset
    report = getattr(run.trainables.model, "weights_report", None)
    return {**({"encoder_weights": report.to_dict()} if report is not None else {}),
            "batch_size": run.plan.batch_size, "steps_per_epoch": run.plan.steps_per_epoch, "total_steps": run.plan.total_steps,
            "warmup_steps": run.plan.warmup_steps, "defaults": defaults, "device": str(run.plan.device),
            "data_on_device": run.data.on_device.record() if run.data.on_device is not None else None,
            "dataset": data_record(dataset),
            **({"stream": run.data.source.record()} if hasattr(run.data.source, "record") else {}),
            "views": getattr(run.data.batches, "config", None),
            "parameters": sum(p.numel() for p in run.trainables.model.encoder.parameters()),
            "world_size": run.plan.parallel.world_size,
            "versions": {"contrastkit": __version__, "torch": torch.__version__,
                         "python": platform.python_version()}}


# -- training -----------------------------------------------------------------------------

def _train(run: _Training, progress: Optional[bool],
           on_epoch_end: Optional[Callable[[int, Dict[str, Any]], None]]) -> None:
    """The remaining epochs, each ending with its record and checkpoint."""
    show = (sys.stderr.isatty() if progress is None else progress) and run.plan.parallel.is_main
    bar = _Progress(show, run.plan.total_steps, run.state.step)
    run.trainables.model.train()
    try:  # metrics.jsonl grows all through training: marked as being written until it is closed
        with (run.writer.appending_metrics() if run.plan.parallel.is_main else open(os.devnull, "w")) as metrics:
            if restarts_allowed() and not run.resumed:  # a restart before the first checkpoint resumes too
                _write_checkpoint(run, torch.zeros(()), 0)
            while run.state.epoch < run.plan.config.epochs:
                run.epoch_started = time.perf_counter()
                loss_sum = _train_epoch(run, metrics, bar)
                if loss_sum is None:  # stopped by a signal in the middle of the epoch, checkpointed
                    raise _preempted(run)
                record = _end_epoch(run, loss_sum, time.perf_counter() - run.epoch_started, metrics)
                bar.update(0, online=_online_line(record))
                if on_epoch_end is not None:
                    on_epoch_end(run.state.epoch, record)
                if run.faults.agree_stop():
                    raise _preempted(run)
    finally:
        bar.close()


def _online_line(record: Dict[str, Any]) -> str:
    """The progress line's part for the online probe's numbers of the last epoch ("" without)."""
    parts = [f"{name} {record[key]:.3f}" for name, key in (("probe", records.ONLINE_PROBE_ACCURACY),
                                                           ("knn", records.ONLINE_KNN_ACCURACY),
                                                           ("view top-1", records.ONLINE_VIEW_RETRIEVAL_TOP1))
             if key in record]
    return ("  online " + "  ".join(parts)) if parts else ""


def _train_epoch(run: _Training, metrics: IO[str], bar: "_Progress") -> Optional[torch.Tensor]:
    """One pass over this rank's share of the shuffled training set (its batch source), from
    the batch a resumed run stopped at;
    returns the summed loss of the steps whose update was kept, or ``None`` when a stop signal
    ended the epoch early (after a checkpoint at that step). Every ``checkpoint_every`` steps
    it writes a checkpoint (the epoch's end writes its own).

    Before a step that will be logged (and the run's last step) rank 0 arms the batch tap: that
    step's loss keeps its similarity problem and diagnostics (:mod:`contrastkit.methods.tap`),
    read back with the loss at the logging step; the last step's batch is saved for the
    report's pictures (:mod:`.last_batch`)."""
    config = run.plan.config
    start, run.state.epoch_step = run.state.epoch_step, 0
    run.data.source.set_epoch(run.state.epoch, start=start, state=run.state.data)  # seeded by (seed, epoch), nothing else
    run.state.data = None
    loss_sum = torch.tensor(run.state.epoch_loss_sum if start else 0.0, device=run.plan.device)
    if not start:
        run.faults.start_epoch()
    window_started, window_steps = time.perf_counter(), 0
    drawn, delivered = len(run.data.source), 0  # batches the epoch draws, and those with an image left
    for batch, step_batch in enumerate(run.data.source, start):
        indices = step_batch.indices
        rows = int(indices.shape[0])  # known on the host: no read from the device
        delivered += rows > 0
        # Fewer than 2 readable images (damaged files skipped) leave the loss no negative and
        # BatchNorm one row: the step is skipped, on every rank if on any (they step together).
        if run.data.source.short_batches and run.faults.agree_short(rows < min(2, run.plan.rank_batch)):
            _skip_short_batch(run, metrics, bar)
            window_steps += 1
        else:
            if step_batch.images is not None and hasattr(run.data.batches, "hold"):
                run.data.batches.hold(run.data.training_split, step_batch)  # a caller's own views read the split
            logging = (run.state.step + 1) % config.log_every == 0 or batch == run.plan.steps_per_epoch - 1
            last = run.state.step + 1 == run.plan.total_steps
            if run.plan.parallel.is_main and (logging or last):
                run.monitor.tap.arm()
            try:
                loss, made = _train_step(run, step_batch, metrics)
            except ValueError:  # e.g. the losses refusing non-finite embeddings: a non-finite loss before it is the cause
                run.faults.check_deferred(run.state.step)
                raise
            step_tau = run.monitor.tap.tau
            problem, diagnostics = run.monitor.tap.take()
            if run.faults.kept:
                loss_sum += loss.detach()
            else:
                _skip_step(run, loss, metrics, bar)
            window_steps += 1
            if logging and run.faults.kept:
                window_started = _log_step(run, loss, window_started, window_steps, metrics, bar,
                                           diagnostics, problem.negatives if problem is not None else 0)
                window_steps = 0
            if last and problem is not None:
                save_last_batch(run.writer, problem, made, indices, run.data.dataset, method=config.method,
                                temperature=float(step_tau), step=run.state.step, epoch=run.state.epoch + 1,
                                images=step_batch.images, labels=step_batch.labels, keys=step_batch.keys,
                                texts=step_batch.texts)
        if batch + 1 < run.plan.steps_per_epoch:  # (the epoch's end writes its own checkpoint)
            if run.faults.stop or (config.checkpoint_every and run.state.step % config.checkpoint_every == 0):
                _write_checkpoint(run, loss_sum, batch + 1)
                run.faults.agree_stop()
            if run.faults.stop:
                return None
    if drawn and not run.plan.parallel.any(delivered > 0)[0]:
        raise _nothing_read(run, f"no image could be read: all {drawn * run.plan.batch_size} training images of "
                                 f"epoch {run.state.epoch + 1} were damaged and skipped")
    return loss_sum


def _nothing_read(run: _Training, what: str) -> ValueError:
    """The error of an epoch none of whose batches trained because an unlabeled collection's
    damaged files were skipped (``what`` happened): all their images lost, or too many. The
    skipped files are listed first (every rank calls this: each names the files of its own share)."""
    add_skipped(run.data.dataset, run.data.source.skipped)
    met_by_rank = run.plan.parallel.gather_objects(skipped_reasons(run.data.dataset))
    where = "skipped files"
    if run.plan.parallel.is_main:
        for found in met_by_rank[1:]:
            add_skipped(run.data.dataset, found)
        if _write_skipped(run):
            where = run.folder.skipped
    return ValueError(f"{run.plan.config.data}: {what} (they are named in {where})")


def _write_skipped(run: _Training) -> List[str]:
    """Write the run's skipped.txt (the damaged files it met and why), if it met any; their lines."""
    skipped = skipped_files(run.data.dataset)
    if skipped:
        run.writer.write_skipped(skipped)
    return skipped


def _skip_short_batch(run: _Training, metrics: IO[str], bar: "_Progress") -> None:
    """A step whose batch (on this rank or another) was left with fewer than 2 readable images
    by the damaged files skipped: no forward pass and no update, but the step counts (the
    schedules go on, every rank runs the epoch's steps); its record in metrics.jsonl, and a
    warning the first time. The files are named in skipped.txt as the loader recorded them."""
    with warnings.catch_warnings():  # torch's "scheduler before optimizer" warning: no update, on purpose
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        run.trainables.scheduler.step()
    run.state.step += 1
    metrics.write(records.metrics_line(records.metrics_record(records.SKIPPED, epoch=run.state.epoch + 1, step=run.state.step,
                                                              reason=_SHORT_BATCH)))
    if run.plan.parallel.is_main and "short_batch" not in run.monitor.warned:
        run.monitor.warned["short_batch"] = run.state.step
        bar.warn(f"warning: step {run.state.step}: {_SHORT_BATCH}; the step was skipped"
                 + (" on every process" if run.plan.parallel.active else ""))


_SHORT_BATCH = "the batch was left with fewer than 2 readable images (damaged files skipped)"


def _skip_step(run: _Training, loss: torch.Tensor, metrics: IO[str], bar: "_Progress") -> None:
    """``on_nan="skip"``: the step whose loss was not finite (on some rank) kept no update; its
    record in metrics.jsonl, and a warning the first time."""
    value = float(run.plan.parallel.mean(loss))  # not finite: written as "nan" / "inf" (valid JSON)
    metrics.write(records.metrics_line(records.metrics_record(records.SKIPPED, epoch=run.state.epoch + 1, step=run.state.step,
                                                              loss=str(value))))
    run.faults.count_skip(run.trainables.model, run.state.step, value)
    if run.plan.parallel.is_main and "skipped" not in run.monitor.warned:
        run.monitor.warned["skipped"] = run.state.step
        bar.warn(f"warning: step {run.state.step}: the loss was {value}; its update was skipped (--on-nan skip)")


def _micro_batch(configured: int, rows: int) -> int:
    """The micro-batch of a batch of ``rows``: the configured one, or for a batch that lost rows
    to damaged files an unlabeled collection skipped, its largest divisor below it (micro-batches
    stay equal, as BatchNorm expects)."""
    if rows % configured == 0:
        return configured
    return max(d for d in range(1, min(configured, rows) + 1) if rows % d == 0)


def _step_loss_and_backward(run: _Training, batch: Any, batch_labels: Optional[torch.Tensor], on_device: torch.Tensor,
                            indices: torch.Tensor, checked: bool) -> torch.Tensor:
    """The step's loss and its gradients (zeroed first), under the run's precision."""
    precision = run.trainables.precision
    if run.plan.config.micro_batch:  # cached-gradient accumulation, outside DDP: it averages nothing here
        run.trainables.optimizer.zero_grad(set_to_none=True)
        with value_checks(checked):
            loss = run.plan.method.cached_gradient_loss(run.trainables.model, batch, batch_labels,
                                                   _micro_batch(run.plan.config.micro_batch, int(indices.shape[0])),
                                                   indices=on_device, tap=run.monitor.tap,
                                                   autocast=precision.autocast, backward=precision.backward)
        average_gradients(run.trainables.model.parameters())
    else:
        with precision.autocast(), value_checks(checked):
            loss = run.trainables.step_loss(batch, batch_labels, indices=on_device, tap=run.monitor.tap)  # step_loss, DDP-wrapped
        run.trainables.optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
    return loss


def _train_step(run: _Training, step_batch: StepBatch, metrics: IO[str]) -> Tuple[torch.Tensor, Any]:
    """One optimizer step on ``step_batch``; returns its loss (not synced) and the batch.

    Nothing in it reads a value back from the device (no ``.item()``, ``float(tensor)``, no
    blocking copy): on a GPU the host queues the step and goes on to the next batch; the loss
    is read at logging steps only (:func:`_log_step`). The forward pass and the loss run under
    the run's precision (:class:`~contrastkit.methods.precision.StepPrecision`)."""
    indices, on_device, batch_labels = step_batch.indices, step_batch.on_device, step_batch.labels
    batch = run.data.batches(run.data.training_split, indices)
    if run.plan.config.channels_last:
        batch = channels_last_batch(batch)
    tau_now = before_loss(run.trainables.model, run.trainables.schedule, run.state.step, run.plan.total_steps)
    if tau_now is not None:  # a varying tau is logged at every step
        metrics.write(records.metrics_line(records.metrics_record(records.TAU, step=run.state.step + 1, tau=tau_now)))
    precision = run.trainables.precision
    # On an accelerator a run that reads its loss only at logging steps (faults.defers) lets a
    # non-finite value through the losses' input checks, which would otherwise end the run in a
    # device-side assertion before the loss is read and the step that went wrong is named.
    checked = not run.faults.defers or run.plan.device.type == "cpu"
    online = run.trainables.online
    try:
        with online.capturing() if online is not None else contextlib.nullcontext():
            loss = _step_loss_and_backward(run, batch, batch_labels, on_device, indices, checked)
    except Exception as err:  # a --compile run whose kernels torch cannot build here: one line, not torch's trace
        failure = compile_failure(err) if run.plan.config.compile else None
        if failure is None:
            raise
        raise failure from err
    if run.faults.keep_update(loss, run.state.step + 1):  # (a stop signal is agreed on here too)
        precision.step(run.trainables.optimizer)
        if online is not None:  # on the h this step's forward computed (detached)
            online.train_step(batch_labels)
    # The clamp of a learnable tau, a temperature method's own update (iSogCLR's temperatures).
    temperatures = after_optimizer_step(run.plan.method, run.trainables.model)
    if run.monitor.tau_histogram is not None and temperatures is not None:
        run.monitor.tau_histogram.add(temperatures)
    run.trainables.scheduler.step()
    run.state.step += 1
    return loss, batch


def _log_step(run: _Training, loss: torch.Tensor, window_started: float, window_steps: int, metrics: IO[str],
              bar: "_Progress", diagnostics: Optional[torch.Tensor] = None, negatives: int = 0) -> float:
    """The step record and progress update for the ``window_steps`` steps since
    ``window_started``; returns the time it was written (the next window's start).
    ``diagnostics``: the step's batch diagnostics (:func:`contrastkit.metrics.batch.batch_diagnostics`,
    on the device), read back with the loss in one transfer; a failure they show is printed
    once per kind (:func:`contrastkit.metrics.batch.batch_warnings`) and listed in the record."""
    run.faults.check_deferred(run.state.step)  # a non-finite loss since the last read is named by its own step
    mean_loss = run.plan.parallel.mean(loss)
    if diagnostics is not None:  # the only host sync, at logging cadence: the loss and the diagnostics together
        numbers = torch.cat([mean_loss.reshape(1).to(diagnostics.dtype), diagnostics]).tolist()
        value, batch_numbers = numbers[0], diagnostics_record(numbers[1:], negatives)
    else:
        value, batch_numbers = float(mean_loss), {}
    if not math.isfinite(value):  # (a non-finite step loss stopped the run or was skipped before this)
        raise run.faults.nonfinite(run.state.step, value)
    now = time.perf_counter()
    speed = window_steps * run.plan.batch_size / max(now - window_started, 1e-9)
    tau = run.trainables.model.temperature.value
    record = records.metrics_record(records.STEP, epoch=run.state.epoch + 1, step=run.state.step, loss=value, tau=tau,
                                    lr=run.trainables.scheduler.get_last_lr()[0], images_per_second=speed, **batch_numbers)
    found = batch_warnings(record, learnable=run.plan.config.learnable_temperature,
                           tau_bound=run.trainables.model.temperature.min_value, previous=run.monitor.previous_steps)
    run.monitor.previous_steps = (run.monitor.previous_steps + [record])[-4:]
    if found:
        record["warnings"] = [w["kind"] for w in found]
    metrics.write(records.metrics_line(record))
    run.monitor.loggers.record(record)
    for warning in found if run.plan.parallel.is_main else ():
        if warning["kind"] not in run.monitor.warned:
            run.monitor.warned[warning["kind"]] = run.state.step
            bar.warn(f"warning: step {run.state.step}: {warning['message']}")
    bar.update(window_steps, epoch=f"{run.state.epoch + 1}/{run.plan.config.epochs}", loss=f"{value:.4f}", tau=f"{tau:.3f}",
               speed=f"{speed:.0f}")
    return now


def _end_epoch(run: _Training, loss_sum: torch.Tensor, seconds: float, metrics: IO[str]) -> Dict[str, Any]:
    """The epoch record (with the val numbers every ``eval_every`` epochs) and the checkpoint."""
    config, parallel = run.plan.config, run.plan.parallel
    kept_steps = run.plan.steps_per_epoch - run.faults.epoch_skipped - run.faults.epoch_short
    if kept_steps == 0 and run.faults.epoch_short:  # damaged files left no batch of 2 readable images
        raise _nothing_read(run, f"every batch of epoch {run.state.epoch + 1} was left with fewer than 2 readable "
                                 "images" + (" on some process" if parallel.active else "")
                                 + " by its damaged files, which were skipped")
    if kept_steps == 0:  # --on-nan skip skipped the whole epoch: nothing trains
        raise run.faults.all_skipped(run.state.epoch + 1, run.state.step)
    run.state.epoch += 1
    epoch_loss = float(parallel.mean(loss_sum)) / kept_steps
    run.state.epoch_losses.append(epoch_loss)
    run.state.train_seconds += seconds
    record = records.metrics_record(records.EPOCH, epoch=run.state.epoch, step=run.state.step, loss=epoch_loss,
                                    tau=run.trainables.model.temperature.value, lr=run.trainables.scheduler.get_last_lr()[0],
                                    train_seconds=run.state.train_seconds)
    if run.trainables.online is not None:  # every rank evaluates its share
        # of rank 0's encoder: DDP gives the other ranks its buffers only at the next forward
        parallel.broadcast_buffers(run.trainables.model)
        try:
            with eager_calls(config.compile):
                record.update(run.trainables.online.evaluate(run.trainables.model.encoder, run.data.dataset,
                                                             workers=config.workers))
        except BadItemError as err:  # --bad-files fail: a damaged val file
            raise run.faults.held_out_damaged(err, run.state.epoch) from None
    evaluating = config.eval_every and (run.state.epoch % config.eval_every == 0 or run.state.epoch == config.epochs)
    if evaluating and parallel.is_main:
        with eager_calls(config.compile):  # the read-out's calls run eagerly (no compilation per batch size)
            _evaluate_epoch(run, record)
    metrics.write(records.metrics_line(record))
    if run.monitor.tau_histogram is not None:  # the distribution of the per-anchor temperatures of the epoch
        run.monitor.tau_histogram.merged(parallel.reduce)
        metrics.write(records.metrics_line(run.monitor.tau_histogram.record(run.state.epoch, run.state.step)))
    metrics.flush()
    run.monitor.loggers.record(record)
    run.monitor.loggers.flush()
    _write_checkpoint(run, loss_sum, 0)
    return record


def _write_checkpoint(run: _Training, loss_sum: torch.Tensor, epoch_step: int) -> None:
    """``checkpoints/last.pt`` at the current step: at the end of an epoch (``epoch_step`` 0) or
    ``epoch_step`` batches into the epoch in progress (with each rank's ``loss_sum`` of them).
    Every rank takes part; rank 0 writes. A write that fails stops the run with one error naming
    the checkpoint left intact (:func:`.faults.write_failed`)."""
    config, parallel = run.plan.config, run.plan.parallel
    run.faults.check_deferred(run.state.step)  # never a checkpoint of a state a non-finite step updated
    ranks = parallel.gather_objects(TrainState.rank_state(float(loss_sum), run.data.source.state_dict() if epoch_step else None))

    def write() -> None:
        in_epoch = time.perf_counter() - run.epoch_started if epoch_step else 0.0
        payload = {"config": config.to_dict(), "launch": launch_id(), **run.trainables.state_dict(),
                   **run.state.state_dict(ranks, epoch_step, run.state.train_seconds + in_epoch)}
        try:
            run.writer.write_checkpoint(lambda path: save_checkpoint(path, payload))
        except CheckpointWriteError as err:
            raise write_failed(err, run.state.step, run.faults.last_checkpoint) from None

    parallel.run_on_main(write)  # a failed write stops every rank
    parallel.barrier()  # the checkpoint is complete before any rank goes on
    run.faults.last_checkpoint = (run.state.step, run.state.epoch)


# -- evaluation ---------------------------------------------------------------------------

def _evaluate_epoch(run: _Training, record: Dict[str, Any]) -> None:
    """The val numbers of an ``eval_every`` epoch into ``record`` (rank 0), and the epoch's
    candidacy for the reported one."""
    config = run.plan.config
    if config.select_by != "val_probe":  # the online read-out's number of this epoch, measured above
        key = SELECTION_SCORES[config.select_by][0]
        if key in record:
            run.state.selection.observe(run.state.epoch, record[key], run.trainables.model)
        else:  # no labelled batch trained the head yet, or val had fewer than 2 readable images
            warnings.warn(f"--select-by {config.select_by}: epoch {run.state.epoch} has no {key}, so it cannot be "
                          "picked", stacklevel=1)
    elif run.data.dataset.num_classes:
        # One extraction of the train and val features serves the kNN and the probe.
        features = tuple(extract_features(run.trainables.model.encoder, split, run.plan.device,
                                          workers=config.workers) for split in (run.data.dataset.train, run.data.dataset.val))
        record["val_knn_accuracy"] = _val_knn(features, run.data.dataset, config)
        score = val_probe_accuracy(run.trainables.model.encoder, run.data.dataset, run.plan.device, seed=config.subset_seed,
                                   features=features)
        record["val_probe_accuracy"] = score
        run.state.selection.observe(run.state.epoch, score, run.trainables.model)
    record.update(run.plan.method.val_metrics(run.eval_context()))


def _summarise(run: _Training, baselines: bool) -> Dict[str, Any]:
    """Rank 0's held-out evaluation and the summary (``summary.json``)."""
    config = run.plan.config
    eval_started = time.perf_counter()
    try:  # an unlabeled collection's held-out files, read whole once: a damaged one is named too
        read_held_out_files(run.data.dataset, batch_size=run.plan.batch_size, workers=config.workers)
    except BadItemError as err:  # --bad-files fail
        raise ValueError(f"{err} (a held-out file, read after training; its checkpoint of step {run.state.step} is "
                         "complete)") from None
    baseline = (build_model(config, run.data.dataset.image_shape, run.data.tokenizer, encoder=run.trainables.given_encoder,
                            train_size=run.plan.data_choices.train_size).encoder.to(run.plan.device)
                if baselines else None)
    try:
        numbers = evaluate_model(config, run.trainables.model, run.data.dataset, run.plan.device, baseline_encoder=baseline,
                                 raw_pixels=baselines)
        numbers.update(run.plan.method.test_metrics(run.eval_context()))
        selected = run.state.selection.report(run.state.epoch, numbers, lambda state: _evaluate_snapshot(run, state),
                                              select_by=config.select_by)
    except (ReadoutPartFailed, MemoryError, RuntimeError) as err:
        # The trained weights are safe in the last checkpoint: say so, and how to read them out.
        reason = str(err) if isinstance(err, ReadoutPartFailed) else \
            str(ReadoutPartFailed("the trained model", err))
        raise ReadoutFailed(reason, run.folder.last_checkpoint, config.out) from err
    eval_seconds = time.perf_counter() - eval_started
    summary = {
        **numbers, **selected,
        "final_loss": run.state.epoch_losses[-1] if run.state.epoch_losses else None,
        "epochs": run.state.epoch, "steps": run.state.step, "method": config.method, "data": run.data.dataset.name,
        "encoder": config.encoder, "views": config.views, "final_temperature": run.trainables.model.temperature.value,
        "temperature_schedule": config.temperature_schedule, "temperature_method": config.temperature_method,
        "train_seconds": run.state.train_seconds, "eval_seconds": eval_seconds,
        "seconds": time.perf_counter() - run.started,  # this invocation (train_seconds adds up resumes)
        "images_per_second": run.state.step * run.plan.batch_size / run.state.train_seconds if run.state.train_seconds > 0 else None,
        "beats_baselines": records.beats_baselines(numbers) if baselines else None,
    }
    if records.VIEW_RETRIEVAL_TOP1 in numbers:  # without labels: judged by view retrieval
        summary["beats_baselines_view_retrieval"] = (records.beats_baselines(numbers, records.VIEW_RETRIEVAL_TOP1)
                                                     if baselines else None)
    if run.trainables.online is not None:  # the last epoch's online numbers
        summary.update(run.trainables.online.last)
    if config.on_nan == "skip":
        summary["skipped_steps"] = run.faults.skipped
    if run.data.source.short_batches:  # steps skipped for a batch short of readable images (damaged files)
        summary["skipped_batches"] = run.faults.short
    skipped = _write_skipped(run)
    if skipped or getattr(run.data.dataset, "source", None) == "collection":
        summary["skipped_files"] = len(skipped)
    if skipped:
        print(f"skipped {len(skipped)} damaged image file(s); they are named in {run.folder.skipped}", file=sys.stderr)
    run.monitor.loggers.summary(summary, step=run.state.step, epoch=run.state.epoch)
    return summary


def _evaluate_snapshot(run: _Training, state: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """The held-out numbers (no baselines) of the model with the weights ``state``."""
    model = build_model(run.plan.config, run.data.dataset.image_shape, run.data.tokenizer, encoder=run.trainables.given_encoder,
                        initial_weights=False, train_size=run.plan.data_choices.train_size)
    model.load_state_dict(state)
    model.to(run.plan.device)
    numbers = evaluate_model(run.plan.config, model, run.data.dataset, run.plan.device, raw_pixels=False)
    context = EvalContext(model, run.data.dataset, run.data.batches, run.plan.device, run.plan.config, run.plan.batch_size)
    numbers.update(run.plan.method.test_metrics(context))
    return numbers


def _val_knn(features: Tuple[np.ndarray, np.ndarray], dataset: DataSplits, config: PretrainConfig) -> float:
    from contrastkit.metrics import knn_accuracy

    train_x, val_x = features
    return knn_accuracy(train_x, dataset.train.labels.numpy(), val_x, dataset.val.labels.numpy(),
                        k=config.knn_k, temperature=config.knn_temperature, num_classes=dataset.num_classes)
