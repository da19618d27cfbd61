"""Bounded step shapes: every variable width of a batch padded up to one of a few buckets
(``train.buckets``, issue 36 §2).

A batch padded to its longest row has a new width almost every step: each new width is a new set
of kernel shapes and allocator blocks on a GPU (ArcCSE's first steps at B 64 took 548 ms/step on an
H200 for that reason, docs/gpu/h200-2026-11-26.md), and no step of a new shape can replay a
captured CUDA graph. Padding each width up to the smallest bucket that holds it bounds the shapes one
epoch meets, at the price of the padded positions' arithmetic (``padding_overhead`` measures it on
the real corpus; ``sentemb plan`` prices it).

Padding changes nothing a method computes on its real tokens: padded positions are masked out of
attention, pooled over never, and carry label -100 where a loss reads labels. With
``train.dropout_rng: stream`` the dropout masks are drawn over the padded shape, so a bucketed run
draws other masks for the same tokens: another random run with the same distribution, as
``train.chunk_size`` and ``train.unpad`` are (the setting is left out of the run's fingerprint).
With ``dropout_rng: keyed`` a hidden state's mask is the same at every real position, but an
attention-weight mask is drawn in flat order over the padded (heads, L, L), so it is not. With
``dropout_rng: counter`` every mask element is a hash of its coordinates, so a bucketed run equals
the unbucketed one with dropout on (``sentemb.model.dropout``).

The setting:
- ``auto`` (default): ``AUTO_LADDER`` cut at ``max_len`` on CUDA (where shapes cost), no bucketing
  elsewhere (a CPU step's time is its arithmetic, so padding is pure cost);
- ``none``: pad every width to its longest row (the behaviour before buckets);
- a list of widths: those buckets, on every device (tests and the plan use this).

A group of rows that may pass ``max_len`` (ArcCSE's triplets, PaSeR's decoder rows) goes on past
the last bucket in half-octave steps up to its own limit (``bucket_width(n, buckets, limit)``,
``Method.width(n, limit)``). ``batch_shapes`` / ``batch_widths`` name each group's (rows, width) in
a built batch and ``count_shapes`` counts the distinct ones over many batches.

The ladder, measured (``scripts/bucket_overhead.py --batches 186 --ladder``: one epoch of
``wiki1m_head.txt``, 186 batches of 64, all-MiniLM-L6-v2's tokenizer, ``sampler: length`` for
ArcCSE and ``random`` for the others; overhead = padded positions with buckets / without, rows x
width summed over the epoch, and in brackets the distinct widths with buckets; without buckets
there are 20-70):

=========================  ===========  =================  ==================  ====================
method, group              ``max_len``  ``AUTO_LADDER``    16,24,32,48,64,     16,32,48,64,96,
                                                            128,256,512         128,256,512
=========================  ===========  =================  ==================  ====================
simcse/sarcse/infocse      32           1.000 (1)          1.000 (1)           1.000 (1)
  (and una, paser) rows    512          1.230 (5)          1.490 (4)           1.230 (5)
arccse sentences           32           1.066 (2)          1.048 (3)           1.079 (2)
arccse triplets            32           1.204 (5)          1.204 (5)           1.204 (5)
arccse sentences           512          1.229 (7)          1.303 (7)           1.238 (7)
arccse triplets            512          1.230 (5)          1.411 (4)           1.230 (5)
paser decoder              32           1.164 (3)          1.164 (3)           1.227 (2)
paser decoder              512          1.179 (4)          1.179 (4)           1.188 (3)
=========================  ===========  =================  ==================  ====================

A random batch of 64 is 32 tokens wide at ``max_len`` 32 (every batch holds a sentence that is cut),
so the methods trained there pay nothing for their sentences. At 512 a random batch is 45-141 tokens
wide (median 75) and a length-sampled one 10-141: the first ladder's gap from 64 to 128
cost 1.30-1.49; 96 in it brings that to 1.23, paid for by dropping 16 (length-sampled batches of
short sentences pad to 24: +1.8 points on ArcCSE's sentences at 32, where a row is cheap). Past
``max_len`` half-octaves (x1.5 at most) instead of doublings bring ArcCSE's triplets at 32 from
1.43 to 1.20 (3 -> 5 widths) and PaSeR's decoder rows from 1.25 to 1.16. The paper's ArcCSE
micro-batch (32) gives the same picture (sentences + triplets at 512: 1.307 with the first ladder,
1.217 with this one). ``sentemb plan`` and the H200 timings price the shapes themselves.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Sequence

from .. import SentembError

#: ``train.buckets: auto``'s widths: 8, multiples of 8 (tensor-core friendly), in half-octave steps
#: (x4/3, x3/2) where real batches are (a batch of 64 wiki1m sentences is 32-141 BERT tokens wide,
#: a length-sampled one 10-141) and octaves above 128. Cut at the run's ``max_len``, which is always
#: the last bucket. Chosen on measured batches (module docstring, "The ladder").
AUTO_LADDER = (24, 32, 48, 64, 96, 128, 256, 512)


def resolve_buckets(setting, max_len: int, device_type: str = "cuda", where: str = "train.buckets"
                    ) -> tuple[int, ...] | None:
    """The bucket widths of a run (ascending, the last ``max_len``), or None for "pad to the longest".

    ``setting``: ``train.buckets`` (``auto``, ``none``/None, or a list of positive ints);
    ``device_type``: where the run trains (``auto`` buckets on ``cuda`` only). Widths above
    ``max_len`` are dropped; ``max_len`` is added as the last bucket, so no row is ever cut."""
    if setting is None or setting == "none":
        return None
    if setting == "auto":
        if device_type != "cuda":
            return None
        widths: Iterable[int] = AUTO_LADDER
    elif isinstance(setting, (list, tuple)):
        bad = [w for w in setting if isinstance(w, bool) or not isinstance(w, int) or w < 1]
        if bad or not setting:
            raise SentembError(f"{where}: {setting!r} is not auto, none or a non-empty list of positive widths")
        widths = setting
    else:
        raise SentembError(f"{where}: {setting!r} is not auto, none or a list of widths")
    return tuple(sorted({int(w) for w in widths if int(w) < max_len} | {int(max_len)}))


def next_width(w: int) -> int:
    """The smallest width above ``w`` of the form 2^k or 3·2^k (half-octave steps: 32, 48, 64, 96, 128,
    192, 256, 384, 512, ...; multiples of 8 from 24 on): how a group's widths grow past the last bucket."""
    k = int(w).bit_length()  # 2^(k-1) <= w < 2^k
    half = 3 << (k - 2) if k >= 2 else 2
    return half if half > w else 1 << k


