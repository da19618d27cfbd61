"""UNA (methods.md §3): Steps 2-3 against hand computations, the batch layout every α steps, the
symmetric NT-Xent against a float64 loop, gradient flow, inputs and bad input."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from conftest import tiny_run

from sentemb import SentembError
from sentemb.methods import MethodContext, get_method
from sentemb.methods.una import (UNAAugmenter, replacement_probabilities, sample_replacement,
                                 simcse_hard_negative_loss, symmetric_nt_xent)
from sentemb.model.backbone import load_encoder

from conftest import TINY_WORDS

SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat"]


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("una")
    rng = random.Random(7)
    lines = [" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 14))) for _ in range(80)]
    lines[:len(SENTS)] = SENTS  # the test sentences are corpus lines 0..3
    p = d / "corpus.txt"
    p.write_text("".join(x + "\n" for x in lines), "utf-8")
    para = d / "paraphrases.txt"  # a stand-in paraphrase per line: the words reversed
    para.write_text("".join(" ".join(reversed(x.split())) + "\n" for x in lines), "utf-8")
    return p


@pytest.fixture(scope="module")
def tfidf(corpus):
    from sentemb.stats.tfidf import write_tfidf

    out = corpus.parent / "tfidf.parquet"
    write_tfidf([corpus], out, workers=1)
    return out


@pytest.fixture(scope="module")
def tfidf_para(corpus):
    from sentemb.stats.tfidf import write_tfidf

    out = corpus.parent / "tfidf_para.parquet"
    write_tfidf([corpus, corpus.parent / "paraphrases.txt"], out, workers=1)
    return out


def _method(tiny_bert_dir, corpus, tfidf, seed=0, **args):
    torch.manual_seed(0)
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    inputs = {"tfidf": tfidf, "tfidf_para": corpus.parent / "tfidf_para.parquet",
              "paraphrases": corpus.parent / "paraphrases.txt"}
    return get_method("una")(enc, tok, args, MethodContext(max_len=32, seed=seed, inputs=inputs, corpus=corpus))


# ------------------------------------------------------------------------------ Step 2
def test_probabilities_on_a_hand_made_sentence():
    # z = [0.1, 0.4, 0.2, 0.9]: min 0.1, z - min = [0, .3, .1, .8], C = 1.2 / 4 = 0.3
    p = replacement_probabilities([0.1, 0.4, 0.2, 0.9], 0.5)
    np.testing.assert_allclose(p, [0.0, 0.5, 0.5 * 0.1 / 0.3, 1.0], rtol=1e-12)
    # before clipping the mean is β (Eq. 5): β·mean((z - min)/C) = β
    raw = [0.5 * d / 0.3 for d in (0.0, 0.3, 0.1, 0.8)]
    assert sum(raw) / 4 == pytest.approx(0.5)
    # the arg-max term gets p = 1 even where β·(z - min)/C < 1: β = 0.1, z = [0, 1, 2] -> C = 1
    np.testing.assert_allclose(replacement_probabilities([0.0, 1.0, 2.0], 0.1), [0.0, 0.1, 1.0])


@pytest.mark.parametrize("z, want", [([3.0], [1.0]), ([2.0, 2.0, 2.0], [1.0, 0.0, 0.0]), ([], [])])
def test_probabilities_without_spread_replace_only_the_top_term(z, want):
    p = replacement_probabilities(z, 0.5)
    assert not np.isnan(p).any()
    np.testing.assert_array_equal(p, want)


# ------------------------------------------------------------------------------ Step 3
def _window_probs(k, s, r, exclude_self):
    """P(j) for every candidate j: explicit loop over the window [k - r, k + r] clipped to the vocabulary."""
    cand = [j for j in range(k - r, k + r + 1) if 0 <= j < len(s) and not (exclude_self and j == k)]
    total = sum(s[j] for j in cand)
    return {j: s[j] / total for j in cand}


@pytest.mark.parametrize("k, exclude_self", [(3, True), (25, True), (48, True), (25, False)])
def test_replacement_window_and_frequencies_proportional_to_s(k, exclude_self):
    V, r, n = 50, 5, 10_000
    s = np.sort(np.random.default_rng(1).uniform(0.1, 2.0, V))[::-1].copy()  # rank order: s descending
    rng = np.random.default_rng(123)
    draws = [sample_replacement(k, s, r, rng, exclude_self=exclude_self) for _ in range(n)]
    probs = _window_probs(k, s, r, exclude_self)
    assert set(draws) == set(probs)  # exactly the ranks [k - r, k + r] clipped (minus k itself)
    counts = {j: draws.count(j) for j in probs}
    chi2 = sum((counts[j] - n * p) ** 2 / (n * p) for j, p in probs.items())
    # chi-square with len(probs) - 1 <= 10 dof: 0.999 quantile is 29.6
    assert chi2 < 29.6, (chi2, counts)


def test_replacement_window_with_zero_mass_is_uniform_and_a_lone_term_is_kept():
    s = np.zeros(10)
    draws = {sample_replacement(4, s, 2, np.random.default_rng(i)) for i in range(400)}
    assert draws == {2, 3, 5, 6}
    assert sample_replacement(0, np.array([1.0]), 3, np.random.default_rng(0)) == 0


def test_precomputed_cumsum_gives_the_same_draws():
    s = np.linspace(2.0, 0.1, 30)
    cs = np.concatenate([[0.0], np.cumsum(s)])
    a = [sample_replacement(10, s, 4, np.random.default_rng(5)) for _ in range(3)]
    b = [sample_replacement(10, s, 4, np.random.default_rng(5), cumsum=cs) for _ in range(3)]
    assert a == b


# ------------------------------------------------------------------------------ the augmenter
def _hand_z(sentence, corpus_lines):
    """tf·idf per distinct term, counted by hand (tokens = whitespace words for this vocabulary)."""
    docs = [set(x.split()) for x in corpus_lines if x.split()]
    toks = sentence.split()
    out = {}
    for t in toks:
        if t not in out:
            n_t = sum(1 for d in docs if t in d)
            out[t] = math.log(1 + toks.count(t) / len(toks)) * -math.log(n_t / len(docs))
    return out


def test_negatives_replace_the_top_term_within_the_window_with_frequencies_p(corpus, tfidf):
    import pyarrow.parquet as pq

    lines = corpus.read_text("utf-8").splitlines()
    table = pq.read_table(tfidf).to_pydict()
    rank = dict(zip(table["term"], table["rank"]))
    r = 3
    aug = UNAAugmenter.from_parquet(tfidf, beta=0.5, radius=r, write_back="tokens")
    sent = "the dog runs in the park with the big red car"
    z = _hand_z(sent, lines)
    top = max(z, key=z.get)
    zmin = min(z.values())
    C = sum(v - zmin for v in z.values()) / len(z)
    p_hand = {t: 1.0 if t == top else min(0.5 * (v - zmin) / C, 1.0) for t, v in z.items()}
    rng = np.random.default_rng(0)
    n, hits = 2000, {t: 0 for t in z}
    toks = sent.split()
    for _ in range(n):
        neg, share = aug.negative(sent, rng)
        new = neg.split()
        assert len(new) == len(toks) and new != toks
        changed = {}
        for old, t in zip(toks, new):
            if old != t:
                assert abs(rank[t] - rank[old]) <= r  # only within the rank window
                assert changed.setdefault(old, t) == t  # all occurrences of a term get one replacement
        assert top in changed  # the arg-max term is always replaced
        assert share == pytest.approx(len(changed) / len(z))
        for t in changed:
            hits[t] += 1
    for t, p in p_hand.items():  # each term replaced with frequency p_i (4 sigma)
        assert abs(hits[t] / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, hits[t] / n, p)


def test_span_write_back_keeps_text_and_case():
    from sentemb.stats.tfidf import tokenize

    aug = UNAAugmenter(["x"], [1], [1.0], 1)
    sent = "The Dog runs in the PARK, (SA) fast."
    toks = tokenize(sent)
    assert toks == ["the", "dog", "runs", "in", "the", "park", ",", "(", "sa", ")", "fast", "."]
    new = ["the", "cat", "runs", "in", "the", "city", ",", "(", "sa", "sky", "fast", "."]
    assert aug._write(sent, toks, new) == "The Cat runs in the CITY, (SA sky fast."
    aug.write_back = "tokens"
    assert aug._write(sent, toks, new) == "the cat runs in the city , ( sa sky fast ."


QUOTED = ['He said "hi" and \'\'bye\'\' ``ok\'\'.', '"a" "b', "''", "``", 'a " b', "x '' y `` z \"q\"",
          "It's 5 o'clock (GMT), isn't it?", "Don't  stop\tbelieving ... "]


def _nltk_spans(text):
    from nltk.tokenize import NLTKWordTokenizer

    try:
        return list(NLTKWordTokenizer().span_tokenize(text))
    except (ValueError, RuntimeError):
        return None


def test_token_spans_are_nltks_span_tokenize_from_the_tokens_made_once():
    """The write-back's spans come from the one tokenization (``token_spans``); NLTK's
    ``span_tokenize`` (which tokenizes again) is the reference, quotes included."""
    from sentemb.methods.una import token_spans
    from sentemb.stats.tfidf import word_tokens

    for text in QUOTED + SENTS:
        assert token_spans(text, word_tokens(text)) == _nltk_spans(text), text
    assert token_spans("a b", ["a", "c"]) is None  # tokens that are not in the text: no spans


@pytest.mark.realdata
def test_token_spans_on_the_real_corpus(shared):
    from sentemb.data.corpus import read_corpus
    from sentemb.methods.una import token_spans
    from sentemb.stats.tfidf import word_tokens

    lines = read_corpus(shared / "data" / "wiki1m_head.txt")
    assert sum('"' in x for x in lines) > 100  # the sample has quotes to convert back
    for text in lines:
        assert token_spans(text, word_tokens(text)) == _nltk_spans(text), text


def test_ablations_random_selection_and_random_replacement(corpus, tfidf):
    import pyarrow.parquet as pq

    rank = dict(zip(*pq.read_table(tfidf, columns=["term", "rank"]).to_pydict().values()))
    sent = "the dog runs in the park with the big red car"
    toks = sent.split()
    far = 0
    aug = UNAAugmenter.from_parquet(tfidf, radius=1, replacement="random", write_back="tokens")
    rng = np.random.default_rng(0)
    for _ in range(300):
        new = aug.negative(sent, rng)[0].split()
        far += sum(abs(rank[t] - rank[o]) > 1 for o, t in zip(toks, new) if o != t)
        assert all(o != t for o, t in zip(toks, new) if o != t)
    assert far > 0  # random replacement leaves the rank window
    aug = UNAAugmenter.from_parquet(tfidf, beta=0.5, selection="random", write_back="tokens")
    shares = [aug.negative(sent, rng)[1] for _ in range(2000)]
    assert min(shares) > 0  # at least one term replaced
    # each of the 9 distinct terms with probability β, plus one forced: E = (1 + 8β)/9
    assert np.mean(shares) == pytest.approx((1 + 8 * 0.5) / 9, abs=0.02)


def test_code_redraw_may_keep_a_term_but_never_returns_the_anchor(corpus, tfidf):
    """redraw: code with the paper's selection: the window holds the term itself, and a negative whose
    text equals its anchor's is replaced by the code's fallback (never the anchor)."""
    aug = UNAAugmenter.from_parquet(tfidf, radius=1, redraw="code", write_back="tokens")
    rng = np.random.default_rng(0)
    sent = "red car"
    for _ in range(500):
        neg, _ = aug.negative(sent, rng)
        assert neg != sent
    # the window may hold the term itself: a single draw sometimes returns it
    s = aug.s
    k = aug.rank["car"]
    kept = sum(sample_replacement(k, s, 1, rng, exclude_self=False) == k for _ in range(500))
    assert kept > 0


def _code_probabilities(sent, lines, beta):
    """The authors' ``ThresholdRep.get_replace_prob`` (function/tfidf_una.py) by hand: per token
    position, p = (z − min z)/Σ(z − min z) · β · n, the first arg-max set to 1 where every p < 1."""
    z = _hand_z(sent, lines)
    zs = np.array([z[t] for t in sent.split()])
    with np.errstate(invalid="ignore"):
        p = (zs - zs.min()) / (zs - zs.min()).sum() * beta * len(zs)
    if p.max() < 1:
        p[p.argmax()] = 1
    return p


def test_code_selection_form_draws_each_token_position_with_the_codes_probability(corpus, tfidf):
    """selection_form: code: every occurrence of a repeated term ("the" 3 times) is drawn on its own,
    with the code's per-position probability, and gets its own replacement."""
    lines = corpus.read_text("utf-8").splitlines()
    sent = "the dog runs in the park with the big red car"
    toks = sent.split()
    p = np.minimum(_code_probabilities(sent, lines, 0.5), 1.0)
    aug = UNAAugmenter.from_parquet(tfidf, beta=0.5, radius=3, write_back="tokens", selection_form="code")
    rng = np.random.default_rng(1)
    n, hits, split = 3000, np.zeros(len(toks)), 0
    for _ in range(n):
        new = aug.negative(sent, rng)[0].split()
        assert len(new) == len(toks)
        changed = np.array([a != b for a, b in zip(toks, new)])  # exclude_self: a drawn position changes
        hits += changed
        the = [new[i] for i in (0, 4, 7)]
        split += len(set(the)) > 1
    for i, (h, q) in enumerate(zip(hits / n, p)):
        assert abs(h - q) <= 4 * math.sqrt(q * (1 - q) / n) + 1e-9, (toks[i], h, q)
    assert split > 0  # the occurrences of one term are not replaced alike
    paper = UNAAugmenter.from_parquet(tfidf, beta=0.5, radius=3, write_back="tokens")
    for _ in range(300):
        new = paper.negative(sent, rng)[0].split()
        assert len({new[i] for i in (0, 4, 7)}) == 1  # the paper's form: one replacement per term


