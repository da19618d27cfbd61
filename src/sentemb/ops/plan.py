"""``sentemb plan``: what a configuration costs, estimated on a CPU without a GPU or network.

One row per job of the workflow's DAG (train, pretrain, paraphrase, evaluate: STS, transfer and the
untrained baselines), then the configuration's total GPU-hours. Per job: parameters, FLOPs per
optimizer step, steps, GPU-hours at a stated MFU of the named GPU's bf16 peak, and peak GPU memory;
flags where ``job_resources`` (runtime, mem_mb) does not cover the estimate with ``--margin`` or the
GPU's memory is too small.

How (issue 20 §3; docs/plan-and-benchmarks.md):

* FLOPs per optimizer step are **counted** (``sentemb.ops.flops.counted_by_module``: every matmul,
  attention in its math form, forward and backward) on one real step of the run's own job
  (``sentemb.train.loop.setup`` + ``run_steps``, as ``sentemb train`` builds it) with random weights at
  the backbone's real widths (``sentemb.ops.shapes``; a backbone without a published shape takes its
  model directory's config.json), ``MICRO`` sentences per batch, every counting sentence exactly
  ``width`` tokens (``Counter.corpus``), the method's own inputs built on that corpus. So both SimCSE
  views, SAM's second forward/backward, InfoCSE's auxiliary network and PaSeR's decoder are in the
  count. The model is built with ``shapes.layers_needed`` layers (2; InfoCSE 7) and the count
  scaled to the real depth by the FLOPs attributed to one encoder layer (every layer has one shape,
  so the work is linear in depth). A full copy of the encoder the method keeps (``encoder_copies``:
  ESimCSE's momentum encoder) is built at that depth too and scaled with it: its first layer's
  FLOPs, saved activations, passes and parameters (frozen ones as frozen) count per layer as the
  encoder's do. A copy of a fixed number of lower layers (InfoCSE's ``aux_lower``: ``skip_from``) has
  fewer layers than the probe (``Method.layers_needed``) and is counted as built. The count at ``MICRO`` sentences is scaled linearly to the run's
  batch (matmuls are linear in batch at a fixed padded length; the in-batch similarity matrix is
  quadratic but below 0.1% of a step at B = 512) and times ``grad_accum``.
* **At the lengths the job meets.** ``corpus_lengths`` finds the corpus's token lengths under the
  backbone's tokenizer, from the first source that exists: the workflow's token cache
  ``results/stats/<corpus>/tokens.<backbone>/`` (every line), else a seeded sample of
  ``LENGTH_SAMPLE`` lines of ``--lengths-from``'s text, the prepared corpus, the mirrored corpus or its head sample
  (``data/<corpus>_head.txt``) tokenized with the backbone's tokenizer (BERT WordPiece standing in
  where the backbone's own is absent: said in the plan), else whitespace words ×
  ``TOKENS_PER_WORD`` + 2; with no text at all, ``max_len`` (the old upper bound). The plan prints
  which. ``width_profile`` cuts those lengths into the run's batches with the run's own sampler
  (``batch_schedule``: random or by length) and pads each batch's longest row to its bucket
  (``train.buckets``, the ``auto`` ladder without): a share of the micro-batches per width.
* **The width fit.** For a fixed job shape and batch, a step's FLOPs are a + b·L + c·L² in its
  padded width L (the matmuls linear in L, attention's two matmuls quadratic), and so are its saved
  activations. ``fitted_measures`` counts each job shape at three widths (``FIT_WIDTHS`` 16, 32, 64,
  or three within a narrower range) and prices every width the job meets from the quadratic through
  them (``quadratic_through``, exact rational arithmetic), unless counting the met widths directly is
  cheaper (e.g. SimCSE at max_len 32 meets only 32). Widths above ``max_len`` are a second segment
  (ArcCSE's triplets up to ``triplet_max_len``: there the main rows stay at ``max_len``), fitted on
  its own. ``tests/test_plan.py`` checks a fourth, directly counted width (exact for SimCSE and
  ArcCSE). ArcCSE is priced in two variants, every sentence forming a triplet and none, each fitted,
  mixed per width by the share of the batch's sentences with at least ``min_words`` words; the
  triplet rows are taken at the batch's width (an upper bound: their own longest may be shorter).
  Not width-modelled: the rows a method builds from its inputs rather than from the batch (PaSeR's
  decoder rows, UNA's paraphrases) are counted on the counting corpus's inputs at each width, not at
  the real inputs' lengths; the last, partial batch of an epoch is priced as a full one.
* **Floor.** Per job, counted FLOPs (steps and dev evaluations) / the GPU's dense bf16 peak: no
  MFU, no host floor; the total prints the estimate / floor ratio.
* **Shapes, batch building.** Per training job the distinct padded widths one epoch meets per encoder
  pass (``shapes``: main, ArcCSE's triplets; what a compiled or graph-captured step recompiles for),
  and the time to build one optimizer step's batches (the method's ``build_batch`` on real sentences,
  with its inputs built from them: PaSeR's RAKE phrases, UNA's TF-IDF and paraphrase stand-ins of
  their lengths; the backbone's stand-in tokenizer; timed on this CPU, over ``train.workers``
  processes): flagged where it exceeds the GPU step.
* Steps: the corpus's lines (``corpus.expected_lines``; the built-in ``sts-unlabeled`` corpus
  ``STS_UNLABELED_LINES``), ``batch_size``, ``epochs`` or ``max_steps``, ``grad_accum``, as
  ``sentemb.train.loop.batch_schedule`` cuts them. STS-B dev evaluations (fp32, ``DEV_SENTENCES``
  sentences each at ``EVAL_LEN`` tokens) are added as encoder forwards; their share of the job's
  time is printed (``dev%``) and flagged above ``DEV_SHARE_FLAG``.
* A step's time = max(FLOPs / (MFU × peak), ``STEP_FLOOR_S_PER_LAYER`` × layers × passes): the
  compute at a share of the GPU's dense bf16 peak (``benchmark.PEAK_BF16_TFLOPS``), or, for small
  steps, the host's time to launch the kernels, which measured on an H200 is a floor whatever the
  batch (``docs/gpu/h200-2026-11-26.md``). The MFU is measured too (``MEASURED_MFU``, by the
  encoder's width; ``--mfu`` overrides it). Passes: the encoder's forward+backward passes of a step
  (counted in the counted step: ArcCSE's triplets and SAM's second pass are more), × chunks, a
  no-grad forward a third. GPU-hours = the steps' time × ``train.devices``; fp32 evaluation at half
  the MFU (TF32); beam-search generation (paraphrases) at ``GEN_MFU``.
* Peak GPU memory = 16 bytes per trainable parameter (fp32 weights, gradients, AdamW's two moments)
  + 4 per frozen one (+ 4 per trainable with SAM: the saved perturbation) + activations + ``CUDA_OVERHEAD_GB``.
  Activations are measured: the bytes of the distinct tensors autograd saves in one micro-batch's
  forward (``torch.autograd.graph.saved_tensors_hooks``; each held until the forward ends, as the
  backward would hold it, so that a reused address is not taken for the same tensor: a few % more
  than before 2026-11-27, when they were not held), under the CPU's bf16 autocast where the
  GPU run autocasts (train.precision auto/bf16), scaled by depth as the FLOPs are and linearly to
  the batch, at the job's widest width, × ``CUDA_ACTIVATION_RATIO`` (0.5: what an H200 measured
  against the CPU's figure, rounded up).
  Allocator fragmentation and kernels' workspaces beyond the overhead are not modelled.

What it is not: a measurement of every job. One H200 calibrated the MFU and the floor (SimCSE,
ArcCSE; BERT-base, BERT-large, RoBERTa-large; B 16–1024): the estimate of a SimCSE step is within
25% of the measured one there (``sentemb gpu-check`` prints both); other GPUs are assumed to reach
the same share of their peak with the same host floor. Data loading (beyond the timed
``build_batch``), dev evaluation's host work and the transfer classifiers' training (SentEval's
k-fold grid search, CPU/GPU light but minutes per task) are not in the FLOPs, and paraphrase
generation is a rough formula (memory-bound decoding).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from .. import SentembError
from .shapes import backbone_architecture
from ..config.settings import Config

log = logging.getLogger(__name__)

#: GPU -> memory in GB; with the bf16 dense peaks one table, ``sentemb.ops.gpus.GPUS``
from .gpus import GPU_MEMORY_GB, GPUS, gpu_spec  # noqa: E402
DEFAULT_GPU = "H100"
#: Share of the bf16 dense peak a large-batch training step reaches, by the encoder's hidden size,
#: measured on an H200 (counted FLOPs / time, ``sentemb gpu-check``, 2026-11-26): SimCSE bf16 at
#: max_len 32, BERT-base 23.8% (B 512) and 23.1% (B 1024); BERT-large 30.9% and RoBERTa-large 30.5%
#: (B 512). A narrower encoder takes the 768 figure, a wider one the 1024 figure.
MEASURED_MFU = {768: 0.24, 1024: 0.30}
#: Seconds per encoder layer per forward+backward pass below which no step goes, measured on the
#: same H200: SimCSE's step took 34–44 ms for BERT-base (12 layers) at every batch from 16 to 256,
#: and 69–77 ms for RoBERTa-large/BERT-large (24 layers) at 32–128 (bf16 and fp32 alike): the host
#: issues the kernels slower than the GPU runs them. ArcCSE (two passes: the views, the triplets)
#: measured 69–84 ms at B 64, with SAM (four) 140 ms. Assumed the same on other GPUs (host-bound).
STEP_FLOOR_S_PER_LAYER = 0.0029
#: The same floor with ``train.graphs`` (the step replayed as CUDA graphs, ``sentemb.train.graphs``),
#: measured on an H200 (2026-11-27, ``sentemb gpu-check --host-parts graphed``,
#: ``docs/gpu/h200-2026-11-27-graphs.md``): SimCSE BERT-base B 64 max_len 32, 13.9 ms a step graphed
#: (47.3 eager, batches built in line), i.e. 1.16 ms per layer and pass; with SAM (two passes) 30.5 ms.
#: At this batch the graphed step is the GPU's own time on small kernels, not the host's.
GRAPHED_STEP_FLOOR_S_PER_LAYER = 0.00116
#: The graphed step with ``train.compile`` (Inductor's fused kernels inside the graph) and
#: ``train.attention: auto`` (the memory-efficient attention kernel on CUDA), measured on an H200
#: (2026-11-28, sixth lend, ``docs/gpu/h200-2026-11-28c.md``): SimCSE BERT-base bf16 max_len 32, B 64
#: 10.1 ms a step (0.84 ms per layer and pass) and B 512 49.3 ms, 34.5% of the bf16 peak. Measured at
#: width 768 only: a wider encoder keeps ``MEASURED_MFU``'s figure (no gain assumed where none was
#: measured).
COMPILED_GRAPHED_FLOOR_S_PER_LAYER = 0.00084
COMPILED_GRAPHED_MFU = {768: 0.345}
#: The same step with another ``train.attention`` (floor per layer and pass, MFU at width 768), the
#: same lends: ``sdpa`` (torch's pick, cuDNN's kernel on the H200) 10.9 ms at B 64 and 31.2% at B 512
#: (third to sixth lends); ``sdpa_math`` 10.7 ms and 33.1%. ``eager`` (Hugging Face's attention) is
#: unmeasured and priced as ``sdpa``.
COMPILED_GRAPHED_BY_ATTENTION = {"sdpa": (0.0009, 0.31), "sdpa_math": (0.00089, 0.33), "eager": (0.0009, 0.31)}
#: ``train.compile`` without ``train.graphs`` (Inductor's fused kernels launched from the host), the
#: sixth lend's compiled, not graphed, twins of those rows (``docs/gpu/h200-2026-11-28c.md``; checked by
#: ``sentemb plan-check docs/gpu/h200-2026-11-28c.rows.json``): SimCSE BERT-base bf16 max_len 32, B 64
#: 21.5 ms a step with the memory-efficient attention (``auto`` on CUDA; 1.79 ms per layer and pass) and
#: 29.8 ms with ``sdpa`` (cuDNN's kernel, 2.48 ms); at B 512 49.2 and 54.2 ms, the graphed steps' times
#: (compute-bound at the compiled MFU of ``mfu_for``). Before this constant the plan priced such a step
#: at the eager floor, 17-62% above these. Another kernel or a wider encoder is unmeasured compiled
#: alone: the eager floor and MFU.
COMPILED_FLOOR_BY_ATTENTION = {"auto": 0.00179, "sdpa_efficient": 0.00179, "sdpa": 0.00248}
#: The graphed floor by the encoder's width (the same lend): RoBERTa-large's SimCSE step at B 64 took
#: 36.2 ms graphed (24 layers: 1.51 ms per layer and pass), its wider layers' kernels longer than
#: BERT-base's. With ``train.compile`` a wider encoder keeps this (unmeasured compiled).
GRAPHED_FLOOR_BY_WIDTH = {768: GRAPHED_STEP_FLOOR_S_PER_LAYER, 1024: 0.00151}
#: Gradient caching's chunks run their matmuls at this share of the whole batch's MFU, measured on an
#: H200 (2026-11-28, fourth lend, ``docs/gpu/h200-2026-11-28.md``): SimCSE BERT-base B 512 max_len 32
#: graphed with counter masks, 212 TFLOP/s unchunked and 175 in chunks of 128 (the whole-batch first
#: pass; its 4/3 FLOPs counted), 0.83. One chunk size measured: the plan uses it for every chunk.
CHUNKED_MFU_RATIO = 0.83
#: ``train.dropout_rng: counter`` (masks hashed on the device, ``sentemb.model.dropout``), the same lend,
#: SimCSE BERT-base max_len 32: the floor-bound B 64 step is 1.71× the stream one eager (85.4 / 49.9 ms:
#: the hash's eager ops on the host), 1.14× graphed (15.8 / 13.8), 1.22× graphed and compiled (13.3 /
#: 10.9); the compute-bound B 512 graphed step 1.13× (79.3 / 70.0: the hash's arithmetic). ``keyed``
#: masks (drawn on the CPU) are unmeasured and priced as ``stream``.
COUNTER_FLOOR_FACTOR = {"eager": 1.71, "graphed": 1.14, "compiled": 1.22}
COUNTER_COMPUTE_FACTOR = 1.13
DEFAULT_MFU = None  # None: MEASURED_MFU by the encoder's width
GEN_MFU = 0.05  # beam-search generation is memory-bound: a tenth-ish of training's MFU (assumed)
DEFAULT_MARGIN = 1.5  # a request must cover the estimate × this
CUDA_OVERHEAD_GB = 1.5  # CUDA context, cuBLAS workspace, allocator slack (assumed)
#: CUDA's activations per sentence / the CPU autocast's, which the plan measures. On an H200, SimCSE
#: bf16 at max_len 32, B 512: BERT-base's peak 16.8 GiB holds 31.8 MB per sentence beyond 16 bytes
#: per parameter (the CPU measure: 67.7 MB, ratio 0.47), RoBERTa-large's 44.7 GiB 82.6 MB (CPU:
#: 219.7 MB, 0.38). CUDA's fused kernels keep fewer fp32 copies and bit-packed dropout masks. The
#: larger ratio, rounded up, keeps the estimate an upper bound.
CUDA_ACTIVATION_RATIO = 0.5
HOST_BASE_GB = 3.0  # Python, torch, CUDA libraries, tokenizer in a job's host memory (assumed)
MICRO = 4  # sentences per counted micro-batch
EVAL_LEN = 64  # padded tokens per evaluated sentence (SentEval sentences are mostly shorter)
DEV_SENTENCES = 3000  # STS-B dev: 1,500 pairs
#: SentEval's test-time sentences: STS12-16 + STS-B test + SICK test (the evaluated pairs x 2)
STS_SENTENCES = 37_700
#: SentEval transfer sentences per task (a transfer encoding job encodes those of
#: evaluation.transfer_tasks), and all seven (122,639)
TRANSFER_TASK_SENTENCES = {"MR": 10662, "CR": 3775, "SUBJ": 10000, "MPQA": 10606, "SST2": 70042, "TREC": 5952,
                           "MRPC": 11602}
TRANSFER_SENTENCES = sum(TRANSFER_TASK_SENTENCES.values())
#: lines of sentemb prepare-sts-corpus on SentEval's tree by config sts_corpus (pairs, duplicates);
#: (all, keep) is ConSERT's loader, the default
STS_UNLABELED = {("all", "keep"): 89_192, ("scored", "keep"): 62_198, ("scored", "drop"): 30_840, ("all", "drop"): 48_699}
STS_UNLABELED_LINES = STS_UNLABELED[("all", "keep")]
PARAPHRASE_INPUT_LEN = 32  # tokens per source sentence (assumed)
#: Seconds of one STS-B dev evaluation (3,000 sentences) of BERT-base on an H200, by precision (the
#: run's ``train.eval_precision``; ``auto`` is bf16 on a GPU): ``sentemb gpu-check --host``,
#: docs/gpu/h200-2026-11-27.md. A dev evaluation is short and host-bound (its FLOPs at the training
#: MFU would say 0.28 s in fp32); another encoder takes these times × its forward FLOPs / BERT-base's.
#: That row encoded in batches of 256 in both precisions and tokenized the dev set on every call; the
#: loop's dev embedder keeps the tokenized set and encodes fp32 in batches of 128 and bf16 (on CUDA) in
#: batches of 512. The row now measures the loop's way (``sentemb.ops.hostcheck.dev_eval``); these
#: constants stand until a GPU reruns it.
DEV_EVAL_SECONDS = {"fp32": 0.59, "bf16": 0.29}
DEV_EVAL_REFERENCE = "bert-base-uncased"
DEV_SHARE_FLAG = 0.10  # flag a training job that spends more than this share of its time in dev evaluation
LENGTH_SAMPLE = 20_000  # corpus lines sampled (seeded) for the lengths when no token cache is built
MIN_SCHEDULE_BATCHES = 256  # micro-batches drawn from the lengths per job (epochs of the sample as needed)
#: BERT WordPiece tokens per whitespace word of wiki1m (measured: all-MiniLM-L6-v2's tokenizer on
#: shared/data/wiki1m_head.txt, 11,913 lines: 1.333). The last fallback: words x this + 2 specials.
TOKENS_PER_WORD = 1.333
BUILD_TIMING_ROUNDS = 3  # timed rounds of those steps, each on new batches, after one untimed round; the fastest
BUILD_TIMING_STEPS = 5  # build_batch calls per timing round at least (build_timing_steps: a whole number of UNA's alpha)

from .shapes import COUNTING_WORDS as WORDS  # noqa: E402  (each one token of every stand-in tokenizer)


@dataclass
class Measure:
    """One counted micro-batch step of a job shape, at ``layers`` layers and ``MICRO`` sentences;
    ``passes``: the encoder's passes in that step (its first layer's forwards with gradients, and
    a third of each one without)."""

    layers: int
    flops: float  # one optimizer step of one micro-batch
    flops_layer: float  # of those, one encoder layer's
    act_bytes: float  # saved activations of one micro-batch's forward
    act_layer: float  # of those, one encoder layer's
    trainable: int
    frozen: int
    params_layer: int  # trainable parameters per encoder layer (the encoder's, and its full copies')
    grad_passes: float = 1.0
    nograd_passes: float = 0.0
    build_s: float | None = None  # seconds of the method's build_batch at the run's batch size (this CPU)
    frozen_layer: int = 0  # frozen parameters per encoder layer (a frozen full copy's: ESimCSE's momentum encoder)
    #: where a run's steps differ (``Method.step_kinds``: UNA's negatives on one step in alpha): (share of
    #: the steps, that kind's Measure); the time and FLOPs of a step are their mix, memory this one's (the
    #: kind with the most activations: UNA's step with negatives)
    kinds: list | None = None

    def at(self, layers: int) -> dict:
        d = layers - self.layers
        return {"flops": self.flops + d * self.flops_layer, "act": self.act_bytes + d * self.act_layer,
                "trainable": self.trainable + d * self.params_layer, "frozen": self.frozen + d * self.frozen_layer}


@dataclass
class Row:
    kind: str
    job: str
    params: int = 0
    flops_step: float = 0.0
    steps: int = 0
    gpu_hours: float = 0.0
    mem_gb: float = 0.0
    host_gb: float = 0.0
    runtime_min: int | None = None
    mem_mb: int | None = None
    flags: list = field(default_factory=list)
    chunk: str = ""  # training: sentences per forward on one GPU ("64" whole, "16/64" chunks of 16 of 64)
    cpu_hours: float = 0.0  # CPU work of a job that holds no GPU (SentEval's transfer classifier)
    wall_hours: float | None = None  # a CPU job's wall time on its cpus (else the runtime is gpu_hours)
    floor_hours: float = 0.0  # counted FLOPs / the GPU's bf16 peak (no MFU, no host floor)
    # training jobs only:
    lengths: str = ""  # where the priced lengths came from (token cache, corpus sample, fallback, max_len)
    widths: dict = field(default_factory=dict)  # counted width -> share of the job's micro-batches
    shapes: dict = field(default_factory=dict)  # encoder pass -> distinct padded widths one epoch meets
    dev_share: float | None = None  # share of the job's GPU time in STS-B dev evaluation
    step_s: float | None = None  # estimated seconds of one optimizer step on one GPU
    build_s: float | None = None  # seconds to build one optimizer step's batches on the job's CPUs
    graphs: bool = False  # priced as train.graphs (the graphed step's floor, GRAPHED_STEP_FLOOR_S_PER_LAYER)
    compiled: bool = False  # and train.compile with it (COMPILED_GRAPHED_FLOOR_S_PER_LAYER, COMPILED_GRAPHED_MFU)


# ---------------------------------------------------------------------------------------- measuring
#: the train settings, beyond those ``Counter._shape`` names, that the counted step runs with and that
#: change what it counts (saved activations: the attention kernels, dropout and its masks; the update's
#: and the optimizer's ops and state): runs that differ in one are counted apart within a plan. A
#: setting not here (lr, seeds, schedule, logging; compile and compile_random: the count runs eager)
#: leaves the count as it is.
COUNT_TRAIN_KEYS = ("attention", "dropout", "dropout_rng", "counter_kernel", "graphs", "optimizer", "update")


class Counter:
    """Counts steps and encodes on CPU, cached per distinct job shape (model dirs, corpora, inputs
    under one temporary directory)."""

    def __init__(self, config: dict | Config, work: Path, lengths_from: str | Path | None = None,
                 sample: int | None = LENGTH_SAMPLE, store: CountStore | None = None):
        self.config, self.work = Config.of(config), Path(work)
        self.lengths_from = lengths_from
        self.sample = sample  # lines of a corpus text the lengths are read from (None: every line)
        self.cache: dict = {}
        self.counts: list[tuple[str, int, float]] = []  # (method class, width, seconds) of every step counted
        self.store = store  # counts kept across invocations (``CountStore``; None: none)
        self.reused = 0  # counts read from ``store`` instead of counted

    def model_dir(self, arch: str | dict, layers: int) -> Path:
        from .shapes import write_model_dir

        key = ("model", json.dumps(arch, sort_keys=True), layers)
        if key not in self.cache:
            self.cache[key] = write_model_dir(arch, self.work / f"model-{len(self.cache)}-{layers}", num_layers=layers)
        return self.cache[key]

    def corpus(self, width: int) -> Path:
        """A counting corpus whose every line is ``width`` tokens long with its 2 special tokens
        ([CLS]/[SEP], <s>/</s>) in every stand-in tokenizer: "the" and ``width`` − 3 more
        ``COUNTING_WORDS``, each one token (``tests/test_plan.py`` checks it)."""
        key = ("corpus", width)
        if key not in self.cache:
            rng = random.Random(0)
            p = self.work / f"corpus-{width}.txt"
            n = max(1, width - 2)
            p.write_text("".join(" ".join(["the"] + [rng.choice(WORDS) for _ in range(n - 1)]) + "\n"
                                 for _ in range(4 * MICRO)))
            self.cache[key] = p
        return self.cache[key]

    def sentences_corpus(self, sentences: list[str]) -> Path:
        """A corpus file of ``sentences`` (real ones, for timing ``build_batch``), one per line."""
        text = "".join(" ".join(x.split()) + "\n" for x in sentences if x.strip())
        key = ("sentences", hashlib.sha256(text.encode("utf-8")).hexdigest())
        if key not in self.cache:
            p = self.work / f"sentences-{key[1][:12]}.txt"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, "utf-8")
            self.cache[key] = p
        return self.cache[key]

    def lengths(self, corpus: str, backbone: str) -> "Lengths":
        """The corpus's token lengths under ``backbone``'s tokenizer (``corpus_lengths``), cached."""
        key = ("lengths", corpus, backbone)
        if key not in self.cache:
            self.cache[key] = corpus_lengths(self.config, corpus, backbone, self.lengths_from, self.sample)
            log.info("lengths of %s for %s: %s", corpus, backbone, self.cache[key].source)
        return self.cache[key]

    def input(self, name: str, corpus: Path, model: Path) -> Path:
        """Input ``name`` built on ``corpus`` (``sentemb.stats.inputs``: its ``build``): the counting
        corpus of a width, or the real sentences that batch building is timed on."""
        from ..stats.inputs import build_input, get_input

        key = ("input", name, str(corpus), str(model) if get_input(name).per_backbone else "")
        if key not in self.cache:
            d = self.work / "inputs" / f"{len(self.cache)}"
            try:
                self.cache[key] = build_input(name, d, corpus, model, self.config)
            except SentembError as e:
                raise SentembError(f"sentemb plan: input '{name}' for counting: {e}") from None
        return self.cache[key]

    def tokens(self, corpus: Path, arch: str | dict, model: Path) -> Path:
        """The token cache of ``corpus`` under ``arch``'s tokenizer (read from ``model``), built once
        and loaded by every job of the plan on that corpus and backbone, as the workflow's jobs load
        rule ``tokenize``'s (``train.token_cache``): not tokenized again in each job's set-up."""
        from ..data.corpus import read_corpus
        from ..data.tokens import TokenCache
        from ..model.backbone import load_tokenizer

        key = ("tokens", str(corpus), json.dumps(arch, sort_keys=True))
        if key not in self.cache:
            d = self.work / "tokens" / f"{len(self.cache)}"
            TokenCache.build(read_corpus(corpus), load_tokenizer(model), corpus=corpus).save(d)
            self.cache[key] = d
        return self.cache[key]

    def encode(self, backbone: str | dict) -> tuple[float, int]:
        """(FLOPs of one sentence's encoder forward at ``EVAL_LEN`` tokens, parameters) at the
        backbone's full depth: evaluation encodes in fp32 without gradients."""
        import torch

        from .flops import counted_by_module
        from ..model.backbone import load_encoder
        from .shapes import depth, parameter_count

        arch = backbone
        key = ("encode", json.dumps(arch, sort_keys=True))
        if key not in self.cache:
            enc, _ = load_encoder(self.model_dir(arch, 2), pooling_layer=False)
            enc.eval()
            ids = torch.full((MICRO, EVAL_LEN), 5, dtype=torch.long)
            with torch.no_grad():
                _, flops, per = counted_by_module(lambda: enc(input_ids=ids, attention_mask=torch.ones_like(ids)))
            layer = per[f"{type(enc).__name__}.encoder.layer.0"]
            layers = depth(arch)
            self.cache[key] = ((flops + (layers - 2) * layer) / MICRO, parameter_count(arch))
        return self.cache[key]

    def _shape(self, run, method_cls=None) -> tuple:
        """(method class, counted method_args, architecture, layers, key of the job shape): what a
        count depends on besides the width."""
        from ..methods import get_method
        from .shapes import layers_needed

        cls = method_cls or get_method(run.method)
        args = dict(run.method_args)
        if "pretrained" in get_method(run.method).requires(get_method(run.method).make_args(args)) and method_cls is None:
            # InfoCSE from its stage-1 checkpoint: the same networks as init: backbone (other initial weights)
            args["init"] = "backbone"
        arch = backbone_architecture(self.config, run.backbone)
        layers = layers_needed(run.method, args)
        t = run.train
        shape = (cls.__name__, json.dumps(_reduced(run.method, args), sort_keys=True, default=str), args.get("min_words"),
                 json.dumps(arch, sort_keys=True), t.max_len, bool(t.sam_rho), t.unpad, _autocast_name(t.precision), layers,
                 json.dumps({k: getattr(t, k) for k in COUNT_TRAIN_KEYS}, sort_keys=True, default=str))
        return cls, args, arch, layers, shape

    def counted(self, run, method_cls=None, width: int | None = None) -> bool:
        """Whether ``run``'s job shape is counted at ``width`` already (``measure`` would reuse it)."""
        return ("measure", *self._shape(run, method_cls)[4], int(width or run.train.max_len)) in self.cache

    def measure(self, run, method_cls=None, width: int | None = None, timing: list[str] | None = None) -> Measure:
        """Count one optimizer step (one micro-batch) of ``run`` at ``MICRO`` sentences, every one
        ``width`` tokens long before truncation (default ``train.max_len``): the main rows are
        truncated at ``max_len`` as the run truncates them, the method's own rows (ArcCSE's triplets)
        built from those sentences at their own lengths. With ``timing`` (real sentences), also time
        the method's ``build_batch`` on them at the run's batch size (``Measure.build_s``; cached per
        method shape and batch size, whatever the width): a job of its own on a corpus of those
        sentences, with the method's inputs built from it (``_build_seconds``)."""
        from ..methods import get_method
        from ..stats.inputs import data_digest

        cls, args, arch, layers, shape = self._shape(run, method_cls)
        t = run.train
        width = int(width or t.max_len)
        key = ("measure", *shape, width)
        # timing depends on every argument (UNA's alpha decides which steps mine negatives; the count's
        # shape drops such schedule arguments) and on the sentences
        tkey = None
        if timing is not None:
            tkey = ("build", *shape, json.dumps(args, sort_keys=True, default=str), t.batch_size, t.token_cache,
                    str(self.sentences_corpus(timing)))  # token_cache: cached ids, or tokenized in the batches
        model = self.model_dir(arch, layers)
        base = get_method(run.method)
        needed = () if method_cls is not None else base.requires(base.make_args(args))
        train = dataclasses.replace(t, batch_size=MICRO, grad_accum=1, fuse_micro_batches=1, chunk_size=None, max_steps=1,
                                    epochs=1, model_selection="last",
                                    eval_at_end=False, device="cpu", prefetch=False, save_steps=10**9,
                                    log_steps=10**9, precision=_autocast_name(t.precision), compile=False,
                                    log_grad_norms=False, num_threads=None, buckets=None)  # the width as asked
        local = dataclasses.replace(run, train=train, method_args=args, tracking={"enabled": False, "uri": None},
                                    paths={"model": str(model), "corpus": "", "senteval": None, "inputs": {}})
        # what the count is of, beyond the in-memory key: the counted job's settings (for the store)
        job = {"method": run.method, "train": local.train.to_dict(), "method_args": args}
        data = {}
        for n in needed:  # once per input and plan (the data does not change while it counts)
            if ("data", n) not in self.cache:
                self.cache[("data", n)] = data_digest(n, self.config)
            if self.cache[("data", n)] is not None:
                data[n] = self.cache[("data", n)]
        if data:  # data the inputs read besides the corpus (NLTK's for PaSeR): its digest (a job without keeps its files)
            job["data"] = data
        if key not in self.cache and self.store is not None:
            kept = self.store.get(key, cls, self.config, job)
            if kept is not None:
                self.cache[key] = kept
                self.reused += 1
        if key not in self.cache:
            corpus = self.corpus(width)
            inputs = {n: str(self.input(n, corpus, model)) for n in needed}
            t0 = time.perf_counter()
            m = _count(dataclasses.replace(local, paths={**local.paths, "corpus": str(corpus), "inputs": inputs,
                                                         **self._token_path(t, corpus, arch, model)}), cls)
            self.counts.append((cls.__name__, width, time.perf_counter() - t0))
            self.cache[key] = m
            if self.store is not None:
                self.store.put(key, cls, self.config, job, m)
            _release()
            log.info("counted %s %s %s max_len %d width %d: %.3g FLOPs/micro-step at %d layers", cls.__name__,
                     run.backbone, json.dumps(_reduced(run.method, args), default=str), t.max_len, width, m.flops, layers)
        if tkey is not None and tkey not in self.cache:
            self.cache[tkey] = self._time_build(local, cls, needed, arch, model, timing, t.batch_size,
                                                build_timing_steps(run, method_cls))
        m = self.cache[key]
        return dataclasses.replace(m, build_s=self.cache.get(tkey, m.build_s))

    def _token_path(self, train, corpus: Path, arch, model: Path) -> dict:
        """``paths.tokens`` of a counted or timed job: the shared cache (``tokens``) where the run
        reads a token cache (``train.token_cache``), else nothing (the run tokenizes in its batches)."""
        return {"tokens": str(self.tokens(corpus, arch, model))} if train.token_cache else {}

    def _time_build(self, local, cls, needed, arch, model: Path, timing: list[str], batch_size: int,
                    steps: int = BUILD_TIMING_STEPS) -> float | None:
        """``_build_seconds`` in a job whose corpus is the real sentences ``timing``, with the method's
        inputs built from it (PaSeR's phrases, UNA's TF-IDF and paraphrase stand-ins of the real
        lengths), not the counting corpus's. None, said in the log, where it cannot be timed."""
        real = self.sentences_corpus(timing)
        with open(real, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines < 2:
            log.warning("sentemb plan: fewer than 2 sentences to time %s's batch building on", cls.__name__)
            return None
        try:
            paths = {**local.paths, "corpus": str(real), "inputs": {n: str(self.input(n, real, model)) for n in needed}}
            paths.update(self._token_path(local.train, real, arch, model))
            return _build_seconds(dataclasses.replace(local, paths=paths), cls, batch_size, steps)
        except (SentembError, OSError) as e:
            log.warning("sentemb plan: %s's batch building not timed: %s", cls.__name__, e)
            return None


# ------------------------------------------------------------------------------ counts kept on disk
#: what a count of the store holds: the counted fields of a ``Measure`` (never ``build_s``, a timing of
#: this CPU at that moment, nor ``kinds``, which the pricing attaches)
_STORED_FIELDS = ("layers", "flops", "flops_layer", "act_bytes", "act_layer", "trainable", "frozen", "params_layer",
                  "grad_passes", "nograd_passes", "frozen_layer")


def default_count_store() -> Path | None:
    """Where ``sentemb plan`` keeps its counts unless told (``--count-cache``): ``$SENTEMB_PLAN_CACHE``
    (``none``: nowhere), else ``$XDG_CACHE_HOME/sentemb/plan-counts``, else ``~/.cache/sentemb/plan-counts``."""
    import os

    env = os.environ.get("SENTEMB_PLAN_CACHE")
    if env:
        return None if env.lower() == "none" else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sentemb" / "plan-counts"


class CountStore:
    """The plan's counts (``Counter.measure``'s ``Measure`` of one job shape at one width) kept in
    ``root`` across invocations, one JSON file each: counting is about half of the paper
    configuration's plan (76 counts, 146 s of a 259 s plan on 2 cores), and a config edited between two
    plans mostly meets the shapes the first one counted. A kept count is read only for a count of the
    same job as the one that wrote it (``path``): the shape and width (the in-memory key), the counted
    job's whole train settings and method arguments (``train.graphs``, ``dropout`` or ``attention``
    change what a step saves and runs, though the in-memory key leaves them out), the config's ``stats``
    section (the method inputs built on the counting corpus: RAKE's phrases, TF-IDF), the digest of
    the data those inputs read besides the corpus (``sentemb.stats.inputs.data_digest``: NLTK's
    stopwords and WordNet for PaSeR; part of the counted job), and the ``fingerprint``: this package's
    sources, the method's code (``sentemb.methods.code_digest``: its class's file, a plug-in package's
    files), and the versions of Python, torch, transformers and the input builders' libraries. Each
    fingerprint has its own subfolder (an old one can be deleted whole). A class without a source file
    (defined in a notebook) is never kept. A file that cannot be read or does not hold a count is
    counted again and rewritten (a warning names it). Batch building is timed in every invocation,
    never kept: it is this CPU's time at that moment."""

    #: libraries whose version a count depends on besides Python's (the inputs' builders: NLTK's
    #: tokenizers and RAKE for PaSeR's phrases, scikit-learn for TF-IDF, the tokenizers)
    LIBRARIES = ("torch", "transformers", "tokenizers", "nltk", "rake-nltk", "scikit-learn")

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._prints: dict = {}
        self._warned = False

    def fingerprint(self, cls) -> str | None:
        """The digest of the code and versions a count of method class ``cls`` is computed with; None
        where ``cls`` has no readable source file (its counts are not kept)."""
        if cls not in self._prints:
            import inspect
            import sys
            from importlib import metadata

            from ..methods import code_digest

            try:
                src = Path(inspect.getsourcefile(cls) or "")
                if not src.is_file():
                    raise OSError(f"{src or 'none'} is not a file")
                h = hashlib.sha256(f"python {sys.version.split()[0]}\0".encode())
                for lib in self.LIBRARIES:
                    try:
                        h.update(f"{lib} {metadata.version(lib)}\0".encode())
                    except metadata.PackageNotFoundError:
                        h.update(f"{lib} absent\0".encode())
                h.update(_package_digest().encode() + b"\0" + code_digest(cls).encode())
                self._prints[cls] = h.hexdigest()
            except (TypeError, OSError) as e:
                log.info("sentemb plan: %s's counts are not kept (its source file: %s)", cls.__name__, e)
                self._prints[cls] = None
        return self._prints[cls]

    def path(self, key: tuple, cls, config: Config, job: dict) -> Path | None:
        """The file of the count of ``key`` for the counted job ``job`` (its ``train`` settings and
        ``method_args``); None where ``cls``'s counts are not kept."""
        from ..config.fields import to_dict

        print_ = self.fingerprint(cls)
        if print_ is None:
            return None
        ident = json.dumps([list(key), job, to_dict(config.stats)], sort_keys=True, default=str)
        return self.root / print_[:16] / f"{hashlib.sha256(ident.encode()).hexdigest()}.json"

    def get(self, key: tuple, cls, config: Config, job: dict) -> Measure | None:
        p = self.path(key, cls, config, job)
        if p is None or not p.exists():
            return None
        try:
            data = json.loads(p.read_text("utf-8"))
            return Measure(**{f: data[f] for f in _STORED_FIELDS})
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("sentemb plan: the kept count %s is unreadable (%s): counting again", p, e)
            return None

    def put(self, key: tuple, cls, config: Config, job: dict, m: Measure) -> None:
        """Write one count (atomically: a plan stopped meanwhile, or another plan writing the same
        count, leaves no half file); an unwritable store is said once and otherwise ignored (the plan
        stays right, only slower next time)."""
        import os

        p = self.path(key, cls, config, job)
        if p is None:
            return
        tmp = None
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.stem, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({f_: getattr(m, f_) for f_ in _STORED_FIELDS}, f)
            os.replace(tmp, p)
            tmp = None
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("sentemb plan: counts are not kept in %s (%s)", self.root, e)
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """sha256 of this package's Python sources (relative path and bytes of each, in path order)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@contextlib.contextmanager
def _frozen_imports():
    """Inside: the objects alive now (torch, transformers and this package, imported) out of the
    garbage collector's reach (``gc.freeze``), so that ``_release``'s full collection after each
    count scans what the counts made, not every module (23 s of the paper configuration's 82
    collections, 8 s frozen)."""
    from transformers import BertModel, RobertaModel  # noqa: F401  (the models' modules, imported once)

    from ..train import loop  # noqa: F401

    if gc.get_freeze_count():  # a caller froze already: left as it is
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _release() -> None:
    """Free the last job's model, optimizer and graph, and hand the memory back to the OS (glibc
    keeps freed blocks of up to its mmap threshold on the heap: dozens of jobs would pile up)."""
    import ctypes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _autocast_name(precision: str) -> str:
    """The CPU autocast that stands for the GPU run's: bf16 for auto/bf16/fp16 (same bytes), else fp32."""
    return "fp32" if precision == "fp32" else "bf16"


def _reduced(method: str, args: dict) -> dict:
    """Method arguments as far as they change a step's FLOPs and memory: floats as zero/non-zero, the
    method's ``schedule_args`` (integers that choose which steps or rows do work) dropped
    (``tests/test_real_shapes.py`` documents the same reduction)."""
    from ..methods import get_method

    scalar_ints = {method: set(get_method(method).schedule_args)}
    out = {}
    for k, v in sorted(args.items()):
        if k == "pretrain":
            continue
        if isinstance(v, float):
            v = "zero" if v == 0 else "nonzero"
        elif isinstance(v, int) and not isinstance(v, bool) and k in scalar_ints.get(method, ()):
            continue
        out[k] = v
    return out


def encoder_copies(method, enc) -> list:
    """The full copies of the encoder ``enc`` that ``method`` holds besides it (ESimCSE's momentum
    encoder): submodules of its class with as many layers, none of them ``enc``'s own. Built on a
    reduced-depth probe they have the probe's depth, and scale with the real one as ``enc`` does. A
    copy of a fixed number of lower layers (InfoCSE's ``aux_lower``) has fewer layers than the probe
    (``Method.layers_needed`` exceeds that number) and is left out."""
    n = len(enc.encoder.layer)
    own = {id(m) for m in enc.modules()}
    out = []
    for _, m in method.named_modules():
        layers = getattr(getattr(m, "encoder", None), "layer", None)
        if id(m) in own or type(m) is not type(enc) or layers is None or len(layers) != n:
            continue
        if any(id(x) in own for x in layers):  # shares the encoder's layers: no copy
            continue
        out.append(m)
    return out


def _count(run, method_cls) -> Measure:
    """Count one step of ``run`` (see ``Counter.measure``)."""
    import torch

    from .flops import counted_by_module, fp32_gemms
    from ..train.loop import State, autocast, micro_batches, run_steps, setup

    # the CPU autocast's bf16 products as fp32 ones (``fp32_gemms``): the same FLOPs and saved bytes,
    # without an AVX2 CPU's emulated bf16 GEMMs (about 200x slower in a linear layer's backward)
    with fp32_gemms(), setup(run, "/nonexistent-plan", method_cls) as job:
        method, enc = job.method, job.method.encoder
        # the first layer of the encoder and of each full copy of it (``encoder_copies``): per layer of depth
        layers0 = [enc.encoder.layer[0]] + [c.encoder.layer[0] for c in encoder_copies(method, enc)]
        layer_names = {f"{type(enc).__name__}.encoder.layer.0"} | {
            f"{type(method).__name__}.{n}" for n, mod in method.named_modules() if any(mod is x for x in layers0)}
        per_layer = {id(p): p for x in layers0 for p in x.parameters()}.values()
        params_layer = sum(p.numel() for p in per_layer if p.requires_grad)
        frozen_layer = sum(p.numel() for p in per_layer if not p.requires_grad)
        trainable = sum(p.numel() for p in method.parameters() if p.requires_grad)
        frozen = sum(p.numel() for p in method.parameters() if not p.requires_grad)
        # activations: the distinct storages autograd saves in one micro-batch's forward
        (_, batch), = micro_batches(job, 0)
        seen, inside, total, in_layer, alive = set(), [False], [0], [0], []

        def pack(t):
            s = t.untyped_storage()
            ptr = (s.data_ptr(), s.nbytes())
            if ptr not in seen and t.device.type != "meta":
                seen.add(ptr)
                total[0] += s.nbytes()
                if inside[0]:
                    in_layer[0] += s.nbytes()
                # held until the forward ends, as autograd would hold it until the backward: a freed
                # storage's address reused by a later tensor would otherwise be taken for the same one
                alive.append(t)
            # autograd keeps nothing: this forward is never backpropagated, and a saved output that
            # refers to itself through its grad_fn would form a cycle autograd cannot free
            return None

        hooks = [h for x in layers0 for h in (x.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True)),
                                              x.register_forward_hook(lambda *a: inside.__setitem__(0, False)))]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None), autocast(job.device, job.amp):
            terms = job.step_fn(batch)
        for h in hooks:
            h.remove()
        alive.clear()
        del terms
        job.opt.zero_grad(set_to_none=True)
        # FLOPs: one optimizer step of the loop's own code; the encoder's passes in it
        calls = [0, 0]  # grad, no-grad passes of the encoder's first layer(s)

        def count_pass(*_):
            calls[int(not torch.is_grad_enabled())] += 1

        # the optimizer's update is elementwise (no counted FLOP) and, over a base encoder's parameters
        # under the counting mode, about a third of the count's time: the step runs with empty groups
        groups = [g["params"] for g in job.opt.param_groups]
        for g in job.opt.param_groups:
            g["params"] = []
        hooks = []
        try:
            if getattr(job.settings, "graphs", False):  # train.graphs: a new shape's first step runs twice (the
                list(run_steps(job, State(), 1))         # capture check, then the step): the count is the replay's
            hooks = [x.register_forward_hook(count_pass) for x in layers0]
            _, flops, per_module = counted_by_module(lambda: list(run_steps(job, State(), 1)))
        finally:
            for h in hooks:
                h.remove()
            for g, params in zip(job.opt.param_groups, groups):
                g["params"] = params
        flops_layer = sum(v for k, v in per_module.items() if k in layer_names)
        if not flops_layer:
            raise SentembError(f"sentemb plan: no FLOPs attributed to the encoder's first layer ({sorted(per_module)[:8]})")
        return Measure(layers=len(enc.encoder.layer), flops=flops, flops_layer=flops_layer, act_bytes=total[0],
                       act_layer=in_layer[0], trainable=trainable, frozen=frozen, params_layer=params_layer,
                       grad_passes=float(calls[0]), nograd_passes=float(calls[1]), frozen_layer=frozen_layer)


