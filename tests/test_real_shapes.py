"""Issue 20 §2: every run of the paper configuration (``config/config.yaml``) takes one optimizer step
at its backbone's real widths.

The published shapes are kept here (``PUBLISHED``, written out independently of
``sentemb.ops.shapes.ARCHITECTURES``, which must agree with them). For every run the configuration
defines (study points included), the job is built as ``sentemb train`` builds it
(``resolve_run`` -> ``Run`` -> ``sentemb.train.loop.setup``) on a random-weight model at the real hidden
size, heads, intermediate size, vocabulary, positions and type vocabulary, with a stand-in tokenizer
of the backbone's family (``sentemb.ops.shapes.write_model_dir``), and ``run_steps`` takes one optimizer
step at batch 4 and the run's ``max_len``. A run added to the configuration is covered without
editing this file.

Depth: 2 Transformer layers, except where a method reads a given layer: InfoCSE's ``skip_from``
(the auxiliary network's input is the state after that layer, so the backbone needs ``skip_from + 1``
layers; ``sentemb.ops.shapes.layers_needed``). No other method depends on depth: every layer of an
encoder has the same shape.

Dedupe (the suite's budget): runs that would take the same step are tested once. The key is the
method, its resolved arguments, the backbone's architecture and the train keys that change what a
step computes (``STEP_TRAIN_KEYS``: max_len, sam_rho, unpad, precision, sampler, dropout,
compile; grad_accum as 1 or "more than 1", the same code path). In the arguments, a float is
reduced to zero or non-zero (a weight, rate or temperature changes numbers, not the step; zero may
switch a term off) and the integers of ``SCALAR_INT_ARGS`` (a schedule or a count, not a shape) are
dropped; every other integer (a layer count, a width, a length) is kept exactly, so a new integer
argument is tested per value until it is listed there. Batch size, learning rate, epochs and seeds
do not change the step's code and are not in the key.

fp16 (the suite's budget): on a CPU an fp16 matmul has no native kernel and runs about 20x slower
than fp32 (this project's 2-core machine: 1.97 s against 0.11 s for 128x1024 @ 1024x30522), which made
infocse-code on BERT-large take 122 s of the suite. What fp16 changes in a step (autocast's dtype, the
gradient scaler) does not depend on the width, so a run in fp16 takes its step in fp16 at the
narrowest width the configuration runs that method in fp16 with the same train keys
(``STEP_TRAIN_KEYS``: SAM, accumulation, compile, ... meet the scaler; ``FP16_WIDTH``), and in bf16
at wider ones: their shapes are still taken at their real widths.

bf16 and fp16 products run as fp32 GEMMs of the same inputs, rounded back (``sentemb.ops.flops.
fp32_gemms``): what a native kernel computes up to the order of its sums. This CPU (AVX2) has no bf16
GEMM: a linear layer's backward ran at 0.8 GFLOP/s in bf16, and infocse-code on BERT-large took 127 s
of the suite in bf16.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
import torch

from conftest import REPO, SHARED, SKIP_REASON

CONFIG = REPO / "config" / "config.yaml"

#: the published Hugging Face config.json shape fields (hub: google-bert/*, FacebookAI/*)
PUBLISHED = {
    "bert-base-uncased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                              vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0),
    "bert-large-uncased": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                               vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0),
    "roberta-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                         vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2),
    "roberta-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                          vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                          bos_token_id=0, eos_token_id=2),
}
#: published parameter counts of the encoders without BERT's NSP pooler (~110M, 340M, 125M, 355M)
PUBLISHED_PARAMS = {"bert-base-uncased": 108_891_648, "bert-large-uncased": 334_092_288,
                    "roberta-base": 124_055_040, "roberta-large": 354_310_144}

STEP_TRAIN_KEYS = ("max_len", "sam_rho", "unpad", "precision", "sampler", "dropout", "compile")
#: integer arguments that are a schedule or a count, not a shape (each method's ``schedule_args``):
#: dropped from the dedupe key
SCALAR_INT_ARGS = {n: set(cls.schedule_args) for n, cls in __import__("sentemb.methods", fromlist=["registry"]).registry().items()}
#: arguments that change only which tokens a batch holds, not a tensor's shape: one step covers them
#: (PaSeR's EDA operation: its batch builder is tested in tests/test_paser.py)
DATA_ONLY_ARGS = {"paser": {"eda"}}
BATCH = 4


def step_key(run, arch: str) -> str:
    def reduce(k, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        if isinstance(v, float):
            return "zero" if v == 0 else "nonzero"
        return None if k in SCALAR_INT_ARGS.get(run.method, ()) else v

    args = {k: reduce(k, v) for k, v in sorted(run.method_args.items())
            if k != "pretrain" and k not in DATA_ONLY_ARGS.get(run.method, ())}
    train = {k: getattr(run.train, k) for k in STEP_TRAIN_KEYS} | {"accum": min(run.train.grad_accum, 2)}
    return json.dumps([run.method, arch, args, train], sort_keys=True, default=str)


def _cases():
    """(id, run) of every distinct step of the configuration's runs, the first run of each kept."""
    from sentemb.config.load import load_config, resolve_run
    from sentemb.ops.shapes import architecture_of

    config = load_config(CONFIG)
    seen, cases = {}, []
    for r in config["runs"]:
        run = resolve_run(config, r["name"], r["backbone"], (r["seeds"] or config["seeds"])[0])
        key = step_key(run, architecture_of(config["backbones"][run.backbone]["hub_id"]))
        if key not in seen:
            seen[key] = run
            cases.append(pytest.param(run, id=f"{run.name}@{run.backbone}"))
    return config, cases


