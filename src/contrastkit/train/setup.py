"""Shared construction helpers: device, data set, model (used by training and re-evaluation)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from .config import PretrainConfig
from .methods import get_method

__all__ = ["resolve_device", "load_data", "limit_splits", "build_model", "limit_threads"]


@contextlib.contextmanager
def limit_threads(threads: int) -> Iterator[None]:
    """Run with ``threads`` CPU threads for torch and for the BLAS/OpenMP pools scikit-learn
    uses (0: leave the process settings alone); the previous settings come back afterwards.

    Why the default is 1: on a CPU shared with other jobs, a 2-thread small-CNN step ran 6x
    slower than a 1-thread one (threads spin-waiting for each other; benchmarks/RESULTS_train.md).
    """
    if not threads:
        yield
        return
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

    from contrastkit.data import stratified_subset

    limits = {"train": config.train_limit, "val": config.val_limit, "test": config.test_limit}
    if all(limit is None or limit >= len(getattr(dataset, name)) for name, limit in limits.items()):
        return dataset
    limited = copy.copy(dataset)
    for name, limit in limits.items():
        if limit is not None:
            setattr(limited, name, stratified_subset(getattr(dataset, name), limit, config.subset_seed))
    return limited


def build_model(config: PretrainConfig, in_channels: int, tokenizer: Any = None) -> Any:
    """The model at its initialisation for ``config.seed``; the global RNG is left untouched,
    so the random-init baseline can be rebuilt at any time with identical weights. convirt
    also needs the run's text ``tokenizer``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return get_method(config.method).build_model(config, in_channels, tokenizer)
