"""Subcommands of the ``stats`` stage (see :mod:`sentemb.stats`); heavy imports happen on run."""

from __future__ import annotations

import argparse
import os

from .argtypes import non_negative_int, positive_int


def _freq(a):
    from ..data.corpus import require_text
    from ..stats.frequency import write_token_frequencies

    require_text(a.corpus)
    write_token_frequencies(a.corpus, a.tokenizer, a.output, batch_size=a.batch_size)


def _tfidf(a):
    from ..data.corpus import require_text
    from ..stats.tfidf import write_tfidf

    for path in (a.corpus, *a.extra):
        require_text(path)
    write_tfidf([a.corpus, *a.extra], a.output, workers=a.workers, chunk_size=a.chunk_size)


def _rake(a):
    from ..data.corpus import require_text
    from ..stats.rake import write_rake

    require_text(a.corpus)
    write_rake(a.corpus, a.nltk_data, a.output, top_k=a.top_k, workers=a.workers,
               chunk_size=a.chunk_size)


def _paraphrase(a):
    from ..stats.paraphrase import paraphrase_shard

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    paraphrase_shard(a.corpus, a.model, a.output, shard=a.shard, num_shards=a.num_shards,
                           batch_size=a.batch_size, num_beams=a.num_beams,
                           max_length=a.max_length, device=a.device,
                           max_input_length=a.max_input_length, max_batches=a.max_batches,
                           precision=a.precision)


def _merge(a):
    from ..stats.paraphrase import merge_paraphrases

    merge_paraphrases(a.inputs, a.corpus, a.output)


def _summary(a):
    from ..stats.summary import write_summary

    write_summary(a.output, title=a.title, corpus=a.corpus, freq=a.freq, tfidf=a.tfidf,
                  rake=a.rake, paraphrases=a.paraphrases)


def _workers(p):
    p.add_argument("--workers", type=positive_int, default=None,
                   help="processes (default: the cores this process may use)")


def register(sub: argparse._SubParsersAction) -> None:
    from ..config.settings import ParaphraseSettings, StatsSettings

    p = sub.add_parser("stats-freq", help="token frequency of a corpus under one tokenizer (SARCSE)")
    p.add_argument("--corpus", required=True, help="corpus, one sentence per line")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face model/tokenizer directory")
    p.add_argument("--output", required=True, help="parquet: token_id, token, count, freq, special")
    p.add_argument("--batch-size", type=positive_int, default=4096, help="lines tokenized per call (default: %(default)s)")
    p.set_defaults(func=_freq)

    p = sub.add_parser("stats-tfidf", help="TF-IDF df/idf and relevance s_t per term (UNA)")
    p.add_argument("--corpus", required=True, help="corpus, one document (sentence) per line")
    p.add_argument("--extra", nargs="*", default=[],
                   help="more documents, e.g. the paraphrases (UNA's second vocabulary)")
    p.add_argument("--output", required=True, help="parquet: term, df, idf, s, rank")
    p.add_argument("--chunk-size", type=positive_int, default=5000, help="lines per worker task (default: %(default)s)")
    _workers(p)
    p.set_defaults(func=_tfidf)

    p = sub.add_parser("stats-rake", help="RAKE top-k phrases per line (PaSeR)")
    p.add_argument("--corpus", required=True, help="corpus, one sentence per line")
    p.add_argument("--nltk-data", required=True, help="NLTK data directory holding corpora/stopwords")
    p.add_argument("--top-k", type=positive_int, default=StatsSettings().rake_top_k, help="default: stats.rake_top_k")
    p.add_argument("--output", required=True, help="parquet: line, phrases, scores")
    p.add_argument("--chunk-size", type=positive_int, default=2000, help="lines per worker task (default: %(default)s)")
    _workers(p)
    p.set_defaults(func=_rake)

    p = sub.add_parser("paraphrase", help="paraphrase one shard of a corpus, resumably (UNA)")
    p.add_argument("--corpus", required=True, help="corpus, one sentence per line")
    p.add_argument("--model", required=True, help="a seq2seq model directory")
    p.add_argument("--shard", type=non_negative_int, default=0, help="this shard takes lines shard, shard+N, ...")
    p.add_argument("--num-shards", type=positive_int, default=1, help="N, the number of shards (default: %(default)s)")
    p.add_argument("--output", required=True, help="shard output (JSONL line/text)")
    para = ParaphraseSettings()  # the declared defaults (config stats.paraphrase)
    p.add_argument("--batch-size", type=positive_int, default=para.batch_size,
                   help="sentences per generation batch (default: %(default)s, as stats.paraphrase.batch_size)")
    p.add_argument("--num-beams", type=positive_int, default=para.num_beams,
                   help="beam search width (default: %(default)s, as stats.paraphrase.num_beams)")
    p.add_argument("--max-length", type=positive_int, default=para.max_length,
                   help="max generated tokens (default: %(default)s, as stats.paraphrase.max_length)")
    p.add_argument("--precision", choices=("bf16", "fp32"),
                   default=os.environ.get("SENTEMB_PARAPHRASE_PRECISION") or para.precision,
                   help="generation on CUDA (config stats.paraphrase.precision, which the workflow passes as "
                        "the environment variable SENTEMB_PARAPHRASE_PRECISION, this option's default); the CPU is "
                        "always fp32")
    p.add_argument("--max-input-length", type=positive_int, default=None,
                   help="truncate inputs to this many tokens (default: the smaller of the tokenizer's and the "
                        "model's maximum)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cpu, cuda, cuda:N (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--max-batches", type=positive_int, default=None,
                   help="stop after this many new batches, keeping the checkpoint (resume later)")
    p.set_defaults(func=_paraphrase)

    p = sub.add_parser("paraphrase-merge", help="merge paraphrase shards into a line-aligned file")
    p.add_argument("--inputs", nargs="+", required=True, help="every shard's output (JSONL line/text)")
    p.add_argument("--corpus", required=True, help="the paraphrased corpus (each of its lines must be covered once)")
    p.add_argument("--output", required=True, help="text file, one paraphrase per corpus line")
    p.set_defaults(func=_merge)

    p = sub.add_parser("stats-summary", help="human-readable summary of a corpus's statistics")
    p.add_argument("--corpus", help="corpus, one sentence per line (line and word counts)")
    p.add_argument("--freq", nargs="*", default=[], help="token_freq.*.parquet files")
    p.add_argument("--tfidf", help="tfidf parquet (stats-tfidf)")
    p.add_argument("--rake", help="RAKE parquet (stats-rake)")
    p.add_argument("--paraphrases", help="merged paraphrases, one per corpus line (paraphrase-merge)")
    p.add_argument("--title", default="Corpus statistics", help="Markdown heading (default: %(default)s)")
    p.add_argument("--output", required=True, help="Markdown file (JSON written beside it)")
    p.set_defaults(func=_summary)
