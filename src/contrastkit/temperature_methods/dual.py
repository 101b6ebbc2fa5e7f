"""Dual temperature (Zhang et al., CVPR 2022): ``dual[:INTRA_TEMPERATURE,INTER_TEMPERATURE]``,
``tau_alpha`` within an anchor, ``tau_beta`` across anchors
(:class:`~contrastkit.losses.DualTemperatureNTXentLoss`)."""

from __future__ import annotations

from typing import Mapping, Tuple

import numpy as np

from contrastkit.losses import DualTemperatureNTXentLoss

from .registry import MethodRows, TemperatureMethodSpec, register_temperature_method


def explain(rows: MethodRows, settings: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The softmax (and the penalty over negatives) at ``tau_alpha``, the gradient times
    ``w_i = (1 - P_i(tau_beta)) / (1 - P_i(tau_alpha))``: the positive is pulled by
    ``(1 - P_i(tau_beta)) / tau_alpha``."""
    taus = np.full(rows.n, settings["intra_temperature"])
    softmax = rows.softmax(taus)
    inter = rows.softmax(settings["inter_temperature"])
    weights = rows.negative_mass(inter) / rows.negative_mass(softmax)
    return taus, weights, weights[:, None] * softmax.gradients


DUAL = register_temperature_method(TemperatureMethodSpec(
    name="dual", loss=DualTemperatureNTXentLoss, title="dual temperature", citation="Zhang et al., CVPR 2022",
    summary="tau_alpha within an anchor, tau_beta across anchors",
    options=("intra_temperature", "inter_temperature"), counts=(0, 2), explain=explain,
    claim="A dual temperature (Zhang et al., CVPR 2022) beats the best fixed tau",
))

__all__ = ["DUAL"]
