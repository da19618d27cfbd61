"""``sentemb plan`` (issue 20 §3): a row for every job of the DAG and a total, FLOPs against the
Transformer formula, and the flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO

TEST_CONFIG = REPO / ".test" / "config.yaml"


@pytest.fixture(scope="module")
def test_plan():
    from sentemb.config.load import load_config
    from sentemb.ops.plan import plan

    config = load_config(TEST_CONFIG)
    return config, plan(config, "h100")


def test_the_plan_has_a_row_for_every_job_of_the_dag_and_a_total(test_plan):
    from sentemb.ops.plan import format_plan
    from sentemb.stats.workflow import stats_settings

    config, rows = test_plan
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r.kind, []).append(r.job)
    # the Snakefile's jobs (sentemb.config.load: jobs, tested, baselines, as workflow/rules/common.smk reads them)
    from sentemb.config.load import baselines as baselines_of, jobs as jobs_of, tested as tested_of

    jobs = [f"{j.name}/{j.backbone}/seed{j.seed}" for j in jobs_of(config)]
    assert sorted(by_kind["train"]) == sorted(jobs)
    tested = [f"{j.name}/{j.backbone}/seed{j.seed}" for j in jobs_of(config) if (j.name, j.backbone) in tested_of(config)]
    baselines = [f"baseline/{b}/{p}" for b, p in baselines_of(config)]
    assert sorted(by_kind["evaluate"]) == sorted(tested + baselines)
    # transfer: .test sets runs[].transfer on the simcse run only (seeds 1, 2), and the baselines follow
    assert not config["evaluation"]["transfer"]
    assert sorted(by_kind["transfer"]) == ["baseline/tiny-bert/avg", "simcse/tiny-bert/seed1", "simcse/tiny-bert/seed2"]
    assert by_kind["pretrain"] == ["infocse/tiny-bert"]
    assert len(by_kind["paraphrase"]) == stats_settings(config)["paraphrase"]["shards"]
    # a transfer encoding encodes the configured tasks' sentences only (.test: TREC, 5,952 sentences)
    assert config["evaluation"]["transfer_tasks"] == ["TREC"]
    assert {r.steps for r in rows if r.kind == "transfer"} == {5952}
    # SentEval's classifier: a job without a GPU after every transfer encoding (issue 26 §4)
    assert sorted(by_kind["classify"]) == sorted(by_kind["transfer"])
    for r in rows:
        if r.kind == "classify":
            assert r.gpu_hours == 0 and r.mem_gb == 0 and 0 < r.wall_hours <= r.cpu_hours, r
            continue
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
    from sentemb.config.load import load_config
    from sentemb.ops.plan import plan
    from sentemb.ops.shapes import ARCHITECTURES

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
    # a step's time = max(FLOPs / (MFU x peak), the host floor x 12 layers x 1 pass), plus the STS-B
    # dev evaluations (fp32: half the peak); at batch 64 the floor binds (as the H200 measured)
    from sentemb.ops.plan import STEP_FLOOR_S_PER_LAYER

    assert train.flops_step / (0.5 * 989e12) < STEP_FLOOR_S_PER_LAYER * layers
    assert train.gpu_hours >= train.steps * STEP_FLOOR_S_PER_LAYER * layers / 3600
    # memory: at least weights + gradients + AdamW's moments in fp32
    assert train.mem_gb > 16 * train.params / 1e9


def test_flags_name_what_is_not_covered():
    from sentemb.ops.plan import Row, _flag

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
    from sentemb.ops.plan import plan

    with pytest.raises(SentembError, match="--gpu B300: unknown GPU"):
        plan({"job_resources": {}}, "b300")


def test_a_training_job_is_planned_with_the_chunk_and_devices_it_would_use():
    """Issue 26 §5: memory per GPU with the chunk each job would use (``train.chunk_size``, ``auto``
    solved against the GPU's memory as the loop's ``auto_chunk`` does), the share of each of
    ``train.devices``, and the chunked step's extra forward in its FLOPs."""
    import dataclasses

    from sentemb.config.load import load_config, resolve_run
    from sentemb.ops.plan import (CHUNKED_MFU_RATIO, COUNTER_COMPUTE_FACTOR, COUNTER_FLOOR_FACTOR, CUDA_ACTIVATION_RATIO,
                                  CUDA_OVERHEAD_GB, GPU_MEMORY_GB, Measure, _peak, _train_row)
    from sentemb.ops.shapes import backbone_architecture, depth

    config = load_config(TEST_CONFIG)
    r = next(r for r in config["runs"] if r["method"] == "simcse")
    base = resolve_run(config, r["name"], r["backbone"], (r["seeds"] or config["seeds"])[0])
    layers = depth(backbone_architecture(config, base.backbone))
    cpu = 1 / CUDA_ACTIVATION_RATIO  # the CPU's measured activations per CUDA byte
    m = Measure(layers=layers, flops=1e12, flops_layer=1e11, act_bytes=4e9 * cpu, act_layer=1e9 * cpu, trainable=10**8,
                frozen=0, params_layer=10**7)  # 1 GB of CUDA activations per sentence, 1.6 GB of weights and AdamW state

    def row(**train):
        run = dataclasses.replace(base, train=dataclasses.replace(base.train, **{"batch_size": 128, **train}))
        return _train_row("train", "x", run, m, 1e9, config, "H100", 0.35, 1.5, {})

    whole, auto, fixed, two = row(), row(chunk_size="auto"), row(chunk_size=16), row(chunk_size="auto", devices=2)
    static = 1.6 + CUDA_OVERHEAD_GB
    assert whole.chunk == "128" and whole.mem_gb == pytest.approx(static + 128)
    assert any("> H100 80 GB" in f for f in whole.flags)
    fits = int(0.7 * (GPU_MEMORY_GB["H100"] - static))  # the most sentences in 70% of what is left ...
    equal = lambda batch, fits: -(-batch // -(-batch // fits))  # noqa: E731 ... in the fewest equal chunks
    n = equal(128, fits)
    assert auto.chunk == f"{n}/128" and auto.mem_gb == pytest.approx(static + n) and auto.mem_gb < 80
    assert not any("GB >" in f for f in auto.flags)
    assert auto.flops_step == pytest.approx(whole.flops_step * 4 / 3)  # one more forward
    assert fixed.chunk == "16/128" and fixed.mem_gb == pytest.approx(static + 16)
    assert two.chunk == f"{equal(64, fits)}/64 x2" and two.flops_step == pytest.approx(auto.flops_step)
    assert row(chunk_size="auto", batch_size=32).chunk == "32"  # fits: no chunking, no extra forward
    assert row(chunk_size="auto", batch_size=32).flops_step == pytest.approx(whole.flops_step / 4)
    # a sentence of a tenth of a GB: batch 128 fits whole, batch 1024 is cut (sizes in bytes, as the loop)
    m = dataclasses.replace(m, act_bytes=4e8 * cpu, act_layer=1e8 * cpu)
    small = row(chunk_size="auto")
    assert small.chunk == "128" and small.mem_gb == pytest.approx(static + 12.8)
    assert small.flops_step == pytest.approx(whole.flops_step)  # no extra forward
    k = int(0.7 * (GPU_MEMORY_GB["H100"] - static) * 10)  # 70% of what is left, 0.1 GB a sentence
    assert row(chunk_size="auto", batch_size=1024).chunk == f"{equal(1024, k)}/1024"
    # floor-bound (a step of 1 GFLOP): the no-grad first pass is one pass over the batch with counter or
    # keyed masks (train.chunk_first_pass), one per chunk with stream masks or chunk_first_pass chunks
    m = dataclasses.replace(m, flops=1e9, flops_layer=1e8)
    chunks = 128 // 16
    per_pass = row().step_s
    assert row(chunk_size=16).step_s == pytest.approx(per_pass * chunks * 4 / 3)
    # counter masks' hash costs the eager floor COUNTER_FLOOR_FACTOR (measured); keyed masks are unmeasured
    for rng, cost in (("counter", COUNTER_FLOOR_FACTOR["eager"]), ("keyed", 1.0)):
        assert row(chunk_size=16, dropout_rng=rng).step_s == pytest.approx(per_pass * (chunks + 1 / 3) * cost)
    assert row(chunk_size=16, dropout_rng="counter", chunk_first_pass="chunks").step_s == pytest.approx(
        per_pass * chunks * 4 / 3 * COUNTER_FLOOR_FACTOR["eager"])
    # compute-bound (1e16 FLOPs a micro-batch of 4): the chunks' matmuls at CHUNKED_MFU_RATIO of the MFU, the
    # counter hash's arithmetic COUNTER_COMPUTE_FACTOR
    m = dataclasses.replace(m, flops=1e16, flops_layer=1e15)
    whole = row()
    assert whole.step_s == pytest.approx(1e16 * 32 / (0.35 * _peak("H100")))
    assert row(chunk_size=16).step_s == pytest.approx(whole.step_s * 4 / 3 / CHUNKED_MFU_RATIO)
    assert row(dropout_rng="counter").step_s == pytest.approx(whole.step_s * COUNTER_COMPUTE_FACTOR)


def test_the_transfer_classifier_is_planned_as_cpu_time_and_its_runtime_checked():
    """issue 26 §4: the classifier's CPU time per task (the measured 384-d seconds scaled to the
    vectors' width), its wall time on job_resources.classify.cpus, a runtime that does not cover it
    flagged, and a classify job that would hold a GPU flagged."""
    from sentemb.ops.plan import _classify_row, format_plan
    from sentemb.evaluate.transfer import CLASSIFIER_SECONDS_384, classifier_seconds

    config = {"evaluation": {"transfer_tasks": list(CLASSIFIER_SECONDS_384), "mrpc_features": "code",
                             "transfer_classifier": "pytorch"}}
    arch = {"model_type": "bert", "hidden_size": 384}
    row = _classify_row(config, "x", arch, {"gpu": 0, "runtime": 60, "mem_mb": 16000, "cpus": 4}, "H100", 1.5)
    assert row.cpu_hours * 3600 == pytest.approx(sum(CLASSIFIER_SECONDS_384.values()))
    assert row.wall_hours * 3600 == pytest.approx(154)  # SUBJ alone; the rest packed beside it
    assert row.flags == []
    one = _classify_row(config, "x", arch, {"gpu": 1, "runtime": 10, "mem_mb": 16000, "cpus": 1}, "H100", 1.5)
    assert one.wall_hours == pytest.approx(one.cpu_hours)
    assert any(f.startswith("runtime 10 min < 1.5x 9 min") for f in one.flags), one.flags
    assert any("holds 1 GPU idle" in f for f in one.flags), one.flags
    large = _classify_row(config, "x", {**arch, "hidden_size": 1024}, {"gpu": 0, "runtime": 60, "cpus": 4}, "H100", 1.5)
    assert large.cpu_hours * 3600 == pytest.approx(sum(classifier_seconds(t, 1024, mrpc_mode="code")
                                                       for t in CLASSIFIER_SECONDS_384))
    assert large.cpu_hours > 1.1 * row.cpu_hours  # a step's fixed cost is most of it (STEP_US)
    text = format_plan([row, one], "H100", 0.35)
    assert "CPU-hours of SentEval's transfer classifier (jobs without a GPU): 0.3 (2 jobs, longest 9 min" in text
    assert "total: 0.0 GPU-hours" in text


def test_the_step_time_is_compute_or_the_host_floor_and_passes_are_counted(tiny_bert_dir, tiny_corpus):
    """``step_seconds`` = max(FLOPs / (MFU x peak), floor x layers x passes), the MFU measured by width
    (``mfu_for``); the counted step's encoder passes: SimCSE 1 (both views in one forward), ArcCSE 1
    (its triplets in the views' forward, ``triplet_pass: with_views``) or 2 (``separate``, the
    default: the views, the triplets), with SAM twice that (every pass again at w + e)."""
    from dataclasses import replace

    from sentemb.ops.plan import MEASURED_MFU, STEP_FLOOR_S_PER_LAYER, _count, mfu_for, step_seconds
    from sentemb.testing import tiny_run

    assert step_seconds(1e12, 12, 1, 989e12, 0.24) == pytest.approx(12 * STEP_FLOOR_S_PER_LAYER)
    assert step_seconds(1e15, 12, 1, 989e12, 0.24) == pytest.approx(1e15 / (0.24 * 989e12))
    assert mfu_for("bert-base-uncased") == MEASURED_MFU[768] and mfu_for("roberta-large") == MEASURED_MFU[1024]
    assert mfu_for(384) == MEASURED_MFU[768] and mfu_for("roberta-large", 0.5) == 0.5

    def passes(method, args=None, **over):
        args = {"min_words": 1, **(args or {})} if method == "arccse" else {}
        run = tiny_run(tiny_bert_dir, tiny_corpus, None, method, method_args=args,
                       batch_size=4, max_steps=1, eval_at_end=False, model_selection="last", prefetch=False, **over)
        m = _count(run, None)
        return m.grad_passes, m.nograd_passes

    assert passes("simcse") == (1, 0)
    assert passes("arccse") == (2, 0)
    assert passes("arccse", {"triplet_pass": "with_views"}) == (1, 0)
    assert passes("arccse", {"triplet_pass": "with_views"}, sam_rho=0.05) == (2, 0)
    assert passes("arccse", {"triplet_pass": "separate"}) == (2, 0)
    assert passes("arccse", {"triplet_pass": "separate"}, sam_rho=0.05) == (4, 0)
    # train.graphs: a new shape's first step runs the capture check and then the step; the count is one step's
    assert passes("simcse", graphs=True) == (1, 0) and passes("arccse", sam_rho=0.05, graphs=True) == (4, 0)
    run = tiny_run(tiny_bert_dir, tiny_corpus, None, "simcse", batch_size=4, max_steps=1, eval_at_end=False,
                   model_selection="last", prefetch=False)
    eager = _count(run, None).flops
    assert _count(replace(run, train=replace(run.train, graphs=True)), None).flops == pytest.approx(eager, rel=1e-9)


# ------------------------------------------------------------------ issue 36: real lengths, floor, GPUs, shapes
def _minilm_config(tmp_path, run: dict, **over):
    from sentemb.config.load import load_config

    base = {"runs": [run], "studies": [], "baselines": {}, "evaluation": {"transfer": False},
            "stats": {"paraphrase": {"enabled": False}}, "results_dir": str(tmp_path / "results"),
            "resources_dir": str(tmp_path / "resources")}
    return load_config(TEST_CONFIG, {**base, **over})


def test_runs_that_differ_in_a_counted_train_setting_are_counted_apart(tmp_path):
    """Within one plan a step's count is reused for runs of the same shape: not across the train
    settings the counted step runs with (``COUNT_TRAIN_KEYS``: attention kernels, dropout, its masks,
    the update; eager attention saves other tensors than sdpa), but across lr and the like."""
    from sentemb.config.load import resolve_run
    import dataclasses

    from sentemb.ops.plan import COUNT_TRAIN_KEYS, Counter

    assert {"attention", "dropout", "dropout_rng", "graphs"} <= set(COUNT_TRAIN_KEYS)
    config = _minilm_config(tmp_path, {"method": "simcse", "backbone": "tiny-bert", "seeds": [1],
                                       "train": {"batch_size": 8, "max_len": 16}})
    r = resolve_run(config, "simcse", "tiny-bert", 1)
    counter = Counter(config, tmp_path / "work")
    sdpa = counter.measure(r, None, 16)
    assert counter.measure(dataclasses.replace(r, train=dataclasses.replace(r.train, lr=1e-3)), None, 16) == sdpa
    assert len(counter.counts) == 1
    eager = counter.measure(dataclasses.replace(r, train=dataclasses.replace(r.train, attention="eager")), None, 16)
    assert len(counter.counts) == 2 and eager.act_bytes != sdpa.act_bytes  # the kernels save other tensors
    counter.measure(dataclasses.replace(r, train=dataclasses.replace(r.train, dropout=0.0)), None, 16)
    assert len(counter.counts) == 3


@pytest.mark.realdata
def test_counting_corpus_lines_are_exactly_the_counted_width(tmp_path):
    """Every counting line is ``width`` tokens with its special tokens, in both stand-in families."""
    from sentemb.ops.plan import Counter
    from sentemb.ops.shapes import stand_in_tokenizer

    counter = Counter({}, tmp_path)
    for arch in ("bert-base-uncased", "roberta-base"):
        tok = stand_in_tokenizer(arch)
        for width in (16, 24, 48, 128):
            lines = counter.corpus(width).read_text().splitlines()
            assert {len(tok(x)["input_ids"]) for x in lines} == {width}, (arch, width)


@pytest.mark.realdata
def test_lengths_from_a_real_token_cache_agree_with_a_sample_of_the_text(tmp_path, shared, minilm_dir):
    """The token cache the workflow writes and the corpus text tokenized by the plan give the same
    lengths; both match what the tokenizer says of the real lines (mean 25.2 tokens, max 141)."""
    import numpy as np
    from transformers import AutoTokenizer

    from sentemb.config.paths import Layout
    from sentemb.data.tokens import TokenCache
    from sentemb.ops.plan import corpus_lengths, width_profile
    from sentemb.ops.shapes import backbone_architecture

    text = shared / "data" / "wiki1m_head.txt"
    lines = text.read_text("utf-8").splitlines()
    run = {"method": "simcse", "backbone": "tiny-bert", "seeds": [1],
           "train": {"batch_size": 32, "max_len": 512, "sampler": "length"}}
    config = _minilm_config(tmp_path, run)
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    sampled = corpus_lengths(config, "wiki-tiny", "tiny-bert", lengths_from=text)
    assert "--lengths-from" in sampled.source and "tokenizer" in sampled.source
    TokenCache.build(lines, tok, corpus=text).save(Layout.of(config).tokens("wiki-tiny", "tiny-bert"))
    cached = corpus_lengths(config, "wiki-tiny", "tiny-bert", lengths_from=text)
    assert cached.source.startswith("token cache")
    direct = np.array([len(x) for x in tok(lines)["input_ids"]])  # the tokenizer itself, specials on
    assert np.array_equal(cached.tokens, direct)
    assert len(sampled.tokens) == len(lines) and np.array_equal(np.sort(sampled.tokens), np.sort(direct))
    assert direct.mean() == pytest.approx(25.2, abs=0.1) and direct.max() == 141
    from sentemb.config.load import resolve_run

    r = resolve_run(config, "simcse", "tiny-bert", 1)
    arch = backbone_architecture(config, "tiny-bert")
    a, b = width_profile(r, arch, cached)["count"], width_profile(r, arch, sampled)["count"]
    mean = lambda p: sum(w * f for w, f in p.items())  # noqa: E731
    assert mean(b) == pytest.approx(mean(a), rel=0.05)


@pytest.mark.realdata
def test_shape_count_is_bounded_by_the_buckets_on_real_batches(tmp_path, shared, minilm_dir):
    """The plan's count of distinct main-pass widths equals that of the real padded batches (the
    token cache's ``batch`` padded by ``pad_to`` to its bucket) and is at most 8 with buckets."""
    from transformers import AutoTokenizer

    from sentemb.config.load import resolve_run
    from sentemb.data.buckets import bucket_width, resolve_buckets
    from sentemb.data.tokens import TokenCache
    from sentemb.ops.plan import Lengths, width_profile
    from sentemb.ops.shapes import backbone_architecture
    from sentemb.train.loop import batch_schedule, sentence_lengths

    lines = (shared / "data" / "wiki1m_head.txt").read_text("utf-8").splitlines()
    cache = TokenCache.build(lines, AutoTokenizer.from_pretrained(minilm_dir))
    for sampler, max_len in (("length", 512), ("random", 32), ("length", 64)):
        run = {"method": "simcse", "backbone": "tiny-bert", "seeds": [1],
               "train": {"batch_size": 32, "max_len": max_len, "sampler": sampler}}
        config = _minilm_config(tmp_path, run)
        r = resolve_run(config, "simcse", "tiny-bert", 1)
        words = sentence_lengths(lines)
        lengths = Lengths("test", cache.lengths(10**9), words, [])
        prof = width_profile(r, backbone_architecture(config, "tiny-bert"), lengths)
        buckets = resolve_buckets("auto", max_len, "cuda")
        sched = batch_schedule(len(lines), 32, 1, 0, words if sampler == "length" else None)
        real = {bucket_width(int(cache.batch(b, max_len)["input_ids"].shape[1]), buckets) for b in sched}
        assert prof["shapes"]["main"] == len(real) <= len(buckets) <= 8, (sampler, max_len)


def test_batch_building_is_timed_on_the_real_sentences_with_inputs_built_from_them(tmp_path, monkeypatch):
    """The plan times ``build_batch`` in a job of its own whose corpus is the real sentences and whose
    method inputs (UNA's paraphrase stand-ins and TF-IDF) are built from them, not from the counting
    corpus's long synthetic lines; the counted FLOPs stay the counting corpus's."""
    import dataclasses

    import pyarrow.parquet as pq

    from sentemb.config.load import resolve_run
    from sentemb.ops import plan

    real = [f"a short real sentence number {i} ." for i in range(40)]
    run = {"method": "una", "backbone": "tiny-bert", "seeds": [1], "method_args": {"paraphrase": True},
           "train": {"batch_size": 8, "max_len": 32, "max_steps": 5, "eval_steps": 10}}
    config = _minilm_config(tmp_path, run, stats={"paraphrase": {"enabled": True}})
    r = resolve_run(config, "una", "tiny-bert", 1)
    timed = []
    build = plan._build_seconds

    def spy(job_run, cls, batch_size, steps):
        timed.append((job_run, batch_size))
        return build(job_run, cls, batch_size, steps)

    monkeypatch.setattr(plan, "_build_seconds", spy)
    counter = plan.Counter(config, tmp_path / "work")
    m = counter.measure(r, None, 32, real)
    (job_run, b), = timed
    assert b == 8 and m.build_s > 0
    assert Path(job_run.paths["corpus"]).read_text("utf-8").splitlines() == real
    para = Path(job_run.paths["inputs"]["paraphrases"]).read_text("utf-8").splitlines()
    assert para == [" ".join(reversed(x.split())) for x in real]  # the stand-in, at the real lengths
    terms = set(pq.read_table(job_run.paths["inputs"]["tfidf_para"], columns=["term"]).column("term").to_pylist())
    assert terms == {w for x in real for w in x.split()}  # the TF-IDF of the real words, and of no other
    # the run reads a token cache (train.token_cache, as the workflow's runs read rule tokenize's): one
    # built for the real sentences under the backbone's tokenizer, the ids the tokenizer gives
    from sentemb.data.tokens import TokenCache
    from sentemb.model.backbone import load_tokenizer

    cache = TokenCache.load(job_run.paths["tokens"], corpus=job_run.paths["corpus"], lines=len(real))
    tok = load_tokenizer(job_run.paths["model"])
    assert cache.batch([3], 32)["input_ids"][0].tolist() == tok(real[3])["input_ids"]
    assert counter.measure(r, None, 48, real).build_s == m.build_s and len(timed) == 1  # once per shape
    # alpha decides which steps mine negatives: another alpha is timed again, the FLOP count is reused
    other = dataclasses.replace(r, method_args={**r.method_args, "alpha": 1})
    n_counts = len(counter.counts)
    counter.measure(other, None, 32, real)
    assert len(timed) == 2 and timed[1][0].method_args["alpha"] == 1 and len(counter.counts) == n_counts


def test_una_is_priced_as_its_steps_with_and_without_negatives_mixed_by_alpha(tmp_path):
    """UNA mines negatives on one step in alpha: its step's FLOPs and time are 1/alpha of a step with
    negatives (priced alone: alpha 1) and the rest of one without (``negatives: false``), each of
    those priced as a run of its own; memory is the step with negatives'."""
    import dataclasses

    from sentemb.config.load import resolve_run
    from sentemb.ops.plan import Counter, _priced_row, build_timing_steps

    text = tmp_path / "lines.txt"
    text.write_text("".join(f"a real sentence with words {i} and {i + 1} .\n" for i in range(60)), "utf-8")

    def row(**args):
        run = {"method": "una", "backbone": "tiny-bert", "seeds": [1], "method_args": args,
               "train": {"batch_size": 8, "max_len": 32, "max_steps": 20, "eval_steps": 10**6}}
        config = _minilm_config(tmp_path, run)
        r = resolve_run(config, "una", "tiny-bert", 1)
        # an MFU so low that every step is priced at its compute, not at the host floor, so times differ
        return _priced_row(Counter(config, tmp_path / "work", text), "train", "una", r, config, "H100", 1e-6, 1.5,
                           {"cpus": 8}), r

    (mixed, r5), (every, r1), (none, r0) = row(alpha=5), row(alpha=1), row(negatives=False)
    assert none.flops_step < every.flops_step and none.step_s < every.step_s  # negatives: twice the rows
    assert mixed.flops_step == pytest.approx(0.2 * every.flops_step + 0.8 * none.flops_step, rel=1e-9)
    assert mixed.step_s == pytest.approx(0.2 * every.step_s + 0.8 * none.step_s, rel=1e-9)
    # batch building is timed over whole periods of the schedule: one step in alpha with negatives
    assert [build_timing_steps(x) for x in (r5, r1, r0)] == [5, 5, 5]
    assert [build_timing_steps(dataclasses.replace(r5, method_args={**r5.method_args, "alpha": a}))
            for a in (2, 3, 7, 9)] == [6, 6, 7, 9]
    assert mixed.mem_gb == pytest.approx(every.mem_gb, rel=1e-9) and mixed.mem_gb > none.mem_gb
    # a graphed run captures each kind of step at each width: twice the shapes of a run of one kind
    assert every.shapes == none.shapes and mixed.shapes["main"] == 2 * every.shapes["main"], (mixed.shapes, every.shapes)


@pytest.mark.realdata
@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_real_length_pricing_is_the_transformer_formula_at_each_batch_s_padded_width(tmp_path, shared, minilm_dir,
                                                                                     method):
    """SimCSE and ArcCSE at max_len 512, sampled by length, on 2,976 wiki1m sentences (mean 25
    tokens): the plan's FLOPs per step are those of the Transformer formula at every batch's own
    padded width, worked out here from the tokenizer and the sampler (not from the plan's profile
    or counts): two views per sentence, and for ArcCSE three triplet rows per sentence of at least
    25 words (at the batch's width: the plan's upper bound). Far below the formula at 512; only the
    three fit widths are counted (per ArcCSE variant). The formula leaves out the MLP head and the
    in-batch similarity (< 1% at hidden 32)."""
    import numpy as np
    from transformers import AutoTokenizer

    from sentemb.config.load import resolve_run
    from sentemb.data.buckets import bucket_width, resolve_buckets
    from sentemb.ops.plan import FIT_WIDTHS, Counter, _priced_row
    from sentemb.train.loop import batch_schedule

    lines = [ln for ln in (shared / "data" / "wiki1m_head.txt").read_text("utf-8").splitlines() if ln.strip()][:2976]
    text = tmp_path / "wiki-2976.txt"  # 93 full batches: the plan prices every batch at batch_size
    text.write_text("\n".join(lines) + "\n", "utf-8")
    batch, max_len = 32, 512
    run = {"method": method, "backbone": "tiny-bert", "seeds": [1],
           "train": {"batch_size": batch, "max_len": max_len, "sampler": "length", "max_steps": 20, "eval_steps": 10}}
    config = _minilm_config(tmp_path, run)
    r = resolve_run(config, method, "tiny-bert", 1)
    counter = Counter(config, tmp_path / "work", text)
    row = _priced_row(counter, "train", method, r, config, "H100", None, 1.5, {"cpus": 8})
    assert "--lengths-from" in row.lengths and "tokenizer" in row.lengths
    # independently: every batch's longest sentence in tokens, padded to its bucket; its rows
    tokens = np.array([len(x) for x in AutoTokenizer.from_pretrained(minilm_dir)(lines)["input_ids"]])
    words = np.array([len(s.split()) for s in lines])
    ladder = resolve_buckets("auto", max_len, "cuda")
    sched = batch_schedule(len(lines), batch, 1, 0, words)
    widths = np.array([bucket_width(int(min(tokens[b].max(), max_len)), ladder) for b in sched])
    rows = np.array([2 * batch + (3 * int((words[b] >= 25).sum()) if method == "arccse" else 0) for b in sched])
    a = config["backbones"]["tiny-bert"]["random_init"]
    h, layers, inter = a["hidden_size"], a["num_hidden_layers"], a["intermediate_size"]

    def formula(n, L):  # n rows of L tokens: dense 6N per token, attention 12·layers·h·L per token
        return n * L * (6 * layers * (4 * h * h + 2 * h * inter) + 12 * layers * h * L)

    assert row.flops_step == pytest.approx(np.mean([formula(n, L) for n, L in zip(rows, widths)]), rel=0.02)
    assert 24 <= widths.mean() <= 64 and row.flops_step < 0.2 * formula(rows.mean(), max_len)
    assert row.widths == pytest.approx({int(w): float((widths == w).mean()) for w in np.unique(widths)}, abs=1e-4)
    counted = [w for _, w, _ in counter.counts]
    assert sorted(set(counted)) == list(FIT_WIDTHS) and len(counted) == 3 * (2 if method == "arccse" else 1)
    assert 0 < row.floor_hours <= row.gpu_hours and row.build_s > 0
    if method == "arccse":
        assert (words >= 25).mean() < 0.5  # most real sentences form no triplet (min_words 25)
        assert 1 <= row.shapes["triplets"] <= 8 and row.shapes["main"] <= 8


@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_the_width_fit_predicts_a_direct_count(tmp_path, method):
    """A step's FLOPs and saved activations are a + b·L + c·L² in the width L: the quadratic through
    the three counted fit widths gives a fourth width's direct count within 1% (exactly, in fact).
    ArcCSE (every sentence forming a triplet) at max_len 16 with triplets to 64: above max_len the
    main rows stay at 16 and only the triplet rows grow, a second segment fitted on its own. (Its
    ``triplet_pass`` is pinned to ``separate``, the default: ``auto`` encodes the triplets with the
    views up to max_len and apart above it, the same FLOPs at max_len but 1.4% other saved
    activations, which the segment's quadratic through max_len then misses.)"""
    from sentemb.config.load import resolve_run
    from sentemb.ops.plan import WIDTH_FIELDS, Counter, fitted_measures, quadratic_through

    assert quadratic_through({1: 6, 2: 17, 3: 34}) == (1, 2, 3)  # 1 + 2L + 3L²
    arccse = method == "arccse"
    run = {"method": method, "backbone": "tiny-bert", "seeds": [1],
           "method_args": {"min_words": 1, "triplet_max_len": 64, "triplet_pass": "separate"} if arccse else {},
           "train": {"batch_size": 32, "max_len": 16 if arccse else 64}}
    config = _minilm_config(tmp_path, run)
    r = resolve_run(config, method, "tiny-bert", 1)
    counter = Counter(config, tmp_path / "work")
    fit = fitted_measures(counter, r, [24, 40, 48, 56])
    assert [w for _, w, _ in counter.counts] == [16, 32, 64]
    direct = counter.measure(r, None, 48)
    for f in WIDTH_FIELDS:
        assert getattr(fit[48], f) == pytest.approx(getattr(direct, f), rel=0.01), f
    assert (fit[48].grad_passes, fit[48].nograd_passes) == (direct.grad_passes, direct.nograd_passes)
    if arccse:  # the fit is no straight line: the triplet rows' attention is quadratic
        assert fit[56].flops - fit[48].flops > fit[48].flops - fit[40].flops


def test_floor_is_below_the_estimate_and_is_the_counted_flops_at_peak(test_plan):
    from sentemb.ops.plan import format_plan

    config, rows = test_plan
    for r in rows:
        if r.kind == "classify":
            continue
        assert 0 < r.floor_hours <= r.gpu_hours, r
    for r in rows:
        if r.kind == "train":  # at least the training steps' FLOPs at 989 TFLOP/s
            assert r.floor_hours * 3600 >= r.flops_step * r.steps / 989e12 * (1 - 1e-9)
    last = format_plan(rows, "H100", None).splitlines()[-1]
    floor = float(last.split("; floor ")[1].split(" GPU-hours")[0])
    assert floor == pytest.approx(sum(r.floor_hours for r in rows), abs=0.05)
    assert "estimate/floor" in last


def test_dev_evaluation_share_is_printed_and_flagged(test_plan, tmp_path):
    """The share is the dev evaluations' time over the job's: per evaluation the H200's measured
    seconds of BERT-base in the run's eval precision, scaled by the encoder's forward FLOPs against
    BERT-base's; recomputed here from the job's own schedule."""
    from sentemb.config.load import jobs, resolve_run
    from sentemb.ops.plan import DEV_EVAL_SECONDS, Counter, format_plan
    from sentemb.train.loop import eval_due

    config, rows = test_plan
    text = format_plan(rows, "H100", None)
    assert "dev%" in text.splitlines()[0] and "STS-B dev evaluation" in text
    train = [r for r in rows if r.kind == "train"]
    assert all(r.dev_share is not None and 0 <= r.dev_share < 1 for r in train)
    for r in train:
        if r.dev_share > 0.10:
            assert any(f.startswith("dev eval") for f in r.flags)
    job = jobs(config)[0]
    run = resolve_run(config, job.name, job.backbone, job.seed)
    (row,) = [r for r in train if r.job == f"{job.name}/{job.backbone}/seed{job.seed}"]
    evals = sum(eval_due(run.train, s, run.train.grad_accum, row.steps) for s in range(1, row.steps + 1)) \
        if run.train.selects_by_dev else 0
    (ev,) = [r for r in rows if r.kind == "evaluate" and r.job == row.job] or [None]
    assert ev is not None and evals > 0, "the test config's first job should evaluate on dev"
    base = Counter(config, tmp_path).encode("bert-base-uncased")[0]
    secs = DEV_EVAL_SECONDS["fp32" if run.train.eval_precision == "fp32" else "bf16"]
    dev_h = evals * secs * ev.flops_step / base / 3600
    assert row.dev_share * row.gpu_hours == pytest.approx(dev_h, rel=1e-6)


def test_every_known_gpu_is_accepted_and_an_unknown_one_names_them():
    from sentemb import SentembError
    from sentemb.ops.benchmark import PEAK_BF16_TFLOPS
    from sentemb.ops.plan import GPU_MEMORY_GB, Row, _flag, _peak, plan

    assert set(GPU_MEMORY_GB) == set(PEAK_BF16_TFLOPS) and len(GPU_MEMORY_GB) >= 6
    for name in GPU_MEMORY_GB:
        for spelled in (name, name.lower()):
            assert _peak(spelled) == PEAK_BF16_TFLOPS[name] * 1e12
            row = _flag(Row("train", "x", mem_gb=GPU_MEMORY_GB[name] + 1), spelled, {}, 1.5)
            assert any(f"> {spelled.upper()} {GPU_MEMORY_GB[name]} GB" in f for f in row.flags)
    with pytest.raises(SentembError) as e:
        plan({"job_resources": {}}, "b300")
    assert all(n in str(e.value) for n in GPU_MEMORY_GB)


@pytest.mark.realdata
def test_minilm_is_planned_from_its_model_directory(tmp_path, minilm_dir):
    """A backbone without a published architecture (all-MiniLM-L6-v2 in config/demo.yaml) takes its
    shape from the model directory's config.json: the plan's parameter count is the real
    checkpoint's."""
    import json

    from safetensors import safe_open

    from sentemb.config.load import load_config
    from sentemb.ops.plan import plan
    from sentemb.ops.shapes import backbone_architecture

    demo = REPO / "config" / "demo.yaml"
    over = {"mirror": str(minilm_dir.parents[1]), "runs": [{"method": "simcse", "backbone": "minilm", "seeds": [1],
                                                             "train": {"max_steps": 2, "eval_steps": 100}}],
            "studies": [], "baselines": {}, "evaluation": {"transfer": False},
            "stats": {"paraphrase": {"enabled": False}}, "results_dir": str(tmp_path / "r"),
            "resources_dir": str(tmp_path / "res")}
    config = load_config(demo, over)
    arch = backbone_architecture(config, "minilm")
    real = json.loads((minilm_dir / "config.json").read_text())
    assert (arch["hidden_size"], arch["num_hidden_layers"]) == (real["hidden_size"], real["num_hidden_layers"]) == (384, 6)
    with safe_open(str(minilm_dir / "model.safetensors"), "pt") as f:
        n = sum(f.get_slice(k).get_shape().numel() if hasattr(f.get_slice(k).get_shape(), "numel")
                else __import__("math").prod(f.get_slice(k).get_shape()) for k in f.keys() if "pooler" not in k
                and "position_ids" not in k)
    rows = plan(config, "a100-40", work=tmp_path)
    (train,) = [r for r in rows if r.kind == "train"]
    (ev,) = [r for r in rows if r.kind == "evaluate" and r.job.startswith("simcse")]
    assert ev.params == n
    assert "tokenizer" in train.lengths and train.floor_hours <= train.gpu_hours


# ------------------------------------------------------------------ issue 39: a frozen copy of the encoder
def test_a_frozen_full_copy_of_the_encoder_is_counted_at_the_real_depth(tmp_path, tiny_bert_dir, tiny_corpus):
    """ESimCSE's momentum encoder (a frozen full copy, examples/methods/esimcse.py) is built at the
    probe's 2 layers: scaled to BERT-base's 12 it is as large as the encoder (+ its momentum MLP),
    and its no-grad forward is a pass of the step. InfoCSE's frozen ``aux_lower`` (the lower
    ``skip_from`` layers) has a fixed depth and is counted as built."""
    import random

    from sentemb.methods import get_method, import_method_module
    from sentemb.ops.plan import _count, encoder_copies
    from sentemb.ops.shapes import ARCHITECTURES, parameter_count, write_model_dir
    from sentemb.testing import tiny_run

    import_method_module(str(REPO / "examples" / "methods" / "esimcse.py"), "test")
    model = write_model_dir("bert-base-uncased", tmp_path / "bert-base-2", num_layers=2)
    corpus = tmp_path / "corpus.txt"
    rng = random.Random(0)
    corpus.write_text("".join(" ".join(rng.choice(["the", "a", "dog", "cat", "man"]) for _ in range(6)) + "\n"
                              for _ in range(16)))
    run = tiny_run(model, corpus, None, "esimcse", method_cls=get_method("esimcse"), batch_size=4, max_len=12,
                   max_steps=1, eval_at_end=False, model_selection="last", prefetch=False)
    m = _count(run, None)
    h, encoder = ARCHITECTURES["bert-base-uncased"]["hidden_size"], parameter_count("bert-base-uncased")
    at = m.at(12)
    assert m.frozen_layer == m.params_layer > 0
    assert at["frozen"] - encoder in (0, h * h + h)  # the momentum encoder (+ the momentum MLP)
    assert at["trainable"] - encoder in (0, h * h + h)
    assert (m.grad_passes, m.nograd_passes) == (1, 1)  # the momentum encoder's forward of the sentences

    run = tiny_run(tiny_bert_dir, tiny_corpus, None, "infocse", batch_size=4, max_steps=1, eval_at_end=False,
                   model_selection="last", prefetch=False, method_args={"skip_from": 1, "init": "backbone",
                                                                        "head_layers": 1})
    m = _count(run, None)
    from sentemb.model.backbone import load_encoder

    enc, _ = load_encoder(tiny_bert_dir, pooling_layer=False)
    lower = sum(p.numel() for n, p in enc.named_parameters() if not n.startswith("encoder.layer.1."))
    assert m.frozen == lower and m.frozen_layer == 0  # embeddings + 1 layer, whatever the depth
    assert encoder_copies(enc, enc) == []


@pytest.mark.realdata
def test_the_sts_corpus_is_made_from_the_mirrors_senteval_data_when_not_prepared(tmp_path, shared, monkeypatch):
    """PaSeR's ``sts-unlabeled`` corpus, not prepared yet, is made for the plan's lengths and batch
    timing as the workflow makes it (config sts_corpus: ConSERT's loader), into the temporary folder: its
    89,192 lines; with ``sts_corpus: {pairs: scored, duplicates: drop}`` 30,840; with ``max_sentences``
    the workflow's sample."""
    import tempfile

    from sentemb.ops.plan import STS_UNLABELED_LINES, corpus_text_files

    config = _minilm_config(tmp_path, {"method": "simcse", "backbone": "tiny-bert", "seeds": [1]})
    config.pop("sts_corpus", None)  # .test's sample of it: the default form first
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (path, what), = corpus_text_files(config, "sts-unlabeled")
    assert "sts-unlabeled made from" in what and path.parent == tmp_path / "tmp"
    assert len(path.read_text("utf-8").splitlines()) == STS_UNLABELED_LINES
    path.write_text("cut short\n", "utf-8")  # a file that is not what its summary says is made again
    (again, _), = corpus_text_files(config, "sts-unlabeled")
    assert again == path and len(path.read_text("utf-8").splitlines()) == STS_UNLABELED_LINES == 89_192
    config["sts_corpus"] = {"pairs": "scored", "duplicates": "drop"}
    (other, _), = corpus_text_files(config, "sts-unlabeled")
    assert other != path and len(other.read_text("utf-8").splitlines()) == 30_840
    # sts_corpus.max_sentences: the sample the workflow's prepare-sts-corpus makes, line for line
    from sentemb.data.fetch import prepare_sts_corpus

    config["sts_corpus"] = {"max_sentences": 1000, "sample_seed": 2}
    (sample, _), = corpus_text_files(config, "sts-unlabeled")
    prepare_sts_corpus(shared / "data" / "senteval", tmp_path / "made.txt", keep_duplicates=True, unscored=True,
                       max_sentences=1000, seed=2)
    assert sample.read_text("utf-8") == (tmp_path / "made.txt").read_text("utf-8")
    assert len(sample.read_text("utf-8").splitlines()) == 1000


def test_a_terminated_plan_removes_its_work_folder(tmp_path):
    """SIGTERM (``timeout``, ``kill``, Slurm) ends ``sentemb plan`` as Ctrl-C does: exit 143, a line
    saying so, and its temporary folder (model copies, corpora, inputs: 1.6 GB for the paper
    configuration) removed on the way out."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "sentemb", "plan", "--config", str(REPO / "config" / "demo.yaml")],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not any(tmp_path.glob("sentemb-plan-*/model-*")) and p.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "the plan ended before it could be stopped"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 143, err[-2000:]
    assert "sentemb plan: terminated (SIGTERM)" in err
    assert not [d for d in tmp_path.glob("sentemb-plan-*") if d.is_dir()]


def test_threads_sets_torchs_threads_for_the_counts(monkeypatch):
    """``sentemb plan --threads N`` (a loaded login node: 1 is faster) counts with N torch threads;
    0 is refused naming the option."""
    import torch

    from sentemb.cli import main
    from sentemb.cli import plan as cli_plan

    seen = []
    monkeypatch.setattr(cli_plan, "plan", lambda *a, **k: seen.append(torch.get_num_threads()) or [])
    monkeypatch.setattr(cli_plan, "format_plan", lambda *a, **k: "")
    before = torch.get_num_threads()
    try:
        assert main(["plan", "--config", str(REPO / "config" / "demo.yaml"), "--threads", "1"]) == 0
        assert seen == [1]
        with pytest.raises(SystemExit) as e:  # argparse refuses it (sentemb.cli.argtypes.positive_int)
            main(["plan", "--config", str(REPO / "config" / "demo.yaml"), "--threads", "0"])
        assert e.value.code == 2 and seen == [1]
    finally:
        torch.set_num_threads(before)


def test_a_prepared_sts_corpus_of_another_form_is_not_read(tmp_path):
    """A prepared ``sts-unlabeled`` whose summary says another form than config ``sts_corpus`` (one from
    before the key: scored pairs, deduplicated) will be made again, so the plan prices the configured
    form's line count; the same form is read."""
    import json

    from sentemb.config.load import load_config
    from sentemb.ops.plan import corpus_lines

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "sts-unlabeled.txt").write_text("a\nb\n", "utf-8")
    (tmp_path / "corpus" / "sts-unlabeled.txt.json").write_text(json.dumps({"sentences": 2, "keep_duplicates": False}))
    paper = REPO / "config" / "config.yaml"
    assert corpus_lines(load_config(paper, {"resources_dir": str(tmp_path)}), "sts-unlabeled") == 89_192
    old = {"resources_dir": str(tmp_path), "sts_corpus": {"pairs": "scored", "duplicates": "drop"}}
    assert corpus_lines(load_config(paper, old), "sts-unlabeled") == 2
    # a sample (sts_corpus.max_sentences): its size unprepared, the prepared file only for the same sample
    sample = {"resources_dir": str(tmp_path), "sts_corpus": {"max_sentences": 500, "sample_seed": 3}}
    assert corpus_lines(load_config(paper, sample), "sts-unlabeled") == 500  # the whole corpus not prepared
    (tmp_path / "corpus" / "sts-unlabeled.txt.json").write_text(json.dumps(
        {"sentences": 2, "keep_duplicates": True, "unscored": True, "max_sentences": 500, "seed": 3}))
    assert corpus_lines(load_config(paper, sample), "sts-unlabeled") == 2
    for other, want in (({"max_sentences": 500, "sample_seed": 4}, 500), ({"max_sentences": 400, "sample_seed": 3}, 400),
                        ({}, 89_192)):
        got = corpus_lines(load_config(paper, {"resources_dir": str(tmp_path), "sts_corpus": other}), "sts-unlabeled")
        assert got == want, other


