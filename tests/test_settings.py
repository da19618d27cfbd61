"""Issue 19 §1: every setting declared once (``sentemb.config.settings``), the schema generated from it, a
resolved run a typed ``Run`` whose mapping form and resume fingerprint did not change."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import REPO

from sentemb import SentembError
from sentemb.config.fields import specs
from sentemb.config.load import jobs, load_config, load_schema, resolve_run, validate_config
from sentemb.config.settings import SECTIONS, EvaluationSettings, JobResources, Run, StatsSettings, TrainSettings

BASE = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": "simcse", "backbone": "b"}]}


def _leaves(cls, obj=None, prefix=""):
    """(dotted key, spec, default) of every leaf setting of a settings class."""
    out = []
    for s in specs(cls):
        value = getattr(obj, s.name) if obj is not None else s.default
        if dataclasses.is_dataclass(value):
            out += _leaves(type(value), value, f"{prefix}{s.name}.")
        else:
            out.append((f"{prefix}{s.name}", s, value))
    return out


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_schema_section_is_the_settings_class(section):
    """Keys, defaults, allowed values: what validation fills in is exactly the dataclass's defaults,
    and no hand-written schema is left beside the classes (one source)."""
    assert not list((REPO / "src").rglob("*.schema.*"))
    # workflow/schemas holds only the generated schema (test_the_workflow_schema_file_is_the_generated_schema)
    assert sorted(p.name for p in (REPO / "workflow/schemas").iterdir()) == ["config.schema.yaml"]
    filled = validate_config(json.loads(json.dumps(BASE)))[section]
    cls = SECTIONS[section]
    want = {}
    for key, _, default in _leaves(cls):
        d = want
        *head, last = key.split(".")
        for h in head:
            d = d.setdefault(h, {})
        d[last] = default
    assert filled == want
    schema = load_schema()["properties"][section]
    for key, spec, _ in _leaves(cls):
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        assert node.get("description"), f"{section}.{key} has no help"
        if spec.choices and not key.endswith("tasks"):
            assert node["enum"] == list(spec.choices)


def test_run_train_overrides_have_no_defaults_and_the_same_keys():
    props = load_schema()["properties"]
    top, run = props["train"]["properties"], props["runs"]["items"]["properties"]["train"]["properties"]
    assert list(top) == list(run) == [s.name for s in specs(TrainSettings)]
    assert all("default" not in p for p in run.values())
    assert {k: p["default"] for k, p in top.items()} == {s.name: s.default for s in specs(TrainSettings)}


@pytest.mark.parametrize("config,key", [
    ({"train": {"batch_size": 1}}, "'train.batch_size'"),
    ({"train": {"sampler": "sorted"}}, "'train.sampler'"),
    ({"evaluation": {"tasks": ["STS99"]}}, r"'evaluation.tasks\[0\]'"),
    ({"stats": {"paraphrase": {"shards": 0}}}, "'stats.paraphrase.shards'"),
    ({"stats": {"paraphrase": {"model": {"sha256": "abc"}}}}, "'stats.paraphrase.model.sha256'"),
    ({"job_resources": {"train": {"gpus": 1}}}, "'job_resources.train'"),
    ({"runs": [{"method": "simcse", "backbone": "b", "train": {"lr": 0}}]}, r"'runs\[0\].train.lr'"),
])
def test_validation_names_the_bad_key(config, key):
    with pytest.raises(SentembError, match=key):
        validate_config({**json.loads(json.dumps(BASE)), **config})


def test_a_partly_given_resource_kind_takes_that_kinds_defaults():
    """The rules read job_resources only (no fallback of their own): a key left out of a kind is the
    kind's default from JobResources, not another number."""
    cfg = validate_config({**json.loads(json.dumps(BASE)), "job_resources": {"train": {"runtime": 10}}})
    assert cfg["job_resources"]["train"] == {"gpu": 1, "runtime": 10, "mem_mb": 32000, "cpus": 8}
    assert cfg["job_resources"]["evaluate"]["mem_mb"] == JobResources().evaluate.mem_mb == 16000
    rules = "".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk"))
    import re

    assert 'res("' in rules and not re.search(r'res\("\w+", "\w+"\) (or|if)', rules)


