"""Configuration: load YAML, fill defaults from the JSON schema, validate with errors naming the key.

The schema is generated from the typed tree ``sentemb.config.settings.Config`` (``load_schema``); the
Snakefile and the CLI validate with it. ``jobs``, ``tested``, ``transfer_runs`` and ``baselines``
enumerate what a validated config makes: the Snakefile, ``sentemb plan`` and the tests read them.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema
import yaml

from .. import SentembError
from .fields import build, schema_of
from .paths import Layout
from .settings import Config, Run, RunSpec, TrainSettings


def load_schema() -> dict:
    """The config's JSON schema, generated whole from the typed tree ``sentemb.config.settings.Config``
    (each key declared there once, with its default, type, bounds and help). ``sentemb
    config-schema`` prints it; ``config/README.md`` is generated from it (``sentemb config-keys``)."""
    return copy.deepcopy(_parsed_schema())


@functools.lru_cache(maxsize=1)
def _parsed_schema() -> dict:
    # built once per process: method checks ask for it per run (hundreds of runs with studies)
    import dataclasses

    from .fields import hints_of
    from .settings import Config

    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "sentemb workflow configuration",
              "description": "Generated from sentemb.config.settings.Config (sentemb config-schema); validated by "
                             "sentemb.config.load.validate_config, which fills in the defaults.",
              **schema_of(Config)}
    hints = hints_of(Config)
    for f in dataclasses.fields(Config):  # a section's description: its class's (as config/README.md shows it)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and tp.__doc__:
            schema["properties"][f.name]["description"] = " ".join(tp.__doc__.split("\n\n")[0].split())
    return schema


def _extend_with_default(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultValidator = _extend_with_default(jsonschema.Draft202012Validator)


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def validate_config(config: dict, source: str = "config") -> dict:
    """Fill defaults and validate ``config`` in place; raise SentembError naming the bad key.

    Also checks what a schema cannot: that every run names a declared backbone and a registered
    method, and that run names are unique per backbone.
    """
    from ..methods import load_method_modules

    schema = load_schema()
    # Defaults filled in while validating (errors reported together, each naming its key).
    errors = sorted(_DefaultValidator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        msgs = [f"  - config key '{_key_path(e)}': {e.message}" for e in errors[:10]]
        raise SentembError(f"invalid configuration in {source}:\n" + "\n".join(msgs))
    # The user's methods next: the checks below (and the DAG) see them like the built-in ones.
    try:
        load_method_modules(config["method_modules"])
    except SentembError as e:
        raise SentembError(f"invalid configuration in {source}: config key {e}") from None
    from ..methods import registry
    from .studies import expand_studies

    expand_studies(config, source)  # each study point becomes a run (or reuses one): checked as every run
    if config.get("published"):
        from ..report.paper import check_paper_entries

        try:
            check_paper_entries(config["published"], "config key 'published'")
        except SentembError as e:
            raise SentembError(f"invalid configuration in {source}: {e}") from None
    for key in ("results_dir", "resources_dir"):  # Snakemake would stop with NotADirectoryError, no key named
        path = Path(config[key])
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise SentembError(f"invalid configuration in {source}: config key '{key}': {blocker} exists and is "
                               "not a directory")
    for backbone in config["baselines"]:
        if backbone not in config["backbones"]:
            raise SentembError(
                f"invalid configuration in {source}: config key 'baselines.{backbone}': "
                f"'{backbone}' is not one of the declared backbones {sorted(config['backbones'])}"
            )
        poolers = config["baselines"][backbone]
        twice = sorted({p for p in poolers if poolers.count(p) > 1})
        if twice:  # one evaluation each: the tables would count the row twice
            raise SentembError(f"invalid configuration in {source}: config key 'baselines.{backbone}': "
                               f"pooler(s) {', '.join(twice)} listed twice")
    try:  # the top-level train keys on their own: a wrong one is named there, not in runs[0]
        TrainSettings.from_dict(config["train"], "train")
    except SentembError as e:
        raise SentembError(f"invalid configuration in {source}: config key {e}") from None
    seen = set()
    run_settings = []  # each run's TrainSettings, for Method.check_train
    known = _known_corpora(config["corpus"]["name"])
    for i, run in enumerate(config["runs"]):
        if run["backbone"] not in config["backbones"]:
            raise SentembError(
                f"invalid configuration in {source}: config key 'runs[{i}].backbone': "
                f"'{run['backbone']}' is not one of the declared backbones {sorted(config['backbones'])}"
            )
        if run["weights"] is not None and run["weights"] not in config["backbones"]:
            raise SentembError(
                f"invalid configuration in {source}: config key 'runs[{i}].weights': "
                f"'{run['weights']}' is not one of the declared backbones {sorted(config['backbones'])}"
            )
        if run["method"] not in registry():
            raise SentembError(
                f"invalid configuration in {source}: config key 'runs[{i}].method': "
                f"unknown method '{run['method']}' (registered: {sorted(registry())})"
            )
        if run["corpus"] is not None and run["corpus"] not in known:
            raise SentembError(
                f"invalid configuration in {source}: config key 'runs[{i}].corpus': unknown corpus "
                f"'{run['corpus']}' (known: {', '.join(known)}; the configured corpus is corpus.name)"
            )
        if run["name"] is None:
            run["name"] = run["method"]
        key = (run["name"], run["backbone"])
        if key in seen:
            raise SentembError(
                f"invalid configuration in {source}: config key 'runs[{i}].name': run "
                f"'{run['name']}' on backbone '{run['backbone']}' appears twice; give one a distinct name"
            )
        seen.add(key)
        try:
            settings = TrainSettings.from_dict({**config["train"], **run["train"]}, f"runs[{i}].train")
            run_settings.append(settings)
        except SentembError as e:
            raise SentembError(f"invalid configuration in {source}: config key {e}") from None
        where = f"invalid configuration in {source}: config key 'runs[{i}].train'"
        try:
            settings.check(where)
        except SentembError as e:  # named by the top-level train where that alone is refused for the same reason
            try:
                TrainSettings.from_dict(config["train"], "train").check(f"invalid configuration in {source}: config key 'train'")
            except SentembError as top:
                if str(top).split(": ", 2)[-1] == str(e).split(": ", 2)[-1]:
                    raise top from None
            raise
        from ..methods.base import check_fusable

        check_fusable(registry()[run["method"]], settings, f"{where} (run '{run['name']}')")
    for m in config["methods"]:
        if m not in registry():
            raise SentembError(
                f"invalid configuration in {source}: config key 'methods.{m}': unknown method "
                f"(registered: {sorted(registry())})"
            )
    # Method arguments against each method's declared Args (errors name the key).
    try:
        for m, margs in config["methods"].items():
            registry()[m].validate_args(margs, f"methods.{m}")
        for i, run in enumerate(config["runs"]):
            registry()[run["method"]].validate_args(run["method_args"], f"runs[{i}].method_args")
    except SentembError as e:
        raise SentembError(f"invalid configuration in {source}: config key {e}") from None
    # A method's rules across its arguments and against the config (``Method.check``), on every
    # run's resolved arguments; a study's point is named by its study.
    try:
        for i, run in enumerate(config["runs"]):
            cls = registry()[run["method"]]
            where = (f"studies[{run['study']}] point {json.dumps(run['point'], sort_keys=True)}: method_args"
                     if run["study"] else f"runs[{i}].method_args")
            margs = _method_args(cls, run["method"], config["methods"], run["method_args"], f"runs[{i}].method_args")
            args = cls.make_args(margs)
            cls.check(args, config, where)
            cls.check_train(args, run_settings[i], f"{where.rsplit(': ', 1)[0]} (run '{run['name']}')"
                            if run["study"] else f"runs[{i}] (run '{run['name']}')")
            # runs[].weights start the encoder the job loads; a stage of its own (trained from the backbone)
            # or a checkpoint named in the method's arguments would replace it without a word
            own = margs.get("aux_checkpoint") not in (None, "model")  # a checkpoint of its own, not the loaded model
            if run["weights"] is not None and ("pretrained" in cls.requires(args) or own):
                raise SentembError(
                    f"runs[{i}].weights: '{run['weights']}' would be replaced by the method's "
                    f"{'aux_checkpoint' if own else 'pretraining stage (trained from the backbone)'}"
                    f"; use it with arguments that start from the loaded model (InfoCSE: aux_checkpoint: model, "
                    "or init: backbone)")
    except SentembError as e:
        raise SentembError(f"invalid configuration in {source}: config key {e}") from None
    return config


def known_corpora(config: dict | Config) -> list[str]:
    """Corpus names a run may train on: the configured ``corpus.name`` and the built-in ones."""
    return _known_corpora(Config.of(config).corpus.name)


def _known_corpora(name: str) -> list[str]:
    from ..data.fetch import BUILTIN_CORPORA

    return [name] + [c for c in BUILTIN_CORPORA if c != name]


def load_config(path: str | os.PathLike, overrides: dict | None = None) -> dict:
    """Read a YAML config file, apply ``overrides`` (a nested dict), validate and return it."""
    path = Path(path)
    config = read_config_file(path)
    if overrides:
        _deep_update(config, overrides)
    return validate_config(config, source=str(path))


def read_config_file(path: str | os.PathLike) -> dict:
    """The mapping a YAML config file holds, unvalidated; a syntax error names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise SentembError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:  # a stream: YAML's marks then name the file, not "<unicode string>"
            config = yaml.safe_load(f) or {}
    except UnicodeDecodeError as e:
        raise SentembError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise SentembError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(config, dict):
        raise SentembError(f"config file {path} must hold a mapping at the top level")
    return config


