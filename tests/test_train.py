"""The shared training loop: determinism, resume, best checkpoint, bad input."""

import argparse
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sentemb import SentembError
from sentemb.data.corpus import read_corpus
from sentemb.train.loop import batch_schedule, train

from conftest import assert_same_model
from conftest import simcse_run as run_cfg


def test_batch_schedule_deterministic_no_bucketing():
    a = batch_schedule(50, 16, 1, seed=3)
    assert [len(x) for x in a] == [16, 16, 16, 2]  # a trailing batch of 2 is kept, of 1 dropped
    assert sum(len(x) for x in batch_schedule(49, 16, 1, 3)) == 48
    b = batch_schedule(50, 16, 1, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(np.concatenate(a), np.concatenate(batch_schedule(50, 16, 1, seed=4)))
    two = batch_schedule(50, 16, 2, seed=3)
    assert len(two) == 8 and not np.array_equal(two[0], two[4])  # a new permutation each epoch


def test_train_writes_best_checkpoint_and_summary(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    out = tmp_path / "run"
    s = train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval), out, progress=False)
    assert s["steps"] == 6 and [h["step"] for h in s["history"]] == [2, 4, 6]
    assert s["best_dev_stsb"] == max(h["dev_stsb"] for h in s["history"])
    meta = json.loads((out / "model" / "sentemb.json").read_text())
    assert meta["step"] == s["best_step"] and meta["pooler"] == "cls_before_pooler"
    assert (out / "model" / "modules.json").is_file() and not (out / ".work").exists()
    assert json.loads((out / "train.json").read_text())["best_step"] == s["best_step"]


def test_training_changes_weights_and_is_deterministic(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=100)
    train(cfg, tmp_path / "a", progress=False)
    train(cfg, tmp_path / "b", progress=False)
    wa, wb = load_file(tmp_path / "a/model/model.safetensors"), load_file(tmp_path / "b/model/model.safetensors")
    w0 = load_file(tiny_bert_dir / "model.safetensors")
    k = "encoder.layer.0.attention.self.query.weight"
    k = k if k in wa else next(x for x in wa if "query.weight" in x)
    assert torch.equal(wa[k], wb[k])
    assert not torch.equal(wa[k], w0[k])


def test_resume_after_kill_gives_identical_model(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval)
    full = train(cfg, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "resumed", stop_after=3, progress=False)
    assert (tmp_path / "resumed/.work/last.pt").is_file() and not (tmp_path / "resumed/model").exists()
    res = train(cfg, tmp_path / "resumed", progress=False)
    assert res["history"] == full["history"]
    assert_same_model(tmp_path / "full/model", tmp_path / "resumed/model")


@pytest.mark.parametrize("log_steps", [1, 4], ids=["checked-every-step", "checked-at-log-step"])
def test_nan_loss_is_a_clear_error_and_leaves_no_output(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path,
                                                        monkeypatch, log_steps):
    from sentemb.methods.simcse import SimCSE

    orig = SimCSE.losses
    calls = {"n": 0}

    def bad(self, batch):
        calls["n"] += 1
        out = orig(self, batch)
        if calls["n"] == 3:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(SimCSE, "losses", bad)
    out = tmp_path / "run"
    with pytest.raises(SentembError, match=r"loss is nan at step 3 .*the run is fp32 already: look for a term"):
        train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, log_steps=log_steps, eval_steps=100), out,
              progress=False)
    assert not (out / "model").exists() and not (out / "train.json").exists()


def test_bad_corpus_lines_name_the_line(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"one sentence\n\xff\xfe bad\n")
    with pytest.raises(SentembError, match=r"c.txt:2: line 2 is not valid UTF-8"):
        read_corpus(p)
    p.write_text("one\n\nthree\n")
    with pytest.raises(SentembError, match=r"c.txt:2: line 2 is empty"):
        read_corpus(p)
    with pytest.raises(SentembError, match="not found"):
        read_corpus(tmp_path / "missing.txt")


