"""A study's table and figure (issue 21): ``results/studies/<name>.csv/.md`` and ``.png/.svg/.pdf``.

The study block and its expansion into runs are :mod:`sentemb.config.studies`. The table has one row
per point with the value(s), the run, ``n_seeds``, ``mean``, ``std`` (sample), the seeds' 95 %
t-interval and the published value; published values come from ``config/paper_results.yaml``,
section ``studies`` (see ``load_published``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from .. import SentembError
from ..config.studies import DEV_METRIC, METRICS, format_value
from ..evaluate.senteval import TASKS, TRANSFER_TASKS

# ------------------------------------------------------------------------------------ published
def load_published(path: str | Path | None) -> dict[str, dict]:
    """The ``studies`` section of ``config/paper_results.yaml``, by study name. Each entry::

        - study: sarcse-theta
          source: "SARCSE Table 3 (RoBERTa-base)"
          points:                       # values the paper prints, by point (keys as in `vary`, or short)
            - {at: {theta: 0.0}, scores: {Avg: 77.43, STSBenchmark: 81.64}}
          reference:                    # a seeds study: the reference run's published values, by seed
            - {at: {seed: 42}, scores: {Avg: 75.32}}

    ``scores`` are keyed by study metric names (``best_dev_stsb`` = STS-B dev Spearman × 100); a seeds
    study's ``at`` holds ``seed``. ``note`` (a string, kept) records where the paper prints two values
    for one point or mean and which one is used (``config/paper_tables.yaml`` names the printed rows)."""
    import yaml

    if not path:
        return {}
    try:
        doc = yaml.safe_load(Path(path).read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SentembError(f"cannot read published results {path}: {e}") from None
    out = {}
    for i, e in enumerate(doc.get("studies") or []):
        where = f"{path}: studies[{i}]"
        if not isinstance(e, dict) or "study" not in e or "source" not in e:
            raise SentembError(f"{where}: needs `study` and `source`")
        extra = set(e) - {"study", "source", "note", "points", "reference"}
        if extra:
            raise SentembError(f"{where}: unknown key(s) {sorted(extra)}")
        if not isinstance(e.get("note", ""), str):
            raise SentembError(f"{where}.note: a string")
        for part in ("points", "reference"):
            for j, p in enumerate(e.get(part) or []):
                if not isinstance(p, dict) or not isinstance(p.get("at"), dict) or not isinstance(p.get("scores"), dict):
                    raise SentembError(f"{where}.{part}[{j}]: needs `at` (a mapping) and `scores` (a mapping)")
                for m, v in p["scores"].items():
                    if m not in METRICS or not isinstance(v, (int, float)) or isinstance(v, bool):
                        raise SentembError(f"{where}.{part}[{j}].scores.{m}: a number for one of {', '.join(METRICS)}")
        if e["study"] in out:
            raise SentembError(f"{where}: study '{e['study']}' has a second entry")
        out[e["study"]] = e
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def published_at(entries: list[dict] | None, at: dict[str, Any], metric: str) -> float | None:
    """The published ``metric`` at point ``at`` (keys compared by their short form)."""
    for p in entries or []:
        want = {k.split(".")[-1]: v for k, v in p["at"].items()}
        have = {k.split(".")[-1]: v for k, v in at.items()}
        if set(want) == set(have) and all(_same(want[k], have[k]) for k in want) and metric in p["scores"]:
            return float(p["scores"][metric])
    return None


# ------------------------------------------------------------------------------------ table
def read_values(paths: Iterable[str | Path], metric: str, seen: set | None = None) -> dict[tuple[str, int], float]:
    """(run name, seed) -> the metric, from eval_sts.json / train.json / eval_transfer.json files; a file
    without the metric (null: ``best_dev_stsb`` of a run selecting its last model) gives no entry.
    ``seen``: gets the (run name, seed) of every file read, with the metric or without."""
    out = {}
    for p in paths:
        try:
            d = json.loads(Path(p).read_text("utf-8"))
        except (OSError, ValueError) as e:
            raise SentembError(f"cannot read results {p}: {e}") from None
        if not isinstance(d, dict):
            raise SentembError(f"{p}: expected a JSON object of results, found {type(d).__name__}")
        meta = d.get("run") if isinstance(d.get("run"), dict) else d
        if "name" not in meta or "seed" not in meta:
            raise SentembError(f"{p}: results lack run metadata (name, seed)")
        if isinstance(meta["seed"], bool) or not isinstance(meta["seed"], int):
            raise SentembError(f"{p}: run metadata seed {meta['seed']!r} is not an integer")
        if seen is not None:
            seen.add((meta["name"], int(meta["seed"])))
        if metric == "Avg":
            tasks = [t for t in TASKS if d.get(t) is not None]
            value = sum(d[t] for t in tasks) / len(tasks) if tasks else None
        else:
            value = d.get(metric)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SentembError(f"{p}: {metric} {value!r} is not a number")
        if value is not None:
            out[(meta["name"], int(meta["seed"]))] = float(value)
    return out


def _stats(values: list[float]) -> dict[str, Any]:
    import numpy as np

    from .tables import ci95

    v = np.asarray(values, dtype=float)
    lo, hi = ci95(v)
    return {"n_seeds": int(v.size), "mean": float(v.mean()) if v.size else None,
            "std": float(v.std(ddof=1)) if v.size > 1 else None, "ci95_low": lo, "ci95_high": hi}


def study_table(spec: dict, values: dict[tuple[str, int], float], published: dict | None = None):
    """One row per point (a seeds study: per role, study and reference): the point's value(s), the run,
    n_seeds, mean, sample std, 95 % t-interval over the study's seeds, the published value (a seeds
    study: the published mean of the seeds the paper lists, and the Welch p-value against the reference)."""
    import pandas as pd

    from .tables import welch_p

    metric, seeds = spec["metric"], spec["seeds"]
    published = published or {}
    rows = []
    if spec.get("reference"):
        per_role = {}
        for role, run, pub_list in (("study", spec["expanded"][0]["run"], published.get("points")),
                                    ("reference", spec["reference"], published.get("reference"))):
            vals = [values[(run, s)] for s in seeds if (run, s) in values]
            pubs = [published_at(pub_list, {"seed": s}, metric) for s in seeds]
            pubs = [p for p in pubs if p is not None]
            per_role[role] = vals
            rows.append({"role": role, "run": run, **_stats(vals),
                         "published": (sum(pubs) / len(pubs)) if pubs else None,
                         "published_std": _stats(pubs)["std"] if pubs else None})
        p = welch_p(per_role["study"], per_role["reference"])
        rows[0]["p_welch_vs_reference"] = p
        rows[1]["p_welch_vs_reference"] = None
    else:
        for point in spec["expanded"]:
            vals = [values[(point["run"], s)] for s in seeds if (point["run"], s) in values]
            rows.append({**point["point"], "run": point["run"], **_stats(vals),
                         "published": published_at(published.get("points"), point["point"], metric)})
    return pd.DataFrame(rows)


def study_markdown(spec: dict, table, source: str | None) -> str:
    def fmt(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 0.01 and v != 0 else f"{v:.2f}"
        return str(v)

    cols = list(table.columns)
    head = (f"Study `{spec['name']}`: {spec['method']} on {spec['backbone']}, metric `{spec['metric']}` "
            f"({'STS-B development Spearman × 100, the run’s best' if spec['metric'] == DEV_METRIC else '× 100'}); "
            f"mean, sample std and 95 % t-interval over seeds {spec['seeds']}."
            + (f" Published: {source}." if source else " Published: none listed (the paper_results file's `studies` section)."))
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ figure
def _metric_label(metric: str) -> str:
    """A study metric's axis label."""
    from .paper import SHORT

    if metric == DEV_METRIC:
        return "STS-B dev ρ × 100 (best)"
    if metric == "Avg":
        return "STS Avg (Spearman ρ × 100)"
    if metric in TRANSFER_TASKS:
        return f"{metric} accuracy × 100"
    return f"{SHORT.get(metric, metric)} Spearman ρ × 100"


