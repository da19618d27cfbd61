"""Throughput benchmark (a script, not a test): training and evaluation sentences/s and tokens/s,
and the achieved training FLOP/s with its share of the device's peak (on CUDA the GPU's bf16 dense
peak by name, on CPU a large matmul in the rows' precision timed in the same run; ``sentemb.ops.flops``), for a model directory, batch size and device. ``--compare-st`` runs the
sentence-transformers SimCSE recipe (MultipleNegativesRankingLoss on duplicated sentences) with the
same model, sentences, batch size, max length and optimizer, timed the same way.

    sentemb benchmark --model $SHARED/models/all-MiniLM-L6-v2 --corpus $SHARED/data/wiki1m_head.txt \
        --batch-size 64 --steps 20 --device cpu --compare-st
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import SentembError
from ..config.settings import Run, TrainSettings

from .gpus import PEAK_BF16_TFLOPS  # noqa: E402  (one table with the plan's memory: sentemb.ops.gpus)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed_training(module, opt, make_batch, loss_of, sentences, batch_size, steps, warmup, device, precision):
    """sentence-transformers' recipe (``bench_st``; not a sentemb method, so not the loop's
    ``run_steps``): warmup + steps optimizer steps (forward, backward, clip 1.0, AdamW) on
    consecutive corpus slices; time the last ``steps``. Returns (seconds, real tokens, padded tokens)."""
    import torch

    from ..train.loop import autocast

    n_tok = n_pad = 0
    t0 = None
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            t0 = time.perf_counter()
        batch = make_batch(sentences[(i * batch_size) % len(sentences):][:batch_size])
        with autocast(device, precision):
            loss = loss_of(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            n_tok += int(batch["attention_mask"].sum())
            n_pad += batch["input_ids"].numel()
    _sync(device)
    return time.perf_counter() - t0, n_tok, n_pad


def bench_method(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, method="simcse",
                 method_args=None, inputs=None, sam_rho=None, unpad=False, chunk_size=None):
    """A registered method through the loop's own code (``sentemb.train.loop.setup`` and ``run_steps``:
    the batch schedule, ``build_batch`` with the corpus's token cache, in line (``prefetch: false``)
    and timed separately, transfer, autocast, ``losses``, backward, with ``sam_rho`` SAM's second
    pass, clip, AdamW, LR schedule). Returns (seconds, real tokens, padded tokens, encoder config,
    build seconds) of the last ``steps`` steps after ``warmup``, and the FLOPs per padded position
    of one more step, counted (``sentemb.ops.flops.counted``: every matmul of the step, whatever the
    method runs), so that FLOPs of the timed steps = that × their padded positions. ``chunk_size``:
    ``train.chunk_size`` (gradient caching; its extra forward is in the counted FLOPs)."""
    from .flops import counted
    from ..train.loop import State, log_step, run_steps, setup

    run = _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, 10**9, method_args, inputs,
                     sam_rho=sam_rho, unpad=unpad, prefetch=False, chunk_size=chunk_size)
    with setup(run, "/nonexistent-benchmark-output") as job:
        if job.total < warmup + steps + 2:
            raise SentembError(f"--corpus gives {job.total} steps of batch {batch_size}; {warmup + steps + 2} are needed")
        build, t_build, n_pad = job.method.build_batch, [0.0], [0]

        def timed_build(*args, **kwargs):  # build_batch, timed, and the padded positions of its rows
            t = time.perf_counter()
            out = build(*args, **kwargs)
            t_build[0] += time.perf_counter() - t
            n_pad[0] += out["attention_mask"].numel() if "attention_mask" in out else 0
            return out

        job.method.build_batch = timed_build
        state = State()
        for _ in run_steps(job, state, warmup):
            pass
        log_step(job, state)  # a fresh throughput window
        _sync(job.device)
        t0, t_build[0], n_pad[0] = time.perf_counter(), 0.0, 0
        for _ in run_steps(job, state, steps):
            pass
        _sync(job.device)
        secs = time.perf_counter() - t0
        timed_tok, timed_pad, n_pad[0] = state.n_tok, n_pad[0], 0
        _, flops = counted(lambda: list(run_steps(job, state, 1)))
        return secs, timed_tok, timed_pad, job.method.encoder.config, t_build[0], flops / max(n_pad[0], 1)


WARM_BUILDS = 10  # bench_build's untimed builds: UNA's default alpha (5) puts negatives in two of them


def bench_build(model_dir, corpus, batch_size, steps, max_len, method="simcse", method_args=None,
                inputs=None) -> list[float]:
    """Seconds of the method's ``build_batch`` (the host work of a step's batches, done in the
    loop's prefetch thread or ``train.workers`` processes, off the device) for the loop's optimizer
    steps 0..``steps``−1 of ``corpus``, in order (UNA's negatives on its α-th steps), after
    ``WARM_BUILDS`` untimed builds of the steps after them (lazy imports and caches, on every kind of
    step a schedule of period ≤ ``WARM_BUILDS`` has). The job is ``sentemb.train.loop.setup``'s on
    the CPU, so the method reads the corpus's token cache as in training (built in memory here)."""
    from ..train.loop import setup

    run = _bench_run(model_dir, corpus, batch_size, "cpu", max_len, "fp32", method, 10**9, method_args, inputs,
                     prefetch=False)
    with setup(run, "/nonexistent-benchmark-output") as job:
        if job.total < steps + WARM_BUILDS:
            raise SentembError(f"--corpus gives {job.total} steps of batch {batch_size}; {steps + WARM_BUILDS} are "
                               "needed")

        def build(s):
            idx = job.micro[s]
            return job.method.build_batch([job.sentences[i] for i in idx], step=s, lines=idx, micro=s)

        for s in range(steps, steps + WARM_BUILDS):  # warm-up, on batches not timed
            build(s)
        times = []
        for s in range(steps):
            t0 = time.perf_counter()
            build(s)
            times.append(time.perf_counter() - t0)
        return times


def bench_st(model_dir, sentences, batch_size, steps, warmup, device, max_len, precision):
    """sentence-transformers' SimCSE recipe: MultipleNegativesRankingLoss on (s, s) pairs."""
    import torch
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    model = SentenceTransformer(str(model_dir), device=str(device))
    model.max_seq_length = max_len
    model.train()
    loss_fn = MultipleNegativesRankingLoss(model, scale=20.0)  # scale 20 = 1/τ with τ = 0.05
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=device.type == "cuda")
    prep = model.preprocess if hasattr(model, "preprocess") else model.tokenize

    def make_batch(s):
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in prep(s).items()}

    secs, n_tok, _ = _timed_training(model, opt, make_batch, lambda f: loss_fn([f, dict(f)], None), sentences,
                                     batch_size, steps, warmup, device, precision)
    return secs, n_tok