def _build_seconds(run, method_cls, batch_size: int, steps: int = BUILD_TIMING_STEPS) -> float:
    """Seconds of the method's ``build_batch`` for one optimizer step of ``batch_size`` sentences, as
    the loop calls it: each step a new batch of ``run``'s corpus lines (with their line indices, so
    the token cache reads them; the lines wrap around when fewer) and its own ``micro``, steps
    0..``steps``−1 (``build_timing_steps``: UNA's negatives on one step in α). One round is
    built untimed (lazy imports, first caches), then ``BUILD_TIMING_ROUNDS`` rounds, each on new
    batches, as training meets new words (PaSeR's WordNet look-ups, memoized per word); the fastest
    round's mean: a round slowed by something else on this CPU, or by caches still cold in a
    process that has looked up little yet (WordNet's), is not the steady cost of a training job."""
    import time

    from ..train.loop import setup

    with setup(run, "/nonexistent-plan", method_cls) as job:
        n = len(job.sentences)

        def build(k: int, step: int) -> None:  # the k-th batch of the timing, at optimizer step `step`
            lines = [(k * batch_size + i) % n for i in range(batch_size)]
            job.method.build_batch([job.sentences[i] for i in lines], step=step, lines=lines, micro=k)

        for s in range(steps):  # warm-up round
            build(s, s)
        rounds = []
        for r in range(1, BUILD_TIMING_ROUNDS + 1):
            t0 = time.perf_counter()
            for s in range(steps):
                build(r * steps + s, s)
            rounds.append((time.perf_counter() - t0) / steps)
        return min(rounds)


