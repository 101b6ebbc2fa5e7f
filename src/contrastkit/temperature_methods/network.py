"""TempNet (Qiu et al., ICML 2024): ``network[:INITIAL[,RHO[,TAU_MIN,TAU_MAX]]]``, a head on the
embedding predicts each anchor's temperature within ``[TAU_MIN, TAU_MAX]``
(:class:`~contrastkit.losses.TemperatureNetworkLoss`; per-sample state). Its rows' view is the
robust objective's optimum, as for ``individual`` (what the network predicts for a real
embedding depends on its training)."""

from __future__ import annotations

from contrastkit.losses import TemperatureNetworkLoss

from .individual import ROBUST_COUNTS, ROBUST_OPTIONS, explain_robust
from .registry import TemperatureMethodSpec, register_temperature_method

NETWORK = register_temperature_method(TemperatureMethodSpec(
    name="network", loss=TemperatureNetworkLoss, title="TempNet", label="TempNet (network)", citation="Qiu et al., ICML 2024",
    summary="a network predicts each anchor's tau, trained on the robust objective",
    options=ROBUST_OPTIONS, counts=ROBUST_COUNTS, explain=explain_robust,
    claim="A temperature network (TempNet, Qiu et al., ICML 2024) beats the best fixed tau",
))

__all__ = ["NETWORK"]
