"""Throughput benchmark (a script, not a test): training and evaluation sentences/s and tokens/s,
and MFU on CUDA, for a model directory, batch size and device. ``--compare-st`` runs the
sentence-transformers SimCSE recipe (MultipleNegativesRankingLoss on duplicated sentences) with the
same model, sentences, batch size, max length and optimizer, timed the same way.

    sentemb benchmark --model $SHARED/models/all-MiniLM-L6-v2 --corpus $SHARED/data/wiki1m_head.txt \
        --batch-size 64 --steps 20 --device cpu --compare-st
"""

from __future__ import annotations

import time

from . import SentembError

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def train_flops(config, n_tokens: int, seq_len: int) -> float:
    """Forward+backward FLOPs: 6·N·T for the dense weights + 12·layers·hidden·L·T for attention
    (PaLM, Chowdhery et al. 2022, App. B); N excludes the embedding tables."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    n = layers * (4 * h * h + 2 * h * inter) + h * h  # attention + FFN + MLP head
    return 6.0 * n * n_tokens + 12.0 * layers * h * seq_len * n_tokens


def _peak(device, override):
    import torch

    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _timed_training(module, opt, make_batch, loss_of, sentences, batch_size, steps, warmup, device, precision):
    """Run warmup + steps optimizer steps (forward, backward, clip 1.0, AdamW) on consecutive corpus
    slices; time the last ``steps``. Returns (seconds, real tokens, padded tokens)."""
    import torch

    from .train import _precision

    amp = _precision(precision, device)
    n_tok = n_pad = 0
    t0 = None
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            t0 = time.perf_counter()
        batch = make_batch(sentences[(i * batch_size) % len(sentences):][:batch_size])
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
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


def bench_method(model_dir, sentences, batch_size, steps, warmup, device, max_len, precision, method="simcse",
                 method_args=None, inputs=None, corpus=None, sam_rho=None):
    """A registered method through the loop's own calls: ``build_batch`` (timed separately, with the
    sentences' corpus line indices and the micro-batch index), transfer, autocast, ``losses``,
    backward, (with ``sam_rho``: SAM's ascent and second forward/backward with the same dropout
    masks, as ``train.sam_gradients``), clip, AdamW. Returns (seconds, real tokens, padded tokens,
    encoder config, build seconds)."""
    import torch

    from pathlib import Path

    from . import sam
    from .methods import MethodContext, get_method
    from .models import load_encoder
    from .train import _precision, _rng_state, _set_rng_state, build_optimizer

    torch.manual_seed(0)
    enc, tok = load_encoder(model_dir, pooling_layer=False)
    ctx = MethodContext(max_len=max_len, seed=0, backbone=Path(model_dir).name, model_dir=Path(model_dir),
                        inputs={k: Path(v) for k, v in (inputs or {}).items()}, corpus=Path(corpus) if corpus else None)
    m = get_method(method)(enc, tok, method_args or {}, ctx).to(device)
    m.train()
    opt = build_optimizer(m, 3e-5, 0.0, device)
    amp = _precision(precision, device)
    n_tok = n_pad = 0
    t0 = None
    t_build = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            t0, t_build = time.perf_counter(), 0.0
        start = (i * batch_size) % len(sentences)
        lines = list(range(start, min(start + batch_size, len(sentences))))
        tb = time.perf_counter()
        cpu_batch = m.build_batch([sentences[j] for j in lines], step=i, lines=lines, micro=i)
        t_build += time.perf_counter() - tb
        batch = {k: v.to(device, non_blocking=True) for k, v in cpu_batch.items()}
        rng = _rng_state() if sam_rho else None
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = m.losses(batch)["loss"]
        loss.backward()
        if sam_rho:
            saved = sam.ascend([p for g in opt.param_groups for p in g["params"]], sam_rho)
            opt.zero_grad(set_to_none=True)
            _set_rng_state(rng)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                m.losses(batch)["loss"].backward()
            sam.restore(saved)
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup and "attention_mask" in batch:
            n_tok += int(batch["attention_mask"].sum())
            n_pad += batch["attention_mask"].numel()
    _sync(device)
    return time.perf_counter() - t0, n_tok, n_pad, enc.config, t_build


def bench_sentemb(model_dir, sentences, batch_size, steps, warmup, device, max_len, precision):
    """sentemb's SimCSE: both dropout views in one forward pass of 2B rows."""
    secs, n_tok, n_pad, cfg, _ = bench_method(model_dir, sentences, batch_size, steps, warmup, device, max_len,
                                              precision, "simcse")
    return secs, n_tok, n_pad, cfg


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


