"""Bounded step shapes (issue 36 §2, ``train.buckets``, ``sentemb.data.buckets``).

* the bucket arithmetic (``resolve_buckets``, ``bucket_width`` with and without a group's limit,
  ``pad_to``, ``padding_overhead``, ``batch_shapes`` / ``count_shapes``) against hand-written values;
* ``mask_tokens(width=)``: the MLM draws of a bucket-padded batch are those of the unpadded one;
* per method, on the tiny random BERT and RoBERTa, with every dropout off and in fp32: a batch built
  with buckets is the batch built without, padded (its real columns equal, its padding columns the
  key's padding value: pad id, 0, -100), every width of it is a bucket (or the doubled ladder up to
  the group's own limit past ``max_len``), and every logged loss term is the same to 1e-5;
* ``realdata``: over one length-sampled epoch of 50 batches of 64 wiki1m sentences (all-MiniLM-L6-v2's
  tokenizer), every method meets at most 8 widths per group with ``buckets: auto`` resolved for
  CUDA at ``max_len`` 512 and 32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentemb import SentembError, testing
from sentemb.data.buckets import (AUTO_LADDER, batch_shapes, batch_widths, bucket_width, count_shapes, next_width,
                                  pad_to, padding_overhead, resolve_buckets)
from sentemb.methods import MethodContext, get_method
from sentemb.methods.base import WEIGHTED
from sentemb.methods.masking import mask_tokens


# ------------------------------------------------------------------------------------ arithmetic
def test_resolve_buckets():
    assert resolve_buckets("auto", 512, "cuda") == AUTO_LADDER == (24, 32, 48, 64, 96, 128, 256, 512)
    assert resolve_buckets("auto", 32, "cuda") == (24, 32)
    assert resolve_buckets("auto", 40, "cuda") == (24, 32, 40)
    assert resolve_buckets("auto", 16, "cuda") == (16,)
    assert resolve_buckets("auto", 32, "cpu") is None and resolve_buckets("none", 32) is None
    assert resolve_buckets([64, 8, 8, 100], 32, "cpu") == (8, 32)
    with pytest.raises(SentembError):
        resolve_buckets([0], 32)
    assert all(w % 8 == 0 for w in AUTO_LADDER) and len(AUTO_LADDER) <= 8


def test_bucket_width_and_the_ladder_past_the_last_bucket():
    b = (16, 24, 32)
    assert [bucket_width(n, b) for n in (1, 16, 17, 24, 25, 32)] == [16, 16, 24, 24, 32, 32]
    assert bucket_width(33, b) == 33 and bucket_width(7, None) == 7  # no limit / no buckets: n unchanged
    # with the group's own limit the widths go on in half-octaves (2^k, 3·2^k) past max_len, capped at it
    assert [next_width(w) for w in (2, 3, 4, 16, 24, 32, 40, 48, 64, 96, 100, 384)] == \
        [3, 4, 6, 24, 32, 48, 48, 64, 96, 128, 128, 512]
    got = [bucket_width(n, b, 512) for n in (33, 48, 49, 65, 97, 129, 193, 257, 385, 512)]
    assert got == [48, 48, 64, 96, 128, 192, 256, 384, 512, 512]
    assert [bucket_width(n, b, 78) for n in (40, 70, 78)] == [48, 78, 78]
    assert bucket_width(600, b, 512) == 600  # beyond the limit: never cut a row
    assert bucket_width(20, b, 512) == 24  # within the buckets a limit above them plays no part
    # a limit below the covering bucket cuts it (PaSeR's max_target_len 20 under buckets 16, 24, 32)
    assert [bucket_width(n, b, 20) for n in (12, 17, 20, 21)] == [16, 20, 20, 24]
    assert bucket_width(41, (24, 40), 512) == 48  # a last bucket off the series joins it
    # at most 1.5 times the longest row past the buckets, and a bucket's own worst case below them
    assert all(bucket_width(n, b, 512) <= 1.5 * n for n in range(33, 513))


def test_pad_to_and_padding_overhead():
    t = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(pad_to(t, 4, 9), torch.tensor([[1, 2, 9, 9], [3, 4, 9, 9]]))
    assert pad_to(t, 2, 9) is t and pad_to(t, 1, 9) is t
    # groups of widths 10 (3 rows) and 20 (1 row) padded to 16 and 24: (16·3 + 24) / (10·3 + 20)
    assert padding_overhead([10, 20], [3, 1], (16, 24, 32)) == pytest.approx(72 / 50)
    assert padding_overhead([10, 20], None, None) == 1.0


def test_batch_shapes_names_each_group_and_refuses_two_widths_in_one():
    batch = {"input_ids": torch.zeros(4, 16), "attention_mask": torch.zeros(4, 16), "mlm_labels": torch.zeros(2, 16),
             "tri_input_ids": torch.zeros(6, 64), "tri_index": torch.zeros(2), "negatives": torch.tensor(3),
             "dec_input_ids": torch.zeros(0, 24)}
    groups = {"tri_": "triplets", "dec_": "decoder"}
    assert batch_shapes(batch, groups) == {"sentences": (4, 16), "triplets": (6, 64)}  # no decoder rows: no shape
    assert batch_widths(batch, groups) == {"sentences": 16, "triplets": 64}
    with pytest.raises(SentembError, match="sentences"):  # without groups all are "sentences": two widths refused
        batch_widths(batch)

    class M:
        width_groups = groups

    other = {**batch, "input_ids": torch.zeros(4, 24), "attention_mask": torch.zeros(4, 24),
             "mlm_labels": torch.zeros(2, 24)}
    assert count_shapes(M(), [batch, other, batch]) == {"sentences": [16, 24], "triplets": [64]}
    assert count_shapes(M(), [batch, other], rows=True) == {"sentences": [(4, 16), (4, 24)], "triplets": [(6, 64)]}


def test_mask_tokens_draws_over_the_real_width_only():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, (4, 7))
    maskable = np.ones((4, 7), dtype=bool)
    maskable[2, 5:] = False  # a shorter row
    plain = mask_tokens(ids, maskable, 0.4, np.random.default_rng(1), 4, 50)
    padded_ids = np.concatenate([ids, np.zeros((4, 5), dtype=ids.dtype)], 1)
    padded_mask = np.concatenate([maskable, np.zeros((4, 5), dtype=bool)], 1)
    x, y = mask_tokens(padded_ids, padded_mask, 0.4, np.random.default_rng(1), 4, 50, width=7)
    assert np.array_equal(x[:, :7], plain[0]) and np.array_equal(y[:, :7], plain[1])
    assert (x[:, 7:] == 0).all() and (y[:, 7:] == -100).all()
    # the draws over the padded shape would differ: the width is what keeps them
    x2, _ = mask_tokens(padded_ids, padded_mask, 0.4, np.random.default_rng(1), 4, 50)
    assert not np.array_equal(x2[:, :7], plain[0])
    words = np.tile(np.arange(7), (4, 1))
    pw = np.concatenate([words, -np.ones((4, 5), dtype=int)], 1)
    wx, wy = mask_tokens(padded_ids, padded_mask, 0.4, np.random.default_rng(2), 4, 50, pw, width=7)
    px, py = mask_tokens(ids, maskable, 0.4, np.random.default_rng(2), 4, 50, words)
    assert np.array_equal(wx[:, :7], px) and np.array_equal(wy[:, :7], py)


# ------------------------------------------------------------------------------------ per method
#: per backbone: max_len, the run's bucket list (resolved with max_len), words of the short batch's lines
BACKBONES = {"bert": (16, [6, 10, 14], 9), "roberta": (64, [24, 48], 8)}
#: the arguments of each case: the contract's, without inputs that need a stage or WordNet
CASES = {"simcse": {}, "sarcse": {}, "arccse": {"triplet_margin": 0.5}, "una": {}, "infocse": {"init": "backbone"},
         "paser": {"eda": "rs"}, "infocse-pretrain": {"init": "backbone", "pretrain": {"mask_unit": "word"}},
         # decoder positions below the bucket that holds a target: the bucket is cut to them
         "paser-short-targets": {"eda": "rs", "max_target_len": 9}}
REL = 1e-5
DEBUG = False


@pytest.fixture(scope="module")
def worlds(tiny_bert_dir, tiny_roberta_dir, tiny_senteval, tmp_path_factory):
    made = {}

    def get(case, backbone):
        if (case, backbone) not in made:
            name = case.split("-")[0]
            cls = get_method(name)
            args = {**cls.contract_args, **CASES[case]}
            model = tiny_bert_dir if backbone == "bert" else tiny_roberta_dir
            made[case, backbone] = testing.harness(cls, tmp_path_factory.mktemp(f"b_{case}_{backbone}"), args=args,
                                                   model_dir=model, senteval=tiny_senteval)
        return made[case, backbone]

    return get


def build(h, case, max_len):
    """The method of ``case`` on the harness's encoder, every dropout off (encoder, method's own), train mode."""
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(h.model_dir, dropout=0.0, pooling_layer=False)
    ctx = MethodContext(max_len=max_len, seed=3, backbone="tiny", model_dir=h.model_dir, inputs=h.inputs,
                        corpus=h.corpus)
    cls = h.cls.pretrain_stage if case.endswith("-pretrain") else h.cls
    torch.manual_seed(0)
    m = cls(enc, tok, {**h.args, **h.cls.contract_no_dropout}, ctx)
    return m.train()


def pad_value(key, tok):
    """The padding value of a batch key, by its name (independent of the methods' code)."""
    if key.endswith("labels"):
        return -100
    if key.endswith("input_ids"):
        return tok.pad_token_id
    return 0


def limits(m, max_len):
    """The group's longest width past the last bucket (None: never past it)."""
    out = {"sentences": None}
    if m.name == "arccse":
        out["triplets"] = m._triplet_len()
    if m.name == "paser" and hasattr(m, "decoder"):
        out["decoder"] = m.args.max_target_len
    return out


def terms(out):
    flat = {k: float(v) for k, v in out.items() if k != WEIGHTED}
    flat.update({f"w/{k}": float(v) for k, v in out[WEIGHTED].items()})
    return flat


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_buckets_pad_and_change_no_loss(case, backbone, worlds):
    """With buckets a batch is the unbucketed one padded with each key's padding value, its widths are
    buckets, and with dropout off every logged term equals the unbucketed batch's to 1e-5."""
    h = worlds(case, backbone)
    max_len, listed, short_words = BACKBONES[backbone]
    buckets = resolve_buckets(listed, max_len, "cpu")
    m = build(h, case, max_len)
    tok = m.tokenizer
    corpus = h.corpus.read_text("utf-8").splitlines()
    short = [i for i, s in enumerate(corpus) if len(s.split()) <= short_words][:6]
    long = short[:3] + [i for i, s in enumerate(corpus) if len(s.split()) >= 25][:3]
    assert len(short) == 6 and len(long) == 6
    grew, past, cut = set(), set(), set()
    for micro, lines in enumerate((short, long)):
        sents = [corpus[i] for i in lines]
        m.ctx.buckets = None
        plain = m.build_batch(sents, step=0, lines=lines, micro=micro)
        m.ctx.buckets = buckets
        padded = m.build_batch(sents, step=0, lines=lines, micro=micro)
        assert plain.keys() == padded.keys()
        for k, v in plain.items():
            p = padded[k]
            if v.dim() < 2:
                assert torch.equal(p, v), k
                continue
            w0 = v.size(1)
            assert p.size(0) == v.size(0) and p.size(1) >= w0, k
            assert torch.equal(p[:, :w0], v), f"{k}: the real columns differ"
            assert (p[:, w0:] == pad_value(k, tok)).all(), f"{k}: padded with other than {pad_value(k, tok)}"
        plain_w = batch_widths(plain, m.width_groups)
        lim = limits(m, max_len)
        for g, w in batch_widths(padded, m.width_groups).items():
            ladder = set()  # past the last bucket: 2^k or 3·2^k up to the group's limit, or the limit
            if lim.get(g):
                ladder = {lim[g]} | {v for k in range(3, 10) for v in (2 ** k, 3 * 2 ** (k - 1))
                                     if buckets[-1] < v <= lim[g]}
            assert w in set(buckets) | ladder, f"{g}: width {w} is not a bucket {buckets} nor past them {sorted(ladder)}"
            assert w == bucket_width(plain_w[g], buckets, lim.get(g))
            if lim.get(g) and w == lim[g] and w not in buckets:
                cut.add(g)
            if w > plain_w[g]:
                grew.add(g)
            if w > max_len:
                past.add(g)
        with torch.no_grad():
            a, b = terms(m.losses(plain)), terms(m.losses(padded))
            # the sentence embeddings and per-sentence states themselves (the losses of a random
            # tiny model are near log B, little moved by its embeddings): those of one shape
            ea, eb = m.encode(plain), m.encode(padded)
            ref = {**{f"batch/{k}": v for k, v in ea.batch.items()}, **{f"rows/{k}": v for k, v in ea.rows.items()}}
            got = {**{f"batch/{k}": v for k, v in eb.batch.items()}, **{f"rows/{k}": v for k, v in eb.rows.items()}}
            if m.name == "arccse" and plain["tri_index"].numel():
                ref["triplets"], got["triplets"] = m.encode_triplets(plain), m.encode_triplets(padded)
            same = [k for k, v in ref.items() if isinstance(v, torch.Tensor) and v.shape == got[k].shape]
            assert same or case == "infocse-pretrain", "no embedding to compare"
            testing.close({k: got[k] for k in same}, {k: ref[k] for k in same}, f"{case}/{backbone} micro {micro}")
        assert a.keys() == b.keys()
        if DEBUG:
            print(case, backbone, micro, plain_w, batch_widths(padded, m.width_groups), a)
        for k in a:
            assert math.isfinite(a[k]) and abs(a[k] - b[k]) <= REL * max(abs(a[k]), abs(b[k])) + 1e-7, \
                f"{case}/{backbone} micro {micro}: {k} {a[k]!r} without buckets, {b[k]!r} with"
    assert "sentences" in grew, "no batch was padded: the test proves nothing"
    if case == "arccse":
        assert "triplets" in grew and (backbone == "roberta" or "triplets" in past)
    if case == "paser-short-targets":
        assert cut, "no decoder row met a bucket above max_target_len: the case proves nothing"


# ------------------------------------------------------------------------------------ real batches
N_LINES, BATCH = 3200, 64  # one length-sampled epoch of 50 batches


@pytest.fixture(scope="module")
def real_world(shared, tmp_path_factory):
    """The first 3200 wiki1m lines as a corpus, and the inputs a method reads built on it (on demand)."""
    from sentemb.stats.inputs import build_input

    d = tmp_path_factory.mktemp("wiki")
    lines = (shared / "data" / "wiki1m_head.txt").read_text("utf-8").splitlines()[:N_LINES]
    corpus = d / "corpus.txt"
    corpus.write_text("".join(x + "\n" for x in lines), "utf-8")
    model = shared / "models" / "all-MiniLM-L6-v2"
    built = {}

    def inputs(cls, args):
        for n in cls.requires(cls.make_args(args)):
            if n not in built:
                built[n] = build_input(n, d / n, corpus, model)
        return dict(built)

    return lines, corpus, model, inputs


REAL_ARGS = {"simcse": {}, "sarcse": {}, "arccse": {}, "una": {}, "infocse": {"init": "backbone", "skip_from": 3},
             "paser": {"eda": "none"}}


@pytest.mark.realdata
@pytest.mark.parametrize("name", sorted(REAL_ARGS))
def test_real_batches_meet_few_widths(name, real_world):
    """Issue 36 §2: over 50 length-sampled batches of 64 wiki1m sentences every group of every method
    has at most 8 widths with ``buckets: auto`` (CUDA) at max_len 512 (base runs) and 32 (large)."""
    from sentemb.model.backbone import load_encoder
    from sentemb.train.loop import batch_schedule, sentence_lengths

    lines, corpus, model, inputs = real_world
    enc, tok = load_encoder(model, pooling_layer=False)
    cls = get_method(name)
    ctx = MethodContext(max_len=512, seed=1, backbone="minilm", model_dir=model, inputs=inputs(cls, REAL_ARGS[name]),
                        corpus=corpus)
    m = cls(enc, tok, REAL_ARGS[name], ctx)
    order = batch_schedule(len(lines), BATCH, 1, 1, sentence_lengths(lines))
    assert len(order) == N_LINES // BATCH == 50
    for max_len in (512, 32):
        m.ctx.max_len, m.ctx.buckets = max_len, resolve_buckets("auto", max_len, "cuda")
        batches = [m.build_batch([lines[i] for i in idx], step=k, lines=[int(i) for i in idx], micro=k)
                   for k, idx in enumerate(order)]
        seen = count_shapes(m, batches)
        assert "sentences" in seen and all(len(w) <= 8 for w in seen.values()), (max_len, seen)
        assert set(seen["sentences"]) <= set(m.ctx.buckets), (max_len, seen)
        if name == "arccse":
            assert "triplets" in seen
