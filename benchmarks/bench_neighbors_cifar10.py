"""Nearest neighbors on CIFAR-10: how often a test image's nearest training images share its
class, under a briefly trained encoder, the same network at its random initialisation and the
raw pixels (issue 30, item 4: ``contrastkit neighbors``).

    PYTHONPATH=src python benchmarks/bench_neighbors_cifar10.py [--tarball PATH] [--train-per-class 500]
        [--test-per-class 100] [--epochs 10] [--batch-size 128] [--k 8] [--threads 1] [--seeds 3]
        [--markdown FILE] [--json FILE]

Steps: the first ``--train-per-class`` images of each class of the tarball's ``train/`` part and
the first ``--test-per-class`` of its ``test/`` part are extracted into a class-folder tree
(``train/<class>``, ``test/<class>``: the loader carves 10 % of train into val, stratified);
``contrastkit pretrain`` trains the default SimCLR run with the small CNN on it (no read-out
baselines), once per seed (``--seeds``: seeds 0, 1, ...; the seed also draws the random-init
network); then the collection is the run's train split and the queries are every test image.
For each encoder, ``h`` of both is computed by the read-out's extractor and searched exactly by
:func:`contrastkit.metrics.search.nearest` (cosine of ``h``; the raw pixels: cosine of the
flattened images). The labels are used only to score: *agreement@1* is the share of queries
whose nearest image has their class, *precision@k* the mean share of the ``k`` nearest with
their class (chance: 0.10 each, ten balanced classes).

The command's own path is timed on the trained run too: :func:`contrastkit.train.neighbors.find_neighbors`
with every test image as a ``test:INDEX`` query against ``split="train"``, exact, then FAISS
(building and saving the index) and FAISS again (reusing it); its exact neighbors must equal
the ones computed here, and the FAISS lists are compared with them.

The CIFAR-10 images (Krizhevsky, 2009) are the JPEG class-folder tree of
``shared/data/cifar10-jpeg.tar.gz`` (see that folder's README).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from contrastkit.metrics.readout import extract_features, pixel_features  # noqa: E402
from contrastkit.metrics.search import nearest  # noqa: E402
from contrastkit.train import PretrainConfig, pretrain  # noqa: E402
from contrastkit.train.neighbors import find_neighbors  # noqa: E402
from contrastkit.train.runs import load_run  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TARBALL = os.path.join(_HERE, "..", "..", "shared", "data", "cifar10-jpeg.tar.gz")


def extract_subset(tarball: str, root: str, train_per_class: int, test_per_class: int) -> Dict[str, int]:
    """The first images of each class of each part, as ``root/{train,test}/<class>/<file>``."""
    limits = {"train": train_per_class, "test": test_per_class}
    counts: Dict[Tuple[str, str], int] = {}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 3 or parts[0] not in limits:
                continue
            key = (parts[0], parts[1])
            if counts.get(key, 0) >= limits[parts[0]]:
                continue
            counts[key] = counts.get(key, 0) + 1
            target = os.path.join(root, *parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.extractfile(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
    return {part: sum(n for (p, _), n in counts.items() if p == part) for part in limits}


def scores(neighbor_rows: torch.Tensor, collection_labels: torch.Tensor,
           query_labels: torch.Tensor) -> Dict[str, float]:
    """agreement@1 and precision@k of neighbor lists ``(q, k)`` (labels only score)."""
    same = collection_labels[neighbor_rows] == query_labels[:, None]
    return {"agreement@1": float(same[:, 0].float().mean()), f"precision@{same.shape[1]}": float(same.float().mean())}


def load() -> str:
    return os.popen("uptime").read().strip()


def train_and_score(data: str, run_dir: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """Train the run of ``seed`` (unless ``run_dir`` holds it already) and score the neighbors of
    its trained and random-init encoders and of the raw pixels."""
    start = time.perf_counter()
    config = PretrainConfig(data=data, epochs=args.epochs, batch_size=args.batch_size, seed=seed, device="cpu",
                            threads=args.threads, out=run_dir)
    if not os.path.isfile(os.path.join(run_dir, "summary.json")):
        pretrain(config, progress=False, baselines=False)
    record: Dict[str, Any] = {"seed": seed, "train_seconds": time.perf_counter() - start}
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    record["run"] = {key: summary.get(key)
                     for key in ("probe_accuracy", "knn_accuracy", "final_loss", "epochs", "steps")}
    saved = load_run(run_dir)
    dataset = saved.load_data()
    cpu = torch.device("cpu")
    train, test = dataset.train, dataset.test
    record["sizes"] = {"collection (train split)": len(train), "queries (test split)": len(test),
                       "val (carved, unused)": len(dataset.val)}
    encoders = {"trained": saved.build_model(dataset.image_shape, cpu).encoder,
                "random init": saved.build_untrained(dataset.image_shape).encoder}
    results: Dict[str, Dict[str, float]] = {}
    for name, encoder in encoders.items():
        start = time.perf_counter()
        collection = torch.from_numpy(extract_features(encoder, train, cpu))
        queries = torch.from_numpy(extract_features(encoder, test, cpu))
        found = nearest(queries, collection, args.k)
        results[name] = {**scores(found.indices, train.labels, test.labels), "seconds": time.perf_counter() - start}
        if name == "trained":
            record["trained_rows"] = found.indices.tolist()
    start = time.perf_counter()
    found = nearest(torch.from_numpy(pixel_features(test)), torch.from_numpy(pixel_features(train)), args.k)
    results["raw pixels"] = {**scores(found.indices, train.labels, test.labels), "seconds": time.perf_counter() - start}
    record["results"] = results
    return record


def command_path(run_dir: str, queries: int, trained_rows: List[List[int]], args: argparse.Namespace) -> Dict[str, Any]:
    """``find_neighbors`` on the trained run: exact, FAISS (built), FAISS (reused), timed and compared."""
    queries_text = [f"test:{i}" for i in range(queries)]
    timings: Dict[str, Any] = {}
    lists: Dict[str, List[List[int]]] = {}
    for label, index in (("exact", "exact"), ("faiss, built", "faiss"), ("faiss, reused", "faiss")):
        start = time.perf_counter()
        search = find_neighbors(run_dir, queries_text, k=args.k, split="train", index=index, device="cpu",
                                threads=args.threads)
        timings[label] = {"seconds": time.perf_counter() - start, "index_reused": search.index_reused}
        lists[label] = [[n.row for n in q.neighbors] for q in search.queries]
    pairs = list(zip(lists["exact"], lists["faiss, built"]))
    return {"timings": timings, "exact_lists_equal_library": lists["exact"] == trained_rows,
            "faiss_lists_identical_share": float(np.mean([a == b for a, b in pairs])),
            "faiss_top1_identical_share": float(np.mean([a[0] == b[0] for a, b in pairs]))}


def search_scale(queries: int, rows: int, dim: int, k: int, seed: int = 0) -> Dict[str, Any]:
    """Search time alone at full CIFAR-10 size: random unit features standing in for ``h``
    (``queries`` test against ``rows`` train images), exact (chunk 4096: one 64 MiB block of
    similarities at a time, where the whole matrix would take ``queries * rows * 4`` bytes)
    against FAISS (index built, then searched); best of two repeats each."""
    from contrastkit.metrics.search import faiss_flat_index, faiss_nearest

    generator = torch.Generator().manual_seed(seed)
    query_features = torch.randn(queries, dim, generator=generator)
    collection = torch.randn(rows, dim, generator=generator)
    timings: Dict[str, float] = {}
    for _ in range(2):
        start = time.perf_counter()
        exact = nearest(query_features, collection, k)
        timings["exact"] = min(timings.get("exact", float("inf")), time.perf_counter() - start)
        start = time.perf_counter()
        index = faiss_flat_index(collection)
        built = time.perf_counter()
        approximate = faiss_nearest(index, query_features, k)
        done = time.perf_counter()
        timings["faiss build"] = min(timings.get("faiss build", float("inf")), built - start)
        timings["faiss search"] = min(timings.get("faiss search", float("inf")), done - built)
    differ = ~(approximate.indices == exact.indices).all(dim=1)
    gap = (approximate.similarities[differ] - exact.similarities[differ]).abs()
    return {"queries": queries, "rows": rows, "dim": dim, "k": k, "seconds": timings,
            "full matrix MiB": queries * rows * 4 / 2**20, "block MiB": 4096 * 4096 * 4 / 2**20,
            "faiss lists identical share": float((~differ).float().mean()), "lists differing": int(differ.sum()),
            "largest similarity difference rank by rank where lists differ": float(gap.max()) if gap.numel() else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", default=os.environ.get("CONTRASTKIT_CIFAR10_TARBALL", DEFAULT_TARBALL))
    parser.add_argument("--work", default=None, help="folder for the images and the runs (default: a temporary one)")
    parser.add_argument("--train-per-class", type=int, default=500)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=3, help="runs, seeds 0 .. SEEDS-1 (default 3)")
    parser.add_argument("--markdown", default=None, help="write the results as Markdown here")
    parser.add_argument("--json", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    if not os.path.isfile(args.tarball):
        raise SystemExit(f"no CIFAR-10 tarball at {args.tarball} (--tarball, or $CONTRASTKIT_CIFAR10_TARBALL)")
    torch.set_num_threads(args.threads)
    work = args.work or tempfile.mkdtemp(prefix="neighbors-cifar10-")
    data = os.path.join(work, "cifar10")
    record: Dict[str, Any] = {"load_before": load(), "torch": torch.__version__, "python": platform.python_version(),
                              "threads": args.threads, "settings": vars(args)}
    start = time.perf_counter()
    if not os.path.isdir(data):
        record["extracted"] = extract_subset(args.tarball, data, args.train_per_class, args.test_per_class)
    record["extract_seconds"] = time.perf_counter() - start
    record["seeds"] = [train_and_score(data, os.path.join(work, f"run-seed{seed}"), seed, args)
                       for seed in range(args.seeds)]
    first = record["seeds"][0]
    record["command"] = command_path(os.path.join(work, "run-seed0"), first["sizes"]["queries (test split)"],
                                     first["trained_rows"], args)
    for run in record["seeds"]:
        del run["trained_rows"]
    record["scale"] = search_scale(10_000, 50_000, 128, args.k)
    record["load_after"] = load()
    text = markdown(record, args)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2, sort_keys=True)
            handle.write("\n")


def markdown(record: Dict[str, Any], args: argparse.Namespace) -> str:
    k = args.k
    seeds = record["seeds"]
    lines = [f"| encoder | agreement@1 mean (sd) | precision@{k} mean (sd) | agreement@1 per seed | "
             f"precision@{k} per seed |", "|---|---:|---:|---|---|"]
    for name in seeds[0]["results"]:
        top1 = np.array([run["results"][name]["agreement@1"] for run in seeds])
        top_k = np.array([run["results"][name][f"precision@{k}"] for run in seeds])
        lines.append(f"| {name} | {top1.mean():.3f} ({top1.std(ddof=1) if len(seeds) > 1 else 0:.3f}) | "
                     f"{top_k.mean():.3f} ({top_k.std(ddof=1) if len(seeds) > 1 else 0:.3f}) | "
                     f"{', '.join(f'{v:.3f}' for v in top1)} | {', '.join(f'{v:.3f}' for v in top_k)} |")
    runs = "; ".join(f"seed {run['seed']}: probe {run['run']['probe_accuracy']:.3f}, "
                     f"kNN {run['run']['knn_accuracy']:.3f}, {run['train_seconds']:.0f} s" for run in seeds)
    timings = record["command"]["timings"]
    scale = record["scale"]
    command_lines = [f"| {label} | {t['seconds']:.1f} | {t['index_reused']} |" for label, t in timings.items()]
    return "\n".join([
        "| | |", "|---|---|",
        f"| images | {seeds[0]['sizes']} |",
        f"| runs | SimCLR, small CNN, {args.epochs} epochs, batch {args.batch_size}, "
        f"{seeds[0]['run']['steps']} steps each; {runs} |",
        f"| machine | python {record['python']}, torch {record['torch']}, {record['threads']} thread(s) |",
        f"| load before | `{record['load_before']}` |",
        f"| load after | `{record['load_after']}` |",
        "",
        *lines,
        "",
        f"`find_neighbors` on the seed-0 run with the {seeds[0]['sizes']['queries (test split)']} test images as "
        f"queries (k = {k}, collection: the train split):",
        "",
        "| search | seconds (load run + data, encode, search) | index reused |",
        "|---|---:|---|",
        *command_lines,
        "",
        f"Its exact lists equal the library's: {record['command']['exact_lists_equal_library']}; FAISS lists "
        f"identical to the exact ones for {record['command']['faiss_lists_identical_share']:.3f} of "
        f"the queries (top-1: {record['command']['faiss_top1_identical_share']:.3f}).",
        "",
        f"Search alone at full CIFAR-10 size ({scale['queries']:,} queries x {scale['rows']:,} rows, d = "
        f"{scale['dim']}, k = {scale['k']}, random features; best of 2):",
        "",
        "| search | seconds |",
        "|---|---:|",
        f"| exact (`nearest`, chunk 4096: {scale['block MiB']:.0f} MiB of similarities at a time, not "
        f"{scale['full matrix MiB']:,.0f} MiB) | {scale['seconds']['exact']:.1f} |",
        f"| FAISS `IndexFlatIP`: build | {scale['seconds']['faiss build']:.2f} |",
        f"| FAISS `IndexFlatIP`: search | {scale['seconds']['faiss search']:.1f} |",
        "",
        f"FAISS lists identical to the exact ones (in order) for {scale['faiss lists identical share']:.4f} of the "
        f"queries; in the {scale['lists differing']} other(s), the similarities rank by rank differ by at most "
        f"{scale['largest similarity difference rank by rank where lists differ']:.1e}: the same neighbors, "
        "ordered differently where two similarities tie (the exact search puts the smaller row first).",
        "",
    ])


if __name__ == "__main__":
    main()
