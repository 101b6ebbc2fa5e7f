"""Measured: time and peak memory of the distributed NT-Xent modes on CPU (gloo), per rank.

For each global batch, every mode runs in freshly spawned processes (so that each peak RSS
belongs to one configuration): a single process on the whole batch (the peer everything is
compared with), then W processes in global mode (dense and tiled), local mode (dense) and
the ring (local mode with tiles). Reported: median forward+backward seconds over the repeats
(the slowest rank), and the growth of the peak resident memory (Linux VmHWM, reset before the
loss) over the resident memory before it (the largest rank), with ratios to the single-process run. A CPU with few cores runs the W processes
side by side, so times measure work per rank plus gloo's overhead, not a cluster. "dense"
modes have the automatic tiling of large matrices switched off.

    python benchmarks/distributed_bench.py --world 2 --rows 512 2048 --dim 128 --chunk 512 \\
        > benchmarks/results/distributed_bench.md
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODES = {  # name -> (world is W?, keyword arguments of nt_xent_views)
    "single process (dense)": (False, {}),
    "global (dense)": (True, {"distributed": True}),
    "global (tiled)": (True, {"distributed": True, "chunk_size": "CHUNK"}),
    "local (dense)": (True, {"distributed": True, "distributed_mode": "local"}),
    "ring (local, tiled)": (True, {"distributed": True, "distributed_mode": "local", "chunk_size": "CHUNK"}),
}


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one.
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _worker(rank, world, init_file, out_dir, rows, dim, options, repeats):
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
    from contrastkit.losses import nt_xent_views, tiled

    if "chunk_size" not in options:  # "dense" means dense: switch off the automatic tiling
        tiled.DENSE_MAX_ENTRIES = 1 << 62

    g = torch.Generator().manual_seed(rank)
    z_a = torch.randn(rows, dim, generator=g, requires_grad=True)
    z_b = torch.randn(rows, dim, generator=g, requires_grad=True)
    times = []
    _reset_peak()
    before = _status_mib("VmRSS")
    for _ in range(repeats):
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        nt_xent_views(z_a, z_b, temperature=0.1, **options).backward()
        times.append(time.perf_counter() - start)
    grown = _status_mib("VmHWM") - before
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as handle:
        handle.write(f"{statistics.median(times)} {grown}\n")
    if world > 1:
        dist.destroy_process_group()


def measure(world: int, rows: int, dim: int, options: dict, repeats: int):
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), tmp, rows, dim, options, repeats),
                           nprocs=world, join=True, start_method="forkserver")
        values = [tuple(map(float, open(os.path.join(tmp, f"{r}.txt")).read().split())) for r in range(world)]
    return max(v[0] for v in values), max(v[1] for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2048], help="pairs per rank")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    multiprocessing.set_forkserver_preload(["torch", "contrastkit.losses"])
    print(f"# Distributed NT-Xent on CPU (gloo): W = {args.world}, d = {args.dim}, float32, "
          f"tile {args.chunk}, median of {args.repeats}, torch {torch.__version__}, {os.cpu_count()} cores\n")
    print("| pairs per rank | global rows | mode | seconds (fwd+bwd) | x single | peak RSS growth MiB | x single |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        reference = None
        for name, (distributed, options) in MODES.items():
            options = {k: (args.chunk if v == "CHUNK" else v) for k, v in options.items()}
            world = args.world if distributed else 1
            per_rank = rows if distributed else rows * args.world
            seconds, grown = measure(world, per_rank, args.dim, options, args.repeats)
            if reference is None:
                reference = (seconds, grown)
            print(f"| {rows} | {2 * rows * args.world} | {name} | {seconds:.3f} | {seconds / reference[0]:.2f} | "
                  f"{grown:.0f} | {grown / max(reference[1], 1e-9):.2f} |", flush=True)


if __name__ == "__main__":
    main()
