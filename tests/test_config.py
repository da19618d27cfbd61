"""Config validation: defaults filled from the schema, errors that name the key."""

import pytest
import yaml

from sentemb import SentembError
from sentemb.config.load import load_config, resolve_run

REPO_CONFIGS = ["config/config.yaml", "config/demo.yaml", ".test/config.yaml"]


@pytest.mark.parametrize("path", REPO_CONFIGS)
def test_shipped_configs_validate(path, monkeypatch):
    from conftest import REPO

    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / path)
    for run in cfg["runs"]:
        r = resolve_run(cfg, run["name"], run["backbone"], cfg["seeds"][0])
        assert r.train.batch_size >= 2
        if run["method"] == "simcse" and not run.get("study"):  # a study may vary it
            assert r.method_args["temperature"] == 0.05


def test_paper_config_follows_methods_md():
    from conftest import REPO

    cfg = load_config(REPO / "config/config.yaml")
    bert = resolve_run(cfg, "simcse", "bert-base-uncased", 42).train
    roberta = resolve_run(cfg, "simcse", "roberta-base", 42).train
    assert (bert.batch_size, bert.lr, bert.max_len, bert.eval_steps) == (64, 3e-5, 32, 125)
    assert (roberta.batch_size, roberta.lr) == (512, 1e-5)
    assert bert.grad_clip == 1.0 and bert.warmup_ratio == 0 and bert.weight_decay == 0


def _write(tmp_path, cfg):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


BASE = {"backbones": {"b": {"hub_id": "x/b"}}, "runs": [{"method": "simcse", "backbone": "b"}]}


@pytest.mark.parametrize("patch,key", [
    ({"train": {"lr": "fast"}}, "train.lr"),
    ({"train": {"batch_size": 1}}, "train.batch_size"),
    ({"evaluation": {"tasks": ["STS99"]}}, "evaluation.tasks[0]"),
    ({"runs": [{"method": "simcse", "backbone": "nope"}]}, "runs[0].backbone"),
    ({"runs": [{"method": "bogus", "backbone": "b"}]}, "runs[0].method"),
    # a study beside a bad run: the run's key is named, not a bare "unknown method" from the expansion
    ({"runs": [{"method": "bogus", "backbone": "b"}],
      "studies": [{"name": "t", "method": "simcse", "backbone": "b", "vary": {"method_args.temperature": [0.1]}}]},
     "runs[0].method"),
    ({"studies": [{"name": "t", "method": "bogus", "backbone": "b", "vary": {"method_args.temperature": [0.1]}}]},
     "studies[0].method"),
    ({"trian": {}}, "<top level>"),
    ({"runs": [{"method": "simcse", "backbone": "b", "train": {"lrr": 1}}]}, "runs[0].train"),
])
def test_errors_name_the_key(tmp_path, patch, key):
    with pytest.raises(SentembError) as e:
        load_config(_write(tmp_path, {**BASE, **patch}))
    assert f"'{key}'" in str(e.value)


def test_a_refused_combination_names_the_train_block_it_comes_from(tmp_path):
    """The top-level ``train`` where it alone is refused for the reason the run is; the run's
    ``runs[i].train`` where its own keys make the refusal; a non-fusable method's run under
    ``fuse_micro_batches`` at load, not when its job starts."""
    runs = [{"method": "simcse", "backbone": "b", "train": {"unpad": False}},
            {"method": "una", "backbone": "b", "train": {"unpad": False}}]

    def err(cfg):
        with pytest.raises(SentembError) as e:
            load_config(_write(tmp_path, {**BASE, **cfg}))
        return str(e.value)

    got = err({"train": {"graphs": True, "unpad": True}})
    assert "config key 'train': train.graphs cannot be combined with train.unpad" in got, got
    load_config(_write(tmp_path, {**BASE, "train": {"graphs": True, "unpad": True}, "runs": runs}))  # every run overrides it
    runs[1]["train"]["precision"] = "fp16"
    got = err({"train": {"graphs": True, "unpad": True}, "runs": runs})
    assert "config key 'runs[1].train': train.graphs cannot be combined with train.precision fp16" in got, got
    got = err({"train": {"fuse_micro_batches": 2, "grad_accum": 2}, "runs": runs[:1] + [{"method": "una", "backbone": "b"}]})
    assert "config key 'runs[1].train' (run 'una'): train.fuse_micro_batches 2: method 'una' does not declare" in got, got


def test_pasers_decoder_dropout_under_compiled_counter_masks_is_refused_at_load(tmp_path):
    """``Method.check_train``: PaSeR's torch-layout decoder (``nn.MultiheadAttention`` with attention
    dropout) in a compiled run with counter masks, refused when the config loads, naming the run and
    the keys (the loop's set-up refused it only when the job started); BART's layout, no decoder
    dropout, or stream masks load; a study's point is named by its study."""
    paser = {"method": "paser", "backbone": "b", "corpus": "sts-unlabeled"}
    over = {"train": {"compile": True, "dropout_rng": "counter"}}

    def load(runs, **extra):
        return load_config(_write(tmp_path, {**BASE, **over, "runs": runs, **extra}))

    with pytest.raises(SentembError) as e:
        load([{"method": "simcse", "backbone": "b"}, paser])
    assert ("config key runs[1] (run 'paser'): train.compile with train.dropout_rng counter cannot serve the "
            "attention dropout of PaSeR's decoder (method_args.decoder_dropout_layout torch, decoder_dropout 0.1)"
            in str(e.value)), str(e.value)
    load([{**paser, "method_args": {"decoder_dropout_layout": "bart"}}])
    load([{**paser, "method_args": {"decoder_dropout": 0.0}}])
    load([{**paser, "train": {"dropout_rng": "stream"}}])
    study = {"name": "layout", "method": "paser", "backbone": "b", "corpus": "sts-unlabeled",
             "vary": {"method_args.decoder_dropout_layout": ["bart", "torch"]}}
    with pytest.raises(SentembError, match=r"studies\[layout\] point \{\"decoder_dropout_layout\": "
                                           r"\"torch\"\} \(run 'layout/decoder_dropout_layout=torch'\): train\.compile with"):
        load([{**paser, "method_args": {"decoder_dropout_layout": "bart"}}], studies=[study])


