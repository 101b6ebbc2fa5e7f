"""The pretraining loop: views -> encoder -> loss -> update, then the fixed read-out.

Outputs in ``config.out``: ``config.json`` (resolved configuration), ``metrics.jsonl`` (one
JSON record per logged step and per epoch), ``checkpoints/last.pt`` (written atomically each
epoch) and ``summary.json`` (final numbers).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from contrastkit import layout
from contrastkit import __version__
from contrastkit._io import remove_outputs, write_json

from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import RESUME_MAY_CHANGE, PretrainConfig
from .evaluate import evaluate_encoders, extract_features
from .geometry import geometry
from .parallel import LossForward, Parallel, setup
from .setup import build_model, limit_threads, load_data, resolve_device

__all__ = ["pretrain", "warmup_cosine", "OUTPUT_FILES"]

OUTPUT_FILES = layout.RUN_OUTPUTS


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR factor at step ``s``: linear warm-up ``(s + 1) / warmup_steps``, then cosine decay
    from 1 to 0 over the remaining steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_out(out: str, resume: bool, force: bool) -> None:
    """Refuse before any work: a non-empty OUT needs --resume or --force."""
    if resume and force:
        raise ValueError("--resume and --force exclude each other: resume continues a run, force starts over")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"output path {out} exists and is not a folder")
    if resume:
        checkpoint = layout.RunFolder(out).last_checkpoint
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"nothing to resume: {checkpoint} does not exist")
        return
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise FileExistsError(f"output folder {out} is not empty; pass --resume to continue the run "
                              "in it or --force to start over (this deletes its config.json, "
                              "metrics.jsonl, summary.json and checkpoints/)")


def _prepare_out(out: str, resume: bool) -> None:
    """Once the run is set up: with --force delete the previous run's files (only those)."""
    if not resume:
        remove_outputs(out, OUTPUT_FILES)
    os.makedirs(layout.RunFolder(out).checkpoints, exist_ok=True)


def _truncate_metrics(path: str, epoch: int, step: int) -> None:
    """Drop records written after the checkpoint a run resumes from (an interrupted epoch)."""
    if not os.path.isfile(path):
        return
    kept = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by the interruption
            if record.get("step", 0) <= step and record.get("epoch", 0) <= epoch:
                kept.append(json.dumps(record) + "\n")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(kept)
    os.replace(tmp, path)


def _check_resumable(state: Dict[str, Any], config: PretrainConfig, path: str) -> None:
    stored = state["config"]
    if not isinstance(stored, dict):
        raise ValueError(f"checkpoint {path} has no readable configuration")
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
            TextColumn("loss {task.fields[loss]}  tau {task.fields[tau]}  {task.fields[speed]} img/s"),
            TimeRemainingColumn(), transient=False,
        )
        self.task = self.progress.add_task("pretrain", total=total, completed=completed,
                                           epoch="-", loss="-", tau="-", speed="-")
        self.progress.start()

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
) -> Optional[Dict[str, Any]]:
    """Train ``config.method`` on ``config.data`` and evaluate it; returns the summary dict
    (also written to ``config.out/summary.json``).

    Args:
        config: the run's options (validated and completed here).
        resume: continue from ``config.out/checkpoints/last.pt``.
        force: start over in a non-empty ``config.out`` (deletes the files a run writes).
        progress: show the rich progress bar; ``None`` means "if stderr is a terminal".
        dataset, views: an already loaded data set and view maker (by default
            ``contrastkit.data.load_dataset`` / ``make_views`` from the config).
        on_epoch_end: called as ``on_epoch_end(epoch, record)`` after each epoch's checkpoint
            (on every rank under torchrun).
        baselines: also evaluate the random-init and raw-pixel baselines (a sweep of many
            runs on the same data may skip them).

    The per-epoch shuffling uses its own generator seeded from ``(seed, epoch)``; the views
    draw from torch's global RNG, whose state (with numpy's and python's) is checkpointed,
    so a resumed run on CPU ends with the same weights as an uninterrupted one.

    Under ``torchrun`` (``WORLD_SIZE > 1``) the processes train one model data-parallel
    (:mod:`contrastkit.train.parallel`): ``batch_size`` is the global batch, split evenly over
    the ranks by a ``DistributedSampler``; only rank 0 writes files and evaluates, and the
    other ranks return ``None``. Resuming needs the same number of processes.
    """
    config = config.resolved()
    with limit_threads(config.threads):
        return _pretrain(config, resume, force, progress, dataset, views, on_epoch_end, baselines)


