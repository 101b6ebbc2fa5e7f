"""The fixed read-out protocol on frozen features.

* Linear probe: features standardised with train statistics, a multinomial logistic
  regression (mean cross-entropy plus ``||W||^2 / (2 C n)``, intercept not penalised, as
  scikit-learn's ``LogisticRegression``) fitted on train for the ``C`` of a grid, walked from
  the smallest ``C`` (each fit warm-started from the previous one) until val accuracy has
  fallen twice in a row; the ``C`` with the best val accuracy (the smallest such ``C`` on
  ties) is reported with its test accuracy, the test split scored once.
* Weighted kNN (Wu et al. 2018, "instance discrimination"): features L2-normalised, the
  ``k`` train rows with the largest cosine similarity vote for their class with weight
  ``exp(cos / temperature)``; the class with the largest total wins.

Both run in torch on float32 features (statistics and the optimiser's state in float64), on
as many threads as torch is given. The probe minimises the same objective as scikit-learn by
L-BFGS (Nocedal & Wright 2006, ch. 7) in the preconditioned coordinates ``V = L^T W``, ``L L^T``
the Cholesky factorisation of ``covariance / k + I / (C n)`` (covariance from a sample of rows; the objective's Hessian at
``W = 0`` up to the softmax's ``1 - 1/k``; ``k`` classes): the same optimum, reached in tens of
iterations where raw correlated pixels took thousands. Its cost is bounded by the data: each
fit stops when the objective no longer moves (``PROBE_RELATIVE_CHANGE``), when its gradient
vanishes (``PROBE_TOLERANCE``) or at a cap on evaluations that shrinks as one evaluation grows
(:func:`~contrastkit.metrics.probe_evaluation_cap`; a fit stopped there is reported, :class:`~contrastkit.metrics.ProbeCapWarning`), and
the grid is not walked past the val optimum (``PROBE_GRID_PATIENCE``). With at most half as many
training images as features (a small data set's raw pixels) the probe is fitted in the span of
the training rows, which holds the optimum: the same fit at ``n^2 k`` per evaluation, not ``d^2 k``.
The kNN similarities are computed a block of queries at a time, so memory stays
``O(block * n)``.

8-bit features (uint8 ``(n, d)``: the raw-pixel baseline of 8-bit images,
:func:`~contrastkit.metrics.pixel_features`) of at least ``BYTE_PATH_VALUES`` values are read in
exact integer arithmetic (:mod:`contrastkit.metrics.bytes`): the kNN's dot products exactly, the
probe's two products per evaluation with the float operand written to 31 bits; a quarter of the
memory, and on CIFAR-10's raw pixels several times faster than float32. Smaller ones are read as
the float32 ``k / 255`` the models see, with the numbers of float features.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from contrastkit.data import unit_float

from .bytes import (CENTRE, SUM_CHUNK, bytes_times, centred, column_statistics, gram, integer_kernel, integer_matmul,
                    row_sums, times_bytes)

__all__ = ["DEFAULT_C_GRID", "PROBE_TOLERANCE", "ProbeCapWarning", "ProbeResult", "linear_probe",
           "probe_evaluation_cap", "probe_settings", "knn_predict", "knn_accuracy"]

DEFAULT_C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)

#: Queries per block of the kNN similarity matrix (``block x n`` float32 at a time).
KNN_BLOCK = 1024
#: L-BFGS stops when the largest gradient entry (preconditioned coordinates) falls below this.
#: Looser stops are cheaper (about half the iterations at 1e-4) and agree on large,
#: well-determined problems (60,000 images: 1e-4 and 1e-8 agree to 3e-4), but not where there
#: are fewer images than features: on GlyphLab's raw pixels (120 x 1,024) the weakly
#: regularised fits stopped at 1e-4 or 1e-5 short of the optimum, val then picked C = 100 and
#: the test accuracy was 0.027 / 0.013 off the converged one; at 1e-6 it is the converged
#: (scikit-learn, tol 1e-10) number, and 1e-8 changes nothing (tests/metrics/test_readout_equivalence.py).
PROBE_TOLERANCE = 1e-6
#: The work one fit may take, in multiply-adds (probe_evaluation_cap), and the bounds of its cap
#: on evaluations of the objective.
PROBE_WORK = 5e11
PROBE_MIN_EVALUATIONS = 100
PROBE_MAX_EVALUATIONS = 2000
#: Stop walking the C grid once val accuracy has fallen this many times in a row.
PROBE_GRID_PATIENCE = 2
#: L-BFGS also stops when the objective fell by at most this share of its value over the last
#: PROBE_CHANGE_WINDOW iterations.
PROBE_RELATIVE_CHANGE = 1e-6
PROBE_CHANGE_WINDOW = 10
#: Rows of the training features the preconditioner's covariance is estimated from (or 4 x the
#: feature count, if larger).
PRECONDITIONER_ROWS = 8192
#: (s, y) pairs L-BFGS keeps, and the step reductions of one line search before it gives up.
PROBE_HISTORY = 10
PROBE_BACKTRACKS = 10
#: uint8 training features of at least this many values take the exact integer path
#: (:mod:`contrastkit.metrics.bytes`); on smaller ones its extra small operations per evaluation
#: cost more than the products it saves, and they are read as float32.
BYTE_PATH_VALUES = 1 << 22
#: The kNN on uint8 features keeps a block's float64 similarities within this many bytes.
_BYTE_KNN_BYTES = 1 << 28
#: exp(-80) = 1.8e-35, above float32's smallest normal number (1.2e-38).
_EXP_FLOOR = -80.0


def probe_settings() -> Dict[str, object]:
    """The settings that decide :func:`linear_probe`'s numbers besides its input (read now, so
    a changed setting is seen): the C grid, the stopping rules, the evaluation cap's rule, the
    grid's patience and the size from which 8-bit features take the exact integer path."""
    return {"c_grid": [float(c) for c in DEFAULT_C_GRID], "probe_tolerance": PROBE_TOLERANCE,
            "probe_relative_change": PROBE_RELATIVE_CHANGE, "probe_change_window": PROBE_CHANGE_WINDOW,
            "probe_history": PROBE_HISTORY, "probe_backtracks": PROBE_BACKTRACKS, "probe_work": PROBE_WORK,
            "probe_evaluations": [PROBE_MIN_EVALUATIONS, PROBE_MAX_EVALUATIONS],
            "probe_grid_patience": PROBE_GRID_PATIENCE, "preconditioner_rows": PRECONDITIONER_ROWS,
            "byte_path_values": BYTE_PATH_VALUES}


