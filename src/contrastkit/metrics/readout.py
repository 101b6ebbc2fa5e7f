"""The fixed read-out protocol applied to encoders: frozen ``h`` features of the un-augmented
train / val / test images -> linear probe with C chosen on val (:func:`~contrastkit.metrics.linear_probe`)
and weighted kNN (:func:`~contrastkit.metrics.knn_accuracy`).

Baselines read out the same way: the same architecture at its random initialisation and the raw
pixels. Neither depends on a training run, so a caller may keep their numbers
(:class:`BaselineStore`; ``contrastkit pretrain`` keeps them in its baseline cache).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple

import numpy as np
import torch
from torch import nn

from contrastkit import records
from contrastkit.data import DataSplits, compact_images, image_batches, unit_float

from .probe import knn_accuracy, linear_probe

__all__ = ["extract_features", "pixel_features", "baseline_pixel_images", "RAW_PIXEL_SIDE", "evaluate_features",
           "evaluate_encoders", "BaselineStore",
           "held_out_views", "held_out_view_batches", "view_retrieval", "label_free_numbers", "evaluate_without_labels", "LABEL_FREE_SAMPLES",
           "LABEL_FREE_ROWS", "ReadoutPartFailed", "readout_part"]


class ReadoutPartFailed(RuntimeError):
    """A part of the read-out (``part``: "the trained encoder", "the raw-pixel baseline", ...)
    ran out of memory or failed in torch. ``exit_status`` 1: ``contrastkit probe`` says so in
    one line (the part and the first line of the cause), not in a traceback."""

    exit_status = 1

    def __init__(self, part: str, cause: BaseException) -> None:
        reason = (str(cause).strip().splitlines() or [""])[0] or type(cause).__name__
        super().__init__(f"the read-out of {part} failed ({type(cause).__name__}: {reason[:300]})")
        self.part = part


@contextlib.contextmanager
def readout_part(part: str) -> Iterator[None]:
    """Name ``part`` in a :class:`ReadoutPartFailed` if it runs out of memory or torch fails in it
    (``MemoryError``, ``RuntimeError``: a refused allocation); other errors pass unchanged."""
    try:
        yield
    except ReadoutPartFailed:
        raise
    except (MemoryError, RuntimeError) as err:
        raise ReadoutPartFailed(part, err) from err


class BaselineStore(Protocol):
    """Where :func:`evaluate_encoders` gets a baseline's numbers: ``numbers(kind, compute,
    encoder)`` returns those kept for ``kind`` (``"raw_pixel"`` or ``"random_init"``, with its
    untrained ``encoder``) on the data set it was made for, or ``compute()`` (and may keep them)."""

    def numbers(self, kind: str, compute: Callable[[], Dict[str, Any]],
                encoder: Optional[nn.Module] = None) -> Dict[str, Any]: ...


@torch.no_grad()
def extract_features(encoder: nn.Module, images: Any, device: torch.device, batch_size: int = 256, *,
                     workers: int = 0) -> np.ndarray:
    """``h`` of ``images`` in eval mode (BatchNorm uses running statistics): ``(n, d)`` float32
    (the precision the read-out computes in).

    ``images`` is a split of any storage (:class:`~contrastkit.data.DataSplit`) or an
    ``(n, C, H, W)`` tensor (float in ``[0, 1]``, or uint8 0..255), read in batches of ``batch_size`` (decoded in
    ``workers`` processes; :func:`~contrastkit.data.image_batches`). The encoder's train/eval
    mode is restored afterwards."""
    was_training = encoder.training
    encoder.eval()
    try:
        chunks = [encoder(_as_model_input(batch.to(device))).float().cpu()
                  for batch in image_batches(images, batch_size, workers)]
    finally:
        encoder.train(was_training)
    return torch.cat(chunks).numpy()


def _as_model_input(batch: torch.Tensor) -> torch.Tensor:
    """uint8 images as the float32 ``k / 255`` the models read; others as they are."""
    return unit_float(batch) if batch.dtype == torch.uint8 else batch


#: The largest side of the images the raw-pixel baseline reads: larger images are averaged down
#: to it (their shape kept). 32 x 32 is the "tiny images" size at which scenes and objects are still
#: recognised (Torralba, Fergus & Freeman 2008, "80 million tiny images"), CIFAR-10's side. It
#: bounds the baseline's features at 3 x 32 x 32 = 3,072 values whatever ``--image-size`` is: at
#: 224 a probe on all 150,528 pixels would need a 150,528-square matrix (181 GB) and its kNN the
#: raw images of every split in memory.
RAW_PIXEL_SIDE = 32


def baseline_pixel_images(images: torch.Tensor) -> torch.Tensor:
    """``(n, C, H, W)`` images as the raw-pixel baseline reads them: unchanged up to
    :data:`RAW_PIXEL_SIDE` a side, else each output pixel the mean of the input pixels it covers
    (``adaptive_avg_pool2d``) at ``RAW_PIXEL_SIDE`` along the longer side (the other side in
    proportion, rounded). uint8 images stay uint8 (the means rounded to the nearest integer)."""
    height, width = images.shape[-2:]
    if max(height, width) <= RAW_PIXEL_SIDE:
        return images
    scale = RAW_PIXEL_SIDE / max(height, width)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    small = torch.nn.functional.adaptive_avg_pool2d(images.float(), size)
    return small.round_().clamp_(0, 255).to(torch.uint8) if images.dtype == torch.uint8 else small.to(images.dtype)


def pixel_features(split: Any, workers: int = 0) -> np.ndarray:
    """The raw-pixel baseline's features of a split: its images (:func:`baseline_pixel_images`)
    flattened, ``(n, C*H*W)``, as uint8 intensities 0..255 when the images are 8-bit (every
    value ``k / 255``: images decoded from files, CIFAR-10, MNIST), which the probe and kNN read
    in exact integer arithmetic at a quarter of the memory, else float32 in ``[0, 1]``."""
    batches = [compact_images(unit_float(baseline_pixel_images(batch.cpu()).reshape(batch.shape[0], -1)))
               for batch in image_batches(split, workers=workers)]
    if any(batch.dtype != torch.uint8 for batch in batches):
        batches = [unit_float(batch) for batch in batches]
    return torch.cat(batches).numpy()


def evaluate_features(train_x: np.ndarray, val_x: np.ndarray, test_x: np.ndarray, dataset: DataSplits, *,
                      knn_k: int = 20, knn_temperature: float = 0.07) -> Dict[str, Any]:
    """Probe (C on val, accuracy on test) and kNN (test vs train memory) on given features
    ``(n, d)`` of the data set's three splits (in order), scored with their labels.
    ``probe_capped_c`` lists the values of C whose probe fit stopped at its evaluation cap
    (:func:`~contrastkit.metrics.linear_probe`; empty when every fit converged)."""
    labels = [split.labels.cpu().numpy() for split in (dataset.train, dataset.val, dataset.test)]
    probe = linear_probe(train_x, labels[0], val_x, labels[1], test_x, labels[2])
    knn = knn_accuracy(train_x, labels[0], test_x, labels[2], k=knn_k, temperature=knn_temperature,
                       num_classes=dataset.num_classes)
    return {records.PROBE_ACCURACY: probe.test_accuracy, "probe_val_accuracy": probe.val_accuracy,
            "probe_c": probe.best_c, "probe_capped_c": probe.capped_c, records.KNN_ACCURACY: knn}


class _ComputeAlways:
    def numbers(self, kind: str, compute: Callable[[], Dict[str, Any]],
                encoder: Optional[nn.Module] = None) -> Dict[str, Any]:
        return compute()


def evaluate_encoders(dataset: DataSplits, encoder: nn.Module, device: torch.device, *,
                      baseline_encoder: Optional[nn.Module] = None, raw_pixels: bool = True,
                      knn_k: int = 20, knn_temperature: float = 0.07, workers: int = 0,
                      baselines: Optional[BaselineStore] = None) -> Dict[str, Any]:
    """The read-out of a trained ``encoder`` on a labelled data set (``summary.json``'s numbers),
    and under the baselines' keys (:func:`contrastkit.records.baseline_key`) those asked for: the
    untrained ``baseline_encoder`` and (``raw_pixels``) the flattened images, taken from
    ``baselines`` when it keeps them (``None``: always computed). Streamed splits are read in
    batches (``workers`` decoding processes)."""
    splits = (dataset.train, dataset.val, dataset.test)
    options = {"knn_k": knn_k, "knn_temperature": knn_temperature}
    store: BaselineStore = _ComputeAlways() if baselines is None else baselines
    # What the encoders read: the splits, or, once the raw-pixel baseline has decoded them at their
    # size (up to RAW_PIXEL_SIDE), its pixels (the same values: the three feature sets decode a
    # streamed split once, not three times; they are the size of the pixel probe's own arrays, so
    # the peak does not grow). Larger images are decoded again rather than held whole.
    sources: List[Any] = list(splits)

    def pixel_numbers() -> Dict[str, Any]:
        pixels = [pixel_features(split, workers) for split in splits]
        if max(dataset.image_shape[1:]) <= RAW_PIXEL_SIDE:  # the pixels are the images themselves
            sources[:] = [torch.from_numpy(x).reshape(x.shape[0], *dataset.image_shape) for x in pixels]
        return evaluate_features(*pixels, dataset, **options)

    def features(model: nn.Module) -> Iterator[np.ndarray]:
        return (extract_features(model, source, device, workers=workers) for source in sources)

    with readout_part("the raw-pixel baseline"):
        pixels = store.numbers(records.RAW_PIXEL, pixel_numbers) if raw_pixels else None
    with readout_part("the trained encoder"):
        result = evaluate_features(*features(encoder), dataset, **options)
    if baseline_encoder is not None:
        with readout_part("the random-init baseline"):
            baseline = store.numbers(records.RANDOM_INIT, lambda: evaluate_features(
                *features(baseline_encoder), dataset, **options), baseline_encoder)
        result.update(records.baseline_numbers(records.RANDOM_INIT, baseline))
    if pixels is not None:
        result.update(records.baseline_numbers(records.RAW_PIXEL, pixels))
    return result


# -- without labels -----------------------------------------------------------------------

#: The label-free read-out as a results table shows it: ``(row title, summary key)``, each key
#: also under each baseline's key (:func:`contrastkit.records.baseline_key`).
LABEL_FREE_ROWS = (("view retrieval top-1", records.VIEW_RETRIEVAL_TOP1),
                   ("view retrieval top-5", "view_retrieval_top5"),
                   ("alignment (lower better)", "alignment"), ("uniformity (lower better)", "uniformity"),
                   ("effective rank", "effective_rank"), ("held-out loss", "heldout_loss"))

#: Held-out images the label-free read-out uses at most (its metrics are O(N^2 d); 2,000 give
#: means and top-5 retrieval rates to about a percent).
LABEL_FREE_SAMPLES = 2000


def held_out_view_batches(split: Any, views: Any, *, max_samples: int = LABEL_FREE_SAMPLES, seed: int = 0,
                          batch_size: int = 256, workers: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """The two augmented views ``(view_a, view_b)`` of :func:`held_out_views` a batch of at most
    ``batch_size`` images at a time, as the view maker returns them (its device and dtype), in
    the split's order: a caller that reads them out batch by batch never holds every view. The
    views are those :func:`held_out_views` returns, whatever the caller does between batches: the
    reading and the views draw from their own CPU generator state, seeded once and swapped in
    around each batch, and the caller's stream is left as it was."""
    own = _seeded_cpu_state(seed)
    batches: Optional[Iterator[torch.Tensor]] = None
    count = 0
    while count < max_samples:
        caller = torch.get_rng_state()  # the caller's CPU stream, left as it was between batches
        torch.set_rng_state(own)
        try:
            with torch.no_grad():
                if batches is None:  # (a loader draws its seed here: from the seeded stream)
                    batches = iter(image_batches(split, batch_size, workers))
                batch = next(batches, None)
                pair = None if batch is None else views.views_of(batch[:max_samples - count])
            own = torch.get_rng_state()
        finally:
            torch.set_rng_state(caller)
        if pair is None:
            return
        count += pair[0].shape[0]
        yield pair


def _seeded_cpu_state(seed: int) -> torch.Tensor:
    """The CPU generator's state after ``torch.manual_seed(seed)``, made by a generator of its
    own (every global one, the GPUs' too, untouched)."""
    return torch.Generator().manual_seed(seed).get_state()


def held_out_views(split: Any, views: Any, *, max_samples: int = LABEL_FREE_SAMPLES, seed: int = 0,
                   batch_size: int = 256, workers: int = 0) -> Any:
    """Two augmented views ``(view_a, view_b)`` ``(n, C, H, W)`` float32 (CPU) of the first
    ``max_samples`` images of ``split`` (any storage, read by :func:`~contrastkit.data.image_batches`),
    made by the view maker's ``views_of`` under ``seed`` in a forked RNG, so that every encoder
    read out on them sees the same views and the caller's RNG stream is left untouched."""
    parts_a, parts_b = [], []
    for view_a, view_b in held_out_view_batches(split, views, max_samples=max_samples, seed=seed,
                                                batch_size=batch_size, workers=workers):
        parts_a.append(view_a.float().cpu())
        parts_b.append(view_b.float().cpu())
    return torch.cat(parts_a), torch.cat(parts_b)


def view_retrieval(h_a: torch.Tensor, h_b: torch.Tensor, ks: tuple = (1, 5), chunk: int = 1024) -> Dict[str, float]:
    """How often each image's second view finds its first among all first views: the share of
    rows ``i`` for which ``h_a[i]`` is within the ``k`` nearest of ``h_b[i]`` by cosine similarity
    (ties counted against it). ``h_a``, ``h_b``: ``(n, d)``."""
    a = torch.nn.functional.normalize(h_a.double(), dim=1)
    b = torch.nn.functional.normalize(h_b.double(), dim=1)
    ranks = []
    for start in range(0, b.shape[0], chunk):
        sims = b[start:start + chunk] @ a.T
        own = sims[torch.arange(sims.shape[0]), torch.arange(start, start + sims.shape[0])]
        ranks.append((sims >= own[:, None]).sum(1) - 1)  # how many others tie or beat the partner
    rank = torch.cat(ranks)
    return {f"view_retrieval_top{k}": float((rank < k).double().mean()) for k in ks}


def label_free_numbers(h_a: torch.Tensor, h_b: torch.Tensor, *, temperature: float, batch_size: int) -> Dict[str, float]:
    """The label-free read-out of two views' features ``(n, d)``: view retrieval top-1 / top-5,
    alignment and uniformity (Wang & Isola 2020, on the normalised features), effective rank
    (Roy & Vetterli 2007, raw features) and the held-out NT-Xent loss at ``temperature`` over
    consecutive batches of ``batch_size`` pairs (the run's)."""
    from contrastkit.losses import nt_xent_views

    from .representation import alignment, effective_rank, uniformity

    losses = []
    for start in range(0, h_a.shape[0], batch_size):
        part_a, part_b = h_a[start:start + batch_size], h_b[start:start + batch_size]
        if part_a.shape[0] >= 2:
            losses.append(float(nt_xent_views(torch.nn.functional.normalize(part_a, dim=1),
                                              torch.nn.functional.normalize(part_b, dim=1),
                                              temperature=temperature)))
    return {**view_retrieval(h_a, h_b), "alignment": alignment(h_a, h_b), "uniformity": uniformity(h_a),
            "effective_rank": effective_rank(h_a), "heldout_loss": float(np.mean(losses))}


def evaluate_without_labels(split: Any, encoder: nn.Module, device: torch.device, views: Any, *,
                            temperature: float, batch_size: int, baseline_encoder: Optional[nn.Module] = None,
                            raw_pixels: bool = True, seed: int = 0, workers: int = 0,
                            max_samples: int = LABEL_FREE_SAMPLES) -> Dict[str, Any]:
    """The read-out of an encoder on a held-out split without labels (:func:`label_free_numbers`
    of its ``h`` on two views of each image, :func:`held_out_views`), and under the baselines'
    keys (:func:`contrastkit.records.baseline_key`) those of the untrained ``baseline_encoder`` and of the flattened
    views themselves, all on the same views; ``label_free_samples`` says how many images."""
    with readout_part("the held-out views"):
        view_a, view_b = held_out_views(split, views, max_samples=max_samples, seed=seed, workers=workers)
    if view_a.shape[0] < 2:
        raise ValueError(f"the label-free read-out needs at least 2 held-out images, got {view_a.shape[0]}")
    options = {"temperature": temperature, "batch_size": batch_size}

    def features(model: nn.Module, views_: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(extract_features(model, views_, device)).double().flatten(1)

    result: Dict[str, Any] = {"label_free_samples": int(view_a.shape[0])}
    with readout_part("the trained encoder"):
        result.update(label_free_numbers(features(encoder, view_a), features(encoder, view_b), **options))
    if baseline_encoder is not None:
        with readout_part("the random-init baseline"):
            numbers = label_free_numbers(features(baseline_encoder, view_a), features(baseline_encoder, view_b),
                                         **options)
        result.update(records.baseline_numbers(records.RANDOM_INIT, numbers))
    if raw_pixels:
        with readout_part("the raw-pixel baseline"):
            numbers = label_free_numbers(baseline_pixel_images(view_a).double().flatten(1),
                                         baseline_pixel_images(view_b).double().flatten(1), **options)
        result.update(records.baseline_numbers(records.RAW_PIXEL, numbers))
    return result