_COUNTED_FIELDS = ("kind", "job", "params", "flops_step", "steps", "mem_gb", "host_gb", "floor_hours", "chunk",
                   "widths", "shapes")


def test_counts_kept_on_disk_are_reused_only_for_the_same_code_and_settings(tmp_path, monkeypatch, caplog):
    """``plan(count_store=)`` (the CLI's ``--count-cache``): a second plan of the same config counts
    nothing and prices every job as the first did; other code (torch's version, the method's file), a
    counted job with other train settings (``graphs``: other work per step) or other ``stats`` settings
    keep their counts in other files; an unreadable file is counted again, said, and rewritten."""
    import dataclasses
    import json
    import logging
    from importlib import metadata

    from sentemb.config.settings import Config
    from sentemb.methods.arccse import ArcCSE
    from sentemb.methods.simcse import SimCSE
    from sentemb.ops import plan as P

    config = _minilm_config(tmp_path, {"method": "simcse", "backbone": "tiny-bert", "seeds": [1]})
    cfg, store = Config.of(config), tmp_path / "store"
    counted, puts = [], []
    real, real_put = P._count, P.CountStore.put
    monkeypatch.setattr(P, "_count", lambda *a: counted.append(a[1].__name__) or real(*a))
    monkeypatch.setattr(P.CountStore, "put", lambda self, *a: puts.append(a[:4]) or real_put(self, *a))
    first = P.plan(config, "h100", count_store=store)
    kept = sorted(store.glob("*/*.json"))
    assert counted and len(kept) == len(counted) == len(puts)  # every count kept, one file each
    assert all(set(json.loads(p.read_text())) == set(P._STORED_FIELDS) for p in kept)  # no timing kept
    key, cls, _, job = puts[0]
    assert cls is SimCSE and P.CountStore(store).path(key, cls, cfg, job) in kept
    assert "data" not in job  # no input reads data besides the corpus: the files kept before InputKind.data

    def fields(rows):
        return [{f: getattr(r, f) for f in _COUNTED_FIELDS} for r in rows]

    counted.clear()
    again = P.plan(config, "h100", count_store=store)
    assert counted == [] and fields(again) == fields(first)
    assert sorted(store.glob("*/*.json")) == kept

    # other code, another counted job, other stats settings: another file (never one that was kept)
    ours = P.CountStore(store).fingerprint(SimCSE)
    assert P.CountStore(store).fingerprint(SimCSE) == ours != P.CountStore(store).fingerprint(ArcCSE)
    with monkeypatch.context() as m:
        version = metadata.version
        m.setattr(metadata, "version", lambda lib: "0.0" if lib == "torch" else version(lib))
        assert P.CountStore(store).fingerprint(SimCSE) != ours
        assert P.CountStore(store).path(key, cls, cfg, job) not in kept
    graphed = {**job, "train": {**job["train"], "graphs": not job["train"]["graphs"]}}
    assert P.CountStore(store).path(key, cls, cfg, graphed) not in kept
    other_stats = dataclasses.replace(cfg, stats=dataclasses.replace(cfg.stats, corpus_report=not cfg.stats.corpus_report))
    assert P.CountStore(store).path(key, cls, other_stats, job) not in kept

    # an unreadable count: counted again (and said), the file rewritten whole
    counted.clear()
    kept[0].write_text('{"layers": 2, "flo')
    with caplog.at_level(logging.WARNING, logger="sentemb.ops.plan"):
        mended = P.plan(config, "h100", count_store=store)
    assert len(counted) == 1 and fields(mended) == fields(first)
    assert str(kept[0]) in caplog.text and "counting again" in caplog.text
    assert set(json.loads(kept[0].read_text())) == set(P._STORED_FIELDS)
    assert not list(store.rglob("*.tmp"))


