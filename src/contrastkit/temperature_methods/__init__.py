"""Temperature methods: losses that decide their own temperatures, one file and one record each.

:mod:`.registry` holds the records (:class:`TemperatureMethodSpec`); the built-ins register
themselves here, each from its own file:

``macl`` (:mod:`.macl`), ``dual`` (:mod:`.dual`), ``individual`` (:mod:`.individual`),
``network`` (:mod:`.network`).

A new method is a loss (an :class:`~contrastkit.losses.AdaptiveTemperatureLoss`) and one call
of :func:`register_temperature_method`; ``--temperature-method NAME[:VALUES]`` then trains
it, and ``contrastkit explain --methods`` and ``contrastkit experiment temperature-methods``
list it (docs/temperature-methods.md).
"""

from .registry import (
    SCHEDULE_KINDS,
    TEMPERATURE_METHOD_REGISTRY,
    MethodRows,
    TemperatureMethodSpec,
    explain_at_setting,
    get_temperature_method,
    register_temperature_method,
    registering_modules,
    temperature_method_names,
    unregister_temperature_method,
)
from .method import TemperatureMethod, parse_temperature_method, temperature_method_of
from . import macl, dual, individual, network  # noqa: E402,F401  (the built-ins register themselves)

__all__ = ["TemperatureMethodSpec", "TEMPERATURE_METHOD_REGISTRY", "register_temperature_method",
           "unregister_temperature_method", "get_temperature_method", "temperature_method_names",
           "explain_at_setting", "MethodRows", "registering_modules", "TemperatureMethod",
           "parse_temperature_method", "temperature_method_of"]