# ---------------------------------------------------------------------------------------- lengths
@dataclass
class Lengths:
    """A corpus's sentence lengths as a backbone's tokenizer sees them: ``tokens`` (untruncated, with
    the special tokens) and ``words`` (whitespace words, what ``train.sampler: length`` sorts by) per
    line of the whole corpus or of a seeded sample of it, ``sentences`` (a few hundred of its lines,
    for timing ``build_batch``; empty when only a token cache was read), and ``source`` (said in the
    plan). ``tokens`` None: no corpus text was found; training is priced at ``max_len``."""

    source: str
    tokens: "np.ndarray | None" = None
    words: "np.ndarray | None" = None
    sentences: list = field(default_factory=list)


def corpus_text_files(config: dict | Config, corpus: str, lengths_from: str | Path | None = None) -> list[tuple[Path, str]]:
    """Candidate files of ``corpus``'s text, best first, each with what it is: ``lengths_from`` (the
    plan's ``--lengths-from``), the prepared ``resources/corpus/<corpus>.txt``, the raw corpus in the
    mirror (config ``mirror`` / ``$SENTEMB_MIRROR``, then the ``shared/`` folders of
    ``sentemb.ops.shapes.shared_dirs``) at ``corpus.mirror_path`` (the configured corpus only), and
    last a head sample of it there: ``data/<corpus>_head.txt`` (shared/data/wiki1m_head.txt: the
    first 11,913 lines of wiki1m)."""
    import os

    from ..config.paths import Layout
    from .shapes import shared_dirs

    cfg = Config.of(config)
    out: list[tuple[Path, str]] = []
    if lengths_from:
        out.append((Path(lengths_from), "--lengths-from"))
    if not _stale_sts_corpus(cfg, corpus):
        out.append((Path(Layout.of(cfg).corpus(corpus)), "prepared corpus"))
    roots = []
    mirror = os.environ.get("SENTEMB_MIRROR") or cfg.mirror
    if mirror:
        roots.append(Path(mirror).expanduser())
    roots += list(shared_dirs())
    if corpus == cfg.corpus.name and cfg.corpus.mirror_path:
        out += [(r / cfg.corpus.mirror_path, "mirrored corpus") for r in roots]
    out += [(r / "data" / f"{corpus}_head.txt", "head sample of the corpus") for r in roots]
    out = [(p, what) for p, what in out if p.is_file()]
    if corpus == "sts-unlabeled" and not out:  # not prepared yet: made as the workflow makes it, from SentEval's data
        for d in [Path(Layout.of(cfg).eval_data("senteval"))] + [r / cfg.senteval.mirror_path for r in roots]:
            made = _sts_unlabeled_text(d, cfg.sts_corpus.unscored, cfg.sts_corpus.keep_duplicates,
                                       cfg.sts_corpus.max_sentences, cfg.sts_corpus.sample_seed)
            if made is not None:
                out.append((made, f"sts-unlabeled made from {d} (sentemb prepare-sts-corpus)"))
                break
    return out