def test_a_kept_paser_count_is_keyed_on_the_nltk_data_its_inputs_read(tmp_path, shared, monkeypatch):
    """PaSeR's inputs (RAKE's stopwords, EDA's WordNet) read NLTK's data besides the corpus: a count
    kept with one copy of that data is not read back once a file of it changed (another count)."""
    import shutil

    from sentemb.config.load import resolve_run
    from sentemb.ops import plan as P
    from sentemb.stats.inputs import data_digest

    resources = tmp_path / "resources"
    shutil.copytree(shared / "nltk_data", resources / "nltk_data")
    config = _minilm_config(tmp_path, {"method": "paser", "backbone": "tiny-bert", "seeds": [1],
                                       "train": {"batch_size": 4, "max_len": 16}})
    assert data_digest("tfidf", config) is None  # built from the corpus alone
    digest = data_digest("nltk", config)
    assert digest == data_digest("rake", config) and len(digest) == 64
    jobs, counted = [], []
    real_put, real_count = P.CountStore.put, P._count
    monkeypatch.setattr(P.CountStore, "put", lambda self, *a: jobs.append(a[3]) or real_put(self, *a))
    monkeypatch.setattr(P, "_count", lambda *a: counted.append(a[1].__name__) or real_count(*a))
    store = P.CountStore(tmp_path / "store")
    run = resolve_run(config, "paser", "tiny-bert", 1)
    first = P.Counter(config, tmp_path / "w1", store=store).measure(run, None, 16)
    assert counted == ["PaSeR"] and jobs[-1]["data"] == {"rake": digest, "nltk": digest}
    again = P.Counter(config, tmp_path / "w2", store=store).measure(run, None, 16)
    assert counted == ["PaSeR"] and again.flops == first.flops  # the same data: read back
    wordnet = resources / "nltk_data" / "corpora" / "wordnet" / "lexnames"
    wordnet.write_text(wordnet.read_text() + "\n")
    assert data_digest("nltk", config) not in (None, digest)
    P.Counter(config, tmp_path / "w3", store=store).measure(run, None, 16)
    assert counted == ["PaSeR", "PaSeR"]  # other data: counted again (SimCSE's job names none: the test above)


