"""The one training loop every method shares (in the spirit of nanoGPT's ``train.py``).

It owns data order, optimisation (AdamW, linear decay, grad clipping, optional Sharpness-Aware
Minimization: ``train.sam_rho``), precision (bf16 autocast on CUDA, fp32 on CPU; methods compute
logits and losses in fp32), periodic STS-B dev evaluation
with best-checkpoint selection (methods.md §0), resumable checkpoints, and MLflow logging (with
``train.log_grad_norms``, each weighted loss term's gradient norm on log steps: ``sentemb.train.grad_norms``).
A method contributes only its batch construction and loss terms (``sentemb.methods.base.Method``).
How a step's gradient is computed (the whole micro-batch, in chunks with gradient caching:
``train.chunk_size``, over several processes: ``train.devices``, twice with SAM, under keyed dropout
masks) is ``sentemb.train.step``'s: one ``StepStrategy`` per way, chosen at set-up (``strategy_for``)
and called by the optimizer-step stage, so that this module reads as its stages.

What keeps a step's critical path to the model (issues 13, 36): the corpus is tokenized once
(``train.token_cache``, ``sentemb.data.tokens``), the next steps' batches are built ahead and pinned
(``sentemb.train.batches``: ``train.workers: N`` forked worker processes, else with ``train.prefetch``
one background thread), loss finiteness is checked with one host sync per log/eval/save instead of
per step, and the dev set is tokenized and padded once. None of these change what is computed: the
losses and weights are the same step by step with them off (tested). What is left is measured: the
time the loop waits for its batches (``train/data_wait`` per step in MLflow; ``data_wait_s``,
``data_wait_s_per_step`` in ``train.json``) and the time in dev evaluation (``dev/eval_s``;
``dev_eval_s``, ``dev_eval_share``), whose precision is ``train.eval_precision`` (fp32, or bf16: a
weights setting, as it can keep another checkpoint).

Outputs of ``train(run, out_dir)``:
    out_dir/model/       the best checkpoint by STS-B dev (HF + sentence-transformers layout), with
                         its model card without results (README.md, sentemb.report.model_card)
    out_dir/train.json   summary (best dev, steps, throughput, this process's data wait and dev-eval
                         cost: ``cost_summary``, history: one record per evaluated or,
                         with train.log_grad_norms, logged step: dev_stsb, train/grad_norm/<term>;
                         provenance: git commit, corpus sha256 and size, framework versions)
    out_dir/.work/       resume state; removed after success
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from .. import SentembError
from ..config.settings import Run, TrainSettings, legacy_fingerprint
from ..data.corpus import read_corpus
from ..utils import atomic_path, write_json
from .batches import Prefetcher, WorkerBatches, batch_source, fetch, micro_batches  # noqa: F401  (re-exported)
from .step import _precision, _rng_state, _set_rng_state, graphs_summary, resolve_chunk_size, resolve_first_pass, strategy_for
# imported from here by sentemb.ops.plan, sentemb.ops.benchmark, sentemb.testing and the tests
from .step import AUTO_CHUNK_MARGIN, auto_chunk, autocast  # noqa: F401

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..methods import Method
    from ..tracking.runs import Tracker
    from .step import StepStrategy

log = logging.getLogger(__name__)


def sentence_lengths(sentences: list[str]) -> np.ndarray:
    """The length ``train.sampler: length`` sorts by: whitespace-separated words of the raw line.
    Open choice (ArcCSE §4.1 says only "sampled by length"): words, not word pieces, so that the
    schedule needs no tokenizer, is the same with ``train.token_cache`` on or off and on every
    backbone, and counts what the paper's other length rule counts ("sentences with less than 25
    words", ``ArcCSE.Args.min_words``)."""
    import numpy as np

    return np.fromiter((len(s.split()) for s in sentences), dtype=np.int64, count=len(sentences))


def micro_batches_per_epoch(n: int, batch_size: int) -> int:
    """The micro-batches of one epoch over ``n`` sentences (``batch_schedule``: a trailing batch of one
    sentence is dropped)."""
    return n // batch_size + (1 if n % batch_size >= 2 else 0)


