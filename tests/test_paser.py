"""PaSeR (methods.md §2, issue 10): phrase masking, EDA, decoding signal, L_gen, L_MLM, shared
embeddings, export, bad input; the per-run corpus `sts-unlabeled`.

Every reference here is computed independently of the module (explicit loops, hand examples)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import tiny_run

from sentemb import SentembError
from sentemb.methods import MethodContext, get_method
from sentemb.methods.paser import EDA, decoding_signal, mask_phrases

M = "[MASK]"

SENTS = ["a man plays the guitar in the park", "the dog runs in the park", "red car",
         "she eats an apple in the house", "the old man plays music in the street", "a cat sits on the mat"]
# hand-chosen "RAKE" rows, line-aligned with SENTS (best first)
PHRASES = [["man plays", "guitar", "park"], ["dog runs", "park"], [], ["eats", "apple"],
           ["old man plays music", "street"], ["cat sits"]]


def write_rake(path, rows, top_k=5):
    import json

    meta = {b"sentemb": json.dumps({"top_k": top_k}).encode()}
    t = pa.table({"line": np.arange(len(rows), dtype=np.int64), "phrases": pa.array(rows, pa.list_(pa.string())),
                  "scores": pa.array([[1.0] * len(r) for r in rows], pa.list_(pa.float64()))})
    pq.write_table(t.replace_schema_metadata(meta), path)
    return path


@pytest.fixture
def setup(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in SENTS))
    return corpus, write_rake(tmp_path / "rake_top5.parquet", PHRASES)


def make(model_dir, corpus, rake, nltk=None, seed=3, **args):
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(model_dir, pooling_layer=False)
    inputs = {"rake": rake, "nltk": nltk or corpus.parent}
    ctx = MethodContext(max_len=32, seed=seed, backbone="tiny", model_dir=model_dir, inputs=inputs, corpus=corpus)
    a = {"decoder_layers": 1, "decoder_ffn": 64, "eda": "none", **args}
    return get_method("paser")(enc, tok, a, ctx)


# --------------------------------------------------------------------------------- phrase masking
def test_mask_phrases_hand_example():
    s = "The New York Times reported a big fire in new york ."
    out = mask_phrases(s, ["new york times", "big fire", "new york", "not there"], M)
    assert out.text == f"The {M} {M} {M} reported a {M} {M} in {M} {M} ."
    assert out.phrases == ["New York Times", "big fire", "new york"]
    assert out.mask_ordinals == [[0, 1, 2], [3, 4], [5, 6]]


def test_mask_phrases_punctuation_repeats_and_order():
    s = "it's a dog-friendly park, a park."
    out = mask_phrases(s, ["park", "friendly park", "park", "park"], M)
    # first "park" takes the first occurrence; "friendly park" then does not occur unmasked; the
    # second "park" takes the second occurrence; the third finds none left
    assert out.text == f"it's a dog-friendly {M} , a {M} ."
    assert out.phrases == ["park", "park"] and out.mask_ordinals == [[0], [1]]
    out = mask_phrases(s, ["friendly park"], M)
    assert out.text == f"it's a dog- {M} {M} , a park."
    assert mask_phrases(s, [], M).text == s and mask_phrases(s, [], M).phrases == []


def test_masking_covers_exactly_the_phrase_words():
    rng = random.Random(0)
    vocab = "alpha beta gamma delta eps zeta eta theta iota kappa".split()
    for _ in range(200):
        words = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
        # phrases: random contiguous slices
        phrases = []
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(words))
            phrases.append(" ".join(words[i:i + rng.randint(1, 3)]))
        out = mask_phrases(" ".join(words), phrases, M)
        # reference: greedy first unmasked occurrence, by explicit scanning
        masked = [False] * len(words)
        for p in phrases:
            pw = p.split()
            for i in range(len(words)):
                if words[i:i + len(pw)] == pw and not any(masked[i:i + len(pw)]):
                    masked[i:i + len(pw)] = [True] * len(pw)
                    break
        assert out.text.split() == [M if m else w for w, m in zip(words, masked)]
        assert sum(len(p.split()) for p in out.phrases) == sum(masked)


# --------------------------------------------------------------------------------- EDA
class _Lemma:
    def __init__(self, n):
        self._n = n

    def name(self):
        return self._n


class _Syn:
    def __init__(self, names):
        self._l = [_Lemma(n) for n in names]

    def lemmas(self):
        return self._l


class FakeWordNet:
    TABLE = {"dog": ["dog", "hound", "Domestic_dog"], "park": ["park", "green"], "runs": ["runs", "sprints"]}

    def synsets(self, w):
        return [_Syn(self.TABLE[w])] if w in self.TABLE else []


def test_eda_synonym_replacement_against_eda_rules():
    eda = EDA("sr", 0.5, M, FakeWordNet(), stopwords={"the", "in"})
    assert eda.synonyms("dog") == ["domestic dog", "hound"]  # '_' -> ' ', lowercased, itself removed, sorted
    s = f"the dog runs in the park with the dog {M} {M}"
    seen = set()
    for seed in range(40):
        out = eda(s, np.random.default_rng(seed)).split()
        # n = max(1, int(0.5 * 9 unmasked words)) = 4 ≥ the 3 replaceable words: all three replaced,
        # every occurrence of a replaced word replaced the same way, masks and stopwords untouched
        assert out[-2:] == [M, M] and out.count(M) == 2
        text = " ".join(out)
        assert "dog" not in text.replace("domestic dog", "") and "runs" not in out and "park" not in out
        assert out[0] == "the" and "in" in out and "with" in out
        seen.add(text)
    assert len(seen) > 1  # the random choice matters
    one = EDA("sr", 0.1, M, FakeWordNet(), stopwords=set())  # n = max(1, int(0.1 * 3)) = 1 word replaced
    for seed in range(20):
        out = one("dog runs park", np.random.default_rng(seed))
        assert sum(a != b for a, b in zip(out.split()[:3], "dog runs park".split())) >= 1
        assert sum(w in out for w in ("dog", "runs", "park")) == 2 or "domestic dog" in out


@pytest.mark.parametrize("op", ["rs", "rd"])
def test_eda_swap_and_delete_never_touch_masks(op):
    s = f"a {M} b c {M} {M} d e f g"
    for seed in range(100):
        out = EDA(op, 0.5, M, None).__call__(s, np.random.default_rng(seed)).split()
        assert out.count(M) == 3
        if op == "rs":  # masks stay in place, the other words are a permutation
            assert [i for i, w in enumerate(out) if w == M] == [1, 4, 5]
            assert sorted(w for w in out if w != M) == sorted("a b c d e f g".split())
        else:  # deletion keeps the order of the survivors
            rest = [w for w in out if w != M]
            it = iter("a b c d e f g".split())
            assert all(w in it for w in rest) and len(out) >= 3
    assert EDA("rd", 1.0, M, None)(f"{M} x", np.random.default_rng(0)).split().count(M) == 1


def test_eda_draw_once_augments_each_line_alike_in_every_epoch(tiny_bert_dir, setup):
    """eda_draw: once (the code's EDA applied offline): a line's s and s̃ are the same whatever the
    micro-batch (epoch) and the line's place in the batch: EDA on s, then on s̃, from the line's own
    generator (seed, EDA_ONCE_STREAM, line); the MLM masks are still drawn per micro-batch. With the
    default (step) the augmentation changes between micro-batches."""
    from sentemb.methods.paser import EDA_ONCE_STREAM

    corpus, rake = setup
    m = make(tiny_bert_dir, corpus, rake, eda="rs", eda_draw="once")
    lines = list(range(len(SENTS)))
    b = len(SENTS)

    def rows(batch, order):
        ids, att = batch["input_ids"], batch["attention_mask"]
        return {l: (ids[i][att[i] == 1].tolist(), ids[b + i][att[b + i] == 1].tolist()) for i, l in enumerate(order)}

    a = m.build_batch(SENTS, lines=lines, micro=5)
    later = m.build_batch(SENTS, lines=lines, micro=6)
    rev = m.build_batch(SENTS[::-1], lines=lines[::-1], micro=9)
    assert rows(a, lines) == rows(later, lines) == rows(rev, lines[::-1])
    assert not torch.equal(a["mlm_labels"], later["mlm_labels"])
    eda = EDA("rs", 0.5, M, None)
    for l, s in enumerate(SENTS):  # the reference: the line's own generator, s first, then s̃
        g = np.random.default_rng([3, EDA_ONCE_STREAM, l])
        want_s, want_m = eda(s, g), eda(mask_phrases(s, PHRASES[l], M).text, g)
        tok = m.tokenizer
        assert rows(a, lines)[l] == (tok(want_s)["input_ids"], tok(want_m)["input_ids"]), l
    step = make(tiny_bert_dir, corpus, rake, eda="rs")
    assert rows(step.build_batch(SENTS, lines=lines, micro=5), lines) != rows(step.build_batch(SENTS, lines=lines, micro=6), lines)


def eda_get_only_chars(line: str) -> str:
    """EDA's ``get_only_chars`` (jasonwei20/eda_nlp ``code/eda.py``) as its code reads, character by
    character: the reference the module's vectorised ``eda_only_chars`` is checked against."""
    clean_line = ""
    line = line.replace("’", "").replace("'", "").replace("-", " ").replace("\t", " ").replace("\n", " ").lower()
    for char in line:
        clean_line += char if char in "qwertyuiopasdfghjklzxcvbnm " else " "
    clean_line = re.sub(" +", " ", clean_line)
    if clean_line[0] == " ":
        clean_line = clean_line[1:]
    return clean_line


def eda_clean_reference(sentence: str) -> list[str]:
    """``eda_clean: eda`` on a sentence with mask tokens: EDA's cleaning of the text between the masks
    (``eda()``'s ``words = [w for w in sentence.split(' ') if w != '']``), the masks kept in place."""
    parts = sentence.split(M)
    out = []
    for i, part in enumerate(parts):
        out += [w for w in eda_get_only_chars(part + " ").split(" ") if w != ""]
        if i < len(parts) - 1:
            out.append(M)
    return out


CLEAN_CASES = ["Don't re-use 3.5 well-known items!", "It's the U.S.A.'s 2nd  try\t- isn’t it?", "42 % ...",
               f"A {M} {M} of the café's [x] O'Neil-Smith {M}", "naïve résumé — ÜBER", "", f"{M}"]


@pytest.mark.parametrize("sentence", CLEAN_CASES)
def test_eda_clean_is_edas_get_only_chars_around_the_masks(sentence):
    """``eda_clean: eda``: EDA's ``get_only_chars`` on every word but the mask tokens (apostrophes dropped,
    hyphens to spaces, lowercase, every character outside a-z a space: accented letters and digits go),
    under op none as under the others."""
    from sentemb.methods.paser import eda_only_chars

    want = eda_clean_reference(sentence)
    assert EDA("none", 0.5, M, None, clean=True)(sentence, np.random.default_rng(0)).split() == want
    assert EDA("none", 0.5, M, None)(sentence, np.random.default_rng(0)).split() == sentence.split()  # the default
    if M not in sentence:
        assert eda_only_chars(sentence) == want
    for op in ("rs", "rd"):  # the operations run on the cleaned words: a permutation / a subsequence of them
        for seed in range(20):
            out = EDA(op, 0.5, M, None, clean=True)(sentence, np.random.default_rng(seed)).split()
            assert out.count(M) == want.count(M)
            if op == "rs":
                assert sorted(out) == sorted(want)
            else:
                it = iter(want)
                assert all(w in it for w in out)


def test_eda_clean_synonym_replacement_sees_the_cleaned_words():
    """Synonym replacement after EDA's cleaning: "DOG" and "park-side" are "dog", "park", "side", so they
    are replaced (uncleaned they are not words of the WordNet stand-in); n counts the cleaned words."""
    s = "The DOG's friend RUNS, in the park-side!"
    raw = EDA("sr", 1.0, M, FakeWordNet(), stopwords={"the", "in"})(s, np.random.default_rng(0)).split()
    assert raw == s.split()  # no word of the stand-in as written
    out = EDA("sr", 1.0, M, FakeWordNet(), stopwords={"the", "in"}, clean=True)(s, np.random.default_rng(0)).split()
    cleaned = eda_clean_reference(s)
    assert cleaned == ["the", "dogs", "friend", "runs", "in", "the", "park", "side"]
    # "dogs" has no entry; "runs" and "park" are replaced, the rest stays as cleaned
    assert out == ["the", "dogs", "friend", "sprints", "in", "the", "green", "side"]


@pytest.mark.realdata
def test_eda_clean_on_real_sts_sentences(shared):
    """The vectorised cleaning against EDA's character loop on 3,000 STS-B sentences (digits,
    apostrophes, hyphens, non-ASCII letters), and what it takes away there."""
    from sentemb.methods.paser import eda_only_chars

    path = shared / "data" / "senteval" / "STS" / "STSBenchmark" / "sts-train.csv"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    sents = []
    for line in path.read_text(encoding="utf-8").splitlines()[:1500]:
        sents += line.split("\t")[5:7]
    assert len(sents) == 3000
    changed = 0
    for s in sents:
        want = [w for w in eda_get_only_chars(s + " ").split(" ") if w != ""]
        assert eda_only_chars(s) == want, s
        changed += want != s.split()
    assert changed > 2000  # nearly every sentence has a capital letter or punctuation: cleaning is no detail


def test_build_batch_with_eda_clean_tokenizes_the_cleaned_sentences(tiny_bert_dir, tmp_path):
    """``eda_clean: eda`` in the method: s and s̃ are tokenized cleaned, the masks as many as before."""
    sents = ["The Dog's park-side, 3 times!", "Red car."]
    phrases = [["dog"], []]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in sents))
    rake = write_rake(tmp_path / "rake_top5.parquet", phrases)
    m = make(tiny_bert_dir, corpus, rake, eda_clean="eda")
    plain = make(tiny_bert_dir, corpus, rake)
    batch = m.build_batch(sents, lines=[0, 1], micro=0)
    tok = m.tokenizer
    want = [eda_clean_reference(s) for s in sents] + \
        [eda_clean_reference(mask_phrases(s, p, tok.mask_token).text) for s, p in zip(sents, phrases)]
    ids, att = batch["input_ids"], batch["attention_mask"]
    for i, words in enumerate(want):
        assert ids[i][att[i] == 1].tolist() == tok(" ".join(words))["input_ids"], i
    mask = tok.mask_token_id
    assert (ids == mask).sum() == (plain.build_batch(sents, lines=[0, 1], micro=0)["input_ids"] == mask).sum() == 1