def _sorted_values(values: list[Any]) -> list[Any]:
    """Distinct point values in axis order: by value where all are numbers, else as configured."""
    distinct = list({json.dumps(v): v for v in values}.values())
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct):
        return sorted(distinct)
    return distinct


def _seed_values(values: dict[tuple[str, int], float], run: str, seeds: list[int]) -> list[float]:
    return [values[(run, s)] for s in seeds if (run, s) in values]


def _points_in_order(spec: dict) -> list[dict]:
    """The study's expanded points sorted by their values (key by key)."""
    keys = list(spec["expanded"][0]["point"])
    orders = {k: [json.dumps(v) for v in _sorted_values([p["point"][k] for p in spec["expanded"]])] for k in keys}
    return sorted(spec["expanded"], key=lambda p: [orders[k].index(json.dumps(p["point"][k])) for k in keys])


def study_figure(spec: dict, values: dict[tuple[str, int], float], published: dict | None, out: str | Path,
                 histories: dict | None = None) -> list[Path]:
    """The study's figure as PNG, SVG and PDF beside ``out`` (``draw_study_figure``)."""
    import matplotlib.pyplot as plt

    from .style import save

    fig = draw_study_figure(spec, values, published, histories)
    written = save(fig, Path(out).with_suffix(""))
    plt.close(fig)
    return written


