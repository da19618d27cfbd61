"""The report's tables (issue 12 §3–4): the transfer table and the paper-vs-reproduced table.

Everything here reads the per-run JSON files (``eval_sts.json``, ``eval_transfer.json``,
``train.json``) and ``config/paper_results.yaml``; nothing is recomputed from models. The figures are
:mod:`sentemb.report.figures`.

* ``table_transfer``: accuracy × 100 per transfer task, mean ± sample std over seeds.
* ``table_paper``: per run × backbone (and baseline pooler) and metric, the published value, the
  reproduced mean ± std over seeds, their difference, the seeds' 95 % t-interval (n ≥ 2) and whether
  the published value lies inside it; on each STS ``Avg`` row a Welch t-test (two-sided,
  ``scipy.stats.ttest_ind(equal_var=False)``) of the per-seed Avg against the SimCSE row on the same
  backbone (UNA's ten-seed comparison). A metric the papers do not report stays empty, never 0.
  Four tables are compared, each with its own metric: ``sts`` (test sets, ``eval_sts.json``),
  ``transfer`` (``eval_transfer.json``), ``dev`` (STS-B **development** Spearman, which the
  papers' ablation and sensitivity tables report: compared with the run's best dev score,
  ``best_dev_stsb`` of ``train.json``, never with a test score) and ``geometry`` (alignment and
  uniformity of STS-B test, the ``geometry`` of ``eval_sts.json``; SARCSE Table 4, PaSeR App. D).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .. import SentembError
from ..evaluate.senteval import TASKS
from ..evaluate.transfer import CLASSIFIER_DESCRIPTIONS, TRANSFER_TASKS
from ..utils import read_json
from .style import BASELINE
from .tables import META, ci95, welch_p

if TYPE_CHECKING:
    import pandas as pd

SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


def mean_std_table(df: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Mean over seeds per (name, method, backbone); ``<metric>_std`` the sample std (NaN for one seed:
    no spread was measured)."""
    import pandas as pd

    g = df.groupby(["name", "method", "backbone"], sort=False)
    mean = g[metrics].mean()
    std = g[metrics].std(ddof=1).add_suffix("_std")
    out = pd.concat([mean, std], axis=1)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index().round(2)


def transfer_classifier(paths: Iterable[str | Path]) -> str:
    """The classifier every transfer JSON was computed with (``protocol.classifier``: ``pytorch`` or
    ``sklearn``; files written before the switch say ``sklearn LogisticRegression``). Seeds of
    different classifiers must not be averaged into one cell, so a mix is an error naming the files."""
    seen: dict[str, list[str]] = {}
    for p in paths:
        d = read_json(p)
        if not isinstance(d, dict):
            raise SentembError(f"{p}: expected a JSON object of results, found {type(d).__name__}")
        c = (d.get("protocol") or {}).get("classifier", "")
        c = "sklearn" if c == "sklearn LogisticRegression" else c
        if c not in CLASSIFIER_DESCRIPTIONS:
            raise SentembError(f"{p}: protocol.classifier is {c!r}, not one of {sorted(CLASSIFIER_DESCRIPTIONS)}")
        seen.setdefault(c, []).append(str(p))
    if len(seen) > 1:
        raise SentembError("transfer results computed with different classifiers (evaluation.transfer_classifier) "
                           "cannot share a table: " + "; ".join(f"{c}: {', '.join(v)}" for c, v in seen.items()))
    if not seen:
        raise SentembError("no results given")
    return next(iter(seen))


def table_transfer(df: pd.DataFrame) -> pd.DataFrame:
    tasks = [t for t in TRANSFER_TASKS if t in df.columns and df[t].notna().any()]
    df = df.copy()
    df["Avg"] = df[tasks].mean(axis=1)
    extra = ["MRPC_F1"] if "MRPC_F1" in df.columns and df["MRPC_F1"].notna().any() else []
    return mean_std_table(df, tasks + extra + ["Avg"])


