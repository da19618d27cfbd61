"""``sentemb`` commands of ``sentemb.report.paper`` and ``sentemb.report.figures``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

from pathlib import Path

from ..evaluate.senteval import TASKS
from ..evaluate.transfer import CLASSIFIER_DESCRIPTIONS, TRANSFER_TASKS
from ..report.tables import collect
from ..utils import atomic_path
from ..report.paper import (collect_dev, collect_geometry, load_paper_results, paper_markdown, pm_markdown, table_paper,
                            table_transfer, transfer_classifier)
from ..report.figures import figures


def _write(df, csv, md_path, md_text, header):
    with atomic_path(csv) as tmp:  # both files or neither (the Markdown inside the CSV's write)
        df.to_csv(tmp, index=False)
        if md_path:
            with atomic_path(md_path) as md:
                md.write_text(header + "\n\n" + md_text, "utf-8")
    print(md_text)


def _cmd_table_transfer(args) -> int:
    clf = transfer_classifier(args.inputs)
    t = table_transfer(collect(args.inputs, [*TRANSFER_TASKS, "MRPC_F1"]))
    metrics = [c for c in t.columns if c not in ("name", "method", "backbone", "n_seeds") and not c.endswith("_std")]
    _write(t, args.output, args.markdown, pm_markdown(t, metrics),
           f"Transfer tasks (SentEval protocol; classifier `{clf}`: {CLASSIFIER_DESCRIPTIONS[clf]}, on frozen "
           "embeddings): accuracy × 100, mean ± sample std over seeds; MRPC_F1 = F1 × 100 of the paraphrase class.")
    return 0


def _cmd_table_paper(args) -> int:
    sts = collect(args.sts, TASKS)
    tr = collect(args.transfer, [*TRANSFER_TASKS]) if args.transfer else None
    dev = collect_dev(args.train) if args.train else None
    t = table_paper(sts, tr, load_paper_results(args.published), dev, collect_geometry(args.sts))
    _write(t, args.output, args.markdown, paper_markdown(t),
           "Published vs reproduced (mean ± sample std over seeds; `diff` = reproduced − published; 95% t-interval "
           "over seeds; `p_welch_vs_simcse`: Welch t-test of the per-seed STS Avg against SimCSE on the same "
           "backbone). `table`: `sts` = test sets, `transfer` = SentEval transfer accuracy, `dev` = STS-B "
           "development Spearman (the run's best, by which it kept its checkpoint), as the papers' ablation "
           "tables report it; `geometry` = alignment / uniformity of STS-B test (pairs with gold >= 4; SARCSE "
           "Table 4, PaSeR App. D). `note`: where a paper prints two values for the row, which one is used. "
           "Empty `published` = not reported by the papers. Baseline `avg_static_last` is the pooling "
           "the papers' \"first-last avg.\" rows used (static embeddings + last layer); `avg_first_last` is "
           "SimCSE's later code (first + last Transformer layer).")
    return 0


def _cmd_figures(args) -> int:
    import pandas as pd

    paper = None
    if args.paper:
        from .. import SentembError

        need = ["table", "method", "metric", "published", "reproduced"]  # what paper_vs_reproduced reads
        try:
            paper = pd.read_csv(args.paper)
        except (OSError, ValueError) as e:  # missing, empty (EmptyDataError is a ValueError), not CSV
            raise SentembError(f"--paper {args.paper}: not a readable table_paper.csv ({type(e).__name__}: {e})") \
                from None
        missing = [c for c in need if c not in paper.columns]
        if missing:
            raise SentembError(f"--paper {args.paper}: not sentemb table-paper's CSV (no column(s) {', '.join(missing)})")
        paper = paper.astype(object).where(paper.notna(), None)
    files = figures([Path(p) for p in args.evals], [Path(p) for p in args.train], paper, args.output_dir)
    print("\n".join(str(f) for f in files))
    return 0


def register(sub) -> None:
    p = sub.add_parser("table-transfer", help="aggregate transfer JSONs into one table (CSV, optionally Markdown; "
                                              "the workflow writes results/table_transfer.csv + .md)")
    p.add_argument("--inputs", nargs="+", required=True, help="eval_transfer.json files")
    p.add_argument("--output", required=True, help="CSV")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    p.set_defaults(func=_cmd_table_transfer)
    p = sub.add_parser("table-paper", help="published vs reproduced numbers in one table (CSV, optionally Markdown; "
                                           "the workflow writes results/table_paper.csv + .md)")
    p.add_argument("--sts", nargs="+", required=True, help="eval_sts.json files (runs and baselines)")
    p.add_argument("--transfer", nargs="*", default=[], help="eval_transfer.json files")
    p.add_argument("--published", required=True, help="config/paper_results.yaml")
    p.add_argument("--train", nargs="*", default=[],
                   help="train.json files (best STS-B dev score, for the published `dev` rows)")
    p.add_argument("--output", required=True, help="CSV")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    p.set_defaults(func=_cmd_table_paper)
    p = sub.add_parser("figures", help="PNG, SVG and PDF figures from the per-run JSON files")
    p.add_argument("--evals", nargs="+", required=True, help="eval_sts.json files")
    p.add_argument("--train", nargs="*", default=[], help="train.json files (history -> dev curves)")
    p.add_argument("--paper", default=None, help="table_paper.csv")
    p.add_argument("--output-dir", required=True, help="folder the figures are written to (created)")
    p.set_defaults(func=_cmd_figures)
