"""Shared construction helpers: device, data set, model (used by training and re-evaluation)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from .config import PretrainConfig
from .methods import ContrastiveModel

__all__ = ["resolve_device", "load_data", "build_model", "limit_threads"]


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
    """``contrastkit.data.load_dataset(config.data, seed=config.seed, **config.data_options)``
    (``contrastkit.data.paired.load_paired`` for the paired method convirt)."""
    if config.paired:
        from contrastkit.data.paired import load_paired

        return load_paired(config.data, seed=config.seed, **config.data_options)
    from contrastkit.data import load_dataset

    return load_dataset(config.data, seed=config.seed, **config.data_options)


def build_model(config: PretrainConfig, in_channels: int, tokenizer: Any = None) -> Any:
    """The model at its initialisation for ``config.seed``; the global RNG is left untouched,
    so the random-init baseline can be rebuilt at any time with identical weights. convirt
    also needs the run's text ``tokenizer``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        if config.paired:
            from .convirt import ConvirtModel

            if tokenizer is None:
                raise ValueError("convirt needs the run's text tokenizer to build its model")
            return ConvirtModel(config.encoder, in_channels, tokenizer, temperature=config.temperature,
                                learnable_temperature=config.learnable_temperature, weight=config.weight,
                                projection_dim=config.projection_dim, text_encoder=config.text_encoder)
        return ContrastiveModel(
            config.method, config.encoder, in_channels,
            temperature=config.temperature, learnable_temperature=config.learnable_temperature,
            projection_dim=config.projection_dim, momentum=config.momentum, queue_size=config.queue_size,
        )
