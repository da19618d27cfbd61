"""The report end of the DAG (issue 12 §3–5): transfer table, paper-vs-reproduced table, figures.

Everything here reads the per-run JSON files (``eval_sts.json``, ``eval_transfer.json``,
``train.json``) and ``config/paper_results.yaml``; nothing is recomputed from models.

* ``table_transfer``: accuracy × 100 per transfer task, mean ± sample std over seeds.
* ``table_paper``: per run × backbone (and baseline pooler) and metric, the published value, the
  reproduced mean ± std over seeds, their difference, the seeds' 95 % t-interval (n ≥ 2) and whether
  the published value lies inside it; on each STS ``Avg`` row a Welch t-test (two-sided,
  ``scipy.stats.ttest_ind(equal_var=False)``) of the per-seed Avg against the SimCSE row on the same
  backbone (UNA's ten-seed comparison). A metric the papers do not report stays empty, never 0.
  Three tables are compared, each with its own metric: ``sts`` (test sets, ``eval_sts.json``),
  ``transfer`` (``eval_transfer.json``) and ``dev`` (STS-B **development** Spearman, which the
  papers' ablation and sensitivity tables report: compared with the run's best dev score,
  ``best_dev_stsb`` of ``train.json``, never with a test score).
* ``figures``: PNG + SVG under ``results/figures/``; one colour per method in every figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from . import SentembError
from .senteval import TASKS
from .tables import META, ci95, collect, welch_p  # noqa: F401  (ci95, welch_p: public here too)
from .transfer import CLASSIFIER_DESCRIPTIONS, TRANSFER_TASKS
from .utils import atomic_path, read_json

if TYPE_CHECKING:
    import pandas as pd

BASELINE = "baseline"  # method name of an untrained backbone's rows (run meta method=baseline)
SHORT = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


def mean_std_table(df: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Mean over seeds per (name, method, backbone); ``<metric>_std`` the sample std (0 for one seed)."""
    import pandas as pd

    g = df.groupby(["name", "method", "backbone"], sort=False)
    mean = g[metrics].mean()
    std = g[metrics].std(ddof=1).fillna(0.0).add_suffix("_std")
    out = pd.concat([mean, std], axis=1)
    out["n_seeds"] = g["seed"].nunique()
    return out.reset_index().round(2)


