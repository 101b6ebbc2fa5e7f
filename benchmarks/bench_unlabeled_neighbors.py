"""``contrastkit neighbors`` on a run trained on a FLAT folder of CIFAR-10 training images (no
class folders, no labels in training): how often a CIFAR-10 test query's nearest collection
images share its class, under the trained encoder, the same network at its random
initialisation and the raw pixels. The labels are used only to score.

    PYTHONPATH=src python benchmarks/bench_unlabeled_neighbors.py [--tarball PATH] [--train-per-class 1000]
        [--test-per-class 100] [--epochs 10] [--batch-size 256] [--k 8] [--seeds 3] [--workers 1]
        [--threads 1] [--work DIR] [--markdown FILE] [--json FILE]

Steps:

1. The first ``--train-per-class`` images of each class of the tarball's ``train/`` part are
   written into ONE flat folder under neutral names (``img_NNNNN.jpg``, numbered in a seeded
   random order, so that neither a name nor its position says the class); their classes are
   kept by this script alone, outside the folder. The first ``--test-per-class`` images of each
   class of ``test/`` are the queries (never in the collection).
2. Per seed, ``contrastkit pretrain --data FLAT`` trains the default SimCLR run (small CNN) from
   the command line: the folder is read as an unlabeled collection (hash split into train / val
   / test, the label-free read-out with both baselines).
3. ``contrastkit neighbors RUN QUERY_FILES... --k K --json --no-picture`` searches the run's whole
   collection (train, val and test of the flat folder) for every query file: the command's own
   output is scored (*agreement@1*: share of queries whose nearest image has their class;
   *precision@k*: mean share of the k nearest with their class; chance 0.10 for both).
4. The same queries and collection, read the same way, are encoded by the run's random-init
   network (:meth:`SavedRun.build_untrained`) and as raw pixels, and searched by
   :func:`contrastkit.metrics.search.nearest`; the trained encoder is searched this way too and
   must give the command's lists.

The CIFAR-10 images (Krizhevsky, 2009) are the JPEG class-folder tree of
``shared/data/cifar10-jpeg.tar.gz`` (see that folder's README).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(_HERE, "..", "src")
sys.path.insert(0, _SRC)

from contrastkit.data import ImageFolderDataset  # noqa: E402
from contrastkit.metrics.readout import extract_features, pixel_features  # noqa: E402
from contrastkit.metrics.search import nearest  # noqa: E402
from contrastkit.train.runs import load_run  # noqa: E402

DEFAULT_TARBALL = os.path.join(_HERE, "..", "..", "shared", "data", "cifar10-jpeg.tar.gz")
LABEL_FREE = ("view_retrieval_top1", "view_retrieval_top5", "alignment", "uniformity", "effective_rank",
              "heldout_loss")


def extract(tarball: str, work: str, train_per_class: int, test_per_class: int) -> Dict[str, Any]:
    """The flat training folder (neutral names) and the query files (``queries/<class>/``);
    returns ``{"flat_labels": {name: class}, "queries": [[path, class], ...]}``."""
    limits = {"train": train_per_class, "test": test_per_class}
    counts: Dict[tuple, int] = {}
    train_members: List[tuple] = []
    queries: List[List[str]] = []
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 3 or parts[0] not in limits:
                continue
            key = (parts[0], parts[1])
            if counts.get(key, 0) >= limits[parts[0]]:
                continue
            counts[key] = counts.get(key, 0) + 1
            data = archive.extractfile(member).read()
            if parts[0] == "train":
                train_members.append((parts[1], data))
            else:
                target = os.path.join(work, "queries", parts[1], parts[2])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as handle:
                    handle.write(data)
                queries.append([target, parts[1]])
    flat = os.path.join(work, "flat")
    os.makedirs(flat)
    order = np.random.default_rng(0).permutation(len(train_members))
    labels = {}
    for number, position in enumerate(order):
        name = f"img_{number:05d}.jpg"
        cls, data = train_members[position]
        with open(os.path.join(flat, name), "wb") as handle:
            handle.write(data)
        labels[name] = cls
    return {"flat_labels": labels, "queries": sorted(queries)}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def contrastkit(*args: str) -> str:
    """``python -m contrastkit ARGS`` (this checkout's source), its stdout; stops on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "contrastkit", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"contrastkit {args[0]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


def scores(neighbor_classes: List[List[str]], query_classes: List[str]) -> Dict[str, float]:
    """agreement@1 and precision@k of neighbor class lists (labels only score)."""
    same = np.array([[c == q for c in row] for row, q in zip(neighbor_classes, query_classes)])
    return {"agreement@1": float(same[:, 0].mean()), f"precision@{same.shape[1]}": float(same.mean())}


def one_seed(seed: int, work: str, extracted: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    run_dir = os.path.join(work, f"run-seed{seed}")
    flat = os.path.join(work, "flat")
    record: Dict[str, Any] = {"seed": seed, "run_reused": os.path.isfile(os.path.join(run_dir, "summary.json"))}
    if not record["run_reused"]:  # a finished run of an earlier invocation (same --work) is kept
        contrastkit("pretrain", "--data", flat, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
                    "--workers", str(args.workers), "--threads", str(args.threads), "--seed", str(seed),
                    "--device", "cpu", "--out", run_dir, "--no-report", "--quiet", "--json")
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    record["pretrain_seconds"] = summary["seconds"]  # training and read-out, whenever the run was made
    record["run"] = {prefix + key: summary.get(prefix + key) for key in LABEL_FREE
                     for prefix in ("", "random_init_", "raw_pixel_")}
    record["run"].update({key: summary.get(key) for key in ("final_loss", "epochs", "steps", "skipped_files",
                                                             "label_free_samples")})
    # Proof that training saw no labels: the run recorded an unlabeled data set.
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as handle:
        recorded = json.load(handle)["derived"]["dataset"]
    record["run"]["num_classes_seen_in_training"] = recorded["num_classes"]
    record["sizes"] = recorded["sizes"]

    query_files = [path for path, _ in extracted["queries"]]
    query_classes = [cls for _, cls in extracted["queries"]]
    labels = extracted["flat_labels"]
    start = time.perf_counter()
    output = contrastkit("neighbors", run_dir, *query_files, "--k", str(args.k), "--json", "--no-picture",
                         "--threads", str(args.threads), "--device", "cpu")
    record["neighbors_command_seconds"] = time.perf_counter() - start
    found = json.loads(output)
    command_names = [[n["image"]["name"] for n in q["neighbors"]] for q in found["queries"]]
    results = {"trained (contrastkit neighbors)": {
        **scores([[labels[os.path.basename(n)] for n in row] for row in command_names], query_classes),
        "seconds": record["neighbors_command_seconds"]}}

    saved = load_run(run_dir)
    dataset = saved.load_data()
    cpu = torch.device("cpu")
    splits = [dataset.train, dataset.val, dataset.test]
    names = [split.relative_path(i) for split in splits for i in range(len(split))]
    reader = ImageFolderDataset(query_files, [0] * len(query_files), color="RGB",
                                size=tuple(int(s) for s in dataset.image_shape[1:]))
    encoders = {"trained (library)": saved.build_model(dataset.image_shape, cpu).encoder,
                "random init": saved.build_untrained(dataset.image_shape).encoder}
    for name, encoder in encoders.items():
        start = time.perf_counter()
        collection = torch.cat([torch.from_numpy(extract_features(encoder, split, cpu)) for split in splits])
        queries = torch.from_numpy(extract_features(encoder, reader, cpu))
        rows = nearest(queries, collection, args.k).indices.tolist()
        results[name] = {**scores([[labels[os.path.basename(names[r])] for r in row] for row in rows],
                                  query_classes), "seconds": time.perf_counter() - start}
        if name == "trained (library)":
            record["library_lists_equal_command"] = [[names[r] for r in row] for row in rows] == command_names
    start = time.perf_counter()
    collection = torch.cat([torch.from_numpy(pixel_features(split)) for split in splits])
    rows = nearest(torch.from_numpy(pixel_features(reader)), collection, args.k).indices.tolist()
    results["raw pixels"] = {**scores([[labels[os.path.basename(names[r])] for r in row] for row in rows],
                                      query_classes), "seconds": time.perf_counter() - start}
    record["results"] = results
    record["collection_images"] = len(names)
    return record


def markdown(record: Dict[str, Any], args: argparse.Namespace) -> str:
    k = args.k
    seeds = record["seeds"]
    encoders = ["trained (contrastkit neighbors)", "random init", "raw pixels"]
    lines = [f"| encoder | agreement@1 mean (sd) | precision@{k} mean (sd) | agreement@1 per seed | "
             f"precision@{k} per seed |", "|---|---:|---:|---|---|"]
    for name in encoders:
        top1 = np.array([run["results"][name]["agreement@1"] for run in seeds])
        top_k = np.array([run["results"][name][f"precision@{k}"] for run in seeds])
        spread = (lambda v: v.std(ddof=1) if len(v) > 1 else 0.0)
        lines.append(f"| {name} | {top1.mean():.3f} ({spread(top1):.3f}) | {top_k.mean():.3f} ({spread(top_k):.3f}) "
                     f"| {', '.join(f'{v:.3f}' for v in top1)} | {', '.join(f'{v:.3f}' for v in top_k)} |")
    runs = []
    for run in seeds:
        r = run["run"]
        runs.append(f"| {run['seed']} | {r['steps']} | {r['view_retrieval_top1']:.3f} / "
                    f"{r['random_init_view_retrieval_top1']:.3f} / {r['raw_pixel_view_retrieval_top1']:.3f} | "
                    f"{r['num_classes_seen_in_training']} | {run['pretrain_seconds']:.0f} | "
                    f"{run['neighbors_command_seconds']:.0f} | {run['library_lists_equal_command']} |")
    first = seeds[0]
    return "\n".join([
        "| | |", "|---|---|",
        f"| collection | {first['collection_images']:,} CIFAR-10 training images in one flat folder "
        f"(run splits by path hash: {first['sizes']}) |",
        f"| queries | {record['queries']:,} CIFAR-10 test images ({args.test_per_class} per class), as image files "
        "(not in the collection) |",
        f"| runs | SimCLR, small CNN, {args.epochs} epochs, batch {args.batch_size}, {args.workers} worker(s), "
        f"{args.threads} thread(s), CPU |",
        f"| machine | {record['cores']} cores; python {record['python']}, torch {record['torch']} |",
        f"| load before | `{record['load_before']}` |",
        f"| load after | `{record['load_after']}` |",
        f"| wall time of this invocation | {record['wall_seconds']:.0f} s (runs made by an earlier invocation with "
        f"the same --work: {', '.join(str(r['seed']) for r in seeds if r['run_reused']) or 'none'}) |",
        "",
        *lines,
        "",
        "| seed | steps | view retrieval top-1 of the run's held-out split: trained / random init / raw pixels | "
        "classes the run saw | pretrain s | neighbors s | library lists = command's |",
        "|---:|---:|---|---:|---:|---:|---|",
        *runs,
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", default=os.environ.get("CONTRASTKIT_CIFAR10_TARBALL", DEFAULT_TARBALL))
    parser.add_argument("--work", default=None, help="folder for the images and the runs (default: a temporary one)")
    parser.add_argument("--train-per-class", type=int, default=1000)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3, help="runs, seeds 0 .. SEEDS-1 (default 3)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", default=None, help="write the tables as Markdown here")
    parser.add_argument("--json", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    if not os.path.isfile(args.tarball):
        raise SystemExit(f"no CIFAR-10 tarball at {args.tarball} (--tarball, or $CONTRASTKIT_CIFAR10_TARBALL)")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = args.work or tempfile.mkdtemp(prefix="unlabeled-neighbors-")
    record: Dict[str, Any] = {"load_before": uptime(), "cores": os.cpu_count(), "torch": torch.__version__,
                              "python": platform.python_version(),
                              "settings": {key: value for key, value in vars(args).items()  # no paths of this machine
                                           if key not in ("tarball", "work", "markdown", "json")}}
    labels_file = os.path.join(work, "labels-for-scoring.json")  # beside the flat folder, never in it
    if not os.path.isfile(labels_file):
        os.makedirs(work, exist_ok=True)
        with open(labels_file, "w", encoding="utf-8") as handle:
            json.dump(extract(args.tarball, work, args.train_per_class, args.test_per_class), handle)
    with open(labels_file, encoding="utf-8") as handle:
        extracted = json.load(handle)
    record["queries"] = len(extracted["queries"])
    record["seeds"] = []
    for seed in range(args.seeds):
        run = one_seed(seed, work, extracted, args)
        record["seeds"].append(run)
        print(json.dumps({"seed": seed, "results": run["results"]}), flush=True)
    record["load_after"] = uptime()
    record["wall_seconds"] = time.perf_counter() - started
    text = markdown(record, args)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2, sort_keys=True)
            handle.write("\n")


if __name__ == "__main__":
    main()
