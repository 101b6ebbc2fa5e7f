"""Analysis tools: what the contrastive loss does with given similarities and temperatures.

:func:`explain` and :func:`sweep` compute probabilities, gradients, the relative penalty over
negatives and the temperature limits; :func:`plot_temperature` draws them (needs matplotlib).
:func:`explain_sigmoid` does the same for the sigmoid (SigLIP) loss, next to the softmax view;
:func:`explain_methods` shows what each temperature method (MACL, dual temperature, iSogCLR,
TempNet) does to the same rows next to a fixed tau.
"""

from .explanation import Explanation, Sweep, explain, sweep
from .methods import MethodComparison, MethodView, explain_methods, robust_temperature
from .plots import plot_temperature
from .sigmoid import SigmoidExplanation, explain_sigmoid

__all__ = ["Explanation", "Sweep", "explain", "sweep", "plot_temperature", "SigmoidExplanation",
           "explain_sigmoid", "MethodComparison", "MethodView", "explain_methods", "robust_temperature"]
