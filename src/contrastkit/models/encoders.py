"""The built-in encoders (a small CNN, the CPU default; CIFAR-stem ResNet-18 and ResNet-50; a
small ViT), an MLP projection head, and the loading and checking of any other encoder.

An encoder is any ``nn.Module`` mapping images ``(N, C, H, W)`` to ``h`` of shape ``(N, D)``,
or ``(N, D, ...)`` which is pooled (global average over the trailing dimensions). Its ``D`` is
found by one dry forward (:func:`prepare_encoder`). A run names its encoder by a *spec*
(:func:`encoder_from_spec`): a built-in name of :data:`ENCODERS`, ``"timm:NAME"`` or
``"torchvision:NAME"`` (a model of those libraries without its classifier,
:mod:`contrastkit.models.external`), ``"package.module:factory"`` (called with the run's
``encoder_options``), or ``"object:<class path>"`` for a module handed over as a Python object
whose class cannot be imported again.

The built-ins need nothing beyond torch: they are what runs where timm and torchvision are not
installed (the small CNN is also the CPU default, and ``resnet18`` is the same network as
``torchvision:resnet18`` with ``cifar_stem=true``, with other parameter names).

The small CNN and ResNet-18 normalise with BatchNorm by default, or, with ``norm="group"``,
without batch statistics: GroupNorm (up to 32 groups, Wu & He 2018) in the convolutional
layers and LayerNorm in the head, so that a row's output does not depend on the other rows of
its batch (what cached-gradient accumulation needs to be exact, ``docs/accumulation.md``);
the small ViT has LayerNorm only.
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from .external import external_encoder, is_external_spec

__all__ = ["SmallCNN", "ResNet18", "ResNet50", "SmallViT", "ProjectionHead", "PooledEncoder", "build_encoder",
           "ENCODERS", "NORMS", "norm_layer", "load_factory", "encoder_from_spec", "describe_encoder",
           "prepare_encoder", "unwrap_encoder", "OBJECT_PREFIX"]

#: The normalisations of the built-in networks: ``"batch"`` (the default) or ``"group"``.
NORMS = ("batch", "group")
GROUPS = 32  # Wu & He's default number of groups


def norm_layer(norm: Optional[str], channels: int, *, spatial: bool = True) -> nn.Module:
    """The normalisation of ``channels`` features: ``"batch"`` (or ``None``) -> BatchNorm;
    ``"group"`` -> GroupNorm with ``gcd(32, channels)`` groups for ``(N, C, H, W)`` inputs
    (``spatial``), LayerNorm for ``(N, C)`` ones."""
    norm = "batch" if norm is None else norm
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if norm == "batch":
        return nn.BatchNorm2d(channels) if spatial else nn.BatchNorm1d(channels)
    return nn.GroupNorm(math.gcd(GROUPS, channels), channels) if spatial else nn.LayerNorm(channels)


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1, norm: Optional[str] = None) -> List[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        norm_layer(norm, out_channels),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Module):
    """A stride-2 3x3 conv stem, three 3x3 conv-BN-ReLU blocks (2x2 max-pools after the
    second and third), then global average pooling. Sized for CPU training: about 3.6 M
    multiply-adds per 32x32 image; the stride-2 stem makes a step ~1.5x faster on CPU than a
    stride-1 stem with a max-pool (benchmarks/RESULTS_train.md).

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``; any ``H, W >= 8``.
        width: channels of the stem; the next blocks use ``2``, ``4`` and ``8`` times it.
        norm: ``"batch"`` (BatchNorm, default) or ``"group"`` (GroupNorm; :func:`norm_layer`).

    ``forward`` returns ``h`` of shape ``(N, 8 * width)``; ``out_dim`` holds that size.
    """

    def __init__(self, in_channels: int = 1, width: int = 16, norm: Optional[str] = None) -> None:
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, width, stride=2, norm=norm),
            *_conv_bn_relu(width, 2 * width, norm=norm),
            nn.MaxPool2d(2),
            *_conv_bn_relu(2 * width, 4 * width, norm=norm),
            nn.MaxPool2d(2),
            *_conv_bn_relu(4 * width, 8 * width, norm=norm),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.out_dim = 8 * width

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


class _BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: Optional[str] = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(norm, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm_layer(norm, out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                norm_layer(norm, out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 with the CIFAR stem (one 3x3 conv, stride 1, no max-pool), as in SimCLR's
    CIFAR-10 experiments; the classification layer is dropped.

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``.
        width: channels of the first stage (64 in the standard network).
        norm: ``"batch"`` (BatchNorm, default) or ``"group"`` (GroupNorm; :func:`norm_layer`).

    ``forward`` returns ``h`` of shape ``(N, 8 * width)`` (512 for the standard network).
    """

    def __init__(self, in_channels: int = 3, width: int = 64, norm: Optional[str] = None) -> None:
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        self.stem = nn.Sequential(*_conv_bn_relu(in_channels, width, norm=norm))
        stages = []
        channels = width
        for index, out_channels in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if index == 0 else 2
            stages.append(nn.Sequential(_BasicBlock(channels, out_channels, stride, norm),
                                        _BasicBlock(out_channels, out_channels, 1, norm)))
            channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out_dim = channels

    def forward(self, x: Tensor) -> Tensor:
        return torch.flatten(self.pool(self.stages(self.stem(x))), 1)