def _stale_sts_corpus(cfg: Config, corpus: str) -> bool:
    """A prepared ``sts-unlabeled`` made in another form than config ``sts_corpus`` asks (its summary
    says how; one made before the key existed is the scored, deduplicated form): the workflow will
    make it again, so the plan does not read it."""
    from ..config.paths import Layout

    if corpus != "sts-unlabeled":
        return False
    try:
        made = json.loads(Path(Layout.of(cfg).corpus_summary(corpus)).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    sts = cfg.sts_corpus
    want = (sts.unscored, sts.keep_duplicates, sts.max_sentences, sts.sample_seed if sts.max_sentences else 0)
    return (bool(made.get("unscored")), bool(made.get("keep_duplicates")), made.get("max_sentences"),
            made.get("seed", 0)) != want


def _sts_unlabeled_text(senteval_dir: Path, unscored: bool = True, keep_duplicates: bool = True,
                        max_sentences: int | None = None, seed: int = 0) -> Path | None:
    """The ``sts-unlabeled`` corpus (``sentemb.data.fetch.prepare_sts_corpus``, as config ``sts_corpus``
    makes it) of ``senteval_dir``, written once to this machine's temporary folder (never the
    workflow's outputs); None where that folder holds no STS data."""
    from ..data.fetch import prepare_sts_corpus

    if not (senteval_dir / "STS" / "STSBenchmark").is_dir():
        return None
    sample = "" if max_sentences is None else f" {max_sentences} {seed}"
    key = hashlib.sha256(f"{senteval_dir.resolve()} {unscored} {keep_duplicates}{sample}".encode("utf-8")).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"sentemb-plan-sts-unlabeled-{key}.txt"
    try:  # made again unless its summary (written last) gives its line count
        summary = json.loads(Path(f"{out}.json").read_text("utf-8"))
        with open(out, encoding="utf-8") as f:
            fresh = summary.get("sentences") == sum(1 for _ in f)
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        try:
            prepare_sts_corpus(senteval_dir, out, keep_duplicates=keep_duplicates, unscored=unscored,
                               max_sentences=max_sentences, seed=seed)
        except (SentembError, OSError) as e:
            log.warning("sentemb plan: sts-unlabeled from %s: %s", senteval_dir, e)
            return None
    return out


def _sample_lines(path: Path, n: int, seed: int = 0) -> tuple[list[str], int]:
    """Up to ``n`` non-empty lines of ``path`` drawn without replacement (seeded; all when fewer),
    in file order, and the file's line count."""
    from ..utils import seeded_sample

    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln.rstrip("\n") for ln in f]
    lines = [ln for ln in lines if ln.strip()]
    return seeded_sample(lines, n, seed), len(lines)


def _tokenizer_for(config: dict | Config, backbone: str):
    """(tokenizer, what it is) of ``backbone`` for counting lengths: its real one (the model
    directory of ``shapes.backbone_model_dir``), else the stand-in of its family where that is the
    real vocabulary (BERT: the mirror's MiniLM WordPiece = bert-base-uncased's), else (None, why)."""
    from transformers import AutoTokenizer

    from .shapes import _minilm_dir, backbone_model_dir, fields_of

    d = backbone_model_dir(config, backbone)
    if d is not None:
        try:
            return AutoTokenizer.from_pretrained(d), f"{backbone}'s tokenizer ({d})"
        except (OSError, ValueError) as e:
            log.warning("tokenizer of %s in %s: %s", backbone, d, e)
    family = fields_of(backbone_architecture(config, backbone)).get("model_type")
    src = _minilm_dir()
    if src is not None:
        tok = AutoTokenizer.from_pretrained(src)
        if family == "bert":
            return tok, f"bert-base-uncased WordPiece ({src}; {backbone}'s own not found)"
        return tok, f"bert-base-uncased WordPiece as a proxy for {backbone}'s {family} BPE ({src}; its own not found)"
    return None, f"no {family} tokenizer found"


