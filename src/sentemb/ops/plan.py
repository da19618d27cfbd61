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
  the backbone's real widths (``sentemb.ops.shapes``), ``MICRO`` sentences per batch padded to the
  run's ``max_len`` (every counting sentence is ``max_len`` words long: an upper bound where real
  batches are shorter, e.g. ArcCSE's max_len 512), the method's own inputs built on that corpus.
  So both SimCSE views, SAM's second forward/backward, InfoCSE's auxiliary network and PaSeR's
  decoder are in the count. The model is built with ``shapes.layers_needed`` layers (2; InfoCSE 7)
  and the count scaled to the real depth by the FLOPs attributed to one encoder layer (every layer
  has one shape, so the work is linear in depth). The count at ``MICRO`` sentences is scaled
  linearly to the run's batch (matmuls are linear in batch at a fixed padded length; the in-batch
  similarity matrix is quadratic but below 0.1% of a step at B = 512) and times ``grad_accum``.
* Steps: the corpus's lines (``corpus.expected_lines``; the built-in ``sts-unlabeled`` corpus
  ``STS_UNLABELED_LINES``), ``batch_size``, ``epochs`` or ``max_steps``, ``grad_accum``, as
  ``sentemb.train.loop.batch_schedule`` cuts them. STS-B dev evaluations (fp32, ``DEV_SENTENCES``
  sentences each) are added as encoder forwards.
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
  forward (``torch.autograd.graph.saved_tensors_hooks``), under the CPU's bf16 autocast where the
  GPU run autocasts (train.precision auto/bf16), scaled by depth as the FLOPs are and linearly to
  the batch, × ``CUDA_ACTIVATION_RATIO`` (0.5: what an H200 measured against the CPU's figure).
  Allocator fragmentation and kernels' workspaces beyond the overhead are not modelled.

What it is not: a measurement of every job. One H200 calibrated the MFU and the floor (SimCSE,
ArcCSE; BERT-base, BERT-large, RoBERTa-large; B 16–1024): the estimate of a SimCSE step is within
25% of the measured one there (``sentemb gpu-check`` prints both); other GPUs are assumed to reach
the same share of their peak with the same host floor. Data loading, dev evaluation's host work and
the transfer classifiers' training (SentEval's k-fold grid search, CPU/GPU light but minutes per
task) are not in the FLOPs, and paraphrase generation is a rough formula (memory-bound decoding).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import SentembError
from .shapes import backbone_architecture
from ..config.settings import Config

log = logging.getLogger(__name__)

#: GPU -> memory in GB (the bf16 dense peaks are ``sentemb.ops.benchmark.PEAK_BF16_TFLOPS``)
GPU_MEMORY_GB = {"H100": 80, "H200": 141, "A100": 80, "A100-40": 40, "L40S": 48, "A10": 24, "4090": 24}
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
STS_UNLABELED_LINES = 30_840  # sentemb prepare-sts-corpus on SentEval's tree (deduplicated)
PARAPHRASE_INPUT_LEN = 32  # tokens per source sentence (assumed)

WORDS = ("the a of and to in is was for on that with as by it at from he she they man woman dog cat plays guitar "
         "car red runs park street city house music one two new old good").split()


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
    params_layer: int
    grad_passes: float = 1.0
    nograd_passes: float = 0.0

    def at(self, layers: int) -> dict:
        d = layers - self.layers
        return {"flops": self.flops + d * self.flops_layer, "act": self.act_bytes + d * self.act_layer,
                "trainable": self.trainable + d * self.params_layer, "frozen": self.frozen}


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


