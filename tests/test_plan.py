"""``sentemb plan`` (issue 20 §3): a row for every job of the DAG and a total, FLOPs against the
Transformer formula, and the flags."""

from __future__ import annotations

import pytest

from conftest import REPO

TEST_CONFIG = REPO / ".test" / "config.yaml"


@pytest.fixture(scope="module")
def test_plan():
    from sentemb.config import load_config
    from sentemb.plan import plan

    config = load_config(TEST_CONFIG)
    return config, plan(config, "h100")


def test_the_plan_has_a_row_for_every_job_of_the_dag_and_a_total(test_plan):
    from sentemb.plan import format_plan
    from sentemb.stats import stats_settings

    config, rows = test_plan
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r.kind, []).append(r.job)
    # the Snakefile's jobs (workflow/rules/common.smk: JOBS, TESTED, TRANSFER_RUNS, BASELINES)
    jobs = [f"{r['name']}/{r['backbone']}/seed{s}" for r in config["runs"] for s in (r.get("seeds") or config["seeds"])]
    assert sorted(by_kind["train"]) == sorted(jobs)
    tested = [f"{r['name']}/{r['backbone']}/seed{s}" for r in config["runs"] if r.get("evaluate", True)
              for s in (r.get("seeds") or config["seeds"])]
    baselines = [f"baseline/{b}/{p}" for b, ps in (config.get("baselines") or {}).items() for p in ps]
    assert sorted(by_kind["evaluate"]) == sorted(tested + baselines)
    assert config["evaluation"]["transfer"] and sorted(by_kind["transfer"]) == sorted(tested + baselines)
    assert by_kind["pretrain"] == ["infocse/tiny-bert"]
    assert len(by_kind["paraphrase"]) == stats_settings(config)["paraphrase"]["shards"]
    for r in rows:
        assert r.params > 0 and r.flops_step > 0 and r.steps > 0 and r.gpu_hours > 0 and r.mem_gb > 0, r
    text = format_plan(rows, "H100", 0.35)
    assert all(r.job[:58] in text for r in rows)
    total = float(text.splitlines()[-1].split("total: ")[1].split(" GPU-hours")[0])
    assert total == pytest.approx(sum(r.gpu_hours for r in rows), abs=0.05)


def test_counted_simcse_step_at_real_width_matches_the_transformer_formula(tmp_path):
    """SimCSE on bert-base-uncased, counted at 2 layers and micro-batch 4 and scaled to 12 layers
    and batch 64: 6·N per token for the encoder's dense weights plus 12·layers·h·L per token for
    attention (PaLM App. B), two views per sentence, every sentence max_len tokens. Left out of
    the formula: the MLP head and the 2B×2B similarity (< 0.1%)."""
    from sentemb.config import load_config
    from sentemb.plan import plan
    from sentemb.shapes import ARCHITECTURES

    over = {"backbones": {"bert-base-uncased": {"hub_id": "google-bert/bert-base-uncased",
                                                "mirror_path": "models/bert-base-uncased"}},
            "runs": [{"method": "simcse", "backbone": "bert-base-uncased", "seeds": [1],
                      "train": {"batch_size": 64, "max_len": 32, "epochs": 1}}],
            "studies": [], "baselines": {}, "evaluation": {"transfer": False},
            "stats": {"paraphrase": {"enabled": False}}, "corpus": {"max_sentences": 6400}}
    config = load_config(TEST_CONFIG, over)
    rows = plan(config, "h100", mfu=0.5)
    (train,) = [r for r in rows if r.kind == "train"]
    a = ARCHITECTURES["bert-base-uncased"]
    h, layers, inter, max_len, batch = a["hidden_size"], a["num_hidden_layers"], a["intermediate_size"], 32, 64
    per_token = 6 * layers * (4 * h * h + 2 * h * inter) + 12 * layers * h * max_len
    assert train.flops_step == pytest.approx(batch * 2 * max_len * per_token, rel=0.01)
    assert train.steps == 100  # 6400 sentences / 64
    assert train.params == pytest.approx(108_891_648 + h * h + h, rel=1e-6)  # + SimCSE's MLP head
    # GPU-hours = FLOPs / (MFU x peak), plus the STS-B dev evaluations (fp32: half the peak)
    assert train.gpu_hours >= train.flops_step * train.steps / (0.5 * 989e12) / 3600
    # memory: at least weights + gradients + AdamW's moments in fp32
    assert train.mem_gb > 16 * train.params / 1e9


def test_flags_name_what_is_not_covered():
    from sentemb.plan import Row, _flag

    row = _flag(Row("train", "x", params=1, gpu_hours=2.0, mem_gb=100.0, host_gb=10.0), "H100",
                {"runtime": 120, "mem_mb": 12000}, 1.5)
    assert any(f.startswith("runtime 120 min") for f in row.flags)
    assert any(f.startswith("mem_mb 12000") for f in row.flags)
    assert any("> H100 80 GB" in f for f in row.flags)
    ok = _flag(Row("train", "y", params=1, gpu_hours=1.0, mem_gb=20.0, host_gb=10.0), "H100",
               {"runtime": 240, "mem_mb": 32000}, 1.5)
    assert ok.flags == []


def test_unknown_gpu_is_refused():
    from sentemb import SentembError
    from sentemb.plan import plan

    with pytest.raises(SentembError, match="--gpu B300: unknown GPU"):
        plan({"job_resources": {}}, "b300")
