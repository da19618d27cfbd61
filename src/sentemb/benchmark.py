"""Throughput benchmark (a script, not a test): training and evaluation sentences/s and tokens/s,
and the achieved training FLOP/s with its share of the device's peak (on CUDA the GPU's bf16 dense
peak by name, on CPU a large fp32 matmul timed in the same run; ``sentemb.flops``), for a model directory, batch size and device. ``--compare-st`` runs the
sentence-transformers SimCSE recipe (MultipleNegativesRankingLoss on duplicated sentences) with the
same model, sentences, batch size, max length and optimizer, timed the same way.

    sentemb benchmark --model $SHARED/models/all-MiniLM-L6-v2 --corpus $SHARED/data/wiki1m_head.txt \
        --batch-size 64 --steps 20 --device cpu --compare-st
"""

from __future__ import annotations

import time

from . import SentembError
from .settings import Run, TrainSettings

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak(device, override):
    import torch

    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _timed_training(module, opt, make_batch, loss_of, sentences, batch_size, steps, warmup, device, precision):
    """sentence-transformers' recipe (``bench_st``; not a sentemb method, so not the loop's
    ``run_steps``): warmup + steps optimizer steps (forward, backward, clip 1.0, AdamW) on
    consecutive corpus slices; time the last ``steps``. Returns (seconds, real tokens, padded tokens)."""
    import torch

    from .train import autocast

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
    """A registered method through the loop's own code (``sentemb.train.setup`` and ``run_steps``:
    the batch schedule, ``build_batch`` with the corpus's token cache, in line (``prefetch: false``)
    and timed separately, transfer, autocast, ``losses``, backward, with ``sam_rho`` SAM's second
    pass, clip, AdamW, LR schedule). Returns (seconds, real tokens, padded tokens, encoder config,
    build seconds) of the last ``steps`` steps after ``warmup``, and the FLOPs per padded position
    of one more step, counted (``sentemb.flops.counted``: every matmul of the step, whatever the
    method runs), so that FLOPs of the timed steps = that × their padded positions. ``chunk_size``:
    ``train.chunk_size`` (gradient caching; its extra forward is in the counted FLOPs)."""
    from .flops import counted
    from .train import State, log_step, run_steps, setup

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
    from .evaluate import Embedder

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

    from .methods import get_method

    fields = dict(epochs=50, batch_size=batch_size, max_len=max_len, eval_steps=10**9, eval_at_end=False,
                  log_steps=log_steps, save_steps=10**9, precision=precision, device=str(device),
                  model_selection="last")
    settings = TrainSettings(**{**fields, **train})
    return Run(name=method, method=method, backbone=Path(model_dir).name, seed=0, train=settings,
               method_args=get_method(method).resolve_args(method_args or {}), tracking={"enabled": False},
               paths={"model": str(model_dir), "corpus": str(corpus), "senteval": None, "inputs": dict(inputs or {})})


def _bench_jobs(stack, runs: dict, needed: int, batch_size: int) -> dict:
    """name -> (job, state): ``sentemb.train.setup`` of each run (closed with ``stack``), each with
    at least ``needed`` optimizer steps."""
    from .train import State, setup

    jobs = {}
    for name, run in runs.items():
        job = stack.enter_context(setup(run, "/nonexistent-benchmark-output"))
        if job.total < needed:
            raise SentembError(f"--corpus gives {job.total} steps of batch {batch_size}; {needed} are needed")
        jobs[name] = (job, State())
    return jobs


def _steps(job, state, n: int) -> None:
    """``n`` optimizer steps of the loop's own ``run_steps`` (with its log stage when due)."""
    from .train import run_steps

    for _ in run_steps(job, state, n):
        pass