def bench_eval(model_dir, sentences, batch_size, device):
    from ..evaluate.sts import Embedder

    emb = Embedder.from_dir(model_dir, "cls_before_pooler", device=str(device), batch_size=batch_size)
    emb(sentences[:batch_size])  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    emb(sentences)
    _sync(device)
    n_tok = sum(len(x) for x in emb.tokenizer(list(dict.fromkeys(sentences)))["input_ids"])
    return time.perf_counter() - t0, len(set(sentences)), n_tok


#: the loop configurations ``--overhead`` times, name -> train settings over the defaults
LOOP_VARIANTS = {
    "shared loop (default: token cache + prefetch thread)": {},
    "shared loop, token cache, no prefetch": {"prefetch": False},
    "shared loop, tokenizer on every step, no prefetch": {"token_cache": False, "prefetch": False},
}


def _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method="simcse", log_steps=10,
               method_args=None, inputs=None, **train) -> Run:
    """A resolved run for benchmarking the loop: 50 epochs of ``corpus`` at lr 3e-5, no dev
    evaluation, no checkpoints; ``train`` overrides train settings."""
    from pathlib import Path

    from ..methods import get_method

    fields = dict(epochs=50, batch_size=batch_size, max_len=max_len, eval_steps=10**9, eval_at_end=False,
                  log_steps=log_steps, save_steps=10**9, precision=precision, device=str(device),
                  model_selection="last")
    settings = TrainSettings(**{**fields, **train})
    return Run(name=method, method=method, backbone=Path(model_dir).name, seed=0, train=settings,
               method_args=get_method(method).resolve_args(method_args or {}), tracking={"enabled": False},
               paths={"model": str(model_dir), "corpus": str(corpus), "senteval": None, "inputs": dict(inputs or {})})


