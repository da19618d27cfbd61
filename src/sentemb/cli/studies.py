"""``sentemb`` commands of ``sentemb.report.studies``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import SentembError
from ..report.studies import load_published, read_values, study_figure, study_markdown, study_table
from ..utils import atomic_path


def _cmd_study(args: argparse.Namespace) -> int:
    try:
        spec = json.loads(Path(args.spec).read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SentembError(f"cannot read study spec {args.spec}: {e}") from None
    published = load_published(args.published).get(spec["name"])
    values = read_values(args.inputs, spec["metric"])
    table = study_table(spec, values, published)
    with atomic_path(args.output) as tmp:
        table.to_csv(tmp, index=False)
    md = study_markdown(spec, table, (published or {}).get("source"))
    if args.markdown:
        with atomic_path(args.markdown) as tmp:
            tmp.write_text(md, "utf-8")
    if args.figure:
        from ..report.figures import dev_histories

        study_figure(spec, values, published, args.figure, dev_histories(args.train) if args.train else None)
    print(md)
    return 0


def register(sub) -> None:
    p = sub.add_parser("study", help="a study's table (results/studies/<name>.csv + .md) and figure")
    p.add_argument("--spec", required=True, help="the expanded study (JSON, rule study_spec)")
    p.add_argument("--inputs", nargs="+", required=True, help="the points' eval_sts.json / train.json / "
                                                              "eval_transfer.json files")
    p.add_argument("--published", default=None, help="config/paper_results.yaml (its `studies` section)")
    p.add_argument("--output", required=True, help="CSV")
    p.add_argument("--markdown", default=None)
    p.add_argument("--figure", default=None, help="figure path (.png); .svg and .pdf are written beside it")
    p.add_argument("--train", nargs="*", default=[], help="the points' train.json files: their STS-B dev curves "
                                                         "beside the figure's main panel")
    p.set_defaults(func=_cmd_study)