def test_train_settings_from_a_mapping_name_the_key():
    with pytest.raises(SentembError, match=r"runs\[2\]\.train\.lrr: unknown argument of train"):
        TrainSettings.from_dict({"lrr": 1}, "runs[2].train")
    with pytest.raises(SentembError, match=r"train\.precision: 'fp8' is not one of"):
        TrainSettings.from_dict({"precision": "fp8"})
    s = TrainSettings.from_dict({"lr": 1e-4, "batch_size": 8})
    assert (s.lr, s.batch_size, s.epochs) == (1e-4, 8, 1)
    assert list(s.to_dict())[:2] == ["epochs", "max_steps"]  # declaration order (the fingerprint sorts keys)


def test_stats_and_evaluation_defaults_are_the_classes():
    assert StatsSettings().paraphrase.model.hub_id == "tuner007/pegasus_paraphrase"
    assert EvaluationSettings().precision == "fp32" and "STSBenchmark" in EvaluationSettings().tasks
    from sentemb.stats.workflow import stats_settings

    s = stats_settings({"runs": [], "stats": {"paraphrase": {"shards": 2}}})
    assert s["paraphrase"]["shards"] == 2 and s["paraphrase"]["num_beams"] == 10 and s["rake_top_k"] == 5


def test_a_setting_added_at_its_old_behaviour_reruns_nothing_and_runs_round_trip(monkeypatch):
    """Issue 28 §2 (replacing the golden hashes of the run JSON): a train setting added with the
    default that computes what was computed before (``ADDED_DEFAULTS``, left out of the fingerprint at
    that value; or weight-free, left out at any value) changes no fingerprint when given explicitly at
    that value, and a weight-changing one does at any other; every resolved run survives a JSON round
    trip; and a run's fingerprint is that of its JSON (the train job's view)."""
    import dataclasses

    from sentemb.train.pretrain import resolve_pretrain
    from sentemb.config.settings import ADDED_DEFAULTS, fingerprint, weight_free_keys

    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / ".test/config.yaml")
    runs = [resolve_run(cfg, *job) for job in jobs(cfg)]
    runs.append(resolve_pretrain(cfg, "infocse", "tiny-bert"))
    others = {"chunk_size": 8, "dropout_rng": "keyed", "devices": 2, "sampler": "length", "eval_unit": "micro_batches",
              "buckets": [16], "workers": 2, "eval_precision": "bf16", "graphs": True, "fuse_micro_batches": 2,
              "compile_mode": "max-autotune-no-cudagraphs", "compile_random": "inductor", "update": "fused",
              "attention": "sdpa_math", "dev_max_len": 32,
              "optimizer": "adamw_hf", "tf32": False}
    for run in runs:
        assert isinstance(run, Run) and isinstance(run.train, TrainSettings)
        again = Run.from_dict(json.loads(json.dumps(run.to_dict())))
        assert again.to_dict() == run.to_dict() and fingerprint(again) == fingerprint(run)
        for key, old in {"chunk_size": None, "devices": 1, **ADDED_DEFAULTS}.items():
            # the run as written before the key existed (no such key) and with the key at its old value
            at_old = dataclasses.replace(run, train=dataclasses.replace(run.train, **{key: old}))
            before = at_old.to_dict()
            before["train"] = {k: v for k, v in before["train"].items() if k != key}
            before = Run.from_dict(before)
            if key == "attention":  # its default moved to auto (another kernel on CUDA): unwritten, another run
                assert before.train.attention == "auto" and fingerprint(at_old) != fingerprint(before), run.name
            else:
                assert fingerprint(at_old) == fingerprint(before), (run.name, key)
            moved = dataclasses.replace(run, train=dataclasses.replace(run.train, **{key: others[key]}))
            if key in ADDED_DEFAULTS and key not in weight_free_keys():  # weight-changing: another value, another run
                assert fingerprint(moved) != fingerprint(at_old), (run.name, key)
            else:
                assert fingerprint(moved) == fingerprint(at_old), (run.name, key)


def test_config_readme_is_the_generated_listing():
    from sentemb.config.reference import config_keys_markdown

    text = config_keys_markdown()
    assert (REPO / "config/README.md").read_text("utf-8") == text, "run: sentemb config-keys > config/README.md"
    for key in ("`train.batch_size`", "`evaluation.precision`", "`stats.paraphrase.model.hub_id`",
                "`job_resources.pretrain.runtime`", "`methods.simcse.temperature`", "`runs[].train`"):
        assert key in text


