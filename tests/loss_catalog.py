"""One catalog of the public losses of :mod:`contrastkit.losses`, which every loss test draws from.

Each :class:`LossCase` says how to call one loss in one setting (a function and its options):
which tensors it takes (made here, seeded, for any ``N``, ``D``, dtype and device), how it
takes its temperature, whether it has a tiled path (``chunk_size``) and a distributed path,
which float64 loop reference of ``tests/reference.py`` it is checked against, its module twin,
and which inputs carry gradients. A loss added to ``contrastkit.losses.__all__`` and not here
fails ``tests/losses/test_loss_catalog.py``; a test that keeps its own per-loss data (a
tolerance, a hand-written reference) keys it by catalog name and fails on a name it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch

from contrastkit import losses as L

#: What in ``contrastkit.losses.__all__`` is not a loss, and why (each name must still exist).
NOT_LOSSES: Dict[str, str] = {
    "views_positive_index": "a helper: the +/- N positive map of two stacked views",
    "value_checks": "a context manager switching the input value checks",
    "macl_temperature": "MACL's temperature formula (a number from the alignment), not a loss",
    "Temperature": "the temperature module a loss is given, not a loss",
    "MIN_TEMPERATURE": "a constant: the temperature floor",
    "SIGLIP_TEMPERATURE": "a constant: SigLIP's initial temperature",
    "SIGLIP_BIAS": "a constant: SigLIP's initial bias",
    "RobustLoss": "the named tuple robust_nt_xent returns, not a loss",
    "AdaptiveTemperatureLoss": "the abstract base of the temperature methods (its forward is not implemented)",
}

#: The kinds of inputs (``LossCase.inputs``) and the tensors each makes.
INPUT_KINDS = {
    "views": "two views (N, D): z_a and a noisy copy z_b",
    "bank": "query, positive (N, D) and a shared bank of N negatives (N, D)",
    "paired": "query, positive (N, D) and 4 negatives per query (N, 4, D)",
    "stacked": "the 2N stacked views (2N, D) and their +/- N positive map",
    "labels": "the 2N stacked views (2N, D) and class labels (each row's other view shares its label)",
    "similarities": "similarities (N, N) of the two views and the boolean positive mask (the diagonal)",
    "square": "similarities (2N, 2N) of the stacked views and their +/- N positive map",
}


@dataclass(frozen=True)
class LossCase:
    """One public loss in one setting, and how to call it."""

    name: str  # the function's name, or function[setting] for a second setting of it
    function: Callable
    inputs: str  # a key of INPUT_KINDS
    options: Mapping = field(default_factory=dict)  # keyword options besides temperature and per-call ones
    #: "learnable": takes ``temperature=`` as a number or a tensor (scalar or one per anchor) with
    #: its gradient; "settings": its temperatures are numbers among ``options``; "none": has none.
    temperature: str = "learnable"
    tiled: bool = True  # takes chunk_size= (a memory-linear path)
    distributed: bool = True  # takes distributed= (global negatives across processes)
    reference: Optional[str] = None  # the float64 loop reference's name in tests/reference.py
    twin: Optional[str] = None  # its nn.Module in contrastkit.losses
    #: "twin": same options as the function, tested by test_losses_modules; "method": a temperature
    #: method (AdaptiveTemperatureLoss) holding its own temperature settings or state.
    twin_kind: str = "twin"
    anchors: int = 2  # anchor rows per pair: the length of a per-anchor temperature is anchors * N
    grads: Tuple[int, ...] = (0, 1)  # the inputs (by position) that carry gradients
    per_anchor: bool = True  # takes one temperature per anchor row (False: only one for all)
    result: Callable = staticmethod(lambda out: out)  # the loss tensor from what the function returns
    #: Why its gradient is by design not the derivative of its value (a stop-gradient weight), so
    #: that gradcheck does not apply to it; None for the losses whose gradient is their value's.
    stop_gradient: Optional[str] = None

    def tensors(self, n: int, d: int, dtype=torch.float64, device="cpu", seed: int = 0,
                noise: float = 0.5) -> Tuple[torch.Tensor, ...]:
        """Its inputs for ``n`` pairs of ``d``-dimensional embeddings: drawn in float64 on the
        CPU from ``seed`` (the same numbers on every device), then cast to ``dtype`` on ``device``."""
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(n, d, generator=g, dtype=torch.float64)
        b = a + noise * torch.randn(n, d, generator=g, dtype=torch.float64)  # correlated views: a realistic loss
        made = _MAKERS[self.inputs](a, b, g)
        return tuple(t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in made)

    def __call__(self, tensors, temperature=None, **options) -> torch.Tensor:
        """The loss of ``tensors`` at ``temperature`` (ignored unless learnable), with the case's
        options and ``options`` (chunk_size, reduction, distributed, ...)."""
        kwargs = {**self.options, **options}
        if self.temperature == "learnable":
            kwargs["temperature"] = temperature
        return self.result(self.function(*tensors, **kwargs))

    @property
    def function_name(self) -> str:
        return self.function.__name__


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


_MAKERS: Dict[str, Callable] = {
    "views": lambda a, b, g: (a, b),
    "bank": lambda a, b, g: (a, b, torch.randn(a.shape, generator=g, dtype=a.dtype)),
    "paired": lambda a, b, g: (a, b, torch.randn(a.shape[0], 4, a.shape[1], generator=g, dtype=a.dtype)),
    "stacked": lambda a, b, g: (torch.cat([a, b]), L.views_positive_index(a.shape[0])),
    "labels": lambda a, b, g: (torch.cat([a, b]), torch.arange(a.shape[0]).repeat(2) % max(2, a.shape[0] // 4)),
    "similarities": lambda a, b, g: (_unit(a) @ _unit(b).T, torch.eye(a.shape[0], dtype=torch.bool)),
    "square": lambda a, b, g: ((lambda z: z @ z.T)(_unit(torch.cat([a, b]))), L.views_positive_index(a.shape[0])),
}

_CASES = [
    LossCase("contrastive_loss", L.contrastive_loss, "similarities", tiled=False, distributed=False,
             twin="ContrastiveLoss", anchors=1, grads=(0,)),
    LossCase("similarity_loss", L.similarity_loss, "square", {"exclude_diagonal": True}, tiled=False,
             distributed=False, reference="similarity", twin="SimilarityLoss", grads=(0,)),
    LossCase("info_nce", L.info_nce, "views", reference="info_nce", twin="InfoNCE", anchors=1),
    # A bank of negatives is refused with distributed= (a bank is shared across ranks by KeyQueue).
    LossCase("info_nce[bank]", L.info_nce, "bank", distributed=False, reference="info_nce", anchors=1,
             grads=(0, 1, 2)),
    # Paired negatives: one bank per query, no tiled and no distributed path.
    LossCase("info_nce[paired]", L.info_nce, "paired", {"negative_mode": "paired"}, tiled=False,
             distributed=False, reference="info_nce", anchors=1, grads=(0, 1, 2)),
    LossCase("nt_xent", L.nt_xent, "stacked", distributed=False, reference="nt_xent", twin="NTXent", grads=(0,)),
    LossCase("nt_xent_views", L.nt_xent_views, "views", reference="nt_xent", twin="NTXentViews"),
    LossCase("bidirectional_info_nce", L.bidirectional_info_nce, "views", {"weight": 0.75},
             reference="bidirectional", twin="BidirectionalInfoNCE"),
    LossCase("supcon", L.supcon, "labels", reference="supcon", twin="SupCon", anchors=2, grads=(0,)),
    LossCase("supcon[in]", L.supcon, "labels", {"variant": "in"}, reference="supcon", grads=(0,)),
    LossCase("dcl", L.dcl, "views", reference="dcl", twin="DCL"),
    LossCase("simple_loss", L.simple_loss, "views", {"negative_weight": 0.7}, temperature="none",
             reference="simple", twin="SimpleLoss", per_anchor=False),
    LossCase("hard_negative_nt_xent", L.hard_negative_nt_xent, "views", {"top_k": 3}, reference="hard_negative",
             twin="HardNegativeNTXent"),
    LossCase("hard_negative_nt_xent[quantile]", L.hard_negative_nt_xent, "views", {"quantile": 0.75},
             reference="hard_negative"),
    LossCase("debiased_nt_xent", L.debiased_nt_xent, "views", {"tau_plus": 0.1}, reference="debiased",
             twin="DebiasedNTXent"),
    LossCase("hcl", L.hcl, "views", {"tau_plus": 0.1, "beta": 1.5}, reference="debiased", twin="HCL"),
    LossCase("sigmoid_loss", L.sigmoid_loss, "views", {"bias": -2.0}, reference="sigmoid", twin="SigmoidLoss",
             anchors=1),
    LossCase("macl_nt_xent", L.macl_nt_xent, "views", {"temperature": 0.2, "alpha": 0.5, "threshold": 0.1},
             temperature="settings", reference="macl", twin="MACLNTXentLoss", twin_kind="method", per_anchor=False,
             stop_gradient="MACL's weight sg[1 / (1 - P_i)] of each anchor's loss carries no gradient"),
    LossCase("dual_temperature_nt_xent", L.dual_temperature_nt_xent, "views",
             {"intra_temperature": 0.2, "inter_temperature": 0.7}, temperature="settings", reference="dual",
             twin="DualTemperatureNTXentLoss", twin_kind="method", per_anchor=False,
             stop_gradient="its weight sg[(1 - P_i(tau_beta)) / (1 - P_i(tau_alpha))] carries no gradient"),
    # iSogCLR's objective with one temperature per anchor; without moving estimates (log_u None)
    # its gradient is the objective's own. Its methods learn those temperatures per sample.
    LossCase("robust_nt_xent", L.robust_nt_xent, "views", {"rho": 0.3}, reference="robust",
             twin="IndividualTemperatureLoss", twin_kind="method", result=lambda out: out.loss),
]
#: The twins beyond one per case: TempNet predicts the same loss's temperatures with a network.
EXTRA_TWINS = {"TemperatureNetworkLoss": "robust_nt_xent"}

CATALOG: Dict[str, LossCase] = {case.name: case for case in _CASES}
assert len(CATALOG) == len(_CASES), "catalog names must be unique"


def cases(**wanted) -> Dict[str, LossCase]:
    """The catalog's cases whose fields have the given values, e.g. ``cases(tiled=True)``."""
    return {name: case for name, case in CATALOG.items()
            if all(getattr(case, key) == value for key, value in wanted.items())}


def twins(kind: Optional[str] = None) -> Dict[str, LossCase]:
    """Module twin name -> its function's case (the first case of that function)."""
    found = {case.twin: case for case in _CASES if case.twin and kind in (None, case.twin_kind)}
    if kind in (None, "method"):
        found.update({twin: CATALOG[name] for twin, name in EXTRA_TWINS.items()})
    return found


def is_loss(value) -> bool:
    """A public loss: a function, or an nn.Module class (constants and tuples are not)."""
    if isinstance(value, type):
        return issubclass(value, torch.nn.Module)
    return callable(value)


def missing_from_catalog(namespace) -> Dict[str, object]:
    """The public losses of ``namespace`` (its ``__all__``) that are neither in the catalog
    (as a case's function or twin) nor listed in :data:`NOT_LOSSES`."""
    covered = {case.function_name for case in _CASES} | set(twins()) | set(NOT_LOSSES)
    return {name: getattr(namespace, name) for name in namespace.__all__
            if name not in covered and is_loss(getattr(namespace, name))}
