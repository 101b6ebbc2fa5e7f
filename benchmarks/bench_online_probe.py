"""What ``--online-probe`` costs a run: whole ``contrastkit pretrain`` runs on CIFAR-10 with and
without it, each in its own process, alternated, on the small CNN (the default encoder) and on
ResNet-18, with default settings otherwise.

    PYTHONPATH=src python benchmarks/bench_online_probe.py --data CIFAR10_DIR [--repeats 3]
        [--resnet-train-limit 2560] [--out benchmarks/results/online_probe.md]

``CIFAR10_DIR`` is the extracted CIFAR-10 JPEG tree (``train/<class>``, ``test/<class>``). What
is compared, per encoder:

* **per step**: the training epochs' images/s (the summary's ``images_per_second``: the steps
  alone, which with ``--online-probe`` include the head's forward, backward and Adam step on the
  step's detached ``h``); the cost is ``1 - on / off`` of the medians;
* **per epoch**: the online evaluation at each epoch's end (the kNN bank's features extracted
  again, the val sample classified): what the run's wall time grows by beyond its training
  steps, ``(seconds_on - train_seconds_on) - (seconds_off - train_seconds_off)``;
* **the offline read-out's numbers** with and without (the encoder trains the same: they must be
  equal), and the online probe's and kNN monitor's last numbers beside the offline ones.

Whole runs on a shared machine spread by more than the probe's cost; ``--steps-only STEPS`` times
the step itself in one process instead, with and without the probe alternated, and the probe's
own step alone (``step_costs``; ResNet-18 gets STEPS / 8 steps, at least 3); ``--epoch-only
REPEATS`` times the evaluation at an epoch's end alone (``time_epoch_evaluation``);
``--agreement EPOCHS`` trains one whole default run of EPOCHS epochs with the online probe and
``--eval-every 5`` and compares, epoch by epoch, the online numbers with the val read-out's
(``agreement``): do they agree by the end of a run?

The small CNN trains one whole epoch of the 45,000 training images (default batch); ResNet-18,
on this CPU about 20x slower a step, trains ``--resnet-train-limit`` images of it (batch 256,
the read-out on 2,000 val and test images: ``--val-limit 2000 --test-limit 2000``, which the
online evaluation's val sample then is too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

_KEYS = ("images_per_second", "train_seconds", "eval_seconds", "seconds", "probe_accuracy", "knn_accuracy",
         "online_probe_accuracy", "online_knn_accuracy", "batch_size", "steps")


def run(data: str, encoder: str, online: bool, train_limit: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="online-") as work:
        argv = [sys.executable, "-m", "contrastkit", "pretrain", "--data", data, "--out", os.path.join(work, "run"),
                "--epochs", "1", "--no-baselines", "--no-report", "--quiet", "--json", "--device", "cpu",
                "--online-probe" if online else "--no-online-probe"]
        if encoder != "small":
            argv += ["--encoder", encoder, "--batch-size", "256", "--train-limit", str(train_limit),
                     "--val-limit", "2000", "--test-limit", "2000"]
        started = time.perf_counter()
        process = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.path.join(
            ROOT, "src")})
        wall = time.perf_counter() - started
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {process.returncode}\n{process.stderr[-3000:]}")
        summary = json.loads(process.stdout)
    result = {key: summary.get(key) for key in _KEYS}
    result.update(encoder=encoder, online=online, wall=wall)
    return result


def step_costs(encoder: str, steps: int, batch: int = 256, threads: int = 0) -> Dict[str, Any]:
    """The training step timed in one process, with and without the online probe, alternated:
    SimCLR's step (both views through the encoder, NT-Xent, backward, the optimizer's step) on
    a batch of ``batch`` CIFAR-sized images, and, with the probe, the encoder's output kept by
    its hook and the head's own step on it (:meth:`~contrastkit.train.online.OnlineProbe.train_step`),
    which is also timed alone. Random pixels: the time of a step does not depend on them."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    import torch

    from contrastkit.methods import PretrainConfig, build_model
    from contrastkit.train.online import OnlineProbe

    if threads:
        torch.set_num_threads(threads)
    config = PretrainConfig(encoder=encoder, batch_size=batch).resolved()
    model = build_model(config, (3, 32, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    online = OnlineProbe(model.encoder.out_dim, 10, torch.device("cpu"), seed=0, knn_k=config.knn_k,
                         knn_temperature=config.knn_temperature)
    online.attach(model.encoder)
    generator = torch.Generator().manual_seed(0)
    view_a, view_b = (torch.rand(batch, 3, 32, 32, generator=generator) for _ in range(2))
    labels = torch.randint(0, 10, (batch,), generator=generator)
    times: Dict[bool, List[float]] = {False: [], True: []}
    probe: List[float] = []
    for step in range(1 + 2 * steps):
        with_probe = step % 2 == 1
        started = time.perf_counter()
        with online.capturing() if with_probe else _nothing():
            loss = model.loss(view_a, view_b, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if with_probe:
            before = time.perf_counter()
            online.train_step(labels)
            probe.append(time.perf_counter() - before)
        if step:  # (the first step warms up)
            times[with_probe].append(time.perf_counter() - started)
    off, on, alone = (statistics.median(times[False]), statistics.median(times[True]), statistics.median(probe))
    return {"encoder": encoder, "batch": batch, "steps_each": steps, "step_off_ms": 1e3 * off, "step_on_ms": 1e3 * on,
            "probe_step_ms": 1e3 * alone, "probe_share": alone / off, "difference_share": on / off - 1}


def time_epoch_evaluation(data: str, encoder: str, repeats: int) -> Dict[str, Any]:
    """The online evaluation at an epoch's end timed alone (``OnlineProbe.evaluate``: the kNN
    bank's features extracted again, the val sample classified by the kNN and the head), on the
    data set as ``pretrain --data DATA`` opens it, the run's default kNN settings; and the online
    view retrieval a run without labels does instead (``OnlineViewRetrieval.evaluate``: two
    views of each of 2,000 val images made and encoded); medians of ``repeats`` after one
    warm-up call."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    import torch

    from contrastkit.data import open_data
    from contrastkit.methods import PretrainConfig, build_model
    from contrastkit.train.evaluate import readout_views
    from contrastkit.train.online import OnlineProbe, OnlineViewRetrieval

    config = PretrainConfig(encoder=encoder, data=data).resolved()
    dataset = open_data(data)
    model = build_model(config, dataset.image_shape)
    online = OnlineProbe(model.encoder.out_dim, dataset.num_classes, torch.device("cpu"), seed=0,
                         knn_k=config.knn_k, knn_temperature=config.knn_temperature)
    # The same images without their labels: the online view retrieval of 2,000 val images.
    views = OnlineViewRetrieval(readout_views(config, dataset, torch.device("cpu")), torch.device("cpu"), seed=0)
    seconds: Dict[str, List[float]] = {"probe": [], "views": []}
    for _ in range(1 + repeats):
        for name, evaluation in (("probe", online), ("views", views)):
            started = time.perf_counter()
            evaluation.evaluate(model.encoder, dataset)
            seconds[name].append(time.perf_counter() - started)
    return {"encoder": encoder, "epoch_evaluation_s": statistics.median(seconds["probe"][1:]),
            "runs": seconds["probe"][1:], "bank": min(len(dataset.train), 4096), "val": min(len(dataset.val), 10000),
            "view_retrieval_s": statistics.median(seconds["views"][1:]), "view_runs": seconds["views"][1:]}


def agreement(data: str, epochs: int, eval_every: int, work: str) -> Dict[str, Any]:
    """One default small-CNN run of ``epochs`` epochs with ``--online-probe --eval-every
    eval_every`` in ``work`` (resumed when a run is there), and per evaluation epoch the online
    probe and kNN beside the val probe and val kNN of the same epoch (all on the val split; the
    online ones on its seeded sample of at most 10,000 images, here all 5,000); then the last
    epoch's online numbers beside the offline read-out's on test."""
    out = os.path.join(work, "run")
    argv = [sys.executable, "-m", "contrastkit", "pretrain", "--data", data, "--out", out, "--epochs", str(epochs),
            "--eval-every", str(eval_every), "--online-probe", "--no-baselines", "--no-report", "--quiet", "--json",
            "--device", "cpu"]
    if os.path.exists(os.path.join(out, "checkpoints", "last.pt")):
        argv.append("--resume")
    started = time.perf_counter()
    process = subprocess.run(argv, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    if process.returncode:
        raise SystemExit(process.stderr[-4000:])
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    epochs_rows = []
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("kind") == "epoch":
                epochs_rows.append({key: record.get(key) for key in (
                    "epoch", "loss", "online_probe_accuracy", "online_knn_accuracy", "val_probe_accuracy",
                    "val_knn_accuracy")})
    return {"epochs": epochs_rows, "wall": time.perf_counter() - started,
            "summary": {key: summary.get(key) for key in _KEYS + ("selected_epoch",)}}


def agreement_lines(result: Dict[str, Any], command: str, load: Any) -> List[str]:
    """The markdown section of an :func:`agreement` run."""
    lines = ["## Online against the val read-out over a whole run", "", "```bash", command, "```", "",
             f"Load average (1, 5, 15 min) at the end: {tuple(round(x, 2) for x in load)}; the run took "
             f"{result['wall'] / 60:.1f} min.", "",
             "| epoch | loss | online probe | val probe | difference | online kNN | val kNN | difference |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.4f}"

    def gap(a: Any, b: Any) -> str:
        return "-" if a is None or b is None else f"{a - b:+.4f}"

    for row in result["epochs"]:
        if row["val_probe_accuracy"] is None and row["epoch"] not in (1, len(result["epochs"])):
            continue
        lines.append(f"| {row['epoch']} | {row['loss']:.4f} | {cell(row['online_probe_accuracy'])} | "
                     f"{cell(row['val_probe_accuracy'])} | {gap(row['online_probe_accuracy'], row['val_probe_accuracy'])}"
                     f" | {cell(row['online_knn_accuracy'])} | {cell(row['val_knn_accuracy'])} | "
                     f"{gap(row['online_knn_accuracy'], row['val_knn_accuracy'])} |")
    scored = [row for row in result["epochs"] if row["val_probe_accuracy"] is not None]
    for online, val, name in (("online_probe_accuracy", "val_probe_accuracy", "probe"),
                              ("online_knn_accuracy", "val_knn_accuracy", "kNN")):
        a, b = [row[online] for row in scored], [row[val] for row in scored]
        best_online = scored[a.index(max(a))]["epoch"]
        best_val = scored[b.index(max(b))]["epoch"]
        lines += ["", f"- {name}: over the {len(scored)} evaluation epochs the online and val numbers have a Spearman "
                      f"rank correlation of {_spearman(a, b):.3f}; the best online {name} is at epoch {best_online}, "
                      f"the best val {name} at epoch {best_val} (the earliest on ties)."]
    summary = result["summary"]
    lines += ["", f"At the end, on test (the offline read-out): probe {cell(summary['probe_accuracy'])}, kNN "
                  f"{cell(summary['knn_accuracy'])}; the last epoch's online probe "
                  f"{cell(summary['online_probe_accuracy'])} and online kNN {cell(summary['online_knn_accuracy'])} "
                  "(on val).", ""]
    return lines


def _spearman(a: List[float], b: List[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (ties at their mean rank)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def _median(rows: List[Dict[str, Any]], key: str) -> float:
    return statistics.median(float(row[key]) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--encoders", default="small,resnet18")
    parser.add_argument("--resnet-train-limit", type=int, default=2560)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "online_probe.md"))
    parser.add_argument("--steps-only", type=int, default=0, metavar="STEPS",
                        help="time STEPS training steps with and without the probe in one process instead "
                             "(step_costs), per encoder, and print them as JSON lines")
    parser.add_argument("--epoch-only", type=int, default=0, metavar="REPEATS",
                        help="time the online evaluation at an epoch's end alone instead (time_epoch_evaluation), "
                             "per encoder")
    parser.add_argument("--agreement", type=int, default=0, metavar="EPOCHS",
                        help="train one default small-CNN run of EPOCHS epochs with the online probe and "
                             "--eval-every 5 and append the online numbers beside the val read-out's to --out")
    parser.add_argument("--work", default=None, help="--agreement's run folder's parent (resumed when there)")
    args = parser.parse_args()
    if args.agreement:
        with (tempfile.TemporaryDirectory(prefix="agreement-") if args.work is None else _nothing()) as temporary:
            result = agreement(args.data, args.agreement, 5, args.work or temporary)
        print(json.dumps(result), flush=True)
        command = (f"PYTHONPATH=src python benchmarks/bench_online_probe.py --data CIFAR10_DIR --agreement "
                   f"{args.agreement}")
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write("\n".join([""] + agreement_lines(result, command, os.getloadavg())))
        return
    if args.epoch_only:
        for encoder in args.encoders.split(","):
            print(json.dumps(time_epoch_evaluation(args.data, encoder, args.epoch_only)), flush=True)
        return
    if args.steps_only:
        for encoder in args.encoders.split(","):
            print(json.dumps(step_costs(encoder, args.steps_only if encoder == "small" else max(3, args.steps_only // 8))),
                  flush=True)
        return
    load_before = os.getloadavg()
    rows: List[Dict[str, Any]] = []
    for encoder in args.encoders.split(","):
        for repeat in range(args.repeats):
            for online in ((False, True) if repeat % 2 == 0 else (True, False)):
                rows.append(run(args.data, encoder, online, args.resnet_train_limit))
                print(json.dumps(rows[-1]), flush=True)
    load_after = os.getloadavg()
    lines = ["# What the online probe and kNN monitor cost a run", "",
             f"Command: `PYTHONPATH=src python benchmarks/bench_online_probe.py --data CIFAR10_DIR --repeats "
             f"{args.repeats} --encoders {args.encoders} --resnet-train-limit {args.resnet_train_limit}` "
             "(`benchmarks/bench_online_probe.py`'s docstring says what each figure is).",
             f"Machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}; load average "
             f"(1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, after "
             f"{tuple(round(x, 2) for x in load_after)}.", "",
             "| encoder | online probe | images/s (median, min-max) | train s | wall s | probe | kNN | online probe | "
             "online kNN |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    verdicts = []
    for encoder in args.encoders.split(","):
        sides = {online: [row for row in rows if row["encoder"] == encoder and row["online"] is online]
                 for online in (False, True)}
        for online, side in sides.items():
            speeds = [float(row["images_per_second"]) for row in side]
            last = side[-1]
            lines.append(f"| {encoder} | {'on' if online else 'off'} | {statistics.median(speeds):.0f} "
                         f"({min(speeds):.0f}-{max(speeds):.0f}) | {_median(side, 'train_seconds'):.1f} | "
                         f"{_median(side, 'wall'):.1f} | {last['probe_accuracy']:.4f} | {last['knn_accuracy']:.4f} | "
                         + (f"{last['online_probe_accuracy']:.4f} | {last['online_knn_accuracy']:.4f} |" if online
                            else "- | - |"))
        step_cost = 1 - _median(sides[True], "images_per_second") / _median(sides[False], "images_per_second")
        epoch_cost = ((_median(sides[True], "seconds") - _median(sides[True], "train_seconds"))
                      - (_median(sides[False], "seconds") - _median(sides[False], "train_seconds")))
        same = all(row["probe_accuracy"] == sides[False][0]["probe_accuracy"]
                   and row["knn_accuracy"] == sides[False][0]["knn_accuracy"] for row in sides[True] + sides[False])
        verdicts.append(f"- **{encoder}**: per step {100 * step_cost:+.1f} % of the step's time (goal <= 3 %: "
                        f"{'met' if step_cost <= 0.03 else 'not met'}); the epoch's online evaluation "
                        f"{epoch_cost:.1f} s against {_median(sides[True], 'train_seconds'):.1f} s of training steps "
                        f"({100 * epoch_cost / _median(sides[True], 'train_seconds'):.1f} %); the offline read-out's "
                        f"numbers {'equal' if same else 'DIFFER'} with and without.")
    lines += ["", *verdicts, "", "Raw rows (one per run, in the order run):", "", "```"]
    lines += [json.dumps(row) for row in rows] + ["```", ""]
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
