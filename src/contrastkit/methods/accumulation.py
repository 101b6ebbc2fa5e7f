"""Cached-gradient accumulation: the exact gradient of a contrastive loss over a batch whose
encoder activations do not fit, computed in micro-batches (Gao et al. 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup"; open_clip's ``--accum-freq``).

Ordinary gradient accumulation does not give a contrastive loss a larger batch: each
micro-batch would only see its own negatives. :func:`cached_gradient_loss` instead

1. embeds all ``B`` rows in micro-batches of ``m`` without building a graph, saving the RNG
   state (torch's CPU generator and the CUDA ones in use) before each micro-batch;
2. computes the loss on the concatenated embeddings (as leaf tensors), so it sees all ``B``
   rows -- tiled when large, distributed under ``torchrun``, like any contrastkit loss -- and
   back-propagates it to the embeddings and to the loss's own parameters (a learnable tau);
3. re-runs each micro-batch with a graph, restoring its RNG state so that dropout and any
   other random layer replay identically, and back-propagates its slice of the embeddings'
   gradient into the encoder.

Memory: the encoder's activations of one micro-batch plus the ``B`` rows of embeddings,
instead of the activations of all ``B`` rows. Time: one more forward pass of the encoder.

Exactness: the parameters' gradients are those of the full batch (to rounding) whenever the
embedding of a row does not depend on the other rows of its micro-batch -- GroupNorm or
LayerNorm, BatchNorm in eval mode, no normalisation. BatchNorm in train mode normalises over
the micro-batch instead of the batch (see ``docs/accumulation.md``).

Depends on torch and :func:`contrastkit.losses.validation.require` (the replay check).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from contrastkit.losses.validation import require

__all__ = ["cached_gradient_loss", "check_micro_batch", "batch_rows", "slice_batch", "average_gradients",
           "replay_tolerance"]

#: Embeddings as an embed function returns them: one ``(rows, ...)`` tensor or a tuple of them.
Embeddings = Union[Tensor, Tuple[Tensor, ...]]


def replay_tolerance(dtype: torch.dtype) -> float:
    """The default largest difference, relative to ``max(1, max |embedding|)``, allowed between
    the two passes over a micro-batch: recomputing the same rows from the same RNG state
    differs at most by the rounding of a different kernel choice."""
    if dtype == torch.float64:
        return 1e-9
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    return 1e-4


def _tensors(batch: Any) -> Iterator[Tensor]:
    if isinstance(batch, Tensor):
        yield batch
    elif isinstance(batch, (tuple, list)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)


def batch_rows(batch: Any) -> int:
    """The number of rows ``B`` of a batch: a tensor, or a (nested) tuple, list or dict of
    tensors that all have ``B`` rows (dimension 0); other leaves are left alone."""
    sizes = {int(t.shape[0]) if t.ndim else -1 for t in _tensors(batch)}
    if not sizes:
        raise TypeError("the batch holds no tensor: pass a tensor or a tuple/list/dict of tensors")
    if len(sizes) != 1 or -1 in sizes:
        raise ValueError(f"every tensor of the batch must have the same number of rows (dimension 0), "
                         f"got {sorted(sizes)}")
    return sizes.pop()


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor of ``batch`` (same nesting; other leaves as they are)."""
    if isinstance(batch, Tensor):
        return batch[start:stop]
    if isinstance(batch, tuple):
        return tuple(slice_batch(item, start, stop) for item in batch)
    if isinstance(batch, list):
        return [slice_batch(item, start, stop) for item in batch]
    if isinstance(batch, dict):
        return {key: slice_batch(item, start, stop) for key, item in batch.items()}
    return batch


def check_micro_batch(micro_batch: Any, rows: int, name: str = "micro_batch", batch: str = "") -> int:
    """``micro_batch`` as an int: ``1 <= micro_batch <= rows`` and dividing ``rows`` (every
    micro-batch has the same size, so BatchNorm sees equal micro-batches); ``ValueError``
    naming ``name`` otherwise (and the batch as ``batch`` describes it, default "the batch
    (rows rows)")."""
    batch = batch or f"the batch ({rows} rows)"
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {micro_batch!r}")
    if micro_batch > rows:
        raise ValueError(f"{name} ({micro_batch}) must be at most {batch}")
    if rows % micro_batch:
        raise ValueError(f"{name} ({micro_batch}) must divide {batch}")
    return micro_batch


def _as_tuple(embeddings: Any, rows: int) -> Tuple[Tensor, ...]:
    parts = (embeddings,) if isinstance(embeddings, Tensor) else embeddings
    if not isinstance(parts, tuple) or not parts or not all(isinstance(p, Tensor) for p in parts):
        raise TypeError(f"embed must return a tensor or a non-empty tuple of tensors, got "
                        f"{type(embeddings).__name__}")
    for index, part in enumerate(parts):
        if part.ndim == 0 or part.shape[0] != rows:
            raise ValueError(f"embed's output {index} has shape {tuple(part.shape)}: it must have one row "
                             f"per row of the micro-batch ({rows}), so that the micro-batches' embeddings "
                             "are the row blocks of the batch's")
    return parts


