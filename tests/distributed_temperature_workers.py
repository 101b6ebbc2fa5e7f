"""Worker functions for the multi-process tests of per-anchor temperatures (gloo, float64).

Each rank's temperatures come from a small head on its own embeddings (``tau_i = 0.1 +
softplus(w . z_i)``, as a temperature network does), in the order of the anchors the loss
returns; the test process computes the same losses on the concatenated batch in one process.
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from contrastkit import losses as L

from distributed_workers import MODES, Encoder, _average, batches
from loss_catalog import cases

TILE = 3


class AnchorTemperatures(torch.nn.Module):
    """An encoder (:class:`distributed_workers.Encoder`) and a per-row temperature head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        torch.manual_seed(1)
        self.head = torch.nn.Linear(4, 1).double()

    def tau(self, z: torch.Tensor) -> torch.Tensor:
        return 0.1 + F.softplus(self.head(F.normalize(z, dim=1))).squeeze(1)

    def forward(self, x_a, x_b):
        z_a, z_b, _ = self.encoder(x_a, x_b)
        return z_a, z_b


def _views_tau(m, a, b):
    return m.tau(torch.cat([a, b]))


def _sample_major_tau(m, a, b):
    return m.tau(torch.stack([a, b], dim=1).reshape(-1, a.shape[1]))


# name -> (loss(z_a, z_b, labels, tau, **options), tau(model, z_a, z_b))
LOSSES: Dict[str, tuple] = {
    "nt_xent_views": (lambda a, b, y, t, **kw: L.nt_xent_views(a, b, temperature=t, **kw), _views_tau),
    "dcl": (lambda a, b, y, t, **kw: L.dcl(a, b, temperature=t, **kw), _views_tau),
    "info_nce": (lambda a, b, y, t, **kw: L.info_nce(a, b, temperature=t, **kw), lambda m, a, b: m.tau(a)),
    "bidirectional_info_nce": (lambda a, b, y, t, **kw: L.bidirectional_info_nce(a, b, temperature=t, weight=0.3,
                                                                                   **kw), _views_tau),
    "supcon_views": (lambda a, b, y, t, **kw: L.supcon(torch.stack([a, b], dim=1), y, temperature=t, **kw),
                     _sample_major_tau),
    "supcon_in_views": (lambda a, b, y, t, **kw: L.supcon(torch.stack([a, b], dim=1), y, temperature=t,
                                                          variant="in", **kw), _sample_major_tau),
    "hard_negative": (lambda a, b, y, t, **kw: L.hard_negative_nt_xent(a, b, temperature=t, top_k=3, **kw),
                      _views_tau),
    "hcl": (lambda a, b, y, t, **kw: L.hcl(a, b, temperature=t, tau_plus=0.1, beta=0.5, **kw), _views_tau),
    "sigmoid": (lambda a, b, y, t, **kw: L.sigmoid_loss(a, b, t, -1.0, **{k: v for k, v in kw.items()
                                                                           if k != "distributed_mode"}),
                lambda m, a, b: m.tau(a)),
}
for _name in list(LOSSES):
    _loss, _tau = LOSSES[_name]
    LOSSES[_name + "_tiled"] = ((lambda loss: lambda a, b, y, t, **kw: loss(a, b, y, t, chunk_size=TILE, **kw))(_loss),
                                _tau)
#: SupCon L_out has no ring: tiled + local raises (tested elsewhere), so it is not run.
SKIP = {("supcon_views_tiled", "local")}


def dense_name(name: str) -> str:
    return name[:-len("_tiled")] if name.endswith("_tiled") else name


def loss_and_grads(model: AnchorTemperatures, name: str, data, reduction: str, **options):
    """The loss (detached), the per-anchor temperatures used, and every parameter's gradient."""
    model.zero_grad()
    z_a, z_b = model(data[0], data[1])
    loss_fn, tau_fn = LOSSES[name]
    tau = tau_fn(model, z_a, z_b)
    loss = loss_fn(z_a, z_b, data[2], tau, reduction=reduction, **options)
    if reduction == "none":
        return loss.detach(), {}
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def suite_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str]):
    data = batches(seed, sizes)[rank]
    model = AnchorTemperatures()
    results = {}
    for name in LOSSES:
        for mode in MODES:
            if (name, mode) in SKIP:
                continue
            for reduction in reductions:
                value, grads = loss_and_grads(model, name, data, reduction, distributed=True, distributed_mode=mode)
                results[(name, mode, reduction)] = (value, _average(grads))
    return results