def test_code_selection_form_replaces_nothing_where_all_scores_are_equal(corpus, tfidf):
    """The code's 0/0 on a one-term sentence: no position is selected (NaN probabilities); the negative
    is the lowercased tokens, and only where that text is the anchor's does the fallback fire (one
    vocabulary term drawn ∝ s − min s). The paper's form replaces the arg-max term."""
    import pyarrow.parquet as pq

    table = pq.read_table(tfidf, columns=["term", "s"]).to_pydict()
    s = np.array(table["s"])
    rng = np.random.default_rng(2)
    code = UNAAugmenter.from_parquet(tfidf, write_back="tokens", selection_form="code")
    assert code.negative("Car", rng) == ("car", 0.0)  # "Car" != "car": no fallback, as `example == output`
    assert code.negative("car", rng) == ("car", 0.0)  # redraw exclude_self: no fallback at all
    assert UNAAugmenter.from_parquet(tfidf, write_back="tokens").negative("car", rng)[0] != "car"
    fallback = UNAAugmenter.from_parquet(tfidf, write_back="tokens", selection_form="code", redraw="code")
    n = 4000
    draws = [fallback.negative("car", rng) for _ in range(n)]
    assert all(share == 1.0 and len(neg.split()) == 1 for neg, share in draws)
    want = (s - s.min()) / (s - s.min()).sum()
    got = {t: 0 for t in table["term"]}
    for neg, _ in draws:
        got[neg] += 1
    for t, q in zip(table["term"], want):
        assert abs(got[t] / n - q) <= 4 * math.sqrt(q * (1 - q) / n) + 1e-9, (t, got[t] / n, q)
    assert got[table["term"][int(np.argmin(s))]] == 0


