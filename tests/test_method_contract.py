"""One contract every registered method obeys (issue 6), on the tiny random BERT.

A new method adds only the tests of its own equations; this module runs it through the loop's
contract: flat CPU batches deterministic in (seed, micro), a finite fp32 loss whose gradient reaches
the encoder, scalar logged terms, export == training-time dev embedder == ``sentemb evaluate``'s
embedder == ``SentenceTransformer(path)``, bit-identical resume, typed arguments.

Per method: ``CONTRACT_ARGS`` holds argument overrides a tiny 2-layer model needs; every input a
method declares (``Method.requires(args)``) is built on the tiny corpus by ``INPUT_BUILDERS``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sentemb import SentembError
from sentemb.methods import MethodContext, get_method, registry
from sentemb.methods.base import INPUT_NAMES, WEIGHTED

REPO = Path(__file__).resolve().parents[1]

#: tiny-model argument overrides per method (e.g. fewer layers than the paper's backbone)
CONTRACT_ARGS: dict[str, dict] = {
    "simcse": {},
    "sarcse": {"channels": 40},  # 40 TextCNN channels on hidden 32 (paper: 500 on RoBERTa)
    "una": {"paraphrase": True, "radius": 8, "alpha": 2},  # negatives on steps 0 and 2 of the 4-step resume test
    "paser": {"decoder_layers": 1, "decoder_ffn": 64},
    "infocse": {"skip_from": 1},  # 2 layers: M^{>0} after layer 1
    "arccse": {"min_words": 5},  # the contract's short sentences then form triplets too
}

SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat",
         "she eats an apple in the house", "two old men are playing music in the street"]


# ------------------------------------------------------------------------------------ inputs
def _token_freq(d, corpus, model_dir):
    from sentemb.stats.frequency import write_token_frequencies

    out = d / "token_freq.tiny.parquet"
    write_token_frequencies(corpus, model_dir, out)
    return out


def _tfidf(d, corpus, model_dir, name="tfidf.parquet", para=False):
    from sentemb.stats.tfidf import write_tfidf

    out = d / name
    write_tfidf([corpus, _paraphrases(d, corpus, model_dir)] if para else [corpus], out, workers=1)
    return out


def _paraphrases(d, corpus, model_dir):
    out = d / "paraphrases.txt"
    if not out.is_file():  # a stand-in paraphrase per line: the words reversed
        lines = corpus.read_text("utf-8").splitlines()
        out.write_text("".join(" ".join(reversed(x.split())) + "\n" for x in lines), "utf-8")
    return out


def _nltk(d, corpus, model_dir):
    from conftest import SHARED, SKIP_REASON

    if SHARED is None:
        pytest.skip(SKIP_REASON)
    return SHARED / "nltk_data"


def _rake(d, corpus, model_dir):
    from sentemb.stats.rake import write_rake

    out = d / "rake_top5.parquet"
    write_rake(corpus, _nltk(d, corpus, model_dir), out, top_k=5, workers=1)
    return out


def _pretrained(d, corpus, model_dir, method):
    """The method's own pretraining stage (``Method.pretrain_stage``), 1 step on the tiny corpus."""
    from conftest import tiny_run
    from sentemb.pretrain import run_pretrain

    run = tiny_run(model_dir, corpus, None, method, seed=5, method_args=CONTRACT_ARGS.get(method), name=f"{method}-pretrain",
                   max_steps=1, eval_steps=1, eval_at_end=False, model_selection="last")
    run.rule = "pretrain"
    run_pretrain(run, d / "pretrain", progress=False)
    return d / "pretrain" / "model"


#: name -> builder(dir, corpus, model_dir) -> path, for every name in INPUT_NAMES a method may declare
#: ("pretrained" also gets the method's name: it runs that method's own pretraining stage)
INPUT_BUILDERS = {
    "token_freq": _token_freq,
    "tfidf": _tfidf,
    "tfidf_para": lambda d, c, m: _tfidf(d, c, m, "tfidf_para.parquet", para=True),
    "paraphrases": _paraphrases,
    "nltk": _nltk,
    "rake": _rake,
    "pretrained": _pretrained,
}


def test_every_input_name_has_a_builder_or_a_method_that_builds_it():
    # "pretrained" is a workflow stage output: its builder runs the method's own Method.pretrain.
    assert set(INPUT_NAMES) <= set(INPUT_BUILDERS)


@pytest.fixture(scope="module", params=sorted(registry()))
def name(request):
    return request.param


