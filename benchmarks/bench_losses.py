"""Measure one loss configuration: forward + backward time and extra peak memory.

Usage (one configuration per process, so peak memory is not polluted by other runs)::

    python benchmarks/bench_losses.py METHOD N [--dim 128] [--temperature 0.1] [--threads 2]

Prints one JSON line: method, n, seconds (median over repetitions), repetitions, extra
peak RSS in MiB (peak resident set during the timed runs minus the resident set after
imports and input creation), and the loss value (to check that every implementation
computes the same number). ``benchmarks/run_benchmarks.py`` runs every configuration in a
fresh subprocess under a time and an address-space limit and writes the results table.

Peers are used as black boxes through their public classes. Two of them import torchvision
from their package ``__init__``; their loss modules themselves need only torch, so they are
loaded without executing those ``__init__`` files (see ``_load_submodule``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import types
from typing import Callable, Dict, Tuple

import torch

METHODS: Dict[str, str] = {
    # one modality, SimCLR's 2N views
    "views/contrastkit-dense": "contrastkit nt_xent_views, dense path",
    "views/contrastkit-tiled": "contrastkit nt_xent_views, tiled path",
    "views/contrastkit-auto": "contrastkit nt_xent_views, automatic choice",
    "views/contrastkit-tiled-per-anchor": "contrastkit nt_xent_views, tiled, one learnable tau per anchor",
    "views/contrastkit-tiled-per-anchor-fixed": "contrastkit nt_xent_views, tiled, one fixed tau per anchor",
    "views/pytorch-metric-learning": "pytorch-metric-learning NTXentLoss",
    "views/lightly": "lightly NTXentLoss",
    "views/gemm-bound": "3 products of (2N x d)(d x 2N) size",
    # two modalities, both directions
    "bidirectional/contrastkit-dense": "contrastkit bidirectional_info_nce, dense path",
    "bidirectional/contrastkit-tiled": "contrastkit bidirectional_info_nce, tiled path",
    "bidirectional/contrastkit-tiled-per-anchor": "contrastkit bidirectional_info_nce, tiled, one learnable tau "
                                                  "per anchor",
    "bidirectional/contrastkit-tiled-per-anchor-fixed": "contrastkit bidirectional_info_nce, tiled, one fixed tau "
                                                        "per anchor",
    "bidirectional/open_clip": "open_clip ClipLoss",
    "bidirectional/gemm-bound": "3 products of (N x d)(d x N) size",
    # two modalities, one direction, in-batch negatives
    "info_nce/contrastkit-dense": "contrastkit info_nce, dense path",
    "info_nce/contrastkit-tiled": "contrastkit info_nce, tiled path",
    "info_nce/info-nce-pytorch": "info-nce-pytorch InfoNCE",
    "info_nce/gemm-bound": "3 products of (N x d)(d x N) size",
    # two modalities, SigLIP's pairwise sigmoid loss (t = 1 / tau, b = -10)
    "sigmoid/contrastkit-dense": "contrastkit sigmoid_loss, dense path",
    "sigmoid/contrastkit-tiled": "contrastkit sigmoid_loss, tiled path",
    "sigmoid/open_clip": "open_clip SigLipLoss",
    "sigmoid/gemm-bound": "3 products of (N x d)(d x N) size",
}

#: SigLIP's initial bias, used by every sigmoid configuration (the scale is 1 / --temperature).
SIGMOID_BIAS = -10.0


def _load_submodule(name: str, stub_packages: Tuple[str, ...] = (), empty_modules: Tuple[str, ...] = ()):
    """Import ``name`` without running the ``__init__`` of the listed packages.

    Each stub package gets its real directory as ``__path__``, so its submodules are found
    and imported normally. ``empty_modules`` are replaced by empty modules: only for
    modules the measured code path never uses (documented in RESULTS.md).
    """
    root = name.split(".")[0]
    spec = importlib.util.find_spec(root)
    if spec is None or spec.origin is None:
        raise ImportError(f"{root} is not installed")
    base = os.path.dirname(spec.origin)
    for package in stub_packages:
        module = types.ModuleType(package)
        module.__path__ = [os.path.join(base, *package.split(".")[1:])]
        sys.modules[package] = module
    for empty in empty_modules:
        sys.modules[empty] = types.ModuleType(empty)
    return importlib.import_module(name)


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM (the peak RSS) of this process (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _peer_versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for dist in ("pytorch-metric-learning", "lightly", "open_clip_torch", "info-nce-pytorch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def build(method: str, n: int, dim: int, tau: float, device: str = "cpu",
          dtype: torch.dtype = torch.float32) -> Tuple[Callable[[], torch.Tensor], list]:
    """Inputs (leaf tensors that need a gradient, on ``device`` in ``dtype``) and a closure
    computing the loss."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, dim, generator=generator).to(device, dtype).requires_grad_()
    b = torch.randn(n, dim, generator=generator).to(device, dtype).requires_grad_()
    group, name = method.split("/")
    import contrastkit.losses as ck
    from contrastkit.losses import tiled

    if name.startswith("contrastkit"):
        if name == "contrastkit-dense":
            tiled.DENSE_MAX_ENTRIES = 2**62  # force the dense path
            chunk = None
        elif name.startswith("contrastkit-tiled"):
            chunk = tiled.DEFAULT_CHUNK_SIZE
        else:
            chunk = None
        if name.startswith("contrastkit-tiled-per-anchor"):
            # One tau per anchor (2N of them), spread by a factor of e around --temperature; a
            # learnable one is a leaf that needs its gradient (iSogCLR's individual temperatures).
            spread = torch.rand(2 * n, generator=generator) - 0.5
            tau = (tau * torch.exp(spread)).to(device, dtype)
            if not name.endswith("-fixed"):
                tau.requires_grad_()
                inputs = [a, b, tau]
            else:
                inputs = [a, b]
            if group == "views":
                return (lambda: ck.nt_xent_views(a, b, temperature=tau, chunk_size=chunk)), inputs
            return (lambda: ck.bidirectional_info_nce(a, b, temperature=tau, chunk_size=chunk)), inputs
        if group == "views":
            return (lambda: ck.nt_xent_views(a, b, temperature=tau, chunk_size=chunk)), [a, b]
        if group == "bidirectional":
            return (lambda: ck.bidirectional_info_nce(a, b, temperature=tau, chunk_size=chunk)), [a, b]
        if group == "sigmoid":
            return (lambda: ck.sigmoid_loss(a, b, temperature=tau, bias=SIGMOID_BIAS, chunk_size=chunk)), [a, b]
        return (lambda: ck.info_nce(a, b, temperature=tau, chunk_size=chunk)), [a, b]
    if name == "pytorch-metric-learning":
        from pytorch_metric_learning.losses import NTXentLoss

        loss_fn = NTXentLoss(temperature=tau)
        labels = torch.arange(n, device=device).repeat(2)
        return (lambda: loss_fn(torch.cat([a, b]), labels)), [a, b]
    if name == "lightly":
        module = _load_submodule(
            "lightly.loss.ntx_ent_loss",
            stub_packages=("lightly", "lightly.loss", "lightly.models", "lightly.models.modules", "lightly.utils"),
            # lightly.models.utils imports torchvision; the memory bank uses it only to gather
            # across processes, which memory_bank_size=0 on one process never does.
            empty_modules=("lightly.models.utils",),
        )
        loss_fn = module.NTXentLoss(temperature=tau, memory_bank_size=0)
        return (lambda: loss_fn(a, b)), [a, b]
    if name == "open_clip":
        module = _load_submodule("open_clip.loss", stub_packages=("open_clip",))
        scale = torch.tensor(1.0 / tau, device=device)
        normalize = torch.nn.functional.normalize
        if group == "sigmoid":
            # Fixed scale and bias as tensors; on one process SigLipLoss is dense (its chunks are
            # the other ranks' texts, exchanged between neighbors).
            loss_fn = module.SigLipLoss()
            bias = torch.tensor(SIGMOID_BIAS, device=device)
            return (lambda: loss_fn(normalize(a, dim=-1), normalize(b, dim=-1), scale, bias)), [a, b]
        loss_fn = module.ClipLoss()
        return (lambda: loss_fn(normalize(a, dim=-1), normalize(b, dim=-1), scale)), [a, b]
    if name == "info-nce-pytorch":
        from info_nce import InfoNCE

        loss_fn = InfoNCE(temperature=tau)
        return (lambda: loss_fn(a, b)), [a, b]
    raise ValueError(f"unknown method {method!r}")