def test_rank_ties_first_seen_orders_equal_s_by_first_occurrence(corpus, tmp_path):
    """rank_ties: first_seen (the code's stable sort of its corpus-ordered dict): among equal s, the
    term that occurs first in the corpus ranks first; the ``first`` column is that order whatever the
    workers and chunks."""
    import pyarrow.parquet as pq

    from sentemb.stats.tfidf import tokenize, write_tfidf

    order = {}
    for line in corpus.read_text("utf-8").splitlines():
        for t in tokenize(line):
            order.setdefault(t, len(order))
    out = tmp_path / "tfidf.parquet"
    write_tfidf([corpus], out, workers=2, chunk_size=7)
    table = pq.read_table(out).to_pydict()
    assert dict(zip(table["term"], table["first"])) == order
    s = dict(zip(table["term"], table["s"]))
    assert len(s) - len(set(s.values())) > 5  # ties to order
    aug = UNAAugmenter.from_parquet(out, rank_ties="first_seen")
    assert aug.terms == sorted(s, key=lambda t: (-s[t], order[t]))
    assert UNAAugmenter.from_parquet(out).terms == sorted(s, key=lambda t: (-s[t], t))
    assert list(aug.s) == sorted(s.values(), reverse=True)
    old = tmp_path / "old.parquet"
    pq.write_table(pq.read_table(out).drop(["first"]).replace_schema_metadata(pq.read_table(out).schema.metadata), old)
    with pytest.raises(SentembError, match=r"old\.parquet: no column .*first.*stats_tfidf"):
        UNAAugmenter.from_parquet(old, rank_ties="first_seen")


