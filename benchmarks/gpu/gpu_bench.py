"""The GPU measurements of ``benchmarks/gpu/run.sh``, one subcommand each.

    python benchmarks/gpu/gpu_bench.py losses --out DIR [--max-n 262144] [--budget-s 240]
    python benchmarks/gpu/gpu_bench.py syncs  --out DIR
    python benchmarks/gpu/gpu_bench.py train  --out DIR [--steps 30]

* ``losses``: forward + backward time (CUDA events, median of repetitions) and extra peak
  memory (``torch.cuda.max_memory_allocated`` minus what the inputs hold) of the dense and
  tiled contrastkit losses and their peers (``benchmarks/bench_losses.py``), in float32 and
  bfloat16, N doubling from 1,024 to ``--max-n`` pairs; a method stops growing at its first
  out-of-memory, error, or a call slower than ``--slow-s``, and the whole run at ``--budget-s``.
* ``syncs``: host synchronisations of one loss call (``torch.cuda.set_sync_debug_mode``).
* ``train``: images/s of full training steps of the default small CNN with kornia views.

Each writes JSON lines to ``DIR/<subcommand>.jsonl`` (:func:`write_results`); every line holds
the machine (GPU name, torch and CUDA versions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent / "src"))

LOSS_METHODS = (
    "views/contrastkit-dense", "views/contrastkit-tiled", "views/pytorch-metric-learning", "views/lightly",
    "bidirectional/contrastkit-dense", "bidirectional/contrastkit-tiled", "bidirectional/open_clip",
    "info_nce/contrastkit-dense", "info_nce/contrastkit-tiled", "info_nce/info-nce-pytorch")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def machine() -> Dict[str, Any]:
    """What the numbers were measured on."""
    info: Dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_results(out_dir: os.PathLike, name: str, rows: Iterable[Dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines to ``out_dir/name.jsonl`` (the folder is created), each
    with the :func:`machine` it was measured on; returns the path."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem, got {name!r}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    host = machine()
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({**row, "machine": host}) + "\n")
    return path


def count_syncs(function: Callable[[], Any], device: torch.device) -> Optional[int]:
    """Host synchronisations that ``function()`` makes on a CUDA ``device`` (each one CUDA's
    sync debug mode reports as a warning); ``None`` on any other device, where a host sync
    does not exist (the function is not even called)."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            function()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device is available (torch.cuda.is_available() is False); "
                         "these measurements need one GPU")
    return torch.device("cuda")


def _time_loss(loss_fn: Callable[[], torch.Tensor], inputs: List[torch.Tensor], min_seconds: float = 1.0):
    times: List[float] = []
    value = None
    budget = time.perf_counter()
    while True:
        for x in inputs:
            x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = loss_fn()
        loss.backward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
        value = float(loss.detach())
        del loss
        if times[0] > min_seconds or (len(times) >= 5 and time.perf_counter() - budget > min_seconds) \
                or len(times) >= 50:
            break
    timed = times if len(times) == 1 else times[1:]
    return statistics.median(timed), len(timed), value


def measure_loss(method: str, n: int, dtype: str, dim: int = 128, tau: float = 0.1) -> Dict[str, Any]:
    """One configuration on the GPU: seconds, extra peak MiB, loss value, or the error."""
    import bench_losses
    from contrastkit.losses import tiled

    row: Dict[str, Any] = {"method": method, "n": n, "dtype": dtype, "dim": dim}
    dense_limit = tiled.DENSE_MAX_ENTRIES  # build() raises it to force the dense path
    try:
        torch.cuda.empty_cache()
        loss_fn, inputs = bench_losses.build(method, n, dim, tau, device="cuda", dtype=DTYPES[dtype])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        seconds, repetitions, value = _time_loss(loss_fn, inputs)
        row.update(status="ok", seconds=seconds, repetitions=repetitions, loss=value,
                   extra_peak_mib=(torch.cuda.max_memory_allocated() - baseline) / 2**20)
    except torch.cuda.OutOfMemoryError:
        row["status"] = "OOM"
    except Exception as err:  # a peer that does not support bf16, say: record it, go on
        row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        tiled.DENSE_MAX_ENTRIES = dense_limit
        loss_fn = inputs = None
        torch.cuda.empty_cache()
    return row


def sizes_up_to(max_n: int, start: int = 1024) -> List[int]:
    if max_n < start:
        raise ValueError(f"--max-n must be >= {start}, got {max_n}")
    out = [start]
    while out[-1] * 2 <= max_n:
        out.append(out[-1] * 2)
    return out


