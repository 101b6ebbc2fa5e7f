"""The GPU measurements of ``benchmarks/gpu/run.sh``, one subcommand each.

    python benchmarks/gpu/gpu_bench.py losses --out DIR [--max-n 262144] [--budget-s 240]
    python benchmarks/gpu/gpu_bench.py syncs  --out DIR
    python benchmarks/gpu/gpu_bench.py train  --out DIR --data CIFAR10_FOLDER [--epochs 8]
    python benchmarks/gpu/gpu_bench.py table  --out DIR

* ``losses``: forward + backward time (CUDA events, median of repetitions) and extra peak
  memory (``torch.cuda.max_memory_allocated`` minus what the inputs hold) of the dense and
  tiled contrastkit losses and their peers (``benchmarks/bench_losses.py``), in float32 and
  bfloat16, N doubling from 1,024 to ``--max-n`` pairs; a method stops growing at its first
  out-of-memory, error, or a call slower than ``--slow-s``, and the whole run at ``--budget-s``.
* ``syncs``: host synchronisations (``torch.cuda.set_sync_debug_mode``) of one loss call, and
  of each step of short training runs (:data:`SYNC_RUNS`, the training images held on the GPU)
  with whether the step logs: a logging step reads its loss back, no other step may wait.
* ``train``: ``contrastkit pretrain`` of ResNet-18 on CIFAR-10 (a class-folder tree of JPEGs)
  with ``--precision bf16 --channels-last --data-on-device on`` for ``--epochs`` epochs: its
  images per second and its kNN and linear-probe accuracy; then, in the same job, the same
  training for ``--baseline-epochs`` in float32, NCHW, streamed by the loader workers (images
  per second only), for the ratio.
* ``table``: ``DIR/RESULTS.md`` from the JSON lines: the loss benchmark as tables (seconds and
  extra peak MiB of each implementation at each N, per dtype, with the tiled loss's ratios to
  the dense one and to the peers, open_clip's among them), the sync counts, the training rows.

Each writes JSON lines to ``DIR/<subcommand>.jsonl`` (:func:`write_results`); every line holds
the machine (GPU name, torch and CUDA versions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent / "src"))

LOSS_METHODS = (
    "views/contrastkit-dense", "views/contrastkit-tiled", "views/pytorch-metric-learning", "views/lightly",
    "bidirectional/contrastkit-dense", "bidirectional/contrastkit-tiled", "bidirectional/open_clip",
    "info_nce/contrastkit-dense", "info_nce/contrastkit-tiled", "info_nce/info-nce-pytorch")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def machine() -> Dict[str, Any]:
    """What the numbers were measured on."""
    info: Dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_results(out_dir: os.PathLike, name: str, rows: Iterable[Dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines to ``out_dir/name.jsonl`` (the folder is created), each
    with the :func:`machine` it was measured on; returns the path."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem, got {name!r}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    host = machine()
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({**row, "machine": host}) + "\n")
    return path


def count_syncs(function: Callable[[], Any], device: torch.device) -> Optional[int]:
    """Host synchronisations that ``function()`` makes on a CUDA ``device`` (each one CUDA's
    sync debug mode reports as a warning); ``None`` on any other device, where a host sync
    does not exist (the function is not even called)."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            function()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device is available (torch.cuda.is_available() is False); "
                         "these measurements need one GPU")
    return torch.device("cuda")


def _time_loss(loss_fn: Callable[[], torch.Tensor], inputs: List[torch.Tensor], min_seconds: float = 1.0):
    times: List[float] = []
    value = None
    budget = time.perf_counter()
    while True:
        for x in inputs:
            x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = loss_fn()
        loss.backward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
        value = float(loss.detach())
        del loss
        if times[0] > min_seconds or (len(times) >= 5 and time.perf_counter() - budget > min_seconds) \
                or len(times) >= 50:
            break
    timed = times if len(times) == 1 else times[1:]
    return statistics.median(timed), len(timed), value