# ---------------------------------------------------------------------------------------- measuring
class Counter:
    """Counts steps and encodes on CPU, cached per distinct job shape (model dirs, corpora, inputs
    under one temporary directory)."""

    def __init__(self, config: dict | Config, work: Path):
        self.config, self.work = Config.of(config), Path(work)
        self.cache: dict = {}

    def model_dir(self, arch: str | dict, layers: int) -> Path:
        from .shapes import write_model_dir

        key = ("model", json.dumps(arch, sort_keys=True), layers)
        if key not in self.cache:
            self.cache[key] = write_model_dir(arch, self.work / f"model-{len(self.cache)}-{layers}", num_layers=layers)
        return self.cache[key]

    def corpus(self, max_len: int) -> Path:
        key = ("corpus", max_len)
        if key not in self.cache:
            rng = random.Random(0)
            p = self.work / f"corpus-{max_len}.txt"  # every line max_len words: padded to max_len
            p.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(max_len)) + "\n" for _ in range(4 * MICRO)))
            self.cache[key] = p
        return self.cache[key]

    def input(self, name: str, corpus: Path, model: Path) -> Path:
        """Input ``name`` built on the counting corpus (``sentemb.stats.inputs``: its ``build``)."""
        from ..stats.inputs import build_input, get_input

        key = ("input", name, str(corpus), str(model) if get_input(name).per_backbone else "")
        if key not in self.cache:
            d = self.work / "inputs" / f"{len(self.cache)}"
            try:
                self.cache[key] = build_input(name, d, corpus, model, self.config)
            except SentembError as e:
                raise SentembError(f"sentemb plan: input '{name}' for counting: {e}") from None
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

    def measure(self, run, method_cls=None) -> Measure:
        """Count one optimizer step (one micro-batch) of ``run`` at ``MICRO`` sentences."""
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
        key = ("measure", cls.__name__, json.dumps(_reduced(run.method, args), sort_keys=True, default=str),
               json.dumps(arch, sort_keys=True),
               t.max_len, bool(t.sam_rho), t.unpad, _autocast_name(t.precision), layers)
        if key in self.cache:
            return self.cache[key]
        model = self.model_dir(arch, layers)
        corpus = self.corpus(t.max_len)
        base = get_method(run.method)
        needed = () if method_cls is not None else base.requires(base.make_args(args))
        inputs = {n: str(self.input(n, corpus, model)) for n in needed}
        train = dataclasses.replace(t, batch_size=MICRO, grad_accum=1, chunk_size=None, max_steps=1, epochs=1, model_selection="last",
                                    eval_at_end=False, device="cpu", prefetch=False, save_steps=10**9,
                                    log_steps=10**9, precision=_autocast_name(t.precision), compile=False,
                                    log_grad_norms=False, num_threads=None)
        local = dataclasses.replace(run, train=train, method_args=args, tracking={"enabled": False, "uri": None},
                                    paths={"model": str(model), "corpus": str(corpus), "senteval": None,
                                           "inputs": inputs})
        self.cache[key] = m = _count(local, cls)
        _release()
        log.info("counted %s %.40s %s max_len %d: %.3g FLOPs/micro-step at %d layers", cls.__name__, arch,
                 json.dumps(_reduced(run.method, args), default=str)[:60], t.max_len, m.flops, layers)
        return m


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


def _layer0(module):
    """The first Transformer layer of an HF encoder, and its parameter count."""
    layer = module.encoder.layer[0]
    return layer, sum(p.numel() for p in layer.parameters())


