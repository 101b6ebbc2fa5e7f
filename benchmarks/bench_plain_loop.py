"""`contrastkit pretrain`'s training step against a hand-written PyTorch SimCLR loop (CPU).

    PYTHONPATH=src python benchmarks/bench_plain_loop.py --data glyphlab --epochs 6 --repeats 3
    PYTHONPATH=src python benchmarks/bench_plain_loop.py --data digits --data-option size=28 ...
    PYTHONPATH=src python benchmarks/bench_plain_loop.py --data /path/to/cifar10-tree --train-limit 1000 ...

Both sides train the same model (``contrastkit.methods.build_model`` of the same config,
seed and all), on the same kornia views (the method's batch maker), with the same loss
(``model.loss``: ``nt_xent_views``), the same AdamW parameter groups and the same warm-up
cosine schedule. The plain loop is what a user writes by hand::

    for epoch in range(epochs):
        for indices in torch.randperm(n, generator=g)[: steps * batch].view(steps, batch):
            view_a, view_b = views(train, indices)
            loss = model.loss(view_a, view_b, labels[indices])
            optimizer.zero_grad(set_to_none=True); loss.backward(); optimizer.step(); scheduler.step()

``pretrain`` is timed from its own epoch records (``train_seconds``: the epoch loop alone,
DataLoader, logging every ``log_every`` steps and the per-step bookkeeping included; the
end-of-epoch checkpoint and the final read-out are not steps and are left out). The first
epoch of each side is a warm-up; steps/s is then measured per epoch, over ``--repeats``
alternating repeats of both sides; the table gives the median and the spread (min-max). The
plain loop also times its view calls, the view pipeline's share of a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.train import PretrainConfig, pretrain  # noqa: E402
from contrastkit.train.loop import warmup_cosine  # noqa: E402
from contrastkit.methods import get_method  # noqa: E402
from contrastkit.methods import build_model, limit_data, resolve_for_data  # noqa: E402


def _config(args, out: str) -> PretrainConfig:
    return PretrainConfig(data=args.data, data_options=dict(args.data_option), train_limit=args.train_limit,
                          val_limit=args.eval_limit, test_limit=args.eval_limit, epochs=args.epochs,
                          batch_size=args.batch_size, threads=args.threads, out=out, seed=0).resolved()


def pretrain_rates(args) -> List[float]:
    """Steps/s of each epoch after the first, from ``pretrain``'s own epoch records."""
    seconds: List[float] = []
    with tempfile.TemporaryDirectory() as out:
        config = _config(args, out)
        pretrain(config, force=True, progress=False, baselines=False,
                 on_epoch_end=lambda epoch, record: seconds.append(record["train_seconds"]))
        steps = json.load(open(os.path.join(out, "config.json")))["derived"]["steps_per_epoch"] \
            if os.path.exists(os.path.join(out, "config.json")) else None
    per_epoch = [b - a for a, b in zip(seconds, seconds[1:])]
    return [steps / s for s in per_epoch], steps


def plain_rates(args) -> Dict[str, List[float]]:
    """Steps/s of each epoch after the first of the hand-written loop, and its view share."""
    with tempfile.TemporaryDirectory() as out:
        config = _config(args, out)
    torch.set_num_threads(config.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else torch.get_num_threads()))
    torch.manual_seed(config.seed)
    method = get_method(config.method)
    dataset = limit_data(method.load_data(config), config)
    train = dataset.train
    n = len(train)
    config, choices = resolve_for_data(config, n)
    batch = choices.step_batch
    views = method.batches(dataset, config, torch.device("cpu"))
    model = build_model(config, dataset.image_shape)
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    steps = n // batch
    total = steps * config.epochs
    warmup = int(round(config.warmup_fraction * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warmup))
    generator = torch.Generator().manual_seed(config.seed)
    labels = train.labels
    rates, shares = [], []
    for epoch in range(config.epochs):
        started, view_seconds = time.perf_counter(), 0.0
        for indices in torch.randperm(n, generator=generator)[: steps * batch].view(steps, batch):
            t0 = time.perf_counter()
            view_a, view_b = views(train, indices)
            view_seconds += time.perf_counter() - t0
            loss = model.loss(view_a, view_b, labels[indices])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        seconds = time.perf_counter() - started
        if epoch:
            rates.append(steps / seconds)
            shares.append(view_seconds / seconds)
    return {"rates": rates, "view_shares": shares, "steps": steps}


def _summary(values: List[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="glyphlab")
    parser.add_argument("--data-option", action="append", default=[], type=lambda s: (s.split("=")[0], int(s.split("=")[1])),
                        help="NAME=INT option of the loader (e.g. size=28 for digits)")
    parser.add_argument("--train-limit", type=int)
    parser.add_argument("--eval-limit", type=int, default=200, help="val/test images (the read-out is not timed)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    ours, plain, shares = [], [], []
    for _ in range(args.repeats):  # alternating, so load changes hit both sides alike
        rates, steps = pretrain_rates(args)
        ours += rates
        result = plain_rates(args)
        plain += result["rates"]
        shares += result["view_shares"]
    ratio = statistics.median(ours) / statistics.median(plain)
    print(f"load average after: {os.getloadavg()}")
    print(f"| data | steps/epoch | pretrain steps/s | plain loop steps/s | pretrain / plain | view share |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| {args.data} {dict(args.data_option) or ''} | {result['steps']} | {_summary(ours)} | {_summary(plain)} "
          f"| {ratio:.3f} | {100 * statistics.median(shares):.0f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
