"""Studies: a sensitivity analysis as one config block, one table and one figure (issue 21).

A study varies run keys over values and becomes ordinary named runs::

    studies:
      - name: sarcse-theta
        method: sarcse
        backbone: roberta-base
        vary: {method_args.theta: [0.0, 0.1, 0.2]}   # one key: a curve; two keys: a grid (heat map)
        train: {batch_size: 64, lr: 1.0e-5}            # the settings every point shares
        seeds: [42]                                    # default: the top-level seeds
        metric: Avg                                    # what the figure and table show

* ``vary`` maps run keys (``method_args.<arg>``, ``train.<key>``) to value lists; several keys form
  their Cartesian grid. ``points`` instead lists the points one by one (``[{method_args.m: 10,
  method_args.n: 1}, ...]``) for designs that are not a grid (PaSeR Table 8, ArcCSE Fig. 6). A study
  with neither is a **seeds study** (UNA Table D7): one point over its seeds, set against
  ``reference`` (a run on the same backbone, default ``simcse``) on the same seeds.
* Each point is a run named ``<study>/<key>=<value>[,<key>=<value>]`` (``<key>`` = the last part of
  the run key unless two keys of the study share it; a seeds study's run is ``<study>/seeds``). The
  value is written canonically (``repr`` of the float, integral floats as integers: ``theta=0.3``,
  ``aux_weight=1e-05``, ``margin_deg=10``; booleans ``true``/``false``), so the name is stable and
  uses only ``[A-Za-z0-9_.,=-]``. Its ``/`` nests the run directory:
  ``results/runs/<study>/<key>=<value>/<backbone>/seed<seed>``, one folder per study.
* A point whose settings equal an existing run (same method, backbone, corpus, effective ``train``
  and effective method arguments) **reuses** that run: nothing is retrained, the run keeps its name,
  and gains the study's seeds it lacks (its table row then counts them too). The study records the
  run each point maps to (``studies[i].expanded``).
* ``evaluate: false`` (a cheap study, e.g. the CPU demo's): the new runs skip the test sets (no
  eval_sts.json, no table1 row) and the metric is their training-time dev score, ``best_dev_stsb``.
* Generated runs carry ``study`` and ``point``; ``resolve_run`` passes them on and the training
  MLflow run is tagged with both.
* Bad keys and values are refused naming ``studies[i].vary.<key>``: method arguments against the
  method's declared ``Args``, train keys against the config schema's train settings.

The table ``results/studies/<name>.csv/.md``: one row per point with the value(s), the run,
``n_seeds``, ``mean``, ``std`` (sample), the seeds' 95 % t-interval and the published value; the
figure ``results/studies/<name>.png/.svg/.pdf``. Published values come from ``config/paper_results.yaml``,
section ``studies`` (see ``load_published``).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from . import SentembError
from .layout import Layout
from .senteval import TASKS, TRANSFER_TASKS

#: the metrics a study may show: STS test tasks and their Avg (eval_sts.json), the run's best STS-B
#: development score (train.json, what the papers' sensitivity tables mostly report), a transfer task
DEV_METRIC = "best_dev_stsb"
METRICS = [*TASKS, "Avg", DEV_METRIC, *TRANSFER_TASKS]
SEEDS_POINT = "seeds"
_SAFE_STR = re.compile(r"^[A-Za-z0-9_.-]+$")
_PREFIXES = ("method_args", "train")


def metric_source(metric: str) -> str:
    """The per-run file a metric is read from: ``eval_sts``, ``train`` or ``eval_transfer``."""
    if metric == DEV_METRIC:
        return "train"
    if metric in TRANSFER_TASKS:
        return "eval_transfer"
    return "eval_sts"


# ------------------------------------------------------------------------------------ names
def format_value(value: Any, where: str) -> str:
    """The canonical, filesystem-safe spelling of a point value in a run name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SentembError(f"{where}: {value!r} cannot be a study point")
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value).replace("e+", "e")
    if isinstance(value, str) and _SAFE_STR.match(value):
        return value
    raise SentembError(f"{where}: {value!r} cannot name a study point (numbers, booleans and strings of "
                       "[A-Za-z0-9_.-] only)")