def _pretrain(config: PretrainConfig, resume: bool, force: bool, progress: Optional[bool], dataset: Any,
              views: Any, on_epoch_end: Optional[Callable[[int, Dict[str, Any]], None]],
              baselines: bool = True) -> Optional[Dict[str, Any]]:
    started = time.perf_counter()
    device = resolve_device(config.device)
    parallel = setup(device)
    if parallel.active and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    parallel.run_on_main(lambda: _check_out(config.out, resume, force))
    _seed_everything(config.seed)
    if dataset is None:
        dataset = load_data(config)
    train = dataset.train
    n_train = int(train.images.shape[0])
    batch_size = min(config.batch_size, n_train)
    if batch_size < 2:
        raise ValueError(f"the training split of {config.data} has {n_train} image(s); at least 2 are needed")
    if parallel.active and batch_size % parallel.world_size:
        raise ValueError(f"the batch size {batch_size} must be a multiple of the number of processes "
                         f"({parallel.world_size})")
    config = config.with_queue(batch_size, n_train)
    tokenizer = None
    if config.paired:  # convirt: a batch is images and the token ids of their texts
        from .convirt import PairedBatches, run_tokenizer

        tokenizer = run_tokenizer(dataset, config.out, resume)
        views = PairedBatches(tokenizer, device) if views is None else views
    if views is None:
        from contrastkit.data import make_views

        views = make_views(dataset, mode=config.views, device=device, strength=config.view_strength)

    model = build_model(config, dataset.image_shape[0], tokenizer).to(device)
    schedule = config.schedule
    trainer = None
    if parallel.active:
        model.distributed = True
        trainer = torch.nn.parallel.DistributedDataParallel(LossForward(model))
        torch.manual_seed(config.seed + 1_000_003 * parallel.rank)  # different views on each rank
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)  # biases, norms, tau
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=config.lr)
    else:
        optimizer = torch.optim.SGD(groups, lr=config.lr, momentum=0.9, nesterov=True)
    steps_per_epoch = n_train // batch_size  # the last partial batch is dropped (fixed batch size)
    rank_batch = batch_size // parallel.world_size
    if parallel.active:
        steps_per_epoch = (n_train // parallel.world_size) // rank_batch
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = int(round(config.warmup_fraction * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_steps))

    folder = layout.RunFolder(config.out)
    parallel.run_on_main(lambda: _prepare_out(config.out, resume))
    if tokenizer is not None:
        parallel.run_on_main(lambda: tokenizer.save(folder.tokenizer))
    checkpoint_path = folder.last_checkpoint
    metrics_path = folder.metrics
    epoch, step, train_seconds, epoch_losses = 0, 0, 0.0, []
    if resume:
        state = load_checkpoint(checkpoint_path)
        _check_resumable(state, config, checkpoint_path)
        if int(state.get("world_size", 1)) != parallel.world_size:
            raise ValueError(f"checkpoint {checkpoint_path} was written by {state.get('world_size', 1)} "
                             f"process(es); resume it with the same number (now {parallel.world_size})")
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"checkpoint {checkpoint_path} does not match this model/optimizer: "
                             f"{str(err).splitlines()[0]}") from None
        # The schedule's functions are not in the state (only its step): a changed --epochs
        # reshapes the cosine from the resumed step on.
        set_rng_state(state["rng_per_rank"][parallel.rank] if parallel.active else state["rng"])
        epoch, step = int(state["epoch"]), int(state["step"])
        train_seconds = float(state.get("train_seconds", 0.0))
        epoch_losses = [float(v) for v in state.get("epoch_losses", [])]
        if parallel.is_main:
            _truncate_metrics(metrics_path, epoch, step)

    derived = {"batch_size": batch_size, "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
               "warmup_steps": warmup_steps, "device": str(device),
               "dataset": {"name": dataset.name, "num_classes": int(dataset.num_classes),
                           "image_shape": list(dataset.image_shape),
                           "sizes": {s: int(getattr(dataset, s).images.shape[0]) for s in ("train", "val", "test")}},
               "views": getattr(views, "config", None),
               "parameters": sum(p.numel() for p in model.encoder.parameters()),
               "world_size": parallel.world_size,
               "versions": {"contrastkit": __version__, "torch": torch.__version__,
                            "python": platform.python_version()}}
    if parallel.is_main:
        write_json(folder.config, {"config": config.to_dict(), "derived": derived})

    show = (sys.stderr.isatty() if progress is None else progress) and parallel.is_main
    bar = _Progress(show, total_steps, step)
    labels_all = train.labels.to(device) if train.labels is not None else None  # paired data may lack labels
    model.train()
    try:
        with (open(metrics_path, "a", encoding="utf-8") if parallel.is_main else open(os.devnull, "w")) as metrics:
            while epoch < config.epochs:
                epoch_started = time.perf_counter()
                if parallel.active:
                    order = _rank_order(n_train, config.seed, epoch, parallel)
                else:
                    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
                loss_sum = torch.zeros((), device=device)
                window_started, window_steps = time.perf_counter(), 0
                for batch in range(steps_per_epoch):
                    indices = order[batch * rank_batch:(batch + 1) * rank_batch]
                    view_a, view_b = views(train, indices)
                    tau_now = _follow_schedule(model, schedule, step, total_steps)
                    if tau_now is not None:  # a varying tau is logged at every step
                        metrics.write(json.dumps({"kind": "tau", "step": step + 1, "tau": tau_now}) + "\n")
                    step_loss = model.loss if trainer is None else trainer
                    loss = step_loss(view_a, view_b, None if labels_all is None else labels_all[indices.to(device)])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    model.temperature.clamp_()  # CLIP: keep a learnable tau's parameter at or below its cap
                    scheduler.step()
                    loss_sum += loss.detach()
                    step += 1
                    window_steps += 1
                    if step % config.log_every == 0 or batch == steps_per_epoch - 1:
                        value = float(parallel.mean(loss))  # the only host sync, at logging cadence
                        if not math.isfinite(value):
                            raise FloatingPointError(f"the loss became {value} at step {step}; "
                                                     "lower --lr or raise --temperature")
                        now = time.perf_counter()
                        speed = window_steps * batch_size / max(now - window_started, 1e-9)
                        tau = model.temperature.value
                        record = {"kind": "step", "epoch": epoch + 1, "step": step, "loss": value, "tau": tau,
                                  "lr": scheduler.get_last_lr()[0], "images_per_second": speed}
                        metrics.write(json.dumps(record) + "\n")
                        bar.update(window_steps, epoch=f"{epoch + 1}/{config.epochs}", loss=f"{value:.4f}",
                                   tau=f"{tau:.3f}", speed=f"{speed:.0f}")
                        window_started, window_steps = now, 0
                epoch += 1
                epoch_loss = float(parallel.mean(loss_sum)) / steps_per_epoch
                epoch_losses.append(epoch_loss)
                train_seconds += time.perf_counter() - epoch_started
                record = {"kind": "epoch", "epoch": epoch, "step": step, "loss": epoch_loss,
                          "tau": model.temperature.value, "lr": scheduler.get_last_lr()[0],
                          "train_seconds": train_seconds}
                if config.eval_every and epoch % config.eval_every == 0 and parallel.is_main:
                    if dataset.num_classes:
                        record["val_knn_accuracy"] = _val_knn(model, dataset, device, config)
                    if config.paired:
                        from .convirt import val_retrieval

                        record.update(val_retrieval(model, dataset, device))
                    else:
                        record["val_geometry"] = geometry(model, dataset.val, views, device, batch_size=batch_size,
                                                          temperature=model.temperature.value, seed=config.seed)
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                rng_per_rank = parallel.gather_objects(rng_state())
                if parallel.is_main:
                    save_checkpoint(checkpoint_path, {
                        "config": config.to_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "rng": rng_per_rank[0], "rng_per_rank": rng_per_rank, "world_size": parallel.world_size,
                        "epoch": epoch, "step": step, "train_seconds": train_seconds,
                        "epoch_losses": epoch_losses,
                    })
                parallel.barrier()  # the checkpoint is complete before any rank goes on
                if on_epoch_end is not None:
                    on_epoch_end(epoch, record)
    finally:
        bar.close()
    if not parallel.is_main:
        parallel.barrier()  # rank 0 evaluates and writes the summary
        parallel.teardown()
        return None

    eval_started = time.perf_counter()
    baseline = build_model(config, dataset.image_shape[0], tokenizer).encoder.to(device) if baselines else None
    numbers: Dict[str, Any] = {}
    if dataset.num_classes:  # paired data from a CSV may carry no labels: no probe then
        numbers = evaluate_encoders(dataset, model.encoder, device, baseline_encoder=baseline,
                                    raw_pixels=baselines, knn_k=config.knn_k, knn_temperature=config.knn_temperature)
    if config.paired:  # image-text pairs: retrieval and zero-shot instead of two-view geometry
        from .convirt import evaluate_convirt

        numbers.update(evaluate_convirt(model, dataset, device))
    else:
        numbers["representation"] = geometry(model, dataset.test, views, device, batch_size=batch_size,
                                             temperature=model.temperature.value, seed=config.seed)
    eval_seconds = time.perf_counter() - eval_started
    summary = {
        **numbers,
        "final_loss": epoch_losses[-1] if epoch_losses else None,
        "epochs": epoch, "steps": step, "method": config.method, "data": dataset.name,
        "encoder": config.encoder, "views": config.views, "final_temperature": model.temperature.value,
        "temperature_schedule": config.temperature_schedule,
        "train_seconds": train_seconds, "eval_seconds": eval_seconds,
        "seconds": time.perf_counter() - started,  # this invocation (train_seconds adds up resumes)
        "images_per_second": step * batch_size / train_seconds if train_seconds > 0 else None,
        "beats_baselines": bool(numbers["probe_accuracy"] > numbers["random_init_probe_accuracy"]
                                and numbers["probe_accuracy"] > numbers["raw_pixel_probe_accuracy"])
        if baselines and "probe_accuracy" in numbers else None,
    }
    write_json(folder.summary, summary)
    parallel.barrier()
    parallel.teardown()
    return summary


def _follow_schedule(model: Any, schedule: Any, step: int, total_steps: int) -> Optional[float]:
    """Set the model's tau for this step of a varying schedule and return it (``None`` for a
    constant or learnable tau, which the optimizer or nobody changes)."""
    return schedule.apply(model.temperature, step, total_steps)


def _rank_order(n_train: int, seed: int, epoch: int, parallel: Parallel) -> torch.Tensor:
    """This rank's share of the epoch's shuffled images (``DistributedSampler``: the same
    permutation on every rank, every ``world_size``-th image from ``rank`` on)."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n_train), num_replicas=parallel.world_size, rank=parallel.rank,
                                 shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return torch.tensor(list(sampler), dtype=torch.long)


def _val_knn(model: Any, dataset: Any, device: torch.device, config: PretrainConfig) -> float:
    from contrastkit.metrics import knn_accuracy

    train_x = extract_features(model.encoder, dataset.train.images, device)
    val_x = extract_features(model.encoder, dataset.val.images, device)
    return knn_accuracy(train_x, dataset.train.labels.numpy(), val_x, dataset.val.labels.numpy(),
                        k=config.knn_k, temperature=config.knn_temperature, num_classes=dataset.num_classes)
