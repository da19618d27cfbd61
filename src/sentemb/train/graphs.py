"""The training step replayed as CUDA graphs (``train.graphs: true``; issue 37).

An eager BERT-base step at the papers' batch 64 dispatches about 4,300 aten ops, and on a fast GPU
the host's dispatching, not the arithmetic, is the step's time (34 ms on an H200 for about 2 ms of
arithmetic). ``Graphed`` (``sentemb.train.step``) wraps the job's micro-batch strategy (``Plain``, ``Chunked``,
``Sharded`` or ``Fused`` of ``sentemb.train.step``) and runs each micro-batch's whole forward and backward (with gradient
caching: both passes and the cached-gradient backward of every chunk; with ``train.fuse_micro_batches``: each group
of fused micro-batches, one flat batch, ``Fused.units``) as one captured CUDA graph:

1. **Static shapes.** A micro-batch is keyed by the shapes and dtypes of its tensors; the widths
   come from ``train.buckets`` (on CUDA ``auto``: a handful per run), so a run captures one graph
   per distinct key (``MAX_GRAPHS`` at most; a micro-batch of a shape beyond them runs eagerly,
   with a warning naming ``train.buckets``). Each graph
   owns static input tensors: every micro-batch is copied into those of its key, and the graph is
   replayed.
2. **Capture.** At a key's first micro-batch: one eager pass on a side stream under the capture
   check (``capture_hazards``: an op that reads a device value on the host, has a data-dependent
   shape, or copies host data to the device makes a graph that replays stale values or fails, so
   it is refused naming the op and the method's line), a second eager pass, then the capture
   (``torch.cuda.graph``, one memory pool shared by all the run's graphs). The eager passes leave no
   trace: gradients, the method's buffers (e.g. a BatchNorm's running statistics) and the random
   state are put back as they were, so a run's result does not depend on where its captures fall
   (a resumed run captures again, later, and is bit-identical).
3. **Gradients in place.** ``.grad`` of every parameter a graph writes is allocated once, before
   its capture, and never set to None (``clear_grads``); a graph's backward accumulates into it, so
   ``grad_accum`` replays sum as in eager mode. A parameter no replayed graph of a step wrote, or
   one the method names idle in every micro-batch of the step (``Method.static_idle_parameters``:
   the static step wrote it zeros where an eager one writes nothing), is given to the optimizer
   without a gradient, as in eager mode (torch's AdamW skips it).
4. **No host sync.** The loss terms are the graph's static outputs, copied out after each replay
   (device to device); the finiteness check, the clip (``clip_grad_norm_``, foreach) and the fused
   AdamW step are the loop's eager ones, which never read a device value on the host.

Dropout: with ``train.dropout_rng: stream`` torch's CUDA generator serves the graph (each replay
advances its Philox offset, so masks are fresh every replay and the saved generator state resumes
them). With ``counter`` the masks are hashed from a static device key (``Job.dropout_key``) that is
filled with the micro-batch's key before each replay: the same masks as an eager ``counter`` run,
however the batch is chunked or sharded. ``keyed`` (CPU generators) cannot be captured and is
refused, as are gradient caching with ``stream`` (its second pass rewinds the generator on the
host), ``train.unpad`` (the packed length changes every step), ``precision:
fp16`` (the grad scaler reads its inf check on the host) and, on CUDA, ``train.devices`` > 1 (a
collective captured in a graph is not supported here yet).

A replay reruns kernels, not Python. The capture check's pass therefore also refuses
(``python_work``), naming it, a step that changes, sets or removes one of the method's own
attributes (containers followed a few levels deep) or reads ``Method.step``/``micro``; a method that keeps state across steps (``after_step``) hands tensors to
its hook through ``Method.stash``, which in a graphed micro-batch writes the graph's static outputs
(``stash_into``), copied out under each replay's micro-batch (``copy_stash``). Its hook must update
parameters, buffers and tensor attributes in place: one replaced by a new tensor is refused at the
next step (``check_storage``). A graphed ``stream`` run is another
random run than an eager one (other masks are drawn), as ``train.unpad`` is.

With ``train.compile`` the graph holds Inductor's fused kernels instead of the eager ones: the
compiled ``Method.losses`` (dropout from torch's generator, ``fallback_random``) is compiled in the
warm-up pass of a key's first micro-batch, before its capture, and the capture records the compiled
forward and backward (the capture check's pass runs eagerly: ``torch.compile`` does not run under a
dispatch mode); a chunked step's chunks run through the compiled ``Method.encode``
(``job.encode_fn``). It serves ``dropout_rng: stream`` or ``counter``
(each counter dropout a graph break, run outside the compiled code: ``sentemb.model.dropout.
compile_safe``; the breaks cost no host time at replay, but Inductor cannot fuse a mask with the
kernels around it; with ``counter_kernel: inline`` the masks are traced with the encoder instead,
``compile_inline``); each new batch shape is a recompilation, so
``train.buckets`` matters more.

On the CPU (CI, a laptop) there are no CUDA graphs: the same strategy runs the same static-shape
step eagerly on its static inputs, with the capture check on each key's first micro-batch, so the
tests exercise everything but the capture itself. On a step whose per-term gradient norms are
logged (``train.log_grad_norms``) the micro-batches run eagerly: that step needs extra backward
passes a graph does not have.
"""

