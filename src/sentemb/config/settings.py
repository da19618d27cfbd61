"""Every workflow setting with a default, declared once (``arg``: default, type, allowed values,
bounds, one-line help). ``Config`` is the whole configuration as one typed tree: the config schema
is generated from it (``sentemb.config.load.load_schema``), ``config/README.md`` too (``sentemb
config-keys``), and the code reads the typed objects: ``Config.of`` of a validated config,
``TrainSettings`` in the training loop, ``Run`` for one resolved job.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .. import SentembError
from .fields import arg, build, check_mapping, default_of, schema_of, to_dict

#: numpy's and torch's seeds are unsigned 32-bit integers (``seeds``, ``runs[].seeds``, ``studies[].seeds``)
SEED_MAX = 2**32 - 1
#: the declared bounds of every seed setting (of each item, for a list of seeds)
SEED_BOUNDS = {"minimum": 0, "maximum": SEED_MAX}

SHA256 = "^[0-9a-f]{64}$"
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "avg_static_last")
STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")


@dataclass
class TrainSettings:
    """Config key ``train`` (and each ``runs[].train``, which overrides it key by key): the shared
    training loop's settings (``sentemb.train.loop``); hyperparameter defaults as in methods.md §0."""

    epochs: float = arg(1, "passes over the corpus (fractions allowed)", exclusive_minimum=0)
    max_steps: int | None = arg(None, "stop after this many optimizer steps (null = epochs decide)", minimum=1)
    batch_size: int = arg(64, "sentences per micro-batch (the in-batch negatives)", minimum=2)
    grad_accum: int = arg(1, "micro-batches per optimizer step", minimum=1)
    fuse_micro_batches: int = arg(
        1,
        "Encode this many of a step's grad_accum micro-batches in one forward and backward (sentemb.train.step.Fused): "
        "the encoder sees their rows at once, padded to the widest, and each micro-batch keeps its own in-batch "
        "terms, so the gradient is the accumulated one (dropout off: to rounding; the method contract's check "
        "fused). The host's per-pass cost, the eager step's floor on a GPU (docs/plan-and-benchmarks.md), is paid "
        "once per group instead of once per micro-batch. Must divide grad_accum; for methods that declare "
        "Method.fusable (simcse, arccse), with dropout_rng stream, one device and no chunk_size. With "
        "graphs, each group of fused micro-batches is one captured graph; with compile, the encoder's forward over "
        "the group is the compiled one (the terms stay eager). With "
        "dropout on, the stream draws the masks of the fused rows at once: another random run, as unpad is.",
        minimum=1)
    lr: float = arg(3.0e-5, "peak learning rate of AdamW", exclusive_minimum=0)
    weight_decay: float = arg(0.0, "AdamW weight decay (not on biases and LayerNorm weights)", minimum=0)
    optimizer: str = arg(
        "adamw", "adamw - torch.optim.AdamW (fused on CUDA); adamw_hf - the AdamW of transformers 4.2.1, which the HF "
        "Trainer of the SimCSE family's code (SimCSE, PaSeR, InfoCSE) steps with: epsilon added to sqrt(v) before "
        "the bias correction (an effective epsilon of eps/sqrt(1-beta2^t), 3.2e-7 at step 1) and weight decay after "
        "the update (sentemb.train.optim.HFAdamW). Needs update: separate.", choices=("adamw", "adamw_hf"))
    warmup_ratio: float = arg(0.0, "share of the optimizer steps with a linear warm-up", minimum=0, maximum=1)
    lr_schedule: str = arg("linear", "learning rate after warm-up: linear decay to 0 or constant",
                           choices=("linear", "constant"))
    grad_clip: float | None = arg(1.0, "clip the gradient norm at this value (null = no clipping)", exclusive_minimum=0)
    update: str = arg(
        "separate",
        "How the optimizer step applies grad_clip (sentemb.train.step.apply_update). separate - clip_grad_norm_ scales "
        "every gradient, then AdamW steps (the HF Trainer's order; fused AdamW on CUDA); fused - the total norm is taken "
        "and its clip factor handed to fused AdamW as its grad_scale, which divides each gradient by 1/factor inside the "
        "optimizer's own kernel: one read of all gradients fewer and a few ops fewer for the host (measured on an "
        "H200: -0.1 ms a step; docs/gpu/h200-2026-11-28b.md), the same update to rounding (a division by the "
        "reciprocal: one ulp on about half the elements), hence a weights setting. Runs torch's fused AdamW on any "
        "device (CPU too). Refused with precision fp16 (the grad scaler owns grad_scale). graphed - separate's "
        "update (clip_grad_norm_, fused AdamW, the gradients zeroed) captured as one CUDA graph beside the "
        "micro-batches' (sentemb.train.step.UpdateGraphs), replayed once a step, the learning rate a float32 device "
        "tensor that the schedule fills (another run to rounding: a relative 1e-8 on the rate); on a CPU the same "
        "update eagerly. Needs graphs (which refuse precision fp16).",
        choices=("separate", "fused", "graphed"))
    max_len: int = arg(32, "truncate sentences to this many tokens", minimum=4)
    eval_steps: int = arg(125, "STS-B dev evaluation every this many eval_unit", minimum=1)
    eval_unit: str = arg(
        "optimizer_steps",
        "What eval_steps counts. optimizer_steps - parameter updates (the HF Trainer's global step, SimCSE's code, "
        "methods.md §0). micro_batches - forward/backward passes of batch_size sentences, ArcCSE §4.1's \"training "
        "steps\" (\"update the parameters every 64 steps ... evaluate every 125 training steps\"); each check is made "
        "after the update that completes micro-batch k*eval_steps (weights change only at updates). The same with "
        "grad_accum 1.", choices=("optimizer_steps", "micro_batches"))
    eval_at_end: bool = arg(True, "also evaluate after the last step")
    eval_precision: str = arg(
        "fp32",
        "Precision of the STS-B dev evaluation that selects the checkpoint. fp32 - as before (batches of 128); bf16 - "
        "bf16 autocast on any device, in batches of 512 on CUDA; auto - bf16 on CUDA, fp32 elsewhere. bf16 scores "
        "agree with fp32 to about 0.01 on STS, but a near tie can keep another checkpoint, so it is a weights "
        "setting (fp32 is its value before it existed: ADDED_DEFAULTS). Its cost is in train.json "
        "(dev_eval_s, dev_eval_share).", choices=("fp32", "bf16", "auto"))
    dev_max_len: int | None = arg(
        None, "Truncation, in tokens, of the STS-B dev sentences of the evaluation that selects the checkpoint. "
        "null - the model's maximum (SentEval as SimCSE's code calls it: no truncation short of 512); an integer - "
        "that many tokens, special ones included (UNA's code: its max_len, 32). A weights setting: it changes "
        "which checkpoint is kept (null is its value before it existed: ADDED_DEFAULTS).", minimum=3)
    log_steps: int = arg(10, "log the mean loss terms every this many optimizer steps", minimum=1, weights=False)
    save_steps: int = arg(250, "save the resume state every this many optimizer steps", minimum=1, weights=False)
    precision: str = arg("auto", "auto = bf16 autocast on CUDA, fp32 elsewhere; bf16, fp16 (with a gradient "
                         "scaler) or fp32 everywhere", choices=("auto", "bf16", "fp16", "fp32"))
    tf32: bool = arg(
        True, "On CUDA, fp32 matmuls (an fp32 run's encoder, the fp32 losses and logits under autocast, the fp32 "
        "STS-B dev evaluation) in TF32 (torch.set_float32_matmul_precision('high')); false - IEEE fp32 matmuls and "
        "cuDNN convolutions ('highest', cudnn.allow_tf32 off). The authors' code ran on torch 1.7-1.11, whose "
        "default was TF32 matmuls on an Ampere GPU (allow_tf32 True until 1.12) and IEEE fp32 on older ones: UNA's "
        "RTX 2080 Ti (App. C.4) has no TF32, so una-code sets false. Other rounding, hence a weights setting (true "
        "is its value before it existed: ADDED_DEFAULTS); no effect on a CPU.")
    dropout: float | None = arg(None, "encoder dropout (null = the backbone's own)", minimum=0, maximum=1)
    device: str = arg("auto", "auto (CUDA if available), cpu, cuda, cuda:N", weights=False)
    num_threads: int | None = arg(None, "torch CPU threads (null = torch's default)", minimum=1, weights=False)
    compile: bool = arg(False, "torch.compile the method's forward and losses (dropout drawn as in eager mode, so the "
                        "losses match an eager run to fp32 tolerance; see `sentemb benchmark --compile`). With dropout_rng counter "
                        "each dropout runs outside the compiled code (a graph break; sentemb.model.dropout.compile_safe), "
                        "which costs no host time inside graphs: true, but keeps Inductor from fusing the mask with its "
                        "neighbours; counter_kernel inline traces it instead (no break). keyed is refused, and with counter "
                        "so is torch's nn.MultiheadAttention with attention dropout (PaSeR's default decoder). A step whose "
                        "per-term gradient norms are logged (log_grad_norms) runs eagerly. On the CPU the job runs with "
                        "torch's deterministic algorithms (Inductor's multi-threaded CPU backward otherwise varies by "
                        "~1e-8 from call to call), so a compiled run repeats and resumes bit for bit, batches of several "
                        "widths included (checked in separate processes). On CUDA, where batches have several widths, a "
                        "resumed process compiles its first width statically where the uninterrupted one may reuse its "
                        "dynamic-shape kernels: it may equal it only to fp32 rounding (unmeasured).")
    compile_mode: str = arg(
        "default",
        "With compile: torch.compile's mode. default - Inductor's heuristics; max-autotune-no-cudagraphs - Inductor "
        "times candidate kernels for each matmul and fuses pointwise work into Triton matmul templates where they win "
        "(longer compilation, cached per machine; its CUDA graphs are train.graphs' own, so Inductor's are off). "
        "Other kernels round differently, hence a weights setting. Refused without compile.",
        choices=("default", "max-autotune-no-cudagraphs"))
    compile_random: str = arg(
        "eager",
        "With compile and dropout_rng stream: who draws the dropout masks inside the compiled code. eager - torch's "
        "own dropout kernels from the global generator (Inductor's fallback_random), so a compiled run sees the "
        "masks and losses of an eager one; inductor - Inductor's Philox draws them inside its fused kernels (no mask "
        "kernel and no mask tensor per dropout site: faster), other masks, so another random run, like "
        "train.unpad (measured on an H200: no faster, +0.2 ms at batch 64, +1.3 at 512). Refused with dropout_rng "
        "counter or keyed (their masks are hashed outside the compiled code), and without compile.",
        choices=("eager", "inductor"))
    attention: str = arg(
        "auto",
        "The encoder's attention kernels. auto - sdpa_efficient on a CUDA device, sdpa elsewhere and with unpad "
        "(measured on an H200, BERT-base bf16 at max_len 32, graphed and compiled: batch 64 10.9 -> 10.1 ms a "
        "step, batch 512 54.5 -> 49.3 ms; compiled without graphs 29.8 -> 21.5 and 54.2 -> 49.2 ms; "
        "docs/gpu/h200-2026-11-28c.md; longer rows unmeasured); sdpa - torch's scaled_dot_product_attention, "
        "torch picking the kernel (on an H100/H200 cuDNN's: at max_len 32 it took 24% of BERT-base's compiled "
        "step, 12.4 of 52.6 ms at batch 512, docs/gpu/h200-2026-11-28b.md; the default before auto existed); "
        "sdpa_efficient - the same function restricted to the memory-efficient kernel (math where it cannot "
        "serve); sdpa_math - restricted to its math form (two batched matmuls and a softmax, which train.compile "
        "fuses with the mask and dropout; torch computes it in fp32 for bf16 inputs: 10.7 and 51.4 ms on the H200); "
        "eager - Hugging Face's eager attention (the same arithmetic through its own mask; some transformers "
        "versions build that mask from host data, which train.graphs refuses, naming the op). The same attention "
        "to rounding; with dropout_rng stream the attention-probability masks are drawn by another kernel "
        "(another random run), hence a weights setting, and auto is its own value in the fingerprint (a state "
        "saved with sdpa does not resume under auto, on any device). The backend restriction holds for the job's "
        "process while the job runs. Refused with unpad except sdpa and auto (its packed forward has its own "
        "attention).",
        choices=("auto", "sdpa", "sdpa_efficient", "sdpa_math", "eager"))
    token_cache: bool = arg(True, "Tokenize the corpus once (rule tokenize, results/stats/<corpus>/tokens.<backbone>/, "
                            "memory-mapped) instead of on every step; batches are identical either way.", weights=False)
    prefetch: bool = arg(True, "Build the next step's batches in a background thread (pinned memory on CUDA) while "
                         "the current step computes; batches are identical either way.", weights=False)
    unpad: bool = arg(False, "Padding-free training forward (BERT-family encoders, sentemb.model.unpad) - the encoder runs "
                      "on the real tokens only. Same outputs with dropout off; with dropout on the masks are drawn over "
                      "fewer positions, so it is another random run (hence off by default).")
    model_selection: str = arg("best_dev", "best_dev keeps the checkpoint with the best STS-B dev score (methods.md "
                               "§0); last keeps the final weights and skips dev evaluation (e.g. pretraining stages).",
                               choices=("best_dev", "last"))
    sam_rho: float | None = arg(None, "Sharpness-Aware Minimization radius ρ (Foret et al. 2021; ArcCSE uses 0.05); "
                                "null = plain AdamW. Each step computes the gradient twice (about 2x the cost); "
                                "refused with precision fp16.", exclusive_minimum=0)
    sampler: str = arg(
        "random",
        "Order of the training sentences. random - a fresh seeded permutation per epoch cut into batches (SimCSE). "
        "length - ArcCSE §4.1's \"the sentences are sampled by length\": per epoch the sentences sorted by whitespace "
        "word count (ties in a seeded random order) are cut into batches of neighbours and the batch order is "
        "shuffled; every sentence once per epoch, deterministic in (corpus, seed), the same with token_cache on or "
        "off. Changes the in-batch negatives, so it is part of what a resumed state must share.",
        choices=("random", "length"))
    log_grad_norms: bool = arg(
        False,
        "On every log step, log the L2 norm of each weighted loss term's gradient (as the term enters the total loss) "
        "on the encoder's parameters (SARCSE - encoder + TextCNN) as train/grad_norm/<term> in MLflow and in "
        "train.json's history (sentemb.train.grad_norms). The weights are bit-identical with it on or off; works with "
        "grad_accum, sam_rho and autocast. With compile a logged step runs eagerly (the weights then differ from the "
        "run without it by fp32 rounding; with compile_random inductor that step's masks are torch's). Cost, on logged steps only - one partial backward per term (none for a "
        "one-term method); MiniLM, batch 64, CPU, +0 ms for simcse, +12.4 s = +108% of a step for sarcse's 3 terms, "
        "i.e. +11% of training time at log_steps 10 (sentemb benchmark --grad-norms).", weights=False)
    chunk_size: int | str | None = arg(
        None,
        "Gradient caching (Gao et al. 2021; sentence-transformers' Cached* losses): encode each micro-batch this many "
        "sentences at a time, first without a graph, then again per chunk with its random state replayed, "
        "back-propagating the in-batch terms' gradient cached on the whole batch's embeddings. The gradient is the "
        "unchunked one (same negatives: the whole batch_size) in bounded memory, for one extra forward pass. null = "
        "the whole micro-batch in one forward (no caching); auto = the fastest chunking that fits the GPU's free "
        "memory with a margin: the fewest chunks, of equal size (the whole batch on CPU), reported in the log and train.json. A state saved with one chunk "
        "size resumes with another. With graphs, any chunk_size (auto too, also on the CPU) needs dropout_rng "
        "counter.", minimum=1, pattern="^auto$", weights=False)
    chunk_first_pass: str = arg(
        "auto",
        "With chunk_size, the pieces gradient caching's graph-free first pass encodes the batch in (it keeps no "
        "activations, only the embeddings, so it can take far more sentences than a chunk with its graph; "
        "sentemb.train.step.first_pass_bounds). chunks - chunk by chunk (the only choice with dropout_rng stream, whose "
        "masks are recorded per chunk and replayed); whole - the whole micro-batch (this process's share) in one "
        "forward; auto - whole with dropout_rng keyed or counter (their masks do not depend on the chunking), on CUDA "
        "in the fewest pieces that fit the free memory (measured), chunks with stream. The same embeddings to rounding "
        "either way; the choice is logged and written to train.json (first_pass).", choices=("auto", "chunks", "whole"),
        weights=False)
    devices: int = arg(
        1,
        "Processes (one GPU each; gloo processes on CPU) one training job runs as: torchrun --standalone "
        "--nproc-per-node N, started by `sentemb train` itself. batch_size stays the global batch; each process "
        "encodes its share and the in-batch terms see every process's embeddings, gathered with their gradient "
        "(sentemb.train.distributed). The Snakefile requests N GPUs for the job.", minimum=1, weights=False)
    dropout_rng: str = arg(
        "stream",
        "Where dropout masks come from. stream - torch's global generator (fast; with chunk_size each chunk's masks "
        "are drawn when the chunk is encoded, so they are not those of an unchunked run, only distributed alike). "
        "keyed - every mask is a function of (seed, micro-batch, sentence, view, dropout call) (sentemb.model.dropout), so "
        "chunk_size gives exactly the unchunked gradient with dropout on; several times slower dropout, CPU-generated "
        "(for checks and CPU runs). counter - the same keys hashed on the tensor's own device with integer tensor ops "
        "(no generator state, no host round trip; a position's mask does not depend on the padded width, so buckets "
        "leave it alone): chunked, sharded and bucketed runs equal the plain one with dropout on. Other masks than "
        "keyed's and stream's, so another random run.", choices=("stream", "keyed", "counter"))
    counter_kernel: str = arg(
        "auto",
        "How dropout_rng counter computes its masks (sentemb.model.dropout.counter_keep_mask); the same bits either way. "
        "eager - ~10 int64 tensor ops per coordinate over the whole mask (memory-bound: +10 ms per BERT-base step at "
        "batch 64 on an H200); fused - the same hash through torch.compile, one kernel per mask (compiled once per "
        "process, a few seconds); inline - the same hash traced with the encoder under compile (no graph break at "
        "each dropout, so Inductor fuses the hash into the kernels around it; without compile, eager's ops; GPU time "
        "unmeasured: gpu-check's tune rows); auto - fused on CUDA, eager elsewhere.",
        choices=("auto", "eager", "fused", "inline"),
        weights=False)
    buckets: list | str | None = arg(
        "auto",
        "Bounded step shapes (sentemb.data.buckets): every variable width of a batch (the sentences, ArcCSE's triplet "
        "rows, PaSeR's decoder rows, ...) is padded up to the smallest of a few widths instead of to its longest row, "
        "so one epoch meets a handful of kernel shapes. auto - 24, 32, 48, 64, 96, 128, 256, 512 cut at max_len (a "
        "group that may pass max_len, such as ArcCSE's triplets, goes on in half-octaves up to its own limit), on "
        "CUDA only (on a CPU padding is pure cost); none - pad to the longest row; a list of widths - those, on every "
        "device. Padded positions are masked, so the real tokens' results are the same; with dropout_rng stream the "
        "masks are drawn over the padded shape (another random run, as chunk_size).", weights=False,
        schema=lambda: {"oneOf": [{"type": "string", "enum": ["auto", "none"]}, {"type": "null"},
                                  {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1}]})
    graphs: bool = arg(
        False,
        "Replay each micro-batch's forward and backward as a CUDA graph (sentemb.train.graphs; issue 37): captured once "
        "per batch shape (the widths of buckets), so the host no longer dispatches ~4,300 ops a step. Needs graph-safe "
        "methods (no host reads of device values, host-built tensors or Python state changed inside the step: refused "
        "naming the op or attribute and the line; a method that keeps state hands tensors to after_step with "
        "Method.stash) "
        "and dropout_rng stream or counter (counter with chunk_size). On a CPU the same static-shape step runs eagerly "
        "(what CI tests). With stream dropout a graphed run draws other masks than an eager one: another random run "
        "(counter masks are the same). With compile, the graph replays the compiled (fused) kernels. Refused with unpad, "
        "precision fp16, dropout_rng keyed, and devices > 1 on CUDA.")
    workers: int = arg(
        0,
        "Processes that build the batches (sentemb.train.batches): 0 - in the loop's process (a background thread "
        "with prefetch, else in line); N - N worker processes building the next steps' micro-batches ahead. Batches "
        "are a function of (seed, micro-batch), so the weights are the same either way. The wait for data is logged "
        "as train/data_wait (seconds per step). The workers are forked once the model is loaded; so that no thread "
        "ends while the job forks (the child could hang), such a job loads checkpoints in the calling thread "
        "(HF_DEACTIVATE_ASYNC_LOAD=1 in its environment unless set) and runs no tqdm monitor thread "
        "(sentemb.utils.no_thread_churn).",
        minimum=0, weights=False)
    worker_timeout: float = arg(
        300,
        "With workers > 0: the seconds the loop waits for one step's batches from the worker processes before it "
        "stops with an error naming this key, the step and the workers' process ids (a worker that dies is reported "
        "at once; this catches one that hangs, which would otherwise hold the job, and its GPU, for good). "
        "0 - wait without limit. A step's batches take milliseconds to build (PaSeR's, the slowest, about 0.3 s), "
        "so the default leaves room for a loaded machine; it is below NCCL's 10-minute collective timeout, so with "
        "devices > 1 the hung rank's error, not the other ranks' collective timeout, ends the job.",
        minimum=0, weights=False)

    @classmethod
    def from_dict(cls, values: dict | None, where: str = "train") -> TrainSettings:
        """Settings from a mapping (a run config's ``train``); unknown keys and wrong types name the key."""
        check_mapping(cls, values or {}, where, "train")
        return build(cls, values)

    def to_dict(self) -> dict:
        """The mapping form, in declaration order."""
        return to_dict(self)

    @property
    def selects_by_dev(self) -> bool:
        """Is the kept checkpoint chosen by STS-B dev (``model_selection: best_dev``)?"""
        return self.model_selection == "best_dev"

    def check(self, key: str) -> None:
        """What the schema cannot say of one run's settings; ``key`` prefixes the message (the
        config key or the run). The combinations no step strategy serves are refused by
        ``sentemb.train.step.check_settings``."""
        if isinstance(self.chunk_size, str) and self.chunk_size != "auto":
            raise SentembError(f"{key}: train.chunk_size {self.chunk_size!r} is not a number of sentences, auto or null")
        from ..data.buckets import resolve_buckets

        resolve_buckets(self.buckets, self.max_len, "cuda", f"{key}: train.buckets")
        if self.dropout_rng in ("keyed", "counter") and self.unpad:
            raise SentembError(f"{key}: train.dropout_rng {self.dropout_rng} needs padded rows (one per sentence view); it "
                               "cannot be combined with train.unpad (packed tokens)")
        from ..train.step import check_settings

        check_settings(self, key)


