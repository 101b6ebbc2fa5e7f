"""Cost of the read-out against one training epoch, on a data set of realistic size.

The read-out is what `contrastkit pretrain` runs after training: frozen ``h`` features of the
train / val / test images, the linear probe (C chosen on val) and the weighted kNN on them, the
same for the random-init encoder and for the raw pixels, and the geometry metrics of two views
of the test split. One training epoch is timed as full steps (views -> encoder -> loss ->
backward -> AdamW step) and extrapolated to ``len(train) // batch_size`` steps.

    PYTHONPATH=src python benchmarks/bench_readout.py DATA [--batch-size 256] [--steps 20]
        [--threads N] [--cache cold-warm|off] [--json FILE]

The baselines do not depend on the run and are kept in a baseline cache
(``contrastkit.train.baselines``): ``--cache cold-warm`` (the default) times the read-out of a
first run on the data (an empty cache: everything computed, the baselines stored) and of the next
run (the baselines read back), and checks that both give the same numbers; ``--cache off`` times
one read-out that computes everything without a cache.

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
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.data import load_dataset, make_views  # noqa: E402
from contrastkit.train import PretrainConfig  # noqa: E402
from contrastkit.metrics import readout as readout_module  # noqa: E402
from contrastkit.methods.geometry import geometry  # noqa: E402
from contrastkit.train import baselines as baselines_module  # noqa: E402
from contrastkit.train.baselines import BaselineCache  # noqa: E402
from contrastkit.methods import build_model  # noqa: E402


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

    # Each stage where the read-out (or the baseline cache, for the digests) looks it up.
    stages = {"extract_features": readout_module, "linear_probe": readout_module, "knn_accuracy": readout_module,
              "data_digest": baselines_module, "encoder_digest": baselines_module}
    for name, module in stages.items():
        originals[name] = getattr(module, name)
        setattr(module, name, wrap(name, originals[name]))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(stages[name], name, function)


def readout_seconds(config: PretrainConfig, dataset: Any, cache: BaselineCache) -> Dict[str, Any]:
    """Time the read-out exactly as the training loop runs it, with the baseline ``cache``;
    returns the stage times and the numbers it produced."""
    model = build_model(config, dataset.image_shape[0])
    baseline = build_model(config, dataset.image_shape[0]).encoder
    views = make_views(dataset, mode="augment", device="cpu")
    times: Dict[str, float] = defaultdict(float)
    device = torch.device("cpu")
    started, cpu_started = time.perf_counter(), time.process_time()
    with timed_parts(times):
        numbers = readout_module.evaluate_encoders(
            dataset, model.encoder, device, baseline_encoder=baseline, raw_pixels=True, knn_k=config.knn_k,
            knn_temperature=config.knn_temperature,
            baselines=cache.for_data(dataset, knn_k=config.knn_k, knn_temperature=config.knn_temperature,
                                     device=device))
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
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both measurements (default: torch's, the cores it may use)")
    parser.add_argument("--cache", choices=("cold-warm", "off"), default="cold-warm",
                        help="time a first and a next run with the baseline cache, or one run without it")
    parser.add_argument("--label", default="", help="a name for this measurement in the table")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dataset = load_dataset(args.data)
    config = PretrainConfig(data=args.data, batch_size=args.batch_size).resolved()
    sizes = {name: int(getattr(dataset, name).images.shape[0]) for name in ("train", "val", "test")}
    if sizes["train"] < args.batch_size:
        parser.error(f"--batch-size {args.batch_size} is larger than the train split ({sizes['train']} images)")
    label = args.label or "read-out"
    with tempfile.TemporaryDirectory(prefix="bench-readout-cache-") as folder:
        if args.cache == "off":
            readouts = {label: readout_seconds(config, dataset, BaselineCache(None))}
        else:
            cache = BaselineCache(folder)
            readouts = {f"{label}, first run (cache empty)": readout_seconds(config, dataset, cache)}
            readouts[f"{label}, next run (baselines cached)"] = readout_seconds(config, dataset, cache)
            assert sorted(cache.hits) == ["random_init", "raw_pixel"], cache.hits
    epoch = epoch_seconds(config, dataset, args.steps)
    print(f"python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs; data {dataset.name} {tuple(dataset.image_shape)} "
          f"train/val/test {sizes['train']}/{sizes['val']}/{sizes['test']}, batch {args.batch_size}")
    print()
    print("| measurement | clock | features s | probe s | kNN s | cache keys s | geometry s | read-out s | epoch s "
          "| read-out / epoch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, readout in readouts.items():
        seconds = readout["seconds"]
        for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
            keys = seconds.get("data_digest" + suffix, 0) + seconds.get("encoder_digest" + suffix, 0)
            parts = " | ".join(f"{value:.1f}" for value in (
                *(seconds.get(part + suffix, 0) for part in ("extract_features", "linear_probe", "knn_accuracy")),
                keys, seconds.get("geometry" + suffix, 0), seconds["total" + suffix]))
            one_epoch = epoch["wall" if clock == "wall" else "cpu"]
            print(f"| {name} | {clock} | {parts} | {one_epoch:.1f} | {seconds['total' + suffix] / one_epoch:.2f} |")
    numbers = [readout["numbers"] for readout in readouts.values()]
    accuracies = {key: value for key, value in numbers[0].items() if key.endswith("accuracy") or key.endswith("probe_c")}
    print()
    print("numbers:", json.dumps(accuracies))
    if len(numbers) == 2:
        same = all(numbers[1][key] == value for key, value in accuracies.items())
        print("the next run's numbers are the first run's:", "identical" if same else "DIFFERENT")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"label": label, "sizes": sizes, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
                       "epoch_seconds": epoch, "readouts": {
                           name: {"readout_seconds": readout["seconds"],
                                  "ratio_wall": readout["seconds"]["total"] / epoch["wall"],
                                  "ratio_cpu": readout["seconds"]["total_cpu"] / epoch["cpu"],
                                  "numbers": readout["numbers"]} for name, readout in readouts.items()}},
                      handle, indent=1)


if __name__ == "__main__":
    main()