@pytest.mark.realdata
def test_build_batch_with_wordnet_is_deterministic_per_seed_and_micro(tiny_bert_dir, setup, shared):
    corpus, rake = setup
    m = make(tiny_bert_dir, corpus, rake, nltk=shared / "nltk_data", eda="sr")
    lines = list(range(len(SENTS)))
    a = m.build_batch(SENTS, lines=lines, micro=5)
    b = make(tiny_bert_dir, corpus, rake, nltk=shared / "nltk_data", eda="sr").build_batch(SENTS, lines=lines, micro=5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = m.build_batch(SENTS, lines=lines, micro=6)
    d = make(tiny_bert_dir, corpus, rake, nltk=shared / "nltk_data", eda="sr", seed=4).build_batch(SENTS, lines=lines, micro=5)
    assert not torch.equal(a["mlm_labels"], c["mlm_labels"]) or not torch.equal(a["input_ids"], c["input_ids"])
    assert not torch.equal(a["input_ids"], d["input_ids"]) or not torch.equal(a["mlm_labels"], d["mlm_labels"])
    # EDA never touches the masks: as many mask tokens in s̃ as phrase words, none in s
    mask_id = m.tokenizer.mask_token_id
    b_ = len(SENTS)
    n_words = [sum(len(p.split()) for p in mask_phrases(s, ph, M).phrases) for s, ph in zip(SENTS, PHRASES)]
    assert (a["input_ids"][b_:] == mask_id).sum(1).tolist() == n_words
    assert int((a["input_ids"][:b_] == mask_id).sum()) == 0


@pytest.mark.realdata
def test_eda_stopwords_eda_is_edas_127_word_list_and_lets_won_be_replaced(tiny_bert_dir, setup, shared):
    """``eda_stopwords: eda``: EDA's ``eda.py`` list, NLTK's English list before its 2018 revision (127
    words: no contraction, none of their pieces; "don", "s", "t" kept, as EDA keeps them), which lets
    synonym replacement take a piece such as "won" that NLTK's 179 words protect."""
    from sentemb.methods.paser import eda_stopword_list
    from sentemb.stats.rake import load_stopwords

    nltk_words = load_stopwords(shared / "nltk_data")
    eda_words = eda_stopword_list(nltk_words)
    assert (len(nltk_words), len(eda_words)) == (179, 127)
    assert eda_words[:4] == ["i", "me", "my", "myself"] and eda_words[-9:] == \
        ["very", "s", "t", "can", "will", "just", "don", "should", "now"]
    assert not {"won", "isn", "re", "ll", "ma", "ain", "don't", "you're"} & set(eda_words)
    corpus, rake = setup
    m = make(tiny_bert_dir, corpus, rake, nltk=shared / "nltk_data", eda="sr", eda_stopwords="eda")
    assert m.eda.stop == set(eda_words)
    assert make(tiny_bert_dir, corpus, rake, nltk=shared / "nltk_data", eda="sr").eda.stop == set(nltk_words)

    class WonNet(FakeWordNet):
        TABLE = {"won": ["won", "acquire"]}

    for stop, replaced in ((nltk_words, False), (eda_words, True)):
        out = EDA("sr", 0.5, M, WonNet(), stopwords=stop)("she won the cup", np.random.default_rng(0))
        assert ("acquire" in out.split()) == replaced and ("won" in out.split()) != replaced


# --------------------------------------------------------------------------------- the signal
def test_decoding_signal_parts_by_explicit_loops():
    g = torch.Generator().manual_seed(0)
    e_s, e_m = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    for absolute in (True, False):
        out = decoding_signal(e_s, e_m, 10.0, 0.5, absolute=absolute).numpy()
        assert out.shape == (3, 4, 5)
        for i in range(3):
            for j in range(5):
                a, b = float(e_s[i, j]), float(e_m[i, j])
                f = abs if absolute else (lambda x: x)
                ref = [a, b, 10.0 * f(a - b), 0.5 * f(a * b)]
                assert np.allclose(out[i, :, j], ref, atol=1e-6)


# --------------------------------------------------------------------------------- model pieces
def test_decoder_shares_the_encoder_word_embedding_as_one_parameter(tiny_bert_dir, setup):
    m = make(tiny_bert_dir, *setup)
    w = m.encoder.get_input_embeddings().weight
    assert m.decoder.embed_tokens.weight is w and m.mlm_head.W is w
    assert sum(p is w for p in m.parameters()) == 1
    assert not m.mlm_head_pretrained  # the tiny random BertModel has no cls.predictions
    assert len(m.decoder.layers.layers) == 1
    assert m.decoder.layers.layers[0].linear1.out_features == 64


def test_targets_dec_inputs_and_labels(tiny_bert_dir, setup):
    m = make(tiny_bert_dir, *setup)
    tok = m.tokenizer
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=0)
    # reference: [CLS] p1 [SEP] p2 [SEP] ... for the rows with phrases (line 2 "red car" has none)
    rows = [i for i, p in enumerate(PHRASES) if p]
    assert batch["dec_rows"].tolist() == rows
    for r, i in enumerate(rows):
        ids = [tok.cls_token_id]
        for p in PHRASES[i]:
            ids += tok.convert_tokens_to_ids(tok.tokenize(p)) + [tok.sep_token_id]
        n = len(ids) - 1
        assert batch["dec_input_ids"][r, :n].tolist() == ids[:-1]
        assert batch["dec_labels"][r, :n].tolist() == ids[1:]
        assert (batch["dec_labels"][r, n:] == -100).all() and (batch["dec_attention_mask"][r, n:] == 0).all()
    # s̃ of each line: its phrase words masked
    b = len(SENTS)
    for i, s in enumerate(SENTS):
        ref = " ".join(M if w in {x for p in PHRASES[i] for x in p.split()} else w for w in s.split())
        got = tok.decode([t for t in batch["input_ids"][b + i].tolist() if t != tok.pad_token_id][1:-1])
        assert got.split() == ref.replace(M, "[MASK]").split()


