"""A whole ``pretrain`` run at a large batch with cached-gradient accumulation: peak RSS.

What ``contrastkit pretrain --data DIR --batch-size B --micro-batch m --epochs 1`` does (data
loading, views, the steps, checkpoints, the read-out of the trained encoder), in one process,
with the read-out's random-init and raw-pixel baselines left out (they are independent of the
batch, and the raw-pixel probe holds the whole training split as floats). Prints the wall time,
the training time, and the process's peak RSS (``ru_maxrss``), so the memory target of
``docs/accumulation.md`` is checked on the real training path (views included), not on one
isolated step.

    PYTHONPATH=src python benchmarks/bench_pretrain_large_batch.py CIFAR10_DIR --batch-size 16384 \
        --micro-batch 256 --out runs/bench-large-batch
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="a data set name or folder (e.g. the CIFAR-10 class-folder tree)")
    parser.add_argument("--batch-size", type=int, default=16384)
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True, help="the run folder (must not exist)")
    args = parser.parse_args()
    from contrastkit.train import PretrainConfig, pretrain

    config = PretrainConfig(data=args.data, batch_size=args.batch_size, micro_batch=args.micro_batch,
                            epochs=args.epochs, threads=args.threads, out=args.out)
    started = time.perf_counter()
    summary = pretrain(config, progress=False, baselines=False)
    row = {"batch_size": args.batch_size, "micro_batch": args.micro_batch, "epochs": args.epochs,
           "threads": args.threads, "wall_seconds": round(time.perf_counter() - started, 1),
           "train_seconds": round(summary["train_seconds"], 1), "final_loss": summary["final_loss"],
           "probe_accuracy": summary["probe_accuracy"],
           "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
           "cpus": os.cpu_count(), "machine": platform.machine(), "load_average": os.getloadavg()}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