@dataclass
class PretrainStage:
    """The keys of a method's pretraining block (``methods.<method>.pretrain``) that are neither
    ``train`` keys nor the method's own: read by ``sentemb.train.pretrain.resolve_pretrain``."""

    corpus: str | None = arg(None, "corpus of the stage (a name under resources/corpus; null = corpus.name)")
    seed: int = arg(42, "seed of the stage", **SEED_BOUNDS)


@dataclass
class EvaluationSettings:
    """Config key ``evaluation``: test-time STS and transfer evaluation (``sentemb evaluate``)."""

    data: str = arg("senteval", "STS data: SentEval's tokenized sets or the sets as originally published",
                    choices=("senteval", "senteval-raw"))
    tasks: list[str] = arg(list(STS_TASKS), "STS tasks evaluated", choices=STS_TASKS)
    setting: str = arg("all", "SentEval's aggregation of STS12-16 subsets", choices=("all", "mean", "wmean"))
    batch_size: int = arg(128, "sentences per encoding batch", minimum=1)
    pooler: str | None = arg(None, "Override the method's evaluation pooler.", choices=(None, *POOLERS, "method"))
    precision: str = arg("fp32", "Test-time encoding (STS, transfer). fp32 (default) on every device, as SentEval and "
                         "the papers encode and as the loop's dev selection does; bf16 = autocast on any device; "
                         "auto = bf16 on CUDA only. bf16/auto are faster but not the published protocol.",
                         choices=("auto", "bf16", "fp32"))
    transfer: bool = arg(False, "Also run the SentEval transfer tasks per run (eval_transfer.json, "
                         "results/table_transfer.csv).")
    transfer_tasks: list[str] = arg(list(TRANSFER_TASKS), "SentEval transfer tasks", choices=TRANSFER_TASKS,
                                    min_items=1)
    baseline_transfer: bool = arg(True, "The untrained baselines (config baselines) also get the transfer tasks when "
                                  "some run does (their rows in results/table_transfer); false: only the runs "
                                  "(two fewer jobs per baseline)")
    mrpc_features: str = arg("paper", "MRPC pair features: paper = [u, v, |u-v|, u*v] (methods.md), code = "
                             "[|u-v|, u*v] (SentEval's code).", choices=("paper", "code"))
    transfer_classifier: str = arg(
        "pytorch",
        "Transfer classifier (an open choice, sentemb.evaluate.transfer): pytorch = SentEval's usepytorch=True path with "
        "SimCSE's evaluation.py config (nhid 0, adam, batch 64, tenacity 5, epoch_size 4, l2reg 1e-5..1e-2), what the "
        "published SimCSE/InfoCSE transfer numbers came from; sklearn = SentEval's LogisticRegression path (faster; "
        "see docs/evaluation.md for the cost of each).", choices=("pytorch", "sklearn"))


