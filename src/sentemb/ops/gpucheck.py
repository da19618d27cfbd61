"""``sentemb gpu-check``: one command for the first user with a GPU (issue 20 §6).

On the visible CUDA device, in a few minutes, it measures what no CPU machine of this project could:

1. the six methods through the loop's own code (``benchmark.bench_method``) in bf16 at batch 64 and
   512, next to sentence-transformers' SimCSE recipe at the same batch: sentences/s, ms/step,
   achieved TFLOP/s (counted FLOPs, ``sentemb.ops.flops``), share of the GPU's bf16 dense peak, and peak
   GPU memory;
2. the STS evaluation of one model in fp32 (the protocol) and in bf16: the difference per task;
3. the tiny DAG (``.test/config.yaml``) end to end with training on CUDA under bf16, timed;
4. ``sentemb plan``'s estimate for one SimCSE step (``plan.step_seconds``: the step's counted FLOPs
   at the plan's measured MFU of the peak, or its host floor) next to the step time measured in 1;
5. gradient caching (``train.chunk_size``, issue 26 §2): SimCSE at each batch in chunks of a quarter
   of it, time per step and peak memory next to the unchunked step of 1;
6. one job across two GPUs (``train.devices: 2``, issue 26 §3; with two or more GPUs visible, else
   the row says why not): ``sentemb train`` end to end as 2 processes against 1, fp32 with keyed
   dropout, wall time and the relative difference of the final weights (round-off expected);
7. a real multi-step run: ``sentemb train`` of SimCSE for one epoch of ``--corpus`` on this device in
   bf16 (data loading, logging and export included), its wall time and sentences/s, and the STS
   average of the ``--sts-model`` before and after.

``--model`` is a model directory or one of ``sentemb.ops.shapes.ARCHITECTURES`` (``bert-base-uncased``,
``roberta-large``, ...): random weights at the published shape, whose speed and memory are the
pretrained model's. The STS rows (2, 7) need real weights: they use ``--sts-model`` (by default the
mirror's all-MiniLM-L6-v2).

It prints one Markdown table to paste into an issue. Without CUDA it says so and exits 2 (``--cpu``
runs the same code on the CPU at a toy size: the tests use it so that the command cannot rot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import SentembError


def methods_to_check(names: list[str] | None = None) -> tuple[str, ...]:
    """``names``, or every registered method (the built-in ones and any imported plug-in), SimCSE
    first (the reference of the sentence-transformers row); an unknown name is refused."""
    from ..methods import registry

    reg = registry()
    for n in names or ():
        if n not in reg:
            raise SentembError(f"--method {n}: not a registered method (known: {', '.join(sorted(reg))})")
    chosen = list(dict.fromkeys(names)) if names else list(reg)
    return tuple(sorted(chosen, key=lambda n: n != "simcse"))


class _Table(list):
    """The table's lines, each also printed (flushed) as it is added, so that a run stopped by a time
    limit leaves the rows it measured."""

    def append(self, line: str) -> None:
        super().append(line)
        print(line, flush=True)


def _row(what: str, value: str, note: str = "") -> str:
    return f"| {what} | {value} | {note} |"


def _inputs_for(model: Path, corpus: Path, work: Path, device: str, methods: tuple[str, ...],
                margs: dict[str, dict]) -> dict[str, dict]:
    """method -> every input it reads with its arguments ``margs`` (``Method.requires``), made from the
    benchmark corpus by each kind's ``sentemb.stats.inputs`` builder (token frequency, TF-IDF, RAKE with the
    mirror's NLTK data, ...) and, for ``pretrained``, the method's own pretraining stage (3 steps).
    A kind that cannot be built here leaves that method's rows "skipped", naming why."""
    from ..stats.inputs import InputUnavailable, build_input
    from ..methods import get_method

    built: dict[str, Path | Exception] = {}
    out: dict[str, dict] = {}
    for m in methods:
        cls = get_method(m)
        out[m] = {}
        for name in cls.requires(cls.make_args(margs.get(m, {}))):
            key = f"{name}:{m}" if name == "pretrained" else name
            if key not in built:
                try:
                    built[key] = (_pretrain_stage(cls, model, corpus, work / f"pretrain-{m}", device)
                                  if name == "pretrained" else build_input(name, work / name, corpus, model))
                except InputUnavailable as e:
                    built[key] = e
            out[m][name] = built[key]
    return out


def _method_args(model: Path, methods: tuple[str, ...]) -> dict[str, dict]:
    """Arguments that depend on the model's depth (``Method.args_for_depth``: InfoCSE's M^{>0} after
    half the layers, the paper's 6 of 12)."""
    from transformers import AutoConfig

    from ..methods import get_method

    layers = AutoConfig.from_pretrained(model).num_hidden_layers
    return {m: a for m in methods if (a := get_method(m).args_for_depth(layers))}