def _count(run, method_cls) -> Measure:
    import torch

    from .flops import counted_by_module
    from ..train.loop import State, autocast, micro_batches, run_steps, setup

    with setup(run, "/nonexistent-plan", method_cls) as job:
        method, enc = job.method, job.method.encoder
        layer, params_layer = _layer0(enc)
        layer_names = {f"{type(enc).__name__}.encoder.layer.0"} | {
            f"{type(method).__name__}.{n}" for n, mod in method.named_modules() if mod is layer}
        trainable = sum(p.numel() for p in method.parameters() if p.requires_grad)
        frozen = sum(p.numel() for p in method.parameters() if not p.requires_grad)
        # activations: the distinct storages autograd saves in one micro-batch's forward
        (_, batch), = micro_batches(job, 0)
        seen, inside, total, in_layer = set(), [False], [0], [0]

        def pack(t):
            s = t.untyped_storage()
            ptr = (s.data_ptr(), s.nbytes())
            if ptr not in seen and t.device.type != "meta":
                seen.add(ptr)
                total[0] += s.nbytes()
                if inside[0]:
                    in_layer[0] += s.nbytes()
            # keep nothing: this forward is never backpropagated, and a saved output that refers to
            # itself through its grad_fn would form a cycle autograd cannot free
            return None

        h1 = layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        h2 = layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None), autocast(job.device, job.amp):
            terms = job.step_fn(batch)
        h1.remove(), h2.remove()
        del terms
        job.opt.zero_grad(set_to_none=True)
        # FLOPs: one optimizer step of the loop's own code; the encoder's passes in it
        calls = [0, 0]
        h3 = layer.register_forward_hook(lambda *a: calls.__setitem__(int(not torch.is_grad_enabled()),
                                                                       calls[int(not torch.is_grad_enabled())] + 1))
        try:
            _, flops, per_module = counted_by_module(lambda: list(run_steps(job, State(), 1)))
        finally:
            h3.remove()
        flops_layer = sum(v for k, v in per_module.items() if k in layer_names)
        if not flops_layer:
            raise SentembError(f"sentemb plan: no FLOPs attributed to the encoder's first layer ({sorted(per_module)[:8]})")
        return Measure(layers=len(enc.encoder.layer), flops=flops, flops_layer=flops_layer, act_bytes=total[0],
                       act_layer=in_layer[0], trainable=trainable, frozen=frozen, params_layer=params_layer,
                       grad_passes=float(calls[0]), nograd_passes=float(calls[1]))


# ---------------------------------------------------------------------------------------- the plan
def corpus_lines(config: dict | Config, corpus: str) -> int:
    """Training sentences of ``corpus``: the prepared file's lines if present, else
    ``corpus.expected_lines`` (the configured corpus) or ``STS_UNLABELED_LINES``."""
    from ..utils import count_lines

    cfg = Config.of(config)
    path = Path(cfg.resources_dir) / "corpus" / f"{corpus}.txt"
    if path.is_file():
        return count_lines(path)
    c = cfg.corpus
    if corpus == c.name and (c.expected_lines or c.max_sentences):
        return min(int(n) for n in (c.expected_lines, c.max_sentences) if n)
    if corpus == "sts-unlabeled":
        return STS_UNLABELED_LINES
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


