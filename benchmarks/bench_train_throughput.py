"""Training throughput of `contrastkit pretrain` on CPU: images/s and where the time goes.

Times full training steps (views -> encoder -> loss -> backward -> optimizer step) of the
default configuration and splits each step into the view pipeline (kornia augmentations) and
the model part (forward, loss, backward, optimizer step). Peers in the same run: the same step
with noise-realisation views (mode "A", no kornia) and with the ResNet-18 encoder.

    PYTHONPATH=src python benchmarks/bench_train_throughput.py [--steps 20] [--batch-size 60]

Prints a Markdown table; images/s counts source images (each gives two views).
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
from contrastkit.train import PretrainConfig  # noqa: E402
from contrastkit.methods import build_model, resolve_for_data  # noqa: E402


def time_steps(config: PretrainConfig, dataset, views_mode: str, steps: int, warmup: int, threads: int):
    torch.set_num_threads(threads)
    views = make_views(dataset, mode=views_mode, device="cpu")
    config, _ = resolve_for_data(config.resolved(), dataset.train.images.shape[0])
    model = build_model(config, dataset.image_shape[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(0)
    n = dataset.train.images.shape[0]
    view_times, model_times = [], []
    for step in range(warmup + steps):
        indices = torch.randint(0, n, (config.batch_size,), generator=generator)
        t0 = time.perf_counter()
        view_a, view_b = views(dataset.train, indices)
        t1 = time.perf_counter()
        loss = model.loss(view_a, view_b, dataset.train.labels[indices])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        float(loss.detach())  # one sync so the step is really finished (a no-op cost on CPU)
        t2 = time.perf_counter()
        if step >= warmup:
            view_times.append(t1 - t0)
            model_times.append(t2 - t1)
    view_total, model_total = sum(view_times), sum(model_times)
    return {
        "images_per_second": steps * config.batch_size / (view_total + model_total),
        "view_share": view_total / (view_total + model_total),
        "view_ms": 1000 * statistics.median(view_times),
        "model_ms": 1000 * statistics.median(model_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=60)
    parser.add_argument("--resnet-steps", type=int, default=3, help="steps for the (slow on CPU) ResNet-18 peer")
    args = parser.parse_args()
    dataset = load_dataset("glyphlab", seed=0)
    base = dict(batch_size=args.batch_size)
    many = os.cpu_count() or 2
    rows = [
        ("small CNN, simclr, augment views, 1 thread (the default)", PretrainConfig(**base), "augment", args.steps, 1),
        (f"same, {many} threads", PretrainConfig(**base), "augment", args.steps, many),
        ("small CNN, simclr, A views (no kornia), 1 thread", PretrainConfig(**base), "A", args.steps, 1),
        ("small CNN, moco, augment views, 1 thread", PretrainConfig(method="moco", **base), "augment", args.steps, 1),
        ("ResNet-18, simclr, augment views, 1 thread", PretrainConfig(encoder="resnet18", **base), "augment",
         args.resnet_steps, 1),
    ]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}, {platform.processor() or platform.machine()}, "
          f"glyphlab {tuple(dataset.image_shape)}, batch {args.batch_size}\n")
    print("| configuration | images/s | ratio to default | view ms/step | model ms/step | view share |")
    print("|---|---:|---:|---:|---:|---:|")
    reference = None
    for name, config, mode, steps, n_threads in rows:
        r = time_steps(config, dataset, mode, steps, args.warmup if steps > 3 else 1, n_threads)
        reference = reference or r["images_per_second"]
        print(f"| {name} | {r['images_per_second']:.0f} | {r['images_per_second'] / reference:.2f} | "
              f"{r['view_ms']:.1f} | {r['model_ms']:.1f} | {100 * r['view_share']:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
