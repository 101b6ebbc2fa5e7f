"""Read-out metrics on frozen features: linear probe and weighted kNN (pure functions).

scikit-learn is imported lazily inside the functions that need it.
"""

from .probe import DEFAULT_C_GRID, ProbeResult, knn_accuracy, knn_predict, linear_probe

__all__ = ["DEFAULT_C_GRID", "ProbeResult", "knn_accuracy", "knn_predict", "linear_probe"]