def _cuda_devices(batch: Any) -> List[int]:
    """The CUDA devices whose generators a forward pass may draw from: the batch's and the
    current one."""
    devices = {t.device.index for t in _tensors(batch) if t.is_cuda}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices.add(torch.cuda.current_device())
    return sorted(d for d in devices if d is not None)


def _rng_state(devices: Sequence[int]) -> Tuple[Tensor, List[Tensor]]:
    return torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]


@contextlib.contextmanager
def _replaying(state: Tuple[Tensor, List[Tensor]], devices: Sequence[int]) -> Iterator[None]:
    """Run with the RNG state of a micro-batch's first pass; afterwards the generators are
    where they were (the replay draws nothing of its own)."""
    with torch.random.fork_rng(devices=list(devices)):
        torch.set_rng_state(state[0])
        for device, cuda_state in zip(devices, state[1]):
            torch.cuda.set_rng_state(cuda_state, device)
        yield


def _check_replay(second: Tuple[Tensor, ...], first: Tuple[Tensor, ...], index: int, rows: Tuple[int, int],
                  tolerance: Optional[float]) -> None:
    """Raise unless each replayed output is within the tolerance of its first pass. The
    comparison stays on the device: on the CPU a difference raises at once with its size; on
    an accelerator the check is queued (``torch._assert_async``, via
    :func:`contrastkit.losses.validation.require`) and fails at the next synchronising
    operation, so that a step does not wait for the device here."""
    for k, (new, old) in enumerate(zip(second, first)):
        what = f"output {k} of micro-batch {index} (rows {rows[0]}-{rows[1] - 1})"
        if new.shape != old.shape:
            raise ValueError(_not_deterministic(what, f"changed shape from {tuple(old.shape)} to {tuple(new.shape)}"))
        if old.numel() == 0:
            continue
        new = new.detach()
        tol = replay_tolerance(old.dtype) if tolerance is None else tolerance
        limit = old.abs().nan_to_num(0.0).amax().clamp(min=1.0) * tol
        gap = (new - old).abs()
        close = (gap <= limit) | (new == old) | (new.isnan() & old.isnan())

        def detail(new: Tensor = new, old: Tensor = old, limit: Tensor = limit, what: str = what) -> str:
            gap = float((new - old).abs().nan_to_num(float("inf")).max())
            return _not_deterministic(what, f"differ by up to {gap:.3g} (tolerance {float(limit):.3g})")

        require(close.all(), _not_deterministic(what, "differs beyond the tolerance"), detail)


def _not_deterministic(what: str, detail: str) -> str:
    return (f"the encoder is not deterministic: {what} {detail} between the first (no-graph) pass and its replay; "
            "cached-gradient accumulation replays each micro-batch from torch's saved RNG state, so the embed "
            "function must not draw from another generator (numpy, Python's random, its own torch.Generator) nor "
            "keep state between calls")


