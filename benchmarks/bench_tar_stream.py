"""Training from tar shards (a stream) against training from the same images as a class-folder
tree read by index: whole ``contrastkit pretrain`` runs with default settings, each in its own
process, as a user runs them.

    PYTHONPATH=src python benchmarks/bench_tar_stream.py --tree CIFAR10_DIR --shards SHARDS_DIR
        [--epochs 2] [--workers 2] [--repeats 2] [--out benchmarks/results/tar_stream.md]

``CIFAR10_DIR`` is the extracted CIFAR-10 JPEG tree (``train/<class>``, ``test/<class>``);
``SHARDS_DIR`` receives it as ``contrastkit shard`` writes it (``contrastkit.data.write_shards``,
written once, 1,000 samples a shard, the image bytes unchanged): ``SHARDS_DIR/train`` (50 shards)
and ``SHARDS_DIR/test`` (10). The folder run reads the 60,000 files of the tree, the stream the
50 training shards. The splits differ (the folder keeps CIFAR-10's test set and carves val from
train; the stream splits its 50,000 samples by the SHA-1 of their keys: 70 / 10 / 20 %), so the
training sets differ in size: the table compares the training epochs' images/s
(``train_seconds`` of the epochs, the summary's ``images_per_second``), and gives each run's wall
time (set-up, training, read-out) for what it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))


def _run(data: str, epochs: int, workers: int) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "contrastkit", "pretrain", "--data", data, "--epochs", str(epochs),
                   "--workers", str(workers), "--out", os.path.join(out, "run"), "--quiet", "--json",
                   "--no-report", "--device", "cpu"]
        env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = child.communicate()
        wall = time.perf_counter() - started
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
        summary = json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])
        with open(os.path.join(out, "run", "config.json"), encoding="utf-8") as handle:
            derived = json.load(handle)["derived"]
    return {"images_per_second": summary["images_per_second"], "train_seconds": summary["train_seconds"],
            "wall": wall, "steps": summary["steps"], "batch": derived["batch_size"],
            "train_images": derived.get("stream", {}).get("train_samples") or derived["dataset"]["sizes"]["train"],
            "probe": summary.get("probe_accuracy"), "knn": summary.get("knn_accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "tar_stream.md"))
    args = parser.parse_args()
    from contrastkit.data import write_shards

    started = time.perf_counter()
    written = write_shards(args.tree, args.shards, shard_size=1000)  # (kept as they are when written before)
    print(f"the shards written in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    train_shards = written.parts["train"].folder if "train" in written.parts else args.shards
    load_before = os.getloadavg()
    results: Dict[str, List[Dict[str, float]]] = {"class folder (read by index)": [], "tar shards (stream)": []}
    for _ in range(args.repeats):  # alternating
        results["class folder (read by index)"].append(_run(args.tree, args.epochs, args.workers))
        results["tar shards (stream)"].append(_run(train_shards, args.epochs, args.workers))
    load_after = os.getloadavg()
    lines = ["| data | train images | batch | steps | images/s (median, min-max) | train s | wall s | probe | kNN |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        speeds = [r["images_per_second"] for r in runs]
        first = runs[0]
        lines.append(f"| {name} | {first['train_images']:,} | {first['batch']} | {first['steps']} | "
                     f"{statistics.median(speeds):.0f} ({min(speeds):.0f}-{max(speeds):.0f}) | "
                     f"{statistics.median(r['train_seconds'] for r in runs):.1f} | "
                     f"{statistics.median(r['wall'] for r in runs):.1f} | "
                     f"{first['probe']:.3f} | {first['knn']:.3f} |")
    command = " ".join(["python benchmarks/bench_tar_stream.py", "--tree CIFAR10_DIR", "--shards SHARDS_DIR",
                        f"--epochs {args.epochs}", f"--workers {args.workers}", f"--repeats {args.repeats}"])
    text = "\n".join([
        "# Training from tar shards against the same images as a class-folder tree",
        "",
        f"Command: `{command}` (`benchmarks/bench_tar_stream.py`'s docstring says what each side does).",
        f"Machine: {os.cpu_count()} CPUs, {platform.machine()}; load average (1, 5, 15 min) before "
        f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in load_after)}.",
        "",
        *lines, ""])
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
