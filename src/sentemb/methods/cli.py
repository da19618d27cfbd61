"""``sentemb methods``: every registered method with its arguments, defaults and inputs."""

from __future__ import annotations

import argparse
import json


def describe(name: str | None = None) -> list[dict]:
    """Machine-readable description of the registered methods (or of one)."""
    from . import get_method, registry

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
            "eval_pooler": cls.pooler_for(defaults),
            "inputs": list(cls.requires(defaults)),
            "args": [{"name": s.name, "type": s.type, "default": s.default, "choices": list(s.choices) if s.choices else None,
                      "help": s.help} for s in cls.arg_specs()],
        })
    return out


def format_methods(desc: list[dict]) -> str:
    lines = []
    for m in desc:
        lines.append(f"{m['name']}: {m['summary']}")
        lines.append(f"  evaluation pooler: {m['eval_pooler']}    inputs (with default args): "
                     f"{', '.join(m['inputs']) or 'none'}")
        if not m["args"]:
            lines.append("  (no arguments)")
        w = max((len(a["name"]) for a in m["args"]), default=0)
        for a in m["args"]:
            choices = f" {{{', '.join(map(str, a['choices']))}}}" if a["choices"] else ""
            lines.append(f"  {a['name']:<{w}}  {a['type']:<8} = {json.dumps(a['default'])!s:<12}{choices}  {a['help']}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cmd_methods(args: argparse.Namespace) -> int:
    desc = describe(args.name)
    print(json.dumps(desc, indent=2, default=str) if args.json else format_methods(desc), end="" if not args.json else "\n")
    return 0


def register(sub) -> None:
    p = sub.add_parser("methods", help="list the registered methods, their arguments, defaults and inputs")
    p.add_argument("name", nargs="?", default=None, help="one method (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_methods)
