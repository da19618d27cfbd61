"""``sentemb`` commands of ``sentemb.stats.inputs``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

from pathlib import Path

from .. import SentembError
from ..stats.inputs import build_input, get_input


def _cmd_make_input(args) -> int:
    """``sentemb make-input KIND``: a plug-in input kind built into ``--output`` (a folder, written
    under a temporary name and renamed when complete), as rule ``make_input`` runs it."""
    from ..methods import load_method_modules
    from ..utils import atomic_path

    load_method_modules(args.method_module or None, "--method-module")
    kind = get_input(args.kind, "make-input")
    if kind.build is None:
        raise SentembError(f"make-input {args.kind}: made by a stage ({kind.rule}), not from a corpus")
    for what, p in (("--corpus", args.corpus), ("--model", args.model)):
        if not Path(p).exists():
            raise SentembError(f"make-input {args.kind}: {what} {p} does not exist")
    from ..data.corpus import require_text

    require_text(args.corpus)  # an empty corpus would give an empty input that looks finished
    with atomic_path(args.output, is_dir=True) as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        build_input(args.kind, tmp, args.corpus, args.model)
    print(f"input {args.kind} -> {args.output}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("make-input", help="build an input kind of a plug-in method (sentemb.stats.inputs) from a corpus")
    p.add_argument("kind", help="the input kind to build (a built-in kind or one a --method-module file registers)")
    p.add_argument("--corpus", required=True, help="corpus, one sentence per line")
    p.add_argument("--model", required=True, help="the backbone's directory (its tokenizer)")
    p.add_argument("--output", required=True, help="the folder to write")
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module that registers the kind (the config's method_modules; repeatable)")
    p.set_defaults(func=_cmd_make_input)
