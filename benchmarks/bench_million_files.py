"""Opening a collection of a million image files: the time and the memory of
``contrastkit.data.open_data`` (the listing, the split by key, the skipped-file bookkeeping)
and of the first training batch, each in a fresh child process, as a command meets them.

    PYTHONPATH=src python benchmarks/bench_million_files.py --work WORK [--files 1000000]
        [--kinds flat,tree,list,csv] [--keep] [--recorded] [--out benchmarks/results/million_files.json]

``WORK`` receives (once; a later call with ``--keep`` reuses what is there):

* ``flat/``: ``--files`` files in one folder, ``img_0000000.png`` ...;
* ``tree/``: as many files nested two folders deep (``000/00/img_0000000.png``: 100 files a
  folder, 100 folders a parent), opened as an unlabeled collection (``unlabeled=True``, what
  ``--unlabeled`` asks: a folder of two or more sub-folders is read as class folders otherwise);
* ``tree.txt``: a list file of the tree's paths, one a line, relative to ``WORK``;
* ``pairs.csv``: an image-text CSV of the tree's paths, a short caption each (``--kinds csv``
  opens it as streamed pairs, ``open_data(..., paired=True, stream=True)``: held, every image
  would be decoded into memory, which a million images do not fit; then builds the run's
  tokenizer from the training texts, ``tokenizer_s``, and decodes 256 items, ``batch_s``).

Every file is the same 1x1 grey PNG (67 bytes): nothing is decoded when a collection is opened
(the colour is decided from the headers of its first 32 files), so the pixels do not matter to
what is timed; the first batch decodes its 256 files. Files are written, not hard-linked: a
collection reads a hard link to a file it already listed once.

Each measurement runs in a child process (``--child KIND PATH``) that reports: ``import_rss``
(resident MiB after importing contrastkit.data and torch, before opening), ``open_s`` and
``open_peak`` (wall seconds and the process's peak resident MiB, ``VmHWM``, at the end of the
open), ``held`` (resident MiB after the open, the collection alive, garbage collected), then
``batch_s`` and ``batch_peak`` for the first training batch (``IndexBatchSource``: batch 256,
the epoch's shuffled order, 0 workers, as ``pretrain`` draws it). ``open_peak - import_rss`` is
the memory the open adds above the interpreter with torch loaded (~513 MiB here, whatever the
collection). The parent also records ``resource.getrusage(RUSAGE_CHILDREN)``'s peak when a
child sets a new one (``rusage_children_peak``): it covers the child's whole life, the
interpreter's exit included (torch's teardown alone reaches ~125 MiB above its ``VmHWM``), so
the figures quoted are ``VmHWM``'s.

``--recorded`` also measures a run's recorded listing (``contrastkit.data.collection_index``),
each in its own child: ``record`` (listed, then written to ``WORK/index-KIND.npz``: ``write_s``,
``index_mib``), ``recorded`` (opened again with ``index=``: read from the record, the folders'
times or the list's or the CSV's SHA-256 checked, nothing listed) and ``changed`` (one file
added since, in the flat folder, a folder of the tree, or as a line of the list or a row of the
CSV: the change seen, the collection listed again and compared with the record,
``collection_changed="reindex"``; the file and the line are taken away afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]

#: A 1x1 8-bit grey PNG.
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a4944415478da63f80f00010101001ba9fcb70000000049454e44ae426082")


def _status(field: str) -> float:
    """A field of /proc/self/status in MiB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _relative(i: int, nested: bool) -> str:
    name = f"img_{i:07d}.png"
    return f"{i // 10000:03d}/{(i // 100) % 100:02d}/{name}" if nested else name


def _write_files(target: Path, count: int, nested: bool) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for i in range(count):
        relative = _relative(i, nested)
        if nested and i % 100 == 0:
            os.makedirs(partial / os.path.dirname(relative), exist_ok=True)
        with open(partial / relative, "wb") as handle:
            handle.write(TINY_PNG)
    partial.rename(target)


def generate(work: Path, count: int, kinds: List[str]) -> Dict[str, float]:
    """The collections ``kinds`` need under ``work`` (each written once); seconds each took."""
    took: Dict[str, float] = {}
    work.mkdir(parents=True, exist_ok=True)
    wanted = {"flat"} if "flat" in kinds else set()
    if {"tree", "list", "csv"} & set(kinds):
        wanted.add("tree")
    for name in sorted(wanted):
        if not (work / name).is_dir():
            started = time.perf_counter()
            _write_files(work / name, count, nested=name == "tree")
            took[name] = time.perf_counter() - started
    if "list" in kinds and not (work / "tree.txt").exists():
        with open(work / "tree.txt", "w") as handle:
            handle.writelines(f"tree/{_relative(i, True)}\n" for i in range(count))
    if "csv" in kinds and not (work / "pairs.csv").exists():
        with open(work / "pairs.csv", "w") as handle:
            handle.write("image,text\n")
            handle.writelines(f"tree/{_relative(i, True)},a photo numbered {i}\n" for i in range(count))
    return took