def draw_study_figure(spec: dict, values: dict[tuple[str, int], float], published: dict | None,
                      histories: dict | None = None):
    """The study's figure (``sentemb.report.style``), returned unsaved. Left: the metric against the
    varied value (mean; with several seeds each seed and the ±1 std band, with one "1 seed"; published
    values as black crosses; a log axis where the values span a decade); two keys: a heat map of the
    mean (published in brackets); a seeds study: each seed of the study and of its reference, their
    means with the 95 % t-interval, the published seeds. Right, where ``histories``
    (``sentemb.report.figures.dev_histories`` of the study's train.json) has the points: each point's STS-B
    dev curve. Score axes and the heat map's colours span at least ``MIN_SCORE_SPAN`` points."""
    from .style import COLUMN_WIDTH, FONT_SIZE, TEXT_WIDTH, new_figure, paper_style, thin_ticklabels

    published = published or {}
    keys = list(spec["expanded"][0]["point"])
    curves, styles, legend_title = _study_curves(spec, histories or {})
    with paper_style():
        grid = len(keys) == 2 and not spec.get("reference")
        height = max(3.0 if not grid else 1.4 + 0.3 * len({json.dumps(p["point"][keys[1]]) for p in spec["expanded"]}),
                     0.6 + 0.135 * (len(curves) + 2) if curves else 0)
        if curves:
            fig, axes = new_figure(TEXT_WIDTH, height, ncols=2, gridspec_kw={"width_ratios": [1, 1.2]})
        else:
            fig, axes = new_figure(COLUMN_WIDTH * (1.45 if grid else 1.25), height)
        ax = axes[0, 0]
        if spec.get("reference"):
            _seeds_panel(ax, spec, values, published)
        elif grid:
            _grid_panel(fig, ax, spec, values, published, keys)
        else:
            _curve_panel(ax, spec, values, published, keys[0])
        if curves:
            from .figures import dev_panel

            dev_panel(axes[0, 1], curves, styles, legend_title)
            axes[0, 1].set_title("STS-B dev during training", loc="left")
        fig.suptitle(f"{spec['name']}: {spec['method']} on {spec['backbone']}", fontsize=FONT_SIZE)
        if not grid and not spec.get("reference"):
            thin_ticklabels(ax, "x")
    return fig


