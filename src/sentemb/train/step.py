"""How one optimizer step's gradient is computed: the step strategies of the training loop.

The loop (``sentemb.train.loop``) builds a step's micro-batches and calls the job's strategy, chosen
once at set-up by ``strategy_for``: ``gradients(job, batches, state, norms)`` accumulates the step's
gradient in the parameters' ``.grad`` and records its loss terms in ``state``, ``update(job)``
applies it (``apply_update``: clip, AdamW, scaler, schedule). The strategies:

* ``Plain``: each micro-batch whole, one forward and backward through ``job.step_fn``
  (``Method.losses``, or its ``torch.compile``'d version);
* ``Chunked`` (``train.chunk_size``): gradient caching, each micro-batch ``job.chunk`` sentences at
  a time (``chunked_backward``; Gao et al. 2021, §3.2); a micro-batch that fits one chunk is plain;
* ``Sharded`` (``train.devices`` > 1, ``sentemb.train.distributed``): this process's share of each
  micro-batch (``sharded_backward``; in chunks with ``train.chunk_size``), gradients summed over
  the processes once per step;
* ``SAM`` (``train.sam_rho``; Foret et al. 2021, Eqs. 2-3, ``sentemb.train.sam``): wraps one of
  the above, whose gradient it takes twice, at w and at w + ε̂.

Dropout masks are the strategies' shared context: with ``train.dropout_rng: keyed`` every forward
runs under ``keyed_dropout`` (masks keyed by (seed, micro-batch, sentence), the same in every
strategy), otherwise torch's generators, whose state a strategy rewinds where it recomputes a forward
(``_device_rng``, ``_rng_state``). The precision is ``autocast``'s, the same in all of them.

A new strategy (e.g. the step replayed as CUDA graphs) subclasses ``StepStrategy``, overrides
``gradients`` (and ``update`` if it applies the update its own way), is chosen in ``strategy_for``,
and refuses the settings it cannot serve in ``check_settings``, which the configuration's own check
calls (``TrainSettings.check``), so a bad combination fails at config load, before any job runs.

``job`` below is the loop's ``Job`` and ``state`` its ``State`` (``sentemb.train.loop``; this module
reads them, and does not import the loop, which imports it).
"""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Callable

from .. import SentembError
from .graphs import (MAX_GRAPHS, WARMUP, _Entry, _key, _null, _shapes, as_captured, capture_hazards, copy_stash,
                     python_state_error, python_work, read_state, set_dropout_key, stash_into)

if TYPE_CHECKING:  # nothing from sentemb.config: its TrainSettings.check imports this module
    import torch

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ precision and random state


def _precision(name: str, device: torch.device) -> torch.dtype | None:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[name]


def autocast(device: torch.device, precision: "str | torch.dtype | None"):
    """The loop's autocast context on ``device``: ``precision`` a ``train.precision`` name or the
    autocast dtype (None = fp32, autocast off)."""
    import torch

    dtype = _precision(precision, device) if isinstance(precision, str) else precision
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def _rng_state() -> dict:
    import numpy as np
    import torch

    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    import numpy as np
    import torch

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _device_rng(device: "torch.device") -> dict:
    import torch

    st = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_device_rng(st: dict, device: "torch.device") -> None:
    import torch

    torch.set_rng_state(st["cpu"])
    if "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


def keyed_dropout(job, micro: int, start: int, stop: "int | dict"):
    """The dropout context of sentences ``[start, stop)`` of micro-batch ``micro`` (``stop`` a
    whole batch: all its sentences): keyed masks (``sentemb.model.dropout``) with ``train.dropout_rng:
    keyed`` (CPU generators) or ``counter`` (hashed on the device), nothing with ``stream``."""
    if job.settings.dropout_rng == "stream":
        return nullcontext()
    from ..model.dropout import keyed

    if isinstance(stop, dict):
        stop = job.method.n_sentences(stop)
    counter = job.settings.dropout_rng == "counter"
    # train.graphs: the static device key a captured graph reads (sentemb.train.graphs.set_dropout_key)
    key = getattr(job, "dropout_key", None) if counter else None
    return keyed(job.seed, micro, start, stop, mode="counter" if counter else "generator", key=key,
                 kernel=_counter_kernel(job), device=job.device)


def _counter_kernel(job) -> str:
    """``train.counter_kernel`` resolved: ``auto`` is ``fused`` on CUDA, ``eager`` elsewhere;
    ``inline`` as set (the masks traced with the compiled encoder; ``sentemb.model.dropout.keyed``)."""
    kernel = getattr(job.settings, "counter_kernel", "auto")
    return ("fused" if job.device.type == "cuda" else "eager") if kernel == "auto" else kernel


# ------------------------------------------------------------------------------- the interface


class StepStrategy:
    """How an optimizer step's gradient is computed and applied; ``optimizer_step`` calls
    ``gradients`` then ``update`` once per step.

    ``batches``: the step's micro-batches as the loop builds them, (global micro index, CPU batch)
    each; ``state``: the loop's ``State``, or None for a pass whose terms are not recorded (SAM's
    second)."""

    def gradients(self, job, batches: list[tuple[int, dict]], state, norms: bool = False) -> None:
        """Accumulate the step's gradient in the parameters' ``.grad`` (loss / accum per micro-batch).
        With ``state``, the loss terms and throughput counts are recorded for logging and the
        finiteness check, and with ``norms`` (``train.log_grad_norms`` on a step that will be
        logged), each weighted term's gradient norm (``state.grad_norms``)."""
        raise NotImplementedError

    def update(self, job) -> None:
        """Apply the accumulated gradient and clear it (``apply_update``)."""
        apply_update(job)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MicroBatches(StepStrategy):
    """One forward and backward per micro-batch (``backward``, defined by the subclasses), the
    gradients summed in ``.grad``; each micro-batch's terms recorded in ``state``."""

    def gradients(self, job, batches: list[tuple[int, dict]], state, norms: bool = False) -> None:
        probe = _probe(job, state, norms, chunked=True)
        with _eager_if_probed(job, state, norms):
            self._gradients(job, batches, state, probe)

    def _gradients(self, job, batches: list[tuple[int, dict]], state, probe) -> None:
        for m, batch, members in self.units(job, batches):
            for mm, b in members:
                _count_input(job, state, mm, b)
            batch = {key: v.to(job.device, non_blocking=True) for key, v in batch.items()}
            job.method.micro = m  # what encode/batch_terms read (Method.micro)
            terms = self.backward(job, batch, m, probe)
            _record_terms(state, terms, len(members))
        self.reduce(job)
        if probe is not None:
            state.grad_norms = probe.norms()

    def units(self, job, batches: list[tuple[int, dict]]) -> list[tuple[int, dict, list[tuple[int, dict]]]]:
        """The step's units of work, one ``backward`` each: (micro index, batch, the micro-batches it
        holds). Here every micro-batch is one; ``Fused`` joins k."""
        return [(m, b, [(m, b)]) for m, b in batches]

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        """Forward and backward of micro-batch ``micro`` (``batch`` on the device), the loss scaled by
        the grad scaler and divided by ``job.accum``; feeds ``probe`` (``TermGradNorms``) when given.
        Returns its logged terms and ``loss``, as ``Method.losses`` (no ``WEIGHTED``)."""
        raise NotImplementedError

    def reduce(self, job) -> None:
        """After the step's last micro-batch (the sum over processes, ``Sharded``)."""


