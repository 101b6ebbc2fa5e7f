"""What a run learned, shown on its own held-out images: the data of the "neighbors" and "map"
pictures of a report, computed from the run folder when the report is written.

The run is read back through :func:`contrastkit.train.runs.load_run` (its configuration and
checkpoint) and its own data (:meth:`~contrastkit.train.runs.SavedRun.load_data`: the same
loader, options and subsets as in training; a class-folder tree is opened streamed, so only
the sample below is decoded). The random-init encoder is the run's network at its
initialisation (:meth:`~contrastkit.train.runs.SavedRun.build_untrained`), the baseline of the
read-out.

The pictures use a sample of the held-out (test) split: :data:`PICTURE_SAMPLE` images, a
class-stratified subset drawn with a fixed seed, so every run on the same data (the runs of a
sweep) shows the same queries. Why 1000: it is 100 images per class of CIFAR-10, enough that a
query's 6 nearest neighbors are chosen among many images of every class, while encoding them
twice (trained and random-init) and the t-SNE map stay a few seconds on a CPU (measured in
``benchmarks/results/pictures.md``). A smaller split is used whole.

The map is t-SNE (scikit-learn's ``TSNE``, exact neighbors of the encoder's ``h`` under cosine
distance, PCA initialisation, fixed seed). Why t-SNE and not UMAP: scikit-learn is already what
the read-out needs, so the map needs no new dependency; at 1000 points t-SNE's cost (seconds)
is not where UMAP's speed would matter; and t-SNE with PCA initialisation and a fixed seed is
deterministic. Its axes mean nothing and distances between far clusters are not to scale:
what the map shows is which images end up together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import numpy as np
import torch

__all__ = ["HeldOutPictures", "held_out_pictures", "encode", "open_run_data", "pick_queries", "nearest",
           "PICTURE_SAMPLE", "QUERIES", "NEIGHBORS", "SAMPLE_SEED", "PICTURE_ERRORS"]

#: Held-out images the neighbors and the map are drawn from (see the module docstring).
PICTURE_SAMPLE = 1000
#: Query images of the neighbors picture (one per class in turn).
QUERIES = 8
#: Nearest neighbors shown per query.
NEIGHBORS = 6
#: The seed of the sample (the same for every run, so that a sweep's runs share their queries).
SAMPLE_SEED = 0
#: What stops the pictures of held-out images (a run's data or checkpoint cannot be read): the
#: page says why, in one line, instead of failing.
PICTURE_ERRORS = (OSError, ValueError, RuntimeError, ImportError, KeyError)


@dataclass
class HeldOutPictures:
    """A held-out sample of a run's data with what its trained and random-init encoders make of it.

    ``positions`` index the sample (``0 .. n-1``); ``indices`` are the sample's indices in the
    split ``split``. ``trained`` / ``untrained``: the ``h`` of each image (L2-normalised)."""

    split: str
    indices: np.ndarray
    images: torch.Tensor
    labels: Optional[np.ndarray]
    class_names: List[str]
    trained: np.ndarray
    untrained: Optional[np.ndarray]
    queries: List[int]
    embedding: Optional[np.ndarray] = None  # (n, 2) the map
    map_method: str = ""
    seconds: Dict[str, float] = field(default_factory=dict)

    def label(self, position: int) -> Optional[int]:
        return None if self.labels is None else int(self.labels[position])

    def label_name(self, position: int) -> str:
        label = self.label(position)
        if label is None:
            return ""
        return self.class_names[label] if label < len(self.class_names) else str(label)

    def neighbors(self, trained: bool = True, k: int = NEIGHBORS) -> List[List[int]]:
        """The ``k`` nearest sample positions of each query (cosine of ``h``, the query itself left out)."""
        features = self.trained if trained else self.untrained
        if features is None:
            return []
        return [nearest(features, q, k) for q in self.queries]


def nearest(features: np.ndarray, query: int, k: int) -> List[int]:
    """The ``k`` rows of ``features`` most similar to row ``query`` by cosine (itself left out),
    most similar first, ties to the lower row: :func:`contrastkit.metrics.search.nearest`."""
    from contrastkit.metrics.search import nearest as search_nearest

    table = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    found = search_nearest(table[query:query + 1], table, min(k, table.shape[0] - 1),
                           exclude=torch.tensor([query]))
    return [int(i) for i in found.indices[0].tolist()]


def pick_queries(labels: Optional[np.ndarray], n: int, count: int = QUERIES) -> List[int]:
    """``count`` sample positions: the first image of each class in turn (class 0, 1, ...,
    then the second of each), or evenly spaced positions without labels."""
    count = min(count, n)
    if labels is None:
        return sorted({int(round(i * (n - 1) / max(count - 1, 1))) for i in range(count)})
    by_class: Dict[int, List[int]] = {}
    for position, label in enumerate(labels.tolist()):
        by_class.setdefault(int(label), []).append(position)
    chosen: List[int] = []
    rank = 0
    while len(chosen) < count:
        added = False
        for label in sorted(by_class):
            if rank < len(by_class[label]) and len(chosen) < count:
                chosen.append(by_class[label][rank])
                added = True
        if not added:
            break
        rank += 1
    return chosen


def open_run_data(saved: Any) -> Any:
    """The run's data set as it trained (:meth:`~contrastkit.train.runs.SavedRun.load_data`);
    a class-folder tree opened streamed (the same splits and subsets, only the index read), so
    that the pictures decode only their sample. An unlabeled collection that changed since
    the run is read as the run recorded it, the files gone left out (the pictures show the
    run's data)."""
    config = saved.config
    from contrastkit.methods import get_method

    if not get_method(config.method).paired and "stream" not in config.data_options:
        try:
            return saved.load_data(config.data, {**config.data_options, "stream": True}, collection_changed="keep")
        except ValueError:
            pass  # not a folder of images: opened as it trained
    return saved.load_data(collection_changed="keep")


def _normalised(features: np.ndarray) -> np.ndarray:
    features = features.astype(np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.where(norms > 0, norms, 1.0)


def _map(features: np.ndarray, seed: int = SAMPLE_SEED) -> np.ndarray:
    from sklearn.manifold import TSNE

    n = features.shape[0]
    perplexity = float(min(30.0, max(2.0, (n - 1) / 3.0)))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", metric="cosine", random_state=seed,
                learning_rate="auto").fit_transform(features.astype(np.float32))


def encode(saved: Any, images: torch.Tensor, device: torch.device, *, trained: bool = True,
           image_shape: Any = None) -> np.ndarray:
    """The L2-normalised ``h`` of ``images`` under the run's trained encoder (``trained``) or
    the same network at its initialisation."""
    from contrastkit.metrics.readout import extract_features

    shape = tuple(image_shape if image_shape is not None else images.shape[1:])
    encoder = (saved.build_model(shape, device) if trained else saved.build_untrained(shape).to(device)).encoder
    return _normalised(extract_features(encoder, images, device))


def held_out_pictures(run_dir: str, *, sample: int = PICTURE_SAMPLE, with_map: bool = True,
                      untrained: bool = True, device: str = "auto", saved: Any = None,
                      dataset: Any = None) -> HeldOutPictures:
    """The held-out sample of the run in ``run_dir`` encoded by its trained encoder (and its
    random-init one, ``untrained``), the queries and, ``with_map``, the t-SNE map of the trained
    ``h``. ``saved`` / ``dataset``: the run and its data, if already read."""
    from contrastkit.data import stratified_subset_indices, unit_float
    from contrastkit.data.loader import read_present_images
    from contrastkit.train.runs import load_run
    from contrastkit.train.setup import limit_threads, resolve_device

    seconds: Dict[str, float] = {}
    started = time.perf_counter()
    saved = load_run(run_dir) if saved is None else saved
    with limit_threads(saved.config.threads):
        dataset = open_run_data(saved) if dataset is None else dataset
        seconds["data"] = time.perf_counter() - started
        name, split = ("test", dataset.test) if len(dataset.test) else ("val", dataset.val)
        if len(split) < 2:
            raise ValueError(f"the held-out split of {saved.config.data} has {len(split)} image(s); the pictures need 2")
        labels = getattr(split, "labels", None)
        labels_np = None if labels is None else labels.cpu().numpy()
        indices = stratified_subset_indices(None if labels_np is None else labels_np.tolist(), len(split), sample,
                                            SAMPLE_SEED)
        step = time.perf_counter()
        images, read = read_present_images(split, torch.from_numpy(indices))
        indices = read.numpy()  # without the damaged files an unlabeled collection skips
        if len(indices) < 2:
            raise ValueError(f"the held-out split of {saved.config.data} has {len(indices)} readable image(s); the "
                             "pictures need 2")
        images = unit_float(images)
        seconds["read"] = time.perf_counter() - step
        torch_device = resolve_device(device)
        shape = tuple(dataset.image_shape)
        step = time.perf_counter()
        trained = encode(saved, images, torch_device, image_shape=shape)
        base = encode(saved, images, torch_device, trained=False, image_shape=shape) if untrained else None
        seconds["encode"] = time.perf_counter() - step
        sample_labels = None if labels_np is None else labels_np[indices]
        pictures = HeldOutPictures(name, indices, images, sample_labels, list(getattr(dataset, "class_names", []) or []),
                                   trained, base, pick_queries(sample_labels, len(indices)))
        if with_map and len(indices) >= 5:
            step = time.perf_counter()
            pictures.embedding = _map(trained)
            pictures.map_method = "t-SNE"
            seconds["map"] = time.perf_counter() - step
    seconds["total"] = time.perf_counter() - started
    return replace(pictures, seconds=seconds)
