"""Memory and time of one SimCLR training step: the plain full batch against cached-gradient
accumulation (``pretrain --micro-batch``), on CPU, 32x32 RGB images, 1 thread.

Each configuration runs in its own subprocess, its address space capped with
``resource.setrlimit(RLIMIT_AS)`` (``--cap-gib``), so a plain step that needs more memory
fails with an allocation error instead of swapping or starving the machine; a size whose
plain step ran out is not tried plainly at larger sizes. Per configuration: the peak resident
set size of the process (``ru_maxrss``, data and model included), the seconds of the step
(views already made: random tensors), and its parts -- the plain step's forward (encoder +
loss), the accumulated step's first, no-graph pass over the micro-batches (the extra forward
pass of the method) and its replay's forward (with a graph, the same work as a plain forward).

    PYTHONPATH=src python benchmarks/bench_accumulation.py \\
        [--sizes 1024,2048,4096,8192,16384] [--micro-batch 256] \\
        [--resnet-sizes 512,1024] [--resnet-micro-batch 256] [--cap-gib 6] [--repeats 2] \
        [--timeout 600] [--out FILE.md]

Prints (and with ``--out`` writes) a Markdown table, and the rows as JSON lines to
``FILE.jsonl``. ResNet-18 stops at 1,024 pairs: on a shared 2-core CPU its step takes minutes.
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

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")


def _one(encoder: str, pairs: int, micro_batch: int, cap_gib: float) -> dict:
    """One step in this (capped) process; returns its measurements."""
    cap = int(cap_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    sys.path.insert(0, SRC)
    import torch

    from contrastkit.train import get_method
    from contrastkit.methods.accumulation import cached_gradient_loss
    from contrastkit.methods import ContrastiveModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    method = get_method("simclr")
    model = ContrastiveModel("simclr", encoder, 3, temperature=0.2, projection_dim=64).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    result = {"encoder": encoder, "pairs": pairs, "micro_batch": micro_batch or None}
    try:
        views = (torch.rand(pairs, 3, 32, 32), torch.rand(pairs, 3, 32, 32))
        warm = tuple(v[:min(32, pairs)] for v in views)  # first-call set-up, outside the timing
        method.loss(model, warm).backward()
        optimizer.zero_grad(set_to_none=True)
        result["rss_before_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        start = time.perf_counter()
        if micro_batch:
            passes = {False: 0.0, True: 0.0}  # seconds of embed without / with a graph

            def embed(part):
                began = time.perf_counter()
                out = method.embed(model, part)
                passes[torch.is_grad_enabled()] += time.perf_counter() - began
                return out

            cached_gradient_loss(embed, lambda z: method.objective(model, z, None), views, micro_batch,
                                 model=model)
            result["first_pass_seconds"] = passes[False]
            result["replay_forward_seconds"] = passes[True]
        else:
            loss = method.loss(model, views)
            result["forward_seconds"] = time.perf_counter() - start
            loss.backward()
        optimizer.step()
        result["step_seconds"] = time.perf_counter() - start
        result["status"] = "ok"
    except (RuntimeError, MemoryError) as err:
        if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
            raise
        result["status"] = f"out of memory (cap {cap_gib:g} GiB)"
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def _run(encoder: str, pairs: int, micro_batch: int, cap_gib: float, timeout: float) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--one", encoder, str(pairs), str(micro_batch),
               str(cap_gib)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"encoder": encoder, "pairs": pairs, "micro_batch": micro_batch or None,
                "status": f"over {timeout:g} s, stopped"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        status = "out of memory" if done.returncode in (-9, 137) else f"failed: {done.stderr.strip()[-300:]}"
        return {"encoder": encoder, "pairs": pairs, "micro_batch": micro_batch or None, "status": status}
    return json.loads(lines[-1])


def _table(rows: list) -> str:
    plain = {(r["encoder"], r["pairs"]): r for r in rows if not r["micro_batch"] and r["status"] == "ok"}
    out = ["| encoder | pairs B | micro-batch | status | peak RSS GiB | step s | forward s (plain) "
           "| first pass s | replay forward s | extra pass / plain forward |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def cell(key, fmt="{:.2f}"):
            return fmt.format(r[key]) if key in r else "-"
        ratio = "-"
        if r["micro_batch"] and r["status"] == "ok":
            reference = plain.get((r["encoder"], r["pairs"]))
            base = reference["forward_seconds"] if reference else r["replay_forward_seconds"]
            ratio = f"{r['first_pass_seconds'] / base:.2f}" + ("" if reference else " (vs replay)")
        out.append(f"| {r['encoder']} | {r['pairs']} | {r['micro_batch'] or 'plain'} | {r['status']} "
                   f"| {cell('peak_rss_gib')} | {cell('step_seconds', '{:.1f}')} | {cell('forward_seconds', '{:.1f}')} "
                   f"| {cell('first_pass_seconds', '{:.1f}')} | {cell('replay_forward_seconds', '{:.1f}')} | {ratio} |")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        encoder, pairs, micro_batch, cap = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
        print(json.dumps(_one(encoder, pairs, micro_batch, cap)), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096,8192,16384", help="small CNN batch sizes (pairs)")
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--resnet-sizes", default="512,1024",
                        help="ResNet-18 batch sizes (pairs); on a shared 2-core CPU a larger step takes minutes")
    parser.add_argument("--resnet-micro-batch", type=int, default=256)
    parser.add_argument("--cap-gib", type=float, default=6.0, help="address-space cap of each step's process")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a step is stopped")
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration; the fastest is kept")
    parser.add_argument("--out", default=None, help="write the table here (and the rows to OUT.jsonl)")
    args = parser.parse_args()
    plan = [("small", int(b), args.micro_batch) for b in args.sizes.split(",") if b]
    plan += [("resnet18", int(b), args.resnet_micro_batch) for b in args.resnet_sizes.split(",") if b]
    rows, out_of_memory = [], set()
    started = time.time()
    for encoder, pairs, micro_batch in plan:
        for m in (0, micro_batch):
            if not m and encoder in out_of_memory:
                rows.append({"encoder": encoder, "pairs": pairs, "micro_batch": None,
                             "status": "not run (a smaller batch ran out of memory)"})
                continue
            runs = [_run(encoder, pairs, m, args.cap_gib, args.timeout) for _ in range(args.repeats)]
            done = [r for r in runs if r["status"] == "ok"]
            # the machine is shared: the fastest of the repeats (the peak RSS does not vary)
            row = min(done, key=lambda r: r["step_seconds"]) if done else runs[0]
            if not m and row["status"] != "ok":
                out_of_memory.add(encoder)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    header = (f"torch threads 1, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"{(time.time() - started) / 60:.0f} min; load average at the end "
              f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    text = header + "\n\n" + _table(rows) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
        with open(os.path.splitext(args.out)[0] + ".jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