def corpus_lengths(config: dict | Config, corpus: str, backbone: str, lengths_from: str | Path | None = None,
                   sample: int | None = LENGTH_SAMPLE) -> Lengths:
    """The lengths ``sentemb plan`` prices ``corpus`` at for ``backbone`` (see ``Lengths``), from the
    first source that exists:

    1. the workflow's token cache ``results/stats/<corpus>/tokens.<backbone>/`` (every line; words
       from the prepared corpus text when present, else the token lengths stand for them);
    2. a seeded sample of ``sample`` lines (``LENGTH_SAMPLE``; None: every line) of the corpus text
       (``corpus_text_files``),
       tokenized with the backbone's tokenizer (``_tokenizer_for``), or, with none found, whitespace
       words × ``TOKENS_PER_WORD`` + 2;
    3. nothing: ``Lengths(tokens=None)``, priced at ``max_len`` (an upper bound)."""
    import numpy as np

    from ..config.paths import Layout
    from ..data.tokens import TokenCache
    from ..train.loop import sentence_lengths

    cfg = Config.of(config)
    layout = Layout.of(cfg)
    cache = Path(layout.tokens(corpus, backbone))
    texts = corpus_text_files(cfg, corpus, lengths_from)
    if (cache / "meta.json").is_file():
        try:
            tc = TokenCache.load(cache)
        except SentembError as e:
            log.warning("%s", e)
        else:
            tokens = np.asarray(tc.lengths(10**9), dtype=np.int64)
            words, sentences, how = tokens, [], "token lengths stand for words"
            for path, _ in [(Path(layout.corpus(corpus)), "prepared corpus")] + texts:
                if not path.is_file():
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = [ln.rstrip("\n") for ln in f]
                if len(lines) == len(tokens):  # the text the cache was made from: its words
                    words, sentences, how = sentence_lengths(lines), lines[:2048], f"words of {path}"
                    break
            return Lengths(f"token cache {cache} ({len(tokens)} lines; {how})", tokens, words, sentences)
    for path, what in texts:
        lines, total = _sample_lines(path, sample if sample is not None else 2**62)
        if not lines:
            continue
        words = sentence_lengths(lines)
        tok, how = _tokenizer_for(cfg, backbone)
        if tok is not None:
            ids = tok(lines, add_special_tokens=False)["input_ids"]
            n_special = tok.num_special_tokens_to_add(pair=False)
            tokens = np.fromiter((len(x) + n_special for x in ids), dtype=np.int64, count=len(ids))
        else:
            how = f"words x {TOKENS_PER_WORD} + 2 ({how})"
            tokens = np.ceil(words * TOKENS_PER_WORD).astype(np.int64) + 2
        sample = f"{len(lines)} of {total} lines" if len(lines) < total else f"all {total} lines"
        return Lengths(f"{what} {path} ({sample}), {how}", tokens, words, lines[:2048])
    return Lengths("max_len (no token cache or corpus text found)")


def _row_cap(run, arch) -> int:
    """The longest row, in tokens, a step of ``run`` builds: ``max_len``, or for ArcCSE with
    triplets its ``triplet_max_len`` capped at the position limit (``ArcCSE._triplet_len``)."""
    from .shapes import fields_of

    t = run.train
    if run.method != "arccse" or not run.method_args.get("triplet", True):
        return int(t.max_len)
    return max(int(t.max_len), _triplet_len(run, arch))


def _triplet_len(run, arch) -> int:
    """ArcCSE's triplet truncation (``ArcCSE._triplet_len``): ``triplet_max_len`` within the
    encoder's positions (RoBERTa's family: two fewer)."""
    from .shapes import fields_of

    f = fields_of(arch)
    limit = int(f.get("max_position_embeddings", 512))
    if f.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2  # RoBERTa's positions start at padding_idx + 1
    return min(int(run.method_args.get("triplet_max_len", 512)), limit)


