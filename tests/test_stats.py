"""Corpus statistics (stage ``stats``): each statistic against an independent computation.

Unit tests use hand-made corpora, the ``tiny_bert_dir`` vocabulary, a tiny stopword directory and
a tiny random Pegasus; ``realdata`` tests use ../shared (wiki1m_head.txt, MiniLM, nltk_data).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from sentemb import SentembError
from sentemb.data.corpus import count_corpus_lines, iter_lines
from sentemb.stats import read_metadata

CORPUS = [
    "A man plays the guitar.",
    "The man plays the piano, and the woman plays the guitar.",
    "",
    "Dog",
    "the the the",
    "A red car runs in the city; a blue car sits by the house.",
    "   ",
    "Is this the new one? Yes, this is the new one!",
    "The cat eats food: apple, apple and apple.",
]

STOPWORDS = ["a", "an", "the", "and", "is", "are", "in", "on", "by", "this", "these", "of", "to", "was", "for"]


def write_corpus(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus.txt", CORPUS)


@pytest.fixture(scope="session")
def tiny_tok_dir(tiny_bert_dir, tmp_path_factory) -> Path:
    """The tiny WordPiece vocabulary of ``tiny_bert_dir`` as a fast tokenizer.

    Built here with ``vocab=`` because transformers 5 ignores the ``vocab_file=`` argument that
    conftest passes (its saved tokenizer then holds only the 5 special tokens).
    """
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny_tok")
    tok = BertTokenizerFast(vocab=str(tiny_bert_dir / "vocab.txt"), do_lower_case=True)
    assert len(tok) > 100
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_nltk_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("nltk_data")
    (d / "corpora" / "stopwords").mkdir(parents=True)
    (d / "corpora" / "stopwords" / "english").write_text("\n".join(STOPWORDS) + "\n")
    return d


# ---------------------------------------------------------------- reading


def test_reader_keeps_alignment_and_names_bad_line(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"one\r\n\ntwo\xe2\x80\xa8still two\nlast")
    assert list(iter_lines(p)) == ["one", "", "two\u2028still two", "last"]
    assert count_corpus_lines(p) == 4
    p.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(SentembError, match=r"c\.txt:2: line 2 is not valid UTF-8"):
        list(iter_lines(p))


# ---------------------------------------------------------------- token frequency


def test_token_frequency_exact(corpus, tiny_tok_dir, tmp_path):
    from transformers import AutoTokenizer

    from sentemb.stats.frequency import write_token_frequencies

    extra = write_corpus(tmp_path / "c2.txt", CORPUS + ["[CLS] a literal special token [SEP]"])
    out = tmp_path / "token_freq.bert.parquet"
    meta = write_token_frequencies(extra, tiny_tok_dir, out, batch_size=3)
    t = pq.read_table(out).to_pandas()
    tok = AutoTokenizer.from_pretrained(tiny_tok_dir)
    # independent: one sentence at a time through the slow path tokenize() + vocab lookup
    ref = Counter(tok.convert_tokens_to_ids(w) for s in CORPUS + ["a literal special token"]
                  for w in tok.tokenize(s))
    special = set(tok.all_special_ids)
    total = sum(c for i, c in ref.items() if i not in special)
    assert ref[tok.unk_token_id] > 0  # the tiny vocabulary leaves words unknown: [UNK] is special
    assert list(t.token_id) == list(range(len(tok)))
    assert meta["total_tokens"] == total == read_metadata(out)["total_tokens"]
    for i, row in t.iterrows():
        if i in special:
            assert row["special"] and row["freq"] == 0.0
            assert row["count"] == ref.get(i, 0) + (i in (tok.cls_token_id, tok.sep_token_id))
        else:
            assert row["count"] == ref.get(i, 0)
            assert row["freq"] == ref.get(i, 0) / total
    assert t["freq"].sum() == pytest.approx(1.0, abs=1e-12)
    assert t.loc[tok.convert_tokens_to_ids("the"), "token"] == "the"


# ---------------------------------------------------------------- TF-IDF


def reference_tfidf(lines):
    """Dense N×V computation straight from the formulas (methods.md §3)."""
    from sentemb.stats.tfidf import tokenize

    docs = [tokenize(s) for s in lines]
    docs = [d for d in docs if d]
    vocab = sorted({t for d in docs for t in d})
    col = {t: j for j, t in enumerate(vocab)}
    counts = np.zeros((len(docs), len(vocab)))
    for i, d in enumerate(docs):
        for t in d:
            counts[i, col[t]] += 1
    n = counts.sum(1, keepdims=True)
    tf = np.where(counts > 0, np.log(1 + counts / n), 0.0)
    df = (counts > 0).sum(0)
    idf = -np.log(df / len(docs))
    s = (tf * idf).max(0)
    return vocab, df, idf, s


def test_tfidf_exact_and_worker_invariant(corpus, tmp_path):
    from sentemb.stats.tfidf import tokenize, write_tfidf

    assert tokenize("The man's car, isn't it?") == ["the", "man", "'s", "car", ",", "is", "n't", "it", "?"]
    out1, out2 = tmp_path / "t1.parquet", tmp_path / "t2.parquet"
    meta = write_tfidf([corpus], out1, workers=1, chunk_size=4)
    write_tfidf([corpus], out2, workers=2, chunk_size=2)
    t1, t2 = pq.read_table(out1), pq.read_table(out2)
    assert t1.equals(t2)  # bit-identical for any worker count / chunking
    t = t1.to_pandas()
    vocab, df, idf, s = reference_tfidf(CORPUS)
    assert meta["n_docs"] == 7 and meta["n_lines"] == [len(CORPUS)]  # 2 blank lines: no documents
    got = t.set_index("term")
    assert sorted(got.index) == vocab
    assert [got.loc[v, "df"] for v in vocab] == df.tolist()
    np.testing.assert_allclose([got.loc[v, "idf"] for v in vocab], idf, rtol=1e-14, atol=0)
    np.testing.assert_allclose([got.loc[v, "s"] for v in vocab], s, rtol=1e-14, atol=0)
    # single-token sentence "Dog": tf = log 2, no division by zero
    assert got.loc["dog", "s"] == pytest.approx(math.log(2) * math.log(7))
    # ranking: s descending, ties by term; rank = row position
    keys = list(zip(-t["s"], t["term"]))
    assert keys == sorted(keys) and t["rank"].tolist() == list(range(len(t)))
    assert got.loc["the", "idf"] == -math.log(6 / 7)


def test_tfidf_with_extra_documents(corpus, tmp_path):
    from sentemb.stats.tfidf import write_tfidf

    para = write_corpus(tmp_path / "para.txt", ["A guitarist plays.", "", "Hound", "zebra crossing"])
    both = write_corpus(tmp_path / "both.txt", CORPUS + ["A guitarist plays.", "", "Hound", "zebra crossing"])
    m = write_tfidf([corpus, para], tmp_path / "a.parquet", workers=1)
    write_tfidf([both], tmp_path / "b.parquet", workers=1)
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    assert m["n_lines"] == [len(CORPUS), 4] and m["n_docs"] == 10


def test_tfidf_bad_utf8_names_line(tmp_path):
    from sentemb.stats.tfidf import write_tfidf

    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok line\n\xc3\x28 broken\n")
    with pytest.raises(SentembError, match="bad.txt:2"):
        write_tfidf([p], tmp_path / "t.parquet", workers=1)
    assert not (tmp_path / "t.parquet").exists()


# ---------------------------------------------------------------- RAKE


def direct_rake(text, k):
    from rake_nltk import Rake

    r = Rake(stopwords=set(STOPWORDS), sentence_tokenizer=lambda t: [t])
    r.extract_keywords_from_text(text)
    ranked = r.get_ranked_phrases_with_scores()[:k]
    return [p for _, p in ranked], [s for s, _ in ranked]


@pytest.mark.parametrize("k", [2, 5])
def test_rake_equals_rake_nltk(corpus, tiny_nltk_data, tmp_path, k):
    from sentemb.stats.rake import write_rake

    out = tmp_path / f"rake_top{k}.parquet"
    meta = write_rake(corpus, tiny_nltk_data, out, top_k=k, workers=2 if k == 5 else 1, chunk_size=2)
    t = pq.read_table(out).to_pandas()
    assert meta["n_lines"] == len(CORPUS) and t["line"].tolist() == list(range(len(CORPUS)))
    for text, phrases, scores in zip(CORPUS, t["phrases"], t["scores"]):
        exp_p, exp_s = direct_rake(text, k) if text.strip() else ([], [])
        assert list(phrases) == exp_p and list(scores) == exp_s
    assert list(t["phrases"][2]) == [] and list(t["phrases"][6]) == []  # blank lines
    assert list(t["phrases"][3]) == ["dog"] and list(t["scores"][3]) == [1.0]  # one token
    assert list(t["phrases"][4]) == []  # stopwords only
    assert read_metadata(out)["top_k"] == k


def test_rake_missing_stopwords(corpus, tmp_path):
    from sentemb.stats.rake import write_rake

    (tmp_path / "empty_nltk").mkdir(mode=0o700)
    with pytest.raises(SentembError, match="stopwords"):
        write_rake(corpus, tmp_path / "empty_nltk", tmp_path / "r.parquet", workers=1)


@pytest.mark.realdata
def test_nltk_data_is_read_from_the_directory_asked_whatever_the_process_read_before(shared, tmp_path):
    """``load_stopwords`` and PaSeR's ``load_wordnet`` read the directory they are given, though the
    process's ``nltk.data.path`` lists another one first (a plan counting with a config's copy of
    the data after the mirror's, the suite's tests one after the other): the stopwords were refused
    (found first in the other directory), WordNet was silently the other directory's."""
    import shutil
    import zipfile

    from sentemb.methods.paser import load_wordnet
    from sentemb.stats.rake import load_stopwords

    real = shared / "nltk_data"
    mine = tmp_path / "nltk_data"
    (mine / "corpora").mkdir(parents=True)
    with zipfile.ZipFile(real / "corpora" / "stopwords.zip") as z:
        english = z.read("stopwords/english").decode("utf8")
    with zipfile.ZipFile(mine / "corpora" / "stopwords.zip", "w") as z:  # the same form as the mirror's
        z.writestr("stopwords/english", english + "zzmine\n")
    shutil.copytree(real / "corpora" / "wordnet", mine / "corpora" / "wordnet")
    theirs = load_stopwords(real)
    assert "zzmine" in load_stopwords(mine) and "zzmine" not in theirs  # mine: first on the path now
    assert load_stopwords(real) == theirs
    assert str(load_wordnet(mine).root).startswith(str(mine)) and str(load_wordnet(real).root).startswith(str(real))
    # WordNet as nltk.download leaves it, corpora/wordnet.zip only: found, and read
    zipped = tmp_path / "zipped"
    (zipped / "corpora").mkdir(parents=True)
    with zipfile.ZipFile(zipped / "corpora" / "wordnet.zip", "w") as z:
        for f in sorted((real / "corpora" / "wordnet").iterdir()):
            z.write(f, f"wordnet/{f.name}")
    wn = load_wordnet(zipped)
    assert str(wn.root).startswith(str(zipped)) and "wordnet.zip" in str(wn.root)
    assert [s.name() for s in wn.synsets("dog")][:1] == [s.name() for s in load_wordnet(real).synsets("dog")][:1]