@dataclass
class ParaphraserModel:
    """The seq2seq paraphraser, fetched like a backbone (``sentemb fetch-model``)."""

    hub_id: str = arg("tuner007/pegasus_paraphrase", "Hugging Face model id")
    revision: str | None = arg(None, "revision of the model (null = the default branch)")
    mirror_path: str | None = arg(None, "Path under the mirror; null means models/<last part of hub_id>.")
    sha256: str | None = arg(None, "sha256 of the weights file", pattern=SHA256)
    random_init: dict | None = arg(None, "Build a random seq2seq model from these HF config keys (model_type pegasus; "
                                   "set eos_token_id / decoder_start_token_id from the tokenizer) and the fetched "
                                   "tokenizer, for tests and throughput benchmarks.")


@dataclass
class ParaphraseSettings:
    """Offline paraphrases of every corpus sentence (UNA positives); GPU jobs."""

    enabled: bool | None = arg(None, "Paraphrase the corpus (and summarise it). null = only when "
                               "tfidf_with_paraphrases is set or a run's method requires \"paraphrases\" or "
                               "\"tfidf_para\". Other corpora of runs (runs[].corpus) are paraphrased only when a run "
                               "on them needs it.")
    model: ParaphraserModel = arg(ParaphraserModel(), "The seq2seq paraphraser, fetched like a backbone "
                                  "(sentemb fetch-model).")
    shards: int = arg(4, "Separate GPU jobs (lines i::shards).", minimum=1)
    batch_size: int = arg(32, "sentences per generation batch", minimum=1)
    num_beams: int = arg(10, "beam search width", minimum=1)
    max_length: int = arg(60, "Max generated tokens.", minimum=2)
    precision: str = arg("bf16", "Generation on CUDA: bf16 autocast (about twice as fast), or fp32 as the UNA "
                         "authors' data/augment/paraphrase.py generates (another beam may win where scores are "
                         "close). On the CPU always fp32. Shared by every run on the corpus.", choices=("bf16", "fp32"))


