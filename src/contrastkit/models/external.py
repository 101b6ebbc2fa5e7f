"""Encoders from the model libraries users have: ``timm:NAME`` and ``torchvision:NAME``.

``timm:NAME`` is ``timm.create_model(NAME, num_classes=0, in_chans=C, **options)`` (timm drops
the classifier and returns the pooled features). ``torchvision:NAME`` is
``torchvision.models.get_model(NAME, **options)`` (``weights=None``: random initialisation)
with its classification layer replaced by ``nn.Identity``: the last ``nn.Linear`` under
``fc`` (ResNets, RegNets, ...), ``classifier`` (VGG, MobileNets, EfficientNets, ConvNeXt,
DenseNet, ...), ``heads`` (ViT) or ``head`` (Swin). The feature size is then found by the
dry forward (:func:`~contrastkit.models.prepare_encoder`).

One option is contrastkit's own and never reaches the library: ``cifar_stem=true`` gives a
ResNet-family model (a ``conv1`` convolution then a ``maxpool``: timm's and torchvision's
ResNets, ResNeXts, Wide ResNets) the stem SimCLR used for 32x32 CIFAR-10 images (Chen et al.
2020, appendix B.9): a 3x3 convolution with stride 1 in place of the 7x7 stride-2 one, and no
max-pool, so a 32x32 image is not cut to 8x8 before the first block. Other families have no
such stem and are refused with that option (a ViT takes its own size options instead, e.g.
timm's ``img_size=32, patch_size=4``).

Grayscale and other channel counts: timm builds the first layer for ``in_chans``; a
torchvision model (always built for RGB) gets its first convolution rebuilt for ``C`` input
channels, its filters summed over RGB for one channel (a gray image then gives the response the
same image repeated in R, G and B would) or repeated and scaled by ``3 / C`` for other counts,
as timm adapts pretrained filters.

Neither package is imported before such an encoder is asked for; without it,
:class:`~contrastkit.extras.MissingExtraError` names the extra to install.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from contrastkit.extras import import_extra

__all__ = ["TIMM_PREFIX", "TORCHVISION_PREFIX", "EXTERNAL_PREFIXES", "CIFAR_STEM", "is_external_spec",
           "external_encoder", "timm_encoder", "torchvision_encoder", "apply_cifar_stem", "adapt_input_channels",
           "remove_classifier"]

TIMM_PREFIX = "timm:"
TORCHVISION_PREFIX = "torchvision:"
#: The spec prefixes of the model libraries (``--encoder timm:resnet18``).
EXTERNAL_PREFIXES: Tuple[str, ...] = (TIMM_PREFIX, TORCHVISION_PREFIX)
#: contrastkit's own encoder option (never passed to the library): the CIFAR stem of a ResNet.
CIFAR_STEM = "cifar_stem"
# Where torchvision keeps the classification layer, in the order they are looked for.
_HEADS = ("fc", "classifier", "heads", "head")


def is_external_spec(spec: str) -> bool:
    """Whether ``spec`` names a timm or torchvision model (``timm:NAME``, ``torchvision:NAME``)."""
    return isinstance(spec, str) and spec.startswith(EXTERNAL_PREFIXES)


def external_encoder(spec: str, in_channels: int, options: Optional[Mapping[str, Any]] = None) -> nn.Module:
    """The encoder ``spec`` (``timm:NAME`` or ``torchvision:NAME``) for images of
    ``in_channels`` channels, ``options`` passed to the library except ``cifar_stem``."""
    prefix = next((p for p in EXTERNAL_PREFIXES if spec.startswith(p)), None)
    if prefix is None:
        raise ValueError(f"encoder {spec!r} does not start with one of {EXTERNAL_PREFIXES}")
    name = spec[len(prefix):]
    options = dict(options or {})
    stem = options.pop(CIFAR_STEM, False)
    if not isinstance(stem, bool):
        raise TypeError(f"encoder option {CIFAR_STEM} must be true or false, got {stem!r}")
    build = timm_encoder if prefix == TIMM_PREFIX else torchvision_encoder
    return build(name, in_channels, cifar_stem=stem, **options)


def _check_name(name: str, known: Callable[[], List[str]], library: str, listing: str, exists: bool) -> None:
    if not name:
        raise ValueError(f"--encoder {library}:NAME needs a model name, e.g. {library}:resnet18")
    if not exists:
        close = difflib.get_close_matches(name, known(), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"{library} has no model {name!r}{hint}; {listing} lists them")


def _refuse_num_classes(spec: str, options: Mapping[str, Any]) -> None:
    if "num_classes" in options:
        raise ValueError(f"encoder {spec}: the option num_classes is not taken; the classification layer is "
                         "removed (the encoder's output is its features)")


def timm_encoder(name: str, in_channels: int = 3, *, cifar_stem: bool = False, **options: Any) -> nn.Module:
    """``timm.create_model(name, num_classes=0, in_chans=in_channels, **options)``: images
    ``(N, in_channels, H, W)`` -> pooled features ``(N, D)`` (``D = model.num_features``);
    ``cifar_stem``: :func:`apply_cifar_stem`."""
    spec = f"{TIMM_PREFIX}{name}"
    timm = import_extra("timm", "timm", f"--encoder {spec}")
    _check_name(name, timm.list_models, "timm", "timm.list_models()", bool(name) and timm.is_model(name))
    _refuse_num_classes(spec, options)
    options.setdefault("in_chans", in_channels)
    model = _call(lambda: timm.create_model(name, num_classes=0, **options), spec, options)
    if cifar_stem:
        apply_cifar_stem(model, int(options["in_chans"]), spec)
    return model


def torchvision_encoder(name: str, in_channels: int = 3, *, cifar_stem: bool = False, **options: Any) -> nn.Module:
    """``torchvision.models.get_model(name, **options)`` with its classification layer removed
    (:func:`remove_classifier`) and, for ``in_channels != 3``, its first convolution rebuilt
    (:func:`adapt_input_channels`): images ``(N, in_channels, H, W)`` -> features ``(N, D)``
    (or ``(N, D, ...)``, pooled by the caller); ``cifar_stem``: :func:`apply_cifar_stem`."""
    spec = f"{TORCHVISION_PREFIX}{name}"
    models = import_extra("torchvision.models", "torchvision", f"--encoder {spec}", "torchvision")
    known = models.list_models(module=models)
    _check_name(name, lambda: known, "torchvision", "torchvision.models.list_models(module=torchvision.models)",
                name in known)
    _refuse_num_classes(spec, options)
    model = _call(lambda: models.get_model(name, **options), spec, options)
    remove_classifier(model, spec)
    if cifar_stem:
        apply_cifar_stem(model, in_channels, spec)
    elif in_channels != 3:
        adapt_input_channels(model, in_channels, spec)
    return model


def _call(build: Any, spec: str, options: Dict[str, Any]) -> nn.Module:
    """``build()``, its failures on the user's name and options as one error naming them."""
    try:
        return build()
    except TypeError as err:
        raise TypeError(f"encoder {spec}: bad encoder options {sorted(options)} ({err})") from None
    except (RuntimeError, ValueError, KeyError, AssertionError, OSError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"encoder {spec} with options {options} cannot be built: {text} (weights are read from "
                         "a local file with --encoder-weights FILE)") from None