def width_profile(run, arch, lengths: Lengths, steps: "Sequence[int] | None" = None) -> dict:
    """How one job's micro-batches are wide, from ``lengths``: ``batch_schedule`` (the run's sampler;
    epochs of the lengths until ``MIN_SCHEDULE_BATCHES`` micro-batches, seed 0) cut at the run's
    batch size; each batch's longest row L (tokens, untruncated). With ``train.fuse_micro_batches``
    k, each k consecutive micro-batches count as one batch (one forward, padded to the widest).
    ``steps`` (optimizer step indices): only those steps' micro-batches (``grad_accum`` each) of a
    job of seed 0 on these very lines (``sentemb plan-check``: the steps a benchmark timed).
    Returns

    * ``count``: counted width -> share of micro-batches, the width being the bucket of min(L, the
      row cap) on the counting ladder (``train.buckets`` resolved for cuda at the row cap; with
      ``train.buckets: none``, the ``auto`` ladder: an upper bound by its padding);
    * ``shapes``: pass -> distinct padded widths one epoch meets: ``main`` (the batch, bucket of
      min(L, max_len)), ``triplets`` for ArcCSE (bucket of the batch's longest sentence of at least
      ``min_words`` words, capped at the triplet length, in batches that have one);
    * ``triplet_share`` (ArcCSE with triplets): width -> mean share of a batch's sentences with at
      least ``min_words`` words (the rows that form triplets), over the batches of that width;
    * ``triplet_batches`` (likewise): width -> share of its batches with at least one such sentence
      (those run the triplet pass);
    * ``padding``: ``padding_overhead`` of the main pass's buckets over the batches' own widths.

    Without lengths (``tokens`` None): every batch at the row cap, as before this model existed."""
    import numpy as np

    from ..data.buckets import AUTO_LADDER, bucket_width, padding_overhead, resolve_buckets
    from ..train.loop import batch_schedule

    t = run.train
    cap = _row_cap(run, arch)
    if lengths.tokens is None:
        triplets = run.method == "arccse" and run.method_args.get("triplet", True)
        return {"count": {cap: 1.0}, "shapes": {"main": 1} | ({"triplets": 1} if triplets else {}),
                "triplet_share": {}, "padding": 1.0, "batches": 0}
    setting = t.buckets if t.buckets not in (None, "none") else "auto"
    ladder = resolve_buckets(setting, cap, "cuda") or tuple(w for w in AUTO_LADDER if w < cap) + (cap,)
    main_buckets = resolve_buckets(t.buckets, t.max_len, "cuda")
    n = len(lengths.tokens)
    b = min(t.batch_size, n)
    per_epoch = max(1, n // b)
    epochs = max(1, math.ceil(MIN_SCHEDULE_BATCHES / per_epoch)) if t.sampler != "length" else 1
    if steps is not None:
        steps = sorted(set(int(x) for x in steps))
        if not steps or steps[0] < 0:
            raise SentembError(f"width_profile: steps {steps} are not optimizer step indices")
        epochs = max(epochs, math.ceil((steps[-1] + 1) * t.grad_accum / per_epoch) + 1)
    sched = batch_schedule(n, b, epochs, 0, lengths.words if t.sampler == "length" else None)
    if steps is not None:
        a = t.grad_accum
        sched = [m for s in steps for m in sched[s * a : (s + 1) * a]]
    fuse = int(getattr(t, "fuse_micro_batches", 1) or 1)
    micro = [np.asarray(x) for x in sched]  # the micro-batches, before fusing (ArcCSE pads triplets per micro-batch)
    if fuse > 1:  # train.fuse_micro_batches: k consecutive micro-batches are one forward, at the widest one's width
        sched = [np.concatenate(micro[i : i + fuse]) for i in range(0, len(micro), fuse)]
    tokens = lengths.tokens
    longest = np.fromiter((tokens[i].max() for i in sched), dtype=np.int64, count=len(sched))
    counted = np.array([bucket_width(int(min(x, cap)), ladder) for x in longest])
    widths, counts = np.unique(counted, return_counts=True)
    plain = np.minimum(longest, t.max_len)
    main = np.array([bucket_width(int(x), main_buckets) for x in plain])
    shapes = {"main": int(len(np.unique(main)))}
    tri_share = {}
    if run.method == "arccse" and run.method_args.get("triplet", True):  # rows that form triplets, per width
        min_words = int(run.method_args.get("min_words", 25))
        share = np.fromiter(((lengths.words[i] >= min_words).mean() for i in sched), dtype=float, count=len(sched))
        tri_share = {int(w): float(share[counted == w].mean()) for w in widths}
        tri_batches = {int(w): float((share[counted == w] > 0).mean()) for w in widths}
    tri_mix = {}
    if tri_share:  # ArcCSE's triplets: the sentences of >= min_words words, at their own length
        min_words = int(run.method_args.get("min_words", 25))
        tri = [int(tokens[i][lengths.words[i] >= min_words].max()) for i in sched
               if (lengths.words[i] >= min_words).any()]
        tri_len = _triplet_len(run, arch)  # the loop's triplet widths (Method.width with the triplets' limit)
        shapes["triplets"] = int(len({bucket_width(min(x, tri_len), main_buckets, tri_len) for x in tri}))
        tri_mix, tri_batches = _triplet_mix(micro, fuse, counted, tokens, lengths.words, min_words,
                                            _triplet_len(run, arch), main_buckets, b, bool(t.graphs))
    return {"count": {int(w): float(c) / len(sched) for w, c in zip(widths, counts)}, "shapes": shapes,
            "triplet_share": tri_share, "triplet_batches": tri_batches if tri_share else {},
            "triplet_mix": tri_mix, "padding": padding_overhead(plain.tolist(), buckets=main_buckets),
            "batches": len(sched)}


def _triplet_mix(micro: list, fuse: int, counted, tokens, words, min_words: int, tri_len: int, buckets, b: int,
                 static: bool) -> tuple[dict, dict]:
    """ArcCSE's triplet rows as the loop builds them (``ArcCSE.build_triplets``, ``merge``), per group of
    ``fuse`` micro-batches (one forward): T_j triplets in micro-batch j (its sentences of at least
    ``min_words`` words), in a graphed run (``static``) padded to ``max(TRIPLET_PAD_MIN, 2^⌈log2 T_j⌉)``
    where T_j > 0 (none where it is 0); the group's triplet rows padded to the widest micro-batch's
    triplet width W, the loop's own (``Method.width``): the run's ``buckets`` (cut at ``max_len``) of
    its longest such sentence truncated at ``tri_len``, past them widening up to ``tri_len``. Returns
    (counted width w -> {W: mean over the groups of width w of their triplets / (fuse · b) at W}: the
    share of a full triplet step, all ``b`` sentences of each micro-batch forming one, at width W;
    counted width -> share of its groups that run the triplet pass at all)."""
    import numpy as np

    from ..data.buckets import bucket_width
    from ..methods.arccse import TRIPLET_PAD_MIN

    mix: dict[int, dict[int, float]] = {}
    runs: dict[int, list[bool]] = {}
    groups = [micro[i : i + fuse] for i in range(0, len(micro), fuse)]
    for w, group in zip(counted.tolist(), groups):
        rows, width = 0, 0
        for idx in group:
            long = words[idx] >= min_words
            n_long = int(long.sum())
            if n_long:
                width = max(width, bucket_width(int(min(tokens[idx][long].max(), tri_len)), buckets, tri_len))
            rows += max(TRIPLET_PAD_MIN, 1 << max(n_long - 1, 0).bit_length()) if static and n_long else n_long
        runs.setdefault(int(w), []).append(bool(rows))
        if rows:
            at = mix.setdefault(int(w), {})
            at[int(width)] = at.get(int(width), 0.0) + rows / (fuse * b)
    out = {w: {W: v / len(runs[w]) for W, v in sorted(m.items())} for w, m in mix.items()}
    return out, {w: float(np.mean(r)) for w, r in runs.items()}


# ---------------------------------------------------------------------------------------- the plan
def corpus_lines(config: dict | Config, corpus: str) -> int:
    """Training sentences of ``corpus``: the prepared file's lines if present, else
    ``corpus.expected_lines`` (the configured corpus) or ``STS_UNLABELED_LINES``."""
    from ..utils import count_lines

    cfg = Config.of(config)
    path = Path(cfg.resources_dir) / "corpus" / f"{corpus}.txt"
    if path.is_file() and not _stale_sts_corpus(cfg, corpus):
        return count_lines(path)
    c = cfg.corpus
    if corpus == c.name and (c.expected_lines or c.max_sentences):
        return min(int(n) for n in (c.expected_lines, c.max_sentences) if n)
    if corpus == "sts-unlabeled":
        n = STS_UNLABELED[(cfg.sts_corpus.pairs, cfg.sts_corpus.duplicates)]
        return min(n, cfg.sts_corpus.max_sentences or n)
    raise SentembError(f"sentemb plan: the size of corpus '{corpus}' is unknown (set corpus.expected_lines or "
                       f"prepare {path})")


def schedule(settings, lines: int) -> tuple[int, int]:
    """(optimizer steps, STS-B dev evaluations) of a run on ``lines`` sentences (as ``setup``)."""
    from ..train.loop import eval_due

    b = settings.batch_size
    per_epoch = lines // b + (1 if lines % b >= 2 else 0)
    micro = max(1, int(round(settings.epochs * per_epoch)))
    total = micro // settings.grad_accum
    if settings.max_steps:
        total = min(total, settings.max_steps)
    evals = sum(eval_due(settings, s, settings.grad_accum, total) for s in range(1, total + 1)) \
        if settings.selects_by_dev else 0
    return total, evals


def plan_chunk(setting, share: int, per_sentence_gb: float, free_gb: float) -> int | None:
    """The chunk (sentences per forward with a graph) a training job uses on one GPU of ``free_gb``
    after its weights, optimizer state and CUDA context: ``train.chunk_size`` as set (None = the
    whole ``share`` of the batch), and for ``auto`` what ``sentemb.train.loop.auto_chunk`` would pick
    from the measured per-sentence activations (None when the share fits)."""
    from ..train.loop import AUTO_CHUNK_MARGIN, auto_chunk

    if setting is None:
        return None
    if setting != "auto":
        return int(setting) if int(setting) < share else None
    return auto_chunk(per_sentence_gb * 1e9, max(free_gb, 0.0) * 1e9, share, AUTO_CHUNK_MARGIN)  # bytes, as the loop


def _mix(a: Measure, b: Measure, share: float) -> Measure:
    """``a`` + ``share`` × (``b`` − ``a``) field by field: a step of which a ``share`` of the rows
    does ``b``'s extra work (ArcCSE: rows that form triplets)."""
    out = dataclasses.replace(a)
    for f in ("flops", "flops_layer", "act_bytes", "act_layer", "grad_passes", "nograd_passes"):
        setattr(out, f, getattr(a, f) + share * (getattr(b, f) - getattr(a, f)))
    return out


#: the Measure fields that depend on the width L as a + b·L + c·L² (matmuls linear in L, attention's
#: scores and context quadratic; saved activations likewise: the attention probabilities quadratic)
WIDTH_FIELDS = ("flops", "flops_layer", "act_bytes", "act_layer")
FIT_WIDTHS = (16, 32, 64)  # where a job shape is counted to fit a segment from MIN_COUNT_WIDTH up
MIN_COUNT_WIDTH = 8  # no count below this width (a counting line of 6 words)


def quadratic_through(points: dict[int, float]) -> tuple[Fraction, Fraction, Fraction]:
    """(a, b, c) of the one a + b·L + c·L² through three (L, y) points, exactly (rational
    arithmetic: counted FLOPs and bytes are integers)."""
    (x0, y0), (x1, y1), (x2, y2) = sorted((Fraction(x), Fraction(y)) for x, y in points.items())
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c = (d12 - d01) / (x2 - x0)
    b = d01 - c * (x0 + x1)
    return y0 - b * x0 - c * x0 * x0, b, c


def fit_points(lo: int, hi: int) -> tuple[int, ...] | None:
    """Three widths in [lo, hi] to count a segment at: ``FIT_WIDTHS`` from ``MIN_COUNT_WIDTH``
    (hi ≥ 64), lo, 2·lo, 4·lo above it, else lo, the middle, hi; None when [lo, hi] has no three
    distinct widths."""
    if hi - lo < 2:
        return None
    if lo <= MIN_COUNT_WIDTH and hi >= FIT_WIDTHS[-1]:
        return FIT_WIDTHS
    if 4 * lo <= hi:
        return (lo, 2 * lo, 4 * lo)
    pts = (lo, (lo + hi) // 2, hi)
    return pts if len(set(pts)) == 3 else None


def width_segments(run, arch) -> list[tuple[int, int]]:
    """The width ranges over which one step's FLOPs and bytes are one quadratic in the width L:
    up to ``max_len`` (every row grows with L); for ArcCSE with triplets, also ``max_len`` to the
    triplet length, where the main rows stay truncated at ``max_len`` and only the triplet rows grow."""
    t = run.train
    cap = _row_cap(run, arch)
    segs = [(MIN_COUNT_WIDTH, min(int(t.max_len), cap))]
    if cap > t.max_len:
        segs.append((int(t.max_len), cap))
    return segs


def fitted_measures(counter: "Counter", run, widths, method_cls=None, timing: list | None = None) -> dict[int, Measure]:
    """Width -> the Measure of one micro-batch of ``run`` at that width, for every width of
    ``widths``. Per segment (``width_segments``), the cheaper of: counting each width directly
    (``Counter.measure``), or counting the segment's three ``fit_points`` and pricing every width
    from the quadratic through them (``quadratic_through``, each of ``WIDTH_FIELDS``); cost = the sum
    of the widths not counted yet (a count's time grows with its width). Exact where the step's
    work is a quadratic in L (``tests/test_plan.py`` checks a fourth, directly counted width)."""
    arch = backbone_architecture(counter.config, run.backbone)
    t = run.train
    out: dict[int, Measure] = {}
    first, build_s = [timing], [None]

    def measure(w: int) -> Measure:  # batch building is timed once, whatever the width
        m = counter.measure(run, method_cls, w, first[0])
        if first[0] is not None:
            first[0], build_s[0] = None, m.build_s
        return m

    segs = width_segments(run, arch)
    cap = segs[-1][1]  # beyond it every row is truncated: a wider batch is the same step
    todo = sorted({min(int(w), cap) for w in widths})
    for k, (lo, hi) in enumerate(segs):
        group = [w for w in todo if (w <= hi if k == 0 else t.max_len < w <= hi)]
        if not group:
            continue
        pts = fit_points(lo, hi)
        cost = lambda ws: sum(w for w in ws if not counter.counted(run, method_cls, w))  # noqa: E731
        if pts is None or cost(group) <= cost(pts):
            out.update({w: measure(w) for w in group})
            continue
        ms = {p: measure(p) for p in pts}
        fits = {f: quadratic_through({p: getattr(m, f) for p, m in ms.items()}) for f in WIDTH_FIELDS}
        top = ms[max(pts)]
        for w in group:
            out[w] = dataclasses.replace(top, **{f: float(a + b * w + c * w * w) for f, (a, b, c) in fits.items()})
    return {int(w): dataclasses.replace(out[min(int(w), cap)], build_s=build_s[0]) for w in widths}


def job_measures(counter: "Counter", run, profile: dict, method_cls=None, timing: list | None = None) -> dict[int, Measure]:
    """Counted width -> the Measure of one micro-batch at that width (``_one_kind_measures``), with
    the kinds of step the method takes (``Method.step_kinds``; UNA's steps with and without negatives)
    each counted and attached (``Measure.kinds``) where there are several. Batch building is timed on
    the run itself (all its kinds of step)."""
    kinds = step_kinds(run, method_cls)
    if kinds[0][1] or abs(sum(share for share, _ in kinds) - 1) > 1e-9:
        raise SentembError(f"sentemb plan: {run.method}.step_kinds: the first kind has no overrides and the shares "
                           f"sum to 1 ({kinds})")
    main = _one_kind_measures(counter, run, profile, method_cls, timing)
    if len(kinds) == 1:
        return main
    others = [(share, _one_kind_measures(counter, dataclasses.replace(run, method_args={**run.method_args, **over}),
                                         profile, None, None)) for share, over in kinds[1:]]
    out = {}
    for w, m in main.items():
        parts = [(kinds[0][0], m)] + [(share, o[w]) for share, o in others]
        # memory is the kind that holds the most activations (the step with negatives); batch building the run's
        top = max((x for _, x in parts), key=lambda x: x.act_bytes)
        out[w] = dataclasses.replace(top, kinds=parts, build_s=m.build_s)
    return out


def step_kinds(run, method_cls=None) -> list[tuple[float, dict]]:
    """The run's kinds of optimizer step (``Method.step_kinds``); one for a pretraining stage."""
    from ..methods import get_method

    if method_cls is not None:
        return [(1.0, {})]
    cls = get_method(run.method)
    return cls.step_kinds(cls.make_args(run.method_args))


def build_timing_steps(run, method_cls=None) -> int:
    """Optimizer steps per timing round: at least ``BUILD_TIMING_STEPS`` and a whole number of the
    schedule's period (UNA: α steps, one with negatives), so that each kind of step is timed in its share."""
    share = step_kinds(run, method_cls)[0][0]
    period = max(1, round(1 / share)) if share < 1 else 1
    return period * -(-BUILD_TIMING_STEPS // period)


def _one_kind_measures(counter: "Counter", run, profile: dict, method_cls=None,
                       timing: list | None = None) -> dict[int, Measure]:
    """Counted width -> the Measure of one micro-batch at that width (``fitted_measures``). ArcCSE
    with triplets is priced in two variants, every sentence forming a triplet (``min_words`` 1)
    and none (``triplet: false``), each counted as an eager step and fitted in the width; per counted
    width, the no-triplet step plus, at each triplet width W, the profile's ``triplet_mix`` share of
    (full − none) at W (the FLOPs and activations are linear in the triplet rows: the rows the loop
    builds, a graphed run's padding of T included, ``_triplet_mix``; a profile without it mixes at
    the batch's width by ``triplet_share``, an upper bound; with ``triplet_pass: with_views`` a group
    with triplets wider than its views widens every view, which this scales by the triplet rows'
    share: low for mixed groups, random batches at ``max_len`` 32), the encoder passes by its
    ``triplet_batches`` (the share of batches that run
    the triplet pass at all). ``build_batch`` is timed in both on the real sentences and mixed by the job's
    mean triplet share."""
    widths = sorted(profile["count"])
    tri = profile.get("triplet_share") or {}
    if not tri or method_cls is not None:
        return fitted_measures(counter, run, widths, method_cls, timing)
    mixes = profile.get("triplet_mix") or {}
    at = sorted(set(widths) | {W for m in mixes.values() for W in m})  # the main widths and the triplets' own
    # counted as eager steps: a graphed run's padding of T (build_triplets) is priced by the profile's
    # triplet_mix, not by the count's 4 sentences padded to TRIPLET_PAD_MIN
    eager = dataclasses.replace(run.train, graphs=False,  # (update: graphed needs graphs; it counts no FLOP)
                                update="separate" if run.train.update == "graphed" else run.train.update)
    full = fitted_measures(counter, dataclasses.replace(run, train=eager, method_args={**run.method_args, "min_words": 1}),
                           at, None, timing)
    none = fitted_measures(counter, dataclasses.replace(run, train=eager, method_args={**run.method_args, "triplet": False}),
                           at, None, timing)
    build_s = None
    if timing is not None:  # every real sentence forming a triplet, and none, mixed by the job's share
        share = sum(f * tri.get(w, 0.0) for w, f in profile["count"].items())
        a, b = none[widths[0]].build_s, full[widths[0]].build_s
        build_s = a + share * (b - a) if a is not None and b is not None else (a if b is None else b)
    batches = profile.get("triplet_batches") or {}
    out = {}
    for w in widths:
        if mixes:  # the triplet rows each group has, at their own width (_triplet_mix)
            out[w] = dataclasses.replace(none[w])
            for W, share in (mixes.get(w) or {}).items():
                for f in ("flops", "flops_layer", "act_bytes", "act_layer"):
                    setattr(out[w], f, getattr(out[w], f) + share * (getattr(full[W], f) - getattr(none[W], f)))
        else:  # a profile without it (made by hand): every triplet row at the batch's width, an upper bound
            out[w] = _mix(none[w], full[w], tri.get(w, 0.0))
        for f in ("grad_passes", "nograd_passes"):  # a batch with any triplet runs the whole triplet pass
            lo, hi = getattr(none[w], f), getattr(full[w], f)
            setattr(out[w], f, lo + batches.get(w, tri.get(w, 0.0)) * (hi - lo))
        out[w].build_s = build_s
    return out


def _train_row(kind, label, run, m: Measure, encode: float, config: dict | Config, gpu, mfu, margin, res, method_cls=None,
               measures: dict[int, Measure] | None = None, profile: dict | None = None, lengths: str = "",
               dev_eval_s: float | None = None) -> Row:
    """One training (or pretraining) job. Memory is per GPU: weights, gradients and AdamW state on
    every one of ``train.devices``, activations of one chunk (``plan_chunk``) or of the GPU's share
    of the batch, at the widest counted width. GPU-hours add the chunked step's extra forward (1/3
    of the counted forward + backward) where the method has in-batch terms
    (``Method.has_batch_terms``): one pass over the share (``train.chunk_first_pass``, keyed or
    counter masks) or one per chunk (stream masks) at the step's floor. ``measures`` (width -> Measure) and ``profile`` (``width_profile``)
    price each width at its share of the micro-batches; without them every step is ``m``. With
    ``train.fuse_micro_batches`` k, k micro-batches are one forward: a step has grad_accum / k times
    one micro-batch's encoder passes, at the widest of the k widths (``width_profile``), and memory
    holds the k micro-batches' activations (flagged where they need chunks, which the loop refuses)."""
    from .shapes import depth

    cfg = Config.of(config)
    t = run.train
    arch = backbone_architecture(cfg, run.backbone)
    layers = depth(arch)
    measures = measures or {t.max_len: m}
    shares = (profile or {}).get("count") or {max(measures): 1.0}
    widest = measures[max(measures)]
    at = widest.at(layers)
    fused = bool(t.graphs and t.compile)
    static, per_sentence, share, chunk = _step_memory(run, at, gpu)
    steps, evals = schedule(t, corpus_lines(cfg, run.corpus))
    peak = _peak(gpu)
    per_gpu, flops_step = step_time(run, arch, measures, shares, gpu, mfu, method_cls)  # the given mfu, or step_time's
    mfu = mfu_for(arch, mfu, compiled=fused, attention=t.attention)  # the dev evaluation's (no measured time)
    eval_flops = evals * DEV_SENTENCES * encode
    if dev_eval_s is not None:  # measured seconds per evaluation (DEV_EVAL_SECONDS), scaled by the encoder
        eval_hours = evals * dev_eval_s / 3600
    else:
        eval_hours = eval_flops / (mfu * peak / (2 if dev_precision(t) == "fp32" else 1)) / 3600
    hours = per_gpu * t.devices * steps / 3600 + eval_hours
    mem = static + per_sentence * (chunk or share)
    host = HOST_BASE_GB + 8 * (at["trainable"] + at["frozen"]) / 1e9
    row = Row(kind, label, at["trainable"] + at["frozen"], flops_step, steps, hours, mem, host, graphs=t.graphs,
              compiled=fused)
    row.floor_hours = (flops_step * steps + eval_flops) / peak / 3600
    row.chunk = (f"{chunk}/{share}" if chunk is not None else f"{share}") + (f" x{t.devices}" if t.devices > 1 else "")
    row.lengths = lengths
    row.widths = {int(w): round(float(f), 4) for w, f in sorted(shares.items())}
    row.shapes = dict((profile or {}).get("shapes") or {})
    kinds = len(widest.kinds or ()) or 1  # each kind of step (UNA's 4B rows with negatives, 2B without) its own shapes
    if kinds > 1 and "main" in row.shapes:
        row.shapes["main"] *= kinds
    row.dev_share = eval_hours / hours if hours else 0.0
    row.step_s = per_gpu
    row = _flag(row, gpu, res, margin)
    fuse = int(getattr(t, "fuse_micro_batches", 1) or 1)
    if fuse > 1 and chunk is not None:  # the loop refuses to chunk fused micro-batches (resolve_chunk_size)
        row.flags.append(f"fuse_micro_batches {fuse}: {share} sentences do not fit one forward on {gpu}; set 1")
    if row.dev_share > DEV_SHARE_FLAG:
        row.flags.append(f"dev eval {100 * row.dev_share:.0f}% of its time > {100 * DEV_SHARE_FLAG:.0f}%")
    if widest.build_s is not None:
        cpus = int(res.get("cpus") or 1)
        workers = int(getattr(t, "workers", 0) or 0)
        parallel = max(1, min(workers, cpus)) if workers else 1
        row.build_s = widest.build_s * t.grad_accum / parallel
        if row.build_s > per_gpu:
            row.flags.append(f"batch building {1000 * row.build_s:.0f} ms/step on {parallel} process(es) > "
                             f"GPU step {1000 * per_gpu:.0f} ms")
    return row


def _step_memory(run, at: dict, gpu: str) -> tuple[float, float, int, int | None]:
    """(GB a GPU holds for weights, gradients, AdamW state, SAM's copy and the CUDA context; GB of
    activations per sentence; sentences per forward on one GPU, ``train.fuse_micro_batches`` included;
    the chunk, ``plan_chunk``, or None) of ``run`` at ``at`` (``Measure.at`` of its widest width)."""
    t = run.train
    static = (16 * at["trainable"] + 4 * at["frozen"] + (4 * at["trainable"] if t.sam_rho else 0)) / 1e9 \
        + CUDA_OVERHEAD_GB
    per_sentence = CUDA_ACTIVATION_RATIO * at["act"] / MICRO / 1e9
    fuse = int(getattr(t, "fuse_micro_batches", 1) or 1)  # micro-batches per forward (train.fuse_micro_batches)
    share = -(-t.batch_size * fuse // t.devices)
    return static, per_sentence, share, plan_chunk(t.chunk_size, share, per_sentence, gpu_spec(gpu)[1] - static)


def step_time(run, arch, measures: dict[int, Measure], shares: dict | None, gpu: str, mfu: float | None = None,
              method_cls=None) -> tuple[float, float]:
    """(seconds, counted FLOPs) of one optimizer step of ``run`` on one GPU of ``train.devices``:
    each counted width's ``Measure`` (``measures``) at its share of the micro-batches (``shares``,
    ``width_profile``'s ``count``; None: the widest alone), each kind of step mixed by its share
    (``Method.step_kinds``), priced by ``step_seconds`` at ``gpu``'s peak and ``mfu`` (None:
    ``mfu_for``). With ``train.chunk_size`` (``plan_chunk``) the grad passes run per chunk and the
    in-batch terms' no-grad first pass once (``train.chunk_first_pass``, keyed or counter masks) or
    once per chunk (stream masks), at the step's FLOPs + a third of the forward and backward; with
    ``train.fuse_micro_batches`` k, k micro-batches are one forward. What ``sentemb plan`` prices a
    training job's step at (``_train_row``), and ``sentemb plan-check`` a measured one."""
    from ..methods import get_method
    from .shapes import depth

    t = run.train
    cls = method_cls or get_method(run.method)
    layers = depth(arch)
    shares = shares or {max(measures): 1.0}
    at = measures[max(measures)].at(layers)
    fused = bool(t.graphs and t.compile)
    width = _width_key(arch)
    alone = bool(t.compile and not t.graphs and compiles_alone(width, t.attention))  # compiled, launched eagerly
    mfu = mfu_for(arch, mfu, compiled=fused or alone, attention=t.attention)
    scale = t.batch_size / MICRO
    fuse = int(getattr(t, "fuse_micro_batches", 1) or 1)
    _, _, share, chunk = _step_memory(run, at, gpu)
    extra = 4 / 3 if chunk is not None and cls.has_batch_terms else 1.0
    # train.chunk_first_pass: the no-grad first pass in one forward where the masks allow it (its memory is assumed to fit)
    whole_first = t.dropout_rng != "stream" and getattr(t, "chunk_first_pass", "auto") != "chunks"
    peak = _peak(gpu)
    flops_step, per_gpu = 0.0, 0.0
    for w, frac in shares.items():
        for part, mw in measures[w].kinds or [(1.0, measures[w])]:  # the kinds of step (UNA's negatives), mixed
            f = mw.at(layers)["flops"] * scale * t.grad_accum * extra
            if chunk is not None:  # per chunk the grad passes; the in-batch terms' no-grad forward once or per chunk
                n = -(-share // chunk)
                first = (1 if whole_first else n) / 3 if cls.has_batch_terms else 0.0
                passes = n * mw.grad_passes + first
            else:
                passes = mw.grad_passes + mw.nograd_passes / 3
            flops_step += frac * part * f
            per_gpu += frac * part * step_seconds(f / t.devices, layers, passes * t.grad_accum / fuse, peak, mfu,
                                                  t.graphs, fused, width, chunked=chunk is not None,
                                                  counter=t.dropout_rng == "counter", attention=t.attention,
                                                  compile_only=alone)
    return per_gpu, flops_step


def mfu_for(arch, mfu: float | None = None, compiled: bool = False, attention: str = "auto") -> float:
    """``mfu`` when given, else ``MEASURED_MFU`` by ``arch``'s hidden size (an ``ARCHITECTURES``
    name, a shape mapping, or a hidden size); ``compiled`` (``train.compile``, graphed or, where
    ``compiles_alone``, not: the same kernels, the same MFU at B 512 on the H200):
    ``COMPILED_GRAPHED_MFU`` where it was measured (``COMPILED_GRAPHED_BY_ATTENTION``'s for another
    ``train.attention``)."""
    if mfu is not None:
        return mfu
    key = _width_key(arch)
    if compiled and key == 768 and attention in COMPILED_GRAPHED_BY_ATTENTION:
        return COMPILED_GRAPHED_BY_ATTENTION[attention][1]
    return (COMPILED_GRAPHED_MFU.get(key) if compiled else None) or MEASURED_MFU[key]


def _width_key(arch) -> int:
    """768 for an encoder of hidden size 768 or less, else 1024: the widths the constants were measured at."""
    from .shapes import fields_of

    width = arch if isinstance(arch, int) else int(fields_of(arch).get("hidden_size", 768))
    return 768 if width <= 768 else 1024


def step_seconds(flops: float, layers: int, passes: float, peak: float, mfu: float, graphs: bool = False,
                 compiled: bool = False, width: int = 768, chunked: bool = False, counter: bool = False,
                 attention: str = "auto", compile_only: bool = False) -> float:
    """The plan's time of one optimizer step on one GPU: its ``flops`` at ``mfu`` of ``peak``
    (FLOP/s; × ``CHUNKED_MFU_RATIO`` when ``chunked``, gradient caching's chunks), or the floor
    (``STEP_FLOOR_S_PER_LAYER`` × ``layers`` × ``passes``, the host's; with ``graphs``,
    ``train.graphs``, the GPU's small kernels: ``GRAPHED_FLOOR_BY_WIDTH`` at the encoder's ``width``
    key (768 or 1024), and with ``compiled`` too, ``train.compile``,
    ``COMPILED_GRAPHED_FLOOR_S_PER_LAYER`` where measured, ``COMPILED_GRAPHED_BY_ATTENTION``'s for
    another ``attention``; ``compile_only``, ``train.compile`` without graphs:
    ``COMPILED_FLOOR_BY_ATTENTION``'s where measured), the larger. ``counter``
    (``train.dropout_rng: counter``) scales the floor by ``COUNTER_FLOOR_FACTOR`` and the FLOPs' time
    by ``COUNTER_COMPUTE_FACTOR``."""
    graphed = GRAPHED_FLOOR_BY_WIDTH.get(width, GRAPHED_STEP_FLOOR_S_PER_LAYER)
    compiled_floor = COMPILED_GRAPHED_BY_ATTENTION.get(attention, (COMPILED_GRAPHED_FLOOR_S_PER_LAYER,))[0]
    floor = ((compiled_floor if width == 768 else graphed) if graphs and compiled else
             graphed if graphs else
             COMPILED_FLOOR_BY_ATTENTION[attention] if compile_only and compiles_alone(width, attention) else
             STEP_FLOOR_S_PER_LAYER)
    compute = flops / (mfu * (CHUNKED_MFU_RATIO if chunked else 1.0) * peak)
    if counter:
        floor *= COUNTER_FLOOR_FACTOR["compiled" if graphs and compiled else "graphed" if graphs else "eager"]
        compute *= COUNTER_COMPUTE_FACTOR
    return max(compute, floor * layers * passes)


def compiles_alone(width: int, attention: str) -> bool:
    """Whether ``train.compile`` without graphs has a measured price at this width key and attention
    kernel (``COMPILED_FLOOR_BY_ATTENTION``); elsewhere such a step is priced as an eager one."""
    return width == 768 and attention in COMPILED_FLOOR_BY_ATTENTION


def _peak(gpu: str) -> float:
    """The dense bf16 peak of ``gpu`` in FLOP/s (``sentemb.ops.gpus.GPUS``)."""
    return gpu_spec(gpu)[2] * 1e12


def _flag(row: Row, gpu: str, res: dict, margin: float) -> Row:
    row.runtime_min, row.mem_mb = res.get("runtime"), res.get("mem_mb")
    hours = row.wall_hours if row.wall_hours is not None else row.gpu_hours
    if row.runtime_min is not None and row.runtime_min < margin * hours * 60:
        row.flags.append(f"runtime {row.runtime_min} min < {margin}x {hours * 60:.0f} min")
    if row.mem_mb is not None and row.mem_mb < margin * row.host_gb * 1000:
        row.flags.append(f"mem_mb {row.mem_mb} < {margin}x {row.host_gb * 1000:.0f} MB host")
    name, memory, _ = gpu_spec(gpu)
    if row.mem_gb > memory:
        row.flags.append(f"needs {row.mem_gb:.0f} GB > {name} {memory} GB")
    return row


def plan(config: dict | Config, gpu: str = DEFAULT_GPU, mfu: float | None = DEFAULT_MFU, margin: float = DEFAULT_MARGIN,
         work: str | Path | None = None, lengths_from: str | Path | None = None, graphs: bool | None = None,
         compile: bool | None = None, count_store: str | Path | None = None) -> list[Row]:
    """Every job of the configuration's DAG with its estimate (see the module docstring).
    ``graphs``, ``compile``: price every training and pretraining job with ``train.graphs``,
    ``train.compile`` set so (a what-if; None: as each run sets it). ``count_store``: a folder whose
    counts (``CountStore``) are reused and where new ones are kept (None: count everything; the CLI
    passes ``default_count_store()``)."""
    import torch

    from ..config.load import baseline_transfer, baselines, jobs, resolve_run, tested, transfer_runs
    from ..methods import get_method
    from ..train.pretrain import resolve_pretrain
    from ..config.fields import to_dict
    gpu = gpu_spec(gpu)[0]
    cfg = Config.of(config)
    resources = to_dict(cfg.job_resources)  # rule kind -> {gpu, runtime, mem_mb, cpus}
    torch.manual_seed(0)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sentemb-plan-", dir=work) as tmp, _frozen_imports():
        counter = Counter(cfg, Path(tmp), lengths_from, store=CountStore(count_store) if count_store else None)
        # pretraining stages: once per method and backbone a run of it reads
        for method in sorted({r.method for r in cfg.runs if get_method(r.method).pretrain_stage}):
            cls = get_method(method)
            backbones = sorted({r.backbone for r in cfg.runs if r.method == method
                                and "pretrained" in _requires(cfg, r)})
            for b in backbones:
                run = _with_graphs(resolve_pretrain(cfg, method, b), graphs, compile)
                rows.append(_priced_row(counter, "pretrain", f"{method}/{b}", run, cfg, gpu, mfu, margin,
                                        resources["pretrain"], cls.pretrain_stage))
        # training and its evaluations
        evaluations = []  # (job, architecture, with transfer)
        evaluated, transferred = tested(cfg), transfer_runs(cfg)
        for job in jobs(cfg):  # the Snakefile's training jobs (sentemb.config.load.jobs)
            run = _with_graphs(resolve_run(cfg, job.name, job.backbone, job.seed), graphs, compile)
            label = f"{job.name}/{job.backbone}/seed{job.seed}"
            rows.append(_priced_row(counter, "train", label, run, cfg, gpu, mfu, margin, resources["train"]))
            if (job.name, job.backbone) in evaluated:
                evaluations.append((label, backbone_architecture(cfg, job.backbone),
                                    (job.name, job.backbone) in transferred))
        evaluations += [(f"baseline/{b}/{p}", backbone_architecture(cfg, b), baseline_transfer(cfg))
                        for b, p in baselines(cfg)]
        peak = _peak(gpu)
        for label, arch, transfer in evaluations:
            encode, params = counter.encode(arch)
            transfer_n = sum(TRANSFER_TASK_SENTENCES[t] for t in cfg.evaluation.transfer_tasks)
            for kind, n in (("evaluate", STS_SENTENCES), ("transfer", transfer_n)):
                if kind == "transfer" and not transfer:
                    continue
                hours = n * encode / (mfu_for(arch, mfu) * peak / 2) / 3600  # fp32: TF32 at half the bf16 peak
                row = Row(kind, label, params, encode, n, hours, 4 * params / 1e9 + CUDA_OVERHEAD_GB,
                          HOST_BASE_GB + 8 * params / 1e9, floor_hours=n * encode / peak / 3600)
                rows.append(_flag(row, gpu, resources["evaluate"], margin))
            if transfer:
                rows.append(_classify_row(cfg, label, arch, resources["classify"], gpu, margin))
        rows.extend(_paraphrase_rows(cfg, gpu, resources["paraphrase"], margin))
        widths = sorted({c[1] for c in counter.counts})
        log.info("counted %d steps (width: counts %s) in %.0f s%s", len(counter.counts),
                 ", ".join(f"{w}: {sum(c[1] == w for c in counter.counts)}" for w in widths),
                 sum(c[2] for c in counter.counts),
                 f"; {counter.reused} reused from {counter.store.root}" if counter.store is not None else "")
    return rows


def _with_graphs(run, graphs: bool | None, compile: bool | None = None):
    """``run`` with ``train.graphs`` set to ``graphs`` and ``train.compile`` to ``compile`` (None: as
    it is). A run turned graphed or compiled keeps its fused micro-batches (each group one graph; the
    group's encoder forward compiled)."""
    over = {k: v for k, v in (("graphs", graphs), ("compile", compile)) if v is not None and getattr(run.train, k) != v}
    return dataclasses.replace(run, train=dataclasses.replace(run.train, **over)) if over else run


def _priced_row(counter: Counter, kind: str, label: str, run, cfg: Config, gpu: str, mfu, margin, res: dict,
                method_cls=None) -> Row:
    """A training or pretraining job priced at its corpus's lengths (``corpus_lengths``,
    ``width_profile``, ``job_measures``)."""
    arch = backbone_architecture(cfg, run.backbone)
    lengths = counter.lengths(run.corpus, run.backbone)
    profile = width_profile(run, arch, lengths)
    measures = job_measures(counter, run, profile, method_cls, lengths.sentences or None)
    encode = counter.encode(arch)[0]
    dev_eval_s = DEV_EVAL_SECONDS[dev_precision(run.train)] * encode / counter.encode(DEV_EVAL_REFERENCE)[0]
    return _train_row(kind, label, run, measures[max(measures)], encode, cfg, gpu, mfu, margin, res,
                      method_cls, measures=measures, profile=profile, lengths=lengths.source, dev_eval_s=dev_eval_s)


def dev_precision(settings) -> str:
    """The precision a run's STS-B dev evaluation runs in on a GPU (``train.eval_precision``: auto is bf16)."""
    return "fp32" if settings.eval_precision == "fp32" else "bf16"


def _classify_row(config: dict | Config, label: str, arch, res: dict, gpu: str, margin: float) -> Row:
    """SentEval's transfer classifier on the encoded vectors: CPU seconds per task from the measured
    384-d figures scaled to the vectors' width (``transfer.classifier_seconds``), wall time with
    ``job_resources.classify.cpus`` tasks at once (longest first); a job that would hold a GPU
    while it runs is flagged."""
    from .shapes import fields_of
    from ..evaluate.transfer import classifier_seconds, classifier_wall_seconds, feature_dim

    ev = Config.of(config).evaluation
    tasks = ev.transfer_tasks
    dim = int(fields_of(arch)["hidden_size"])
    secs = [classifier_seconds(t, dim, mrpc_mode=ev.mrpc_features, classifier=ev.transfer_classifier)
            for t in tasks]
    n = sum(TRANSFER_TASK_SENTENCES[t] for t in tasks)
    feats = sum(TRANSFER_TASK_SENTENCES[t] * feature_dim(t, dim, ev.mrpc_features) for t in tasks) * 4
    row = Row("classify", label, 0, 0.0, n, 0.0, 0.0, HOST_BASE_GB + 2 * feats / 1e9,
              cpu_hours=sum(secs) / 3600, wall_hours=classifier_wall_seconds(secs, res["cpus"]) / 3600)
    row = _flag(row, gpu, res, margin)
    if res.get("gpu"):
        row.flags.append(f"holds {res['gpu']} GPU idle (job_resources.classify.gpu: the classifier runs on the CPU)")
    return row


def _requires(config, r) -> tuple:
    from ..config.load import run_requires

    return run_requires(config, r)


def _paraphrase_rows(config: dict | Config, gpu: str, res: dict, margin: float) -> list[Row]:
    """Beam-search paraphrase shards (rough): per sentence the encoder's 2·N_enc·T plus, per beam
    and generated token, the decoder's 2·N_dec and the output projection's 2·d·V."""
    import torch
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    from ..stats.workflow import needs_paraphrases, run_corpora
    from ..stats.paraphrase import PEGASUS_LARGE_SHAPE

    cfg = Config.of(config)
    para = cfg.stats.paraphrase
    corpora = [c for c in run_corpora(cfg) or [cfg.corpus.name] if needs_paraphrases(cfg, c)]
    if not corpora:
        return []
    shape = {k: v for k, v in (para.model.random_init or PEGASUS_LARGE_SHAPE).items() if k != "model_type"}
    shape = {**{"vocab_size": PEGASUS_LARGE_SHAPE["vocab_size"]}, **shape}
    with torch.device("meta"):
        model = PegasusForConditionalGeneration(PegasusConfig(**shape))
    n_enc = sum(p.numel() for p in model.model.encoder.layers.parameters())
    n_dec = sum(p.numel() for p in model.model.decoder.layers.parameters())
    params = sum(p.numel() for p in model.parameters())
    d, v = model.config.d_model, model.config.vocab_size
    per_sentence = 2 * n_enc * PARAPHRASE_INPUT_LEN + para.num_beams * para.max_length * (2 * n_dec + 2 * d * v)
    # KV cache of a batch: beams x (self + cross) keys and values per decoder layer, fp32
    kv = (para.batch_size * para.num_beams * model.config.decoder_layers * 4 * d
          * (para.max_length + PARAPHRASE_INPUT_LEN) * 4)
    rows = []
    for c in corpora:
        lines = corpus_lines(cfg, c)
        for shard in range(para.shards):
            n = len(range(shard, lines, para.shards))
            # at GEN_MFU whatever stats.paraphrase.precision: fp32 generation is slower by an unmeasured factor
            hours = per_sentence * n / (GEN_MFU * _peak(gpu)) / 3600
            row = Row("paraphrase", f"{c}/shard{shard}of{para.shards}", params, per_sentence * para.batch_size,
                      math.ceil(n / para.batch_size), hours, (4 * params + kv) / 1e9 + CUDA_OVERHEAD_GB,
                      HOST_BASE_GB + 4 * params / 1e9, floor_hours=per_sentence * n / _peak(gpu) / 3600)
            rows.append(_flag(row, gpu, res, margin))
    return rows


def format_plan(rows: list[Row], gpu: str, mfu: float | None) -> str:
    """The plan as a table, then the totals: GPU-hours (estimate and floor, and their ratio), the
    lengths each training job was priced at, and the flags."""
    head = f"{'kind':<10} {'job':<50} {'params':>7} {'FLOP/step':>9} {'steps':>7} {'GPU-h':>7} {'floor-h':>7} " \
           f"{'CPU-h':>6} {'chunk':>7} {'shapes':>6} {'dev%':>4} {'bld ms':>6} {'step ms':>7} {'GPU GB':>6} " \
           f"{'req min':>7} {'req MB':>6}  flags"
    lines = [head, "-" * len(head)]
    for r in rows:
        shapes = "/".join(str(v) for v in r.shapes.values())
        dev = f"{100 * r.dev_share:.0f}" if r.dev_share is not None else ""
        bld = f"{1000 * r.build_s:.0f}" if r.build_s is not None else ""
        step = f"{1000 * r.step_s:.0f}" if r.step_s is not None else ""
        lines.append(f"{r.kind:<10} {r.job[:50]:<50} {r.params / 1e6:>6.0f}M {r.flops_step:>9.3g} {r.steps:>7} "
                     f"{r.gpu_hours:>7.2f} {r.floor_hours:>7.2f} {f'{r.cpu_hours:.2f}' if r.cpu_hours else '':>6} "
                     f"{r.chunk:>7} {shapes:>6} {dev:>4} {bld:>6} {step:>7} {r.mem_gb:>6.1f} {r.runtime_min or '':>7} "
                     f"{r.mem_mb or '':>6}  {'; '.join(r.flags)}")
    by_kind: dict[str, float] = {}
    for r in rows:
        if r.kind != "classify":
            by_kind[r.kind] = by_kind.get(r.kind, 0.0) + r.gpu_hours
    flagged = [r for r in rows if r.flags]
    cpu = [r for r in rows if r.kind == "classify"]
    lines += ["", "columns: floor-h = counted FLOPs / the GPU's bf16 peak; shapes = distinct padded widths one epoch "
              "meets per encoder pass (main[/triplets]), times the method's kinds of step (UNA: with and without "
              "negatives); dev% = share of the job's time in STS-B dev evaluation; "
              "bld ms = building one optimizer step's batches on the job's CPUs (train.workers), timed here; "
              "step ms = the estimated GPU step"]
    sources: dict[str, int] = {}
    for r in rows:
        if r.lengths:
            sources[r.lengths] = sources.get(r.lengths, 0) + 1
    for src, n in sources.items():
        lines.append(f"lengths ({n} training jobs): {src}")
    lines += ["GPU-hours by kind: " + ", ".join(f"{k} {v:.1f} ({sum(r.kind == k for r in rows)} jobs)"
                                                for k, v in by_kind.items())]
    if cpu:
        lines.append(f"CPU-hours of SentEval's transfer classifier (jobs without a GPU): "
                     f"{sum(r.cpu_hours for r in cpu):.1f} ({len(cpu)} jobs, longest {max(r.wall_hours for r in cpu) * 60:.0f} "
                     f"min on its cpus)")
    train = [r for r in rows if r.dev_share is not None]
    if train:
        dev_h = sum(r.dev_share * r.gpu_hours for r in train)
        lines.append(f"STS-B dev evaluation ({DEV_SENTENCES} sentences each, in each run's train.eval_precision at the "
                     f"H200's measured {DEV_EVAL_SECONDS['bf16']} s bf16 / {DEV_EVAL_SECONDS['fp32']} s fp32 for BERT-base): "
                     f"{dev_h:.1f} GPU-hours, "
                     f"{100 * dev_h / max(sum(r.gpu_hours for r in train), 1e-12):.1f}% of training; "
                     f"{sum(r.dev_share > DEV_SHARE_FLAG for r in train)} jobs above {100 * DEV_SHARE_FLAG:.0f}%")
    at = (f"MFU {mfu:.2f} of its bf16 peak" if mfu is not None else
          f"the MFU measured on an H200 ({', '.join(f'{v:.2f} at width {k}' for k, v in MEASURED_MFU.items())}) "
          f"and a floor of {1000 * STEP_FLOOR_S_PER_LAYER:.1f} ms per layer and pass")
    graphed, compiled = sum(r.graphs for r in rows), sum(r.compiled for r in rows)
    if graphed and mfu is None:
        at += (f" ({graphed} jobs with train.graphs: {1000 * GRAPHED_STEP_FLOOR_S_PER_LAYER:.2f} ms, the graphed step "
               "measured on an H200" + (f"; {compiled} of them with train.compile: "
                                        f"{1000 * COMPILED_GRAPHED_FLOOR_S_PER_LAYER:.2f} ms and MFU "
                                        f"{COMPILED_GRAPHED_MFU[768]:.3g} at width 768 with train.attention auto, other kernels at "
                                        "their own" if compiled
                                        else "") + ")")
    total = sum(by_kind.values())
    floor = sum(r.floor_hours for r in rows)
    lines += [f"total: {total:.1f} GPU-hours on {gpu} at {at}; floor {floor:.1f} GPU-hours (counted FLOPs at "
              f"{gpu}'s bf16 peak), estimate/floor {total / floor if floor else float('nan'):.1f}x; "
              f"{len(rows)} jobs, {len(flagged)} flagged (an estimate; see docs/gpu/h200-2026-11-26.md)"]
    return "\n".join(lines)
