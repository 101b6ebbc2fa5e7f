"""Pretraining on an unlabeled image collection as a user meets it: the CIFAR-10 training
images copied into one flat folder (no class folders), trained from the command line with
DataLoader workers, next to a 10,000-image flat folder; peak memory of the whole process tree
(the trainer and its workers, sampled from /proc) and the label-free read-out with both
baselines; the CIFAR-10 test folder as ``--eval-data`` for the probe and kNN.

    python benchmarks/bench_unlabeled.py CIFAR10_JPEG_TARBALL_OR_DIR [--epochs 3] [--workers 2]

Writes ``benchmarks/results/unlabeled.json`` and prints one line per run. The flat folders are
hard links in a temporary folder (no copy of the pixels); nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
        stack.extend(children.get(current, []))
    return total


def _run(args: List[str]) -> Dict[str, object]:
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_rss(process.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({process.returncode}):\n{err}")
    return {"summary": json.loads(out), "peak_tree_rss_bytes": peak[0], "wall_seconds": time.perf_counter() - started}


def _flat(source: Path, target: Path, per_class: int) -> int:
    target.mkdir(parents=True)
    count = 0
    for folder in sorted((source / "train").iterdir()):
        for image in sorted(folder.iterdir())[:per_class]:
            os.link(image, target / f"{folder.name}_{image.name}")
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cifar", help="the CIFAR-10 JPEG tree (train/<class>, test/<class>) or its .tar.gz")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "unlabeled.json"))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="unlabeled-bench-") as work:
        work_path = Path(work)
        source = Path(options.cifar)
        if source.is_file():
            with tarfile.open(source) as archive:
                archive.extractall(work_path / "cifar")
            source = next(p.parent for p in (work_path / "cifar").rglob("train") if p.is_dir())
        results = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
                   "load_before": os.getloadavg(), "cores": os.cpu_count(), "runs": {}}
        for label, per_class in (("flat10k", 1000), ("flat50k", 5000)):
            flat = work_path / label
            images = _flat(source, flat, per_class)
            args = [sys.executable, "-m", "contrastkit", "pretrain", "--data", str(flat), "--workers",
                    str(options.workers), "--epochs", str(options.epochs), "--batch-size", str(options.batch_size),
                    "--eval-data", str(source / "test"), "--out", str(work_path / f"run-{label}"), "--no-report",
                    "--json", "--quiet"]
            result = _run(args)
            summary = result["summary"]
            keys = [k for k in summary if "view_retrieval" in k or k.endswith(("probe_accuracy", "knn_accuracy"))
                    or k in ("train_seconds", "eval_seconds", "images_per_second", "skipped_files")]
            results["runs"][label] = {"images": images, "peak_tree_rss_mib": result["peak_tree_rss_bytes"] / 2**20,
                                      "wall_seconds": result["wall_seconds"],
                                      **{k: summary[k] for k in sorted(keys)}}
            print(label, json.dumps(results["runs"][label]), flush=True)
        small, large = results["runs"]["flat10k"], results["runs"]["flat50k"]
        results["rss_ratio_50k_over_10k"] = large["peak_tree_rss_mib"] / small["peak_tree_rss_mib"]
        results["load_after"] = os.getloadavg()
    Path(options.out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"peak RSS 50k / 10k = {results['rss_ratio_50k_over_10k']:.3f}; written to {options.out}")


if __name__ == "__main__":
    main()
