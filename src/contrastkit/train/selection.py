"""Picking the epoch to report: the read-out protocol of the textbook, section 30.2 (exercise F5).

The validation split picks the epoch, the test split is read once. At every evaluation epoch
(``eval_every``, and always the last epoch) the run scores its encoder by ``select_by``
(:data:`SELECTION_SCORES`). By default that is the **val linear probe**: a probe fitted on 80 % of the training split, its ``C`` chosen on the other 20 %
(a class-stratified split with the run's ``subset_seed``), and its accuracy on the val split.
Neither test nor the val labels pick ``C`` here, so the score that picks the epoch never saw
the numbers it is compared by. The encoder with the best score (the earliest on ties) is kept
as a snapshot of the whole model (in memory and in the checkpoint, so a resumed run picks the
same epoch); at the end its test numbers are read once with the usual protocol
(``contrastkit.train.evaluate.evaluate_model``) next to the last epoch's. With
``select_by`` one of the online read-out's numbers (:mod:`contrastkit.train.online`: the online
probe, the kNN monitor, or without labels the view retrieval), the score of an evaluation epoch is
that number, measured on val at the epoch's end anyway, and no probe is refitted: solo-learn's
and lightly's way of watching a run, here also picking its epoch (and the only way a run without
labels can pick one).

``summary.json`` then holds (the same rule for every method, wherever the data carry labels):

* ``probe_accuracy``, ``knn_accuracy``, ``representation``... at the top level: the model at
  the **last** epoch, as before (what ``contrastkit probe RUN`` re-evaluates from ``last.pt``);
* ``selected``: the same held-out numbers (no baselines) for the **selected** epoch;
* ``selected_epoch``: that epoch (the last one when no selection ran: ``eval_every`` 0 or
  unlabelled data, and then ``selected`` repeats the last epoch's numbers);
* ``selection``: ``{"metric", "rule", "epochs", "scores"}``, every val score that took part,
  or ``None``.

Studies judge their claims by the ``selected`` numbers (:func:`selected_numbers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from contrastkit import records

from .online import KNN_BANK, VAL_SAMPLES, VIEW_SAMPLES

__all__ = ["SELECTION_METRIC", "SELECTION_RULE", "SELECTION_SCORES", "HELD_OUT_FRACTION", "EpochSelection",
           "val_probe_accuracy", "selected_numbers"]

#: The name of the score that picks the epoch (also its key in the epoch records).
SELECTION_METRIC = "val_probe_accuracy"
#: The share of the training split that picks the probe's ``C`` for the val score.
HELD_OUT_FRACTION = 0.2
SELECTION_RULE = ("the evaluation epoch (every eval_every epochs and the last) with the best val linear probe "
                  "accuracy (probe fitted on 80% of train, C chosen on the other 20%); the earliest on ties")
_ONLINE_RULE = ("the evaluation epoch (every eval_every epochs and the last) with the best {what}, measured on val at "
                "the epoch's end; the earliest on ties")
#: The epoch record's key of each ``select_by`` score and the rule that ``summary.json``'s
#: ``selection`` states (the names of ``contrastkit.methods.config.SELECT_BY``).
SELECTION_SCORES = {
    "val_probe": (SELECTION_METRIC, SELECTION_RULE),
    "online_probe": (records.ONLINE_PROBE_ACCURACY, _ONLINE_RULE.format(
        what=f"online linear probe accuracy (a head trained beside the encoder on the training batches' detached h; "
             f"at most {VAL_SAMPLES} val images)")),
    "online_knn": (records.ONLINE_KNN_ACCURACY, _ONLINE_RULE.format(
        what=f"online kNN accuracy (its memory a fixed sample of at most {KNN_BANK} training images; at most "
             f"{VAL_SAMPLES} val images)")),
    "online_view_retrieval": (records.ONLINE_VIEW_RETRIEVAL_TOP1, _ONLINE_RULE.format(
        what=f"online view retrieval top-1 (two fixed augmented views of each of the first {VIEW_SAMPLES} val "
             f"images)")),
}


def val_probe_accuracy(encoder: nn.Module, dataset: Any, device: torch.device, *, seed: int = 0,
                       workers: int = 0, features: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> float:
    """The val score of ``encoder``: linear probe fitted on a class-stratified 80 % of the
    training split, ``C`` chosen on the other 20 % (:data:`HELD_OUT_FRACTION`), accuracy on the
    val split (a fraction in ``[0, 1]``). ``features``: the encoder's ``(train, val)`` features
    when the caller already has them (else extracted here, streamed splits decoded in
    ``workers`` processes)."""
    from contrastkit.data.base import stratified_split
    from contrastkit.metrics import linear_probe

    from contrastkit.metrics.readout import extract_features

    train_y = dataset.train.labels.cpu().numpy()
    fit, held_out = stratified_split(train_y, [1.0 - HELD_OUT_FRACTION, HELD_OUT_FRACTION], seed)
    if held_out.size == 0 or np.unique(train_y[fit]).size < 2:
        raise ValueError(f"the training split ({train_y.size} images) is too small to score epochs by a val probe "
                         "(it needs two classes in 80% of it and at least one image in the rest)")
    if features is None:
        features = tuple(extract_features(encoder, split, device, workers=workers)
                         for split in (dataset.train, dataset.val))
    train_x, val_x = features
    probe = linear_probe(train_x[fit], train_y[fit], train_x[held_out], train_y[held_out],
                         val_x, dataset.val.labels.cpu().numpy())
    return probe.test_accuracy


@dataclass
class EpochSelection:
    """The val scores of a run's evaluation epochs and a snapshot of the best model so far.

    ``best_state`` is a CPU copy of the model's ``state_dict`` at ``best_epoch``; the whole
    selection goes into the checkpoint (:meth:`state_dict`) so that a resumed run keeps it.
    """

    epochs: List[int] = field(default_factory=list)
    scores: List[float] = field(default_factory=list)
    best_epoch: Optional[int] = None
    best_state: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False)

    def observe(self, epoch: int, score: float, model: nn.Module) -> None:
        """Record ``score`` for ``epoch``; snapshot ``model`` if it beats every earlier score."""
        if self.best_epoch is None or score > self.scores[self.epochs.index(self.best_epoch)]:
            self.best_epoch = epoch
            self.best_state = {key: value.detach().to("cpu", copy=True) for key, value in model.state_dict().items()}
        self.epochs.append(int(epoch))
        self.scores.append(float(score))

    def state_dict(self) -> Dict[str, Any]:
        """What the checkpoint keeps (plain lists and tensors, loadable with ``weights_only``)."""
        return {"epochs": list(self.epochs), "scores": list(self.scores), "best_epoch": self.best_epoch,
                "best_state": self.best_state}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` (``None``, from a checkpoint without a selection: empty)."""
        state = state or {}
        self.epochs = [int(e) for e in state.get("epochs", [])]
        self.scores = [float(s) for s in state.get("scores", [])]
        self.best_epoch = state.get("best_epoch")
        self.best_state = state.get("best_state")
        if (self.best_epoch is None) != (self.best_state is None) or len(self.epochs) != len(self.scores):
            raise ValueError("the checkpoint's epoch selection is inconsistent (scores, epochs and snapshot differ)")

    def report(self, last_epoch: int, last_numbers: Dict[str, Any],
               evaluate_state: Callable[[Dict[str, torch.Tensor]], Dict[str, Any]],
               select_by: str = "val_probe") -> Dict[str, Any]:
        """The ``summary.json`` keys of the module docstring. ``last_numbers`` are the last
        epoch's held-out numbers; ``evaluate_state(state_dict)`` reads the test numbers of the
        snapshot (called only when the selected epoch is not the last); ``select_by``: what
        scored the epochs (:data:`~contrastkit.train.selection.SELECTION_SCORES`)."""
        metric, rule = SELECTION_SCORES[select_by]
        own = {key: value for key, value in last_numbers.items() if not records.is_baseline_key(key)}
        if self.best_epoch is None:
            return {"selected_epoch": last_epoch, "selected": own, "selection": None}
        selected = own if self.best_epoch == last_epoch else evaluate_state(self.best_state)
        return {"selected_epoch": int(self.best_epoch), "selected": selected,
                "selection": {"metric": metric, "rule": rule, "epochs": list(self.epochs),
                              "scores": list(self.scores)}}


def selected_numbers(summary: Dict[str, Any]) -> Dict[str, Any]:
    """The held-out numbers of a run's selected epoch: ``summary["selected"]`` (every summary
    the trainer writes has it); a ``ValueError`` for a summary without them."""
    selected = summary.get("selected")
    if not isinstance(selected, dict):
        raise ValueError("a run summary without the numbers of its selected epoch (\"selected\"): "
                         "it was not written by this contrastkit; train the run again")
    return selected
