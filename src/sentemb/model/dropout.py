"""Keyed dropout (``train.dropout_rng: keyed``): every dropout mask a function of what it masks.

With torch's global generator, the masks of a forward pass over R rows are drawn as one tensor, so
they depend on how the batch is cut: gradient caching (``train.chunk_size``) or several processes
would draw other masks than one pass over the whole batch, and SimCSE's augmentation *is* the
dropout mask. Here the mask of row r in the k-th dropout call of a chunk's forward passes is drawn
from a generator seeded with ``(seed, micro-batch, k, sentence, view)``: the sentence's index in
the micro-batch and which of its views the row is. The same sentence view gets the same mask
however the batch is chunked, so a chunked gradient equals the unchunked one with dropout on.

Rows are matched to sentences by the loop's context (``keyed``: the chunk holds sentences
``[start, stop)`` of the micro-batch): a forward over R = v·n rows of a chunk of n sentences is
read as v views of the n sentences, view-major ([x_1..x_n, x_1..x_n], as SimCSE doubles a batch).
A method whose rows are laid out otherwise (UNA's pairs, PaSeR's decoder rows) says so with
``rows(sentence, view)`` around that forward; a tensor that fits neither is an error, never a
silent fallback to the global generator.

What it intercepts while a context is active: ``torch.nn.functional.dropout`` (``nn.Dropout``,
Hugging Face's eager attention) and ``torch.nn.functional.scaled_dot_product_attention`` with
``dropout_p > 0`` (Hugging Face's SDPA attention, ``nn.MultiheadAttention``), computed in its math
form with the keyed mask on the attention weights. Outside a context both are torch's own.

Two ways to draw a keyed mask (``mode``):

- ``generator`` (``train.dropout_rng: keyed``): one CPU generator seeding and draw per row and
  dropout call, and the masks copied to the device; the padding width of a chunk must equal the
  batch's (``Method.chunk`` keeps it), since a row's mask is drawn at its padded shape, element by
  element in flat order (so an attention-weight mask also depends on the padded width). Meant for
  checks and CPU runs; ``stream`` stays the default.
- ``counter`` (``train.dropout_rng: counter``; issue 37 §2): a counter-based mask computed on the
  tensor's own device with integer tensor ops, no generator state: element (r, i_1, …, i_k) is kept
  when a hash of (row key, i_1, …, i_k) is at or above p·2^24, the row key a hash of (seed,
  micro-batch, dropout call, sentence, view). Each coordinate enters the hash on its own, so a real
  position's mask does not depend on the padded width either (``train.buckets`` leaves it alone), nor
  on chunking or processes. No host round trip and no generator to advance: the form a captured
  CUDA graph can replay (with the micro-batch key as a device tensor). The hash is murmur3's 32-bit
  finaliser over int64 tensors holding 32-bit words; its top 24 bits give the uniform draw. Three
  kernels compute the same bits (``train.counter_kernel``): ``eager`` tensor ops, ``fused`` (the
  hash compiled on its own), and ``inline``, whose inputs ``keyed`` makes as device tensors at the
  context's entry so that ``torch.compile`` traces the mask with the encoder around it
  (``compile_inline``: no graph break at each dropout, as ``compile_safe`` has).
"""

from __future__ import annotations

import logging
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .. import SentembError

