"""Shared construction helpers: device, data set, model (used by training and re-evaluation)."""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from .config import PretrainConfig
from .methods import get_method

__all__ = ["resolve_device", "load_data", "as_run_data", "limit_splits", "build_model", "limit_threads",
           "resolve_threads"]


def resolve_threads(threads: int) -> int:
    """The CPU threads a run with ``threads`` uses: ``threads`` itself, or for ``0`` (the
    default of ``PretrainConfig.threads``) the cores this process may run on
    (``os.sched_getaffinity``, which honours ``taskset`` and container CPU sets), else torch's
    own choice where the platform has no affinity call.

    On a CPU shared with other jobs, OpenMP threads that spin-wait for each other can make a
    multi-threaded step several times slower than a 1-thread one (benchmarks/RESULTS_train.md);
    ``OMP_WAIT_POLICY=PASSIVE`` in the environment, or ``threads=1``, avoids that.
    """
    if threads:
        return int(threads)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return torch.get_num_threads()


@contextlib.contextmanager
def limit_threads(threads: int) -> Iterator[None]:
    """Run with :func:`resolve_threads` ``(threads)`` CPU threads for torch and for the
    BLAS/OpenMP pools scikit-learn uses; the previous settings come back afterwards."""
    threads = resolve_threads(threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # comes with scikit-learn; without it only torch is limited
            yield
        else:
            with threadpool_limits(limits=threads):
                yield
    finally:
        torch.set_num_threads(previous)


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; anything else must be a valid, present device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {name!r} is not a valid torch device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device


def load_data(config: PretrainConfig) -> Any:
    """The data set of ``config.data`` as ``config.method`` reads it (:meth:`Method.load_data`:
    ``contrastkit.data.load_dataset``, or ``contrastkit.data.paired.load_paired`` for the paired
    method convirt), cut to the configured subsets (:func:`limit_splits`)."""
    return limit_splits(get_method(config.method).load_data(config), config)


def limit_splits(dataset: Any, config: PretrainConfig) -> Any:
    """``dataset`` with each split cut to ``config.train_limit`` / ``val_limit`` /
    ``test_limit`` samples (``None``: kept whole), each a class-stratified subset drawn with
    ``config.subset_seed`` (:func:`contrastkit.data.stratified_subset`). The data set is
    returned unchanged when no limit applies; otherwise a shallow copy with the cut splits."""
    import copy

    from contrastkit.data import stratified_subset, stratified_subset_indices, subset_split
    from contrastkit.data.streaming import in_memory

    limits = {"train": config.train_limit, "val": config.val_limit, "test": config.test_limit}
    if all(limit is None or limit >= len(getattr(dataset, name)) for name, limit in limits.items()):
        return dataset
    limited = copy.copy(dataset)
    for name, limit in limits.items():
        if limit is None:
            continue
        split = getattr(dataset, name)
        if in_memory(split):
            cut = stratified_subset(split, limit, config.subset_seed)
        else:  # a streamed split: the same images, chosen from its labels (its file index)
            labels = getattr(split, "labels", None)
            cut = subset_split(split, stratified_subset_indices(None if labels is None else labels.tolist(),
                                                               len(split), limit, config.subset_seed))
        setattr(limited, name, cut)
    return limited


def as_run_data(dataset: Any) -> Any:
    """A data set as a run reads it: a contrastkit data set (in memory or streamed) as it is;
    a user's map-style ``torch.utils.data.Dataset`` of ``(image, label)``, or a dict of them
    with the key ``train`` (and ``val``, ``test``), streamed
    (:func:`~contrastkit.data.as_streaming`)."""
    from contrastkit.data.streaming import as_streaming

    if hasattr(dataset, "train") and hasattr(dataset, "image_shape"):
        return dataset
    if isinstance(dataset, dict):
        unknown = sorted(set(dataset) - {"train", "val", "test"})
        if unknown or "train" not in dataset:
            raise ValueError(f"a dict of data sets needs the key 'train' (and optionally 'val', 'test'), got "
                             f"{sorted(dataset)}")
        return as_streaming(**dataset)
    return as_streaming(dataset)


def build_model(config: PretrainConfig, image_shape: Union[int, Sequence[int]], tokenizer: Any = None, *,
                encoder: Optional[nn.Module] = None) -> Any:
    """The model at its initialisation for ``config.seed``: the one place a run's model, its
    random-init baseline, and the model of a finished run (``probe``, ``embed``) are built.

    Args:
        config: the run's configuration; ``config.encoder`` / ``config.encoder_options`` say
            which encoder (:func:`~contrastkit.models.encoder_from_spec`).
        image_shape: the data's ``(C, H, W)`` (or only ``C``: the dry forward then assumes
            32x32, and is skipped for an encoder that declares ``out_dim``).
        tokenizer: the run's text tokenizer (convirt).
        encoder: a module to use instead of ``config.encoder`` (copied, never modified: the
            copy is trained, so the baseline built from the same module is its initialisation).

    The encoder is checked by one dry forward (:func:`~contrastkit.models.prepare_encoder`),
    and the projection head is built on the feature size it finds. The global RNG is left
    untouched, so the random-init baseline can be rebuilt at any time with identical weights.
    """
    from contrastkit.models import encoder_from_spec, prepare_encoder

    shape = (int(image_shape), 32, 32) if isinstance(image_shape, int) else tuple(int(s) for s in image_shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if encoder is not None:
            module, name = copy.deepcopy(encoder), f"{type(encoder).__module__}.{type(encoder).__qualname__}"
        else:
            options = dict(config.encoder_options)
            if config.norm is not None and ":" not in config.encoder:  # --norm of the built-in networks
                options.setdefault("norm", config.norm)
            module, name = encoder_from_spec(config.encoder, shape[0], options), config.encoder
        if not isinstance(image_shape, int) or getattr(module, "out_dim", None) is None:
            module = prepare_encoder(module, shape, name=repr(name))
        return get_method(config.method).build_model(config, shape[0], tokenizer, encoder=module)