def test_kill_between_checkpoints_resumes_to_the_same_result(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path,
                                                              monkeypatch):
    """A crash after the best export but before the next state save (no stop hook: a real exception)."""
    from sentemb.methods.simcse import SimCSE

    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=2, save_steps=3)
    full = train(cfg, tmp_path / "full", progress=False)
    orig, calls = SimCSE.losses, {"n": 0}

    def crash_at_5(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("node lost")
        return orig(self, batch)

    monkeypatch.setattr(SimCSE, "losses", crash_at_5)
    with pytest.raises(RuntimeError):
        train(cfg, tmp_path / "run", progress=False)
    monkeypatch.setattr(SimCSE, "losses", orig)
    assert (tmp_path / "run/.work/last.pt").is_file() and (tmp_path / "run/.work/best").is_dir()
    res = train(cfg, tmp_path / "run", progress=False)
    assert (res["best_step"], res["best_dev_stsb"]) == (full["best_step"], full["best_dev_stsb"])
    assert_same_model(tmp_path / "full/model", tmp_path / "run/model")


def test_state_from_other_settings_is_not_resumed(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run", stop_after=3, progress=False)
    changed = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, lr=5e-4)
    res = train(changed, tmp_path / "run", progress=False)
    fresh = train(changed, tmp_path / "fresh", progress=False)
    assert res["history"] == fresh["history"]  # a fresh start, not a resume with the old lr


# ------------------------------------------------------------------ issue 28 §2: one fingerprint
def test_the_fingerprint_is_the_weight_changing_settings_declared_by_each_setting(tiny_bert_dir, tiny_corpus,
                                                                                   tiny_senteval):
    """Every train setting declares whether it changes the weights (``arg(..., weights=False)``); the
    fingerprint is blind to exactly those, and to the MLflow settings, and sees every other one."""
    import dataclasses

    from sentemb.config.settings import TrainSettings, fingerprint, run_options, weight_free_keys

    base = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval)
    free = set(weight_free_keys())
    assert {"log_steps", "save_steps", "prefetch", "token_cache", "log_grad_norms", "num_threads", "device",
            "chunk_size", "devices", "buckets", "workers", "counter_kernel", "chunk_first_pass", "worker_timeout"} == free
    other = {"log_steps": 7, "save_steps": 3, "prefetch": False, "token_cache": False, "log_grad_norms": True,
             "num_threads": 1, "device": "cuda", "chunk_size": 4, "devices": 2, "buckets": [16], "workers": 2,
             "counter_kernel": "fused", "chunk_first_pass": "chunks", "worker_timeout": 5}
    for key, value in other.items():
        assert fingerprint(dataclasses.replace(base, train=dataclasses.replace(base.train, **{key: value}))) == \
            fingerprint(base), key
    # a state saved before the fingerprint had log_steps, save_steps and device in it, and no setting added
    # since: every weight-free key added later must be left out of the legacy fingerprint too
    # (LEGACY_WEIGHT_FREE), or such a state stops resuming
    from sentemb.config.settings import legacy_fingerprint

    assert set(json.loads(legacy_fingerprint(base))["train"]) & free == {"log_steps", "save_steps", "device"}
    assert fingerprint(dataclasses.replace(base, tracking={"enabled": True, "uri": "http://x"}, experiment="e",
                                           run_name="r", name="renamed")) == fingerprint(base)
    changes = {"lr": 1e-3 * 2, "batch_size": 8, "max_len": 12, "eval_steps": 3, "dropout": 0.2,
               "precision": "bf16", "sam_rho": 0.05, "sampler": "length", "grad_accum": 2, "warmup_ratio": 0.1,
               "eval_precision": "bf16"}
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    for key, value in changes.items():
        if key not in fields:
            continue
        assert fingerprint(dataclasses.replace(base, train=dataclasses.replace(base.train, **{key: value}))) != \
            fingerprint(base), key
    assert fingerprint(dataclasses.replace(base, seed=base.seed + 1)) != fingerprint(base)
    assert fingerprint(dataclasses.replace(base, method_args={**base.method_args, "temperature": 0.1})) != \
        fingerprint(base)
    assert set(run_options(base)["train"]) <= free


def test_a_state_resumes_across_a_logging_change_and_from_before_the_fingerprint(tiny_bert_dir, tiny_corpus,
                                                                                 tiny_senteval, tmp_path):
    """A state saved with log_steps 1 resumes with log_steps 2 (to the uninterrupted weights); a state
    saved by the code before ``fingerprint`` (its fingerprint had log_steps, save_steps, device in it)
    still resumes."""
    from sentemb.config.settings import legacy_fingerprint

    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval)
    full = train(cfg, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run", stop_after=3, progress=False)
    train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, log_steps=2, save_steps=50), tmp_path / "run",
          progress=False)
    assert_same_model(tmp_path / "full/model", tmp_path / "run/model")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "old", stop_after=3, progress=False)
    state = tmp_path / "old" / ".work" / "last.pt"
    state = state if state.is_file() else next((tmp_path / "old").rglob("last.pt"))
    st = torch.load(state, weights_only=False)
    st["fingerprint"] = legacy_fingerprint(cfg)
    torch.save(st, state)
    res = train(cfg, tmp_path / "old", progress=False)
    assert res["history"] == full["history"]  # resumed (a fresh start would log the first steps again: same
    assert_same_model(tmp_path / "full/model", tmp_path / "old/model")  # history), to the same weights


def test_train_options_apply_only_weight_free_settings(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    from sentemb.config.settings import apply_options, run_options

    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval)
    opts = run_options(cfg)
    opts["train"]["log_steps"] = 5
    got = apply_options(cfg, opts)
    assert got.train.log_steps == 5 and got.train.lr == cfg.train.lr
    with pytest.raises(SentembError, match=r"--options: only weight-free train settings .* not lr"):
        apply_options(cfg, {"train": {"lr": 1.0}})