def child(kind: str, path: str, mode: str = "open", index: str = "") -> None:
    """One measurement (module docstring), printed as one JSON line. ``mode``: ``open`` (listed,
    as a new run), ``record`` (listed, then the listing written to ``index``), ``recorded``
    (read from ``index``, the collection unchanged) or ``changed`` (a file added since:
    confirmed by listing again, ``collection_changed="reindex"``)."""
    import gc

    import torch

    torch.set_num_threads(1)
    from contrastkit.data import open_data
    from contrastkit.data.batch_source import IndexBatchSource

    result: Dict[str, Any] = {"kind": kind, "mode": mode, "import_rss": _status("VmRSS")}
    recorded = {} if mode == "open" else {"index": index, "collection_changed": "reindex"}
    started = time.perf_counter()
    if kind == "csv":  # opened as streamed pairs (the data option stream=true), as a convirt run does
        from contrastkit.methods.convirt import build_tokenizer

        data = open_data(path, paired=True, stream=True, **recorded)
        result.update(open_s=time.perf_counter() - started, open_peak=_status("VmHWM"), index_state=data.index_state)
        _write_record(data, mode, index, result)
        gc.collect()
        result["held"] = _status("VmRSS")
        result["splits"] = {name: len(split) for name, split in data.splits()}
        started = time.perf_counter()
        tokenizer = build_tokenizer(data)  # what a run builds from the training texts before its first step
        result.update(tokenizer_s=time.perf_counter() - started, tokenizer_peak=_status("VmHWM"),
                      vocabulary=len(tokenizer.vocabulary))
        started = time.perf_counter()
        items = [data.train[i] for i in range(256)]
        result.update(batch_s=time.perf_counter() - started, batch_peak=_status("VmHWM"), batch_images=len(items))
        print(json.dumps(result))
        return
    data = open_data(path, unlabeled=kind == "tree", **recorded)
    result.update(open_s=time.perf_counter() - started, open_peak=_status("VmHWM"), index_state=data.index_state)
    _write_record(data, mode, index, result)
    gc.collect()
    result["held"] = _status("VmRSS")
    result["splits"] = {name: len(split) for name, split in data.splits()}
    result["left_out"] = len(data.left_out)
    started = time.perf_counter()
    source = IndexBatchSource(data.train, batch_size=256, seed=0, workers=0)
    source.set_epoch(0)
    batch = next(iter(source))
    result.update(batch_s=time.perf_counter() - started, batch_peak=_status("VmHWM"),
                  batch_images=int(batch.images.shape[0]))
    print(json.dumps(result))


def _write_record(data: Any, mode: str, index: str, result: Dict[str, Any]) -> None:
    """In ``record`` mode, write the data set's record to ``index``, timed."""
    if mode == "record":
        started = time.perf_counter()
        data.index.write(index)
        result.update(write_s=time.perf_counter() - started, write_peak=_status("VmHWM"),
                      index_mib=os.path.getsize(index) / 2**20)


def measure(kind: str, path: Path, mode: str = "open", index: str = "") -> Dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    process = subprocess.run([sys.executable, __file__, "--child", kind, str(path), mode, index], capture_output=True,
                             text=True)
    if process.returncode != 0:
        raise SystemExit(f"{kind}: the child failed ({process.returncode}):\n{process.stderr}")
    result = json.loads(process.stdout.strip().splitlines()[-1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # (the largest child so far: only a new maximum is this child's own)
    result["rusage_children_peak"] = after / 1024 if after > before else None
    return result


def _recorded(kind: str, path: Path, work: Path) -> List[Dict[str, Any]]:
    """The listing of ``kind`` recorded, read back unchanged, then confirmed after one file was
    added (and the file taken away again); each in its own child."""
    index = str(work / f"index-{kind}.npz")
    if os.path.exists(index):  # (an earlier run's: the record is made anew)
        os.remove(index)
    results = []
    for mode in ("record", "recorded"):
        results.append(measure(kind, path, mode, index))
        print(json.dumps(results[-1]), flush=True)
    if kind in ("list", "csv"):
        added = work / "tree" / "added.png"
        original = path.read_bytes()
        added.write_bytes(TINY_PNG)
        path.write_bytes(original + (b"tree/added.png\n" if kind == "list" else b"tree/added.png,one more photo\n"))
    else:
        added = path / ("added.png" if kind == "flat" else "000/00/added.png")
        added.write_bytes(TINY_PNG)
    try:
        results.append(measure(kind, path, "changed", index))
        print(json.dumps(results[-1]), flush=True)
    finally:
        added.unlink()
        if kind in ("list", "csv"):
            path.write_bytes(original)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder the collections are written to")
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--kinds", default="flat,tree,list,csv")
    parser.add_argument("--keep", action="store_true", help="keep the generated collections (reused next time)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "million_files.json")
    parser.add_argument("--recorded", action="store_true",
                        help="also time the listing recorded, read back, and confirmed after a change")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "PATH", "MODE", "INDEX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.work is None:
        parser.error("--work is required")
    kinds = args.kinds.split(",")
    took = generate(args.work, args.files, kinds)
    load_before = os.getloadavg()
    paths = {"flat": args.work / "flat", "tree": args.work / "tree", "list": args.work / "tree.txt",
             "csv": args.work / "pairs.csv"}
    results = []
    for kind in kinds:
        result = measure(kind, paths[kind])
        print(json.dumps(result), flush=True)
        results.append(result)
        if args.recorded:
            results += _recorded(kind, paths[kind], args.work)
    load_after = os.getloadavg()
    record = {"files": args.files, "generated_s": took, "load_before": load_before, "load_after": load_after,
              "python": platform.python_version(), "cpus": os.cpu_count(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"load average before {load_before}, after {load_after}; wrote {args.out}")
    if not args.keep:
        for name in ("flat", "tree", "tree.txt", "pairs.csv"):
            target = args.work / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()


if __name__ == "__main__":
    main()
