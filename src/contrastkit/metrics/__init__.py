"""Metrics on frozen features (pure functions).

* Read-out: linear probe and weighted kNN (:mod:`contrastkit.metrics.probe`; torch, float32).
* Representation geometry: alignment, uniformity, tolerance, positive vs nearest-negative
  similarity, penalty entropy, effective rank (:mod:`contrastkit.metrics.representation`;
  pure torch, chunked so large evaluation sets fit in memory).
* The read-out protocol of an encoder on a labelled data set, with its raw-pixel and
  random-init baselines (:mod:`contrastkit.metrics.readout`).
* A training batch's diagnostics: each anchor's ``p+`` and effective number of negatives, the
  similarities of its positive and negatives, and the failures they show
  (:mod:`contrastkit.metrics.batch`; the trainer records them at every logged step).
* The distribution of the per-anchor temperatures of a temperature method, one histogram per
  epoch (:mod:`contrastkit.metrics.temperatures`).
"""

from .batch import DIAGNOSTICS, WARNINGS, BatchProblem, batch_diagnostics, batch_warnings
from .probe import (DEFAULT_C_GRID, PROBE_TOLERANCE, ProbeCapWarning, ProbeResult, knn_accuracy, knn_predict, linear_probe,
                    probe_evaluation_cap, probe_settings)
from .representation import (
    SimilarityProfile,
    alignment,
    effective_rank,
    penalty_entropy,
    representation_metrics,
    similarity_profile,
    tolerance,
    uniformity,
)
from .temperatures import TAU_EDGES, TemperatureHistogram
from .readout import (RAW_PIXEL_SIDE, BaselineStore, baseline_pixel_images, evaluate_encoders, evaluate_features,
                      extract_features, pixel_features)

__all__ = [
    "DEFAULT_C_GRID", "PROBE_TOLERANCE", "ProbeCapWarning", "ProbeResult", "knn_accuracy", "knn_predict", "linear_probe",
    "probe_evaluation_cap", "probe_settings",
    "alignment", "uniformity", "tolerance", "similarity_profile", "SimilarityProfile",
    "penalty_entropy", "effective_rank", "representation_metrics",
    "extract_features", "pixel_features", "baseline_pixel_images", "RAW_PIXEL_SIDE", "evaluate_features",
    "evaluate_encoders", "BaselineStore",
    "BatchProblem", "batch_diagnostics", "batch_warnings", "DIAGNOSTICS", "WARNINGS",
    "TemperatureHistogram", "TAU_EDGES",
]
