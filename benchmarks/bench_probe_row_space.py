"""The linear probe with fewer training images than features: fitted in the span of the training
rows (what ``linear_probe`` does when ``2 n <= d``) against the same probe in the whole feature
space, on CIFAR-10 raw pixels (3,072 features), same grid, same stopping rules.

    PYTHONPATH=src python benchmarks/bench_probe_row_space.py CIFAR10_DIR [--sizes 50,500] \\
        [--json RESULT.json]

CIFAR10_DIR: a class-folder tree (``train/<class>/*.jpg``, ``test/<class>/*.jpg``). For each
size ``n``: ``n`` training images (the first ``n / 10`` of each class), 500 val and 1,000 test
images from ``test/``; wall and CPU seconds of ``linear_probe`` both ways, the test accuracy, the
chosen C and the evaluations per C.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np
from PIL import Image

from contrastkit.metrics import probe


def _images(root: str, split: str, per_class: int, skip: int = 0):
    classes = sorted(os.listdir(os.path.join(root, split)))
    x, y = [], []
    for label, name in enumerate(classes):
        files = sorted(os.listdir(os.path.join(root, split, name)))[skip:skip + per_class]
        for file in files:
            with Image.open(os.path.join(root, split, name, file)) as image:
                x.append(np.asarray(image.convert("RGB"), dtype=np.float32).reshape(-1) / 255)
            y.append(label)
    return np.stack(x), np.array(y, dtype=np.int64)


def _timed(splits, whole_space: bool):
    row_space = probe._row_space
    if whole_space:
        probe._row_space = lambda *arrays: arrays
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        result = probe.linear_probe(*splits)
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                "test_accuracy": result.test_accuracy, "best_c": result.best_c,
                "evaluations": {str(c): e for c, e in result.evaluations_by_c.items()}, "capped": result.capped_c}
    finally:
        probe._row_space = row_space


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--sizes", default="50,500")
    parser.add_argument("--json")
    args = parser.parse_args()
    val, test = _images(args.data, "test", 50), _images(args.data, "test", 100, skip=50)
    results = []
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print("| n x d | fit | wall s | CPU s | test acc | C | evaluations per C |\n|---|---|---:|---:|---:|---:|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        train = _images(args.data, "train", n // 10)
        for whole in (False, True):
            r = {"n": len(train[1]), "d": train[0].shape[1], "whole_space": whole, **_timed((*train, *val, *test), whole)}
            results.append(r)
            print(f"| {r['n']} x {r['d']} | {'whole space' if whole else 'row space'} | {r['wall']:.1f} | {r['cpu']:.1f} | "
                  f"{r['test_accuracy']:.4f} | {r['best_c']:g} | "
                  + " ".join(f"{c}:{e}" for c, e in r["evaluations"].items()) + " |", flush=True)
    print("load:", load, "->", subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"results": results, "load_before": load}, handle, indent=1)


if __name__ == "__main__":
    main()
