"""A short human-readable summary of one corpus's statistics (``summary.md`` + ``summary.json``).

Every input is optional; the summary covers what is given: corpus size, token frequencies per
tokenizer (with the tokens SARCSE down-weights: freq > (1 − θ)/λ = 1.8% for θ = 0.1, λ = 50,
methods.md §1), TF-IDF vocabulary and top terms by relevance s_t (§3), the RAKE phrase-count
distribution (§2) and the paraphrase/original length ratio in words (§3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, median

from ..data.corpus import iter_lines
from . import read_metadata

SARCSE_THRESHOLD = (1 - 0.1) / 50  # freq above which f(w) = max(θ, 1 − λ·freq) hits θ


def _table(path, columns: list[str], what: str):
    """The parquet ``path`` of ``sentemb <what>`` with ``columns``, or an error naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .. import SentembError

    if not Path(path).is_file():
        raise SentembError(f"{path}: not found (the output of `sentemb {what}`)")
    try:
        return pq.read_table(path, columns=columns).to_pandas()
    except (pa.ArrowInvalid, KeyError, OSError) as e:  # not parquet, or without these columns
        raise SentembError(f"{path}: not a parquet file of `sentemb {what}` with columns {', '.join(columns)} "
                           f"({e})") from None


def summarize(corpus=None, freq: Sequence = (), tfidf=None, rake=None, paraphrases=None,
              top: int = 10) -> dict:
    from .. import SentembError

    if not any((corpus, freq, tfidf, rake, paraphrases)):
        raise SentembError("nothing to summarise: give --corpus, --freq, --tfidf, --rake or --paraphrases")
    out: dict = {}
    lines = list(iter_lines(corpus)) if corpus else None
    if lines is not None:
        words = [len(s.split()) for s in lines]
        out["corpus"] = {"path": str(corpus), "lines": len(lines),
                         "empty_lines": sum(1 for w in words if w == 0),
                         "mean_words": round(mean(words), 2) if words else 0.0}
    for path in freq:
        t = _table(path, ["token_id", "token", "count", "freq"], "stats-freq")
        meta = read_metadata(path)
        seen = t[t["count"] > 0]
        topt = t.sort_values(["freq", "token_id"], ascending=[False, True]).head(top)
        out.setdefault("token_freq", {})[Path(path).name] = {
            "total_tokens": meta.get("total_tokens"), "vocab_size": len(t), "ids_seen": len(seen),
            "top": [[r.token, round(float(r.freq), 5)] for r in topt.itertuples()],
            "above_sarcse_threshold": [r.token for r in t[t["freq"] > SARCSE_THRESHOLD].itertuples()],
        }
    if tfidf:
        t = _table(tfidf, ["term", "df", "s"], "stats-tfidf")
        meta = read_metadata(tfidf)
        out["tfidf"] = {"documents": meta.get("n_docs"), "vocab_size": len(t),
                        "top_terms": [[r.term, round(float(r.s), 4)] for r in t.head(top).itertuples()],
                        "most_frequent": t.nlargest(top, "df", keep="first")["term"].tolist()}
    if rake:
        t = _table(rake, ["phrases", "scores"], "stats-rake")
        counts = t["phrases"].map(len)
        top1 = [s[0] for s in t["scores"] if len(s)]
        out["rake"] = {"lines": len(t), "top_k": read_metadata(rake).get("top_k"),
                       "phrase_count_distribution": {int(k): int(v) for k, v in sorted(Counter(counts).items())},
                       "mean_phrases": round(float(counts.mean()), 3) if len(t) else 0.0,
                       "mean_top1_score": round(mean(top1), 3) if top1 else None}
    if paraphrases:
        para = list(iter_lines(paraphrases))
        info = {"lines": len(para), "empty": sum(1 for p in para if not p.strip())}
        if lines is not None:
            ratios = [len(p.split()) / len(s.split()) for s, p in zip(lines, para) if s.split()]
            info.update(aligned=len(para) == len(lines),
                        length_ratio_mean=round(mean(ratios), 3) if ratios else None,
                        length_ratio_median=round(median(ratios), 3) if ratios else None,
                        identical=sum(1 for s, p in zip(lines, para) if s.strip() and s.strip() == p.strip()))
        out["paraphrases"] = info
    return out


def to_markdown(s: dict, title: str = "Corpus statistics") -> str:
    md = [f"# {title}", ""]
    if "corpus" in s:
        c = s["corpus"]
        md += [f"Corpus `{c['path']}`: {c['lines']:,} lines ({c['empty_lines']} empty), "
               f"{c['mean_words']} words per line on average.", ""]
    for name, f in s.get("token_freq", {}).items():
        md += [f"## Token frequency — `{name}`", "",
               f"{f['total_tokens']:,} tokens; {f['ids_seen']:,} of {f['vocab_size']:,} vocabulary ids occur.",
               "Most frequent: " + ", ".join(f"`{t}` {v:.2%}" for t, v in f["top"]) + ".",
               f"Above {SARCSE_THRESHOLD:.1%} (SARCSE weight θ): "
               + (", ".join(f"`{t}`" for t in f["above_sarcse_threshold"]) or "none") + ".", ""]
    if "tfidf" in s:
        t = s["tfidf"]
        md += ["## TF-IDF (UNA)", "", f"{t['vocab_size']:,} terms over {t['documents']:,} documents.",
               "Highest relevance s_t: " + ", ".join(f"`{w}` {v}" for w, v in t["top_terms"]) + ".",
               "Highest document frequency: " + ", ".join(f"`{w}`" for w in t["most_frequent"]) + ".", ""]
    if "rake" in s:
        r = s["rake"]
        dist = ", ".join(f"{k}: {v:,}" for k, v in r["phrase_count_distribution"].items())
        md += ["## RAKE phrases (PaSeR)", "", f"{r['lines']:,} lines, top {r['top_k']} kept; "
               f"{r['mean_phrases']} phrases per line on average, mean top-1 score {r['mean_top1_score']}.",
               f"Lines by number of phrases kept: {dist}.", ""]
    if "paraphrases" in s:
        p = s["paraphrases"]
        md += ["## Paraphrases (UNA)", "", f"{p['lines']:,} lines ({p['empty']} empty)"
               + (f", aligned with the corpus: {p['aligned']}; length ratio (words, paraphrase/original) "
                  f"mean {p['length_ratio_mean']}, median {p['length_ratio_median']}; "
                  f"{p['identical']:,} identical to their original" if "aligned" in p else "") + ".", ""]
    return "\n".join(md)


def write_summary(output, title: str = "Corpus statistics", **inputs) -> dict:
    """Write ``output`` (Markdown) and the same content as JSON beside it (``.json``)."""
    from ..utils import write_json, write_text

    s = summarize(**inputs)
    write_json(Path(output).with_suffix(".json"), s)
    write_text(output, to_markdown(s, title) + "\n")
    return s