@dataclass
class ProbeResult:
    """Outcome of :func:`linear_probe`: test accuracy at the ``C`` picked on val."""

    test_accuracy: float
    val_accuracy: float
    best_c: float
    val_accuracy_by_c: Dict[float, float] = field(default_factory=dict)
    evaluations_by_c: Dict[float, int] = field(default_factory=dict)
    capped_c: List[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in ("val_accuracy_by_c", "evaluations_by_c"):
            data[key] = {str(k): v for k, v in data[key].items()}
        return data


class ProbeCapWarning(RuntimeWarning):
    """A fit of :func:`linear_probe` stopped at its evaluation cap before converging."""


def _features(x: object, name: str) -> np.ndarray:
    """``x`` as a float32 ``(n, d)`` array (float64 inputs are checked before the cast), or as
    it is when it is uint8."""
    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if array.dtype == np.uint8:  # 8-bit intensities: kept, the exact integer path reads them
        if array.ndim != 2:
            raise ValueError(f"{name} must have shape (n, d), got {array.shape}")
        if array.shape[0] == 0:
            raise ValueError(f"{name} is empty")
        return np.require(array, requirements=["C", "W"])  # a copy when read-only or strided
    if not np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d), got {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    single = np.asarray(array, dtype=np.float32)
    if not np.all(np.isfinite(single)):
        raise ValueError(f"{name} holds values beyond the float32 range (|x| > 3.4e38)")
    return single


def _labels(y: object, n: int, name: str) -> np.ndarray:
    array = np.asarray(y)
    if array.ndim != 1 or array.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integer class labels, got dtype {array.dtype}")
    return array.astype(np.int64)


def _as_float(*arrays: np.ndarray) -> List[np.ndarray]:
    """``arrays`` as float32: all uint8, as ``k / 255`` (what the models read of 8-bit images);
    uint8 next to float ones, as their values (a caller's mixed features are not rescaled)."""
    if all(a.dtype == np.uint8 for a in arrays):
        return [unit_float(torch.from_numpy(a)).numpy() for a in arrays]
    return [a.astype(np.float32) if a.dtype == np.uint8 else a for a in arrays]


def _byte_statistics(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation (float64, ``(d,)``) of the pixels ``q + 128`` (``q`` int8
    ``(n, d)``, :func:`~contrastkit.metrics.bytes.centred`), as :func:`_standardise` takes them (a
    constant column's deviation 1 in units of ``k / 255``), from exact integer sums."""
    mean, variance = column_statistics(q)
    std = variance.sqrt()
    # In the float path's units (k / 255): a constant column divided by 1 there is divided by 255 here.
    return mean, torch.where(std < 255 * 10 * torch.finfo(torch.float64).eps, torch.full_like(std, 255.0), std)


def _standardise(train: np.ndarray, *others: np.ndarray) -> Tuple[torch.Tensor, ...]:
    """Subtract the train mean, divide by the train standard deviation (population, a
    constant column divided by 1, as scikit-learn's ``StandardScaler``); float32 tensors."""
    x = torch.from_numpy(train)
    mean = x.mean(0, dtype=torch.float64)
    std = (x.double() - mean).pow_(2).mean(0).sqrt_()
    std = torch.where(std < 10 * torch.finfo(torch.float64).eps, torch.ones_like(std), std)
    mean, std = mean.float(), std.float()
    return tuple((torch.from_numpy(a) - mean) / std for a in (train, *others))


def _minimise(objective: Callable[[torch.Tensor], Tuple[float, torch.Tensor]], start: torch.Tensor,
              max_evaluations: int, trace: Optional[Callable[..., None]] = None,
              ) -> Tuple[torch.Tensor, int, int, str]:
    """L-BFGS (Nocedal & Wright 2006, algorithm 7.5; ``PROBE_HISTORY`` pairs) of a smooth convex
    ``objective(x) -> (f, grad f)`` from ``start`` (flat float64), with a backtracking line
    search that asks for sufficient decrease only (Armijo, ``c1 = 1e-4``): on a convex objective
    every accepted step has ``s.y >= 0``, so the curvature condition of a Wolfe search adds
    evaluations and nothing else. Stops at the first of: the largest gradient entry at most
    ``PROBE_TOLERANCE`` ("gradient"); the objective's decrease over the last
    ``PROBE_CHANGE_WINDOW`` iterations at most ``PROBE_RELATIVE_CHANGE`` of its value
    ("objective"); a line search that finds no decrease (float32 noise, "no progress");
    ``max_evaluations`` evaluations ("cap"). Returns ``(x, evaluations, iterations, stop)``."""
    x = start.clone()
    f, g = objective(x)
    evaluations, history, values = 1, [], [f]
    scaling = 1.0
    while True:
        if trace is not None:
            trace(x, f, g, evaluations)
        if float(g.abs().max()) <= PROBE_TOLERANCE:
            return x, evaluations, len(values) - 1, "gradient"
        if len(values) > PROBE_CHANGE_WINDOW and \
                values[-1 - PROBE_CHANGE_WINDOW] - f <= PROBE_RELATIVE_CHANGE * abs(f):
            return x, evaluations, len(values) - 1, "objective"
        if evaluations >= max_evaluations:
            return x, evaluations, len(values) - 1, "cap"
        # Two-loop recursion: direction = -H g with the history's inverse Hessian estimate.
        direction = -g
        alphas = []
        for s, y, rho in reversed(history):
            alpha = rho * float(s @ direction)
            direction = direction - alpha * y
            alphas.append(alpha)
        direction = direction * scaling
        for (s, y, rho), alpha in zip(history, reversed(alphas)):
            direction = direction + (alpha - rho * float(y @ direction)) * s
        slope = float(g @ direction)
        if slope >= 0:  # not a descent direction (rounding): start the history again
            history, scaling, direction = [], 1.0, -g
            slope = -float(g @ g)
        step, backtracks = 1.0, 0
        while True:
            candidate = x + step * direction
            f_new, g_new = objective(candidate)
            evaluations += 1
            if f_new <= f + 1e-4 * step * slope:
                break
            if evaluations >= max_evaluations:
                return x, evaluations, len(values) - 1, "cap"
            backtracks += 1
            if backtracks > PROBE_BACKTRACKS:  # below float32's resolution of the objective
                return x, evaluations, len(values) - 1, "no progress"
            # Minimum of the quadratic through f, the slope and f_new, kept within [0.1, 0.5] of the step.
            curvature = f_new - f - slope * step
            guess = -slope * step * step / (2 * curvature) if curvature > 0 else 0.5 * step
            step = min(max(guess, 0.1 * step), 0.5 * step)
        s, y = candidate - x, g_new - g
        sy = float(s @ y)
        if sy > 1e-10 * float(y @ y):
            history = (history + [(s, y, 1.0 / sy)])[-PROBE_HISTORY:]
            scaling = sy / float(y @ y)
        x, f, g = candidate, f_new, g_new
        values.append(f)


class _FloatRows:
    """Standardised training features ``x`` ``(n, d)`` float32 as the probe multiplies them:
    logits as ``W^T X^T`` (``k x n``) and the weight gradient as ``G^T X`` (``k x d``), both in
    their fast layout (on CPU the autograd form ``X^T G`` of a tall, thin matrix ran ~10x slower
    than ``G^T X``), so ``x`` and its transpose are both kept, contiguous."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.xt = x.contiguous(), x.T.contiguous()
        self.n, self.d = x.shape

    def logits(self, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``(k, n)`` float32 logits of ``weight`` ``(d, k)`` and ``bias`` ``(k,)``."""
        return torch.addmm(bias.float()[:, None], weight.T.float(), self.xt)

    def weighted_sum(self, residual: torch.Tensor) -> torch.Tensor:
        """``X^T G`` ``(d, k)`` float64 of ``residual`` ``(k, n)``."""
        return (residual @ self.x).double().T

    def second_moment(self, step: int) -> torch.Tensor:
        """``X^T X / m`` ``(d, d)`` float64 of every ``step``-th standardised row (``m`` of them)."""
        sample = self.x[::step]
        moment = torch.zeros(self.d, self.d, dtype=torch.float64)
        for start in range(0, sample.shape[0], 8192):  # float32 products, float64 sums
            block = sample[start:start + 8192]
            moment += (block.T @ block).double()
        return moment / sample.shape[0]


class _ByteRows:
    """8-bit training features ``pixels`` ``(n, d)`` uint8, standardised by their columns' mean
    and standard deviation (``mean``, ``std``: float64 ``(d,)``), as :class:`_FloatRows`
    multiplies them, in exact integer arithmetic (:mod:`contrastkit.metrics.bytes`): with
    ``q = p - 128`` and ``V = W / std``, ``X W = q V - (mean - 128) V`` and
    ``X^T G = (q^T G - (mean - 128) 1^T G) / std``. A quarter of the bytes per evaluation, no
    rounding but that of ``V`` and ``G`` to 31-bit integers."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.q = centred(pixels)
        self.q_t = self.q.T.contiguous()
        self.mean, self.std = _byte_statistics(self.q)
        self.shift = self.mean - CENTRE
        self.n, self.d = pixels.shape

    def logits(self, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return (bytes_times(self.q_t, weight / self.std[:, None], self.shift) + bias[:, None]).float()

    def weighted_sum(self, residual: torch.Tensor) -> torch.Tensor:
        return (times_bytes(residual, self.q, self.shift) / self.std).T

    def second_moment(self, step: int) -> torch.Tensor:
        # (q - s)^T (q - s) = q^T q - s (1^T q) - (q^T 1) s^T + m s s^T, divided by std std^T
        sample = self.q[::step]
        sums = sample.sum(0, dtype=torch.int64).double()
        m = sample.shape[0]
        moment = gram(sample) - torch.outer(self.shift, sums) - torch.outer(sums, self.shift) \
            + m * torch.outer(self.shift, self.shift)
        return moment / torch.outer(self.std, self.std) / m


class _MultinomialProbe:
    """L-BFGS fits of one standardised training set along a grid of ``C`` (see module doc).

    The objective and its gradient are written out rather than left to autograd, on the two
    products of ``rows`` (:class:`_FloatRows` or :class:`_ByteRows`)."""

    def __init__(self, rows: "_FloatRows | _ByteRows", y: torch.Tensor, classes: int) -> None:
        self.data = rows
        self.y, self.classes = y, classes
        self.rows = torch.arange(rows.n)
        # The preconditioner's covariance from at most PRECONDITIONER_ROWS evenly spaced rows (at
        # least 4 d): it only sets the speed, not the optimum, and on 45,000 x 3,072 raw pixels
        # the whole product cost as much as all the fits together.
        self.covariance = rows.second_moment(max(1, rows.n // max(PRECONDITIONER_ROWS, 4 * rows.d)))
        self.weight = torch.zeros(rows.d, classes, dtype=torch.float64)
        self.bias = torch.zeros(classes, dtype=torch.float64)

    def _loss_and_gradients(self, weight: torch.Tensor, bias: torch.Tensor, penalty: float):
        """``mean CE + penalty / 2 ||W||^2`` and its gradients w.r.t. ``W`` and ``b``."""
        logits = self.data.logits(weight, bias)  # (k, n)
        # Cross-entropy and softmax residual written so that a confidently right sample keeps its
        # digits in float32: CE = log(1 + sum_{j != y} e^(z_j)) with z = logits - logit_y, taken
        # with log1p, and p_y - 1 = expm1(-CE). The textbook form (log-sum-exp minus the logit;
        # p_y - 1) cancels to ~1e-7 absolute, which on separable data (fewer images than
        # features, weak regularisation) is the size of the whole gradient near the optimum.
        # Exponents are kept above _EXP_FLOOR: below it exp() returns float32 denormals, which
        # the CPU computes several times slower (confident fits, large logits), and which add
        # less than 1e-34 to anything here.
        z = logits.sub_(logits[self.y, self.rows])
        z[self.y, self.rows] = -float("inf")
        top = z.amax(0).clamp_(min=0.0)
        sample_loss = top + (z - top).clamp_(min=_EXP_FLOOR).exp_().sum(0).add_(torch.expm1(-top)).log1p_()
        loss = sample_loss.double().mean() + 0.5 * penalty * weight.pow(2).sum()
        residual = z.sub_(sample_loss).clamp_(min=_EXP_FLOOR).exp_()  # softmax probabilities, then minus the labels
        residual[self.y, self.rows] = torch.expm1(-sample_loss)
        residual /= self.data.n
        grad_weight = self.data.weighted_sum(residual) + penalty * weight
        return loss, grad_weight, residual.sum(1).double()

    def fit(self, c: float, max_evaluations: int, trace=None) -> None:
        """Minimise ``mean CE(x W + b) + ||W||^2 / (2 C n)`` from the current solution, by
        L-BFGS with a backtracking (Armijo) line search in the preconditioned coordinates, at
        most ``max_evaluations`` evaluations of the objective; sets ``evaluations``,
        ``iterations`` and ``stop`` (``"gradient"``, ``"objective"``, ``"no progress"`` or
        ``"cap"``)."""
        penalty = 1.0 / (c * self.data.n)
        factor = self._preconditioner(penalty)
        d, k = self.weight.shape

        def weight_of(v: torch.Tensor) -> torch.Tensor:  # W = L^-T V
            return torch.linalg.solve_triangular(factor.mT, v, upper=True)

        def objective(point: torch.Tensor):
            v, b = point[:d * k].view(d, k), point[d * k:]
            loss, grad_weight, grad_bias = self._loss_and_gradients(weight_of(v), b, penalty)
            grad_v = torch.linalg.solve_triangular(factor, grad_weight, upper=False)  # chain rule: L^-1 dW
            return float(loss), torch.cat([grad_v.reshape(-1), grad_bias])

        start = torch.cat([(factor.mT @ self.weight).reshape(-1), self.bias])
        point, self.evaluations, self.iterations, self.stop = _minimise(objective, start, max_evaluations, trace)
        self.weight = weight_of(point[:d * k].view(d, k))
        self.bias = point[d * k:].clone()

    def _preconditioner(self, penalty: float) -> torch.Tensor:
        """The lower Cholesky factor ``L`` of ``covariance / k + penalty I`` (the Hessian of the
        objective at ``W = 0``, up to the softmax's ``1 - 1/k``): in ``V = L^T W`` that Hessian is
        the identity. Float32 products leave the covariance's null directions at +-1e-7, so a
        factorisation that fails is retried with a larger diagonal (it only sets the speed)."""
        eye = torch.eye(self.covariance.shape[0], dtype=torch.float64)
        jitter = 0.0
        while True:
            factor, info = torch.linalg.cholesky_ex(self.covariance / self.classes + (penalty + jitter) * eye)
            if int(info) == 0:
                return factor
            jitter = max(1e-10, 100 * jitter)

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> np.ndarray:
        return torch.addmm(self.bias.float(), x, self.weight.float()).argmax(1).numpy()


def _row_space(train: torch.Tensor, *others: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Every split in the coordinates of an orthonormal basis ``Q`` (``d x r``) of the standardised
    training rows' span (``r <= n < d``): the same probe with ``r`` features. Exact: the loss
    sees ``X W`` only, so a part of ``W`` orthogonal to the rows changes nothing but the penalty,
    and the optimum has none (``W = Q W'``, ``||W|| = ||W'||``, ``x W = (x Q) W'``). With fewer
    images than features (a small data set's raw pixels) each evaluation then costs ``n^2 k``
    instead of ``d^2 k``."""
    _, values, basis = torch.linalg.svd(train.double(), full_matrices=False)  # basis: (n, d)
    keep = values > values[0] * max(train.shape) * torch.finfo(torch.float32).eps
    keep[0] = True  # all-constant features: one direction, whose values are all zero
    basis = basis[keep].T  # (d, r)
    return tuple((split.double() @ basis).float() for split in (train, *others))


def probe_evaluation_cap(n: int, d: int, classes: int) -> int:
    """The evaluations of the objective one fit of :func:`linear_probe` may take on ``n`` training
    rows of ``d`` features and ``classes`` classes: ``PROBE_WORK`` multiply-adds over the
    ``2 (n + d) (d + 1) classes`` of one evaluation, kept within
    ``[PROBE_MIN_EVALUATIONS, PROBE_MAX_EVALUATIONS]``."""
    per_evaluation = 2.0 * (n + d) * (d + 1) * classes
    return int(min(PROBE_MAX_EVALUATIONS, max(PROBE_MIN_EVALUATIONS, PROBE_WORK // per_evaluation)))


def _walk_grid(grid: Sequence[float], val_accuracy_of: Callable[[float], float],
               patience: Optional[int]) -> Tuple[float, Dict[float, float]]:
    """The ``C`` of ``grid`` with the best val accuracy (the smallest on ties) and the val
    accuracy of every ``C`` fitted, walking the grid from the smallest ``C`` and stopping once
    val accuracy has fallen ``patience`` times in a row (each value below the one before;
    ``None``: the whole grid). ``val_accuracy_of(c)`` fits ``C`` and scores it on val."""
    by_c: Dict[float, float] = {}
    best_c, falls, previous = None, 0, None
    for c in sorted(set(grid)):
        accuracy = by_c[c] = float(val_accuracy_of(c))
        if best_c is None or accuracy > by_c[best_c]:
            best_c = c
        falls = falls + 1 if previous is not None and accuracy < previous else 0
        previous = accuracy
        if patience is not None and falls >= patience:
            break
    return best_c, by_c


def linear_probe(
    train_x: object, train_y: object,
    val_x: object, val_y: object,
    test_x: object, test_y: object,
    *,
    c_grid: Sequence[float] = DEFAULT_C_GRID,
    max_evaluations: Optional[int] = None,
    patience: Optional[int] = PROBE_GRID_PATIENCE,
) -> ProbeResult:
    """Logistic-regression probe with ``C`` chosen on val.

    Args:
        train_x, val_x, test_x: ``(n_split, d)`` features (same ``d``), float; or all three
            uint8, read as 8-bit intensities: as the float32 ``k / 255`` the models see, and from
            ``BYTE_PATH_VALUES`` training values on in exact integer arithmetic (the module's
            docstring). uint8 next to float features is read as its values.
        train_y, val_y, test_y: ``(n_split,)`` integer labels.
        c_grid: inverse regularisation strengths to try, walked from the smallest.
        max_evaluations: evaluations of the objective per fit (default
            :func:`~contrastkit.metrics.probe_evaluation_cap` of the training set); a fit that stops there is named
            in ``capped_c`` and warned about.
        patience: stop walking the grid once val accuracy has fallen this many times in a
            row (``None``: fit every ``C``).

    Returns a :class:`~contrastkit.metrics.ProbeResult`; accuracies are fractions in ``[0, 1]``. The test split is
    scored once, by the fit of the chosen ``C``.
    """
    train_x = _features(train_x, "train_x")
    val_x = _features(val_x, "val_x")
    test_x = _features(test_x, "test_x")
    dim = train_x.shape[1]
    for name, x in (("val_x", val_x), ("test_x", test_x)):
        if x.shape[1] != dim:
            raise ValueError(f"{name} has {x.shape[1]} features but train_x has {dim}")
    train_y = _labels(train_y, train_x.shape[0], "train_y")
    val_y = _labels(val_y, val_x.shape[0], "val_y")
    test_y = _labels(test_y, test_x.shape[0], "test_y")
    classes, train_index = np.unique(train_y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError("train_y holds a single class; a probe needs at least two")
    grid = [float(c) for c in c_grid]
    if not grid or any(not np.isfinite(c) or c <= 0 for c in grid):
        raise ValueError(f"c_grid must be a non-empty sequence of positive numbers, got {c_grid}")
    for name, value in (("max_evaluations", max_evaluations), ("patience", patience)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")

    rows: "_FloatRows | _ByteRows"
    row_space = 2 * train_x.shape[0] <= dim  # nearer to n = d the SVD costs what it saves
    if not row_space and train_x.size >= BYTE_PATH_VALUES and integer_kernel() \
            and all(x.dtype == np.uint8 for x in (train_x, val_x, test_x)):
        rows = _ByteRows(train_x)
        val_s, test_s = (((torch.from_numpy(x).double() - rows.mean) / rows.std).float() for x in (val_x, test_x))
    else:
        train_s, val_s, test_s = _standardise(*_as_float(train_x, val_x, test_x))
        if row_space:
            train_s, val_s, test_s = _row_space(train_s, val_s, test_s)
        rows = _FloatRows(train_s)
    if max_evaluations is None:
        max_evaluations = probe_evaluation_cap(rows.n, rows.d, len(classes))
    # One model walked along the grid from strong to weak regularisation, each fit starting
    # from the previous solution (same optimum, far fewer iterations at large C).
    model = _MultinomialProbe(rows, torch.from_numpy(train_index.astype(np.int64)), len(classes))
    fits: Dict[float, Tuple[torch.Tensor, torch.Tensor]] = {}
    evaluations: Dict[float, int] = {}
    capped = []

    def val_accuracy_of(c: float) -> float:
        model.fit(c, int(max_evaluations))
        evaluations[c] = model.evaluations
        if model.stop == "cap":
            capped.append(c)
        fits[c] = (model.weight, model.bias)
        return float((classes[model.predict(val_s)] == val_y).mean())

    best_c, by_c = _walk_grid(grid, val_accuracy_of, patience)
    model.weight, model.bias = fits[best_c]
    test_acc = float((classes[model.predict(test_s)] == test_y).mean())
    if capped:
        warnings.warn(f"linear probe: the fit of C = {', '.join(f'{c:g}' for c in capped)} stopped at its cap of "
                      f"{max_evaluations} evaluations before converging (n = {train_x.shape[0]}, d = {dim}); "
                      "its val accuracy may be understated", ProbeCapWarning, stacklevel=2)
    return ProbeResult(test_accuracy=test_acc, val_accuracy=by_c[best_c], best_c=best_c, val_accuracy_by_c=by_c,
                       evaluations_by_c=evaluations, capped_c=capped)


def knn_predict(
    memory_x: object, memory_y: object, query_x: object,
    *, k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
) -> np.ndarray:
    """Weighted kNN predictions (cosine similarity, votes ``exp(cos / temperature)``).

    Args:
        memory_x: ``(n, d)`` features of the labelled memory (train split); with ``query_x``
            both uint8 (8-bit intensities) of at least ``BYTE_PATH_VALUES`` values, the cosines
            come from exact integer dot products.
        memory_y: ``(n,)`` integer labels in ``[0, num_classes)``.
        query_x: ``(m, d)`` features to classify.
        k: neighbors per query (capped at ``n``).
        temperature: vote temperature (Wu et al. 2018 use 0.07).
        num_classes: defaults to ``max(memory_y) + 1``.

    Returns ``(m,)`` predicted labels; ties go to the smaller class index.
    """
    memory_x = _features(memory_x, "memory_x")
    query_x = _features(query_x, "query_x")
    if query_x.shape[1] != memory_x.shape[1]:
        raise ValueError(f"query_x has {query_x.shape[1]} features but memory_x has {memory_x.shape[1]}")
    memory_y = _labels(memory_y, memory_x.shape[0], "memory_y")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    if memory_y.min() < 0:
        raise ValueError("memory_y must hold non-negative class indices")
    classes = int(memory_y.max()) + 1 if num_classes is None else int(num_classes)
    if memory_y.max() >= classes:
        raise ValueError(f"memory_y holds label {memory_y.max()} but num_classes is {classes}")

    k = min(int(k), memory_x.shape[0])
    if memory_x.dtype == np.uint8 and query_x.dtype == np.uint8 and memory_x.size >= BYTE_PATH_VALUES \
            and integer_kernel():
        return _byte_knn(memory_x, memory_y, query_x, k, temperature, classes)
    memory_x, query_x = _as_float(memory_x, query_x)

    def unit(x: np.ndarray) -> torch.Tensor:
        rows = torch.from_numpy(x)
        # Norms accumulated in float64: a float32 square sum of large features could overflow.
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True, dtype=torch.float64)
        return rows / norms.clamp_min_(1e-12).float()

    memory, queries = unit(memory_x), unit(query_x)
    labels = torch.from_numpy(memory_y)
    predictions = np.empty(queries.shape[0], dtype=np.int64)
    # One similarity buffer for every block: a fresh (block, n) matrix per block spent ~10% of
    # the raw-pixel kNN of 60,000 images in page faults.
    buffer = torch.empty(min(KNN_BLOCK, queries.shape[0]), memory.shape[0])
    for start in range(0, queries.shape[0], KNN_BLOCK):
        block = queries[start:start + KNN_BLOCK]
        similarity = torch.mm(block, memory.T, out=buffer[:block.shape[0]])  # (block, n)
        predictions[start:start + KNN_BLOCK] = _vote(similarity, labels, k, temperature, classes)
    return predictions


def _vote(similarity: torch.Tensor, labels: torch.Tensor, k: int, temperature: float, classes: int,
          row_scale: Optional[torch.Tensor] = None) -> np.ndarray:
    """The weighted vote of each row's ``k`` most similar memory rows: ``(rows,)`` classes
    (``row_scale``: the similarities of each row are ``similarity * row_scale``)."""
    neighbor_sim, neighbors = similarity.topk(k, dim=1)
    if row_scale is not None:
        neighbor_sim = neighbor_sim * row_scale[:, None]
    # Subtracting the row maximum keeps exp() finite; it scales every vote of a row equally.
    weights = ((neighbor_sim - neighbor_sim[:, :1]) / temperature).double().exp_()
    votes = torch.zeros(neighbors.shape[0], classes, dtype=torch.float64)
    votes.scatter_add_(1, labels[neighbors], weights)
    return votes.numpy().argmax(axis=1)


def _byte_knn(memory_x: np.ndarray, memory_y: np.ndarray, query_x: np.ndarray, k: int, temperature: float,
              classes: int) -> np.ndarray:
    """:func:`knn_predict` on uint8 features, its cosines from exact integer dot products
    (:mod:`contrastkit.metrics.bytes`): with ``q = p - 128``, ``p_a . p_b = q_a . q_b + 128
    (sum q_a + sum q_b) + 128^2 d`` and ``|p|^2 = sum q^2 + 256 sum q + 128^2 d``, each block's
    products split into sums of at most ``SUM_CHUNK`` features. A block's similarities are
    float64 (within ``_BYTE_KNN_BYTES``), each the exact dot product divided once by the norms."""
    d = memory_x.shape[1]
    memory = centred(memory_x)
    memory_t = memory.T.contiguous()

    def terms(q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``128 sum q`` and ``|p|`` per row (float64; a zero row's norm is kept above 0)."""
        sums, squares = row_sums(q)
        constant = CENTRE * CENTRE * d
        return (CENTRE * sums).double(), (squares + 2 * CENTRE * sums + constant).double().sqrt_().clamp_min_(1e-12)

    memory_shift, memory_norms = terms(memory)
    inverse_norms = memory_norms.reciprocal()
    labels = torch.from_numpy(memory_y)
    block = max(1, min(KNN_BLOCK, _BYTE_KNN_BYTES // (8 * memory.shape[0])))
    predictions = np.empty(query_x.shape[0], dtype=np.int64)
    for start in range(0, query_x.shape[0], block):
        queries = centred(query_x[start:start + block])
        query_shift, query_norms = terms(queries)
        dots = integer_matmul(queries[:, :SUM_CHUNK], memory_t[:SUM_CHUNK]).double()
        for first in range(SUM_CHUNK, d, SUM_CHUNK):
            dots += integer_matmul(queries[:, first:first + SUM_CHUNK], memory_t[first:first + SUM_CHUNK]).double()
        dots.add_(memory_shift).add_((query_shift + CENTRE * CENTRE * d)[:, None]).mul_(inverse_norms)
        # dots / |p_memory| ranks each row's neighbors; / |p_query| (one per row) makes the cosines
        predictions[start:start + block] = _vote(dots, labels, k, temperature, classes, query_norms.reciprocal())
    return predictions


def knn_accuracy(
    memory_x: object, memory_y: object, query_x: object, query_y: object,
    *, k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
) -> float:
    """Accuracy of :func:`knn_predict` against ``query_y`` ``(m,)``."""
    predictions = knn_predict(memory_x, memory_y, query_x, k=k, temperature=temperature,
                              num_classes=num_classes)
    query_y = _labels(query_y, predictions.shape[0], "query_y")
    return float((predictions == query_y).mean())
