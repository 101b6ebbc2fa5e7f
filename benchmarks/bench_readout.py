"""Cost of the read-out against one training epoch, on a data set of realistic size.

The read-out is what `contrastkit pretrain` runs after training: frozen ``h`` features of the
train / val / test images, the linear probe (C chosen on val) and the weighted kNN on them, the
same for the random-init encoder and for the raw pixels, and the geometry metrics of two views
of the test split. One training epoch is timed as full steps (views -> encoder -> loss ->
backward -> AdamW step) and extrapolated to ``len(train) // batch_size`` steps.

    PYTHONPATH=src python benchmarks/bench_readout.py DATA [--batch-size 256] [--steps 20]
        [--threads 1] [--json FILE]

``DATA`` is anything ``contrastkit.data.load_dataset`` reads (e.g. a class-folder tree of the
60,000 CIFAR-10 images, or a ``.npz`` of them converted to 28x28 grayscale). Both encoders are
at their initialisation (timing only: a trained encoder's features cost the same to extract;
the probe's iterations may differ a little). Prints a Markdown table; ``--json`` also writes
the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.data import load_dataset, make_views  # noqa: E402
from contrastkit.train import PretrainConfig  # noqa: E402
from contrastkit.train import evaluate as evaluate_module  # noqa: E402
from contrastkit.train.geometry import geometry  # noqa: E402
from contrastkit.train.setup import build_model  # noqa: E402


def epoch_seconds(config: PretrainConfig, dataset: Any, steps: int, warmup: int = 2) -> Dict[str, float]:
    """Seconds of one training epoch: the mean of ``steps`` full steps (after ``warmup``), times
    the steps of an epoch (the last partial batch is dropped, as in training); wall-clock and
    process CPU seconds (on a loaded machine the CPU time of a 1-thread run is the stable one)."""
    views = make_views(dataset, mode="augment", device="cpu")
    model = build_model(config, dataset.image_shape[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(0)
    n = dataset.train.images.shape[0]
    elapsed = cpu = 0.0
    for step in range(warmup + steps):
        indices = torch.randint(0, n, (config.batch_size,), generator=generator)
        started, cpu_started = time.perf_counter(), time.process_time()
        view_a, view_b = views(dataset.train, indices)
        loss = model.loss(view_a, view_b, dataset.train.labels[indices])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        float(loss.detach())
        if step >= warmup:
            elapsed += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
    return {"wall": elapsed / steps * (n // config.batch_size), "cpu": cpu / steps * (n // config.batch_size)}


@contextlib.contextmanager
def timed_parts(times: Dict[str, float]) -> Iterator[None]:
    """Accumulate the time of each read-out stage that ``evaluate_encoders`` calls."""
    originals: Dict[str, Callable] = {}

    def wrap(name: str, function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - started
                times[f"{name}_cpu"] += time.process_time() - cpu_started
        return timed

    for name in ("extract_features", "linear_probe", "knn_accuracy"):
        originals[name] = getattr(evaluate_module, name)
        setattr(evaluate_module, name, wrap(name, originals[name]))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(evaluate_module, name, function)


def readout_seconds(config: PretrainConfig, dataset: Any) -> Dict[str, Any]:
    """Time the read-out exactly as the training loop runs it; returns the stage times and
    the numbers it produced."""
    model = build_model(config, dataset.image_shape[0])
    baseline = build_model(config, dataset.image_shape[0]).encoder
    views = make_views(dataset, mode="augment", device="cpu")
    times: Dict[str, float] = defaultdict(float)
    device = torch.device("cpu")
    started, cpu_started = time.perf_counter(), time.process_time()
    with timed_parts(times):
        numbers = evaluate_module.evaluate_encoders(dataset, model.encoder, device, baseline_encoder=baseline,
                                                    raw_pixels=True, knn_k=config.knn_k,
                                                    knn_temperature=config.knn_temperature)
    geometry_started, geometry_cpu = time.perf_counter(), time.process_time()
    numbers["representation"] = geometry(model, dataset.test, views, device, batch_size=config.batch_size,
                                         temperature=config.temperature, seed=config.seed)
    times["geometry"] = time.perf_counter() - geometry_started
    times["geometry_cpu"] = time.process_time() - geometry_cpu
    times["total"] = time.perf_counter() - started
    times["total_cpu"] = time.process_time() - cpu_started
    return {"seconds": dict(times), "numbers": numbers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a data set path or name for contrastkit.data.load_dataset")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="training steps timed for the epoch estimate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both measurements")
    parser.add_argument("--label", default="", help="a name for this measurement in the table")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_dataset(args.data)
    config = PretrainConfig(data=args.data, batch_size=args.batch_size).resolved()
    sizes = {name: int(getattr(dataset, name).images.shape[0]) for name in ("train", "val", "test")}
    readout = readout_seconds(config, dataset)
    epoch = epoch_seconds(config, dataset, args.steps)
    seconds = readout["seconds"]
    print(f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs; data {dataset.name} {tuple(dataset.image_shape)} "
          f"train/val/test {sizes['train']}/{sizes['val']}/{sizes['test']}, batch {args.batch_size}")
    print()
    print("| measurement | clock | features s | probe s | kNN s | geometry s | read-out s | epoch s | read-out / epoch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
        parts = " | ".join(f"{seconds.get(part + suffix, 0):.1f}"
                           for part in ("extract_features", "linear_probe", "knn_accuracy", "geometry", "total"))
        one_epoch = epoch["wall" if clock == "wall" else "cpu"]
        print(f"| {args.label or 'read-out'} | {clock} | {parts} | {one_epoch:.1f} | "
              f"{seconds['total' + suffix] / one_epoch:.2f} |")
    accuracies = {key: value for key, value in readout["numbers"].items()
                  if key.endswith("accuracy") or key.endswith("probe_c")}
    print()
    print("numbers:", json.dumps(accuracies))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"label": args.label, "sizes": sizes, "batch_size": args.batch_size,
                       "threads": torch.get_num_threads(), "readout_seconds": seconds, "epoch_seconds": epoch,
                       "ratio_wall": seconds["total"] / epoch["wall"],
                       "ratio_cpu": seconds["total_cpu"] / epoch["cpu"], "numbers": readout["numbers"]}, handle, indent=1)


if __name__ == "__main__":
    main()