def _study_curves(spec: dict, histories: dict) -> tuple[dict, list, str | None]:
    """The dev curves of the study's runs: (legend label -> per-seed Series, styles, legend title)."""
    from .style import Style, StyleBook, series_styles

    seeds = set(spec["seeds"])

    def of(run: str) -> list:
        return [series for (name, _, backbone), by_seed in histories.items()
                if name == run and backbone == spec["backbone"] for seed, series in by_seed.items() if seed in seeds]

    if spec.get("reference"):
        run = spec["expanded"][0]["run"]
        curves = {f"{run} (study)": of(run), f"{spec['reference']} (reference)": of(spec["reference"])}
        styles = [StyleBook([(spec["method"], spec["method"])]).method(spec["method"]),
                  Style("#555555", "s", "--", "none")]
        title = None
    else:
        points = _points_in_order(spec)
        curves = {", ".join(format_value(v, k) for k, v in p["point"].items()): of(p["run"]) for p in points}
        styles = series_styles(len(curves))
        title = ", ".join(points[0]["point"])
    kept = [(label, c, s) for (label, c), s in zip(curves.items(), styles) if c]
    if not kept:
        return {}, [], None
    return {label: c for label, c, _ in kept}, [s for *_, s in kept], title


def _curve_panel(ax, spec: dict, values: dict, published: dict, key: str) -> None:
    import numpy as np

    from .style import StyleBook, legend_outside, score_limits, value_axis, value_scale

    metric, seeds = spec["metric"], spec["seeds"]
    own = StyleBook([(spec["method"], spec["method"])]).method(spec["method"])
    points = _points_in_order(spec)
    order = [p["point"][key] for p in points]
    pos = value_axis(ax, order, [format_value(v, key) for v in order])
    per_point = [_seed_values(values, p["run"], seeds) for p in points]
    mean = np.array([np.mean(v) if v else np.nan for v in per_point])
    std = np.array([np.std(v, ddof=1) if len(v) > 1 else np.nan for v in per_point])
    shown: list[float] = [x for v in per_point for x in v]
    if any(len(v) > 1 for v in per_point):
        xs = [x for x, v in zip(pos, per_point) for _ in v]
        ax.plot(xs, [y for v in per_point for y in v], label="each seed",
                **{**own.points(markersize=2.5), "fillstyle": "none", "alpha": 0.7})
        ax.fill_between(pos, mean - std, mean + std, color=own.colour, alpha=0.18, linewidth=0,
                        label="±1 std over seeds")
        shown += list(mean - std) + list(mean + std)
    n = len(seeds)
    scale = value_scale(order)
    joined = scale != "category"  # categories have no order: their points stand alone
    ax.plot(pos, mean, label=f"reproduced (mean of {n} seeds)" if n > 1 else "reproduced (1 seed)",
            **(own.line() if joined else own.points(markersize=5)))
    pub = [(x, published_at(published.get("points"), p["point"], metric)) for x, p in zip(pos, points)]
    pub = [(x, y) for x, y in pub if y is not None]
    if pub:
        ax.plot([x for x, _ in pub], [y for _, y in pub], color="black", marker="x",
                linestyle="--" if joined else "none", linewidth=0.8, markersize=4, label="published")
        shown += [y for _, y in pub]
    shown = [y for y in shown if y == y]
    if shown:
        ax.set_ylim(*score_limits(min(shown), max(shown)))
    if not joined:
        ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_xlabel(key + {"log": " (log scale)", "symlog": " (log scale; 0 at the left)"}.get(scale, ""))
    ax.set_ylabel(_metric_label(metric))
    legend_outside(ax, where="top", ncols=2)


