"""``sentemb`` commands of ``sentemb.report.studies``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from .. import SentembError
from ..report.studies import load_published, read_values, study_figure, study_markdown, study_table
from ..utils import atomic_path

log = logging.getLogger(__name__)


def _cmd_study(args: argparse.Namespace) -> int:
    try:
        spec = json.loads(Path(args.spec).read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise SentembError(f"cannot read study spec {args.spec}: {e}") from None
    missing = [k for k in ("name", "metric", "expanded", "seeds") if k not in spec] if isinstance(spec, dict) else None
    if missing is None or missing or not isinstance(spec["expanded"], list) or not spec["expanded"]:
        raise SentembError(f"study spec {args.spec}: expected the object rule study_spec writes (name, metric, "
                           f"expanded points, seeds){f'; missing {missing}' if missing else ''}")
    published = load_published(args.published).get(spec["name"])
    seen: set = set()
    values = read_values(args.inputs, spec["metric"], seen)
    runs = ([spec["expanded"][0]["run"], spec["reference"]] if spec.get("reference")
            else [p["run"] for p in spec["expanded"]])
    pairs = [(r, s) for r in runs for s in spec["seeds"]]
    missing = [f"{r} seed {s}" for r, s in pairs if (r, s) not in seen]
    if missing:  # a point's results not given (a path mistyped, a run not finished): no table of blanks
        raise SentembError(f"study '{spec['name']}': no results for {len(missing)} of its {len(pairs)} (point, seed) "
                           f"pairs among the {len(args.inputs)} --inputs: {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''} (pass every point's results; the workflow's rule "
                           "study does)")
    empty = [f"{r} seed {s}" for r, s in pairs if (r, s) not in values]
    if empty:  # given, but without the metric: the row says so by its blanks and n_seeds
        log.warning("study '%s': %d result file(s) have no %s (left out of the means): %s", spec["name"], len(empty),
                    spec["metric"], ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else ""))
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
    p.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    p.add_argument("--figure", default=None, help="figure path (.png); .svg and .pdf are written beside it")
    p.add_argument("--train", nargs="*", default=[], help="the points' train.json files: their STS-B dev curves "
                                                         "beside the figure's main panel")
    p.set_defaults(func=_cmd_study)