@pytest.fixture(scope="module")
def inputs(name, tiny_bert_dir, tmp_path_factory):
    """The declared inputs of ``name`` (contract args), built once per method on the tiny corpus."""
    import random

    from conftest import TINY_WORDS

    d = tmp_path_factory.mktemp(f"inputs_{name}")
    rng = random.Random(1)
    corpus = d / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 30))) + "\n"
                              for _ in range(64)), "utf-8")
    cls = get_method(name)
    built = {}
    for n in cls.requires(cls.make_args(CONTRACT_ARGS.get(name, {}))):
        if n not in INPUT_BUILDERS:
            pytest.fail(f"method '{name}' requires input '{n}' but the contract test has no builder for it")
        extra = {"method": name} if n == "pretrained" else {}
        built[n] = INPUT_BUILDERS[n](d, corpus, tiny_bert_dir, **extra)
    return {"corpus": corpus, "inputs": built, "args": CONTRACT_ARGS.get(name, {})}


def make(name, model_dir, inputs, seed=3):
    from sentemb.models import load_encoder

    enc, tok = load_encoder(model_dir, pooling_layer=False)
    ctx = MethodContext(max_len=16, seed=seed, backbone="tiny", model_dir=model_dir, inputs=inputs["inputs"],
                        corpus=inputs["corpus"])
    return get_method(name)(enc, tok, inputs["args"], ctx)


def run_cfg(name, model_dir, inputs, senteval, **over):
    """A 4-step run of method ``name`` with its contract args and inputs (``conftest.tiny_run``)."""
    from conftest import tiny_run

    return tiny_run(model_dir, inputs["corpus"], senteval, name, seed=5, method_args=inputs["args"],
                    inputs=inputs["inputs"], **{"max_steps": 4, **over})


# ------------------------------------------------------------------------------------ the contract
def test_build_batch_is_a_flat_dict_of_cpu_tensors_deterministic_in_seed_and_micro(name, tiny_bert_dir, inputs):
    m = make(name, tiny_bert_dir, inputs)
    lines = list(range(len(SENTS)))
    a = m.build_batch(SENTS, step=0, lines=lines, micro=7)
    b = make(name, tiny_bert_dir, inputs).build_batch(SENTS, step=0, lines=lines, micro=7)
    assert isinstance(a, dict) and a
    for k, v in a.items():
        assert isinstance(v, torch.Tensor), f"{name}: batch['{k}'] is {type(v).__name__}, not a tensor"
        assert v.device.type == "cpu"
        assert torch.equal(v, b[k]), f"{name}: batch['{k}'] differs for the same (seed, micro)"


def test_losses_are_finite_fp32_scalars_and_the_gradient_reaches_the_encoder(name, tiny_bert_dir, inputs):
    torch.manual_seed(0)
    m = make(name, tiny_bert_dir, inputs)
    m.train()
    terms = m.losses(m.build_batch(SENTS, step=0, lines=list(range(len(SENTS))), micro=0))
    weighted = terms.pop(WEIGHTED)
    loss = terms["loss"]
    assert loss.dtype == torch.float32 and loss.ndim == 0 and torch.isfinite(loss)
    for k, v in terms.items():
        assert torch.as_tensor(v).numel() == 1, f"{name}: logged term '{k}' is not a scalar"
    # the weighted terms (train.log_grad_norms) carry the graph, are named as logged, and sum to the loss
    assert weighted and set(weighted) <= set(terms) - {"loss"}, f"{name}: weighted terms {sorted(weighted)}"
    assert any(v.requires_grad for v in weighted.values())
    assert float(sum(weighted.values()).detach()) == pytest.approx(float(loss.detach()), rel=1e-6, abs=1e-7)
    loss.backward()
    grads = [p.grad for p in m.encoder.parameters() if p.requires_grad and p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads), f"{name}: no gradient reaches the encoder"


def test_export_embeds_like_the_training_time_dev_embedder(name, tiny_bert_dir, inputs, tmp_path):
    from sentence_transformers import SentenceTransformer

    from sentemb.evaluate import embedder_for

    torch.manual_seed(0)
    m = make(name, tiny_bert_dir, inputs)
    cls = get_method(name)
    pooler = cls.pooler_for(m.args)
    with torch.no_grad():  # make every head matter: non-trivial weights everywhere
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    dev = m.embedder(pooler, torch.device("cpu"))(SENTS)
    m.export(tmp_path / "model", pooler, meta={"method": name, "name": name, "backbone": "tiny", "seed": 5})
    ours = embedder_for(tmp_path / "model", pooler, device="cpu")(SENTS)
    st = SentenceTransformer(str(tmp_path / "model"), device="cpu", trust_remote_code=True).encode(SENTS, convert_to_numpy=True)
    assert dev.shape == ours.shape == st.shape
    np.testing.assert_allclose(ours, dev, atol=1e-5, err_msg=f"{name}: `sentemb evaluate` != training-time embedder")
    np.testing.assert_allclose(st, dev, atol=1e-5, err_msg=f"{name}: SentenceTransformer(path) != training-time embedder")


