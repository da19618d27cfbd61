"""The host-side rows of ``sentemb gpu-check`` (issue 36; groundwork of issue 37): what a fast GPU step
leaves the host to pay.

- ``first_steps``: a method's first steps on real length-sampled batches with ``train.buckets`` none
  and auto. Every new padded width is new kernel shapes and allocator blocks (ArcCSE paid 548 ms/step
  for its first 13 steps on an H200); with buckets the widths are few and the cost is paid a few
  times. Reports ms/step of the first and the next steps and the distinct batch shapes met.
- ``workers``: ``sentemb train`` of a method for a few dozen steps with ``train.workers`` 0 and N,
  reading the loop's own ``data_wait_s_per_step`` from ``train.json`` (seconds per step the loop
  waited for its batches).
- ``dev_eval``: one STS-B dev evaluation (3,000 sentences, the model-selection signal every 125
  steps) in fp32 and bf16, and its share of a run at the measured step.
- ``graph_probe``: the loop's own ``method.losses`` of one static batch, forward, backward, clip and
  fused AdamW, eager against the same captured once as a CUDA graph and replayed (``torch.cuda.graph``;
  dropout stays on: CUDA's Philox generator advances its offset on every replay). It measures how far
  the host floor of issue 37 is from the GPU's own time; it is a probe, not the graphed strategy
  (no LR schedule, no loss logging, one shape).

Each function returns ``(what, value, note)`` rows for ``gpucheck._row``; a failure becomes the row's
value ("FAILED: ...") so one broken probe does not cost the others.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .. import SentembError

log = logging.getLogger(__name__)
Row = tuple[str, str, str]


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:240]}"


def _kernel(train: dict, device: str) -> dict:
    """``{"attention": the kernel}`` a row with these ``train`` overrides runs on ``device``
    (``train.attention`` resolved: ``auto`` is ``sdpa_efficient`` on CUDA), so that a row's label
    names it whether or not the row set it (the default moved between lends)."""
    import torch

    from ..config.settings import TrainSettings
    from ..train.loop import resolve_attention

    t = TrainSettings.from_dict(train, "train")
    return {"attention": resolve_attention(t.attention, torch.device(device), t.unpad)}


def _graphed_strategy(job):
    """The job's ``Graphed`` strategy (``train.graphs``) inside its wrappers (``SAM``), None without graphs."""
    strat = job.strategy
    while strat is not None and not hasattr(strat, "entries"):
        strat = getattr(strat, "inner", None)
    return strat


def first_steps(model: Path, corpus: Path, device: str, batch: int, max_len: int, method: str, margs: dict | None,
                inputs: dict, train: dict, buckets, first: int = 15, then: int = 15) -> Row:
    """``first`` + ``then`` optimizer steps of ``method`` from a fresh job (``train`` overrides the
    benchmark's settings, e.g. ArcCSE's ``sampler: length``, ``grad_accum``, ``sam_rho``), each step
    timed to a device sync; the distinct shapes of the built batches (every tensor's shape)."""
    from .benchmark import _bench_run
    from ..train.loop import State, run_steps, setup

    try:
        run = _bench_run(model, corpus, batch, device, max_len, "bf16", method, 10**9, margs, inputs,
                         prefetch=False, buckets=buckets, **train)
    except Exception as e:  # noqa: BLE001 - a probe's failure is its row
        return f"first steps {method} B={batch}", f"FAILED: {_first_line(e)}", ""
    t = run.train
    fuse = getattr(t, "fuse_micro_batches", 1)
    what = (f"first steps {method} B={batch}x{t.grad_accum} max_len {max_len} {'sam ' if t.sam_rho else ''}"
            f"sampler {t.sampler}, buckets {buckets}" + (f", fuse_micro_batches {fuse}" if fuse > 1 else "")
            + (", graphs" if t.graphs else "") + (", compile" if t.compile else "")
            + f", attention {_kernel(train, device)['attention']}"
            + (f", triplet_pass {margs['triplet_pass']}" if "triplet_pass" in (margs or {}) else ""))
    try:
        with setup(run, "/nonexistent-gpucheck-output") as job:
            build, shapes = job.method.build_batch, set()

            built = [0.0]  # seconds of build_batch (in line: prefetch false) since the step began

            def recording(*a, **k):
                t0 = time.perf_counter()
                out = build(*a, **k)
                built[0] += time.perf_counter() - t0
                shapes.add(tuple(sorted((key, tuple(v.shape)) for key, v in out.items())))
                return out

            job.method.build_batch = recording
            state, times, steady, computed, calm_steps, build_times = State(), [], [], set(), [], []
            inner = job.strategy
            while getattr(inner, "inner", None) is not None:
                inner = inner.inner
            units = inner.units

            def recorded_units(*a, **k):  # what each forward computes (Fused.units pads a group to its widest)
                out = units(*a, **k)
                computed.update(tuple(sorted((key, tuple(v.shape)) for key, v in b.items())) for _, b, _ in out)
                return out

            inner.units = recorded_units

            def seen():  # the shapes captured under train.graphs (ArcCSE pads its triplets there), else the
                # shapes computed (an eager step at a new shape plans new kernels)
                strat = _graphed_strategy(job)
                return (0, len(strat.entries)) if strat is not None else (len(computed), 0)

            for _ in range(first + then):
                before = seen()
                _sync(job.device)
                built[0] = 0.0
                t = time.perf_counter()
                for _ in run_steps(job, state, 1):
                    pass
                _sync(job.device)
                times.append(time.perf_counter() - t)
                build_times.append(built[0])
                if seen() == before:  # no shape met for the first time: replays, or kernels planned before
                    steady.append(times[-1])
                    calm_steps.append(len(times) - 1)
        a, b = times[:first], times[first:]
        from .plan_check import record

        rec = dict(train={**train, **_kernel(train, device), "buckets": buckets, "prefetch": False},
                   method_args=margs or {})
        if steady:  # sentemb plan-check: the steps that met no new shape, what the plan prices
            record(what + ", steps meeting no new shape", method, model, batch, max_len, sum(steady) / len(steady),
                   (0, len(times)), only_steps=calm_steps,
                   build_s=sum(build_times[i] for i in calm_steps) / len(calm_steps), **rec)
        else:
            record(what + f", steps {first + 1}-{first + then}", method, model, batch, max_len,
                   sum(b) / max(len(b), 1), (first, first + then), steady=False, note="every step met a new shape",
                   build_s=sum(build_times[first:]) / max(len(b), 1), **rec)
        graphs = seen()[1]
        calm = (f"steps meeting no new shape: {1000 * sum(steady) / len(steady):.0f} ms/step ({len(steady)} of "
                f"{len(times)}); " if steady else "every step met a new shape; ")
        return (what, f"{1000 * sum(a) / len(a):.0f} ms/step (steps 1-{first}), {1000 * sum(b) / max(len(b), 1):.0f} "
                      f"ms/step (steps {first + 1}-{first + then})",
                calm + f"{len(shapes)} distinct batch shapes" + (f", {graphs} captured graphs" if graphs else "")
                + f"; slowest step {1000 * max(times):.0f} ms")
    except Exception as e:  # noqa: BLE001 - a probe's failure is its row
        return what, f"FAILED: {_first_line(e)}", ""


