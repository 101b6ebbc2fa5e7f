"""Data-layer timings: building each data set, and making one batch of view pairs per mode.

Peers in the same run: the view makers are compared to plain indexing of the same batch
(the cost floor of any view maker), reported as ratios. Timings are medians of repeats.

    PYTHONPATH=src python benchmarks/bench_data.py [--repeats 5] [--batch-size 256] [--threads 1]

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.data import load_dataset, make_views  # noqa: E402
from contrastkit.data.digits import _raw_digits  # noqa: E402


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"batch {args.batch_size}, repeats {args.repeats}\n")

    print("| data set | build time (s) | summary |")
    print("|---|---|---|")
    built = {}
    for name in ("glyphlab", "digits"):
        def build(name=name):
            _raw_digits.cache_clear()  # time the real read of sklearn's file, not the cache
            built[name] = load_dataset(name, seed=0)
        seconds = median_seconds(build, args.repeats)
        print(f"| {name} (defaults) | {seconds:.3f} | {built[name].summary()} |")

    print("\n| data set | views | ms per batch | images/s | ratio to plain indexing |")
    print("|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for name, modes in (("glyphlab", ("A", "B", "augment")), ("digits", ("augment",))):
        ds = built[name]
        idx = torch.randint(0, len(ds.train), (args.batch_size,), generator=generator)
        floor = median_seconds(lambda: (ds.train.images[idx].clone(), ds.train.images[idx].clone()), args.repeats)
        print(f"| {name} | plain indexing | {1000 * floor:.2f} | {args.batch_size / floor:,.0f} | 1.0 |")
        for mode in modes:
            views = make_views(ds, mode)
            seconds = median_seconds(lambda: views(ds.train, idx), args.repeats)
            print(f"| {name} | {mode} (strength {views.strength:g}) | {1000 * seconds:.2f} | "
                  f"{args.batch_size / seconds:,.0f} | {seconds / floor:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
