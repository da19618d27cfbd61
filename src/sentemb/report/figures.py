"""The report's figures (issue 12 §5, issue 29 §2): PNG, SVG and PDF under ``results/figures/``, drawn
with :mod:`sentemb.report.style` (paper sizes, colour-blind-safe styles, one look per method in every
figure) from the per-run JSON files; nothing is recomputed from models.

* ``table1_bars``: each run's STS scores, a dot per seed mean with the seeds' whiskers;
* ``dev_curves``: STS-B development Spearman over training steps (``train.json``);
* ``align_uniform`` and ``cosine_buckets``: the geometry of ``eval_sts.json``;
* ``paper_vs_reproduced``: the rows of :func:`sentemb.report.paper.table_paper`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ..evaluate.senteval import TASKS
from ..utils import read_json
from .paper import SHORT
from .style import BASELINE
from .tables import META, collect

if TYPE_CHECKING:
    import pandas as pd


def method_colours(methods: Iterable[str]) -> dict[str, str]:
    """The colour of each method, the same in every figure (``style.METHOD_STYLES``; a plug-in
    method: the next colour by name; baselines black)."""
    from .style import BASELINE_COLOURS, StyleBook

    methods = set(methods)
    book = StyleBook([(m, m) for m in methods - {BASELINE}])
    return {m: (BASELINE_COLOURS[0] if m == BASELINE else book.method(m).colour) for m in methods}


def is_study_point(name: str) -> bool:
    """A study's point run (``<study>/<key>=<value>``, sentemb.config.studies.point_name)."""
    return "/" in name


def _label(r, backbone: bool = True) -> str:
    if r["method"] == BASELINE:
        text = f"untrained ({r.get('pooler')})"
    else:
        text = r["name"]
    return f"{text} / {r['backbone']}" if backbone else text


def _style_book(df: pd.DataFrame, train_metas: Iterable[dict] = ()):
    """One StyleBook for a set of figures: every run (study points aside) and baseline they show."""
    from .style import StyleBook

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

    from .style import MIN_SCORE_SPAN, SMALL_FONT_SIZE, TEXT_WIDTH, new_figure, score_limits, thin_ticklabels

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

    from .style import legend_outside, score_limits

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
    else:  # optimizer steps are whole numbers: no tick at 3.2 on a short run's axis
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    ax.set_xlabel("optimizer step" + (" (points spread sideways)" if single else ""))
    ax.set_ylabel("STS-B dev ρ × 100")
    title = "\n".join(t for t in (legend_title, note) if t) or None
    short = max(len(label) for label in curves) <= 12
    legend_outside(ax, title=title, alignment="left", ncols=2 if len(curves) > 14 and short else 1)


def dev_curves(train_paths: list[Path], book):
    """STS-B dev curves from train.json, one panel per backbone: each run's mean over seeds, band =
    min–max over seeds. Runs without history (baselines) are omitted, and so are study points: each
    study's figure holds its points' curves (``sentemb.report.studies``)."""
    from .style import COLUMN_WIDTH, TEXT_WIDTH, new_figure

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

    from .style import COLUMN_WIDTH, TEXT_WIDTH, new_figure, place_labels

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

    from .style import SMALL_FONT_SIZE, TEXT_WIDTH, new_figure

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
    value a hollow star; "(1 seed)" after a run with one seed (no interval). 0.17 in a row, narrower
    (to 0.13 in) where the figure would pass a page (``PAGE_HEIGHT``)."""
    import pandas as pd
    from matplotlib.lines import Line2D

    from .style import PAGE_HEIGHT, TEXT_WIDTH, legend_outside, new_figure, score_limits

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
    # 0.17 in a row, less (down to 0.13, a label's height with room) where the rows would pass a page
    frame = 0.9 + 0.45 * len(tables)
    row_in = min(0.17, max(0.13, (PAGE_HEIGHT - frame) / sum(sizes)))
    fig, axes = new_figure(TEXT_WIDTH, frame + row_in * sum(sizes), nrows=len(tables), ncols=1,
                           gridspec_kw={"height_ratios": sizes})
    star = {"marker": "*", "markersize": 8, "fillstyle": "none", "color": "black", "markeredgewidth": 0.7,
            "linestyle": "none"}
    first = None  # the style of the first row drawn (the legend's reproduced handle)
    for ax, (table, baselines) in zip(axes[:, 0], tables):
        sub = rows[(rows["table"] == table) & (base == baselines)].reset_index(drop=True)
        xs = []
        labels = []
        for i, row in sub.iterrows():
            r = {**row.to_dict()}  # a table_paper row (not settings): NaN where a column is empty
            r["pooler"] = r["pooler"] if isinstance(r.get("pooler"), str) and r["pooler"] else None
            style = book.of(r)
            first = style if first is None else first
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
    # the reproduced handle in the first row's own style (each row is drawn in its run's marker and
    # colour, and the labels name the runs): a grey circle matched no point of a run drawn otherwise
    handles = [Line2D([], [], **first.points(markersize=4)), Line2D([], [], **star)]
    legend_outside(axes[0, 0], handles, ["reproduced: mean over seeds, 95 % t-interval", "published"], where="top")
    return fig


#: the figures of issue 12 §5 by file stem, in the order ``figures`` writes them (the workflow's targets)
FIGURES = ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced")


def draw_figures(eval_paths: list[Path], train_paths: list[Path], paper: pd.DataFrame | None):
    """Yield (stem, figure) for every figure of ``FIGURES``, drawn in ``style.paper_style``;
    the caller saves and closes each before the next is drawn."""
    from .style import paper_style

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

    from .style import save

    import os
    import shutil
    import tempfile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # every figure drawn and written aside first: a failure halfway leaves none of them in out_dir
    # (Snakemake would take the first figures for a finished job's)
    tmp = Path(tempfile.mkdtemp(prefix=".figures.tmp-", dir=out_dir))
    try:
        drawn: list[Path] = []
        for stem, fig in draw_figures(eval_paths, train_paths, paper):
            drawn += save(fig, tmp / stem)
            plt.close(fig)
        written = []
        for f in drawn:
            os.replace(f, out_dir / f.name)
            written.append(out_dir / f.name)
        return written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