# ------------------------------------------------------------------------------ losses
def reference_symmetric(u: np.ndarray, tau: float) -> float:
    R = len(u)
    cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    total = 0.0
    for k in range(R):
        partner = k + 1 if k % 2 == 0 else k - 1
        denom = sum(math.exp(cos(u[k], u[l]) / tau) for l in range(R) if l != k)
        total += -math.log(math.exp(cos(u[k], u[partner]) / tau) / denom)
    return total / R


def reference_simcse(z1, z2, z3, tau):
    cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    cols = list(z2) + (list(z3) if z3 is not None else [])
    total = 0.0
    for i in range(len(z1)):
        denom = sum(math.exp(cos(z1[i], c) / tau) for c in cols)
        total += -math.log(math.exp(cos(z1[i], z2[i]) / tau) / denom)
    return total / len(z1)


def test_symmetric_loss_against_a_float64_loop_over_a_4B_row_batch():
    rng = np.random.default_rng(0)
    B = 3
    a, p, n = rng.normal(size=(B, 6)), rng.normal(size=(B, 6)), rng.normal(size=(B, 6))
    rows = [x for i in range(B) for x in (a[i], p[i])] + [x for i in range(B) for x in (n[i], n[i])]
    u = np.stack(rows)  # a1 p1 a2 p2 a3 p3 ñ1 ñ1 ñ2 ñ2 ñ3 ñ3
    got = symmetric_nt_xent(torch.tensor(u, dtype=torch.float32), 0.05)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(reference_symmetric(u, 0.05), rel=1e-4)
    assert symmetric_nt_xent(torch.tensor(u[:2 * B], dtype=torch.float32), 0.05).item() == pytest.approx(
        reference_symmetric(u[:2 * B], 0.05), rel=1e-4)
    got = simcse_hard_negative_loss(*(torch.tensor(x, dtype=torch.float32) for x in (a, p, n)), 0.05)
    assert got.item() == pytest.approx(reference_simcse(a, p, n, 0.05), rel=1e-4)


