"""The report end of the DAG (issue 12 §3–5): transfer table, paper-vs-reproduced table, figures.

Everything here reads the per-run JSON files (``eval_sts.json``, ``eval_transfer.json``,
``train.json``) and ``config/paper_results.yaml``; nothing is recomputed from models.

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
* ``figures``: PNG, SVG and PDF under ``results/figures/``, drawn with ``sentemb.figure_style`` (paper
  sizes, colour-blind-safe styles, one look per method in every figure).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from . import SentembError
from .senteval import TASKS
from .tables import META, ci95, collect, welch_p  # noqa: F401  (ci95, welch_p: public here too)
from .transfer import CLASSIFIER_DESCRIPTIONS, TRANSFER_TASKS
from .figure_style import BASELINE  # noqa: F401  the method name of an untrained backbone's rows (public here too)
from .utils import read_json

if TYPE_CHECKING:
    import pandas as pd

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
    ``sentemb.paper_tables.check_against_config`` verifies that every run the entry names has them, so a number cannot be
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
    allowed = {"method", "backbone", "pooler", "name", "also", "method_args", "train", "table", "source", "note",
               "scores"}
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
        if not isinstance(e.get("note", ""), str):
            raise SentembError(f"{path}: results[{i}].note must be a string")
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
    ``align`` and ``uniform`` (``sentemb.evaluate.geometry``); files without one are left out."""
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
                       "std": round(float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0, nd),
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
# Drawn with sentemb.figure_style (sizes, fonts, colour-blind-safe styles, PNG + SVG + PDF). Study points
# (runs named <study>/<point>, sentemb.studies) are left out here: each study's figure
# (results/studies/) has their scores and their dev curves.


def method_colours(methods: Iterable[str]) -> dict[str, str]:
    """The colour of each method, the same in every figure (``figure_style.METHOD_STYLES``; a plug-in
    method: the next colour by name; baselines black)."""
    from .figure_style import BASELINE_COLOURS, StyleBook

    methods = set(methods)
    book = StyleBook([(m, m) for m in methods - {BASELINE}])
    return {m: (BASELINE_COLOURS[0] if m == BASELINE else book.method(m).colour) for m in methods}


def is_study_point(name: str) -> bool:
    """A study's point run (``<study>/<key>=<value>``, sentemb.studies.point_name)."""
    return "/" in name


def _label(r, backbone: bool = True) -> str:
    if r["method"] == BASELINE:
        text = f"untrained ({r.get('pooler')})"
    else:
        text = r["name"]
    return f"{text} / {r['backbone']}" if backbone else text


def _style_book(df: pd.DataFrame, train_metas: Iterable[dict] = ()):
    """One StyleBook for a set of figures: every run (study points aside) and baseline they show."""
    from .figure_style import StyleBook

    runs = {(r["name"], r["method"]) for _, r in df.iterrows() if r["method"] != BASELINE}
    runs |= {(m["name"], m["method"]) for m in train_metas}
    runs = {r for r in runs if not is_study_point(r[0])}
    baselines = {(r["backbone"], r["pooler"]) for _, r in df.iterrows() if r["method"] == BASELINE}
    return StyleBook(runs, baselines)


def _seed_note(counts: Iterable[int]) -> str:
    counts = list(counts)
    if counts and all(n == 1 for n in counts):
        return "1 seed each: no spread"
    return ""


