"""The float32 rounding of small per-anchor losses: contrastkit's dense and tiled paths against
F.cross_entropy on the same float32 logits (what info-nce-pytorch and lightly call), each
measured against float64 on the same rounded inputs.

    PYTHONPATH=src python benchmarks/bench_float32_accuracy.py [--seeds 5] [--out benchmarks/results/float32_small_losses.md]

Cases: N = 64 query / positive pairs of dimension 32 whose positives are near-duplicates
(noise 0.05 before normalising), tau = 0.05: per-anchor losses from about 1e-6 to 1e-3, where
``lse - l_pos`` rounds at the size of the logits (20) and ``log(1 + small)`` at 1. Reported: the
largest and the median relative error over every anchor of every seed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import torch
import torch.nn.functional as F

from contrastkit import losses

N, D, TAU = 64, 32, 0.05


def _views_logits(q, p):
    z = torch.cat([q, p])
    logits = (z @ z.T / TAU).fill_diagonal_(float("-inf"))
    return logits, torch.cat([torch.arange(N, 2 * N), torch.arange(N)])


CASES = {
    "info_nce (in-batch)": (lambda q, p, chunk: losses.info_nce(q, p, temperature=TAU, reduction="none",
                                                                 chunk_size=chunk),
                            lambda q, p: (q @ p.T / TAU, torch.arange(N))),
    "nt_xent_views": (lambda q, p, chunk: losses.nt_xent_views(q, p, temperature=TAU, reduction="none",
                                                               chunk_size=chunk), _views_logits),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "float32_small_losses.md"))
    args = parser.parse_args()
    rows = ["| loss | computed by | largest relative error | median relative error |", "|---|---|---:|---:|"]
    smallest = 1.0
    for name, (loss, logits_of) in CASES.items():
        errors = {"contrastkit, dense": [], "contrastkit, tiled (chunk_size=16)": [], "F.cross_entropy": []}
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(seed)
            q = F.normalize(torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
            p = F.normalize(q + 0.05 * torch.randn(N, D, generator=g, dtype=torch.float64), dim=1)
            q, p = q.float().double(), p.float().double()  # the float32 inputs, exactly
            reference = loss(q, p, None)
            smallest = min(smallest, float(reference.min()))
            logits, target = logits_of(q.float(), p.float())
            found = {"contrastkit, dense": loss(q.float(), p.float(), None),
                     "contrastkit, tiled (chunk_size=16)": loss(q.float(), p.float(), 16),
                     "F.cross_entropy": F.cross_entropy(logits, target, reduction="none")}
            for key, value in found.items():
                errors[key] += ((value.double() - reference).abs() / reference).tolist()
        for key, values in errors.items():
            rows.append(f"| {name} | {key} | {max(values):.1e} | {statistics.median(values):.1e} |")
    command = f"python benchmarks/bench_float32_accuracy.py --seeds {args.seeds}"
    text = "\n".join(["# float32 rounding of small per-anchor losses", "",
                      f"Command: `{command}` (the script's docstring says what is measured). torch "
                      f"{torch.__version__}, {platform.machine()}, CPU. Smallest float64 loss: {smallest:.1e}.", "",
                      *rows, ""])
    print(text)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