def _bench_jobs(stack, runs: dict, needed: int, batch_size: int) -> dict:
    """name -> (job, state): ``sentemb.train.loop.setup`` of each run (closed with ``stack``), each with
    at least ``needed`` optimizer steps."""
    from ..train.loop import State, setup

    jobs = {}
    for name, run in runs.items():
        job = stack.enter_context(setup(run, "/nonexistent-benchmark-output"))
        if job.total < needed:
            raise SentembError(f"--corpus gives {job.total} steps of batch {batch_size}; {needed} are needed")
        jobs[name] = (job, State())
    return jobs


def _steps(job, state, n: int) -> None:
    """``n`` optimizer steps of the loop's own ``run_steps`` (with its log stage when due)."""
    from ..train.loop import run_steps

    for _ in run_steps(job, state, n):
        pass


def bench_overhead(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, log_steps=10,
                   method="simcse", rounds=3, variants=None):
    """The shared loop's full optimizer step (``sentemb.train.loop.run_steps``: batches from the
    prefetch thread or built in line, transfer, autocast, losses, backward, clip, optimizer, LR
    schedule, the deferred finiteness check, and ``log_step`` every ``log_steps``) in each of
    ``variants`` (default ``LOOP_VARIANTS``), against a bare step on tensors built beforehand
    (forward + loss + backward + optimizer only), same model and batch shapes. The variants and the
    bare step take turns for ``rounds`` rounds of ``steps`` steps (so that a load change on the
    machine hits all of them); each one's median round counts. Returns {name: seconds per step},
    "bare" included."""
    import statistics
    from contextlib import ExitStack

    from ..train.loop import autocast, log_step

    variants = LOOP_VARIANTS if variants is None else variants
    runs = {name: _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, log_steps, **over)
            for name, over in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in [*variants, "bare"]}
    with ExitStack() as stack:
        jobs = _bench_jobs(stack, runs, warmup + rounds * steps + 1, batch_size)
        for job, state in jobs.values():
            _steps(job, state, warmup)
            log_step(job, state)
        bare_job, bare_state = next(iter(jobs.values()))
        for r in range(rounds):
            for name, (job, state) in jobs.items():
                _sync(device)
                t0 = state.t_log = time.perf_counter()
                _steps(job, state, steps)
                log_step(job, state)
                _sync(device)
                times[name].append((time.perf_counter() - t0) / steps)
            # bare: this round's batches (the default loop's next ones) prepared on the device beforehand
            first = bare_state.step
            batches = []
            for s in range(first, first + steps):
                idx = bare_job.micro[s]
                cpu = bare_job.method.build_batch([bare_job.sentences[i] for i in idx], step=s, lines=idx, micro=s)
                batches.append({k: v.to(device) for k, v in cpu.items()})
            _sync(device)
            t0 = time.perf_counter()
            for batch in batches:
                with autocast(device, precision):
                    loss = bare_job.method.losses(batch)["loss"]
                loss.backward()
                bare_job.opt.step()
                bare_job.opt.zero_grad(set_to_none=True)
            _sync(device)
            times["bare"].append((time.perf_counter() - t0) / steps)
    return {name: statistics.median(v) for name, v in times.items()}


