"""The last training batch of a run, kept for its pictures: ``RUN/last_batch.pt``.

At the last step of a run the trainer keeps what that step's loss saw (its method's
:class:`~contrastkit.metrics.batch.BatchProblem`: the similarity matrix, the positives, what
each row and column is) with the batch's training indices and labels, the images of a few of
its elements as the run made them (both augmented views, or the image of an image-text pair,
as uint8) and their source images and texts. ``contrastkit report`` draws the "views" and "one
real batch" pictures from it, ``contrastkit explore RUN`` takes its rows.

Why a file rather than recomputing at report time: the views are random draws and the
embeddings are those of the training step (the model in training mode, BatchNorm on the
batch's statistics, MoCo's queue as it was); no later forward pass reproduces them. The file
is small: the similarities (``M x K`` float32, 1 MiB for SimCLR's ``2B = 512``) and at most
:data:`MAX_PICTURES` images; a problem larger than :data:`MAX_ENTRIES` similarities (a MoCo
queue of 65536 keys) keeps no matrix, and the report says so.

The file is written with ``torch.save`` and read with ``weights_only=True`` (tensors, numbers,
strings, lists and dicts only). It is listed in the run's manifest, so ``--force`` deletes it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from contrastkit import layout
from contrastkit._io import one_line
from contrastkit.data.loader import read_images
from contrastkit.metrics.batch import IMAGE, TEXT, VIEW_A, VIEW_B, BatchProblem
from contrastkit.models import TensorFileError, load_tensors
from contrastkit.run_writer import RunWriter

__all__ = ["LastBatch", "save_last_batch", "read_last_batch", "FORMAT", "SHOWN_ELEMENTS", "HARDEST_SHOWN",
           "MAX_ENTRIES", "MAX_PICTURES", "MAX_SIDE", "ANCHOR_ROLES"]

#: The file's format version.
FORMAT = 1
#: Elements of the batch shown with their views (the first ones of the batch, which is shuffled).
SHOWN_ELEMENTS = 12
#: Hardest negatives kept as images for each anchor the pictures and the explorer show.
HARDEST_SHOWN = 8
#: The largest similarity matrix kept (entries): 16 MiB of float32.
MAX_ENTRIES = 1 << 22
#: At most this many images are kept.
MAX_PICTURES = 128
#: Images larger than this (pixels, either side) are kept downscaled to it.
MAX_SIDE = 128
#: The anchors kept for the pictures and the explorer: the lowest, median and highest p+ of the batch.
ANCHOR_ROLES = ("lowest", "median", "highest")


def _uint8(images: Tensor) -> Tensor:
    """Images ``(b, C, H, W)`` (float in [0, 1] or uint8) as uint8 on the CPU, at most :data:`MAX_SIDE`."""
    images = images.detach()
    if images.dtype != torch.uint8:
        images = (images.float().clamp(0, 1) * 255).round().to(torch.uint8)
    h, w = images.shape[-2:]
    if max(h, w) > MAX_SIDE:
        scale = MAX_SIDE / max(h, w)
        size = (max(1, round(h * scale)), max(1, round(w * scale)))
        images = torch.nn.functional.interpolate(images.float(), size=size, mode="bilinear", antialias=True,
                                                 align_corners=False).round().clamp(0, 255).to(torch.uint8)
    return images.cpu().contiguous()


def _key(item: int, view: int) -> str:
    return f"{item}:{view}"


def save_last_batch(writer: RunWriter, problem: BatchProblem, batch: Any, indices: Tensor, dataset: Any,
                    *, method: str, temperature: float, step: int, epoch: int, images: Optional[Tensor] = None,
                    labels: Optional[Tensor] = None, keys: Optional[List[str]] = None,
                    texts: Optional[List[str]] = None) -> None:
    """Write ``last_batch.pt`` through the run folder's ``writer`` from the last step's ``problem`` (on any device), its
    ``batch`` (as the method's batch maker made it: ``batch[0]`` view A or the images,
    ``batch[1]`` view B), the training ``indices`` of its elements and the ``dataset``.
    ``images``, ``labels``, ``keys``, ``texts``: the batch's decoded images ``(b, C, H, W)``,
    labels, sample keys and captions as its batch source gave them (a stream's batch has no
    index to read them by); by default read from ``dataset.train`` by ``indices``."""
    from contrastkit.analysis import explain

    m, k = problem.shape
    positive = problem.positive.detach().cpu().long()
    record: Dict[str, Any] = {
        "format": FORMAT, "method": method, "step": int(step), "epoch": int(epoch),
        "temperature": float(temperature), "description": problem.description,
        "exclude_diagonal": bool(problem.exclude_diagonal), "shape": [int(m), int(k)],
        "positive": positive,
        "row_items": problem.row_items.detach().cpu().long(), "row_views": problem.row_views.detach().cpu().long(),
        "column_items": problem.column_items.detach().cpu().long(),
        "column_views": problem.column_views.detach().cpu().long(),
        "indices": indices.detach().cpu().long(),
        "class_names": [str(name) for name in (getattr(dataset, "class_names", None) or [])],
    }
    if keys is not None:
        record["keys"] = [str(key) for key in keys]
    if labels is None and keys is None:
        labels = getattr(dataset.train, "labels", None)
        labels = None if labels is None else labels[record["indices"]]
    record["labels"] = None if labels is None else labels.detach().cpu().long()
    anchors: Dict[str, int] = {}
    wanted: List[Tuple[int, int]] = []  # (element, view) pairs whose image is kept
    n = int(indices.shape[0])
    shown = list(range(min(SHOWN_ELEMENTS, n)))
    views = sorted({int(v) for v in problem.row_views.tolist() + problem.column_views.tolist()}
                   & {VIEW_A, VIEW_B, IMAGE})
    wanted += [(item, view) for item in shown for view in views]
    if m * k <= MAX_ENTRIES:  # (a larger matrix is never formed: the report says it is not kept)
        similarities = problem.matrix().detach().float().cpu()
        record["similarities"] = similarities
        e = explain(similarities.double(), temperature=float(temperature), positive=positive.tolist(),
                    exclude_diagonal=bool(problem.exclude_diagonal))
        order = torch.from_numpy(e.positive_probability).argsort(stable=True)
        anchors = {"lowest": int(order[0]), "median": int(order[(m - 1) // 2]), "highest": int(order[-1])}
        negative = torch.from_numpy(e.in_denominator).clone()
        negative[torch.arange(m), positive] = False
        for row in dict.fromkeys(anchors.values()):
            wanted.append((int(problem.row_items[row]), int(problem.row_views[row])))
            columns = [int(positive[row])] + similarities[row].masked_fill(~negative[row], -math.inf) \
                .topk(min(HARDEST_SHOWN, int(negative[row].sum()))).indices.tolist()
            for column in columns:
                item = problem.item_of(row, column)
                if item >= 0:
                    wanted.append((item, int(problem.column_views[column])))
    record["anchors"] = anchors
    pictures: Dict[str, Tensor] = {}
    for item, view in list(dict.fromkeys(wanted))[:MAX_PICTURES]:
        if view in (VIEW_A, IMAGE):
            source = batch[0]
        elif view == VIEW_B:
            source = batch[1]
        else:
            continue
        if isinstance(source, Tensor) and source.dim() == 4:
            pictures[_key(item, view)] = _uint8(source[item:item + 1])[0]
    record["pictures"] = pictures
    record["shown"] = shown
    if not shown:
        record["sources"] = None
    elif images is not None and images.dim() == 4:  # decoded by the loader: not read again
        record["sources"] = _uint8(images[torch.tensor(shown)])
    else:
        record["sources"] = _uint8(read_images(dataset.train, record["indices"][shown]))
    text_items = sorted({item for item, _ in wanted} | set(shown)) if TEXT in problem.column_views.tolist() else []
    if texts is not None:  # the batch's own, row by row
        record["texts"] = {str(item): str(texts[item]) for item in text_items}
    else:
        split_texts = getattr(dataset.train, "texts", None)
        record["texts"] = {str(item): str(split_texts[int(record["indices"][item])]) for item in text_items} \
            if split_texts is not None else {}
    writer.write_last_batch(record)


@dataclass
class LastBatch:
    """``RUN/last_batch.pt`` read back (:func:`read_last_batch`)."""

    path: str
    record: Dict[str, Any] = field(repr=False)

    @property
    def method(self) -> str:
        return str(self.record["method"])

    @property
    def temperature(self) -> float:
        return float(self.record["temperature"])

    @property
    def step(self) -> int:
        return int(self.record["step"])

    @property
    def description(self) -> str:
        return str(self.record.get("description", ""))

    @property
    def similarities(self) -> Optional[Tensor]:
        """``(M, K)`` float32, or ``None`` when the matrix was too large to keep."""
        return self.record.get("similarities")

    @property
    def shape(self) -> Tuple[int, int]:
        return tuple(self.record["shape"])  # type: ignore[return-value]

    @property
    def positive(self) -> Tensor:
        return self.record["positive"]

    @property
    def exclude_diagonal(self) -> bool:
        return bool(self.record["exclude_diagonal"])

    @property
    def indices(self) -> Tensor:
        """The training-split index of each element of the batch."""
        return self.record["indices"]

    @property
    def labels(self) -> Optional[Tensor]:
        return self.record.get("labels")

    @property
    def class_names(self) -> List[str]:
        return list(self.record.get("class_names") or [])

    @property
    def shown(self) -> List[int]:
        """The elements shown with their views (positions in the batch)."""
        return list(self.record.get("shown") or [])

    @property
    def anchors(self) -> Dict[str, int]:
        """Row of the anchor with the lowest, median and highest p+ (keys ``"lowest"``, ``"median"``,
        ``"highest"``)."""
        return dict(self.record.get("anchors") or {})

    def explanation(self) -> Any:
        """:func:`contrastkit.analysis.explain` of the whole batch at the run's ``tau``."""
        from contrastkit.analysis import explain

        if self.similarities is None:
            raise ValueError(f"{self.path} keeps no similarity matrix (the batch was larger than "
                             f"{MAX_ENTRIES} similarities)")
        return explain(self.similarities.double(), temperature=self.temperature, positive=self.positive.tolist(),
                       exclude_diagonal=self.exclude_diagonal)

    def row_item(self, row: int) -> Tuple[int, int]:
        """``(element, view)`` of anchor ``row``."""
        return int(self.record["row_items"][row]), int(self.record["row_views"][row])

    def column_item(self, row: int, column: int) -> Tuple[int, int]:
        """``(element, view)`` of candidate ``column`` of anchor ``row`` (element -1: not in the batch)."""
        item = int(self.record["column_items"][column])
        if item == -2:  # the anchor's own element (OWN_ITEM)
            item = int(self.record["row_items"][row])
        return item, int(self.record["column_views"][column])

    def picture(self, item: int, view: int) -> Optional[Tensor]:
        """The kept image ``(C, H, W)`` uint8 of element ``item``'s ``view``, if kept."""
        return (self.record.get("pictures") or {}).get(_key(item, view))

    def source(self, item: int) -> Optional[Tensor]:
        """The training image of shown element ``item`` (before the views were made)."""
        shown = self.shown
        sources = self.record.get("sources")
        return sources[shown.index(item)] if sources is not None and item in shown else None

    def text(self, item: int) -> Optional[str]:
        return (self.record.get("texts") or {}).get(str(item))

    def label(self, item: int) -> Optional[int]:
        labels = self.labels
        return None if labels is None or item < 0 else int(labels[item])

    def label_name(self, item: int) -> Optional[str]:
        label = self.label(item)
        names = self.class_names
        return None if label is None else (names[label] if label < len(names) else str(label))


def read_last_batch(run_dir: str) -> Optional[LastBatch]:
    """``run_dir/last_batch.pt``, or ``None`` when the run has none (it has not finished, or
    was written by an older contrastkit); a damaged file is a ``ValueError`` naming it."""
    path = layout.RunFolder(run_dir).last_batch
    if not os.path.isfile(path):
        return None
    try:
        record = load_tensors(path)
    except (TensorFileError, OSError) as err:
        raise ValueError(f"{path} cannot be read ({err.reason if isinstance(err, TensorFileError) else one_line(err)}); "
                         "run the training again to write it") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a last-batch file of this contrastkit (format "
                         f"{record.get('format') if isinstance(record, dict) else '?'}, expected {FORMAT})")
    return LastBatch(path, record)