def workers(model: Path, corpus: Path, device: str, batch: int, max_len: int, method: str, margs: dict | None,
            inputs: dict, n_workers: int, steps: int, work: Path, train: dict | None = None) -> Row:
    """``sentemb train`` of ``method`` for ``steps`` steps (no dev evaluation) with ``train.workers``
    ``n_workers``; the loop's wait for data per step (``train.json``: ``data_wait_s_per_step``)."""
    from .benchmark import _bench_run
    from .benchmark import train_cli
    from ..utils import read_json

    what = f"train {method} B={batch} {steps} steps, workers {n_workers}"
    run = _bench_run(model, corpus, batch, device, max_len, "bf16", method, 10, margs, inputs, max_steps=steps,
                     workers=n_workers, **(train or {}))
    out, secs, err = train_cli(run, work, f"workers-{method}-{n_workers}")
    if err is not None:
        return what, "FAILED", err
    s = read_json(out / "train.json")
    loop = float(s.get("train_seconds_this_process") or secs)
    wait = s.get("data_wait_s_per_step")
    wait_s = f"{1000 * float(wait):.1f} ms/step waiting for data" if wait is not None else "data wait not recorded"
    return (what, f"{1000 * loop / steps:.0f} ms/step in the loop; {wait_s}",
            f"{secs:.0f} s end to end with start-up and export")


def dev_eval(model: Path, senteval: Path, device: str, step_s: float | None, eval_steps: int = 125) -> list[Row]:
    """One STS-B dev evaluation of ``model`` in fp32 and bf16 by the loop's own dev embedder: [CLS]
    pooling, ``Method.embedder``'s batch (``DEV_BATCH``) and kept plan (the dev set tokenized once),
    then ``train.eval_precision`` applied as the loop applies it (``tune_dev_embedder``: bf16 on CUDA
    in batches of ``DEV_BATCH_CUDA``). Seconds of the second call (the first tokenizes and builds the
    plan, as the loop's first evaluation does), and with ``step_s`` its share of a run that evaluates
    every ``eval_steps`` steps of that length. The encoder is loaded as the loop loads it (no NSP
    pooler), and on CUDA the loop's process-wide settings hold while the rows run (``setup``: TF32
    matmuls, ``train.attention: auto``'s SDPA kernel), then are put back.
    ``sentemb.ops.plan.DEV_EVAL_SECONDS`` was measured by an earlier form of this row, which encoded in
    batches of 256 in both precisions and tokenized the dev set on every call; the loop does neither."""
    import torch

    from ..evaluate.senteval import load_task
    from ..evaluate.sts import stsb_dev, tune_dev_embedder
    from ..methods.base import DEV_BATCH
    from ..model.backbone import load_encoder
    from ..model.encoder import Embedder
    from ..train.loop import resolve_attention, sdpa_backend
    from ..utils import resolve_device

    rows, restore = [], []
    try:
        pairs = load_task(senteval, "STSBenchmark", "dev")
        dev = resolve_device(device)
        encoder, tokenizer = load_encoder(model, device=dev, pooling_layer=False)
        encoder.eval()
        if dev.type == "cuda":
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("high")
            restore.append(lambda: torch.set_float32_matmul_precision(before))
            undo = sdpa_backend(resolve_attention("auto", dev))
            if undo is not None:
                restore.append(undo)
        for prec in ("fp32", "bf16"):
            emb = Embedder(encoder, tokenizer, "cls_before_pooler", batch_size=DEV_BATCH, device=dev, precision="fp32",
                           keep_plan=True)
            tune_dev_embedder(emb, prec, dev)
            stsb_dev(emb, pairs)  # the first evaluation: tokenizes the dev set and keeps the plan
            _sync(device)
            t = time.perf_counter()
            score = stsb_dev(emb, pairs)
            _sync(device)
            secs = time.perf_counter() - t
            share = (f"; {100 * secs / (eval_steps * step_s + secs):.1f}% of a run evaluating every {eval_steps} steps "
                     f"of {1000 * step_s:.0f} ms") if step_s else ""
            rows.append((f"STS-B dev evaluation {prec} ({Path(model).name}, 3,000 sentences, batch {emb.batch_size}, "
                         "tokenized once)",
                         f"{secs:.2f} s", f"Spearman {score:.2f}{share}"))
            from .plan_check import record

            # sentemb plan-check: against the plan's price of one evaluation (DEV_EVAL_SECONDS); its second call
            record(rows[-1][0], "simcse", model, emb.batch_size, emb.max_length, secs, (1, 2), precision=prec,
                   kind="dev_eval")
    except Exception as e:  # noqa: BLE001
        rows.append(("STS-B dev evaluation", f"FAILED: {_first_line(e)}", ""))
    finally:
        for put_back in reversed(restore):
            put_back()
    return rows


