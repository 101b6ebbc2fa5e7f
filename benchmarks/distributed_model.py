"""A cost model (not a measurement) of the distributed NT-Xent loss, world sizes 1..1024.

Prints markdown tables: bytes each rank moves per step for each mode, compute vs
communication time per step, memory of the loss per rank, and where the ring stops scaling.
Every number is derived from the formulas below and the hardware assumptions in HARDWARE;
change them and re-run. Command used for docs/distributed.md:

    python benchmarks/distributed_model.py > benchmarks/results/distributed_model.md

Loss: SimCLR's NT-Xent on two views, R = 2B embedding rows of width d in the global batch,
r = R / W rows per rank. contrastkit computes the log-sum-exp in float32 (inputs of lower
precision are upcast), so the similarity GEMMs are float32 work; the embeddings travel in the
dtype the model produced (bf16 here, ``b`` bytes per element).

Per rank and step (derivations in docs/distributed.md):

=============  ======================  =================================  ============  =================
mode           sent/received bytes     similarity FLOPs                   exp() calls   loss memory
=============  ======================  =================================  ============  =================
global         (W-1)/W R d b           6 R^2 d                            R^2           ~3 R^2 * 4 bytes
local (dense)  2 (W-1)/W R d b         6 R^2 d / W                        R^2 / W       ~3 r R * 4 bytes
ring (tiled)   (3W-2)/W R d b          8 R^2 d / W                        2 R^2 / W     ~4 r d * 4 + 2 t^2 * 4
=============  ======================  =================================  ============  =================

(global: forward all-gather, backward none -- the replicated rule; local: all-gather +
reduce-scatter; ring: W-1 block hops forward, W-1 block hops + W gradient hops backward, and
the backward recomputes the tiles: one GEMM more than dense.)

Collective time (NCCL-style ring): t = (W-1) * (alpha + S / (W * beta)) for S bytes gathered
or scattered in total; the ring loss: W steps, each max(compute of one block, hop) forward
(the next block is prefetched), and compute + gradient hop backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HARDWARE = {
    # NVIDIA H100 SXM datasheet peaks; achieved fractions are assumptions.
    "fp32_flops": 67e12 * 0.6,         # non-tensor FP32 (the loss GEMMs), 60 % achieved
    "bf16_flops": 989e12 * 0.4,        # dense BF16 tensor cores (the encoder), 40 % MFU
    "exp_per_s": 132 * 16 * 1.83e9,    # SFU: 16 exp/clock/SM, 132 SMs, 1.83 GHz boost
    # Links: NVLink 4 inside a node of 8 GPUs, one 400 Gb/s InfiniBand NDR NIC per GPU across.
    "beta_nvlink": 360e9,              # bytes/s achieved per GPU (450 GB/s per direction peak)
    "alpha_nvlink": 3e-6,              # seconds per ring hop
    "beta_ib": 45e9,                   # bytes/s achieved per GPU (50 GB/s peak)
    "alpha_ib": 8e-6,
    "gpus_per_node": 8,
}
BYTES = 2            # bf16 embeddings on the wire
MEMORY = 80 * 2**30  # H100 memory; a mode whose loss alone needs more is marked OOM
TILE = 1024          # ring tile edge
WORLDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


@dataclass
class Scenario:
    name: str
    pairs_per_rank: int = 0      # weak scaling when > 0
    global_pairs: int = 0        # strong scaling when > 0
    d: int = 128
    encoder_gflops: float = 4.1  # forward GFLOPs per image (ResNet-50 at 224 px)
    params: float = 25.6e6       # encoder parameters (DDP all-reduce, fp32 gradients)

    def rows(self, world: int) -> int:
        pairs = self.pairs_per_rank * world if self.pairs_per_rank else self.global_pairs
        return 2 * pairs


def link(world: int):
    h = HARDWARE
    if world <= h["gpus_per_node"]:
        return h["alpha_nvlink"], h["beta_nvlink"]
    return h["alpha_ib"], h["beta_ib"]


def collective(world: int, total_bytes: float) -> float:
    if world == 1:
        return 0.0
    alpha, beta = link(world)
    return (world - 1) * (alpha + total_bytes / (world * beta))


def hop(world: int, block_bytes: float) -> float:
    alpha, beta = link(world)
    return alpha + block_bytes / beta


def loss_compute(rows_anchor: float, rows_cand: float, d: int, gemms: int, exps: int) -> float:
    h = HARDWARE
    elements = rows_anchor * rows_cand
    return gemms * 2 * elements * d / h["fp32_flops"] + exps * elements / h["exp_per_s"]


def model(s: Scenario, world: int) -> dict:
    R = s.rows(world)
    r = R / world
    d = s.d
    full = R * d * BYTES
    out = {"W": world, "R": R, "r": int(r)}
    # bytes each rank receives (= sends) per step
    out["bytes_global"] = (world - 1) / world * full
    out["bytes_local"] = 2 * (world - 1) / world * full
    out["bytes_ring"] = (3 * world - 2) / world * full if world > 1 else 0.0
    # time of the loss per step (compute + communication as executed)
    out["t_global"] = loss_compute(R, R, d, 3, 1) + collective(world, full)
    out["t_local"] = loss_compute(r, R, d, 3, 1) + 2 * collective(world, full)
    block = r * d * BYTES
    step_fwd = loss_compute(r, r, d, 1, 1)
    step_bwd = loss_compute(r, r, d, 3, 1)
    if world == 1:
        out["t_ring"] = step_fwd + step_bwd
    else:
        out["t_ring"] = world * max(step_fwd, hop(world, block)) + world * (max(step_bwd, hop(world, block))
                                                                        + hop(world, block * 2))
    out["ring_hop_compute"] = step_fwd
    out["ring_hop_comm"] = hop(world, block) if world > 1 else 0.0
    # memory of the loss per rank (float32 logits, their exp and gradient ~ 3 copies)
    out["mem_global"] = 3 * R * R * 4
    out["mem_local"] = 3 * r * R * 4
    out["mem_ring"] = 4 * r * d * 4 + 2 * min(TILE, r) ** 2 * 4
    # context: the encoder and DDP's gradient all-reduce
    images = r / 2 * 2  # r rows = r/2 pairs = r images (two views each)
    out["t_encoder"] = images * 3 * s.encoder_gflops * 1e9 / HARDWARE["bf16_flops"]
    out["t_ddp"] = 2 * collective(world, s.params * 4)
    return out


def fmt_bytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if x < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return ""


def fmt_time(t: float) -> str:
    if t == 0:
        return "0"
    if t < 1e-3:
        return f"{t * 1e6:.0f} us"
    if t < 1:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def fits(m: dict, mode: str) -> str:
    return fmt_time(m[f"t_{mode}"]) + (" (OOM)" if m[f"mem_{mode}"] > MEMORY else "")


def table(s: Scenario) -> str:
    head = ("| W | R | rows/rank | bytes global | bytes local | bytes ring | loss time global | "
            "loss time local | loss time ring | encoder fwd+bwd | DDP all-reduce | loss memory "
            "global / local / ring |")
    lines = [head, "|" + "---|" * 12]
    for world in WORLDS:
        m = model(s, world)
        lines.append(
            f"| {world} | {m['R']} | {m['r']} | {fmt_bytes(m['bytes_global'])} | {fmt_bytes(m['bytes_local'])} | "
            f"{fmt_bytes(m['bytes_ring'])} | {fits(m, 'global')} | {fits(m, 'local')} | "
            f"{fits(m, 'ring')} | {fmt_time(m['t_encoder'])} | {fmt_time(m['t_ddp'])} | "
            f"{fmt_bytes(m['mem_global'])} / {fmt_bytes(m['mem_local'])} / {fmt_bytes(m['mem_ring'])} |")
    return "\n".join(lines)


def ring_limit(s: Scenario) -> str:
    """First world size at which a ring hop takes longer than the compute it hides behind."""
    for world in WORLDS[1:]:
        m = model(s, world)
        if m["ring_hop_comm"] > m["ring_hop_compute"]:
            return (f"from W = {world}: hop {fmt_time(m['ring_hop_comm'])} > block compute "
                    f"{fmt_time(m['ring_hop_compute'])} (rows/rank {m['r']})")
    return "no W <= 1024"


def summary(s: Scenario) -> str:
    models = [model(s, world) for world in WORLDS]
    best = min(models, key=lambda m: m["t_ring"])
    lines = []
    if s.global_pairs:  # strong scaling: more ranks should make the loss faster
        lines.append(f"Ring loss time is smallest at W = {best['W']} ({fmt_time(best['t_ring'])}); beyond it "
                     "the W sequential hops per pass (latency) make it slower again."
                     if best["W"] != WORLDS[-1] else "Ring loss time still falls at W = 1024.")
    for mode in ("local", "ring"):
        over = next((m for m in models if m[f"t_{mode}"] > m["t_encoder"]), None)
        lines.append(f"{mode}: loss time exceeds the encoder's fwd+bwd time from W = {over['W']}"
                     if over else f"{mode}: loss time stays below the encoder's fwd+bwd time up to W = 1024")
    oom = next((m for m in models if m["mem_local"] > MEMORY), None)
    lines.append(f"local (dense) mode's loss needs more than 80 GiB from W = {oom['W']}" if oom
                 else "local (dense) mode fits in 80 GiB up to W = 1024")
    return "\n".join(f"- {line}" for line in lines)


def main() -> None:
    scenarios = [
        Scenario("weak scaling, SimCLR-like: 256 pairs per GPU, d = 128, ResNet-50", pairs_per_rank=256),
        Scenario("weak scaling, 4096 pairs per GPU, d = 128, ResNet-50", pairs_per_rank=4096),
        Scenario("strong scaling: 32768 pairs in total (R = 65536 rows), d = 512, ViT-B/16 encoder",
                 global_pairs=32768, d=512, encoder_gflops=17.6, params=86e6),
    ]
    print("# Distributed NT-Xent: a cost model (derived, not measured)\n")
    print("Hardware assumptions:", ", ".join(f"{k} = {v:.3g}" for k, v in HARDWARE.items()),
          f"; embeddings on the wire: {BYTES} bytes/element; ring tile {TILE}.\n")
    for s in scenarios:
        print(f"## {s.name}\n")
        print(table(s) + "\n")
        print(f"- Ring becomes communication-bound (hop not hidden by compute): {ring_limit(s)}")
        print(summary(s) + "\n")


if __name__ == "__main__":
    main()
