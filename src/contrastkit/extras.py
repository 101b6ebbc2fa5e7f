"""Optional packages, imported only when a feature that needs them is used.

contrastkit's core needs torch and numpy; timm, torchvision, safetensors, onnx and onnxruntime
are extras (``pip install 'contrastkit[timm]'`` ...). :func:`import_extra` imports one of
them where it is needed, or raises :class:`MissingExtraError` naming the extra that installs
it. Standard library only, so that every layer may import it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "import_extra"]


class MissingExtraError(ImportError, ValueError):
    """An optional package is not installed; the message names the extra that installs it.

    An ``ImportError`` (what it is) and a ``ValueError`` (a choice the user can change: the
    command line prints it as one line, exit status 2)."""


def import_extra(module: str, extra: str, purpose: str, package: str = "") -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingExtraError` saying that
    ``purpose`` (e.g. ``"--encoder timm:resnet18"``) needs ``package`` (default: the module's
    top-level name) and ``pip install 'contrastkit[extra]'`` installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        name = package or module.partition(".")[0]
        raise MissingExtraError(f"{purpose} needs the {name} package, which is not installed ({err}): "
                                f"pip install 'contrastkit[{extra}]'") from None
