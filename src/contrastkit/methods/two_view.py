"""The two-view methods (SimCLR, DCL, SupCon, Wang & Liu's simple and hard contrastive losses)
and the model they train, :class:`ContrastiveModel`: two augmented views of each image, one
encoder and projection head, a loss over the batch's in-batch negatives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contrastkit import losses
from contrastkit.data import MODES, DataSplit, DataSplits, training_views
from contrastkit.metrics.batch import VIEW_A, VIEW_B, BatchProblem
from contrastkit.models import ProjectionHead, build_encoder
from contrastkit.temperature_methods import parse_temperature_method

from .base import Batch, EvalContext, Method, across_ranks
from .geometry import geometry
from .registry import METHOD_REGISTRY

if TYPE_CHECKING:
    from .config import PretrainConfig

__all__ = ["TwoViewMethod", "SimCLR", "DCL", "SupCon", "Simple", "HardNegative", "ContrastiveModel",
           "HARD_NEGATIVE_QUANTILE"]

# Wang & Liu's hard contrastive loss keeps the K most similar negatives (K = 4096 in the
# paper); with the few in-batch negatives of a small batch we keep the hardest quarter.
HARD_NEGATIVE_QUANTILE = 0.75


class TwoViewMethod(Method):
    """Methods on two augmented views of each image, trained as a :class:`ContrastiveModel`:
    one forward pass over both views (BatchNorm sees both, as in SimCLR) gives
    ``(z_a, z_b)``; the val and test numbers are the two-view geometry of ``h`` and ``z``
    (alignment, uniformity, tolerance; ``train/geometry.py``)."""

    cached_gradients = True
    default_temperature = 0.2

    def complete(self, config: "PretrainConfig") -> None:
        """The two-view options: ``views`` one of :data:`contrastkit.data.MODES`."""
        super().complete(config)
        if config.views not in MODES:
            raise ValueError(f"views must be one of {MODES}, got {config.views!r}")

    def batches(self, dataset: DataSplits, config: "PretrainConfig", device: torch.device,
                tokenizer: Any = None, *, transform: Optional[Callable[[Tensor], Any]] = None
                ) -> Callable[[Any, Tensor], Batch]:
        return training_views(dataset, mode=config.views, device=device, strength=config.view_strength,
                              transform=transform, seed=config.seed)

    def build_model(self, config: "PretrainConfig", in_channels: int, tokenizer: Any = None, *,
                    encoder: Optional[nn.Module] = None, train_size: int = 0) -> nn.Module:
        temperature_method = None
        if config.temperature_method is not None:  # it replaces NT-Xent
            # Without the data (train_size 0), the per-sample state's size comes from the checkpoint.
            method = parse_temperature_method(config.temperature_method)
            temperature_method = method.build(train_size, config.projection_dim)
        return ContrastiveModel(
            self, config.encoder if encoder is None else encoder, in_channels,
            temperature=config.temperature, learnable_temperature=config.learnable_temperature,
            projection_dim=config.projection_dim, momentum=config.momentum, queue_size=config.queue_size,
            norm=config.norm, temperature_method=temperature_method,
        )

    def extend_model(self, model: "ContrastiveModel", queue_size: Optional[int]) -> None:
        """Add the method's own modules to a freshly built model (MoCo's key network)."""

    def embed(self, model: nn.Module, batch: Batch) -> Tuple[Tensor, ...]:
        view_a, view_b = batch
        n = view_a.shape[0]
        z = model.head(model.encoder(torch.cat([view_a, view_b], dim=0)))
        return z[:n], z[n:]

    def batch_problem(self, model: nn.Module, embeddings: Tuple[Tensor, ...]) -> Optional[BatchProblem]:
        """SimCLR's ``2B x 2B`` matrix of both views' cosine similarities: row ``i`` (view A of
        element ``i``, then view B of each) against every view, its positive the other view of
        its element (``i <-> i + B``), itself excluded. The loss of DCL, SupCon, the simple and
        the hard-negative loss weigh the same matrix differently: its diagnostics are those of
        the NT-Xent choice."""
        z_a, z_b = embeddings
        n = z_a.shape[0]
        z = F.normalize(torch.cat([z_a, z_b]).to(_similarity_dtype(z_a)), dim=1)
        items = torch.arange(2 * n, device=z.device) % n
        views = torch.cat([torch.full((n,), VIEW_A), torch.full((n,), VIEW_B)]).to(z.device)
        return BatchProblem.computed(lambda index: z[index] @ z.T, (2 * n, 2 * n),
                                     (torch.arange(2 * n, device=z.device) + n) % (2 * n), True, items, views, items,
                                     views, "both views of the batch against each other (self excluded)")

    def _geometry(self, run: EvalContext, split: DataSplit) -> Dict[str, Any]:
        return geometry(run.model, split, run.batches, run.device, batch_size=run.batch_size,
                        temperature=run.model.temperature.value, seed=run.config.seed)

    def val_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return {"val_geometry": self._geometry(run, run.dataset.val)}

    def test_metrics(self, run: EvalContext) -> Dict[str, Any]:
        return {"representation": self._geometry(run, run.dataset.test)}


class SimCLR(TwoViewMethod):
    """:func:`~contrastkit.losses.nt_xent_views` on the ``2N`` anchors of both views; with a
    temperature method (``--temperature-method NAME``, :mod:`contrastkit.temperature_methods`), that method's
    loss on the same anchors (:mod:`contrastkit.losses.adaptive`)."""

    name = "simclr"
    temperature_methods = True

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor],
                  indices: Optional[Tensor] = None) -> Tensor:
        """``indices`` ``(N,)``: the batch's sample indices in the training split, for a
        temperature method with per-sample state (a training step needs them). Outside training
        (``model.eval()``: a validation loss) the batch's images have no state of their own: its
        loss is NT-Xent at the model's ``tau``, the mean temperature of the last training step's
        anchors, the ``tau`` the run's evaluation reads too."""
        z_a, z_b = embeddings
        method = getattr(model, "temperature_method", None)
        if method is not None and not (method.needs_indices and indices is None and not model.training):
            if method.needs_indices and indices is not None:
                indices = indices.to(z_a.device)
            return method(z_a, z_b, indices if method.needs_indices else None, **across_ranks(model))
        return losses.nt_xent_views(z_a, z_b, temperature=model.temperature, **across_ranks(model))


