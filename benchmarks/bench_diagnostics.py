"""What the batch diagnostics of a logged step cost, against the training step (CPU).

    PYTHONPATH=src python benchmarks/bench_diagnostics.py --data /path/to/cifar10-tree --batch-size 256

At a logged step the method's loss hands the step's embeddings to the armed tap
(``contrastkit.methods.tap``): the batch's similarity problem (SimCLR: the ``2B x 2B`` matrix of
both views, float64) and its six numbers, on the device; the trainer then reads them back with
the loss in one transfer. Two measurements, on the same model, views and data:

* **direct**: the tap's work (``observe_batch`` on the step's own embeddings, then the read-back
  of the numbers), timed alone ``--repeats`` times (median), against the median of ``--steps``
  whole training steps (views -> encoder -> loss -> backward -> AdamW step), interleaved with it;
* **end to end**: ``pretrain`` with ``log_every = 1`` (every step logged), the tap armed as
  usual or disabled, alternating ``--runs`` times each; ``train_seconds`` per step.

The direct ratio is the number to read (the end-to-end difference is within the machine's noise
on a shared CPU); with ``--log-every`` 10 (the default) a run pays it on one step in ten.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.methods import build_model, get_method, load_data  # noqa: E402
from contrastkit.methods.optimization import build_optimizer  # noqa: E402
from contrastkit.methods.tap import BatchTap, observe_batch  # noqa: E402
from contrastkit.train import PretrainConfig, pretrain  # noqa: E402


def _config(args, out: str) -> PretrainConfig:
    return PretrainConfig(data=args.data, train_limit=args.train_limit, val_limit=200, test_limit=200,
                          epochs=args.epochs, batch_size=args.batch_size, threads=args.threads, out=out, seed=0,
                          log_every=1, method=args.method).resolved()


def direct(args) -> dict:
    config = _config(args, "unused")
    torch.set_num_threads(max(1, args.threads or 1))
    method = get_method(config.method)
    dataset = load_data(config)
    views = method.batches(dataset, config, torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(config, dataset.image_shape)
    model.train()
    optimizer = build_optimizer(model, config)
    n = len(dataset.train)
    steps, taps = [], []
    model.batch_tap = tap = BatchTap()
    for step in range(args.steps + 2):
        indices = torch.randperm(n)[:config.batch_size]
        started = time.perf_counter()
        batch = views(dataset.train, indices)
        loss = method.loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        float(loss)
        took = time.perf_counter() - started
        if step >= 2:  # warm-up
            steps.append(took)
        with torch.no_grad():
            embeddings = tuple(e.detach() for e in method.embed(model, batch))
        for _ in range(max(1, args.repeats // args.steps)):
            tap.arm()
            started = time.perf_counter()
            observe_batch(method, model, embeddings)
            _, values = tap.take()
            torch.cat([loss.detach().reshape(1).double(), values]).tolist()  # the one read-back
            taps.append(time.perf_counter() - started)
    step_s, tap_s = statistics.median(steps), statistics.median(taps)
    return {"step_ms": 1e3 * step_s, "step_ms_min": 1e3 * min(steps), "step_ms_max": 1e3 * max(steps),
            "diagnostics_ms": 1e3 * tap_s, "diagnostics_ms_min": 1e3 * min(taps),
            "share_of_a_logged_step": tap_s / step_s, "steps_timed": len(steps), "diagnostics_timed": len(taps),
            "similarity_matrix": [2 * config.batch_size, 2 * config.batch_size]}


def end_to_end(args) -> dict:
    per_step = {"on": [], "off": []}
    original = BatchTap.arm
    for _ in range(args.runs):
        for mode in ("on", "off"):
            BatchTap.arm = original if mode == "on" else (lambda self: None)
            try:
                with tempfile.TemporaryDirectory() as out:
                    summary = pretrain(_config(args, out), force=True, progress=False, baselines=False)
                    per_step[mode].append(summary["train_seconds"] / summary["steps"])
            finally:
                BatchTap.arm = original
    on, off = statistics.median(per_step["on"]), statistics.median(per_step["off"])
    return {"step_ms_with": 1e3 * on, "step_ms_without": 1e3 * off, "difference": (on - off) / off,
            "runs": per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--method", default="simclr")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--train-limit", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=None, help="append the result as a JSON line to this file")
    args = parser.parse_args()
    result = {"command": " ".join(["python"] + sys.argv), "machine": platform.machine(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "load_before": os.getloadavg(),
              "data": args.data, "method": args.method, "batch_size": args.batch_size, "threads": args.threads,
              "direct": direct(args)}
    if args.runs:
        result["end_to_end"] = end_to_end(args)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
