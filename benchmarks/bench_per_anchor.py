"""The cost of one temperature per anchor against one scalar tau, measured side by side.

    PYTHONPATH=src python benchmarks/bench_per_anchor.py --n 16384 --rounds 3

Builds the configurations of ``bench_losses.py`` (two views, SimCLR's NT-Xent; both directions,
CLIP's loss; tiled, tiles of the default size, d = 128, float32) and times forward + backward
of each, alternating scalar, per-anchor (learnable: its gradient too) and per-anchor (fixed)
round after round in one process, so that a change of the machine's load hits all of them
alike. Prints one JSON line per measurement and a summary line per group with the median
wall and CPU seconds and the ratios to the scalar tau.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_losses import build  # noqa: E402

VARIANTS = ("contrastkit-tiled", "contrastkit-tiled-per-anchor", "contrastkit-tiled-per-anchor-fixed")


def once(loss_fn, inputs):
    for x in inputs:
        x.grad = None
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = loss_fn()
    loss.backward()
    return time.perf_counter() - start, time.process_time() - cpu_start, float(loss.detach())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16384, help="pairs (N)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--groups", nargs="+", default=["views", "bidirectional"], choices=["views", "bidirectional"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(json.dumps({"n": args.n, "dim": args.dim, "threads": args.threads, "torch": torch.__version__,
                      "load_average_at_start": load}), flush=True)
    for group in args.groups:
        built = {v: build(f"{group}/{v}", args.n, args.dim, args.temperature) for v in VARIANTS}
        torch.mm(built[VARIANTS[0]][1][0][:256].detach(), built[VARIANTS[0]][1][0][:256].detach().T)
        times = {v: ([], []) for v in VARIANTS}
        for round_ in range(args.rounds):
            for variant in VARIANTS:
                wall, cpu, value = once(*built[variant])
                times[variant][0].append(wall)
                times[variant][1].append(cpu)
                print(json.dumps({"group": group, "variant": variant, "round": round_, "seconds": wall,
                                  "cpu_seconds": cpu, "loss": value, "load_average": os.getloadavg()[0]}),
                      flush=True)
        base_wall = statistics.median(times[VARIANTS[0]][0])
        base_cpu = statistics.median(times[VARIANTS[0]][1])
        summary = {"group": group, "n": args.n}
        for variant in VARIANTS:
            wall, cpu = statistics.median(times[variant][0]), statistics.median(times[variant][1])
            summary[variant] = {"median_seconds": wall, "median_cpu_seconds": cpu,
                                "wall_ratio": wall / base_wall, "cpu_ratio": cpu / base_cpu}
        print(json.dumps({"summary": summary}), flush=True)
        del built
    print(json.dumps({"load_average_at_end": os.getloadavg()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
