"""Corpus statistics computed once per corpus (workflow stage ``stats``) and only read by training.

* :mod:`.frequency` — token frequency per tokenizer (SARCSE, methods.md §1).
* :mod:`.rake` — RAKE key phrases per sentence (PaSeR, §2).
* :mod:`.tfidf` — TF-IDF document frequencies and corpus relevance s_t (UNA, §3).
* :mod:`.paraphrase` — sharded, resumable seq2seq paraphrasing (UNA positives, §3).
* :mod:`.summary` — a short human-readable summary per corpus.

Corpora are read by :mod:`sentemb.data.corpus` (its line convention): empty lines are kept, so every
output stays aligned with the corpus lines: an empty line has no TF-IDF terms and is not a
document, gets no RAKE phrases, and an empty paraphrase.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice

from ..config.paths import Layout


def chunked(items: Iterable, size: int) -> Iterator[list]:
    """``items`` in lists of ``size`` (the last one shorter); a size below 1 would yield nothing at all."""
    if size < 1:
        from .. import SentembError

        raise SentembError(f"chunk size must be at least 1, got {size}")
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def default_workers() -> int:
    """Cores this process may use (respects CPU affinity, e.g. a Slurm allocation)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def parallel_map(fn, items: Iterable, workers: int, initializer=None, initargs=()) -> Iterator:
    """``map(fn, items)`` over ``workers`` processes, results in input order, bounded memory.

    Unlike ``Pool.imap`` (whose feeder thread drains the whole input iterator), at most
    ``2 * workers`` items are in flight, so a streamed corpus is never held in memory whole.
    ``workers <= 1`` runs in this process (same results: callers merge deterministically).
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    import multiprocessing as mp
    from collections import deque

    # fork: workers start in milliseconds with NLTK already imported (forkserver/spawn re-import it,
    # ~2 s each, and cannot start from a stdin script). Workers run pure-Python code only (no
    # torch/tokenizers), so the parent's native thread pools are no hazard.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=initializer, initargs=initargs) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def write_parquet(table, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Write a pyarrow table atomically (temp sibling, then rename), with optional JSON metadata."""
    import json

    import pyarrow.parquet as pq

    from ..utils import atomic_path

    if metadata:
        meta = dict(table.schema.metadata or {})
        meta[b"sentemb"] = json.dumps(metadata, sort_keys=True).encode()
        table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_metadata(path: str | os.PathLike) -> dict:
    """The ``sentemb`` metadata a stats parquet file was written with (``{}`` if none)."""
    import json

    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[b"sentemb"]) if b"sentemb" in meta else {}