def test_unknown_method_argument_is_rejected(tmp_path):
    with pytest.raises(SentembError, match=r"methods\.simcse\.temprature: unknown argument of method 'simcse'"):
        load_config(_write(tmp_path, {**BASE, "methods": {"simcse": {"temprature": 0.1}}}))


@pytest.mark.parametrize("block, msg", [
    ({"methods": {"simcse": {"temperature": "0.05"}}}, r"methods\.simcse\.temperature: '0\.05' is not a number"),
    ({"methods": {"simcse": {"mlp": "sometimes"}}}, r"methods\.simcse\.mlp: 'sometimes' is not one of"),
    ({"runs": [{"method": "simcse", "backbone": "b", "method_args": {"tmperature": 1.0}}]},
     r"runs\[0\]\.method_args\.tmperature: unknown argument of method 'simcse'"),
    ({"runs": [{"method": "simcse", "backbone": "b", "method_args": {"temperature": True}}]},
     r"runs\[0\]\.method_args\.temperature: True is not a number"),
])
def test_typed_method_arguments_name_the_key(tmp_path, block, msg):
    with pytest.raises(SentembError, match=msg):
        load_config(_write(tmp_path, {**BASE, **block}))


def test_method_defaults_then_methods_block_then_run_args(tmp_path):
    from sentemb.methods import get_method

    cfg = load_config(_write(tmp_path, {**BASE, "methods": {"simcse": {"temperature": 0.1}},
                                        "runs": [{"method": "simcse", "backbone": "b", "method_args": {"mlp": "none"}}]}))
    run = resolve_run(cfg, "simcse", "b", 1)
    assert run.method_args == {"temperature": 0.1, "mlp": "none"}
    assert get_method("simcse").arg_defaults() == {"temperature": 0.05, "mlp": "train_only"}
    assert run.paths["inputs"] == {}


def test_not_yaml_and_missing_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("runs: [unclosed\n")
    with pytest.raises(SentembError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(SentembError, match="not found"):
        load_config(tmp_path / "none.yaml")


def test_check_config_merges_files_as_snakemake_and_names_the_line_or_key(tmp_path, capsys, monkeypatch):
    """``sentemb check-config``: several files update each other key by key (Snakemake's --configfile
    merge), the summary counts the merged config's jobs, a YAML syntax error names file, line and column
    (Snakemake's own message names none), a bad setting its key; exit 2 on an error."""
    from conftest import REPO

    from sentemb.cli import main
    from sentemb.config.load import jobs, merge_configs

    monkeypatch.chdir(REPO)
    demo = load_config("config/demo.yaml")
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text("seeds: [1, 2, 3]\ntrain: {lr: 1.0e-4}\n")
    merged = merge_configs(["config/demo.yaml", seeds])
    assert merged["seeds"] == [1, 2, 3] and merged["train"]["lr"] == 1.0e-4
    demo_text = yaml.safe_load(open("config/demo.yaml"))
    assert {k: v for k, v in merged["train"].items() if k != "lr"} == \
        {k: v for k, v in demo_text["train"].items() if k != "lr"}  # the demo's other train keys kept
    # the demo's text: 6 runs and one study of 3 points, none with seeds of its own; each on 3 seeds now
    assert len(demo_text["runs"]) == 6 and [len(v) for s in demo_text["studies"] for v in s["vary"].values()] == [3]
    assert not any("seeds" in r for r in demo_text["runs"] + demo_text["studies"])
    assert main(["check-config", "config/demo.yaml", str(seeds)]) == 0
    assert "training jobs (runs x seeds): 27" in capsys.readouterr().out
    assert main(["check-config", "config/demo.yaml"]) == 0
    assert f"training jobs (runs x seeds): {len(jobs(demo))}" in capsys.readouterr().out
    # the demo's transfer task is SimCSE's alone: no baseline row (evaluation.baseline_transfer), which
    # a config layered on it turns back on
    from sentemb.config.load import baseline_transfer, transfer_runs

    assert transfer_runs(demo) == {("simcse", "minilm")} and not baseline_transfer(demo)
    back = tmp_path / "back.yaml"
    back.write_text("evaluation: {baseline_transfer: true}\n")
    assert baseline_transfer(merge_configs(["config/demo.yaml", back]))

    broken = tmp_path / "broken.yaml"
    broken.write_text("seeds: [1, 2]\ntrain:\n  lr: 1e-4\n   batch_size: 8\n")
    assert main(["check-config", "config/demo.yaml", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f'"{broken}", line 4, column' in err and "<unicode string>" not in err
    with pytest.raises(SentembError, match=f'{broken}.*line 4, column'):
        load_config(broken)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train: {batch_size: -4}\n")
    assert main(["check-config", "config/demo.yaml", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "train.batch_size" in err and str(wrong) in err
