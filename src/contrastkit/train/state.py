"""What a pretraining checkpoint holds, in one place: the weights and the optimizer's state
(:class:`Trainables`), and the counters the epochs advance (:class:`TrainState`). The
checkpoint writer and the resume both go through these two; no other code reads or writes a
checkpoint's keys.

The keys (a checkpoint is a flat dict; ``contrastkit.train.checkpoint`` checks them on load):

* ``model``, ``optimizer``, ``scheduler``, ``precision`` (the gradient scaler): :class:`Trainables`;
  with the online read-out (on unless ``--no-online-probe``) also ``online_probe``: on labelled
  data the online probe's head, its optimizer and the last epoch's numbers
  (:class:`~contrastkit.train.online.OnlineProbe`), without labels the last epoch's view
  retrieval (:class:`~contrastkit.train.online.OnlineViewRetrieval`).
* ``epoch`` (epochs done), ``step`` (optimizer steps done, skipped ones included),
  ``train_seconds``, ``epoch_losses`` (one mean loss per epoch done), ``selection`` (the val
  probe's candidates, :class:`~contrastkit.train.selection.EpochSelection`), the fault counters
  (``skipped_steps``, ``epoch_skipped``, ``short_batches``, ``epoch_short_batches``,
  :class:`~contrastkit.train.faults.StepFaults`): :class:`TrainState`.
* The position in the epoch in progress: ``epoch_step`` (its batches already done; 0 at an
  epoch's end) and per rank ``epoch_loss_sums`` (each rank's sum of their losses) and
  ``data_per_rank`` (what each rank's batch source needs to continue, where it needs more than
  ``epoch_step``: a stream's position and shuffle buffer).
* ``rng_per_rank`` (torch, numpy and python RNG states of each rank; ``rng`` is rank 0's) and
  ``world_size``: a checkpoint resumes with the number of processes that wrote it.
* ``config`` and ``launch``: written and checked by the loop (what the run was, which torchrun
  launch wrote it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .checkpoint import rng_state, set_rng_state
from .faults import StepFaults
from .selection import EpochSelection

__all__ = ["Trainables", "TrainState"]


@dataclass
class Trainables:
    """What the optimizer changes: the model, the optimizer, its learning-rate scheduler and the
    step's precision (its gradient scaler's state), which the checkpoint holds; and, not in it,
    the training forward ``step_loss`` (DDP-wrapped under torchrun), the temperature
    ``schedule`` and the caller's encoder module when its class cannot rebuild it
    (``given_encoder``: the random-init baseline then starts from it). ``online``: the online
    read-out (:class:`~contrastkit.train.online.OnlineProbe`, whose own head and optimizer the
    checkpoint holds too, or :class:`~contrastkit.train.online.OnlineViewRetrieval`; ``None``
    when the run has none)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Any
    # step_loss(batch, labels, indices=, tap=): contrastkit.methods.step.step_loss
    step_loss: Optional[Callable[..., torch.Tensor]] = None
    schedule: Any = None
    given_encoder: Optional[torch.nn.Module] = None
    online: Any = None

    def state_dict(self) -> Dict[str, Any]:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "precision": self.precision.state_dict()}
        if self.online is not None:
            state["online_probe"] = self.online.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any], path: str, precision_name: str) -> None:
        """Restore :meth:`state_dict`; a part that does not fit is one ``ValueError`` naming ``path``."""
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            # A checkpoint written without the online probe: its head starts at the resumed step.
            if self.online is not None and state.get("online_probe") is not None:
                self.online.load_state_dict(state["online_probe"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"checkpoint {path} does not match this model/optimizer: "
                             f"{str(err).splitlines()[0]}") from None
        # The schedule's functions are not in the state (only its step): a changed --epochs
        # reshapes the cosine from the resumed step on.
        try:
            self.precision.load_state_dict(state.get("precision"))
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"checkpoint {path} does not match --precision {precision_name}: {err}") from None


@dataclass
class TrainState:
    """The counters a run advances and its checkpoint restores (the module's keys), with the
    run's fault counters (``faults``) and, per rank, its position in the epoch in progress."""

    faults: StepFaults
    epoch: int = 0                  # epochs done
    step: int = 0                   # optimizer steps done (skipped steps included)
    epoch_step: int = 0             # on resume: the batches of the epoch in progress already done
    epoch_loss_sum: float = 0.0     # ... and this rank's sum of their losses
    data: Optional[Dict[str, Any]] = None  # ... and this rank's batch source position (None: epoch_step says it)
    train_seconds: float = 0.0      # training time over every invocation of the run
    epoch_losses: List[float] = field(default_factory=list)
    selection: EpochSelection = field(default_factory=EpochSelection)  # the val read-out picks the epoch

    @staticmethod
    def rank_state(loss_sum: float, data: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """What each rank adds to a checkpoint (gathered on rank 0 for :meth:`state_dict`): its
        RNG states, its loss sum of the epoch in progress and its batch source's position."""
        return {"rng": rng_state(), "loss_sum": loss_sum, "data": data}

    def state_dict(self, ranks: List[Dict[str, Any]], epoch_step: int, train_seconds: float) -> Dict[str, Any]:
        """The checkpoint's counters at a step boundary ``epoch_step`` batches into the epoch in
        progress (0: at an epoch's end), with ``ranks`` (:meth:`rank_state` of each rank) and
        the training time so far (``train_seconds``)."""
        state = {"world_size": len(ranks), "epoch": self.epoch, "step": self.step, "train_seconds": train_seconds,
                 "epoch_losses": list(self.epoch_losses), "selection": self.selection.state_dict(),
                 "epoch_step": epoch_step, "epoch_loss_sums": [r["loss_sum"] for r in ranks] if epoch_step else [],
                 "rng": ranks[0]["rng"], "rng_per_rank": [r["rng"] for r in ranks], **self.faults.state()}
        if epoch_step and any(r["data"] is not None for r in ranks):
            state["data_per_rank"] = [r["data"] for r in ranks]
        return state

    def load_state_dict(self, state: Dict[str, Any], rank: int, world_size: int, path: str) -> None:
        """Continue from ``state`` (a checkpoint read from ``path``) as rank ``rank`` of
        ``world_size``: the counters, this rank's RNG states and position in the epoch."""
        if int(state.get("world_size", 1)) != world_size:
            raise ValueError(f"checkpoint {path} was written by {state.get('world_size', 1)} "
                             f"process(es); resume it with the same number (now {world_size})")
        set_rng_state(state["rng_per_rank"][rank] if world_size > 1 else state["rng"])
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.epoch_losses = [float(v) for v in state.get("epoch_losses", [])]
        self.selection.load_state_dict(state.get("selection"))
        self.epoch_step = int(state.get("epoch_step", 0))
        sums = state.get("epoch_loss_sums", [])
        self.epoch_loss_sum = float(sums[rank]) if len(sums) == world_size else 0.0
        positions = state.get("data_per_rank")
        self.data = positions[rank] if isinstance(positions, list) and len(positions) == world_size else None
        self.faults.load_state(state)
        self.faults.last_checkpoint = (self.step, self.epoch)
