"""Training from tar shards (a stream) against the same CIFAR-10 images as a class-folder tree
read by index, and as torchvision's ``ImageFolder`` in a ``DataLoader``: whole ``contrastkit
pretrain`` runs with default settings, each in its own process, as a user runs them.

    PYTHONPATH=src python benchmarks/bench_tar_stream.py --tree CIFAR10_DIR --shards SHARDS_DIR
        [--epochs 1] [--workers 2] [--repeats 2] [--out benchmarks/results/tar_stream.md]

``CIFAR10_DIR`` is the extracted CIFAR-10 JPEG tree (``train/<class>``, ``test/<class>``);
``SHARDS_DIR`` receives it as ``contrastkit shard`` writes it (``contrastkit.data.write_shards``,
written once, 1,000 samples a shard, the image bytes unchanged): ``SHARDS_DIR/train`` (50 shards)
and ``SHARDS_DIR/test`` (10). The three sides, alternated in each repeat, with the same
encoder, views, batch choice and ``--workers``:

* **tar shards**: ``pretrain --data SHARDS_DIR/train --eval-data SHARDS_DIR/test``: the 50,000
  training images streamed from 50 shards; val and test from the held-out shards;
* **class folder**: ``pretrain --data CIFAR10_DIR``: the 60,000 files read by index (the
  folder's split: CIFAR-10's test set, val carved from train: 45,000 training images);
* **torchvision ImageFolder**: ``pretrain(dataset={"train": ImageFolder(CIFAR10_DIR/train),
  "test": ImageFolder(CIFAR10_DIR/test)})`` in Python: torchvision's reader, the items decoded in
  the ``DataLoader`` workers (45,000 training images after the val carved out).

The training sets differ in size, so the table compares the training epochs' images/s (the
summary's ``images_per_second``), with each run's wall time (set-up, training, read-out) for
what it is; the ratios are of the medians. **Peak RSS per worker**: the largest resident set
of any ``DataLoader`` worker process of the run (``VmHWM`` of each child of the run's process,
read every 0.2 s while it runs). ``--reader-only IMAGES`` times the data path alone instead:
reading and preprocessing IMAGES images from the shards and from the folder, in one process.
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
import threading
import time
from typing import Dict, List

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))


_IMAGEFOLDER = """
import json, sys
from torchvision.datasets import ImageFolder
from contrastkit.train import PretrainConfig, pretrain
root, out, epochs, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = PretrainConfig(data="imagefolder", epochs=epochs, workers=workers, out=out, device="cpu")
summary = pretrain(config, dataset={"train": ImageFolder(root + "/train"), "test": ImageFolder(root + "/test")},
                   progress=False)