def run_losses(args: argparse.Namespace) -> List[Dict[str, Any]]:
    require_cuda()
    rows: List[Dict[str, Any]] = []
    deadline = time.perf_counter() + args.budget_s
    for dtype in DTYPES:
        for method in LOSS_METHODS:
            for n in sizes_up_to(args.max_n):
                if time.perf_counter() > deadline:
                    rows.append({"method": method, "n": n, "dtype": dtype, "status": "skipped (budget)"})
                    break
                row = measure_loss(method, n, dtype)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["status"] != "ok" or row["seconds"] > args.slow_s:
                    break
    return rows


def run_syncs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    device = require_cuda()
    import contrastkit.losses as ck

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 128, generator=g).to(device).requires_grad_()
    b = torch.randn(4096, 128, generator=g).to(device).requires_grad_()
    calls = {  # 512 pairs take the dense path, 4,096 with chunk_size the tiled one
        "nt_xent_views dense": lambda **k: ck.nt_xent_views(a[:512], b[:512], temperature=0.1, **k),
        "nt_xent_views tiled": lambda **k: ck.nt_xent_views(a, b, temperature=0.1, chunk_size=1024, **k),
        "bidirectional_info_nce dense": lambda **k: ck.bidirectional_info_nce(a[:512], b[:512], temperature=0.1, **k),
        "bidirectional_info_nce tiled": lambda **k: ck.bidirectional_info_nce(a, b, temperature=0.1, chunk_size=1024,
                                                                             **k),
        "info_nce dense": lambda **k: ck.info_nce(a[:512], b[:512], temperature=0.1, **k),
        "supcon tiled": lambda **k: ck.supcon(a, torch.arange(4096, device=device) % 10, temperature=0.1,
                                              variant="in", chunk_size=1024, **k),
        "sigmoid_loss tiled": lambda **k: ck.sigmoid_loss(a, b, chunk_size=1024, **k),
    }
    rows = []
    for name, call in calls.items():
        for validate in (True, False):  # the value checks run on the device either way (0 expected)
            call(validate=validate).backward()  # warm-up: lazy CUDA initialisation syncs once
            forward = count_syncs(lambda: call(validate=validate), device)
            both = count_syncs(lambda: call(validate=validate).backward(), device)
            rows.append({"call": name, "validate": validate, "forward_syncs": forward,
                         "forward_backward_syncs": both})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def run_train(args: argparse.Namespace) -> List[Dict[str, Any]]:
    device = require_cuda()
    from contrastkit.data import load_dataset, make_views
    from contrastkit.train import PretrainConfig
    from contrastkit.methods import build_model

    dataset = load_dataset("glyphlab")
    rows = []
    for encoder, batch in (("small", 256), ("resnet18", 256)):
        config = PretrainConfig(encoder=encoder, batch_size=batch).resolved()
        model = build_model(config, dataset.image_shape[0]).to(device)
        views = make_views(dataset, mode="augment", device=device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
        n = dataset.train.images.shape[0]
        generator = torch.Generator().manual_seed(0)
        for step in range(5 + args.steps):
            if step == 5:
                torch.cuda.synchronize()
                started = time.perf_counter()
            indices = torch.randint(0, n, (batch,), generator=generator)
            view_a, view_b = views(dataset.train, indices)
            loss = model.loss(view_a, view_b, dataset.train.labels[indices].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        rows.append({"encoder": encoder, "batch_size": batch, "steps": args.steps,
                     "images_per_second": args.steps * batch / seconds, "data": dataset.name})
        print(json.dumps(rows[-1]), flush=True)
    return rows


COMMANDS = {"losses": run_losses, "syncs": run_syncs, "train": run_train}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--out", required=True, help="folder the results are written to")
    parser.add_argument("--max-n", type=int, default=262144, help="largest N (pairs) of the loss benchmark")
    parser.add_argument("--budget-s", type=float, default=240.0, help="wall-clock budget of the loss benchmark")
    parser.add_argument("--slow-s", type=float, default=5.0, help="a loss call slower than this stops its method")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    args = parser.parse_args(argv)
    sizes_up_to(args.max_n)
    if args.budget_s <= 0 or args.slow_s <= 0 or args.steps < 1:
        parser.error("--budget-s and --slow-s must be > 0 and --steps >= 1")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"gpu_bench: {err}", file=sys.stderr)
        return 2
    rows = COMMANDS[args.command](args)
    print(f"wrote {write_results(args.out, args.command, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