# ------------------------------------------------------------------ issue 13: the fast paths
def test_a_state_saved_with_the_fast_paths_resumes_without_them_bit_identically(tiny_bert_dir, tiny_corpus,
                                                                                 tiny_senteval, tmp_path):
    """token_cache/prefetch change speed, not results: a kill under one setting resumes under the
    other (same state, same MLflow run) and ends with the weights of an uninterrupted run."""
    from sentemb.train.loop import run_fingerprint

    fast = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, token_cache=True, prefetch=True)
    slow = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, token_cache=False, prefetch=False)
    assert run_fingerprint(fast) == run_fingerprint(slow)
    full = train(fast, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(fast, tmp_path / "run", stop_after=3, progress=False)
    res = train(slow, tmp_path / "run", progress=False)
    assert res["history"] == full["history"]
    assert_same_model(tmp_path / "full/model", tmp_path / "run/model")


def test_the_workflows_token_cache_is_read_and_a_wrong_one_refused(tiny_bert_dir, tiny_corpus, tiny_senteval,
                                                                   tmp_path, monkeypatch):
    from sentemb.model.backbone import load_tokenizer
    from sentemb.data.tokens import TokenCache

    tok = load_tokenizer(tiny_bert_dir)
    TokenCache.build(read_corpus(tiny_corpus), tok, corpus=tiny_corpus).save(tmp_path / "tokens.tiny")
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=100)
    cfg.paths["tokens"] = str(tmp_path / "tokens.tiny")

    def no_tokenizer_on_a_step(*a, **k):
        raise AssertionError("the tokenizer ran during training")

    monkeypatch.setattr(TokenCache, "build", no_tokenizer_on_a_step)  # it must be loaded, not rebuilt
    with_cache = train(cfg, tmp_path / "a", progress=False)
    monkeypatch.undo()
    plain = train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=100, token_cache=False),
                  tmp_path / "b", progress=False)
    assert with_cache["history"] == plain["history"]
    other = tmp_path / "other.txt"
    other.write_text(tiny_corpus.read_text().replace("the", "a"))
    cfg.paths["corpus"] = str(other)
    with pytest.raises(SentembError, match=r"tokens.tiny/meta.json: made from another corpus"):
        train(cfg, tmp_path / "c", progress=False)
    assert not (tmp_path / "c" / "model").exists()


def test_a_build_error_in_the_prefetch_thread_reaches_the_loop(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path,
                                                                monkeypatch):
    from sentemb.methods.simcse import SimCSE

    orig = SimCSE.build_batch

    def fails_at_micro_2(self, sentences, step=0, *, lines=None, micro=0):
        if micro == 2:
            raise SentembError("bad line in micro-batch 2")
        return orig(self, sentences, step, lines=lines, micro=micro)

    monkeypatch.setattr(SimCSE, "build_batch", fails_at_micro_2)
    with pytest.raises(SentembError, match="bad line in micro-batch 2"):
        train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "model").exists()


def test_the_loops_dev_evaluation_tokenizes_the_dev_set_once(tiny_bert_dir, tiny_senteval, monkeypatch):
    """stsb_dev with the training-time embedder (Method.embedder): the second evaluation gives the
    same score without tokenizing anything."""
    from sentemb.evaluate.sts import stsb_dev
    from sentemb.methods import MethodContext, get_method
    from sentemb.model.backbone import load_encoder
    from sentemb.evaluate.senteval import load_task

    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    m = get_method("simcse")(enc, tok, {}, MethodContext(max_len=16, seed=0))
    embed = m.embedder("cls_before_pooler", torch.device("cpu"))
    dev = load_task(tiny_senteval, "STSBenchmark", "dev")
    first = stsb_dev(embed, dev)

    def no_tokenizer(*a, **k):
        raise AssertionError("the dev set was tokenized again")

    monkeypatch.setattr(type(tok), "__call__", no_tokenizer)
    assert stsb_dev(embed, dev) == first


def test_the_dev_embedder_tokenizes_the_dev_set_once(tiny_bert_dir, monkeypatch):
    from sentemb.model.encoder import Embedder
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(tiny_bert_dir)
    sents = ["the dog runs", "a man plays the guitar in the park", "the dog runs", "red car"]
    kept = Embedder(enc, tok, "cls_before_pooler", batch_size=2, keep_plan=True)
    plain = Embedder(enc, tok, "cls_before_pooler", batch_size=2)
    first = kept(sents)
    calls = []
    real_plan = kept.plan
    monkeypatch.setattr(kept, "plan", lambda uniq: calls.append(uniq) or real_plan(uniq))
    np.testing.assert_array_equal(kept(sents), first)  # the kept plan, not a new one
    assert calls == []
    np.testing.assert_array_equal(plain(sents), first)
    kept(["another sentence"])  # other sentences: a new plan
    assert calls == [["another sentence"]]