def epochs_begun(step: int, accum: int, per_epoch: int) -> range:
    """The epochs (0-based) whose first micro-batch optimizer step ``step`` (0-based) holds: those e with
    e·per_epoch in [step·accum, (step + 1)·accum) (one at most unless an epoch is shorter than a step);
    ``Method.before_epoch`` is called for each before the step."""
    first, stop = step * accum, (step + 1) * accum
    return range(-(-first // per_epoch), -(-stop // per_epoch))


def batch_schedule(n: int, batch_size: int, epochs: float, seed: int, lengths: "np.ndarray | None" = None
                   ) -> list[np.ndarray]:
    """Micro-batches of corpus indices, a pure function of the arguments (resume rebuilds it).

    ``lengths`` None (``train.sampler: random``, the default): a fresh seeded permutation per epoch
    cut into consecutive batches, no length bucketing (bucketing changes which sentences are each
    other's in-batch negatives).

    ``lengths`` given (``train.sampler: length``; ArcCSE §4.1: "During training, the sentences are
    sampled by length", with each batch padded to its longest sentence): per epoch, the corpus in
    order of length (ties broken by the epoch's seeded permutation, so equal-length groups differ
    between epochs) is cut into consecutive batches of ``batch_size`` neighbours, and the order of
    those batches is shuffled by the same epoch generator. Every sentence once per epoch, as with
    ``random``; gradient accumulation groups consecutive micro-batches of the shuffled order.

    Either way a trailing batch of one sentence is dropped (no negatives)."""
    import numpy as np

    if lengths is not None and len(lengths) != n:
        raise SentembError(f"batch_schedule: {len(lengths)} lengths for {n} sentences")
    per_epoch = micro_batches_per_epoch(n, batch_size)
    total = max(1, int(round(epochs * per_epoch)))
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < total:
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(n)
        if lengths is not None:
            perm = perm[np.argsort(np.asarray(lengths)[perm], kind="stable")]
        chunks = [c for c in (perm[i : i + batch_size] for i in range(0, n, batch_size)) if len(c) >= 2]
        if lengths is not None:
            chunks = [chunks[int(k)] for k in rng.permutation(len(chunks))]
        out.extend(chunks)
        epoch += 1
    return out[:total]


def build_optimizer(module: torch.nn.Module, lr: float, weight_decay: float, device: torch.device,
                    fused: bool = False, capturable: bool = False, kind: str = "adamw"):
    """AdamW; biases and LayerNorm weights are not decayed (the HF Trainer's convention). torch's fused
    kernel on CUDA, and on any device with ``fused`` (``train.update: fused`` hands it the clip);
    ``capturable`` on CUDA (``train.update: graphed`` captures its step; see ``tensor_lr``).
    ``kind`` (``train.optimizer``): ``adamw_hf`` is transformers 4.2.1's AdamW
    (``sentemb.train.optim.HFAdamW``; neither fused nor capturable)."""
    import torch

    decay, no_decay = [], []
    for n, p in module.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in n or "layer_norm" in n else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if kind == "adamw_hf":
        from .optim import HFAdamW

        if fused or capturable:
            raise SentembError("train.optimizer adamw_hf has no fused or capturable kernel: set train.update: separate")
        return HFAdamW(groups, lr=lr)
    return torch.optim.AdamW(groups, lr=lr, fused=fused or device.type == "cuda",
                             capturable=capturable and device.type == "cuda")


def tensor_lr(opt, device) -> None:
    """Each param group's learning rate as a float32 tensor on ``device`` (``train.update: graphed``):
    a captured AdamW step reads it from there, and the LR schedule fills it in place
    (``LRScheduler`` does for a tensor), where a float would be frozen into the graph. The value is
    the float's rounded to float32 (a relative 1e-8 or less): another run to rounding."""
    import torch

    for group in opt.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)


def resolve_attention(attention: str, device, unpad: bool = False) -> str:
    """``train.attention`` as the job runs it: ``auto`` is ``sdpa_efficient`` on a CUDA device (faster
    than the cuDNN kernel torch picks there, at short rows: ``docs/gpu/h200-2026-11-28c.md``) and
    ``sdpa`` elsewhere, or with ``unpad`` (its packed forward has its own attention); any other value
    is itself."""
    if attention != "auto":
        return attention
    return "sdpa_efficient" if getattr(device, "type", str(device)) == "cuda" and not unpad else "sdpa"


def sdpa_backend(attention: str):
    """``train.attention: sdpa_efficient`` or ``sdpa_math``: restrict the process's
    ``scaled_dot_product_attention`` to the memory-efficient kernel (the math one where it cannot
    serve) or to the math one, until the returned function is called (``Job.close``; None for another
    ``attention``). The flags are the process's: compiled code traced and CUDA graphs captured
    meanwhile keep the choice. AOTAutograd's compile cache is off meanwhile (its key does not see
    the flags)."""
    if attention not in ("sdpa_efficient", "sdpa_math"):
        return None
    import torch._functorch.config as functorch_config
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ctx = sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if attention == "sdpa_efficient"
                      else [SDPBackend.MATH])
    ctx.__enter__()
    # AOTAutograd's cache is keyed by Dynamo's graph, which holds SDPA undecomposed: it can serve code
    # compiled under other backend flags (on the CPU a function recompiled under MATH ran the flash
    # kernel; the H200's sdpa_efficient rows timed as sdpa's, compiled in 4 s: possibly the same), and
    # would store code compiled under these for other jobs
    cache = functorch_config.enable_autograd_cache
    functorch_config.enable_autograd_cache = False

    def undo():
        functorch_config.enable_autograd_cache = cache
        ctx.__exit__(None, None, None)

    return undo


#: what the process's compiled code was compiled under (``fresh_compile_cache``)
_COMPILED_UNDER: list = []


def fresh_compile_cache(under: tuple) -> None:
    """Drop the process's compiled code (``torch._dynamo.reset``) when this job compiles under other
    settings (``under``: ``train.compile_mode``, ``compile_random``, ``dropout_rng``, ``counter_kernel``,
    ``attention``,
    and the shapes' settings ``batch_size``, ``chunk_size``, ``max_len``, ``buckets``,
    ``fuse_micro_batches``) than the last
    one did: Dynamo's cache is keyed by the code object and its guards, not by Inductor's config or
    mode, so a second job in the process (gpu-check's rows, the tests) would otherwise replay the
    first job's kernels, or (other shapes) recompile them for dynamic shapes. A job alone in its
    process (``sentemb train``) compiles afresh either way."""
    if _COMPILED_UNDER and _COMPILED_UNDER[0] != under:
        import torch._dynamo

        from ..model.dropout import forget_warm

        torch._dynamo.reset()
        forget_warm()  # warm_fused's kernels went with the reset: the next capture's warm-up makes them again
    _COMPILED_UNDER[:] = [under]


def lr_lambda(schedule: str, total: int, warmup: int):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return step / warmup
        if schedule == "constant":
            return 1.0
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


