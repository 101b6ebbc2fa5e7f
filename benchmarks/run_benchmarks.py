"""Run every loss configuration in a fresh subprocess and write the results table.

    PYTHONPATH=src python benchmarks/run_benchmarks.py --sizes 1024 4096 16384 65536 \\
        --out benchmarks/RESULTS.md

Each configuration runs ``benchmarks/bench_losses.py METHOD N`` with 2 threads under an
address-space limit (RLIMIT_AS, default 20 GiB, lowered if the machine has less memory
available) and a wall-clock limit; a run that fails to allocate is reported as OOM, one
that runs past the limit as TIMEOUT. Ratios are to the GEMM lower bound of the same problem
(three products of the dense formulation) measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
BENCH = HERE / "bench_losses.py"

GROUPS = {
    "views": ("SimCLR NT-Xent, one modality (2N x 2N)", [
        "contrastkit-dense", "contrastkit-tiled", "contrastkit-tiled-per-anchor", "contrastkit-tiled-per-anchor-fixed",
        "pytorch-metric-learning", "lightly", "gemm-bound"]),
    "bidirectional": ("CLIP / ConVIRT bidirectional InfoNCE, weight 0.5 (N x N)", [
        "contrastkit-dense", "contrastkit-tiled", "contrastkit-tiled-per-anchor", "contrastkit-tiled-per-anchor-fixed",
        "open_clip", "gemm-bound"]),
    "info_nce": ("InfoNCE with in-batch negatives, one direction (N x N)", [
        "contrastkit-dense", "contrastkit-tiled", "info-nce-pytorch", "gemm-bound"]),
    "sigmoid": ("SigLIP sigmoid loss, t = 1/tau, b = -10 (N x N)", [
        "contrastkit-dense", "contrastkit-tiled", "open_clip", "gemm-bound"]),
}

OOM_MARKERS = ("can't allocate memory", "MemoryError", "Cannot allocate memory", "std::bad_alloc",
               "out of memory", "DefaultCPUAllocator")


def _mem_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_one(method: str, n: int, args, limit_bytes: int) -> Dict[str, object]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    command = [sys.executable, str(BENCH), method, str(n), "--dim", str(args.dim),
               "--temperature", str(args.temperature), "--threads", str(args.threads)]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                              preexec_fn=limit, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"method": method, "n": n, "status": f"TIMEOUT (> {args.timeout:.0f} s)", "load": load_before}
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        result = json.loads(lines[-1])
        result.update(status="ok", load=load_before, wall=wall)
        return result
    text = done.stdout + done.stderr
    if any(marker in text for marker in OOM_MARKERS) or done.returncode in (-9, 137):
        status = f"OOM (> {limit_bytes / 2**30:.0f} GiB address space)"
    else:
        tail = text.strip().splitlines()[-1] if text.strip() else f"exit {done.returncode}"
        status = f"error: {tail[:120]}"
    return {"method": method, "n": n, "status": status, "load": load_before}


def table(results: List[Dict[str, object]], sizes: List[int]) -> List[str]:
    lines = []
    for group, (title, methods) in GROUPS.items():
        lines += [f"### {title}", "",
                  "| N pairs | implementation | fwd+bwd wall (s) | wall / bound | CPU (s) | CPU / bound "
                  "| extra peak (MiB) | loss | load |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for n in sizes:
            bound = next((r for r in results if r["method"] == f"{group}/gemm-bound" and r["n"] == n
                          and r["status"] == "ok"), None)
            for name in methods:
                r = next((r for r in results if r["method"] == f"{group}/{name}" and r["n"] == n), None)
                if r is None:
                    continue
                if r["status"] != "ok":
                    lines.append(f"| {n} | {name} | {r['status']} | | | | | | {r['load']:.1f} |")
                    continue
                ratio = f"{r['seconds'] / bound['seconds']:.2f}x" if bound else "n/a"
                cpu_ratio = f"{r['cpu_seconds'] / bound['cpu_seconds']:.2f}x" if bound else "n/a"
                loss = "" if r["loss"] is None else f"{r['loss']:.6f}"
                lines.append(f"| {n} | {name} | {r['seconds']:.3f} | {ratio} | {r['cpu_seconds']:.2f} | {cpu_ratio} "
                             f"| {r['extra_peak_mib']:.0f} | {loss} | {r['load']:.1f} |")
        lines.append("")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--groups", nargs="+", default=list(GROUPS), choices=list(GROUPS))
    parser.add_argument("--skip", nargs="*", default=[], help="implementation names to leave out")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-gib", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--omp-wait-policy", default="PASSIVE",
                        help="OMP_WAIT_POLICY for every run ('' keeps the environment's); PASSIVE keeps "
                             "OpenMP threads from spinning, which on a shared, oversubscribed machine "
                             "otherwise inflates wall time several-fold")
    parser.add_argument("--json", type=Path, help="append raw results (one JSON per line) here")
    parser.add_argument("--out", type=Path, help="write the markdown table here (refuses to overwrite)")
    parser.add_argument("--force", action="store_true", help="overwrite --out")
    args = parser.parse_args(argv)
    if args.out and args.out.exists() and not args.force:
        parser.error(f"{args.out} exists; pass --force to overwrite it")

    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    results = []
    for n in args.sizes:
        for group in args.groups:
            for name in GROUPS[group][1]:
                if name in args.skip:
                    continue
                limit = int(min(args.memory_gib * 2**30, _mem_available() - 2 * 2**30))
                result = run_one(f"{group}/{name}", n, args, limit)
                results.append(result)
                print(json.dumps(result), flush=True)
                if args.json:
                    with args.json.open("a") as handle:
                        handle.write(json.dumps(result) + "\n")

    versions = subprocess.run([sys.executable, str(BENCH), "versions"], capture_output=True, text=True)
    header = [
        f"Command: `{' '.join([Path(sys.executable).name] + sys.argv)}`",
        f"Machine: {os.cpu_count()} CPUs ({_cpu_model()}), {args.threads} torch threads, "
        f"d = {args.dim}, tau = {args.temperature}, float32, forward + backward.",
        f"Versions: {versions.stdout.strip()}",
        f"Limits per configuration: {args.memory_gib:g} GiB address space (RLIMIT_AS), "
        f"{args.timeout:.0f} s wall clock. OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}. "
        "`load` = 1-minute load average when the run started.",
        "",
    ]
    text = "\n".join(header + table(results, args.sizes))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
