"""The method contract, for anyone's method (issue 27 §2): ``sentemb check-method NAME`` and your tests.

Every registered method — the six built-in ones and a method in your own file (``method_modules``)
— obeys one contract with the shared loop. This module runs it on a tiny random encoder (a 2-layer
BERT of hidden 32 with a WordPiece vocabulary of ~130 words, built here), a 64-line corpus and a
SentEval-shaped tree of 12 pairs per file. It needs no network and no GPU. Each check is a function
of a ``Harness`` that raises ``CheckFailed`` naming what broke:

=============  ==========================================================================================
check          what it asserts
=============  ==========================================================================================
arguments      unknown and mistyped arguments refused naming the key; every argument documented; a
               default inside its choices and bounds; every bound refuses a value just outside it;
               the declared inputs are known kinds
batches        ``build_batch`` gives a flat dict of CPU tensors, identical for the same (seed, micro),
               and the same with the corpus's token cache as with the tokenizer
loss           a finite fp32 scalar loss; scalar logged terms; the weighted terms (``WEIGHTED``) carry
               the graph, are named as logged and sum to the loss; its gradient reaches the encoder
buckets        with ``train.buckets`` (CUDA's default ``auto``) every row group is padded to one bucket width
               and, dropout off, the logged terms equal the unbucketed batch's
bf16           the same under bf16 autocast (the CPU's is the code CUDA's runs): the encoder in bf16,
               every term fp32, an fp32 gradient reaching the encoder
export         export == the training-time dev embedder == ``sentemb evaluate``'s embedder ==
               ``SentenceTransformer(path)`` (1e-5)
resume         no tensor outside the checkpoint changes between steps; killed after 2 steps and resumed,
               the run's history and exported weights are bit-identical
grad_norms     each logged ``train/grad_norm/<term>`` equals a fresh backward of that weighted term
chunked        gradient caching (``train.chunk_size``): a chunked step has the unchunked gradient
               (dropout off, and on with keyed masks), and ``grad_accum`` over smaller batches does not
pretrain       a method's pretraining stage (``Method.pretrain_stage``) is chunked to the same gradient
               (skipped without one)
devices        ``train.devices: 2`` (two gloo processes started by ``sentemb train``) trains the weights
               of one process
graphs         ``train.graphs: true`` (the static-shape step a CUDA graph replays, on a CPU run eagerly with
               the capture check), whole and chunked, trains to the eager weights and state (dropout off);
               what a replay cannot serve fails naming the op or attribute and the method's line
fused          ``train.fuse_micro_batches: 2`` (one forward over a step's micro-batches; a method declaring
               ``Method.fusable``), with and without the paper's train settings: the accumulated run's weights
               and logged terms (dropout off); refused, naming it, for a method that does not declare it
state_chunked  a method that keeps state (``Method.after_step``, buffers, frozen parameters, extra state):
               its whole state after 3 steps is the unchunked run's with ``train.chunk_size``
state_devices  ... every rank's whole state after 3 steps on ``train.devices: 2`` is the one process's
state_accum    ... ``grad_accum: 2`` of B/2 gives the whole state of 1 × B (where ``Method.accum_equal``)
state_sam      ... under SAM the second pass over a micro-batch sees the state the first pass saw
state_resume   ... killed after a step and resumed, the whole state after 3 steps is bit-identical
state_graphed  ... ``train.graphs: true`` gives the eager run's whole state after 3 steps of 2 micro-batches,
               and what a replayed graph would not redo (Python state, host reads) is refused
state_epoch    a method with ``Method.before_epoch``: killed at an epoch's end and resumed, its whole state
               two epochs on is bit-identical, and graphed it is the eager run's
=============  ==========================================================================================

The ``state_*`` checks skip a method whose state is its trainable weights alone (the weights' own
checks and tests cover it): they compare what a checkpoint holds (``method_state``), so they catch a
method that changes its state outside ``after_step`` (on every ``encode`` call, or enqueuing at once).

Use it from your own pytest suite::

    import pytest
    from sentemb import testing
    from sentemb.methods import import_method_module

    import_method_module("my_method.py")  # registers the method (a file, or a module name)

    @pytest.mark.parametrize("check", testing.CHECKS)
    def test_my_method_keeps_the_contract(check, tmp_path_factory):
        testing.run_check("my-method", check, testing.harness("my-method", tmp_path_factory.mktemp("h")))

or from the command line: ``sentemb check-method my-method --method-module my_method.py``.

A method whose defaults do not suit a 2-layer, hidden-32 encoder declares its overrides in the
class attribute ``contract_args`` (e.g. InfoCSE's ``skip_from: 1``). Inputs (``Method.requires``)
are built on the tiny corpus by their ``sentemb.stats.inputs`` entries; a method that needs a kind of input
of its own registers one (``sentemb.stats.inputs.register_input``) with a ``build`` function.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from . import SentembError

#: the tiny WordPiece vocabulary's words (the tiny encoder, corpus and SentEval tree use them)
TINY_WORDS = (
    "the a an of and to in is was for on that with as by it at from his her he she they "
    "man woman dog cat plays playing guitar piano car red blue big small runs running is are "
    "sits sitting on mat park street city house tree sky sun water eats food apple music "
    "one two three new old good bad very not no yes this these there here what who"
).split()

#: the sentences the single-batch checks use
SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat",
         "she eats an apple in the house", "two old men are playing music in the street"]

REL = 1e-5  # fp32 round-off of another summation order (see ``close``)


class CheckFailed(AssertionError):
    """A contract check failed; the message names what broke."""


class CheckSkipped(Exception):
    """A check that does not apply (no pretraining stage) or cannot run here (data it needs is absent)."""


def _stderr_tail(r) -> str:
    """A failed subprocess's last stderr line, then its last 30 lines (a worker's traceback that the
    launcher's own last line only points at, "the first error is above"), at most 3,000 characters."""
    lines = r.stderr.strip().splitlines() or [""]
    tail = "\n".join(lines[-30:])[-3000:]
    return lines[-1][:400] + (f"\n--- its stderr, last lines ---\n{tail}" if len(lines) > 1 else "")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


# ------------------------------------------------------------------------------------ the tiny world
#: what a DAG's working directory holds once its inputs are made (at the default ``resources_dir`` and
#: ``results_dir``): fetched models and data, prepared corpora, token caches, corpus statistics
DAG_INPUTS = ("resources", "results/stats")


def simcse_dag_config(base: str | Path, tasks: tuple[str, ...] = ("STSBenchmark", "SICKRelatedness")) -> dict:
    """The DAG config ``base`` (a YAML file, e.g. the repository's ``.test/config.yaml``) reduced to one
    SimCSE run on its first backbone at one seed, no study, no untrained baseline, no transfer task, the
    STS tasks ``tasks``: the DAG of the checks of the DAG's own machinery (the fault matrix, the tracked
    DAG, Slurm) rather than of the methods. Returns the mapping; the caller adjusts and writes it."""
    import yaml

    cfg = yaml.safe_load(Path(base).read_text("utf-8"))
    cfg["seeds"] = [1]
    cfg["runs"] = [{"method": "simcse", "backbone": next(iter(cfg["backbones"]))}]
    cfg["studies"] = []
    cfg["baselines"] = {}
    cfg["evaluation"]["tasks"] = list(tasks)
    for key in ("transfer", "transfer_tasks", "transfer_classifier"):
        cfg["evaluation"].pop(key, None)
    return cfg


def copy_dag_inputs(src: str | Path, dst: str | Path, subdirs: tuple[str, ...] = DAG_INPUTS) -> list[str]:
    """Give the DAG in ``dst`` the inputs another run of the same config made in ``src``, copied with
    their modification times (as a rerun finds them): its Snakemake then plans training, evaluation
    and the tables only. Returns the folders copied (those ``src`` has)."""
    import shutil

    done = []
    for sub in subdirs:
        if (Path(src) / sub).is_dir():
            shutil.copytree(Path(src) / sub, Path(dst) / sub, copy_function=shutil.copy2)
            done.append(sub)
    return done


def tiny_encoder_dir(root: str | Path) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32, 2 heads) with a tiny WordPiece vocabulary,
    saved in Hugging Face layout under ``root`` (seed 0: the same weights every time)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = Path(root)
    d.mkdir(parents=True, exist_ok=True)
    chars = [c for c in "abcdefghijklmnopqrstuvwxyz.,'" if c not in TINY_WORDS]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(TINY_WORDS)) + chars
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab=str(d / "vocab.txt"), do_lower_case=True)  # transformers 5: `vocab=`
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(d)
    return d