def test_target_cut_tokens_is_the_tokenizers_truncation_at_every_cap(tiny_bert_dir, setup):
    """``target_cut: tokens`` (paser-code) against the tokenizer's own truncation of "p1 [SEP] … pk"
    at every cap from 2 (a first phrase longer than the cap, a cut just after a separator, an exact
    fit, phrases dropped because their masks were cut off); ``phrases`` against whole trailing
    phrases dropped."""
    import dataclasses

    from sentemb.methods.paser import mask_phrases

    m = make(tiny_bert_dir, *setup)
    tok = m.tokenizer
    phrases = ["the man plays the guitar", "dog", "park bench", "a big red car"]
    masked = mask_phrases("the man plays the guitar near the dog on a park bench by a big red car", phrases,
                          tok.mask_token)
    assert masked.phrases == phrases
    pieces = [tok(p, add_special_tokens=False)["input_ids"] + [tok.sep_token_id] for p in phrases]
    for surviving, kept in ((99, 4), (max(masked.mask_ordinals[2]), 2)):  # the third phrase's last mask cut off
        text = f" {tok.sep_token} ".join(phrases[:kept])
        whole = tok(text)["input_ids"]
        for cap in range(2, len(whole) + 3):
            m.args = dataclasses.replace(m.args, max_target_len=cap, target_cut="tokens")
            assert m.targets(masked, surviving) == tok(text, max_length=cap, truncation=True)["input_ids"], cap
            m.args = dataclasses.replace(m.args, target_cut="phrases")
            ref = [tok.cls_token_id]
            for piece in pieces[:kept]:
                if len(ref) + len(piece) > cap:
                    break
                ref += piece
            assert m.targets(masked, surviving) == (ref if len(ref) > 1 else []), cap
    first = len(pieces[0]) + 1  # [CLS] p1 [SEP]
    m.args = dataclasses.replace(m.args, max_target_len=first, target_cut="tokens")  # p1 alone, whole
    assert m.targets(masked, 99) == [tok.cls_token_id, *pieces[0]]
    m.args = dataclasses.replace(m.args, max_target_len=first + 1)  # the cut just after p1's separator
    assert m.targets(masked, 99) == [tok.cls_token_id, *pieces[0], tok.sep_token_id]
    m.args = dataclasses.replace(m.args, max_target_len=2)
    assert m.targets(masked, 99) == [tok.cls_token_id, tok.sep_token_id]