def bucket_width(n: int, buckets: Sequence[int] | None, limit: int | None = None) -> int:
    """The padded width of a row group whose longest row has ``n`` positions: the smallest bucket
    ``>= n``; ``n`` itself without buckets.

    Beyond the last bucket (``max_len``: a group the method lets grow past it, ArcCSE's triplets up
    to ``triplet_max_len``, PaSeR's decoder rows up to ``max_target_len``): without ``limit``, ``n``
    unchanged; with ``limit`` (the group's own longest possible width, within its positions) the
    widths go on in half-octave steps (``next_width``: 32 -> 48, 64, 96, 128, 192, 256, 384, 512),
    capped at ``limit``, so such a group too meets a few widths, each at most 1.5 times its longest
    row. A bucket above ``limit`` is cut to it (PaSeR's decoder rows at ``max_target_len`` 20 in the
    bucket 24 of ``max_len`` 32 would pass its 20 positions). Past the last bucket, ``n > limit``
    gives ``n`` (a row is never cut)."""
    n = int(n)
    if not buckets:
        return n
    i = bisect_left(buckets, n)
    if i < len(buckets):
        return int(buckets[i]) if limit is None or n > limit else min(int(buckets[i]), int(limit))
    if limit is None or n > limit:
        return n
    w = int(buckets[-1])
    while w < n:
        w = next_width(w)
    return min(w, int(limit))