def gemm_bound(group: str, n: int, dim: int) -> float:
    """Time of the three products of the dense problem: S = A B^T, G B and G^T A, with the
    outputs preallocated (pure compute). One modality: A = B = Z of 2N rows."""
    rows = 2 * n if group == "views" else n
    z = torch.randn(rows, dim)
    panel = rows if rows <= 32768 else 4096  # the full 2N x 2N matrix does not fit beyond that
    s = torch.empty(panel, rows)
    g = torch.randn(panel, rows)
    out_rows, out_all = torch.empty(panel, dim), torch.empty(rows, dim)
    torch.mm(z[:256], z[:256].T)  # warm up the BLAS threads
    start = time.perf_counter()
    for p0 in range(0, rows, panel):
        torch.mm(z[p0:p0 + panel], z.T, out=s)
    for p0 in range(0, rows, panel):
        torch.mm(g, z, out=out_rows)
    for p0 in range(0, rows, panel):
        if panel == rows:
            torch.mm(g.T, z, out=out_all)
        else:
            out_all.addmm_(g.T, z[p0:p0 + panel])
    return time.perf_counter() - start


def measure(method: str, n: int, dim: int, tau: float, min_seconds: float = 2.0) -> Dict[str, object]:
    group, name = method.split("/")
    if name == "gemm-bound":
        baseline = _rss_bytes("VmRSS")
        _reset_peak_rss()
        cpu_start = time.process_time()
        seconds = gemm_bound(group, n, dim)
        return {"method": method, "n": n, "seconds": seconds, "cpu_seconds": time.process_time() - cpu_start,
                "repetitions": 1,
                "extra_peak_mib": (_rss_bytes("VmHWM") - baseline) / 2**20, "loss": None}
    loss_fn, inputs = build(method, n, dim, tau)
    torch.mm(inputs[0][:256].detach(), inputs[0][:256].detach().T)  # start the thread pool
    baseline = _rss_bytes("VmRSS")
    _reset_peak_rss()
    times, cpu_times, value = [], [], None
    budget_start = time.perf_counter()
    while True:
        for x in inputs:
            x.grad = None
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = loss_fn()
        loss.backward()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        value = float(loss.detach())
        del loss
        spent = time.perf_counter() - budget_start
        # Large problems: one run. Small ones: a warm-up, then repeat for >= min_seconds.
        if times[0] > min_seconds or (len(times) >= 4 and spent > min_seconds) or len(times) >= 50:
            break
    timed = times if len(times) == 1 else times[1:]
    cpu = cpu_times if len(cpu_times) == 1 else cpu_times[1:]
    return {"method": method, "n": n, "seconds": statistics.median(timed), "cpu_seconds": statistics.median(cpu),
            "repetitions": len(timed),
            "extra_peak_mib": (_rss_bytes("VmHWM") - baseline) / 2**20, "loss": value}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("method", choices=sorted(METHODS) + ["versions"])
    parser.add_argument("n", type=int, nargs="?", default=0, help="pairs (N)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.method == "versions":
        print(json.dumps(_peer_versions()))
        return 0
    torch.set_num_threads(args.threads)
    print(json.dumps(measure(args.method, args.n, args.dim, args.temperature)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
