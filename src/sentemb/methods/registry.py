"""The method table: ``register_method`` fills it. A module of its own so that the built-in method
modules register without importing their package (whose ``registry()`` imports them), which keeps
the import graph acyclic with the registry's dynamic imports counted (tests/test_imports.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Method

_PACKAGE = __name__.rpartition(".")[0]  # sentemb.methods: its modules are the built-in methods
_REGISTRY: dict[str, type[Method]] = {}
_MODULES: set[str] = set()  # every module a registered class came from (also where a later copy replaced it)


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register ``cls`` under ``cls.name``. A name of a built-in method cannot be
    taken by another class (a plug-in cannot silently replace one of the six), nor a name another
    file's class holds (two plug-in files of different contents registering one name); a plug-in
    imported again (the same file, edited or from another path, or a copy of it) replaces its
    earlier class. The class must set ``name``, where it declares ``Args``, make it a ``@dataclass``
    (else its arguments would be dropped), and give every argument a default its own declaration
    (type, bounds, choices) accepts: all the defaults that do not are named at once."""
    from .. import SentembError

    where = f"{cls.__qualname__} ({_source(cls) or cls.__module__})"
    name = cls.__dict__.get("name", getattr(cls, "name", None))
    if not isinstance(name, str) or not name:
        raise SentembError(f"@register_method on {where}: the class has no `name` (set a class attribute, e.g. "
                           "`name = \"my-simcse\"`: what configs call the method)")
    args = cls.__dict__.get("Args")
    if isinstance(args, type) and "__dataclass_fields__" not in args.__dict__ and _own_annotations(args):
        raise SentembError(f"@register_method on {where}: its Args is not a dataclass, so its arguments "
                           f"{', '.join(_own_annotations(args))} would be ignored; decorate it with @dataclass")
    bad = []  # every default against its own declaration (type, bounds, choices), all named at once
    for spec in cls.arg_specs():
        try:
            cls.validate_args({spec.name: spec.default}, "defaults")
        except SentembError as e:
            hint = f" (a default of None needs the type `{spec.type} | None`)" if spec.default is None else ""
            bad.append(f"{e}{hint}")
    if bad:
        raise SentembError(f"@register_method on {where}: {len(bad)} default(s) break their own declaration: "
                           + "; ".join(bad))
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        if old.__module__.startswith(_PACKAGE + "."):
            raise SentembError(f"method '{name}' of {where}: the name is the built-in "
                               f"{old.__module__}.{old.__qualname__}'s; give the class another `name`")
        a, b = _source(old), _source(cls)
        if a is not None and b is not None and a != b and _digest(a) != _digest(b):
            raise SentembError(f"method '{name}' is registered twice: by {old.__qualname__} in {a} and by "
                               f"{cls.__qualname__} in {b}; give one of the classes another `name`")
    _REGISTRY[name] = cls
    _MODULES.add(cls.__module__)
    return cls


def _own_annotations(cls: type) -> list[str]:
    import inspect

    try:
        return list(inspect.get_annotations(cls))
    except Exception:  # noqa: BLE001 - an annotation that cannot be read is not ours to judge
        return []


def _digest(path: str) -> str | None:
    """sha256 of a file (None where it cannot be read): a copy of a plug-in's file is the same plug-in."""
    from ..utils import sha256_file

    try:
        return sha256_file(path)
    except OSError:
        return None


def _source(cls: type) -> str | None:
    """The resolved file that defines ``cls`` (None where it has none: a class made at run time)."""
    import inspect
    from pathlib import Path

    try:
        f = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None
    return str(Path(f).resolve()) if f else None