def bench_overhead(model_dir, corpus, batch_size, steps, warmup, device, max_len, precision, log_steps=10,
                   method="simcse"):
    """The shared loop's full optimizer step (``sentemb.train.optimizer_step``: build_batch on the
    corpus schedule, transfer, autocast, losses, backward, clip, optimizer, LR schedule, the
    deferred finiteness check, and ``log_step`` every ``log_steps``) against a bare step on tensors
    built beforehand (forward + loss + backward + optimizer only), same model, same batches.
    Returns (loop seconds per step, bare seconds per step)."""
    import torch

    from .tracking import Tracker
    from .train import State, log_step, optimizer_step, setup

    tc = {"epochs": 1, "max_steps": None, "batch_size": batch_size, "grad_accum": 1, "lr": 3e-5, "weight_decay": 0.0,
          "warmup_ratio": 0.0, "lr_schedule": "linear", "grad_clip": 1.0, "max_len": max_len, "eval_steps": 10**9,
          "eval_at_end": False, "log_steps": log_steps, "save_steps": 10**9, "precision": precision, "dropout": None,
          "device": str(device), "num_threads": None, "compile": False, "model_selection": "last"}
    from .methods import get_method

    run = {"name": method, "method": method, "backbone": "bench", "seed": 0, "train": tc,
           "method_args": get_method(method).resolve_args({}), "paths": {"model": str(model_dir), "corpus": str(corpus),
                                                                           "senteval": None, "inputs": {}}}
    job = setup(run, "/nonexistent-benchmark-output")
    if job.total < 2 * (warmup + steps):
        raise SentembError(f"--corpus gives {job.total} steps of batch {batch_size}; {2 * (warmup + steps)} are needed")
    job.tracker = Tracker(enabled=False)
    state = State()
    job.method.train()
    for _ in range(warmup):
        optimizer_step(job, state)
    log_step(job, state)
    _sync(device)
    t0 = time.perf_counter()
    state.t_log = t0
    for i in range(steps):
        optimizer_step(job, state)
        if state.step % log_steps == 0:
            log_step(job, state)
    log_step(job, state)
    _sync(device)
    loop = (time.perf_counter() - t0) / steps

    # bare: the next steps' batches prepared and moved to the device before the clock starts
    batches = [{k: v.to(device) for k, v in micro[1].items()}
               for s in range(state.step, state.step + warmup + steps) for micro in [
                   (s, job.method.build_batch([job.sentences[i] for i in job.micro[s]], step=s, lines=job.micro[s], micro=s))]]
    amp = job.amp
    for i, batch in enumerate(batches):
        if i == warmup:
            _sync(device)
            t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = job.method.losses(batch)["loss"]
        loss.backward()
        job.opt.step()
        job.opt.zero_grad(set_to_none=True)
    _sync(device)
    bare = (time.perf_counter() - t0) / steps
    return loop, bare