def test_phrase_cut_off_by_max_len_is_dropped(tiny_bert_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    long = " ".join(["the"] * 40 + ["guitar"])
    corpus.write_text(f"{long}\nthe guitar\n")
    rake = write_rake(tmp_path / "r.parquet", [["guitar"], ["guitar"]])
    m = make(tiny_bert_dir, corpus, rake)
    batch = m.build_batch([long, "the guitar"], lines=[0, 1], micro=0)
    assert batch["dec_rows"].tolist() == [1]  # line 0's phrase lies beyond 32 tokens
    assert int((batch["input_ids"][0] == m.tokenizer.mask_token_id).sum()) == 0


def _hand_ce(logits, labels):
    """Mean over labelled positions of -log softmax, one token at a time."""
    total, n = 0.0, 0
    lg, lb = logits.detach().double().numpy(), labels.numpy()
    for idx in np.ndindex(lb.shape):
        if lb[idx] == -100:
            continue
        row = lg[idx]
        total += -(row[lb[idx]] - (row.max() + math.log(np.exp(row - row.max()).sum())))
        n += 1
    return total / n


def test_l_gen_and_l_mlm_equal_hand_cross_entropies(tiny_bert_dir, setup):
    torch.manual_seed(0)
    m = make(tiny_bert_dir, *setup, mlm_prob=0.5)
    m.eval()  # no dropout: the same logits twice
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=1)
    terms = m.losses(batch)
    with torch.no_grad():
        memory = m.signal(batch["input_ids"], batch["attention_mask"])
        logits = m.decoder(batch["dec_input_ids"], batch["dec_attention_mask"], memory[batch["dec_rows"]])
        b = len(SENTS)
        hid = m.encoder(input_ids=batch["mlm_input_ids"], attention_mask=batch["attention_mask"][:b]).last_hidden_state
        mlm_logits = m.mlm_head(hid)
    assert float(terms["phrases"]) == int((batch["dec_labels"] != -100).sum()) > 0
    assert abs(float(terms["gen"]) - _hand_ce(logits, batch["dec_labels"])) < 1e-4
    assert abs(float(terms["mlm"]) - _hand_ce(mlm_logits, batch["mlm_labels"])) < 1e-4
    assert abs(float(terms["loss"].detach()) - float(terms["gen"]) - float(terms["mlm"])) < 1e-5
    # the decoder's prediction at position i depends on the target only through tokens < i (causal)
    x = batch["dec_input_ids"][:1].clone()
    with torch.no_grad():
        a = m.decoder(x, batch["dec_attention_mask"][:1], memory[batch["dec_rows"][:1]])
        x[0, -1] = m.tokenizer.mask_token_id
        c = m.decoder(x, batch["dec_attention_mask"][:1], memory[batch["dec_rows"][:1]])
    assert torch.allclose(a[0, :-1], c[0, :-1], atol=1e-5)


