"""The corpus token cache (sentemb.data.tokens, issue 13): its batches are the tokenizer's batches.

The reference is always the tokenizer itself, called as the methods called it before the cache:
``tokenizer(sentences, padding=True, truncation=True, max_length=L, return_tensors="pt")``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from sentemb import SentembError
from sentemb.model.backbone import load_tokenizer
from sentemb.data.tokens import TokenCache, tokenizer_fingerprint

from conftest import TINY_WORDS

EDGE = ["the dog", "", "  spaced   out  ", "Ünïcödé café — naïve", "x" * 200, "a " * 80, "the"]


def reference(tok, sentences, max_len):
    return dict(tok(list(sentences), padding=True, truncation=True, max_length=max_len, return_tensors="pt"))


def assert_same(a, b):
    assert list(a) == list(b), f"keys {list(a)} != {list(b)}"
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), f"{k}:\n{a[k]}\n!=\n{b[k]}"


def corpus_lines(n=120, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)] + EDGE


@pytest.mark.parametrize("which", ["bert", "roberta"])
@pytest.mark.parametrize("max_len", [4, 9, 32, 512])
def test_batches_equal_the_tokenizer_for_every_batch_and_length(which, max_len, tiny_bert_dir, tiny_roberta_dir):
    tok = load_tokenizer(tiny_bert_dir if which == "bert" else tiny_roberta_dir)
    sents = corpus_lines()
    cache = TokenCache.build(sents, tok)
    rng = np.random.default_rng(0)
    for _ in range(25):
        lines = rng.choice(len(sents), size=int(rng.integers(1, 20)), replace=False)
        assert_same(cache.batch(lines, max_len), reference(tok, [sents[i] for i in lines], max_len))
    lengths = cache.lengths(max_len)
    ref = [len(x) for x in tok(sents, truncation=True, max_length=max_len)["input_ids"]]
    assert lengths.tolist() == ref


def test_left_padding_tokenizers_are_padded_on_the_left(tiny_bert_dir):
    tok = load_tokenizer(tiny_bert_dir)
    tok.padding_side = "left"
    sents = corpus_lines(30)
    cache = TokenCache.build(sents, tok)
    assert_same(cache.batch([0, 5, 30, 31], 12), reference(tok, [sents[i] for i in (0, 5, 30, 31)], 12))


def test_saved_cache_is_memory_mapped_and_gives_the_same_batches(tiny_bert_dir, tmp_path):
    tok = load_tokenizer(tiny_bert_dir)
    sents = corpus_lines()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in sents), "utf-8")
    built = TokenCache.build(sents, tok, corpus=corpus)
    built.save(tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["ids.npy", "meta.json", "offsets.npy"]
    loaded = TokenCache.load(tmp_path / "cache", tok, corpus=corpus, lines=len(sents))
    assert isinstance(loaded.ids, np.memmap)
    lines = [3, 1, 125, 0, 124]
    assert_same(loaded.batch(lines, 16), built.batch(lines, 16))
    assert_same(loaded.batch(lines, 16), reference(tok, [sents[i] for i in lines], 16))


def test_a_cache_of_another_tokenizer_corpus_or_length_is_refused_by_name(tiny_bert_dir, tiny_roberta_dir, tmp_path):
    bert, roberta = load_tokenizer(tiny_bert_dir), load_tokenizer(tiny_roberta_dir)
    assert tokenizer_fingerprint(bert) != tokenizer_fingerprint(roberta)
    before = tokenizer_fingerprint(bert)
    bert(["the dog runs"] * 3, truncation=True, max_length=3, padding="max_length")  # per-call state only
    assert tokenizer_fingerprint(bert) == before
    sents = corpus_lines(20)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in sents), "utf-8")
    TokenCache.build(sents, bert, corpus=corpus).save(tmp_path / "cache")
    meta = tmp_path / "cache" / "meta.json"
    with pytest.raises(SentembError, match=rf"{meta}: made by another tokenizer"):
        TokenCache.load(tmp_path / "cache", roberta)
    with pytest.raises(SentembError, match=rf"{meta}: {len(sents)} lines, but the corpus has 3"):
        TokenCache.load(tmp_path / "cache", bert, lines=3)
    other = tmp_path / "other.txt"
    other.write_text("".join(s + " changed\n" for s in sents), "utf-8")
    with pytest.raises(SentembError, match=rf"{meta}: made from another corpus than {other}"):
        TokenCache.load(tmp_path / "cache", bert, corpus=other)
    np.save(tmp_path / "cache" / "ids.npy", np.zeros(3, dtype=np.int32))  # damaged
    with pytest.raises(SentembError, match="do not match meta.json"):
        TokenCache.load(tmp_path / "cache", bert)
    with pytest.raises(SentembError, match="not found"):
        TokenCache.load(tmp_path / "nothing", bert)


def test_tokenize_corpus_command_writes_the_cache(tiny_bert_dir, tmp_path):
    sents = corpus_lines(40)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in sents if s.strip()), "utf-8")
    out = tmp_path / "tokens.tiny"
    r = subprocess.run([sys.executable, "-m", "sentemb", "tokenize-corpus", "--model", str(tiny_bert_dir),
                        "--corpus", str(corpus), "--output", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    kept = [s for s in sents if s.strip()]
    assert meta["lines"] == len(kept) and meta["prefix"] == [2] and meta["suffix"] == [3]  # [CLS] … [SEP]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tokens")]  # no temporary left
    tok = load_tokenizer(tiny_bert_dir)
    cache = TokenCache.load(out, tok, corpus=corpus)
    assert_same(cache.batch(range(len(kept)), 32), reference(tok, kept, 32))


@pytest.mark.realdata
def test_the_real_corpus_under_the_real_tokenizer_gives_the_tokenizers_batches(minilm_dir, shared):
    """Every batch of the training schedule of the real Wikipedia sample under MiniLM's WordPiece."""
    from sentemb.data.corpus import read_corpus
    from sentemb.train.loop import batch_schedule

    corpus = shared / "data" / "wiki1m_head.txt"
    tok = load_tokenizer(minilm_dir)
    sents = read_corpus(corpus)
    cache = TokenCache.build(sents, tok, corpus=corpus)
    for max_len in (8, 32):
        for idx in batch_schedule(len(sents), 64, 1, seed=0):
            assert_same(cache.batch(idx, max_len), reference(tok, [sents[i] for i in idx], max_len))


