"""Representation geometry of a model on held-out data: the metrics of
:mod:`contrastkit.metrics.representation` on ``h`` (encoder output) and ``z`` (projection).

Two views of every held-out sample come from the run's own view maker (the same kind of
positive pair the model was trained on), drawn under a fixed seed in a forked RNG, so every
evaluation of a run sees the same views and the training RNG stream is left untouched.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import Tensor, nn

from contrastkit.metrics.representation import representation_metrics

__all__ = ["held_out_embeddings", "geometry"]

#: Held-out samples used at most (the metrics are O(N^2 d) in time; 2000 is plenty for means).
MAX_SAMPLES = 2000


@torch.no_grad()
def held_out_embeddings(model: nn.Module, split: Any, views: Any, device: torch.device, *,
                        seed: int = 0, max_samples: int = MAX_SAMPLES,
                        batch_size: int = 256) -> Dict[str, Tensor]:
    """``h`` and ``z`` of two views of the first ``max_samples`` samples of ``split``.

    Args:
        model: a :class:`~contrastkit.methods.ContrastiveModel` (``encoder``, ``head``).
        split: a held-out split (``images``, ``labels``).
        views: the run's view maker, ``views(split, indices) -> (view_a, view_b)``.
        device: where the model lives.
        seed: seed of the views (drawn in a forked CPU RNG).

    Returns ``{"h_a", "h_b", "z_a", "z_b"}`` float64 CPU tensors ``(n, d)`` and ``"labels"``.
    The model is put in eval mode (BatchNorm running statistics) and restored afterwards.
    """
    n = min(len(split), max_samples)
    was_training = model.training
    model.eval()
    parts: Dict[str, list] = {"h_a": [], "h_b": [], "z_a": [], "z_b": []}
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for start in range(0, n, batch_size):
                indices = torch.arange(start, min(n, start + batch_size))
                for suffix, images in zip("ab", views(split, indices)):
                    h = model.encoder(images.to(device))
                    parts[f"h_{suffix}"].append(h.double().cpu())
                    parts[f"z_{suffix}"].append(model.head(h).double().cpu())
    finally:
        model.train(was_training)
    out = {key: torch.cat(value) for key, value in parts.items()}
    # No labels (an unlabeled collection), or fewer rows than asked (damaged files skipped): no tolerance.
    labels = getattr(split, "labels", None)
    out["labels"] = labels[:n].cpu() if labels is not None and out["h_a"].shape[0] == n else None
    return out


def geometry(model: nn.Module, split: Any, views: Any, device: torch.device, *, temperature: float,
             batch_size: int, seed: int = 0) -> Dict[str, Dict[str, Any]]:
    """:func:`~contrastkit.metrics.representation_metrics` of ``h`` and ``z`` on ``split``.

    ``temperature`` and ``batch_size`` are the run's (they shape the penalty entropy).
    Returns ``{"h": {...}, "z": {...}, "samples": n}``, JSON-ready; a space whose metrics are
    undefined (an all-zero embedding row, a split with one sample per class) holds
    ``{"error": message}`` instead.
    """
    emb = held_out_embeddings(model, split, views, device, seed=seed)
    out: Dict[str, Any] = {"samples": int(emb["h_a"].shape[0])}
    for space in ("h", "z"):
        try:
            out[space] = representation_metrics(emb[f"{space}_a"], emb[f"{space}_b"], emb["labels"],
                                                temperature=temperature, batch_size=batch_size)
        except ValueError as err:  # e.g. an all-zero feature row: report it, do not stop the run
            out[space] = {"error": str(err)}
    return out