def measure_loss(method: str, n: int, dtype: str, dim: int = 128, tau: float = 0.1) -> Dict[str, Any]:
    """One configuration on the GPU: seconds, extra peak MiB, loss value, or the error."""
    import bench_losses
    from contrastkit.losses import tiled

    row: Dict[str, Any] = {"method": method, "n": n, "dtype": dtype, "dim": dim}
    dense_limit = tiled.DENSE_MAX_ENTRIES  # build() raises it to force the dense path
    try:
        torch.cuda.empty_cache()
        loss_fn, inputs = bench_losses.build(method, n, dim, tau, device="cuda", dtype=DTYPES[dtype])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        seconds, repetitions, value = _time_loss(loss_fn, inputs)
        row.update(status="ok", seconds=seconds, repetitions=repetitions, loss=value,
                   extra_peak_mib=(torch.cuda.max_memory_allocated() - baseline) / 2**20)
    except torch.cuda.OutOfMemoryError:
        row["status"] = "OOM"
    except Exception as err:  # a peer that does not support bf16, say: record it, go on
        row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        tiled.DENSE_MAX_ENTRIES = dense_limit
        loss_fn = inputs = None
        torch.cuda.empty_cache()
    return row


def sizes_up_to(max_n: int, start: int = 1024) -> List[int]:
    if max_n < start:
        raise ValueError(f"--max-n must be >= {start}, got {max_n}")
    out = [start]
    while out[-1] * 2 <= max_n:
        out.append(out[-1] * 2)
    return out


def run_losses(args: argparse.Namespace) -> List[Dict[str, Any]]:
    require_cuda()
    rows: List[Dict[str, Any]] = []
    deadline = time.perf_counter() + args.budget_s
    for dtype in DTYPES:
        for method in LOSS_METHODS:
            for n in sizes_up_to(args.max_n):
                if time.perf_counter() > deadline:
                    rows.append({"method": method, "n": n, "dtype": dtype, "status": "skipped (budget)"})
                    break
                row = measure_loss(method, n, dtype)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if row["status"] != "ok" or row["seconds"] > args.slow_s:
                    break
    return rows


def run_syncs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    device = require_cuda()
    import contrastkit.losses as ck

    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 128, generator=g).to(device).requires_grad_()
    b = torch.randn(4096, 128, generator=g).to(device).requires_grad_()
    calls = {  # 512 pairs take the dense path, 4,096 with chunk_size the tiled one
        "nt_xent_views dense": lambda **k: ck.nt_xent_views(a[:512], b[:512], temperature=0.1, **k),
        "nt_xent_views tiled": lambda **k: ck.nt_xent_views(a, b, temperature=0.1, chunk_size=1024, **k),
        "bidirectional_info_nce dense": lambda **k: ck.bidirectional_info_nce(a[:512], b[:512], temperature=0.1, **k),
        "bidirectional_info_nce tiled": lambda **k: ck.bidirectional_info_nce(a, b, temperature=0.1, chunk_size=1024,
                                                                             **k),
        "info_nce dense": lambda **k: ck.info_nce(a[:512], b[:512], temperature=0.1, **k),
        "supcon tiled": lambda **k: ck.supcon(a, torch.arange(4096, device=device) % 10, temperature=0.1,
                                              variant="in", chunk_size=1024, **k),
        "sigmoid_loss tiled": lambda **k: ck.sigmoid_loss(a, b, chunk_size=1024, **k),
    }
    rows = []
    for name, call in calls.items():
        for validate in (True, False):  # the value checks run on the device either way (0 expected)
            call(validate=validate).backward()  # warm-up: lazy CUDA initialisation syncs once
            forward = count_syncs(lambda: call(validate=validate), device)
            both = count_syncs(lambda: call(validate=validate).backward(), device)
            rows.append({"call": name, "validate": validate, "forward_syncs": forward,
                         "forward_backward_syncs": both})
            print(json.dumps(rows[-1]), flush=True)
    for name, options in SYNC_RUNS.items():
        steps = count_step_syncs(name, options, Path(args.runs))
        rows += steps
        quiet = sum(r["syncs"] for r in steps if not r["logging"])
        print(json.dumps({"run": name, "steps": len(steps), "syncs_on_non_logging_steps": quiet}), flush=True)
    return rows


class _MarkedBatches:
    """A run's batches; records, as each step's batch comes, how many warnings had come."""

    def __init__(self, batches: Any, run: Any, caught: List[Any], marks: List[Any]) -> None:
        self.batches, self.run, self.caught, self.marks = batches, run, caught, marks

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        for item in self.batches:
            self.marks.append((self.run.step + 1, len(self.caught)))
            yield item


class _Done(Exception):
    """Stops a run after its last epoch's checkpoint (no evaluation)."""