def assert_kill_resumes_bit_identically(cfg, tmp_path, name) -> dict:
    """Train ``cfg`` uninterrupted, and again killed after 1 step and resumed: the same history and
    bit-identical exported weights. Returns the uninterrupted run's summary."""
    from sentemb.train import train

    full = train(cfg, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "resumed", stop_after=1, progress=False)
    res = train(cfg, tmp_path / "resumed", progress=False)
    assert res["history"] == full["history"]
    for f in sorted((tmp_path / "full/model").rglob("*.safetensors")):
        a, b = load_file(f), load_file(tmp_path / "resumed/model" / f.relative_to(tmp_path / "full/model"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{name}: {f.name} differs"
    return full


def test_resume_after_a_kill_is_bit_identical(name, tiny_bert_dir, inputs, tiny_senteval, tmp_path):
    cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval)
    assert_kill_resumes_bit_identically(cfg, tmp_path, name)


def test_log_grad_norms_equal_a_fresh_backward_of_each_term(name, tiny_bert_dir, inputs, tiny_senteval):
    """Issue 18 §4: each ``train/grad_norm/<term>`` the loop logs (here on every step, over 2
    accumulated micro-batches) equals the norm of ``.grad`` on ``grad_norm_parameters()`` after a
    fresh forward and backward of that weighted term alone, at the same weights, on the same
    micro-batches with the same dropout masks (the RNG state rewound)."""
    import copy

    from sentemb.train import State, _rng_state, _set_rng_state, micro_batches, run_steps, setup

    cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, precision="fp32", model_selection="last", prefetch=False,
                  grad_accum=2, max_steps=2, log_grad_norms=True)
    job, ref = setup(cfg, "/nonexistent"), setup(cfg, "/nonexistent")
    params = ref.method.grad_norm_parameters()
    state = State()
    while state.step < job.total:  # one step of the loop at a time, recorded before and read after
        weights, rng = copy.deepcopy(job.method.state_dict()), _rng_state()
        batches = micro_batches(job, state.step)
        next(run_steps(job, state, 1))
        got = {k.rsplit("/", 1)[1]: v for k, v in state.history[-1].items() if k.startswith("train/grad_norm/")}
        logged = set(state.terms)
        assert got and set(got) <= logged - {"loss"}, f"{name}: grad norms {sorted(got)} vs terms {sorted(logged)}"
        ref.method.load_state_dict(weights)
        for term, value in got.items():
            ref.method.zero_grad(set_to_none=True)
            _set_rng_state(rng)
            for _, batch in batches:
                t = ref.method.losses(batch)[WEIGHTED][term]
                if t.requires_grad:
                    (t / job.accum).backward()
            grads = [p.grad.double().norm() for p in params if p.grad is not None]
            want = float(torch.stack(grads).norm()) if grads else 0.0
            assert value == pytest.approx(want, rel=1e-4, abs=1e-9), f"{name}: step {state.step}: {term}"
        assert any(v > 0 for v in got.values())


def test_log_grad_norms_leave_the_weights_bit_identical_and_reach_history_and_tracker(
        name, tiny_bert_dir, inputs, tiny_senteval, tmp_path, monkeypatch):
    """With SAM, 2 accumulated micro-batches and bf16 autocast: the trained model is the same bit for
    bit with ``train.log_grad_norms`` on or off; on, every log step's record in ``train.json``'s
    history and the tracker's metrics carry ``train/grad_norm/<term>``; dev scores are unchanged."""
    import json

    from conftest import assert_same_model

    from sentemb.train import train
    from sentemb.tracking import Tracker

    logged = []
    monkeypatch.setattr(Tracker, "log_metrics", lambda self, metrics, step=None: logged.append((step, dict(metrics))))
    over = dict(grad_accum=2, max_steps=2, sam_rho=0.05, precision="bf16", eval_steps=1)
    off = train(run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over), tmp_path / "off", progress=False)
    logged.clear()
    on = train(run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, log_grad_norms=True, **over), tmp_path / "on",
               progress=False)
    assert_same_model(tmp_path / "off" / "model", tmp_path / "on" / "model")
    assert [h["dev_stsb"] for h in on["history"]] == [h["dev_stsb"] for h in off["history"]]
    assert json.loads((tmp_path / "on" / "train.json").read_text())["history"] == on["history"]
    steps = [h["step"] for h in on["history"]]
    assert steps == [1, 2]
    for h in on["history"]:
        norms = {k for k in h if k.startswith("train/grad_norm/")}
        assert norms and all(math.isfinite(h[k]) and h[k] >= 0 for k in norms), h
        metrics = [m for s, m in logged if s == h["step"] and "train/loss" in m]
        assert len(metrics) == 1 and all(metrics[0][k] == h[k] for k in norms)
    assert not any(k.startswith("train/grad_norm/") for h in off["history"] for k in h)


