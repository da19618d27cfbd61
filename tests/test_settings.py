"""Issue 19 §1: every setting declared once (``sentemb.settings``), the schema generated from it, a
resolved run a typed ``Run`` whose mapping form and resume fingerprint did not change."""

from __future__ import annotations

import dataclasses
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


def test_a_setting_added_at_its_old_behaviour_reruns_nothing_and_runs_round_trip(monkeypatch):
    """Issue 28 §2 (replacing the golden hashes of the run JSON): a train setting added with the
    default that computes what was computed before (``OMIT_AT_DEFAULT``: left out of the run's JSON;
    ``ADDED_DEFAULTS``: left out of the fingerprint) changes neither the JSON nor the fingerprint when
    given explicitly at that value, and does at any other; every resolved run survives a JSON round
    trip; and a run's fingerprint is that of its JSON (the train job's view)."""
    import dataclasses

    from sentemb.pretrain import resolve_pretrain
    from sentemb.settings import ADDED_DEFAULTS, OMIT_AT_DEFAULT, fingerprint

    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / ".test/config.yaml")
    runs = [resolve_run(cfg, r["name"], r["backbone"], seed) for r in cfg["runs"] for seed in r.get("seeds") or cfg["seeds"]]
    runs.append(resolve_pretrain(cfg, "infocse", "tiny-bert"))
    others = {"chunk_size": 8, "dropout_rng": "keyed", "devices": 2, "sampler": "length", "eval_unit": "micro_batches"}
    for run in runs:
        assert isinstance(run, Run) and isinstance(run.train, TrainSettings)
        again = Run.from_dict(json.loads(json.dumps(run.to_dict())))
        assert again.to_dict() == run.to_dict() and fingerprint(again) == fingerprint(run)
        for key, old in {**OMIT_AT_DEFAULT, **ADDED_DEFAULTS}.items():
            # the run as written before the key existed (no such key) and with the key at its old value
            at_old = dataclasses.replace(run, train=dataclasses.replace(run.train, **{key: old}))
            before = at_old.to_dict()
            before["train"] = {k: v for k, v in before["train"].items() if k != key}
            before = Run.from_dict(before)
            assert fingerprint(at_old) == fingerprint(before), (run.name, key)
            if key in OMIT_AT_DEFAULT:
                assert at_old.to_dict() == before.to_dict(), (run.name, key)
            moved = dataclasses.replace(run, train=dataclasses.replace(run.train, **{key: others[key]}))
            if key in ADDED_DEFAULTS:  # the weight-changing ones: another value is another run
                assert fingerprint(moved) != fingerprint(at_old), (run.name, key)


def test_config_readme_is_the_generated_listing():
    from sentemb.config_keys import config_keys_markdown

    text = config_keys_markdown()
    assert (REPO / "config/README.md").read_text("utf-8") == text, "run: sentemb config-keys > config/README.md"
    for key in ("`train.batch_size`", "`evaluation.precision`", "`stats.paraphrase.model.hub_id`",
                "`job_resources.pretrain.runtime`", "`methods.simcse.temperature`", "`runs[].train`"):
        assert key in text
