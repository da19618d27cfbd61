"""``sentemb`` commands of ``sentemb.report.model_card``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse

from ..report.model_card import write_run_card


def _cmd_model_card(args: argparse.Namespace) -> int:
    rec = write_run_card(args.run_dir, paper_results=args.paper_results, datasets=args.dataset, sts=args.sts,
                         transfer=args.transfer, marker=args.output)
    held = [k for k, v in rec["results"].items() if v]
    print(f"{rec['card']}: " + (f"results of {', '.join(held)}" if held else "no results (not evaluated yet)")
          + (f"; published rows: {', '.join(rec['published'])}" if rec["published"] else ""))
    return 0


def register(sub) -> None:
    p = sub.add_parser("model-card", help="write a run's model card (model/README.md) with its evaluation results")
    p.add_argument("--run-dir", required=True, help="results/runs/<name>/<backbone>/seed<N>")
    p.add_argument("--paper-results", default=None, help="config/paper_results.yaml (the published numbers)")
    p.add_argument("--dataset", action="append", default=[], metavar="HUB_ID",
                   help="Hub id of the training corpus (front matter `datasets`; repeatable)")
    p.add_argument("--sts", default=None, help="STS results (default: eval_sts.json of the run dir, if present)")
    p.add_argument("--transfer", default=None,
                   help="transfer results (default: eval_transfer.json of the run dir, if present)")
    p.add_argument("--output", default=None, help="a JSON record of what was written (the rule's output)")
    p.set_defaults(func=_cmd_model_card)