def test_batches_from_the_token_cache_equal_batches_from_the_tokenizer(name, tiny_bert_dir, inputs):
    """Issue 13: ``build_batch`` with the corpus's token cache in ``ctx`` (what the loop gives) and
    without (the tokenizer on every step) returns the same tensors, for every method."""
    from sentemb.tokens import TokenCache

    lines = list(range(len(SENTS)))
    plain = make(name, tiny_bert_dir, inputs).build_batch(SENTS, step=0, lines=lines, micro=7)
    m = make(name, tiny_bert_dir, inputs)
    m.ctx.tokens = TokenCache.build(SENTS, m.tokenizer)
    cached = m.build_batch(SENTS, step=0, lines=lines, micro=7)
    assert plain.keys() == cached.keys()
    for k in plain:
        assert torch.equal(plain[k], cached[k]), f"{name}: batch['{k}'] differs with the token cache"


def test_the_optimised_loop_gives_the_same_losses_step_by_step(name, tiny_bert_dir, inputs, tiny_senteval):
    """Issue 13's exactness test: the loop with the token cache and the prefetch thread (defaults)
    and the loop as it was (tokenizer on every step, batches built in line) give the same loss
    terms at every step, fp32, fixed seed, on the corpus's real line order (``inputs`` corpus)."""
    from sentemb.train import State, run_steps, setup

    def losses(**over):
        cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, precision="fp32", model_selection="last", **over)
        with setup(cfg, "/nonexistent") as job:
            assert (job.method.ctx.tokens is not None) == over["token_cache"]
            assert (job.prefetch is not None) == over["prefetch"]
            return [{k: v.clone() for k, v in state.terms.items()} for state in run_steps(job, State())]

    fast = losses(token_cache=True, prefetch=True)
    before = losses(token_cache=False, prefetch=False)
    assert len(fast) == len(before) == 4
    for step, (a, b) in enumerate(zip(fast, before), start=1):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}: step {step}: {k} {float(a[k])} != {float(b[k])}"


def test_padding_free_training_gives_the_padded_losses_with_dropout_off(name, tiny_bert_dir, inputs, tiny_senteval):
    """train.unpad (sentemb.unpad) changes only which positions are computed: with dropout off, the
    loss terms of every step equal the padded run's (fp32 tolerance; other summation order)."""
    from sentemb.train import State, run_steps, setup

    def losses(unpad):
        cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, precision="fp32", model_selection="last",
                      dropout=0.0, unpad=unpad, prefetch=False)
        with setup(cfg, "/nonexistent") as job:
            return [{k: float(v) for k, v in state.terms.items()} for state in run_steps(job, State())]

    padded, packed = losses(False), losses(True)
    assert len(padded) == len(packed) == 4
    for step, (a, b) in enumerate(zip(padded, packed), start=1):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), f"{name}: step {step}: {k}"


def test_unknown_and_mistyped_arguments_are_refused(name):
    cls = get_method(name)
    with pytest.raises(SentembError, match=rf"runs\[0\]\.method_args\.no_such_arg: unknown argument of method '{name}'"):
        cls.validate_args({"no_such_arg": 1}, "runs[0].method_args")
    for spec in cls.arg_specs():
        if spec.type in ("float", "int", "bool"):
            with pytest.raises(SentembError, match=rf"methods\.{name}\.{spec.name}: "):
                cls.validate_args({spec.name: "not a value"}, f"methods.{name}")
            break


def test_every_declared_bound_is_enforced_in_the_config_naming_the_key(name, tmp_path):
    """Issue 27 §3: every ``arg(..., minimum=, maximum=, exclusive_minimum=, exclusive_maximum=)``
    refuses a value just outside it when the config is validated, in ``methods.<name>`` and in
    ``runs[i].method_args``, naming the key; a value on an inclusive bound and the default pass."""
    import yaml

    from sentemb.args import meta_of
    from sentemb.config import load_config

    cls = get_method(name)
    base = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())

    def load(methods=None, method_args=None):
        cfg = {**base, "methods": {name: methods or {}}, "studies": [],
               "runs": [{"method": name, "backbone": next(iter(base["backbones"])), "method_args": method_args or {}}]}
        p = tmp_path / "c.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return load_config(p)

    bounded = 0
    for spec in cls.arg_specs():
        meta = meta_of(cls.Args, spec.name)
        step = 1 if spec.type.startswith("int") else 1e-9
        for key, outside, edge in (("minimum", -step, True), ("exclusive_minimum", 0, False),
                                   ("maximum", step, True), ("exclusive_maximum", 0, False)):
            if meta.get(key) is None:
                continue
            bounded += 1
            bad = meta[key] + outside
            bad = int(bad) if spec.type.startswith("int") else float(bad)
            with pytest.raises(SentembError, match=rf"methods\.{name}\.{spec.name}: {bad!r} "):
                load(methods={spec.name: bad})
            with pytest.raises(SentembError, match=rf"runs\[0\]\.method_args\.{spec.name}: {bad!r} "):
                load(method_args={spec.name: bad})
            if edge:
                cls.validate_args({spec.name: meta[key]}, "edge")  # an inclusive bound is allowed
    assert bounded, f"{name} declares no bound on any argument"
    load()  # the defaults are within every bound and pass Method.check