def test_losses_are_fp32_under_bf16_autocast():
    u = torch.randn(8, 4).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert symmetric_nt_xent(u, 0.05).dtype == torch.float32
        assert simcse_hard_negative_loss(u[:2], u[2:4], u[4:6], 0.05).dtype == torch.float32


@pytest.mark.parametrize("loss", ["symmetric", "simcse"])
def test_method_loss_equals_reference_on_model_outputs(tiny_bert_dir, corpus, tfidf, loss):
    m = _method(tiny_bert_dir, corpus, tfidf, loss=loss)
    m.eval()  # no dropout, so the reference can recompute the rows
    batch = m.build_batch(SENTS, step=0, lines=[0, 1, 2, 3], micro=0)
    terms = m.losses(batch)
    model_in = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        u = m.mlp(m.encoder(**model_in).last_hidden_state[:, 0]).double().numpy()
    B = len(SENTS)
    if loss == "symmetric":
        assert len(u) == 4 * B and int(terms["negatives"]) == 2 * B
        want = reference_symmetric(u, 0.05)
    else:
        assert len(u) == 3 * B and int(terms["negatives"]) == B
        want = reference_simcse(u[0:2 * B:2], u[1:2 * B:2], u[2 * B:], 0.05)
    assert terms["loss"].item() == pytest.approx(want, rel=1e-4)
    assert set(terms) == {"loss", "contrastive", "negatives", "replaced", "empty_paraphrases", "weighted"}
    assert not terms["contrastive"].requires_grad