def test_the_plans_data_digest_is_the_datas_not_the_fetchs_manifest_and_follows_linked_folders(shared, tmp_path):
    """``data_digest`` (the plan's key for counts made with NLTK's data): the same files give the same
    digest whether fetched twice (the fetch's manifest records file times: left out) or linked in from
    elsewhere (a mirror's linked folder: followed); a changed file gives another."""
    import shutil

    from sentemb.stats.inputs import data_digest

    real = shared / "nltk_data" / "corpora"
    copied, linked = tmp_path / "copied", tmp_path / "linked"
    shutil.copytree(real, copied / "nltk_data" / "corpora")
    (linked / "nltk_data" / "corpora").mkdir(parents=True)
    for f in real.iterdir():
        (linked / "nltk_data" / "corpora" / f.name).symlink_to(f, target_is_directory=f.is_dir())
    first = data_digest("nltk", {"resources_dir": str(copied)})
    assert first == data_digest("nltk", {"resources_dir": str(linked)})
    (copied / "nltk_data" / ".sentemb_manifest.json").write_text('{"files": {"a": 1}}')
    assert data_digest("nltk", {"resources_dir": str(copied)}) == first
    (copied / "nltk_data" / "corpora" / "wordnet" / "lexnames").write_text("changed\n")
    assert data_digest("nltk", {"resources_dir": str(copied)}) != first


