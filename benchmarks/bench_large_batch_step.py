"""A large-batch training step as a user runs it: peak RSS and step time of ``contrastkit
pretrain --batch-size N --micro-batch 256`` for SimCLR, ConVIRT (bidirectional InfoNCE) and SigLIP.

Each row is one whole ``pretrain`` process of one step (``--epochs 1`` on exactly ``N`` training
images): loading the data, the views, the cached-gradient step (embeddings in micro-batches of
256, the exact loss over all ``N`` pairs), the logged step's batch diagnostics, the last batch
kept for the pictures, the checkpoint and the read-out of the trained encoder (its baselines left
out: they do not depend on the batch). Reported: the step's seconds (``train_seconds`` of the
summary, one step) and the process's peak resident memory (``ru_maxrss`` of the child).

SimCLR reads the CIFAR-10 JPEG tree (``--cifar10``, class folders, held in memory); its 45,000
training images allow N up to 32,768, so N = 65,536 uses GlyphLab (``--data glyphlab``,
``train_scenes`` = N, 28 x 28 grey). ConVIRT and SigLIP read ``glyphlab-text`` (image-caption
pairs) with ``train_scenes`` = N.

``--before REF`` runs the SimCLR rows at ``--before-sizes`` with the package as it was at git
``REF`` (a worktree of it first on ``PYTHONPATH``) under an address-space limit
(``--memory-limit-gb``, ``prlimit --as``), so that a step that would take the machine's memory
fails instead.

    PYTHONPATH=src python benchmarks/bench_large_batch_step.py --cifar10 CIFAR10_DIR \\
        --before HEAD~1 --out benchmarks/results/large_batch_step.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_readout_image_size import peak_mib_of  # noqa: E402  (the same child-process measurement)

ROOT = Path(__file__).resolve().parent.parent


def _rows(cifar: Optional[Path]) -> List[Dict[str, Any]]:
    rows = []
    for n in (4096, 16384, 32768, 65536):
        if n <= 32768 and cifar is not None:
            rows.append({"method": "simclr", "n": n, "data": str(cifar), "options": ["--train-limit", str(n)]})
        elif n == 65536:
            rows.append({"method": "simclr", "n": n, "data": "glyphlab",
                         "options": [f"--data-option=train_scenes={n}", "--data-option=size=28"]})
    for method in ("convirt", "siglip"):
        for n in (4096, 16384, 65536):
            rows.append({"method": method, "n": n, "data": "glyphlab-text",
                         "options": [f"--data-option=train_scenes={n}"]})
    return rows


def _command(row: Dict[str, Any], out: Path, micro_batch: int) -> List[str]:
    return [sys.executable, "-m", "contrastkit", "pretrain", "--method", row["method"], "--data", row["data"],
            *row["options"], "--epochs", "1", "--batch-size", str(row["n"]), "--micro-batch", str(micro_batch),
            "--device", "cpu", "--no-report", "--no-baselines", "--quiet", "--json", "--out", str(out)]


def _measure(row: Dict[str, Any], src: Path, work: Path, micro_batch: int, limit: Optional[float]) -> Dict[str, Any]:
    out = Path(tempfile.mkdtemp(dir=work)) / "run"
    env = dict(os.environ, PYTHONPATH=str(src))
    done = peak_mib_of(_command(row, out, micro_batch), env, limit, ROOT)
    result = {**row, "rc": done["rc"], "peak_mib": done["peak_mib"], "wall_seconds": done["seconds"],
              "error": done["last_error_line"]}
    if done["rc"] == 0:
        summary = json.loads(done["out"])
        result.update(step_seconds=summary["train_seconds"], steps=summary["steps"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar10", type=Path, default=None, help="the CIFAR-10 class-folder tree (train/, test/)")
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--before", default=None, help="git ref of the package to compare with")
    parser.add_argument("--before-sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--memory-limit-gb", type=float, default=16.0)
    parser.add_argument("--only", default=None, help="run only the rows of this method")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table here too")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="large-batch-"))
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    before_load = uptime()
    results = []
    for row in _rows(args.cifar10):
        if args.only and row["method"] != args.only:
            continue
        results.append({"package": "this commit", **_measure(row, ROOT / "src", work, args.micro_batch, None)})
        print(json.dumps(results[-1]), file=sys.stderr)
    if args.before and args.cifar10 is not None:
        tree = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for n in args.before_sizes:
                row = {"method": "simclr", "n": n, "data": str(args.cifar10), "options": ["--train-limit", str(n)]}
                results.append({"package": f"before ({args.before})",
                                **_measure(row, tree / "src", work, args.micro_batch, args.memory_limit_gb)})
                print(json.dumps(results[-1]), file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    after_load = uptime()
    lines = ["# A large-batch step: peak memory and time", "",
             "Command (from the repository root):", "",
             "    PYTHONPATH=src python benchmarks/bench_large_batch_step.py --cifar10 CIFAR10_DIR"
             + (f" --before {args.before}" if args.before else "")
             + (f" --only {args.only}" if args.only else ""), "",
             f"python {platform.python_version()}, {os.cpu_count()} CPUs, `--micro-batch {args.micro_batch}`, "
             "`--device cpu`, one step per row (a whole `pretrain` process: data, views, the step, its "
             "diagnostics, the last batch, the checkpoint, the read-out without baselines).", "",
             f"Load: before `{before_load}`; after `{after_load}`.", "",
             "| package | method | N pairs | data | step seconds | peak RSS (MiB) | exit |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        data = "CIFAR-10" if r["data"] == str(args.cifar10) else r["data"]
        step = f"{r['step_seconds']:.1f}" if "step_seconds" in r else "-"
        outcome = "0" if r["rc"] == 0 else f"{r['rc']}: {r['error'][:120]}"
        lines.append(f"| {r['package']} | {r['method']} | {r['n']:,} | {data} | {step} | {r['peak_mib']:,} | {outcome} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