def pad_to(t, width: int, value, dim: int = -1):
    """``t`` (a tensor) right-padded with ``value`` along ``dim`` to ``width`` (unchanged if it is
    already that wide or wider)."""
    import torch

    n = t.size(dim)
    if n >= width:
        return t
    shape = list(t.shape)
    shape[dim] = width - n
    return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=dim)


def padding_overhead(widths: Sequence[int], rows: Sequence[int] | None = None,
                     buckets: Sequence[int] | None = None) -> float:
    """Padded positions with ``buckets`` / padded positions without, over groups whose longest row
    is ``widths[i]`` positions and which have ``rows[i]`` rows (default 1 each): the factor the
    padding multiplies a step's token work by (>= 1)."""
    rows = rows if rows is not None else [1] * len(widths)
    plain = sum(w * r for w, r in zip(widths, rows))
    if not plain:
        return 1.0
    return sum(bucket_width(w, buckets) * r for w, r in zip(widths, rows)) / plain


def batch_shapes(batch: dict, groups: dict[str, str] | None = None) -> dict[str, tuple[int, int]]:
    """(rows, padded width) of each group of row tensors of a built batch (``Method.build_batch``).

    A tensor of 2 or more dimensions is a group's: the group ``groups`` names for the longest prefix
    of its key that it lists (a method's ``width_groups``: ArcCSE ``{"tri_": "triplets"}``, PaSeR
    ``{"dec_": "decoder"}``), else ``"sentences"``. Its width is dim 1; every tensor of a group has
    the same (else SentembError naming the keys); rows are the most rows of the group's tensors
    (PaSeR's ``input_ids`` hold [s; s̃], 2B, its ``mlm_input_ids`` B). Scalars and 1-D tensors
    (counts, row indices) are no group's; a group without rows is left out (no step computes on it)."""
    groups = groups or {}
    prefixes = sorted(groups, key=len, reverse=True)
    width: dict[str, tuple[int, str]] = {}
    rows: dict[str, int] = {}
    for key, v in batch.items():
        if getattr(v, "dim", lambda: 0)() < 2:
            continue
        g = next((groups[p] for p in prefixes if key.startswith(p)), "sentences")
        w = int(v.size(1))
        if g in width and width[g][0] != w:
            raise SentembError(f"batch_shapes: group '{g}' has width {width[g][0]} ('{width[g][1]}') and {w} ('{key}')")
        width.setdefault(g, (w, key))
        rows[g] = max(rows.get(g, 0), int(v.size(0)))
    return {g: (rows[g], width[g][0]) for g in width if rows[g] > 0}


def batch_widths(batch: dict, groups: dict[str, str] | None = None) -> dict[str, int]:
    """The padded width of each group of a built batch (``batch_shapes``): ``{"sentences": 32,
    "triplets": 64}``."""
    return {g: w for g, (_, w) in batch_shapes(batch, groups).items()}


def count_shapes(method, batches: Iterable[dict], rows: bool = False) -> dict[str, list]:
    """The distinct widths each group of ``method``'s batches meets (``batch_widths`` with the
    method's ``width_groups``), sorted: the number of step shapes an epoch compiles or captures per
    group. ``rows=True``: the distinct (rows, width) pairs instead (a row count that varies, such
    as ArcCSE's triplets, is a shape too)."""
    groups = getattr(method, "width_groups", None) or {}
    seen: dict[str, set] = {}
    for b in batches:
        for g, (r, w) in batch_shapes(b, groups).items():
            seen.setdefault(g, set()).add((r, w) if rows else w)
    return {g: sorted(v) for g, v in seen.items()}