# ---------------------------------------------------------------- paraphrases


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a shared CPU OpenMP spinning costs 100×."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_pegasus(tiny_tok_dir, tmp_path_factory) -> Path:
    from sentemb.stats.paraphrase import save_random_pegasus

    return save_random_pegasus(tmp_path_factory.mktemp("tiny_pegasus"), tiny_tok_dir)


PARA_CORPUS = [f"the {w} plays {v} in the park" for w in ("man", "woman", "dog", "cat") for v in
               ("music", "guitar", "piano")] + ["", "sun", "a big red house by the old tree is here"]
PARA_KW = dict(batch_size=3, num_beams=3, max_length=8, device="cpu")


def run_all_shards(corpus, model, out_dir, n=2, **kw):
    from sentemb.stats.paraphrase import merge_paraphrases, paraphrase_shard

    shards = [out_dir / f"shard{i}of{n}.jsonl" for i in range(n)]
    for i, s in enumerate(shards):
        paraphrase_shard(corpus, model, s, shard=i, num_shards=n, **{**PARA_KW, **kw})
    merge_paraphrases(shards, corpus, out_dir / "paraphrases.txt")
    return shards, out_dir / "paraphrases.txt"


def test_paraphrase_shards_merge_and_resume(tiny_pegasus, tmp_path):
    from sentemb.stats.paraphrase import merge_paraphrases, paraphrase_shard

    corpus = write_corpus(tmp_path / "c.txt", PARA_CORPUS)
    (tmp_path / "ref").mkdir()
    ref_shards, ref = run_all_shards(corpus, tiny_pegasus, tmp_path / "ref")
    lines = ref.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(PARA_CORPUS) == count_corpus_lines(ref)
    assert lines[12] == "" and all(lines[i] for i in range(12))  # empty line → empty paraphrase
    rec = [json.loads(x) for x in ref_shards[1].read_text().splitlines()]
    assert [r["line"] for r in rec] == list(range(1, len(PARA_CORPUS), 2))  # strided shard

    # interrupted: 2 batches, then a torn record (killed mid-write); rerun resumes
    out = tmp_path / "shard0of2.jsonl"
    res = paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, max_batches=2, **PARA_KW)
    ckpt = out.with_name(out.name + ".ckpt.jsonl")
    assert not res["finished"] and not out.exists() and ckpt.exists()
    assert len(ckpt.read_bytes().splitlines()) == 3  # header + 2 batches
    with open(ckpt, "ab") as f:
        f.write(b'{"batch": 2, "lines": [0, ')
    res = paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, **PARA_KW)
    assert res["finished"] and res["new_batches"] == res["batches"] - 2 and not ckpt.exists()
    assert out.read_bytes() == ref_shards[0].read_bytes()

    # a crash inside a batch (exception) leaves no output; the rerun completes identically
    out.unlink()
    import sentemb.stats.paraphrase as P

    calls = {"n": 0}
    orig = P.Paraphraser.__call__

    def flaky(self, texts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return orig(self, texts)

    P.Paraphraser.__call__ = flaky
    try:
        with pytest.raises(RuntimeError):
            paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, **PARA_KW)
    finally:
        P.Paraphraser.__call__ = orig
    assert not out.exists()
    paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, **PARA_KW)
    assert out.read_bytes() == ref_shards[0].read_bytes()

    # a checkpoint from other settings is discarded, not mixed in
    paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, max_batches=1,
                     **{**PARA_KW, "max_length": 6})
    paraphrase_shard(corpus, tiny_pegasus, out, shard=0, num_shards=2, **PARA_KW)
    assert out.read_bytes() == ref_shards[0].read_bytes()

    # merge checks coverage
    with pytest.raises(SentembError, match="miss"):
        merge_paraphrases(ref_shards[:1], corpus, tmp_path / "x.txt")
    with pytest.raises(SentembError, match="more than one shard"):
        merge_paraphrases([ref_shards[0], ref_shards[0], ref_shards[1]], corpus, tmp_path / "x.txt")
    with pytest.raises(SentembError, match=r"paraphrase-merge: .*absent\.jsonl not found"):
        merge_paraphrases([ref_shards[0], tmp_path / "absent.jsonl"], corpus, tmp_path / "x.txt")
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_bytes(ref_shards[1].read_bytes().replace(b'"text": "', b'"text": "\xff', 1))
    with pytest.raises(SentembError, match=r"garbled\.jsonl:1: not a paraphrase record \(a UTF-8 JSON line"):
        merge_paraphrases([ref_shards[0], garbled], corpus, tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()


def test_paraphrase_killed_subprocess_resumes_identically(tiny_pegasus, tmp_path):
    from sentemb.stats.paraphrase import paraphrase_shard

    lines = [f"{a} {b} {c}" for a in ("the man", "a woman", "the old dog", "one cat")
             for b in ("plays", "runs", "eats", "sits") for c in ("in the park", "on the mat",
                                                               "by the big red house", "here")]
    corpus = write_corpus(tmp_path / "c.txt", lines * 3)
    kw = dict(batch_size=2, num_beams=4, max_length=24, device="cpu")
    ref = tmp_path / "ref.jsonl"
    paraphrase_shard(corpus, tiny_pegasus, ref, shard=1, num_shards=2, **kw)

    out = tmp_path / "shard.jsonl"
    ckpt = out.with_name(out.name + ".ckpt.jsonl")
    cmd = [sys.executable, "-m", "sentemb.cli", "paraphrase", "--corpus", str(corpus), "--model",
           str(tiny_pegasus), "--shard", "1", "--num-shards", "2", "--output", str(out),
           "--batch-size", "2", "--num-beams", "4", "--max-length", "24", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and ckpt.read_bytes().count(b"\n") >= 4:  # header + 3 batches
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not out.exists()
    done = ckpt.read_bytes().count(b"\n") - 1
    res = paraphrase_shard(corpus, tiny_pegasus, out, shard=1, num_shards=2, **kw)
    assert res["finished"] and res["new_batches"] <= res["batches"] - done
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("stat", ["freq", "tfidf", "rake", "paraphrase"])
def test_non_utf8_line_is_named_and_leaves_no_output(stat, tiny_tok_dir, tiny_nltk_data, tiny_pegasus, tmp_path):
    from sentemb.stats.frequency import write_token_frequencies
    from sentemb.stats.paraphrase import paraphrase_shard
    from sentemb.stats.rake import write_rake
    from sentemb.stats.tfidf import write_tfidf

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a man plays\n\nthe dog\ncaf\xe9 latin-1\n")
    out = tmp_path / "out"
    run = {
        "freq": lambda: write_token_frequencies(bad, tiny_tok_dir, out),
        "tfidf": lambda: write_tfidf([bad], out, workers=2, chunk_size=1),
        "rake": lambda: write_rake(bad, tiny_nltk_data, out, workers=2, chunk_size=1),
        "paraphrase": lambda: paraphrase_shard(bad, tiny_pegasus, out, **PARA_KW),
    }[stat]
    with pytest.raises(SentembError, match=r"bad\.txt:4: line 4 is not valid UTF-8"):
        run()
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["bad.txt"]


# ---------------------------------------------------------------- summary and CLI


def test_cli_and_summary(corpus, tiny_tok_dir, tiny_nltk_data, tmp_path):
    from sentemb.cli import main

    d = tmp_path / "stats"
    para = write_corpus(tmp_path / "para.txt", [s.upper() + " indeed" if s.strip() else "" for s in CORPUS])
    assert main(["stats-freq", "--corpus", str(corpus), "--tokenizer", str(tiny_tok_dir),
                 "--output", str(d / "token_freq.bert.parquet")]) == 0
    assert main(["stats-tfidf", "--corpus", str(corpus), "--extra", str(para), "--workers", "1",
                 "--output", str(d / "tfidf.parquet")]) == 0
    assert main(["stats-rake", "--corpus", str(corpus), "--nltk-data", str(tiny_nltk_data),
                 "--top-k", "3", "--workers", "1", "--output", str(d / "rake_top3.parquet")]) == 0
    assert main(["stats-summary", "--corpus", str(corpus), "--freq", str(d / "token_freq.bert.parquet"),
                 "--tfidf", str(d / "tfidf.parquet"), "--rake", str(d / "rake_top3.parquet"),
                 "--paraphrases", str(para), "--output", str(d / "summary.md")]) == 0
    md = (d / "summary.md").read_text()
    for head in ("Token frequency", "TF-IDF", "RAKE", "Paraphrases"):
        assert head in md
    s = json.loads((d / "summary.json").read_text())
    assert s["corpus"] == {"path": str(corpus), "lines": 9, "empty_lines": 2, "mean_words": s["corpus"]["mean_words"]}
    assert s["rake"]["phrase_count_distribution"]["0"] == 3  # two blank lines + stopwords-only line
    assert s["paraphrases"]["aligned"] and s["paraphrases"]["length_ratio_mean"] > 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"x\n\xff\n")
    assert main(["stats-tfidf", "--corpus", str(bad), "--workers", "1", "--output", str(d / "x.parquet")]) == 2


def test_stats_settings_and_targets():
    from sentemb.config.load import validate_config
    from sentemb.stats.workflow import stats_settings, stats_targets

    raw = {"resources_dir": "r", "results_dir": "res", "corpus": {"name": "c"},
           "backbones": {"bert": {"hub_id": "x/bert"}, "roberta": {"hub_id": "x/roberta"}},
           "runs": [{"method": "simcse", "backbone": "bert"}]}
    cfg = validate_config(json.loads(json.dumps(raw)))
    s = stats_settings(cfg)
    assert s["rake_top_k"] == 5 and s["paraphrase"]["num_beams"] == 10
    assert s["paraphrase"]["model"]["hub_id"] == "tuner007/pegasus_paraphrase"
    assert s["paraphrase"]["model_name"] == "pegasus_paraphrase" and s["paraphrase"]["enabled"] is False
    assert stats_targets(cfg) == ["res/stats/c/token_freq.bert.parquet", "res/stats/c/token_freq.roberta.parquet",
                                  "res/stats/c/tfidf.parquet", "res/stats/c/rake_top5.parquet",
                                  "res/stats/c/summary.md"]
    cfg = validate_config({**json.loads(json.dumps(raw)), "stats": {"tfidf_with_paraphrases": True, "rake_top_k": 3}})
    assert stats_settings(cfg)["paraphrase"]["enabled"] is True
    assert stats_targets(cfg)[-2:] == ["res/stats/c/paraphrases.txt", "res/stats/c/tfidf_para.parquet"]
    assert "res/stats/c/rake_top3.parquet" in stats_targets(cfg)
    # an entry named only as runs[].weights (starting weights) gets no token frequencies
    cfg = validate_config({**json.loads(json.dumps(raw)),
                           "runs": [{"method": "simcse", "backbone": "bert", "weights": "roberta"}]})
    assert [t for t in stats_targets(cfg) if "token_freq" in t] == ["res/stats/c/token_freq.bert.parquet"]


def test_all_builds_only_the_statistics_the_runs_read_unless_the_corpus_report_is_asked():
    """Issue 39: ``rule all`` (``all_stats_targets``) asks for the inputs of the configured runs'
    methods (``Method.requires``), every statistic and the summary only with ``stats.corpus_report``;
    ``snakemake stats`` (``stats_targets``) is unchanged."""
    from sentemb.config.load import validate_config
    from sentemb.stats.workflow import all_stats_targets, stats_targets

    raw = {"resources_dir": "r", "results_dir": "res", "corpus": {"name": "c"},
           "backbones": {"bert": {"hub_id": "x/bert"}, "roberta": {"hub_id": "x/roberta"}},
           "runs": [{"method": "simcse", "backbone": "bert"}, {"method": "simcse", "backbone": "roberta"}]}

    def targets(**over):
        return all_stats_targets(validate_config({**json.loads(json.dumps(raw)), **over}))

    assert targets() == []
    assert targets(stats={"corpus_report": True}) == stats_targets(validate_config(json.loads(json.dumps(raw))))
    assert targets(stats={"paraphrase": {"enabled": True}}) == ["res/stats/c/paraphrases.txt"]
    got = targets(runs=[{"method": "sarcse", "backbone": "bert"}, {"method": "paser", "backbone": "bert"},
                        {"method": "simcse", "backbone": "roberta"}])
    assert "res/stats/c/token_freq.bert.parquet" in got and "res/stats/c/rake_top5.parquet" in got
    assert not any("roberta" in t or "tfidf" in t or "paraphrase" in t or "summary" in t for t in got)


@pytest.mark.realdata
def test_all_with_simcse_runs_plans_no_rake_tfidf_or_paraphrase_job(tmp_path, shared):
    """``snakemake -n all`` on the tiny config with its SimCSE run alone (no corpus report, paraphrases
    left to the runs): training, evaluation and tables, no statistics job but the token cache."""
    import re

    import yaml

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["runs"] = [r for r in cfg["runs"] if r.get("method") == "simcse"][:1]
    cfg["studies"], cfg["methods"] = [], {}
    cfg["stats"]["corpus_report"] = False
    cfg["stats"]["paraphrase"]["enabled"] = None
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                        f"--configfile={tmp_path / 'config.yaml'}", "-n", "all"], capture_output=True, text=True,
                       env={**os.environ, "SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": ""}, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    planned = set(re.findall(r"^(?:local)?rule (\w+):", out, re.M))
    assert {"train", "evaluate", "table1"} <= planned, planned
    assert not planned & {"stats_rake", "stats_tfidf", "stats_tfidf_para", "paraphrase_shard", "paraphrase_merge",
                          "fetch_paraphraser", "stats_summary", "stats_token_freq"}, planned