def test_mlm_masks_only_non_special_positions_80_10_10(tiny_bert_dir, setup):
    m = make(tiny_bert_dir, *setup, mlm_prob=0.3)
    tok = m.tokenizer
    b = len(SENTS)
    counts = {"mask": 0, "rand_or_keep": 0, "chosen": 0, "eligible": 0}
    for micro in range(30):
        batch = m.build_batch(SENTS, lines=list(range(b)), micro=micro)
        ids, lab, inp = batch["input_ids"][:b], batch["mlm_labels"], batch["mlm_input_ids"]
        for i in range(b):
            for j in range(ids.size(1)):
                t = int(ids[i, j])
                special = t in (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
                if special:
                    assert lab[i, j] == -100 and inp[i, j] == t
                    continue
                counts["eligible"] += 1
                if lab[i, j] == -100:
                    assert inp[i, j] == t  # not chosen: unchanged
                else:
                    assert lab[i, j] == t
                    counts["chosen"] += 1
                    counts["mask" if inp[i, j] == tok.mask_token_id else "rand_or_keep"] += 1
    assert 0.2 < counts["chosen"] / counts["eligible"] < 0.4
    assert 0.65 < counts["mask"] / counts["chosen"] < 0.95


def test_gradients_reach_encoder_decoder_and_both_signal_halves(tiny_bert_dir, setup):
    torch.manual_seed(0)
    m = make(tiny_bert_dir, *setup)
    m.train()
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=0)
    assert not m.losses(batch)["gen"].requires_grad
    # L_gen alone: the gradient reaches the decoder, the shared embedding and the encoder layers,
    # not the MLM head
    memory = m.signal(batch["input_ids"], batch["attention_mask"])
    memory.retain_grad()
    logits = m.decoder(batch["dec_input_ids"], batch["dec_attention_mask"], memory[batch["dec_rows"]])
    sel = batch["dec_labels"] != -100
    torch.nn.functional.cross_entropy(logits[sel], batch["dec_labels"][sel]).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in m.decoder.named_parameters()
               if "norm" not in n and "bias" not in n)
    assert m.encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert m.mlm_head.dense.weight.grad is None
    # all four parts of the signal (E_s, E_s̃, difference, product) receive gradient: nothing detached
    for part in range(4):
        assert memory.grad[batch["dec_rows"], part].abs().sum() > 0
    e = torch.randn(2, 4, requires_grad=True)
    f = torch.randn(2, 4, requires_grad=True)
    decoding_signal(e, f, 10.0, 10.0).sum().backward()
    assert e.grad.abs().sum() > 0 and f.grad.abs().sum() > 0


def test_code_form_has_a_trainable_linear_on_the_masked_embedding(tiny_bert_dir, setup):
    m = make(tiny_bert_dir, *setup, masked_linear=True, signal_abs=False, signal_m=1.0, signal_n=1.0)
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=0)
    m.eval()
    with torch.no_grad():
        cls = m.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
        b = len(SENTS)
        e_s, e_m = cls[:b], m.masked_proj(cls[b:])
        ref = torch.stack([e_s, e_m, e_s - e_m, e_s * e_m], 1)
        assert torch.allclose(m.signal(batch["input_ids"], batch["attention_mask"]), ref, atol=1e-5)
    m.train()
    m.losses(batch)["loss"].backward()
    assert m.masked_proj.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------- edge cases
def test_empty_target_sep_gives_a_line_without_phrases_the_codes_one_token_target(tiny_bert_dir, tmp_path):
    """``empty_target: sep``: a line whose RAKE row is empty gets the target [CLS] [SEP] (decoder input
    [CLS], label [SEP]), as the code's " " cell tokenizes; a line whose phrases are not found in it keeps
    no target (its RAKE row is not empty); ``none`` (the default) gives neither a decoder row; a graphed
    batch (``static``) carries the same labels; ``target_truncation: sentence`` still drops it at max_len."""
    corpus = tmp_path / "c.txt"
    long = " ".join(["word"] * 40)
    corpus.write_text(f"red car\nblue sky\na man plays\n{long}\n")
    rake = write_rake(tmp_path / "r.parquet", [[], ["not in it"], ["man plays"], []])
    sents, lines = ["red car", "blue sky", "a man plays", long], [0, 1, 2, 3]
    m = make(tiny_bert_dir, corpus, rake, empty_target="sep")
    tok = m.tokenizer
    batch = m.build_batch(sents, lines=lines, micro=0)
    assert batch["dec_rows"].tolist() == [0, 2, 3]
    for r in (0, 2):  # the two lines without a RAKE phrase
        r = batch["dec_rows"].tolist().index([0, 2, 3][r])
        assert batch["dec_input_ids"][r, 0] == tok.cls_token_id and batch["dec_labels"][r, 0] == tok.sep_token_id
        assert (batch["dec_labels"][r, 1:] == -100).all() and batch["dec_attention_mask"][r].tolist()[:2] == [1, 0]
    assert float(m.losses(batch)["gen"]) > 0
    assert make(tiny_bert_dir, corpus, rake).build_batch(sents, lines=lines, micro=0)["dec_rows"].tolist() == [2]
    cut = make(tiny_bert_dir, corpus, rake, empty_target="sep", target_truncation="sentence")
    assert cut.build_batch(sents, lines=lines, micro=0)["dec_rows"].tolist() == [0, 2]
    m.ctx.static = True
    static = m.build_batch(sents, lines=lines, micro=0)
    assert static["dec_rows"].tolist() == [0, 1, 2, 3]
    assert static["dec_labels"][0, 0] == tok.sep_token_id and (static["dec_labels"][1] == -100).all()


