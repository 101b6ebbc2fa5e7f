"""Workers of tests/losses/test_losses_precision.py: small float32 losses by the ring exchange
(``distributed_mode="local"`` with tiles) on two gloo processes, with their float64 values."""

from __future__ import annotations

from typing import Dict

import torch


def ring_worker(rank: int, world: int, n: int, d: int, tau: float) -> Dict[str, torch.Tensor]:
    from contrastkit import losses as L

    g = torch.Generator().manual_seed(rank)
    q = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    p = torch.nn.functional.normalize(q + 0.05 * torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    q, p = q.float().double(), p.float().double()  # the float32 inputs, exactly
    found = {}
    for name, loss in (("info_nce", L.info_nce), ("nt_xent_views", L.nt_xent_views)):
        def call(a, b, chunk):
            return loss(a, b, temperature=tau, reduction="none", chunk_size=chunk, distributed=True,
                        distributed_mode="local")
        found[name] = torch.stack([call(q, p, None), call(q.float(), p.float(), 8).double()])
    return found