def bench_overhead(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, log_steps=10,
                   method="simcse", rounds=3, variants=None):
    """The shared loop's full optimizer step (``sentemb.train.run_steps``: batches from the
    prefetch thread or built in line, transfer, autocast, losses, backward, clip, optimizer, LR
    schedule, the deferred finiteness check, and ``log_step`` every ``log_steps``) in each of
    ``variants`` (default ``LOOP_VARIANTS``), against a bare step on tensors built beforehand
    (forward + loss + backward + optimizer only), same model and batch shapes. The variants and the
    bare step take turns for ``rounds`` rounds of ``steps`` steps (so that a load change on the
    machine hits all of them); each one's median round counts. Returns {name: seconds per step},
    "bare" included."""
    import statistics
    from contextlib import ExitStack

    from .train import autocast, log_step

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
    """The cost of ``train.log_grad_norms`` (sentemb.grad_norms): the shared loop's optimizer step +
    ``log_step`` on *every* step (``log_steps: 1``) with the option off and on (``_bench_turns``).
    The difference is the cost of one logged step. Returns {"off": s/step, "on": s/step, "terms": [names]}."""
    runs = {key: _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, 1, method_args, inputs,
                            log_grad_norms=on) for key, on in (("off", False), ("on", True))}
    times, states = _bench_turns(runs, steps, warmup, rounds, device, batch_size)
    history = states["on"].history  # the logged grad norms of each step
    terms = [k.rsplit("/", 1)[1] for k in (history[-1] if history else {}) if k.startswith("train/grad_norm/")]
    return {**times, "terms": terms}


def bench_chunked(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, chunk_size,
                  method="simcse", method_args=None, inputs=None, rounds=3, keyed=False) -> dict:
    """The cost of gradient caching (``train.chunk_size``): the shared loop's optimizer step with the
    whole micro-batch in one forward and in chunks of ``chunk_size`` (``_bench_turns``); with
    ``keyed`` also both under ``train.dropout_rng: keyed``. Returns {variant: s/step} with variants
    "whole", "chunked" (and "whole keyed", "chunked keyed")."""
    variants = {"whole": {}, "chunked": {"chunk_size": chunk_size}}
    if keyed:
        variants.update({f"{k} keyed": {**v, "dropout_rng": "keyed"} for k, v in list(variants.items())})
    runs = {key: _bench_run(model_dir, corpus, batch_size, device, max_len, precision, method, 10**9, method_args,
                            inputs, **over) for key, over in variants.items()}
    return _bench_turns(runs, steps, warmup, rounds, device, batch_size)[0]


def bench_compile(model_dir, corpus, batch_size, steps, device, max_len, method="simcse"):
    """The loop with ``train.compile`` off and on, fp32, same seed: per-step losses and seconds per
    step after the first (compilation) step. Returns {False: (losses, first_s, s_per_step), True: …}."""
    import torch

    from .train import run_steps, setup

    out = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        run = _bench_run(model_dir, corpus, batch_size, device, max_len, "fp32", method, compile=compiled,
                         prefetch=False)
        with setup(run, "/nonexistent-benchmark-output") as job:
            from .train import State

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
    """The loop's STS-B dev evaluation (``sentemb.train.evaluate_and_keep``: the training-time dev
    embedder of SimCSE, fp32, the dev set tokenized and padded once and kept): seconds of the first
    call (with tokenization) and the median of the next ``repeats``. Returns (first, then, sentences)."""
    import statistics

    import torch

    from .evaluate import stsb_dev
    from .methods import MethodContext, get_method
    from .models import load_encoder
    from .senteval import load_task

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

    from .models import load_tokenizer
    from .tokens import TokenCache
    from .train import batch_schedule, read_corpus

    sentences = read_corpus(corpus)
    lengths = TokenCache.build(sentences, load_tokenizer(model_dir)).lengths(max_len)
    fr = [1 - lengths[idx].sum() / (len(idx) * lengths[idx].max())
          for idx in batch_schedule(len(sentences), batch_size, 1, seed)[:max_batches]]
    return float(np.mean(fr)), float(np.percentile(fr, 10)), float(np.percentile(fr, 90)), len(fr)