def tiny_senteval(root: str | Path, n: int = 12) -> Path:
    """A SentEval-shaped tree (STS12–16, STS-B, SICK) with ``n`` scored pairs per file of tiny words."""
    from .evaluate.senteval import STS_SUBSETS

    root = Path(root)
    rng = random.Random(0)

    def sent():
        return " ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(3, 9)))

    def rows():
        return [(sent(), sent(), f"{rng.uniform(0, 5):.2f}") for _ in range(n)]

    for task, subsets in STS_SUBSETS.items():
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True, exist_ok=True)
        for sub in subsets:
            r = rows()
            (d / f"STS.input.{sub}.txt").write_text("".join(f"{a}\t{b}\n" for a, b, _ in r))
            (d / f"STS.gs.{sub}.txt").write_text("".join(f"{g}\n" for *_, g in r))
    d = root / "STS" / "STSBenchmark"
    d.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        (d / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g}\t{a}\t{b}\n" for i, (a, b, g) in enumerate(rows())))
    d = root / "SICK"
    d.mkdir(parents=True, exist_ok=True)
    for fname in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (d / fname).write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + "".join(
            f"{i}\t{a}\t{b}\t{g}\tNEUTRAL\n" for i, (a, b, g) in enumerate(rows())))
    return root


def tiny_corpus(path: str | Path, lines: int = 64, seed: int = 1, words: tuple[int, int] = (4, 30)) -> Path:
    """``lines`` sentences of tiny words, ``words`` long (the contract's corpus: 64 lines of 4–30
    words, so that 16-sentence batches give 4 steps and long sentences exist)."""
    rng = random.Random(seed)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(*words))) + "\n"
                         for _ in range(lines)), "utf-8")
    return p


def tiny_train(**over):
    """The contract's train settings (``sentemb.config.settings.TrainSettings``): batch 16, max_len 16, lr
    1e-3, STS-B dev every 2 steps, every step logged, on CPU; ``over`` replaces any of them."""
    from .config.settings import TrainSettings

    base = TrainSettings(batch_size=16, max_len=16, lr=1e-3, eval_steps=2, log_steps=1, save_steps=100, device="cpu")
    return replace(base, **over)


def tiny_run(model, corpus, senteval=None, method="simcse", *, seed=7, method_args=None, inputs=None, name=None,
             method_cls=None, **train_over):
    """A resolved run (``sentemb.config.settings.Run``) of ``method`` on the tiny encoder (``tiny_train``
    settings, ``train_over`` replacing some), no MLflow; ``inputs``: the method's inputs by name.
    ``method_cls``: a class not in the registry (its module is recorded for a training subprocess)."""
    from .methods import get_method, method_source
    from .config.settings import Run

    cls = method_cls or get_method(method)
    source = {}
    if not cls.__module__.startswith("sentemb.methods."):
        src = method_source(cls)
        source = {"method_module": src[0], "method_digest": src[1]} if src else {}
    return Run(name=name or method, method=method, backbone="tiny", seed=seed, train=tiny_train(**train_over),
               method_args=cls.resolve_args(method_args or {}), experiment="t",
               tracking={"enabled": False, "uri": None},
               paths={"model": str(model), "corpus": str(corpus), "senteval": str(senteval) if senteval else None,
                      "inputs": {k: str(v) for k, v in (inputs or {}).items()}}, **source)


# ------------------------------------------------------------------------------------ inputs
def build_inputs(cls, args: dict, work: Path, corpus: Path, model_dir: Path) -> dict[str, Path]:
    """Every input ``cls.requires(args)`` declares, built on the tiny corpus by its ``sentemb.stats.inputs``
    entry (a plug-in's own kind too, once its file ran ``register_input``); ``pretrained``: the
    method's own pretraining stage, 1 step. ``CheckSkipped`` where one cannot be built here."""
    from .stats.inputs import InputUnavailable, build_input, get_input

    built = {}
    for n in cls.requires(cls.make_args(args)):
        get_input(n, f"method '{cls.name}' requires")
        try:
            built[n] = (_pretrained(cls, args, work, corpus, model_dir) if n == "pretrained"
                        else build_input(n, work / n, corpus, model_dir))
        except InputUnavailable as e:
            raise CheckSkipped(f"input '{n}': {e}") from None
    return built


def _pretrained(cls, args, work, corpus, model_dir) -> Path:
    """The method's own pretraining stage (``Method.pretrain_stage``), 1 step on the tiny corpus."""
    from .train.pretrain import run_pretrain

    if cls.pretrain_stage is None:
        raise SentembError(f"method '{cls.name}' requires 'pretrained' but has no pretrain_stage")
    run = tiny_run(model_dir, corpus, None, cls.name, seed=5, method_args=args, name=f"{cls.name}-pretrain",
                   method_cls=cls, max_steps=1, eval_steps=1, eval_at_end=False, model_selection="last")
    run.rule = "pretrain"
    run_pretrain(run, work / "pretrain", progress=False)
    return work / "pretrain" / "model"


# ------------------------------------------------------------------------------------ the harness
@dataclass
class Harness:
    """One method on the tiny world: its class, contract arguments, encoder, corpus, SentEval tree,
    inputs, and a scratch directory (``work``)."""

    cls: type
    args: dict
    model_dir: Path
    corpus: Path
    senteval: Path
    inputs: dict = field(default_factory=dict)
    work: Path = Path(".")
    #: what several checks share (the 3-step reference state of the ``state_*`` checks)
    cache: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.cls.name

    def scratch(self, what: str) -> Path:
        d = self.work / f"{what}-{time.monotonic_ns()}"
        d.mkdir(parents=True)
        return d

    def make(self, seed: int = 3, inputs: dict | None = None):
        """The method built on the tiny encoder (``max_len`` 16)."""
        from .methods import MethodContext
        from .model.backbone import load_encoder

        enc, tok = load_encoder(self.model_dir, pooling_layer=False)
        ctx = MethodContext(max_len=16, seed=seed, backbone="tiny", model_dir=self.model_dir,
                            inputs=self.inputs if inputs is None else inputs, corpus=self.corpus)
        return self.cls(enc, tok, self.args, ctx)

    def run(self, args: dict | None = None, **over):
        """A 4-step run (batch 16 of the 64 lines) of the method with its contract args and inputs."""
        return tiny_run(self.model_dir, self.corpus, self.senteval, self.name, seed=5,
                        method_args=self.args if args is None else args, inputs=self.inputs, method_cls=self.cls,
                        **{"max_steps": 4, **over})

    def exact_run(self, **over):
        """``run`` in fp32, the last model kept, batches built in line: for the gradient comparisons.
        With ``dropout: 0.0`` every dropout of the method is off (``Method.contract_no_dropout``)."""
        args = self.args
        if over.get("dropout") == 0.0:
            args = {**args, **getattr(self.cls, "contract_no_dropout", {})}
        return self.run(args, **{"precision": "fp32", "model_selection": "last", "prefetch": False,
                                 "token_cache": False, **over})


def harness(method: str | type, work: str | Path, *, args: dict | None = None, model_dir: Path | None = None,
            senteval: Path | None = None) -> Harness:
    """The tiny world for ``method`` (a registered name or a ``Method`` subclass) under ``work``:
    the tiny encoder (or ``model_dir``), the 64-line corpus, a SentEval tree (or ``senteval``), and
    the inputs the method declares with its contract arguments (``args``, default the class's
    ``contract_args``). ``CheckSkipped`` when an input cannot be built here (NLTK data absent)."""
    from .methods import get_method

    cls = get_method(method) if isinstance(method, str) else method
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = model_dir or (work / "encoder" if (work / "encoder" / "config.json").is_file()
                              else tiny_encoder_dir(work / "encoder"))
    senteval = senteval or tiny_senteval(work / "senteval")
    a = dict(getattr(cls, "contract_args", {}) or {}) if args is None else dict(args)
    cls.validate_args(a, f"{cls.__name__}.contract_args")
    (work / "inputs").mkdir(exist_ok=True)
    corpus = tiny_corpus(work / "inputs" / "corpus.txt")
    inputs = build_inputs(cls, a, work / "inputs", corpus, model_dir)
    return Harness(cls=cls, args=a, model_dir=model_dir, corpus=corpus, senteval=senteval, inputs=inputs,
                   work=work)


# ------------------------------------------------------------------------------------ comparisons
def close(a: dict, b: dict, what: str, rel: float = REL, floor: float | str | None = None) -> None:
    """Tensors ``a`` and ``b`` by name agree: for the whole, ‖Δ‖ ≤ rel·‖b‖; per tensor p, ‖Δ_p‖ ≤
    rel·‖b_p‖ + floor, the floor 1e-2·rel·‖b‖ (``None``: gradients that are zero in exact arithmetic,
    e.g. attention key biases, softmax being shift-invariant), rel·‖b‖ (``"whole"``: weights, where
    AdamW turns the round-off of a gradient element near ε into a visible share of a step) or a number."""
    _require(a.keys() == b.keys(), f"{what}: different tensors {sorted(set(a) ^ set(b))}")
    total = sum(float(v.double().norm()) ** 2 for v in b.values()) ** 0.5
    err = sum(float((a[k].double() - b[k].double()).norm()) ** 2 for k in a) ** 0.5
    _require(err <= rel * total, f"{what}: ‖Δ‖ {err:.3g} vs ‖ref‖ {total:.3g} (relative {err / max(total, 1e-30):.2g})")
    for k in a:
        e, r = float((a[k].double() - b[k].double()).norm()), float(b[k].double().norm())
        bound = rel * r + {None: 1e-2 * rel * total, "whole": rel * total}.get(floor, floor)
        _require(e <= bound, f"{what}: {k}: ‖Δ‖ {e:.3g} vs ‖ref‖ {r:.3g} (whole {total:.3g})")


