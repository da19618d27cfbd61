"""The ``-code`` runs compute the authors' code (issue 38): each test takes the run's method arguments
from ``config/config.yaml``, computes its loss on a tiny random BERT and batch, and compares it with an
independent float64 implementation of the authors' computation written here from reading their code
(their code is not in this repository):

* PaSeR, chengzhipanpan/PaSeR @877ac00: ``paser/models.py`` ``cl_init`` (~l. 93-116: BartConfig with
  ``decoder_ffn_dim = hidden_size``, BART's dropout defaults, ``decoder.embed_tokens = bert.embeddings``,
  ``init_weights``) and ``cl_forward`` (~l. 210-240), ``train.py``'s collator (~l. 494-533: whole target
  dropped when s or s̃ has 32 tokens or more, decoder inputs = labels shifted right), transformers
  4.2.1's ``BartDecoder`` / ``BartDecoderLayer`` (post-LN; q scaled by head_dim^-1/2).
* InfoCSE, caskcsg/sentemb @5eeec55: ``InfoCSE/infocse/models_cls_mlm.py`` (``cl_init`` ``init_weights``,
  ``cl_forward``'s ``if cls.model_args.mlm_eval: cls.mlm.eval()`` ~l. 164) and its two scripts.
* UNA, ClaudiaShu/UNA @a2ae48c: ``model/models.py`` ``MLPLayer`` (~l. 15, PyTorch's Linear) and
  ``una.py``'s step (GradScaler only, no autocast, no gradient clipping).

Each test also runs with one switch set back to sentemb's default and checks that the comparison then
fails (``SWITCHES``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sentemb.config.load import find_run, load_config, method_args_of
from sentemb.methods import MethodContext, get_method

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6  # relative: the loss is equal in float64 up to the fp32 cross-entropy sentemb computes


@pytest.fixture(scope="module")
def paper_config():
    return load_config(ROOT / "config" / "config.yaml")


def code_args(config, name, backbone="bert-base-uncased"):
    return method_args_of(config, find_run(config, name, backbone))


# --------------------------------------------------------------------------------------------- PaSeR
LONG = "the quick fox " + " ".join(["word"] * 40)  # s and s̃ reach max_len: the code drops its target
SENTS = ["a man plays the guitar in the park", "the dog runs in the park", LONG, "she eats an apple in the house"]
PHRASES = [["man plays", "guitar"], ["dog runs", "park"], ["quick fox"], ["eats", "apple"]]


@pytest.fixture
def paser_setup(tmp_path):
    from test_paser import write_rake

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + "\n" for s in SENTS))
    return corpus, write_rake(tmp_path / "rake_top5.parquet", PHRASES)


def make_paser(model_dir, corpus, rake, args):
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(model_dir, pooling_layer=False)
    ctx = MethodContext(max_len=32, seed=3, backbone="tiny", model_dir=model_dir,
                        inputs={"rake": rake, "nltk": corpus.parent}, corpus=corpus)
    torch.manual_seed(0)
    return get_method("paser")(enc, tok, {**args, "eda": "none", "decoder_layers": 2}, ctx)


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _ce_mean(logits, labels):
    sel = labels != -100
    lg, lb = logits[sel], labels[sel]
    return (torch.logsumexp(lg, -1) - lg[torch.arange(len(lb)), lb]).mean()


def _bart_attention(x, kv, in_w, in_b, out_w, out_b, heads, causal):
    """transformers 4.2.1 BartAttention: q, k, v projections, q * head_dim^-1/2, softmax (attention
    dropout 0), output projection."""
    h = x.size(-1)
    d = h // heads
    q = (x @ in_w[:h].T + in_b[:h]) * d ** -0.5
    k = kv @ in_w[h:2 * h].T + in_b[h:2 * h]
    v = kv @ in_w[2 * h:].T + in_b[2 * h:]
    split = lambda t: t.view(t.size(0), t.size(1), heads, d).transpose(1, 2)  # noqa: E731
    s = split(q) @ split(k).transpose(-1, -2)
    if causal:
        t = x.size(1)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, -1) @ split(v)).transpose(1, 2).reshape(x.shape)
    return o @ out_w.T + out_b


def _lm_head(x, p, eps):
    """BertLMPredictionHead: dense, GELU, LayerNorm, vocabulary matrix + bias."""
    y = _ln(_gelu(x @ p["dense.weight"].T + p["dense.bias"]), p["LayerNorm.weight"], p["LayerNorm.bias"], eps)
    return y @ p["weight"].T + p["bias"]


def paser_reference_loss(m, batch, max_len=32):
    """The authors' ``cl_forward`` loss in float64 on sentemb's batch laid out their way (dropout off)."""
    st = {k: v.double() for k, v in m.state_dict().items()}
    cfg = m.encoder.config
    eps = cfg.layer_norm_eps
    h = cfg.hidden_size
    enc = m.encoder
    b = batch["mlm_input_ids"].size(0)
    ids, att = batch["input_ids"], batch["attention_mask"]
    cls = enc(input_ids=ids, attention_mask=att).last_hidden_state[:, 0].double()
    z1 = cls[:b]
    z2 = cls[b:] @ st["masked_proj.weight"].T + st["masked_proj.bias"]  # cls.projection
    t_w, k_w = m.args.signal_n, m.args.signal_m
    memory = torch.stack([t_w * (z1 * z2), k_w * (z1 - z2), z1, z2], 1)  # new_cls_emb
    # train.py: usable_sample = both s and s̃ shorter than 32 tokens; else labels all -100
    n_tok = att.sum(1)
    labels = torch.full((b, batch["dec_labels"].size(1)), -100, dtype=torch.long)
    for r, i in enumerate(batch["dec_rows"].tolist()):
        if n_tok[i] < max_len and n_tok[b + i] < max_len:
            labels[i] = batch["dec_labels"][r]
    # shift_tokens_right(labels, pad 0, start 101 = [CLS]); -100 -> pad
    dec_in = torch.cat([torch.full((b, 1), m.tokenizer.cls_token_id), labels[:, :-1]], 1)
    dec_in = dec_in.masked_fill(dec_in == -100, m.tokenizer.pad_token_id)
    t = dec_in.size(1)
    # BartDecoder: embed_tokens = BertEmbeddings (word + position + token type 0, LayerNorm), + BART positions
    x = st["encoder.embeddings.word_embeddings.weight"][dec_in] + st["encoder.embeddings.position_embeddings.weight"][:t]
    x = x + st["encoder.embeddings.token_type_embeddings.weight"][0]
    x = _ln(x, st["encoder.embeddings.LayerNorm.weight"], st["encoder.embeddings.LayerNorm.bias"], eps)
    x = x + st["decoder.embed_positions.weight"][:t]
    x = _ln(x, st["decoder.layernorm_embedding.weight"], st["decoder.layernorm_embedding.bias"], 1e-5)
    heads = m.args.decoder_heads
    for i in range(m.args.decoder_layers):
        p = {k[len(f"decoder.layers.layers.{i}."):]: v for k, v in st.items() if k.startswith(f"decoder.layers.layers.{i}.")}
        assert p["linear1.weight"].shape == (h, h), "decoder_ffn_dim = config.hidden_size (cl_init)"
        a = _bart_attention(x, x, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"],
                            p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"], heads, causal=True)
        x = _ln(x + a, p["norm1.weight"], p["norm1.bias"], 1e-5)
        a = _bart_attention(x, memory, p["multihead_attn.in_proj_weight"], p["multihead_attn.in_proj_bias"],
                            p["multihead_attn.out_proj.weight"], p["multihead_attn.out_proj.bias"], heads, causal=False)
        x = _ln(x + a, p["norm2.weight"], p["norm2.bias"], 1e-5)
        f = _gelu(x @ p["linear1.weight"].T + p["linear1.bias"]) @ p["linear2.weight"].T + p["linear2.bias"]
        x = _ln(x + f, p["norm3.weight"], p["norm3.bias"], 1e-5)
    head = {k[len("mlm_head."):]: v for k, v in st.items() if k.startswith("mlm_head.")}
    assert "weight" in head, "lm_head.decoder: its own matrix, not tied (BertForCL has no output embeddings)"
    gen = _ce_mean(_lm_head(x, head, eps), labels)  # cls.lm_head(decoder_outputs[0])
    hid = enc(input_ids=batch["mlm_input_ids"], attention_mask=att[:b]).last_hidden_state.double()
    mlm = _ce_mean(_lm_head(hid, head, eps), batch["mlm_labels"])
    return gen + m.args.mlm_weight * mlm


def paser_code_init_and_dropout(m):
    """What a dropout-off loss cannot see: ``cls.projection`` as ``init_weights`` leaves it
    (N(0, initializer_range), zero bias), and BART's dropout layout in training mode: BERT's embedding
    dropout, BART's embedding dropout, then per layer 0.1 on the three residual branches and 0 on the
    attention weights and the FFN activation (attention_dropout = activation_dropout = 0)."""
    cfg = m.encoder.config
    w, bias = m.masked_proj.weight, m.masked_proj.bias
    assert float(bias.abs().max()) == 0.0 and 0.7 < float(w.std()) / cfg.initializer_range < 1.3
    calls = []
    import torch.nn.functional as F

    drop, sdpa = F.dropout, F.scaled_dot_product_attention

    def rec_drop(x, p=0.5, training=True, inplace=False):
        calls.append(("dropout", round(float(p), 6), x.size(-1)))
        return drop(x, 0.0, training, inplace)

    def rec_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append(("attention", round(float(dropout_p), 6)))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal, **kw)

    m.train()
    ids = torch.tensor([[m.tokenizer.cls_token_id, 7, 8]])
    try:
        F.dropout, F.scaled_dot_product_attention = rec_drop, rec_sdpa
        m.decoder(ids, torch.ones_like(ids), torch.zeros(1, 4, cfg.hidden_size))
    finally:
        F.dropout, F.scaled_dot_product_attention = drop, sdpa
    h, p = cfg.hidden_size, m.args.decoder_dropout
    want = [("dropout", round(cfg.hidden_dropout_prob, 6), h), ("dropout", p, h)]
    for _ in range(m.args.decoder_layers):
        want += [("attention", 0.0), ("dropout", p, h), ("attention", 0.0), ("dropout", p, h),
                 ("dropout", 0.0, h), ("dropout", p, h)]  # FFN width = hidden size
    assert sorted(calls) == sorted(want)


def paser_gap(model_dir, setup, args):
    m = make_paser(model_dir, *setup, args)
    batch = m.build_batch(SENTS, lines=list(range(len(SENTS))), micro=1)
    m.double().eval()
    with torch.no_grad():
        ours = m.losses(batch)["loss"]
        ref = paser_reference_loss(m, batch)
    return m, float(ours), float(ref)


#: the switches to the authors' code and sentemb's default (the paper's reading or the former behaviour)
SWITCHES = {"paser": {"decoder_embeddings": "word", "decoder_dropout_layout": "torch", "decoder_ffn": 768,
                      "masked_linear_init": "torch", "target_truncation": "phrases"},
            "infocse-base": {"projection_init": "torch"},
            "infocse-large": {"projection_init": "torch", "aux_lower_eval": True},
            "una": {"mlp_init": "normal"}}


def test_paser_code_loss_equals_the_authors_cl_forward(tiny_bert_dir, paser_setup, paper_config):
    args = code_args(paper_config, "paser-code")
    m, ours, ref = paser_gap(tiny_bert_dir, paser_setup, args)
    assert abs(ours - ref) < TOL * abs(ref) and ours > 0  # sentemb casts the logits to fp32 for the CE
    paser_code_init_and_dropout(make_paser(tiny_bert_dir, *paser_setup, args))


@pytest.mark.parametrize("switch", sorted(SWITCHES["paser"]))
def test_paser_code_comparison_fails_with_a_switch_set_back(tiny_bert_dir, paser_setup, paper_config, switch):
    args = {**code_args(paper_config, "paser-code"), switch: SWITCHES["paser"][switch]}
    with pytest.raises(AssertionError):
        m, ours, ref = paser_gap(tiny_bert_dir, paser_setup, args)
        assert abs(ours - ref) < TOL * abs(ref)
        paser_code_init_and_dropout(make_paser(tiny_bert_dir, *paser_setup, args))


# ------------------------------------------------------------------------------------------- InfoCSE
def infocse_code_checks(m):
    """``cl_init``'s ``init_weights``: the BatchNorm projection's Linear layers N(0, initializer_range)
    (BatchNorm untouched); with ``--mlm_eval`` absent (large script) the frozen copy ``cls.mlm`` stays in
    the training mode the Trainer puts the model in: its dropout draws (two passes differ)."""
    std = m.encoder.config.initializer_range
    for lin in (x for x in m.mlp.modules() if isinstance(x, torch.nn.Linear)):
        assert lin.bias is None and 0.7 < float(lin.weight.std()) / std < 1.3
    m.train()
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    with torch.no_grad():
        a = m.aux_lower(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        b = m.aux_lower(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    return bool((a - b).abs().max() > 0)  # True: training mode (dropout on)


@pytest.mark.parametrize("backbone,train_mode", [("bert-base-uncased", False), ("bert-large-uncased", True)])
def test_infocse_code_init_and_frozen_copy_mode(tiny_bert_dir, paper_config, backbone, train_mode):
    args = {**code_args(paper_config, "infocse-code", backbone), "skip_from": 1, "init": "backbone"}
    torch.manual_seed(0)
    m = get_method("infocse")(*_encoder(tiny_bert_dir), args, MethodContext(max_len=16, seed=3, backbone="tiny",
                                                                             model_dir=tiny_bert_dir))
    assert infocse_code_checks(m) is train_mode
    run = find_run(paper_config, "infocse-code", backbone)
    assert run.train["precision"] == "fp16"  # both scripts pass --fp16 (HF Trainer: autocast + GradScaler)
    key = "infocse-large" if train_mode else "infocse-base"
    for switch, back in SWITCHES[key].items():  # each switch set back: a check fails
        torch.manual_seed(0)
        m = get_method("infocse")(*_encoder(tiny_bert_dir), {**args, switch: back},
                                  MethodContext(max_len=16, seed=3, backbone="tiny", model_dir=tiny_bert_dir))
        with pytest.raises(AssertionError):
            assert infocse_code_checks(m) is train_mode


def _encoder(model_dir):
    from sentemb.model.backbone import load_encoder

    return load_encoder(model_dir, pooling_layer=False)


# ----------------------------------------------------------------------------------------------- UNA
def una_code_checks(m, run):
    """``MLPLayer``'s ``nn.Linear`` as PyTorch builds it: weights and bias uniform within 1/sqrt(h),
    the bias non-zero; fp32 (``--fp16_precision`` only enables a GradScaler, no autocast) and no
    gradient clipping (``una.py``: ``scaler.step`` straight after ``backward``)."""
    w, b = m.mlp.dense.weight, m.mlp.dense.bias
    bound = 1 / math.sqrt(w.size(1))
    assert float(b.abs().max()) > 0 and float(w.abs().max()) <= bound and float(w.std()) > 0.5 * bound / math.sqrt(3)
    assert run.train["precision"] == "fp32" and run.train["grad_clip"] is None


def test_una_code_mlp_init_precision_and_clipping(tiny_bert_dir, tmp_path, paper_config):
    run = find_run(paper_config, "una-code", "bert-base-uncased")
    args = {**code_args(paper_config, "una-code"), "paraphrase": False, "negatives": False}
    ctx = MethodContext(max_len=32, seed=0, inputs={}, corpus=None)
    torch.manual_seed(0)
    una_code_checks(get_method("una")(*_encoder(tiny_bert_dir), args, ctx), run)
    torch.manual_seed(0)
    with pytest.raises(AssertionError):
        una_code_checks(get_method("una")(*_encoder(tiny_bert_dir), {**args, **SWITCHES["una"]}, ctx), run)