def _cmd_overhead(args) -> int:
    import torch

    from .utils import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    res = bench_overhead(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len,
                         args.precision, rounds=args.rounds)
    waste, p10, p90, n = padding_waste(args.model, args.corpus, args.batch_size, args.max_len)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {args.precision} | median of {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'step':<66} {'ms/step':>9} {'overhead':>9}")
    bare = res["bare"]
    print(f"{'bare (forward + loss + backward + optimizer, tensors pre-built)':<66} {1000 * bare:>9.1f} {'':>9}")
    for what in LOOP_VARIANTS:
        print(f"{what:<66} {1000 * res[what]:>9.1f} {100 * (res[what] / bare - 1):>8.1f}%")
    print("(the shared loop also clips the gradient norm, steps the LR schedule, checks finiteness and logs)")
    print(f"padding waste (padded share of positions per batch, {n} batches of the schedule): "
          f"mean {100 * waste:.1f}%, p10 {100 * p10:.1f}%, p90 {100 * p90:.1f}%")
    if args.compile:
        comp = bench_compile(args.model, args.corpus, args.batch_size, args.compile_steps, device, args.max_len)
        (l0, f0, s0), (l1, f1, s1) = comp[False], comp[True]
        diff = max(abs(a - b) for a, b in zip(l0, l1))
        print()
        print(f"torch.compile (train.compile), fp32, {len(l0)} steps of the same run:")
        print(f"{'':<22} {'first step s':>13} {'ms/step after':>14} {'loss, step 1':>13} {'loss, last step':>16}")
        print(f"{'eager':<22} {f0:>13.2f} {1000 * s0:>14.1f} {l0[0]:>13.6f} {l0[-1]:>16.6f}")
        print(f"{'compiled':<22} {f1:>13.2f} {1000 * s1:>14.1f} {l1[0]:>13.6f} {l1[-1]:>16.6f}")
        print(f"largest per-step loss difference: {diff:.2e}")
    return 0


def _cmd_grad_norms(args) -> int:
    import torch

    from .utils import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    methods = args.method or ["simcse"]
    margs = _method_args(args.method_args, methods)
    inputs = dict(kv.split("=", 1) for kv in args.input)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {args.precision} | median of {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'method':<10} {'terms':<28} {'ms/step off':>12} {'ms/step on':>11} {'ms per logged step':>19} "
          f"{'% of a step':>12} {'at log_steps 10':>16}")
    for m in methods:
        r = bench_grad_norms(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len,
                             args.precision, m, margs.get(m), inputs, args.rounds)
        extra = r["on"] - r["off"]
        print(f"{m:<10} {', '.join(r['terms']):<28} {1000 * r['off']:>12.1f} {1000 * r['on']:>11.1f} "
              f"{1000 * extra:>19.1f} {100 * extra / r['off']:>11.1f}% {10 * extra / r['off']:>15.1f}%")
    print("(every step logged in both columns; the difference is the cost of train.log_grad_norms on a logged step, "
          "nothing on the others; 'at log_steps 10' = that cost over 10 steps)")
    return 0


def _cmd_chunked(args) -> int:
    import torch

    from .utils import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    methods = args.method or ["simcse"]
    margs = _method_args(args.method_args, methods)
    inputs = dict(kv.split("=", 1) for kv in args.input)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | chunks of {args.chunked} | max_len "
          f"{args.max_len} | precision {args.precision} | median of {args.rounds} rounds of {args.steps} steps after "
          f"{args.warmup} warm-up")
    head = f"{'method':<10} {'ms/step whole':>14} {'ms/step chunked':>16} {'ratio':>7}"
    if args.keyed:
        head += f" {'whole keyed':>12} {'chunked keyed':>14} {'ratio':>7}"
    print(head)
    for m in methods:
        r = bench_chunked(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len,
                          args.precision, args.chunked, m, margs.get(m), inputs, args.rounds, args.keyed)
        row = f"{m:<10} {1000 * r['whole']:>14.1f} {1000 * r['chunked']:>16.1f} {r['chunked'] / r['whole']:>7.2f}"
        if args.keyed:
            row += (f" {1000 * r['whole keyed']:>12.1f} {1000 * r['chunked keyed']:>14.1f} "
                    f"{r['chunked keyed'] / r['whole keyed']:>7.2f}")
        print(row, flush=True)
    print("(train.chunk_size: a chunked step encodes the batch twice, once without a graph: expect about 4/3 of the "
          "whole step's time; keyed = train.dropout_rng: keyed, the masks that make it equal the unchunked gradient)")
    return 0