def same_model(a: Path, b: Path, what: str) -> None:
    """Every tensor of the exported model under ``a`` equals the one under ``b``, bit for bit."""
    import torch
    from safetensors.torch import load_file

    files = sorted(Path(a).rglob("*.safetensors"))
    _require(bool(files), f"{what}: no weights in {a}")
    for f in files:
        x, y = load_file(f), load_file(Path(b) / f.relative_to(a))
        _require(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x),
                 f"{what}: {f.relative_to(a)} differs")


def step_gradients(cfg, method_cls=None) -> tuple[dict, Any]:
    """The gradient of optimizer step 0 of ``cfg`` (every micro-batch accumulated), by name, and
    the chunk size the loop chose."""
    import torch

    from .train.loop import micro_batches, setup
    from .train.step import micro_batch_strategy

    with setup(cfg, "/nonexistent", method_cls) as job:
        torch.manual_seed(11)
        micro_batch_strategy(job).gradients(job, micro_batches(job, 0), None)
        grads = {n: p.grad.detach().clone() for n, p in job.method.named_parameters() if p.grad is not None}
        return grads, job.chunk


def kill_and_resume(cfg, out: Path, what: str, method_cls=None, after: int = 2) -> dict:
    """Train ``cfg`` uninterrupted, and again killed after ``after`` steps and resumed: the same history
    and bit-identical exported weights. Returns the uninterrupted run's summary. Two steps by default:
    a state that a checkpoint misses may show only in the second (an EMA that starts as a copy of the
    encoder is that copy after step 1 as well)."""
    from .train.loop import train

    full = train(cfg, out / "full", progress=False, method_cls=method_cls)
    try:
        train(cfg, out / "resumed", stop_after=after, progress=False, method_cls=method_cls)
    except KeyboardInterrupt as e:  # the stop_after hook's; a real Ctrl-C or SIGTERM stops the check
        if "test hook" not in str(e):
            raise
    else:
        raise CheckFailed(f"{what}: stop_after={after} did not stop the run")
    res = train(cfg, out / "resumed", progress=False, method_cls=method_cls)
    _require(res["history"] == full["history"], f"{what}: the resumed run's history differs from the uninterrupted one")
    same_model(out / "full" / "model", out / "resumed" / "model", f"{what}: resumed")
    return full


# ------------------------------------------------------------------------------------ the checks
def check_arguments(h: Harness) -> None:
    """Typed arguments: unknown and mistyped values refused naming the key, every argument
    documented, defaults inside their choices and bounds, every bound refusing a value just outside
    it (``where.<arg>: <value>``), and the declared inputs known kinds."""
    from .config.fields import meta_of
    from .stats.inputs import INPUTS

    cls, name = h.cls, h.name

    def refused(args, key, what):
        try:
            cls.validate_args(args, "methods." + name)
        except SentembError as e:
            _require(f"methods.{name}.{key}" in str(e), f"{what}: the error does not name methods.{name}.{key}: {e}")
        else:
            raise CheckFailed(f"{what} was accepted")

    refused({"no_such_arg": 1}, "no_such_arg", "an unknown argument 'no_such_arg'")
    for spec in cls.arg_specs():
        _require(bool(spec.help), f"argument '{spec.name}' has no help text (arg(default, 'help', ...))")
        if spec.choices:
            _require(spec.default in spec.choices, f"argument '{spec.name}': default {spec.default!r} not in its choices")
        if spec.type in ("float", "int", "bool"):
            refused({spec.name: "not a value"}, spec.name, f"'{spec.name}': 'not a value' for a {spec.type}")
        meta = meta_of(cls.Args, spec.name)
        step = 1 if spec.type.startswith("int") else 1e-9
        for key, outside in (("minimum", -step), ("exclusive_minimum", 0), ("maximum", step), ("exclusive_maximum", 0)):
            if meta.get(key) is None:
                continue
            bad = meta[key] + outside
            refused({spec.name: int(bad) if spec.type.startswith("int") else float(bad)}, spec.name,
                    f"'{spec.name}': {bad!r} outside its {key} {meta[key]!r}")
    try:
        from .config.load import validate_config

        cls.validate_args(cls.arg_defaults(), "defaults")
        # a validated config with one run of the method at its defaults (Method.check gets one)
        config = validate_config({"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": cls.name, "backbone": "b"}]})
        cls.check(cls.make_args({}), config, "defaults")
    except SentembError as e:
        raise CheckFailed(f"the default arguments are refused: {e}") from None
    unknown = set(cls.requires(cls.make_args(h.args))) - set(INPUTS)
    _require(not unknown, f"requires() names unknown input kinds {sorted(unknown)} (known: {', '.join(INPUTS)}; "
             "register yours with sentemb.stats.inputs.register_input)")


def check_batches(h: Harness) -> None:
    """``build_batch``: a flat dict of CPU tensors, identical for the same (seed, micro), and the
    same with the corpus's token cache in ``ctx`` (what the loop gives) as with the tokenizer."""
    import torch

    from .data.tokens import TokenCache

    lines = list(range(len(SENTS)))
    a = h.make().build_batch(SENTS, step=0, lines=lines, micro=7)
    b = h.make().build_batch(SENTS, step=0, lines=lines, micro=7)
    _require(isinstance(a, dict) and bool(a), f"build_batch returned {type(a).__name__}, not a non-empty dict")
    for k, v in a.items():
        _require(isinstance(v, torch.Tensor), f"batch['{k}'] is {type(v).__name__}, not a tensor")
        _require(v.device.type == "cpu", f"batch['{k}'] is on {v.device}, not the CPU (the loop moves it)")
        _require(torch.equal(v, b[k]), f"batch['{k}'] differs for the same (seed, micro): draw every random choice "
                 "from self.np_rng(micro) or self.torch_rng(micro), not a global generator")
    m = h.make()
    m.ctx.tokens = TokenCache.build(SENTS, m.tokenizer)
    cached = m.build_batch(SENTS, step=0, lines=lines, micro=7)
    _require(a.keys() == cached.keys(), f"with the token cache the batch has keys {sorted(cached)}, not {sorted(a)}")
    for k in a:
        _require(torch.equal(a[k], cached[k]), f"batch['{k}'] differs with the token cache")