class Plain(MicroBatches):
    """The whole micro-batch at once, through ``job.step_fn`` (``Method.losses``, or compiled)."""

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        from ..methods.base import WEIGHTED

        with autocast(job.device, job.amp), keyed_dropout(job, micro, 0, batch):
            terms = job.step_fn(batch)
        weighted = terms.pop(WEIGHTED, None)  # graph-carrying weighted terms: never logged as such
        loss = terms["loss"]
        if probe is not None:
            probe.add(weighted or {"loss": loss})
        job.scaler.scale(loss / job.accum).backward()
        return terms


class Chunked(Plain):
    """Gradient caching (``train.chunk_size``, ``chunked_backward``): a micro-batch of more than
    ``job.chunk`` sentences in chunks of ``job.chunk``, one that fits a chunk as ``Plain``."""

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        n = job.method.n_sentences(batch)
        if job.chunk < n:
            return chunked_backward(job, batch, micro, probe, 0, n)
        return super().backward(job, batch, micro, probe)


class Fused(MicroBatches):
    """``train.fuse_micro_batches`` k > 1: each k consecutive micro-batches of a step in one forward
    and backward (``fused_backward``). The eager step's floor on a GPU is the host issuing each
    encoder pass's kernels (``sentemb.ops.plan.STEP_FLOOR_S_PER_LAYER``), nearly the same for 16 or
    256 sentences, so k micro-batches cost about one pass instead of k. The terms are logged as the
    micro-batches' (their sum, counted k times)."""

    def __init__(self, k: int):
        self.k = k

    def __repr__(self) -> str:
        return f"Fused({self.k})"

    def units(self, job, batches: list[tuple[int, dict]]) -> list[tuple[int, dict, list[tuple[int, dict]]]]:
        """Each k consecutive micro-batches as one unit: their tensors in one flat batch (``FUSED_KEY``
        names micro-batch j's ``key``), so that ``Graphed`` keys, copies and captures the unit as it
        does one micro-batch; its index is the first one's (a fusable method reads none:
        ``Method.fusable``). Each tensor of two or more dimensions is padded to the group's widest
        (``Method.pad_width``, as ``Method.merge`` pads them anyway), so a unit's shape is its widest
        member's k times, not one of the combinations of the members' widths: as few graphs as
        widths."""
        out = []
        for i in range(0, len(batches), self.k):
            group = batches[i : i + self.k]
            widths = {}
            for _, b in group:
                for key, v in b.items():
                    if v.dim() >= 2:
                        widths[key] = max(widths.get(key, 0), int(v.size(1)))
            flat = {FUSED_KEY.format(j, key): job.method.pad_width(key, v, widths[key]) if key in widths else v
                    for j, (_, b) in enumerate(group) for key, v in b.items()}
            out.append((group[0][0], flat, group))
        return out

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        group: dict[int, dict] = {}
        for name, v in batch.items():
            j, key = name.split(FUSED_SEP, 1)
            group.setdefault(int(j), {})[key] = v
        return fused_backward(job, [(micro + j, group[j]) for j in sorted(group)], probe)


#: a fused unit's flat batch key for micro-batch j's tensor ``key`` (``Fused.units``)
FUSED_SEP = "|"
FUSED_KEY = "{}" + FUSED_SEP + "{}"


def _probe(job, state, norms: bool, chunked: bool = False):
    """The step's ``TermGradNorms`` when its per-term norms are logged (``train.log_grad_norms`` on a
    logged step), else None; ``chunked``: the gradient comes in chunks when ``job.chunk`` is set."""
    if state is None or not norms:
        return None
    from .grad_norms import TermGradNorms

    return TermGradNorms(job.method.grad_norm_parameters(), job.accum, job.scaler, parts=chunked and bool(job.chunk))


def _count_input(job, state, m: int, batch: dict) -> None:
    """Micro-batch ``m``'s sentences and real tokens in ``state``'s throughput counts (none without a state)."""
    if state is None:
        return
    state.n_sent += len(job.micro[m])
    if "attention_mask" in batch:
        state.n_tok += int(batch["attention_mask"].sum())


def _record_terms(state, terms: dict, n: int = 1) -> None:
    """The logged ``terms`` of ``n`` micro-batches (their sum, ``loss`` among them) in ``state``: the
    finiteness check's entry (read without a sync, ``check_finite``), the running sums the log
    divides by ``n_terms``, and ``state.terms`` per micro-batch. Nothing without a state (SAM's
    second pass)."""
    import torch

    if state is None:
        return
    detached = {key: v.detach() for key, v in terms.items()}
    state.terms = detached if n == 1 else {key: v / n for key, v in detached.items()}
    state.pending.append((state.step + 1, torch.isfinite(detached["loss"]), state.terms))
    for key, v in detached.items():
        state.sum_terms[key] = state.sum_terms[key] + v if key in state.sum_terms else v
    state.n_terms += n


def fused_backward(job, group: list[tuple[int, dict]], probe=None) -> dict:
    """k micro-batches ``group`` ((global micro index, batch on the device) each) in one forward and
    backward: ``Method.merge`` concatenates them, one ``Method.encode`` encodes every row, each
    micro-batch's in-batch terms (``batch_terms``) see its own rows only (its own negatives), and
    the per-sentence terms (``row_terms``) run once on the merge, whose value is the micro-batches'
    mean (``Method.fusable``). The backward is that of Σ_j L_j / accum, what accumulating the k
    micro-batches one by one back-propagates. With ``train.compile`` the encoder's forward over the
    merge is the compiled ``job.encode_fn`` (as gradient caching's chunks); the terms stay eager.
    Returns the detached logged terms and ``loss`` summed over the k micro-batches."""
    from ..methods.base import WEIGHTED, add_terms, total_loss

    method, k = job.method, len(group)
    merged, spans = method.merge([b for _, b in group])
    logged: dict = {}
    weighted_sum: dict = {}
    encode = getattr(job, "encode_fn", None) or method.encode  # compiled with train.compile
    with autocast(job.device, job.amp):
        enc = encode(merged)
        for (m, batch), (a, b) in zip(group, spans):
            out = method.batch_terms({key: v[a:b] for key, v in enc.batch.items()}, batch)
            weighted = out.pop(WEIGHTED)
            add_terms(logged, {key: v.detach() for key, v in out.items()})
            add_terms(weighted_sum, weighted)
        rows = method.row_terms(enc, merged, merged)
    row_weighted = rows.pop(WEIGHTED)
    add_terms(logged, {key: k * v.detach() for key, v in rows.items()})
    add_terms(weighted_sum, {key: k * v for key, v in row_weighted.items()})
    loss = total_loss(weighted_sum)
    if probe is not None:
        probe.add(weighted_sum)
    if loss.requires_grad:
        job.scaler.scale(loss / job.accum).backward()
    return {"loss": loss.detach(), **logged}