CONFIG_DICT, CASES = _cases()


def arch_of(run) -> str:
    """The published architecture of the run's backbone (not of ``runs[].weights``: the same shape, the
    Hub's Condenser for infocse-code, whose hub id names none)."""
    from sentemb.ops.shapes import architecture_of

    return architecture_of(CONFIG_DICT["backbones"][run.backbone]["hub_id"])


def fp16_key(run) -> str:
    """What an fp16 step meets besides the width: the method and the train keys of ``step_key``."""
    train = {k: getattr(run.train, k) for k in STEP_TRAIN_KEYS} | {"accum": min(run.train.grad_accum, 2)}
    return json.dumps([run.method, train], sort_keys=True, default=str)


def _fp16_width() -> dict:
    """``fp16_key`` -> the narrowest hidden size at which a case runs it in fp16."""
    out: dict = {}
    for p in CASES:
        run = p.values[0]
        if run.train.precision == "fp16":
            h, key = PUBLISHED[arch_of(run)]["hidden_size"], fp16_key(run)
            out[key] = min(h, out.get(key, h))
    return out


FP16_WIDTH = _fp16_width()


def test_published_shapes_are_the_architectures_the_package_builds():
    from sentemb.ops.shapes import ARCHITECTURES, hf_config, parameter_count

    assert set(ARCHITECTURES) == set(PUBLISHED)
    for arch, want in PUBLISHED.items():
        cfg = hf_config(arch)
        assert {k: getattr(cfg, k) for k in want} == want, arch
        assert parameter_count(arch) == PUBLISHED_PARAMS[arch], arch
    # RoBERTa's positions start after the padding index: 512 tokens + pad + offset
    assert hf_config("roberta-base").max_position_embeddings == 512 + hf_config("roberta-base").pad_token_id + 1


def test_every_configured_backbone_has_a_published_architecture_and_every_run_a_case():
    from sentemb.ops.shapes import architecture_of

    weights_only = {r["weights"] for r in CONFIG_DICT["runs"]} - {r["backbone"] for r in CONFIG_DICT["runs"]} - {None}
    assert weights_only == {"condenser-bert-base", "condenser-bert-large"}  # starting weights (infocse-code)
    for name, b in CONFIG_DICT["backbones"].items():
        if name not in weights_only:
            assert architecture_of(b["hub_id"]) == name
    assert len(CONFIG_DICT["runs"]) > len(CASES) >= len({(r["method"], r["backbone"]) for r in CONFIG_DICT["runs"]})


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real_shapes")


@pytest.fixture(scope="module")
def corpus(workdir) -> Path:
    """64 lines of 4 to 40 words (ArcCSE's triplets need sentences of >= 25 words), enough to fill max_len 32."""
    from conftest import TINY_WORDS

    rng = random.Random(0)
    p = workdir / "corpus.txt"
    p.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 40))) + "\n"
                         for _ in range(64)), "utf-8")
    return p


_CACHE: dict = {}


def model_dir(workdir: Path, arch: str, layers: int) -> Path:
    from sentemb.ops.shapes import write_model_dir

    key = ("model", arch, layers)
    if key not in _CACHE:
        _CACHE[key] = write_model_dir(arch, workdir / f"{arch}-{layers}l", num_layers=layers)
    return _CACHE[key]