def _stop_after(epochs: int) -> Callable[[int, Dict[str, Any]], None]:
    def stop(epoch: int, record: Dict[str, Any]) -> None:
        if epoch >= epochs:
            raise _Done
    return stop


#: The training runs whose steps ``syncs`` counts (tiny GlyphLab data held on the device).
SYNC_RUNS = {
    "simclr small fp32": {},
    "simclr resnet18 bf16 channels-last": {"precision": "bf16", "channels_last": True, "encoder": "resnet18"},
    "simclr small fp16": {"precision": "fp16"},
    "moco views A": {"method": "moco", "views": "A"},
    "siglip pairs": {"method": "siglip", "data": "glyphlab-text", "views": "paired"},
    "simclr micro-batches bf16": {"precision": "bf16", "micro_batch": 2},
}


def count_step_syncs(name: str, options: Dict[str, Any], out: Path) -> List[Dict[str, Any]]:
    """One row per training step of a two-epoch run with its training images on the GPU: its
    synchronisations (and where Python was at each), and whether the step logs."""
    from contrastkit.train import PretrainConfig, loop, pretrain

    runs: List[Any] = []
    marks: List[Any] = []
    set_up, train_epoch = loop._set_up, loop._train_epoch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def marking_set_up(*a: Any, **k: Any) -> Any:
            run = set_up(*a, **k)
            run.loader = _MarkedBatches(run.loader, run, caught, marks)
            runs.append(run)
            return run

        def counting_epoch(run: Any, *a: Any, **k: Any) -> Any:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return train_epoch(run, *a, **k)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        loop._set_up, loop._train_epoch = marking_set_up, counting_epoch
        try:
            config = PretrainConfig(**{"data": "glyphlab", "data_options": {"train_scenes": 32, "val_scenes": 9,
                                                                            "test_scenes": 12, "size": 28},
                                       "epochs": 2, "batch_size": 8, "log_every": 3, "device": "cuda",
                                       "data_on_device": "on", "out": str(out / "sync-runs" / name.replace(" ", "-")),
                                       **options})
            pretrain(config, force=True, progress=False, on_epoch_end=_stop_after(2))
        except _Done:
            pass
        finally:
            loop._set_up, loop._train_epoch = set_up, train_epoch
    run = runs[0]
    bounds = marks + [(None, len(caught))]
    rows = []
    for (step, start), (_, stop) in zip(bounds, bounds[1:]):
        where = [f"{Path(w.filename).name}:{w.lineno}" for w in caught[start:stop]
                 if "synchroniz" in str(w.message).lower()]
        rows.append({"run": name, "step": step, "syncs": len(where), "where": where,
                     "logging": step % run.config.log_every == 0 or step % run.steps_per_epoch == 0})
    return rows


def run_train(args: argparse.Namespace) -> List[Dict[str, Any]]:
    device = require_cuda()
    from contrastkit.train import PretrainConfig, pretrain

    data = Path(args.data)
    if not (data / "train").is_dir():
        raise SystemExit(f"gpu_bench train: {data} is not a CIFAR-10 class-folder tree (train/<class>/*.jpg)")
    out, runs = Path(args.out), Path(args.runs)
    rows: List[Dict[str, Any]] = []
    common = dict(data=str(data), encoder="resnet18", batch_size=args.batch_size, workers=args.workers,
                  device=str(device), log_every=20, baseline_cache="off")
    fast = PretrainConfig(**common, epochs=args.epochs, precision="bf16", channels_last=True, data_on_device="on",
                          out=str(runs / "cifar10-bf16"))
    started = time.perf_counter()

    def progress(epoch: int, record: Dict[str, Any]) -> None:
        print(json.dumps({"run": "bf16 channels-last data-on-device", **record}), flush=True)

    summary = pretrain(fast, force=True, progress=False, baselines=False, on_epoch_end=progress)
    rows.append({"run": "bf16 channels-last data-on-device", "epochs": args.epochs, "batch_size": args.batch_size,
                 "images_per_second": summary["images_per_second"], "train_seconds": summary["train_seconds"],
                 "eval_seconds": summary["eval_seconds"], "knn_accuracy": summary.get("knn_accuracy"),
                 "probe_accuracy": summary.get("probe_accuracy"), "final_loss": summary["final_loss"],
                 "seconds": time.perf_counter() - started, "command": _command(fast)})
    print(json.dumps(rows[-1]), flush=True)
    _keep_run_files(Path(fast.out), out / "cifar10-bf16")
    write_results(out, "train", rows)  # kept if the float32 run below runs out of time

    plain = PretrainConfig(**common, epochs=args.baseline_epochs, precision="32", channels_last=False,
                           data_on_device="off", out=str(runs / "cifar10-fp32"))
    started = time.perf_counter()
    try:
        pretrain(plain, force=True, progress=False, baselines=False, on_epoch_end=_stop_after(args.baseline_epochs))
    except _Done:
        pass
    state = torch.load(Path(plain.out) / "checkpoints" / "last.pt", weights_only=True, map_location="cpu")
    rows.append({"run": "fp32 NCHW streamed", "epochs": args.baseline_epochs, "batch_size": args.batch_size,
                 "images_per_second": int(state["step"]) * args.batch_size / float(state["train_seconds"]),
                 "train_seconds": float(state["train_seconds"]), "seconds": time.perf_counter() - started,
                 "command": _command(plain)})
    rows[-1]["bf16_run_speedup"] = rows[0]["images_per_second"] / rows[-1]["images_per_second"]
    print(json.dumps(rows[-1]), flush=True)
    _keep_run_files(Path(plain.out), out / "cifar10-fp32")
    return rows