def test_the_workflow_schema_file_is_the_generated_schema():
    """workflow/schemas/config.schema.yaml (where the Snakemake catalog, editors and Snakemake's validate
    look) is ``sentemb config-schema --yaml``: current, and the schema sentemb validates with (issue 39)."""
    import yaml

    from sentemb.cli.config_keys import config_schema_yaml
    from sentemb.config.load import load_schema

    path = REPO / "workflow" / "schemas" / "config.schema.yaml"
    text = config_schema_yaml()
    assert path.read_text("utf-8") == text, "run: sentemb config-schema --yaml > workflow/schemas/config.schema.yaml"
    assert yaml.safe_load(text) == load_schema()


# --------------------------------------------------------------------- issue 28 §1: one typed tree
def test_the_whole_schema_is_generated_from_the_typed_tree():
    """Every top-level key is a field of ``Config`` with its help, the schema is ``schema_of(Config)``
    (no section written by hand), and a validated config reads as attributes with its defaults."""
    from sentemb.config.settings import Config, TrackingSettings

    schema = load_schema()
    fields = [f.name for f in dataclasses.fields(Config)]
    assert list(schema["properties"]) == fields and schema["required"] == ["backbones", "runs"]
    assert schema["properties"]["runs"]["items"]["required"] == ["method", "backbone"]
    assert all(p.get("description") for p in schema["properties"].values())
    cfg = Config.of(validate_config({**json.loads(json.dumps(BASE)), "tracking": {"uri": "sqlite:///x.db"}}))
    assert cfg.tracking == TrackingSettings(enabled=True, uri="sqlite:///x.db", wait_s=None)
    run = cfg.runs[0]
    assert (run.name, run.evaluate, run.transfer, run.seeds, run.corpus) == ("simcse", True, None, None, None)
    assert cfg.seeds_of(run) == [42] and cfg.corpus_of(run) == "wiki1m" and not cfg.transfers(run)
    assert cfg.backbones["b"].hub_id == "x/y" and cfg.backbones["b"].random_init is None
    assert cfg.job_resources.train.gpu == 1 and cfg.evaluation.batch_size == 128


def test_jobs_tested_transfer_runs_and_baselines_enumerate_the_config():
    """The job enumeration the Snakefile, ``plan`` and the tests share, against a hand-listed config:
    per-run seeds, a dev-only run, a per-run transfer switch over evaluation.transfer, a study's
    points (one reusing an existing run), baselines."""
    from sentemb.config.load import Job, baselines, jobs, tested, transfer_runs

    config = {
        "backbones": {"b": {"hub_id": "x/y"}, "c": {"hub_id": "x/z"}},
        "seeds": [1, 2],
        "evaluation": {"transfer": True},
        "runs": [{"method": "simcse", "backbone": "b"},
                 {"method": "simcse", "backbone": "c", "seeds": [7], "transfer": False},
                 {"method": "sarcse", "backbone": "b", "name": "cheap", "evaluate": False}],
        "studies": [{"name": "t", "method": "simcse", "backbone": "b", "seeds": [3],
                     "vary": {"method_args.temperature": [0.05, 0.1]}}],
        "baselines": {"b": ["avg", "cls"], "c": ["avg_first_last"]},
    }
    config = validate_config(config)
    assert jobs(config) == [Job("simcse", "b", 1), Job("simcse", "b", 2), Job("simcse", "b", 3),  # 0.05 = simcse
                            Job("simcse", "c", 7), Job("cheap", "b", 1), Job("cheap", "b", 2),
                            Job("t/temperature=0.1", "b", 3)]
    assert tested(config) == {("simcse", "b"), ("simcse", "c"), ("t/temperature=0.1", "b")}
    assert transfer_runs(config) == {("simcse", "b"), ("t/temperature=0.1", "b")}
    assert baselines(config) == [("b", "avg"), ("b", "cls"), ("c", "avg_first_last")]


def test_no_settings_default_is_written_twice_in_the_code():
    """Issue 28: the schema fills every default of a validated config (``Config``), so reading a
    setting with a fallback (``run.get("evaluate", True)``, ``config.get("baselines") or {}``) is a
    second, possibly different, default. None is left in ``src/`` or the workflow."""
    import re

    receivers = r"\b(config|cfg|run|r|study|spec|tracking|stats|train|evaluation|corpus|para|block|margs|settings)"
    pattern = re.compile(receivers + r"""(\[[^\]]+\])*\.get\(\s*["'][A-Za-z_]+["']\s*(,|\)\s*or\b)""")
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "workflow").rglob("*.smk"), REPO / "Snakefile",
             *(REPO / "scripts").glob("*.py")]
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text("utf-8").splitlines(), 1)
             if pattern.search(line) and not line.lstrip().startswith("#")]
    assert not found, "\n".join(found)