@dataclass
class StatsSettings:
    """Config key ``stats``: corpus statistics (stage ``stats``, shared/docs/methods.md §1-3),
    computed once per corpus under <results_dir>/stats/<corpus>/ and only read by training jobs."""

    rake_top_k: int = arg(5, "RAKE phrases kept per sentence (PaSeR); ablations with a smaller k read a prefix.",
                          minimum=1)
    tfidf_with_paraphrases: bool = arg(False, "Compute tfidf.parquet over corpus + paraphrases (UNA's second "
                                       "vocabulary) instead of the corpus alone; tfidf_para.parquet (corpus + "
                                       "paraphrases) can be requested either way.")
    paraphrase: ParaphraseSettings = arg(ParaphraseSettings(), "Offline paraphrases of every corpus sentence (UNA "
                                         "positives); GPU jobs.")
    corpus_report: bool = arg(False, "Build every statistic of each training corpus and its summary "
                              "(summary.md/.json, in the Snakemake report) for `snakemake all`, also those no configured "
                              "run reads (token_freq, tfidf, rake, paraphrases). false: `all` builds only what the runs' "
                              "methods require (Method.requires); `snakemake stats` builds everything either way.")

    @classmethod
    def from_dict(cls, values: dict | None) -> StatsSettings:
        check_mapping(cls, values or {}, "stats", "stats")
        return build(cls, values)

    def to_dict(self) -> dict:
        return to_dict(self)


