"""Result tables: one row per run name × backbone, mean over seeds (with std and n_seeds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from .. import SentembError
from ..evaluate.senteval import TASKS
from ..utils import read_json

if TYPE_CHECKING:
    import pandas as pd


#: the run metadata every result file carries (``sentemb evaluate --run-meta``)
META = ("name", "method", "backbone", "seed")


def ci95(values) -> tuple[float, float] | tuple[None, None]:
    """Two-sided 95 % t-interval of the mean over seeds (None with fewer than two seeds)."""
    import numpy as np
    from scipy import stats

    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return None, None
    half = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean() - half), float(v.mean() + half)


def welch_p(a, b) -> float | None:
    """Two-sided Welch t-test p-value (None unless both samples have ≥ 2 seeds)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    p = stats.ttest_ind(list(a), list(b), equal_var=False).pvalue
    return None if p != p else float(p)  # NaN (zero variance on both sides) -> empty

def collect(paths: Iterable[str | Path], metrics: Sequence[str] = TASKS) -> pd.DataFrame:
    """One row per result JSON (``eval_sts.json``, ``eval_transfer.json``): run metadata (name,
    method, backbone, seed, pooler) and ``metrics`` (None where the file has none)."""
    import pandas as pd

    rows, seen = [], {}
    for p in paths:
        d = read_json(p)
        if not isinstance(d, dict):
            raise SentembError(f"{p}: expected a JSON object of results, found {type(d).__name__}")
        meta = d.get("run") or {}
        missing = [k for k in META if k not in meta]
        if missing:
            raise SentembError(f"{p}: results lack run metadata {missing} (pass --run-meta to evaluate)")
        seed = meta["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SentembError(f"{p}: run metadata seed {seed!r} is not an integer")
        scores = {m: d.get(m) for m in metrics}
        bad = {m: v for m, v in scores.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))}
        if bad:
            raise SentembError(f"{p}: scores that are not numbers: {bad}")
        if all(v is None for v in scores.values()):
            raise SentembError(f"{p}: holds none of the scores {', '.join(metrics)}")
        key = (*(meta[k] for k in ("name", "backbone")), seed, d.get("pooler"))
        if key in seen:  # a seed counted twice would shift the mean and report a spread never measured
            raise SentembError(f"{p} and {seen[key]}: the same run (name {key[0]!r}, backbone {key[1]!r}, seed "
                               f"{seed}, pooler {key[3]!r}) given twice")
        seen[key] = p
        rows.append({**{k: meta[k] for k in META}, "pooler": d.get("pooler"), **scores})
    if not rows:
        raise SentembError("no results given")
    df = pd.DataFrame(rows)
    df["seed"] = df["seed"].astype(int)
    return df


def table1(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds of each task and of Avg; ``std`` is the sample std of Avg over seeds (empty with
    one seed: no spread was measured, which 0.00 would claim)."""
    tasks = [t for t in TASKS if t in df.columns and df[t].notna().any()]
    df = df.copy()
    df["Avg"] = df[tasks].mean(axis=1)
    g = df.groupby(["name", "method", "backbone"], sort=False)
    out = g[tasks + ["Avg"]].mean()
    out["std"] = g["Avg"].std(ddof=1)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index().round(2)


def to_markdown(t: pd.DataFrame) -> str:
    cols = list(t.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        lines.append("| " + " | ".join(("" if v != v else f"{v:.2f}") if isinstance(v, float) else str(v) for v in r)
                     + " |")
    return "\n".join(lines) + "\n"