class _Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride) -> 1x1 expand (x4), with a projection shortcut when needed."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        out_channels = channels * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, channels, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 (bottleneck blocks, stages of 3, 4, 6, 3) with the CIFAR stem (one 3x3 conv,
    stride 1, no max-pool); the classification layer is dropped.

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``.
        width: channels of the first stage's 3x3 convolutions (64 in the standard network).

    ``forward`` returns ``h`` of shape ``(N, 32 * width)`` (2048 for the standard network).
    """

    def __init__(self, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        if in_channels < 1 or width < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        layers: List[nn.Module] = [*_conv_bn_relu(in_channels, width)]
        channels = width
        for index, (count, stage_width) in enumerate(zip((3, 4, 6, 3), (width, 2 * width, 4 * width, 8 * width))):
            for block in range(count):
                layers.append(_Bottleneck(channels, stage_width, 2 if index > 0 and block == 0 else 1))
                channels = stage_width * _Bottleneck.expansion
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = channels

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


class SmallViT(nn.Module):
    """A small vision transformer (Dosovitskiy et al. 2021) for 32x32 inputs: 4x4 patches
    (64 tokens), learned position embeddings, pre-LayerNorm encoder blocks, the mean of the
    tokens as ``h``. LayerNorm only, so no batch statistics (a batch's rows do not interact).

    Args:
        in_channels: ``C`` of the input images ``(N, C, H, W)``.
        image_size: ``H = W`` the position embeddings are made for.
        patch_size: side of a patch; must divide ``image_size``.
        dim, depth, heads: token width, number of blocks, attention heads (``dim % heads == 0``).

    ``forward`` returns ``h`` of shape ``(N, dim)``.
    """

    def __init__(self, in_channels: int = 3, image_size: int = 32, patch_size: int = 4, dim: int = 128,
                 depth: int = 4, heads: int = 4) -> None:
        super().__init__()
        if min(in_channels, image_size, patch_size, dim, depth, heads) < 1:
            raise ValueError("in_channels, image_size, patch_size, dim, depth and heads must be >= 1")
        if image_size % patch_size or dim % heads:
            raise ValueError(f"patch_size must divide image_size and heads must divide dim, got image_size "
                             f"{image_size}, patch_size {patch_size}, dim {dim}, heads {heads}")
        self.image_size = image_size
        self.patches = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.position = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2, dim))
        nn.init.trunc_normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out_dim = dim

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"SmallViT was built for {self.image_size}x{self.image_size} images, got "
                             f"{x.shape[-2]}x{x.shape[-1]} (pass image_size)")
        tokens = self.patches(x).flatten(2).transpose(1, 2) + self.position
        return self.norm(self.blocks(tokens)).mean(dim=1)


class ProjectionHead(nn.Module):
    """SimCLR's MLP head ``z = W2 relu(BN(W1 h))``: ``(N, in_dim)`` -> ``(N, out_dim)``;
    ``norm="group"`` puts LayerNorm in place of BN (:func:`norm_layer`)."""

    def __init__(self, in_dim: int, hidden_dim: int = 128, out_dim: int = 64, norm: Optional[str] = None) -> None:
        super().__init__()
        if min(in_dim, hidden_dim, out_dim) < 1:
            raise ValueError(f"head sizes must be >= 1, got {in_dim}, {hidden_dim}, {out_dim}")
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden_dim, bias=False),
            norm_layer(norm, hidden_dim, spatial=False),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, out_dim),
        )
        self.out_dim = out_dim

    def forward(self, h: Tensor) -> Tensor:
        return self.net(h)


#: The built-in encoders by name: ``factory(in_channels, **options)``.
ENCODERS: Dict[str, Callable[..., nn.Module]] = {
    "small": SmallCNN,
    "resnet18": ResNet18,
    "resnet50": ResNet50,
    "vit": SmallViT,
}

#: Spec prefix of an encoder given as a Python object whose class cannot be imported again.
OBJECT_PREFIX = "object:"


def build_encoder(name: str, in_channels: int, norm: Optional[str] = None, **options: Any) -> nn.Module:
    """The built-in encoder called ``name`` (a key of :data:`ENCODERS`) for ``in_channels``
    inputs; ``options`` go to its constructor (e.g. ``width``), and ``norm`` (``None``/``"batch"``:
    BatchNorm; ``"group"``: GroupNorm) to the small CNN and ResNet-18."""
    if name not in ENCODERS:
        raise ValueError(f"encoder must be one of {sorted(ENCODERS)}, got {name!r}")
    if norm is not None:
        options["norm"] = norm
    try:
        return ENCODERS[name](in_channels, **options)
    except TypeError as err:
        raise TypeError(f"encoder {name!r}: bad encoder options {sorted(options)} ({err})") from None


def load_factory(path: str) -> Callable[..., Any]:
    """The callable at ``"package.module:attribute"`` (the attribute may be dotted).

    Raises ``ValueError`` naming ``path`` when the form is wrong, the module cannot be
    imported or has no such attribute, and ``TypeError`` when it is not callable.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"encoder factory must look like 'package.module:factory', got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"encoder factory {path!r}: cannot import module {module_name!r} ({err})") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"encoder factory {path!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"encoder factory {path!r} is a {type(target).__name__}, not a callable")
    return target


def encoder_from_spec(spec: str, in_channels: int, options: Optional[Mapping[str, Any]] = None) -> nn.Module:
    """Build the encoder a run's ``encoder`` / ``encoder_options`` describe.

    A built-in name goes to :func:`build_encoder`; ``"timm:NAME"`` / ``"torchvision:NAME"`` to
    :func:`~contrastkit.models.external.external_encoder`; ``"package.module:factory"`` is imported and
    called with ``options``, plus ``in_channels=`` when its signature takes that argument and
    ``options`` do not set it. ``"object:..."`` (a module given as an object) cannot be rebuilt:
    ``ValueError`` asks for the module again.
    """
    options = dict(options or {})
    if spec.startswith(OBJECT_PREFIX):
        raise ValueError(f"the run's encoder was given as a Python object ({spec[len(OBJECT_PREFIX):]}) whose "
                         "class cannot be imported; pass the module again (encoder=...)")
    if ":" not in spec:
        return build_encoder(spec, in_channels, **options)
    if is_external_spec(spec):
        return external_encoder(spec, in_channels, options)
    factory = load_factory(spec)
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        parameters = {}
    if "in_channels" in parameters and "in_channels" not in options:
        options["in_channels"] = in_channels
    try:
        module = factory(**options)
    except TypeError as err:
        raise TypeError(f"encoder factory {spec!r} cannot be called with options {options}: {err}; if the run was "
                        "given the module as an object, pass it again (encoder=...)") from None
    if not isinstance(module, nn.Module):
        raise TypeError(f"encoder factory {spec!r} returned a {type(module).__name__}, not a torch.nn.Module")
    return module


def describe_encoder(module: nn.Module, in_channels: int) -> str:
    """The spec that rebuilds ``module``'s architecture: ``"package.module:Class"`` when that
    class can be imported again and, called with no options (``in_channels`` when it takes it),
    builds parameters of the same names and shapes; else ``"object:package.module.Class"``.
    Torch's global RNG is left untouched."""
    cls = type(module)
    path = f"{cls.__module__}:{cls.__qualname__}"
    if cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__:
        try:
            with torch.random.fork_rng(devices=[]):
                rebuilt = encoder_from_spec(path, in_channels) if load_factory(path) is cls else None
        except Exception:  # any failure to rebuild means: not rebuildable from the path alone
            rebuilt = None
        if rebuilt is not None and _shapes(rebuilt) == _shapes(module):
            return path
    return f"{OBJECT_PREFIX}{cls.__module__}.{cls.__qualname__}"


def _shapes(module: nn.Module) -> Dict[str, tuple]:
    return {key: tuple(value.shape) for key, value in module.state_dict().items()}


class PooledEncoder(nn.Module):
    """An encoder with output ``(N, D, ...)`` followed by global average pooling over the
    trailing dimensions: ``(N, C, H, W)`` -> ``(N, D)``. ``module`` is the wrapped encoder."""

    def __init__(self, module: nn.Module, out_dim: int) -> None:
        super().__init__()
        self.module = module
        self.out_dim = out_dim

    def forward(self, x: Tensor) -> Tensor:
        h = self.module(x)
        return h.flatten(2).mean(dim=2) if h.dim() > 2 else h


def unwrap_encoder(encoder: nn.Module) -> nn.Module:
    """The module inside a :class:`PooledEncoder` (the one a user passed or built), else
    ``encoder`` itself."""
    return encoder.module if isinstance(encoder, PooledEncoder) else encoder


def _dry_output(encoder: nn.Module, sample: Tensor, name: str) -> Tensor:
    try:
        out = encoder(sample)
    except Exception as err:  # a user's module may raise anything on a wrong input shape
        raise ValueError(f"encoder {name}: a forward pass on a batch of shape {tuple(sample.shape)} failed "
                         f"({type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''})"
                         ) from None
    if not isinstance(out, Tensor) or out.dim() < 2 or out.shape[0] != sample.shape[0] or out.numel() == 0:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"encoder {name}: maps a batch of shape {tuple(sample.shape)} to {got}; expected "
                         f"(N, D) or (N, D, ...) with N = {sample.shape[0]}")
    if not out.is_floating_point() or not bool(torch.isfinite(out).all()):
        raise ValueError(f"encoder {name}: its output on a batch of shape {tuple(sample.shape)} is not finite "
                         "floating point (NaN, inf or an integer dtype)")
    return out