class DCL(TwoViewMethod):
    """:func:`~contrastkit.losses.dcl` (the positive left out of the denominator)."""

    name = "dcl"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        z_a, z_b = embeddings
        return losses.dcl(z_a, z_b, temperature=model.temperature, **across_ranks(model))


class SupCon(TwoViewMethod):
    """:func:`~contrastkit.losses.supcon` on both views, positives from the labels."""

    name = "supcon"
    needs_labels = True
    default_temperature = 0.1  # Khosla et al.

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        if labels is None:
            raise ValueError("supcon needs the labels of the batch")
        z_a, z_b = embeddings
        return losses.supcon(torch.stack([z_a, z_b], dim=1), labels, temperature=model.temperature,
                             **across_ranks(model))


class Simple(TwoViewMethod):
    """Wang & Liu's simple contrastive loss (:func:`~contrastkit.losses.simple_loss`, no
    temperature)."""

    name = "simple"
    default_temperature = 1.0  # the simple loss has no temperature (reported only)

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        return losses.simple_loss(*embeddings, **across_ranks(model))


class HardNegative(TwoViewMethod):
    """Wang & Liu's hard contrastive loss (:func:`~contrastkit.losses.hard_negative_nt_xent`),
    keeping the hardest quarter of the ``2N - 2`` negatives (``HARD_NEGATIVE_QUANTILE``)."""

    name = "hard_negative"

    def objective(self, model: nn.Module, embeddings: Tuple[Tensor, ...], labels: Optional[Tensor]) -> Tensor:
        # Under torchrun the hardest quarter of the global batch's negatives.
        return losses.hard_negative_nt_xent(*embeddings, temperature=model.temperature,
                                            quantile=HARD_NEGATIVE_QUANTILE, **across_ranks(model))