print(json.dumps(summary))
"""


def _children(pid: int) -> List[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                found += [int(child) for child in handle.read().split()]
    except OSError:
        pass
    return found


def _peak_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _watch_workers(pid: int, peaks: Dict[int, int], stop: threading.Event) -> None:
    """The peak RSS (KiB) of every child process of ``pid`` (the DataLoader workers), until ``stop``."""
    while not stop.wait(0.2):
        for child in _children(pid):
            peaks[child] = max(peaks.get(child, 0), _peak_kib(child))


def _run(side: str, data: str, epochs: int, workers: int, tree: str, eval_data: str = "") -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        run = os.path.join(out, "run")
        if side == "imagefolder":
            command = [sys.executable, "-c", _IMAGEFOLDER, tree, run, str(epochs), str(workers)]
        else:
            command = [sys.executable, "-m", "contrastkit", "pretrain", "--data", data, "--epochs", str(epochs),
                       "--workers", str(workers), "--out", run, "--quiet", "--json", "--no-report", "--device", "cpu"]
            if eval_data:
                command += ["--eval-data", eval_data]
        env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
        started = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peaks: Dict[int, int] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_workers, args=(child.pid, peaks, stop), daemon=True)
        watcher.start()
        stdout, stderr = child.communicate()
        stop.set()
        watcher.join()
        wall = time.perf_counter() - started
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{stderr[-3000:]}")
        summary = json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])
        with open(os.path.join(run, "config.json"), encoding="utf-8") as handle:
            derived = json.load(handle)["derived"]
    return {"images_per_second": summary["images_per_second"], "train_seconds": summary["train_seconds"],
            "wall": wall, "steps": summary["steps"], "batch": derived["batch_size"],
            "train_images": derived.get("stream", {}).get("train_samples") or derived["dataset"]["sizes"]["train"],
            "probe": summary.get("probe_accuracy"), "knn": summary.get("knn_accuracy"),
            "worker_peak_mib": max(peaks.values(), default=0) / 1024, "workers_seen": len(peaks)}


def _reader_costs(train_shards: str, tree: str, images: int) -> Dict[str, float]:
    """Microseconds an image of reading and preprocessing alone, one process and one thread: the
    first ``images`` samples of the stream's first epoch, and as many items of the class folder
    read by index (streamed: decoded on access)."""
    import torch

    from contrastkit.data import open_data

    torch.set_num_threads(1)
    stream = open_data(train_shards, size=32).train
    stream.set_epoch(0)
    started = time.perf_counter()
    for count, _ in enumerate(stream, start=1):
        if count == images:
            break
    shards = (time.perf_counter() - started) / images
    folder = open_data(tree, size=32, stream=True).train
    started = time.perf_counter()
    for index in range(images):
        folder[index]
    return {"shards_us": shards * 1e6, "folder_us": (time.perf_counter() - started) / images * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--reader-only", type=int, default=0, metavar="IMAGES",
                        help="only time reading and preprocessing IMAGES images from each (no training) and print it")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "tar_stream.md"))
    args = parser.parse_args()
    from contrastkit.data import write_shards

    started = time.perf_counter()
    written = write_shards(args.tree, args.shards, shard_size=args.shard_size)  # (kept when written before)
    print(f"the shards written in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    train_shards = written.parts["train"].folder
    held_shards = written.parts["test"].folder
    if args.reader_only:
        print(json.dumps(_reader_costs(train_shards, args.tree, args.reader_only)))
        return
    load_before = os.getloadavg()
    sides = {"tar shards (stream)": ("shards", train_shards, held_shards),
             "class folder (contrastkit, by index)": ("folder", args.tree, ""),
             "torchvision ImageFolder + DataLoader": ("imagefolder", args.tree, "")}
    results: Dict[str, List[Dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.repeats):  # alternating
        for name, (side, data, eval_data) in sides.items():
            results[name].append(_run(side, data, args.epochs, args.workers, args.tree, eval_data))
            print(name, results[name][-1], file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    lines = ["| data | train images | batch | steps | images/s (median, min-max) | train s | wall s | "
             "peak RSS per worker MiB | probe | kNN |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    medians = {}
    for name, runs in results.items():
        speeds = [r["images_per_second"] for r in runs]
        medians[name] = statistics.median(speeds)
        first = runs[0]
        lines.append(f"| {name} | {first['train_images']:,} | {first['batch']} | {first['steps']} | "
                     f"{statistics.median(speeds):.0f} ({min(speeds):.0f}-{max(speeds):.0f}) | "
                     f"{statistics.median(r['train_seconds'] for r in runs):.1f} | "
                     f"{statistics.median(r['wall'] for r in runs):.1f} | "
                     f"{max(r['worker_peak_mib'] for r in runs):.0f} | "
                     f"{first['probe']:.3f} | {first['knn']:.3f} |")
    shards = medians["tar shards (stream)"]
    lines += ["", f"Ratios of the median images/s: tar shards / class folder "
                  f"**{shards / medians['class folder (contrastkit, by index)']:.2f}x**, tar shards / torchvision "
                  f"ImageFolder **{shards / medians['torchvision ImageFolder + DataLoader']:.2f}x**."]
    command = " ".join(["PYTHONPATH=src python benchmarks/bench_tar_stream.py", "--tree CIFAR10_DIR",
                        "--shards SHARDS_DIR", f"--epochs {args.epochs}", f"--workers {args.workers}",
                        f"--repeats {args.repeats}", f"--shard-size {args.shard_size}"])
    text = "\n".join([
        "# Training from tar shards against the same images as a class-folder tree and torchvision's ImageFolder",
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
