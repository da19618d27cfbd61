"""``sentemb`` commands of ``sentemb.ops.benchmark``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

from .. import SentembError
from ..ops.benchmark import (
    LOOP_VARIANTS, bench_chunked, bench_compile, bench_counter_compile, bench_dev_eval, bench_eval,
    bench_grad_norms, bench_method, bench_overhead, bench_st, padding_waste, _method_args, _peak)
from .argtypes import key_value, non_negative_int, positive_int, positive_float




def _cmd_overhead(args) -> int:
    import torch

    from ..utils import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    res = bench_overhead(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len,
                         args.precision, rounds=args.rounds)
    waste, p10, p90, n = padding_waste(args.model, args.corpus, args.batch_size, args.max_len)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {_precision_label(args)} | median of {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up")
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


def _bench_setup(args) -> tuple:
    """The device (and its name as printed), the methods, their ``--method-args`` and ``--input``
    paths of a method benchmark."""
    import torch

    from ..utils import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    methods = args.method or ["simcse"]
    return device, name, methods, _method_args(args.method_args, methods), dict(args.input)


def _cmd_grad_norms(args) -> int:
    device, name, methods, margs, inputs = _bench_setup(args)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | max_len {args.max_len} | "
          f"precision {_precision_label(args)} | median of {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up")
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


def _cmd_counter_compile(args) -> int:
    device, name, methods, margs, inputs = _bench_setup(args)
    chunk = args.chunked or max(1, args.batch_size // 4)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | chunks of {chunk} | max_len {args.max_len} "
          f"| precision {_precision_label(args)} | train.compile, dropout_rng counter | median of {args.steps} steps after the "
          f"first (compiling) step and {args.warmup} warm-up, each row in a process of its own")
    print(f"{'method':<10} {'counter masks':<34} {'chunks':>7} {'first step s':>13} {'ms/step':>9} {'vs break':>9}")
    for m in methods:
        r = bench_counter_compile(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device,
                                  args.max_len, args.precision, chunk, m, args.threads, method_args=margs.get(m),
                                  inputs=inputs)
        for kernel, what in (("auto", "outside (a graph break each)"), ("inline", "traced (counter_kernel inline)")):
            for c in (None, chunk):
                first, per = r[kernel, c]
                print(f"{m:<10} {what:<34} {c or 'none':>7} {first:>13.1f} {1000 * per:>9.1f} "
                      f"{per / r['auto', c][1]:>9.2f}", flush=True)
    print("(train.counter_kernel inline traces the counter masks with the encoder, so the compiled code has no graph "
          "break at each dropout and Inductor can fuse the hash with the work around it; the same masks)")
    return 0


def _cmd_chunked(args) -> int:
    device, name, methods, margs, inputs = _bench_setup(args)
    print(f"model {args.model} | device {name} | batch {args.batch_size} | chunks of {args.chunked} | max_len "
          f"{args.max_len} | precision {_precision_label(args)} | median of {args.rounds} rounds of {args.steps} steps after "
          f"{args.warmup} warm-up")
    head = f"{'method':<10} {'ms/step whole':>14} {'ms/step chunked':>16} {'ratio':>7}"
    if args.keyed:
        head += f" {'whole keyed':>12} {'chunked keyed':>14} {'ratio':>7}"
    if args.counter:
        head += f" {'whole counter':>14} {'chunked counter':>16} {'ratio':>7} {'1st pass per chunk':>19} {'ratio':>7}"
    print(head)
    for m in methods:
        r = bench_chunked(args.model, args.corpus, args.batch_size, args.steps, args.warmup, device, args.max_len,
                          args.precision, args.chunked, m, margs.get(m), inputs, args.rounds, args.keyed, args.counter)
        row = f"{m:<10} {1000 * r['whole']:>14.1f} {1000 * r['chunked']:>16.1f} {r['chunked'] / r['whole']:>7.2f}"
        if args.keyed:
            row += (f" {1000 * r['whole keyed']:>12.1f} {1000 * r['chunked keyed']:>14.1f} "
                    f"{r['chunked keyed'] / r['whole keyed']:>7.2f}")
        if args.counter:
            per = r["chunked counter per-chunk first pass"]
            row += (f" {1000 * r['whole counter']:>14.1f} {1000 * r['chunked counter']:>16.1f} "
                    f"{r['chunked counter'] / r['whole counter']:>7.2f} {1000 * per:>19.1f} {per / r['whole counter']:>7.2f}")
        print(row, flush=True)
    print("(train.chunk_size: a chunked step encodes the batch twice, once without a graph: expect about 4/3 of the "
          "whole step's time; keyed = train.dropout_rng: keyed, the masks that make it equal the unchunked gradient; "
          "counter = the same keys hashed on the device: 'chunked counter' runs the graph-free first pass over the "
          "whole batch (train.chunk_first_pass auto), '1st pass per chunk' chunk by chunk (chunk_first_pass chunks))")
    return 0


def _cmd_build_only(args) -> int:
    import statistics

    import torch

    from ..ops.benchmark import WARM_BUILDS, bench_build

    other = [flag for flag, on in (("--overhead", args.overhead), ("--grad-norms", args.grad_norms),
                                   ("--counter-compile", args.counter_compile), ("--chunked", args.chunked)) if on]
    other += ["--" + k.replace("_", "-") for k in _OPTIONAL
              if k not in _READS["build_only"] and getattr(args, k) != args.option_defaults[k]]
    if other:
        raise SentembError(f"--build-only times build_batch alone; it cannot be combined with {', '.join(other)}")
    _, _, methods, margs, inputs = _bench_setup(args)  # threads, methods (default simcse), their args and inputs
    print(f"model {args.model} (its tokenizer) | corpus {args.corpus} | batch {args.batch_size} | max_len "
          f"{args.max_len} | cpu x{torch.get_num_threads()} threads | build_batch of optimizer steps "
          f"0..{args.steps - 1}, one call each, after {WARM_BUILDS} untimed calls")
    print(f"{'method':<10} {'ms/step mean':>13} {'median':>8} {'max':>8} {'slowest step':>13} {'sentences/s':>12}")
    for m in methods:
        t = bench_build(args.model, args.corpus, args.batch_size, args.steps, args.max_len, m, margs.get(m), inputs)
        mean = sum(t) / len(t)
        print(f"{m:<10} {1000 * mean:>13.2f} {1000 * statistics.median(t):>8.2f} {1000 * max(t):>8.2f} "
              f"{t.index(max(t)):>13} {args.batch_size / mean:>12.0f}", flush=True)
    print("(one process: the loop builds a step's batches a step ahead in a thread, or over train.workers "
          "processes; a mean above the GPU step's time holds the GPU back)")
    return 0


#: the options only some of benchmark's modes read (``_unread``; their defaults are the parser's)
_OPTIONAL = ("peak_tflops", "sam_rho", "senteval", "eval_every", "unpad", "compile", "compile_steps", "compare_st",
             "keyed", "counter", "method", "method_args", "input", "rounds", "eval_sentences", "eval_batch_size")
#: mode -> the optional options it reads (the default mode: the per-method table)
_READS = {
    "overhead": {"rounds", "compile", "compile_steps"},
    "grad_norms": {"rounds", "method", "method_args", "input"},
    "counter_compile": {"method", "method_args", "input"},
    "chunked": {"rounds", "keyed", "counter", "method", "method_args", "input"},
    "build_only": {"method", "method_args", "input"},
    "default": {"peak_tflops", "sam_rho", "senteval", "eval_every", "unpad", "compare_st", "method", "method_args",
                "input", "eval_sentences", "eval_batch_size"},
}


def _unread(args) -> None:
    """Refuse, naming them, the options given that the chosen mode does not read (they would be dropped
    without a word: ``--keyed`` without ``--chunked``, ``--peak-tflops`` with ``--overhead``, ...);
    ``--eval-every`` also needs ``--senteval``. ``--build-only`` has its own list."""
    mode = next((m for m in ("overhead", "grad_norms", "counter_compile", "chunked") if getattr(args, m)), "default")
    given = [k for k in _OPTIONAL if getattr(args, k) != args.option_defaults[k]]
    unread = [k for k in given if k not in _READS[mode]]
    if mode == "default" and "eval_every" in given and args.senteval is None:
        unread.append("eval_every")
    if unread:
        flag = {"overhead": "--overhead", "grad_norms": "--grad-norms", "counter_compile": "--counter-compile",
                "chunked": "--chunked"}.get(mode, "the per-method table (no mode flag)")
        names = ", ".join("--" + k.replace("_", "-") for k in dict.fromkeys(unread))
        raise SentembError(f"{names}: not read by {flag}" + (" (--eval-every needs --senteval)"
                                                             if "eval_every" in unread else "")
                           + "; drop them, or choose the mode that reads them (sentemb benchmark --help)")


def _cmd_benchmark(args) -> int:
    import torch

    from ..methods import load_method_modules

    # a plug-in's method (--method NAME from a file of one's own), imported before any --method is looked up
    load_method_modules(args.method_module or None, "--method-module")
    if not args.build_only:
        _unread(args)
    if args.build_only:
        return _cmd_build_only(args)
    if args.overhead:
        return _cmd_overhead(args)
    if args.grad_norms:
        return _cmd_grad_norms(args)
    if args.counter_compile:
        return _cmd_counter_compile(args)
    if args.chunked:
        return _cmd_chunked(args)

    from ..train.loop import read_corpus
    from ..utils import resolve_device

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
    inputs = dict(args.input)
    sents = args.batch_size * args.steps
    peak = _peak(device, args.peak_tflops)
    peak_what = "given" if args.peak_tflops else "bf16 dense, by GPU name"
    if peak is None and device.type == "cpu":
        from ..ops.flops import cpu_peak_tflops

        dtype = args.precision if args.precision in ("bf16", "fp16") else "fp32"  # auto is fp32 on a CPU
        peak, peak_what = cpu_peak_tflops(dtype=dtype), f"{dtype} matmul (up to 2048x2048) measured now"
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
          f"precision {_precision_label(args)} | {args.steps} timed steps after {args.warmup} warm-up"
          + (f" | SAM rho {args.sam_rho} (every method)" if args.sam_rho else ""))
    print(f"peak: {f'{peak:.3f} TFLOP/s ({peak_what})' if peak else 'unknown (give --peak-tflops)'}; "
          "TFLOP/s = counted matmul FLOPs of the padded batches (sentemb.ops.flops) / time")
    print(f"{'what':<36} {'sentences/s':>12} {'tokens/s':>12} {'ms/step':>9} {'TFLOP/s':>8} {'of peak':>8}")
    for what, sps, tps, ms, tf, u in rows:
        print(f"{what:<36} {sps:>12.1f} {tps:>12.0f} {(f'{ms:.1f}' if ms is not None else '-'):>9} "
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




def register(sub) -> None:
    p = sub.add_parser("benchmark", help="training/evaluation throughput, achieved FLOP/s and share of the device peak")
    p.add_argument("--model", required=True, help="HF model directory (pretrained or random-init)")
    p.add_argument("--corpus", required=True, help="sentences, one per line")
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences per training step (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps (default: %(default)s)")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed warm-up steps before them (default: %(default)s)")
    p.add_argument("--max-len", type=positive_int, default=32, help="training truncation in tokens, as train.max_len "
                                                           "(default: %(default)s)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cpu, cuda, cuda:N (default: %(default)s)")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="training precision, as train.precision (auto: bf16 autocast on CUDA, fp32 elsewhere; "
                        "default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--eval-sentences", type=positive_int, default=2000,
                   help="corpus sentences the evaluate row encodes (default: %(default)s)")
    p.add_argument("--eval-batch-size", type=positive_int, default=128,
                   help="batch size of the evaluate row (default: %(default)s)")
    p.add_argument("--peak-tflops", type=positive_float, default=None, help="device peak for MFU (default: by GPU name)")
    p.add_argument("--overhead", action="store_true",
                   help="compare the shared loop's full step with a bare step on pre-built tensors (use a tiny "
                        "model) and report the padding waste of the corpus's batches")
    p.add_argument("--senteval", default=None, metavar="DIR",
                   help="SentEval data directory: also time the loop's STS-B dev evaluation and its share of training "
                        "time at --eval-every")
    p.add_argument("--eval-every", type=positive_int, default=125, help="with --senteval: steps between dev evaluations (default: %(default)s)")
    p.add_argument("--unpad", action="store_true",
                   help="also time simcse with the padding-free forward (train.unpad)")
    p.add_argument("--rounds", type=positive_int, default=3, help="--overhead: rounds of --steps steps per variant (median)")
    p.add_argument("--compile", action="store_true",
                   help="--overhead: also run the loop with train.compile off and on (fp32) and compare losses")
    p.add_argument("--compile-steps", type=positive_int, default=5,
                   help="--compile: steps of each run, eager and compiled (default: %(default)s)")
    p.add_argument("--compare-st", action="store_true", help="also time sentence-transformers' MNRL recipe")
    p.add_argument("--grad-norms", action="store_true",
                   help="time the loop with train.log_grad_norms off and on, every step logged, for each --method "
                        "(default simcse): the cost of one logged step (--steps, --rounds, --warmup)")
    p.add_argument("--chunked", type=positive_int, default=None, metavar="N",
                   help="time the loop with the whole micro-batch in one forward and with train.chunk_size N "
                        "(gradient caching) for each --method (default simcse): the cost of the extra forward")
    p.add_argument("--keyed", action="store_true", help="--chunked: also both with train.dropout_rng: keyed")
    p.add_argument("--counter", action="store_true",
                   help="--chunked: also both with train.dropout_rng: counter, and the chunked step with its first "
                        "pass chunk by chunk (train.chunk_first_pass: chunks)")
    p.add_argument("--counter-compile", action="store_true",
                   help="time train.compile with dropout_rng counter, the masks outside the compiled code (a graph "
                        "break each) against traced with it (train.counter_kernel inline), whole and in chunks of "
                        "--chunked N (default batch/4), each in a process of its own (--steps, --warmup)")
    p.add_argument("--method", action="append", default=[], metavar="NAME",
                   help="also time this registered method (repeatable); prints a per-method table with the "
                        "share of build_batch and the ratio to simcse measured in the same invocation")
    p.add_argument("--method-module", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="a Python file (relative to the working directory) or module with @register_method "
                        "classes, imported before --method is looked up (repeatable; as check-method's)")
    p.add_argument("--method-args", action="append", default=[], metavar="[NAME=]JSON",
                   help="method arguments, e.g. 'una={\"alpha\": 5}'")
    p.add_argument("--sam-rho", type=positive_float, default=None, metavar="RHO",
                   help="time every method with Sharpness-Aware Minimization (train.sam_rho): two forward/backward "
                        "passes per step")
    p.add_argument("--input", action="append", type=key_value, default=[], metavar="NAME=PATH",
                   help="an input a method declares (token_freq, tfidf, rake, paraphrases, nltk, ...)")
    p.add_argument("--build-only", action="store_true",
                   help="time only each --method's build_batch (default simcse): the host work of a step's "
                        "batches, on the CPU, no model step, over optimizer steps 0..--steps-1; prints ms per step "
                        "(--device, --precision and --warmup do not apply)")
    p.set_defaults(func=_cmd_benchmark, option_defaults={k: p.get_default(k) for k in _OPTIONAL})


def _precision_label(args) -> str:
    """``--precision`` as it ran: ``auto`` with what it resolved to on the device (bf16 on CUDA, fp32 on a CPU)."""
    if args.precision != "auto":
        return args.precision
    from ..train.step import _precision
    from ..utils import resolve_device

    dtype = _precision("auto", resolve_device(args.device))
    return f"auto ({'bf16' if dtype is not None else 'fp32'} here)"