def test_compiled_loop_gives_the_eager_losses(tiny_bert_dir, tiny_corpus, tiny_senteval):
    """train.compile: true gives the losses of the eager loop to fp32 tolerance, dropout included."""
    torch._dynamo.reset()
    from sentemb.train.loop import State, run_steps, setup

    def losses(compile):
        cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, precision="fp32", compile=compile, max_steps=3,
                      model_selection="last", prefetch=False)
        with setup(cfg, "/nonexistent") as job:
            return [float(state.terms["loss"]) for state in run_steps(job, State())], job

    eager, _ = losses(False)
    compiled, job = losses(True)
    assert job.step_fn is not job.method.losses  # the compiled function ran
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)
    assert eager[0] != eager[1]  # different batches, so matching every step means something


# ------------------------------------------------- issue 18 §5: length sampler, eval cadence
def _reference_length_groups(lengths, batch_size):
    """The length multisets of the batches of one length-sampled epoch, by hand: the sorted lengths
    cut into consecutive groups of ``batch_size`` (a trailing group of one dropped)."""
    s = sorted(int(x) for x in lengths)
    groups = [s[i:i + batch_size] for i in range(0, len(s), batch_size)]
    return sorted(g for g in groups if len(g) >= 2)


def test_length_sampler_batches_are_sorted_neighbours_in_shuffled_order():
    rng = np.random.default_rng(0)
    n, bs = 203, 8
    lengths = rng.integers(1, 40, n)  # many ties
    sched = batch_schedule(n, bs, 2, seed=5, lengths=lengths)
    per_epoch = n // bs + 1  # 25 full batches + one of 3
    assert len(sched) == 2 * per_epoch
    for e in range(2):
        epoch = sched[e * per_epoch:(e + 1) * per_epoch]
        # every sentence exactly once per epoch
        assert sorted(np.concatenate(epoch).tolist()) == list(range(n))
        # each batch is a group of neighbours in length order (the same multisets as the reference)
        assert sorted(sorted(lengths[b].tolist()) for b in epoch) == _reference_length_groups(lengths, bs)
        # batches of similar length, not in length order
        lo = [int(lengths[b].min()) for b in epoch]
        assert lo != sorted(lo) and lo != sorted(lo, reverse=True)
        assert max(int(np.ptp(lengths[b])) for b in epoch) <= 3  # 203 sentences over 39 lengths, batches of 8
    assert [len(b) for b in sched].count(3) == 2
    first, second = sched[:per_epoch], sched[per_epoch:]
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))  # a new order each epoch
    again = batch_schedule(n, bs, 2, seed=5, lengths=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(sched, again))  # deterministic
    other = batch_schedule(n, bs, 2, seed=6, lengths=lengths)
    assert any(not np.array_equal(a, b) for a, b in zip(sched, other))  # seeds differ
    # ties are broken at random: with all lengths equal the batches are not corpus order
    flat = batch_schedule(40, 8, 1, seed=5, lengths=np.ones(40, dtype=int))
    assert sorted(np.concatenate(flat).tolist()) == list(range(40))
    assert not np.array_equal(np.concatenate(flat), np.arange(40))


def test_length_sampler_drops_a_trailing_batch_of_one_and_keeps_the_random_default():
    lengths = np.array([5, 1, 9, 3, 7, 2, 8, 4, 6])
    sched = batch_schedule(9, 4, 1, seed=0, lengths=lengths)
    assert sorted(len(b) for b in sched) == [4, 4]
    assert sorted(np.concatenate(sched).tolist()) == sorted(set(range(9)) - {2})  # the longest one is left out
    assert sorted(sorted(lengths[b].tolist()) for b in sched) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # without lengths the schedule is the random one of before (runs keep their data order)
    a = batch_schedule(50, 16, 1, seed=3)
    perm = np.random.default_rng([3, 0]).permutation(50)
    assert all(np.array_equal(x, perm[i * 16:(i + 1) * 16]) for i, x in enumerate(a))
    with pytest.raises(SentembError, match="3 lengths for 9 sentences"):
        batch_schedule(9, 4, 1, seed=0, lengths=lengths[:3])


def test_sentence_lengths_are_whitespace_words():
    from sentemb.train.loop import sentence_lengths

    assert sentence_lengths(["a b  c", "x", " one\ttwo "]).tolist() == [3, 1, 2]


def test_length_sampler_in_the_loop_resumes_bit_identically_with_or_without_the_token_cache(
        tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    """setup builds the length schedule from the corpus; a kill with the token cache resumes without
    it (and the other way round) to the uninterrupted run's history and weights."""
    from sentemb.train.loop import run_fingerprint, sentence_lengths, setup

    fast = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, sampler="length", token_cache=True, grad_accum=2,
                   epochs=2)
    slow = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, sampler="length", token_cache=False, grad_accum=2,
                   epochs=2)
    plain = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, grad_accum=2, epochs=2)
    assert run_fingerprint(fast) == run_fingerprint(slow) != run_fingerprint(plain)
    # a config that spells out the default resumes a state saved before the key existed
    assert run_fingerprint(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, grad_accum=2, epochs=2,
                                   sampler="random", eval_unit="optimizer_steps")) == run_fingerprint(plain)
    jobs = [setup(c, tmp_path / f"setup{i}") for i, c in enumerate((fast, slow, plain))]
    sents = read_corpus(tiny_corpus)
    want = batch_schedule(len(sents), 16, 2, 7, sentence_lengths(sents))
    for job in jobs[:2]:
        assert len(job.micro) == len(want) and all(np.array_equal(a, b) for a, b in zip(job.micro, want))
    assert any(not np.array_equal(a, b) for a, b in zip(jobs[0].micro, jobs[2].micro))
    full = train(fast, tmp_path / "full", progress=False)
    for a, b in ((fast, slow), (slow, fast)):
        out = tmp_path / f"run-{a.train.token_cache}"
        with pytest.raises(KeyboardInterrupt):
            train(a, out, stop_after=3, progress=False)
        res = train(b, out, progress=False)
        assert res["history"] == full["history"]
        assert_same_model(tmp_path / "full/model", out / "model")
    other = train(plain, tmp_path / "plain", progress=False)
    assert other["history"] != full["history"]  # the length order trained another model