def _bench_turns(runs: dict, steps: int, warmup: int, rounds: int, device, batch_size: int) -> tuple[dict, dict]:
    """The shared loop's optimizer step (``run_steps``) of each run in ``runs`` (name -> Run), same
    model, batches and seed, taking turns for ``rounds`` rounds of ``steps`` steps after ``warmup``
    (so that a load change on the machine hits all of them). Returns ({name: median s/step},
    {name: its job's State})."""
    import statistics
    from contextlib import ExitStack

    times: dict[str, list[float]] = {key: [] for key in runs}
    with ExitStack() as stack:
        jobs = _bench_jobs(stack, runs, warmup + rounds * steps, batch_size)
        for job, state in jobs.values():
            _steps(job, state, warmup)
        for _ in range(rounds):
            for key, (job, state) in jobs.items():
                _sync(device)
                t0 = time.perf_counter()
                _steps(job, state, steps)
                _sync(device)
                times[key].append((time.perf_counter() - t0) / steps)
        states = {key: state for key, (_, state) in jobs.items()}
    return {key: statistics.median(v) for key, v in times.items()}, states


def bench_grad_norms(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, method="simcse",
                     method_args=None, inputs=None, rounds=3) -> dict:
    """The cost of ``train.log_grad_norms`` (sentemb.train.grad_norms): the shared loop's optimizer step +
    ``log_step`` on *every* step (``log_steps: 1``) with the option off and on (``_bench_turns``).
    The difference is the cost of one logged step. Returns {"off": s/step, "on": s/step, "terms": [names]}."""
    runs = {key: _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, 1, method_args, inputs,
                            log_grad_norms=on) for key, on in (("off", False), ("on", True))}
    times, states = _bench_turns(runs, steps, warmup, rounds, device, batch_size)
    history = states["on"].history  # the logged grad norms of each step
    terms = [k.rsplit("/", 1)[1] for k in (history[-1] if history else {}) if k.startswith("train/grad_norm/")]
    return {**times, "terms": terms}


def bench_chunked(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, chunk_size,
                  method="simcse", method_args=None, inputs=None, rounds=3, keyed=False, counter=False) -> dict:
    """The cost of gradient caching (``train.chunk_size``): the shared loop's optimizer step with the
    whole micro-batch in one forward and in chunks of ``chunk_size`` (``_bench_turns``); with
    ``keyed`` also both under ``train.dropout_rng: keyed``; with ``counter`` under ``counter``, the
    chunked step both with its graph-free first pass over the whole batch (``train.chunk_first_pass:
    auto``) and chunk by chunk (``chunks``). Returns {variant: s/step} with variants "whole",
    "chunked" (and "whole keyed", "chunked keyed"; "whole counter", "chunked counter", "chunked
    counter per-chunk first pass")."""
    base = {"whole": {}, "chunked": {"chunk_size": chunk_size}}
    variants = dict(base)
    if keyed:
        variants.update({f"{k} keyed": {**v, "dropout_rng": "keyed"} for k, v in base.items()})
    if counter:
        variants.update({f"{k} counter": {**v, "dropout_rng": "counter"} for k, v in base.items()})
        variants["chunked counter per-chunk first pass"] = {"chunk_size": chunk_size, "dropout_rng": "counter",
                                                            "chunk_first_pass": "chunks"}
    runs = {key: _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, 10**9, method_args,
                            inputs, **over) for key, over in variants.items()}
    return _bench_turns(runs, steps, warmup, rounds, device, batch_size)[0]


_COUNTER_COMPILE = """
import json, statistics, sys, time
import torch
from sentemb.ops.benchmark import _bench_run, _steps, _sync, _bench_jobs
from contextlib import ExitStack
kw = json.loads(sys.argv[1])
if kw.get("threads"):  # 0: torch's default
    torch.set_num_threads(kw["threads"])
kw.pop("threads")
steps, warmup, device = kw.pop("steps"), kw.pop("warmup"), torch.device(kw.pop("device"))
run = _bench_run(kw.pop("model"), kw.pop("corpus"), kw.pop("batch_size"), device, kw.pop("max_len"), kw.pop("precision"),
                 kw.pop("method"), 10**9, kw.pop("method_args"), kw.pop("inputs"), prefetch=False, **kw)
with ExitStack() as stack:
    (job, state), = _bench_jobs(stack, {"run": run}, 1 + warmup + steps, run.train.batch_size).values()
    t = time.perf_counter()
    _steps(job, state, 1)
    _sync(device)
    first = time.perf_counter() - t
    _steps(job, state, warmup)
    times = []
    for _ in range(steps):
        _sync(device)
        t = time.perf_counter()
        _steps(job, state, 1)
        _sync(device)
        times.append(time.perf_counter() - t)
print("RESULT " + json.dumps([first, statistics.median(times)]), flush=True)
"""