# ---------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def wiki(shared) -> Path:
    return shared / "data" / "wiki1m_head.txt"


@pytest.mark.realdata
def test_real_token_frequency(wiki, minilm_dir, tmp_path):
    from sentemb.stats.frequency import write_token_frequencies

    meta = write_token_frequencies(wiki, minilm_dir, tmp_path / "f.parquet")
    t = pq.read_table(tmp_path / "f.parquet").to_pandas()
    assert meta["n_lines"] == 11913 == count_corpus_lines(wiki)
    assert len(t) == 30522 and t["freq"].sum() == pytest.approx(1.0, abs=1e-9)
    top = t.nlargest(5, "freq")["token"].tolist()
    assert "the" in top and "," in top


@pytest.mark.realdata
def test_real_tfidf_against_sklearn_and_stable(wiki, tmp_path):
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import CountVectorizer

    from sentemb.stats.tfidf import tokenize, write_tfidf

    meta = write_tfidf([wiki], tmp_path / "t.parquet", workers=2)
    t = pq.read_table(tmp_path / "t.parquet").to_pandas()
    # independent: sklearn sparse counts, tf = log1p(n_t/n), column max
    cv = CountVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None)
    X = sp.csr_matrix(cv.fit_transform(iter_lines(wiki)), dtype=np.float64)
    n = np.asarray(X.sum(1)).ravel()
    X = X[n > 0]
    n = n[n > 0]
    tf = X.multiply(1.0 / n[:, None]).tocsr()
    tf.data = np.log1p(tf.data)
    df = np.diff(X.tocsc().indptr)
    s = tf.max(0).toarray().ravel() * -np.log(df / X.shape[0])
    vocab = cv.get_feature_names_out()
    got = t.set_index("term").loc[vocab]
    assert meta["n_docs"] == X.shape[0] and len(t) == len(vocab)
    assert (got["df"].to_numpy() == df).all()
    np.testing.assert_allclose(got["s"].to_numpy(), s, rtol=1e-12)
    # stable: another worker count and chunking give the same table
    head = write_corpus(tmp_path / "head.txt", list(iter_lines(wiki))[:2000])
    write_tfidf([head], tmp_path / "h1.parquet", workers=1, chunk_size=2000)
    write_tfidf([head], tmp_path / "h2.parquet", workers=2, chunk_size=257)
    assert pq.read_table(tmp_path / "h1.parquet").equals(pq.read_table(tmp_path / "h2.parquet"))
    assert {"the", ".", ","} == set(t.nlargest(3, "df")["term"])