def test_eval_cadence_in_micro_batches_follows_arccse_training_steps():
    from dataclasses import replace

    from sentemb.config.settings import TrainSettings
    from sentemb.train.loop import eval_due

    tc = TrainSettings(eval_steps=125, eval_unit="micro_batches", eval_at_end=False)
    # arccse-accum64 on wiki1m: 1e6 // 32 = 31250 micro-batches, 64 per update -> 488 updates
    steps = [s for s in range(1, 489) if eval_due(tc, s, 64, 488)]
    assert len(steps) == 31232 // 125 == 249 and steps[:4] == [2, 4, 6, 8] and steps[-1] == 487
    # by hand: micro-batch 125k is completed by update ceil(125k / 64)
    assert steps == sorted({math.ceil(125 * k / 64) for k in range(1, 250)})
    assert eval_due(replace(tc, eval_at_end=True), 488, 64, 488)
    # counted in optimizer steps (the default) the same run has 3 checks, none in the last quarter
    opt = TrainSettings(eval_steps=125, eval_at_end=False)
    assert [s for s in range(1, 489) if eval_due(opt, s, 64, 488)] == [125, 250, 375]
    # without accumulation both units agree; more than one multiple in one update is one check
    for s in range(1, 50):
        assert eval_due(replace(opt, eval_steps=7), s, 1, 49) == eval_due(replace(tc, eval_steps=7), s, 1, 49)
    assert [s for s in range(1, 5) if eval_due(replace(tc, eval_steps=10), s, 64, 4)] == [1, 2, 3, 4]
    assert not eval_due(replace(opt, model_selection="last"), 125, 64, 488)


def test_eval_unit_micro_batches_in_the_loop(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, grad_accum=2, epochs=4, eval_steps=3,
                  eval_unit="micro_batches", eval_at_end=False)
    s = train(cfg, tmp_path / "run", progress=False)
    # 24 micro-batches, 12 updates; checks at micro-batches 3, 6, ..., 24 -> after updates 2, 3, 5, 6, ...
    assert s["steps"] == 12 and [h["step"] for h in s["history"]] == [2, 3, 5, 6, 8, 9, 11, 12]


def test_no_dev_check_is_refused_before_training_naming_the_keys(tiny_bert_dir, tiny_corpus, tiny_senteval,
                                                                 tmp_path):
    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=100, eval_at_end=False)
    with pytest.raises(SentembError, match=r"train\.eval_steps \(100 optimizer_steps\) is beyond the run \(6 "
                                           r"optimizer steps.*train\.eval_at_end is false"):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "model").exists()


def test_a_run_without_dev_evaluation_exits_0(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path, capsys):
    """model_selection: last, eval_steps beyond the run, eval_at_end false: the final weights, exit 0
    (the closing line used to format best_dev_stsb = None and exit 1)."""
    from sentemb.cli import main

    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, eval_steps=100, eval_at_end=False,
                  model_selection="last")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert main(["train", "--run-config", str(path), "--output-dir", str(tmp_path / "out"), "--quiet",
                 "--no-track"]) == 0
    out = capsys.readouterr().out
    assert "final weights at step 6/6" in out and "model_selection: last" in out
    s = json.loads((tmp_path / "out" / "train.json").read_text())
    assert s["best_dev_stsb"] is None and s["history"] == [] and (tmp_path / "out" / "model").is_dir()


@pytest.mark.parametrize("key,good,bad", [("sampler", "length", "sorted"),
                                          ("eval_unit", "micro_batches", "updates")])
def test_sampler_and_eval_unit_in_the_schema(key, good, bad):
    from sentemb.config.fields import specs
    from sentemb.config.load import load_schema, validate_config
    from sentemb.config.settings import TrainSettings

    schema = load_schema()["properties"]
    choices = next(s.choices for s in specs(TrainSettings) if s.name == key)
    assert schema["train"]["properties"][key]["enum"] == list(choices)
    assert schema["runs"]["items"]["properties"]["train"]["properties"][key] == {
        k: v for k, v in schema["train"]["properties"][key].items() if k != "default"}
    base = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": "arccse", "backbone": "b"}]}
    default = {"sampler": "random", "eval_unit": "optimizer_steps"}[key]
    assert validate_config(dict(base))["train"][key] == default
    assert validate_config({**base, "train": {key: good}})["train"][key] == good
    with pytest.raises(SentembError, match=rf"'train\.{key}'"):
        validate_config({**base, "train": {key: bad}})
    with pytest.raises(SentembError, match=rf"'runs\[0\]\.train\.{key}'"):
        validate_config({**base, "runs": [{"method": "arccse", "backbone": "b", "train": {key: bad}}]})