def graph_probe(model: Path, corpus: Path, device: str, batch: int, max_len: int, steps: int = 20, warmup: int = 5,
                method: str = "simcse", margs: dict | None = None, inputs: dict | None = None,
                dropout: str = "stream") -> Row:
    """The loop's ``method.losses`` on one static micro-batch (the first of the schedule, padded to
    ``max_len``), bf16 autocast, backward, clip 1.0, fused capturable AdamW: ms/step eager, then the
    same step captured once as a CUDA graph and replayed. ``dropout``: ``stream`` (torch's generator;
    CUDA graphs advance its Philox offset on every replay) or ``counter`` (``sentemb.model.dropout``'s
    hashed masks, keyed by a device tensor that gets the next micro-batch's key before each replay)."""
    import contextlib

    import torch

    from .benchmark import _bench_run
    from ..model.dropout import key_words, keyed, mix
    from ..train.loop import autocast, micro_batches, setup

    what = f"graph probe {method} B={batch} max_len {max_len} (static shape, {dropout} dropout)"
    try:
        run = _bench_run(model, corpus, batch, device, max_len, "bf16", method, 10**9, margs, inputs,
                         prefetch=False, buckets=[max_len])
        with setup(run, "/nonexistent-gpucheck-output") as job:
            dev, method_ = job.device, job.method
            (_, cpu_batch), = micro_batches(job, 0)[:1]
            static = {k: v.to(dev) for k, v in cpu_batch.items()}
            params = [p for p in method_.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=3e-5, fused=dev.type == "cuda", capturable=dev.type == "cuda")
            key, n = key_words(mix(0, 0), dev), method_.n_sentences(static)
            micro = [0]

            def masks(refresh: bool):
                if dropout != "counter":
                    return contextlib.nullcontext()
                if refresh:  # eager: the next micro-batch's key (a capture reads the key tensor as it is)
                    micro[0] += 1
                    key.copy_(key_words(mix(0, micro[0])))
                return keyed(0, 0, 0, n, mode="counter", key=key)

            def step(refresh: bool = True):
                with autocast(dev, job.amp), masks(refresh):
                    loss = method_.losses(static)["loss"]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                opt.step()
                return loss

            def timed(fn, n):
                _sync(dev)
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                _sync(dev)
                return (time.perf_counter() - t) / n

            def eager():
                step()
                opt.zero_grad(set_to_none=True)

            if dev.type != "cuda":  # the eager half only (tests run it on the CPU)
                for _ in range(warmup):
                    eager()
                eager_s = timed(eager, steps)
                return what, f"eager {1000 * eager_s:.1f} ms/step, graphed n/a", "CUDA graphs need a CUDA device"
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    eager()
            torch.cuda.current_stream().wait_stream(side)
            eager_s = timed(eager, steps)
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)  # backward allocates .grad from the graph's pool
            with torch.cuda.graph(graph):
                loss = step(refresh=False)
            for _ in range(warmup):
                graph.replay()
            def replay():
                if dropout == "counter":
                    micro[0] += 1
                    key.copy_(key_words(mix(0, micro[0])))
                graph.replay()

            graph_s = timed(replay, steps)
            first, again = float(loss), (replay(), float(loss))[1]
        return (what, f"eager {1000 * eager_s:.1f} ms/step, graphed {1000 * graph_s:.1f} ms/step "
                      f"({eager_s / graph_s:.1f}x)",
                f"forward+backward+clip+fused AdamW; loss after two replays {first:.4f} -> {again:.4f} "
                "(finite and moving: the weights update and the dropout masks are fresh)")
    except Exception as e:  # noqa: BLE001
        return what, f"FAILED: {_first_line(e)}", ""


#: the parts of the host rows, in the order they run (``gpu-check --host-parts``)
PARTS = ("first_steps", "workers", "graph", "dev_eval", "graph_methods", "compile", "graphed", "profile", "tune")


