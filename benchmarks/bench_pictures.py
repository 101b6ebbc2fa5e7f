"""What the report's pictures cost against the run they describe (CPU).

    PYTHONPATH=src python benchmarks/bench_pictures.py --data /path/to/cifar10-tree \\
        --train-limit 5000 --val-limit 1000 --test-limit 2000 --epochs 30 --batch-size 256

1. Trains a run as ``contrastkit pretrain`` does (its read-out and baselines included: the
   run's time is the wall time of :func:`contrastkit.train.pretrain`), the settings of the
   CIFAR-10 study runs by default (``experiments/cifar10/run.sh``).
2. Writes its report without the pictures (``pictures=False``) and with them (the default:
   views, neighbors and map of a 1000-image held-out sample, one real batch, and the explorer
   page), and takes the difference as the pictures' cost, with their parts (opening the data,
   reading the sample, encoding it twice, the t-SNE map) from the page's own timings.
3. ``--default-steps N``: also times N steps of ``contrastkit pretrain``'s default configuration
   (batch 60) on the same data and estimates a default run on the whole of CIFAR-10 (60 epochs of
   45,000 training images = 45,000 steps), whose pictures cost the same (their sample is fixed).

The pictures' cost does not grow with the run (a fixed sample, one batch); it is compared with
the shortest run the project trains on CIFAR-10.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.report import write_report  # noqa: E402
from contrastkit.report.pictures import held_out_pictures  # noqa: E402
from contrastkit.train import PretrainConfig, pretrain  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--train-limit", type=int, default=5000)
    parser.add_argument("--val-limit", type=int, default=1000)
    parser.add_argument("--test-limit", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--default-steps", type=int, default=0)
    parser.add_argument("--out", default=None, help="append the result as a JSON line to this file")
    args = parser.parse_args()
    result = {"command": " ".join(["python"] + sys.argv), "machine": platform.machine(), "cpus": os.cpu_count(),
              "torch": torch.__version__, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as root:
        run = os.path.join(root, "run")
        config = PretrainConfig(data=args.data, train_limit=args.train_limit, val_limit=args.val_limit,
                                test_limit=args.test_limit, epochs=args.epochs, batch_size=args.batch_size,
                                eval_every=args.eval_every, threads=args.threads, out=run, baseline_cache="off")
        started = time.perf_counter()
        summary = pretrain(config, progress=False)
        run_seconds = time.perf_counter() - started
        result["run"] = {"seconds": run_seconds, "train_seconds": summary["train_seconds"],
                         "eval_seconds": summary["eval_seconds"], "steps": summary["steps"],
                         "probe_accuracy": summary.get("probe_accuracy")}
        started = time.perf_counter()
        write_report(run, os.path.join(root, "plain.html"), pictures=False)
        plain = time.perf_counter() - started
        started = time.perf_counter()
        write_report(run)
        full = time.perf_counter() - started
        parts = held_out_pictures(run).seconds  # the held-out part again, for its breakdown
        result["report"] = {"without_pictures_seconds": plain, "with_pictures_seconds": full,
                            "pictures_seconds": full - plain, "held_out_parts_seconds": parts,
                            "pictures_share_of_run": (full - plain) / run_seconds,
                            "report_share_of_run": full / run_seconds,
                            "report_bytes": os.path.getsize(os.path.join(run, "report.html")),
                            "last_batch_bytes": os.path.getsize(os.path.join(run, "last_batch.pt"))}
        if args.default_steps:
            quick = PretrainConfig(data=args.data, train_limit=60 * args.default_steps, val_limit=100, test_limit=100,
                                   epochs=1, threads=args.threads, out=os.path.join(root, "default"),
                                   baseline_cache="off")
            summary = pretrain(quick, progress=False, baselines=False)
            step = summary["train_seconds"] / summary["steps"]
            estimate = step * 45000
            result["default_run_estimate"] = {"step_seconds": step, "steps": 45000, "train_seconds": estimate,
                                              "pictures_share": (full - plain) / estimate}
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
