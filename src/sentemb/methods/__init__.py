"""Method registry. A method is a ``Method`` subclass in its own module, registered by name.

Adding a method = one module here (batch construction + losses) + a line in ``_MODULES`` + config.
"""

from __future__ import annotations

import importlib

from .base import Method, MethodContext

_MODULES = ["sentemb.methods.simcse"]
_REGISTRY: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Method]]:
    if not _REGISTRY:
        for m in _MODULES:
            importlib.import_module(m)
    return _REGISTRY


def get_method(name: str) -> type[Method]:
    from .. import SentembError

    reg = registry()
    if name not in reg:
        raise SentembError(f"unknown method '{name}' (registered: {sorted(reg)})")
    return reg[name]


__all__ = ["Method", "MethodContext", "get_method", "register_method", "registry"]