def _pretrain_stage(cls, model: Path, corpus: Path, out: Path, device: str) -> Path:
    """A method's pretraining stage (``Method.pretrain_stage``, through the shared loop), 3 steps: an
    input, not a measurement."""
    import dataclasses

    from transformers import AutoConfig

    from .benchmark import _bench_run
    from ..train.pretrain import run_pretrain

    args = cls.args_for_depth(AutoConfig.from_pretrained(model).num_hidden_layers)
    run = _bench_run(model, corpus, 16, device, 32, "bf16", cls.name, 10**9, args)
    run = dataclasses.replace(run, name=f"{cls.name}-pretrain", rule="pretrain",
                              train=dataclasses.replace(run.train, max_steps=3))
    run_pretrain(run, out, progress=False)
    return out / "model"


def check(*args, **kwargs) -> list[str]:
    """``_check`` in a temporary folder of its own (the methods' inputs, the end-to-end jobs' runs:
    about 260 MB with BERT-base), removed when it returns, fails or is stopped (Ctrl-C, SIGTERM)."""
    with tempfile.TemporaryDirectory(prefix="sentemb-gpucheck-") as work:
        return _check(*args, work=Path(work), **kwargs)


def _check(model: Path, corpus: Path, senteval: Path, device_name: str, batches: tuple[int, ...],
           steps: int, warmup: int, max_len: int, methods: tuple[str, ...], dag: bool, repo: Path,
           sts_tasks: tuple[str, ...] | None = None, sts_model: Path | None = None,
           method_args: dict[str, dict] | None = None, epoch_batch: int | None = 64, host: bool = False,
           classic: bool = True, host_parts: tuple[str, ...] | None = None, *, work: Path) -> list[str]:
    import torch

    from .benchmark import _peak, bench_method, bench_st
    from .hostcheck import _kernel
    from .plan_check import record
    from ..data.corpus import read_corpus
    from ..evaluate.sts import embedder_for, evaluate_sts
    from ..methods import get_method

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    precision = "bf16"
    peak = _peak(device, None)
    if peak is None and not cuda:
        from .flops import cpu_peak_tflops

        peak = cpu_peak_tflops(dtype=precision)  # the rows' own dtype: bf16
    name = torch.cuda.get_device_name(device) if cuda else f"cpu x{torch.get_num_threads()}"
    lines = _Table()
    lines += [f"sentemb gpu-check on {name} (torch {torch.__version__}); model {model}; max_len {max_len}; "
             f"{steps} timed steps after {warmup}; peak {peak:.3g} TFLOP/s "
             f"({'bf16 dense, by GPU name' if cuda else 'bf16 matmul measured now'})", "",
             "| what | value | note |", "| --- | --- | --- |"]
    print("\n".join(lines), flush=True)
    sentences = read_corpus(corpus)
    margs = _method_args(model, methods)
    for m, a in (method_args or {}).items():
        margs[m] = {**margs.get(m, {}), **a}
    inputs = _inputs_for(model, corpus, work / "stats", device_name, methods, margs)
    sts_model = sts_model or model
    simcse_step = {}
    for b in batches if classic else ():
        for m in methods:
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            missing = {n: v for n, v in inputs[m].items() if isinstance(v, Exception)}
            if missing:
                lines.append(_row(f"train {m} B={b}", "skipped", "; ".join(f"input {n}: {v}" for n, v in missing.items())))
                continue
            try:
                secs, tok, padded, cfg, build, fpt = bench_method(model, corpus, b, steps, warmup, device, max_len, precision,
                                                            m, margs.get(m), {n: str(v) for n, v in inputs[m].items()},
                                                            get_method(m).paper_train.get("sam_rho"))
            except SentembError as e:
                lines.append(_row(f"train {m} B={b}", "skipped", str(e)))
                continue
            mem = f", peak mem {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if cuda else ""
            sam = get_method(m).paper_train.get("sam_rho")
            record(f"train {m} B={b} bf16", m, model, b, max_len, secs / steps, (warmup, warmup + steps),
                   {"prefetch": False, **({"sam_rho": sam} if sam else {}), **_kernel({}, device_name)},
                   margs.get(m) or {}, build_s=build / steps)
            tf = fpt * padded / secs / 1e12
            if m == "simcse":
                simcse_step[b] = (secs / steps, fpt * padded / steps, cfg)
            lines.append(_row(f"train {m} B={b} bf16", f"{b * steps / secs:.0f} sent/s, {1000 * secs / steps:.0f} ms/step",
                              f"{tf:.3g} TFLOP/s = {100 * tf / peak:.1f}% of peak{mem}"))
        if "simcse" in methods:
            s2, _ = bench_st(model, sentences, b, steps, warmup, device, max_len, precision)
            lines.append(_row(f"train sentence-transformers MNRL B={b} bf16",
                              f"{b * steps / s2:.0f} sent/s, {1000 * s2 / steps:.0f} ms/step", "same model, batch, max_len"))
    # gradient caching: the same step in chunks of a quarter of the batch (memory bound, one extra forward)
    if "simcse" in methods and classic:
        for b in batches:
            c = max(1, b // 4)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            secs, _, _, _, build, _ = bench_method(model, corpus, b, steps, warmup, device, max_len, precision, "simcse",
                                                   None, {}, chunk_size=c)
            mem = f", peak mem {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if cuda else ""
            record(f"train simcse B={b} bf16 chunk_size {c}", "simcse", model, b, max_len, secs / steps,
                   (warmup, warmup + steps), {"prefetch": False, "chunk_size": c, **_kernel({}, device_name)},
                   build_s=build / steps)
            whole = simcse_step.get(b, (None,))[0]
            ratio = f"; {secs / steps / whole:.2f}x the unchunked step" if whole else ""
            lines.append(_row(f"train simcse B={b} bf16 chunk_size {c}",
                              f"{b * steps / secs:.0f} sent/s, {1000 * secs / steps:.0f} ms/step",
                              f"gradient caching{ratio}{mem}"))
    if host:  # issue 36/37: first steps with and without buckets, worker processes, dev evaluation, graph probe
        from . import hostcheck

        step = simcse_step.get(64, (None,))[0]
        for r in hostcheck.rows(model, corpus, senteval, device_name, work, margs, inputs, step,
                                parts=host_parts or hostcheck.PARTS[:4], graph_batches=batches):
            lines.append(_row(*r))
    if not classic:
        return lines
    lines.append(_row(*_devices_row(model, corpus, device_name, max(batches), max(steps, 5), max_len, work)))
    # bf16 vs fp32 evaluation of the same model
    scores = {}
    for prec in ("fp32", "bf16"):
        t = time.perf_counter()
        emb = embedder_for(sts_model, "avg", device=device_name, batch_size=128, precision=prec)
        res = evaluate_sts(emb, senteval, *([list(sts_tasks)] if sts_tasks else []))
        scores[prec] = (res, time.perf_counter() - t)
    diffs = {t: scores["bf16"][0][t] - scores["fp32"][0][t] for t in scores["fp32"][0]["details"]}  # x100 already
    worst = max(diffs, key=lambda t: abs(diffs[t]))
    lines.append(_row(f"STS Avg fp32 / bf16 (avg pooling, {Path(sts_model).name})",
                      f"{scores['fp32'][0]['avg']:.2f} / {scores['bf16'][0]['avg']:.2f}",
                      f"largest task difference {worst} {diffs[worst]:+.2f}; {scores['fp32'][1]:.0f} s / "
                      f"{scores['bf16'][1]:.0f} s"))
    # sentemb plan's estimate (counted FLOPs of a step at its stated MFU of the peak) vs the measured step
    from .plan import mfu_for, step_seconds

    for b, (ms, flops_step, cfg) in sorted(simcse_step.items()):
        mfu = mfu_for(int(cfg.hidden_size))
        est = step_seconds(flops_step, cfg.num_hidden_layers, 1, peak * 1e12, mfu)
        lines.append(_row(f"plan vs measured, simcse B={b}", f"estimate {1000 * est:.0f} ms / measured {1000 * ms:.0f} ms",
                          f"plan's step = max(counted FLOPs / ({mfu} x peak), host floor x {cfg.num_hidden_layers} "
                          f"layers); measured/estimate {ms / est:.2f}"))
    if epoch_batch:
        lines.append(_row(*_epoch_row(sts_model, corpus, senteval, device_name, epoch_batch, max_len, work,
                                      scores["fp32"][0]["avg"], sts_tasks)))
    if dag:
        lines.append(_row("tiny DAG, training on this device in bf16", *_tiny_dag(repo, device_name, senteval)))
    return lines


