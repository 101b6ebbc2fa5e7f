"""The methods by name: :func:`register_method` adds one, :func:`get_method` finds it.

The registry knows no method itself: each method registers its own object (the built-ins when
:mod:`contrastkit.methods` is imported), so adding a method is one subclass in one file::

    @register_method
    class MyMethod(TwoViewMethod):
        name = "mine"
        default_temperature = 0.2
        def objective(self, model, embeddings, labels): ...

Standard library only, so that the run's configuration may ask it without importing any method
(the registry holds :class:`~contrastkit.methods.Method` objects; it needs nothing of them but
their ``name``).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

__all__ = ["METHOD_REGISTRY", "register_method", "unregister_method", "get_method", "method_names"]

#: Every registered method by name, in the order of registration.
METHOD_REGISTRY: Dict[str, Any] = {}

def register_method(method: Any) -> Any:
    """Register a method class (instantiated with no arguments) or object under its ``name``;
    usable as a class decorator. A name registered twice is a ``ValueError``: one method owns
    each name."""
    instance = method() if isinstance(method, type) else method
    name = getattr(instance, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a method needs a non-empty string name, got {name!r}")
    if name in METHOD_REGISTRY and type(METHOD_REGISTRY[name]) is not type(instance):
        raise ValueError(f"method {name!r} is already registered ({type(METHOD_REGISTRY[name]).__name__})")
    METHOD_REGISTRY[name] = instance
    return method


def unregister_method(name: str) -> None:
    """Remove the method ``name`` (a method a test or a plug-in registered for a while)."""
    METHOD_REGISTRY.pop(name, None)


def method_names() -> Tuple[str, ...]:
    """The registered methods' names, in the order of registration."""
    return tuple(METHOD_REGISTRY)


def get_method(name: str) -> Any:
    """The registered :class:`~contrastkit.methods.Method` called ``name``; an unknown name is a ``ValueError`` listing them."""
    if not isinstance(name, str) or name not in METHOD_REGISTRY:
        raise ValueError(f"method must be one of {method_names()}, got {name!r}")
    return METHOD_REGISTRY[name]
