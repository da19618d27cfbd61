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
    """For a method from the user's code (not this package): (what to import it by, ``code_digest``).
    The digest goes into the run's settings, so editing the method's file, or a file of the user's
    code it imports, reruns that method's jobs and nothing else. None for a built-in method."""
    mod = sys.modules.get(cls.__module__)
    if cls.__module__.startswith(__name__ + ".") or mod is None:
        return None
    return _SPEC.get(cls.__module__, cls.__module__), code_digest(cls)


def code_digest(cls: type) -> str:
    """The sha256 of the code that defines ``cls``: of its file alone where ``method_files`` finds no
    other (so a one-file plug-in's digest is its file's sha256), else of its file's digest and each
    other file's path relative to it and digest, in path order. "" where ``cls`` has no source file."""
    files = method_files(cls)
    if not files:
        return ""
    first = hashlib.sha256(files[0].read_bytes()).hexdigest()
    if len(files) == 1:
        return first
    import os

    h = hashlib.sha256(first.encode())
    for f in sorted(files[1:], key=lambda f: os.path.relpath(f, files[0].parent)):
        h.update(f"\0{os.path.relpath(f, files[0].parent)}\0{hashlib.sha256(f.read_bytes()).hexdigest()}".encode())
    return h.hexdigest()


def method_files(cls: type) -> list[Path]:
    """The files of the user's code that define ``cls``: its own file first, then every other file of
    the user's code that its module reaches, through the modules, classes and functions in its globals
    and its base classes, and from those modules in turn. The user's code is any Python file outside
    the standard library, the installed packages (``site-packages``: an editable install's sources
    count) and this package. A constant imported by value (``from helpers import RATE``) is not
    followed; its module is, where anything else of it is imported."""
    import types

    try:
        own = inspect.getsourcefile(cls)
    except TypeError:  # a class defined at run time
        own = None
    if own is None:
        mod = sys.modules.get(cls.__module__)
        own = getattr(mod, "__file__", None) if mod is not None else None
    if own is None:
        return []
    files, seen = [Path(own).resolve()], set()
    stack = [sys.modules.get(c.__module__) for c in cls.__mro__]
    while stack:
        mod = stack.pop()
        if mod is None or mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        f = _user_file(mod)
        if f is None:
            continue
        if f not in files:
            files.append(f)
        for v in list(vars(mod).values()):
            if isinstance(v, types.ModuleType):
                stack.append(v)
            elif isinstance(v, (type, types.FunctionType)) and isinstance(getattr(v, "__module__", None), str):
                stack.append(sys.modules.get(v.__module__))
    return files


def _user_file(module) -> Path | None:
    """``module``'s file where it is the user's code (``method_files``), else None."""
    f = getattr(module, "__file__", None)
    if not f or not str(f).endswith(".py"):
        return None
    p = Path(f).resolve()
    return None if any(p.is_relative_to(r) for r in _not_user_roots()) else p


def _not_user_roots() -> tuple[Path, ...]:
    """Where the standard library, the installed packages and this package live."""
    global _ROOTS
    if _ROOTS is None:
        import site
        import sysconfig

        roots = {v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
        try:
            roots.update(site.getsitepackages())
            roots.add(site.getusersitepackages())
        except AttributeError:  # a virtualenv's old site module
            pass
        _ROOTS = tuple(Path(r).resolve() for r in roots if r) + (Path(__file__).resolve().parent.parent,)
    return _ROOTS


_ROOTS: tuple[Path, ...] | None = None


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
           "method_source", "code_digest", "method_files", "register_method", "registry"]