def _epoch_row(model: Path, corpus: Path, senteval: Path, device_name: str, batch: int, max_len: int, work: Path,
               before: float, sts_tasks: tuple[str, ...] | None) -> tuple[str, str, str]:
    """``sentemb train`` of SimCSE (lr 3e-5, bf16, the default loop: token cache, prefetch, logging,
    export) for one epoch of ``corpus`` on this device, then the exported model's STS average (fp32,
    avg pooling, the tasks of the fp32/bf16 row) against ``before``, the same score of ``model``."""
    from .benchmark import _bench_run, train_cli
    from ..evaluate.sts import embedder_for, evaluate_sts
    from ..utils import read_json

    run = _bench_run(model, corpus, batch, device_name, max_len, "bf16", "simcse", 10**9, epochs=1)
    what = f"train simcse one epoch of the corpus, B={batch} bf16 ({Path(model).name})"
    out, secs, err = train_cli(run, work, "epoch")
    if err is not None:
        return what, "FAILED", err
    summary = read_json(out / "train.json")
    steps, loop = int(summary.get("steps") or 0), float(summary.get("train_seconds_this_process") or secs)
    emb = embedder_for(out / "model", "avg", device=device_name, batch_size=128)
    after = evaluate_sts(emb, senteval, *([list(sts_tasks)] if sts_tasks else []))["avg"]
    corpus_n = ((summary.get("provenance") or {}).get("corpus") or {}).get("sentences")
    n = min(steps * batch, corpus_n) if corpus_n else steps * batch  # one epoch: the corpus's sentences, at most
    return (what, f"{secs:.0f} s for {steps} steps end to end; {n / loop:.0f} sent/s in the loop ({loop:.0f} s)",
            f"STS Avg (fp32, avg pooling) {before:.2f} -> {after:.2f}; a 1M-sentence epoch (wiki1m) at the loop's "
            f"rate ~{1e6 / (n / loop) / 60:.1f} min")


