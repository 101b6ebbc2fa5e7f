"""iSogCLR's individual temperatures (Qiu et al., ICML 2023):
``individual[:INITIAL[,RHO[,TAU_MIN,TAU_MAX]]]``, one learnt temperature per training sample
(:class:`~contrastkit.losses.IndividualTemperatureLoss`; per-sample state)."""

from __future__ import annotations

from typing import Mapping, Tuple

import numpy as np

from contrastkit.losses import IndividualTemperatureLoss

from .registry import MethodRows, TemperatureMethodSpec, register_temperature_method


def explain_robust(rows: MethodRows, settings: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The robust objective ``F_i = tau_i log E_j exp((s_ij - s_+) / tau_i) + tau_i rho`` at the
    temperature that minimises it for each row (its penalty ``rho`` nats from uniform, clipped to
    ``[tau_min, tau_max]``): weight ``tau_i``, ``dF/ds_j = q_j``, ``dF/ds_+ = -1``.

    Why that temperature: ``dF/dtau = rho - KL(q || uniform)`` with ``q`` the penalty
    distribution over the negatives, so the optimum's penalty has entropy ``log M - rho``
    (``M e^-rho`` effective negatives). The gradient takes the moving estimate equal to the
    batch's. iSogCLR's learnt temperatures move towards this value; TempNet is trained towards
    it and predicts it from the embedding (what it predicts for a real embedding depends on the
    network, so the row's view is the objective's optimum)."""
    taus = rows.robust_temperature(settings["rho"], settings["tau_min"], settings["tau_max"])
    softmax = rows.softmax(taus)
    gradients = softmax.penalty.copy()
    gradients[np.arange(rows.n), softmax.positive] = -1.0
    return taus, taus.copy(), gradients


#: The form's values of the two methods on the robust objective, and how many a form may give
#: (the bounds come together).
ROBUST_OPTIONS, ROBUST_COUNTS = ("initial", "rho", "tau_min", "tau_max"), (0, 1, 2, 4)

INDIVIDUAL = register_temperature_method(TemperatureMethodSpec(
    name="individual", loss=IndividualTemperatureLoss, title="iSogCLR", label="iSogCLR (individual)",
    citation="Qiu et al., ICML 2023", summary="each sample's tau minimises the robust objective",
    options=ROBUST_OPTIONS, counts=ROBUST_COUNTS, explain=explain_robust,
    claim="Individual temperatures learnt by iSogCLR (Qiu et al., ICML 2023) beat the best fixed tau",
))

__all__ = ["INDIVIDUAL", "explain_robust", "ROBUST_OPTIONS", "ROBUST_COUNTS"]