# ----------------------------------------------------------------------------------- the loop
# A run is a sequence of named stages over two small objects: ``Job`` (what is fixed once set up)
# and ``State`` (what changes every step and is saved for resume). ``train`` at the bottom reads
# top to bottom: set up, resume, then per optimizer step: one step, log, evaluate-and-keep, save.


@dataclass
class Job:
    """Everything fixed after set-up (``setup`` returns it complete): settings, data, the method
    (encoder + heads), optimisation, the dev embedder, the tracker and the batch prefetcher."""

    run: Run
    out_dir: Path
    work: Path  # resume state and best export: out_dir/.work
    settings: TrainSettings  # run.train
    seed: int
    device: "torch.device"
    amp: "torch.dtype | None"  # autocast dtype, None = fp32
    sentences: list[str]
    dev_pairs: list
    method: "Method"
    step_fn: Callable[[dict], dict]  # method.losses, or its torch.compile'd version
    pooler: str
    micro: list  # micro-batches of corpus line indices (batch_schedule)
    accum: int
    total: int  # optimizer steps
    opt: "torch.optim.Optimizer"
    sched: "torch.optim.lr_scheduler.LRScheduler"
    scaler: "torch.amp.GradScaler"
    fingerprint: str  # resume only a state saved under the same settings
    meta: dict
    tracker: "Tracker"  # MLflow (a disabled one outside ``train``)
    embedder: Callable | None = None  # the STS-B dev embedder (model_selection: best_dev)
    prefetch: "Prefetcher | WorkerBatches | None" = None  # next steps' batches built ahead (train.workers, train.prefetch)
    chunk: int | None = None  # sentences per chunk of gradient caching (train.chunk_size resolved); None = whole
    first_chunk: int | None = None  # sentences per piece of its graph-free first pass (train.chunk_first_pass); None = whole
    rank: int = 0  # this process among train.devices (sentemb.train.distributed); only rank 0 writes
    world: int = 1
    strategy: "StepStrategy | None" = None  # how a step's gradient is computed (sentemb.train.step.strategy_for)
    dropout_key: "torch.Tensor | None" = None  # train.graphs + dropout_rng counter: the static key (sentemb.train.graphs)
    encode_fn: Callable | None = None  # train.compile: method.encode compiled (gradient caching's chunks, fused groups); None = eager
    restore: list = field(default_factory=list)  # what close() puts back (train.attention's backend)
    attention: str = "sdpa"  # train.attention as run (resolve_attention: auto resolved on the job's device)
    per_epoch: int = 0  # micro-batches per epoch (micro_batches_per_epoch); 0 = no before_epoch calls

    def close(self) -> None:
        """Stop the prefetch thread or the batch workers (``train`` does; so should a caller of ``setup``),
        and put back the process state the job set (``restore``)."""
        try:
            if self.prefetch is not None:
                self.prefetch.close()
        finally:
            while self.restore:
                self.restore.pop()()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class State:
    """What changes during training; ``step``, ``best`` and ``history`` are saved for resume."""

    step: int = 0
    best: dict = field(default_factory=lambda: {"dev": -math.inf, "step": 0})
    history: list = field(default_factory=list)
    # logging window (since the last log)
    sum_terms: dict = field(default_factory=dict)
    n_terms: int = 0
    n_sent: int = 0
    n_tok: int = 0
    t_log: float = 0.0
    # (step, isfinite(loss) on device, detached terms) not yet checked: one host sync per check
    pending: list = field(default_factory=list)
    # train.log_grad_norms: {term: ‖∇ weighted term‖} of the step to be logged (sentemb.train.grad_norms)
    grad_norms: dict = field(default_factory=dict)
    # the detached loss terms of the last micro-batch (benchmarks and tests read them per step)
    terms: dict = field(default_factory=dict)
    # time blocked getting batches (sentemb.train.batches.fetch): the log window's and its steps,
    # and this process's total and steps; seconds in evaluate-and-keep, this process
    data_wait: float = 0.0
    data_steps: int = 0
    data_wait_total: float = 0.0
    steps_run: int = 0
    dev_eval_s: float = 0.0
    dev_evals: int = 0


#: ``torch._dynamo.config.recompile_limit`` under ``train.compile`` with ``dropout_rng: counter`` (``setup``)
COUNTER_RECOMPILE_LIMIT = 64