def cached_gradient_loss(
    embed: Callable[[Any], Embeddings],
    loss: Callable[[Embeddings], Tensor],
    batch: Any,
    micro_batch: int,
    *,
    model: Optional[nn.Module] = None,
    tolerance: Optional[float] = None,
    autocast: Optional[Callable[[], ContextManager[Any]]] = None,
    backward: Optional[Callable[[Tensor], None]] = None,
) -> Tensor:
    """The loss of the whole batch, with its gradients accumulated in micro-batches.

    After the call, every parameter's ``.grad`` holds (added to what was there, as
    ``backward`` does) the gradient of ``loss(embed(batch))``: the encoder's through the
    replayed micro-batches, the loss's own parameters' (a learnable temperature) from the
    loss on the whole batch. Call ``optimizer.zero_grad()`` before and ``optimizer.step()``
    after, as for ``loss.backward()``.

    Args:
        embed: micro-batch -> embeddings, a tensor or a tuple of tensors with one row per
            row of the micro-batch (e.g. ``lambda b: (head(enc(b[0])), head(enc(b[1])))``).
            Run twice per micro-batch: it must be deterministic given torch's RNG state.
        loss: the embeddings of the whole batch (the same structure as ``embed`` returns,
            every tensor with ``B`` rows) -> a scalar tensor, e.g. ``lambda z:
            nt_xent_views(*z, temperature=tau)``. It runs once; with ``distributed=True`` it
            takes every rank's negatives, as without accumulation.
        batch: a tensor or a (nested) tuple/list/dict of tensors with ``B`` rows each; a
            micro-batch is rows ``[i m, (i + 1) m)`` of every tensor.
        micro_batch: ``m``, the rows per micro-batch; ``1 <= m <= B`` and ``m`` divides ``B``.
        model: the module ``embed`` runs, if any: its buffers (BatchNorm's running
            statistics) are put back after the replay, so that each micro-batch updates them
            once, as in its first pass.
        tolerance: the largest difference between the two passes over a micro-batch, relative
            to ``max(1, max |embedding|)``; default ``accumulation.replay_tolerance(dtype)``.
        autocast: the context of every forward computation (both passes of ``embed`` and the
            ``loss``), e.g. :meth:`StepPrecision.autocast
            <contrastkit.methods.precision.StepPrecision.autocast>`; the backward passes run
            outside it. Default: none.
        backward: how the whole batch's loss is back-propagated, e.g. :meth:`StepPrecision.backward
            <contrastkit.methods.precision.StepPrecision.backward>` (fp16: the scaled loss, so that
            every gradient is scaled alike); default ``loss.backward()``.

    Returns:
        Tensor: the loss of the whole batch, detached, since its graph has been used.

    Raises:
        ValueError: ``micro_batch`` out of range or not dividing ``B``; an embedding with the
            wrong number of rows; a loss that does not depend on the embeddings; an encoder
            whose replay differs from its first pass (non-deterministic), detected before the
            gradient of that micro-batch is applied.
        TypeError: ``embed`` does not return tensors, or ``loss`` does not return a scalar tensor.

    Under ``torchrun`` the per-rank parameter gradients still have to be averaged over the
    ranks, which DDP would do after ``backward``: :func:`average_gradients`.

    Example:
        >>> encoder = torch.nn.Linear(3, 2)
        >>> x = torch.randn(8, 3)
        >>> value = cached_gradient_loss(encoder, lambda z: z.pow(2).sum(), x, 4)
        >>> bool(torch.allclose(value, encoder(x).pow(2).sum()))
        True
    """
    rows = batch_rows(batch)
    m = check_micro_batch(micro_batch, rows)
    starts = range(0, rows, m)
    parts = [slice_batch(batch, start, start + m) for start in starts]
    devices = _cuda_devices(batch)
    forward = autocast if autocast is not None else contextlib.nullcontext

    # 1. every micro-batch without a graph, its RNG state saved first
    states, first = [], []
    bare = False  # embed returns one tensor, not a tuple: so does loss receive it
    with torch.no_grad(), forward():
        for part in parts:
            states.append(_rng_state(devices))
            raw = embed(part)
            bare = isinstance(raw, Tensor)
            first.append(_as_tuple(raw, m))
    width = len(first[0])
    if any(len(outputs) != width for outputs in first):
        raise ValueError("embed returned a different number of tensors for different micro-batches")

    # 2. the loss of the whole batch, back to the embeddings (and the loss's own parameters)
    leaves = tuple(torch.cat([outputs[k] for outputs in first]).requires_grad_(True) for k in range(width))
    with forward():
        value = loss(leaves[0] if bare else leaves)
    if not isinstance(value, Tensor) or value.ndim != 0:
        raise TypeError(f"loss must return a scalar tensor, got "
                        f"{type(value).__name__}{tuple(value.shape) if isinstance(value, Tensor) else ''}")
    if not value.requires_grad:
        raise ValueError("the loss does not depend on the embeddings: nothing to back-propagate")
    if backward is None:
        value.backward()
    else:
        backward(value)
    grads = [leaf.grad for leaf in leaves]

    # 3. each micro-batch again, with a graph and its first pass's RNG state
    saved = [b.detach().clone() for b in model.buffers()] if model is not None else []
    for index, (start, part) in enumerate(zip(starts, parts)):
        with _replaying(states[index], devices), forward():
            outputs = _as_tuple(embed(part), m)
        _check_replay(outputs, first[index], index, (start, start + m), tolerance)
        pairs = [(out, grad[start:start + m]) for out, grad in zip(outputs, grads)
                 if grad is not None and out.requires_grad]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
    if model is not None:
        with torch.no_grad():
            for buffer, value_before in zip(model.buffers(), saved):
                buffer.copy_(value_before)
    return value.detach()



def average_gradients(parameters: Iterable[nn.Parameter], group: Any = None) -> None:
    """Average the ``.grad`` of ``parameters`` over the ranks of ``group`` (default: every
    rank), in place -- what DDP does after ``backward``, for a step whose gradients were
    accumulated outside DDP (:func:`cached_gradient_loss` under ``torchrun``). Parameters
    that require a gradient but got none take part as zeros, so that every rank runs the same
    collectives. A no-op without an initialised process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size(group)
    trained = [p for p in parameters if p.requires_grad]
    for parameter in trained:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    if not trained:
        return
    # one collective for all: the gradients flattened into one buffer per dtype
    for dtype in sorted({p.grad.dtype for p in trained}, key=str):
        same = [p for p in trained if p.grad.dtype == dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in same])
        dist.all_reduce(flat, group=group)
        flat /= world
        offset = 0
        for parameter in same:
            size = parameter.grad.numel()
            parameter.grad.copy_(flat[offset:offset + size].view_as(parameter.grad))
            offset += size