def test_every_argument_is_documented_and_inputs_are_known(name):
    cls = get_method(name)
    for spec in cls.arg_specs():
        assert spec.help, f"{name}.{spec.name} has no help text"
        if spec.choices:
            assert spec.default in spec.choices
    assert set(cls.requires(cls.make_args())) <= set(INPUT_NAMES)


# ------------------------------------------------------------------------------------ bf16 (issue 20 §2)
# The CPU autocast is the code CUDA's runs (``sentemb.train.autocast``): the same contract holds
# under ``train.precision: bf16`` as under fp32 (the tests above).
def test_loss_terms_stay_fp32_under_bf16_autocast(name, tiny_bert_dir, inputs):
    from sentemb.train import autocast

    torch.manual_seed(0)
    m = make(name, tiny_bert_dir, inputs)
    m.train()
    seen = []  # the dtype of the encoder's linear layers (its LayerNorms run in fp32): proves the autocast is on
    for mod in m.encoder.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    batch = m.build_batch(SENTS, step=0, lines=list(range(len(SENTS))), micro=0)
    with autocast(torch.device("cpu"), "bf16"):
        terms = m.losses(batch)
    assert torch.bfloat16 in seen, f"{name}: the encoder did not run in bf16 under autocast ({seen})"
    weighted = terms.pop(WEIGHTED)
    for k, v in {**terms, **{f"weighted {k}": v for k, v in weighted.items()}}.items():
        assert v.dtype == torch.float32, f"{name}: loss term '{k}' is {v.dtype} under bf16 autocast"
        assert torch.isfinite(v).all(), f"{name}: loss term '{k}' = {v}"
    terms["loss"].backward()
    assert any(p.grad is not None and p.grad.dtype == torch.float32 and float(p.grad.abs().sum()) > 0
               for p in m.encoder.parameters()), f"{name}: no fp32 gradient reaches the encoder"


def test_bf16_unpadded_training_resumes_bit_identically_and_exports_what_evaluate_embeds(
        name, tiny_bert_dir, inputs, tiny_senteval, tmp_path):
    """bf16 autocast with ``train.unpad`` (and SAM for ArcCSE, as the paper trains it): the loop's
    steps, the kill-and-resume, and the selected export: ``sentemb evaluate``'s embedder and
    ``SentenceTransformer(path)`` of the exported model reproduce the training-time dev embedder's
    best STS-B dev score."""
    from sentence_transformers import SentenceTransformer

    from sentemb.evaluate import embedder_for, stsb_dev
    from sentemb.senteval import load_task

    over = dict(precision="bf16", unpad=True, sam_rho=0.05 if name == "arccse" else None)
    cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over)
    full = assert_kill_resumes_bit_identically(cfg, tmp_path, name)
    assert full["precision"] == "torch.bfloat16"
    dev = load_task(tiny_senteval, "STSBenchmark", "dev")
    pooler = get_method(name).pooler_for(get_method(name).make_args(inputs["args"]))
    ours = stsb_dev(embedder_for(tmp_path / "full/model", pooler, device="cpu"), dev)
    assert ours == pytest.approx(full["best_dev_stsb"], abs=1e-4), f"{name}: `sentemb evaluate` != dev embedder"
    st = SentenceTransformer(str(tmp_path / "full/model"), device="cpu", trust_remote_code=True)
    ref = embedder_for(tmp_path / "full/model", pooler, device="cpu")(SENTS)
    np.testing.assert_allclose(st.encode(SENTS, convert_to_numpy=True), ref, atol=1e-5)


def test_the_pretraining_stage_runs_under_bf16_with_unpad(name, tiny_bert_dir, inputs, tmp_path):
    """A method's pretraining stage (``Method.pretrain_stage``, InfoCSE's stage 1) under bf16 autocast
    and ``train.unpad``: finite fp32 losses, and a model its method then reads."""
    import json

    from conftest import tiny_run
    from sentemb.pretrain import run_pretrain

    cls = get_method(name)
    if cls.pretrain_stage is None:
        pytest.skip(f"{name} has no pretraining stage")
    run = tiny_run(tiny_bert_dir, inputs["corpus"], None, name, seed=5, method_args=inputs["args"],
                   name=f"{name}-pretrain", max_steps=2, eval_steps=1, eval_at_end=False, model_selection="last",
                   precision="bf16", unpad=True)
    run.rule = "pretrain"
    summary = run_pretrain(run, tmp_path / "stage", progress=False)
    assert summary["precision"] == "torch.bfloat16" and summary["steps"] == 2
    assert json.loads((tmp_path / "stage/train.json").read_text())["steps"] == 2
    m = make(name, tiny_bert_dir, {**inputs, "inputs": {**inputs["inputs"], "pretrained": tmp_path / "stage/model"}})
    terms = m.losses(m.build_batch(SENTS, step=0, lines=list(range(len(SENTS))), micro=0))
    assert terms["loss"].dtype == torch.float32 and torch.isfinite(terms["loss"])