def merge_configs(paths: list[str | os.PathLike]) -> dict:
    """Several config files merged as Snakemake merges ``--configfile``s: each later file updates the
    mapping so far, nested mappings key by key."""
    merged: dict = {}
    for path in paths:
        _deep_update(merged, read_config_file(path))
    return merged


def _deep_update(base: dict, upd: dict) -> dict:
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


def _spec(run: dict | RunSpec) -> RunSpec:
    """A ``runs`` entry as the tree holds it (a validated mapping's entry is converted)."""
    return run if isinstance(run, RunSpec) else build(RunSpec, run)


def find_run(config: dict | Config, name: str, backbone: str) -> RunSpec:
    """The configured run ``name`` on ``backbone`` (``runs[].name`` defaults to the method's name)."""
    cfg = Config.of(config)
    for run in cfg.runs:
        if cfg.run_name(run) == name and run.backbone == backbone:
            return run
    raise SentembError(f"no run named '{name}' on backbone '{backbone}' in config key 'runs'")


def corpus_of(config: dict | Config, run: dict | RunSpec) -> str:
    """The name of the corpus a run trains on (``runs[].corpus``, default ``corpus.name``)."""
    return Config.of(config).corpus_of(_spec(run))


def _method_args(cls, method: str, methods: dict, method_args: dict, where: str) -> dict[str, Any]:
    """Method ``method``'s (class ``cls``) declared defaults, then ``methods.<method>`` (of the
    mapping ``methods``), then the run's ``method_args``: the one resolution, for a validated
    mapping's run (``validate_config``) and the tree's (``method_args_of``)."""
    base = cls.resolve_args(methods.get(method, {}), where=f"methods.{method}")
    cls.validate_args(method_args, where)
    return {**base, **method_args}


