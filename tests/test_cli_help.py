"""Every option of every ``sentemb`` subcommand says what it is for in ``sentemb <command> --help``."""

from __future__ import annotations

import argparse


def test_every_subcommand_option_has_help():
    from sentemb.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {' / '.join(a.option_strings) or a.dest}"
               for name, p in sub.choices.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not missing, f"{len(missing)} option(s) without help=:\n" + "\n".join(missing)
