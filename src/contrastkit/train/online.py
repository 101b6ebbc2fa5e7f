"""The read-out a run watches while it trains (``--online-probe``): an online linear probe and a
kNN monitor, logged every epoch, at almost no cost per step.

* **Online linear probe** (solo-learn's online linear classifier; lightly's
  ``OnlineLinearClassifier``): a linear head on the encoder's representation ``h``, detached,
  trained by its own optimizer (Adam, :data:`PROBE_LR`) on each training batch's labels. It
  reads the ``h`` the step's forward pass already computed, every row of it: for the two-view
  methods both views of each image (the labels tiled, as solo-learn averages the loss over its
  crops), for MoCo the query view, for the image-text methods the images. No extra forward pass
  of the encoder is made: a forward hook on the encoder keeps its output while the training
  step runs (:meth:`OnlineProbe.capturing`). At each epoch's end its accuracy on the val split
  (at most :data:`VAL_SAMPLES` images, a seeded sample) is the record's
  ``online_probe_accuracy``.
* **kNN monitor** (solo-learn's and lightly's online kNN): a fixed, seeded sample of at most
  :data:`KNN_BANK` training images, whose features are extracted again at each epoch's end (eval
  mode), is the memory of the weighted kNN (:func:`contrastkit.metrics.knn_predict`, the
  read-out's, with the run's ``knn_k`` and ``knn_temperature``) that classifies the same val
  images: ``online_knn_accuracy``.

Neither changes the encoder's training: the features are detached, the head has its own
optimizer, and its initialisation and the epoch's evaluation leave the global RNG states as they
found them. Under torchrun each rank trains the head on its share of the batch with the gradients
averaged over the ranks (the head stays the same on every rank, and equals the head a single
process trains on the whole batch), and evaluates its share of the val images and of the bank;
the counts are summed, so the numbers are the single-process ones for the same weights.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from contrastkit import records
from contrastkit.data import BadItemError, subset_split
from contrastkit.methods import average_gradients
from contrastkit.metrics import knn_predict
from contrastkit.metrics.readout import extract_features, held_out_view_batches, view_retrieval

from .checkpoint import rng_state, set_rng_state
from .parallel import Parallel

__all__ = ["OnlineProbe", "OnlineViewRetrieval", "KNN_BANK", "VAL_SAMPLES", "VIEW_SAMPLES", "PROBE_LR"]

#: Training images in the kNN monitor's memory (a seeded sample; the whole split when smaller).
KNN_BANK = 4096
#: Val images the online numbers are measured on (a seeded sample; the whole split when smaller).
VAL_SAMPLES = 10000
#: The online probe's learning rate (Adam; constant).
PROBE_LR = 1e-3
#: Val images whose two views the online view retrieval matches (the first ones of the split; the
#: label-free read-out's 2,000, which give its top-5 rate to about a percent).
VIEW_SAMPLES = 2000


class OnlineProbe:
    """The online probe's head and optimizer, the kNN monitor's sample, and the last epoch's
    numbers; its :meth:`state_dict` goes into the run's checkpoint.

    Args:
        feature_dim: the size of ``h``; ``num_classes``: the classes of the labels.
        device: where the head trains (the run's device).
        seed: the head's initialisation and the samples of the bank and of val.
        knn_k, knn_temperature: the kNN monitor's neighbors and temperature (the run's read-out's).
        parallel: the run's process group (``contrastkit.train.parallel.Parallel``; default: one process).
    """

    def __init__(self, feature_dim: int, num_classes: int, device: torch.device, *, seed: int, knn_k: int,
                 knn_temperature: float, parallel: Any = None) -> None:
        self.num_classes, self.seed, self.device = int(num_classes), int(seed), device
        self.knn_k, self.knn_temperature = int(knn_k), float(knn_temperature)
        self.parallel = parallel or Parallel()
        with torch.random.fork_rng(devices=[]):  # the run's own RNG stream is left as it was
            torch.manual_seed(self.seed)
            self.head = nn.Linear(int(feature_dim), self.num_classes)
        self.head.to(device)
        self.optimizer = torch.optim.Adam(self.head.parameters(), lr=PROBE_LR)
        self.steps = 0  # steps the head was trained (0: no training batch carried labels yet)
        self.last: Dict[str, float] = {}  # the last epoch's numbers (the summary's)
        self._kept: List[Tensor] = []
        self._capturing = False
        self._hook: Any = None

    # -- during the step ------------------------------------------------------------------
    def attach(self, encoder: nn.Module) -> None:
        """Keep ``encoder``'s output while :meth:`capturing` (a forward hook; read-only)."""
        self._hook = encoder.register_forward_hook(self._keep)

    def detach(self) -> None:
        """Remove the hook :meth:`attach` added."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _keep(self, module: nn.Module, inputs: Any, output: Any) -> None:
        # Only the forward that trains (grad enabled): a micro-batched step's first pass,
        # without a graph, is replayed with one, and each row is kept once.
        if self._capturing and torch.is_grad_enabled() and isinstance(output, Tensor):
            self._kept.append(output.detach())

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """The training step's forward pass runs inside: the encoder's outputs are kept for
        :meth:`train_step`."""
        self._kept, self._capturing = [], True
        try:
            yield
        finally:
            self._capturing = False

    def train_step(self, labels: Optional[Tensor]) -> None:
        """One step of the head on the ``h`` kept by :meth:`capturing` and the batch's
        ``labels`` ``(N,)`` (nothing without labels). The kept rows are ``k`` blocks of the
        batch's rows in order per encoder call (``cat([view_a, view_b])``: ``k = 2``; a
        micro-batched step's calls are consecutive parts of the batch). No value is read back
        from the device."""
        kept, self._kept = self._kept, []
        if labels is None or not kept:
            return
        n = int(labels.shape[0])
        rows = sum(int(h.shape[0]) for h in kept)
        if n == 0 or rows % n:
            raise ValueError(f"the online probe got {rows} rows of h for a batch of {n}: the encoder's calls in a "
                             "step must hold each image of the batch the same number of times")
        k, start, parts = rows // n, 0, []
        labels = labels.to(self.device)
        for h in kept:
            part = int(h.shape[0]) // k
            parts.append(labels[start:start + part].repeat(k))
            start += part
        features = torch.cat([h.flatten(1) for h in kept]).float().to(self.device)
        with torch.autocast(device_type=self.device.type, enabled=False):
            loss = nn.functional.cross_entropy(self.head(features), torch.cat(parts))
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)  # (not Tensor.backward: a step's one Tensor.backward stays the encoder's loss)
        average_gradients(self.head.parameters())  # each rank's share of an equal split: the global batch's mean
        self.optimizer.step()
        self.steps += 1

    # -- at the epoch's end ---------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, encoder: nn.Module, dataset: Any, *, workers: int = 0) -> Dict[str, float]:
        """The epoch's numbers (every rank calls it): ``online_knn_accuracy`` and, once the
        head has trained, ``online_probe_accuracy``, on the val sample. The RNG states are
        restored afterwards (a loader drawing its seed does not move the training's stream)."""
        bank_rows = _sample(len(dataset.train), KNN_BANK, self.seed)
        val_rows = _sample(len(dataset.val), VAL_SAMPLES, self.seed + 1)
        with _reading(self.parallel):
            bank_x = self._features(encoder, dataset.train, bank_rows[self._share(len(bank_rows))], workers)
            val_x = self._features(encoder, dataset.val, val_rows[self._share(len(val_rows))], workers)
        # The whole bank on every rank, in the sample's order (each rank extracted rows r::world).
        pieces = self.parallel.gather_objects(bank_x)
        memory = np.empty((len(bank_rows), pieces[0].shape[1]), dtype=np.float32)
        for rank, piece in enumerate(pieces):
            memory[self._share(len(bank_rows), rank)] = piece
        bank_y = dataset.train.labels.cpu().numpy()[bank_rows]
        val_y = dataset.val.labels.cpu().numpy()[val_rows[self._share(len(val_rows))]]
        counts = torch.zeros(3, dtype=torch.float64)
        if len(val_y):
            predicted = knn_predict(memory, bank_y, val_x, k=self.knn_k, temperature=self.knn_temperature,
                                    num_classes=self.num_classes)
            counts[0] = float((predicted == val_y).sum())
            logits = self.head(torch.from_numpy(val_x).to(self.device))
            counts[1] = float((logits.argmax(1).cpu().numpy() == val_y).sum())
            counts[2] = float(len(val_y))
        counts = self.parallel.reduce(counts, "sum")
        numbers = {records.ONLINE_KNN_ACCURACY: float(counts[0] / counts[2])}
        if self.steps:
            numbers[records.ONLINE_PROBE_ACCURACY] = float(counts[1] / counts[2])
        self.last = numbers
        return numbers

    def _share(self, n: int, rank: Optional[int] = None) -> slice:
        """Rank ``rank``'s (default: this rank's) rows of ``n``: every ``world_size``-th."""
        return slice(self.parallel.rank if rank is None else rank, n, self.parallel.world_size)

    def _features(self, encoder: nn.Module, split: Any, rows: np.ndarray, workers: int) -> np.ndarray:
        """``h`` of the images ``rows`` of ``split`` (``(m, d)`` float32, eval mode)."""
        mine = rows
        if not len(mine):
            return np.zeros((0, self.head.in_features), dtype=np.float32)
        images = getattr(split, "images", None)
        part = images[torch.from_numpy(mine)] if isinstance(images, Tensor) else subset_split(split, mine.tolist())
        return extract_features(encoder, part, self.device, workers=workers).reshape(len(mine), -1)

    # -- the checkpoint -------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "last": dict(self.last)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state.get("steps", 0))
        self.last = {str(k): float(v) for k, v in dict(state.get("last", {})).items()}


class OnlineViewRetrieval:
    """The online read-out of a run on images without labels: the view retrieval of a fixed
    held-out set at each epoch's end (the module docstring). It trains nothing, so it has no
    hook and no step; the same protocol as :class:`OnlineProbe` (``attach``, ``capturing``,
    ``train_step``, ``evaluate``, ``last``, ``state_dict``), so the run holds either.

    Args:
        views: the run's read-out view maker (``views_of(images) -> (view_a, view_b)``).
        device: where the encoder runs; ``seed``: the views' seed (the run's).
        parallel: the run's process group (default: one process). Each rank reads its share of
            each batch's views (every ``world_size``-th image), the features are gathered, and
            every rank computes the same numbers as one process would.
        batch_size: the images whose views are made and read at a time.
    """

    def __init__(self, views: Any, device: torch.device, *, seed: int, parallel: Any = None,
                 batch_size: int = 256) -> None:
        self.views, self.device, self.seed, self.batch_size = views, device, int(seed), int(batch_size)
        self.parallel = parallel or Parallel()
        self.last: Dict[str, float] = {}

    def attach(self, encoder: nn.Module) -> None:
        """Nothing: the view retrieval reads no training step."""

    def detach(self) -> None:
        """Nothing (:meth:`attach` added no hook)."""

    def capturing(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def train_step(self, labels: Optional[Tensor]) -> None:
        """Nothing: there is no head to train."""

    @torch.no_grad()
    def evaluate(self, encoder: nn.Module, dataset: Any, *, workers: int = 0) -> Dict[str, float]:
        """The epoch's ``online_view_retrieval_top1`` and ``_top5`` on the first
        :data:`VIEW_SAMPLES` val images (nothing when val has fewer than 2). Every rank calls it."""
        if len(dataset.val) < 2:
            return {}
        rows: List[np.ndarray] = []
        mine_a: List[np.ndarray] = []
        mine_b: List[np.ndarray] = []
        start, rank, world = 0, self.parallel.rank, self.parallel.world_size
        with _reading(self.parallel):
            for view_a, view_b in held_out_view_batches(dataset.val, self.views, max_samples=VIEW_SAMPLES,
                                                        seed=self.seed, batch_size=self.batch_size, workers=workers):
                n = int(view_a.shape[0])
                mine = torch.arange((rank - start) % world, n, world)
                if len(mine):
                    for kept, views in ((mine_a, view_a), (mine_b, view_b)):
                        kept.append(extract_features(encoder, views[mine.to(views.device)], self.device)
                                    .reshape(len(mine), -1))
                    rows.append(mine.numpy() + start)
                start += n
        if start < 2:  # (a val split whose files were skipped as damaged: nothing to retrieve among)
            return {}
        pieces = self.parallel.gather_objects((np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64),
                                               _rows_of(mine_a), _rows_of(mine_b), start))
        filled = [piece for piece in pieces if len(piece[0])]  # (a rank may have had no rows)
        order = np.concatenate([piece[0] for piece in filled])
        if any(piece[3] != start for piece in pieces) or np.unique(order).size != start:
            # The ranks read different images (a file skipped by one rank, changed since the other
            # read it): no number rather than a wrong one, this epoch.
            warnings.warn(f"the online view retrieval gives no numbers this epoch: its processes read "
                          f"{sorted({piece[3] for piece in pieces})} val images", stacklevel=1)
            return {}
        h_a = np.empty((start, filled[0][1].shape[1]), dtype=np.float32)
        h_b = np.empty_like(h_a)
        h_a[order] = np.concatenate([piece[1] for piece in filled])
        h_b[order] = np.concatenate([piece[2] for piece in filled])
        numbers = view_retrieval(torch.from_numpy(h_a), torch.from_numpy(h_b))
        self.last = {f"online_{key}": value for key, value in numbers.items()}
        return dict(self.last)

    def state_dict(self) -> Dict[str, Any]:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.last = {str(k): float(v) for k, v in dict(state.get("last", {})).items()}


@contextlib.contextmanager
def _reading(parallel: Any) -> Iterator[None]:
    """The online read-out reads images inside: the run's RNG states are restored after it (a
    loader drawing its seed does not move the training's stream), and a damaged file that any
    rank met stops every rank, the others with a pointer to it (they would otherwise wait for
    that rank in the next collective)."""
    state = rng_state()
    damaged: Optional[BadItemError] = None
    try:
        yield
    except BadItemError as err:
        damaged = err
    finally:
        set_rng_state(state)
    if parallel.any(damaged is not None)[0]:
        raise damaged if damaged is not None else BadItemError(
            "a damaged image file, which another process names, in the online read-out's images")


def _rows_of(parts: List[np.ndarray]) -> np.ndarray:
    """``parts`` stacked (an empty ``(0,)`` array without any)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def _sample(n: int, size: int, seed: int) -> np.ndarray:
    """``min(n, size)`` of ``range(n)``, sorted: all of them, or a seeded sample (own generator)."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