def build_input(name: str, run, workdir: Path, corpus: Path, model: Path, arch: str, layers: int) -> Path:
    """Input ``name`` of ``run`` on the tiny corpus, by the package's own statistics functions."""
    key = (name, arch, layers) if name in ("token_freq", "pretrained") else (name,)
    if key in _CACHE:
        return _CACHE[key]
    d = workdir / "inputs" / "-".join(map(str, key))
    d.mkdir(parents=True, exist_ok=True)
    if name == "token_freq":
        from sentemb.stats.frequency import write_token_frequencies

        out = d / "token_freq.parquet"
        write_token_frequencies(corpus, model, out)
    elif name == "paraphrases":
        out = d / "paraphrases.txt"  # a stand-in paraphrase per line: the words reversed
        out.write_text("".join(" ".join(reversed(x.split())) + "\n" for x in corpus.read_text("utf-8").splitlines()))
    elif name in ("tfidf", "tfidf_para"):
        from sentemb.stats.tfidf import write_tfidf

        out = d / f"{name}.parquet"
        extra = [build_input("paraphrases", run, workdir, corpus, model, arch, layers)] if name == "tfidf_para" else []
        write_tfidf([corpus, *extra], out, workers=1)
    elif name == "nltk":
        if SHARED is None:
            pytest.skip(SKIP_REASON)
        out = SHARED / "nltk_data"
    elif name == "rake":
        from sentemb.stats.rake import write_rake

        out = d / "rake_top5.parquet"
        write_rake(corpus, build_input("nltk", run, workdir, corpus, model, arch, layers), out, top_k=5, workers=1)
    elif name == "pretrained":
        out = pretrained_stage(run, d, corpus, model)
    else:
        pytest.fail(f"method '{run.method}' requires input '{name}' and this test has no builder for it")
    _CACHE[key] = out
    return out


def pretrained_stage(run, d: Path, corpus: Path, model: Path) -> Path:
    """The method's pretraining stage as the workflow resolves it (``resolve_pretrain``), one step."""
    from sentemb.train.pretrain import resolve_pretrain, run_pretrain

    stage = resolve_pretrain(CONFIG_DICT, run.method, run.backbone)
    stage = local(stage, corpus, model, {})
    run_pretrain(stage, d / "stage", progress=False)
    return d / "stage" / "model"


def local(run, corpus: Path, model: Path, inputs: dict, precision: str | None = None):
    """``run`` with local paths and one optimizer step of ``BATCH`` sentences on CPU, no tracking,
    no dev evaluation; every train key that changes the step (``STEP_TRAIN_KEYS``) kept, but for
    ``precision`` where it is given (fp16 at a wider width, see the module's docstring)."""
    train = dataclasses.replace(run.train, batch_size=BATCH, precision=precision or run.train.precision, grad_accum=min(run.train.grad_accum, 2), max_steps=1,
                                epochs=1, model_selection="last", eval_at_end=False, device="cpu", prefetch=False,
                                save_steps=10**6, log_steps=1)
    return dataclasses.replace(run, train=train, tracking={"enabled": False, "uri": None},
                               paths={"model": str(model), "corpus": str(corpus), "senteval": None, "stats": None,
                                      "inputs": {k: str(v) for k, v in inputs.items()}})


# ------------------------------------------------------------------------------------ the step
@pytest.mark.parametrize("run", CASES)
def test_one_optimizer_step_at_the_real_widths(run, workdir, corpus):
    from sentemb.methods import get_method
    from sentemb.ops.flops import fp32_gemms
    from sentemb.ops.shapes import layers_needed
    from sentemb.train.loop import State, run_steps, setup

    arch = arch_of(run)
    layers = layers_needed(run.method, run.method_args)
    model = model_dir(workdir, arch, layers)
    cls = get_method(run.method)
    inputs = {n: build_input(n, run, workdir, corpus, model, arch, layers)
              for n in cls.requires(cls.make_args(run.method_args))}
    precision = run.train.precision
    if precision == "fp16" and PUBLISHED[arch]["hidden_size"] > FP16_WIDTH[fp16_key(run)]:
        precision = "bf16"  # fp16's own step is the narrower case's (the module's docstring)
    with setup(local(run, corpus, model, inputs, precision), "/nonexistent") as job:
        cfg = job.method.encoder.config
        want = PUBLISHED[arch]
        assert {k: getattr(cfg, k) for k in want if k != "num_hidden_layers"} == \
            {k: v for k, v in want.items() if k != "num_hidden_layers"}
        assert cfg.num_hidden_layers == layers
        # the encoder's vectors (biases, LayerNorm): cheap to compare, and every layer's change with any gradient
        before = {n: p.detach().clone() for n, p in job.method.named_parameters() if p.requires_grad and p.ndim == 1}
        state = State()
        with fp32_gemms():  # the module's docstring: bf16/fp16 products as a native kernel computes them
            steps = list(run_steps(job, state, 1))
        assert len(steps) == 1 and state.step == 1
        loss = state.terms["loss"]
        assert loss.dtype == torch.float32 and math.isfinite(float(loss)), f"{run.name}: loss {loss}"
        changed = [n for n, p in job.method.named_parameters() if n in before and not torch.equal(p, before[n])]
        assert any(n.startswith("encoder.") for n in changed), f"{run.name}: the step left the encoder unchanged"