def _cmd_benchmark(args) -> int:
    import torch

    if args.overhead:
        return _cmd_overhead(args)
    if args.grad_norms:
        return _cmd_grad_norms(args)
    if args.chunked:
        return _cmd_chunked(args)

    from .train import read_corpus
    from .utils import resolve_device

    device = resolve_device(args.device)
    if args.sam_rho is not None and (args.sam_rho <= 0 or args.precision == "fp16"):
        raise SentembError("--sam-rho: must be > 0 and cannot be combined with --precision fp16")
    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = read_corpus(args.corpus)
    need = args.batch_size * (args.steps + args.warmup + 2)  # + the counted step (and one to spare)
    if len(sentences) < need:
        raise SentembError(f"--corpus has {len(sentences)} sentences; {need} are needed for the steps asked")
    rows = []
    methods = list(dict.fromkeys(["simcse", *(args.method or [])]))  # simcse first: the ratio's reference
    margs = _method_args(args.method_args, methods)
    inputs = dict(kv.split("=", 1) for kv in args.input)
    sents = args.batch_size * args.steps
    peak = _peak(device, args.peak_tflops)
    peak_what = "given" if args.peak_tflops else "bf16 dense, by GPU name"
    if peak is None and device.type == "cpu":
        from .flops import cpu_peak_tflops

        peak, peak_what = cpu_peak_tflops(), "fp32 matmul 2048x2048 measured now"
    per_method = []
    for name in methods:
        secs, tok, padded, cfg, t_build, fpt = bench_method(
            args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len, args.precision,
            name, margs.get(name), inputs, args.sam_rho)
        tflops = fpt * padded / secs / 1e12  # counted FLOPs of the padded batches the model ran
        rows.append((f"train sentemb {name}", sents / secs, tok / secs, 1000 * secs / args.steps, tflops,
                     tflops / peak if peak else None))
        per_method.append((name, sents / secs, tok / secs, t_build / secs))
        if args.unpad and name == "simcse":
            s_u, tok_u, *_ = bench_method(args.model, args.corpus, args.batch_size, args.steps, args.warmup,
                                          device, args.max_len, args.precision, name, margs.get(name), inputs,
                                          args.sam_rho, unpad=True)
            # Both rows count the FLOPs of the padded batch (the work asked of the model; the same
            # batches), so the unpad row's share of peak is the padded work done per second.
            t_u = fpt * padded / s_u / 1e12
            rows.append(("train sentemb simcse, train.unpad", sents / s_u, tok_u / s_u, 1000 * s_u / args.steps, t_u,
                         t_u / peak if peak else None))
    if args.compare_st:
        s2, t2 = bench_st(args.model, sentences, args.batch_size, args.steps, args.warmup, device, args.max_len,
                          args.precision)
        rows.append(("train sentence-transformers MNRL", sents / s2, t2 / s2, 1000 * s2 / args.steps, None, None))
    es, en, et = bench_eval(args.model, sentences[: args.eval_sentences], args.eval_batch_size, device)
    rows.append(("evaluate (encode, no truncation)", en / es, et / es, None, None, None))
    dev_eval = bench_dev_eval(args.model, args.senteval, device) if args.senteval else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {args.precision} | {args.steps} timed steps after {args.warmup} warm-up"
          + (f" | SAM rho {args.sam_rho} (every method)" if args.sam_rho else ""))
    print(f"peak: {f'{peak:.3f} TFLOP/s ({peak_what})' if peak else 'unknown (give --peak-tflops)'}; "
          "TFLOP/s = counted matmul FLOPs of the padded batches (sentemb.flops) / time")
    print(f"{'what':<36} {'sentences/s':>12} {'tokens/s':>12} {'ms/step':>9} {'TFLOP/s':>8} {'of peak':>8}")
    for what, sps, tps, ms, tf, u in rows:
        print(f"{what:<36} {sps:>12.1f} {tps:>12.0f} {ms if ms is not None else float('nan'):>9.1f} "
              f"{(f'{tf:.3f}' if tf is not None else '-'):>8} {(f'{100 * u:.1f}%' if u is not None else '-'):>8}")
    if dev_eval is not None:
        step_s = args.batch_size / per_method[0][1]
        every = args.eval_every
        first, then, n_dev = dev_eval
        print(f"STS-B dev evaluation in the loop ({n_dev} sentences, fp32, tokenized once): first {first:.2f} s, then "
              f"{then:.2f} s; every {every} steps of simcse at batch {args.batch_size} "
              f"({every * step_s:.1f} s of training) it costs {100 * then / (every * step_s + then):.1f}% of training time")
    if args.method:
        ref = per_method[0][1]
        print()
        print(f"{'method':<16} {'sentences/s':>12} {'tokens/s':>12} {'build_batch share':>18} {'vs simcse':>10}")
        for name, sps, tps, share in per_method:
            print(f"{name:<16} {sps:>12.1f} {tps:>12.0f} {100 * share:>17.1f}% {sps / ref:>9.2f}x")
        print("(tokens/s counts the real tokens of the batch a method builds; build_batch share = time in "
              "build_batch / step time)")
    return 0


