"""TF-IDF statistics for UNA's hard negatives (methods.md §3; UNA paper eq. 2, Step 1 and 3).

Each sentence is a document; its terms are NLTK word tokens (``word_tokenize(text,
preserve_line=True)``: Treebank tokenizer, no sentence splitting, so no ``punkt`` data is needed),
lowercased after tokenization (so a consumer can tokenize the original-case sentence and look the
lowercased tokens up). For a document d with n tokens and n_t occurrences of term t:

    tf(t, d) = log(1 + n_t / n)          idf(t) = −log(df_t / N)
    s_t = max_d tf(t, d) · idf(t)        (the term's corpus relevance, the column max of Z)

N counts documents with at least one token: empty lines are no documents (and n ≥ 1 for every
document, so nothing divides by zero). Because idf ≥ 0 and rounding is monotone,
s_t = idf(t) · max_d tf(t, d) exactly, so the corpus is streamed keeping only df_t and max tf per
term (memory O(vocabulary), never an N × V matrix). Chunks are processed in parallel and merged by
integer sums and float maxima, so results are bit-identical for any worker count.

Output ``tfidf.parquet``: term, df, idf, s, rank, first — sorted by s descending, ties by term
ascending; ``rank`` is the 0-based row position (UNA samples replacements within radius r in this
order). ``first`` numbers the terms in the order they first occur in the sources (line by line,
token by token): the order the authors' code keeps terms in (a dict filled as it reads the corpus),
and so their order among equal s after its stable sort (UNA's ``rank_ties: first_seen``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Sequence

from ..data.corpus import iter_lines
from . import chunked, default_workers, parallel_map, write_parquet

log = logging.getLogger(__name__)

TOKENIZER_NAME = "nltk.word_tokenize(preserve_line=True), lowercased"


#: the pattern attributes of ``nltk.tokenize.destructive.NLTKWordTokenizer`` (a pattern, a (pattern,
#: substitution) pair, or a list of either), all that its ``tokenize`` reads
_PATTERN_ATTRS = ("STARTING_QUOTES", "PUNCTUATION", "PARENS_BRACKETS", "CONVERT_PARENTHESES", "DOUBLE_DASHES",
                  "ENDING_QUOTES", "CONTRACTIONS2", "CONTRACTIONS3")


@functools.lru_cache(maxsize=1)
def word_tokenizer():
    """NLTK's Treebank word tokenizer (``NLTKWordTokenizer``, what ``word_tokenize(text,
    preserve_line=True)`` runs) with its own compiled patterns, applied without NLTK 3.10's per-call
    wall-clock limit (``nltk.redos.compile(pattern, timeout=None)``).

    The limit guards NLTK's regexes against patterns a caller supplies; these are NLTK's fixed
    Treebank patterns, and timing every one of a sentence's ~30 substitutions cost half as much again
    as the substitutions: ``word_tokenize`` took 14.0 s against 9.2 s on the 89,192 sentences of
    ``sts-unlabeled`` (``scripts/bench_stats.py --only tokenizers``), on every TF-IDF statistic and on
    UNA's batches. The tokens are the same: the same compiled patterns run (``tests/test_stats.py``
    compares them with ``word_tokenize`` on real corpora). An NLTK without ``redos`` gets its own
    tokenizer unchanged."""
    from nltk.tokenize.destructive import NLTKWordTokenizer

    try:
        from nltk import redos
    except ImportError:  # NLTK before 3.10: plain compiled patterns already
        return NLTKWordTokenizer()

    def bare(x):
        if isinstance(x, redos.TimedPattern):  # the same compiled pattern, no time limit
            return redos.compile(x, timeout=None)
        if isinstance(x, (list, tuple)):
            return type(x)(bare(i) for i in x)
        return x

    untimed = {k: bare(getattr(NLTKWordTokenizer, k)) for k in _PATTERN_ATTRS if hasattr(NLTKWordTokenizer, k)}
    return type("UntimedNLTKWordTokenizer", (NLTKWordTokenizer,), {"__module__": __name__, **untimed})()


def word_tokens(text: str) -> list[str]:
    """One sentence's NLTK word tokens in their case (``word_tokenize(text, preserve_line=True)``,
    i.e. ``NLTKWordTokenizer().tokenize(text)``, run by :func:`word_tokenizer`): what :func:`tokenize`
    lowercases, and what UNA's span write-back aligns to the text (``sentemb.methods.una.token_spans``)."""
    return word_tokenizer().tokenize(text)