def test_gradient_reaches_encoder_mlp_and_the_negative_rows(tiny_bert_dir, corpus, tfidf):
    m = _method(tiny_bert_dir, corpus, tfidf)
    m.train()
    batch = m.build_batch(SENTS, step=0, lines=[0, 1, 2, 3], micro=0)
    enc = m.encode(batch).batch
    u = torch.cat([enc["pairs"], enc["negatives"]], 0)
    u.retain_grad()
    symmetric_nt_xent(u, 0.05).backward()
    B = len(SENTS)
    assert u.grad[2 * B:].abs().sum(-1).min() > 0  # every negative row is a query and a key
    assert m.mlp.dense.weight.grad.abs().sum() > 0
    assert m.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------------------ batches
def _decode(m, batch):
    return [m.tokenizer.decode(r, skip_special_tokens=True) for r in batch["input_ids"]]


@pytest.mark.parametrize("paraphrase", [False, True])
def test_batch_layout_on_alpha_steps_and_other_steps(tiny_bert_dir, corpus, tfidf, tfidf_para, paraphrase):
    m = _method(tiny_bert_dir, corpus, tfidf, alpha=3, paraphrase=paraphrase)
    B = len(SENTS)
    for step in range(7):
        batch = m.build_batch(SENTS, step=step, lines=[0, 1, 2, 3], micro=step)
        rows = _decode(m, batch)
        assert rows[0:2 * B:2] == SENTS
        pos = [" ".join(reversed(s.split())) for s in SENTS] if paraphrase else SENTS
        assert rows[1:2 * B:2] == pos
        if step % 3 == 0:  # steps 0, 3, 6: ã_1, ã_1, ..., ã_B, ã_B
            assert len(rows) == 4 * B and int(batch["negatives"]) == 2 * B
            negs = rows[2 * B:]
            assert negs[0::2] == negs[1::2]
            assert all(n != s for n, s in zip(negs[0::2], SENTS))
            assert 0 < float(batch["replaced"]) <= 1
        else:
            assert len(rows) == 2 * B and int(batch["negatives"]) == 0 and float(batch["replaced"]) == 0


@pytest.mark.parametrize("paraphrase,loss", [(False, "symmetric"), (True, "symmetric"), (False, "simcse")])
def test_batches_are_one_tokenizer_call_on_the_rows_with_or_without_the_token_cache(tiny_bert_dir, corpus, tfidf,
                                                                                      tfidf_para, paraphrase, loss):
    """build_batch tokenizes each distinct row once and reads anchors from the corpus's token cache:
    the reference is the tokenizer called once on all rows, negatives drawn again from np_rng(micro)."""
    from sentemb.data.corpus import read_corpus
    from sentemb.data.tokens import TokenCache

    plain = _method(tiny_bert_dir, corpus, tfidf, alpha=2, paraphrase=paraphrase, loss=loss)
    cached = _method(tiny_bert_dir, corpus, tfidf, alpha=2, paraphrase=paraphrase, loss=loss)
    lines_all = read_corpus(corpus)
    cached.ctx.tokens = TokenCache.build(lines_all, cached.tokenizer)
    para = [" ".join(reversed(x.split())) for x in lines_all]
    for step in range(4):
        idx = [(7 * step + 3 * k) % len(lines_all) for k in range(6)]
        sents = [lines_all[i] for i in idx]
        rows = [x for i, s in zip(idx, sents) for x in (s, para[i] if paraphrase else s)]
        if step % 2 == 0:
            rng = plain.np_rng(step)
            negs = [plain.augmenter.negative(s, rng)[0] for s in sents]
            rows += [x for n in negs for x in ((n, n) if loss == "symmetric" else (n,))]
        ref = plain.tokenizer(rows, padding=True, truncation=True, max_length=32, return_tensors="pt")
        for m in (plain, cached):
            got = m.build_batch(sents, step=step, lines=idx, micro=step)
            assert all(torch.equal(got[k], ref[k]) for k in ref), (step, m is cached)