#: strings for every pattern group of NLTK's Treebank tokenizer: opening and closing quotes (ASCII,
#: typographic, guillemets), punctuation before and after digits, ellipses, brackets, double dashes,
#: contractions (cannot, gonna, 'tis, 'twas), possessives, a sentence-final period after a bracket
TOKENIZER_EDGES = [
    '"Hello," she said -- "it\'s 3:30 p.m.!"', "«Bonjour» „Guten Tag“ ‘single’ `backticks' ``double''",
    "I cannot, I won't, we're gonna... 'Tis true and 'twas so.", "Prices: $3.88, 3,36 euros (roughly) [sic] {x} <y>.",
    "U.S.A. vs. Mr. Smith's dog's bone; ok?!", "He said (and I quote).", "wait... what?? -- no!!", "",
    "   spaced   out   ", "tab\tseparated\tline", "end with quote'", "a 'quoted' word and 'another'.",
]


@pytest.mark.realdata
def test_word_tokens_are_nltks_word_tokenize_on_real_sentences(wiki, shared):
    """The tokenizers run without NLTK 3.10's per-call time limit against NLTK's own, token for token:
    ``sentemb.stats.tfidf.word_tokens`` (TF-IDF, UNA) against ``nltk.word_tokenize(preserve_line=True)``
    and ``sentemb.stats.rake.word_tokenizer()`` (RAKE) against ``nltk.wordpunct_tokenize``, on the
    wiki1m head, STS sentences and the Treebank tokenizer's edge cases."""
    from nltk.tokenize import word_tokenize, wordpunct_tokenize

    from sentemb.data.fetch import sts_sentences
    from sentemb.stats import rake
    from sentemb.stats.tfidf import word_tokenizer, word_tokens

    sents = list(iter_lines(wiki)) + sts_sentences(shared / "data" / "senteval")[:4000] + TOKENIZER_EDGES
    want = [word_tokenize(s, preserve_line=True) for s in sents]
    assert [word_tokens(s) for s in sents] == want
    assert sum(map(len, want)) > 250_000  # 293,870 tokens
    words = rake.word_tokenizer()
    assert [words(s) for s in sents] == [wordpunct_tokenize(s) for s in sents]
    try:
        from nltk.redos import TimedPattern
    except ImportError:  # an NLTK without the time limit: its own tokenizer, nothing to compare
        return
    tok = word_tokenizer()
    flat = [p for k in ("STARTING_QUOTES", "PUNCTUATION", "PARENS_BRACKETS", "DOUBLE_DASHES", "ENDING_QUOTES",
                        "CONTRACTIONS2", "CONTRACTIONS3") for p in (getattr(tok, k) if isinstance(getattr(tok, k), list)
                                                                    else [getattr(tok, k)])]
    flat = [p[0] if isinstance(p, tuple) else p for p in flat]
    assert flat and not any(isinstance(p, TimedPattern) and p._timeout is not None for p in flat)  # no limit
    assert getattr(words, "__self__", None) is not None and words.__self__._timeout is None