def check_buckets(h: Harness) -> None:
    """``train.buckets`` (on CUDA ``auto`` by default): each row group of a batch is padded to a bucket
    (``Method.width``, ``pad_rows``), one width a group (``width_groups``, ``batch_shapes``), never
    narrower than without buckets; and with every dropout off (encoder and ``contract_no_dropout``)
    every logged term equals the unbucketed batch's (``REL``), on a batch of the corpus's shortest
    lines and one of middle length (the longest are cut at max_len, past every bucket), each with
    buckets that pad it 3 positions. A method that tokenizes rows of its own without ``pad_rows``
    fails here, not on its first GPU run (on a CPU ``auto`` means none)."""
    import torch

    from .data.buckets import batch_shapes
    from .methods import MethodContext
    from .methods.base import WEIGHTED
    from .model.backbone import load_encoder

    enc, tok = load_encoder(h.model_dir, dropout=0.0, pooling_layer=False)
    ctx = MethodContext(max_len=16, seed=3, backbone="tiny", model_dir=h.model_dir, inputs=h.inputs, corpus=h.corpus)
    m = h.cls(enc, tok, {**h.args, **getattr(h.cls, "contract_no_dropout", {})}, ctx).train()
    corpus = h.corpus.read_text("utf-8").splitlines()
    by_len = sorted(range(len(corpus)), key=lambda i: (len(corpus[i].split()), i))
    fix = ("pad every row group the method tokenizes itself with self.pad_rows(...) or to self.width(n) "
           "(docs/methods/writing-a-method.md, section 2)")

    def terms(batch, what):
        torch.manual_seed(0)
        try:
            with torch.no_grad():
                out = m.losses(batch)
        except Exception as e:  # noqa: BLE001 - the method's own error, with what to do
            raise CheckFailed(f"{what}: losses() failed: {type(e).__name__}: {e}; {fix}") from e
        flat = {k: float(v) for k, v in out.items() if k != WEIGHTED}
        flat.update({f"{WEIGHTED}/{k}": float(v) for k, v in out.get(WEIGHTED, {}).items()})
        return flat

    for which, lines in (("shortest lines", by_len[:8]), ("middle lines", by_len[len(by_len) // 2:][:8])):
        sents = [corpus[i] for i in lines]
        m.ctx.buckets = None
        plain = m.build_batch(sents, step=0, lines=lines, micro=1)
        # buckets that pad this batch's sentences 3 positions past their longest row (a natural width
        # of any other row group then differs from its bucket's too), and max_len
        w = max((v.size(1) for k, v in plain.items() if v.dim() >= 2 and k.endswith("input_ids")), default=0)
        if not w:
            raise CheckSkipped("the batch has no token rows (no key ending in input_ids) to pad")
        buckets = (min(w + 3, m.ctx.max_len), m.ctx.max_len) if w + 3 < m.ctx.max_len else (m.ctx.max_len,)
        m.ctx.buckets = buckets
        padded = m.build_batch(sents, step=0, lines=lines, micro=1)
        what = f"buckets {list(buckets)}, the {which}"
        _require(plain.keys() == padded.keys(), f"{what}: batch keys {sorted(padded)}, not {sorted(plain)}")
        try:  # the token rows only (a (B, K) index or feature matrix of the method's own is no row group)
            shapes, plain_shapes = batch_shapes(_token_rows(padded), m.width_groups), \
                batch_shapes(_token_rows(plain), m.width_groups)
        except SentembError as e:
            raise CheckFailed(f"{what}: {e}; {fix}, or name the group in width_groups") from None
        for g, (_, gw) in shapes.items():
            _require(gw >= plain_shapes.get(g, (0, 0))[1], f"{what}: group '{g}' is {gw} wide, narrower than without "
                     f"buckets ({plain_shapes[g][1]})")
        a, b = terms(plain, f"{what}, without buckets"), terms(padded, what)
        _require(a.keys() == b.keys(), f"{what}: logged terms {sorted(b)}, not {sorted(a)}")
        for k in a:
            _require(math.isfinite(a[k]) and abs(a[k] - b[k]) <= REL * max(abs(a[k]), abs(b[k])) + 1e-7,
                     f"{what}: '{k}' is {b[k]!r}, without buckets {a[k]!r} (dropout off: padding must not change "
                     "a loss; mask padded positions by the attention mask, and draw random choices over the real "
                     "width, not the padded one)")


#: the keys of token rows (``check_buckets``): what ``pad_rows`` pads, in any row group (``tri_input_ids``)
TOKEN_ROW_SUFFIXES = ("input_ids", "attention_mask", "token_type_ids", "labels")


def _token_rows(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k.endswith(TOKEN_ROW_SUFFIXES)}


def _losses_hold(h: Harness, terms: dict, what: str) -> None:
    import torch

    from .methods.base import WEIGHTED

    weighted = terms.pop(WEIGHTED, None)
    loss = terms.get("loss")
    _require(isinstance(loss, torch.Tensor), f"{what}: losses() has no 'loss' tensor (keys {sorted(terms)})")
    _require(loss.dtype == torch.float32 and loss.ndim == 0, f"{what}: loss is {loss.dtype} of shape {tuple(loss.shape)}, "
             "not an fp32 scalar")
    _require(bool(torch.isfinite(loss.detach())), f"{what}: loss is {float(loss.detach())}")
    for k, v in terms.items():
        v = torch.as_tensor(v)
        _require(v.numel() == 1, f"{what}: logged term '{k}' is not a scalar")
        _require(v.dtype == torch.float32, f"{what}: logged term '{k}' is {v.dtype}, not fp32")
    _require(bool(weighted), f"{what}: losses() returns no weighted terms (WEIGHTED: {{name: w·L_name}})")
    _require(set(weighted) <= set(terms) - {"loss"}, f"{what}: weighted terms {sorted(weighted)} are not among the "
             f"logged terms {sorted(set(terms) - {'loss'})}")
    _require(any(v.requires_grad for v in weighted.values()), f"{what}: no weighted term carries the graph")
    for k, v in weighted.items():
        _require(v.dtype == torch.float32, f"{what}: weighted term '{k}' is {v.dtype}, not fp32")
    total = float(sum(weighted.values()).detach())
    _require(math.isclose(total, float(loss.detach()), rel_tol=1e-6, abs_tol=1e-7),
             f"{what}: the weighted terms sum to {total}, the loss is {float(loss.detach())}")


def check_loss(h: Harness) -> None:
    """A finite fp32 scalar loss with scalar logged terms; the weighted terms carry the graph, are
    named as logged and sum to the loss; its gradient reaches the encoder."""
    import torch

    torch.manual_seed(0)
    m = h.make()
    m.train()
    terms = m.losses(m.build_batch(SENTS, step=0, lines=list(range(len(SENTS))), micro=0))
    loss = terms["loss"] if isinstance(terms, dict) and "loss" in terms else None
    _losses_hold(h, terms, "fp32")
    loss.backward()
    grads = [p.grad for p in m.encoder.parameters() if p.requires_grad and p.grad is not None]
    _require(bool(grads) and any(float(g.abs().sum()) > 0 for g in grads), "no gradient of the loss reaches the encoder")


def check_bf16(h: Harness) -> None:
    """Under bf16 autocast (``sentemb.train.loop.autocast``, the code CUDA's runs): the encoder's linear
    layers run in bf16, every term stays fp32 and finite, and an fp32 gradient reaches the encoder."""
    import torch

    from .train.loop import autocast

    torch.manual_seed(0)
    m = h.make()
    m.train()
    seen = []
    hooks = [mod.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
             for mod in m.encoder.modules() if isinstance(mod, torch.nn.Linear)]
    batch = m.build_batch(SENTS, step=0, lines=list(range(len(SENTS))), micro=0)
    with autocast(torch.device("cpu"), "bf16"):
        terms = m.losses(batch)
    for hk in hooks:
        hk.remove()
    _require(torch.bfloat16 in seen, f"the encoder did not run in bf16 under autocast ({sorted(set(map(str, seen)))})")
    loss = terms["loss"]
    _losses_hold(h, terms, "bf16 autocast")
    loss.backward()
    _require(any(p.grad is not None and p.grad.dtype == torch.float32 and float(p.grad.abs().sum()) > 0
                 for p in m.encoder.parameters()), "no fp32 gradient reaches the encoder under bf16 autocast")


def check_export(h: Harness) -> None:
    """The exported model embeds as the training-time dev embedder does, through ``sentemb
    evaluate``'s embedder and through ``SentenceTransformer(path)`` (1e-5)."""
    import numpy as np
    import torch

    from .evaluate.sts import embedder_for

    torch.manual_seed(0)
    m = h.make()
    pooler = h.cls.pooler_for(m.args)
    with torch.no_grad():  # make every head matter: non-trivial weights everywhere
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = h.scratch("export") / "model"
    dev = m.embedder(pooler, torch.device("cpu"))(SENTS)
    m.export(out, pooler, meta={"method": h.name, "name": h.name, "backbone": "tiny", "seed": 5})
    ours = embedder_for(out, pooler, device="cpu")(SENTS)
    _require(dev.shape == ours.shape, f"`sentemb evaluate` embeds shape {ours.shape}, the dev embedder {dev.shape}")
    gap = float(np.abs(ours - dev).max())
    _require(gap <= 1e-5, f"`sentemb evaluate`'s embedder differs from the training-time dev embedder by {gap:.3g}")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:  # optional dependency: the rest of the check still ran
        return
    st = SentenceTransformer(str(out), device="cpu", trust_remote_code=True).encode(SENTS, convert_to_numpy=True,
                                                                                       show_progress_bar=False)
    _require(st.shape == dev.shape, f"SentenceTransformer(path) embeds shape {st.shape}, the dev embedder {dev.shape}")
    gap = float(np.abs(st - dev).max())
    _require(gap <= 1e-5, f"SentenceTransformer(path) differs from the training-time dev embedder by {gap:.3g}")


def unsaved_tensors(method) -> dict[str, Any]:
    """The tensors a method holds that no checkpoint saves, by a name to show: its non-persistent
    buffers (``register_buffer(..., persistent=False)``), and tensors or modules kept in its own plain
    attributes, directly or in lists, tuples and dicts (``self.queue = torch.zeros(...)``,
    ``self._copies = [copy.deepcopy(encoder)]``), other than views of what ``state_dict`` holds (a
    list that refers to a registered module, so as not to register it twice). A constant or a scratch
    buffer there is fine; a state there is lost on resume."""
    import torch
    from torch import nn

    from .train.graphs import _LOOP_ATTRS, _module_internals

    saved = {t.untyped_storage().data_ptr() for t in method.state_dict(keep_vars=True).values()
             if isinstance(t, torch.Tensor)}
    out: dict[str, Any] = {}

    def put(name, t):
        if t.untyped_storage().data_ptr() not in saved:
            out[name] = t

    for mname, mod in method.named_modules():
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            t = mod._buffers.get(b)
            if t is not None:
                put(f"{mname + '.' if mname else ''}{b} (a non-persistent buffer)", t)

    def walk(name, v, depth):
        if isinstance(v, torch.Tensor):
            put(f"self.{name} (a plain attribute)", v)
        elif isinstance(v, nn.Module):
            for k, t in v.state_dict(keep_vars=True).items():
                if isinstance(t, torch.Tensor):
                    put(f"self.{name}.{k} (a module in a plain attribute, not a submodule)", t)
        elif depth < 3 and isinstance(v, dict) and len(v) <= 1000:
            for k, x in v.items():
                walk(f"{name}[{k!r}]", x, depth + 1)
        elif depth < 3 and isinstance(v, (list, tuple)) and len(v) <= 1000:
            for i, x in enumerate(v):
                walk(f"{name}[{i}]", x, depth + 1)

    skip = _module_internals() | _LOOP_ATTRS
    for k, v in vars(method).items():
        if k not in skip:
            walk(k, v, 0)
    return out


def changed_unsaved(h: Harness, steps: int = 2) -> list[str]:
    """The ``unsaved_tensors`` of the method that hold other values after ``steps`` steps of its run than
    after its first: what a resumed run would start afresh (the hint of a failed resume)."""
    import torch

    from .train.loop import State, run_steps, setup

    with setup(h.exact_run(dropout_rng="keyed"), "/nonexistent", h.cls) as job:
        state = State()
        for _ in run_steps(job, state, 1):
            pass
        first = {k: v.detach().clone() for k, v in unsaved_tensors(job.method).items()}
        for _ in run_steps(job, state, steps - 1):
            pass
        now = unsaved_tensors(job.method)
    return [k for k in now if k in first and (now[k].shape != first[k].shape or not torch.equal(now[k].detach(), first[k]))]


def check_resume(h: Harness) -> None:
    """No tensor outside the checkpoint changes between steps (``changed_unsaved``: it would start afresh
    in a resumed run, however small its effect on a tiny model's weights), and killed after 2 of 4 steps
    and resumed, the run's history and exported weights are bit-identical (two steps: a state that a
    checkpoint misses may show only in the second, as an EMA that starts as a copy of the encoder)."""
    changed = changed_unsaved(h)
    _require(not changed, f"{', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} changed between steps, but "
             "no checkpoint holds it: a resumed run starts it afresh. Register a tensor as a persistent buffer "
             "(self.register_buffer(name, tensor); scratch space rewritten every step may be one too, or be made "
             "inside the step), a module as a submodule (self.name = module; frozen with .requires_grad_(False)), "
             "or return it from get_extra_state")
    kill_and_resume(h.run(), h.scratch("resume"), "kill and resume", h.cls)


def check_grad_norms(h: Harness) -> None:
    """Each ``train/grad_norm/<term>`` the loop logs (every step, 2 accumulated micro-batches) equals
    the norm of ``.grad`` on ``grad_norm_parameters()`` after a fresh forward and backward of that
    weighted term alone, at the same weights, micro-batches and dropout masks (RNG rewound)."""
    import torch

    from .methods.base import WEIGHTED
    from .train.loop import State, _rng_state, _set_rng_state, micro_batches, run_steps, setup

    cfg = h.run(precision="fp32", model_selection="last", prefetch=False, grad_accum=2, max_steps=2,
                log_grad_norms=True)
    job, ref = setup(cfg, "/nonexistent", h.cls), setup(cfg, "/nonexistent", h.cls)
    params = ref.method.grad_norm_parameters()
    state, positive = State(), False
    while state.step < job.total:
        weights, rng = copy.deepcopy(job.method.state_dict()), _rng_state()
        batches = micro_batches(job, state.step)
        next(run_steps(job, state, 1))
        got = {k.rsplit("/", 1)[1]: v for k, v in state.history[-1].items() if k.startswith("train/grad_norm/")}
        logged = set(state.terms)
        _require(bool(got) and set(got) <= logged - {"loss"},
                 f"step {state.step}: grad norms of {sorted(got)}, logged terms {sorted(logged)}")
        ref.method.load_state_dict(weights)
        for term, value in got.items():
            ref.method.zero_grad(set_to_none=True)
            _set_rng_state(rng)
            ref.method.step = state.step - 1  # what the loop told the method during that step
            for micro, batch in batches:
                ref.method.micro = micro
                t = ref.method.losses(batch)[WEIGHTED][term]
                if t.requires_grad:
                    (t / job.accum).backward()
            grads = [p.grad.double().norm() for p in params if p.grad is not None]
            want = float(torch.stack(grads).norm()) if grads else 0.0
            _require(math.isclose(value, want, rel_tol=1e-4, abs_tol=1e-9),
                     f"step {state.step}: train/grad_norm/{term} logged {value:.6g}, a fresh backward gives {want:.6g}")
        positive |= any(v > 0 for v in got.values())
    _require(positive, "every logged gradient norm is zero")


def check_chunked(h: Harness) -> None:
    """``chunk_size: 4`` at batch 16 (4 chunks): every parameter's gradient equals the unchunked one,
    with dropout off and on (``dropout_rng: keyed``); and it is not ``batch_size: 4, grad_accum: 4``
    on the same sentences, whose negatives are within each 4 (a method without in-batch terms,
    ``has_batch_terms = False``, may equal it)."""
    for label, over, rel in (("dropout off", {"dropout": 0.0}, 1e-4), ("dropout on, keyed", {"dropout_rng": "keyed"}, REL)):
        ref, whole = step_gradients(h.exact_run(**over), h.cls)
        got, chunk = step_gradients(h.exact_run(chunk_size=4, **over), h.cls)
        _require(whole is None and chunk == 4, f"{label}: the loop chose chunks {whole} and {chunk}, not None and 4")
        _require(bool(ref) and any(float(g.abs().sum()) > 0 for g in ref.values()), f"{label}: no gradient")
        try:
            close(got, ref, f"{label}: chunked gradient", rel)
        except CheckFailed as e:
            raise CheckFailed(f"{e}. A chunk must give each sentence what the whole batch gives it: encode treats "
                              "rows independently (no statistic over the batch's rows, such as a mean or a "
                              "BatchNorm in training mode, before batch_terms), a term over pairs of the batch's "
                              "sentences (a contrastive denominator, a uniformity) is computed in batch_terms, and "
                              "a per-sentence term (row_terms(enc, chunk, batch)) is normalised by the whole "
                              "batch's count, not the chunk's (docs/methods/writing-a-method.md)") from None
    if not h.cls.has_batch_terms:
        return
    accum, _ = step_gradients(h.exact_run(dropout=0.0, batch_size=4, grad_accum=4), h.cls)
    ref, _ = step_gradients(h.exact_run(dropout=0.0), h.cls)
    enc = [k for k in ref if k.startswith("encoder.") and k in accum]
    diff = sum(float((accum[k] - ref[k]).norm()) for k in enc) / sum(float(ref[k].norm()) for k in enc)
    _require(diff > 1e-2, f"batch 4 × grad_accum 4 gave the batch-16 gradient (relative difference {diff:.2g}): "
             "the in-batch terms do not see the whole batch")


def check_pretrain(h: Harness) -> None:
    """A method's pretraining stage is chunked to its unchunked gradient (dropout on, keyed)."""
    stage = h.cls.pretrain_stage
    if stage is None:
        raise CheckSkipped("no pretraining stage")
    ref, _ = step_gradients(h.exact_run(dropout_rng="keyed"), stage)
    got, chunk = step_gradients(h.exact_run(dropout_rng="keyed", chunk_size=4), stage)
    _require(chunk == 4 and bool(ref), f"the stage chose chunks of {chunk}, not 4")
    close(got, ref, "pretraining stage, chunked gradient")


def check_devices(h: Harness) -> None:
    """``train.devices: 2`` (two gloo processes started by ``sentemb train``, each building its batches
    in one ``train.workers`` process), 2 steps of 2 accumulated micro-batches of 16 (8 per process),
    dropout on with keyed masks: the weights of ``devices: 1`` (batches built in line)
    (the chunked check's tolerance); only rank 0 wrote ``train.json``."""
    from safetensors.torch import load_file

    from .train.loop import train

    out = h.scratch("devices")
    over = dict(dropout_rng="keyed", grad_accum=2)
    one = train(h.exact_run(**over), out / "one", progress=False, method_cls=h.cls)
    run_file = out / "run2.json"
    run_file.write_text(json.dumps(h.exact_run(devices=2, workers=1, **over).to_dict()), "utf-8")  # each rank its own worker
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a plug-in's file is imported by Run.method_module (cwd-relative)
    r = subprocess.run([sys.executable, "-m", "sentemb", "train", "--run-config", str(run_file), "--output-dir",
                        str(out / "two"), "--no-track", "--quiet"], capture_output=True, text=True, env=env, timeout=900)
    _require(r.returncode == 0, f"`sentemb train` with devices 2 exited {r.returncode}: {_stderr_tail(r)}")
    meta = json.loads((out / "two" / "train.json").read_text())
    _require(meta.get("devices") == 2 and meta["steps"] == one["steps"],
             f"devices 2 ran {meta.get('devices')} processes for {meta['steps']} steps, one process {one['steps']}")
    for f in sorted((out / "one" / "model").rglob("*.safetensors")):
        close(load_file(out / "two" / "model" / f.relative_to(out / "one" / "model")), load_file(f),
              f"devices 2: {f.name}", floor="whole")


def check_graphs(h: Harness) -> None:
    """``train.graphs: true`` (each batch shape's step captured once as a CUDA graph and replayed; on a
    CPU the same static-shape step run eagerly, with the capture check), dropout off, 2 steps of 2
    accumulated micro-batches, whole and in chunks of 4 (gradient caching inside the graph): the eager
    run's whole state (1e-4). A step a replay cannot serve (a host read of a device value, a
    data-dependent shape such as a ``chunk`` that selects rows by value, Python state changed in the
    step) fails naming the op or attribute and the method's line. Before the weights, each
    micro-batch's static step is compared with its eager step for the parameters only the static
    one gives a (zero) gradient: ``Method.static_idle_parameters`` must name exactly those
    (``_check_idle_parameters``)."""
    from .train.loop import State, run_steps, setup

    _check_idle_parameters(h)  # first: it names the parameters where the weights would differ for that reason
    got = {}
    variants = {"eager": {}, "graphed": {"graphs": True},
                "graphed, chunks of 4": {"graphs": True, "chunk_size": 4, "dropout_rng": "counter"}}
    for name, over in variants.items():
        try:
            with setup(h.exact_run(dropout=0.0, grad_accum=2, max_steps=2, **over), "/nonexistent", h.cls) as job:
                for _ in run_steps(job, State()):
                    pass
                got[name] = method_state(job.method)
        except SentembError as e:
            if name == "eager":
                raise
            raise CheckFailed(f"{name}: {e}") from e
    hints = {"graphed": "A graphed batch is padded to a static shape: a term that reads the padding (a mean over "
                        "the padded width, a statistic over rows or columns the attention mask leaves out) changes "
                        "with it; a term over a variable count must mask by the batch's own masks",
             "graphed, chunks of 4": "The whole graphed step agrees, the chunked one does not: as in the chunked "
                                     "check, a chunk must give each sentence what the whole batch gives it (a term "
                                     "over pairs of sentences in batch_terms, row_terms normalised by the whole "
                                     "batch's count; docs/methods/writing-a-method.md)"}
    for name in ("graphed", "graphed, chunks of 4"):  # 1e-4 as fused's: AdamW's first steps magnify round-off
        try:
            same_state(got[name], got["eager"], f"{name} vs eager (dropout off)", rel=1e-4)
        except CheckFailed as e:  # the hint for weights that differ, not for a state entry missing or of another kind
            raise CheckFailed(f"{e}. {hints[name]}" if "‖Δ‖" in str(e) else str(e)) from None


def _written_gradients(h: Harness, graphs: bool) -> list[tuple[int, int, set[str], set[str]]]:
    """Per micro-batch of the graphs check's 2 steps: (step, micro, the trainable parameters its
    backward gives a gradient, those ``static_idle_parameters`` names), eager or static."""
    from .train.batches import micro_batches
    from .train.loop import setup
    from .train.step import micro_batch_strategy

    out = []
    with setup(h.exact_run(dropout=0.0, grad_accum=2, max_steps=2, graphs=graphs), "/nonexistent", h.cls) as job:
        params = {n: p for n, p in job.method.named_parameters() if p.requires_grad}
        names = {id(p): n for n, p in params.items()}
        strategy = micro_batch_strategy(job)  # the static step run eagerly, without its graphs
        for step in range(2):
            job.method.step = step
            for micro, batch in micro_batches(job, step):
                for p in params.values():
                    p.grad = None
                strategy.gradients(job, [(micro, batch)], None)
                declared = {names[id(p)] for p in job.method.static_idle_parameters(batch) if id(p) in names}
                out.append((step, micro, {n for n, p in params.items() if p.grad is not None}, declared))
    return out


def _check_idle_parameters(h: Harness) -> None:
    """The static step writes zero gradients where an eager one writes none (a path it runs on every
    batch, an eager step skips on some): ``Method.static_idle_parameters`` must name exactly those,
    or AdamW moves them in a graphed run (momentum, weight decay) and not in an eager one; a named
    parameter the eager step does give a gradient would lose it."""
    eager_runs = _written_gradients(h, False)  # a SentembError here is the eager run's, as check_graphs reports it
    try:
        static_runs = _written_gradients(h, True)
    except SentembError as e:  # a setting the graphed run refuses: as check_graphs' graphed variant reports it
        raise CheckFailed(f"graphed: {e}") from e
    for (step, micro, eager, _), (_, _, static, declared) in zip(eager_runs, static_runs):
        missing = sorted(static - eager - declared)
        _require(not missing, f"step {step} micro-batch {micro}: the static (graphed) step writes zero gradients to "
                              f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}, which an eager step leaves "
                              "without one; name them in Method.static_idle_parameters(batch), or AdamW moves them in a "
                              "graphed run (docs/methods/writing-a-method.md, 'Graph-safe steps')")
        wrong = sorted(declared & static & eager)
        _require(not wrong, f"step {step} micro-batch {micro}: Method.static_idle_parameters names "
                            f"{', '.join(wrong[:6])}{' ...' if len(wrong) > 6 else ''}, which an eager step gives a "
                            "gradient: a graphed run would drop it")


def check_fused(h: Harness) -> None:
    """``train.fuse_micro_batches: 2`` (``sentemb.train.step.Fused``; a method declaring
    ``Method.fusable``), dropout off, with the method's paper train settings (``paper_train``:
    ArcCSE's SAM) and without: (1) at the same weights, the gradient of a step's 2 micro-batches
    fused is the one accumulated micro-batch by micro-batch (fp32 round-off, ``close``) and so are
    the logged terms; (2) 2 optimizer steps train to the accumulated run's weights and state (1e-4:
    AdamW's first steps divide each gradient element by its own magnitude, so an element near zero
    turns round-off into a visible share of a step), and so does the fused step graphed
    (``train.graphs``: each fused group one graph; skipped where the method's step cannot be
    captured, which the check ``graphs`` reports). A method that does not declare it is refused
    naming it."""
    from .methods.base import fusable_method
    from .train.batches import micro_batches
    from .train.loop import State, run_steps, setup
    from .train.step import Fused, Plain, clear_grads

    if not fusable_method(h.cls):
        try:
            with setup(h.exact_run(dropout=0.0, grad_accum=2, max_steps=1, fuse_micro_batches=2), "/nonexistent", h.cls):
                pass
        except SentembError as e:
            _require("fusable" in str(e), f"fuse_micro_batches 2 refused without naming Method.fusable: {e}")
            raise CheckSkipped("the method does not declare Method.fusable (fuse_micro_batches is refused, naming it)")
        raise CheckFailed("train.fuse_micro_batches 2 was accepted for a method that does not declare Method.fusable")
    paper = dict(getattr(h.cls, "paper_train", {}) or {})
    for extra in ([{}, paper] if paper else [{}]):
        what = "fuse_micro_batches 2 vs 1" + (f" with {extra}" if extra else "")
        with setup(h.exact_run(dropout=0.0, grad_accum=2, max_steps=2, fuse_micro_batches=2, **extra),
                   "/nonexistent", h.cls) as job:
            _require("Fused" in repr(job.strategy), f"{what}: the loop chose {job.strategy!r}, not Fused")
            batches = micro_batches(job, 0)
            grads, logged = {}, {}
            for name, strategy in (("fused", Fused(2)), ("accumulated", Plain())):
                clear_grads(job)
                state = State()
                strategy.gradients(job, batches, state)
                grads[name] = {n: p.grad.detach().clone() for n, p in job.method.named_parameters() if p.grad is not None}
                logged[name] = {k: float(v) / state.n_terms for k, v in state.sum_terms.items()}
            clear_grads(job)
        close(grads["fused"], grads["accumulated"], f"{what}: the first step's gradient")
        _require(logged["fused"].keys() == logged["accumulated"].keys(),
                 f"{what}: logged terms {sorted(logged['fused'])} vs {sorted(logged['accumulated'])}")
        for k, b in logged["accumulated"].items():
            a = logged["fused"][k]
            _require(abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"{what}: logged {k} {a:.7g} vs {b:.7g}")
        got = {}
        for fuse, graphs in ((1, False), (2, False), (2, True)):  # and each fused group as one graph (train.graphs)
            try:
                with setup(h.exact_run(dropout=0.0, grad_accum=2, max_steps=2, fuse_micro_batches=fuse, graphs=graphs,
                                       **extra), "/nonexistent", h.cls) as job:
                    for _ in run_steps(job, State()):
                        pass
                    got[fuse, graphs] = method_state(job.method)
            except SentembError as e:
                if not graphs or "train.graphs" not in str(e):
                    raise
                # a step a graph cannot replay: the contract's check `graphs` reports it
        same_state(got[2, False], got[1, False], what, rel=1e-4)
        if (2, True) in got:
            same_state(got[2, True], got[1, False], f"{what}, graphed", rel=1e-4)


# ------------------------------------------------------------------------------------ a method's state
def method_state(method, skip=()) -> dict[str, Any]:
    """The method's whole state as a checkpoint holds it (``state_dict()``: trainable and frozen
    parameters, persistent buffers, ``get_extra_state``), tensors detached and cloned on the CPU, an
    extra state's mappings and sequences flattened to ``key/sub`` entries; the names in ``skip`` left out."""
    import torch

    out: dict[str, Any] = {}

    def put(key, v):
        if isinstance(v, torch.Tensor):
            out[key] = v.detach().cpu().clone()
        elif isinstance(v, dict):
            for k, x in v.items():
                put(f"{key}/{k}", x)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                put(f"{key}/{i}", x)
        else:
            out[key] = copy.deepcopy(v)

    for key, v in method.state_dict().items():
        if key not in skip:
            put(key, v)
    return out


def same_state(got: dict, ref: dict, what: str, exact: bool = False, rel: float = REL) -> None:
    """Two ``method_state``s agree: the same entries; floating tensors within ``close``'s weight
    tolerance at ``rel`` (or bit for bit with ``exact``), every other entry equal."""
    import torch

    _require(got.keys() == ref.keys(), f"{what}: different state entries {sorted(set(got) ^ set(ref))}")
    floats = [k for k, v in ref.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    for k, v in ref.items():
        if k in floats and not exact:
            continue
        g = got[k]
        same = (torch.equal(g, v) if isinstance(v, torch.Tensor) and isinstance(g, torch.Tensor)
                and g.shape == v.shape else g == v if not isinstance(v, torch.Tensor) else False)
        if not same and isinstance(v, torch.Tensor) and isinstance(g, torch.Tensor) and g.shape == v.shape:
            gap = float((g.double() - v.double()).abs().max())
            raise CheckFailed(f"{what}: state '{k}' differs (max |Δ| {gap:.3g})")
        _require(bool(same), f"{what}: state '{k}' differs ({_short(g)} vs {_short(v)})")
    if floats and not exact:
        close({k: got[k] for k in floats}, {k: ref[k] for k in floats}, f"{what}: state", rel=rel, floor="whole")


def _short(v) -> str:
    return f"shape {tuple(v.shape)}" if hasattr(v, "shape") else repr(v)[:60]


def keeps_state(h: Harness) -> bool:
    """Whether the method keeps state besides its trainable weights: it overrides ``after_step``,
    ``before_epoch`` or ``get_extra_state``, or its ``state_dict`` holds buffers or frozen parameters."""
    from torch import nn

    from .methods.base import Method

    if "keeps_state" not in h.cache:
        m = h.make()
        trainable = weight_names(m, [p for p in m.parameters() if p.requires_grad])
        h.cache["keeps_state"] = (type(m).after_step is not Method.after_step
                                  or type(m).before_epoch is not Method.before_epoch
                                  or type(m).get_extra_state is not nn.Module.get_extra_state
                                  or any(k not in trainable for k in m.state_dict()))
    return h.cache["keeps_state"]


def weight_names(method, params) -> set[str]:
    """The ``state_dict`` names of ``params``, under every name a tied parameter has (PaSeR's
    decoder embeddings are the encoder's)."""
    import torch

    ptrs = {p.data_ptr() for p in params}
    return {k for k, v in method.state_dict(keep_vars=True).items()
            if isinstance(v, torch.Tensor) and v.data_ptr() in ptrs}


def _stateful(h: Harness) -> None:
    if not keeps_state(h):
        raise CheckSkipped("no state besides the trainable weights (no after_step, buffers, frozen parameters or "
                           "extra state): the weights' checks cover it")


#: the ``state_*`` checks' runs: 3 optimizer steps of 16, fp32, dropout on with counter-keyed masks
#: (``train.dropout_rng: counter``: the same masks in every chunking and on every process)
STATE_STEPS = 3


def state_run(h: Harness, **over):
    """``Harness.exact_run`` of the ``state_*`` checks: ``STATE_STEPS`` steps, ``dropout_rng: counter``;
    ``over`` replaces."""
    return h.exact_run(**{"dropout_rng": "counter", "max_steps": STATE_STEPS, **over})


def state_after(h: Harness, out: str | Path = "/nonexistent", **over) -> dict:
    """The method's ``method_state`` after the run ``state_run(h, **over)`` (the loop's own stages,
    in this process; nothing written). The plain run's is computed once per harness."""
    from .train.loop import State, run_steps, setup

    key = ("state_after", tuple(sorted(over.items())))
    if key not in h.cache:
        with setup(state_run(h, **over), out, h.cls) as job:
            for _ in run_steps(job, State()):
                pass
            h.cache[key] = method_state(job.method)
    return h.cache[key]


def check_state_chunked(h: Harness) -> None:
    """A method that keeps state: its whole state (``method_state``) after 3 steps with ``chunk_size: 4``
    (gradient caching: every chunk encoded twice) is the unchunked run's (the weights' tolerance)."""
    _stateful(h)
    same_state(state_after(h, chunk_size=4), state_after(h), "chunk_size 4 vs the whole batch")


def _rank_state_worker(run_file: str, out: str) -> None:
    """One rank of ``check_state_devices`` (under torchrun): the run, then its ``method_state`` to
    ``out/state<rank>.pt``."""
    import torch

    from .train import distributed
    from .train.loop import State, run_steps, setup

    run = json.loads(Path(run_file).read_text("utf-8"))
    with setup(run, out) as job:  # the run's method_module names a plug-in's file
        for _ in run_steps(job, State()):
            pass
        torch.save(method_state(job.method), Path(out) / f"state{job.rank}.pt")
    distributed.shutdown()


def check_state_devices(h: Harness) -> None:
    """A method that keeps state: after 3 steps on ``train.devices: 2`` (two gloo processes under
    torchrun, the same dropout masks) every rank holds the whole state of the one-process run."""
    import torch

    _stateful(h)
    out = h.scratch("state-devices")
    (out / "run.json").write_text(json.dumps(state_run(h, devices=2).to_dict()), "utf-8")
    (out / "rank.py").write_text("import sys\nfrom sentemb.testing import _rank_state_worker\n"
                                 "_rank_state_worker(sys.argv[1], sys.argv[2])\n", "utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(out / "rank.py"), str(out / "run.json"), str(out)], capture_output=True, text=True,
                       env=env, timeout=900)
    _require(r.returncode == 0, f"devices 2 under torchrun exited {r.returncode}: {_stderr_tail(r)}")
    ranks = [torch.load(out / f"state{i}.pt", weights_only=False) for i in range(2)]
    same_state(ranks[1], ranks[0], "devices 2: rank 1 vs rank 0", exact=True)
    same_state(ranks[0], state_after(h), "devices 2 vs one process")


def check_state_accum(h: Harness) -> None:
    """A method that keeps state and declares ``grad_accum`` equal to one batch (``Method.accum_equal``;
    by default a method without in-batch terms): 2 micro-batches of 8 per step give the whole state
    of 1 of 16 after 3 steps (the same sentences per step)."""
    _stateful(h)
    equal = h.cls.accum_equal if h.cls.accum_equal is not None else not h.cls.has_batch_terms
    if not equal:
        raise CheckSkipped("the method does not declare grad_accum equal to one batch (accum_equal; its in-batch "
                           "terms see the micro-batch)")
    same_state(state_after(h, batch_size=8, grad_accum=2), state_after(h), "grad_accum 2 x 8 vs 1 x 16")


def check_state_sam(h: Harness) -> None:
    """A method that keeps state, under SAM (``sam_rho: 0.05``), 3 steps: at its first ``encode`` of
    each micro-batch the second pass sees bit for bit the state the first pass saw (all but the
    weights SAM perturbs): nothing changes state before ``after_step``."""
    from .train.loop import State, run_steps, setup
    from .train.step import SAM

    _stateful(h)
    with setup(state_run(h, sam_rho=0.05), "/nonexistent", h.cls) as job:
        _require(isinstance(job.strategy, SAM), f"the loop chose {job.strategy!r}, not SAM")
        method, inner = job.method, job.strategy.inner
        perturbed = weight_names(method, [p for group in job.opt.param_groups for p in group["params"]])
        seen: dict[tuple, dict] = {}
        passes = [0]
        gradients, encode = inner.gradients, method.encode

        def counted(*a, **k):
            passes[0] += 1
            return gradients(*a, **k)

        def watched(batch):
            key = (method.step, method.micro, passes[0])
            if key not in seen:
                seen[key] = method_state(method, skip=perturbed)
            return encode(batch)

        inner.gradients, method.encode = counted, watched
        for _ in run_steps(job, State()):
            pass
    firsts = {(s, m): p for s, m, p in seen if p % 2 == 1}
    _require(bool(firsts) and all((s, m, p + 1) in seen for (s, m), p in firsts.items()),
             f"SAM did not encode every micro-batch twice (calls {sorted(seen)})")
    for (s, m), p in sorted(firsts.items()):
        same_state(seen[(s, m, p + 1)], seen[(s, m, p)], f"SAM, step {s}, micro-batch {m}: the second pass vs the "
                   "first", exact=True)


def check_state_resume(h: Harness) -> None:
    """A method that keeps state: killed after 1 of 3 steps (the loop's ``save_state``) and resumed in
    a fresh job (``resume``), its whole state after 3 steps is the uninterrupted run's, bit for bit."""
    from .train.loop import resume, run_steps, save_state, setup

    _stateful(h)
    out = h.scratch("state-resume")
    with setup(state_run(h), out, h.cls) as job:
        state = resume(job)
        for _ in run_steps(job, state, 1):
            pass
        save_state(job, state)
    with setup(state_run(h), out, h.cls) as job:
        state = resume(job)
        _require(state.step == 1, f"the resumed job starts at step {state.step}, not 1")
        for _ in run_steps(job, state):
            pass
        got = method_state(job.method)
        unsaved = list(unsaved_tensors(job.method))
    try:
        same_state(got, state_after(h), "killed after step 1 and resumed vs uninterrupted", exact=True)
    except CheckFailed as e:
        if not unsaved:
            raise
        raise CheckFailed(f"{e}; no checkpoint holds {', '.join(unsaved[:4])}{' ...' if len(unsaved) > 4 else ''}"
                          ": a state there is lost on resume") from None


def check_state_graphed(h: Harness) -> None:
    """A method that keeps state: with ``train.graphs: true`` (each batch shape's step captured once
    and replayed; on a CPU the same static-shape step run eagerly, with the capture check) its whole
    state after 3 steps of 2 accumulated micro-batches of 8 is the eager run's. The capture check
    refuses, naming it, what a replay would not redo: Python state changed or ``self.step``/``micro``
    read in the step (``Method.stash`` is the graph-safe way to hand tensors to ``after_step``), a
    host read of a device value; and a parameter or buffer replaced rather than updated in place."""
    _stateful(h)
    over = {"batch_size": 8, "grad_accum": 2}
    try:
        got = state_after(h, graphs=True, **over)
    except SentembError as e:
        raise CheckFailed(str(e)) from e
    same_state(got, state_after(h, **over), "graphs vs eager (2 micro-batches of 8 a step)")


#: ``state_epoch``'s runs: 64 lines at batch 32 are 2 optimizer steps an epoch, so 4 steps begin epochs 0
#: and 1 (``Method.before_epoch`` before steps 0 and 2)
EPOCH_RUN = {"batch_size": 32, "epochs": 2, "max_steps": 4}


def check_state_epoch(h: Harness) -> None:
    """A method with ``Method.before_epoch``: over two epochs (``EPOCH_RUN``), killed after step 2, the
    last of epoch 0, and resumed (the hook then runs before step 2 in the resumed job, as it does in the
    uninterrupted one), its whole state after 4 steps is the uninterrupted run's, bit for bit; and
    with ``train.graphs: true`` (the hook runs between replays: its state changes in place) the eager
    run's. It catches a hook whose effect hangs on Python state a checkpoint does not hold (a count
    of the epochs it saw) and one that replaces a tensor a captured step reads."""
    from .methods import Method
    from .train.loop import resume, run_steps, save_state, setup

    if getattr(h.cls, "before_epoch", Method.before_epoch) is Method.before_epoch:
        raise CheckSkipped("no before_epoch hook")
    out = h.scratch("state-epoch")
    with setup(state_run(h, **EPOCH_RUN), out, h.cls) as job:
        state = resume(job)
        for _ in run_steps(job, state, 2):
            pass
        save_state(job, state)
    with setup(state_run(h, **EPOCH_RUN), out, h.cls) as job:
        state = resume(job)
        _require(state.step == 2, f"the resumed job starts at step {state.step}, not 2")
        for _ in run_steps(job, state):
            pass
        got = method_state(job.method)
    whole = state_after(h, **EPOCH_RUN)
    same_state(got, whole, "killed at the end of epoch 0 and resumed vs uninterrupted", exact=True)
    try:
        graphed = state_after(h, graphs=True, **EPOCH_RUN)
    except SentembError as e:
        raise CheckFailed(str(e)) from e
    same_state(graphed, whole, "graphs vs eager over two epochs")


#: name -> check, in the order ``sentemb check-method`` runs them (cheap first)
CHECKS: dict[str, Callable[[Harness], None]] = {
    "arguments": check_arguments,
    "batches": check_batches,
    "loss": check_loss,
    "buckets": check_buckets,
    "bf16": check_bf16,
    "export": check_export,
    "resume": check_resume,
    "grad_norms": check_grad_norms,
    "chunked": check_chunked,
    "pretrain": check_pretrain,
    "devices": check_devices,
    "graphs": check_graphs,
    "fused": check_fused,
    "state_chunked": check_state_chunked,
    "state_accum": check_state_accum,
    "state_sam": check_state_sam,
    "state_resume": check_state_resume,
    "state_devices": check_state_devices,
    "state_graphed": check_state_graphed,
    "state_epoch": check_state_epoch,
}


@dataclass
class Result:
    check: str
    status: str  # "PASS", "FAIL", "SKIP"
    seconds: float
    message: str = ""

    def line(self) -> str:
        return f"{self.status:<4}  {self.check:<13} {self.seconds:6.1f} s" + (f"  {self.message}" if self.message else "")


def run_check(method: str | type, check: str, h: Harness) -> None:
    """Run one check on harness ``h``; raises ``CheckFailed`` (an ``AssertionError``, so pytest
    reports it as a failure) or ``CheckSkipped`` (call ``pytest.skip`` on it in a test, or let it pass)."""
    if check not in CHECKS:
        raise SentembError(f"unknown check '{check}' (known: {', '.join(CHECKS)})")
    name = method if isinstance(method, str) else method.name
    if h.name != name:
        raise SentembError(f"the harness is for '{h.name}', not '{name}'")
    CHECKS[check](h)


def check_method(method: str | type, work: str | Path, checks: list[str] | None = None,
                 report: Callable[[str], None] | None = print) -> list[Result]:
    """Run ``checks`` (default all of ``CHECKS``) on ``method``; each result is also passed to
    ``report`` as one line. A check that raises anything but ``CheckSkipped`` fails with the
    exception's message."""
    chosen = list(checks or CHECKS)
    for c in chosen:
        if c not in CHECKS:
            raise SentembError(f"--check {c}: unknown check (known: {', '.join(CHECKS)})")
    results = []
    t = time.perf_counter()
    try:
        h = harness(method, work)
    except CheckSkipped as e:
        return [_report(Result(c, "SKIP", 0.0, str(e)), report) for c in chosen]
    except Exception as e:  # noqa: BLE001 - the method could not even be set up: every check fails with that
        msg = f"setting up the tiny world failed: {type(e).__name__}: {e}"
        return [_report(Result(c, "FAIL", time.perf_counter() - t, msg), report) for c in chosen]
    for c in chosen:
        t = time.perf_counter()
        try:
            CHECKS[c](h)
            res = Result(c, "PASS", time.perf_counter() - t)
        except CheckSkipped as e:
            res = Result(c, "SKIP", time.perf_counter() - t, str(e))
        except CheckFailed as e:
            res = Result(c, "FAIL", time.perf_counter() - t, str(e))
        except Exception as e:  # noqa: BLE001 - a crash in the method is a failed check, named
            msg = f"{type(e).__name__}: {e}"
            if any(r.check == "loss" and r.status == "FAIL" for r in results):  # torch's words for a bad loss
                msg += " (the loss check failed: fix that first, the later checks train on that loss)"
            res = Result(c, "FAIL", time.perf_counter() - t, msg)
        results.append(_report(res, report))
    return results


def _report(res: Result, report) -> Result:
    if report is not None:
        report(res.line())
    return res
