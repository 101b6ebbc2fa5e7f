"""Streaming an image folder: peak memory and images/s of training steps over 10k vs 60k images,
with 0, 2 and 4 DataLoader workers.

Each configuration runs in its own process: the streamed data set (only the file index held,
:func:`contrastkit.data.stream_image_folder`), a :class:`~contrastkit.data.EpochBatchSampler`
and :func:`~contrastkit.data.make_loader` as ``pretrain`` builds them, the batched kornia views,
the small CNN with its projection head, NT-Xent and AdamW, for a fixed number of steps.
Reported: the peak resident set of the main process (``ru_maxrss``), the peak proportional set
size of the main process and its workers together (``/proc/PID/smaps_rollup``, sampled every
0.1 s: shared pages counted once), and images/s over the steps after the warm-up.

    PYTHONPATH=src python benchmarks/bench_streaming.py --root CIFAR_JPEG_DIR [--steps 20]
        [--batch-size 256] [--workers 0,2,4] [--out benchmarks/results/streaming.md]

``CIFAR_JPEG_DIR`` is the extracted CIFAR-10 JPEG tree (``train/<class>``, ``test/<class>``; 60,000
files); the 10k tree is made next to it from symbolic links to the first 800 train and 200 test
images of each class. Writes a Markdown table with the command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> List[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


class _PeakTreePss:
    """Samples the summed PSS of this process and its children every ``interval`` seconds."""

    def __init__(self, interval: float = 0.1) -> None:
        self.peak, self.interval, self._stop = 0, interval, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_pss_kib(p) for p in [me, *_children(me)]))
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def one(root: str, workers: int, steps: int, batch_size: int, warmup: int) -> Dict[str, float]:
    """One configuration, in this process: returns its numbers."""
    from contrastkit import losses
    from contrastkit.data import EpochBatchSampler, make_loader, make_views, stream_image_folder
    from contrastkit.train import PretrainConfig
    from contrastkit.methods import build_model

    torch.set_num_threads(1)
    sampler_thread = _PeakTreePss()
    data = stream_image_folder(root)
    n = len(data.train) + len(data.val) + len(data.test)
    views = make_views(data, device="cpu")
    model = build_model(PretrainConfig(seed=0).resolved(), data.image_shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sampler = EpochBatchSampler(len(data.train), batch_size, seed=0)
    loader = make_loader(data.train, batch_sampler=sampler, workers=workers)
    torch.manual_seed(0)
    started, timed = time.perf_counter(), 0
    for step, (images, _) in enumerate(loader):
        if step == warmup:
            started = time.perf_counter()
        view_a, view_b = views.views_of(images)
        z = model.head(model.encoder(torch.cat([view_a, view_b])))
        loss = losses.nt_xent_views(*z.chunk(2), temperature=0.2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        timed += step >= warmup
        if step + 1 == warmup + steps:
            break
    seconds = time.perf_counter() - started
    del loader
    peak_pss = sampler_thread.stop()
    return {"images": n, "train_images": len(data.train), "workers": workers,
            "images_per_second": timed * batch_size / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_tree_pss_mib": peak_pss / 1024, "index_bytes": int(data.train.dataset.files.nbytes)
            if hasattr(data.train, "dataset") else int(data.train.files.nbytes)}


def _subset_tree(root: Path, target: Path, per_class: Dict[str, int]) -> Path:
    if target.is_dir():
        return target
    for split, count in per_class.items():
        for folder in sorted((root / split).iterdir()):
            (target / split / folder.name).mkdir(parents=True, exist_ok=True)
            for file in sorted(folder.iterdir())[:count]:
                os.symlink(file, target / split / folder.name / file.name)
    return target


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="the extracted CIFAR-10 JPEG tree (train/, test/)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", default="0,2,4")
    parser.add_argument("--out", default=None, help="write the Markdown table here too")
    parser.add_argument("--one", nargs=2, metavar=("ROOT", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.steps, args.batch_size, args.warmup)))
        return 0
    root = Path(args.root).resolve()
    small = _subset_tree(root, root.parent / f"{root.name}-10k", {"train": 800, "test": 200})
    before = _uptime()
    rows = []
    for tree in (small, root):
        for workers in (int(w) for w in args.workers.split(",")):
            command = [sys.executable, os.path.abspath(__file__), "--root", str(root), "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--one", str(tree),
                       str(workers)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    after = _uptime()
    by = {(r["images"], r["workers"]): r for r in rows}
    lines = ["# Streaming an image folder: memory and throughput", "",
             "Command (from the repository root, CIFAR-10 JPEG tree extracted to a temporary folder):", "",
             f"    PYTHONPATH=src python benchmarks/bench_streaming.py --root CIFAR_JPEG_DIR --steps {args.steps} "
             f"--batch-size {args.batch_size} --workers {args.workers}", "",
             f"python {platform.python_version()}, torch {torch.__version__}, 1 torch thread in the main process, "
             f"small CNN, batch {args.batch_size}, {args.steps} timed steps after {args.warmup} warm-up steps, "
             f"augment views (kornia, CPU).", "",
             f"Load: before `{before}`; after `{after}`. The machine is shared: images/s are noisy, memory is not.",
             "", "| images | train | workers | images/s | peak RSS main (MiB) | peak PSS main + workers (MiB) | "
             "file index (KiB) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['images']:,} | {r['train_images']:,} | {r['workers']} | {r['images_per_second']:.0f} | "
                     f"{r['peak_rss_mib']:.0f} | {r['peak_tree_pss_mib']:.0f} | {r['index_bytes'] / 1024:.0f} |")
    sizes = sorted({r["images"] for r in rows})
    lines += ["", "Peak at the larger tree over the smaller, per worker count (target: at most 1.3x):", ""]
    for workers in (int(w) for w in args.workers.split(",")):
        a, b = by[(sizes[0], workers)], by[(sizes[-1], workers)]
        lines.append(f"- {workers} workers: RSS {b['peak_rss_mib'] / a['peak_rss_mib']:.2f}x, "
                     f"PSS {b['peak_tree_pss_mib'] / a['peak_tree_pss_mib']:.2f}x")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