def short_keys(keys: list[str]) -> dict[str, str]:
    """Run key -> its name in point names: the last part, the full key where two would collide."""
    last = [k.split(".", 1)[1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def point_name(study: str, point: dict[str, Any], where: str) -> str:
    """``<study>/<key>=<value>,...`` (keys in the study's order); ``<study>/seeds`` for no keys."""
    if not point:
        return f"{study}/{SEEDS_POINT}"
    return study + "/" + ",".join(f"{k}={format_value(v, f'{where}.{k}')}" for k, v in point.items())


# ------------------------------------------------------------------------------------ expansion
def _err(source: str, msg: str) -> SentembError:
    return SentembError(f"invalid configuration in {source}: config key {msg}")


def _train_validator():
    import jsonschema

    from .settings import section_schema

    return jsonschema.Draft202012Validator(section_schema("train", defaults=False))  # = runs[].train's schema


def _check_train(validator, train: dict, where: str, source: str) -> None:
    errors = sorted(validator.iter_errors(train), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.absolute_path)
        if e.validator == "additionalProperties":
            bad = sorted(set(train) - set(e.schema.get("properties", {})))
            key = bad[0] if bad else key
            raise _err(source, f"'{where}.{key}': unknown train setting (see `train` in the config schema)")
        raise _err(source, f"'{where}{'.' + key if key else ''}': {e.message}")


def _points(study: dict, where: str, source: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(run keys, points as {run key: value}) of a study: the grid of ``vary``, or ``points``."""
    if study["vary"] and study["points"]:
        raise _err(source, f"'{where}': give either `vary` (a grid) or `points` (a list), not both")
    if study["vary"]:
        vary = study["vary"]
        keys = list(vary)
        for k in keys:
            if not isinstance(vary[k], list) or not vary[k]:
                raise _err(source, f"'{where}.vary.{k}': a non-empty list of values")
            if len(set(map(json.dumps, vary[k]))) != len(vary[k]):
                raise _err(source, f"'{where}.vary.{k}': a value appears twice")
        return keys, [dict(zip(keys, combo)) for combo in itertools.product(*(vary[k] for k in keys))]
    if study["points"]:
        keys = list(study["points"][0])
        for j, p in enumerate(study["points"]):
            if set(p) != set(keys):
                raise _err(source, f"'{where}.points[{j}]': every point sets the keys of the first "
                                   f"({', '.join(keys)})")
            if json.dumps(p, sort_keys=True) in {json.dumps(q, sort_keys=True) for q in study["points"][:j]}:
                raise _err(source, f"'{where}.points[{j}]': the same point twice")
        return keys, [{k: p[k] for k in keys} for p in study["points"]]
    return [], [{}]


def _signature(config: dict, run: dict) -> str:
    """What makes two runs the same training (``sentemb.settings.fingerprint`` on the unexpanded config):
    method, backbone, corpus, the weight-changing train settings, arguments."""
    from .methods import get_method

    from .settings import weight_free_keys

    cls = get_method(run["method"])
    # merged, not validated: the run checks after the expansion name the key of a bad value
    margs = {**cls.arg_defaults(), **config["methods"].get(run["method"], {}), **run["method_args"]}
    # the weight-changing settings only, as sentemb.settings.fingerprint (a logging knob makes no other run)
    train = {k: v for k, v in {**config["train"], **run["train"]}.items() if k not in weight_free_keys()}
    return json.dumps([run["method"], run["backbone"], run["corpus"] or config["corpus"]["name"], train, margs],
                      sort_keys=True,
                      default=str)


def expand_studies(config: dict, source: str = "config") -> dict:
    """Turn every ``studies`` entry into runs (appended to ``runs``, or existing runs reused); record on
    each study ``expanded`` = [{point, run}], its ``seeds`` and, for a seeds study, ``reference``.
    Called by ``validate_config`` after the schema (defaults filled) and before the run checks, so the
    points are validated as every run is. Idempotent: a second call finds its runs already there."""
    from .methods import registry
    from .settings import run_defaults

    studies = config["studies"]
    if not studies:
        return config
    validator = _train_validator()
    sigs: dict[str, dict] = {}  # signature -> the first run with it (a run's settings do not change here)
    for r in config["runs"]:
        sigs.setdefault(_signature(config, r), r)
    names = set()
    for i, study in enumerate(studies):
        where = f"studies[{i}]"
        if study["name"] in names:
            raise _err(source, f"'{where}.name': study '{study['name']}' appears twice")
        names.add(study["name"])
        if study["backbone"] not in config["backbones"]:
            raise _err(source, f"'{where}.backbone': '{study['backbone']}' is not one of the declared backbones "
                               f"{sorted(config['backbones'])}")
        if study["method"] not in registry():
            raise _err(source, f"'{where}.method': unknown method '{study['method']}' (registered: "
                               f"{sorted(registry())})")
        cls = registry()[study["method"]]
        if study["metric"] not in METRICS:
            raise _err(source, f"'{where}.metric': {study['metric']!r} is not one of {', '.join(METRICS)}")
        if not study["evaluate"] and study["metric"] != DEV_METRIC:
            raise _err(source, f"'{where}.metric': a study with evaluate: false has only the dev score "
                               f"({DEV_METRIC}), not {study['metric']!r}")
        try:
            cls.validate_args(study["method_args"], f"{where}.method_args")
        except SentembError as e:
            raise _err(source, str(e)) from None
        _check_train(validator, study["train"], f"{where}.train", source)
        keys, points = _points(study, where, source)
        label = "vary" if study["vary"] else "points"
        for k in keys:
            prefix, _, arg = k.partition(".")
            if prefix not in _PREFIXES or not arg or "." in arg:
                raise _err(source, f"'{where}.{label}.{k}': a study varies method_args.<argument> or "
                                   "train.<setting>")
            values = {json.dumps(p[k]): p[k] for p in points}.values()
            for v in values:
                if prefix == "method_args":
                    try:
                        cls.validate_args({arg: v}, f"{where}.{label}.method_args")
                    except SentembError as e:
                        raise _err(source, str(e)) from None
                else:
                    _check_train(validator, {arg: v}, f"{where}.{label}.train", source)
        short = short_keys(keys)
        seeds = list(study["seeds"] or config["seeds"])
        expanded = []
        for p in points:
            point = {short[k]: v for k, v in p.items()}
            name = point_name(study["name"], point, f"{where}.{label}")
            run = {**run_defaults(), "name": name, "method": study["method"], "backbone": study["backbone"],
                   "method_args": {**study["method_args"],
                                   **{k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("method_args.")}},
                   "train": {**study["train"],
                             **{k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("train.")}},
                   "seeds": seeds, "study": study["name"], "point": point, "corpus": study["corpus"],
                   "evaluate": study["evaluate"]}
            if study["transfer"] is not None or metric_source(study["metric"]) == "eval_transfer":
                run["transfer"] = True if study["transfer"] is None else study["transfer"]
            sig = _signature(config, run)
            target = sigs.get(sig)
            if target is None:
                if any((r["name"] or r["method"]) == name and r["backbone"] == run["backbone"] for r in config["runs"]):
                    raise _err(source, f"'{where}': a run named '{name}' on '{run['backbone']}' exists with other "
                                       "settings; rename the study or the run")
                config["runs"].append(run)
                sigs[sig] = target = run
            else:
                _add_seeds(config, target, seeds)
                if study["evaluate"]:
                    target["evaluate"] = True
                if run["transfer"]:
                    target["transfer"] = True
            expanded.append({"point": point, "run": target["name"] or target["method"],
                             "reused": target is not run and target.get("study") != study["name"]})
        study["expanded"] = expanded
        study["seeds"] = seeds
        if not keys:
            ref = study["reference"] or "simcse"
            match = [r for r in config["runs"] if (r["name"] or r["method"]) == ref
                     and r["backbone"] == study["backbone"]]
            if not match:
                raise _err(source, f"'{where}.reference': no run '{ref}' on '{study['backbone']}' to set the seeds "
                                   "study against (a seeds study compares with `reference`, default simcse)")
            _add_seeds(config, match[0], seeds)
            study["reference"] = ref
    return config


def _add_seeds(config: dict, run: dict, seeds: list[int]) -> None:
    have = list(run["seeds"] or config["seeds"])
    missing = [s for s in seeds if s not in have]
    if missing:
        run["seeds"] = have + missing


def study_runs(study: dict) -> list[tuple[str, str]]:
    """(run name, role) of a study after expansion: every point's run, then the seeds study's reference."""
    out = [(p["run"], "point") for p in study["expanded"]]
    if study["reference"]:
        out.append((study["reference"], "reference"))
    return out


def study_inputs(config: dict, study: dict) -> list[str]:
    """The per-run result files the study's table reads (its metric's file, every run, every seed)."""
    kind = metric_source(study["metric"])
    return [f"{Layout.of(config).run_dir(name, study['backbone'], s)}/{kind}.json"
            for name, _ in study_runs(study) for s in study["seeds"]]


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
def read_values(paths: Iterable[str | Path], metric: str) -> dict[tuple[str, int], float]:
    """(run name, seed) -> the metric, from eval_sts.json / train.json / eval_transfer.json files."""
    out = {}
    for p in paths:
        try:
            d = json.loads(Path(p).read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise SentembError(f"cannot read results {p}: {e}") from None
        meta = d.get("run") if isinstance(d.get("run"), dict) else d
        if "name" not in meta or "seed" not in meta:
            raise SentembError(f"{p}: results lack run metadata (name, seed)")
        if metric == "Avg":
            tasks = [t for t in TASKS if d.get(t) is not None]
            value = sum(d[t] for t in tasks) / len(tasks) if tasks else None
        else:
            value = d.get(metric)
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
            + (f" Published: {source}." if source else " Published: none listed in paper_results.yaml."))
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ figure
def _metric_label(metric: str) -> str:
    """A study metric's axis label."""
    from .report import SHORT

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


def study_train_inputs(config: dict, study: dict) -> list[str]:
    """The train.json of every run and seed of the study (its points' STS-B dev curves in the figure)."""
    return [f"{Layout.of(config).run_dir(name, study['backbone'], s)}/train.json"
            for name, _ in study_runs(study) for s in study["seeds"]]


def study_figure(spec: dict, values: dict[tuple[str, int], float], published: dict | None, out: str | Path,
                 histories: dict | None = None) -> list[Path]:
    """The study's figure as PNG, SVG and PDF beside ``out`` (``draw_study_figure``)."""
    import matplotlib.pyplot as plt

    from .figure_style import save

    fig = draw_study_figure(spec, values, published, histories)
    written = save(fig, Path(out).with_suffix(""))
    plt.close(fig)
    return written


def draw_study_figure(spec: dict, values: dict[tuple[str, int], float], published: dict | None,
                      histories: dict | None = None):
    """The study's figure (``sentemb.figure_style``), returned unsaved. Left: the metric against the
    varied value (mean; with several seeds each seed and the ±1 std band, with one "1 seed"; published
    values as black crosses; a log axis where the values span a decade); two keys: a heat map of the
    mean (published in brackets); a seeds study: each seed of the study and of its reference, their
    means with the 95 % t-interval, the published seeds. Right, where ``histories``
    (``sentemb.report.dev_histories`` of the study's train.json) has the points: each point's STS-B
    dev curve. Score axes and the heat map's colours span at least ``MIN_SCORE_SPAN`` points."""
    from .figure_style import COLUMN_WIDTH, FONT_SIZE, TEXT_WIDTH, new_figure, paper_style, thin_ticklabels

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
            from .report import dev_panel

            dev_panel(axes[0, 1], curves, styles, legend_title)
            axes[0, 1].set_title("STS-B dev during training", loc="left")
        fig.suptitle(f"{spec['name']}: {spec['method']} on {spec['backbone']}", fontsize=FONT_SIZE)
        if not grid and not spec.get("reference"):
            thin_ticklabels(ax, "x")
    return fig


def _study_curves(spec: dict, histories: dict) -> tuple[dict, list, str | None]:
    """The dev curves of the study's runs: (legend label -> per-seed Series, styles, legend title)."""
    from .figure_style import Style, StyleBook, series_styles

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

    from .figure_style import StyleBook, legend_outside, score_limits, value_axis, value_scale

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

    from .figure_style import SMALL_FONT_SIZE, score_limits

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

    from .figure_style import Style, StyleBook, legend_outside, score_limits
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


def study_spec(config: dict, name: str) -> dict:
    """The expanded study ``name`` of a validated config (what ``sentemb study --spec`` reads)."""
    for s in config["studies"]:
        if s["name"] == name:
            return copy.deepcopy(s)
    raise SentembError(f"no study named '{name}' in config key 'studies'")


def study_tags(run) -> dict[str, str]:
    """MLflow tags of a study point's training run (a ``sentemb.settings.Run``): ``study`` and
    ``point`` (``theta=0.3``)."""
    if not run.study:
        return {}
    point = run.point or {}
    return {"study": run.study,
            "point": ",".join(f"{k}={format_value(v, k)}" for k, v in point.items()) or SEEDS_POINT}
