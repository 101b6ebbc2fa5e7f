"""A peer library's losses against their drop-in classes in ``contrastkit.compat`` (the same
call): forward + backward time and peak memory, CPU, float32.

    PYTHONPATH=src python benchmarks/bench_compat.py --peer {pml,lightly,open_clip,info_nce} [--sizes 1024,4096,16384]
        [--dim 128] [--classes 10] [--repeats 3] [--out benchmarks/results/compat_PEER.md]

``--peer pml``: pytorch-metric-learning's ``NTXentLoss`` / ``SupConLoss`` on N labelled
embeddings (labels drawn from ``--classes`` classes). ``--peer lightly``: lightly's
``NTXentLoss`` / ``DCLLoss`` on N pairs of views (two ``(N, dim)`` tensors). ``--peer open_clip``:
open_clip's ``ClipLoss`` / ``SigLipLoss`` on N image-text pairs (unit features, ``logit_scale``
``1 / 0.07``, SigLIP's ``logit_bias`` -10). ``--peer info_nce``: info-nce-pytorch's ``InfoNCE`` on N
query / positive-key pairs (in-batch negatives).

Each (implementation, loss, N) runs in its own process (so that one's peak is not another's):
the loss and its backward pass ``--repeats`` times after one warm-up; reported: the median
seconds and the process's peak resident memory above what it held before the first call
(``ru_maxrss``). Each process may address ``--memory-limit-gib`` (8 by default); a run that
cannot allocate what it asks for within that is reported as such, with the error's first line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


#: peer -> its name, the peer's module, the compat module, the losses compared, what a call takes.
PEERS = {
    "pml": ("pytorch-metric-learning", "pytorch_metric_learning.losses", "contrastkit.compat.pml",
            ("NTXentLoss", "SupConLoss"), "labels"),
    "lightly": ("lightly", "lightly.loss", "contrastkit.compat.lightly", ("NTXentLoss", "DCLLoss"), "views"),
    "open_clip": ("open_clip", "open_clip.loss", "contrastkit.compat.open_clip", ("ClipLoss", "SigLipLoss"),
                  "pairs"),
    "info_nce": ("info-nce-pytorch", "info_nce", "contrastkit.compat.info_nce", ("InfoNCE",), "views"),
}


def _child(peer: str, kind: str, loss: str, n: int, dim: int, classes: int, repeats: int, limit_gib: float) -> None:
    # A ceiling on the address space: an allocation beyond it fails here instead of swapping the machine.
    resource.setrlimit(resource.RLIMIT_AS, (int(limit_gib * 2**30), int(limit_gib * 2**30)))
    import importlib

    import torch

    torch.set_num_threads(1)
    title, peer_module, compat_module, _, call = PEERS[peer]
    module = importlib.import_module(peer_module if kind == "peer" else compat_module)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, dim, generator=g).requires_grad_()
    other = torch.randint(classes, (n,), generator=g) if call == "labels" else \
        (x.detach() + 0.5 * torch.randn(n, dim, generator=g)).requires_grad_()
    if call == "pairs":  # unit image and text features, as open_clip's model gives them, and its scales
        x, other = (torch.nn.functional.normalize(t.detach(), dim=1).requires_grad_() for t in (x, other))
        scales = (torch.tensor(1 / 0.07).requires_grad_(),) + \
            ((torch.tensor(-10.0).requires_grad_(),) if loss == "SigLipLoss" else ())
    else:
        scales = ()
    criterion = getattr(module, loss)()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    try:
        for repeat in range(repeats + 1):
            started = time.perf_counter()
            criterion(x, other, *scales).backward()
            if repeat:
                times.append(time.perf_counter() - started)
            x.grad = other.grad = None
    except (RuntimeError, MemoryError) as err:
        asked = re.search(r"allocate (?:memory: you tried to allocate )?(\d+) bytes", str(err))
        reason = (f"cannot allocate {int(asked.group(1)) / 2**30:.1f} GiB" if asked else
                  str(err).splitlines()[0][:120])
        print(json.dumps({"error": reason}))
        return
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"seconds": statistics.median(times), "peak_mib": peak / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/compat_PEER.md")
    parser.add_argument("--memory-limit-gib", type=float, default=8.0,
                        help="address-space ceiling of each measured process (default 8)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, loss, n = args.child
        _child(args.peer, kind, loss, int(n), args.dim, args.classes, args.repeats, args.memory_limit_gib)
        return
    title, _, compat_module, compared, call = PEERS[args.peer]
    out = args.out or os.path.join(ROOT, "benchmarks", "results", f"compat_{args.peer}.md")
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()
    rows = [f"| loss | N | {title} s | {compat_module} s | {title} peak MiB | compat peak MiB |",
            "|---|---:|---:|---:|---:|---:|"]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    for loss in compared:
        for n in sizes:
            found = {}
            for kind in ("peer", "compat"):
                output = subprocess.run([sys.executable, __file__, "--peer", args.peer, "--dim", str(args.dim),
                                         "--classes", str(args.classes), "--repeats", str(args.repeats),
                                         "--memory-limit-gib", str(args.memory_limit_gib), "--child", kind, loss,
                                         str(n)], env=env, capture_output=True, text=True, timeout=3600)
                lines = [line for line in output.stdout.splitlines() if line.startswith("{")]
                found[kind] = json.loads(lines[-1]) if lines else {"error": (output.stderr.strip().splitlines()
                                                                             or ["killed"])[-1][:120]}
            cells = []
            for key in ("seconds", "peak_mib"):
                for kind in ("peer", "compat"):
                    result = found[kind]
                    cells.append(f"fails: {result['error']}" if "error" in result else
                                 f"{result[key]:.3f}" if key == "seconds" else f"{result[key]:.0f}")
            rows.append(f"| {loss} | {n:,} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
            print(rows[-1], flush=True)
    load_after = os.getloadavg()
    what = {"labels": "labelled embeddings", "views": "pairs of views", "pairs": "image-text pairs"}[call]
    command = (f"python benchmarks/bench_compat.py --peer {args.peer} --sizes {args.sizes} --dim {args.dim} "
               + (f"--classes {args.classes} " if call == "labels" else "")
               + f"--repeats {args.repeats} --memory-limit-gib {args.memory_limit_gib:g}")
    text = "\n".join([f"# {title}'s losses against {compat_module}", "",
                      f"Command: `{command}` (the script's docstring says what is measured; N {what}). 1 torch "
                      f"thread, float32, CPU. Machine: {os.cpu_count()} CPUs, {platform.machine()}; load average before "
                      f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in load_after)}.",
                      "", *rows, ""])
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
