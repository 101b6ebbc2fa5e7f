"""The input checks' share of a loss call on the CPU: ``validate=True`` against ``validate=False``.

    PYTHONPATH=src python benchmarks/bench_validation.py --sizes 256 4096 --threads 2

For each loss and N pairs (d = 128, float32, forward + backward, automatic dense/tiled
choice) the two settings are timed alternately, ``--repeats`` times each after a warm-up;
the table gives the medians, the checks' share ``(t_validate - t_off) / t_validate``, and,
to see below the noise of the difference, the time of the checks alone (the value checks a
call runs: finite entries of both inputs and their zero-norm rows, timed by themselves).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import contrastkit.losses as L
from contrastkit.losses.validation import check_pair, prepare

LOSSES = {
    "nt_xent_views": lambda a, b, v: L.nt_xent_views(a, b, temperature=0.1, validate=v),
    "bidirectional_info_nce": lambda a, b, v: L.bidirectional_info_nce(a, b, temperature=0.1, validate=v),
}


def _time(function, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def measure(name: str, n: int, repeats: int, dim: int = 128):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, dim, generator=g).requires_grad_()
    b = torch.randn(n, dim, generator=g).requires_grad_()
    loss = LOSSES[name]
    inner = max(1, 2048 // n)  # several calls per sample for the small size

    def step(validate: bool) -> None:
        loss(a, b, validate).backward()

    for validate in (True, False):
        step(validate)
    on, off = [], []
    for _ in range(repeats):
        on.append(_time(lambda: step(True), inner))
        off.append(_time(lambda: step(False), inner))

    def checks() -> None:
        check_pair(a, b)
        prepare(a, True, "z_a"), prepare(b, True, "z_b")

    def prepare_only() -> None:
        from contrastkit.losses.validation import value_checks
        with value_checks(False):
            prepare(a, True, "z_a"), prepare(b, True, "z_b")

    alone = statistics.median(_time(checks, 20) - _time(prepare_only, 20) for _ in range(5))
    t_on, t_off = statistics.median(on), statistics.median(off)
    return {"loss": name, "n": n, "validate_s": t_on, "off_s": t_off,
            "spread_on": (min(on), max(on)), "share": (t_on - t_off) / t_on,
            "checks_alone_s": alone, "checks_alone_share": alone / t_on}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"uptime before: {os.getloadavg()}")
    print("| loss | N pairs | validate=True (ms) | validate=False (ms) | share (difference) "
          "| checks alone (ms) | checks alone / call |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        for name in LOSSES:
            r = measure(name, n, args.repeats)
            print(f"| {name} | {n} | {1e3 * r['validate_s']:.3f} | {1e3 * r['off_s']:.3f} | {100 * r['share']:.1f} % "
                  f"| {1e3 * r['checks_alone_s']:.3f} | {100 * r['checks_alone_share']:.2f} % |", flush=True)
    print(f"uptime after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