class Sharded(MicroBatches):
    """``train.devices`` > 1 (``sentemb.train.distributed``): this process (``job.rank`` of
    ``job.world``) computes its share of every micro-batch (``sharded_backward``; in chunks,
    ``chunked_backward``, when the share is more than ``job.chunk`` sentences); the step's gradient
    is summed over the processes once, after the last micro-batch."""

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        n = job.method.n_sentences(batch)
        lo, hi = _share(n, job.rank, job.world)
        if job.chunk and job.chunk < hi - lo:
            return chunked_backward(job, batch, micro, probe, lo, hi)
        return sharded_backward(job, batch, micro, lo, hi)

    def reduce(self, job) -> None:
        from .distributed import reduce_gradients

        reduce_gradients(job.method.parameters())


class SAM(StepStrategy):
    """Sharpness-Aware Minimization (``train.sam_rho``; Foret et al. 2021, Eqs. 2-3, ``sentemb.train.sam``)
    around ``inner``: the gradient g at w (its loss terms are the ones logged), w ← w + ρ·g/‖g‖, the
    gradient again at the perturbed weights on the same micro-batches with the same dropout masks
    (the RNG state is rewound, and the batches themselves are the kept ones, built from the (seed,
    micro) generators), then w restored exactly; ``update`` clips and steps with that second gradient."""

    def __init__(self, inner: StepStrategy):
        self.inner = inner
        # w's copies, reused every step (sam.ascend's ``into``): a copy of the weights stays allocated between
        # steps, which the plan's static memory counts (16 + 4 bytes a trainable parameter with SAM)
        self.saved: list = []

    def gradients(self, job, batches: list[tuple[int, dict]], state, norms: bool = False) -> None:
        from . import sam

        rng = _rng_state()
        self.inner.gradients(job, batches, state, norms)
        saved = sam.ascend([p for group in job.opt.param_groups for p in group["params"]], job.settings.sam_rho,
                           into=[w for _, w in self.saved])
        self.saved = saved
        clear_grads(job)
        _set_rng_state(rng)  # same dropout masks in the second pass
        with _eager_if_probed(job, state, norms):  # as the first pass ran: the same masks
            self.inner.gradients(job, batches, None)
        sam.restore(saved)

    def update(self, job) -> None:
        self.inner.update(job)

    def __repr__(self) -> str:
        return f"SAM({self.inner!r})"


def graphs_summary(strategy) -> dict:
    """``train.json``'s ``graphs`` record of a graphed run (this process): whether the steps were CUDA
    graphs (false: the static step run eagerly, a CPU), the micro-batch shapes captured, their
    replays, and the micro-batches run eagerly past ``MAX_GRAPHS`` shapes. Empty without graphs."""
    while strategy is not None and not isinstance(strategy, Graphed):
        strategy = getattr(strategy, "inner", None)
    if strategy is None:
        return {}
    return {"graphs": {"cuda_graphs": bool(strategy.capture), "shapes": len(strategy.entries),
                       "replays": sum(e.replays for e in strategy.entries.values()),
                       "eager_past_the_shape_limit": strategy.overflow}}


