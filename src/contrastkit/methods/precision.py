"""How a training step computes on its device: the precision of its arithmetic and the memory
format of its images.

``precision`` (:data:`~contrastkit.methods.config.PRECISIONS`):

``"32"``
    float32 throughout.
``"bf16"``
    The forward pass and the loss under ``torch.autocast`` to bfloat16 (Micikevicius et al.
    2018, "Mixed Precision Training"; PyTorch's automatic mixed precision): matrix products and
    convolutions in bfloat16, the weights, their gradients and the optimizer's state in
    float32. bfloat16 has float32's exponent range, so no gradient scaling is needed.
``"fp16"``
    The same with float16, whose narrow range underflows small gradients: the loss is scaled
    before the backward pass and the gradients unscaled before the optimizer step
    (``torch.amp.GradScaler``), and a step whose gradients overflowed is skipped while the
    scale is lowered. The optimizer is built in its fused form
    (:func:`~contrastkit.methods.build_optimizer`), which takes the scaler's overflow flag on
    the device: the step never waits for the device to say whether it overflowed.

The contrastive losses switch autocast off inside and compute their similarities and
log-sum-exp in float32 from the (upcast) embeddings (:mod:`contrastkit.losses`), so a
temperature of 0.01 stays exact to float32 rounding under either half precision. The batch
diagnostics a logged step computes (:mod:`~contrastkit.methods.tap`) run with autocast off too.

``channels_last``: the model's 4-D weights and each batch's images in the channels-last
("NHWC") memory format, which convolutions on recent GPUs run fastest in, half precision
especially; the values are the same, the order of the arithmetic may differ in rounding.

Depends on torch alone.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager, Dict, Optional

import torch
from torch import Tensor

__all__ = ["AUTOCAST_DTYPES", "autocast_supported", "check_precision", "StepPrecision", "channels_last_batch"]

#: The autocast dtype of each half precision.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast`` on ``device`` computes a matrix product in ``dtype`` (torch
    disables an unsupported autocast with a warning, or refuses it): tried once on a 2x2
    product."""
    device = torch.device(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device_type=device.type, dtype=dtype):
                ones = torch.ones(2, 2, device=device)
                product = ones @ ones
        except (RuntimeError, ValueError, TypeError):
            return False
    return product.dtype == dtype


def check_precision(precision: str, device: torch.device) -> None:
    """Raise ``ValueError`` naming ``--precision`` when ``device`` cannot train in ``precision``
    (its autocast does not support the dtype, or fp16 has no gradient scaler there)."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return
    device = torch.device(device)
    if not autocast_supported(device, dtype):
        other = " or --precision bf16" if precision == "fp16" and autocast_supported(device, torch.bfloat16) else ""
        raise ValueError(f"--precision {precision}: torch {torch.__version__} cannot autocast to {dtype} on "
                         f"{device}; use --precision 32{other}")
    if precision == "fp16":
        try:
            torch.amp.GradScaler(device.type)
        except (RuntimeError, ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"--precision fp16 needs a gradient scaler, which torch {torch.__version__} has not "
                             f"for {device.type} ({err}); use --precision bf16 or 32") from None


class StepPrecision:
    """The arithmetic of one run's training steps on ``device`` (see the module docstring).

    Use::

        with precision.autocast():
            loss = method.loss(model, batch, labels)
        optimizer.zero_grad()
        precision.backward(loss)
        precision.step(optimizer)

    The gradient scaler's state (fp16) is part of a checkpoint (:meth:`state_dict`), so that a
    resumed run continues with the scale it had.
    """

    def __init__(self, precision: str, device: torch.device) -> None:
        check_precision(precision, device)
        self.precision = precision
        self.device = torch.device(device)
        self.dtype: Optional[torch.dtype] = AUTOCAST_DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None

    def autocast(self) -> ContextManager[Any]:
        """The context of the forward pass and the loss (no-op for ``"32"``)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``, of the scaled loss under fp16."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; under fp16 through the scaler (gradients unscaled, the step
        skipped if they overflowed) and the scale updated."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps: the gradient scaler's state (fp16), else nothing."""
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` when an fp16 run's state has no scaler."""
        if self.scaler is None:
            return
        if not isinstance(state, dict) or not isinstance(state.get("scaler"), dict):
            raise ValueError("the checkpoint holds no gradient scaler state for --precision fp16")
        self.scaler.load_state_dict(state["scaler"])


def channels_last_batch(batch: Any) -> Any:
    """``batch`` with every 4-D tensor (images ``(N, C, H, W)``) in the channels-last memory
    format, the same nesting of tuples and lists; other tensors (token ids, masks) as they are."""
    if isinstance(batch, Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.ndim == 4 else batch
    if isinstance(batch, tuple):
        return tuple(channels_last_batch(item) for item in batch)
    if isinstance(batch, list):
        return [channels_last_batch(item) for item in batch]
    return batch
