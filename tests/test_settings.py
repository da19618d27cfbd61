"""Issue 19 §1: every setting declared once (``sentemb.settings``), the schema generated from it, a
resolved run a typed ``Run`` whose mapping form and resume fingerprint did not change."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import yaml

from conftest import REPO

from sentemb import SentembError
from sentemb.args import specs
from sentemb.config import load_config, load_schema, resolve_run, validate_config
from sentemb.settings import SECTIONS, EvaluationSettings, JobResources, Run, StatsSettings, TrainSettings

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
    and the raw YAML schema declares none of these keys itself (one source)."""
    raw = yaml.safe_load((REPO / "src/sentemb/schemas/config.schema.yaml").read_text())
    assert raw["properties"][section] in ({}, None)
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
    assert list(s.to_dict())[:2] == ["lr", "batch_size"]  # the given order first (run config JSON)


def test_stats_and_evaluation_defaults_are_the_classes():
    assert StatsSettings().paraphrase.model.hub_id == "tuner007/pegasus_paraphrase"
    assert EvaluationSettings().precision == "fp32" and "STSBenchmark" in EvaluationSettings().tasks
    from sentemb.stats.workflow import stats_settings

    s = stats_settings({"runs": [], "stats": {"paraphrase": {"shards": 2}}})
    assert s["paraphrase"]["shards"] == 2 and s["paraphrase"]["num_beams"] == 10 and s["rake_top_k"] == 5


#: sha256 of ``run_fingerprint(resolve_run(...))`` and of ``json.dumps(run dict, indent=2)`` for every
#: run of .test/config.yaml, computed on main at d9c806b (before the settings classes), where
#: resolve_run returned the dict itself: this is what decides whether a saved state resumes, and the
#: run config JSON (Snakemake's params of rule run_config): neither may change.
BEFORE = {
    "simcse/tiny-bert/1": ("38c3ebbe4de61747dd47f8a790fa93a68885723912f4575697efb5af9b423b12", "428bf1aa877fde43"),
    "simcse/tiny-bert/2": ("62e7098f3697723ced72e523bec7ce54db732527bee657ce9ee74e413f536981", "1966ec34ea960893"),
    "sarcse/tiny-bert/1": ("8f3b76872b3f00d26664f08d18979a3a4ab367907036181f47205d1002ebea66", "879505f6c2bd12ee"),
    "una/tiny-bert/1": ("9b907145311eb6d9292b27353beb021f6ee9239f859a3ee2cee9c5181e834ffe", "a03cdcbbd72a9f87"),
    "una-para/tiny-bert/1": ("da872b9dc1fd819238644a2730ae5671cb2d034e2d9bbcef30f03a4230e99a8e", "d9d9fe6d19079ef0"),
    "paser/tiny-bert/1": ("88c4be900a3e86001013fdfe9ec1cc9427b880cbc70d8488e3842ebeb3f66e1a", "3c92e374601c10f0"),
    "infocse/tiny-bert/1": ("3b9a89d7e014f1b2747e8e549530ca508fc4f56d2a6a5be16b48fcfbf36b3cb9", "e89070526e102470"),
    "arccse/tiny-bert/1": ("6be64df18c4df95536fddbe6cb56a4582def2bed165a177a88f08bf63b02b18f", "960c262b658f4d30"),
    "pretrain/infocse/tiny-bert": ("34fa89b87ab4d66afb79e5e3761d561b1f5d2b08a2f11b741ee54c727a7fc65f",
                                   "f5102d3ec3df8548"),
}


def test_resolved_runs_keep_their_fingerprint_and_json(monkeypatch):
    from sentemb.pretrain import resolve_pretrain
    from sentemb.train import run_fingerprint

    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / ".test/config.yaml")
    got = {}
    for r in (r for r in cfg["runs"] if not r.get("study")):  # the runs main had (studies came later)
        for seed in r.get("seeds") or cfg["seeds"]:
            got[f"{r['name']}/{r['backbone']}/{seed}"] = resolve_run(cfg, r["name"], r["backbone"], seed)
    got["pretrain/infocse/tiny-bert"] = resolve_pretrain(cfg, "infocse", "tiny-bert")
    assert set(got) == set(BEFORE)
    for key, run in got.items():
        assert isinstance(run, Run) and isinstance(run.train, TrainSettings)
        fp = hashlib.sha256(run_fingerprint(run).encode()).hexdigest()
        js = hashlib.sha256(json.dumps(run.to_dict(), indent=2).encode()).hexdigest()[:16]
        assert (fp, js) == BEFORE[key], key
        assert Run.from_dict(json.loads(json.dumps(run.to_dict()))).to_dict() == run.to_dict()  # JSON round trip


def test_config_readme_is_the_generated_listing():
    from sentemb.config_keys import config_keys_markdown

    text = config_keys_markdown()
    assert (REPO / "config/README.md").read_text("utf-8") == text, "run: sentemb config-keys > config/README.md"
    for key in ("`train.batch_size`", "`evaluation.precision`", "`stats.paraphrase.model.hub_id`",
                "`job_resources.pretrain.runtime`", "`methods.simcse.temperature`", "`runs[].train`"):
        assert key in text
