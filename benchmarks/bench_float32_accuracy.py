"""The float32 rounding of small per-anchor losses: contrastkit's dense and tiled paths against
F.cross_entropy on the same float32 logits (what info-nce-pytorch and lightly call), each
measured against float64 on the same rounded inputs.

    PYTHONPATH=src python benchmarks/bench_float32_accuracy.py [--seeds 5] [--repeats 200]
        [--out benchmarks/results/float32_small_losses.md]

Cases: N = 64 query / positive pairs of dimension 32 whose positives are near-duplicates
(noise 0.05 before normalising), tau = 0.05: per-anchor losses from about 1e-6 to 1e-3, where
``lse - l_pos`` rounds at the size of the logits (20) and ``log(1 + small)`` at 1. Reported: the
largest and the median relative error over every anchor of every seed. Then the cost of the
dense form: forward and backward of the per-anchor losses of 1,024 x 1,024 logits, against the
former ``lse - l_pos`` and ``F.cross_entropy``, interleaved, one thread.
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


def _timing(repeats: int) -> dict:
    """Median ms of forward + backward for each way of computing the dense per-anchor loss."""
    import time

    from contrastkit.losses.core import per_anchor_nll

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1024, 1024, generator=g) * 5
    mask = ~torch.eye(1024, dtype=torch.bool)
    positive = torch.randint(1024, (1024,), generator=g)
    positive = torch.where(positive == torch.arange(1024), (positive + 1) % 1024, positive)

    def former(x):
        masked = x.masked_fill(~mask, float("-inf"))
        return torch.logsumexp(masked, dim=1) - x.gather(1, positive[:, None]).squeeze(1)

    ways = {"contrastkit (max - l_pos) + log1p(others)": lambda x: per_anchor_nll(x, positive, mask)[0],
            "lse - l_pos (the former form)": former,
            "F.cross_entropy": lambda x: F.cross_entropy(x.masked_fill(~mask, float("-inf")), positive,
                                                        reduction="none")}
    times = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            x = logits.clone().requires_grad_()
            started = time.perf_counter()
            way(x).sum().backward()
            times[name].append(1e3 * (time.perf_counter() - started))
    return {name: statistics.median(values[repeats // 10:]) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200)
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
    timing = _timing(args.repeats)
    command = f"python benchmarks/bench_float32_accuracy.py --seeds {args.seeds} --repeats {args.repeats}"
    text = "\n".join(["# float32 rounding of small per-anchor losses", "",
                      f"Command: `{command}` (the script's docstring says what is measured). torch "
                      f"{torch.__version__}, {platform.machine()}, CPU, {os.cpu_count()} CPUs, load average "
                      f"{tuple(round(x, 2) for x in os.getloadavg())}. Smallest float64 loss: {smallest:.1e}.", "",
                      *rows, "", "What the dense form costs: forward and backward of the per-anchor losses of "
                      "1,024 x 1,024 float32 logits (the dense path's largest), the diagonal masked, one thread, "
                      "median milliseconds of interleaved repeats:", "",
                      "| computed by | ms | ratio to lse - l_pos |", "|---|---:|---:|",
                      *[f"| {name} | {ms:.2f} | {ms / timing['lse - l_pos (the former form)']:.2f} |"
                        for name, ms in timing.items()], ""])
    print(text)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