def test_the_count_cache_folder_is_the_option_then_the_environment_then_the_user_cache(monkeypatch, tmp_path):
    """``--count-cache DIR|none``, else ``$SENTEMB_PLAN_CACHE`` (``none``: no store), else
    ``$XDG_CACHE_HOME/sentemb/plan-counts``, else ``~/.cache/sentemb/plan-counts``."""
    from sentemb.cli import main
    from sentemb.cli import plan as cli_plan
    from sentemb.ops.plan import default_count_store

    monkeypatch.delenv("SENTEMB_PLAN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_count_store() == tmp_path / "xdg" / "sentemb" / "plan-counts"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_count_store() == tmp_path / "home" / ".cache" / "sentemb" / "plan-counts"
    monkeypatch.setenv("SENTEMB_PLAN_CACHE", "None")
    assert default_count_store() is None
    monkeypatch.setenv("SENTEMB_PLAN_CACHE", str(tmp_path / "env"))
    assert default_count_store() == tmp_path / "env"

    seen = []
    monkeypatch.setattr(cli_plan, "plan", lambda *a, **k: seen.append(k["count_store"]) or [])
    monkeypatch.setattr(cli_plan, "format_plan", lambda *a, **k: "")
    demo = str(REPO / "config" / "demo.yaml")
    assert main(["plan", "--config", demo]) == 0
    assert main(["plan", "--config", demo, "--count-cache", "none"]) == 0
    assert main(["plan", "--config", demo, "--count-cache", str(tmp_path / "opt")]) == 0
    assert seen == [tmp_path / "env", None, tmp_path / "opt"]