def _devices_row(model: Path, corpus: Path, device_name: str, batch: int, steps: int, max_len: int,
                 work: Path) -> tuple[str, str, str]:
    """``sentemb train`` of SimCSE for ``steps`` steps with ``train.devices`` 1 and 2 (fp32, keyed
    dropout, no evaluation): wall time of each (start-up included) and the largest relative
    difference of a weight tensor between the two final models (fp32 round-off expected)."""
    import torch
    from safetensors.torch import load_file

    from .benchmark import _bench_run, train_cli

    what = f"train simcse B={batch} devices 2 (fp32, keyed dropout)"
    if device_name == "cuda" and torch.cuda.device_count() < 2:
        return what, "skipped", f"{torch.cuda.device_count()} GPU visible; run on a node with two"
    timings, weights = {}, {}
    for devices in (1, 2):
        run = _bench_run(model, corpus, batch, device_name, max_len, "fp32", "simcse", 10**9, devices=devices,
                         dropout_rng="keyed", max_steps=steps)
        out, timings[devices], err = train_cli(run, work, f"devices{devices}")
        if err is not None:
            return what, "FAILED", err
        weights[devices] = load_file(str(next((out / "model").rglob("*.safetensors"))))
    # the whole model's difference, not a tensor's: some gradients are zero in exact arithmetic (an
    # attention key bias: softmax ignores a shift), and AdamW scales their round-off to a full step
    from ..model.backbone import read_weights

    start = {k.removeprefix("bert."): v for k, v in read_weights(model).items()}  # a Hub BERT's bert.* / gamma names
    sq = lambda d: sum(float(v.double().pow(2).sum()) for v in d)  # noqa: E731
    diff = (sq(weights[1][k] - weights[2][k] for k in weights[1]) / sq(weights[1].values())) ** 0.5
    moved = [k for k in weights[1] if k in start and start[k].shape == weights[1][k].shape]
    update = sq(weights[1][k].double() - start[k].double() for k in moved) ** 0.5
    of_update = f" ({(sq(weights[1][k] - weights[2][k] for k in moved) ** 0.5) / update:.1e} of the update)" if update else ""
    return (what, f"{timings[2]:.0f} s vs {timings[1]:.0f} s on one device ({timings[1] / timings[2]:.2f}x)",
            f"{steps} steps end to end with start-up; weights' relative difference {diff:.1e}{of_update}")


def _tiny_dag(repo: Path, device_name: str, senteval: Path) -> tuple[str, str]:
    """Run ``.test/config.yaml`` end to end with ``train.device`` = this device, ``train.precision`` bf16."""
    import yaml

    work = Path(tempfile.mkdtemp(prefix="sentemb-gpucheck-dag-"))
    cfg = yaml.safe_load((repo / ".test" / "config.yaml").read_text())
    cfg.setdefault("train", {}).update({"device": device_name, "precision": "bf16"})
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    mirror = os.environ.get("SENTEMB_MIRROR") or str(senteval.parents[1])
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(work),
                        f"--configfile={work / 'config.yaml'}", "--cores", "4", "results/table1.csv"],
                       env={**os.environ, "SENTEMB_MIRROR": mirror, "MLFLOW_TRACKING_URI": ""},
                       capture_output=True, text=True)
    secs = time.perf_counter() - t
    if p.returncode:
        return "FAILED", f"see {work}/.snakemake/log ({p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''})"
    return f"{secs:.0f} s", f"tables in {work}/results"
