"""The method table: ``register_method`` fills it. A module of its own so that the built-in method
modules register without importing their package (whose ``registry()`` imports them), which keeps
the import graph acyclic with the registry's dynamic imports counted (tests/test_imports.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Method

_PACKAGE = __name__.rpartition(".")[0]  # sentemb.methods: its modules are the built-in methods
_REGISTRY: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register ``cls`` under ``cls.name``. A name of a built-in method cannot be
    taken by another class (a plug-in cannot silently replace one of the six); a plug-in imported
    again (the same file from another path) replaces its earlier class."""
    from .. import SentembError

    old = _REGISTRY.get(cls.name)
    if (old is not None and old.__module__.startswith(_PACKAGE + ".")
            and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__)):
        raise SentembError(f"method '{cls.name}' of {cls.__module__}.{cls.__qualname__}: the name is the built-in "
                           f"{old.__module__}.{old.__qualname__}'s; give the class another `name`")
    _REGISTRY[cls.name] = cls
    return cls
