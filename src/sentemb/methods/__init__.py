"""Method registry. A method is a ``Method`` subclass registered by name with ``@register_method``.

Where methods come from:

* the built-in ones: every module of this package except ``base``, ``registry`` and ``masking``, imported
  on first use (they register with ``.registry.register_method``, never importing this package);
* installed packages: the entry-point group ``sentemb.methods`` (each entry point is imported);
* the user's own code: the config key ``method_modules`` (Python files relative to the working
  directory, or importable module names), imported before the config is validated
  (``load_method_modules``). A training job imports its run's module again (``Run.method_module``).

The public API for a method in a file of its own (kept stable; it is what users' files import)::

    from sentemb.methods import Method, Encoded, register_method, arg, WEIGHTED, all_ranks_rows, ema_
    from sentemb.methods.simcse import SimCSE      # built-in classes, to subclass

``Encoded`` is what ``Method.encode`` returns (``sentemb.methods.base``), ``WEIGHTED`` the key of the
weighted loss terms.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path

from .base import WEIGHTED, Encoded, Method, MethodContext, all_ranks_rows, arg, ema_
from .registry import _MODULES, _REGISTRY, register_method

_NOT_METHODS = {"base", "registry", "masking"}
_LOADED = False
_IMPORTED: dict[str, str] = {}  # method_modules entry (a file resolved) -> module name
_SPEC: dict[str, str] = {}  # module name -> the method_modules entry it was imported by
ENTRY_POINT_GROUP = "sentemb.methods"


def registry() -> dict[str, type[Method]]:
    global _LOADED
    if not _LOADED:  # (a method module imported directly registers only itself)
        _LOADED = True
        for info in pkgutil.iter_modules(__path__):
            if info.name not in _NOT_METHODS and not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
        _load_entry_points()
    return _REGISTRY


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    from .. import SentembError

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except SentembError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken plug-in names itself
            raise SentembError(f"entry point '{ep.name}' ({ep.value}) of group {ENTRY_POINT_GROUP}: "
                               f"{type(e).__name__}: {e}") from e


def import_method_module(spec: str, where: str = "method_modules") -> str:
    """Import one ``method_modules`` entry: a ``.py`` file (a path relative to the working
    directory) or an importable module name; its ``@register_method`` classes join the registry.
    Idempotent per resolved file. Returns the module's name; errors name ``where``."""
    from .. import SentembError

    registry()  # the built-in methods first: a plug-in's name must not shadow one
    is_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    key = str(Path(spec).resolve()) if is_file else spec
    if key in _IMPORTED:
        return _IMPORTED[key]
    try:
        if is_file:
            path = Path(key)
            if not path.is_file():
                raise SentembError(f"{where}: {spec}: no such file (relative to the working directory {Path.cwd()})")
            name = "sentemb_user_methods." + hashlib.sha256(key.encode()).hexdigest()[:8] + "_" + path.stem
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            name = importlib.import_module(spec).__name__
    except SentembError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module: its own error, with the key
        raise SentembError(f"{where}: importing {spec} failed: {type(e).__name__}: {e}") from e
    _IMPORTED[key] = name
    _SPEC[name] = spec
    _check_registered(name, spec, where)
    return name


def _check_registered(module: str, spec: str, where: str) -> None:
    """Warn where the imported ``module`` defines ``Method`` subclasses and registered none of them
    (``@register_method`` forgotten): a run naming one would otherwise read only "unknown method"."""
    import logging

    mod = sys.modules.get(module)
    if mod is None or _registered_by(module):
        return
    own = [v.__name__ for v in vars(mod).values()
           if isinstance(v, type) and issubclass(v, Method) and v.__module__ == module]
    if own:
        logging.getLogger(__name__).warning("%s: %s defines %s but registers no method (a method class is "
                                            "decorated with @register_method, from sentemb.methods)", where, spec,
                                            ", ".join(own))


def _registered_by(module: str) -> bool:
    """Whether ``module`` or one of its submodules (a package listed in method_modules) registered a method."""
    return any(m == module or m.startswith(module + ".") for m in _MODULES)


def load_method_modules(specs, where: str = "method_modules") -> None:
    """Import every entry of the config key ``method_modules`` (a list of strings)."""
    from .. import SentembError

    if specs is None:
        return
    if not isinstance(specs, list) or not all(isinstance(s, str) and s for s in specs):
        raise SentembError(f"{where}: must be a list of Python files or module names, not {specs!r}")
    for i, spec in enumerate(specs):
        import_method_module(spec, f"{where}[{i}]")


def method_source(cls: type[Method]) -> tuple[str, str] | None:
    """For a method from the user's code (not this package): (what to import it by, sha256 of its
    file). The file is the one that defines the class; its digest goes into the run's settings, so
    editing it reruns that method's jobs and nothing else. None for a built-in method."""
    mod = sys.modules.get(cls.__module__)
    if cls.__module__.startswith(__name__ + ".") or mod is None:
        return None
    file = inspect.getsourcefile(cls) or getattr(mod, "__file__", None)
    digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else ""
    return _SPEC.get(cls.__module__, cls.__module__), digest


def get_method(name: str) -> type[Method]:
    from .. import SentembError

    reg = registry()
    if name not in reg:
        hint = ""
        silent = [s for m, s in _SPEC.items() if not _registered_by(m)]
        if silent:
            hint = (f"; {', '.join(silent)} registered no method: is its class decorated with @register_method, "
                    "and is this its `name`?")
        raise SentembError(f"unknown method '{name}' (registered: {sorted(reg)}){hint}")
    return reg[name]


__all__ = ["WEIGHTED", "Encoded", "Method", "MethodContext", "all_ranks_rows", "arg", "ema_", "get_method", "import_method_module", "load_method_modules",
           "method_source", "register_method", "registry"]