log = logging.getLogger(__name__)
_MASK64 = (1 << 64) - 1
_ORIGINAL = {"dropout": F.dropout, "sdpa": F.scaled_dot_product_attention}
_LOCAL = threading.local()
_INSTALLED = False


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 chained over them)."""
    h = 0
    for p in parts:
        h = _splitmix(h ^ (int(p) & _MASK64))
    return h >> 1


_M32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on an int64 tensor of 32-bit words (products wrap in int64; their
    low 32 bits, kept by the mask, are the uint32 product's)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


#: odd 32-bit constants that separate the coordinates of a mask element before hashing
_COORD = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646C, 0xFD7046C5, 0xB55A4F09)


def key_words(key: int, device=None) -> torch.Tensor:
    """A 63-bit key (``mix``) as the int64 tensor [low 32 bits, high 32 bits] the counter mask reads
    (on ``device``; a captured graph keeps one such tensor and copies each step's key into it)."""
    return torch.tensor([key & _M32, (key >> 32) & _M32], dtype=torch.int64, device=device)


def counter_keep_mask(key, sentences: torch.Tensor, views: torch.Tensor, shape, p: float, call: int = 0,
                      kernel: str = "eager") -> torch.Tensor:
    """The ``counter`` mask (module docstring): bool ``shape`` (R, ...), True = kept with probability
    1 − p. ``key``: the (seed, micro-batch) key, an int (``mix``) or its ``key_words`` tensor on the
    mask's device; ``call``: the dropout call's index in the forward; row r keyed by ``sentences[r]``
    and ``views[r]`` (int64 tensors on the mask's device); element (r, i_1, …) by its coordinates,
    each hashed in on its own. Only tensor ops on the device: nothing syncs with the host.

    ``kernel`` (``train.counter_kernel``): ``eager`` runs the hash as ~10 int64 tensor ops per
    coordinate, each over the whole mask (on a GPU, memory traffic of ~20 bytes per element and op:
    issue 37 measured +10 ms per BERT-base step at batch 64 on an H200); ``fused`` runs the same
    function through ``torch.compile`` (Inductor: one kernel that writes the bool mask). Both give
    the same bits (``tests/test_counter_dropout.py``)."""
    dev = sentences.device
    words = key if isinstance(key, torch.Tensor) else key_words(int(key), dev)
    call_word, threshold, dims = _call_word(call), _threshold(p), [int(d) for d in shape[1:]]
    if kernel == "fused" and not _FUSED_FAILED and not _in_dispatch_mode():  # (under a dispatch mode, e.g. the
        # capture check: the eager ops). The call's word as a device scalar (a factory op, no host copy): a
        # Python int would become a symbolic integer under dynamic shapes, and the XOR would need it as a constant
        cw = torch.full((), call_word, dtype=torch.int64, device=dev)
        try:
            return _fused()(words, sentences, views, cw, dims, threshold, _coords(dev))
        except Exception as e:  # noqa: BLE001 - no compiler here (no Triton, no C++ toolchain): the same bits eagerly
            _FUSED_FAILED.append(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")
            log.warning("train.counter_kernel fused: torch.compile of the counter mask failed (%s); the eager ops "
                        "compute the same masks, more slowly", _FUSED_FAILED[0])
    if kernel not in ("eager", "fused"):
        raise SentembError(f"train.counter_kernel: {kernel!r} is not eager or fused")
    return _counter_mask(words, sentences, views, call_word, dims, threshold)


def _call_word(call: int) -> int:
    """The dropout call's index as the 32-bit word the counter hash mixes in."""
    return (int(call) * _COORD[1] + 0x5BD1E995) & _M32


def _threshold(p: float) -> int:
    """A 24-bit draw at or above this keeps the element (probability 1 − p)."""
    return int(round(p * (1 << 24)))


def _counter_mask(words: torch.Tensor, sentences: torch.Tensor, views: torch.Tensor, call_word, dims: list,
                  threshold: int, coord=_COORD, index=None) -> torch.Tensor:
    """``counter_keep_mask``'s hash (``call_word`` an int or a 0-d int64 tensor, ``coord`` ``_COORD``
    or the same constants as an int64 tensor: the same bits). Compiled, a coordinate is an index
    expression that Triton types int32, and its product with a constant above 2^31 does not compile:
    the constants then come as loaded int64 values (``_coords``). ``index(d)``: the int64 coordinates
    0..d-1 (default ``torch.arange``; ``counter_kernel: inline`` slices them from a tensor made
    outside the compiled code, ``_Context.index``, so they too are loaded values)."""
    dev = sentences.device
    lo, hi = words[0], words[1]
    h = _fmix32((sentences & _M32) ^ lo)
    h = _fmix32(h ^ ((views * coord[0]) & _M32) ^ hi)
    h = _fmix32(h ^ call_word)
    h = h.view(-1, *([1] * len(dims)))
    for i, d in enumerate(dims):
        idx = torch.arange(d, device=dev, dtype=torch.int64) if index is None else index(d)
        idx = _fmix32((idx * coord[(i + 2) % len(_COORD)] + i) & _M32)
        h = _fmix32(h ^ idx.view(*([1] * (i + 1)), d, *([1] * (len(dims) - i - 1))))
    shape = (h.shape[0], *dims)
    h = h.expand(*shape) if tuple(h.shape) != shape else h
    return (h >> 8) >= threshold


_FUSED: list = []
_FUSED_FAILED: list = []  # the first compile error: the process then uses the eager ops


def warm_fused(device) -> None:
    """Compile (and on CUDA autotune) the fused counter mask for the two mask ranks a transformer
    draws (hidden states (R, L, D), attention weights (R, H, L, L)) now, on ``device``: before a
    CUDA graph's capture and outside ``sentemb.train.graphs.as_captured``, which makes the eager
    passes look like a capture to the libraries. Widths are dynamic, so the run's shapes reuse
    these kernels."""
    dev = torch.device(device)
    if str(dev) in _WARM:
        return
    _coords(dev)
    words = key_words(1, dev)
    s = torch.arange(4, device=dev, dtype=torch.int64)
    v = torch.zeros(4, device=dev, dtype=torch.int64)
    for shape in ((4, 5, 6), (4, 3, 5, 5)):
        counter_keep_mask(words, s, v, shape, 0.1, 2, kernel="fused")
    _WARM.add(str(dev))


_WARM: set = set()


def forget_warm() -> None:
    """Forget which devices ``warm_fused`` warmed: after ``torch._dynamo.reset`` (a job compiling under
    other settings, ``sentemb.train.loop.fresh_compile_cache``) the fused mask compiles again, and it
    should do so in ``warm_fused``, not inside the capture's warm-up passes."""
    _WARM.clear()


_COORDS: dict = {}


def _device(device) -> torch.device:
    """``device`` with its index: ``cuda`` (what ``train.device: auto`` resolves to) is the current
    CUDA device, ``cuda:0`` say, as a tensor made there reports it. A key tensor's device then
    compares equal to it, and the device caches here have one entry per device."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _coords(dev: torch.device) -> torch.Tensor:
    """``_COORD`` as an int64 tensor on ``dev``, made once per device (``warm_fused``, before a
    capture: a graph must not hold the host copy)."""
    dev = _device(dev)
    key = str(dev)
    if key not in _COORDS:
        _COORDS[key] = torch.tensor(_COORD, dtype=torch.int64).to(dev)
    return _COORDS[key]


_ARANGED: dict = {}
_SUPERSEDED: list = []  # shorter aranges replaced in _ARANGED: captured graphs may still read their memory
#: the least length of ``_aranged``'s tensor: hidden sizes, lengths and rows of a large encoder's batch
ARANGED_MIN = 8192


def _aranged(dev: torch.device, n: int = 0) -> torch.Tensor:
    """int64 0, 1, …, at least ``max(n, ARANGED_MIN)`` long, on ``dev``: one tensor per device, made
    (again, longer) only when a context needs more, at its entry (``keyed``) or before a CUDA
    graph's capture (``warm_inline``), never inside compiled code."""
    dev = _device(dev)
    key = str(dev)
    have = _ARANGED.get(key)
    if have is None or have.size(0) < n:
        if have is not None:  # kept alive: a CUDA graph captured reading it holds its address, not a reference
            _SUPERSEDED.append(have)
        _ARANGED[key] = torch.arange(max(n, ARANGED_MIN, 0 if have is None else 2 * have.size(0)), device=dev,
                                     dtype=torch.int64)
    return _ARANGED[key]


def warm_inline(device, n: int = 0) -> None:
    """Make ``counter_kernel: inline``'s device constants (``_coords``, ``_aranged`` for chunks of up
    to ``n`` sentences) now, before a CUDA graph's capture: inside one they would be a host copy."""
    dev = _device(device)
    _coords(dev)
    _aranged(dev, 8 * n)


def _in_dispatch_mode() -> bool:
    """A Python dispatch mode is active (``sentemb.train.graphs.capture_hazards``' check, a FLOP
    counter): ``torch.compile`` does not run under one, and the eager ops give the same bits."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None


def _fused():
    """``_counter_mask`` compiled once per process (dynamic shapes: one kernel per mask rank, whatever
    the widths), made on first use."""
    if not _FUSED:
        _FUSED.append(torch.compile(_counter_mask, dynamic=True, fullgraph=True))
    return _FUSED[0]


def _check_layout(rows: int, n: int) -> None:
    """A tensor of ``rows`` rows in a chunk of ``n`` sentences must be v views of them (the default
    layout), or its rows declared with ``rows()``."""
    if n <= 0 or rows % n:
        raise SentembError(f"keyed dropout: a tensor of {rows} rows in a chunk of {n} sentences is not v views of "
                           "them; declare its rows with sentemb.model.dropout.rows(sentence, view) around that forward")


@dataclass
class _Context:
    seed: int
    micro: int
    start: int
    stop: int
    calls: int = 0
    override: list = field(default_factory=list)  # stack of (sentence (R,), view (R,)) chunk-local
    mode: str = "generator"  # or "counter" (module docstring)
    key: torch.Tensor | None = None  # counter: the (seed, micro) key words, given (a graph's) or made per device
    kernel: str = "eager"  # counter: eager, fused (counter_keep_mask) or inline (keyed's docstring)
    # counter_kernel inline: made at the context's entry, outside compiled code (keyed), so that compiled
    # code reads tensors only and never specialises on the chunk's start or the micro-batch
    start_t: torch.Tensor | None = None  # the chunk's first sentence, a 0-d int64 tensor on the device
    coord: torch.Tensor | None = None  # _COORD on the device (_coords)
    aranged: torch.Tensor | None = None  # int64 0, 1, ... on the device (_aranged)
    n: int = 0  # stop - start, read instead of the two (which differ per chunk)

    def index(self, d: int) -> torch.Tensor:
        """The int64 coordinates 0..d-1 (``inline``): a slice of ``aranged``, loaded values rather than
        an index expression (``_counter_mask``), else ``torch.arange``."""
        a = self.aranged
        return a[:d] if d <= a.size(0) else torch.arange(d, device=a.device, dtype=torch.int64)

    def row_tensors(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' (sentence, view) keys as int64 tensors on ``device``: those ``rows()`` declared
        (tensors on the device are kept as they are: graph-safe, no host round trip), else the
        default layout (v views of the chunk's sentences, view-major) made there from ``arange``,
        with no host data. With ``inline`` the chunk's start is ``start_t`` and the coordinates come
        from ``aranged``, so compiled code reads tensors, not the start."""
        inline = self.start_t is not None
        start, n = (self.start_t, self.n) if inline else (self.start, self.stop - self.start)
        if self.override:
            sent, view, absolute = self.override[-1]
            if not isinstance(sent, torch.Tensor):  # host lists (eager-built rows): constants under compile
                sent, view = (torch.as_tensor(x, dtype=torch.int64).to(device) for x in (sent, view))
            if sent.numel() != rows:
                raise SentembError(f"keyed dropout: a tensor of {rows} rows inside rows() declaring {sent.numel()}")
            sent = sent.to(device, torch.int64)
            return (sent if absolute else start + sent), view.to(device, torch.int64)
        _check_layout(rows, n)
        r = self.index(rows) if inline else torch.arange(rows, device=device, dtype=torch.int64)
        return start + r % n, r // n

    def row_keys(self, rows: int) -> tuple[list[int], list[int]]:
        n = self.stop - self.start
        if self.override:
            sent, view, absolute = self.override[-1]
            if isinstance(sent, torch.Tensor):
                sent, view = [int(s) for s in sent.tolist()], [int(v) for v in view.tolist()]
            if len(sent) != rows:
                raise SentembError(f"keyed dropout: a tensor of {rows} rows inside rows() declaring {len(sent)}")
            base = 0 if absolute else self.start
            return [base + int(s) for s in sent], [int(v) for v in view]
        _check_layout(rows, n)
        return [self.start + r % n for r in range(rows)], [r // n for r in range(rows)]

    def keep_mask(self, shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
        """Bool (R, ...) mask, True = kept (probability 1 − p), row r from its own generator."""
        call = self.calls
        self.calls += 1
        if self.mode == "counter":
            if self.kernel == "inline":  # traced by torch.compile with the encoder (keyed's docstring)
                st, vt = self.row_tensors(shape[0], self.aranged.device)
                return _counter_mask(self.key, st, vt, _call_word(call), [int(d) for d in shape[1:]], _threshold(p),
                                     coord=self.coord, index=self.index)
            if self.key is None or self.key.device != torch.device(device):
                self.key = key_words(mix(self.seed, self.micro), device)
            st, vt = self.row_tensors(shape[0], torch.device(device))
            return counter_keep_mask(self.key, st, vt, shape, p, call, kernel=self.kernel)
        sent, view = self.row_keys(shape[0])
        g = torch.Generator()
        rows = []
        for s, v in zip(sent, view):
            g.manual_seed(mix(self.seed, self.micro, call, s, v))
            rows.append(torch.rand(shape[1:], generator=g) >= p)
        mask = torch.stack(rows) if rows else torch.zeros(shape, dtype=torch.bool)
        return mask.to(device, non_blocking=True)


def _current() -> _Context | None:
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1] if stack else None


def _rows_k() -> int | None:
    stack = getattr(_LOCAL, "rows_k", None)
    return stack[-1] if stack else None


def _dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    k = _rows_k()
    if k is not None and training and p > 0.0 and input.dim() > 0 and input.size(0) > k:  # dropout_rows
        return torch.cat([_dropout_all(input[:k], p, training, False), input[k:]])
    return _dropout_all(input, p, training, inplace)


def _dropout_all(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    ctx = _current()
    if ctx is None or not training or p == 0.0 or input.dim() == 0:
        return _ORIGINAL["dropout"](input, p, training, inplace)
    if p >= 1.0:
        return input.mul_(0.0) if inplace else input * 0.0
    mask = ctx.keep_mask(input.shape, p, input.device).to(input.dtype)
    scale = 1.0 / (1.0 - p)
    return input.mul_(mask).mul_(scale) if inplace else input * mask * scale


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kw):
    k = _rows_k()
    if k is not None and dropout_p > 0.0 and query.dim() > 0 and query.size(0) > k:  # dropout_rows
        n = query.size(0)

        def rows(t, sl):  # a mask broadcast over the rows (size 1 there) is kept whole
            return t[sl] if isinstance(t, torch.Tensor) and t.dim() > 0 and t.size(0) == n else t

        head = _sdpa_all(query[:k], rows(key, slice(0, k)), rows(value, slice(0, k)), rows(attn_mask, slice(0, k)),
                         dropout_p, is_causal, scale, enable_gqa, **kw)
        tail = _sdpa_all(query[k:], rows(key, slice(k, None)), rows(value, slice(k, None)),
                         rows(attn_mask, slice(k, None)), 0.0, is_causal, scale, enable_gqa, **kw)
        return torch.cat([head, tail])
    return _sdpa_all(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, **kw)


def _sdpa_all(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kw):
    ctx = _current()
    if ctx is None or dropout_p == 0.0:
        if enable_gqa:
            kw["enable_gqa"] = True
        return _ORIGINAL["sdpa"](query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                 scale=scale, **kw)
    # the math form of torch's documented reference implementation, with the keyed mask
    L, S = query.size(-2), key.size(-2)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        causal = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    weights = _dropout_all(weights, dropout_p, True)
    return weights.to(value.dtype) @ value


def _torch_rules() -> None:
    """Have Dynamo's table of torch's own functions built before this module replaces any: it is
    built once per process (``get_torch_obj_rule_map``, cached; its first call, at the latest the
    first compilation) from what ``torch.nn.functional`` holds then, and an interceptor found there
    would be put in a compiled graph as an opaque torch op instead of traced (``compile_inline``
    needs it traced)."""
    import torch._dynamo.trace_rules as rules

    rules.get_torch_obj_rule_map()


def _install() -> None:
    global _INSTALLED
    if not _INSTALLED:
        _torch_rules()
        F.dropout = _dropout
        F.scaled_dot_product_attention = _sdpa
        _INSTALLED = True


def compile_safe() -> None:
    """Keyed dropout under ``train.compile`` (``dropout_rng: counter``): ``F.dropout`` and
    ``F.scaled_dot_product_attention`` are replaced by their interceptors under
    ``torch.compiler.disable``, so Dynamo neither traces nor guards on this module's thread-local
    context (the row keys, the call counter): every dropout is a graph break, run eagerly with the
    counter mask (the fused kernel, compiled on its own, with ``counter_kernel: fused``), and the
    code between two dropouts is compiled. Under ``train.graphs`` the breaks cost nothing at replay.
    For the rest of the process: a break also where no context is active (then torch's own ops)."""
    global _INSTALLED
    if getattr(F.dropout, "_sentemb_compile_safe", False):
        return
    _torch_rules()
    F.dropout = torch.compiler.disable(_dropout)
    F.scaled_dot_product_attention = torch.compiler.disable(_sdpa)
    F.dropout._sentemb_compile_safe = True
    _INSTALLED = True


def compile_inline() -> None:
    """``train.counter_kernel: inline`` under ``train.compile``: ``F.dropout`` and
    ``F.scaled_dot_product_attention`` are the plain interceptors, which Dynamo traces (it reads the
    context from this module's thread-local stack and guards on what it reads: the chunk's size and
    the call count, constant per shape), so the encoder compiles without a break at each dropout and
    the counter hash is fused with its neighbours. Undoes ``compile_safe`` for the process."""
    global _INSTALLED
    _torch_rules()
    F.dropout = _dropout
    F.scaled_dot_product_attention = _sdpa
    _INSTALLED = True


def interceptors() -> Callable[[], None]:
    """What ``compile_safe``/``compile_inline`` are about to change (``F.dropout``,
    ``F.scaled_dot_product_attention``, whether an interceptor is installed), as a function that puts
    it back: a job calls it when it closes, so a later job of the process (gpu-check's rows, the tests)
    compiles torch's own dropout again (a ``compile_safe`` left in place kept every later compiled
    dropout out of Inductor's graph: ``compile_random: inductor`` drew the eager masks)."""
    before = (F.dropout, F.scaled_dot_product_attention, _INSTALLED)

    def put_back() -> None:
        global _INSTALLED
        F.dropout, F.scaled_dot_product_attention, _INSTALLED = before

    return put_back


@contextmanager
def keyed(seed: int, micro: int, start: int, stop: int, mode: str = "generator", key: torch.Tensor | None = None,
          kernel: str = "eager", device=None):
    """Inside: dropout masks keyed by sentences ``[start, stop)`` of micro-batch ``micro``, drawn
    the ``mode`` way (``generator`` or ``counter``, module docstring). ``key``: with ``counter``, the
    ``key_words`` tensor to read the (seed, micro-batch) key from (a captured graph's static input;
    ``seed`` and ``micro`` are then ignored for the masks). ``kernel``: with ``counter``, ``eager``
    or ``fused`` (``counter_keep_mask``), or ``inline``: the same masks.

    ``inline`` (``train.counter_kernel: inline``) is the form ``torch.compile`` traces: the key, the
    chunk's start and the coordinates are made here as tensors on ``device`` (needed), so the compiled
    encoder reads only tensors and the chunk's size, and the dropout is no graph break
    (``compile_inline``): Inductor fuses the hash with the kernels around it. Entered inside a CUDA
    graph's capture, the key must be given and ``warm_inline`` must have run (only a fill kernel is
    launched here then)."""
    if mode not in ("generator", "counter"):
        raise SentembError(f"keyed dropout: mode {mode!r} is not generator or counter")
    if kernel not in ("eager", "fused", "inline"):
        raise SentembError(f"keyed dropout: kernel {kernel!r} is not eager, fused or inline")
    _install()
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    ctx = _Context(int(seed), int(micro), int(start), int(stop), mode=mode, key=key, kernel=kernel)
    if mode == "counter" and kernel == "inline":
        if device is None:
            raise SentembError("keyed dropout: kernel inline needs the device its masks are made on")
        dev = _device(device)
        if ctx.key is None:  # a given key (a captured graph's static input) is read as it is
            ctx.key = key_words(mix(ctx.seed, ctx.micro), dev)
        elif ctx.key.device != dev:
            raise SentembError(f"keyed dropout: the key tensor is on {ctx.key.device}, the masks on {dev}")
        ctx.start_t = torch.full((), ctx.start, dtype=torch.int64, device=dev)  # a fill kernel: no host copy
        ctx.coord, ctx.aranged, ctx.n = _coords(dev), _aranged(dev, 8 * (ctx.stop - ctx.start)), ctx.stop - ctx.start
    stack.append(ctx)
    try:
        yield stack[-1]
    finally:
        stack.pop()


@contextmanager
def dropout_rows(k: int):
    """Inside: a dropout (``F.dropout``, ``nn.Dropout``, SDPA's ``dropout_p``) of a tensor of more than
    ``k`` rows applies to its first ``k`` rows only; the other rows pass as in evaluation mode (no
    mask, no scaling), and their attention runs without dropout. One forward then serves rows with
    dropout and rows without, e.g. ArcCSE's two dropout views and its dropout-free triplets
    (``triplet_pass: with_views``). The first ``k`` rows are drawn as they would be alone: from the
    stream, or inside a ``keyed`` context by its keys and call count, so ``counter`` masks are those
    of a forward of those rows alone. Rows sit on dim 0 (Hugging Face's hidden states and its SDPA's
    (batch, heads, length, dim) inputs)."""
    _install()
    stack = getattr(_LOCAL, "rows_k", None)
    if stack is None:
        stack = _LOCAL.rows_k = []
    stack.append(int(k))
    try:
        yield
    finally:
        stack.pop()


@contextmanager
def call_block(size: int, where: str = "a block of dropout calls"):
    """Inside a keyed context: the dropout calls here number from the context's count on, and after
    the block the count goes on ``size`` later, however many calls were made inside (none, for an
    optional forward skipped when a chunk has no rows for it). The masks of what follows thus do
    not depend on whether or how the block ran: the same in every chunking, eager or graphed.
    Outside a context it does nothing; more than ``size`` calls inside is an error."""
    ctx = _current()
    if ctx is None:
        yield
        return
    base = ctx.calls
    yield
    if ctx.calls - base > size:
        raise SentembError(f"keyed dropout: {ctx.calls - base} dropout calls in {where}, more than its block of {size}")
    ctx.calls = base + size


@contextmanager
def rows(sentence, view=0, absolute: bool = False):
    """Inside a ``keyed`` context: the forward passes here run over rows whose sentences (indices
    within the chunk) and views are these, e.g. UNA's interleaved a_1, p_1, a_2, p_2:
    ``rows([0, 0, 1, 1], [0, 1, 0, 1])``. Outside a context it does nothing. Tensors on the device
    are kept as they are (no host read: the form a captured step, ``train.graphs``, needs); the
    ``counter`` masks read them there. ``absolute``: the keys are not the chunk's sentences but keys
    of the micro-batch as a whole, the same in every chunk and process (PromptBERT's template rows,
    one per sentence length: key L wherever the chunk starts); give them a view no sentence row has."""
    ctx = _current()
    if ctx is None:
        yield
        return
    if isinstance(sentence, torch.Tensor):
        sentence = sentence.flatten()
        view = torch.full_like(sentence, int(view)) if isinstance(view, int) else view.flatten()
        ctx.override.append((sentence, view, absolute))
        try:
            yield
        finally:
            ctx.override.pop()
        return
    sentence = [int(s) for s in torch.as_tensor(sentence).flatten().tolist()]
    view = [int(view)] * len(sentence) if isinstance(view, int) else [int(v) for v in torch.as_tensor(view).tolist()]
    ctx.override.append((sentence, view, absolute))
    try:
        yield
    finally:
        ctx.override.pop()