class Graphed(MicroBatches):
    """``train.graphs: true`` (``sentemb.train.graphs``' docstring: the design, what it refuses):
    ``inner``'s micro-batch backward captured as a CUDA graph once per batch shape and replayed;
    ``capture`` False (a CPU) runs it eagerly on the same static inputs. The capture machinery (the
    capture check, the dropout key, the shapes) is ``sentemb.train.graphs``'."""

    def __init__(self, inner: MicroBatches, capture: bool):
        self.inner, self.capture = inner, capture
        self.entries: dict[tuple, _Entry] = {}
        self.pool = None
        self.step_used: set[int] = set()
        self.step_idle: set[int] = set()  # Method.static_idle_parameters in every micro-batch of the step
        self.captures = 0
        self.overflow = 0  # micro-batches run eagerly: their shape came after MAX_GRAPHS others
        self.storage = None  # a hooked method's parameters, buffers and tensor attributes at the first capture (check_storage)
        self.reads: dict = {}  # the method's plain attributes its captured steps read, as first captured (check_reads)
        self.updates: UpdateGraphs | None = None  # train.update: graphed

    def __repr__(self) -> str:
        return f"Graphed({self.inner!r})"

    # -- MicroBatches
    def gradients(self, job, batches, state, norms: bool = False) -> None:
        if self.storage is not None:  # after_step (or anything) replaced a tensor the graphs read
            from .graphs import check_storage

            check_storage(job.method, self.storage, f"run '{job.run.name}'")
        if self.reads:  # ... or changed a Python value they read
            from .graphs import check_reads

            check_reads(job.method, self.reads, f"run '{job.run.name}'")
        # on the host, from the CPU batches: the parameters an eager step would give no gradient
        idle = [{id(p) for p in job.method.static_idle_parameters(b)} for _, b in batches]
        self.step_idle = set.intersection(*idle) if idle else set()
        if norms:  # extra backward passes for the per-term norms: this step eagerly (module docstring)
            key, job.dropout_key = getattr(job, "dropout_key", None), None  # eager: keyed by each micro-batch
            try:
                self.inner.gradients(job, batches, state, norms)
            finally:
                job.dropout_key = key
            self.step_used.update(id(p) for p in job.method.parameters() if p.grad is not None)
            return
        super().gradients(job, batches, state, norms)

    def reduce(self, job) -> None:
        self.inner.reduce(job)

    def units(self, job, batches):
        return self.inner.units(job, batches)

    def backward(self, job, batch: dict, micro: int, probe) -> dict:
        key = _key(batch)
        entry = self.entries.get(key)
        if entry is None and self.capture and len(self.entries) >= MAX_GRAPHS:
            if not self.overflow:
                log.warning("train.graphs: more than %d distinct micro-batch shapes; the others run eagerly (pad to "
                            "fewer widths with train.buckets)", MAX_GRAPHS)
            self.overflow += 1
            set_dropout_key(job, micro)  # counter masks: this micro-batch's key, not the last replay's
            out = self.inner.backward(job, batch, micro, None)
            self.step_used.update(id(p) for p in job.method.parameters() if p.grad is not None)
            return {k: v.detach() for k, v in out.items()}
        if entry is None:
            entry = self._capture(job, batch, micro, key)
        else:
            for k, v in batch.items():
                entry.batch[k].copy_(v, non_blocking=True)
        set_dropout_key(job, micro)
        if entry.graph is not None:
            entry.graph.replay()
            out = entry.out
        else:
            entry.stash.clear()
            with as_captured(), stash_into(job.method, entry.stash):
                out = entry.out = self.inner.backward(job, entry.batch, micro, None)
        entry.replays += 1
        if entry.stash:  # the replay's stash (static outputs) under its micro-batch, as Method.stash keeps it
            copy_stash(job.method, entry.stash, micro)
        self.step_used.update(id(p) for p in entry.used)
        return {k: v.detach().clone() for k, v in out.items()}

    def update(self, job) -> None:
        """The loop's update (``apply_update``) with the gradient tensors kept; a parameter that no
        micro-batch of this step wrote, or that the method names idle in every one of them
        (``Method.static_idle_parameters``: the static step wrote it zeros where an eager step writes
        nothing), is handed over without a gradient, as in eager mode."""
        params = [p for g in job.opt.param_groups for p in g["params"]]
        idle = [(p, p.grad) for p in params
                if p.grad is not None and (id(p) not in self.step_used or id(p) in self.step_idle)]
        for p, _ in idle:
            p.grad = None
        if job.settings.update == "graphed":
            if self.updates is None:
                self.updates = UpdateGraphs(self.capture and job.device.type == "cuda")
            self.updates.apply(job)
        else:
            apply_update(job)
        for p, g in idle:
            p.grad = g
        self.step_used, self.step_idle = set(), set()

    # -- capture
    def _capture(self, job, batch: dict, micro: int, key: tuple) -> _Entry:
        import torch

        method, device = job.method, job.device
        if getattr(job, "prefetch", None) is not None:  # no build_batch running beside the capture check
            job.prefetch.wait()
        static = {k: v.detach().clone() for k, v in batch.items()}
        entry = _Entry(batch=static)
        params = [p for p in method.parameters() if p.requires_grad]
        grads = [p.grad for p in params]
        buffers = [(b, b.detach().clone()) for b in method.buffers()]
        rng = _device_rng(device)
        cuda = self.capture and device.type == "cuda"
        if job.settings.dropout_rng == "counter" and _counter_kernel(job) == "fused" and cuda:
            from ..model.dropout import warm_fused

            warm_fused(device)  # compiled and tuned here, not in the passes that look like a capture
        if job.settings.dropout_rng == "counter" and _counter_kernel(job) == "inline":
            from ..model.dropout import warm_inline

            warm_inline(device, method.n_sentences(static))  # its device constants, made before the capture check
        side = torch.cuda.Stream(device) if cuda else None
        if cuda:  # the warm-ups read what the main stream wrote (the static inputs, the step's gradients so far)
            side.wait_stream(torch.cuda.current_stream(device))
        try:
            for p in params:
                p.grad = None
            with (torch.cuda.stream(side) if cuda else _null()), as_captured(), stash_into(method, entry.stash):
                set_dropout_key(job, micro)
                # the check's pass through the eager function: torch.compile skips a frame first met
                # under a dispatch mode, and would then never compile it (train.compile)
                with eager_functions(job), python_work(method) as python, capture_hazards(device) as hazards:
                    self.inner.backward(job, static, micro, None)
                errors = []
                if hazards:
                    errors.append(
                        f"run '{job.run.name}': train.graphs: method '{method.name}' cannot be captured as a CUDA graph: "
                        + "; ".join(map(str, hazards)) + ". Make these ops static (see docs/methods/writing-a-method.md, "
                        "'Graph-safe steps') or set train.graphs: false")
                if python:
                    errors.append(python_state_error(method, python, f"run '{job.run.name}'"))
                if errors:
                    raise SentembError(" Also: ".join(errors))
                for k, snap in read_state(method, python.read).items():
                    self.reads.setdefault(k, snap)
                entry.used = [p for p in params if p.grad is not None]
                for _ in range(WARMUP - 1 if cuda else 0):
                    self.inner.backward(job, static, micro, None)
            if cuda:
                torch.cuda.current_stream(device).wait_stream(side)
        finally:
            for p, g in zip(params, grads):
                p.grad = g
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            _set_device_rng(rng, device)
        for p in entry.used:  # allocated outside the graph's pool: backward accumulates into them
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if cuda:
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: a worker's pin-memory thread may allocate while this thread captures
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"), \
                        stash_into(method, entry.stash):
                    entry.out = self.inner.backward(job, static, micro, None)
            except Exception as e:  # noqa: BLE001 - a capture error names the run and the way out
                raise SentembError(f"run '{job.run.name}': train.graphs: capturing method '{method.name}' at batch shape "
                                   f"{_shapes(key)} failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}; "
                                   "set train.graphs: false") from e
            self.pool = graph.pool()
            entry.graph = graph
        self.captures += 1
        self.entries[key] = entry
        if self.storage is None and _has_hook(method):  # only a hook changes state between steps
            from .graphs import state_storage

            self.storage = state_storage(method)
        log.info("train.graphs: %s shape %d (%s)", "captured" if cuda else "static", len(self.entries), _shapes(key))
        return entry



def _has_hook(method) -> bool:
    """Whether ``method`` overrides ``Method.after_step`` or ``Method.before_epoch`` (keeps state across
    steps): the storage a graph reads is checked before each step for those only (about 0.4 ms for
    BERT-base on a slow CPU; a method without a hook changes nothing between steps)."""
    from ..methods.base import Method

    return type(method).after_step is not Method.after_step or type(method).before_epoch is not Method.before_epoch


def _eager_if_probed(job, state, norms: bool):
    """``eager_functions(job)`` on a step whose per-term gradient norms are logged (``state`` and
    ``norms``, as ``_probe``) in a compiled run (``train.compile``), else nothing. The norms'
    ``autograd.grad(retain_graph=True)`` on a compiled graph, then the step's own backward on it, gave
    a wrong ``.grad`` (found on the CPU, torch 2.13), so such a step runs eagerly: its first pass
    (``MicroBatches.gradients``) and SAM's second (``SAM.gradients``), which must draw the same masks."""
    if state is None or not norms or not getattr(job.settings, "compile", False):
        return nullcontext()
    return eager_functions(job)


@contextmanager
def eager_functions(job):
    """Inside: ``job``'s compiled functions (``train.compile``: ``step_fn``, ``encode_fn``) replaced by
    the eager ones, for a pass under a dispatch mode (the capture check, a FLOP count): Dynamo skips
    a frame first met under a dispatch mode, and would never compile it afterwards."""
    saved = job.step_fn, getattr(job, "encode_fn", None)
    job.step_fn = job.method.losses
    if saved[1] is not None:
        job.encode_fn = None
    try:
        yield
    finally:
        job.step_fn = saved[0]
        if saved[1] is not None:
            job.encode_fn = saved[1]


# -------------------------------------------------------------------------------- the chooser


