"""Workers of tests/compat/test_compat_lightly.py: lightly's losses and contrastkit.compat.lightly's
with ``gather_distributed=True`` in one gloo group, on the same per-rank views."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch


def views(seed: int, rank: int, b: int, d: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1000 * rank)
    out0 = torch.randn(b, d, generator=g, dtype=torch.float64)
    return out0, out0 + 0.5 * torch.randn(b, d, generator=g, dtype=torch.float64)


def compare_worker(rank: int, world: int, seed: int, b: int, d: int) -> Dict[str, List[torch.Tensor]]:
    """Per kind: [peer loss, our loss, peer gradients (out0, out1), ours]; and the memory banks
    after two gathered updates."""
    from lightly import loss as peer

    from contrastkit.compat import lightly as compat

    results: Dict[str, List[torch.Tensor]] = {}
    kinds = {"NTXentLoss": {"temperature": 0.2}, "DCLLoss": {"temperature": 0.1}, "DCLWLoss": {"temperature": 0.3},
             "NTXentLoss-negative": {"temperature": -0.4}}
    for kind, options in kinds.items():
        found = []
        for module in (peer, compat):
            out0, out1 = (x.clone().requires_grad_() for x in views(seed, rank, b, d))
            loss = getattr(module, kind.split("-")[0])(gather_distributed=True, **options)(out0, out1)
            loss.backward()
            found.append((loss.detach(), out0.grad, out1.grad))
        results[kind] = [found[0][0], found[1][0], found[0][1], found[0][2], found[1][1], found[1][2]]
    banks = []
    for module in (peer, compat):
        torch.manual_seed(seed)  # the same bank drawn on every rank, by both
        criterion = getattr(module, "NTXentLoss")(memory_bank_size=(5 * b, d), gather_distributed=True)
        values = []
        for step in range(3):
            out0, out1 = (x.float().requires_grad_() for x in views(seed + step, rank, b, d))
            values.append(criterion(out0, out1).detach())
        bank = criterion.memory_bank.bank if hasattr(criterion, "memory_bank") else criterion.bank
        banks.append((torch.stack(values), bank.clone()))
    results["bank"] = [banks[0][0], banks[1][0], banks[0][1], banks[1][1]]
    return results