def profile_steps(model: Path, corpus: Path, device: str, batch: int, max_len: int, method: str, margs: dict | None,
                  inputs: dict, train: dict, warm: int = 10, steps: int = 5, top: int = 6) -> Row:
    """``steps`` optimizer steps of ``method`` (after ``warm``) under ``torch.profiler``: the wall time
    per step, the device's busy time per step (CUDA kernels' self time; on a CPU the ops' self CPU
    time), the ops dispatched per step, and the ``top`` ops or kernels by that time. For a gap the
    step times alone cannot explain, e.g. ArcCSE's ``triplet_pass: with_views`` against
    ``separate`` (docs/gpu/h200-2026-11-28.md)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .benchmark import _bench_run
    from ..train.loop import State, run_steps, setup

    what = (f"profile {method} B={batch} max_len {max_len}"
            + "".join(f", {k} {v}" for k, v in sorted({**_kernel(train, device), **train, **(margs or {})}.items())))
    try:
        run = _bench_run(model, corpus, batch, device, max_len, "bf16", method, 10**9, margs, inputs, **train)
        what = what.replace(f"B={batch} ", f"B={batch}x{run.train.grad_accum} ", 1)
        cuda = device.startswith("cuda")
        with setup(run, "/nonexistent-gpucheck-output") as job:
            state = State()
            for _ in run_steps(job, state, warm):
                pass
            _sync(job.device)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            t = time.perf_counter()
            with profile(activities=acts) as prof:
                for _ in run_steps(job, state, steps):
                    pass
                _sync(job.device)
            wall = (time.perf_counter() - t) / steps
        events = prof.key_averages()
        if cuda:
            from torch.autograd import DeviceType

            # the kernels themselves (a CPU op's event also carries its kernels' time), as the profiler's table sums
            kernels = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
            busy = sum(e.self_device_time_total for e in kernels) / 1e6 / steps
            ranked = sorted(kernels, key=lambda e: -e.self_device_time_total)
            tops = [(e.key, e.self_device_time_total / 1e3 / steps) for e in ranked[:top]]
        else:
            ops = [e for e in events if e.key.startswith("aten::")]
            busy = sum(e.self_cpu_time_total for e in ops) / 1e6 / steps
            tops = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]]
        dispatched = sum(e.count for e in events if e.key.startswith("aten::")) / steps
        where = "GPU busy" if cuda else "ops' self CPU time"
        return (what, f"{1000 * wall:.1f} ms/step wall, {1000 * busy:.1f} ms/step {where}",
                f"{dispatched:.0f} aten ops a step (nested ones included); top: "
                + ", ".join(f"{k[:60]} {ms:.2f} ms" for k, ms in tops))
    except Exception as e:  # noqa: BLE001 - a probe's failure is its row
        return what, f"FAILED: {_first_line(e)}", ""


def _train_list(name: str) -> "list[dict] | None":
    """The environment variable ``name`` (``SENTEMB_TUNE``, ``SENTEMB_PROFILE``): a JSON list of train
    settings (objects), None where it is unset or empty; anything else is refused naming it."""
    import json

    text = os.environ.get(name)
    if not text:
        return None
    try:
        given = json.loads(text)
    except ValueError as e:
        raise SentembError(f"{name} is not JSON ({e}): a list of train settings, e.g. "
                           '[{"chunk_size": 128}]') from None
    if not isinstance(given, list) or not all(isinstance(v, dict) for v in given):
        raise SentembError(f"{name}={text!r}: a JSON list of objects (train settings)")
    return given


def _tune_batches() -> "set[str] | None":
    """``SENTEMB_TUNE_BATCHES`` (``512``, or ``64,512``) as a set, None where it is unset."""
    text = os.environ.get("SENTEMB_TUNE_BATCHES")
    if not text:
        return None
    want = {w.strip() for w in text.split(",") if w.strip()}
    if not want or not want <= {"64", "512"}:
        raise SentembError(f"SENTEMB_TUNE_BATCHES={text!r}: a comma-separated list of 64 and 512 (the tune rows' "
                           "batch sizes)")
    return want


def check_environment(parts: tuple[str, ...]) -> None:
    """The environment variables the requested host ``parts`` read, checked before any row runs (a bad
    value found after the other rows would cost the device time they took): ``SENTEMB_TUNE`` and
    ``SENTEMB_TUNE_BATCHES`` for ``tune``, ``SENTEMB_PROFILE`` for ``profile``, each train dict as the
    config's ``train`` section is checked and ``batch`` a positive integer; an empty list is refused
    (it would run no row). A variable of a part not asked for is not read."""
    from ..config.settings import TrainSettings

    wanted = {"tune": "SENTEMB_TUNE", "profile": "SENTEMB_PROFILE"}
    # what each dict is laid over: the compiled, graphed base of the part's rows (tune_rows: graphed's graphed
    # variant; profile_variants)
    bases = {"tune": {"compile": True, "buckets": [32], "graphs": True},
             "profile": {"compile": True, "graphs": True, "buckets": [32]}}
    for part, name in wanted.items():
        if part not in parts:
            continue
        given = _train_list(name)
        if given is None:
            continue
        if not given:
            raise SentembError(f"{name}=[]: no row to run; unset it for the part's default rows, or list train "
                               'settings, e.g. [{"chunk_size": 128}]')
        for i, v in enumerate(given):
            v = dict(v)
            if part == "profile" and "batch" in v:
                b = v.pop("batch")
                if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                    raise SentembError(f"{name}[{i}].batch: {b!r} is not a positive integer (the profiled step's batch)")
            TrainSettings.from_dict(v, f"{name}[{i}]")  # its own keys and values, named
            TrainSettings.from_dict({**bases[part], **v}, f"{name}[{i}]").check(
                f"{name}[{i}] over the part's base {bases[part]}")  # the combination the row runs
    if "tune" in parts:
        _tune_batches()


def profile_variants(toy: bool) -> list[dict]:
    """The SimCSE steps (max_len 32) that ``--host-parts profile`` puts under ``torch.profiler`` before
    its other rows: each a dict of train settings over the compiled and graphed base (``compile``,
    ``graphs``, ``buckets: [32]``) with its ``batch``.

    By default the compiled graphed B 512 step with counter masks (``update: fused``), whole and in
    chunks of 128: issue 37's chunk target (<= 1.5x the whole step) measured 1.70x on the fifth lend,
    and the chunked step's first pass explains about 0.33x of it. The GPU's busy time against the wall
    time per step tells whether the rest is GPU work (smaller matmuls, the extra forward) or gaps
    between kernels (the host). ``SENTEMB_PROFILE``, a JSON list of such dicts (``batch`` 512 where
    it is missing, 8 on a CPU), profiles those instead, and then the part's other rows are left out;
    what is not a list of objects is refused naming the variable. On a CPU: batches of 8, chunks of 2.
    (Whether torch's profiler sees the kernels of a graph captured before it started is unchecked on
    a GPU: a busy time near 0 would say it does not.)"""
    b512, c128 = (8, 2) if toy else (512, 128)
    base = {"compile": True, "graphs": True, "buckets": [32]}
    given = _train_list("SENTEMB_PROFILE")
    if given is not None:
        return [{**base, "batch": b512, **v} for v in given]
    counter = {**base, "dropout_rng": "counter", "update": "fused"}
    return [{**counter, "batch": b512}, {**counter, "batch": b512, "chunk_size": c128}]


def _loop_ms(run, warm: int, timed: int, count: bool = False, info: dict | None = None
             ) -> tuple[float, float, int, "tuple | None"]:
    """The loop's own steps (``run_steps``) of ``run``: ``warm`` steps (the captures of a graphed
    run happen here), then ``timed`` steps to a device sync. Returns (s/step timed, s warm, graphs,
    and, graphed on CUDA, (s per replay of the most replayed graph alone: ``_replay_s``, s per eager
    update alone), or with ``count`` the first step's (counted FLOPs, encoder layers, encoder passes as
    ``sentemb plan`` counts them, hidden size), or None). ``info`` (a dict) gets ``captured_in_timed``:
    the graphs captured during the timed steps (0: every timed step replayed a graph captured before;
    None without graphs)."""
    from ..train.loop import State, run_steps, setup

    with setup(run, "/nonexistent-gpucheck-output") as job:
        state, flops = State(), None
        _sync(job.device)
        t = time.perf_counter()
        if count:  # the first step's matmuls counted (sentemb.ops.flops; a full batch: the epoch's last may be short)
            from .flops import counted

            import torch

            from ..train.step import eager_functions

            from .plan import encoder_copies

            enc = job.method.encoder
            calls = [0, 0]  # the passes of the encoder and its full copies (a momentum encoder), with and
            hooks = [x.encoder.layer[0].register_forward_hook(  # without grad, as the plan counts them
                lambda *a: calls.__setitem__(int(not torch.is_grad_enabled()), calls[int(not torch.is_grad_enabled())] + 1))
                for x in [enc] + encoder_copies(job.method, enc)]
            try:  # the eager functions: torch.compile would skip a frame first met under the counter's mode for good
                with eager_functions(job):
                    flops = counted(lambda: [None for _ in run_steps(job, state, 1)])[1]
            finally:
                for h in hooks:
                    h.remove()
            flops = (flops, len(job.method.encoder.encoder.layer), calls[0] + calls[1] / 3,
                     int(job.method.encoder.config.hidden_size))
        for _ in run_steps(job, state, warm - count):
            pass
        _sync(job.device)
        warm_s = time.perf_counter() - t
        strat = _graphed_strategy(job)
        before = len(strat.entries) if strat is not None else None
        t = time.perf_counter()
        for _ in run_steps(job, state, timed):
            pass
        _sync(job.device)
        secs = (time.perf_counter() - t) / timed
        if info is not None:
            info["captured_in_timed"] = len(strat.entries) - before if strat is not None else None
        replay = _replay_s(strat, timed) if strat is not None else None
        if replay is not None:  # and the loop's update alone (clip, fused AdamW, schedule, zeroing; train.update)
            _sync(job.device)
            t = time.perf_counter()
            every = {id(p) for g in job.opt.param_groups for p in g["params"]}
            for _ in range(timed):
                strat.step_used = set(every)  # as after a step's micro-batches (update() forgets them)
                strat.update(job)
            _sync(job.device)
            replay = (replay, (time.perf_counter() - t) / timed)
        return secs, warm_s, len(strat.entries) if strat is not None else 0, replay if replay is not None else flops


def _replay_s(strat, n: int) -> "float | None":
    """The GPU's own share of a graphed step: the most replayed graph replayed ``n`` times alone,
    back to back to a device sync (no optimizer, no host work between them); s per replay, None
    without captured graphs (a CPU)."""
    import torch

    graphed = [e for e in strat.entries.values() if e.graph is not None]
    if not graphed:
        return None
    e = max(graphed, key=lambda e: e.replays)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        e.graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


#: the counted FLOPs of a step (``_loop_ms(count=True)``) by (method, batch, max_len): a graphed-only
#: row (``graphed(eager=False)``) of the same step prices itself from its eager twin's count
_COUNTED: dict = {}


def graphed(model: Path, corpus: Path, device: str, batch: int, max_len: int, method: str, margs: dict | None,
            inputs: dict, train: dict | None = None, warm: int = 8, timed: int = 15, label: str = "",
            eager: bool = True) -> Row:
    """``train.graphs`` (issue 37): the loop's step of ``method`` eager and graphed, the same settings
    otherwise (``train``: e.g. ``chunk_size``, ``dropout_rng``, the method's ``paper_train``); each
    ``warm`` steps (captures), then ``timed`` steps. ms/step both ways and the ratio. Without
    ``eager``, the graphed step alone (a variant of a step measured eagerly before: its FLOPs are
    that row's count, ``_COUNTED``; with compile the eager run is a compilation of its own)."""
    from .benchmark import _bench_run

    train = dict(train or {})
    what = (f"graphed {method} B={batch} max_len {max_len}" + (f" {label}" if label else "")
            + "".join(f", {k} {v}" for k, v in sorted({**_kernel(train, device), **train}.items())))
    out, info, settings = {}, {}, {}
    try:
        for g in (False, True) if eager else (True,):
            over = train if g or train.get("update") != "graphed" else {**train, "update": "separate"}  # needs graphs
            settings[g] = over
            run = _bench_run(model, corpus, batch, device, max_len, "bf16", method, 10**9, margs, inputs,
                             graphs=g, **over)  # the loop as a run has it: batches built ahead (prefetch)
            out[g] = _loop_ms(run, warm, timed, count=not g, info=info if g else None)
    except Exception as e:  # noqa: BLE001 - a probe's failure is its row
        import os
        import sys
        import traceback

        if os.environ.get("SENTEMB_GRAPHED_TRACE"):
            traceback.print_exc(file=sys.stderr)
        done = f"eager {1000 * out[False][0]:.1f} ms/step; " if False in out else ""
        return what, f"{done}FAILED: {_first_line(e)}", ""
    (g_s, g_w, n, replay) = out[True]
    from .plan_check import record

    # sentemb plan-check: the loop's steps warm..warm+timed-1 of each (the attention kernel as it ran); steady
    # when no graph was captured in them (the eager twin trains on the same batches)
    new = info.get("captured_in_timed")
    for g, (secs, *_) in out.items():
        record(what + (", graphed" if g else ", not graphed"), method, model, batch, max_len, secs, (warm, warm + timed),
               {**settings[g], **_kernel(train, device), "graphs": g}, margs or {}, steady=not new,
               note=f"{new} graph(s) captured in the timed steps" if new else "")
    key = (method, batch, max_len)
    if eager:
        e_s, e_w, _, counted = out[False]
        if counted and train.get("chunk_size") is None:
            _COUNTED[key] = counted
    else:
        e_s, e_w, counted = None, None, _COUNTED.get(key) if train.get("chunk_size") is None else None
    from .benchmark import _peak

    import torch

    peak = _peak(torch.device(device), None)
    mfu = ""
    if counted:
        flops, layers, passes, width = counted
        mfu = f"; {flops / g_s / 1e12:.3g} TFLOP/s graphed"
        if peak:
            from .plan import _width_key, mfu_for, step_seconds

            fused, att = bool(train.get("compile")), _kernel(train, device)["attention"]
            plan_s = step_seconds(flops, layers, passes, peak * 1e12, mfu_for(width, compiled=fused, attention=att),
                                  True, fused, _width_key(width), chunked=train.get("chunk_size") is not None,
                                  counter=train.get("dropout_rng") == "counter", attention=att)
            mfu += (f", {100 * flops / g_s / 1e12 / peak:.1f}% of the bf16 peak; sentemb plan's graphed step at this "
                    f"GPU's peak {1000 * plan_s:.1f} ms ({100 * (plan_s - g_s) / g_s:+.0f}%, {passes:g} passes)")
    kind = "graphed" if train.get("update") == "graphed" else "eager"
    alone = (f"; alone: one micro-batch's graph replayed {1000 * replay[0]:.1f} ms, the {kind} update (clip, AdamW, "
             f"schedule) {1000 * replay[1]:.1f} ms") if replay else ""
    if not eager:
        return (what, f"graphed {1000 * g_s:.1f} ms/step",
                f"{n} graphs captured in the first {warm} steps ({g_w:.1f} s); {timed} steps timed{alone}{mfu}")
    return (what, f"eager {1000 * e_s:.1f} ms/step, graphed {1000 * g_s:.1f} ms/step ({e_s / g_s:.2f}x)",
            f"{n} graphs captured in the first {warm} steps ({g_w:.1f} s; eager {e_w:.1f} s); {timed} steps timed{alone}{mfu}")


def graphed_rows(model: Path, corpus: Path, device: str, margs: dict, usable: dict, toy: bool,
                 methods: tuple[str, ...] | None = None) -> list[Row]:
    """The graphed rows of issue 37 on this device: SimCSE B 64 (stream and counter dropout), B 512,
    B 512 in chunks of 128 (counter; its unchunked counter step for the ratio; the graph-free first
    pass over the whole batch, ``chunk_first_pass: auto``, and chunk by chunk), SAM at B 64, B 64 and
    B 512 with ``train.compile`` (and B 64 with compile and counter dropout; CUDA only), and every other
    method at B 64, then at B 512, with its paper train settings (each in a process of its own). On a
    CPU: batches of 4 and 8, 2 + 2 steps, in this process."""
    from ..methods import get_method

    b64, b512, c128 = (4, 8, 2) if toy else (64, 512, 128)
    warm, timed = (2, 2) if toy else (8, 15)
    cfgs = [("simcse", b64, {}), ("simcse", b64, {"dropout_rng": "counter"}), ("simcse", b512, {}),
            ("simcse", b512, {"dropout_rng": "counter"}), ("simcse", b512, {"dropout_rng": "counter", "chunk_size": c128}),
            ("simcse", b512, {"dropout_rng": "counter", "chunk_size": c128, "chunk_first_pass": "chunks"}),
            ("simcse", b64, {"sam_rho": 0.05})]
    if not toy:  # Inductor's fused kernels inside the graph (one width: one compilation per run)
        cfgs += [("simcse", b64, {"compile": True, "buckets": [32]}), ("simcse", b512, {"compile": True, "buckets": [32]}),
                 ("simcse", b64, {"compile": True, "buckets": [32], "dropout_rng": "counter"})]
    others = [m for m in sorted(usable) if m != "simcse" and (methods is None or m in methods)]
    for b in (b64, b512):  # issue 37: every method at B 64 and B 512 (all at B 64 first: the target's rows)
        for m in others:
            paper = {k: v for k, v in get_method(m).paper_train.items() if k in ("sam_rho",)}
            cfgs.append((m, b, paper))
    import sys

    out = []
    for m, b, t in cfgs:
        if m in usable:
            kw = dict(model=str(model), corpus=str(corpus), device=device, batch=b, max_len=32, method=m,
                      margs=margs.get(m), inputs=usable.get(m, {}), train=t, warm=warm, timed=timed)
            out.append(graphed(**kw) if toy or m == "simcse" else _isolated(kw))
            print("graphed row: | " + " | ".join(out[-1]) + " |", file=sys.stderr, flush=True)  # a row as it comes
    return out


def tune_rows(model: Path, corpus: Path, device: str, toy: bool) -> list[Row]:
    """What could take the graphed and compiled SimCSE step (BERT-base, max_len 32) under issue 37's
    targets (B 64 <= 10 ms, B 512 >= 35% of peak, chunks of 128 <= 1.5x): the step with
    ``train.compile`` and ``graphs`` as it is (``attention: auto``, the memory-efficient kernel on CUDA;
    eager twin counted), then graphed alone with each other ``train.attention`` (``sdpa``: cuDNN's on
    the H200, 24% of the B 512 step there), ``update: fused``
    (the clip inside fused AdamW), ``update: graphed`` (the optimizer step captured too) and
    ``compile_random: inductor`` (Inductor's own dropout), B 64
    first, then B 512; then B 512 compiled with counter dropout, whole and in chunks of 128, each with
    the masks outside the compiled code (a graph break at each dropout) and ``counter_kernel: inline``
    (traced with it); last,
    ``compile_mode: max-autotune-no-cudagraphs`` (263 s of autotuning at B 64 on the H200).
    Rows print as they come, so a time limit keeps those done. On a CPU: batches of 4 and 8, chunks
    of 2, without max-autotune. ``SENTEMB_TUNE`` (a JSON list of train settings) runs those variants
    instead, the first with its eager twin, and no counter or max-autotune rows;
    ``SENTEMB_TUNE_BATCHES`` (``512``, or ``64,512``) keeps those batch sizes only."""
    import sys

    b64, b512, c128 = (4, 8, 2) if toy else (64, 512, 128)
    warm, timed = (2, 2) if toy else (8, 15)
    base = {"compile": True, "buckets": [32]}
    # in the order that compiles least: the variants of one compilation (Inductor's config) side by side
    variants = [({}, True), ({"update": "graphed"}, False), ({"attention": "sdpa"}, False), ({"update": "fused"}, False),
                ({"attention": "sdpa_math"}, False), ({"attention": "eager"}, False),
                ({"compile_random": "inductor"}, False)]
    chosen = _train_list("SENTEMB_TUNE")  # a subset: train dicts over the compiled base, the first eager
    if chosen is not None:
        variants = [(v, i == 0) for i, v in enumerate(chosen)]
    batches = (b64, b512)
    want = _tune_batches()  # e.g. "512": only those batch sizes (toy: 4 and 8 stand for 64, 512)
    if want is not None:
        batches = tuple(b for b, full in ((b64, "64"), (b512, "512")) if full in want)
    cfgs = [(b, {**base, **v}, e) for b in (b64, b512) for v, e in variants]
    counter = {**base, "dropout_rng": "counter", "update": "fused"}
    if chosen is None:
        inline = {**counter, "counter_kernel": "inline"}  # the masks traced with the encoder: no graph breaks
        cfgs += [(b512, counter, False), (b512, {**counter, "chunk_size": c128}, False),
                 (b512, inline, False), (b512, {**inline, "chunk_size": c128}, False)]
    if not toy and chosen is None:  # last: the longest compilations
        cfgs += [(b, {**base, "compile_mode": "max-autotune-no-cudagraphs"}, False)
                 for b in (b64, b512)]
    out = []
    for b, t, e in [c for c in cfgs if c[0] in batches]:
        out.append(graphed(model=str(model), corpus=str(corpus), device=device, batch=b, max_len=32, method="simcse",
                           margs=None, inputs={}, train=t, warm=warm, timed=timed, eager=e))
        print("tune row: | " + " | ".join(out[-1]) + " |", file=sys.stderr, flush=True)
    return out


_ISOLATED = """
import json, sys
from sentemb.methods import load_method_modules
from sentemb.ops import hostcheck
kw = json.loads(sys.argv[1])
load_method_modules(kw.pop("method_modules"))  # a plug-in method is registered by importing its module
row = getattr(hostcheck, kw.pop("fn"))(**kw)  # graphed, or first_steps
from sentemb.ops.plan_check import RECORDED
print("ROW " + json.dumps({"row": row, "measured": RECORDED}), flush=True)
"""


#: seconds an isolated row (``_isolated``) may run before it is killed and reported as failed
ROW_LIMIT_S = 900


def _isolated(kw: dict, fn: str = "graphed") -> Row:
    """``graphed(**kw)`` (or another row function of this module, ``fn``) in a process of its own (a
    device-side error ends a CUDA context, and would cost the rows after it; a row's first steps would
    find the kernels, cuDNN plans and allocator blocks an earlier row left); when it fails, once more
    with ``CUDA_LAUNCH_BLOCKING=1``, the failing op's Python stack printed to stderr."""
    import sys

    from ..methods import get_method, method_source
    from .benchmark import in_fresh_process

    source = method_source(get_method(kw["method"]))
    arg = {**kw, "fn": fn, "method_modules": [source[0]] if source else []}
    row: Row = (f"{fn.replace('_', ' ')} {kw['method']} B={kw['batch']}", "FAILED", "")
    for blocking in (False, True):
        env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1", "SENTEMB_GRAPHED_TRACE": "1"} if blocking else {})}
        rows, code, err = in_fresh_process(_ISOLATED, arg, "ROW ", env, timeout=ROW_LIMIT_S)
        # a row past the time limit costs that row, not the rows after it
        got = tuple(rows[-1]["row"]) if rows else (row[0], "FAILED: " + (f"no result in {ROW_LIMIT_S} s" if code is None
                                                                         else f"exit {code}"),
                                                   (err.strip().splitlines() or [""])[-1][:300])
        if not blocking:
            row = got
            if rows:  # the rows it measured, for sentemb plan-check
                from .plan_check import add_recorded

                add_recorded(rows[-1]["measured"])
            if "FAILED" not in got[1] or not any(w in err for w in ("CUDA", "cuda", "device-side")):
                return got  # done, or a failure that is not the device's (a second run would only repeat it)
        else:
            print(f"{fn} {kw['method']} again with CUDA_LAUNCH_BLOCKING=1:\n{err[-6000:]}", file=sys.stderr,
                  flush=True)
    return row


def compile_probe(model: Path, corpus: Path, device: str, batch: int, max_len: int, steps: int = 20,
                  warmup: int = 3) -> Row:
    """SimCSE's ``method.losses`` forward and backward on one static batch under
    ``torch.compile(mode="reduce-overhead")`` (Inductor with CUDA graphs; the optimizer stays
    eager): compile time (the warm-up steps) and ms/step, against the same eager."""
    import torch

    from .benchmark import _bench_run
    from ..train.loop import autocast, micro_batches, setup

    what = f"compile probe simcse B={batch} max_len {max_len} (reduce-overhead, static shape)"
    try:
        run = _bench_run(model, corpus, batch, device, max_len, "bf16", "simcse", 10**9, None, {}, prefetch=False,
                         buckets=[max_len])
        with setup(run, "/nonexistent-gpucheck-output") as job:
            dev, method = job.device, job.method
            (_, cpu_batch), = micro_batches(job, 0)[:1]
            static = {k: v.to(dev) for k, v in cpu_batch.items()}
            params = [p for p in method.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=3e-5, fused=dev.type == "cuda")

            def fwd():
                with autocast(dev, job.amp):
                    return method.losses(static)["loss"]

            compiled = torch.compile(fwd, mode="reduce-overhead")

            def step(fn):
                fn().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            def timed(fn, n):
                _sync(dev)
                t = time.perf_counter()
                for _ in range(n):
                    step(fn)
                _sync(dev)
                return time.perf_counter() - t

            timed(fwd, warmup)
            eager_s = timed(fwd, steps) / steps
            compile_s = timed(compiled, warmup)
            comp_s = timed(compiled, steps) / steps
        return (what, f"eager {1000 * eager_s:.1f} ms/step, compiled {1000 * comp_s:.1f} ms/step "
                      f"({eager_s / comp_s:.1f}x)", f"first {warmup} compiled steps (compilation) {compile_s:.0f} s")
    except Exception as e:  # noqa: BLE001
        return what, f"FAILED: {_first_line(e)}", ""


def rows(model: Path, corpus: Path, senteval: Path, device: str, work: Path, margs: dict, inputs: dict,
         step_s: float | None, steps: int = 40, parts: tuple[str, ...] = PARTS[:4],
         graph_batches: tuple[int, ...] = (64, 512)) -> list[Row]:
    """The host rows on this device: ArcCSE's paper configuration's first steps with and without
    buckets (BERT-base: B 32 x 2, max_len 512, SAM, length-sampled), PaSeR and ArcCSE with workers 0
    and 2, the graph probe of SimCSE at ``graph_batches`` (stream and counter dropout), STS-B dev
    evaluation (its share against the probe's eager B 64 step when ``step_s`` is not given), and,
    when ``parts`` names them, the graph probe of every other method in ``inputs`` at B 64
    (``graph_methods``: where a method's step cannot be captured, the row says why), the
    ``torch.compile`` probe (``compile``), the graphed rows (``graphed``), the tune rows (``tune``) and
    steps under ``torch.profiler`` (``profile``: SimCSE's compiled graphed B 512 counter step whole
    and in chunks, or ``SENTEMB_PROFILE``'s steps, ``profile_variants``; then SimCSE's compiled step
    with each attention kernel and ArcCSE's paper step with each ``triplet_pass``). On a CPU (``gpu-check --cpu``, the tests) the same code at
    a toy size: batches of 4, 2 + 2 first steps, 3 steps per worker row."""
    from ..methods import get_method

    toy = not device.startswith("cuda")
    first, then, steps = (2, 2, 3) if toy else (15, 15, steps)
    small = (lambda b: 4) if toy else (lambda b: b)  # noqa: E731
    usable = {m: {n: str(v) for n, v in ins.items()} for m, ins in inputs.items()
              if not any(isinstance(v, Exception) for v in ins.values())}

    # SENTEMB_PROFILE read before any row runs: a bad value costs no row
    profiled = profile_variants(toy) if "profile" in parts and "simcse" in usable else []
    others = "profile" in parts and _train_list("SENTEMB_PROFILE") is None  # its other rows, unless its steps are chosen
    if "profile" in parts and not profiled:
        log.warning("--host-parts profile: no SimCSE step to profile (%s)",
                    "SENTEMB_PROFILE is an empty list" if "simcse" in usable else "simcse is not among the methods")
    out: list[Row] = []
    arc = {"grad_accum": 2, "sam_rho": 0.05, "sampler": "length"}
    if "first_steps" in parts and "arccse" in usable:
        # fuse 2: the paper configuration's step (the triplets in a pass of their own, the default triplet_pass); then the
        # triplets in the views' forward (with_views: one encoder pass per SAM pass, measured slower on the H200)
        # and the fused step graphed (train.graphs: each fused group one graph, one per shape of the buckets), then
        # graphed and compiled (the group's encoder forward compiled: what the plan's --compile on prices); and the
        # fused step with torch's own attention pick (cuDNN's on an H200: auto's memory-efficient kernel was
        # measured faster at max_len 32 only, and these rows reach 512)
        for b, fuse, tri, graphs, att in (("none", 1, None, False, None), ("auto", 1, None, False, None),
                                          ("auto", 2, None, False, None), ("auto", 2, None, False, "sdpa"),
                                          ("auto", 2, "with_views", False, None), ("auto", 2, None, True, None),
                                          ("auto", 2, None, "compiled", None)):
            args = {**(margs["arccse"] if margs.get("arccse") is not None else {}), **({"triplet_pass": tri} if tri else {})}
            kw = dict(model=str(model), corpus=str(corpus), device=device, batch=small(32), max_len=512, method="arccse",
                      margs=args, inputs=usable["arccse"],
                      train={**arc, "fuse_micro_batches": fuse, **({"graphs": True} if graphs else {}),
                             **({"compile": True} if graphs == "compiled" else {}), **({"attention": att} if att else {})},
                      buckets=b,
                      first=first, then=then)
            # each row in a process of its own on a GPU: in one process the rows after the first met the fused
            # shapes' kernels and cuDNN plans built, so two lends ranked with_views and separate oppositely
            out.append(first_steps(**kw) if toy else _isolated(kw, "first_steps"))
    for t in profiled:  # SENTEMB_PROFILE, or the chunked step against the whole
        out.append(profile_steps(model, corpus, device, t.pop("batch"), 32, "simcse", None, usable["simcse"], t,
                                 *((1, 1) if toy else (10, 5)), top=12))
    if "profile" in parts and "simcse" in usable and others:
        # where the compiled step's GPU time goes (issue 37's targets), and with each attention kernel at B 512
        # (cuDNN's took 24% of that step on the H200)
        b64, b512 = (4, 8) if toy else (64, 512)
        # (the default attention, auto: sdpa_efficient on CUDA; then torch's pick, cuDNN's on an H200, and the others)
        for b, att in ((b64, None), (b512, None), (b512, "sdpa"), (b512, "sdpa_math"), (b512, "eager")):
            out.append(profile_steps(model, corpus, device, b, 32, "simcse", None, usable["simcse"],
                                     {"compile": True, "buckets": [32], **({"attention": att} if att else {})},
                                     *((1, 1) if toy else (10, 5)), top=12))
    if "profile" in parts and "arccse" in usable and others:
        # why with_views is slower than separate on the H200
        for tri in ("separate", "with_views"):
            args = {**(margs["arccse"] if margs.get("arccse") is not None else {}), "triplet_pass": tri}
            out.append(profile_steps(model, corpus, device, small(32), 512, "arccse", args, usable["arccse"],
                                     {**arc, "fuse_micro_batches": 2, "buckets": "auto"},
                                     *((1, 1) if toy else (10, 5))))
    for m, extra in (("paser", {}), ("arccse", arc)):
        if "workers" not in parts or m not in usable:
            continue
        for n in (0, 2):
            out.append(workers(model, corpus, device, small(64 if m == "paser" else 32), 32, m, margs.get(m), usable[m],
                               n, steps, work, {**get_method(m).paper_train, **extra}))
    probes = []
    for b in graph_batches if "graph" in parts else ():
        for dropout in ("stream", "counter"):
            if device.startswith("cuda"):
                probes.append(graph_probe(model, corpus, device, b, 32, dropout=dropout))
            else:
                probes.append((f"graph probe simcse B={b} ({dropout} dropout)", "skipped", "CUDA graphs need a CUDA device"))
    if "graph_methods" in parts and device.startswith("cuda"):
        for m in sorted(usable):
            if m != "simcse":
                probes.append(graph_probe(model, corpus, device, 64, 32, method=m, margs=margs.get(m), inputs=usable[m]))
    if "compile" in parts and device.startswith("cuda"):
        probes.append(compile_probe(model, corpus, device, 64, 32))
    if "graphed" in parts:
        probes += graphed_rows(model, corpus, device, margs, usable, toy)
    if "tune" in parts and "simcse" in usable:
        probes += tune_rows(model, corpus, device, toy)
    if step_s is None and probes and "eager " in probes[0][1]:  # the probe's eager B 64 step
        step_s = float(probes[0][1].split("eager ")[1].split(" ms")[0]) / 1000
    if "dev_eval" in parts:
        out += dev_eval(model, senteval, device, step_s)
    return out + probes