# ------------------------------------------------------------------------------------ gradient caching (issue 26 §2)
# Tolerance (fp32 round-off of the other summation order of chunked matmuls): for every parameter p,
# ‖Δg_p‖ ≤ 1e-5·‖g_p‖ + 1e-7·‖g‖ (g the whole model's gradient; the floor is for gradients that are
# zero in exact arithmetic, e.g. attention key biases, softmax being shift-invariant), and for the
# whole model ‖Δg‖ ≤ 1e-5·‖g‖. After several steps, the weights: ‖Δw‖ ≤ 1e-5·‖w‖ for the whole model
# and ‖Δw_p‖ ≤ 1e-5·‖w_p‖ + 1e-5·‖w‖ per parameter (the floor: AdamW's update g/(√v + ε) turns the
# round-off of a gradient element near ε, e.g. a word embedding row of a token seen once, into a
# visible share of an lr-sized step).
# With dropout on, both runs use ``train.dropout_rng: keyed`` (masks a function of (seed,
# micro-batch, sentence, view, call), so the chunked and the unchunked pass draw the same masks);
# with the default ``stream`` each chunk's first pass is replayed in its second, but its masks are
# other draws than the unchunked pass's, so "dropout off" tests that path (every dropout off:
# PaSeR's decoder too). Dropout off, SimCSE's two views are one: the gradient is a cancellation
# ~1e-4 of its usual size, and its round-off is relative 1e-4 of it.
REL = 1e-5
WEIGHT_FLOOR = "whole"  # _close: the per-parameter floor is REL·‖w‖ of the whole model


def _close(a: dict, b: dict, what: str, rel: float = REL, floor: "float | str | None" = None) -> None:
    assert a.keys() == b.keys(), f"{what}: {sorted(set(a) ^ set(b))}"
    total = sum(float(v.double().norm()) ** 2 for v in b.values()) ** 0.5
    err = sum(float((a[k].double() - b[k].double()).norm()) ** 2 for k in a) ** 0.5
    assert err <= rel * total, f"{what}: ‖Δ‖ {err:.3g} vs ‖ref‖ {total:.3g} (relative {err / total:.2g})"
    for k in a:
        e, r = float((a[k].double() - b[k].double()).norm()), float(b[k].double().norm())
        bound = rel * r + {None: 1e-2 * rel * total, "whole": rel * total}.get(floor, floor)
        assert e <= bound, f"{what}: {k}: ‖Δ‖ {e:.3g} vs ‖ref‖ {r:.3g} (whole {total:.3g})"


def _step_grads(cfg, method_cls=None) -> tuple[dict, "object"]:
    """The gradient of optimizer step 0 of ``cfg`` (every micro-batch accumulated), by name."""
    from sentemb.train import accumulate_gradients, micro_batches, setup

    with setup(cfg, "/nonexistent", method_cls) as job:
        torch.manual_seed(11)
        accumulate_gradients(job, micro_batches(job, 0), None)
        grads = {n: p.grad.detach().clone() for n, p in job.method.named_parameters() if p.grad is not None}
        return grads, job.chunk


def _chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over):
    if over.get("dropout") == 0.0 and name == "paser":  # every dropout off: the decoder's too
        inputs = {**inputs, "args": {**inputs["args"], "decoder_dropout": 0.0}}
    return run_cfg(name, tiny_bert_dir, inputs, tiny_senteval,
                   **{"precision": "fp32", "model_selection": "last", "prefetch": False, "token_cache": False, **over})


def test_a_chunked_step_has_the_unchunked_gradient_and_accumulation_does_not(name, tiny_bert_dir, inputs, tiny_senteval):
    """``chunk_size: 4`` at batch 16 (4 chunks): every parameter's gradient equals the unchunked one,
    with dropout off (the default ``stream`` generator) and on (``dropout_rng: keyed``); and it is not
    ``batch_size: 4, grad_accum: 4`` on the same 16 sentences, whose negatives are within each 4."""
    cfg = lambda **o: _chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **o)  # noqa: E731
    for label, over, rel in (("dropout off", {"dropout": 0.0}, 1e-4), ("dropout on, keyed", {"dropout_rng": "keyed"}, REL)):
        ref, whole = _step_grads(cfg(**over))
        got, chunk = _step_grads(cfg(chunk_size=4, **over))
        assert whole is None and chunk == 4
        assert ref and any(float(g.abs().sum()) > 0 for g in ref.values())
        _close(got, ref, f"{name}, {label}", rel)
    accum, _ = _step_grads(cfg(dropout=0.0, batch_size=4, grad_accum=4))
    ref, _ = _step_grads(cfg(dropout=0.0))
    enc = [k for k in ref if k.startswith("encoder.") and k in accum]
    diff = sum(float((accum[k] - ref[k]).norm()) for k in enc) / sum(float(ref[k].norm()) for k in enc)
    assert diff > 1e-2, f"{name}: batch 4 × grad_accum 4 gave the batch-16 gradient (relative difference {diff:.2g})"


