"""``sentemb`` commands of ``sentemb.report.tables``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse

from ..report.tables import collect, table1, to_markdown
from ..utils import atomic_path


def _cmd_table(args: argparse.Namespace) -> int:
    t = table1(collect(args.inputs))
    # both files or neither: the Markdown is written inside the CSV's write, so a failure of either
    # leaves no output that Snakemake would take for a finished one
    with atomic_path(args.output) as tmp:
        t.to_csv(tmp, index=False)
        if args.markdown:
            with atomic_path(args.markdown) as md:
                md.write_text(
                    "Spearman × 100 on STS (SentEval protocol, 'all' setting for STS12–16, test splits for "
                    "STS-B and SICK-R); mean over seeds, `std` = std of Avg over seeds (empty with one seed).\n\n"
                    + to_markdown(t), "utf-8")
    print(to_markdown(t))
    return 0


def register(sub) -> None:
    p = sub.add_parser("table", help="aggregate STS evaluation JSONs into one table (CSV, optionally Markdown; the "
                                     "workflow writes results/table1.csv + .md)")
    p.add_argument("--inputs", nargs="+", required=True, help="eval_sts.json files (runs and baselines)")
    p.add_argument("--output", required=True, help="CSV")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    p.set_defaults(func=_cmd_table)
