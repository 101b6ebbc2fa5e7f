"""Worker functions for the multi-process tests (imported by spawned processes).

Every worker joins a gloo process group through a file in the test's tmp_path (no fixed
ports), runs a batch of checks and saves what it measured to ``result_<rank>.pt``; the test
process computes the single-process references on the concatenated batch and compares.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import traceback
from typing import Callable, Dict, List, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contrastkit import losses as L
from loss_catalog import CATALOG

D_IN, D_OUT = 5, 4
MODES = ("global", "local")


# --------------------------------------------------------------------------- harness


def spawn(target: Callable, world: int, tmp_path, *args) -> List[dict]:
    """Run ``target(rank, world, *args)`` in ``world`` gloo processes; return their results."""
    init_file = os.path.join(str(tmp_path), "init")
    # A fork server imports torch once for all workers of the session (plain "spawn" imports it
    # in every worker); unlike "fork" it never copies the test process's thread pools.
    # torch._dynamo (which DDP imports) is loaded before any group exists: imported while one
    # does, it keeps the group's backend alive into the worker's shutdown (see train.parallel).
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "contrastkit.losses",
                                            __name__])
    mp.start_processes(_entry, args=(world, init_file, str(tmp_path), target, args), nprocs=world,
                       join=True, start_method="forkserver")
    return [torch.load(os.path.join(str(tmp_path), f"result_{r}.pt"), weights_only=False) for r in range(world)]


def _entry(rank: int, world: int, init_file: str, out_dir: str, target: Callable, args) -> None:
    torch.set_num_threads(1)
    # The start method a torchrun rank has (the platform's default), not the fork server this
    # process came from: under that, every DataLoader worker a rank starts came from a fresh fork
    # server of its own and imported torch and contrastkit again (seconds of CPU each).
    multiprocessing.set_start_method(None, force=True)
    # A hung collective fails the test after this; it is not shorter because on a busy 2-core
    # machine rank 0's read-out (probe, kNN, baselines) alone took over a minute while rank 1
    # waited at the barrier that follows it.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        result = target(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"result_{rank}.pt"))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- data and model


def batches(seed: int, sizes: Sequence[int], classes: int = 3):
    """Per-rank inputs ``(x_a, x_b, labels)``, float64; the same on every process."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x_a = torch.randn(n, D_IN, generator=g, dtype=torch.float64)
        x_b = x_a + 0.3 * torch.randn(n, D_IN, generator=g, dtype=torch.float64)
        labels = torch.randint(0, classes, (n,), generator=g)
        out.append((x_a, x_b, labels))
    return out


def concatenated(parts):
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


