"""Result tables: one row per run name × backbone, mean over seeds (with std and n_seeds)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typing import TYPE_CHECKING

from . import SentembError
from .senteval import TASKS
from .utils import atomic_path

if TYPE_CHECKING:
    import pandas as pd


def collect(paths: list[str | Path]) -> pd.DataFrame:
    """One row per evaluation JSON (written by ``sentemb evaluate`` into a run directory)."""
    import pandas as pd

    rows = []
    for p in paths:
        p = Path(p)
        try:
            d = json.loads(p.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise SentembError(f"cannot read evaluation results {p}: {e}") from None
        meta = d.get("run") or {}
        missing = [k for k in ("name", "method", "backbone", "seed") if k not in meta]
        if missing:
            raise SentembError(f"{p}: evaluation results lack run metadata {missing} (pass --run-meta to evaluate)")
        rows.append({**{k: meta[k] for k in ("name", "method", "backbone", "seed")},
                     **{t: d[t] for t in TASKS if t in d}})
    if not rows:
        raise SentembError("no evaluation results given")
    return pd.DataFrame(rows)


def table1(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds of each task and of Avg; ``std`` is the sample std of Avg over seeds."""
    tasks = [t for t in TASKS if t in df.columns]
    df = df.copy()
    df["Avg"] = df[tasks].mean(axis=1)
    g = df.groupby(["name", "method", "backbone"], sort=False)
    out = g[tasks + ["Avg"]].mean()
    out["std"] = g["Avg"].std(ddof=1).fillna(0.0)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index().round(2)


def to_markdown(t: pd.DataFrame) -> str:
    cols = list(t.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        lines.append("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def _cmd_table(args: argparse.Namespace) -> int:
    t = table1(collect(args.inputs))
    with atomic_path(args.output) as tmp:
        t.to_csv(tmp, index=False)
    if args.markdown:
        with atomic_path(args.markdown) as tmp:
            tmp.write_text(
                "Spearman × 100 on STS (SentEval protocol, 'all' setting for STS12–16, test splits for "
                "STS-B and SICK-R); mean over seeds, `std` = std of Avg over seeds.\n\n" + to_markdown(t), "utf-8")
    print(to_markdown(t))
    return 0


def register(sub) -> None:
    p = sub.add_parser("table", help="aggregate evaluation JSONs into results/table1.csv (+ .md)")
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=_cmd_table)