def tokenize(text: str) -> list[str]:
    """UNA's terms of one sentence: NLTK word tokens, lowercased (no punkt data needed)."""
    return [t.lower() for t in word_tokens(text)]


def sentence_tfidf(tokens: Sequence[str], df: dict, n_docs: int) -> dict[str, float]:
    """tf(t,d)·idf(t) for the terms of one tokenized sentence (what UNA's step 2 scores), given df."""
    n = len(tokens)
    counts: dict[str, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    return {t: math.log1p(c / n) * (-math.log(df[t] / n_docs) + 0.0) for t, c in counts.items()}


def _chunk_stats(lines: list[str]) -> tuple[int, dict[str, int], dict[str, float]]:
    """(documents, df, max tf) over one chunk of sentences; ``df``'s keys are in the order the terms
    first occur in the chunk (a dict keeps its insertion order)."""
    n_docs, df, maxtf = 0, {}, {}
    for line in lines:
        tokens = tokenize(line)
        n = len(tokens)
        if n == 0:
            continue
        n_docs += 1
        counts: dict[str, int] = {}
        for t in tokens:
            counts[t] = counts.get(t, 0) + 1
        for t, c in counts.items():
            df[t] = df.get(t, 0) + 1
            tf = math.log1p(c / n)
            if tf > maxtf.get(t, -1.0):
                maxtf[t] = tf
    return n_docs, df, maxtf


def tfidf_stats(sources: Sequence[str | os.PathLike], workers: int | None = None,
                chunk_size: int = 5000):
    """Stream ``sources`` (corpus, then e.g. its paraphrases) and return (pyarrow Table, metadata)."""
    import numpy as np
    import pyarrow as pa

    workers = default_workers() if workers is None else max(1, workers)
    n_lines: list[int] = []

    def lines():
        for src in sources:
            n_lines.append(0)
            for line in iter_lines(src):
                n_lines[-1] += 1
                yield line

    n_docs, df, maxtf = 0, {}, {}
    for nd, cdf, ctf in parallel_map(_chunk_stats, chunked(lines(), chunk_size), workers):
        n_docs += nd
        for t, c in cdf.items():
            df[t] = df.get(t, 0) + c
        for t, v in ctf.items():
            if v > maxtf.get(t, -1.0):
                maxtf[t] = v
    first = {t: i for i, t in enumerate(df)}  # chunks merged in order: the corpus's first-occurrence order
    terms = sorted(df)  # deterministic base order, then a stable sort by s descending
    dfa = np.fromiter((df[t] for t in terms), dtype=np.int64, count=len(terms))
    tfa = np.fromiter((maxtf[t] for t in terms), dtype=np.float64, count=len(terms))
    idf = np.array([-math.log(d / n_docs) + 0.0 for d in dfa.tolist()], dtype=np.float64)
    s = tfa * idf
    order = np.argsort(-s, kind="stable")
    table = pa.table({
        "term": pa.array([terms[i] for i in order], pa.string()),
        "df": dfa[order], "idf": idf[order], "s": s[order],
        "rank": np.arange(len(terms), dtype=np.int64),
        "first": np.fromiter((first[terms[i]] for i in order), dtype=np.int64, count=len(terms)),
    })
    meta = {"n_docs": n_docs, "n_lines": n_lines, "sources": [str(p) for p in sources],
            "vocab_size": len(terms), "tokenizer": TOKENIZER_NAME, "statistic": "tfidf",
            "spec": "methods.md §3: tf=log(1+n_t/n), idf=-log(df/N), s=max_d tf*idf"}
    return table, meta


def write_tfidf(sources, output, workers: int | None = None, chunk_size: int = 5000) -> dict:
    table, meta = tfidf_stats(sources, workers, chunk_size)
    write_parquet(table, output, meta)
    log.info("tfidf: %d documents, %d terms -> %s", meta["n_docs"], meta["vocab_size"], output)
    return meta
