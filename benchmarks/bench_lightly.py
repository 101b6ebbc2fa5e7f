"""`contrastkit pretrain` against lightly's SimCLR, one training recipe run both ways (CPU).

    PYTHONPATH=src python benchmarks/bench_lightly.py --tarball cifar10-jpeg.tar.gz \\
        --train-per-class 52 --val-per-class 5 --test-per-class 30 --epochs 2 --batch-size 128 \\
        --seeds 0 1 --threads 1 --lightly-workers 2 --profile --json benchmarks/results/lightly.json
    PYTHONPATH=src python benchmarks/bench_lightly.py forward-split --batch-size 128 --threads 1 --repeats 3

The recipe: a torchvision ResNet-18 with the CIFAR stem (3x3 stride-1 first convolution, no
max-pool; Chen et al. 2020, appendix B.9) and a 2-layer projection head 512 -> 512 -> 64, NT-Xent
at tau = 0.2 over the 2N views of a batch, AdamW at contrastkit's default learning rate and
weight decay with its warm-up cosine schedule, the same CIFAR-10 training images, epochs and
batch size, the same torch threads. The two pipelines:

* contrastkit: the CLI, ``python -m contrastkit pretrain --encoder torchvision:resnet18
  --encoder-option cifar_stem=true ...`` in a subprocess. The image folder is decoded once
  into memory; each batch's two views come from one kornia call on the training device (a
  float32 batch: crop, flip, colour jitter, grayscale, 3x3 blur), no normalisation; both views
  go through the encoder in one forward pass.
* lightly: a plain PyTorch loop written after lightly's own SimCLR example (its
  ``LightlyDataset`` over the same folder, ``SimCLRTransform`` per image with PIL in DataLoader
  worker processes, ``SimCLRProjectionHead``, ``NTXentLoss``; the two views in two forward
  passes, as the example does), in a subprocess of this script. The same optimizer and
  schedule are built by contrastkit's ``build_optimizer`` / ``build_lr_scheduler``, and the
  settings contrastkit's run resolved (``config.json``) are checked against them.

Measured per pipeline and seed, the pipelines interleaved (seed 0: contrastkit first; seed 1:
lightly first, ...) so that changes in the machine's load hit both:

* training images per second: source images (``steps x batch``) over the epoch loops' wall
  time (contrastkit: its ``train_seconds``, the epoch loops with their data pipeline; lightly:
  the same span around its loop, DataLoader worker start-up included). Model building, the
  data set's decoding, checkpoints and the read-out are outside it.
* peak RSS: ``ru_maxrss`` of the pipeline's process and (lightly) of its largest DataLoader
  worker; and the peak of the summed PSS (proportional set size: shared pages split between
  the processes sharing them) of the whole process tree, sampled every second from /proc.
* kNN accuracy on a CIFAR-10 test subset by one routine for both encoders
  (``contrastkit.metrics.knn_accuracy``: cosine similarity, k = 20, votes exp(cos / 0.07)), the
  memory bank the training images; each backbone sees the preprocessing it trained with
  (contrastkit: pixels in [0, 1]; lightly: ImageNet mean/std normalisation, SimCLRTransform's
  default). A random-init backbone gives the floor.

``uptime`` is printed before and after; the Markdown table and a JSON record go to stdout
(``--json FILE`` writes the record too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

TAU = 0.2           # contrastkit's SimCLR default (methods.two_view.TwoViewMethod.default_temperature)
PROJECTION_DIM = 64  # contrastkit's default size of z; its head's hidden layer is max(512, 64) = 512
KNN_K, KNN_TEMPERATURE = 20, 0.07  # contrastkit's read-out defaults


# ------------------------------------------------------------------------------------------ data

def cifar_tree(tarball: str, root: Path, per_class: Dict[str, int]) -> Path:
    """A class-folder tree ``root/{train,val,test}/<class>/*.jpg`` from the CIFAR-10 JPEG
    tarball: the first ``per_class["train"]`` images of each class of its ``train/`` part, the
    next ``per_class["val"]`` as val, the first ``per_class["test"]`` of its ``test/`` part."""
    counts: Dict[tuple, int] = {}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 3 or parts[0] not in ("train", "test"):
                continue
            source, name = parts[0], parts[1]
            wanted = (("train", per_class["train"]), ("val", per_class["val"])) if source == "train" \
                else (("test", per_class["test"]),)
            for split, limit in wanted:
                if counts.get((split, name), 0) < limit:
                    counts[(split, name)] = counts.get((split, name), 0) + 1
                    target = root / split / name / parts[2]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.extractfile(member).read())
                    break
    classes = {name for (_, name) in counts}
    if len(classes) != 10:
        raise ValueError(f"{tarball}: expected the 10 CIFAR-10 classes, found {sorted(classes)}")
    return root


# ------------------------------------------------------------------------------ measuring a child

def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(command: List[str], log: Path, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``command`` to its end with stdout/stderr in ``log``; its wall seconds, the
    ``ru_maxrss`` of its process tree (``wait4``: the largest single process) and the peak of
    the tree's summed PSS, sampled every second."""
    peak = [0]
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                peak[0] = max(peak[0], sum(_pss_kib(pid) for pid in _descendants(child.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}); see {log}:\n"
                           + "\n".join(log.read_text().splitlines()[-20:]))
    return {"wall_seconds": time.perf_counter() - started, "tree_maxrss_mib": usage.ru_maxrss / 1024,
            "tree_peak_pss_mib": peak[0] / 1024}


# ------------------------------------------------------------------------------ the two pipelines

def contrastkit_run(args, tree: Path, seed: int, out: Path) -> Dict[str, Any]:
    command = [sys.executable, "-m", "contrastkit", "pretrain", "--data", str(tree),
               "--encoder", "torchvision:resnet18", "--encoder-option", "cifar_stem=true",
               "--method", "simclr", "--temperature", str(TAU), "--projection-dim", str(PROJECTION_DIM),
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(seed),
               "--threads", str(args.threads), "--device", "cpu", "--knn-k", str(KNN_K),
               "--knn-temperature", str(KNN_TEMPERATURE), "--no-baselines", "--no-report", "--quiet",
               "--baseline-cache", "off", "--out", str(out), "--force"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    measured = run_measured(command, out.with_suffix(".log"), env)
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    resolved = config.get("config", config)
    return {"pipeline": "contrastkit", "seed": seed, "train_seconds": summary["train_seconds"],
            "steps": summary["steps"], "images_per_second": summary["images_per_second"],
            "final_loss": summary["final_loss"], "own_knn_accuracy": summary.get("knn_accuracy"),
            "main_maxrss_mib": measured["tree_maxrss_mib"], "worker_maxrss_mib": None,
            "resolved": {key: resolved.get(key) for key in ("optimizer", "lr", "weight_decay", "warmup_fraction",
                                                            "temperature", "projection_dim", "batch_size", "epochs")},
            **measured}


def lightly_run(args, tree: Path, seed: int, out: Path) -> Dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "lightly-train", "--data", str(tree / "train"),
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(seed),
               "--threads", str(args.threads), "--workers", str(args.lightly_workers), "--out", str(out)]
    out.mkdir(parents=True, exist_ok=True)
    measured = run_measured(command, out.with_suffix(".log"))
    record = json.loads((out / "result.json").read_text())
    return {"pipeline": "lightly", "seed": seed, **record, **measured}


def lightly_pieces(data: str, batch_size: int, seed: int, workers: int):
    """lightly's SimCLR as its example builds it: the model (backbone + ``SimCLRProjectionHead``),
    the DataLoader of ``LightlyDataset`` with ``SimCLRTransform``, and ``NTXentLoss``."""
    import torch
    import torchvision
    from torch import nn
    from lightly.data import LightlyDataset
    from lightly.loss import NTXentLoss
    from lightly.models.modules import SimCLRProjectionHead
    from lightly.transforms import SimCLRTransform

    torch.manual_seed(seed)
    # The torchvision ResNet-18 with the CIFAR stem, its convolution initialised as torchvision
    # initialises its own (He, fan-out).
    resnet = torchvision.models.resnet18()
    resnet.fc = nn.Identity()
    resnet.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(resnet.conv1.weight, mode="fan_out", nonlinearity="relu")
    resnet.maxpool = nn.Identity()

    class SimCLR(nn.Module):
        def __init__(self, backbone: nn.Module) -> None:
            super().__init__()
            self.backbone = backbone
            self.projection_head = SimCLRProjectionHead(512, 512, PROJECTION_DIM)

        def forward(self, x):
            return self.projection_head(self.backbone(x).flatten(start_dim=1))

    # SimCLRTransform's knobs set to contrastkit's CIFAR-10 views: the crop's minimum area 0.2,
    # colour jitter (0.4, 0.4, 0.4, 0.1) (lightly's advice for CIFAR: cj_strength=0.5), the
    # blur's sigma in (0.1, 1.0); ImageNet normalisation stays lightly's default.
    transform = SimCLRTransform(input_size=32, min_scale=0.2, cj_strength=0.5, sigmas=(0.1, 1.0))
    dataset = LightlyDataset(input_dir=data, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                         num_workers=workers, generator=torch.Generator().manual_seed(seed))
    return SimCLR(resnet), loader, NTXentLoss(temperature=TAU)


def contrastkit_optimizer(model, epochs: int, batch_size: int, seed: int, total_steps: int):
    """contrastkit's default optimizer and schedule for ``model`` (its ``build_optimizer`` and
    ``build_lr_scheduler``) and the resolved configuration they come from."""
    from contrastkit.methods import PretrainConfig, build_lr_scheduler, build_optimizer

    config = PretrainConfig(method="simclr", epochs=epochs, batch_size=batch_size, temperature=TAU,
                            projection_dim=PROJECTION_DIM, seed=seed).resolved()
    optimizer = build_optimizer(model, config)
    return optimizer, build_lr_scheduler(optimizer, config, total_steps), config


def lightly_train(argv: List[str]) -> int:
    """The lightly side (a subprocess of the benchmark): lightly's SimCLR example's loop."""
    parser = argparse.ArgumentParser(prog="bench_lightly.py lightly-train")
    for name in ("--data", "--out"):
        parser.add_argument(name, required=True)
    for name in ("--epochs", "--batch-size", "--seed", "--threads", "--workers"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    model, loader, criterion = lightly_pieces(args.data, args.batch_size, args.seed, args.workers)
    optimizer, scheduler, config = contrastkit_optimizer(model, args.epochs, args.batch_size, args.seed,
                                                         len(loader) * args.epochs)

    losses, steps, waited = [], 0, 0.0
    started = time.perf_counter()
    for epoch in range(args.epochs):
        total = 0.0
        mark = time.perf_counter()
        for batch in loader:
            waited += time.perf_counter() - mark  # the main process blocked on the workers
            x0, x1 = batch[0]
            z0 = model(x0)
            z1 = model(x1)
            loss = criterion(z0, z1)
            total += loss.item()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            steps += 1
            mark = time.perf_counter()
        losses.append(total / len(loader))
        print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}, {time.perf_counter() - started:.1f} s", flush=True)
    train_seconds = time.perf_counter() - started

    out = Path(args.out)
    torch.save(model.backbone.state_dict(), out / "backbone.pt")
    record = {
        "train_seconds": train_seconds, "steps": steps, "images_per_second": steps * args.batch_size / train_seconds,
        "data_wait_seconds": waited, "final_loss": losses[-1], "epoch_losses": losses,
        "main_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # the workers have been joined at the end of each epoch: the largest of them
        "worker_maxrss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 if args.workers else None,
        "resolved": {"optimizer": config.optimizer, "lr": config.lr, "weight_decay": config.weight_decay,
                     "warmup_fraction": config.warmup_fraction, "temperature": criterion.temperature,
                     "projection_dim": PROJECTION_DIM, "batch_size": args.batch_size, "epochs": args.epochs},
    }
    (out / "result.json").write_text(json.dumps(record, indent=1))
    return 0


# ------------------------------------------------------------------------------ where a step's time goes

def profile_steps(tree: Path, batch_size: int, threads: int) -> str:
    """One training step of each pipeline in this process, after one unmeasured warm-up step,
    its parts timed (the view making, the forward pass with the loss, the backward pass, the
    optimizer step) and its top operators by self CPU time (``torch.profiler``). lightly's
    batch is made in this process (no workers), so the time its workers spend on the views
    shows."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from contrastkit.methods import PretrainConfig, build_model, get_method, load_data

    torch.set_num_threads(threads)
    lines = []

    def report(name: str, parts: Dict[str, float], prof) -> None:
        total = sum(parts.values())
        shares = ", ".join(f"{key} {seconds:.1f} s ({100 * seconds / total:.0f} %)" for key, seconds in parts.items())
        lines.append(f"{name}: one step of {batch_size} images, {total:.1f} s: {shares}")
        top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=40)
        lines.append(top)

    # contrastkit: its model, its views and its loss, as its training step calls them
    config = PretrainConfig(data=str(tree), encoder="torchvision:resnet18", encoder_options={"cifar_stem": True},
                            temperature=TAU, projection_dim=PROJECTION_DIM, batch_size=batch_size, threads=threads,
                            device="cpu").resolved()
    method = get_method(config.method)
    dataset = load_data(config)
    views = method.batches(dataset, config, torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(config, dataset.image_shape)
    optimizer, _, _ = contrastkit_optimizer(model, 1, batch_size, 0, 1)
    indices = torch.randperm(len(dataset.train))[:batch_size]
    model.loss(*views(dataset.train, indices)).backward()  # warm-up
    optimizer.zero_grad(set_to_none=True)
    parts: Dict[str, float] = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        view_a, view_b = views(dataset.train, indices)
        t1 = time.perf_counter()
        loss = model.loss(view_a, view_b)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
    parts.update({"views (kornia)": t1 - t0, "forward + loss": t2 - t1, "backward": t3 - t2, "optimizer": t4 - t3})
    report("contrastkit", parts, prof)

    model, loader, criterion = lightly_pieces(str(tree / "train"), batch_size, 0, 0)
    optimizer, _, _ = contrastkit_optimizer(model, 1, batch_size, 0, 1)
    (x0, x1), _, _ = next(iter(loader))
    criterion(model(x0), model(x1)).backward()  # warm-up
    optimizer.zero_grad()
    parts = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        (x0, x1), _, _ = next(iter(loader))
        t1 = time.perf_counter()
        loss = criterion(model(x0), model(x1))
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        t4 = time.perf_counter()
    parts.update({"views (PIL, decode included)": t1 - t0, "forward + loss": t2 - t1, "backward": t3 - t2,
                  "optimizer": t4 - t3})
    report("lightly", parts, prof)
    return "\n".join(lines)


def forward_split(argv: List[str]) -> int:
    """One forward and backward pass over both views together (``2B`` images, contrastkit's
    step) against two passes of ``B`` (lightly's example), alternated ``--repeats`` times on
    the same network and data: the median seconds of each and their ratio."""
    parser = argparse.ArgumentParser(prog="bench_lightly.py forward-split")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from contrastkit.methods import ContrastiveModel
    from contrastkit.models.external import torchvision_encoder

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    encoder = torchvision_encoder("resnet18", 3, cifar_stem=True)
    encoder.out_dim = 512
    model = ContrastiveModel("simclr", encoder, 3, temperature=TAU, projection_dim=PROJECTION_DIM)
    views = torch.rand(2 * args.batch_size, 3, 32, 32)

    def together() -> None:
        model.head(model.encoder(views)).sum().backward()

    def apart() -> None:
        (model.head(model.encoder(views[:args.batch_size])).sum()
         + model.head(model.encoder(views[args.batch_size:])).sum()).backward()

    times: Dict[str, List[float]] = {"together": [], "apart": []}
    for name, step in (("together", together), ("apart", apart)):  # warm-up
        step()
    for _ in range(args.repeats):
        for name, step in (("together", together), ("apart", apart)):
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    print(f"uptime: {_uptime()}")
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"together / apart: {statistics.median(times['together']) / statistics.median(times['apart']):.2f}")
    return 0


# ------------------------------------------------------------------------------ the shared kNN

def knn_accuracies(tree: Path, runs: List[Dict[str, Any]], threads: int) -> Dict[str, float]:
    """kNN accuracy of each run's backbone (and a random-init one) by one routine: the training
    images as the memory bank, the test images as queries, each backbone on the preprocessing it
    trained with."""
    import torch
    import torchvision
    from torch import nn

    from contrastkit.metrics import knn_accuracy
    from contrastkit.metrics.readout import extract_features
    from contrastkit.models.external import torchvision_encoder
    from contrastkit.train.runs import load_run

    torch.set_num_threads(threads)

    def decoded(split: str):
        folder = torchvision.datasets.ImageFolder(str(tree / split), transform=torchvision.transforms.ToTensor())
        images = torch.stack([image for image, _ in folder])
        return images, torch.tensor(folder.targets)

    (train_x, train_y), (test_x, test_y) = decoded("train"), decoded("test")
    imagenet = torchvision.transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])

    def accuracy(backbone: nn.Module, normalize: bool) -> float:
        encoder = nn.Sequential(imagenet, backbone) if normalize else backbone
        with torch.inference_mode():
            memory, queries = (extract_features(encoder, x, torch.device("cpu")) for x in (train_x, test_x))
        return knn_accuracy(memory, train_y.numpy(), queries, test_y.numpy(), k=KNN_K, temperature=KNN_TEMPERATURE)

    results = {}
    torch.manual_seed(0)
    results["random init"] = accuracy(torchvision_encoder("resnet18", 3, cifar_stem=True), normalize=False)
    for run in runs:
        if run["pipeline"] == "contrastkit":
            backbone = load_run(run["out"]).build_model((3, 32, 32), torch.device("cpu")).encoder
        else:
            # lightly's backbone loaded into contrastkit's build of the same network: strict, so
            # any difference in the architecture is an error here
            backbone = torchvision_encoder("resnet18", 3, cifar_stem=True)
            backbone.load_state_dict(torch.load(Path(run["out"]) / "backbone.pt", weights_only=True), strict=True)
        run["knn_accuracy"] = accuracy(backbone, normalize=run["pipeline"] == "lightly")
    return results


# ------------------------------------------------------------------------------ the driver

def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _check_same_recipe(runs: List[Dict[str, Any]]) -> None:
    settings = {json.dumps(run["resolved"], sort_keys=True) for run in runs}
    if len(settings) != 1:
        raise RuntimeError(f"the pipelines did not train with the same settings: {sorted(settings)}")


def _table(runs: List[Dict[str, Any]]) -> str:
    lines = ["| pipeline | seed | steps | train s | train images/s | peak RSS main (MiB) | peak RSS worker (MiB) "
             "| peak PSS tree (MiB) | data wait s | wall s | final loss | kNN acc |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        worker = "-" if run["worker_maxrss_mib"] is None else f"{run['worker_maxrss_mib']:.0f}"
        wait = f"{run['data_wait_seconds']:.1f}" if "data_wait_seconds" in run else "-"
        lines.append(f"| {run['pipeline']} | {run['seed']} | {run['steps']} | {run['train_seconds']:.1f} "
                     f"| {run['images_per_second']:.2f} | {run['main_maxrss_mib']:.0f} | {worker} "
                     f"| {run['tree_peak_pss_mib']:.0f} | {wait} | {run['wall_seconds']:.0f} | {run['final_loss']:.3f} "
                     f"| {run['knn_accuracy']:.3f} |")
    return "\n".join(lines)


def _ratios(runs: List[Dict[str, Any]]) -> str:
    by_seed: Dict[int, Dict[str, Dict[str, Any]]] = {}
    for run in runs:
        by_seed.setdefault(run["seed"], {})[run["pipeline"]] = run
    lines = ["| seed | images/s contrastkit / lightly | kNN contrastkit - lightly |", "|---:|---:|---:|"]
    speed, gap = [], []
    for seed, pair in sorted(by_seed.items()):
        speed.append(pair["contrastkit"]["images_per_second"] / pair["lightly"]["images_per_second"])
        gap.append(pair["contrastkit"]["knn_accuracy"] - pair["lightly"]["knn_accuracy"])
        lines.append(f"| {seed} | {speed[-1]:.2f} | {gap[-1]:+.3f} |")
    lines.append(f"| mean | {statistics.mean(speed):.2f} | {statistics.mean(gap):+.3f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lightly-train"]:
        return lightly_train(argv[1:])
    if argv[:1] == ["forward-split"]:
        return forward_split(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", required=True, help="the CIFAR-10 JPEG tarball (train/ and test/ class folders)")
    parser.add_argument("--train-per-class", type=int, default=52)
    parser.add_argument("--val-per-class", type=int, default=5, help="contrastkit's val split (its read-out only)")
    parser.add_argument("--test-per-class", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of both training processes (1: the choice for a CPU shared with other jobs)")
    parser.add_argument("--lightly-workers", type=int, default=2, help="lightly's DataLoader worker processes")
    parser.add_argument("--work", help="folder for the data tree and the runs (default: a temporary one)")
    parser.add_argument("--json", help="also write the record here")
    parser.add_argument("--profile", action="store_true",
                        help="after the runs, time the parts of one step of each pipeline in this process")
    args = parser.parse_args(argv)

    before = _uptime()
    print(f"uptime before: {before}", flush=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_lightly_"))
    tree = cifar_tree(args.tarball, work / "cifar10", {"train": args.train_per_class, "val": args.val_per_class,
                                                       "test": args.test_per_class})
    runs = []
    for index, seed in enumerate(args.seeds):
        order = (contrastkit_run, lightly_run) if index % 2 == 0 else (lightly_run, contrastkit_run)
        for run in order:
            name = "contrastkit" if run is contrastkit_run else "lightly"
            out = work / f"{name}-seed{seed}"
            record = run(args, tree, seed, out)
            record["out"] = str(out)
            runs.append(record)
            print(f"{name} seed {seed}: {record['images_per_second']:.2f} images/s over {record['steps']} steps, "
                  f"{record['wall_seconds']:.0f} s wall; {_uptime()}", flush=True)
    _check_same_recipe(runs)
    floor = knn_accuracies(tree, runs, args.threads)
    profiled = profile_steps(tree, args.batch_size, args.threads) if args.profile else None
    after = _uptime()
    print(f"uptime after: {after}\n")
    print(_table(runs) + "\n")
    print(_ratios(runs) + "\n")
    print(f"random-init backbone kNN accuracy: {floor['random init']:.3f}")
    own = [f"{run['own_knn_accuracy']:.3f}" for run in runs if run["pipeline"] == "contrastkit"]
    print(f"contrastkit's own read-out kNN accuracy of its runs (its test split, the same images): {', '.join(own)}")
    if profiled:
        print(profiled)
    for run in runs:
        del run["out"]  # a temporary folder of this machine
    settings = {key: value for key, value in vars(args).items() if key not in ("work", "json")}
    record = {"uptime_before": before, "uptime_after": after, "args": settings, "runs": runs, **floor,
              "profile": profiled,
              "train_images": args.train_per_class * 10, "test_images": args.test_per_class * 10}
    print(json.dumps(record))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