def _train_row(kind, label, run, m: Measure, encode: float, config: dict | Config, gpu, mfu, margin, res, method_cls=None) -> Row:
    """One training (or pretraining) job. Memory is per GPU: weights, gradients and AdamW state on
    every one of ``train.devices``, activations of one chunk (``plan_chunk``) or of the GPU's share
    of the batch. GPU-hours add the chunked step's extra forward (1/3 of the counted forward +
    backward) where the method has in-batch terms (``Method.has_batch_terms``)."""
    from ..methods import get_method
    from .shapes import depth

    cfg = Config.of(config)
    t = run.train
    cls = method_cls or get_method(run.method)
    arch = backbone_architecture(cfg, run.backbone)
    layers = depth(arch)
    at = m.at(layers)
    mfu = mfu_for(arch, mfu)
    scale = t.batch_size / MICRO
    static = (16 * at["trainable"] + 4 * at["frozen"] + (4 * at["trainable"] if t.sam_rho else 0)) / 1e9 \
        + CUDA_OVERHEAD_GB
    per_sentence = CUDA_ACTIVATION_RATIO * at["act"] / MICRO / 1e9
    share = -(-t.batch_size // t.devices)
    chunk = plan_chunk(t.chunk_size, share, per_sentence, GPU_MEMORY_GB[gpu.upper()] - static)
    extra = 4 / 3 if chunk is not None and cls.has_batch_terms else 1.0
    flops_step = at["flops"] * scale * t.grad_accum * extra
    steps, evals = schedule(t, corpus_lines(cfg, run.corpus))
    peak = _peak(gpu)
    if chunk is not None:  # per chunk: the grad passes, and the in-batch terms' no-grad forward
        passes = -(-share // chunk) * (m.grad_passes + (1 / 3 if cls.has_batch_terms else 0.0))
    else:
        passes = m.grad_passes + m.nograd_passes / 3
    per_gpu = step_seconds(flops_step / t.devices, layers, passes * t.grad_accum, peak, mfu)
    hours = per_gpu * t.devices * steps / 3600 + evals * DEV_SENTENCES * encode / (mfu * peak / 2) / 3600
    mem = static + per_sentence * (chunk or share)
    host = HOST_BASE_GB + 8 * (at["trainable"] + at["frozen"]) / 1e9
    row = Row(kind, label, at["trainable"] + at["frozen"], flops_step, steps, hours, mem, host)
    row.chunk = (f"{chunk}/{share}" if chunk is not None else f"{share}") + (f" x{t.devices}" if t.devices > 1 else "")
    return _flag(row, gpu, res, margin)


def mfu_for(arch, mfu: float | None = None) -> float:
    """``mfu`` when given, else ``MEASURED_MFU`` by ``arch``'s hidden size (an ``ARCHITECTURES``
    name, a shape mapping, or a hidden size)."""
    if mfu is not None:
        return mfu
    from .shapes import fields_of

    width = arch if isinstance(arch, int) else int(fields_of(arch).get("hidden_size", 768))
    return MEASURED_MFU[768] if width <= 768 else MEASURED_MFU[1024]


def step_seconds(flops: float, layers: int, passes: float, peak: float, mfu: float) -> float:
    """The plan's time of one optimizer step on one GPU: its ``flops`` at ``mfu`` of ``peak``
    (FLOP/s), or the host floor (``STEP_FLOOR_S_PER_LAYER`` × ``layers`` × ``passes``), the larger."""
    return max(flops / (mfu * peak), STEP_FLOOR_S_PER_LAYER * layers * passes)


def _peak(gpu: str) -> float:
    from .benchmark import PEAK_BF16_TFLOPS

    name = gpu.upper().split("-")[0]
    if name not in PEAK_BF16_TFLOPS:
        raise SentembError(f"--gpu {gpu}: unknown GPU (known: {', '.join(sorted(GPU_MEMORY_GB))})")
    return PEAK_BF16_TFLOPS[name] * 1e12


def _flag(row: Row, gpu: str, res: dict, margin: float) -> Row:
    row.runtime_min, row.mem_mb = res.get("runtime"), res.get("mem_mb")
    hours = row.wall_hours if row.wall_hours is not None else row.gpu_hours
    if row.runtime_min is not None and row.runtime_min < margin * hours * 60:
        row.flags.append(f"runtime {row.runtime_min} min < {margin}x {hours * 60:.0f} min")
    if row.mem_mb is not None and row.mem_mb < margin * row.host_gb * 1000:
        row.flags.append(f"mem_mb {row.mem_mb} < {margin}x {row.host_gb * 1000:.0f} MB host")
    if row.mem_gb > GPU_MEMORY_GB[gpu.upper()]:
        row.flags.append(f"needs {row.mem_gb:.0f} GB > {gpu} {GPU_MEMORY_GB[gpu.upper()]} GB")
    return row


def plan(config: dict | Config, gpu: str = DEFAULT_GPU, mfu: float | None = DEFAULT_MFU, margin: float = DEFAULT_MARGIN,
         work: str | Path | None = None) -> list[Row]:
    """Every job of the configuration's DAG with its estimate (see the module docstring)."""
    import torch

    from ..config.load import baseline_transfer, baselines, jobs, resolve_run, tested, transfer_runs
    from ..methods import get_method
    from ..train.pretrain import resolve_pretrain
    from ..config.fields import to_dict
    gpu = gpu.upper()
    if gpu not in GPU_MEMORY_GB:
        raise SentembError(f"--gpu {gpu}: unknown GPU (known: {', '.join(sorted(GPU_MEMORY_GB))})")
    _peak(gpu)
    cfg = Config.of(config)
    resources = to_dict(cfg.job_resources)  # rule kind -> {gpu, runtime, mem_mb, cpus}
    torch.manual_seed(0)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sentemb-plan-", dir=work) as tmp:
        counter = Counter(cfg, Path(tmp))
        # pretraining stages: once per method and backbone a run of it reads
        for method in sorted({r.method for r in cfg.runs if get_method(r.method).pretrain_stage}):
            cls = get_method(method)
            backbones = sorted({r.backbone for r in cfg.runs if r.method == method
                                and "pretrained" in _requires(cfg, r)})
            for b in backbones:
                run = resolve_pretrain(cfg, method, b)
                m = counter.measure(run, cls.pretrain_stage)
                rows.append(_train_row("pretrain", f"{method}/{b}", run, m, counter.encode(backbone_architecture(cfg, run.backbone))[0], cfg,
                                       gpu, mfu, margin, resources["pretrain"], cls.pretrain_stage))
        # training and its evaluations
        evaluations = []  # (job, architecture, with transfer)
        evaluated, transferred = tested(cfg), transfer_runs(cfg)
        for job in jobs(cfg):  # the Snakefile's training jobs (sentemb.config.load.jobs)
            run = resolve_run(cfg, job.name, job.backbone, job.seed)
            m = counter.measure(run)
            label = f"{job.name}/{job.backbone}/seed{job.seed}"
            rows.append(_train_row("train", label, run, m, counter.encode(backbone_architecture(cfg, run.backbone))[0], cfg, gpu, mfu,
                                   margin, resources["train"]))
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
                          HOST_BASE_GB + 8 * params / 1e9)
                rows.append(_flag(row, gpu, resources["evaluate"], margin))
            if transfer:
                rows.append(_classify_row(cfg, label, arch, resources["classify"], gpu, margin))
        rows.extend(_paraphrase_rows(cfg, gpu, resources["paraphrase"], margin))
    return rows


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
            hours = per_sentence * n / (GEN_MFU * _peak(gpu)) / 3600
            row = Row("paraphrase", f"{c}/shard{shard}of{para.shards}", params, per_sentence * para.batch_size,
                      math.ceil(n / para.batch_size), hours, (4 * params + kv) / 1e9 + CUDA_OVERHEAD_GB,
                      HOST_BASE_GB + 4 * params / 1e9)
            rows.append(_flag(row, gpu, res, margin))
    return rows


def format_plan(rows: list[Row], gpu: str, mfu: float | None) -> str:
    head = f"{'kind':<10} {'job':<58} {'params':>8} {'FLOP/step':>10} {'steps':>7} {'GPU-h':>8} {'CPU-h':>6} " \
           f"{'chunk':>9} {'GPU GB':>7} {'req min':>7} {'req MB':>7}  flags"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.kind:<10} {r.job[:58]:<58} {r.params / 1e6:>7.0f}M {r.flops_step:>10.3g} {r.steps:>7} "
                     f"{r.gpu_hours:>8.2f} {f'{r.cpu_hours:.2f}' if r.cpu_hours else '':>6} {r.chunk:>9} {r.mem_gb:>7.1f} {r.runtime_min or '':>7} "
                     f"{r.mem_mb or '':>7}  {'; '.join(r.flags)}")
    by_kind: dict[str, float] = {}
    for r in rows:
        if r.kind != "classify":
            by_kind[r.kind] = by_kind.get(r.kind, 0.0) + r.gpu_hours
    flagged = [r for r in rows if r.flags]
    cpu = [r for r in rows if r.kind == "classify"]
    lines += ["", "GPU-hours by kind: " + ", ".join(f"{k} {v:.1f} ({sum(r.kind == k for r in rows)} jobs)"
                                                   for k, v in by_kind.items())]
    if cpu:
        lines.append(f"CPU-hours of SentEval's transfer classifier (jobs without a GPU): "
                     f"{sum(r.cpu_hours for r in cpu):.1f} ({len(cpu)} jobs, longest {max(r.wall_hours for r in cpu) * 60:.0f} "
                     f"min on its cpus)")
    at = (f"MFU {mfu:.2f} of its bf16 peak" if mfu is not None else
          f"the MFU measured on an H200 ({', '.join(f'{v:.2f} at width {k}' for k, v in MEASURED_MFU.items())}) "
          f"and a floor of {1000 * STEP_FLOOR_S_PER_LAYER:.1f} ms per layer and pass")
    lines += [f"total: {sum(by_kind.values()):.1f} GPU-hours on {gpu} at {at}, "
              f"{len(rows)} jobs, {len(flagged)} flagged (an estimate; see docs/gpu/h200-2026-11-26.md)"]
    return "\n".join(lines)