def _grid_panel(fig, ax, spec: dict, values: dict, published: dict, keys: list[str]) -> None:
    import numpy as np

    from .style import SMALL_FONT_SIZE, score_limits

    metric, seeds = spec["metric"], spec["seeds"]
    xs = _sorted_values([p["point"][keys[0]] for p in spec["expanded"]])
    ys = _sorted_values([p["point"][keys[1]] for p in spec["expanded"]])
    xi = {json.dumps(v): i for i, v in enumerate(xs)}
    yi = {json.dumps(v): i for i, v in enumerate(ys)}
    grid = np.full((len(ys), len(xs)), np.nan)
    cells = []
    for p in spec["expanded"]:
        vals = _seed_values(values, p["run"], seeds)
        cx, cy = xi[json.dumps(p["point"][keys[0]])], yi[json.dumps(p["point"][keys[1]])]
        if vals:
            grid[cy, cx] = float(np.mean(vals))
        cells.append((cx, cy, published_at(published.get("points"), p["point"], metric)))
    finite = grid[np.isfinite(grid)]
    lo, hi = score_limits(float(finite.min()), float(finite.max()), pad=0.0) if finite.size else (0.0, 100.0)
    ax.set_facecolor("0.93")  # a cell that is not a point of the study
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap="viridis", vmin=lo, vmax=hi, aspect="auto")
    n = len(seeds)
    fig.colorbar(im, ax=ax, label=f"{_metric_label(metric)}\n" + (f"mean of {n} seeds" if n > 1 else "1 seed"))
    for cx, cy, pub in cells:
        v = grid[cy, cx]
        text = "" if np.isnan(v) else f"{v:.1f}"
        if pub is not None:
            text += f"\n({pub:.1f})"
        if not text:
            continue
        r, g, b, _ = im.cmap(im.norm(v)) if not np.isnan(v) else (1, 1, 1, 1)
        dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # white text on dark cells, black on light
        ax.text(cx, cy, text, ha="center", va="center", fontsize=SMALL_FONT_SIZE - 0.5,
                color="white" if dark else "black")
    ax.set_xticks(range(len(xs)), [format_value(v, "x") for v in xs])
    ax.set_yticks(range(len(ys)), [format_value(v, "y") for v in ys])
    ax.set_xlabel(keys[0])
    ax.set_ylabel(keys[1])
    for side in ("top", "right"):
        ax.spines[side].set_visible(True)
    ax.set_title("cell: mean (published)" if any(pub is not None for *_, pub in cells) else "cell: mean",
                 loc="left", fontsize=SMALL_FONT_SIZE)


def _seeds_panel(ax, spec: dict, values: dict, published: dict) -> None:
    import numpy as np

    from .style import Style, StyleBook, legend_outside, score_limits
    from .tables import ci95

    metric, seeds = spec["metric"], spec["seeds"]
    own = StyleBook([(spec["method"], spec["method"])]).method(spec["method"])
    other = Style("#555555", "s", "--", "none")
    run = spec["expanded"][0]["run"]
    groups = [("study", run, published.get("points"), own),
              ("reference", spec["reference"], published.get("reference"), other)]
    shown: list[float] = []
    for x, (role, name, pubs, style) in enumerate(groups):
        vals = _seed_values(values, name, seeds)
        jitter = np.linspace(-0.12, 0.12, max(len(vals), 1))[: len(vals)]
        ax.plot(x + jitter, vals, label=f"each seed ({role})", **style.points(markersize=3.5))
        shown += vals
        if vals:
            lo, hi = ci95(vals)
            m = float(np.mean(vals))
            err = [[m - lo], [hi - m]] if lo is not None else None
            ax.errorbar([x + 0.3], [m], yerr=err, color="black", marker="D", markersize=3.5, linestyle="none",
                        label="mean, 95 % t-interval" if x == 0 else None)
            shown += [m] + ([lo, hi] if lo is not None else [])
        pv = [p for p in (published_at(pubs, {"seed": s}, metric) for s in seeds) if p is not None]
        if pv:
            first = "published (per seed)" not in ax.get_legend_handles_labels()[1]
            ax.plot([x - 0.3] * len(pv), pv, marker="x", color="black", linestyle="none", markersize=4,
                    label="published (per seed)" if first else None)
            shown += pv
    ax.set_xticks([0, 1], [f"{run}\n(study)", f"{spec['reference']}\n(reference)"])
    ax.set_xlim(-0.6, 1.6)
    if shown:
        ax.set_ylim(*score_limits(min(shown), max(shown)))
    ax.set_ylabel(_metric_label(metric))
    legend_outside(ax, where="top", ncols=1)