def in_fresh_process(script: str, arg: dict, tag: str, env: dict | None = None,
                     timeout: float = 900) -> tuple[list, "int | None", str]:
    """Run ``script`` (Python source that reads one JSON argument from ``sys.argv[1]``) with ``arg`` in
    a fresh interpreter: a benchmark or gpu-check row that must not meet what an earlier one left in
    the process (compiled code, kernels, cuDNN plans, allocator blocks, a dead CUDA context). Returns
    the JSON payloads of its stdout lines that start with ``tag``, its exit code and its stderr; past
    ``timeout`` seconds it is killed, and returns no payload, exit code None and stderr saying so."""
    import json
    import subprocess
    import sys

    try:
        r = subprocess.run([sys.executable, "-c", script, json.dumps(arg, default=str)], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return [], None, f"{err}\nkilled: no result in {timeout:g} s"
    return [json.loads(line[len(tag):]) for line in r.stdout.splitlines() if line.startswith(tag)], r.returncode, r.stderr


def bench_counter_compile(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, chunk_size,
                          method="simcse", threads=None, kernels=("auto", "inline"), whole=True, method_args=None,
                          inputs=None, timeout=3600, compile=True) -> dict:
    """``train.compile`` with ``dropout_rng: counter``, its masks outside the compiled code (a graph
    break at each dropout, ``counter_kernel`` auto) against traced with it (``inline``), the whole
    micro-batch and in chunks of ``chunk_size``: each variant in a process of its own (the two put
    other functions in ``torch.nn.functional`` for the process). Returns {(kernel, chunk): (first
    step s, the median s/step of ``steps`` single steps after ``warmup``)}; the first step compiles
    (Inductor's caches off, so it is a whole compilation).
    ``kernels`` and ``whole`` (False: the chunked rows only) take a subset; a row that runs past
    ``timeout`` seconds fails the benchmark. ``compile`` False runs the same rows eagerly (the
    tests' check of the rows' processes, without their compilations)."""
    import os

    out = {}
    for kernel in kernels:
        for chunk in (None, chunk_size) if whole else (chunk_size,):
            arg = dict(model=str(model_dir), corpus=str(corpus), batch_size=batch_size, device=str(device),
                       max_len=max_len, precision=precision, method=method, steps=steps, warmup=warmup,
                       threads=threads or 0, compile=compile, dropout_rng="counter",
                       counter_kernel=kernel, chunk_size=chunk, method_args=method_args,
                       inputs={k: str(v) for k, v in (inputs or {}).items()})
            # Inductor's caches off: the first step is a whole compilation, not a replay of an earlier row's
            env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
            where = f"benchmark --counter-compile: counter_kernel {kernel}, chunk_size {chunk}"
            got, code, err = in_fresh_process(_COUNTER_COMPILE, arg, "RESULT ", env, timeout)
            if code is None:
                raise SentembError(f"{where}: no result in {timeout} s")
            if not got:
                tail = "\n  ".join(err.strip().splitlines()[-8:])
                raise SentembError(f"{where} failed (exit {code}):\n  {tail}")
            out[kernel, chunk] = tuple(got[0])
    return out


def bench_compile(model_dir, corpus, batch_size, steps, device, max_len, method="simcse"):
    """The loop with ``train.compile`` off and on, fp32, same seed: per-step losses and seconds per
    step after the first (compilation) step. Returns {False: (losses, first_s, s_per_step), True: …}."""
    import torch

    from ..train.loop import run_steps, setup

    out = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        run = _bench_run(model_dir, corpus, batch_size, device, max_len, "fp32", method, compile=compiled,
                         prefetch=False)
        with setup(run, "/nonexistent-benchmark-output") as job:
            from ..train.loop import State

            state, losses = State(), []
            t0 = t1 = time.perf_counter()
            for s, _ in enumerate(run_steps(job, state, steps + 1)):
                losses.append(float(state.terms["loss"]))
                if s == 0:
                    _sync(device)
                    t1 = time.perf_counter()
            _sync(device)
            out[compiled] = (losses, t1 - t0, (time.perf_counter() - t1) / steps)
    return out


def bench_dev_eval(model_dir, senteval, device, repeats=3):
    """The loop's STS-B dev evaluation (``sentemb.train.loop.evaluate_and_keep``: the training-time dev
    embedder of SimCSE, fp32, the dev set tokenized and padded once and kept): seconds of the first
    call (with tokenization) and the median of the next ``repeats``. Returns (first, then, sentences)."""
    import statistics

    import torch

    from ..evaluate.sts import stsb_dev
    from ..methods import MethodContext, get_method
    from ..model.backbone import load_encoder
    from ..evaluate.senteval import load_task

    dev = load_task(senteval, "STSBenchmark", "dev")
    torch.manual_seed(0)
    enc, tok = load_encoder(model_dir, pooling_layer=False)
    m = get_method("simcse")(enc, tok, {}, MethodContext(max_len=32, seed=0)).to(device)
    m.train()
    embed = m.embedder("cls_before_pooler", device)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        stsb_dev(embed, dev)
        _sync(device)
        times.append(time.perf_counter() - t0)
    n = len({s for p in dev for s in (*p.sent1, *p.sent2)})
    return times[0], statistics.median(times[1:]), n


def padding_waste(model_dir, corpus, batch_size, max_len, seed=0, max_batches=2000):
    """Fraction of padded positions per batch (dynamic padding to the batch's longest sentence,
    truncation to ``max_len``) over the training schedule's batches: (mean, p10, p90, batches)."""
    import numpy as np

    from ..model.backbone import load_tokenizer
    from ..data.tokens import TokenCache
    from ..train.loop import batch_schedule, read_corpus

    sentences = read_corpus(corpus)
    lengths = TokenCache.build(sentences, load_tokenizer(model_dir)).lengths(max_len)
    fr = [1 - lengths[idx].sum() / (len(idx) * lengths[idx].max())
          for idx in batch_schedule(len(sentences), batch_size, 1, seed)[:max_batches]]
    return float(np.mean(fr)), float(np.percentile(fr, 10)), float(np.percentile(fr, 90)), len(fr)


def _peak(device, override):
    import torch

    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _method_args(items: list[str], methods: list[str]) -> dict[str, dict]:
    """``--method-args`` values: ``NAME=JSON`` for one method, or plain JSON for the one non-simcse method."""
    from ..utils import json_object

    out: dict[str, dict] = {}
    for it in items:
        name, _, text = it.partition("=") if not it.lstrip().startswith("{") else ("", "", it)
        if not name:
            others = [m for m in methods if m != "simcse"] or ["simcse"]
            if len(others) != 1:
                raise SentembError("--method-args: with several methods write NAME=JSON")
            name = others[0]
        if name not in methods:
            raise SentembError(f"--method-args {it!r}: {name!r} is not among the methods this run times "
                               f"({', '.join(methods)}); give --method {name}, or fix the name")
        out[name] = {**out.get(name, {}), **json_object(text, f"--method-args {it!r}")}
    return out


def train_cli(run, work: Path, name: str) -> tuple[Path, float, str | None]:
    """``sentemb train`` of ``run`` in a process of its own (``--no-track --quiet``), its run config
    ``work/<name>.json`` and output ``work/<name>``: (output directory, wall seconds, the last line
    of its error output when it failed, else None)."""
    import subprocess
    import sys

    from ..utils import write_json

    cfg, out = work / f"{name}.json", work / name
    write_json(cfg, run.to_dict())
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sentemb", "train", "--run-config", str(cfg), "--output-dir", str(out),
                        "--no-track", "--quiet"], capture_output=True, text=True)
    err = (p.stderr.strip().splitlines() or [""])[-1][:300] if p.returncode else None
    return out, time.perf_counter() - t, err