def test_batches_are_deterministic_in_seed_and_micro(tiny_bert_dir, corpus, tfidf):
    a = _method(tiny_bert_dir, corpus, tfidf, seed=1)
    b = _method(tiny_bert_dir, corpus, tfidf, seed=1)
    c = _method(tiny_bert_dir, corpus, tfidf, seed=2)
    long = [" ".join(TINY_WORDS[i:i + 12]) for i in range(0, 48, 12)]
    x = a.build_batch(long, step=5, micro=9)
    assert all(torch.equal(v, b.build_batch(long, step=5, micro=9)[k]) for k, v in x.items())
    assert _decode(a, x) != _decode(a, a.build_batch(long, step=5, micro=10))
    assert _decode(a, x) != _decode(c, c.build_batch(long, step=5, micro=9))


def test_negatives_on_the_same_steps_after_a_resume(tiny_bert_dir, corpus, tfidf, tiny_senteval, tmp_path,
                                                    monkeypatch):
    from sentemb.methods.una import UNA
    from sentemb.train.loop import train

    seen = []
    orig = UNA.build_batch

    def spy(self, sentences, step=0, *, lines=None, micro=0):
        out = orig(self, sentences, step, lines=lines, micro=micro)
        seen.append((step, micro, int(out["negatives"])))
        return out

    monkeypatch.setattr(UNA, "build_batch", spy)
    cfg = tiny_run(tiny_bert_dir, corpus, tiny_senteval, "una", seed=5, method_args={"alpha": 4},
                   inputs={"tfidf": tfidf}, max_steps=5, batch_size=8, grad_accum=2, lr_schedule="constant",
                   eval_steps=100)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "r", stop_after=2, progress=False)
    first, seen[:] = list(seen), []
    train(cfg, tmp_path / "r", progress=False)
    # 80 lines / 8 / 2 = 5 steps; the prefetch thread had built step 2 ahead (thrown away at the kill,
    # built again, identically, by the resumed run)
    assert first == [(0, 0, 16), (0, 1, 16), (1, 2, 0), (1, 3, 0), (2, 4, 0), (2, 5, 0)]
    assert seen == [(s, 2 * s + k, 16 if s % 4 == 0 else 0) for s in range(2, 5) for k in range(2)]


# ------------------------------------------------------------------------------ inputs, bad input
def test_requires_and_paraphrase_planning():
    from sentemb.stats.workflow import stats_settings

    una = get_method("una")
    assert una.requires(una.make_args({})) == ("tfidf",)
    assert una.requires(una.make_args({"paraphrase": True})) == ("tfidf_para", "paraphrases")
    from sentemb.config.load import validate_config

    cfg = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": "una", "backbone": "b"}]}
    assert stats_settings(validate_config(cfg))["paraphrase"]["enabled"] is False  # no paraphrase job planned
    cfg = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [
        {"method": "una", "backbone": "b"},
        {"method": "una", "backbone": "b", "name": "una-para", "method_args": {"paraphrase": True}}]}
    assert stats_settings(validate_config(cfg))["paraphrase"]["enabled"] is True


def test_paraphrase_line_count_mismatch_fails_before_training(tiny_bert_dir, corpus, tfidf_para, tmp_path):
    bad = tmp_path / "paraphrases.txt"
    bad.write_text("only one line\n", "utf-8")
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    ctx = MethodContext(max_len=16, seed=0, inputs={"tfidf_para": tfidf_para, "paraphrases": bad}, corpus=corpus)
    with pytest.raises(SentembError, match=rf"{bad}.* 1 lines .*{corpus}.* 80"):
        get_method("una")(enc, tok, {"paraphrase": True}, ctx)


def test_empty_paraphrase_uses_the_anchor_or_the_empty_text_and_is_counted(tiny_bert_dir, corpus, tfidf_para, tmp_path):
    lines = corpus.read_text("utf-8").splitlines()
    para = tmp_path / "paraphrases.txt"
    para.write_text("".join(("" if i in (1, 3) else "the sun") + "\n" for i in range(len(lines))), "utf-8")
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    ctx = MethodContext(max_len=16, seed=0, inputs={"tfidf_para": tfidf_para, "paraphrases": para}, corpus=corpus)
    m = get_method("una")(enc, tok, {"paraphrase": True}, ctx)
    batch = m.build_batch(SENTS, step=1, lines=[0, 1, 2, 3], micro=0)
    assert _decode(m, batch)[1:8:2] == ["the sun", SENTS[1], "the sun", SENTS[3]]
    assert int(batch["empty_paraphrases"]) == 2
    assert float(m.losses(batch)["empty_paraphrases"]) == 2
    # empty_paraphrase: empty (una-code): the empty text, which the tokenizer makes [CLS] [SEP]
    code = get_method("una")(enc, tok, {"paraphrase": True, "empty_paraphrase": "empty"}, ctx)
    batch = code.build_batch(SENTS, step=1, lines=[0, 1, 2, 3], micro=0)
    assert _decode(code, batch)[1:8:2] == ["the sun", "", "the sun", ""]
    ids = batch["input_ids"][3][batch["attention_mask"][3].bool()].tolist()
    assert ids == tok("")["input_ids"] == [tok.cls_token_id, tok.sep_token_id]
    assert int(batch["empty_paraphrases"]) == 2