@dataclass
class Resources:
    """Snakemake resources of one rule kind."""

    gpu: int = arg(0, "GPUs per job", minimum=0)
    runtime: int = arg(60, "minutes per job", minimum=1)
    mem_mb: int = arg(16000, "memory per job in MB", minimum=1)
    cpus: int = arg(4, "threads per job", minimum=1)


@dataclass
class JobResources:
    """Config key ``job_resources``: Snakemake resources per rule kind (gpu, runtime in minutes,
    mem_mb, cpus); a key left out of a kind takes that kind's default."""

    train: Resources = arg(Resources(gpu=1, runtime=240, mem_mb=32000, cpus=8), "rule train")
    evaluate: Resources = arg(Resources(gpu=1, runtime=60, mem_mb=16000, cpus=4), "rules evaluate, encode_transfer, "
                              "evaluate_baseline, encode_baseline_transfer: encoding on the GPU")
    classify: Resources = arg(Resources(gpu=0, runtime=60, mem_mb=16000, cpus=4), "rules evaluate_transfer, "
                              "evaluate_baseline_transfer: SentEval's classifier on encoded vectors, no GPU (cpus = "
                              "tasks classified at once, one process each)")
    stats: Resources = arg(Resources(gpu=0, runtime=240, mem_mb=16000, cpus=8), "statistics and the token cache "
                           "(rule tokenize)")
    paraphrase: Resources = arg(Resources(gpu=1, runtime=480, mem_mb=32000, cpus=4), "rule paraphrase")
    pretrain: Resources = arg(Resources(gpu=1, runtime=1440, mem_mb=32000, cpus=8), "A method's pretraining stage "
                              "(rule pretrain).")


@dataclass
class TrackingSettings:
    """Config key ``tracking``: MLflow (``sentemb.tracking.runs``)."""

    enabled: bool = arg(True, "Log runs to MLflow.")
    uri: str | None = arg(None, "MLflow tracking URI; null means sqlite:///mlflow.db in the working directory. "
                          "MLFLOW_TRACKING_URI overrides.")
    wait_s: float | None = arg(None, "Seconds a job waits for an MLflow server that does not answer before it queues "
                               "its tracking records beside its outputs (sent when the server answers again, or by "
                               "`sentemb sync-tracking`); null means $SENTEMB_TRACKING_WAIT_S, else "
                               "sentemb.tracking.runs.DEFAULT_WAIT_S (30).", minimum=0)


NAME = "^[A-Za-z0-9_.-]+$"


@dataclass
class CorpusSettings:
    """Config key ``corpus``: the training corpus, fetched from the Hugging Face Hub or the mirror
    (``sentemb fetch-corpus``)."""

    name: str = arg("wiki1m", "Name of the training corpus (resources/corpus/<name>.txt, results/stats/<name>/). "
                    "The prepared corpus is one file per name under resources_dir: two configs sharing "
                    "resources_dir that prepare it differently (max_sentences, sampling) need different names, "
                    "else each run of one remakes it for the other.", pattern=NAME)
    hub_repo: str = arg("princeton-nlp/datasets-for-simcse", "Hugging Face dataset repository of the corpus.")
    hub_file: str = arg("wiki1m_for_simcse.txt", "File of the corpus in hub_repo.")
    revision: str | None = arg(None, "Revision of hub_repo (null = the default branch).")
    mirror_path: str = arg("data/wiki1m_for_simcse.txt", "Path of the corpus under the mirror.")
    sha256: str | None = arg(None, "sha256 of the fetched corpus file (null = not checked).", pattern=SHA256)
    expected_lines: int | None = arg(None, "Lines the fetched file must have (null = not checked).", minimum=1)
    max_sentences: int | None = arg(None, "Keep a seeded random sample of this many sentences (null = all).", minimum=2)
    sample_seed: int = arg(0, "Seed of the max_sentences sample.", **SEED_BOUNDS)
    skip_bad_lines: bool = arg(False, "Skip empty lines, non-UTF-8 lines and lines holding a NUL byte (counted in the log) instead of failing.")


@dataclass
class StsCorpusSettings:
    """Config key ``sts_corpus``: how the built-in corpus ``sts-unlabeled`` (PaSeR's training data, methods.md
    §2) is made from the fetched SentEval tree (``sentemb prepare-sts-corpus``)."""

    pairs: str = arg(
        "all", "Which lines of STS12-16's input files. all - every line, with a gold score or not: ConSERT's loader "
        "(yym6472/ConSERT data_utils.py load_sts, no_pair=True), which PaSeR follows ('following ConSERT, we mix all "
        "the unlabeled texts from the seven STS datasets', §4.1); scored - only the pairs with a gold score, the ones "
        "SentEval evaluates (this corpus before the key existed). STS-B and SICK: every pair either way.",
        choices=("all", "scored"))
    duplicates: str = arg(
        "keep", "keep - every sentence as often as the files hold it (ConSERT: 89,192 sentences on data/senteval, "
        "with pairs all); drop - the first occurrence of each (after whitespace normalisation) only (30,840 with "
        "pairs scored, this corpus before the key existed).", choices=("keep", "drop"))

    max_sentences: int | None = arg(
        None, "Keep a seeded random sample of this many of its sentences, in corpus order (null = all, what PaSeR "
        "trains on): a try-out's or a test's corpus; the sample is the same for every run and every statistic "
        "of it.", minimum=2)
    sample_seed: int = arg(0, "Seed of the max_sentences sample.", **SEED_BOUNDS)

    @property
    def sample_options(self) -> str:
        """``sentemb prepare-sts-corpus --max-sentences N --seed S``, or nothing (all sentences)."""
        return "" if self.max_sentences is None else f"--max-sentences {self.max_sentences} --seed {self.sample_seed}"

    @property
    def unscored(self) -> bool:
        """``sentemb prepare-sts-corpus --unscored`` (every line of STS12-16's input files)."""
        return self.pairs == "all"

    @property
    def keep_duplicates(self) -> bool:
        """``sentemb prepare-sts-corpus --keep-duplicates``."""
        return self.duplicates == "keep"


