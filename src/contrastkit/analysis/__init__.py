"""Analysis tools: what the contrastive loss does with given similarities and temperatures.

:func:`explain` and :func:`sweep` compute probabilities, gradients, the relative penalty over
negatives and the temperature limits; :func:`plot_temperature` draws them (needs matplotlib).
"""

from .explanation import Explanation, Sweep, explain, sweep
from .plots import plot_temperature

__all__ = ["Explanation", "Sweep", "explain", "sweep", "plot_temperature"]