# --------------------------------------------------------------------------- temperature methods

# The catalogued losses whose temperatures are their own settings (MACL's tau_0, dual's two) and
# that have a distributed path, with the catalog's settings; on the encoder's two views.
ADAPTIVE = cases(temperature="settings", distributed=True)
assert all(case.inputs == "views" and case.tiled for case in ADAPTIVE.values())
STATEFUL_STEPS = 3


def adaptive_losses(model: Encoder, name: str, data, reduction: str, **options):
    model.zero_grad()
    z_a, z_b, _ = model(data[0], data[1])
    loss = ADAPTIVE[name]((z_a, z_b), None, reduction=reduction, **options)
    if reduction == "none":
        return loss.detach(), {}
    loss.backward()
    return loss.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def stateful_module(kind: str, samples: int):
    torch.manual_seed(3)
    if kind == "individual":
        return L.IndividualTemperatureLoss(samples, 0.2, eta=0.5)
    return L.TemperatureNetworkLoss(4, samples, prototypes=6).double()


def stateful_batch(seed: int, step: int, sizes: Sequence[int], rank=None):
    """Step ``step``'s rows and their sample indices (of 20 samples), split over ranks by ``sizes``."""
    data = batches(seed + 100 * step, sizes)
    g = torch.Generator().manual_seed(seed + step)
    indices = torch.randperm(20, generator=g)[:sum(sizes)]
    bounds = [sum(sizes[:r]) for r in range(len(sizes) + 1)]
    if rank is None:
        return (torch.cat([d[0] for d in data]), torch.cat([d[1] for d in data])), indices
    return data[rank][:2], indices[bounds[rank]:bounds[rank + 1]]


def stateful_training(kind: str, seed: int, sizes: Sequence[int], rank=None):
    """SGD on an encoder with a temperature method keeping per-sample state; with ``rank``, this
    rank's share of every batch (gradients averaged over ranks); without, the whole batch."""
    model, module = Encoder(), stateful_module(kind, 20)
    optimizer = torch.optim.SGD(list(model.parameters()) + list(module.parameters()), lr=0.3)
    options = {} if rank is None else {"distributed": True, "distributed_mode": "local"}
    for step in range(STATEFUL_STEPS):
        (x_a, x_b), indices = stateful_batch(seed, step, sizes, rank)
        optimizer.zero_grad()
        z_a, z_b, _ = model(x_a, x_b)
        module(z_a, z_b, indices, chunk_size=TILE, **options).backward()
        if rank is not None:
            _average({k: p.grad for k, p in list(model.named_parameters()) + list(module.named_parameters())
                      if p.grad is not None})
        optimizer.step()
        module.step_()
    return {**{f"state.{k}": v.clone() for k, v in module.state_dict().items()},
            **{f"encoder.{k}": p.detach().clone() for k, p in model.named_parameters()}}


def adaptive_worker(rank: int, world: int, seed: int, sizes: Sequence[int], reductions: Sequence[str]):
    data = batches(seed, sizes)[rank]
    model = Encoder()
    results = {}
    for name in ADAPTIVE:
        for mode in MODES:
            for chunk in (None, TILE):
                for reduction in reductions:
                    value, grads = adaptive_losses(model, name, data, reduction, distributed=True,
                                                   distributed_mode=mode, chunk_size=chunk)
                    results[(name, mode, chunk, reduction)] = (value, _average(grads))
    for kind in ("individual", "network"):
        results[kind] = stateful_training(kind, seed, sizes, rank)
    return results


def pretrain_worker(rank: int, world: int, options: dict, straight: str, interrupted: str):
    """:func:`distributed_workers.pretrain_worker` without the read-out's baselines (rank 0
    evaluates alone after training while the other ranks wait at a barrier)."""
    from contrastkit.train import PretrainConfig, pretrain

    from distributed_workers import StopAfterFirstEpoch, _stop_after_first_epoch

    results = {"straight": pretrain(PretrainConfig(out=straight, **options), progress=False, baselines=False)}
    try:
        pretrain(PretrainConfig(out=interrupted, **options), progress=False, baselines=False,
                 on_epoch_end=_stop_after_first_epoch)
        results["stopped"] = False
    except StopAfterFirstEpoch:
        results["stopped"] = True
    results["resumed"] = pretrain(PretrainConfig(out=interrupted, **options), resume=True, progress=False,
                                  baselines=False)
    return results
