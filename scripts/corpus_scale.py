#!/usr/bin/env python
"""The corpus side of the paper configuration at wiki1m's size, on this machine (issue 20 §4).

wiki1m_for_simcse.txt has 10^6 sentences and, unlike the shared 11,913-line head repeated, a
vocabulary on the order of a million terms: TF-IDF's memory and UNA's augmenter tables grow with the
vocabulary, not with the line count. This script

1. writes a synthetic corpus of ``--lines`` sentences whose vocabulary grows like a real one
   (``heaps_corpus``: every word is, with probability 1 - ``tail_share``, a word drawn from the real
   head's unigram distribution (its frequent words, their frequencies), otherwise a rare word of rank
   r ~ Zipf(``zipf_a``) over an unbounded vocabulary of pseudo-words: distinct terms then grow as a
   power of the token count (Heaps' law) instead of stopping at the head's 37k; sentence lengths
   are the head's);
2. runs the workflow's own rules on it through Snakemake (a mirror directory holding the corpus, the
   shared model, SentEval and NLTK data): fetch + prepare the corpus, token frequency, the token
   cache, TF-IDF, UNA's TF-IDF over corpus + paraphrases, RAKE, the statistics summary, the built-in
   ``sts-unlabeled`` corpus, and the start-up of a UNA, SARCSE and PaSeR training job on the corpus
   (reading the statistics and the token cache, the batch schedule, one optimizer step, saving);
   Snakemake's ``benchmark:`` files give each job's wall time and peak resident memory;
3. runs the two corpus-side steps the workflow cannot reach here (no PEGASUS model in the mirror)
   directly under ``/usr/bin/time``: ``paraphrase-merge`` of two shards and TF-IDF with the
   paraphrases as extra documents (``stats.tfidf_with_paraphrases``), on synthetic paraphrases;
4. prints one Markdown table (and writes it with a JSON copy to ``--out``).

    python scripts/corpus_scale.py --lines 1000000 --workdir /tmp/scale --out results/corpus_scale

Every figure is for this machine only; the table says which machine and how many cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LIMIT_MB = 8000  # issue 20 §4: no corpus-side job may exceed 8 GB
_CONS = "bcdfghklmnprstvz"
_VOWELS = "aeiou"


def pseudo_word(rank: int) -> str:
    """A pronounceable word, one per rank (CV syllables of the rank's base-80 digits); capitalised
    for odd ranks (rare words in Wikipedia are often names)."""
    syl, r = [], rank
    while True:
        r, d = divmod(r, len(_CONS) * len(_VOWELS))
        syl.append(_CONS[d // len(_VOWELS)] + _VOWELS[d % len(_VOWELS)])
        if r == 0:
            break
    w = "".join(syl) + "n"
    return w.capitalize() if rank % 2 else w


def heaps_corpus(head: Path, out: Path, lines: int, seed: int = 0, tail_share: float = 0.25,
                 zipf_a: float = 1.15, chunk: int = 50_000) -> dict:
    """Write ``lines`` synthetic sentences to ``out`` (see the module docstring); return counts."""
    rng = np.random.default_rng(seed)
    head_lines = [l for l in head.read_text("utf-8").splitlines() if l.strip()]
    words = np.array([w for l in head_lines for w in l.split()], dtype=object)
    lens = np.array([len(l.split()) for l in head_lines])
    tail_seen: set[int] = set()
    cache: dict[int, str] = {}
    n_tokens = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tmp.open("w", encoding="utf-8") as f:
        done = 0
        while done < lines:
            n = min(chunk, lines - done)
            ln = rng.choice(lens, size=n)
            total = int(ln.sum())
            toks = words[rng.integers(0, len(words), size=total)]
            tail = rng.random(total) < tail_share
            ranks = rng.zipf(zipf_a, size=int(tail.sum()))
            tail_seen.update(ranks.tolist())
            toks[tail] = [cache.get(r) or cache.setdefault(r, pseudo_word(r)) for r in ranks.tolist()]
            pos = 0
            for k in ln.tolist():
                f.write(" ".join(toks[pos:pos + k]) + "\n")
                pos += k
            n_tokens += total
            done += n
    tmp.replace(out)
    return {"lines": lines, "tokens": n_tokens, "distinct_words": len(set(words.tolist())) + len(tail_seen),
            "tail_share": tail_share, "zipf_a": zipf_a, "seed": seed, "bytes": out.stat().st_size}


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        dst.symlink_to(src.resolve())


def write_config(work: Path, shared: Path, name: str, lines: int) -> Path:
    cfg = f"""# written by scripts/corpus_scale.py
experiment: corpus-scale
mirror: {work / 'mirror'}
corpus: {{name: {name}, mirror_path: data/{name}.txt, expected_lines: {lines}}}
backbones:
  minilm: {{hub_id: sentence-transformers/all-MiniLM-L6-v2, mirror_path: models/all-MiniLM-L6-v2}}
train: {{batch_size: 64, max_len: 32, max_steps: 1, model_selection: last, eval_at_end: false,
         eval_steps: 1000, log_steps: 1, device: cpu}}
runs:
  - {{method: una, backbone: minilm}}
  - {{method: sarcse, backbone: minilm}}
  - {{method: paser, backbone: minilm}}
  - {{name: simcse-sts, method: simcse, backbone: minilm, corpus: sts-unlabeled}}
seeds: [42]
baselines: {{}}
job_resources:
  train: {{gpu: 0, cpus: 1}}
  stats: {{cpus: 2}}
"""
    p = work / "config.yaml"
    p.write_text(cfg)
    return p


def _bench_rows(work: Path) -> list[dict]:
    rows = []
    for tsv in sorted((work / "benchmarks").rglob("*.tsv")):
        with tsv.open() as f:
            rec = next(csv.DictReader(f, delimiter="\t"))
        # Snakemake samples a job's process tree (every 0.5 s for 30 s, then every 30 s): its peak RSS
        # is a lower bound for long jobs, and its CPU time misses pool workers, so it is not shown.
        rows.append({"job": str(tsv.relative_to(work / "benchmarks"))[:-4], "seconds": float(rec["s"]),
                     "cpu_s": None,
                     "max_rss_mb": float(rec["max_rss"]) if rec["max_rss"] not in ("", "NA") else None,
                     "how": "snakemake benchmark (sampled)"})
    return rows


def _timed(cmd: list[str], env: dict, log: Path) -> dict:
    t = time.perf_counter()
    with log.open("w") as f:
        p = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    sec = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed, see {log}")
    text = log.read_text()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([0-9.]+)", text))
    return {"seconds": sec, "cpu_s": cpu, "max_rss_mb": int(rss.group(1)) / 1024 if rss else None,
            "how": "/usr/bin/time"}


def synthetic_paraphrases(corpus: Path, out_dir: Path, shards: int = 2, seed: int = 0) -> list[Path]:
    """Two shard files in the paraphrase stage's format (JSONL ``{"line", "text"}``, line i in shard
    i mod n): each corpus line with its words shuffled, a stand-in with the corpus's vocabulary."""
    rnd = random.Random(seed)
    paths = [out_dir / f"shard{i}of{shards}.jsonl" for i in range(shards)]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [p.open("w", encoding="utf-8") for p in paths]
    with corpus.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            w = line.split()
            rnd.shuffle(w)
            files[i % shards].write(json.dumps({"line": i, "text": " ".join(w)}) + "\n")
    for f in files:
        f.close()
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.json")
    ap.add_argument("--zipf-a", type=float, default=1.15)
    ap.add_argument("--tail-share", type=float, default=0.25)
    args = ap.parse_args(argv)

    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    name = f"scale{args.lines // 1000}k"
    mirror = work / "mirror"
    for sub in ("data/senteval", "data/senteval-raw", "models/all-MiniLM-L6-v2", "nltk_data"):
        _link(args.shared / sub, mirror / sub)
    corpus = mirror / "data" / f"{name}.txt"
    t = time.perf_counter()
    info = heaps_corpus(args.shared / "data" / "wiki1m_head.txt", corpus, args.lines,
                        tail_share=args.tail_share, zipf_a=args.zipf_a) if not corpus.exists() else \
        json.loads((work / "corpus.json").read_text())
    info["generate_s"] = round(time.perf_counter() - t, 1)
    (work / "corpus.json").write_text(json.dumps(info, indent=2))
    print(f"corpus {corpus}: {info}", flush=True)

    cfg = write_config(work, args.shared, name, args.lines)
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    stats = f"results/stats/{name}"
    targets = [f"{stats}/summary.md", f"{stats}/tokens.minilm",
               *(f"results/runs/{r}/minilm/seed42/train.json" for r in ("una", "sarcse", "paser", "simcse-sts"))]
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work),
                        f"--configfile={cfg}", "--cores", str(args.cores), *targets],
                       env=env, capture_output=True, text=True)
    dag_s = time.perf_counter() - t
    (work / "snakemake.log").write_text(p.stdout + p.stderr)
    if p.returncode:
        print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"snakemake failed (log: {work / 'snakemake.log'})")
    rows = _bench_rows(work)

    # What the workflow cannot reach without a paraphrase model: merge and TF-IDF with paraphrases.
    corpus_txt = work / "resources" / "corpus" / f"{name}.txt"
    shards = synthetic_paraphrases(corpus_txt, work / "para")
    para = work / "para" / "paraphrases.txt"
    sentemb = [sys.executable, "-m", "sentemb"]
    rows.append({"job": f"direct/{name}/paraphrase_merge (2 shards)", **_timed(
        [*sentemb, "paraphrase-merge", "--inputs", *map(str, shards), "--corpus", str(corpus_txt),
         "--output", str(para)], env, work / "para" / "merge.log")})
    rows.append({"job": f"direct/{name}/tfidf with paraphrases as extra documents", **_timed(
        [*sentemb, "stats-tfidf", "--corpus", str(corpus_txt), "--extra", str(para), "--workers",
         str(args.cores), "--output", str(work / "para" / "tfidf_with_para.parquet")], env,
        work / "para" / "tfidf.log")})

    import pandas as pd

    terms = len(pd.read_parquet(work / stats / "tfidf.parquet", columns=["term"]))
    lines = [f"Corpus: {args.lines:,} synthetic lines, {info['tokens']:,} words, {info['distinct_words']:,} "
             f"distinct words ({terms:,} TF-IDF terms), {info['bytes'] / 2**20:.0f} MiB "
             f"(`heaps_corpus`: tail share {info['tail_share']}, Zipf a {info['zipf_a']}). "
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, `--cores {args.cores}`; "
             f"whole DAG {dag_s:.0f} s.", "",
             "| job | wall s | CPU s | peak RSS MB | measured by |", "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        rss = "—" if r["max_rss_mb"] is None else f"{r['max_rss_mb']:.0f}"
        flag = " **over 8 GB**" if (r["max_rss_mb"] or 0) > LIMIT_MB else ""
        cpu = "—" if r.get("cpu_s") is None else f"{r['cpu_s']:.1f}"
        lines.append(f"| {r['job']} | {r['seconds']:.1f} | {cpu} | {rss}{flag} | {r['how']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(table + "\n")
        args.out.with_suffix(".json").write_text(json.dumps({"corpus": info, "tfidf_terms": terms,
                                                             "dag_s": dag_s, "rows": rows}, indent=2))
    over = [r["job"] for r in rows if (r["max_rss_mb"] or 0) > LIMIT_MB]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
