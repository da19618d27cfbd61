"""Token frequency per tokenizer, for SARCSE's self-adaptive reconstruction loss (methods.md §1).

freq(w) = count of token w in the training corpus / total token count. Sentences are tokenized
whole (no truncation) with the backbone's fast tokenizer and ``add_special_tokens=False``. Special
tokens (``tokenizer.all_special_ids``: [CLS]/[SEP]/[PAD]/[MASK]/[UNK], <s>/</s>/<pad>/<mask>/<unk>)
are excluded: their ``count`` is still reported (a literal "[UNK]" can occur) but they are left out
of the total and get ``freq = 0``, so ``freq`` sums to 1 over the other ids. SARCSE later derives
f(w) = max(θ, 1 − λ·freq(w)) from this table.

Output (parquet, one row per vocabulary id 0..len(tokenizer)-1): token_id, token, count, freq,
special; metadata: total_tokens, n_lines, tokenizer.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ..data.corpus import iter_lines
from . import chunked, write_parquet

log = logging.getLogger(__name__)


def load_tokenizer(tokenizer_dir: str | os.PathLike):
    """The backbone's fast tokenizer (``sentemb.model.backbone.load_tokenizer``, which refuses a
    directory without a vocabulary)."""
    from ..model.backbone import load_tokenizer as load

    return load(tokenizer_dir, fast=True)


def count_tokens(lines, tokenizer, batch_size: int = 4096) -> np.ndarray:
    """Occurrences of every id in ``range(len(tokenizer))`` over ``lines`` (int64 array)."""
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for batch in chunked(lines, batch_size):
        ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False,
                        return_token_type_ids=False)["input_ids"]
        flat = np.fromiter((i for seq in ids for i in seq), dtype=np.int64)
        if flat.size:
            counts += np.bincount(flat, minlength=len(counts))[: len(counts)]
    return counts


def token_frequencies(corpus: str | os.PathLike, tokenizer_dir: str | os.PathLike,
                      batch_size: int = 4096):
    """Return the frequency table (a pyarrow Table) and its metadata for ``corpus``."""
    import pyarrow as pa

    tok = load_tokenizer(tokenizer_dir)
    n_lines = 0

    def lines():
        nonlocal n_lines
        for line in iter_lines(corpus):
            n_lines += 1
            yield line

    counts = count_tokens(lines(), tok, batch_size)
    special = np.zeros(len(counts), dtype=bool)
    special[[i for i in tok.all_special_ids if i < len(counts)]] = True
    total = int(counts[~special].sum())
    freq = np.where(special, 0.0, counts / total if total else 0.0)
    ids = np.arange(len(counts), dtype=np.int64)
    tokens = [t if t is not None else "" for t in tok.convert_ids_to_tokens(ids.tolist())]
    table = pa.table({"token_id": ids, "token": tokens, "count": counts, "freq": freq,
                      "special": special})
    meta = {"total_tokens": total, "n_lines": n_lines, "tokenizer": str(tokenizer_dir),
            "vocab_size": len(counts), "statistic": "token_freq", "spec": "methods.md §1"}
    return table, meta


def write_token_frequencies(corpus, tokenizer_dir, output, batch_size: int = 4096) -> dict:
    table, meta = token_frequencies(corpus, tokenizer_dir, batch_size)
    write_parquet(table, output, meta)
    log.info("token frequencies: %d lines, %d tokens, vocab %d -> %s", meta["n_lines"],
             meta["total_tokens"], meta["vocab_size"], output)
    return meta