@dataclass
class SentEvalSource:
    """Config key ``senteval``: where the SentEval data comes from (``sentemb fetch-senteval``)."""

    url: str = arg("https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/senteval.tar",
                   "Where the SentEval archive is fetched from (without a mirror).")
    sha256: str | None = arg(None, "sha256 of the SentEval archive at url (null = not checked). A mirror holds the "
                             "extracted tree, not the archive: it is checked by its pair counts, and this key is "
                             "not read.", pattern=SHA256)
    mirror_path: str = arg("data/senteval", "Path of the SentEval tree under the mirror.")
    raw_mirror_path: str | None = arg("data/senteval-raw", "Mirror path of the STS sets as originally published "
                                      "(cased, untokenized); only used when evaluation.data is senteval-raw.")


@dataclass
class Backbone:
    """One entry of config key ``backbones``: a pretrained encoder, fetched once (``sentemb fetch-model``)."""

    hub_id: str = arg("", "Hugging Face model id of the backbone.", required=True)
    revision: str | None = arg(None, "Revision of the model (null = the default branch).")
    mirror_path: str | None = arg(None, "Path under the mirror; null means models/<last part of hub_id>.")
    sha256: str | None = arg(None, "sha256 of the weights file (model.safetensors or pytorch_model.bin).",
                             pattern=SHA256)
    random_init: dict | None = arg(None, "Build a randomly initialised model from this config (keys of the HF "
                                   "config) and the fetched tokenizer instead of loading pretrained weights (tests, "
                                   "throughput benchmarks).")


def _train_override() -> dict:
    """``runs[].train`` / ``studies[].train``: any ``train`` keys, without their defaults."""
    return schema_of(TrainSettings, defaults=False)


@dataclass
class RunSpec:
    """One entry of config key ``runs``: a method on a backbone, trained once per seed."""

    method: str = arg("", "A registered method (sentemb methods).", required=True)
    backbone: str = arg("", "A key of backbones.", required=True)
    name: str | None = arg(None, "Row name in the tables and the output folder (null = the method name); lets one "
                           "method run with several settings. A study's points are named <study>/<key>=<value> "
                           "(sentemb.config.studies).", pattern="^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.,=-]+)?$")
    evaluate: bool = arg(True, "false: no test-set evaluation (STS, transfer) of this run, only its training-time dev "
                         "score (train.json best_dev_stsb); absent from table1/table_paper.")
    study: str | None = arg(None, "Set by a study's expansion (sentemb.config.studies): the study this run is a point of.")
    point: dict | None = arg(None, "Set by a study's expansion: the point's values, {key: value}.")
    train: dict = arg({}, "Any keys of `train` (below), replacing them for this run.", schema=_train_override)
    seeds: list[int] | None = arg(None, "Seeds of this run (null = the top-level seeds), e.g. one seed for an "
                                  "ablation.", min_items=1, **SEED_BOUNDS)
    transfer: bool | None = arg(None, "SentEval transfer tasks for this run (null = evaluation.transfer).")
    method_args: dict = arg({}, "Method arguments of this run over methods.<method>.")
    corpus: str | None = arg(None, "Training corpus of this run (null = corpus.name): the configured corpus or a "
                             "built-in one (sts-unlabeled: the STS sentences of the SentEval tree, sentemb "
                             "prepare-sts-corpus).", pattern=NAME)
    weights: str | None = arg(None, "Start the encoder from this `backbones` entry's weights instead of `backbone`'s "
                              "(fetched and verified like any backbone); the run is still named, reported and "
                              "compared under `backbone`, whose tokenizer the job, the statistics and the token cache use, so "
                              "the two must share one vocabulary (checked when the job starts). null - backbone's own. "
                              "infocse-code: the Hub's Condenser, which the authors' scripts start from.", pattern=NAME)


def run_defaults() -> dict[str, Any]:
    """A ``runs`` entry's keys at their defaults (what the schema fills in; a study's point starts here)."""
    return {f.name: default_of(f) for f in dataclasses.fields(RunSpec) if not f.metadata.get("required")}


def _vary_schema() -> dict:
    return {"type": ["object", "null"], "additionalProperties": {"type": "array", "minItems": 1}}


def _points_schema() -> dict:
    return {"type": ["array", "null"], "items": {"type": "object", "minProperties": 1}}


@dataclass
class StudySpec:
    """One entry of config key ``studies`` (``sentemb.config.studies``): run keys varied over values."""

    name: str = arg("", "Name of the study (results/studies/<name>.*).", required=True, pattern=NAME)
    method: str = arg("", "A registered method.", required=True)
    backbone: str = arg("", "A key of backbones.", required=True)
    corpus: str | None = arg(None, "Training corpus of every point (null = corpus.name).", pattern=NAME)
    method_args: dict = arg({}, "Arguments every point shares.")
    train: dict = arg({}, "`train` keys every point shares.", schema=_train_override)
    seeds: list[int] | None = arg(None, "Seeds of every point (null = the top-level seeds).", min_items=1,
                                  **SEED_BOUNDS)
    transfer: bool | None = arg(None, "Transfer tasks for the points' runs (null = only when the metric is a "
                                "transfer task).")
    evaluate: bool = arg(True, "false: the points' new runs skip the test sets (metric best_dev_stsb only; a cheap "
                         "study).")
    vary: dict | None = arg(None, "Run keys (method_args.<arg>, train.<key>) -> lists of values; several keys: their "
                            "grid.", schema=_vary_schema)
    points: list | None = arg(None, "Explicit points (when not a grid): [{method_args.m: 10, method_args.n: 1}, ...].",
                              schema=_points_schema)
    metric: str = arg("Avg", "STS task, Avg (eval_sts.json), best_dev_stsb (train.json) or a transfer task.")
    reference: str | None = arg(None, "A seeds study (no vary/points): the run it is set against on the same seeds "
                                "(null = simcse).")
    expanded: list | None = arg(None, "Filled by validation: [{point, run, reused}], the run each point maps to.")


def _baselines_schema() -> dict:
    return {"type": "object", "additionalProperties": {"type": "array", "minItems": 1, "items": {"enum": list(POOLERS)}}}