def check_settings(settings, where: str) -> None:
    """Refuse the training settings (a ``TrainSettings``) no step strategy can serve, naming the
    keys; ``where`` prefixes the message (the config key or the run). ``TrainSettings.check`` calls
    it (config load and set-up), ``strategy_for`` too. SAM's ascent step would be scaled by fp16's
    gradient scaler; ``Sharded`` neither measures per-term norms nor runs the compiled step."""
    if settings.devices > 1 and settings.log_grad_norms:
        raise SentembError(f"{where}: train.log_grad_norms is not supported with train.devices {settings.devices} "
                           "(the per-term norms would be one process's share); set one of them back")
    if settings.devices > 1 and settings.compile:
        raise SentembError(f"{where}: train.compile cannot be combined with train.devices {settings.devices}")
    if settings.dropout_rng == "keyed" and settings.compile:
        raise SentembError(f"{where}: train.dropout_rng keyed cannot be combined with train.compile (its masks are drawn "
                           "row by row on the CPU); use dropout_rng counter, the same keys hashed on the device")
    if getattr(settings, "chunk_first_pass", "auto") == "whole" and settings.dropout_rng == "stream":
        raise SentembError(f"{where}: train.chunk_first_pass whole needs train.dropout_rng keyed or counter (stream masks "
                           "are drawn per chunk and replayed chunk by chunk); use chunks or auto, or another dropout_rng")
    check_fuse_settings(settings, where)
    from .graphs import check_graph_settings

    check_graph_settings(settings, where)
    if settings.update == "fused" and settings.precision == "fp16":
        raise SentembError(f"{where}: train.update fused cannot be combined with train.precision fp16 (the gradient "
                           "scaler hands fused AdamW its own grad_scale); use bf16, fp32 or auto, or train.update: "
                           "separate")
    if settings.optimizer == "adamw_hf" and settings.update != "separate":
        raise SentembError(f"{where}: train.optimizer adamw_hf cannot be combined with train.update {settings.update} "
                           "(transformers' AdamW has no fused or capturable kernel); set train.update: separate")
    if settings.update == "graphed" and not settings.graphs:
        raise SentembError(f"{where}: train.update graphed needs train.graphs: true (it captures the optimizer step "
                           "beside the micro-batches' graphs); set train.graphs: true or train.update: separate")

    for key, default in (("compile_mode", "default"), ("compile_random", "eager")):
        if getattr(settings, key) != default and not settings.compile:
            raise SentembError(f"{where}: train.{key} {getattr(settings, key)} has no effect without train.compile (it "
                               f"would only change the run's fingerprint); set train.compile: true or train.{key}: "
                               f"{default}")
    if settings.attention not in ("sdpa", "auto") and settings.unpad:
        raise SentembError(f"{where}: train.attention {settings.attention} cannot be combined with train.unpad (the "
                           "packed forward runs its own variable-length attention); set one of them back")
    if settings.compile_random == "inductor" and settings.dropout_rng != "stream":
        raise SentembError(f"{where}: train.compile_random inductor needs train.dropout_rng stream ({settings.dropout_rng} "
                           "masks are hashed outside the compiled code); set train.compile_random: eager")
    if settings.sam_rho and settings.precision == "fp16":
        raise SentembError(f"{where}: SAM (train.sam_rho {settings.sam_rho}) cannot be combined with train.precision "
                           "fp16 (the gradient scaler would scale SAM's ascent step); use bf16, fp32 or auto, "
                           "or set train.sam_rho: null")


def check_fuse_settings(settings, where: str) -> None:
    """``train.fuse_micro_batches`` with what ``Fused`` does not serve, refused naming the keys."""
    k = getattr(settings, "fuse_micro_batches", 1)
    if k == 1:
        return
    if settings.grad_accum % k:
        raise SentembError(f"{where}: train.fuse_micro_batches {k} must divide train.grad_accum {settings.grad_accum}")
    bad = [(settings.dropout_rng != "stream", f"train.dropout_rng {settings.dropout_rng} (its masks are keyed by "
                                              "micro-batch and sentence, per forward); use stream"),
           (settings.chunk_size not in (None, "auto"), f"train.chunk_size {settings.chunk_size} (gradient caching "
                                                       "chunks one micro-batch; auto checks that the fused ones fit)"),
           (settings.devices > 1, f"train.devices {settings.devices}")]
    for hit, what in bad:
        if hit:
            raise SentembError(f"{where}: train.fuse_micro_batches {k} cannot be combined with {what}; set "
                               "train.fuse_micro_batches: 1 or change that setting")


def micro_batch_strategy(job) -> MicroBatches:
    """How the job computes one pass over a step's micro-batches: ``Sharded`` on several processes
    (``job.world`` > 1), ``Chunked`` with a chunk size (``job.chunk``, ``resolve_chunk_size``),
    ``Plain`` otherwise."""
    world, chunk = getattr(job, "world", 1), getattr(job, "chunk", None)
    fuse = getattr(job.settings, "fuse_micro_batches", 1)
    if fuse > 1:
        return Fused(fuse)
    return Sharded() if world > 1 else Chunked() if chunk else Plain()


def strategy_for(job, where: str | None = None) -> StepStrategy:
    """The job's step strategy: ``micro_batch_strategy``, inside ``SAM`` with ``train.sam_rho``.
    Settings no strategy serves raise a ``SentembError`` naming the keys (``check_settings``);
    ``where`` prefixes it (default: the job's run)."""
    where = where or f"run '{job.run.name}'"
    check_settings(job.settings, where)
    if getattr(job.settings, "fuse_micro_batches", 1) > 1:
        from ..methods.base import check_fusable

        check_fusable(type(job.method), job.settings, where)
    inner = micro_batch_strategy(job)
    if getattr(job.settings, "graphs", False):
        device = getattr(job, "device", None)
        cuda = device is not None and device.type == "cuda"
        if cuda and getattr(job, "world", 1) > 1:
            raise SentembError(f"{where}: train.graphs cannot be combined with train.devices {job.world} on CUDA yet (a "
                               "collective inside a captured graph is not supported here); set train.graphs: false")
        inner = Graphed(inner, capture=cuda)
    return SAM(inner) if job.settings.sam_rho else inner


# ------------------------------------------------------------------- one micro-batch's backward


def _share(n: int, r: int, world: int) -> tuple[int, int]:
    from .distributed import share

    return share(n, r, world)


def sharded_backward(job, batch: dict, micro: int, lo: int, hi: int) -> dict:
    """One micro-batch on one of ``job.world`` ranks (``train.devices``, ``sentemb.train.distributed``):
    this rank encodes sentences ``[lo, hi)``; the in-batch terms are computed on every rank's
    embeddings, gathered with their gradient, and back-propagated as L/world (the gather's backward
    sums the ranks' copies of ∂L/∂E); the per-sentence terms of the share as they are (normalised
    by the whole batch). Returns the micro-batch's logged terms summed over ranks, as ``losses``."""
    from .distributed import gather_rows, share_sizes, sum_scalars
    from ..methods.base import WEIGHTED, add_terms, total_loss

    method, world = job.method, job.world
    static = getattr(job.settings, "graphs", False)  # sizes and names known: nothing read on the host
    n = method.n_sentences(batch)
    local = method.chunk(batch, lo, hi)
    logged, weighted_total, parts = {}, {}, []
    with autocast(job.device, job.amp), keyed_dropout(job, micro, lo, hi):
        enc = method.encode(local)
        if method.has_batch_terms:
            emb = {k: gather_rows(v, sizes=share_sizes(v, n, job.rank, world) if static else None)[0]
                   for k, v in enc.batch.items()}
            out = method.batch_terms(emb, batch)
            weighted = out.pop(WEIGHTED)
            add_terms(logged, {k: v.detach() for k, v in out.items()})
            add_terms(weighted_total, {k: v.detach() for k, v in weighted.items()})
            if weighted:
                parts.append(total_loss(weighted) / world)
        rows = method.row_terms(enc, local, batch)
    weighted = rows.pop(WEIGHTED)
    add_terms(logged, sum_scalars({k: v.detach() for k, v in rows.items()}, static))
    add_terms(weighted_total, sum_scalars({k: v.detach() for k, v in weighted.items()}, static))
    if weighted:
        parts.append(total_loss(weighted))
    loss = sum(parts[1:], parts[0]) if parts else None
    if loss is not None and loss.requires_grad:
        job.scaler.scale(loss / job.accum).backward()
    return {"loss": total_loss(weighted_total), **logged}