def sts_bars(evals: pd.DataFrame, book):
    """Table 1 as a dot plot (the figure ``table1_bars``): one row per run and untrained baseline,
    grouped by backbone, one panel per STS task and the Avg; dot = mean over seeds, whisker = ±1
    sample std over seeds; a run with one seed says so. Each task's axis spans the trained runs (at
    least ``MIN_SCORE_SPAN`` points): an untrained baseline below it is an arrow with its value at the
    axis' edge, so that 30 points of untrained [CLS] do not flatten the methods' differences. Study
    points are left to their studies."""
    import textwrap

    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from .figure_style import MIN_SCORE_SPAN, SMALL_FONT_SIZE, TEXT_WIDTH, new_figure, score_limits, thin_ticklabels

    df = evals[[not is_study_point(n) for n in evals["name"]]].copy()
    tasks = [t for t in TASKS if df[t].notna().any()]
    df["Avg"] = df[tasks].mean(axis=1)
    cols = tasks + ["Avg"]
    df["pooler"] = df["pooler"].where(df["method"] == BASELINE, None)
    g = df.groupby(["backbone", "name", "method"], sort=False, dropna=False)
    mean, std = g[cols].mean(), g[cols].std(ddof=1)
    n = g["seed"].nunique()
    pooler = g["pooler"].first()
    backbones = list(dict.fromkeys(df["backbone"]))
    rows = {b: sorted([k for k in mean.index if k[0] == b],
                      key=lambda k: book.order({"name": k[1], "method": k[2], "pooler": pooler[k]})) for b in backbones}
    all_one = _seed_note(n[k] for k in mean.index if k[2] != BASELINE)
    sizes = [max(len(rows[b]), 5) for b in backbones]  # room for the backbone's name beside its rows
    fig, axes = new_figure(TEXT_WIDTH, 0.8 + 0.14 * sum(sizes) + 0.12 * len(backbones), nrows=len(backbones),
                           ncols=len(cols), sharex="col", sharey="row", gridspec_kw={"height_ratios": sizes})
    outside = False
    for c, col in enumerate(cols):
        scale = [k for k in mean.index if k[2] != BASELINE] or list(mean.index)
        lo = np.nanmin([mean.loc[k, col] - np.nan_to_num(std.loc[k, col]) for k in scale])
        hi = np.nanmax([mean.loc[k, col] + np.nan_to_num(std.loc[k, col]) for k in scale])
        xlim = score_limits(lo, hi, MIN_SCORE_SPAN, pad=0.22)
        for r, b in enumerate(backbones):
            ax = axes[r, c]
            for i, k in enumerate(rows[b]):
                row = {"backbone": k[0], "name": k[1], "method": k[2], "pooler": pooler[k]}
                s = std.loc[k, col] if n[k] > 1 else None
                v = mean.loc[k, col]
                ax.errorbar([v], [i], xerr=None if s is None else [[s], [s]], elinewidth=0.8,
                            label=_label(row, backbone=False), **book.of(row).points(markersize=4))
                if v < xlim[0] or v > xlim[1]:  # off the axis (an untrained baseline): an arrow and the value
                    outside = True
                    left = v < xlim[0]
                    ax.text(xlim[0] if left else xlim[1], i, f"← {v:.0f}" if left else f"{v:.0f} →",
                            ha="left" if left else "right", va="center", fontsize=SMALL_FONT_SIZE - 1,
                            color=book.of(row).colour)
            ax.set_ylim(len(rows[b]) - 0.5, -0.5)
            ax.grid(axis="x", linewidth=0.4, color="0.88")
            ax.set_axisbelow(True)
            if c == 0:
                labels = []
                for k in rows[b]:
                    text = _label({"backbone": k[0], "name": k[1], "method": k[2], "pooler": pooler[k]}, backbone=False)
                    labels.append(text + (" (1 seed)" if n[k] == 1 and k[2] != BASELINE and not all_one else ""))
                ax.set_yticks(range(len(rows[b])), labels)
                ax.set_ylabel("\n".join(textwrap.wrap(b, 12, break_on_hyphens=True)))
            else:
                ax.tick_params(axis="y", left=False)
            if r == 0:
                ax.set_title(SHORT.get(col, col))
        axes[0, c].set_xlim(*xlim)
        axes[-1, c].xaxis.set_major_locator(MaxNLocator(nbins=3, steps=[1, 2, 5, 10]))
    fig.supxlabel("Spearman ρ × 100 (dot: mean over seeds, whisker: ±1 std)" + (f"; {all_one}" if all_one else "")
                  + ("; ← value: below the axis" if outside else ""), fontsize=SMALL_FONT_SIZE + 1)
    for c in range(len(cols)):
        thin_ticklabels(axes[-1, c], "x")
    return fig


