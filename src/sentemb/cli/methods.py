"""``sentemb methods``: every registered method with its arguments, defaults and inputs."""

from __future__ import annotations

import argparse
import json


def describe(name: str | None = None) -> list[dict]:
    """Machine-readable description of the registered methods (or of one)."""
    from ..config.fields import meta_of, value_range
    from ..methods import get_method, method_source, registry

    names = [name] if name else sorted(registry())
    out = []
    for n in names:
        cls = get_method(n)
        defaults = cls.make_args()
        import importlib

        doc = (importlib.import_module(cls.__module__).__doc__ or cls.__doc__ or "").strip()
        out.append({
            "name": n,
            "summary": _first_paragraph(doc),
            "source": (method_source(cls) or ("built-in",))[0],
            "eval_pooler": cls.pooler_for(defaults),
            "inputs": list(cls.requires(defaults)),
            "args": [{"name": s.name, "type": s.type, "default": s.default, "choices": list(s.choices) if s.choices else None,
                      "range": value_range(meta_of(cls.Args, s.name)), "help": s.help} for s in cls.arg_specs()],
        })
    return out


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


def _first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line (a summary wrapped over lines is not cut at the first)."""
    return " ".join(doc.split("\n\n", 1)[0].split()) if doc else ""


def _cmd_methods(args: argparse.Namespace) -> int:
    from ..methods import load_method_modules

    if args.config:  # its method_modules (the user's methods) are imported when it is validated
        from ..config.load import load_config

        load_config(args.config)
    load_method_modules(args.method_module or None, "--method-module")
    desc = describe(args.name)
    print(json.dumps(desc, indent=2, default=str) if args.json else format_methods(desc), end="" if not args.json else "\n")
    return 0


def register(sub) -> None:
    register_check(sub)
    p = sub.add_parser("methods", help="list the registered methods, their arguments, defaults and inputs")
    p.add_argument("name", nargs="?", default=None, help="one method (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", default=None, help="a config whose method_modules (the user's methods) to list too")
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module with @register_method classes (repeatable)")
    p.set_defaults(func=_cmd_methods)


def _cmd_check_method(args: argparse.Namespace) -> int:
    """``sentemb check-method NAME``: the method contract (``sentemb.testing``) on a tiny random
    encoder, one line per check; exit 1 naming the failed checks."""
    import shutil
    import tempfile
    from pathlib import Path

    from .. import SentembError
    from .. import testing
    from ..methods import get_method, load_method_modules, method_source

    if args.list:
        for name, fn in testing.CHECKS.items():  # the docstring's first paragraph, whole sentences
            print(f"{name:<14} {' '.join((fn.__doc__ or '').strip().split(chr(10) + chr(10))[0].split())}")
        return 0
    if not args.name:
        raise SentembError("check-method: name a method (sentemb methods lists them)")
    if args.config:  # its method_modules (the user's methods) are imported when it is validated
        from ..config.load import load_config

        load_config(args.config)
    load_method_modules(args.method_module or None, "--method-module")
    cls = get_method(args.name)
    if not args.verbose:  # one line per check: transformers' load reports and progress bars off
        import logging

        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        for logger in ("sentemb", "sentence_transformers"):
            logging.getLogger(logger).setLevel(logging.WARNING)
    for flag, c in [*(("--check", c) for c in args.check or []), *(("--skip", c) for c in args.skip or [])]:
        if c not in testing.CHECKS:  # before the header line: a typo prints only the error
            raise SentembError(f"{flag} {c}: unknown check (known: {', '.join(testing.CHECKS)})")
    chosen = [c for c in (args.check or testing.CHECKS) if c not in (args.skip or [])]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix=f"sentemb-check-{cls.name}-"))
    origin = cls.__module__ if cls.__module__.startswith("sentemb.methods.") else (method_source(cls) or ("?",))[0]
    print(f"sentemb check-method {cls.name} ({cls.__module__}.{cls.__qualname__}, from {origin}): "
          f"{len(chosen)} check{'s' if len(chosen) != 1 else ''} on a tiny random BERT (2 layers, hidden 32), contract args {json.dumps(cls.contract_args)}",
          flush=True)
    try:
        results = testing.check_method(cls, work, chosen, report=lambda line: print(line, flush=True))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r.check for r in results if r.status == "FAIL"]
    skipped = [r.check for r in results if r.status == "SKIP"]
    passed = len(results) - len(failed) - len(skipped)
    print(f"{cls.name}: {passed} passed, {len(failed)} failed, {len(skipped)} skipped"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def register_check(sub) -> None:
    p = sub.add_parser("check-method", help="run the method contract (sentemb.testing) on a tiny random encoder")
    p.add_argument("name", nargs="?", default=None, help="a registered method (built-in, or from --config / --method-module)")
    p.add_argument("--config", default=None, help="a config whose method_modules (the user's methods) to import")
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module with @register_method classes (repeatable)")
    p.add_argument("--check", action="append", default=None, metavar="CHECK",
                   help="run only this check (repeatable; --list names them)")
    p.add_argument("--skip", action="append", default=None, metavar="CHECK", help="leave this check out (repeatable)")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    p.add_argument("--verbose", action="store_true", help="keep the loop's and transformers' log lines")
    p.set_defaults(func=_cmd_check_method)