def test_chunked_training_gives_the_unchunked_weights_with_accumulation_and_sam(name, tiny_bert_dir, inputs, tiny_senteval):
    """3 optimizer steps of 2 accumulated micro-batches of 16 (each chunked by 4; ArcCSE with SAM, both
    of its passes chunked), dropout on and keyed: the weights equal the unchunked run's."""
    from sentemb.train import State, run_steps, setup

    def weights(**o):
        over = dict(dropout_rng="keyed", grad_accum=2, max_steps=3, sam_rho=0.05 if name == "arccse" else None, **o)
        with setup(_chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over), "/nonexistent") as job:
            params = dict(job.method.named_parameters())
            w0 = {k: p.detach().clone() for k, p in params.items()}
            for _ in run_steps(job, State()):
                pass
            return {k: p.detach().clone() for k, p in params.items()}, [k for k in w0 if not torch.equal(params[k], w0[k])]

    (ref, moved), (got, _) = weights(), weights(chunk_size=4)
    assert any(k.startswith("encoder.") for k in moved), f"{name}: the encoder did not train"
    _close(got, ref, f"{name}: weights after 3 steps", floor=WEIGHT_FLOOR)


def test_chunked_losses_agree_under_bf16_autocast(name, tiny_bert_dir, inputs, tiny_senteval):
    """bf16 autocast, dropout keyed: the logged terms of 2 chunked steps agree with the unchunked ones
    to bf16 tolerance (relative 2e-2: 8 mantissa bits, other summation order)."""
    from sentemb.train import State, run_steps, setup

    def losses(**o):
        cfg = _chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, precision="bf16", dropout_rng="keyed", max_steps=2, **o)
        with setup(cfg, "/nonexistent") as job:
            return [{k: float(v) for k, v in s.terms.items()} for s in run_steps(job, State())]

    ref, got = losses(), losses(chunk_size=4)
    assert len(ref) == len(got) == 2
    for step, (a, b) in enumerate(zip(got, ref), start=1):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=2e-2, abs=2e-3), f"{name}: step {step}: {k}"


def test_chunked_training_resumes_bit_identically_and_with_another_chunk_size(name, tiny_bert_dir, inputs, tiny_senteval,
                                                                              tmp_path):
    """Kill-and-resume with ``chunk_size: 4`` is bit-identical; a state saved with chunks of 4 resumes
    with chunks of 8 (a speed setting: the same fingerprint) to the uninterrupted weights (round-off)."""
    import json

    from sentemb.train import train

    over = dict(dropout_rng="keyed", chunk_size=4)
    cfg = run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over)
    assert_kill_resumes_bit_identically(cfg, tmp_path, name)
    meta = json.loads((tmp_path / "full/train.json").read_text())
    assert meta["chunk_size"] == 4 and meta["chunked"] is True
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "other", stop_after=1, progress=False)
    train(run_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **{**over, "chunk_size": 8}), tmp_path / "other",
          progress=False)
    assert json.loads((tmp_path / "other/train.json").read_text())["chunk_size"] == 8
    for f in sorted((tmp_path / "full/model").rglob("*.safetensors")):
        _close(load_file(tmp_path / "other/model" / f.relative_to(tmp_path / "full/model")), load_file(f),
               f"{name}: resumed with chunks of 8", rel=1e-4)


def test_the_pretraining_stage_is_chunked_to_the_same_gradient(name, tiny_bert_dir, inputs, tiny_senteval):
    """A method's pretraining stage (InfoCSE's MLM at batch 1024 in the paper) gets the same memory
    bound: chunked, its gradient is the unchunked one (dropout on, keyed)."""
    cls = get_method(name)
    if cls.pretrain_stage is None:
        pytest.skip(f"{name} has no pretraining stage")
    stage = cls.pretrain_stage
    cfg = lambda **o: _chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, dropout_rng="keyed", **o)  # noqa: E731
    ref, _ = _step_grads(cfg(), stage)
    got, chunk = _step_grads(cfg(chunk_size=4), stage)
    assert chunk == 4 and ref
    _close(got, ref, f"{name}: pretraining stage")