def dev_histories(train_paths: Iterable[str | Path]) -> dict[tuple[str, str, str], dict[int, pd.Series]]:
    """{(name, method, backbone): {seed: Series of the STS-B dev Spearman × 100 by step}} from
    train.json files; runs without a dev history (baselines, no evaluation) are left out."""
    import pandas as pd

    out: dict[tuple[str, str, str], dict[int, pd.Series]] = {}
    for p in train_paths:
        d = read_json(p)
        hist = [h for h in d.get("history") or [] if "dev_stsb" in h]  # (log-step records carry grad norms only)
        meta = ({k: d[k] for k in META} if all(k in d for k in META) else None) or _meta_from_path(Path(p))
        if not hist or meta is None:
            continue
        series = pd.Series({h["step"]: h["dev_stsb"] for h in hist})
        out.setdefault((meta["name"], meta["method"], meta["backbone"]), {})[int(meta["seed"])] = series
    return out


def dev_panel(ax, curves: dict[str, list], styles: list, legend_title: str | None = None) -> None:
    """Draw dev curves into ``ax``: per entry (legend label -> per-seed Series) the mean over seeds as a
    line in its style, the min–max band over seeds, "(1 seed)" after a one-seed entry (or "1 seed each"
    in the legend title); the legend beside the axes; a score axis of at least ``MIN_SCORE_SPAN`` points.
    Single evaluations at one step (a short study's points) are spread sideways so none hides another."""
    import numpy as np
    import pandas as pd

    from .figure_style import legend_outside, score_limits

    note = _seed_note(len(s) for s in curves.values())
    steps = sorted({x for series in curves.values() for s in series for x in s.index})
    single = len(curves) > 1 and all(len(s) == 1 for series in curves.values() for s in series)
    dodge = (min(np.diff(steps)) if len(steps) > 1 else max(steps[0], 1)) * 0.3 / len(curves) if single else 0
    lo, hi = np.inf, -np.inf
    for i, ((label, series), style) in enumerate(zip(curves.items(), styles)):
        m = pd.concat(series, axis=1).sort_index()
        x = m.index + (i - (len(curves) - 1) / 2) * dodge
        ax.plot(x, m.mean(axis=1), label=label + (" (1 seed)" if m.shape[1] == 1 and not note else ""),
                **style.line(markersize=3.5 if single else 3))
        if m.shape[1] > 1:
            ax.fill_between(x, m.min(axis=1), m.max(axis=1), color=style.colour, alpha=0.15, linewidth=0)
        lo, hi = min(lo, float(m.min().min())), max(hi, float(m.max().max()))
    ax.set_ylim(*score_limits(lo, hi))
    if single:
        ax.set_xticks(steps)
        ax.set_xlim(steps[0] - dodge * len(curves), steps[-1] + dodge * len(curves))
    ax.set_xlabel("optimizer step" + (" (points spread sideways)" if single else ""))
    ax.set_ylabel("STS-B dev ρ × 100")
    title = "\n".join(t for t in (legend_title, note) if t) or None
    short = max(len(label) for label in curves) <= 12
    legend_outside(ax, title=title, alignment="left", ncols=2 if len(curves) > 14 and short else 1)