def test_the_grad_norm_benchmark_times_both_variants(tiny_bert_dir, tiny_corpus):
    """``sentemb benchmark --grad-norms`` (the cost of train.log_grad_norms) runs the loop off and on."""
    from sentemb.ops.benchmark import bench_grad_norms

    r = bench_grad_norms(tiny_bert_dir, tiny_corpus, 16, steps=1, warmup=1, device=torch.device("cpu"), max_len=16,
                         precision="fp32", rounds=1)
    assert r["off"] > 0 and r["on"] > 0 and r["terms"] == ["contrastive"]


def test_the_build_benchmark_times_each_steps_batches_through_the_loops_job(tiny_bert_dir, tiny_corpus, capsys,
                                                                            monkeypatch):
    """``sentemb benchmark --build-only``: build_batch of steps 0..steps-1 of the loop's schedule, in
    order, on the job ``setup`` makes (so with the corpus's token cache), one row per method."""
    from sentemb.cli import main
    from sentemb.methods.simcse import SimCSE

    seen = []
    build = SimCSE.build_batch

    def spy(self, sentences, step=0, *, lines=None, micro=0):
        seen.append((step, self.ctx.tokens is not None, list(lines)))
        return build(self, sentences, step, lines=lines, micro=micro)

    monkeypatch.setattr(SimCSE, "build_batch", spy)
    assert main(["benchmark", "--build-only", "--model", str(tiny_bert_dir), "--corpus", str(tiny_corpus),
                 "--batch-size", "16", "--steps", "3", "--max-len", "16"]) == 0
    assert [s for s, _, _ in seen] == [*range(3, 13), 0, 1, 2] and all(cached for _, cached, _ in seen)  # warm-up first
    assert len({tuple(x) for _, _, x in seen[-3:]}) == 3  # each timed step its own sentences
    out = capsys.readouterr().out
    row = [x for x in out.splitlines() if x.startswith("simcse ")]
    assert len(row) == 1 and float(row[0].split()[1]) > 0
    from sentemb.cli.benchmark import _precision_label  # the timing headers say what `auto` ran as

    assert _precision_label(argparse.Namespace(precision="auto", device="cpu")) == "auto (fp32 here)"
    assert _precision_label(argparse.Namespace(precision="bf16", device="cpu")) == "bf16"
    assert main(["benchmark", "--build-only", "--overhead", "--model", str(tiny_bert_dir), "--corpus",
                 str(tiny_corpus)]) == 2
    assert "--build-only times build_batch alone; it cannot be combined with --overhead" in capsys.readouterr().err


def test_chunk_size_auto_is_the_whole_batch_on_cpu_and_is_reported(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path,
                                                                   caplog):
    """``train.chunk_size: auto`` on CPU: no chunking (host memory is not the bound), said in the log
    and in ``train.json``; a number at least the batch is no chunking either."""
    import logging

    with caplog.at_level(logging.INFO, logger="sentemb.train.step"):  # resolve_chunk_size logs it
        s = train(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, chunk_size="auto", max_steps=1), tmp_path / "a",
                  progress=False)
    assert s["chunk_size"] == 16 and s["chunked"] is False
    assert json.loads((tmp_path / "a/train.json").read_text())["chunk_size"] == 16
    assert any("chunk_size auto: the whole batch (16 sentences) on cpu" in r.getMessage() for r in caplog.records)


