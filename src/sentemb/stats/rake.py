"""RAKE key phrases per sentence, for PaSeR's phrase masking (methods.md §2).

rake-nltk 1.0.6 with its defaults except two arguments that are passed explicitly so it never
loads NLTK data on its own (ecosystem-notes.md): ``stopwords`` = NLTK's English list read from a
given NLTK data directory, and ``sentence_tokenizer`` returning the line whole (each corpus line is
one sentence; no ``punkt_tab``). Words come from rake-nltk's default ``wordpunct_tokenize`` (run
without NLTK 3.10's per-call time limit: ``word_tokenizer``) and are lowercased by rake-nltk; phrases are ranked by rake-nltk (degree/frequency score, descending, ties
by phrase descending, repeated phrases kept, as ``get_ranked_phrases_with_scores`` returns them).
The top k are kept (default 5, so every k ≤ 5 ablation reads a prefix of the same file).

An empty line, a sentence made only of stopwords/punctuation → no phrases. A one-word sentence →
that word with score 1.0 (degree 1 / frequency 1: RAKE only divides by a word's frequency, ≥ 1).

Output ``rake_top{k}.parquet``, one row per corpus line in order: line (0-based), phrases
(list<string>, best first), scores (list<double>).
"""

from __future__ import annotations

import functools
import logging
import os

from ..data.corpus import iter_lines
from . import chunked, default_workers, parallel_map

log = logging.getLogger(__name__)

_RAKE = None  # per-process Rake instance (set by _init_worker)
_TOP_K = 5


def load_stopwords(nltk_data: str | os.PathLike, language: str = "english") -> list[str]:
    """NLTK's stopword list for ``language``, read from the NLTK data directory ``nltk_data``.

    The directory is prepended to ``nltk.data.path`` (NLTK 3.10 reads corpora only from there) and
    the list is read from it directly, not through the process-wide ``nltk.corpus.stopwords``
    cache, so it is always this directory's list (plain ``corpora/stopwords/`` or the zip), whatever
    other directories the process has read from (the search is confined to this one).
    """
    import nltk
    from nltk.corpus.reader import WordListCorpusReader

    from .. import SentembError

    nltk_data = os.path.abspath(nltk_data)
    if nltk_data not in nltk.data.path:
        nltk.data.path.insert(0, nltk_data)
    for name in ("corpora/stopwords/", "corpora/stopwords.zip/stopwords/"):
        try:
            root = nltk.data.find(name, paths=[nltk_data])  # this directory only, not the process's path order
        except LookupError:
            continue
        if str(root).startswith(nltk_data + os.sep):
            try:
                return list(WordListCorpusReader(root, [language], encoding="utf8").words(language))
            except (OSError, LookupError, KeyError):
                break
    raise SentembError(
        f"NLTK stopwords ('{language}') not found in NLTK data directory {nltk_data} (expected "
        f"corpora/stopwords.zip or corpora/stopwords/{language}; the workflow's nltk_data rule fetches it)"
    )


def single_sentence(text: str) -> list[str]:
    """Sentence tokenizer for rake-nltk: a corpus line is one sentence (no punkt needed)."""
    return [text]


@functools.lru_cache(maxsize=1)
def word_tokenizer():
    """rake-nltk's default word tokenizer, NLTK's ``wordpunct_tokenize`` (``WordPunctTokenizer``: its
    compiled pattern ``\\w+|[^\\w\\s]+``, ``findall``), without NLTK 3.10's per-call wall-clock limit
    (``nltk.redos.compile(pattern, timeout=None)``). The limit guards patterns a caller supplies; this is
    NLTK's fixed one, and timing each sentence's one ``findall`` was most of RAKE's extraction time in a
    profile (``wordpunct_tokenize`` 1.7 s against 0.7 s on ``sts-unlabeled``; ``scripts/bench_stats.py
    --only tokenizers``). The words are the same (the same compiled pattern; ``tests/test_stats.py``
    compares them with ``wordpunct_tokenize`` on real corpora). Where NLTK has no time limit, or its
    tokenizer is not built as expected, ``wordpunct_tokenize`` itself."""
    from nltk.tokenize import wordpunct_tokenize
    from nltk.tokenize.regexp import WordPunctTokenizer

    try:
        from nltk import redos
    except ImportError:  # NLTK before 3.10: no time limit
        return wordpunct_tokenize
    tok = WordPunctTokenizer()
    if getattr(tok, "_gaps", True) or not hasattr(tok, "_check_regexp"):
        return wordpunct_tokenize
    tok._check_regexp()
    if not isinstance(getattr(tok, "_regexp", None), redos.TimedPattern):
        return wordpunct_tokenize
    return redos.compile(tok._regexp, timeout=None).findall