@pytest.mark.parametrize("which", ["bert", "roberta"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_method_rows_with_repeats_and_cached_lines_equal_one_tokenizer_call(which, padding_side, tiny_bert_dir,
                                                                           tiny_roberta_dir):
    """``Method.tokenize_rows``: repeated texts tokenized once, corpus lines read from the cache, the
    blocks padded together; the reference is one tokenizer call on all the rows. Rows drawn so that
    the cached block is sometimes the wider and sometimes the narrower, with texts past max_len."""
    from sentemb.methods import MethodContext, get_method
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(tiny_bert_dir if which == "bert" else tiny_roberta_dir, pooling_layer=False)
    tok.padding_side = padding_side
    sents = corpus_lines()
    cache = TokenCache.build(sents, tok)
    other = [" ".join(reversed(s.split())) + " extra words" for s in sents]  # texts that are no corpus line
    rng = np.random.default_rng(1)
    wider = set()
    for max_len in (9, 32):
        m = get_method("simcse")(enc, tok, {}, MethodContext(max_len=max_len, seed=0, tokens=cache))
        for _ in range(30):
            texts, lines = [], []
            for _ in range(int(rng.integers(1, 12))):
                kind = rng.integers(3)
                i = int(rng.integers(len(sents)))
                if kind == 0:  # a corpus line, known as one
                    texts.append(sents[i]), lines.append(i)
                elif kind == 1:  # another text
                    texts.append(other[i]), lines.append(None)
                elif texts:  # a repeat of an earlier row; a corpus line's repeat with its line or without
                    j = int(rng.integers(len(texts)))
                    line = sents.index(texts[j]) if texts[j] in sents and rng.random() < 0.5 else None
                    texts.append(texts[j]), lines.append(line)
                else:  # a corpus line first seen without its line (a later repeat may give it)
                    texts.append(sents[i]), lines.append(None)
            ref = reference(tok, texts, max_len)
            got = m.tokenize_rows(texts, lines)
            assert_same({k: got[k] for k in ref}, ref)
            assert_same({k: m.tokenize_rows(texts)[k] for k in ref}, ref)  # without lines: the tokenizer alone
            cached = [t for t, line in zip(texts, lines) if line is not None]
            rest = [t for t, line in zip(texts, lines) if line is None and t not in cached]
            if cached and rest:
                wider.add(reference(tok, cached, max_len)["input_ids"].size(1) >
                          reference(tok, rest, max_len)["input_ids"].size(1))
    assert wider == {True, False}  # both blocks were the wider one in some draw
    tok.truncation_side = "left"  # the cache keeps first tokens: such a tokenizer tokenizes every row
    m = get_method("simcse")(enc, tok, {}, MethodContext(max_len=9, seed=0, tokens=cache))
    long = [i for i, x in enumerate(sents) if len(tok(x)["input_ids"]) > 9][:5]
    assert len(long) == 5
    ref = reference(tok, [sents[i] for i in long], 9)
    assert_same({k: m.tokenize_rows([sents[i] for i in long], long)[k] for k in ref}, ref)
    assert_same({k: m.tokenize([sents[i] for i in long], long)[k] for k in ref}, ref)
