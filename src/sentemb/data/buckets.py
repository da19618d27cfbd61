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
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Sequence

from .. import SentembError

#: ``train.buckets: auto``'s widths: multiples of 8 (tensor-core friendly), at most 8 below 512,
#: dense where real sentences are (wiki1m: mean 25 BERT tokens, p99 75) and doubling above. Cut at
#: the run's ``max_len``, which is always the last bucket.
AUTO_LADDER = (16, 24, 32, 48, 64, 128, 256, 512)


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


def bucket_width(n: int, buckets: Sequence[int] | None) -> int:
    """The padded width of a row group whose longest row has ``n`` positions: the smallest bucket
    ``>= n``; ``n`` itself without buckets or beyond the last bucket (a width the method itself
    allows past ``max_len``, e.g. special tokens added after truncation)."""
    if not buckets:
        return int(n)
    i = bisect_left(buckets, n)
    return int(buckets[i]) if i < len(buckets) else int(n)


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