@pytest.mark.parametrize("args, match", [
    ({"alpha": 0}, r"methods\.una\.alpha: 0 is below the minimum 1"),
    ({"radius": 0}, r"methods\.una\.radius: 0 is below the minimum 1"),
    ({"beta": 0.0}, r"methods\.una\.beta: 0.0 must be greater than 0"),
    ({"loss": "triplet"}, r"methods\.una\.loss: 'triplet' is not one of 'symmetric', 'simcse'"),
    ({"paraphrase": "yes"}, r"methods\.una\.paraphrase: 'yes' is not true or false"),
])
def test_bad_arguments_name_the_key(args, match):
    with pytest.raises(SentembError, match=match):
        get_method("una").validate_args(args, "methods.una")


def test_missing_statistics_input_is_a_clear_error(tiny_bert_dir):
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    with pytest.raises(SentembError, match="input 'tfidf' was not provided"):
        get_method("una")(enc, tok, {}, MethodContext(max_len=16, seed=0))


def test_paraphrasing_only_has_paraphrase_positives_and_no_negatives(tiny_bert_dir, corpus):
    """UNA Table 1's "paraphrasing only" row: ``negatives: false`` with ``paraphrase: true`` — rows a_1, p_1,
    …, a_B, p_B on every step (α steps included), no TF-IDF statistics read or required; the loss equals
    the symmetric NT-Xent of those rows computed independently in float64."""
    una = get_method("una")
    args = una.resolve_args({"paraphrase": True, "negatives": False})
    assert una.requires(una.make_args(args)) == ("paraphrases",)
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    ctx = MethodContext(max_len=32, seed=0, inputs={"paraphrases": corpus.parent / "paraphrases.txt"}, corpus=corpus)
    m = una(enc, tok, {"paraphrase": True, "negatives": False}, ctx)  # no tfidf input given: not needed
    B = len(SENTS)
    for step in (0, 5, 10, 3):
        batch = m.build_batch(SENTS, step=step, lines=[0, 1, 2, 3], micro=step)
        rows = _decode(m, batch)
        assert rows[0::2] == SENTS and rows[1::2] == [" ".join(reversed(s.split())) for s in SENTS]
        assert len(rows) == 2 * B and int(batch["negatives"]) == 0
    m.eval()
    with torch.no_grad():
        e = m.encode(batch).batch
        u = torch.cat([e["pairs"], e["negatives"]], 0).double()
        got = float(m.losses(batch)["loss"])
    u = torch.nn.functional.normalize(u, dim=-1)
    sim = u @ u.T / 0.05
    ref = 0.0
    for k in range(2 * B):
        others = [l for l in range(2 * B) if l != k]
        ref += -(sim[k, k ^ 1] - torch.logsumexp(sim[k, others], 0))
    assert got == pytest.approx(float(ref) / (2 * B), rel=1e-5)


def test_negatives_off_without_paraphrases_is_unas_simcse_row_and_needs_no_statistics(tiny_bert_dir, corpus):
    """UNA Table 1 row 1 (SimCSE reproduced in UNA's loop): no negatives, the anchor's copy as positive."""
    una = get_method("una")
    assert una.requires(una.make_args({"negatives": False})) == ()
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    m = una(enc, tok, {"negatives": False}, MethodContext(max_len=32, seed=0, corpus=corpus))
    rows = _decode(m, m.build_batch(SENTS, step=0, micro=0))
    assert rows == [x for s in SENTS for x in (s, s)]