def _keep_run_files(run: Path, keep: Path) -> None:
    """Copy a run folder's small files (configuration, metrics, summary) to the results; the
    checkpoints stay behind."""
    import shutil

    keep.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        if (run / name).is_file():
            shutil.copyfile(run / name, keep / name)


def _command(config: Any) -> str:
    """The ``contrastkit pretrain`` command line of a training row."""
    flags = [f"--data {config.data}", f"--encoder {config.encoder}", f"--batch-size {config.batch_size}",
             f"--epochs {config.epochs}", f"--workers {config.workers}", f"--device {config.device}",
             f"--precision {config.precision}", f"--data-on-device {config.data_on_device}",
             f"--log-every {config.log_every}", f"--baseline-cache {config.baseline_cache}", f"--out {config.out}",
             "--no-baselines"]
    if config.channels_last:
        flags.append("--channels-last")
    return "contrastkit pretrain " + " ".join(flags)


def _read_rows(folder: Path, name: str) -> List[Dict[str, Any]]:
    path = folder / f"{name}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def loss_tables(rows: List[Dict[str, Any]]) -> str:
    """Markdown: for each dtype and loss kind, seconds / extra peak MiB of every implementation
    at each N (``OOM``, ``error``, ``skipped``; blank when not run), and the tiled loss's ratios
    to the dense one and to each peer (open_clip for the bidirectional loss)."""
    lines: List[str] = []
    for dtype in DTYPES:
        for kind in dict.fromkeys(method.split("/")[0] for method in LOSS_METHODS):
            methods = [m for m in LOSS_METHODS if m.startswith(kind + "/")]
            got = {(r["method"], r["n"]): r for r in rows if r.get("dtype") == dtype and r.get("method") in methods}
            sizes = sorted({n for _, n in got})
            if not sizes:
                continue
            names = [m.split("/")[1] for m in methods]
            peers = [m for m in methods if "contrastkit" not in m]
            tiled, dense = f"{kind}/contrastkit-tiled", f"{kind}/contrastkit-dense"
            header = ["N"] + [f"{n} s / MiB" for n in names] + ["tiled / dense s", "tiled / dense MiB"]
            for peer in peers:
                header += [f"tiled / {peer.split('/')[1]} s", f"tiled / {peer.split('/')[1]} MiB"]
            lines += [f"### {kind}, {dtype}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]

            def ratio(a: str, b: str, key: str, n: int) -> str:
                x, y = got.get((a, n)), got.get((b, n))
                if not (x and y and x.get("status") == "ok" and y.get("status") == "ok" and y[key]):
                    return ""
                return f"{x[key] / y[key]:.2f}"

            for n in sizes:
                cells = [f"{n:,}"]
                for method in methods:
                    row = got.get((method, n))
                    if row is None:
                        cells.append("")
                    elif row.get("status") == "ok":
                        cells.append(f"{row['seconds']:.4g} / {row['extra_peak_mib']:.0f}")
                    else:
                        cells.append(str(row.get("status", "?")).split(":")[0])
                cells += [ratio(tiled, dense, "seconds", n), ratio(tiled, dense, "extra_peak_mib", n)]
                for peer in peers:
                    cells += [ratio(tiled, peer, "seconds", n), ratio(tiled, peer, "extra_peak_mib", n)]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def run_table(args: argparse.Namespace) -> List[Dict[str, Any]]:
    folder = Path(args.out)
    parts = ["# GPU results", "", "Written by `python benchmarks/gpu/gpu_bench.py table` from the JSON lines beside "
             "this file, which `bash benchmarks/gpu/run.sh` wrote (`machine.txt` says on what, and each part's "
             "exit status).", ""]
    losses = _read_rows(folder, "losses")
    if losses:
        parts += ["## Losses: forward + backward seconds / extra peak MiB", "", loss_tables(losses)]
    syncs = _read_rows(folder, "syncs")
    calls = [r for r in syncs if "call" in r]
    steps = [r for r in syncs if "step" in r]
    if calls:
        parts += ["## Host synchronisations of one loss call", "", "| call | validate | forward | forward + backward |",
                  "|---|---|---|---|"]
        parts += [f"| {r['call']} | {r['validate']} | {r['forward_syncs']} | {r['forward_backward_syncs']} |"
                  for r in calls]
        parts.append("")
    if steps:
        parts += ["## Host synchronisations of training steps (images held on the GPU)", "",
                  "| run | steps | syncs on non-logging steps | most syncs of a logging step | where |",
                  "|---|---|---|---|---|"]
        for name in dict.fromkeys(r["run"] for r in steps):
            mine = [r for r in steps if r["run"] == name]
            quiet = sum(r["syncs"] for r in mine if not r["logging"])
            logged = max((r["syncs"] for r in mine if r["logging"]), default=0)
            where = sorted({w for r in mine if not r["logging"] for w in r["where"]})
            parts.append(f"| {name} | {len(mine)} | {quiet} | {logged} | {', '.join(where)} |")
        parts.append("")
    train = _read_rows(folder, "train")
    if train:
        parts += ["## CIFAR-10, ResNet-18", "", "| run | epochs | images/s | kNN | probe | command |",
                  "|---|---|---|---|---|---|"]
        for r in train:
            knn = "" if r.get("knn_accuracy") is None else f"{r['knn_accuracy']:.3f}"
            probe = "" if r.get("probe_accuracy") is None else f"{r['probe_accuracy']:.3f}"
            parts.append(f"| {r['run']} | {r['epochs']} | {r['images_per_second']:,.0f} | {knn} | {probe} | "
                         f"`{r['command']}` |")
        parts.append("")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "RESULTS.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    print(f"wrote {path}")
    return []


COMMANDS = {"losses": run_losses, "syncs": run_syncs, "train": run_train, "table": run_table}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--out", required=True, help="folder the results are written to")
    parser.add_argument("--max-n", type=int, default=262144, help="largest N (pairs) of the loss benchmark")
    parser.add_argument("--budget-s", type=float, default=240.0, help="wall-clock budget of the loss benchmark")
    parser.add_argument("--slow-s", type=float, default=5.0, help="a loss call slower than this stops its method")
    parser.add_argument("--data", default=None, help="train: the CIFAR-10 class-folder tree (train/, test/)")
    parser.add_argument("--epochs", type=int, default=8, help="train: epochs of the bf16 run")
    parser.add_argument("--baseline-epochs", type=int, default=1, help="train: epochs of the float32 run")
    parser.add_argument("--batch-size", type=int, default=512, help="train: images per step")
    parser.add_argument("--workers", type=int, default=8, help="train: loader workers decoding the JPEGs")
    parser.add_argument("--runs", default="/tmp/contrastkit-gpu-runs",
                        help="train, syncs: where the run folders (checkpoints) go; train copies their small files "
                             "to --out")
    args = parser.parse_args(argv)
    sizes_up_to(args.max_n)
    if args.budget_s <= 0 or args.slow_s <= 0 or min(args.epochs, args.baseline_epochs, args.batch_size) < 1 \
            or args.workers < 0:
        parser.error("--budget-s and --slow-s must be > 0, --epochs, --baseline-epochs and --batch-size >= 1, "
                     "--workers >= 0")
    if args.command == "train" and not args.data:
        parser.error("train needs --data, the CIFAR-10 class-folder tree")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"gpu_bench: {err}", file=sys.stderr)
        return 2
    rows = COMMANDS[args.command](args)
    if args.command != "table":
        print(f"wrote {write_results(args.out, args.command, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