class Encoder(torch.nn.Module):
    """A tiny float64 encoder with a learnable temperature, identical on every rank."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(D_IN, 6), torch.nn.Tanh(), torch.nn.Linear(6, D_OUT)).double()
        self.temperature = L.Temperature(0.3, learnable=True).double()

    def forward(self, x_a, x_b):
        return self.net(x_a), self.net(x_b), self.temperature()


# name -> loss(z_a, z_b, labels, tau, **distributed options)
LOSSES: Dict[str, Callable] = {
    "nt_xent_views": lambda a, b, y, t, **kw: L.nt_xent_views(a, b, temperature=t, **kw),
    "dcl": lambda a, b, y, t, **kw: L.dcl(a, b, temperature=t, **kw),
    "info_nce": lambda a, b, y, t, **kw: L.info_nce(a, b, temperature=t, **kw),
    "bidirectional_info_nce": lambda a, b, y, t, **kw: L.bidirectional_info_nce(a, b, temperature=t,
                                                                                  weight=0.75, **kw),
    "supcon_views": lambda a, b, y, t, **kw: L.supcon(torch.stack([a, b], dim=1), y, temperature=t, **kw),
    "supcon_in": lambda a, b, y, t, **kw: L.supcon(a, y, temperature=t, variant="in", **kw),
    "supcon_in_views": lambda a, b, y, t, **kw: L.supcon(torch.stack([a, b], dim=1), y, temperature=t,
                                                         variant="in", **kw),
}
# The catalog case (tests/loss_catalog.py) each entry runs, in the layout written above (SupCon
# on sample-major views, or on one view with the batch's labels).
CASE_OF = {"nt_xent_views": "nt_xent_views", "dcl": "dcl", "info_nce": "info_nce",
           "bidirectional_info_nce": "bidirectional_info_nce", "supcon_views": "supcon", "supcon_in": "supcon[in]",
           "supcon_in_views": "supcon[in]"}
assert set(CASE_OF) == set(LOSSES) and all(CATALOG[case].distributed for case in CASE_OF.values())
# Tiled variants of every entry whose catalog case has a tiled path (tiles of 3 rows: several per
# rank, ragged at the edges); in "local" mode they run the ring exchange. Their reference is the
# dense loss of the same name.
TILE = 3
TILED = {f"{name}_tiled": name for name, case in CASE_OF.items() if CATALOG[case].tiled}
for _name, _dense in TILED.items():
    LOSSES[_name] = (lambda dense: lambda a, b, y, t, **kw: LOSSES[dense](a, b, y, t, chunk_size=TILE, **kw))(_dense)
# SupCon L_out has no ring: tiled + local raises, so that combination is not run.
SKIP = {("supcon_views_tiled", "local")}


def loss_and_grads(model: Encoder, name: str, data, reduction: str, **options):
    """The loss value (detached) and the gradient of every parameter (dict by name)."""
    model.zero_grad()
    z_a, z_b, tau = model(data[0], data[1])
    loss = LOSSES[name](z_a, z_b, data[2], tau, reduction=reduction, **options)
    if reduction == "none":
        return loss.detach(), {}
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def _average(grads: dict, group=None) -> dict:
    world = dist.get_world_size(group)
    for g in grads.values():
        dist.all_reduce(g, group=group)
        g /= world
    return grads


# --------------------------------------------------------------------------- workers


def losses_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str]):
    """Every loss, both modes, the given reductions: value and averaged parameter gradients."""
    import contrastkit.losses.ring as ring_module

    data = batches(seed, sizes)[rank]
    model = Encoder()
    results, ring_calls = {}, {}
    ring = ring_module.ring_logsumexp

    def counting_ring(*args, **kwargs):
        ring_calls[current] = ring_calls.get(current, 0) + 1
        return ring(*args, **kwargs)

    ring_module.ring_logsumexp = counting_ring
    try:
        for name in LOSSES:
            for mode in MODES:
                if (name, mode) in SKIP:
                    continue
                current = (name, mode)
                for reduction in reductions:
                    value, grads = loss_and_grads(model, name, data, reduction, distributed=True,
                                                  distributed_mode=mode)
                    results[(name, mode, reduction)] = (value, _average(grads))
    finally:
        ring_module.ring_logsumexp = ring
    results["ring_calls"] = ring_calls
    return results


def subgroup_worker(rank: int, world: int, seed: int, sizes: Sequence[int]):
    """A loss on a process group made of ranks 0 and 1 only (``distributed=<group>``)."""
    group = dist.new_group([0, 1])
    results = {}
    if rank in (0, 1):
        data = batches(seed, sizes)[rank]
        model = Encoder()
        for mode in MODES:
            value, grads = loss_and_grads(model, "nt_xent_views", data, "mean", distributed=group,
                                          distributed_mode=mode)
            results[mode] = (value, _average(grads, group))
    dist.barrier()
    return results


def errors_worker(rank: int, world: int):
    """Bad input on one rank, and ranks that disagree: every rank must raise, none may hang."""
    z = torch.randn(4, 3, dtype=torch.float64)
    bad = z.clone()
    if rank == 1:
        bad[0, 0] = float("nan")
    wide = torch.randn(4, 3 + rank, dtype=torch.float64)
    cases = {
        "nan_on_rank_1": lambda: L.nt_xent_views(bad, z, temperature=0.5, distributed=True),
        "width_differs": lambda: L.nt_xent_views(wide, wide, temperature=0.5, distributed=True),
        "dtype_differs": lambda: L.info_nce(z.to(torch.float32 if rank else torch.float64),
                                            z.to(torch.float32 if rank else torch.float64),
                                            temperature=0.5, distributed=True, distributed_mode="local"),
        "bank_with_distributed": lambda: L.info_nce(z, z, z, temperature=0.5, distributed=True),
        "bad_mode": lambda: L.dcl(z, z, temperature=0.5, distributed=True, distributed_mode="sideways"),
        "supcon_tiled_local": lambda: L.supcon(z, torch.tensor([0, 0, 1, 1]), temperature=0.5, chunk_size=2,
                                               distributed=True, distributed_mode="local"),
        "no_positive_anywhere": lambda: L.supcon(z, torch.arange(4) + 4 * rank, temperature=0.5,
                                                 distributed=True, distributed_mode="local"),
    }
    return error_messages(cases)


def error_messages(cases: Dict[str, Callable]) -> Dict[str, object]:
    """Run every case on every rank: ``None`` if it did not raise, else the error's message
    (``"UNEXPECTED ..."`` for anything but ValueError/TypeError); then wait for all ranks."""
    results: Dict[str, object] = {}
    for name, call in cases.items():
        try:
            call()
            results[name] = None
        except (ValueError, TypeError) as err:
            results[name] = f"{type(err).__name__}: {err}"
        except Exception:  # pragma: no cover - reported to the test
            results[name] = "UNEXPECTED " + traceback.format_exc()
    dist.barrier()
    return results


def ddp_worker(rank: int, world: int, seed: int, sizes: Sequence[int], steps: int, lr: float):
    """A few SGD steps under DistributedDataParallel for each loss and mode: final parameters."""
    from torch.nn.parallel import DistributedDataParallel

    results = {}
    for name in ("nt_xent_views", "supcon_views"):
        for mode in MODES:
            model = DistributedDataParallel(Encoder())
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for step in range(steps):
                x_a, x_b, y = batches(seed + step, sizes)[rank]
                optimizer.zero_grad()
                z_a, z_b, tau = model(x_a, x_b)
                LOSSES[name](z_a, z_b, y, tau, distributed=True, distributed_mode=mode).backward()
                optimizer.step()
            results[(name, mode)] = {k: p.detach().clone() for k, p in model.module.named_parameters()}
    return results


def queue_worker(rank: int, world: int, seed: int, size: int, steps: int):
    """Keys of different counts per rank and step into a small queue: its content after each step."""
    from contrastkit.distributed import KeyQueue

    queue = KeyQueue(size, D_OUT, distributed=True, dtype=torch.float64)
    history = []
    for step in range(steps):
        queue.enqueue(queue_keys(seed, step, world)[rank])
        history.append(queue.negatives())
    return {"history": history, "state": {k: v.clone() for k, v in queue.state_dict().items()}}


def queue_keys(seed: int, step: int, world: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return [torch.randn(1 + (rank + step) % 3, D_OUT, generator=g, dtype=torch.float64) for rank in range(world)]


def suite_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str],
                 extras: Sequence[str]):
    """All checks of one spawned run (spawning is the slow part), keyed by check name."""
    results = {"losses": losses_worker(rank, world, seed, sizes, reductions)}
    if "subgroup" in extras:
        results["subgroup"] = subgroup_worker(rank, world, seed, SUBGROUP_SIZES[:world])
    if "errors" in extras:
        results["errors"] = errors_worker(rank, world)
    if "queue" in extras:
        results["queue"] = queue_worker(rank, world, seed, QUEUE_SIZE, QUEUE_STEPS)
    if "ddp" in extras:
        results["ddp"] = ddp_worker(rank, world, seed, DDP_SIZES[:world], DDP_STEPS, DDP_LR)
    return results


SUBGROUP_SIZES = (3, 5, 2)
QUEUE_SIZE, QUEUE_STEPS = 7, 5
DDP_SIZES, DDP_STEPS, DDP_LR = (3, 5), 3, 0.5


def reference_training(name: str, seed: int, sizes: Sequence[int], steps: int, lr: float) -> dict:
    """Single-process SGD on the concatenated global batches (the DDP workers' reference)."""
    model = Encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x_a, x_b, y = concatenated(batches(seed + step, sizes))
        optimizer.zero_grad()
        z_a, z_b, tau = model(x_a, x_b)
        LOSSES[name](z_a, z_b, y, tau).backward()
        optimizer.step()
    return {k: p.detach().clone() for k, p in model.named_parameters()}


# --------------------------------------------------------------------------- pretraining


class StopAfterFirstEpoch(Exception):
    pass


def _stop_after_first_epoch(epoch, record):
    if epoch == 1:
        raise StopAfterFirstEpoch()


def pretrain_worker(rank: int, world: int, options: dict, straight: str, interrupted: str):
    """Data-parallel pretraining through the Python API: an uninterrupted run, a run stopped
    after its first epoch, a refused overwrite, and the resume of the stopped run."""
    from contrastkit.train import PretrainConfig, pretrain

    results = {}
    results["straight"] = pretrain(PretrainConfig(out=straight, **options), progress=False)
    try:
        pretrain(PretrainConfig(out=interrupted, **options), progress=False, on_epoch_end=_stop_after_first_epoch)
        results["stopped"] = False
    except StopAfterFirstEpoch:
        results["stopped"] = True
    try:
        pretrain(PretrainConfig(out=interrupted, **options), progress=False)
        results["overwrite"] = None
    except FileExistsError as err:
        results["overwrite"] = str(err)
    results["resumed"] = pretrain(PretrainConfig(out=interrupted, **options), resume=True, progress=False)
    return results


def stream_worker(rank: int, world: int, options: dict, straight: str, interrupted: str, stop_at: int):
    """Data-parallel pretraining from a stream: an uninterrupted run, a run that rank 0's
    SIGTERM stops during backward pass ``stop_at`` (every rank stops at that step's
    checkpoint), and its resume."""
    import signal

    from contrastkit.train import PretrainConfig, pretrain
    from contrastkit.train.faults import Preempted

    results = {"straight": pretrain(PretrainConfig(out=straight, **options), progress=False, baselines=False)}
    real, calls = torch.Tensor.backward, [0]

    def backward(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == stop_at and rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    torch.Tensor.backward = backward
    try:
        pretrain(PretrainConfig(out=interrupted, **options), progress=False, baselines=False)
        results["stopped_at"] = None
    except Preempted as err:
        results["stopped_at"] = err.step
    finally:
        torch.Tensor.backward = real
    results["resumed"] = pretrain(PretrainConfig(out=interrupted, **options), resume=True, progress=False,
                                  baselines=False)
    return results
