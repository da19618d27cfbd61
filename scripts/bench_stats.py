#!/usr/bin/env python
"""Throughput of the corpus statistics (stage ``stats``) on this machine, projected to 1M sentences.

Runs each statistic end to end (read, compute, write parquet) on a corpus (default
../shared/data/wiki1m_head.txt, optionally repeated to amortise start-up) and prints a table:
statistic, sentences, workers, seconds, sentences/s, projected time for 1M sentences with this
machine's cores, and extrapolated to 8 cores (the 1-worker rate × 8: chunks are independent, so
this is the ideal-scaling bound; the serial merge in the parent is included in the 1-worker time).

``tokenizers`` times NLTK's ``word_tokenize`` and ``wordpunct_tokenize`` against the same compiled
patterns run without NLTK 3.10's per-call time limit (``sentemb.stats.tfidf.word_tokens``,
``sentemb.stats.rake.word_tokenizer``: what TF-IDF, UNA's batches and RAKE run), on the corpus once.

Paraphrasing is measured with a randomly initialised Pegasus (the corpus tokenizer's vocabulary):
by default a tiny one on CPU (plumbing cost only); with ``--pegasus-large-shape`` one of
google/pegasus-large's shape (568M parameters, vocabulary 96,103), meant for a GPU, with bf16
autocast. A random model never emits EOS, so every output runs to ``--max-length`` tokens: the
projection is an upper bound on the real model's time (real paraphrases stop near the input length).

    python scripts/bench_stats.py --corpus ../shared/data/wiki1m_head.txt
    python scripts/bench_stats.py --only paraphrase --pegasus-large-shape --device cuda
    python scripts/bench_stats.py --only tokenizers --corpus resources/corpus/sts-unlabeled.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sentemb.data.corpus import iter_lines
from sentemb.stats import default_workers

M = 1_000_000


def fmt_time(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def timed(fn, *a, **kw) -> float:
    t = time.perf_counter()
    fn(*a, **kw)
    return time.perf_counter() - t


def main(argv=None) -> int:
    shared = REPO.parent / "shared"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(shared / "data" / "wiki1m_head.txt"))
    ap.add_argument("--tokenizer", default=str(shared / "models" / "all-MiniLM-L6-v2"),
                    help="tokenizer for token frequency and the random Pegasus")
    ap.add_argument("--nltk-data", default=str(shared / "nltk_data"))
    ap.add_argument("--repeat", type=int, default=2, help="repeat the corpus to amortise start-up")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--only", nargs="*", choices=["freq", "tfidf", "rake", "tokenizers", "paraphrase"],
                    default=["freq", "tfidf", "rake", "tokenizers", "paraphrase"],
                    help="tokenizers: NLTK's word_tokenize and wordpunct_tokenize against the same patterns without "
                         "NLTK 3.10's per-call time limit (what TF-IDF, UNA and RAKE run), on the corpus once")
    ap.add_argument("--para-lines", type=int, default=256, help="sentences to paraphrase")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-beams", type=int, default=10)
    ap.add_argument("--max-length", type=int, default=60)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--pegasus-large-shape", action="store_true",
                    help="random model of pegasus-large's shape (for a GPU) instead of a tiny one")
    a = ap.parse_args(argv)

    import torch

    lines = list(iter_lines(a.corpus))
    tmp = Path(tempfile.mkdtemp(prefix="bench_stats_"))
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in lines * a.repeat), encoding="utf-8")
    n = len(lines) * a.repeat
    print(f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
          f"({default_workers()} usable), torch {torch.__version__}, "
          f"CUDA {'yes: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no'}")
    print(f"# corpus {a.corpus} x{a.repeat} = {n:,} sentences\n")
    rows = []

    def row(stat, sents, workers, secs, rate1=None):
        rate = sents / secs
        r8 = (rate1 * 8) if rate1 else None
        rows.append((stat, f"{sents:,}", str(workers), f"{secs:.1f}", f"{rate:,.0f}" if rate >= 10 else f"{rate:.2f}",
                     fmt_time(M / rate), fmt_time(M / r8) if r8 else "-"))

    if "freq" in a.only:
        from sentemb.stats.frequency import write_token_frequencies

        t = timed(write_token_frequencies, corpus, a.tokenizer, tmp / "f.parquet")
        row("token_freq (fast tokenizer, Rust threads)", n, default_workers(), t,
            rate1=n / t / default_workers())
    if "tfidf" in a.only:
        from sentemb.stats.tfidf import write_tfidf

        t1 = timed(write_tfidf, [corpus], tmp / "t1.parquet", workers=1)
        row("tfidf", n, 1, t1, rate1=n / t1)
        if a.workers > 1:
            tn = timed(write_tfidf, [corpus], tmp / "tn.parquet", workers=a.workers)
            row("tfidf", n, a.workers, tn, rate1=n / t1)
    if "rake" in a.only:
        from sentemb.stats.rake import write_rake

        t1 = timed(write_rake, corpus, a.nltk_data, tmp / "r1.parquet", workers=1)
        row("rake top-5", n, 1, t1, rate1=n / t1)
        if a.workers > 1:
            tn = timed(write_rake, corpus, a.nltk_data, tmp / "rn.parquet", workers=a.workers)
            row("rake top-5", n, a.workers, tn, rate1=n / t1)
    if "tokenizers" in a.only:
        from nltk.tokenize import word_tokenize, wordpunct_tokenize

        from sentemb.stats import rake, tfidf

        words = rake.word_tokenizer()
        for stat, fn in (("nltk word_tokenize(preserve_line=True)", lambda x: word_tokenize(x, preserve_line=True)),
                         ("sentemb tfidf.word_tokens (no time limit)", tfidf.word_tokens),
                         ("nltk wordpunct_tokenize", wordpunct_tokenize),
                         ("sentemb rake.word_tokenizer() (no time limit)", words)):
            row(stat, len(lines), 1, timed(lambda: [fn(x) for x in lines]))
    if "paraphrase" in a.only:
        from transformers import AutoTokenizer

        from sentemb.stats.paraphrase import PEGASUS_LARGE_SHAPE, Paraphraser, build_random_pegasus

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        shape = PEGASUS_LARGE_SHAPE if a.pegasus_large_shape else None
        model = build_random_pegasus(tok, shape)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        para = Paraphraser(model, tok, device=a.device, num_beams=a.num_beams, max_length=a.max_length)
        texts = [s for s in lines if s.strip()][: a.para_lines]
        texts.sort(key=lambda s: -len(s))  # length-sorted batches, as paraphrase_shard does
        batches = [texts[i:i + a.batch_size] for i in range(0, len(texts), a.batch_size)]
        para(batches[0])  # warm-up (allocations, kernels)
        if para.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for b in batches:
            para(b)
        if para.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter() - t
        name = (f"paraphrase {'pegasus-large shape' if shape else 'tiny'} random ({params:.0f}M params, "
                f"{para.device.type}{', bf16' if para.device.type == 'cuda' else ''}, beams {a.num_beams}, "
                f"max {a.max_length}, batch {a.batch_size})")
        row(name, len(texts), 1 if para.device.type == "cuda" else torch.get_num_threads(), t)

    head = ("statistic", "sentences", "workers", "seconds", "sent/s", "1M here", "1M on 8 cores")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths)] + rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