def chunked_backward(job, batch: dict, micro: int, probe=None, lo: int = 0, hi: int | None = None) -> dict:
    """Gradient caching (Gao et al. 2021, §3.2) of one micro-batch, ``job.chunk`` sentences at a time
    (``Method`` docstring, steps a-c):

    1. the sentences are encoded without a graph (``Method.encode``): chunk by chunk, each chunk's
       random state recorded first, or, when the masks do not depend on the chunking (``dropout_rng``
       keyed or counter), in larger pieces: the whole micro-batch by default (``first_pass_bounds``,
       ``train.chunk_first_pass``), as no activation of this pass is kept;
    2. the in-batch terms (``Method.batch_terms``) are computed on the concatenated embeddings E and
       back-propagated once: ∂L/∂E is cached (and parameters used there, e.g. a projection, get
       their gradient);
    3. each chunk is encoded again with its graph under its recorded random state (the same dropout
       masks as in 1, on CPU and CUDA), and ∂L/∂E of its rows is back-propagated through it together
       with its per-sentence terms (``Method.row_terms``, normalised by the whole batch).

    The parameters' gradient is that of the unchunked loss on the same masks; memory holds one
    chunk's graph. A method without in-batch terms (``has_batch_terms = False``) needs only step 3,
    once. Per-sentence terms draw their dropout from a stream of their own per chunk (seeded from
    the global generator), so they never reuse the numbers of the next chunk's encoding.

    With ``train.devices`` > 1 this rank chunks its share ``[lo, hi)`` of the sentences; step 2
    runs on every rank's embeddings (gathered, ``sentemb.train.distributed``) and this rank keeps the
    cached gradient of its own rows; per-sentence terms are logged summed over ranks. Returns the
    detached logged terms and ``loss``, as ``Method.losses``."""
    import torch

    from ..methods.base import WEIGHTED, add_terms, total_loss

    method, device, size = job.method, job.device, job.chunk
    encode = getattr(job, "encode_fn", None) or method.encode  # compiled with train.compile
    world = getattr(job, "world", 1)
    hi = method.n_sentences(batch) if hi is None else hi
    bounds = [(s, min(s + size, hi)) for s in range(lo, hi, size)]
    chunks = [method.chunk(batch, s, e) for s, e in bounds]
    scale = lambda t: job.scaler.scale(t / job.accum)  # noqa: E731  (as the unchunked backward scales)
    logged: dict = {}  # in-batch terms (the same on every rank)
    weighted_total: dict = {}
    row_logged: dict = {}  # per-sentence terms (this rank's share)
    row_weighted: dict = {}
    cached: dict = {}  # key -> ∂(scaled L_batch)/∂E of this rank's rows
    term_grads: dict = {}  # term -> {key -> ∂(scaled term)/∂E}  (log_grad_norms)
    stream = job.settings.dropout_rng == "stream"  # else the masks are keyed: no random state to replay
    if method.has_batch_terms:
        states, parts = [], []
        first = first_pass_bounds(job, lo, hi, bounds)
        with torch.no_grad():
            for s, e in first:
                states.append(_device_rng(device) if stream else None)
                piece = batch if (s, e) == (0, method.n_sentences(batch)) else method.chunk(batch, s, e)
                with autocast(device, job.amp), keyed_dropout(job, micro, s, e):
                    parts.append(encode(piece).batch)
        row_seed = int(torch.randint(0, 2**62, (1,))) if stream else 0  # after pass 1: the stream continues from here
        after = _device_rng(device) if stream else None
        keys = list(parts[0])
        emb = {k: torch.cat([p[k] for p in parts], 0).detach() if len(parts) > 1 else parts[0][k].detach() for k in keys}
        n_local = {k: emb[k].size(0) for k in keys}
        offset = {k: 0 for k in keys}
        if world > 1:  # every rank's rows, in rank order; this rank's start at offset[k]
            from .distributed import gather_rows, share_sizes

            for k in keys:
                static = getattr(job.settings, "graphs", False)
                known = share_sizes(emb[k], method.n_sentences(batch), job.rank, world) if static else None
                emb[k], sizes = gather_rows(emb[k], with_grad=False, sizes=known)
                offset[k] = sum(sizes[: job.rank])
        for v in emb.values():
            if v.is_floating_point():
                v.requires_grad_(True)
        with autocast(device, job.amp):
            out = method.batch_terms(emb, batch)
        weighted = out.pop(WEIGHTED)
        add_terms(logged, {k: v.detach() for k, v in out.items()})
        add_terms(weighted_total, {k: v.detach() for k, v in weighted.items()})
        leaves = [emb[k] for k in keys if emb[k].requires_grad]
        if probe is not None:
            for name, t in weighted.items():
                if t.requires_grad:
                    grads = torch.autograd.grad(scale(t), leaves + probe.params, retain_graph=True, allow_unused=True)
                    term_grads[name] = dict(zip([k for k in keys if emb[k].requires_grad], grads[:len(leaves)]))
                    probe.add_grads(name, grads[len(leaves):])
        if weighted:
            loss_b = total_loss(weighted)
            if loss_b.requires_grad:  # /world: parameters used here get their gradient on every rank
                scale(loss_b / world).backward()
        for k in keys:
            if emb[k].requires_grad and emb[k].grad is not None:
                g = emb[k].grad[offset[k] : offset[k] + n_local[k]]
                cached[k] = g * world if world > 1 else g
    done: dict = {}  # key -> rows of this rank's cached gradient the chunks so far took
    for i, ((s, e), c) in enumerate(zip(bounds, chunks)):
        if method.has_batch_terms and stream:
            _set_device_rng(states[i], device)
        with autocast(device, job.amp), keyed_dropout(job, micro, s, e):
            enc = encode(c)
            if method.has_batch_terms and job.settings.dropout_rng == "stream":
                torch.manual_seed((row_seed + i) % 2**63)  # the chunk's per-sentence terms: a stream of their own
            rows = method.row_terms(enc, c, batch)
        weighted = rows.pop(WEIGHTED)
        add_terms(row_logged, {k: v.detach() for k, v in rows.items()})
        add_terms(row_weighted, {k: v.detach() for k, v in weighted.items()})
        outputs, grads = [], []
        start = {k: done.get(k, 0) for k in enc.batch}  # this chunk's first row in the cached gradients
        for k in enc.batch:
            done[k] = start[k] + enc.batch[k].size(0)
        # an embedding without a graph (a momentum encoder's keys, made under no_grad) passes on no
        # gradient, as in the unchunked step; pass 1 could not tell it from the others
        for k, g in cached.items():
            if enc.batch[k].requires_grad:
                outputs.append(enc.batch[k])
                grads.append(g[start[k] : done[k]])
        if probe is not None:
            for name, tg in term_grads.items():
                live = [k for k in tg if tg[k] is not None and enc.batch[k].requires_grad]
                outs = [enc.batch[k] for k in live]
                if outs:
                    gs = [tg[k][start[k] : done[k]] for k in live]
                    probe.add_grads(name, torch.autograd.grad(outs, probe.params, gs, retain_graph=True, allow_unused=True))
            for name, t in weighted.items():
                if t.requires_grad:
                    probe.add_grads(name, torch.autograd.grad(scale(t), probe.params, retain_graph=True, allow_unused=True))
        if weighted:
            row_loss = total_loss(weighted)
            if row_loss.requires_grad:
                outputs.append(scale(row_loss))
                grads.append(None)
        if outputs:
            torch.autograd.backward(outputs, grads)
    if method.has_batch_terms and stream:
        _set_device_rng(after, device)
    if world > 1:
        from .distributed import sum_scalars

        static = getattr(job.settings, "graphs", False)
        row_logged, row_weighted = sum_scalars(row_logged, static), sum_scalars(row_weighted, static)
    add_terms(logged, row_logged)
    add_terms(weighted_total, row_weighted)
    return {"loss": total_loss(weighted_total), **logged}


