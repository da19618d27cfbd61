"""``sentemb`` commands of ``sentemb.config.reference``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import json

from ..config.reference import config_keys_markdown


def _cmd_config_keys(args: argparse.Namespace) -> int:
    print(config_keys_markdown(), end="")
    return 0


def _cmd_config_schema(args: argparse.Namespace) -> int:
    from ..config.load import load_schema

    print(json.dumps(load_schema(), indent=2))
    return 0


def register(sub) -> None:
    p = sub.add_parser("config-keys", help="every config key with its type, default and meaning (markdown; "
                                          "config/README.md)")
    p.set_defaults(func=_cmd_config_keys)
    p = sub.add_parser("config-schema", help="the config's JSON schema, generated from sentemb.config.settings.Config "
                                            "(for editors and Snakemake's validate)")
    p.set_defaults(func=_cmd_config_schema)