def padding_waste(model_dir, corpus, batch_size, max_len, seed=0, max_batches=2000):
    """Fraction of padded positions per batch (dynamic padding to the batch's longest sentence,
    truncation to ``max_len``) over the training schedule's batches: (mean, p10, p90, batches)."""
    import numpy as np
    from transformers import AutoTokenizer

    from .train import batch_schedule, read_corpus

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    sentences = read_corpus(corpus)
    lengths = np.array([len(x) for x in tok(sentences, truncation=True, max_length=max_len)["input_ids"]])
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
    loop, bare = bench_overhead(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device,
                                args.max_len, args.precision)
    waste, p10, p90, n = padding_waste(args.model, args.corpus, args.batch_size, args.max_len)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {args.precision} | {args.steps} timed steps after {args.warmup} warm-up")
    print(f"{'step':<62} {'ms/step':>9} {'overhead':>9}")
    print(f"{'bare (forward + loss + backward + optimizer, tensors pre-built)':<62} {1000 * bare:>9.1f} {'':>9}")
    print(f"{'shared loop (sentemb.train.optimizer_step + log_step)':<62} {1000 * loop:>9.1f} "
          f"{100 * (loop / bare - 1):>8.1f}%")
    print(f"padding waste (padded share of positions per batch, {n} batches of the schedule): "
          f"mean {100 * waste:.1f}%, p10 {100 * p10:.1f}%, p90 {100 * p90:.1f}%")
    return 0


def _cmd_benchmark(args) -> int:
    import torch

    if args.overhead:
        return _cmd_overhead(args)

    from .train import read_corpus
    from .utils import resolve_device

    device = resolve_device(args.device)
    if args.sam_rho is not None and (args.sam_rho <= 0 or args.precision == "fp16"):
        raise SentembError("--sam-rho: must be > 0 and cannot be combined with --precision fp16")
    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = read_corpus(args.corpus)
    need = args.batch_size * (args.steps + args.warmup)
    if len(sentences) < need:
        raise SentembError(f"--corpus has {len(sentences)} sentences; {need} are needed for the steps asked")
    rows = []
    methods = list(dict.fromkeys(["simcse", *(args.method or [])]))  # simcse first: the ratio's reference
    margs = _method_args(args.method_args, methods)
    inputs = dict(kv.split("=", 1) for kv in args.input)
    sents = args.batch_size * args.steps
    peak = _peak(device, args.peak_tflops)
    per_method = []
    for name in methods:
        secs, tok, padded, cfg, t_build = bench_method(
            args.model, sentences, args.batch_size, args.steps, args.warmup, device, args.max_len, args.precision,
            name, margs.get(name), inputs, args.corpus, args.sam_rho)
        # SimCSE encodes both views: 2 × tokens pass through the network each step.
        mfu = (train_flops(cfg, 2 * padded, padded // sents) / secs / (peak * 1e12)) if peak and name == "simcse" else None
        rows.append((f"train sentemb {name}", sents / secs, tok / secs, 1000 * secs / args.steps, mfu))
        per_method.append((name, sents / secs, tok / secs, t_build / secs))
    if args.compare_st:
        s2, t2 = bench_st(args.model, sentences, args.batch_size, args.steps, args.warmup, device, args.max_len,
                          args.precision)
        rows.append(("train sentence-transformers MNRL", sents / s2, t2 / s2, 1000 * s2 / args.steps, None))
    es, en, et = bench_eval(args.model, sentences[: args.eval_sentences], args.eval_batch_size, device)
    rows.append(("evaluate (encode, no truncation)", en / es, et / es, None, None))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {args.precision} | {args.steps} timed steps after {args.warmup} warm-up"
          + (f" | SAM rho {args.sam_rho} (every method)" if args.sam_rho else ""))
    print(f"{'what':<36} {'sentences/s':>12} {'tokens/s':>12} {'ms/step':>9} {'MFU':>7}")
    for what, sps, tps, ms, u in rows:
        print(f"{what:<36} {sps:>12.1f} {tps:>12.0f} {ms if ms is not None else float('nan'):>9.1f} "
              f"{(f'{100 * u:.1f}%' if u is not None else '-'):>7}")
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
    p = sub.add_parser("benchmark", help="training/evaluation throughput (and MFU on CUDA)")
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
    p.add_argument("--compare-st", action="store_true", help="also time sentence-transformers' MNRL recipe")
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
