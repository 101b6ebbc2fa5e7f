"""Metrics of learned representations (pure torch, chunked so large evaluation sets fit in memory).

See :mod:`contrastkit.metrics.representation`.
"""

from contrastkit.metrics.representation import (
    SimilarityProfile,
    alignment,
    effective_rank,
    penalty_entropy,
    representation_metrics,
    similarity_profile,
    tolerance,
    uniformity,
)

__all__ = [
    "alignment",
    "uniformity",
    "tolerance",
    "similarity_profile",
    "SimilarityProfile",
    "penalty_entropy",
    "effective_rank",
    "representation_metrics",
]
