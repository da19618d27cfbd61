"""``sentemb methods``: every registered method with its arguments, defaults and inputs."""

from __future__ import annotations

import argparse
import json


def describe(name: str | None = None) -> list[dict]:
    """Machine-readable description of the registered methods (or of one)."""
    from ..args import meta_of
    from . import get_method, method_source, registry

    names = [name] if name else sorted(registry())
    out = []
    for n in names:
        cls = get_method(n)
        defaults = cls.make_args()
        import importlib

        doc = (importlib.import_module(cls.__module__).__doc__ or cls.__doc__ or "").strip()
        out.append({
            "name": n,
            "summary": doc.splitlines()[0] if doc else "",
            "source": (method_source(cls) or ("built-in",))[0],
            "eval_pooler": cls.pooler_for(defaults),
            "inputs": list(cls.requires(defaults)),
            "args": [{"name": s.name, "type": s.type, "default": s.default, "choices": list(s.choices) if s.choices else None,
                      "range": value_range(meta_of(cls.Args, s.name)), "help": s.help} for s in cls.arg_specs()],
        })
    return out


def value_range(meta: dict) -> str | None:
    """A declared range as an interval, e.g. ``[0, 180)``, ``(0, inf)``; None without bounds."""
    lo = (f"[{meta['minimum']:g}" if meta.get("minimum") is not None
          else f"({meta['exclusive_minimum']:g}" if meta.get("exclusive_minimum") is not None else None)
    hi = (f"{meta['maximum']:g}]" if meta.get("maximum") is not None
          else f"{meta['exclusive_maximum']:g})" if meta.get("exclusive_maximum") is not None else None)
    return None if lo is None and hi is None else f"{lo or '(-inf'}, {hi or 'inf)'}"


def format_methods(desc: list[dict]) -> str:
    lines = []
    for m in desc:
        lines.append(f"{m['name']}: {m['summary']}" + (f"  [{m['source']}]" if m.get("source") not in (None, "built-in") else ""))
        lines.append(f"  evaluation pooler: {m['eval_pooler']}    inputs (with default args): "
                     f"{', '.join(m['inputs']) or 'none'}")
        if not m["args"]:
            lines.append("  (no arguments)")
        w = max((len(a["name"]) for a in m["args"]), default=0)
        for a in m["args"]:
            choices = f" {{{', '.join(map(str, a['choices']))}}}" if a["choices"] else ""
            choices += f" {a['range']}" if a.get("range") else ""
            lines.append(f"  {a['name']:<{w}}  {a['type']:<8} = {json.dumps(a['default'])!s:<12}{choices}  {a['help']}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cmd_methods(args: argparse.Namespace) -> int:
    from . import load_method_modules

    if args.config:  # its method_modules (the user's methods) are imported when it is validated
        from ..config import load_config

        load_config(args.config)
    load_method_modules(args.method_module or None, "--method-module")
    desc = describe(args.name)
    print(json.dumps(desc, indent=2, default=str) if args.json else format_methods(desc), end="" if not args.json else "\n")
    return 0


def register(sub) -> None:
    p = sub.add_parser("methods", help="list the registered methods, their arguments, defaults and inputs")
    p.add_argument("name", nargs="?", default=None, help="one method (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", default=None, help="a config whose method_modules (the user's methods) to list too")
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module with @register_method classes (repeatable)")
    p.set_defaults(func=_cmd_methods)