from __future__ import annotations

import logging
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import SentembError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: the most distinct micro-batch shapes one run captures (each graph holds its activations' memory);
#: micro-batches of further shapes run eagerly
MAX_GRAPHS = 64
#: eager passes before a capture (the first one under the capture check)
WARMUP = 2

#: aten ops that cannot be in a captured graph, and why (``capture_hazards``)
HAZARDS = {
    "_local_scalar_dense": "reads a device value on the host (.item(), int(), float(), bool(), an `if` on a tensor)",
    "nonzero": "has a data-dependent shape (nonzero, boolean-mask indexing, one-argument torch.where)",
    "masked_select": "has a data-dependent shape (boolean-mask indexing)",
    "masked_scatter": "reads a data-dependent count",
    "unique": "has a data-dependent shape", "_unique": "has a data-dependent shape",
    "_unique2": "has a data-dependent shape", "unique_dim": "has a data-dependent shape",
    "unique_consecutive": "has a data-dependent shape",
    "lift_fresh": "makes a tensor from host data inside the step (torch.tensor / torch.as_tensor of Python "
                  "values): on CUDA a host-to-device copy that a replay would not redo",
    "lift_fresh_copy": "makes a tensor from host data inside the step (torch.tensor / torch.as_tensor of Python "
                       "values): on CUDA a host-to-device copy that a replay would not redo",
}
_REPEAT_INTERLEAVE = "repeat_interleave"  # data-dependent unless output_size is given


@dataclass
class Hazard:
    """One op of a step that a CUDA graph cannot replay: the aten op, why, and where (the innermost
    frame outside torch and this package's loop: the method's line)."""

    op: str
    why: str
    where: str

    def __str__(self) -> str:
        return f"{self.where}: aten.{self.op} {self.why}"


def _library_dirs() -> tuple[str, ...]:
    """Where the frames that are not the method's live: torch, transformers, and this package's
    step machinery (the loop's strategies, keyed dropout, this module)."""
    import os

    import torch

    dirs = [os.path.dirname(torch.__file__)]
    try:
        import transformers

        dirs.append(os.path.dirname(transformers.__file__))
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    return (*dirs, os.path.join(here, "graphs.py"), os.path.join(here, "step.py"),
            os.path.join(os.path.dirname(here), "model", "dropout.py"))


def _caller() -> str:
    """The innermost frame of the stack that is the method's (``_library_dirs`` skipped), as
    ``folder/file.py:line in function``. Inside autograd's backward only the frames that the engine
    called count (a method's own ``autograd.Function.backward`` or hook); the frames outside it are
    the loop's call of ``.backward()``. Where none is the method's, the backward node (``the backward
    of IndexBackward0``: its forward op, with the method's line, is the hazard named before it,
    where it is one)."""
    import os

    import torch

    node = torch._C._current_autograd_node()
    skip = _library_dirs()
    for f in reversed(traceback.extract_stack()[:-3]):
        if node is not None and f.name == "_engine_run_backward":  # the engine's caller: not the method
            break
        name = os.path.abspath(f.filename)
        if name.startswith(skip):
            continue
        parent, base = os.path.split(name)
        return f"{os.path.basename(parent)}/{base}:{f.lineno} in {f.name}"
    return f"the backward of {node.name()}" if node is not None else "?"


@contextmanager
def capture_hazards(device: "torch.device"):
    """Inside: every aten op dispatched is checked against ``HAZARDS`` (and, on CUDA, a copy from
    host memory to ``device``); yields the list of ``Hazard`` found, filled on exit. Runs the ops
    (it is an eager pass), so it also serves as a warm-up."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    found: list[Hazard] = []
    cuda = torch.device(device).type == "cuda"

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            why = HAZARDS.get(name)
            if name == _REPEAT_INTERLEAVE and kwargs.get("output_size") is None and any(
                    isinstance(a, torch.Tensor) and a.dim() > 0 for a in args[1:2]):
                why = "has a data-dependent shape (repeat_interleave without output_size)"
            if why is None and cuda and name in ("_to_copy", "copy_"):
                src = args[1] if name == "copy_" else args[0]
                dst_dev = args[0].device if name == "copy_" else kwargs.get("device")
                if isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst_dev is not None and \
                        torch.device(dst_dev).type == "cuda":
                    why = "copies host memory to the device inside the step (build it in build_batch)"
            if why is None and name in ("index", "index_put", "index_put_", "_index_put_impl_"):
                idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in idx or ()):
                    why = "has a data-dependent shape (boolean-mask indexing)"
            if name == "_local_scalar_dense" and cuda and args and args[0].device.type == "cpu":
                why = None  # a host tensor's value: no device read
            if why is not None and not any(h.op == name for h in found):
                found.append(Hazard(name, why, _caller()))
            return func(*args, **kwargs)

    with Mode():
        yield found


@contextmanager
def as_captured():
    """Inside: Hugging Face's models take the path they take under CUDA stream capture (its
    ``is_tracing`` is true, so e.g. the SDPA mask is built without reading on the host whether any
    position is padded). The eager passes of a graphed step (the capture check, the warm-ups, and on
    a CPU every pass) thus run what the capture records."""
    import torch

    patched = [(torch.cuda, "is_current_stream_capturing")]
    try:
        from transformers.utils import import_utils

        patched.append((import_utils, "is_cuda_stream_capturing"))
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    saved = [(mod, name, getattr(mod, name)) for mod, name in patched if hasattr(mod, name)]
    for mod, name, _ in saved:
        setattr(mod, name, lambda: True)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def _key(batch: dict) -> tuple:
    return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))


@dataclass
class _Entry:
    """One captured micro-batch shape: its static inputs, the graph (None on CPU) and its static
    outputs (the logged terms), the parameters its backward writes."""

    batch: dict
    graph: object = None
    out: dict = field(default_factory=dict)
    used: list = field(default_factory=list)
    stash: dict = field(default_factory=dict)  # what the step stashes (Method.stash): static outputs too
    replays: int = 0


def _shapes(key: tuple) -> str:
    return ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s, _ in key)


@contextmanager
def _null():
    yield


# --------------------------------------------------------------------------- a method's Python state


#: the ``Method`` attributes the loop itself writes around a step (``Method.step``/``micro``, the stash)
_LOOP_ATTRS = frozenset({"_step", "_micro", "_stashed", "_stash_sink", "_reads", "training"})


def _module_internals() -> frozenset:
    """The attributes every ``nn.Module`` has (its parameters, buffers, hooks: not a method's own)."""
    if not _INTERNALS:
        from torch import nn

        _INTERNALS.append(frozenset(vars(nn.Module())))
    return _INTERNALS[0]


_INTERNALS: list = []


#: how deep ``_snapshot`` follows containers (a dict of lists of tensors: 2), and up to how many
#: members it follows one (a larger one, such as PaSeR's per-line phrases of a whole corpus, is
#: compared by identity and length: following a million members would cost seconds per capture)
_DEPTH = 3
_FOLLOW = 1000


def _snapshot(v, depth: int = 0):
    """What a replay would have to redo if it changed, holding the objects themselves (so that an id
    is never reused while compared): a container (dict, list, tuple, set, deque) as itself and its
    members, followed ``_DEPTH`` deep (beyond, or past ``_FOLLOW`` members: itself and its length);
    a number or string by value; anything else as itself."""
    import collections

    if isinstance(v, (dict, list, tuple, collections.deque, set, frozenset)) and (depth >= _DEPTH or len(v) > _FOLLOW):
        return ("sized", v, len(v))
    if depth < _DEPTH:
        if isinstance(v, dict):
            return ("dict", v, tuple((k, _snapshot(x, depth + 1)) for k, x in v.items()))
        if isinstance(v, (list, tuple, collections.deque)):
            return (type(v).__name__, v, tuple(_snapshot(x, depth + 1) for x in v))
        if isinstance(v, (set, frozenset)):
            return ("set", v, tuple(v))
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return ("value", v)
    return ("obj", v)


def _same(a, b) -> bool:
    """Two ``_snapshot``s are of the same objects with the same members (identity, values by ==)."""
    if a[0] != b[0]:
        return False
    if a[0] == "value":
        return type(a[1]) is type(b[1]) and a[1] == b[1]
    if a[1] is not b[1]:
        return False
    if a[0] == "obj":
        return True
    if a[0] == "sized":
        return a[2] == b[2]
    if a[0] == "set":
        return len(a[2]) == len(b[2]) and all(any(x is y for y in b[2]) for x in a[2])
    if len(a[2]) != len(b[2]):
        return False
    if a[0] == "dict":
        return all(ka == kb and _same(x, y) for (ka, x), (kb, y) in zip(a[2], b[2]))
    return all(_same(x, y) for x, y in zip(a[2], b[2]))


def python_state(method) -> dict:
    """The ``_snapshot`` of each of ``method``'s own plain attributes: not its parameters, buffers or
    submodules (a graph's memory), nor what the loop writes (``_LOOP_ATTRS``)."""
    skip = _module_internals() | _LOOP_ATTRS
    return {k: _snapshot(v) for k, v in vars(method).items() if k not in skip}


class Work(list):
    """``python_work``'s yield: what a replay would not redo (a list of phrases), and the method's own
    plain attributes the step read (``read``, names), whose values a graph keeps from its capture."""

    read: set


_READING: dict = {}


def _reading_class(cls):
    """A subclass of ``cls`` recording the reads of the instance's own plain attributes (its
    ``__dict__``, outside ``_LOOP_ATTRS``) by the thread in the instance's ``_reads``; swapped in for
    ``python_work``'s one pass (the capture check's, eager), then swapped back."""
    if cls not in _READING:
        import threading

        def __getattribute__(self, name):
            d = object.__getattribute__(self, "__dict__")
            if name in d and name not in _LOOP_ATTRS:
                reads = d.get("_reads")
                if reads is not None and reads[0] == threading.get_ident():
                    reads[2].add(name)
            return super(sub, self).__getattribute__(name)

        sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        _READING[cls] = sub
    return _READING[cls]


@contextmanager
def python_work(method):
    """Inside: one pass of a graphed step (the capture check's). Yields a ``Work`` list, filled on exit
    with what a replay would not redo (it reruns the recorded kernels, not the Python): an attribute
    of the method changed, added or removed in the step (a dict stashed into, a counter bumped, a
    value kept for later; a change would happen once, at the capture), and a read of ``Method.step``/
    ``micro`` on this thread (a replay keeps the captured values). Its ``read`` holds the method's
    own plain attributes the step read: a value a graph bakes in, so the job refuses a change to one
    between steps (``check_reads``; an ``after_step`` annealing a Python float, a queue in a list)."""
    import threading

    found = Work()
    before = python_state(method)
    cls = type(method)
    method.__dict__["_reads"] = (threading.get_ident(), set(), set())
    try:  # a class whose layout forbids the swap (a C base) keeps its own: its reads go unrecorded
        method.__class__ = _reading_class(cls)
    except TypeError:
        pass
    try:
        yield found
        reads, found.read = sorted(method.__dict__["_reads"][1]), set(method.__dict__["_reads"][2])
    finally:
        method.__class__ = cls
        method.__dict__.pop("_reads", None)
    after = python_state(method)
    name = cls.__name__
    found += [f"it changes {name}.{k} during the step" for k in before if k in after and not _same(after[k], before[k])]
    found += [f"it removes {name}.{k} during the step" for k in before if k not in after]
    found += [f"it sets {name}.{k} during the step (a cache filled once belongs in __init__)" for k in after
              if k not in before]
    found += [f"it reads self.{k} during the step (a replay keeps the value of its capture)" for k in reads]


def read_state(method, names) -> dict:
    """The ``_snapshot`` of ``method``'s plain attributes ``names`` (those a captured step read)."""
    return {k: snap for k, snap in python_state(method).items() if k in names}


def check_reads(method, captured: dict, where: str) -> None:
    """Refuse a method whose plain attributes that its captured step read (``captured``, ``read_state``
    at the capture) changed since: a replay goes on computing with the captured values (a Python
    number baked into a kernel, the tensors a list held then). Only the method's own attributes are
    followed (its ``__dict__``; not a submodule's, not ``__slots__``)."""
    d = vars(method)  # ``captured`` holds only the method's own attributes (``python_state``'s keys)
    changed = [k for k, snap in captured.items() if k not in d or not _same(_snapshot(d[k]), snap)]
    if changed:
        cls = type(method).__name__
        raise SentembError(
            f"{where}: train.graphs: method '{method.name}' changed {', '.join(f'{cls}.{k}' for k in changed)} between "
            "steps (in after_step, or anywhere outside the step), and its step reads it: a replayed graph keeps the "
            "value it read at its capture. "
            "Keep a value that changes between steps in a tensor made in __init__ (a buffer, saved with the "
            "checkpoint) and update it in place in after_step (fill_, copy_, mul_), or set train.graphs: false")


def python_state_error(method, found: list[str], where: str) -> str:
    """The refusal of a step with Python work (``python_work``'s list)."""
    return (f"{where}: train.graphs: method '{method.name}' keeps Python state in its step, which a replayed graph "
            f"does not redo: {'; '.join(found)}. Hand tensors to after_step with self.stash(name, tensor) and "
            "take_stash(name), put values that change per step into the batch (build_batch gets step and micro), or "
            "set train.graphs: false (docs/methods/writing-a-method.md, 'A method that keeps state')")


@contextmanager
def stash_into(method, sink: dict):
    """Inside: ``Method.stash`` writes into ``sink`` (name -> tensor), a graphed micro-batch's static
    outputs, instead of the method's store."""
    method.__dict__["_stash_sink"] = sink
    try:
        yield
    finally:
        method.__dict__.pop("_stash_sink", None)


def copy_stash(method, sink: dict, micro: int) -> None:
    """A graphed micro-batch's stash (``sink``, rewritten by each replay) into the method's store
    under ``micro``, as ``Method.stash`` would have put it (a device copy)."""
    store = method.__dict__.setdefault("_stashed", {})
    for name, t in sink.items():
        store.setdefault(name, {})[micro] = t.clone()


def state_storage(method) -> list[tuple[str, int]]:
    """(name, data pointer) of every parameter and buffer of ``method`` and of its own plain tensor
    attributes: the memory a captured graph reads."""
    import torch

    skip = _module_internals() | _LOOP_ATTRS
    plain = [(k, v) for k, v in vars(method).items() if k not in skip and isinstance(v, torch.Tensor)]
    return [(k, t.data_ptr()) for k, t in (*method.named_parameters(), *method.named_buffers(), *plain)]


def check_storage(method, captured: list[tuple[str, int]], where: str) -> None:
    """Refuse a method whose parameters or buffers were replaced since the capture (``captured``,
    ``state_storage``) instead of updated in place: the graph would go on reading the old memory."""
    now = state_storage(method)
    if now == captured:
        return
    old, new = dict(captured), dict(now)
    moved = [k for k, ptr in now if k in old and old[k] != ptr]
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    what = [f"replaced {', '.join(moved[:3])}{' and more' if len(moved) > 3 else ''} with new tensors"] if moved else []
    what += [f"removed {', '.join(gone[:3])}"] if gone else []
    what += [f"added {', '.join(added[:3])}"] if added else []
    raise SentembError(
        f"{where}: train.graphs: method '{method.name}' {'; '.join(what)} since its step was captured; a replayed "
        "graph reads the memory it was captured with: keep state in tensors made in __init__ and update them in "
        "place in after_step (copy_, mul_, add_, fill_), or set train.graphs: false")


# --------------------------------------------------------------------------- the dropout key


def set_dropout_key(job, micro: int) -> None:
    """With ``train.dropout_rng: counter``: fill the job's static key tensor (``Job.dropout_key``, made
    here at first use) with micro-batch ``micro``'s key: two scalar fills on the device, no host copy,
    so a graph captured reading it sees each replay's key."""
    if job.settings.dropout_rng != "counter":
        return
    import torch

    from ..model.dropout import _M32, mix

    k = mix(job.seed, micro)
    if getattr(job, "dropout_key", None) is None:
        job.dropout_key = torch.zeros(2, dtype=torch.int64, device=job.device)
    job.dropout_key[0].fill_(k & _M32)
    job.dropout_key[1].fill_((k >> 32) & _M32)


def check_graph_settings(settings, where: str) -> None:
    """``train.graphs`` combined with what it cannot serve (module docstring), refused naming the keys."""
    if not getattr(settings, "graphs", False):
        return
    device = str(getattr(settings, "device", "auto"))
    bad = [(settings.dropout_rng == "keyed", "train.dropout_rng keyed (CPU-drawn masks); use counter or stream"),
           (settings.unpad, "train.unpad (the packed length changes every step); set train.unpad: false"),
           (settings.precision == "fp16", "train.precision fp16 (the grad scaler's inf check reads the device on the "
                                          "host); use bf16, auto or fp32"),
           (settings.chunk_size is not None and settings.dropout_rng == "stream",
            f"train.chunk_size {settings.chunk_size} with train.dropout_rng stream (gradient caching rewinds the "
            "generator on the host; refused whatever the device, as the config does not know it); use "
            "train.dropout_rng: counter"),
           # on a device that resolves to CUDA only at the job's start (auto), the job refuses it (strategy_for)
           (getattr(settings, "devices", 1) > 1 and device.startswith("cuda"),
            f"train.devices {getattr(settings, 'devices', 1)} on train.device {device} (a collective inside a captured "
            "graph is not supported here); set train.devices: 1")]
    for hit, what in bad:
        if hit:
            raise SentembError(f"{where}: train.graphs cannot be combined with {what}, or set train.graphs: false")