def remove_classifier(model: nn.Module, spec: str = "the model") -> str:
    """Replace ``model``'s classification layer by ``nn.Identity`` in place: the attribute
    ``fc`` / ``classifier`` / ``heads`` / ``head`` when it is an ``nn.Linear``, else the last
    ``nn.Linear`` inside it (the layers before it, e.g. ConvNeXt's LayerNorm, stay). Returns
    the path of what was replaced; ``ValueError`` when there is no such layer."""
    for attribute in _HEADS:
        head = getattr(model, attribute, None)
        if not isinstance(head, nn.Module):
            continue
        if isinstance(head, nn.Linear):
            setattr(model, attribute, nn.Identity())
            return attribute
        linears = [path for path, module in head.named_modules() if isinstance(module, nn.Linear)]
        if linears:
            parent_path, _, child = linears[-1].rpartition(".")
            setattr(head.get_submodule(parent_path) if parent_path else head, child, nn.Identity())
            return f"{attribute}.{linears[-1]}"
        break
    raise ValueError(f"encoder {spec} ({type(model).__name__}) has no linear classification layer under "
                     f"{', '.join(_HEADS)}; give a factory (package.module:callable) that returns its features")


def apply_cifar_stem(model: nn.Module, in_channels: int, spec: str = "the model") -> None:
    """Give a ResNet-family ``model`` (a ``conv1`` convolution, then a ``maxpool``) the CIFAR
    stem in place: ``conv1`` becomes a 3x3 convolution, stride 1, padding 1, from
    ``in_channels`` (He-initialised, fan-out, as both libraries initialise convolutions) and
    ``maxpool`` an ``nn.Identity``. A 32x32 image reaches the first block at 32x32, not 8x8.
    ``ValueError`` naming ``spec`` for a model without that stem."""
    conv, pool = getattr(model, "conv1", None), getattr(model, "maxpool", None)
    if not isinstance(conv, nn.Conv2d) or not isinstance(pool, nn.Module):
        raise ValueError(f"encoder option {CIFAR_STEM} applies to ResNet-family models (one 'conv1' convolution, "
                         f"then a 'maxpool'); {spec} is a {type(model).__name__} without that stem. For 32x32 images "
                         "choose a ResNet (resnet18, resnet50, resnext50_32x4d, wide_resnet50_2, ...) or the model's "
                         "own size options (timm ViTs: img_size=32, patch_size=4; torchvision ViTs: image_size=32)")
    stem = nn.Conv2d(in_channels, conv.out_channels, 3, stride=1, padding=1, bias=conv.bias is not None)
    nn.init.kaiming_normal_(stem.weight, mode="fan_out", nonlinearity="relu")
    if stem.bias is not None:
        nn.init.zeros_(stem.bias)
    model.conv1 = stem
    model.maxpool = nn.Identity()