def test_no_phrases_gives_zero_gen_not_nan(tiny_bert_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("red car\nblue sky\n")
    rake = write_rake(tmp_path / "r.parquet", [[], ["not in it"]])
    m = make(tiny_bert_dir, corpus, rake)
    terms = m.losses(m.build_batch(["red car", "blue sky"], lines=[0, 1], micro=0))
    assert float(terms["gen"]) == 0.0 and float(terms["phrases"]) == 0
    assert torch.isfinite(terms["loss"]) and terms["loss"].requires_grad


def test_rake_file_not_line_aligned_is_refused_naming_both_files(tiny_bert_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in SENTS))
    rake = write_rake(tmp_path / "rake_top5.parquet", PHRASES[:4])
    with pytest.raises(SentembError, match=r"rake_top5\.parquet have 4 rows but the corpus .*corpus\.txt has 6 lines"):
        make(tiny_bert_dir, corpus, rake)
    rake = write_rake(tmp_path / "rake_top2.parquet", PHRASES, top_k=2)
    with pytest.raises(SentembError, match="top 2 RAKE phrases .* top_k is 5"):
        make(tiny_bert_dir, corpus, rake)


def test_rake_alignment_error_before_step_1(tiny_bert_dir, tiny_senteval, tmp_path):
    from sentemb.train.loop import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in SENTS * 4))
    rake = write_rake(tmp_path / "rake_top5.parquet", PHRASES)
    run = tiny_run(tiny_bert_dir, corpus, tiny_senteval, "paser", seed=1, method_args={"eda": "none", "decoder_layers": 1},
                   inputs={"rake": rake, "nltk": tmp_path}, max_steps=2, batch_size=4)
    with pytest.raises(SentembError, match="6 rows but the corpus .* has 24 lines"):
        train(run, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / ".work" / "last.pt").exists()


def test_heads_must_divide_hidden_size(tiny_bert_dir, setup):
    with pytest.raises(SentembError, match=r"decoder_heads \(5\) must divide .* hidden size \(32\)"):
        make(tiny_bert_dir, *setup, decoder_heads=5)


def test_export_holds_no_decoder_or_mlm_head(tiny_bert_dir, setup, tmp_path):
    from safetensors.torch import load_file

    m = make(tiny_bert_dir, *setup)
    m.export(tmp_path / "model", "cls_before_pooler", meta={"method": "paser", "name": "paser", "backbone": "tiny", "seed": 1})
    keys = set()
    for f in (tmp_path / "model").rglob("*.safetensors"):
        keys |= set(load_file(f))
    assert keys and not any(("decoder" in k) or ("mlm" in k) or ("masked_proj" in k) for k in keys)
    assert len(keys) == len(m.encoder.state_dict())


# --------------------------------------------------------------------------------- config
def _config(**run):
    return {"backbones": {"b": {"hub_id": "x/b"}},
            "runs": [{"method": "simcse", "backbone": "b"}, {"method": "paser", "backbone": "b", **run}]}


def test_config_corpus_and_top_k_checks():
    from sentemb.config.load import resolve_run, validate_config
    from sentemb.stats.workflow import run_corpora, stats_targets

    with pytest.raises(SentembError, match=r"runs\[1\]\.corpus.*unknown corpus 'nope'.*sts-unlabeled"):
        validate_config(_config(corpus="nope"))
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.top_k.*'stats\.rake_top_k' \(5\)"):
        validate_config(_config(method_args={"top_k": 6}))
    cfg = _config(corpus="sts-unlabeled", method_args={"top_k": 4})
    cfg["stats"] = {"rake_top_k": 4}
    cfg = validate_config(cfg)
    assert run_corpora(cfg) == ["wiki1m", "sts-unlabeled"]
    r = resolve_run(cfg, "paser", "b", 1)
    assert r.corpus == "sts-unlabeled" and r.paths["corpus"] == "resources/corpus/sts-unlabeled.txt"
    assert r.paths["inputs"]["rake"] == "results/stats/sts-unlabeled/rake_top4.parquet"
    assert resolve_run(cfg, "simcse", "b", 1).paths["corpus"] == "resources/corpus/wiki1m.txt"
    t = stats_targets(cfg)
    assert "results/stats/sts-unlabeled/rake_top4.parquet" in t and "results/stats/wiki1m/tfidf.parquet" in t
    assert not any("paraphrases" in x for x in t)