def method_args_of(config: dict | Config, run: dict | RunSpec) -> dict[str, Any]:
    """A run's method arguments: the method's declared defaults, then ``methods.<method>``, then
    the run's ``method_args`` (each layer validated, errors naming the key)."""
    from ..methods import get_method

    cfg, spec = Config.of(config), _spec(run)
    cls = get_method(spec.method)
    i = next((k for k, r in enumerate(cfg.runs) if r is spec), None)
    if i is None and spec is not run:  # a mapping's entry: the equal one of the tree
        i = next((k for k, r in enumerate(cfg.runs) if r == spec), None)
    where = f"runs[{i}].method_args" if i is not None else "method_args"
    return _method_args(cls, spec.method, cfg.methods, spec.method_args, where)


def run_requires(config: dict | Config, run: dict | RunSpec) -> tuple[str, ...]:
    """The inputs (``INPUT_NAMES``) the method of configured ``run`` declares with its arguments."""
    from ..methods import get_method

    cfg, spec = Config.of(config), _spec(run)
    cls = get_method(spec.method)
    return cls.requires(cls.make_args(method_args_of(cfg, spec)))


def input_path(config: dict | Config, name: str, *, corpus: str, backbone: str, method: str) -> str:
    """Where the workflow puts input ``name`` (its ``sentemb.stats.inputs`` entry's ``path``, given
    the layout and the config tree)."""
    from ..stats.inputs import get_input

    cfg = Config.of(config)
    kind = get_input(name, f"method '{method}' requires")
    return kind.path(Layout.of(cfg), cfg, corpus, backbone, method)