def _method_args(items: list[str], methods: list[str]) -> dict[str, dict]:
    """``--method-args`` values: ``NAME=JSON`` for one method, or plain JSON for the one non-simcse method."""
    import json

    out: dict[str, dict] = {}
    for it in items:
        name, _, text = it.partition("=") if not it.lstrip().startswith("{") else ("", "", it)
        if not name:
            others = [m for m in methods if m != "simcse"] or ["simcse"]
            if len(others) != 1:
                raise SentembError("--method-args: with several methods write NAME=JSON")
            name = others[0]
        try:
            val = json.loads(text)
        except json.JSONDecodeError as e:
            raise SentembError(f"--method-args {it!r}: not valid JSON ({e})") from None
        if not isinstance(val, dict):
            raise SentembError(f"--method-args {it!r}: must be a JSON object")
        out[name] = {**out.get(name, {}), **val}
    return out


def register(sub) -> None:
    p = sub.add_parser("benchmark", help="training/evaluation throughput, achieved FLOP/s and share of the device peak")
    p.add_argument("--model", required=True, help="HF model directory (pretrained or random-init)")
    p.add_argument("--corpus", required=True, help="sentences, one per line")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-len", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--eval-sentences", type=int, default=2000)
    p.add_argument("--eval-batch-size", type=int, default=128)
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: by GPU name)")
    p.add_argument("--overhead", action="store_true",
                   help="compare the shared loop's full step with a bare step on pre-built tensors (use a tiny "
                        "model) and report the padding waste of the corpus's batches")
    p.add_argument("--senteval", default=None, metavar="DIR",
                   help="SentEval data directory: also time the loop's STS-B dev evaluation and its share of training "
                        "time at --eval-every")
    p.add_argument("--eval-every", type=int, default=125, help="with --senteval: steps between dev evaluations")
    p.add_argument("--unpad", action="store_true",
                   help="also time simcse with the padding-free forward (train.unpad)")
    p.add_argument("--rounds", type=int, default=3, help="--overhead: rounds of --steps steps per variant (median)")
    p.add_argument("--compile", action="store_true",
                   help="--overhead: also run the loop with train.compile off and on (fp32) and compare losses")
    p.add_argument("--compile-steps", type=int, default=5)
    p.add_argument("--compare-st", action="store_true", help="also time sentence-transformers' MNRL recipe")
    p.add_argument("--grad-norms", action="store_true",
                   help="time the loop with train.log_grad_norms off and on, every step logged, for each --method "
                        "(default simcse): the cost of one logged step (--steps, --rounds, --warmup)")
    p.add_argument("--chunked", type=int, default=None, metavar="N",
                   help="time the loop with the whole micro-batch in one forward and with train.chunk_size N "
                        "(gradient caching) for each --method (default simcse): the cost of the extra forward")
    p.add_argument("--keyed", action="store_true", help="--chunked: also both with train.dropout_rng: keyed")
    p.add_argument("--method", action="append", default=[], metavar="NAME",
                   help="also time this registered method (repeatable); prints a per-method table with the "
                        "share of build_batch and the ratio to simcse measured in the same invocation")
    p.add_argument("--method-args", action="append", default=[], metavar="[NAME=]JSON",
                   help="method arguments, e.g. 'una={\"alpha\": 5}'")
    p.add_argument("--sam-rho", type=float, default=None, metavar="RHO",
                   help="time every method with Sharpness-Aware Minimization (train.sam_rho): two forward/backward "
                        "passes per step")
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="an input a method declares (token_freq, tfidf, rake, paraphrases, nltk, ...)")
    p.set_defaults(func=_cmd_benchmark)