# --------------------------------------------------------------------------------- sts-unlabeled
def _reference_sts(root, unscored=False):
    """Independent reading: every scored pair of STS12-16 test (``unscored``: every line of the input
    files, as ConSERT's ``load_sts`` reads them), every row of the STS-B and SICK splits."""
    sents = []
    for task, subs in {"STS12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
                       "STS13": ["FNWN", "headlines", "OnWN"],
                       "STS14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
                       "STS15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
                       "STS16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]}.items():
        for sub in subs:
            d = root / "STS" / f"{task}-en-test"
            inp = (d / f"STS.input.{sub}.txt").read_text("utf-8").splitlines()
            gs = (d / f"STS.gs.{sub}.txt").read_text("utf-8").splitlines()
            for line, g in zip(inp, gs):
                if g.strip() or unscored:
                    sents += line.split("\t")[:2]
    for split in ("train", "dev", "test"):
        for line in (root / "STS" / "STSBenchmark" / f"sts-{split}.csv").read_text("utf-8").splitlines():
            if line.strip():
                sents += line.strip().split("\t")[5:7]
    for f in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        for line in (root / "SICK" / f).read_text("utf-8").splitlines()[1:]:
            if line.strip():
                sents += line.strip().split("\t")[1:3]
    return [s for s in (" ".join(x.split()) for x in sents) if s]


def test_prepare_sts_corpus_on_a_tiny_tree(tiny_senteval, tmp_path):
    import shutil

    from sentemb.cli import main

    root = tmp_path / "senteval"
    shutil.copytree(tiny_senteval, root)
    first = _reference_sts(root)[0]
    with open(root / "SICK" / "SICK_train.txt", "a") as f:  # a repeat (with other spacing) and a new pair
        f.write(f"99\t{'  '.join(first.split())}\tbrand new sentence\t3.0\tNEUTRAL\n")
    ref = _reference_sts(root)
    assert len(set(ref)) < len(ref)
    out = tmp_path / "sts-unlabeled.txt"
    assert main(["prepare-sts-corpus", "--senteval", str(root), "--output", str(out)]) == 0
    assert out.read_text("utf-8").splitlines() == list(dict.fromkeys(ref))
    assert out.read_text("utf-8").count(first + "\n") == 1 and "brand new sentence" in out.read_text("utf-8")
    assert main(["prepare-sts-corpus", "--senteval", str(root), "--output", str(out), "--keep-duplicates"]) == 0
    assert out.read_text("utf-8").splitlines() == ref


def test_a_sample_of_the_sts_corpus_is_a_seeded_subsequence(tiny_senteval, tmp_path):
    """config ``sts_corpus.max_sentences`` (``--max-sentences``, ``--seed``): that many of the
    sentences, in corpus order, drawn by the seed; as many or more keep all of them."""
    from sentemb.cli import main
    from sentemb.data.fetch import prepare_sts_corpus

    full = _reference_sts(tiny_senteval, unscored=True)
    assert len(full) > 12

    def sample(n, seed, name):
        out = tmp_path / name
        argv = ["prepare-sts-corpus", "--senteval", str(tiny_senteval), "--output", str(out), "--unscored",
                "--keep-duplicates", "--max-sentences", str(n), "--seed", str(seed)]
        assert main(argv) == 0
        return out.read_text("utf-8").splitlines(), json.loads(Path(f"{out}.json").read_text())

    a, summary = sample(10, 0, "a.txt")
    assert len(a) == 10 and summary["sentences"] == 10 and summary["sentences_before_sample"] == len(full)
    assert (summary["max_sentences"], summary["seed"]) == (10, 0)
    it = iter(full)
    assert all(any(s == t for t in it) for s in a)  # a subsequence of the whole corpus: its order kept
    assert sample(10, 0, "again.txt")[0] == a and sample(10, 1, "other.txt")[0] != a
    assert sample(len(full), 0, "all.txt")[0] == full  # nothing to draw: every sentence
    whole = prepare_sts_corpus(tiny_senteval, tmp_path / "whole.txt", keep_duplicates=True, unscored=True)
    assert "max_sentences" not in whole and "seed" not in whole  # without a sample: the summary as before
    with pytest.raises(SentembError, match="at least 2"):
        prepare_sts_corpus(tiny_senteval, tmp_path / "one.txt", max_sentences=1)


@pytest.mark.realdata
def test_sts_unlabeled_count_on_real_senteval(shared, tmp_path):
    from sentemb.data.fetch import prepare_sts_corpus

    root = shared / "data" / "senteval"
    ref = _reference_sts(root)
    unique = list(dict.fromkeys(ref))
    out = tmp_path / "sts-unlabeled.txt"
    summary = prepare_sts_corpus(root, out)
    assert out.read_text("utf-8").splitlines() == unique
    assert summary["sentences"] == len(unique) == 30840 and len(ref) == 62198  # the counts in docs/configuration.md
    # ConSERT's loader (config sts_corpus's default): every line of STS12-16's input files, duplicates kept
    consert = prepare_sts_corpus(root, tmp_path / "consert.txt", keep_duplicates=True, unscored=True)
    assert (tmp_path / "consert.txt").read_text("utf-8").splitlines() == _reference_sts(root, unscored=True)
    assert consert["sentences"] == 89192 and consert["unscored"]  # ConSERT's 89,192 unlabeled texts

@pytest.mark.parametrize("names", ["today", "google"])
def test_mlm_head_is_loaded_from_a_checkpoint_that_has_one(tiny_bert_dir, setup, tmp_path, names):
    """``google``: the file names its LayerNorm tensors ``gamma`` / ``beta``, as the Hub's
    ``bert-base-uncased`` and ``bert-large-uncased`` do (``sentemb.model.backbone.modern_names``)."""
    d, ref = _mlm_checkpoint(tiny_bert_dir, tmp_path, legacy=names == "google")
    m = make(d, *setup)
    assert m.mlm_head_pretrained
    p = ref.cls.predictions
    assert torch.equal(m.mlm_head.dense.weight, p.transform.dense.weight)
    assert torch.equal(m.mlm_head.LayerNorm.weight, p.transform.LayerNorm.weight)
    assert torch.equal(m.mlm_head.bias, p.bias)
    h = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.allclose(m.mlm_head(h), p(h), atol=1e-5)  # same logits as the checkpoint's head


# --------------------------------------------------------------------------------- issue 18 §5
def test_top_k_default_is_the_full_model_of_tables_4_8_9():
    """Table 5's RAKE top-5 row (77.7 / 79.3 / 65.4) is the row of Tables 4, 8 and 9's full model."""
    assert get_method("paser").arg_defaults()["top_k"] == 5
    assert get_method("paser").arg_defaults()["decoder_output"] == "embeddings"


def _mlm_checkpoint(tiny_bert_dir, tmp_path, legacy=False):
    """A tiny random BertForMaskedLM saved to disk, and the model itself (``conftest.mlm_checkpoint``)."""
    from conftest import mlm_checkpoint

    return mlm_checkpoint(tiny_bert_dir, tmp_path / "mlm_model", legacy)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied-code"])
def test_decoder_through_the_pretrained_mlm_head_gives_bert_for_masked_lm_logits(tiny_bert_dir, setup, tmp_path,
                                                                                   tied):
    """decoder_output: mlm_head — logits = the checkpoint's cls.predictions applied to the decoder's
    states (computed by transformers' BertForMaskedLM), and L_gen is their cross-entropy."""
    d, ref = _mlm_checkpoint(tiny_bert_dir, tmp_path)
    m = make(d, *setup, decoder_output="mlm_head", mlm_head_tied=tied)
    assert m.mlm_head_pretrained
    m.eval()
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=1)
    with torch.no_grad():
        memory = m.signal(batch["input_ids"], batch["attention_mask"])[batch["dec_rows"]]
        states = m.decoder.hidden(batch["dec_input_ids"], batch["dec_attention_mask"], memory)
        logits = m.decoder(batch["dec_input_ids"], batch["dec_attention_mask"], memory)
        want = ref.cls(states)
        assert torch.allclose(logits, want, atol=1e-5)
        # not the tied-embedding projection of the default
        assert not torch.allclose(logits, states @ m.encoder.get_input_embeddings().weight.T, atol=1e-3)
        terms = m.losses(batch)
    assert abs(float(terms["gen"]) - _hand_ce(want, batch["dec_labels"])) < 1e-4
    # the decoder does not own the head: its parameters are the method's mlm_head.*, once
    assert not any("_head" in k for k in m.decoder.state_dict())
    assert len({id(p) for p in m.parameters()}) == len(list(m.parameters()))