def run_inputs(config: dict | Config, name: str, backbone: str) -> dict[str, str]:
    """Every input the method of run ``name`` on ``backbone`` declares (``Method.requires(args)``),
    name -> path. The train rule's ``input:`` and ``resolve_run``'s ``paths.inputs`` both come from
    here, so the DAG and the run cannot disagree."""
    cfg = Config.of(config)
    run = find_run(cfg, name, backbone)
    needed = run_requires(cfg, run)
    corpus = cfg.corpus_of(run)
    return {n: input_path(cfg, n, corpus=corpus, backbone=backbone, method=run.method) for n in needed}


def resolve_run(config: dict | Config, name: str, backbone: str, seed: int, *, method: str | None = None,
                train: dict | None = None, method_args: dict | None = None, corpus: str | None = None,
                inputs: dict | None = None, **extra) -> Run:
    """The complete, self-contained settings of one training job (``Run.to_dict()`` is what
    ``sentemb train`` reads and MLflow records as params). ``train`` = the config's ``train``
    updated by the run's. A pretraining stage (``sentemb.train.pretrain.resolve_pretrain``) gives its
    own ``method``, ``train``, ``method_args``, ``corpus``, ``inputs`` and ``extra`` fields
    (``run_name``, ``rule``) instead of a configured run's."""
    import dataclasses

    cfg = Config.of(config)
    run = weights = None
    if method is None:
        run = find_run(cfg, name, backbone)
        weights = run.weights
        method, corpus = run.method, cfg.corpus_of(run)
        train = {**cfg.train.to_dict(), **run.train}
        method_args, inputs = method_args_of(cfg, run), run_inputs(cfg, name, backbone)
    settings = TrainSettings.from_dict(copy.deepcopy(train))
    from ..methods import get_method, method_source

    paths = Layout.of(cfg).job_paths(corpus, backbone, inputs, token_cache=settings.token_cache, weights=weights)
    sts = cfg.sts_corpus
    if corpus == "sts-unlabeled" and ((sts.pairs, sts.duplicates) != ("scored", "drop") or sts.max_sentences):
        # the same file, other sentences than before sts_corpus existed: in the fingerprint, so that a state
        # saved on the old corpus does not resume on this one (at the old form the key is absent, as before);
        # a sample (sts_corpus.max_sentences) adds its size and seed
        paths["corpus_form"] = f"pairs={sts.pairs},duplicates={sts.duplicates}" + (
            f",max_sentences={sts.max_sentences},seed={sts.sample_seed}" if sts.max_sentences else "")
    source = method_source(get_method(method))  # a method from the user's code: its code's digest
    if source:
        extra = {"method_module": source[0], "method_digest": source[1], **extra}
    return Run(
        # the model the encoder starts from: runs[].weights, else the backbone
        name=name, method=method, backbone=backbone, backbone_hub_id=cfg.backbones[weights or backbone].hub_id,
        seed=int(seed), train=settings, method_args=method_args, experiment=cfg.experiment,
        # not in the fingerprint: changing it reruns nothing (rule run_options); a copy, not the tree's
        tracking=dataclasses.replace(cfg.tracking),
        corpus=corpus, **extra,
        **({k: getattr(run, k) for k in ("study", "point") if getattr(run, k) is not None}
           if run is not None else {}),  # MLflow tags
        paths=paths,
    )


# ----------------------------------------------------------------------------- what a config makes
class Job(NamedTuple):
    """One training job: a run (``name`` on ``backbone``) with one seed."""

    name: str
    backbone: str
    seed: int


def jobs(config: dict | Config) -> list[Job]:
    """Every training job of a validated config, in ``runs`` order: each run × its seeds
    (``runs[].seeds``, else ``seeds``). The Snakefile's targets, ``sentemb plan`` and the tests
    enumerate with this."""
    cfg = Config.of(config)
    return [Job(cfg.run_name(r), r.backbone, s) for r in cfg.runs for s in cfg.seeds_of(r)]


def tested(config: dict | Config) -> set[tuple[str, str]]:
    """(name, backbone) of the runs evaluated on the test sets (``runs[].evaluate``)."""
    cfg = Config.of(config)
    return {(cfg.run_name(r), r.backbone) for r in cfg.runs if r.evaluate}


