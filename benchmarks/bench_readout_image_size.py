"""The read-out's seconds and peak memory against the image size, before and after a change.

What a user of a photo folder meets: ``contrastkit pretrain --data photos/ --image-size S``
trains, then reads the encoder out; ``contrastkit probe RUN`` runs that read-out again. This
benchmark builds a flat folder of ``--images`` JPEG photos (CIFAR-10 test images, taken in class
order round-robin, upscaled to ``--source-side`` pixels, so that every ``--image-size`` up to it
is a real downscale of a larger file), trains one epoch on it at each size (small CNN, batch 32,
the encoder's read-out only, no baselines) and then times ``contrastkit probe RUN
--baseline-cache off`` as a child process: the trained encoder, the random-init encoder and the
raw pixels, every number computed. Each read-out runs under an address-space limit
(``--memory-limit-gb``, ``prlimit --as``) so that one that asks for more fails instead of
swapping the machine; its peak resident memory is the child's ``ru_maxrss``.

``--before REF`` times the same read-outs with the package as it was at git ``REF`` (a worktree
of it first on ``PYTHONPATH``), on the same runs, in the same invocation, so the two columns
share the machine's load.

    python benchmarks/bench_readout_image_size.py CIFAR10_DIR --images 400 --sizes 32 64 128 224 \\
        --before HEAD~1 --json benchmarks/results/readout_image_size.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent


def build_folder(cifar: Path, out: Path, count: int, side: int) -> None:
    """``count`` CIFAR-10 test JPEGs, upscaled (bicubic) to ``side`` x ``side``, in one flat folder."""
    from PIL import Image

    classes = sorted(p for p in (cifar / "test").iterdir() if p.is_dir())
    files = [sorted(c.glob("*.jpg")) for c in classes]
    out.mkdir(parents=True)
    for i in range(count):
        source = files[i % len(classes)][i // len(classes)]
        with Image.open(source) as image:
            image.convert("RGB").resize((side, side), Image.BICUBIC).save(out / f"photo{i:05d}.jpg", quality=90)


def peak_mib_of(command: List[str], env: Dict[str, str], limit_gb: Optional[float], cwd: Path) -> Dict[str, Any]:
    """Run ``command`` from a fresh wrapper process, whose children's ``ru_maxrss`` is the
    command's peak resident memory alone: its wall seconds, peak MiB, exit status, the last line
    of its stderr when it failed, and its stdout."""
    wrapper = ("import json,resource,subprocess,sys,time\n"
               "cmd=json.loads(sys.argv[1]); t=time.perf_counter()\n"
               "p=subprocess.run(cmd,capture_output=True,text=True)\n"
               "s=time.perf_counter()-t\n"
               "m=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024\n"
               "print(json.dumps({'seconds':s,'rc':p.returncode,'peak_mib':m,'err':p.stderr[-2000:],"
               "'out':p.stdout[-20000:]}))\n")
    if limit_gb:
        command = ["prlimit", f"--as={int(limit_gb * 2 ** 30)}", "--"] + command
    done = subprocess.run([sys.executable, "-c", wrapper, json.dumps(command)], env=env, cwd=cwd,
                          capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout)
    lines = [line for line in answer["err"].strip().splitlines() if line.strip()]
    return {"seconds": round(answer["seconds"], 2), "rc": answer["rc"], "peak_mib": round(answer["peak_mib"]),
            "last_error_line": lines[-1][:300] if lines and answer["rc"] else "", "out": answer["out"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cifar10", type=Path, help="CIFAR-10 as a class-folder tree (train/, test/)")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--source-side", type=int, default=256)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 224])
    parser.add_argument("--before", default=None, help="git ref of the package to compare with")
    parser.add_argument("--memory-limit-gb", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="readout-size-"))
    photos = work / "photos"
    build_folder(args.cifar10, photos, args.images, args.source_side)
    env = {**os.environ, "CONTRASTKIT_CACHE": str(work / "cache")}
    packages = {"after": env}
    if args.before:
        tree = work / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.before], check=True,
                       capture_output=True)
        packages = {"before": {**env, "PYTHONPATH": str(tree / "src")}, **packages}
    load_before = os.getloadavg()
    rows = []
    try:
        for size in args.sizes:
            run = work / f"run{size}"
            train = subprocess.run([sys.executable, "-m", "contrastkit", "pretrain", "--data", str(photos),
                                    "--image-size", str(size), "--epochs", "1", "--batch-size", "32", "--workers", "2",
                                    "--threads", str(args.threads), "--no-baselines", "--no-report", "--out", str(run)],
                                   env=env, cwd=work, capture_output=True, text=True)
            if train.returncode:
                raise SystemExit(f"training at {size} failed: {train.stderr[-2000:]}")
            row: Dict[str, Any] = {"image_size": size, "raw_values": 3 * size * size}
            for name, package_env in packages.items():
                result = peak_mib_of([sys.executable, "-m", "contrastkit", "probe", str(run), "--baseline-cache", "off",
                                      "--threads", str(args.threads), "--json"], package_env, args.memory_limit_gb, work)
                out = result.pop("out")
                numbers = json.loads(out) if result["rc"] == 0 else {}
                result["raw_pixel_effective_rank"] = numbers.get("raw_pixel_effective_rank")
                result["view_retrieval_top1"] = numbers.get("view_retrieval_top1")
                row[name] = result
                print(size, name, {k: v for k, v in result.items()}, flush=True)
            rows.append(row)
    finally:
        if args.before:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "before")],
                           capture_output=True)
    record = {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "images": args.images,
              "source_side": args.source_side, "threads": args.threads, "memory_limit_gb": args.memory_limit_gb,
              "before": args.before, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "load_average_before": [round(v, 2) for v in load_before],
              "load_average_after": [round(v, 2) for v in os.getloadavg()], "rows": rows}
    print(json.dumps(record, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
