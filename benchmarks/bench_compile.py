"""`--compile` on CPU: the training step with the encoder compiled (torch.compile, inductor)
against the same step eager, in one process, on the same weights and batches.

For each configuration, two copies of one freshly built model (the trainer's `build_model`),
one compiled the way `pretrain --compile` compiles it (`contrastkit.train.setup.compile_encoder`),
train on the same random views (the encoder's cost does not depend on the pixels): forward of
both views, the method's loss, backward, AdamW step. Timed:

* the first compiled step (the compilation; with torch's on-disk cache cold, `--cold-cache`, or
  warm from an earlier run), and the first eager step;
* steady state: `--repeats` rounds of `--steps` eager steps then `--steps` compiled steps
  (interleaved, so a change of the machine's load hits both), median ms per step;
* the loss of the first step of both (same weights, same batch): their difference.

    PYTHONPATH=src python benchmarks/bench_compile.py [--threads 1] [--steps 5] [--repeats 5] [--resnet]

Prints a Markdown table; images/s counts source images (each gives two views).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import tempfile
import time

COLD = "--cold-cache" in sys.argv
if COLD:  # before torch is imported: inductor reads its cache folder once
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.methods import build_model, resolve_for_data  # noqa: E402
from contrastkit.train import PretrainConfig  # noqa: E402
from contrastkit.train.setup import compile_encoder  # noqa: E402


def _step(model, optimizer, views, labels) -> float:
    loss = model.loss(views[0], views[1], labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def measure(name: str, config: PretrainConfig, shape, steps: int, repeats: int):
    config, _ = resolve_for_data(config.resolved(), 10 * config.batch_size)
    eager = build_model(config, shape)
    compiled = copy.deepcopy(eager)
    compile_encoder(compiled.encoder)
    models = {"eager": eager, "compiled": compiled}
    optimizers = {key: torch.optim.AdamW(m.parameters(), lr=config.lr) for key, m in models.items()}
    generator = torch.Generator().manual_seed(0)
    batch = config.batch_size

    def views():
        return torch.rand(2, batch, *shape, generator=generator), torch.randint(0, 10, (batch,), generator=generator)

    first_views, first_labels = views()
    first = {}
    losses = {}
    for key in ("eager", "compiled"):
        started = time.perf_counter()
        losses[key] = _step(models[key], optimizers[key], first_views, first_labels)
        first[key] = time.perf_counter() - started
    times = {"eager": [], "compiled": []}
    for _ in range(repeats):
        for key in ("eager", "compiled"):
            for _ in range(steps):
                batch_views, labels = views()
                started = time.perf_counter()
                _step(models[key], optimizers[key], batch_views, labels)
                times[key].append(time.perf_counter() - started)
    eager_ms, compiled_ms = (1000 * statistics.median(times[k]) for k in ("eager", "compiled"))
    return {"name": name, "eager_ms": eager_ms, "compiled_ms": compiled_ms, "speedup": eager_ms / compiled_ms,
            "eager_ips": batch / eager_ms * 1000, "compiled_ips": batch / compiled_ms * 1000,
            "first_eager_s": first["eager"], "first_compiled_s": first["compiled"],
            "loss_difference": abs(losses["eager"] - losses["compiled"]),
            "break_even_steps": (first["compiled"] - first["eager"]) / max((eager_ms - compiled_ms) / 1000, 1e-9)
            if compiled_ms < eager_ms else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of eager and compiled steps")
    parser.add_argument("--resnet", action="store_true", help="also ResNet-18 at 32x32 (slow on CPU)")
    parser.add_argument("--cold-cache", action="store_true", help="an empty inductor cache: the first compiled "
                                                                   "step pays the whole compilation")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        ("small CNN, simclr, 1x32x32 (GlyphLab), batch 60 (the default run)", PretrainConfig(batch_size=60),
         (1, 32, 32)),
        ("small CNN, simclr, 3x32x32 (CIFAR-10), batch 256", PretrainConfig(batch_size=256), (3, 32, 32)),
    ]
    if args.resnet:
        rows.append(("ResNet-18, simclr, 3x32x32, batch 32", PretrainConfig(batch_size=32, encoder="resnet18"),
                     (3, 32, 32)))
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.1f} at the start, {platform.processor() or platform.machine()}, inductor cache "
          f"{'cold' if COLD else 'warm (as left by earlier runs)'}, {args.repeats} x {args.steps} steps each\n")
    print("| configuration | eager ms/step | compiled ms/step | speed-up (eager / compiled) | eager img/s | "
          "compiled img/s | first step eager s | first step compiled s | break-even steps | first-step loss diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, config, shape in rows:
        r = measure(name, config, shape, args.steps, args.repeats)
        even = "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f}"
        print(f"| {name} | {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | {r['speedup']:.2f}x | {r['eager_ips']:.0f} | "
              f"{r['compiled_ips']:.0f} | {r['first_eager_s']:.2f} | {r['first_compiled_s']:.1f} | {even} | "
              f"{r['loss_difference']:.1e} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