def pm_markdown(t: pd.DataFrame, metrics: list[str]) -> str:
    """Markdown with 'mean ± std' cells ('mean' alone for one seed)."""
    cols = ["name", "method", "backbone", *metrics, "n_seeds"]
    lines = ["| " + " | ".join(SHORT.get(c, c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        cells = [str(r["name"]), str(r["method"]), str(r["backbone"])]
        cells += [f"{r[m]:.2f}" + (f" ± {r[m + '_std']:.2f}" if r[m + "_std"] == r[m + "_std"] else "")
                  for m in metrics]
        cells.append(str(int(r["n_seeds"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- paper vs reproduced
#: the metrics each published table may hold
PAPER_TABLES = {"sts": [*TASKS, "Avg"], "transfer": [*TRANSFER_TASKS, "Avg"], "dev": ["STSBenchmark"],
                "geometry": ["align", "uniform"]}
#: tables compared only on the runs a paper reports them for (their metrics come from other files)
_REPORTED_ONLY = ("dev", "geometry")


def load_paper_results(path: str | Path) -> list[dict]:
    """``config/paper_results.yaml``: a list ``results`` of {method, backbone, [pooler], [name], [also],
    [method_args], [train], table: sts|transfer|dev|geometry, source, [note], scores: {metric: value}};
    errors name the entry and key. ``note`` (kept, shown in table_paper's ``note`` column) records where
    the papers print two values for one model and which one ``scores`` holds.

    An entry applies to the run ``name`` (default: the method's name) on ``backbone``, and to the runs
    listed in ``also`` (runs that reproduce the same published row another way, e.g. an open choice
    taken the authors' code's way); baselines match by backbone and pooler. ``method_args`` and
    ``train`` state the settings that define the published row (beyond the method's paper defaults):
    ``sentemb.report.paper_tables.check_against_config`` verifies that every run the entry names has them, so a number cannot be
    attached to a run that does not reproduce it."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SentembError(f"cannot read published results {path}: {e}") from None
    entries = doc.get("results")
    if not isinstance(entries, list):
        raise SentembError(f"{path}: expected a list under 'results'")
    return check_paper_entries(entries, f"{path}: results")


def check_paper_entries(entries: list, where: str, seen: dict | None = None) -> list[dict]:
    """Check published entries (``load_paper_results``' format); errors start with ``where`` and name
    the entry (``where[i]``) and key. ``seen``: the rows of entries already checked (to refuse a second
    row for one run and table across two lists)."""
    if not isinstance(entries, list):
        raise SentembError(f"{where}: expected a list of published entries")
    known = PAPER_TABLES
    allowed = {"method", "backbone", "pooler", "name", "also", "method_args", "train", "table", "source", "note",
               "scores"}
    seen = {} if seen is None else seen
    for i, e in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(e, dict):
            raise SentembError(f"{at} must be a mapping")
        for k in ("method", "backbone", "table", "source", "scores"):
            if k not in e:
                raise SentembError(f"{at} lacks '{k}'")
        extra = sorted(set(e) - allowed)
        if extra:
            raise SentembError(f"{at} has unknown key(s) {extra} (allowed: {sorted(allowed)})")
        if e["table"] not in known:
            raise SentembError(f"{at}.table must be one of {sorted(known)}, not {e['table']!r}")
        for k in ("method_args", "train"):
            if not isinstance(e.get(k, {}), dict):
                raise SentembError(f"{at}.{k} must be a mapping")
        if not isinstance(e.get("also", []), list):
            raise SentembError(f"{at}.also must be a list of run names")
        if not isinstance(e.get("note", ""), str):
            raise SentembError(f"{at}.note must be a string")
        if not isinstance(e["scores"], dict):
            raise SentembError(f"{at}.scores must be a mapping metric -> number")
        for name in [_entry_name(e), *e.get("also", [])]:
            k = (name, e["backbone"], e.get("pooler"), e["table"])
            if k in seen:
                raise SentembError(f"{at} gives run '{name}' on '{e['backbone']}' a second "
                                   f"{e['table']} row ({seen[k]} has one)")
            seen[k] = at
        bad = [m for m in e["scores"] if m not in known[e["table"]]]
        if bad:
            raise SentembError(f"{at}.scores has unknown metric(s) {bad}")
        for m, v in e["scores"].items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise SentembError(f"{at}.scores.{m} must be a number, not {v!r}")
    return entries


def write_published(paper_results: str | Path, rows: list[dict], out: str | Path) -> Path:
    """``paper_results`` (its ``results`` and ``studies``) with the config's own published ``rows``
    (config key ``published``: a plug-in's paper) added to ``results``, written to ``out`` (YAML): the
    one file table_paper, the studies and the model cards read. A row for a run and table that
    ``paper_results`` already has is refused."""
    import yaml

    doc = yaml.safe_load(Path(paper_results).read_text("utf-8")) or {}
    seen: dict = {}
    base = check_paper_entries(doc.get("results"), f"{paper_results}: results", seen)
    doc["results"] = [*base, *check_paper_entries(list(rows or []), "config key 'published'", seen)]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), "utf-8")
    return out


def _key(row) -> tuple:
    pooler = row["pooler"] if row["method"] == BASELINE else None
    return (row["method"], row["backbone"], pooler)


def _entry_name(e: dict) -> str | None:
    """The run a published entry belongs to: its ``name``, else the method's own run (a baseline: none)."""
    return e.get("name") or (None if e["method"] == BASELINE else e["method"])


def collect_dev(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per ``train.json``: run metadata and ``STSBenchmark`` = the best STS-B dev Spearman × 100
    the run selected its checkpoint by (``best_dev_stsb``); runs without a dev evaluation are left out."""
    import pandas as pd

    rows = []
    for p in paths:
        d = read_json(p)
        missing = [k for k in META if k not in d]
        if missing:
            raise SentembError(f"{p}: training summary lacks run metadata {missing}")
        if d.get("best_dev_stsb") is None:
            continue
        rows.append({**{k: d[k] for k in META}, "pooler": None, "STSBenchmark": float(d["best_dev_stsb"])})
    df = pd.DataFrame(rows, columns=[*META, "pooler", "STSBenchmark"])
    df["seed"] = df["seed"].astype(int)
    return df


def collect_geometry(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per ``eval_sts.json`` with an embedding geometry (STS-B test): run metadata, pooler,
    ``align`` and ``uniform`` (``sentemb.evaluate.sts.geometry``); files without one are left out."""
    import pandas as pd

    rows = []
    for p in paths:
        d = read_json(p)
        geo, meta = d.get("geometry") or {}, d.get("run") or {}
        if geo.get("align") is None and geo.get("uniform") is None:
            continue
        missing = [k for k in META if k not in meta]
        if missing:
            raise SentembError(f"{p}: results lack run metadata {missing} (pass --run-meta to evaluate)")
        rows.append({**{k: meta[k] for k in META}, "pooler": d.get("pooler"),
                     "align": geo.get("align"), "uniform": geo.get("uniform")})
    df = pd.DataFrame(rows, columns=[*META, "pooler", "align", "uniform"])
    df["seed"] = df["seed"].astype(int)
    return df


def table_paper(sts: pd.DataFrame, transfer: pd.DataFrame | None, published: list[dict],
                dev: pd.DataFrame | None = None, geometry: pd.DataFrame | None = None) -> pd.DataFrame:
    """Join the reproduced per-seed results with the published numbers (see module docstring);
    ``dev`` (``collect_dev``) holds each run's best STS-B dev score for the ``dev`` entries,
    ``geometry`` (``collect_geometry``) its STS-B test alignment and uniformity for the ``geometry``
    entries (three decimals). ``note``: the entry's note (two printed values, which one is used)."""
    import numpy as np
    import pandas as pd

    pub = {}
    for e in published:
        # a published row belongs to the run named like its method (or to its `name`, and to the runs
        # in `also`), never to an ablation of that method
        for name in [_entry_name(e), *e.get("also", [])]:
            k = (name, e["method"], e["backbone"], e.get("pooler") if e["method"] == BASELINE else None, e["table"])
            pub[k] = e
    rows = []
    for table, df, metrics in (("sts", sts, TASKS), ("transfer", transfer, TRANSFER_TASKS),
                               ("dev", dev, ["STSBenchmark"]), ("geometry", geometry, PAPER_TABLES["geometry"])):
        if df is None or df.empty:
            continue
        metrics = [m for m in metrics if m in df.columns and df[m].notna().any()]
        df = df.copy()
        if table not in _REPORTED_ONLY:
            df["Avg"] = df[metrics].mean(axis=1)
        nd = 3 if table == "geometry" else 2
        for (name, method, backbone), g in df.groupby(["name", "method", "backbone"], sort=False):
            key = _key(g.iloc[0])
            e = pub.get((None if method == BASELINE else name, *key, table))
            if table in _REPORTED_ONLY and e is None:  # only the runs a paper reports a dev score / geometry for
                continue
            ref = None
            if table == "sts" and method not in ("simcse", BASELINE):
                s = df[(df["method"] == "simcse") & (df["backbone"] == backbone)]
                if (s["name"] == "simcse").any():  # the main SimCSE row, not a SimCSE ablation
                    s = s[s["name"] == "simcse"]
                ref = s["Avg"].tolist() if len(s) else None
            for m in ([*metrics, "Avg"] if table not in _REPORTED_ONLY else metrics):
                vals = g.sort_values("seed")[m].dropna().astype(float).tolist()
                if not vals:
                    continue
                mean = float(np.mean(vals))
                lo, hi = ci95(vals)
                published_v = e["scores"].get(m) if e else None
                row = {"table": table, "name": name, "method": method, "backbone": backbone,
                       "pooler": key[2] or "", "metric": SHORT.get(m, m),
                       "published": published_v, "source": (e["source"] if e and published_v is not None
                                                             else "not reported"),
                       "reproduced": round(mean, nd),
                       "std": round(float(np.std(vals, ddof=1)), nd) if len(vals) > 1 else None,  # 1 seed: none
                       "n_seeds": len(vals),
                       "diff": round(mean - published_v, nd) if published_v is not None else None,
                       "ci95_low": None if lo is None else round(lo, nd), "ci95_high": None if hi is None else round(hi, nd),
                       "published_in_ci95": (None if lo is None or published_v is None else bool(lo <= published_v <= hi)),
                       "p_welch_vs_simcse": None,
                       "note": (e.get("note") or "") if e and published_v is not None else ""}
                if m == "Avg" and ref is not None:
                    p = welch_p(vals, ref)
                    row["p_welch_vs_simcse"] = None if p is None else round(p, 4)
                rows.append(row)
    if not rows:
        raise SentembError("no results for the paper table")
    return pd.DataFrame(rows)


def paper_markdown(t: pd.DataFrame) -> str:
    def fmt(v, nd=2):
        if v is None or (isinstance(v, float) and v != v):
            return ""
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:.{nd}f}" if isinstance(v, float) else str(v)

    cols = ["table", "name", "method", "backbone", "pooler", "metric", "published", "reproduced", "std", "n_seeds",
            "diff", "ci95_low", "ci95_high", "published_in_ci95", "p_welch_vs_simcse", "source"]
    cols += ["note"] if "note" in t.columns and t["note"].fillna("").astype(str).str.len().any() else []
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        nd = 3 if r["table"] == "geometry" else 2
        out.append("| " + " | ".join(fmt(r[c], 4 if c == "p_welch_vs_simcse" else nd) for c in cols) + " |")
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------------------------- figures
# Drawn with sentemb.report.style (sizes, fonts, colour-blind-safe styles, PNG + SVG + PDF). Study points
# (runs named <study>/<point>, sentemb.config.studies) are left out here: each study's figure
# (results/studies/) has their scores and their dev curves.
