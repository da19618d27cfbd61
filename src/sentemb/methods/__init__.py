"""Method registry. A method is a ``Method`` subclass in its own module, registered by name.

Adding a method = one module here (batch construction + losses) + config: every module of this
package except ``base`` and ``cli`` is imported on first use, and its ``@register_method`` classes
are the registered methods.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Encoded, Method, MethodContext

_NOT_METHODS = {"base", "cli"}
_REGISTRY: dict[str, type[Method]] = {}
_LOADED = False


def register_method(cls: type[Method]) -> type[Method]:
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Method]]:
    global _LOADED
    if not _LOADED:  # (a method module imported directly registers only itself)
        _LOADED = True
        for info in pkgutil.iter_modules(__path__):
            if info.name not in _NOT_METHODS and not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
    return _REGISTRY


def get_method(name: str) -> type[Method]:
    from .. import SentembError

    reg = registry()
    if name not in reg:
        raise SentembError(f"unknown method '{name}' (registered: {sorted(reg)})")
    return reg[name]


__all__ = ["Encoded", "Method", "MethodContext", "get_method", "register_method", "registry"]
