"""pytorch-metric-learning's ``NTXentLoss`` / ``SupConLoss`` against ``contrastkit.compat.pml``'s
(the same call, labelled batches): forward + backward time and peak memory, CPU, float32.

    PYTHONPATH=src python benchmarks/bench_compat_pml.py [--sizes 256,1024,4096,16384] [--dim 128]
        [--classes 10] [--repeats 3] [--out benchmarks/results/compat_pml.md]

Each (implementation, loss, N) runs in its own process (so that one's peak is not another's):
N embeddings of ``--dim`` dimensions, labels drawn from ``--classes`` classes, the loss and its
backward pass ``--repeats`` times after one warm-up; reported: the median seconds and the
process's peak resident memory above what it held before the first call (``ru_maxrss``). Each
process may address ``--memory-limit-gib`` (8 by default); a run that cannot allocate what it
asks for within that is reported as such, with the error's first line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _child(kind: str, loss: str, n: int, dim: int, classes: int, repeats: int, limit_gib: float) -> None:
    # A ceiling on the address space: an allocation beyond it fails here instead of swapping the machine.
    resource.setrlimit(resource.RLIMIT_AS, (int(limit_gib * 2**30), int(limit_gib * 2**30)))
    import torch

    torch.set_num_threads(1)
    if kind == "pytorch-metric-learning":
        from pytorch_metric_learning import losses as module
    else:
        from contrastkit.compat import pml as module
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, dim, generator=g).requires_grad_()
    labels = torch.randint(classes, (n,), generator=g)
    criterion = getattr(module, loss)()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    try:
        for repeat in range(repeats + 1):
            started = time.perf_counter()
            criterion(x, labels).backward()
            if repeat:
                times.append(time.perf_counter() - started)
            x.grad = None
    except (RuntimeError, MemoryError) as err:
        asked = re.search(r"allocate (?:memory: you tried to allocate )?(\d+) bytes", str(err))
        reason = (f"cannot allocate {int(asked.group(1)) / 2**30:.1f} GiB" if asked else
                  str(err).splitlines()[0][:120])
        print(json.dumps({"error": reason}))
        return
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"seconds": statistics.median(times), "peak_mib": peak / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024,4096,16384")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "compat_pml.md"))
    parser.add_argument("--memory-limit-gib", type=float, default=8.0,
                        help="address-space ceiling of each measured process (default 8)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, loss, n = args.child
        _child(kind, loss, int(n), args.dim, args.classes, args.repeats, args.memory_limit_gib)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()
    rows = ["| loss | N | pytorch-metric-learning s | contrastkit.compat s | PML peak MiB | compat peak MiB |",
            "|---|---:|---:|---:|---:|---:|"]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    for loss in ("NTXentLoss", "SupConLoss"):
        for n in sizes:
            found = {}
            for kind in ("pytorch-metric-learning", "contrastkit.compat"):
                output = subprocess.run([sys.executable, __file__, "--dim", str(args.dim), "--classes",
                                         str(args.classes), "--repeats", str(args.repeats), "--memory-limit-gib",
                                         str(args.memory_limit_gib), "--child", kind, loss, str(n)], env=env, capture_output=True, text=True, timeout=3600)
                lines = [line for line in output.stdout.splitlines() if line.startswith("{")]
                found[kind] = json.loads(lines[-1]) if lines else {"error": (output.stderr.strip().splitlines()
                                                                             or ["killed"])[-1][:120]}
            cells = []
            for key in ("seconds", "peak_mib"):
                for kind in ("pytorch-metric-learning", "contrastkit.compat"):
                    result = found[kind]
                    cells.append(f"fails: {result['error']}" if "error" in result else
                                 f"{result[key]:.3f}" if key == "seconds" else f"{result[key]:.0f}")
            rows.append(f"| {loss} | {n:,} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
            print(rows[-1], flush=True)
    load_after = os.getloadavg()
    command = (f"python benchmarks/bench_compat_pml.py --sizes {args.sizes} --dim {args.dim} --classes {args.classes} "
               f"--repeats {args.repeats} --memory-limit-gib {args.memory_limit_gib:g}")
    text = "\n".join(["# pytorch-metric-learning's losses against contrastkit.compat.pml", "",
                      f"Command: `{command}` (the script's docstring says what is measured). 1 torch thread, float32, "
                      f"CPU. Machine: {os.cpu_count()} CPUs, {platform.machine()}; load average before "
                      f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in load_after)}.",
                      "", *rows, ""])
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