def dev_curves(train_paths: list[Path], book):
    """STS-B dev curves from train.json, one panel per backbone: each run's mean over seeds, band =
    min–max over seeds. Runs without history (baselines) are omitted, and so are study points: each
    study's figure holds its points' curves (``sentemb.studies``)."""
    from .figure_style import COLUMN_WIDTH, TEXT_WIDTH, new_figure

    runs = {k: v for k, v in dev_histories(train_paths).items() if not is_study_point(k[0])}
    backbones = list(dict.fromkeys(k[2] for k in runs))
    if not backbones:
        fig, axes = new_figure(COLUMN_WIDTH, 1.8)
        axes[0, 0].text(0.5, 0.5, "no training history", ha="center", va="center", transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
        return fig
    ncols = 1 if len(backbones) == 1 else 2
    grid = [backbones[i:i + ncols] for i in range(0, len(backbones), ncols)]
    per = {b: sorted([k for k in runs if k[2] == b], key=lambda k: book.order({"name": k[0], "method": k[1]}))
           for b in backbones}
    heights = [max(1.9, 0.45 + 0.135 * max(len(per[b]) for b in row)) for row in grid]
    fig, axes = new_figure(TEXT_WIDTH if ncols == 2 else 4.2, sum(heights), nrows=len(grid), ncols=ncols,
                           gridspec_kw={"height_ratios": heights})
    for ax in axes.flat[len(backbones):]:
        ax.set_axis_off()
    for ax, b in zip(axes.flat, backbones):
        dev_panel(ax, {k[0]: list(runs[k].values()) for k in per[b]}, [book.run(k[0], k[1]) for k in per[b]])
        ax.set_title(b, loc="left")
    return fig


def _geometry(evals: list[dict]) -> pd.DataFrame:
    """One row per run × backbone (study points aside): align and uniform, mean over seeds."""
    import pandas as pd

    geo = []
    for d in evals:
        gm = d.get("geometry") or {}
        r = d["run"]
        if gm.get("align") is None or gm.get("uniform") is None or is_study_point(r["name"]):
            continue
        geo.append({"backbone": r["backbone"], "name": r["name"], "method": r["method"],
                    "pooler": d.get("pooler") if r["method"] == BASELINE else None,
                    "align": gm["align"], "uniform": gm["uniform"]})
    if not geo:
        return pd.DataFrame(columns=["backbone", "name", "method", "pooler", "align", "uniform"])
    return (pd.DataFrame(geo).groupby(["backbone", "name", "method", "pooler"], sort=False, dropna=False)
            [["align", "uniform"]].mean().reset_index())


def align_uniform(evals: list[dict], book):
    """Alignment-uniformity scatter (SimCSE Fig. 2), one panel per backbone, one point per run and
    baseline (mean over seeds), each labelled beside it where every label finds room clear of every
    point and each other, else all named in one legend under the panels (a run keeps its look in every
    panel)."""
    import math

    from .figure_style import COLUMN_WIDTH, TEXT_WIDTH, new_figure, place_labels

    gdf = _geometry(evals)
    backbones = list(dict.fromkeys(gdf["backbone"]))
    if not backbones:
        fig, axes = new_figure(COLUMN_WIDTH, 1.8)
        axes[0, 0].text(0.5, 0.5, "no geometry (STS-B not evaluated)", ha="center", va="center",
                        transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
        return fig
    ncols = 1 if len(backbones) == 1 else 2
    nrows = -(-len(backbones) // ncols)
    width, height = (TEXT_WIDTH if ncols == 2 else 4.2), 2.7 * nrows
    fig, axes = new_figure(width, height, nrows=nrows, ncols=ncols)
    for ax in axes.flat[len(backbones):]:
        ax.set_axis_off()
    panels, entries = [], {}
    for ax, b in zip(axes.flat, backbones):
        sub = gdf[gdf["backbone"] == b]
        sub = sub.iloc[sorted(range(len(sub)), key=lambda i: book.order(sub.iloc[i]))].reset_index(drop=True)
        for _, r in sub.iterrows():  # baselines last, on top: a run on the same spot stays visible around them
            label = _label(r, backbone=False) if r["method"] != BASELINE or ncols == 1 else _label(r)
            (line,) = ax.plot([r["uniform"]], [r["align"]], label=label,
                              **book.of(r).points(markersize=4.5 if r["method"] == BASELINE else 6))
            entries.setdefault(label, (book.order(r), line))
        _pad_limits(ax, sub["uniform"], sub["align"])
        ax.set_xlabel(r"$\ell_{\mathrm{uniform}}$ (lower: more uniform)")
        ax.set_ylabel(r"$\ell_{\mathrm{align}}$ (lower: better aligned)")
        ax.set_title(b, loc="left")
        panels.append((ax, sub))
    labelled = True
    for ax, sub in panels:
        labelled = labelled and place_labels(ax, list(sub["uniform"]), list(sub["align"]),
                                             [_label(r, backbone=False) for _, r in sub.iterrows()])
    if not labelled:  # one legend for all panels, under them
        for ax, _ in panels:
            for t in list(ax.texts):
                t.remove()
        order = sorted(entries.items(), key=lambda kv: kv[1][0])
        ncol = 3 if ncols == 2 else 2
        fig.set_size_inches(width, height + 0.3 + 0.14 * math.ceil(len(order) / ncol))
        fig.legend([line for _, (_, line) in order], [label for label, _ in order], loc="outside lower center",
                   ncols=ncol)
    return fig


def _pad_limits(ax, xs, ys, frac: float = 0.18) -> None:
    """Limits with room around the points for their labels."""
    for values, setter in ((list(xs), ax.set_xlim), (list(ys), ax.set_ylim)):
        lo, hi = min(values), max(values)
        span = (hi - lo) or max(abs(hi) * 0.1, 0.05)
        setter(lo - frac * span, hi + frac * span)


def cosine_buckets(evals: list[dict], book):
    """Cosine-similarity violins per gold bucket, one panel per run and baseline (study points aside),
    seeds pooled, in rows of at most six."""
    import textwrap

    from .figure_style import SMALL_FONT_SIZE, TEXT_WIDTH, new_figure

    panels: dict[tuple, dict[str, list]] = {}
    for d in evals:
        gm = d.get("geometry") or {}
        r = d["run"]
        if not gm.get("cosine_buckets") or is_study_point(r["name"]):
            continue
        k = (r["backbone"], r["name"], r["method"], d.get("pooler") if r["method"] == BASELINE else None)
        for b, v in gm["cosine_buckets"].items():
            panels.setdefault(k, {}).setdefault(b, []).extend(v.get("cosines", []))
    backbones = list(dict.fromkeys(k[0] for k in panels))
    panels = dict(sorted(panels.items(), key=lambda kv: (backbones.index(kv[0][0]), book.order(
        {"name": kv[0][1], "method": kv[0][2], "pooler": kv[0][3]}))))
    n = max(1, len(panels))
    ncols = min(n, 6 if n > 8 else 4)
    nrows = -(-n // ncols)
    fig, axes = new_figure(TEXT_WIDTH, 0.35 + (1.0 if nrows > 4 else 1.45) * nrows, nrows=nrows, ncols=ncols,
                           sharey=True)
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    for ax, ((backbone, name, method, pooler), buckets) in zip(axes.flat, panels.items()):
        row = {"backbone": backbone, "name": name, "method": method, "pooler": pooler}
        names = list(buckets)
        data = [buckets[b] for b in names]
        pos = [i for i, v in enumerate(data) if len(v) > 1]
        if pos:
            parts = ax.violinplot([data[i] for i in pos], positions=pos, showmeans=True, widths=0.8)
            for body in parts["bodies"]:
                body.set_facecolor(book.of(row).colour)
                body.set_edgecolor(book.of(row).colour)
                body.set_alpha(0.55)
            for k in ("cmeans", "cmins", "cmaxes", "cbars"):
                parts[k].set_color("black")
                parts[k].set_linewidth(0.6)
        ax.set_xticks(range(len(names)), [b.split("-")[0] for b in names])
        title = "\n".join(textwrap.wrap(_label(row, backbone=False), 20, break_on_hyphens=True))
        ax.set_title(f"{title}\n{backbone}", fontsize=SMALL_FONT_SIZE)
    fig.supylabel("cosine similarity of the pair", fontsize=SMALL_FONT_SIZE + 1)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no geometry", ha="center", va="center", transform=axes[0, 0].transAxes)
    fig.supxlabel("gold similarity bucket (from its lower bound: 0 = 0–1 … 4 = 4–5)", fontsize=SMALL_FONT_SIZE + 1)
    return fig


def paper_vs_reproduced(paper: pd.DataFrame | None, book):
    """Paper vs reproduced Avg (points with the seeds' 95 % interval): one panel per table (STS,
    transfer) for the trained runs and one for the untrained baselines (each on its own scale, of at
    least ``MIN_SCORE_SPAN`` points), only the rows the papers report, one line per run; the published
    value a hollow star; "(1 seed)" after a run with one seed (no interval)."""
    import pandas as pd
    from matplotlib.lines import Line2D

    from .figure_style import TEXT_WIDTH, legend_outside, new_figure, score_limits

    rows = paper[(paper["metric"] == "Avg")] if paper is not None else pd.DataFrame()
    if len(rows):
        rows = rows[rows["published"].notna()]
    base = rows["method"] == BASELINE if len(rows) else None
    tables = [(t, b) for t in ("sts", "transfer") for b in (False, True)
              if len(rows) and ((rows["table"] == t) & (base == b)).any()]
    if not tables:
        fig, axes = new_figure(TEXT_WIDTH, 1.2)
        axes[0, 0].text(0.5, 0.5, "no published numbers for these runs\n(the papers report BERT/RoBERTa runs on "
                        "wiki1m: config/config.yaml and config/paper_results.yaml)", ha="center", va="center",
                        transform=axes[0, 0].transAxes)
        axes[0, 0].set_axis_off()
        return fig
    sizes = [max(2, int(((rows["table"] == t) & (base == b)).sum())) for t, b in tables]
    fig, axes = new_figure(TEXT_WIDTH, 0.9 + 0.17 * sum(sizes) + 0.45 * len(tables), nrows=len(tables), ncols=1,
                           gridspec_kw={"height_ratios": sizes})
    star = {"marker": "*", "markersize": 8, "fillstyle": "none", "color": "black", "markeredgewidth": 0.7,
            "linestyle": "none"}
    for ax, (table, baselines) in zip(axes[:, 0], tables):
        sub = rows[(rows["table"] == table) & (base == baselines)].reset_index(drop=True)
        xs = []
        labels = []
        for i, row in sub.iterrows():
            r = {**row.to_dict()}  # a table_paper row (not settings): NaN where a column is empty
            r["pooler"] = r["pooler"] if isinstance(r.get("pooler"), str) and r["pooler"] else None
            style = book.of(r)
            lo, hi = r.get("ci95_low"), r.get("ci95_high")
            has_ci = lo is not None and hi is not None and lo == lo and hi == hi
            err = [[r["reproduced"] - lo], [hi - r["reproduced"]]] if has_ci else None
            ax.errorbar([r["reproduced"]], [i], xerr=err, elinewidth=0.8, **style.points(markersize=4))
            ax.plot([r["published"]], [i], **star)
            xs += [r["reproduced"], r["published"], *([lo, hi] if has_ci else [])]
            n = r.get("n_seeds")
            one = n is not None and n == n and int(n) == 1 and r["method"] != BASELINE
            labels.append(_label(r) + (" (1 seed)" if one else ""))
        ax.set_yticks(range(len(sub)), labels)
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.grid(axis="x", linewidth=0.4, color="0.88")
        ax.set_axisbelow(True)
        ax.set_xlim(*score_limits(min(xs), max(xs)))
        ax.set_xlabel(("STS Avg (Spearman ρ × 100)" if table == "sts" else "transfer Avg (accuracy × 100)")
                      + (", untrained baselines" if baselines else ""))
    handles = [Line2D([], [], marker="o", color="0.35", linestyle="none", markersize=4),
               Line2D([], [], **star)]
    legend_outside(axes[0, 0], handles, ["reproduced: mean over seeds, 95 % t-interval", "published"], where="top")
    return fig


#: the figures of issue 12 §5 by file stem, in the order ``figures`` writes them (the workflow's targets)
FIGURES = ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced")


def draw_figures(eval_paths: list[Path], train_paths: list[Path], paper: pd.DataFrame | None):
    """Yield (stem, figure) for every figure of ``FIGURES``, drawn in ``figure_style.paper_style``;
    the caller saves and closes each before the next is drawn."""
    from .figure_style import paper_style

    df = collect(eval_paths, TASKS)
    evals = [read_json(p) for p in eval_paths]
    metas = [{k: d[k] for k in META} for d in map(read_json, train_paths) if all(k in d for k in META)]
    book = _style_book(df, metas)
    draw = {
        "table1_bars": lambda: sts_bars(df, book),
        "dev_curves": lambda: dev_curves(train_paths, book),
        "align_uniform": lambda: align_uniform(evals, book),
        "cosine_buckets": lambda: cosine_buckets(evals, book),
        "paper_vs_reproduced": lambda: paper_vs_reproduced(paper, book),
    }
    with paper_style():
        for stem in FIGURES:
            yield stem, draw[stem]()


def figures(eval_paths: list[Path], train_paths: list[Path], paper: pd.DataFrame | None, out_dir: str | Path) -> list[Path]:
    """Write every figure (``FIGURES``) as PNG, SVG and PDF into ``out_dir``; returns the files written."""
    import matplotlib.pyplot as plt

    from .figure_style import save

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, fig in draw_figures(eval_paths, train_paths, paper):
        written += save(fig, out_dir / stem)
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