def prepare_encoder(encoder: nn.Module, image_shape: Sequence[int], name: Optional[str] = None) -> nn.Module:
    """Check ``encoder`` by one dry forward on 2 images of ``image_shape`` ``(C, H, W)`` and
    give it ``out_dim`` (its ``D``): the encoder itself, or a :class:`PooledEncoder` around it
    when its output is ``(N, D, ...)``.

    The forward runs under ``no_grad`` in eval mode (the mode is restored; no running statistic
    moves) on inputs from a private generator (torch's global RNG is untouched). ``ValueError``
    naming the encoder when the output has the wrong shape, is not finite, differs between two
    calls in eval mode, or disagrees with a declared ``out_dim``.
    """
    name = name or type(encoder).__name__
    if not isinstance(encoder, nn.Module):
        raise TypeError(f"encoder {name} must be a torch.nn.Module, got {type(encoder).__name__}")
    parameter = next(iter(encoder.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    shape = (2, *(int(s) for s in image_shape))
    sample = torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(device)
    was_training = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            first = _dry_output(encoder, sample, name)
            second = _dry_output(encoder, sample, name)
    finally:
        encoder.train(was_training)
    if first.shape != second.shape or not torch.allclose(first, second, rtol=1e-4, atol=1e-5):
        raise ValueError(f"encoder {name}: two forward passes in eval mode on the same batch differ; the read-out "
                         "needs a deterministic encoder (dropout or other randomness left on in eval mode?)")
    out_dim = int(first.shape[1])
    declared = getattr(encoder, "out_dim", None)
    if declared is not None and first.dim() == 2 and declared != out_dim:
        raise ValueError(f"encoder {name}: declares out_dim {declared} but outputs {out_dim} features")
    if first.dim() > 2:
        return PooledEncoder(encoder, out_dim)
    if declared is None:
        encoder.out_dim = out_dim
    return encoder