class ContrastiveModel(nn.Module):
    """Views -> encoder -> ``h`` -> projection head -> ``z`` -> loss, for the two-view methods.

    Args:
        method: a two-view method (:class:`TwoViewMethod`) or its registered name:
            ``"simclr"``, ``"moco"``, ``"supcon"``, ``"dcl"``, ``"simple"``, ``"hard_negative"``.
        encoder: a built-in name of :data:`~contrastkit.models.ENCODERS`, or an encoder module
            with ``out_dim`` (:func:`~contrastkit.models.prepare_encoder`); ``in_channels``
            the input channels.
        temperature: initial ``tau``; ``learnable_temperature`` trains it (CLIP's
            parameterisation, :class:`~contrastkit.losses.Temperature`).
        projection_dim: size of ``z``.
        momentum: MoCo's key-encoder EMA coefficient.
        queue_size: MoCo's number of stored keys (required for ``"moco"``).
        norm: the encoder's and head's normalisation, ``None``/``"batch"`` (BatchNorm) or
            ``"group"`` (GroupNorm, LayerNorm in the head; :func:`~contrastkit.models.build_encoder`).
        temperature_method: a :class:`~contrastkit.losses.AdaptiveTemperatureLoss` (a temperature
            method's loss, :mod:`contrastkit.temperature_methods`) whose loss replaces the method's own (``simclr`` only); its
            state is the model's (saved with it). ``temperature`` then reports the mean of the
            temperatures its anchors used at the last step.
    """

    def __init__(self, method: Union[str, TwoViewMethod], encoder: Union[str, nn.Module], in_channels: int, *, temperature: float,
                 learnable_temperature: bool = False, projection_dim: int = 64,
                 momentum: float = 0.99, queue_size: Optional[int] = None, norm: Optional[str] = None,
                 temperature_method: Optional[nn.Module] = None) -> None:
        super().__init__()
        two_view = METHOD_REGISTRY.get(method) if isinstance(method, str) else method
        if not isinstance(two_view, TwoViewMethod):
            names = [name for name, m in METHOD_REGISTRY.items() if isinstance(m, TwoViewMethod)]
            raise ValueError(f"method must be one of {', '.join(names)}, got {method!r}")
        self.method = two_view.name
        # The method object itself (stateless): the model asks it for its loss, never the registry.
        self.training_method = two_view
        # Set by the training loop under torchrun: the losses then use every rank's negatives
        # (local mode) and MoCo's queue receives every rank's keys.
        self.distributed = False
        self.encoder = encoder if isinstance(encoder, nn.Module) else build_encoder(encoder, in_channels, norm=norm)
        self.head = ProjectionHead(self.encoder.out_dim, hidden_dim=max(self.encoder.out_dim, projection_dim),
                                   out_dim=projection_dim, norm=norm)
        self.temperature = losses.Temperature(temperature, learnable=learnable_temperature)
        if temperature_method is not None and not two_view.temperature_methods:
            raise ValueError(f"a temperature method replaces NT-Xent on two views; method {two_view.name!r} "
                             "has another loss")
        self.temperature_method = temperature_method
        self.momentum = momentum
        two_view.extend_model(self, queue_size)
        self.register_load_state_dict_pre_hook(_rename_old_queue)

    def embed(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` -> ``h`` ``(N, encoder.out_dim)``."""
        return self.encoder(images)

    def loss(self, view_a: Tensor, view_b: Tensor, labels: Optional[Tensor] = None) -> Tensor:
        """Mean loss over the batch; ``view_a``/``view_b`` ``(N, C, H, W)``, row ``i`` of each
        from the same source image; ``labels`` ``(N,)`` (used by ``supcon`` only)."""
        return self.training_method.loss(self, (view_a, view_b), labels)


def _similarity_dtype(t: Tensor) -> torch.dtype:
    """float64 for a batch's similarities, where the device has it."""
    return torch.float32 if t.device.type == "mps" else torch.float64


def _rename_old_queue(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    """Checkpoints written before MoCo's queue became a KeyQueue hold it as ``queue`` and
    ``queue_pointer`` (always full): read them into ``queue.keys`` / ``.pointer`` / ``.filled``."""
    old = prefix + "queue"
    if isinstance(state_dict.get(old), Tensor) and prefix + "queue_pointer" in state_dict:
        keys = state_dict.pop(old)
        state_dict[old + ".keys"] = keys
        state_dict[old + ".pointer"] = state_dict.pop(prefix + "queue_pointer")
        state_dict[old + ".filled"] = torch.tensor(keys.shape[0], dtype=torch.long)