def make_rake(stopwords):
    """A ``rake_nltk.Rake`` that needs no NLTK data at run time, with rake-nltk's default word
    tokenizer run without NLTK's time limit (:func:`word_tokenizer`)."""
    from rake_nltk import Rake

    stop = set(stopwords)
    if not stop:  # rake-nltk would silently fall back to nltk.corpus.stopwords
        from .. import SentembError

        raise SentembError("RAKE needs a non-empty stopword set")
    return Rake(stopwords=stop, sentence_tokenizer=single_sentence, word_tokenizer=word_tokenizer())


def extract(rake, text: str, top_k: int = 5) -> tuple[list[str], list[float]]:
    """Top-k (phrases, scores) of one sentence, in rake-nltk's ranking."""
    if not text.strip():
        return [], []
    rake.extract_keywords_from_text(text)
    ranked = rake.get_ranked_phrases_with_scores()[:top_k]
    return [p for _, p in ranked], [float(s) for s, _ in ranked]


def _init_worker(stopwords, top_k):
    global _RAKE, _TOP_K
    _RAKE, _TOP_K = make_rake(stopwords), top_k


def _chunk(lines: list[str]) -> tuple[list, list]:
    out = [extract(_RAKE, line, _TOP_K) for line in lines]
    return [p for p, _ in out], [s for _, s in out]


def iter_rake(corpus, nltk_data, top_k: int = 5, workers: int | None = None,
              chunk_size: int = 2000):
    """Yield (phrases, scores) lists per chunk of ``chunk_size`` corpus lines, in corpus order."""
    from .. import SentembError

    if top_k < 1:
        raise SentembError(f"RAKE top_k must be >= 1, got {top_k}")
    workers = default_workers() if workers is None else max(1, workers)
    stop = load_stopwords(nltk_data)
    yield from parallel_map(_chunk, chunked(iter_lines(corpus), chunk_size), workers,
                            initializer=_init_worker, initargs=(stop, top_k))


def write_rake(corpus, nltk_data, output, top_k: int = 5, workers: int | None = None,
               chunk_size: int = 2000) -> dict:
    """Stream RAKE top-k of every line of ``corpus`` into a parquet file (atomic write)."""
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..utils import atomic_path

    meta = {"top_k": top_k, "statistic": "rake", "nltk_data": str(nltk_data),
            "corpus": str(corpus),
            "spec": "methods.md §2: rake-nltk, NLTK English stopwords, one sentence per line"}
    schema = pa.schema([("line", pa.int64()), ("phrases", pa.list_(pa.string())),
                        ("scores", pa.list_(pa.float64()))],
                       metadata={b"sentemb": json.dumps(meta, sort_keys=True).encode()})
    n = 0
    with atomic_path(output) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        for phrases, scores in iter_rake(corpus, nltk_data, top_k, workers, chunk_size):
            w.write_table(pa.table({
                "line": np.arange(n, n + len(phrases), dtype=np.int64),
                "phrases": pa.array(phrases, pa.list_(pa.string())),
                "scores": pa.array(scores, pa.list_(pa.float64())),
            }, schema=schema))
            n += len(phrases)
    log.info("rake: %d lines, top %d -> %s", n, top_k, output)
    return {**meta, "n_lines": n}