def setup(run: Run | dict, out_dir: str | Path, method_cls: "type[Method] | None" = None,
          tracker: "Tracker | None" = None) -> Job:
    """Stage 1, set-up: device and precision, data (bad input fails here, before step 1), the
    method around a freshly loaded encoder (in training mode), the batch schedule, optimizer and LR
    schedule, the dev embedder and the prefetcher: a complete ``Job`` for ``run_steps``. Without
    ``tracker``, nothing is tracked. A caller other than ``train`` closes it (``with setup(...)``)."""
    import torch

    from ..data.buckets import resolve_buckets
    from ..methods import MethodContext, get_method
    from ..model.backbone import load_encoder
    from ..evaluate.senteval import load_task
    from ..tracking.runs import Tracker
    from ..utils import no_thread_churn, resolve_device, seed_everything, use_device

    run = Run.from_dict(run)
    out_dir = Path(out_dir)
    settings, paths, seed = run.train, run.paths, int(run.seed)
    settings.check(f"run '{run.name}'")
    # the method before anything loads: an unknown one (a hand-edited run config) fails in a moment
    if run.method_module and method_cls is None:  # a method from the user's code (config method_modules)
        from ..methods import import_method_module

        import_method_module(run.method_module, f"run '{run.name}': method_module")
    method_cls = method_cls or get_method(run.method)  # a pretraining stage passes its own class
    if settings.workers > 0:
        no_thread_churn()  # before the model loads: no thread ending when the batch workers fork
    from . import distributed

    device = resolve_device(distributed.init(settings.devices, settings.device, f"run '{run.name}'"))
    device_before = use_device(device)  # cuda:N current (graph capture); put back when the job closes
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    amp = _precision(settings.precision, device)
    if device.type == "cuda":
        # TF32 for fp32 matmuls (train.tf32), through the one API whose state Inductor's max-autotune reads
        # back (torch.get_float32_matmul_precision raises once the per-backend fp32_precision was set alone)
        torch.set_float32_matmul_precision("high" if settings.tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = settings.tf32  # SARCSE's TextCNN: its convolutions

    sentences = read_corpus(paths["corpus"])
    dev_pairs = load_task(paths["senteval"], "STSBenchmark", "dev") if settings.selects_by_dev else []
    seed_everything(seed)
    # BERT's pretrained NSP pooler is neither loaded nor computed (methods.md §0).
    encoder, tokenizer = load_encoder(paths["model"], dropout=settings.dropout, pooling_layer=False)
    if paths.get("backbone_model"):  # runs[].weights: the weights' encoder with the backbone's own tokenizer,
        from ..model.backbone import check_same_vocabulary, load_tokenizer  # which made the token cache and statistics

        backbone_tokenizer = load_tokenizer(paths["backbone_model"])
        check_same_vocabulary(tokenizer, backbone_tokenizer, f"run '{run.name}': config key runs[].weights "
                              f"({paths['model']}) against its backbone {paths['backbone_model']}")
        tokenizer = backbone_tokenizer
    attention = resolve_attention(settings.attention, device, settings.unpad)
    if attention == "eager":
        encoder.set_attn_implementation("eager")
    tokens = None
    if settings.token_cache:  # the workflow's cache (paths.tokens), else tokenized here, once
        from ..data.tokens import load_or_build

        tokens = load_or_build(paths.get("tokens"), tokenizer, sentences, paths["corpus"])
    ctx = MethodContext(max_len=settings.max_len, seed=seed, backbone=run.backbone, model_dir=Path(paths["model"]),
                        inputs={k: Path(v) for k, v in paths.get("inputs", {}).items()}, corpus=Path(paths["corpus"]),
                        tokens=tokens, buckets=resolve_buckets(settings.buckets, settings.max_len, device.type),
                        static=settings.graphs)
    method = method_cls(encoder, tokenizer, run.method_args, ctx).to(device)
    if settings.unpad:
        if settings.compile:
            raise SentembError(f"run '{run.name}': train.unpad and train.compile cannot be combined (the packed "
                               "length changes every step, so the compiled graph would be rebuilt); set one to false")
        from ..model.unpad import install

        install(method.encoder, where=f"run '{run.name}': train.unpad")
    step_fn, encode_fn, put_back = method.losses, None, None
    if settings.compile:
        import torch._inductor.config

        # compile_random eager: dropout drawn by the eager kernels from the global generator, not by
        # Inductor's own Philox, so the compiled run sees the same dropout masks (and losses) as an
        # eager one; inductor: Inductor's Philox inside its fused kernels (another random run)
        torch._inductor.config.fallback_random = settings.compile_random == "eager"
        if settings.dropout_rng == "counter":
            from ..model.dropout import compile_inline, compile_safe, interceptors

            put_back = interceptors()  # at the job's close (restore): later jobs compile torch's own dropout

            # torch's nn.MultiheadAttention is one opaque op to Dynamo: its attention dropout would meet the
            # counter masks under fake tensors (a crash in torch's words, found with PaSeR's decoder)
            mha = [n for n, m in method.named_modules() if isinstance(m, torch.nn.MultiheadAttention) and m.dropout > 0]
            if mha:
                raise SentembError(f"run '{run.name}': train.compile with train.dropout_rng counter cannot serve the "
                                   f"attention dropout of torch's nn.MultiheadAttention ({', '.join(mha[:3])}"
                                   f"{' ...' if len(mha) > 3 else ''}); set train.dropout_rng: stream or train.compile: "
                                   "false, or that dropout to 0 (PaSeR: method_args.decoder_dropout_layout: bart)")

            if settings.counter_kernel == "inline":  # the masks traced with the encoder (no break)
                compile_inline()
            else:  # the masks outside the compiled graphs (a break at each dropout)
                compile_safe()
            # after a break Dynamo compiles the encoder's nested functions as frames of their own, and
            # transformers' one `deprecate_kwarg` wrapper code object serves several of them (each
            # arity, with and without grad, is a recompilation): the default limit of 8 would leave
            # them eager for the rest of the run
            import torch._dynamo.config

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COUNTER_RECOMPILE_LIMIT)
        from ..methods.base import eager_stash

        eager_stash()  # Method.stash outside the compiled code (no recompilation per micro-batch)
        method.prepare_compile()  # what the method keeps out of the compiled code (ArcCSE's ArcCon)
        mode = None if settings.compile_mode == "default" else settings.compile_mode
        fresh_compile_cache((settings.compile_mode, settings.compile_random, settings.dropout_rng, settings.counter_kernel,
                             settings.batch_size,
                             attention, settings.chunk_size, settings.max_len, settings.buckets,
                             settings.fuse_micro_batches))
        step_fn = torch.compile(method.losses, mode=mode)
        encode_fn = torch.compile(method.encode, mode=mode)  # gradient caching's chunks, fused groups (fused_backward)

    lengths = sentence_lengths(sentences) if settings.sampler == "length" else None
    micro = batch_schedule(len(sentences), settings.batch_size, settings.epochs, seed, lengths)
    accum = settings.grad_accum
    total = len(micro) // accum
    if settings.max_steps:
        total = min(total, settings.max_steps)
    if total < 1:
        raise SentembError(f"run '{run.name}': the corpus gives no full optimizer step "
                           f"({len(micro)} micro-batches, grad_accum {accum})")
    if settings.selects_by_dev and not any(eval_due(settings, s, accum, total) for s in range(1, total + 1)):
        raise SentembError(f"run '{run.name}': no STS-B dev evaluation would select a checkpoint: "
                           f"train.eval_steps ({settings.eval_steps} {settings.eval_unit}) is beyond the run ({total} "
                           f"optimizer steps of {accum} micro-batches) and train.eval_at_end is false; lower "
                           "train.eval_steps, set train.eval_at_end: true, or set train.model_selection: last")
    opt = build_optimizer(method, settings.lr, settings.weight_decay, device, fused=settings.update != "separate",
                          capturable=settings.update == "graphed", kind=settings.optimizer)
    warmup = int(settings.warmup_ratio * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(settings.lr_schedule, total, warmup))
    if settings.update == "graphed":  # after the schedule's set-up: its base rates stay floats
        tensor_lr(opt, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    pooler = method_cls.pooler_for(method.args)
    job = Job(run=run, out_dir=out_dir, work=out_dir / ".work", settings=settings, seed=seed, device=device, amp=amp,
              sentences=sentences, dev_pairs=dev_pairs, method=method, step_fn=step_fn, pooler=pooler, micro=micro,
              accum=accum, total=total, opt=opt, sched=sched, scaler=scaler, fingerprint=run_fingerprint(run),
              meta={"method": run.method, "name": run.name, "backbone": run.backbone, "seed": seed},
              tracker=tracker if tracker is not None else Tracker(enabled=False), encode_fn=encode_fn)
    job.attention = attention
    job.per_epoch = micro_batches_per_epoch(len(sentences), settings.batch_size)
    if tracker is not None and tracker.run_id:
        job.meta["mlflow_run_id"] = tracker.run_id  # evaluation jobs log their test scores onto this run
    # the dev embedder reads the method's modules by reference: built now, it sees the resumed weights
    job.embedder = method.embedder(pooler, device) if settings.selects_by_dev else None
    job.rank, job.world = distributed.rank(), distributed.world_size()
    method.train()
    job.chunk = resolve_chunk_size(job, micro_batches)
    job.first_chunk = resolve_first_pass(job, micro_batches)
    job.strategy = strategy_for(job)
    job.prefetch = batch_source(job)  # train.workers processes, the prefetch thread or None (sentemb.train.batches)
    if job.embedder is not None:  # train.eval_precision (and larger batches with bf16 on CUDA)
        from ..evaluate.sts import tune_dev_embedder

        tune_dev_embedder(job.embedder, settings.eval_precision, device, settings.dev_max_len)
    if device_before is not None:
        job.restore.append(lambda: torch.cuda.set_device(device_before))
    if put_back is not None:
        job.restore.append(put_back)
    if settings.compile and device.type == "cpu":
        job.restore.append(cpu_deterministic())
    undo = sdpa_backend(attention)  # last: nothing after it can fail and leave the flags set
    if undo is not None:
        job.restore.append(undo)
    return job


def cpu_deterministic() -> Callable[[], None]:
    """A compiled run on the CPU (``train.compile``) with torch's deterministic algorithms on, for the
    job: Inductor's multi-threaded CPU kernels otherwise sum some gradients in an order that varies
    from call to call (1e-8 apart on a tiny BERT with 2 threads), so two runs of one config, or a
    resumed run and the uninterrupted one, differed in their last bits. Returns what puts the flags
    back. On CUDA nothing changes (torch's deterministic mode costs speed there and needs
    ``CUBLAS_WORKSPACE_CONFIG``)."""
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    return lambda: torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def run_fingerprint(run: Run | dict) -> str:
    """The settings a saved state must share to be resumed (and its MLflow run continued):
    ``sentemb.config.settings.fingerprint``, the one definition of "the same training"."""
    from ..config.settings import fingerprint

    return fingerprint(run)


def eval_due(settings: TrainSettings, step: int, accum: int, total: int) -> bool:
    """Whether STS-B dev is evaluated after optimizer step ``step`` (1-based) of ``total``.

    ``train.eval_unit: optimizer_steps`` (default; methods.md §0, SimCSE's code: the HF Trainer's
    ``eval_steps`` counts parameter updates): after every ``eval_steps``-th update.
    ``micro_batches``: ``eval_steps`` counts forward/backward passes over ``batch_size`` sentences,
    ArcCSE §4.1's "training steps" ("update the parameters every 64 steps ... We evaluate our model
    every 125 training steps"). Weights change only at updates, so the check for micro-batch
    k·eval_steps is made after the update that completes it: after step s when a multiple of
    ``eval_steps`` lies in (accum·(s−1), accum·s]. Several multiples in one update give one check.
    ``train.eval_at_end`` adds the last step either way."""
    if not settings.selects_by_dev:
        return False
    if step == total and settings.eval_at_end:
        return True
    every = settings.eval_steps
    if settings.eval_unit == "micro_batches":
        return step * accum // every > (step - 1) * accum // every
    return step % every == 0


def resume(job: Job) -> State:
    """Stage 2, resume: continue from ``.work/last.pt`` if it was saved by this very run (same
    settings); otherwise start afresh (a stale ``.work`` is removed)."""
    import torch

    state_file = job.work / "last.pt"
    st = None
    if job.rank == 0:  # with train.devices > 1 rank 0 decides (and cleans up) before the others read
        st = torch.load(state_file, map_location=job.device, weights_only=False) if state_file.is_file() else None
        if st is not None and st.get("fingerprint") not in (job.fingerprint, legacy_fingerprint(job.run)):
            log.warning("%s was saved by a run with other settings: starting afresh", state_file)
            st = None
        if st is None:
            shutil.rmtree(job.work, ignore_errors=True)
    if job.world > 1:
        from .distributed import barrier, broadcast

        barrier()
        if broadcast(st is not None) and job.rank != 0:
            st = torch.load(state_file, map_location=job.device, weights_only=False)
    if st is None:
        return State()
    job.method.load_state_dict(st["method"])
    job.opt.load_state_dict(st["optimizer"])
    job.sched.load_state_dict(st["scheduler"])
    job.scaler.load_state_dict(st["scaler"])
    state = State(step=st["step"], best=st["best"], history=st["history"])
    _set_rng_state(st["rng"])
    kept = job.work / "best" / "sentemb.json"  # the best export can be newer than the last state save
    if kept.is_file():
        meta_best = json.loads(kept.read_text("utf-8"))
        if meta_best.get("dev_stsb", -math.inf) > state.best["dev"]:
            state.best = {"dev": meta_best["dev_stsb"], "step": meta_best["step"]}
    log.info("resumed from %s at step %d/%d", state_file, state.step, job.total)
    return state




def optimizer_step(job: Job, state: State) -> None:
    """Stage 3, one optimizer step: build the micro-batches, accumulate gradients (twice, at w and
    at w + ε̂, with ``train.sam_rho``), update, then the method's ``after_step`` hook."""
    batches = fetch(job, state)  # timed: train/data_wait (sentemb.train.batches)
    if getattr(job, "world", 1) > 1 and job.settings.dropout_rng == "stream":  # per rank and step (sentemb.train.distributed)
        import torch

        from .distributed import step_seed

        torch.manual_seed(step_seed(job.seed, state.step, job.rank))
    job.method.step = state.step  # what encode/batch_terms read (the strategy sets method.micro per micro-batch)
    begun = getattr(job.method, "before_epoch", None)  # a Method's per-epoch hook (a queue emptied), every process
    if begun is not None and job.per_epoch:
        for epoch in epochs_begun(state.step, job.accum, job.per_epoch):
            begun(epoch)
    job.strategy.gradients(job, batches, state, norms=job.settings.log_grad_norms and logs_at(job, state.step + 1))
    job.strategy.update(job)
    hook = getattr(job.method, "after_step", None)  # a Method's per-step hook, on every process (an EMA, a queue)
    if hook is not None:
        hook(state.step)
    state.step += 1


def check_finite(job: Job, state: State) -> None:
    """Raise on the first non-finite loss since the last check (one device sync per check, so the
    GPU is not stalled every step); runs before every log, evaluation and checkpoint."""
    import torch

    if not state.pending:
        return
    flags = torch.stack([f for _, f, _ in state.pending]).cpu()
    if not bool(flags.all()):
        bad_step, _, terms = state.pending[int((~flags).nonzero()[0])]
        shown = {key: float(v) for key, v in terms.items()}
        advice = ("lower the learning rate or train in fp32 (train.precision)" if job.amp is not None else
                  "the run is fp32 already: look for a term that is not finite by construction (a log of 0, a "
                  "division by 0, an empty mean) in the method, or lower the learning rate")
        raise SentembError(f"run '{job.run.name}' seed {job.seed}: loss is {shown['loss']} at step {bad_step} "
                           f"(terms {shown}); {advice}")
    state.pending.clear()


def logs_at(job: Job, step: int) -> bool:
    """Is the optimizer step that brings the count to ``step`` logged (``train.log_steps``, and the last)?"""
    return step % job.settings.log_steps == 0 or step == job.total


def history_entry(state: State) -> dict:
    """The ``train.json`` history record of the current step (one per step: grad norms, dev score)."""
    if not state.history or state.history[-1]["step"] != state.step:
        state.history.append({"step": state.step})
    return state.history[-1]


def log_step(job: Job, state: State) -> dict:
    """Stage 4, log: mean loss terms since the last log, learning rate, throughput -> MLflow; with
    ``train.log_grad_norms``, the step's per-term gradient norms (also into the history)."""
    check_finite(job, state)
    now = time.perf_counter()
    dt = now - state.t_log
    metrics = {f"train/{key}": float(v) / state.n_terms for key, v in state.sum_terms.items()}
    metrics.update({"train/lr": float(job.sched.get_last_lr()[0]), "train/sentences_per_s": state.n_sent / dt,
                    "train/tokens_per_s": state.n_tok / dt,
                    "train/data_wait": state.data_wait / max(1, state.data_steps)})  # s per step blocked on data
    if state.grad_norms:
        norms = {f"train/grad_norm/{key}": float(v) for key, v in state.grad_norms.items()}
        metrics.update(norms)
        history_entry(state).update(norms)
        state.grad_norms = {}
    job.tracker.log_metrics(metrics, state.step)
    state.sum_terms, state.n_terms, state.n_sent, state.n_tok = {}, 0, 0, 0
    state.data_wait, state.data_steps = 0.0, 0
    state.t_log = now
    return metrics


def evaluate_and_keep(job: Job, state: State) -> float:
    """Stage 5, evaluate and keep: STS-B dev Spearman of the current weights; a new best is
    exported to ``.work/best`` (atomically). Evaluation time is not counted as training time; it is
    priced instead: ``dev/eval_s`` per evaluation in MLflow, ``dev_eval_s`` and ``dev_eval_share``
    in ``train.json`` (the whole stage: encoding, scoring, exporting a new best)."""
    from ..evaluate.sts import stsb_dev

    check_finite(job, state)
    t0 = time.perf_counter()
    if job.prefetch is not None:
        job.prefetch.wait()
    dev = stsb_dev(job.embedder, job.dev_pairs) if job.rank == 0 else None
    if job.world > 1:  # rank 0 evaluates, the others wait for its score: one history, one decision
        from .distributed import broadcast

        dev = broadcast(dev)
    history_entry(state)["dev_stsb"] = dev
    if dev > state.best["dev"]:
        state.best.update(dev=dev, step=state.step)
        if job.rank == 0:
            export_to(job, job.work / "best", {"step": state.step, "dev_stsb": dev})
    job.method.train()
    spent = time.perf_counter() - t0
    state.dev_eval_s += spent
    state.dev_evals += 1
    job.tracker.log_metrics({"dev/stsb_spearman": dev, "dev/best": state.best["dev"], "dev/eval_s": spent}, state.step)
    log.info("step %d: STS-B dev %.2f (best %.2f at step %d; %.2f s)", state.step, dev, state.best["dev"],
             state.best["step"], spent)
    state.t_log += time.perf_counter() - t0
    return dev


def write_card_without_results(model_dir: Path, run: dict, summary: dict) -> None:
    """The exported model's card before any evaluation (``sentemb.report.model_card``: a model is never
    anonymous; rule ``model_card`` adds the results). A failure to write it is logged, not raised:
    it must not cost the trained model."""
    from ..report.model_card import write_export_card

    try:
        write_export_card(model_dir, run, summary)
    except Exception as e:  # noqa: BLE001 - the card is secondary to the weights
        log.warning("run '%s': no model card written (%s: %s); `sentemb model-card` writes it later",
                    run.get("name"), type(e).__name__, e)


def export_to(job: Job, path: Path, extra: dict) -> None:
    with atomic_path(path, is_dir=True) as tmp:
        job.method.export(tmp, job.pooler, meta={**job.meta, "pooler": job.pooler, **extra})


def save_state(job: Job, state: State) -> None:
    """Stage 6, save: everything needed to continue bit-identically (weights, optimizer, schedule,
    scaler, step, best, history, RNG states), written atomically to ``.work/last.pt``."""
    import torch

    check_finite(job, state)  # never checkpoint weights that a non-finite loss has touched
    if job.rank != 0:  # the weights are the same on every rank; rank 0 saves them
        return
    with atomic_path(job.work / "last.pt") as tmp:
        torch.save({"fingerprint": job.fingerprint, "method": job.method.state_dict(), "optimizer": job.opt.state_dict(),
                    "scheduler": job.sched.state_dict(), "scaler": job.scaler.state_dict(), "step": state.step,
                    "best": state.best, "history": state.history, "rng": _rng_state()}, tmp)


def finish(job: Job, state: State, t_start: float) -> dict:
    """Stage 7, finish: the best checkpoint (or, with ``model_selection: last``, the final weights)
    becomes ``model/``; ``train.json`` summarises the run."""
    check_finite(job, state)
    if not job.settings.selects_by_dev:
        if job.rank == 0:
            export_to(job, job.work / "best", {"step": state.step})
        state.best = {"dev": None, "step": state.step}
    summary_extra = {"devices": job.world} if job.world > 1 else {}
    if job.rank != 0:  # only rank 0 writes
        return {**job.meta, "steps": job.total, "best_step": state.best["step"], "best_dev_stsb": state.best["dev"],
                "history": state.history, **summary_extra}
    if not (job.work / "best").is_dir():
        raise SentembError(f"run '{job.run.name}': no checkpoint was evaluated (set train.eval_at_end: true)")
    from ..report.model_card import training_provenance

    seconds = time.perf_counter() - t_start
    summary = {
        **job.meta, "steps": job.total, "best_step": state.best["step"], "best_dev_stsb": state.best["dev"],
        "history": state.history, "train_seconds_this_process": round(seconds, 2),
        **cost_summary(job, state, seconds),
        "pooler": job.pooler, "device": str(job.device), "precision": str(job.amp or "fp32"),
        "attention": job.attention, "chunk_size": job.chunk or job.settings.batch_size, "chunked": job.chunk is not None,
        **({"first_pass": job.first_chunk or "whole"} if job.chunk is not None and job.method.has_batch_terms else {}),
        **graphs_summary(job.strategy),
        **summary_extra,
        "provenance": training_provenance(job.run.to_dict(), len(job.sentences)),  # commit, corpus digest (the card)
    }
    with atomic_path(job.out_dir / "model", is_dir=True) as tmp:
        shutil.rmtree(tmp)
        shutil.copytree(job.work / "best", tmp)
        write_card_without_results(tmp, job.run.to_dict(), summary)
    write_json(job.out_dir / "train.json", summary)
    costs = {k: v for k, v in summary.items() if k in COST_METRICS}
    job.tracker.log_metrics({COST_METRICS[k]: v for k, v in costs.items()}, job.total)
    evaluated_last = bool(state.history) and state.history[-1]["step"] == job.total and "dev_stsb" in state.history[-1]
    if state.best["dev"] is not None and not evaluated_last:  # the curve reaches the last step (logged once there)
        job.tracker.log_metrics({"dev/best": state.best["dev"]}, job.total)
    job.tracker.log_artifact(job.out_dir / "train.json")
    job.tracker.set_tags({"best_step": state.best["step"]})
    return summary


#: train.json's cost keys -> their MLflow metric (logged once, at the last step)
COST_METRICS = {"data_wait_s": "train/data_wait_total_s", "data_wait_s_per_step": "train/data_wait_s_per_step",
                "dev_eval_s": "dev/eval_total_s", "dev_eval_share": "dev/eval_share"}


def cost_summary(job: Job, state: State, seconds: float) -> dict:
    """What this process's run spent waiting for data and in dev evaluation (``train.json``):
    ``data_wait_s`` (total), ``data_wait_s_per_step`` (over the steps this process ran),
    ``workers`` (``train.workers``), ``dev_eval_s`` (every evaluate-and-keep stage), ``dev_evals``,
    ``dev_eval_share`` (of ``seconds``, this process's wall time of the loop) and ``eval_precision``."""
    return {"workers": job.settings.workers, "data_wait_s": round(state.data_wait_total, 4),
            "data_wait_s_per_step": round(state.data_wait_total / max(1, state.steps_run), 6),
            "dev_eval_s": round(state.dev_eval_s, 3), "dev_evals": state.dev_evals,
            "dev_eval_share": round(state.dev_eval_s / seconds, 4) if seconds > 0 else 0.0,
            "eval_precision": job.settings.eval_precision}


def train(run: Run | dict, out_dir: str | Path, *, progress: bool = True, stop_after: int | None = None,
          method_cls: "type[Method] | None" = None) -> dict:
    """Train one run (a resolved run, see ``sentemb.config.load.resolve_run``) into ``out_dir``.

    ``stop_after`` ends the process-equivalent of a kill after that many optimizer steps (tests).
    ``method_cls`` replaces the registered class of ``run.method`` (a pretraining stage,
    ``Method.pretrain_stage``, runs this loop with that Method subclass and ``model_selection: last``).
    """
    from ..config.studies import study_tags
    from ..tracking.runs import Tracker

    run = Run.from_dict(run)
    out_dir = Path(out_dir)
    seed = int(run.seed)
    meta = {"method": run.method, "name": run.name, "backbone": run.backbone, "seed": seed}
    # train.devices > 1: one of several processes (sentemb.train.distributed); only rank 0 tracks and writes
    lead = run.train.devices == 1 or int(os.environ.get("RANK", "0")) == 0
    # The MLflow run is opened first, so that bad input also ends as a FAILED run with the error. A
    # job that will resume its own saved state continues its own run (see Tracker's `marker`).
    tracker = Tracker(uri=run.tracking.uri, experiment=run.experiment,
                      enabled=lead and run.tracking.enabled,
                      run_name=run.run_name or f"train/{run.name}/{run.backbone}/seed{seed}",
                      tags={**meta, "rule": run.rule or "train", **study_tags(run)}, params=run.to_dict(),
                      marker=out_dir / ".mlflow_run.json", key=run_fingerprint(run),
                      resume=(out_dir / ".work" / "last.pt").is_file(), wait_s=run.tracking.wait_s)
    with tracker:
        corpus = Path(run.paths.get("corpus") or "")
        if corpus.is_file() and not tracker.continued:  # lineage: the Dataset column in MLflow
            tracker.log_dataset(corpus, name=run.corpus or corpus.stem)
        with setup(run, out_dir, method_cls, tracker) as job:
            state = resume(job)
            bar = None
            if progress and lead:
                from tqdm import tqdm

                bar = tqdm(total=job.total, initial=state.step, desc=f"train {run.name}", unit="step",
                           file=sys.stderr, mininterval=1 if sys.stderr.isatty() else 30)
            t_start = state.t_log = time.perf_counter()
            for _ in run_steps(job, state, bar=bar):
                if stop_after is not None and state.step >= stop_after and state.step < job.total:
                    save_state(job, state)
                    raise KeyboardInterrupt(f"stopped after {state.step} steps (test hook)")
        if bar is not None:
            bar.close()
        summary = finish(job, state, t_start)
    if lead:
        shutil.rmtree(job.work, ignore_errors=True)
    return summary


def run_steps(job: Job, state: State, steps: int | None = None, bar=None) -> Iterator[State]:
    """The loop, yielding ``state`` after each optimizer step: up to ``steps`` more steps (default:
    until ``job.total``), each followed, when due, by its log, evaluate-and-keep and save stages.
    ``train`` drives it; so do the benchmarks and the tests, which thus run the loop's own code."""
    end = job.total if steps is None else min(job.total, state.step + steps)
    while state.step < end:
        optimizer_step(job, state)
        if bar is not None:
            bar.update(1)
        if logs_at(job, state.step):
            metrics = log_step(job, state)
            if bar is not None:
                bar.set_postfix(loss=f"{metrics['train/loss']:.4f}")
        if eval_due(job.settings, state.step, job.accum, job.total):
            evaluate_and_keep(job, state)
        if state.step % job.settings.save_steps == 0 and state.step != job.total:
            save_state(job, state)
        yield state