def test_mlm_head_switches_tie_and_gradients_as_the_code(tiny_bert_dir, setup, tmp_path):
    """Code form (decoder_output: mlm_head, mlm_head_tied: false): one trainable head serves L_gen and
    L_MLM, its vocabulary matrix is its own copy of the pretrained one; L_gen reaches the head."""
    d, ref = _mlm_checkpoint(tiny_bert_dir, tmp_path)
    w = lambda m: m.encoder.get_input_embeddings().weight  # noqa: E731
    code = make(d, *setup, decoder_output="mlm_head", mlm_head_tied=False)
    tied = make(d, *setup, decoder_output="mlm_head")
    paper = make(d, *setup)
    assert code.mlm_head.W is not w(code) and torch.equal(code.mlm_head.W, ref.cls.predictions.decoder.weight)
    assert code.mlm_head.W.requires_grad and any(p is code.mlm_head.W for p in code.parameters())
    assert tied.mlm_head.W is w(tied) and paper.mlm_head.W is w(paper)
    for m in (code, tied, paper):
        m.train()
        torch.manual_seed(0)
        batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=0)
        memory = m.signal(batch["input_ids"], batch["attention_mask"])
        logits = m.decoder(batch["dec_input_ids"], batch["dec_attention_mask"], memory[batch["dec_rows"]])
        sel = batch["dec_labels"] != -100
        torch.nn.functional.cross_entropy(logits[sel], batch["dec_labels"][sel]).backward()  # L_gen alone
        reaches_head = m.mlm_head.dense.weight.grad is not None and m.mlm_head.dense.weight.grad.abs().sum() > 0
        assert reaches_head == (m is not paper)
        assert w(m).grad.abs().sum() > 0  # the shared input embeddings either way
        assert m.encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert code.mlm_head.weight.grad.abs().sum() > 0 and code.mlm_head.bias.grad.abs().sum() > 0
    # L_MLM uses the same head in the code form
    code.zero_grad()
    b = len(SENTS)
    batch = code.build_batch(SENTS, lines=list(range(b)), micro=0)
    hid = code.encoder(input_ids=batch["mlm_input_ids"], attention_mask=batch["attention_mask"][:b]).last_hidden_state
    msel = batch["mlm_labels"] != -100
    torch.nn.functional.cross_entropy(code.mlm_head(hid[msel]), batch["mlm_labels"][msel]).backward()
    assert code.mlm_head.weight.grad.abs().sum() > 0


def test_export_is_the_encoder_whatever_the_decoder_output(tiny_bert_dir, setup, tmp_path):
    from safetensors.torch import load_file

    d, _ = _mlm_checkpoint(tiny_bert_dir, tmp_path)
    meta = {"method": "paser", "name": "paser", "backbone": "tiny", "seed": 1}
    exported = {}
    for name, args in (("paper", {}), ("code", {"decoder_output": "mlm_head", "mlm_head_tied": False})):
        m = make(d, *setup, **args)
        m.export(tmp_path / name, "cls_before_pooler", meta=meta)
        exported[name] = {k: v for f in (tmp_path / name).rglob("*.safetensors") for k, v in load_file(f).items()}
        assert len(exported[name]) == len(m.encoder.state_dict())
        assert not any(("decoder" in k) or ("mlm" in k) or ("predictions" in k) for k in exported[name])
    assert exported["paper"].keys() == exported["code"].keys()
    assert all(torch.equal(exported["paper"][k], exported["code"][k]) for k in exported["paper"])


def test_methods_command_lists_the_decoder_output_switch(capsys):
    from sentemb.cli import main

    assert main(["methods", "paser"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("decoder_output"))
    assert '"embeddings"' in line and "{embeddings, mlm_head}" in line and "cls.lm_head" in line
    line = next(x for x in out.splitlines() if x.strip().startswith("mlm_head_tied"))
    assert "true" in line and "copy" in line
    assert next(x for x in out.splitlines() if x.strip().startswith("top_k")).split("=")[1].split()[0] == "5"


def test_code_form_head_resumes_bit_identically(tiny_bert_dir, tiny_senteval, tmp_path):
    """The untied head is one more trained parameter: a kill and resume end with the weights and dev
    history of an uninterrupted run."""
    from conftest import assert_same_model

    from sentemb.train.loop import train

    d, _ = _mlm_checkpoint(tiny_bert_dir, tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in SENTS * 4))
    rake = write_rake(tmp_path / "rake_top5.parquet", PHRASES * 4)
    args = {"eda": "none", "decoder_layers": 1, "decoder_ffn": 64, "decoder_output": "mlm_head", "mlm_head_tied": False}
    run = tiny_run(d, corpus, tiny_senteval, "paser", seed=1, method_args=args, name="paser-code",
                   inputs={"rake": rake, "nltk": tmp_path}, max_steps=4, batch_size=4)
    full = train(run, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(run, tmp_path / "resumed", stop_after=2, progress=False)
    res = train(run, tmp_path / "resumed", progress=False)
    assert res["history"] == full["history"] and len(full["history"]) == 2
    assert_same_model(tmp_path / "full/model", tmp_path / "resumed/model")


def test_special_positions_are_the_tokenizers_own_special_tokens_mask(tiny_bert_dir, setup, shared):
    """build_batch finds the special positions with one lookup of ``all_special_ids``: the rows of
    ``get_special_tokens_mask(already_has_special_tokens=True)`` (the tiny and the real WordPiece
    tokenizers; padding counted special too)."""
    from transformers import AutoTokenizer

    m = make(tiny_bert_dir, *setup, mlm_prob=1.0)
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=0)
    b = len(SENTS)
    ids, att = batch["input_ids"][:b], batch["attention_mask"][:b]
    ref = torch.tensor([m.tokenizer.get_special_tokens_mask(x, already_has_special_tokens=True) for x in ids.tolist()],
                       dtype=torch.bool) | (att == 0)
    # mlm_prob 1: every non-special position is chosen for corruption, no special one
    assert torch.equal(batch["mlm_labels"] != -100, ~ref)
    for tok in (m.tokenizer, AutoTokenizer.from_pretrained(shared / "models" / "all-MiniLM-L6-v2")):
        enc = tok(SENTS + ["[MASK] x"], padding=True, return_tensors="pt")["input_ids"]
        want = torch.tensor([tok.get_special_tokens_mask(x, already_has_special_tokens=True) for x in enc.tolist()],
                            dtype=torch.bool)
        got = torch.isin(enc, torch.tensor(sorted(set(tok.all_special_ids)), dtype=enc.dtype))
        assert torch.equal(got, want)