@pytest.mark.realdata
def test_real_rake(wiki, shared, tmp_path):
    from rake_nltk import Rake

    from sentemb.stats.rake import load_stopwords, write_rake

    nltk_data = shared / "nltk_data"
    meta = write_rake(wiki, nltk_data, tmp_path / "r.parquet", top_k=5, workers=2)
    t = pq.read_table(tmp_path / "r.parquet").to_pandas()
    assert meta["n_lines"] == len(t) == 11913 and t["line"].tolist() == list(range(11913))
    stop = set(load_stopwords(nltk_data))
    assert {"the", "of", "and"} <= stop and len(stop) > 100
    r = Rake(stopwords=stop, sentence_tokenizer=lambda x: [x])
    for i, text in enumerate(iter_lines(wiki)):
        if i >= 300:
            break
        r.extract_keywords_from_text(text)
        assert list(t["phrases"][i]) == r.get_ranked_phrases()[:5]
    assert (t["phrases"].map(len) <= 5).all()


def test_paraphrase_precision_fp32_as_the_una_code_and_through_the_workflows_environment(tiny_pegasus, monkeypatch):
    """stats.paraphrase.precision: bf16 autocast on CUDA (default) or fp32 (UNA's data/augment/paraphrase.py);
    the CPU generates in fp32 either way. The rule passes fp32 as SENTEMB_PARAPHRASE_PRECISION (the
    default leaves its command as it was: no finished shard reruns), which `sentemb paraphrase` takes
    as its --precision default. A CPU job's checkpoint keeps its fingerprint (it resumes)."""
    import contextlib

    from sentemb.cli import build_parser
    from sentemb.config.settings import ParaphraseSettings
    from sentemb.stats.paraphrase import Paraphraser, _fingerprint

    assert ParaphraseSettings().precision == "bf16"
    for precision in ("bf16", "fp32"):
        p = Paraphraser.from_pretrained(tiny_pegasus, device="cpu", precision=precision, num_beams=2, max_length=6)
        assert p.precision == "fp32" and isinstance(p.autocast, contextlib.nullcontext)
        assert "precision" not in _fingerprint(tiny_pegasus / "config.json", tiny_pegasus, 0, 1, 3, p)
    with pytest.raises(SentembError, match=r"stats\.paraphrase\.precision"):
        Paraphraser.from_pretrained(tiny_pegasus, device="cpu", precision="fp16")
    argv = ["paraphrase", "--corpus", "c", "--model", "m", "--output", "o"]
    assert build_parser().parse_args(argv).precision == "bf16"
    monkeypatch.setenv("SENTEMB_PARAPHRASE_PRECISION", "fp32")
    assert build_parser().parse_args(argv).precision == "fp32"
    rule = (REPO / "workflow" / "rules" / "stats.smk").read_text()
    assert 'SENTEMB_PARAPHRASE_PRECISION=fp32 " if _PARA["precision"] == "fp32"' in rule
