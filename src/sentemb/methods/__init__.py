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
    other (so a one-file plug-in's digest is its file's sha256), else of that file's digest and, for
    each other file, its path relative to the user's folder it lies in and its digest, in that order.
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
    """The files of the user's code that define ``cls``: its own file first, then each file of the
    user's code it imports, found in the files themselves (every ``import`` statement, in functions
    too, and the packages an import runs) and in the loaded modules' globals (modules, classes and
    functions bound there, such as a module loaded from a path), and from those files in turn. The
    user's code is a Python file in the folder of the method's top-level package (a one-file plug-in:
    its folder) or in the working directory, outside the standard library, the installed packages
    (any ``site-packages`` or ``dist-packages`` folder) and sentemb. What it leaves out: a name bound
    by value (``from helpers import RATE``: its module is followed where it is imported), a module
    imported by a computed name."""
    return [f for _, f in _code_of(cls)]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _code_of(cls: type) -> list[tuple[str, Path]]:
    """(key, file) of ``method_files``: the own file first (key ""), the others keyed by their path
    relative to the user's folder they lie in (the same on every machine with the same layout)."""
    import os

    try:
        own = inspect.getsourcefile(cls)
    except TypeError:  # a class defined at run time
        own = None
    if not own or not os.path.isabs(own) or not os.path.isfile(own):
        return []
    own_path = Path(own).resolve()
    if own_path.is_relative_to(_not_user_roots()[-1]):  # a built-in method: sentemb's digest covers the rest
        return [("", own_path)]
    top = cls.__module__.split(".")[0]
    folder = own_path.parent
    if top != "sentemb_user_methods":  # a module name: the folder above its top-level package
        for _ in range(cls.__module__.count(".")):
            folder = folder.parent
    roots = [folder, Path.cwd().resolve()]
    out: list[tuple[str, Path]] = [("", own_path)]
    seen = {own_path}
    queue = [(cls.__module__, own_path)] + [(c.__module__, None) for c in cls.__mro__[1:]]
    while queue:
        name, path = queue.pop(0)
        if path is None:
            path = _user_file(_module_file(name), roots)
            if path is None or path in seen:
                continue
            seen.add(path)
            out.append((_key(path, roots), path))
        for dep in _imports_of(name, path) + _bound_in(name):
            f = _user_file(_module_file(dep), roots)
            if f is not None and f not in seen:
                seen.add(f)
                out.append((_key(f, roots), f))
                queue.append((dep, f))
    return out


def _key(path: Path, roots: list[Path]) -> str:
    for r in roots:
        if path.is_relative_to(r):
            return str(path.relative_to(r))
    return str(path)


def _imports_of(module: str, path: Path) -> list[str]:
    """The modules the file ``path`` (module ``module``) imports, anywhere in it, with the packages
    each import runs ("a.b.c": a, a.b, a.b.c; ``from a import b``: a and a.b, which may be a module)."""
    import ast

    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    mod = sys.modules.get(module)
    package = getattr(mod, "__package__", None) or module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                names.append(base)
                names += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    out = []
    for n in names:
        parts = n.split(".")
        out += [".".join(parts[: i + 1]) for i in range(len(parts))]
    return list(dict.fromkeys(out))


def _bound_in(module: str) -> list[str]:
    """The modules whose modules, classes or functions the loaded ``module`` binds in its globals (a
    module loaded from a path, as the PromptBERT example loads its sentence-transformers module), but
    not its own submodules, which the import system binds in a package as they are imported."""
    import types

    mod = sys.modules.get(module)
    if mod is None:
        return []
    out = []
    for v in list(vars(mod).values()):
        try:
            t = type(v)
            if issubclass(t, types.ModuleType):
                name = v.__name__
                if isinstance(name, str) and not name.startswith(module + "."):
                    out.append(name)
            elif issubclass(t, (type, types.FunctionType)):
                name = v.__module__
                if isinstance(name, str):
                    out.append(name)
        except Exception:  # noqa: BLE001 - an odd object (a proxy) is no code of ours to follow
            continue
    return out


def _module_file(name: str) -> str | None:
    """The file of module ``name``: the loaded module's, else where the import system would find it
    (``find_spec``, which imports its parent packages); None for a module without one, an installed
    or built-in top-level package, or a name that is no module (``from a import some_function``)."""
    import importlib.util
    import os

    mod = sys.modules.get(name)
    if mod is not None:
        f = getattr(mod, "__file__", None)
        return f if isinstance(f, str) else None
    head = name.split(".")[0]
    if head != name:  # inside an installed or built-in package: not the user's code, and not imported to see
        top = sys.modules.get(head)
        if top is not None:
            tf = getattr(top, "__file__", None)
        else:
            try:
                spec = importlib.util.find_spec(head)  # a top-level name: found without importing anything
            except Exception:  # noqa: BLE001
                return None
            tf = spec.origin if spec is not None and spec.has_location else None
        if not isinstance(tf, str) or not os.path.isabs(tf) or _installed(Path(tf).resolve()):
            return None
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # noqa: BLE001 - not a module (a function imported by name), or one that fails to import
        return None
    return spec.origin if spec is not None and spec.has_location and isinstance(spec.origin, str) else None


def _user_file(f: str | None, roots: list[Path]) -> Path | None:
    """``f`` resolved, where it is a Python file of the user's code (``method_files``), else None."""
    import os

    if not f or not f.endswith(".py") or not os.path.isabs(f) or not os.path.isfile(f):
        return None
    p = Path(f).resolve()
    if _installed(p) or not any(p.is_relative_to(r) for r in roots):
        return None
    return p


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