def transfer_runs(config: dict | Config) -> set[tuple[str, str]]:
    """(name, backbone) of the runs with SentEval transfer tasks (``runs[].transfer``, else
    ``evaluation.transfer``; only runs that are evaluated)."""
    cfg = Config.of(config)
    return {(cfg.run_name(r), r.backbone) for r in cfg.runs if cfg.transfers(r)}


def baselines(config: dict | Config) -> list[tuple[str, str]]:
    """(backbone, pooler) of every untrained baseline (``baselines``)."""
    return [(b, p) for b, poolers in Config.of(config).baselines.items() for p in poolers]


def baseline_transfer(config: dict | Config) -> bool:
    """Do the untrained baselines get the transfer tasks? When some run does (``transfer_runs``), so
    that every transfer table has their rows, unless ``evaluation.baseline_transfer`` is false."""
    return bool(transfer_runs(config)) and Config.of(config).evaluation.baseline_transfer


# ----------------------------------------------------------------------- one evaluation job's settings
#: the evaluation jobs that read a resolved spec (``eval_spec``): STS, transfer encoding, transfer
#: classification; each rule reruns when its own kind's settings change, not another's
EVAL_KINDS = ("sts", "encode_transfer", "transfer")


def eval_spec(config: dict | Config, kind: str, backbone: str, *, name: str | None = None, seed: int | None = None,
              pooler: str | None = None) -> dict[str, Any]:
    """The resolved settings of one evaluation job (issue 28 §3), what rule ``eval_spec`` writes and
    ``sentemb evaluate`` / ``encode-transfer`` / ``evaluate-transfer --spec`` read: a trained run
    (``name``, ``seed``; its pooler is ``evaluation.pooler``, else its method's) or an untrained
    baseline (``pooler``). The keys are the commands' option names; only the settings of ``kind``
    are in it, so changing ``evaluation.transfer_classifier`` reruns no STS evaluation (the transfer
    encoding reruns only because its features are temporary)."""
    if (name is None) == (pooler is None):
        raise SentembError("eval_spec: give a run (name and seed) or a baseline's pooler, not both or neither")
    from ..methods import get_method

    if kind not in EVAL_KINDS:
        raise SentembError(f"evaluation kind '{kind}' is not one of {', '.join(EVAL_KINDS)}")
    cfg = Config.of(config)
    ev = cfg.evaluation
    if name is not None:
        run = find_run(cfg, name, backbone)
        cls = get_method(run.method)
        pooler = ev.pooler or cls.pooler_for(cls.make_args(method_args_of(cfg, run)))
        meta = {"name": name, "method": run.method, "backbone": backbone, "seed": int(seed)}
        run_name, tag = f"{'eval' if kind == 'sts' else 'transfer'}/{name}/{backbone}/seed{seed}", {}
    else:
        meta = {"name": f"untrained-{pooler}", "method": "baseline", "backbone": backbone, "seed": 0}
        run_name = f"{'baseline' if kind == 'sts' else 'baseline-transfer'}/{backbone}/{pooler}"
        tag = {"rule": "evaluate-baseline" if kind == "sts" else "evaluate-baseline-transfer"}
    if kind == "sts":
        return {"pooler": pooler, "tasks": list(ev.tasks), "setting": ev.setting, "batch_size": ev.batch_size,
                "precision": ev.precision, "run_meta": meta, "run_name": run_name, "tag": tag}
    if kind == "encode_transfer":
        return {"pooler": pooler, "tasks": list(ev.transfer_tasks), "batch_size": ev.batch_size,
                "precision": ev.precision}
    return {"pooler": pooler, "tasks": list(ev.transfer_tasks), "mrpc_features": ev.mrpc_features,
            "classifier": ev.transfer_classifier, "run_meta": meta, "run_name": run_name, "tag": tag}


def tracking_options(config: dict | Config) -> dict[str, Any]:
    """Where evaluation jobs record (``--tracking``, rule ``tracking_options``): weight-free like
    ``sentemb.config.settings.run_options``, so a new URI or experiment reruns no evaluation."""
    cfg = Config.of(config)
    return {"track": cfg.tracking.enabled, "experiment": cfg.experiment, "tracking_uri": cfg.tracking.uri}