@dataclass
class Config:
    """The whole configuration (``sentemb.config.load.load_config``): every section a typed class with its
    defaults declared here once. The JSON schema (``sentemb.config.load.load_schema``) and
    ``config/README.md`` (``sentemb config-keys``) are generated from it; ``Config.of`` gives the
    typed tree of a validated config mapping, and the job enumeration (``jobs``, ``tested``,
    ``transfer_runs``, ``baselines``) reads it."""

    experiment: str = arg("sentemb", "MLflow experiment name.", pattern=r"\S")
    local_gpus: int | None = arg(None, "GPUs on this machine for local runs (profiles/local, --resources gpu=N). Each "
                                 "GPU job then claims its own GPU (a lock per slot under .snakemake/gpu_slots, "
                                 "CUDA_VISIBLE_DEVICES set before CUDA starts; freed on exit, crash or kill). Leave "
                                 "null on Slurm, which assigns GPUs itself.", minimum=1)
    mirror: str | None = arg(None, "Local directory laid out like the shared/ data folder (data/senteval, "
                             "data/senteval-raw, data/wiki1m_*.txt, models/<name>, nltk_data). When set (or "
                             "SENTEMB_MIRROR is set) every fetch rule copies from it instead of the network. Relative "
                             "paths are relative to the working directory.")
    resources_dir: str = arg("resources", "Where fetched and prepared inputs are cached.")
    results_dir: str = arg("results", "Where statistics, runs, pretraining stages and tables are written.")
    tracking: TrackingSettings = arg(TrackingSettings(), "MLflow tracking.")
    corpus: CorpusSettings = arg(CorpusSettings(), "The training corpus.")
    senteval: SentEvalSource = arg(SentEvalSource(), "The SentEval data.")
    sts_corpus: StsCorpusSettings = arg(StsCorpusSettings(), "The built-in corpus sts-unlabeled (runs[].corpus).")
    backbones: dict[str, Backbone] = arg({}, "Pretrained encoders by name (the names runs[].backbone refers to).",
                                         required=True, min_items=1, key_pattern=NAME)
    train: TrainSettings = arg(TrainSettings(), "The shared training loop's settings.")
    method_modules: list[str] = arg([], "The user's own methods: Python files (paths relative to the working "
                                    "directory) or importable module names, imported before the config is validated; "
                                    "their @register_method classes are methods like the built-in ones "
                                    "(docs/methods/writing-a-method.md). Installed packages can also register through "
                                    "the entry-point group sentemb.methods.")
    methods: dict[str, dict] = arg({}, "Per-method hyperparameters (keys are registered method names); merged with "
                                   "each method's defaults.")
    runs: list[RunSpec] = arg([], "The training runs: each method × backbone × seed is one job.", required=True,
                              min_items=1)
    studies: list[StudySpec] = arg([], "Sensitivity studies (sentemb.config.studies): each varies run keys over values; "
                                   "every point becomes a run named <study>/<key>=<value> (or reuses a run with equal "
                                   "settings), with a table and a figure under results/studies/. Published values: "
                                   "config/paper_results.yaml, section `studies`.")
    seeds: list[int] = arg([42], "Seeds of every run (runs[].seeds overrides).", min_items=1,
                           **SEED_BOUNDS)
    evaluation: EvaluationSettings = arg(EvaluationSettings(), "Test-time evaluation.")
    baselines: dict[str, list[str]] = arg({}, "Untrained backbones evaluated as they are (rows marked "
                                          "method=baseline in every table): backbone -> list of poolers, e.g. "
                                          "{bert-base-uncased: [avg_static_last, avg_first_last]}.",
                                          schema=_baselines_schema)
    paper_results: str | None = arg(None, "Published numbers for results/table_paper.csv (null = "
                                    "config/paper_results.yaml of the repository).")
    published: list[dict] = arg([], "Published rows of this config's own methods (a plug-in's paper), in the "
                                "format of paper_results' `results` entries ({method, backbone, table, source, "
                                "scores, ...}); added to paper_results' rows for table_paper and the model cards (written "
                                "merged to <results_dir>/published.yaml). A second row for a run and table "
                                "paper_results already has is refused. A study's published values are not rows: "
                                "they go in the `studies` section of the paper_results file.")
    stats: StatsSettings = arg(StatsSettings(), "Corpus statistics.")
    job_resources: JobResources = arg(JobResources(), "Snakemake resources per rule kind.")

    @classmethod
    def of(cls, config: dict | Config) -> Config:
        """The typed tree of a validated config mapping (``sentemb.config.load.validate_config``)."""
        return config if isinstance(config, Config) else build(cls, config)

    # ------------------------------------------------------------------ per run, defaults resolved
    def run_name(self, run: RunSpec) -> str:
        """``runs[].name``, else the method's name."""
        return run.name or run.method

    def seeds_of(self, run: RunSpec) -> list[int]:
        """``runs[].seeds``, else the top-level ``seeds``."""
        return list(run.seeds or self.seeds)

    def corpus_of(self, run: RunSpec) -> str:
        """``runs[].corpus``, else ``corpus.name``."""
        return run.corpus or self.corpus.name

    def transfers(self, run: RunSpec) -> bool:
        """Does the run get the transfer tasks? ``runs[].transfer``, else ``evaluation.transfer``;
        never for a run without test-set evaluation."""
        return run.evaluate and (self.evaluation.transfer if run.transfer is None else run.transfer)


#: the config sections with a settings class of their own, by key (their schema alone:
#: ``section_schema``, e.g. a ``runs[].train`` override checked outside the whole config)
SECTIONS: dict[str, type] = {"train": TrainSettings, "evaluation": EvaluationSettings, "stats": StatsSettings,
                             "job_resources": JobResources}


def section_schema(name: str, defaults: bool = True) -> dict:
    """The JSON schema of config section ``name`` (with its defaults, or, for an override such as
    ``runs[].train``, without)."""
    out = schema_of(SECTIONS[name], defaults)
    if defaults:
        out["default"] = {}
    doc = (SECTIONS[name].__doc__ or "").split("\n\n")[0]
    out["description"] = " ".join(doc.split())
    return out


# ----------------------------------------------------------------------------------- a resolved run
@dataclass
class Run:
    """The complete, self-contained settings of one training job (``sentemb.config.load.resolve_run``,
    a pretraining stage: ``sentemb.train.pretrain.resolve_pretrain``). Its mapping form (``to_dict``) is
    the run config JSON ``sentemb train`` reads, what MLflow records as params, and (in part) the
    resume fingerprint (``sentemb.train.loop.run_fingerprint``)."""

    name: str
    method: str
    backbone: str
    seed: int
    train: TrainSettings = field(default_factory=TrainSettings)
    method_args: dict = field(default_factory=dict)  # the method's resolved Args, as a mapping
    paths: dict = field(default_factory=dict)  # model, corpus, senteval, stats, inputs{name: path}, tokens
    backbone_hub_id: str | None = None
    experiment: str = "sentemb"
    tracking: TrackingSettings = field(default_factory=TrackingSettings)  # a mapping is read as one
    corpus: str | None = None
    run_name: str | None = None  # MLflow run name (default train/<name>/<backbone>/seed<seed>)
    rule: str | None = None  # MLflow tag "rule" (default train)
    study: str | None = None  # the study this run is a point of (sentemb.config.studies), tagged on its MLflow run
    point: dict | None = None  # that point's values, {key: value}
    method_module: str | None = None  # a method from the user's code: the method_modules entry to import
    method_digest: str | None = None  # sentemb.methods.code_digest: its file's sha256, or of its code's files (editing one reruns its jobs only)

    #: the order of the mapping form (the run config JSON); None-valued optional keys are left out
    _ORDER = ("name", "method", "backbone", "backbone_hub_id", "seed", "train", "method_args", "experiment", "tracking",
              "corpus", "run_name", "rule", "paths", "study", "point", "method_module", "method_digest")
    #: keys older run configs may hold and that nothing reads any more (a saved run still loads)
    _RETIRED = ("progress",)
    _OPTIONAL = ("backbone_hub_id", "corpus", "run_name", "rule", "study", "point", "method_module", "method_digest")

    def __post_init__(self):
        if not isinstance(self.tracking, TrackingSettings):  # a run config's mapping (missing keys: defaults)
            check_mapping(TrackingSettings, self.tracking or {}, "run config: tracking", "tracking")
            self.tracking = build(TrackingSettings, self.tracking)

    @classmethod
    def from_dict(cls, values: dict | Run) -> Run:
        if isinstance(values, Run):
            return values
        if not isinstance(values, dict):
            raise SentembError(f"run config: expected a JSON object of settings, found {type(values).__name__}")
        values = {k: v for k, v in values.items() if k not in cls._RETIRED}
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SentembError(f"run config: unknown key(s) {', '.join(sorted(unknown))}")
        missing = [k for k in ("name", "method", "backbone", "seed") if k not in values]
        if missing:
            raise SentembError(f"run config: missing key(s) {', '.join(missing)} (sentemb run-config writes a whole one)")
        for key, kind, words in (("name", str, "a string"), ("method", str, "a string"), ("backbone", str, "a string"),
                                 ("seed", int, "an integer"), ("method_args", dict, "a mapping"),
                                 ("paths", dict, "a mapping")):
            v = values.get(key)
            if key in values and (isinstance(v, bool) or not isinstance(v, kind)):
                raise SentembError(f"run config: '{key}' = {v!r} is not {words}")
        return cls(**{**values, "train": TrainSettings.from_dict(values.get("train"), "train")})

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k in self._ORDER:
            v = getattr(self, k)
            if k in self._OPTIONAL and v is None:
                continue
            out[k] = v.to_dict() if k == "train" else to_dict(v) if k == "tracking" else v
        return out