def first_pass_bounds(job, lo: int, hi: int, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pieces ``[s, e)`` the graph-free first pass of ``chunked_backward`` encodes sentences
    ``[lo, hi)`` in: the chunks ``bounds`` themselves with ``dropout_rng: stream`` (each chunk's
    random state is recorded to be replayed by its second encoding) or ``chunk_first_pass:
    chunks``; otherwise pieces of ``job.first_chunk`` sentences (``resolve_first_pass``; None: all
    of ``[lo, hi)`` in one forward). Keyed and counter masks are a function of the sentence, not of
    the piece it is encoded in, so every piece size gives the same embeddings (to rounding)."""
    size = getattr(job, "first_chunk", None)
    if job.settings.dropout_rng == "stream" or getattr(job.settings, "chunk_first_pass", "auto") == "chunks":
        return bounds
    if size is None or size >= hi - lo:
        return [(lo, hi)]
    size = max(size, bounds[0][1] - bounds[0][0])  # never smaller than a chunk
    return [(s, min(s + size, hi)) for s in range(lo, hi, size)]


# ------------------------------------------------------------------------------------ the update


def apply_update(job) -> None:
    """Clip the gradient norm, step optimizer, grad scaler and LR schedule, clear gradients. With
    ``train.update: fused`` the clip is the optimizer's: ``clip_divisor`` becomes fused AdamW's
    ``grad_scale`` for this step (its kernel divides every gradient by it), instead of
    ``clip_grad_norm_``'s separate multiply over all gradients."""
    import torch

    fused = job.settings.update == "fused"
    if job.settings.grad_clip:
        job.scaler.unscale_(job.opt)
        if fused:
            job.opt.grad_scale = clip_divisor(job.method.parameters(), job.settings.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(job.method.parameters(), job.settings.grad_clip)
    try:
        job.scaler.step(job.opt)
    finally:
        if fused:
            job.opt.grad_scale = None
    job.scaler.update()
    job.sched.step()
    clear_grads(job)


def update_body(job) -> None:
    """The optimizer step as ``train.update: graphed`` captures it: ``clip_grad_norm_`` (its total
    norm and scale on the device, no host read), AdamW (fused, ``capturable`` on CUDA: its step
    counts and learning rates are device tensors) and the gradients zeroed in place. What
    ``apply_update`` does with ``separate``, less the LR schedule, which moves the learning-rate
    tensors outside the graph (``LRScheduler`` fills them in place)."""
    import torch

    if job.settings.grad_clip:
        # as apply_update's (torch's multi-tensor kernels on CUDA): one rounding, the same as separate's
        torch.nn.utils.clip_grad_norm_(job.method.parameters(), job.settings.grad_clip)
    job.opt.step()
    job.opt.zero_grad(set_to_none=False)


class UpdateGraphs:
    """``train.update: graphed``: ``update_body`` captured as a CUDA graph and replayed once per
    optimizer step, so the host issues one replay instead of the clip's, AdamW's and the zeroing's
    launches and their Python (on an H200 the graphed B 64 SimCSE step took 10.1 ms against its
    micro-batch's 8.5 ms replay, the eager update between them: ``docs/gpu/h200-2026-11-28c.md``;
    this graph is unmeasured there). A graph reads fixed tensors, so each one is keyed
    by the data pointers of the gradients the step hands over (a parameter no micro-batch wrote this
    step, or one the method names idle, has none, ``Graphed.update``): another set captures another graph (``MAX_GRAPHS`` at most,
    then eagerly, with a warning). A parameter's first update runs eagerly: AdamW creates its state
    there (``_has_state``). ``capture`` False (a CPU): the same body eagerly, every step."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.graphs: dict[tuple, object] = {}
        self.overflow = 0

    def apply(self, job) -> None:
        from .graphs import MAX_GRAPHS

        key = tuple(p.grad.data_ptr() if p.grad is not None else None for g in job.opt.param_groups
                    for p in g["params"]) if self.capture else ()
        graph = self.graphs.get(key)
        if graph is None and not self._has_state(job):
            # a parameter's first update runs eagerly: AdamW makes its state there; made inside a capture,
            # its moments and step count would be zeroed again by every replay
            update_body(job)
        elif graph is None and len(self.graphs) >= MAX_GRAPHS:
            if not self.overflow:
                log.warning("train.update graphed: more than %d distinct sets of gradients; the others update "
                            "eagerly", MAX_GRAPHS)
            self.overflow += 1
            update_body(job)
        else:
            if graph is None:
                graph = self.graphs[key] = self._capture(job)
            graph.replay()
        job.sched.step()

    def _has_state(self, job) -> bool:
        """Every parameter with a gradient has AdamW's state (its first update ran); never on a CPU
        (nothing is captured there)."""
        return self.capture and all(job.opt.state.get(p) for g in job.opt.param_groups for p in g["params"]
                                    if p.grad is not None)

    def _capture(self, job) -> "torch.cuda.CUDAGraph":
        import torch

        if getattr(job, "prefetch", None) is not None:  # no batch copied to the device beside the capture
            job.prefetch.wait()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # as Graphed._capture
                update_body(job)
        except Exception as e:  # noqa: BLE001 - a capture error names the run and the way out
            raise SentembError(f"run '{job.run.name}': train.update graphed: capturing the optimizer step failed: "
                               f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}; set train.update: "
                               "separate") from e
        log.info("train.update graphed: captured the optimizer step (%d)", len(self.graphs) + 1)
        return graph


def clip_divisor(params, max_norm: float) -> "torch.Tensor":
    """What ``clip_grad_norm_(params, max_norm)`` multiplies every gradient by, as its reciprocal:
    ``max(1, (‖g‖₂ + 1e-6) / max_norm)``, a device scalar (no host read), ``‖g‖₂`` over all gradients
    (``sam.grad_norm``: one multi-tensor norm per device and dtype). Fused AdamW divides each
    gradient by it (``grad_scale``, writing the quotient back into ``.grad``), so ``g / d`` stands for
    ``clip_grad_norm_``'s ``g · (max_norm / (‖g‖₂ + 1e-6))`` clamped at 1: the same to rounding (one
    ulp on about half the elements)."""
    import torch

    from .sam import grad_norm

    return torch.clamp((grad_norm(params) + 1e-6) / max_norm, min=1.0)


def clear_grads(job) -> None:
    """Zero the gradients: set to None, or with ``train.graphs`` zeroed in place (a captured backward
    writes into those very tensors: ``sentemb.train.graphs``)."""
    job.opt.zero_grad(set_to_none=not getattr(job.settings, "graphs", False))


# ------------------------------------------------------------------- gradient caching's chunk size


#: share of the GPU's free memory that ``train.chunk_size: auto`` plans to fill
AUTO_CHUNK_MARGIN = 0.7


def resolve_chunk_size(job, micro_batches: Callable[..., list[tuple[int, dict]]]) -> int | None:
    """``train.chunk_size`` as a number of sentences, None for the whole micro-batch.
    ``micro_batches``: how the loop builds a step's micro-batches (``micro_batches(job, step)``),
    called only for ``auto`` on CUDA.

    ``auto``: on CPU the whole batch (host memory is not the bound). On CUDA, one chunk of 4
    sentences of the first micro-batch is run forward and backward and its peak memory above the
    model's is measured; the chunk is the largest that fits ``AUTO_CHUNK_MARGIN`` of the free memory
    at that per-sentence cost (at least 1; None when the whole batch fits). The gradients of that
    probe are discarded. The choice is logged and written to ``train.json`` (``chunk_size``)."""
    import torch

    size, batch = job.settings.chunk_size, job.settings.batch_size
    if size is None:
        return None
    if size != "auto":
        return int(size) if int(size) < batch else None
    if job.device.type != "cuda":
        log.info("train.chunk_size auto: the whole batch (%d sentences) on %s", batch, job.device)
        return None
    def forward_backward(part, full, micro):
        from ..methods.base import WEIGHTED

        with autocast(job.device, job.amp):
            enc = job.method.encode(part)
            out = job.method.row_terms(enc, part, full)
        zero = torch.zeros((), device=job.device)
        (sum(v.float().sum() for v in enc.batch.values()) + sum(out[WEIGHTED].values(), zero)).backward()

    per_sentence = _peak_per_sentence(job, micro_batches, min(4, batch), forward_backward)
    job.opt.zero_grad(set_to_none=True)  # the probe's gradients discarded
    free, _ = torch.cuda.mem_get_info(job.device)
    fuse = getattr(job.settings, "fuse_micro_batches", 1)
    if fuse > 1:  # train.fuse_micro_batches: the fused micro-batches must fit whole (Fused does not chunk)
        if auto_chunk(per_sentence, free, batch * fuse) is not None:
            raise SentembError(f"run '{job.run.name}': train.fuse_micro_batches {fuse}: {fuse} x {batch} sentences in one "
                               f"forward do not fit {AUTO_CHUNK_MARGIN:.0%} of the GPU's free {free / 2**30:.1f} GB "
                               f"({per_sentence / 2**20:.1f} MB a sentence, measured); set train.fuse_micro_batches: 1")
        log.info("train.chunk_size auto: %.1f MB per sentence, %.1f GB free -> the %d fused micro-batches whole",
                 per_sentence / 2**20, free / 2**30, fuse)
        return None
    chosen = auto_chunk(per_sentence, free, batch)
    log.info("train.chunk_size auto: %.1f MB per sentence, %.1f GB free -> %s", per_sentence / 2**20, free / 2**30,
             "the whole batch" if chosen is None else f"chunks of {chosen} sentences")
    return chosen


def _peak_per_sentence(job, micro_batches: Callable[..., list[tuple[int, dict]]], n: int, run: Callable) -> float:
    """CUDA memory per sentence at the peak of ``run(part, full, micro)`` above what was allocated
    before: ``part`` the first ``n`` sentences (at most the batch's) of the first micro-batch ``full``
    (``micro_batches(job, 0)``), on the device. The device's random state is put back after."""
    import torch

    (micro, full), = micro_batches(job, 0)[:1]
    full = {k: v.to(job.device) for k, v in full.items()}
    n = min(n, job.method.n_sentences(full))
    part = job.method.chunk(full, 0, n)
    torch.cuda.synchronize(job.device)
    base = torch.cuda.memory_allocated(job.device)
    torch.cuda.reset_peak_memory_stats(job.device)
    rng = _device_rng(job.device)
    try:
        run(part, full, micro)
    finally:
        _set_device_rng(rng, job.device)
    return max(1, torch.cuda.max_memory_allocated(job.device) - base) / n


def auto_chunk(per_sentence: float, free: float, batch: int, margin: float = AUTO_CHUNK_MARGIN) -> int | None:
    """The chunk ``train.chunk_size: auto`` picks, the fastest plan that fits: the fewest chunks whose
    graph (``per_sentence`` bytes a sentence, measured) fits ``margin`` of ``free`` bytes, of equal
    size (each chunk is one forward and backward; the step's time falls with their number); None
    when the whole batch fits, at least 1 otherwise."""
    fits = int(margin * free // max(per_sentence, 1))
    if fits >= batch:
        return None
    n = -(-batch // max(1, fits))  # the fewest forwards that fit ...
    return -(-batch // n)  # ... in equal chunks (<= fits): one captured shape under train.graphs, not two


def resolve_first_pass(job, micro_batches: Callable[..., list[tuple[int, dict]]]) -> int | None:
    """``train.chunk_first_pass`` as the piece size (sentences) of gradient caching's graph-free first
    pass (``first_pass_bounds``), None for this process's whole share of a micro-batch; called once
    ``job.chunk`` is resolved, and only meaningful when it is a number.

    ``chunks`` (and any run with ``dropout_rng: stream``, whose masks are replayed per chunk): the
    chunk. ``whole``: None. ``auto``: None on a CPU; on CUDA, one chunk of the first micro-batch is
    encoded without a graph and its peak memory above the model's measured, and the pass takes the
    whole share if it fits ``AUTO_CHUNK_MARGIN`` of the free memory at that cost, else the fewest
    equal pieces that fit (never smaller than a chunk). The choice is logged and written to
    ``train.json`` (``first_pass``)."""
    import torch

    mode = getattr(job.settings, "chunk_first_pass", "auto")
    if job.chunk is None or not job.method.has_batch_terms:
        return None
    if job.settings.dropout_rng == "stream" or mode == "chunks":
        return job.chunk
    if mode == "whole" or job.device.type != "cuda":
        log.info("train.chunk_first_pass %s: the graph-free first pass encodes the whole micro-batch at once", mode)
        return None
    share = -(-job.settings.batch_size // max(1, getattr(job, "world", 1)))

    def forward(part, full, micro):
        with torch.no_grad(), autocast(job.device, job.amp), keyed_dropout(job, micro, 0, part):
            job.method.encode(part)

    per_sentence = _peak_per_sentence(job, micro_batches, job.chunk, forward)
    free, _ = torch.cuda.mem_get_info(job.device)
    size = auto_chunk(per_sentence, free, share)
    size = None if size is None else max(size, job.chunk)
    log.info("train.chunk_first_pass auto: %.2f MB per sentence without a graph, %.1f GB free -> %s",
             per_sentence / 2**20, free / 2**30, "the whole micro-batch" if size is None else f"pieces of {size} sentences")
    return size