def transfer_classifier(paths: Iterable[str | Path]) -> str:
    """The classifier every transfer JSON was computed with (``protocol.classifier``: ``pytorch`` or
    ``sklearn``; files written before the switch say ``sklearn LogisticRegression``). Seeds of
    different classifiers must not be averaged into one cell, so a mix is an error naming the files."""
    seen: dict[str, list[str]] = {}
    for p in paths:
        c = (read_json(p).get("protocol") or {}).get("classifier", "")
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
    """Markdown with 'mean ± std' cells."""
    cols = ["name", "method", "backbone", *metrics, "n_seeds"]
    lines = ["| " + " | ".join(SHORT.get(c, c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        cells = [str(r["name"]), str(r["method"]), str(r["backbone"])]
        cells += [f"{r[m]:.2f} ± {r[m + '_std']:.2f}" for m in metrics]
        cells.append(str(int(r["n_seeds"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- paper vs reproduced
#: the metrics each published table may hold
PAPER_TABLES = {"sts": [*TASKS, "Avg"], "transfer": [*TRANSFER_TASKS, "Avg"], "dev": ["STSBenchmark"]}


def load_paper_results(path: str | Path) -> list[dict]:
    """``config/paper_results.yaml``: a list ``results`` of {method, backbone, [pooler], [name], [also],
    [method_args], [train], table: sts|transfer|dev, source, scores: {metric: value}}; errors name the
    entry and key.

    An entry applies to the run ``name`` (default: the method's name) on ``backbone``, and to the runs
    listed in ``also`` (runs that reproduce the same published row another way, e.g. an open choice
    taken the authors' code's way); baselines match by backbone and pooler. ``method_args`` and
    ``train`` state the settings that define the published row (beyond the method's paper defaults):
    ``check_against_config`` verifies that every run the entry names has them, so a number cannot be
    attached to a run that does not reproduce it."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SentembError(f"cannot read published results {path}: {e}") from None
    entries = doc.get("results")
    if not isinstance(entries, list):
        raise SentembError(f"{path}: expected a list under 'results'")
    known = PAPER_TABLES
    allowed = {"method", "backbone", "pooler", "name", "also", "method_args", "train", "table", "source", "scores"}
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise SentembError(f"{path}: results[{i}] must be a mapping")
        for k in ("method", "backbone", "table", "source", "scores"):
            if k not in e:
                raise SentembError(f"{path}: results[{i}] lacks '{k}'")
        extra = sorted(set(e) - allowed)
        if extra:
            raise SentembError(f"{path}: results[{i}] has unknown key(s) {extra} (allowed: {sorted(allowed)})")
        if e["table"] not in known:
            raise SentembError(f"{path}: results[{i}].table must be one of {sorted(known)}, not {e['table']!r}")
        for k in ("method_args", "train"):
            if not isinstance(e.get(k, {}), dict):
                raise SentembError(f"{path}: results[{i}].{k} must be a mapping")
        if not isinstance(e.get("also", []), list):
            raise SentembError(f"{path}: results[{i}].also must be a list of run names")
        for name in [_entry_name(e), *e.get("also", [])]:
            k = (name, e["backbone"], e.get("pooler"), e["table"])
            if k in seen:
                raise SentembError(f"{path}: results[{i}] gives run '{name}' on '{e['backbone']}' a second "
                                   f"{e['table']} row (results[{seen[k]}] has one)")
            seen[k] = i
        bad = [m for m in e["scores"] if m not in known[e["table"]]]
        if bad:
            raise SentembError(f"{path}: results[{i}].scores has unknown metric(s) {bad}")
        for m, v in e["scores"].items():
            if not isinstance(v, (int, float)):
                raise SentembError(f"{path}: results[{i}].scores.{m} must be a number, not {v!r}")
    return entries


def check_against_config(entries: list[dict], config: dict, source: str = "paper_results.yaml") -> None:
    """Refuse published numbers that no configured run reproduces (``config``: validated, e.g. by
    ``sentemb.config.load_config``); errors name the entry.

    * every run an entry names (``name`` or the method's own run, and ``also``) exists on its backbone,
      with the method, and has the entry's ``method_args`` / ``train`` settings (a baseline: the
      backbone's ``baselines`` list holds its pooler);
    * no configured run has published numbers filed under another name: a run without an entry of
      its own whose method arguments equal those of a run that has one (same method, backbone and
      table; compared on every argument an entry of that method pins) would be reported as "not
      reported" while the paper reports it. List it in that entry's ``also``, or tell it apart in
      the entry's ``method_args`` / ``train``.
    """
    from .config import method_args_of

    runs = {(r["name"], r["backbone"]): r for r in config["runs"]}

    def resolved(r: dict) -> tuple[dict, dict]:
        return method_args_of(config, r), {**config["train"], **(r.get("train") or {})}

    covered: dict[tuple, set] = {}  # (method, backbone, table) -> run names with published numbers
    axes: dict[str, tuple[set, set]] = {}  # method -> (method arguments, train keys) some entry pins
    for i, e in enumerate(entries):
        where = f"{source}: results[{i}] ({e['source']})"
        if e["method"] == BASELINE:
            if e.get("pooler") not in (config.get("baselines") or {}).get(e["backbone"], []):
                raise SentembError(f"{where}: no baseline '{e['backbone']}' with pooler '{e.get('pooler')}' in "
                                   "the config's `baselines`")
            continue
        m_axes, t_axes = axes.setdefault(e["method"], (set(), set()))
        m_axes.update(e.get("method_args", {}))
        t_axes.update(e.get("train", {}))
        for name in [_entry_name(e), *e.get("also", [])]:
            r = runs.get((name, e["backbone"]))
            if r is None:
                raise SentembError(f"{where}: no configured run '{name}' on backbone '{e['backbone']}' "
                                   "reproduces this published row (add the run, or fix the entry's name/backbone)")
            if r["method"] != e["method"]:
                raise SentembError(f"{where}: run '{name}' on '{e['backbone']}' trains '{r['method']}', not "
                                   f"'{e['method']}'")
            margs, train = resolved(r)
            for kind, want, have in (("method_args", e.get("method_args", {}), margs),
                                     ("train", e.get("train", {}), train)):
                for k, v in want.items():
                    if have.get(k) != v:
                        raise SentembError(f"{where}: the published row needs {kind}.{k} = {v!r}, but run "
                                           f"'{name}' on '{e['backbone']}' has {have.get(k)!r}: the numbers "
                                           "belong to another run")
            covered.setdefault((e["method"], e["backbone"], e["table"]), set()).add(name)
    def on_axes(r: dict, m_axes: set, t_axes: set) -> dict:
        margs, train = resolved(r)
        return {**{k: margs.get(k) for k in m_axes}, **{f"train.{k}": train.get(k) for k in t_axes}}

    for (method, backbone, table), names in covered.items():
        m_axes, t_axes = axes.get(method, (set(), set()))
        for (name, b), r in runs.items():
            if b != backbone or r["method"] != method or name in names or r.get("study"):
                continue  # a study's point differs from every run in its varied setting (sentemb.studies)
            mine = on_axes(r, m_axes, t_axes)
            for other in sorted(names):
                theirs = on_axes(runs[(other, backbone)], m_axes, t_axes)
                if mine == theirs and mine:
                    raise SentembError(
                        f"{source}: run '{name}' on '{backbone}' has the settings of '{other}' "
                        f"({', '.join(f'{k}={v!r}' for k, v in sorted(mine.items()))}), whose published {table} "
                        f"numbers are filed under '{other}' only: list '{name}' in that entry's `also`, or "
                        "pin the argument that tells them apart in the entry's method_args")


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


def table_paper(sts: pd.DataFrame, transfer: pd.DataFrame | None, published: list[dict],
                dev: pd.DataFrame | None = None) -> pd.DataFrame:
    """Join the reproduced per-seed results with the published numbers (see module docstring);
    ``dev`` (``collect_dev``) holds each run's best STS-B dev score for the ``dev`` entries."""
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
                               ("dev", dev, ["STSBenchmark"])):
        if df is None or df.empty:
            continue
        if table == "dev":  # only the runs a paper reports a dev score for
            has = {(k[0], k[2]) for k in pub if k[4] == "dev"}
            df = df[[(n, b) in has for n, b in zip(df["name"], df["backbone"])]]
            if df.empty:
                continue
        metrics = [m for m in metrics if m in df.columns and df[m].notna().any()]
        df = df.copy()
        if table != "dev":
            df["Avg"] = df[metrics].mean(axis=1)
        for (name, method, backbone), g in df.groupby(["name", "method", "backbone"], sort=False):
            key = _key(g.iloc[0])
            e = pub.get((None if method == BASELINE else name, *key, table))
            ref = None
            if table == "sts" and method not in ("simcse", BASELINE):
                s = df[(df["method"] == "simcse") & (df["backbone"] == backbone)]
                if (s["name"] == "simcse").any():  # the main SimCSE row, not a SimCSE ablation
                    s = s[s["name"] == "simcse"]
                ref = s["Avg"].tolist() if len(s) else None
            for m in ([*metrics, "Avg"] if table != "dev" else metrics):
                vals = g.sort_values("seed")[m].astype(float).tolist()
                mean = float(np.mean(vals))
                lo, hi = ci95(vals)
                published_v = e["scores"].get(m) if e else None
                row = {"table": table, "name": name, "method": method, "backbone": backbone,
                       "pooler": key[2] or "", "metric": SHORT.get(m, m),
                       "published": published_v, "source": (e["source"] if e and published_v is not None
                                                             else "not reported"),
                       "reproduced": round(mean, 2), "std": round(float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0, 2),
                       "n_seeds": len(vals),
                       "diff": round(mean - published_v, 2) if published_v is not None else None,
                       "ci95_low": None if lo is None else round(lo, 2), "ci95_high": None if hi is None else round(hi, 2),
                       "published_in_ci95": (None if lo is None or published_v is None else bool(lo <= published_v <= hi)),
                       "p_welch_vs_simcse": None}
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
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        out.append("| " + " | ".join(fmt(r[c], 4 if c == "p_welch_vs_simcse" else 2) for c in cols) + " |")
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------------------------- figures
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def method_colours(methods: Iterable[str]) -> dict[str, str]:
    """One fixed colour per method (sorted names; SimCSE first), baselines grey, in every figure."""
    ms = sorted(set(methods) - {BASELINE}, key=lambda m: (m != "simcse", m))
    out = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(ms)}
    out[BASELINE] = "#7f7f7f"
    return out


def _label(r) -> str:
    if r["method"] == BASELINE:
        return f"{r['backbone']} untrained ({r.get('pooler')})"
    return f"{r['name']} / {r['backbone']}" if r["name"] != r["method"] else f"{r['method']} / {r['backbone']}"


def _save(fig, out_dir: Path, stem: str) -> list[Path]:
    paths = []
    for ext in ("png", "svg"):
        p = out_dir / f"{stem}.{ext}"
        with atomic_path(p) as tmp:
            fig.savefig(tmp, format=ext, dpi=120, bbox_inches="tight")
        paths.append(p)
    return paths


def sts_bars(evals: pd.DataFrame, colours: dict[str, str]):
    """Table 1 as grouped bars per task, error bars = std over seeds (``evals``: ``collect`` of eval_sts.json)."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = evals.copy()
    df["label"] = [_label(r) for _, r in df.iterrows()]
    tasks = [t for t in TASKS if df[t].notna().any()]
    df["Avg"] = df[tasks].mean(axis=1)
    cols = tasks + ["Avg"]
    g = df.groupby("label", sort=False)
    mean, std = g[cols].mean(), g[cols].std(ddof=1).fillna(0.0)
    meth = g["method"].first()
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(cols) * max(1, len(mean)) ** 0.5), 4))
    w = 0.8 / max(1, len(mean))
    x = np.arange(len(cols))
    for i, lab in enumerate(mean.index):
        hatch = "//" if meth[lab] == BASELINE else None
        ax.bar(x + (i - (len(mean) - 1) / 2) * w, mean.loc[lab], w, yerr=std.loc[lab], capsize=2, label=lab,
               color=colours[meth[lab]], alpha=0.9 if i % 2 == 0 else 0.65, hatch=hatch, edgecolor="black", linewidth=0.3)
    ax.set_xticks(x, [SHORT.get(c, c) for c in cols])
    ax.set_ylabel("Spearman ρ × 100")
    ax.set_xlabel("STS task")
    ax.set_title("STS results (mean over seeds, bars = ±1 std)")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=7, loc="best")
    return fig


def dev_curves(train_paths: list[Path], colours: dict[str, str]):
    """STS-B dev curves from train.json (runs without history are omitted): mean, min–max band over seeds."""
    import matplotlib.pyplot as plt
    import pandas as pd

    curves = {}
    for p in train_paths:
        d = read_json(p)
        hist = [h for h in d.get("history") or [] if "dev_stsb" in h]  # (log-step records carry grad norms only)
        meta = ({k: d[k] for k in META} if all(k in d for k in META) else None) or _meta_from_path(Path(p))
        if not hist or meta is None:
            continue
        key = (meta["name"], meta["method"], meta["backbone"])
        curves.setdefault(key, []).append(pd.Series({h["step"]: h["dev_stsb"] for h in hist}))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (name, method, backbone), series in curves.items():
        m = pd.concat(series, axis=1).sort_index()
        c = colours.get(method, "#000000")
        ax.plot(m.index, m.mean(axis=1), color=c, marker="o", markersize=3,
                label=f"{name} / {backbone} ({m.shape[1]} seed{'s' if m.shape[1] > 1 else ''})")
        ax.fill_between(m.index, m.min(axis=1), m.max(axis=1), color=c, alpha=0.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("STS-B dev Spearman ρ × 100")
    ax.set_title("Model-selection signal during training (mean, min–max band over seeds)")
    if curves:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no training history", ha="center", va="center", transform=ax.transAxes)
    return fig


def align_uniform(evals: list[dict], colours: dict[str, str]):
    """Alignment-uniformity scatter (SimCSE Fig. 2), one point per run (mean over seeds)."""
    import matplotlib.pyplot as plt
    import pandas as pd

    geo = []
    for d in evals:
        gm = d.get("geometry") or {}
        if gm.get("align") is not None and gm.get("uniform") is not None:
            r = d["run"]
            geo.append({"label": _label({**r, "pooler": d.get("pooler")}), "method": r["method"],
                        "align": gm["align"], "uniform": gm["uniform"]})
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    if geo:
        gdf = pd.DataFrame(geo).groupby(["label", "method"], sort=False)[["align", "uniform"]].mean().reset_index()
        for _, r in gdf.iterrows():
            ax.scatter(r["uniform"], r["align"], color=colours.get(r["method"], "#000"), s=50,
                       marker="s" if r["method"] == BASELINE else "o", label=r["label"])
            ax.annotate(r["label"], (r["uniform"], r["align"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no geometry (STS-B not evaluated)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("ℓ_uniform (lower = more uniform)")
    ax.set_ylabel("ℓ_align (lower = better aligned)")
    ax.set_title("Alignment vs uniformity on STS-B test")
    return fig


def cosine_buckets(evals: list[dict], colours: dict[str, str]):
    """Cosine-similarity violins per gold bucket, one panel per run (seeds pooled)."""
    import matplotlib.pyplot as plt

    panels: dict[tuple, dict[str, list]] = {}
    for d in evals:
        gm = d.get("geometry") or {}
        if not gm.get("cosine_buckets"):
            continue
        r = d["run"]
        k = (_label({**r, "pooler": d.get("pooler")}), r["method"])
        for b, v in gm["cosine_buckets"].items():
            panels.setdefault(k, {}).setdefault(b, []).extend(v.get("cosines", []))
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 0.5, 3.6), sharey=True, squeeze=False)
    for ax, ((lab, method), buckets) in zip(axes[0], panels.items()):
        names = list(buckets)
        data = [buckets[b] for b in names]
        pos = [i for i, v in enumerate(data) if len(v) > 1]
        if pos:
            parts = ax.violinplot([data[i] for i in pos], positions=pos, showmeans=True, widths=0.8)
            for body in parts["bodies"]:
                body.set_facecolor(colours.get(method, "#000"))
                body.set_alpha(0.6)
            for k in ("cmeans", "cmins", "cmaxes", "cbars"):
                parts[k].set_color("black")
                parts[k].set_linewidth(0.8)
        ax.set_xticks(range(len(names)), names)
        ax.set_xlabel("gold similarity bucket")
        ax.set_title(lab, fontsize=8)
    axes[0][0].set_ylabel("cosine similarity of the pair")
    if not panels:
        axes[0][0].text(0.5, 0.5, "no geometry", ha="center", va="center", transform=axes[0][0].transAxes)
    fig.suptitle("STS-B test: cosine similarity per gold-score bucket", fontsize=10)
    return fig


def paper_vs_reproduced(paper: pd.DataFrame | None, colours: dict[str, str]):
    """Paper vs reproduced Avg (points with the seeds' 95 % interval): one horizontal panel per table
    (STS, transfer), only the rows the papers report, one line per run so that 50 rows stay readable."""
    import matplotlib.pyplot as plt
    import pandas as pd

    rows = paper[(paper["metric"] == "Avg")] if paper is not None else pd.DataFrame()
    if len(rows):
        rows = rows[rows["published"].notna()]
    tables = [t for t in ("sts", "transfer") if len(rows) and (rows["table"] == t).any()]
    if tables:
        sizes = [int((rows["table"] == t).sum()) for t in tables]
        fig, axes = plt.subplots(len(tables), 1, figsize=(7.5, 1.2 + 0.24 * sum(sizes) + 0.6 * len(tables)),
                                 gridspec_kw={"height_ratios": sizes}, squeeze=False)
        for ax, table in zip(axes[:, 0], tables):
            sub = rows[rows["table"] == table].reset_index(drop=True)
            for i, r in sub.iterrows():
                c = colours.get(r["method"], "#000")
                lo, hi = r["ci95_low"], r["ci95_high"]
                if lo is not None and hi is not None and lo == lo:
                    ax.errorbar(r["reproduced"], i, xerr=[[r["reproduced"] - lo], [hi - r["reproduced"]]], fmt="o",
                                color=c, capsize=3)
                else:
                    ax.plot(r["reproduced"], i, "o", color=c)
                ax.plot(r["published"], i, marker="*", markersize=11, color=c, markeredgecolor="black", linestyle="none")
            ax.set_yticks(range(len(sub)), [_label(r) for _, r in sub.iterrows()], fontsize=7)
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
            ax.set_xlabel("STS Avg (Spearman × 100)" if table == "sts" else "transfer Avg (accuracy × 100)", fontsize=8)
        axes[0, 0].plot([], [], "o", color="grey", label="reproduced (mean, 95% CI over seeds)")
        axes[0, 0].plot([], [], "*", color="grey", markeredgecolor="black", markersize=11, linestyle="none",
                        label="published")
        axes[0, 0].legend(fontsize=7, loc="lower right")
        axes[0, 0].set_title("Published vs reproduced average (rows the papers report)")
    else:
        fig, ax = plt.subplots(figsize=(6.5, 3))
        ax.text(0.5, 0.5, "no published numbers for these runs\n(the papers report BERT/RoBERTa runs on wiki1m: "
                "config/config.yaml and config/paper_results.yaml)", ha="center", va="center", fontsize=9,
                transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title("Published vs reproduced average")
    fig.tight_layout()
    return fig


#: the figures of issue 12 §5 by file stem, in the order ``figures`` writes them (the workflow's targets)
FIGURES = ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced")


def figures(eval_paths: list[Path], train_paths: list[Path], paper: pd.DataFrame | None, out_dir: str | Path) -> list[Path]:
    """Write every figure (``FIGURES``) as PNG + SVG into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = collect(eval_paths, TASKS)
    evals = [read_json(p) for p in eval_paths]
    colours = method_colours(df["method"])
    draw = {
        "table1_bars": lambda: sts_bars(df, colours),
        "dev_curves": lambda: dev_curves(train_paths, colours),
        "align_uniform": lambda: align_uniform(evals, colours),
        "cosine_buckets": lambda: cosine_buckets(evals, colours),
        "paper_vs_reproduced": lambda: paper_vs_reproduced(paper, colours),
    }
    written: list[Path] = []
    for stem in FIGURES:
        fig = draw[stem]()
        written += _save(fig, out_dir, stem)
        plt.close(fig)
    return written


def _meta_from_path(p: Path) -> dict | None:
    """(name, backbone, seed) from results/runs/<name>/<backbone>/seed<seed>/train.json; method from
    its run_config.json when present, else the name."""
    try:
        name, backbone, seed = p.parts[-4], p.parts[-3], int(p.parts[-2].removeprefix("seed"))
    except (IndexError, ValueError):
        return None
    method = name
    rc = p.with_name("run_config.json")
    if rc.is_file():
        method = read_json(rc).get("method", name)
    return {"name": name, "method": method, "backbone": backbone, "seed": seed}


# ------------------------------------------------------------------------------------------ CLI
def _write(df, csv, md_path, md_text, header):
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False)
    if md_path:
        with atomic_path(md_path) as tmp:
            tmp.write_text(header + "\n\n" + md_text, "utf-8")
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
    t = table_paper(sts, tr, load_paper_results(args.published), dev)
    _write(t, args.output, args.markdown, paper_markdown(t),
           "Published vs reproduced (mean ± sample std over seeds; `diff` = reproduced − published; 95% t-interval "
           "over seeds; `p_welch_vs_simcse`: Welch t-test of the per-seed STS Avg against SimCSE on the same "
           "backbone). `table`: `sts` = test sets, `transfer` = SentEval transfer accuracy, `dev` = STS-B "
           "development Spearman (the run's best, by which it kept its checkpoint), as the papers' ablation "
           "tables report it. Empty `published` = not reported by the papers. Baseline `avg_static_last` is the pooling "
           "the papers' \"first-last avg.\" rows used (static embeddings + last layer); `avg_first_last` is "
           "SimCSE's later code (first + last Transformer layer).")
    return 0


def _cmd_figures(args) -> int:
    import pandas as pd

    paper = pd.read_csv(args.paper) if args.paper else None
    if paper is not None:
        paper = paper.astype(object).where(paper.notna(), None)
    files = figures([Path(p) for p in args.evals], [Path(p) for p in args.train], paper, args.output_dir)
    print("\n".join(str(f) for f in files))
    return 0


def register(sub) -> None:
    p = sub.add_parser("table-transfer", help="aggregate transfer JSONs into results/table_transfer.csv (+ .md)")
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=_cmd_table_transfer)
    p = sub.add_parser("table-paper", help="published vs reproduced numbers (results/table_paper.csv + .md)")
    p.add_argument("--sts", nargs="+", required=True, help="eval_sts.json files (runs and baselines)")
    p.add_argument("--transfer", nargs="*", default=[], help="eval_transfer.json files")
    p.add_argument("--published", required=True, help="config/paper_results.yaml")
    p.add_argument("--train", nargs="*", default=[],
                   help="train.json files (best STS-B dev score, for the published `dev` rows)")
    p.add_argument("--output", required=True)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=_cmd_table_paper)
    p = sub.add_parser("figures", help="PNG + SVG figures from the per-run JSON files")
    p.add_argument("--evals", nargs="+", required=True, help="eval_sts.json files")
    p.add_argument("--train", nargs="*", default=[], help="train.json files (history -> dev curves)")
    p.add_argument("--paper", default=None, help="table_paper.csv")
    p.add_argument("--output-dir", required=True)
    p.set_defaults(func=_cmd_figures)