# ------------------------------------------------------------------------------------ one fingerprint
#: train settings added after states were saved, at the value that computes what was computed
#: before they existed: left out of the fingerprint at that value (so such a state still resumes),
#: in it at any other (``sampler: length`` is another data order, ``eval_unit`` other checkpoints).
#: ``attention``'s default has since moved to ``auto`` (the memory-efficient kernel on CUDA): a run
#: that does not write the key is another run than before, and a state saved then does not resume
ADDED_DEFAULTS = {"optimizer": "adamw", "sampler": "random", "eval_unit": "optimizer_steps", "dropout_rng": "stream", "eval_precision": "fp32",
                  "graphs": False, "fuse_micro_batches": 1, "compile_mode": "default", "compile_random": "eager",
                  "update": "separate", "attention": "sdpa", "dev_max_len": None, "tf32": True}


#: method arguments added after states were saved (issue 38: the switches to the authors' code), at
#: the value that computes what was computed before they existed: left out of the fingerprint at that
#: value, in it at any other (a built-in method's name; a plug-in cannot take one)
ADDED_METHOD_ARGS = {
    "paser": {"masked_linear_init": "torch", "decoder_dropout_layout": "torch", "decoder_embeddings": "word",
              "target_truncation": "phrases", "eda_draw": "step", "eda_stopwords": "nltk", "empty_target": "none",
              "eda_clean": "none", "target_cut": "phrases"},
    "infocse": {"projection_init": "torch", "aux_lower_eval": True, "head_init": "pretrained"},
    "una": {"mlp_init": "normal", "selection_form": "paper", "rank_ties": "term", "empty_paraphrase": "anchor"},
    "arccse": {"triplet_pass": "separate"},  # issue 37: what runs settled before the switch did (the default again)
}


def weight_free_keys() -> tuple[str, ...]:
    """The train settings declared ``arg(..., weights=False)``: they do not change what is trained."""
    return tuple(f.name for f in dataclasses.fields(TrainSettings) if f.metadata.get("weights") is False)


def _fingerprint_dict(run: Run | dict, free: tuple[str, ...]) -> dict:
    run = Run.from_dict(run).to_dict()
    keep = {k: run[k] for k in ("method", "backbone", "seed", "train", "method_args", "paths")}
    if run["method_digest"] if "method_digest" in run else None:  # a plug-in method's file: another version is another run
        keep["method_digest"] = run["method_digest"]
    keep["train"] = {k: v for k, v in keep["train"].items()
                     if k not in free and not (k in ADDED_DEFAULTS and v == ADDED_DEFAULTS[k])}
    keep["paths"] = {k: v for k, v in keep["paths"].items() if k != "tokens"}
    added = ADDED_METHOD_ARGS.get(keep["method"], {})
    keep["method_args"] = {k: v for k, v in (keep["method_args"] or {}).items()
                           if not (k in added and v == added[k])}
    return keep


def fingerprint(run: Run | dict) -> str:
    """The one definition of "the same training" (issue 28 §2): the settings that change the trained
    weights — method, backbone, seed, method arguments (and a plug-in's file digest), data paths,
    every train setting not declared ``weights=False`` (and not an ``ADDED_DEFAULTS`` key at its old
    value). It decides resume (``sentemb.train.loop``), study deduplication (``sentemb.config.studies``) and
    Snakemake's rerun (the only parameter of rules ``run_config`` and ``pretrain_config``). Left out:
    the run's name, its MLflow settings (tracking, experiment, run name, study tags) and the
    weight-free settings (``run_options``), so changing ``train.log_steps`` reruns nothing."""
    return json.dumps(_fingerprint_dict(run, weight_free_keys()), sort_keys=True, default=str)


#: the weight-free train settings before each was declared so (issue 28): a state saved then was
#: fingerprinted with the others in; ``sentemb.train.loop.resume`` accepts that fingerprint too
LEGACY_WEIGHT_FREE = ("token_cache", "prefetch", "num_threads", "log_grad_norms", "chunk_size", "devices",
                      # weight-free settings added since (issues 36, 37 and later): absent from such a state's
                      # settings too; every weight-free key but log_steps, save_steps and device belongs here
                      "buckets", "workers", "chunk_first_pass", "counter_kernel", "worker_timeout")


def legacy_fingerprint(run: Run | dict) -> str:
    """The fingerprint a state saved before ``fingerprint`` existed carries (log_steps, save_steps
    and device were in it), so that such a state still resumes."""
    return json.dumps(_fingerprint_dict(run, LEGACY_WEIGHT_FREE), sort_keys=True, default=str)


def run_options(run: Run | dict) -> dict:
    """What of a run may change without rerunning it: the weight-free train settings and the
    MLflow settings. Rule ``run_options`` writes it; ``sentemb train --options`` applies it over
    the run config (so a job that runs uses today's logging settings without them being a reason
    to run)."""
    run = Run.from_dict(run)
    train = run.train.to_dict()
    return {"train": {k: train[k] for k in weight_free_keys() if k in train},
            "tracking": to_dict(run.tracking), "experiment": run.experiment}


def apply_options(run: Run, options: dict, where: str = "--options") -> Run:
    """``run`` with ``options`` (``run_options``'s mapping) applied; a weight-changing key is refused."""
    if not isinstance(options, dict) or not isinstance(options.get("train") or {}, dict):
        raise SentembError(f"{where}: expected a JSON object {{\"train\": {{...}}, \"tracking\": ..., \"experiment\": ...}}")
    bad = set(options.get("train") or {}) - set(weight_free_keys())
    if bad or set(options) - {"train", "tracking", "experiment"}:
        raise SentembError(f"{where}: only weight-free train settings ({', '.join(weight_free_keys())}), tracking and "
                           f"experiment may be given, not {', '.join(sorted(bad or set(options) - {'train', 'tracking', 'experiment'}))}")
    train = TrainSettings.from_dict({**run.train.to_dict(), **(options.get("train") or {})}, f"{where} train")
    return dataclasses.replace(run, train=train, tracking=options["tracking"] if "tracking" in options else run.tracking,
                               experiment=options.get("experiment", run.experiment))
