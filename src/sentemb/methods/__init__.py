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
    The digest goes into the run's settings, so editing the method's file (or another file of its
    package, ``method_files``) reruns that method's jobs and nothing else. None for a built-in method."""
    mod = sys.modules.get(cls.__module__)
    if cls.__module__.startswith(__name__ + ".") or mod is None:
        return None
    return _SPEC.get(cls.__module__, cls.__module__), code_digest(cls)


def code_digest(cls: type) -> str:
    """The sha256 of the code that defines ``cls``: of its file alone where ``method_files`` lists no
    other (so a one-file plug-in's digest is its file's sha256), else of that file's digest and, for
    each other file, its path relative to its folder (``method_files``) and its digest, in path order.
    "" where ``cls`` has no source file; a file that cannot be read counts as "missing"."""
    files = _code_of(cls)
    if not files:
        return ""
    first = _file_digest(files[0][1])
    if len(files) == 1:
        return first
    h = hashlib.sha256(first.encode())
    for key, f in sorted(files[1:]):
        h.update(f"\0{key}\0{_file_digest(f)}".encode())
    return h.hexdigest()


def method_files(cls: type) -> list[Path]:
    """The files of the user's code whose digest stands for ``cls`` (``code_digest``), its own file
    first; a rule that never misses a file of the method's package and never depends on what else
    was imported:

    * a method in a package (``method_modules: [mymethods.method]``): every Python file of its
      top-level package (``mymethods/**/*.py``), whether the method imports it or not;
    * a one-file plug-in (a file, or a top-level module): the file, and the modules next to it (in its
      folder or below) that it binds in its globals: a module, or a class or function of one, such as
      the module the PromptBERT example loads from a path;
    * a built-in method, or one in an installed package (``site-packages``, ``dist-packages``): its
      own file.

    So editing another module of a method's package reruns its jobs too, and a helper outside the
    package (or the folder of a one-file plug-in) is not followed."""
    return [f for _, f in _code_of(cls)]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _code_of(cls: type) -> list[tuple[str, Path]]:
    """(key, file) of ``method_files``: the own file first (key ""), the others keyed by their path
    relative to the package's folder, or the one-file plug-in's (the same on every machine)."""
    import os

    try:
        own = inspect.getsourcefile(cls)
    except TypeError:  # a class defined at run time
        own = None
    if not own or not os.path.isabs(own) or not os.path.isfile(own):
        return []
    own_path = Path(own).resolve()
    if _installed(own_path):  # a built-in method (sentemb's digest covers the rest), or an installed one
        return [("", own_path)]
    out = [("", own_path)]
    top = sys.modules.get(cls.__module__.split(".")[0])
    where = getattr(top, "__path__", None) if top is not None else None
    if where is not None and not cls.__module__.startswith("sentemb_user_methods."):  # a package's method
        for folder in sorted({Path(w).resolve() for w in where if isinstance(w, str) and os.path.isabs(w)}):
            if _installed(folder):
                continue
            for f in sorted(folder.rglob("*.py")):
                if f.resolve() != own_path and "__pycache__" not in f.parts:
                    out.append((f"{folder.name}/{f.relative_to(folder)}", f.resolve()))
        return out
    folder = own_path.parent  # a one-file plug-in: what it binds from its folder
    for f in _bound_files(sys.modules.get(cls.__module__)):
        if f != own_path and f.is_relative_to(folder) and not _installed(f) and (str(f.relative_to(folder)), f) not in out:
            out.append((str(f.relative_to(folder)), f))
    return out


def _bound_files(module) -> list[Path]:
    """The files of the modules whose modules, classes or functions ``module`` binds in its globals."""
    import os
    import types

    if module is None:
        return []
    names = set()
    for v in list(vars(module).values()):
        try:
            t = type(v)
            if issubclass(t, types.ModuleType):
                names.add(v.__name__)
            elif issubclass(t, (type, types.FunctionType)):
                names.add(v.__module__)
        except Exception:  # noqa: BLE001 - an odd object (a proxy) is no code to follow
            continue
    out = []
    for n in sorted(n for n in names if isinstance(n, str)):
        f = getattr(sys.modules.get(n), "__file__", None)
        if isinstance(f, str) and f.endswith(".py") and os.path.isabs(f) and os.path.isfile(f):
            out.append(Path(f).resolve())
    return out


def _installed(p: Path) -> bool:
    """Whether ``p`` lies in the standard library, an installed package or sentemb."""
    return ("site-packages" in p.parts or "dist-packages" in p.parts
            or any(p.is_relative_to(r) for r in _not_user_roots()))


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
