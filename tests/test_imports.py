"""The modules of sentemb import each other without a cycle (issue 19 §3).

Every import counts: module level, inside a function and under ``TYPE_CHECKING``. An import moved
into a function to dodge a cycle at import time still ties the two modules together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sentemb

PACKAGE = Path(sentemb.__file__).parent


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("sentemb", *path.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the sentemb modules it imports anywhere in its source."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: `from ..stats import x` in sentemb.methods.una
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)  # `from . import rake`: a module
        graph[name] = {t for t in targets if t in mods and t != name}
    # the imports made by name at run time count too: the method registry imports every built-in
    # method module of its package, the CLI every command module it lists
    from sentemb.methods import _NOT_METHODS

    graph["sentemb.methods"] |= {m for m in mods if m.rpartition(".")[0] == "sentemb.methods"
                                 and m.rpartition(".")[2] not in _NOT_METHODS}
    cli = "sentemb.cli" if "sentemb.cli" in mods else None
    if cli:
        for node in ast.walk(ast.parse(mods[cli].read_text("utf-8"))):
            if isinstance(node, ast.Constant) and node.value in mods and node.value != cli:
                graph[cli].add(node.value)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        path.append(m)
        for n in sorted(graph[m]):
            if n in path:
                return path[path.index(n):] + [n]
            if n not in done and (cycle := visit(n)):
                return cycle
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        if m not in done and (cycle := visit(m)):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import():
    g = import_graph()
    assert "sentemb.model.encoder" in g["sentemb.methods.base"]  # module level, relative
    assert "sentemb.methods" in g["sentemb.config.load"]  # inside a function
    assert "sentemb.stats.tfidf" in g["sentemb.methods.una"]  # two levels up, a submodule
    assert "sentemb.stats.rake" in g["sentemb.cli.stats"]  # `from ..stats.rake import ...` inside a function
    assert "sentemb.methods.arccse" in g["sentemb.methods"]  # the registry's import by name
    assert "sentemb.cli.train" in g["sentemb.cli"]  # a command module the CLI imports by name
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_sentemb():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cli_is_one_package_and_validation_sits_above_the_methods():
    """Issue 28 §3/§1: argparse lives in ``sentemb.cli`` only; no method module (nor the registry)
    imports the configuration, the studies or the CLI, which import them."""
    g = import_graph()
    with_argparse = [name for name, path in modules().items() if not name.startswith("sentemb.cli")
                     and "argparse" in {n.id for n in ast.walk(ast.parse(path.read_text("utf-8")))
                                        if isinstance(n, ast.Name)} | _imported(path)]
    assert not with_argparse, with_argparse
    methods = [m for m in g if m == "sentemb.methods" or m.startswith("sentemb.methods.")]
    reach = set()
    todo = [m for m in methods if m != "sentemb.methods"]
    while todo:  # everything a method module imports, transitively
        m = todo.pop()
        for n in g[m] - reach:
            reach.add(n)
            todo.append(n)
    assert not reach & {"sentemb.config.load", "sentemb.config.studies"} and not any(m.startswith("sentemb.cli") for m in reach), \
        sorted(reach & {"sentemb.config.load", "sentemb.config.studies"})
    assert {"sentemb.methods", "sentemb.config.studies"} <= g["sentemb.config.load"]


def _imported(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and not n.level:
            out.add((n.module or "").split(".")[0])
    return out


def test_the_package_is_grouped_by_stage_and_keeps_its_public_imports():
    """Issue 28 §4: no module sits flat beside the stage packages except the package's own entry
    points and the two modules users import by name; the public imports still work."""
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__", "__main__", "testing", "utils"], flat
    stages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert stages == ["cli", "config", "data", "evaluate", "methods", "model", "ops", "report", "stats", "tracking",
                      "train"], stages
    from sentemb.config import Config, baselines, jobs, load_config, tested, transfer_runs
    from sentemb.methods import Method, arg, register_method

    assert all(callable(f) for f in (Config, baselines, jobs, load_config, tested, transfer_runs, Method, arg,
                                     register_method))
    import sentemb.config

    # the package `sentemb.config` loads its validation only when a public name is used, so a method
    # module importing `sentemb.config.fields` does not import every method back
    code = ("import sys, sentemb.config.fields; "
            "assert 'sentemb.config.load' not in sys.modules and 'sentemb.methods.simcse' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert sentemb.config.jobs is jobs
