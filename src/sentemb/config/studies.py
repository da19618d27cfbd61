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

A study's table and figure are :mod:`sentemb.report.studies`.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from typing import Any

from .. import SentembError
from ..config.paths import Layout
from ..evaluate.senteval import TASKS, TRANSFER_TASKS

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

    from ..config.settings import section_schema

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
    for key in ("vary", "points"):  # empty is not absent: it would run as a seeds study without a word
        if study[key] is not None and not study[key]:
            raise _err(source, f"'{where}.{key}': empty; give at least one {'key' if key == 'vary' else 'point'}, "
                               "or leave it out for a study over seeds")
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
    """What makes two runs the same training (``sentemb.config.settings.fingerprint`` on the unexpanded config):
    method, backbone, starting weights (``runs[].weights``), corpus, the weight-changing train settings,
    arguments."""
    from ..methods import get_method

    from ..config.settings import weight_free_keys

    cls = get_method(run["method"])
    # merged, not validated: the run checks after the expansion name the key of a bad value
    margs = {**cls.arg_defaults(), **config["methods"].get(run["method"], {}), **run["method_args"]}
    # the weight-changing settings only, as sentemb.config.settings.fingerprint (a logging knob makes no other run)
    train = {k: v for k, v in {**config["train"], **run["train"]}.items() if k not in weight_free_keys()}
    return json.dumps([run["method"], run["backbone"], run.get("weights"), run["corpus"] or config["corpus"]["name"],
                       train, margs],
                      sort_keys=True,
                      default=str)


def expand_studies(config: dict, source: str = "config") -> dict:
    """Turn every ``studies`` entry into runs (appended to ``runs``, or existing runs reused); record on
    each study ``expanded`` = [{point, run}], its ``seeds`` and, for a seeds study, ``reference``.
    Called by ``validate_config`` after the schema (defaults filled) and before the run checks, so the
    points are validated as every run is. Idempotent: a second call finds its runs already there."""
    from ..methods import registry
    from ..config.settings import run_defaults

    studies = config["studies"]
    if not studies:
        return config
    validator = _train_validator()
    sigs: dict[str, dict] = {}  # signature -> the first run with it (a run's settings do not change here)
    for r in config["runs"]:
        if r["method"] in registry():  # an unknown one is named by its key in the run checks that follow
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
            # (the config's train section has its defaults filled in by now)
            selection = (run["train"] if "model_selection" in run["train"] else config["train"])["model_selection"]
            if study["metric"] == DEV_METRIC and selection != "best_dev":
                raise _err(source, f"'{where}.metric': {DEV_METRIC} is the best STS-B dev score of a run that "
                                   f"selects by it, and point {point} keeps its last model (train.model_selection: "
                                   f"{selection}), so it has none; select by best_dev"
                                   + ("" if not study["evaluate"] else ", or show a test metric"))
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


def study_train_inputs(config: dict, study: dict) -> list[str]:
    """The train.json of every run and seed of the study (its points' STS-B dev curves in the figure)."""
    return [f"{Layout.of(config).run_dir(name, study['backbone'], s)}/train.json"
            for name, _ in study_runs(study) for s in study["seeds"]]


def study_spec(config: dict, name: str) -> dict:
    """The expanded study ``name`` of a validated config (what ``sentemb study --spec`` reads)."""
    for s in config["studies"]:
        if s["name"] == name:
            return copy.deepcopy(s)
    raise SentembError(f"no study named '{name}' in config key 'studies'")


def study_tags(run) -> dict[str, str]:
    """MLflow tags of a study point's training run (a ``sentemb.config.settings.Run``): ``study`` and
    ``point`` (``theta=0.3``)."""
    if not run.study:
        return {}
    point = run.point or {}
    return {"study": run.study,
            "point": ",".join(f"{k}={format_value(v, k)}" for k, v in point.items()) or SEEDS_POINT}
