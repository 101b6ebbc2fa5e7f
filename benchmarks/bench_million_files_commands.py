"""The commands a user runs on a million-file collection, timed whole: ``pretrain`` (a new run),
``pretrain --resume``, ``embed``, ``neighbors`` and ``probe``, each in its own process, with the
wall time and the process's peak resident memory (``VmHWM``).

    PYTHONPATH=src python benchmarks/bench_million_files_commands.py --data WORK/flat \\
        [--out benchmarks/results/million_files_commands.json] [--label now]

``--data``: a collection written by ``bench_million_files.py --keep`` (``WORK/flat``, or
``WORK/tree`` with ``--unlabeled``). The run is small where the collection does not matter to
what is measured (``--train-limit 512 --val-limit 256 --test-limit 256``, batch 256, one epoch
and a second on resume, no baselines, no report), so that each command's time is mostly what it
costs to open the collection: listing it, or reading the run's record of it
(``collection-index.npz``). ``embed`` and ``neighbors`` read the val split (cut to 256 images by
the run's ``--val-limit``). Run it once with the code to compare first on ``PYTHONPATH`` and
``--label`` naming it; the results of both go into the same ``--out`` file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]


def child(argv: List[str]) -> None:
    """Run ``contrastkit`` with ``argv`` and print its peak resident memory (MiB) last."""
    import atexit

    def peak() -> None:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    print(json.dumps({"peak_mib": int(line.split()[1]) / 1024}), file=sys.stderr, flush=True)

    atexit.register(peak)
    from contrastkit.cli import main

    code = main(argv)
    if code:
        raise SystemExit(code)


def command(argv: List[str]) -> Dict[str, Any]:
    started = time.perf_counter()
    process = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {process.returncode}\n{process.stderr[-3000:]}")
    peak = json.loads(process.stderr.strip().splitlines()[-1])["peak_mib"]
    return {"command": argv[0] + (" --resume" if "--resume" in argv else ""), "seconds": seconds, "peak_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--unlabeled", action="store_true")
    parser.add_argument("--label", default="now")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "million_files_commands.json")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    work = Path(tempfile.mkdtemp(prefix="commands-"))
    run = work / "run"
    common = ["--device", "cpu", "--quiet"]
    steps = [
        ["pretrain", "--data", str(args.data), *(["--unlabeled"] if args.unlabeled else []), "--out", str(run),
         "--epochs", "1", "--batch-size", "256", "--train-limit", "512", "--val-limit", "256", "--test-limit", "256",
         "--no-baselines", "--no-report", *common],
        ["pretrain", "--out", str(run), "--resume", "--epochs", "2", "--no-baselines", "--no-report", "--quiet"],
        ["embed", str(run), "--out", str(work / "h.npy"), "--split", "val", *common],
        ["neighbors", str(run), "val:0", "--split", "val", "--k", "4", "--no-picture", "--json", "--device", "cpu"],
        ["probe", str(run), "--no-baselines", "--json", "--device", "cpu"],
    ]
    load_before = os.getloadavg()
    results = []
    try:
        for argv in steps:
            results.append(command(argv))
            print(json.dumps(results[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"label": args.label, "data": str(args.data), "unlabeled": args.unlabeled, "load_before": load_before,
              "load_after": os.getloadavg(), "cpus": os.cpu_count(), "results": results}
    previous = json.loads(args.out.read_text()) if args.out.exists() else []
    previous = [entry for entry in previous if (entry["label"], entry["data"]) != (args.label, str(args.data))]
    args.out.write_text(json.dumps(previous + [record], indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