def test_auto_chunk_is_the_fewest_equal_chunks_that_fit_the_margin():
    from sentemb.train.loop import auto_chunk

    mb = 2**20
    assert auto_chunk(10 * mb, 1000 * mb, 64, margin=0.7) is None  # 70 sentences fit: the whole batch
    # 70 fit: 512 takes 8 forwards either way (7 x 70 + 22), in 8 equal chunks of 64 (one captured shape)
    assert auto_chunk(10 * mb, 1000 * mb, 512, margin=0.7) == 64
    assert auto_chunk(10 * mb, 1000 * mb, 500, margin=0.7) == 63  # 8 forwards: 7 x 63 + 59, never more than fit
    assert auto_chunk(10 * mb, 1000 * mb, 140, margin=0.7) == 70  # exactly two
    assert auto_chunk(10 * mb, 5 * mb, 512, margin=0.7) == 1  # not even one: the smallest chunk, never 0
    for batch in range(2, 300, 7):  # every answer: fits, and no fewer forwards would
        for fits in range(1, batch):
            c = auto_chunk(1, fits / 0.7 + 0.1, batch, margin=0.7)
            assert c <= fits and -(-batch // c) == -(-batch // fits), (batch, fits, c)


@pytest.mark.parametrize("value", ["big", 0, 2.5])
def test_a_bad_chunk_size_is_refused_naming_the_key(value):
    from sentemb.config.load import validate_config

    base = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": "simcse", "backbone": "b"}]}
    for good in (None, 8, "auto"):
        assert validate_config({**base, "train": {"chunk_size": good}})["train"].get("chunk_size") == good
    with pytest.raises(SentembError, match=r"train\.chunk_size"):
        validate_config({**base, "train": {"chunk_size": value}})
    with pytest.raises(SentembError, match=r"runs\[0\]\.train\.chunk_size"):
        validate_config({**base, "runs": [{"method": "simcse", "backbone": "b", "train": {"chunk_size": value}}]})


def test_the_cuda_memory_probe_is_the_peak_per_sentence_and_keeps_the_random_state(tiny_bert_dir, tiny_corpus,
                                                                                    tiny_senteval, monkeypatch):
    """``_peak_per_sentence`` (the probe behind ``chunk_size: auto`` and ``chunk_first_pass: auto`` on
    CUDA), here with torch.cuda's memory counters replaced by a fake one: the peak above the memory
    allocated before, per sentence of the first micro-batch's first ``n`` (at most the batch), and the
    random state the probe's dropout drew from put back."""
    from sentemb.train import step
    from sentemb.train.loop import micro_batches, setup

    mem = {"now": 10_000, "peak": 10_000}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: mem["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: mem.update(peak=mem["now"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mem["peak"])
    with setup(run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, max_steps=1), "/nonexistent") as job:
        seen = []

        def run(part, full, micro):
            seen.append((job.method.n_sentences(part), job.method.n_sentences(full), micro))
            mem["peak"] += 300 * job.method.n_sentences(part) + 5_000  # 300 bytes a sentence above the 10 kB
            torch.rand(3)  # a draw: the probe must put the generator back

        before = torch.get_rng_state()
        assert step._peak_per_sentence(job, micro_batches, 4, run) == 300 + 5_000 / 4
        assert seen == [(4, 16, 0)] and torch.equal(torch.get_rng_state(), before)
        assert step._peak_per_sentence(job, micro_batches, 64, run) == 300 + 5_000 / 16  # at most the batch's 16
        assert seen[-1] == (16, 16, 0)


def test_a_whole_first_pass_is_refused_with_stream_dropout():
    from sentemb.config.settings import TrainSettings

    with pytest.raises(SentembError, match="train.chunk_first_pass whole needs train.dropout_rng keyed or counter"):
        TrainSettings.from_dict({"chunk_size": 4, "chunk_first_pass": "whole"}).check("train")
    for ok in ({"dropout_rng": "counter", "chunk_first_pass": "whole"}, {"chunk_first_pass": "auto"}):
        TrainSettings.from_dict(ok).check("train")


def test_keyed_dropout_is_refused_with_unpad():
    from sentemb.config.settings import TrainSettings

    with pytest.raises(SentembError, match="train.dropout_rng keyed .* train.unpad"):
        TrainSettings.from_dict({"dropout_rng": "keyed", "unpad": True}).check("train")


def test_the_chunked_benchmark_times_both_variants(tiny_bert_dir, tiny_corpus):
    """``sentemb benchmark --chunked N``: the loop whole and in chunks of N (and keyed)."""
    from sentemb.ops.benchmark import bench_chunked

    r = bench_chunked(tiny_bert_dir, tiny_corpus, 16, steps=1, warmup=0, device=torch.device("cpu"), max_len=16,
                      precision="fp32", chunk_size=4, rounds=1, keyed=True, counter=True)
    assert set(r) == {"whole", "chunked", "whole keyed", "chunked keyed", "whole counter", "chunked counter",
                      "chunked counter per-chunk first pass"} and all(v > 0 for v in r.values())


def test_the_counter_compile_benchmark_times_both_kernels_in_processes_of_their_own(tiny_bert_dir, tiny_corpus):
    """``sentemb benchmark --counter-compile``: compiled counter dropout with the masks outside the
    compiled code and traced (``counter_kernel: inline``), whole and chunked, each row a process; here
    its chunked rows' processes without their compilations (``compile=False``: the compiled inline
    step is ``tests/test_graphs.py``'s), and a row that fails names itself."""
    from sentemb import SentembError
    from sentemb.ops.benchmark import bench_counter_compile

    r = bench_counter_compile(tiny_bert_dir, tiny_corpus, 8, steps=1, warmup=0, device=torch.device("cpu"),
                              max_len=16, precision="fp32", chunk_size=4, threads=1, compile=False, whole=False)
    assert set(r) == {("auto", 4), ("inline", 4)}, r
    assert all(first > 0 and per > 0 for first, per in r.values()), r
    with pytest.raises(SentembError, match="counter_kernel inline, chunk_size 4 failed"):
        bench_counter_compile(tiny_bert_dir, tiny_corpus, 8, steps=1, warmup=0, device=torch.device("cpu"),
                              max_len=16, precision="fp32", chunk_size=4, compile=False, kernels=("inline",),
                              whole=False, method_args={"temperature": -1.0})



def test_weights_start_the_encoder_from_another_entry_with_the_backbones_vocabulary(
        tiny_bert_dir, tiny_roberta_dir, tiny_corpus, tiny_senteval, tmp_path):
    """``runs[].weights`` (InfoCSE's Condenser start): the encoder starts from that checkpoint, not the
    backbone's (lr 1e-12: the exported encoder is the other checkpoint's to 1e-9); a checkpoint with
    another vocabulary is refused before training, naming the key; the config's own checks name it
    too, and the job's paths carry both models."""
    import dataclasses
    import shutil

    from transformers import BertModel

    other = tmp_path / "other"
    shutil.copytree(tiny_bert_dir, other)
    torch.manual_seed(5)
    BertModel(BertModel.config_class.from_pretrained(other), add_pooling_layer=False).save_pretrained(other)
    base = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, lr=1e-12, max_steps=2, eval_steps=2)
    run = dataclasses.replace(base, paths={**base.paths, "model": str(other), "backbone_model": str(tiny_bert_dir)})
    train(run, tmp_path / "a", progress=False)
    got, start = load_file(tmp_path / "a/model/model.safetensors"), load_file(other / "model.safetensors")
    k = next(x for x in got if x.endswith("layer.0.attention.self.query.weight"))
    assert torch.allclose(got[k], start[k], atol=1e-9, rtol=0)
    assert not torch.allclose(got[k], load_file(tiny_bert_dir / "model.safetensors")[k], atol=1e-3)

    wrong = dataclasses.replace(base, paths={**base.paths, "model": str(other), "backbone_model": str(tiny_roberta_dir)})
    with pytest.raises(SentembError, match=r"runs\[\]\.weights.*vocabularies differ"):
        train(wrong, tmp_path / "b", progress=False)
    assert not (tmp_path / "b" / "model").exists()