# ------------------------------------------------------------------------------------ several processes (issue 26 §3)
def _train_two_processes(cfg, tmp_path, *, torchrun=False, kill_after=None) -> Path:
    """``cfg`` (``train.devices: 2``) trained by 2 gloo processes on this CPU: through ``sentemb
    train`` (which starts torchrun itself) or under ``torchrun`` directly (``tests/dist_worker.py``)."""
    import json
    import subprocess
    import sys

    run_file, out = tmp_path / "run2.json", tmp_path / "two"
    run_file.write_text(json.dumps(cfg.to_dict()), "utf-8")
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).with_name("dist_worker.py")), str(run_file), str(out)]
        cmd += ["--kill-after", str(kill_after)] if kill_after else []
    else:
        cmd = [sys.executable, "-m", "sentemb", "train", "--run-config", str(run_file), "--output-dir", str(out),
               "--no-track", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return out


def _same_weights(a: Path, b: Path, what: str, adam_outliers: int = 0, lr_steps: float = 0.0) -> None:
    """The weights under ``a`` and ``b`` agree to ``_close``'s tolerance. ``adam_outliers``: that many
    single elements may first be set aside, each differing by at most ``lr_steps`` (lr × steps, what
    AdamW can move an element). Why: with SAM and two processes the weights after step 1 agree to
    < 1e-6 in every element, and after step 2 one word-embedding element differs by 2e-4 (of a
    3 × 1e-3 budget) on this project's 2-core machine (none on the machine of the last CI run;
    2-process runs without SAM: 2e-7 of the weights): an element whose gradient is a near-
    cancellation gets an AdamW update m/(√v + ε) decided by round-off (the summation order of the
    CPU's kernels), the case WEIGHT_FLOOR allows per parameter but not in the whole-model norm."""
    files = sorted(a.rglob("*.safetensors"))
    assert files
    for f in files:
        got, ref = load_file(b / f.relative_to(a)), load_file(f)
        if adam_outliers:
            flat = torch.cat([(got[k].double() - ref[k].double()).abs().flatten() for k in ref])
            top = flat.topk(min(adam_outliers, flat.numel())).values
            assert float(top.max()) <= lr_steps, f"{what}: an element moved by {float(top.max()):.3g} > lr x steps"
            cut = float(top.min())
            got = {k: torch.where((got[k].double() - ref[k].double()).abs() >= cut, ref[k], got[k]) for k in ref}
        _close(got, ref, f"{what}: {f.name}", floor=WEIGHT_FLOOR)


def test_two_processes_train_the_single_process_weights(name, tiny_bert_dir, inputs, tiny_senteval, tmp_path):
    """``train.devices: 2`` (two gloo processes, launched by ``sentemb train``), 2 steps of 2
    accumulated micro-batches of 16 (8 per process): the weights of ``devices: 1`` at the same
    ``batch_size``, to the tolerance of the chunked tests; only rank 0 wrote ``train.json``. Dropout
    is on with keyed masks, which are the single process's masks (a stronger check than dropout
    off, under which SimCSE's two views are one and its gradient a ~1e-4 cancellation that Adam
    normalises into lr-sized steps of round-off)."""
    import json

    from sentemb.train import train

    over = dict(dropout_rng="keyed", grad_accum=2)  # the 64-line corpus: 2 optimizer steps
    one = train(_chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over), tmp_path / "one", progress=False)
    out = _train_two_processes(_chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, devices=2, **over), tmp_path)
    meta = json.loads((out / "train.json").read_text())
    assert meta["devices"] == 2 and meta["steps"] == one["steps"] == 2
    _same_weights(tmp_path / "one/model", out / "model", f"{name}: devices 2")


@pytest.mark.parametrize("chunked", [4])
def test_two_processes_compose_with_chunking_keyed_dropout_and_resume_across_a_kill(
        name, chunked, tiny_bert_dir, inputs, tiny_senteval, tmp_path):
    """Under ``torchrun`` directly: 2 processes, each chunking its share by 4, dropout on and keyed
    (the single process's masks), ArcCSE with SAM; killed after 1 step and resumed: the
    uninterrupted single-process weights."""
    from sentemb.train import train

    if name not in ("arccse", "una"):
        pytest.skip("run for the methods with the most varied rows (ArcCSE's triplets, UNA's negatives)")
    over = dict(dropout_rng="keyed", max_steps=3, sam_rho=0.05 if name == "arccse" else None)
    train(_chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, **over), tmp_path / "one", progress=False)
    cfg = _chunk_cfg(name, tiny_bert_dir, inputs, tiny_senteval, devices=2, chunk_size=chunked, **over)
    out = _train_two_processes(cfg, tmp_path, torchrun=True, kill_after=1)
    _same_weights(tmp_path / "one/model", out / "model", f"{name}: devices 2, chunks of {chunked}, resumed",
                  adam_outliers=4 if over["sam_rho"] else 0, lr_steps=cfg.train.lr * over["max_steps"])