def adapt_input_channels(model: nn.Module, in_channels: int, spec: str = "the model") -> str:
    """Rebuild ``model``'s first convolution (the first ``nn.Conv2d`` it holds, which must take
    3 channels) for ``in_channels`` in place: its filters summed over RGB for 1 channel, else
    repeated over the channels and scaled by ``3 / in_channels``; bias and geometry kept.
    Returns the convolution's path; ``ValueError`` naming ``spec`` when there is none to adapt."""
    for path, conv in model.named_modules():
        if not isinstance(conv, nn.Conv2d):
            continue
        if conv.in_channels != 3 or conv.groups != 1:
            break
        new = nn.Conv2d(in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                        bias=conv.bias is not None, padding_mode=conv.padding_mode)
        with torch.no_grad():
            weight = conv.weight
            if in_channels == 1:
                new.weight.copy_(weight.sum(dim=1, keepdim=True))
            else:
                repeats = math.ceil(in_channels / 3)
                new.weight.copy_(weight.repeat(1, repeats, 1, 1)[:, :in_channels] * (3.0 / in_channels))
            if conv.bias is not None:
                new.bias.copy_(conv.bias)
        parent_path, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, child, new)
        return path
    raise ValueError(f"encoder {spec} ({type(model).__name__}) has no 3-channel first convolution to rebuild for "
                     f"{in_channels}-channel images; convert the images to RGB (e.g. --data-option color=RGB for an "
                     "image folder)")