def test_weights_must_name_a_declared_backbone_and_go_into_the_jobs_paths():
    from pathlib import Path

    from sentemb.config.load import load_config, resolve_run

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "config" / "config.yaml")
    r = resolve_run(cfg, "infocse-code", "bert-base-uncased", 42)
    assert r.paths["model"].endswith("models/condenser-bert-base") and r.backbone_hub_id == "Luyu/condenser"
    assert r.paths["backbone_model"].endswith("models/bert-base-uncased") and r.paths["inputs"] == {}  # no stage 1
    assert "backbone_model" not in resolve_run(cfg, "simcse", "bert-base-uncased", 42).paths
    with pytest.raises(SentembError, match=r"runs\[0\]\.weights.*not one of the declared backbones"):
        load_config(root / ".test" / "config.yaml",
                    {"runs": [{"method": "simcse", "backbone": "tiny-bert", "weights": "nope"}], "studies": []})
    # InfoCSE's stage 1 (trained from the backbone) would replace the weights: refused
    with pytest.raises(SentembError, match=r"runs\[0\]\.weights.*pretraining stage"):
        load_config(root / "config" / "config.yaml",
                    {"runs": [{"method": "infocse", "backbone": "bert-base-uncased", "weights": "condenser-bert-base"}],
                     "studies": []})


def test_the_sts_corpus_form_is_in_the_fingerprint_of_runs_on_it():
    """config ``sts_corpus``: ConSERT's form (the default) is other sentences in the same file than the
    scored, deduplicated corpus of before, so another fingerprint (a state saved on one does not resume
    on the other); at the old form the paths are what they were; a run on wiki1m is unaffected."""
    from pathlib import Path

    from sentemb.config.load import load_config, resolve_run
    from sentemb.config.settings import fingerprint

    root = Path(__file__).resolve().parents[1]
    new = load_config(root / "config" / "config.yaml")
    old = load_config(root / "config" / "config.yaml", {"sts_corpus": {"pairs": "scored", "duplicates": "drop"}})
    a, b = (resolve_run(c, "paser", "bert-base-uncased", 42) for c in (new, old))
    assert "corpus_form" not in b.paths and a.paths["corpus_form"] == "pairs=all,duplicates=keep"
    assert fingerprint(a) != fingerprint(b)
    s1, s2 = (resolve_run(c, "simcse", "bert-base-uncased", 42) for c in (new, old))
    assert fingerprint(s1) == fingerprint(s2)
    # a sample of it (sts_corpus.max_sentences) is other sentences again, and another seed other ones still
    samples = [resolve_run(load_config(root / "config" / "config.yaml", {"sts_corpus": {"max_sentences": 1000,
                                                                                         "sample_seed": seed}}),
                           "paser", "bert-base-uncased", 42) for seed in (0, 1)]
    assert samples[0].paths["corpus_form"] == "pairs=all,duplicates=keep,max_sentences=1000,seed=0"
    assert len({fingerprint(a), *map(fingerprint, samples)}) == 3
