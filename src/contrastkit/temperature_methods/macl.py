"""MACL (Huang et al., ICML 2023): ``macl[:TEMPERATURE[,ALPHA[,THRESHOLD]]]``, the temperature
follows the positives' alignment, ``tau_A = tau_0 (1 + alpha (A - A_0))``, with MACL's
reweighting (:class:`~contrastkit.losses.MACLNTXentLoss`)."""

from __future__ import annotations

from typing import Mapping, Tuple

import numpy as np

from contrastkit.losses import MACLNTXentLoss

from .registry import MethodRows, TemperatureMethodSpec, register_temperature_method


def explain(rows: MethodRows, settings: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``tau_A`` at the rows' alignment for every anchor; the gradient at ``tau_A`` times
    ``w_i = 1 / (1 - P_i)``, so every positive is pulled by exactly ``1 / tau_A``."""
    alignment = rows.alignment
    value = settings["temperature"] * (1.0 + settings["alpha"] * (alignment - settings["threshold"]))
    if not value > 0:
        raise ValueError(f"MACL's temperature tau_0 (1 + alpha (A - A_0)) is {value} at the alignment "
                         f"A = {alignment} of these rows: not positive")
    taus = np.full(rows.n, value)
    softmax = rows.softmax(taus)
    weights = 1.0 / rows.negative_mass(softmax)
    return taus, weights, weights[:, None] * softmax.gradients


MACL = register_temperature_method(TemperatureMethodSpec(
    name="macl", loss=MACLNTXentLoss, title="MACL", citation="Huang et al., ICML 2023",
    summary="tau follows the positives' alignment, gradients reweighted by 1/(1 - P)",
    options=("temperature", "alpha", "threshold"), explain=explain,
    claim="MACL's model-aware temperature (Huang et al., ICML 2023) beats the best fixed tau",
))

__all__ = ["MACL"]
