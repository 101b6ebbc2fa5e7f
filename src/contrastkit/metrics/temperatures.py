"""The distribution of the temperatures a run's anchors used: one histogram per epoch.

A temperature method (:mod:`contrastkit.losses.adaptive`) gives every anchor of every step its
own ``tau``; :class:`TemperatureHistogram` counts them over an epoch in fixed log-spaced bins
(:data:`TAU_EDGES`, ``10^-2`` to ``10^1``: every temperature a run may use), on the device,
without reading anything back until the epoch's record is written. The trainer writes one
``{"kind": "tau_histogram", ...}`` record per epoch to ``metrics.jsonl``; the run report draws
them (:func:`contrastkit.report.figures.tau_histogram_figure`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from contrastkit import records

__all__ = ["TAU_BINS", "TAU_EDGES", "TemperatureHistogram"]

#: Log-spaced bins: 12 per decade from 0.01 to 10 (a temperature outside counts in the end bin).
TAU_BINS = 36
TAU_EDGES: List[float] = [10 ** (-2 + 3 * k / TAU_BINS) for k in range(TAU_BINS + 1)]


class TemperatureHistogram:
    """Counts of per-anchor temperatures (:meth:`add` each step's), their sum, minimum and
    maximum, kept on ``device``; :meth:`record` gives the epoch's record and starts afresh.

    Example:
        >>> h = TemperatureHistogram()
        >>> h.add(torch.tensor([0.1, 0.1, 0.5]))
        >>> r = h.record(epoch=1)
        >>> r["anchors"], round(r["mean"], 4), sum(r["counts"])
        (3, 0.2333, 3)
    """

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._reset()

    def _reset(self) -> None:
        self.counts = torch.zeros(TAU_BINS, dtype=torch.float64, device=self.device)
        self.stats = torch.tensor([0.0, 0.0, float("inf"), float("-inf")], dtype=torch.float64, device=self.device)

    def add(self, temperatures: Tensor) -> None:
        """Count one step's temperatures ``(A,)`` (positive; no host synchronisation)."""
        taus = temperatures.detach().to(device=self.device, dtype=torch.float64).reshape(-1)
        logs = taus.log10().clamp(-2.0, 1.0)
        bins = ((logs + 2.0) * (TAU_BINS / 3.0)).floor().long().clamp(0, TAU_BINS - 1)
        self.counts.index_add_(0, bins, torch.ones_like(taus))
        self.stats += torch.stack([taus.new_tensor(float(taus.numel())), taus.sum(), taus.new_zeros(()),
                                   taus.new_zeros(())])
        self.stats[2] = torch.minimum(self.stats[2], taus.min())
        self.stats[3] = torch.maximum(self.stats[3], taus.max())

    def merged(self, reduce: Any) -> None:
        """Combine with the other ranks: ``reduce(tensor, op)`` with ``op`` ``"sum"``, ``"min"``
        or ``"max"`` returns every rank's combination (the trainer's collective)."""
        self.counts = reduce(self.counts, "sum")
        self.stats = torch.stack([reduce(self.stats[0], "sum"), reduce(self.stats[1], "sum"),
                                  reduce(self.stats[2], "min"), reduce(self.stats[3], "max")])

    def record(self, epoch: int, step: Optional[int] = None) -> Dict[str, Any]:
        """The epoch's ``tau_histogram`` record (read back once; ``step``: the run's step at
        its end), and a fresh histogram."""
        counts = [int(round(c)) for c in self.counts.tolist()]
        anchors, total, low, high = self.stats.tolist()
        self._reset()
        record: Dict[str, Any] = records.metrics_record(records.TAU_HISTOGRAM, epoch=int(epoch), edges=list(TAU_EDGES),
                                                         counts=counts, anchors=int(round(anchors)))
        if step is not None:
            record["step"] = int(step)
        if anchors:
            record.update(mean=total / anchors, min=low, max=high)
        return record
