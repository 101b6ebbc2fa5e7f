"""A toy temperature method in one file, as a plug-in writes one: its loss and its registration.

``toy[:TEMPERATURE[,GROWTH]]``: NT-Xent at a temperature per training sample that starts at
``temperature`` and grows by the factor ``growth`` each time the sample's step ends (per-sample
state, so its steps need the batch's sample indices).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from contrastkit.losses import AdaptiveTemperatureLoss, nt_xent_views
from contrastkit.temperature_methods import MethodRows, TemperatureMethodSpec, register_temperature_method


class ToyTemperatureLoss(AdaptiveTemperatureLoss):
    """NT-Xent with a temperature per training sample (a buffer ``tau`` ``(num_samples,)``),
    multiplied by ``growth`` by :meth:`step_` for the samples of the last training batch."""

    needs_indices = True

    def __init__(self, num_samples: int, temperature: float = 0.3, growth: float = 1.1) -> None:
        super().__init__()
        if not temperature > 0 or not growth > 0:
            raise ValueError(f"temperature and growth must be positive, got {temperature}, {growth}")
        self.temperature, self.growth = float(temperature), float(growth)
        self.register_buffer("tau", torch.full((num_samples,), self.temperature))
        self.register_buffer("steps", torch.zeros(num_samples, dtype=torch.long))
        self._pending: Optional[Tensor] = None

    @property
    def initial_value(self) -> float:
        return self.temperature

    def forward(self, z_a: Tensor, z_b: Tensor, indices: Optional[Tensor] = None, **options: Any) -> Tensor:
        if indices is None:
            raise ValueError("ToyTemperatureLoss keeps one temperature per sample: pass indices=")
        tau = self.tau[indices].to(z_a.device)
        taus = torch.cat([tau, tau])
        self._remember(taus, taus.shape[0], z_a)
        self._pending = indices if self.training and torch.is_grad_enabled() else None
        return nt_xent_views(z_a, z_b, temperature=taus, **options)

    @torch.no_grad()
    def step_(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.tau[pending] *= self.growth
            self.steps[pending] += 1


def explain(rows: MethodRows, settings: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """InfoNCE at the starting temperature (a sample not trained yet)."""
    taus = np.full(rows.n, settings["temperature"])
    return taus, np.ones(rows.n), rows.softmax(taus).gradients


TOY = TemperatureMethodSpec(
    name="toy", loss=ToyTemperatureLoss, title="Toy", citation="a test of contrastkit",
    summary="tau grows by a factor each time its sample trains", options=("temperature", "growth"),
    explain=explain)

register_temperature_method(TOY)
