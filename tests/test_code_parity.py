"""The ``-code`` runs compute the authors' code (issue 38): each test takes the run's method arguments
from ``config/config.yaml``, computes its loss on a tiny random BERT and batch, and compares it with an
independent float64 implementation of the authors' computation written here from reading their code
(their code is not in this repository):

* PaSeR, chengzhipanpan/PaSeR @877ac00: ``paser/models.py`` ``cl_init`` (~l. 93-116: BartConfig with
  ``decoder_ffn_dim = hidden_size``, BART's dropout defaults, ``decoder.embed_tokens = bert.embeddings``,
  ``init_weights``) and ``cl_forward`` (~l. 210-240), ``train.py``'s collator (~l. 494-533: whole target
  dropped when s or s̃ has 32 tokens or more, decoder inputs = labels shifted right), transformers
  4.2.1's ``BartDecoder`` / ``BartDecoderLayer`` (post-LN; q scaled by head_dim^-1/2).
* InfoCSE, caskcsg/sentemb @5eeec55: ``InfoCSE/infocse/models_cls_mlm.py`` (``ProjectionMLP``,
  ``cl_init``'s ``init_weights``, ``cl_forward`` ~l. 118-262: the (bs, 2, len) layout, ``cls.mlm`` under
  no_grad and ``.eval()`` only with ``--mlm_eval``, ``c_head`` + ``lm_head`` on [CLS; skip states],
  InfoNCE, ``loss += mlm_weight * mlm_loss``), ``train_cls_mlm.py``'s loading (~l. 400-418) and its
  two scripts (``--temp 0.05 --mlm_weight 0.00001 --batchnorm``; ``--mlm_eval`` on base only). The
  model runs in training mode as a training step does, its dropout made deterministic and
  view-dependent (``scaled_dropout``): the BatchNorm on batch statistics and the frozen copy's mode
  both show in the loss.
* UNA, ClaudiaShu/UNA @a2ae48c: ``model/models.py`` ``MLPLayer`` (~l. 7, PyTorch's Linear + Tanh),
  ``una.py`` (``tokenize`` ~l. 74: [anchor, positive, anchor_hn, positive_hn] per sample padded to
  ``max_len``; ``simcse_unsup_loss`` ~l. 47; the step: GradScaler only, no autocast, no gradient
  clipping), ``data/dataset.py`` (``positive_hn`` = a copy of ``anchor_hn``) and
  ``script/run_bertbase_una.sh`` (``--temperature 0.05 --max_len 32 --aug_every_n_steps 5``).

The tiny BERT's matrices are redrawn larger for UNA and InfoCSE (``spread_``): at BERT's 0.02 every
[CLS] is nearly the same vector and a contrastive loss ~log(rows) would check little. What a loss on
the model's own weights cannot see (an initialisation, the run's precision) is checked beside it.
``max_target_len: 32`` of paser-code is checked on a target that would be longer.

Each test also runs with one switch set back to sentemb's default and checks that the comparison then
fails (``SWITCHES``)."""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from sentemb.config.load import find_run, load_config, method_args_of
from sentemb.methods import MethodContext, get_method

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6  # relative: the loss is equal in float64 up to the fp32 cross-entropy sentemb computes
TOL_FP32 = 1e-5  # UNA and InfoCSE cast the embeddings to fp32 for the similarities (logits up to 1/τ = 20)


@pytest.fixture(scope="module")
def paper_config():
    return load_config(ROOT / "config" / "config.yaml")


def code_args(config, name, backbone="bert-base-uncased"):
    return method_args_of(config, find_run(config, name, backbone))


# --------------------------------------------------------------------------------------------- PaSeR
LONG = "the quick fox " + " ".join(["word"] * 40)  # s and s̃ reach max_len: the code drops its target
SENTS = ["a man plays the guitar in the park", "the dog runs in the park", LONG, "she eats an apple in the house",
         "so it is"]
PHRASES = [["man plays", "guitar"], ["dog runs", "park"], ["quick fox"], ["eats", "apple"], []]  # the last: no phrase


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
        if PHRASES[i] and n_tok[i] < max_len and n_tok[b + i] < max_len:
            labels[i] = batch["dec_labels"][r]
    # a line without a phrase: its empty target cell is read as " " (train.py), tokenized [CLS] [SEP]:
    # one label, [SEP]
    for i in range(b):
        if not PHRASES[i] and n_tok[i] < max_len and n_tok[b + i] < max_len:
            labels[i, 0] = m.tokenizer.sep_token_id
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
    w, bias = m.masked_proj.weight.detach(), m.masked_proj.bias.detach()
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
                      "masked_linear_init": "torch", "target_truncation": "phrases", "empty_target": "none"},
            "infocse-base": {"projection_init": "torch", "head_init": "pretrained"},
            "infocse-large": {"projection_init": "torch", "aux_lower_eval": True, "head_init": "pretrained"},
            "una": {"mlp_init": "normal"}}


def test_paser_code_loss_equals_the_authors_cl_forward(tiny_bert_dir, paser_setup, paper_config):
    args = code_args(paper_config, "paser-code")
    assert args["eda_draw"] == "once"  # EDA applied offline (the code's README): test_paser.py checks the switch
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


def test_paser_code_targets_stop_at_32_tokens(tiny_bert_dir, tmp_path, paper_config):
    """``max_target_len: 32`` of paser-code takes effect: a 29-word sentence (s: 31 tokens, kept by
    ``target_truncation: sentence``) whose five phrases would make a 35-token target [CLS] p1 [SEP] …
    p5 [SEP]. paser-code's ``target_cut: tokens`` cuts it as the code's tokenizer truncates its target
    column at max_seq_length 32 (reference: the tokenizer's own truncation of "p1 [SEP] … p5");
    ``phrases`` keeps the first four whole (29 tokens); at sentemb's default 64 all five stay."""
    from test_paser import write_rake

    phrases = ["the man plays the guitar piano", "in the park and the dog", "runs in the big red car",
               "with the old blue house tree", "on the small new street"]
    sentence = " ".join(phrases)
    assert len(sentence.split()) == 29
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sentence + "\n")
    rake = write_rake(tmp_path / "rake_top5.parquet", [phrases])
    args = code_args(paper_config, "paser-code")
    assert args["max_target_len"] == 32 and args["target_cut"] == "tokens"
    targets = {}
    for cap, cut in ((32, "tokens"), (32, "phrases"), (64, "tokens"), (64, "phrases")):
        m = make_paser(tiny_bert_dir, corpus, rake, {**args, "max_target_len": cap, "target_cut": cut})
        batch = m.build_batch([sentence], lines=[0], micro=0)
        assert int(batch["attention_mask"][0].sum()) == 31 and batch["dec_rows"].tolist() == [0]
        labels = batch["dec_labels"][0]
        targets[cap, cut] = [m.tokenizer.cls_token_id] + labels[labels != -100].tolist()  # labels = target[1:]
    tok = make_paser(tiny_bert_dir, corpus, rake, args).tokenizer
    whole = tok(f" {tok.sep_token} ".join(phrases))["input_ids"]
    assert len(whole) == 35 and targets[64, "tokens"] == targets[64, "phrases"] == whole
    assert targets[32, "tokens"] == tok(f" {tok.sep_token} ".join(phrases), max_length=32, truncation=True)["input_ids"]
    assert len(targets[32, "tokens"]) == 32 and targets[32, "tokens"][-2] != tok.sep_token_id  # cut mid-phrase
    assert targets[32, "phrases"] == whole[:29] and len(targets[32, "phrases"]) == 1 + 4 * 7


# ------------------------------------------------------------------------------------------- InfoCSE
#: Infocse-bert-base.sh / InfoCSE-bert-large.sh: --temp 0.05 --mlm_weight 0.00001, --batchnorm, --do_mlm;
#: --mlm_eval in the base script only
INFOCSE_SCRIPT = {"temp": 0.05, "mlm_weight": 1e-5, "mlm_eval": {"bert-base-uncased": True, "bert-large-uncased": False}}
INFOCSE_SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat",
                 "she eats an apple", "the quick fox"]


@contextmanager
def scaled_dropout(view):
    """Dropout made deterministic but still mode- and view-dependent: in training mode row r is scaled
    by 1 + p·(1 + 4·view[r]) (``view``: which dropout view, 0 or 1, each row of every forward is), in
    eval mode left alone (attention-probability dropout off). Both sides then compute one function in
    training mode, with two distinct views (identical views would leave L_cl ≈ 0) and the BatchNorm
    projection on batch statistics as in a training step, and a module's mode shows in the loss."""
    import torch.nn.functional as F

    drop, sdpa = F.dropout, F.scaled_dot_product_attention

    def scaled(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        assert x.size(0) == len(view), "every dropout call runs over the 2B rows"
        return x * (1 + p * (1 + 4 * view.to(x.dtype))).view(-1, *[1] * (x.dim() - 1))

    def no_drop(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal, **kw)

    F.dropout, F.scaled_dot_product_attention = scaled, no_drop
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = drop, sdpa


def _bn_train(x, w=None, b=None, eps=1e-5):
    """nn.BatchNorm1d in training mode: batch mean and biased variance."""
    y = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + eps)
    return y if w is None else y * w + b


def infocse_reference_loss(m, batch, mlm_eval):
    """``cl_forward`` (models_cls_mlm.py) in float64, the model in training mode as the HF Trainer puts
    it: input_ids (bs, num_sent = 2, len) flattened sentence by sentence; mlm_input_ids = the collator's
    masked copy of that tensor, one per view; ``cls.mlm`` (a BertForMaskedLM of ``skip_from`` layers)
    under no_grad, ``.eval()`` first when the script passes ``--mlm_eval``; ``c_head`` (BertLayers) on
    [view's last-layer [CLS]; mlm hidden_states[-1][:, 1:]] with the extended attention mask;
    ``lm_head`` (BertLMPredictionHead) and CrossEntropyLoss (mean over the labels ≠ -100); the pooler
    ``cls`` + ``ProjectionMLP`` over all bs·2 rows; Similarity(temp) and CrossEntropyLoss against arange;
    loss = cl + mlm_weight·mlm. Sentence i's masked copy k is sentemb's row k·B + i."""
    from transformers.models.bert.modeling_bert import BertLayer, BertModel

    cfg, a = m.encoder.config, m.args
    bsz = batch["input_ids"].size(0)
    ids, att, tt = (batch[k].repeat_interleave(2, 0) for k in ("input_ids", "attention_mask", "token_type_ids"))
    order = torch.arange(2 * bsz).view(2, bsz).T.reshape(-1)  # (bs, 2) flattened: s1 v1, s1 v2, s2 v1, ...
    mlm_ids, mlm_labels = batch["mlm_input_ids"][order], batch["mlm_labels"][order]
    out = m.encoder(ids, attention_mask=att, token_type_ids=tt, return_dict=True)
    c = copy.deepcopy(cfg)
    c.num_hidden_layers = a.skip_from
    mlm = BertModel(c, add_pooling_layer=False)
    mlm.load_state_dict(m.aux_lower.state_dict())
    mlm.double().train()  # the Trainer's model.train()
    if mlm_eval:
        mlm.eval()
    with torch.no_grad():
        mo = mlm(mlm_ids, attention_mask=att, token_type_ids=tt, output_hidden_states=True, return_dict=True)
    hiddens = torch.cat([out.last_hidden_state[:, :1], mo.hidden_states[-1][:, 1:].detach()], 1).double()
    ext = (1.0 - att[:, None, None, :].double()) * torch.finfo(torch.float64).min
    for i in range(a.head_layers):
        layer = BertLayer(cfg)
        layer.load_state_dict(m.aux_head[i].state_dict())
        o = layer.double().train()(hiddens, ext)
        hiddens = o[0] if isinstance(o, tuple) else o
    st = {k[len("cls.predictions."):]: v.double() for k, v in m.aux_mlm.bert_state().items()}
    head = {"dense.weight": st["transform.dense.weight"], "dense.bias": st["transform.dense.bias"],
            "LayerNorm.weight": st["transform.LayerNorm.weight"], "LayerNorm.bias": st["transform.LayerNorm.bias"],
            "weight": st["decoder.weight"], "bias": st["bias"]}
    mlm_loss = _ce_mean(_lm_head(hiddens, head, cfg.layer_norm_eps), mlm_labels)
    p = {k: v.double() for k, v in m.mlp.net.state_dict().items()}  # ProjectionMLP.net
    x = out.last_hidden_state[:, 0].double() @ p["0.weight"].T
    x = _bn_train(torch.relu(_bn_train(x, p["1.weight"], p["1.bias"])) @ p["3.weight"].T)
    x = x / x.norm(dim=-1, keepdim=True)
    cos = x[0::2] @ x[1::2].T / INFOCSE_SCRIPT["temp"]
    cl = (torch.logsumexp(cos, -1) - cos.diagonal()).mean()
    return cl, mlm_loss, cl + INFOCSE_SCRIPT["mlm_weight"] * mlm_loss


def make_infocse(model_dir, args):
    torch.manual_seed(0)
    m = get_method("infocse")(*_encoder(model_dir), args, MethodContext(max_len=16, seed=3, backbone="tiny",
                                                                      model_dir=model_dir))
    spread_(m.encoder, 0.3, 0.1)  # L_cl ≈ 0.34 with the views below, and the lower copy's mode visible in L_aux
    m.aux_lower.load_state_dict(m.encoder.state_dict(), strict=False)  # the frozen copy of the same weights
    return m


def infocse_gap(m, backbone):
    batch = m.build_batch(INFOCSE_SENTS, micro=0)
    assert int((batch["mlm_labels"] != -100).sum()) > 0
    m.double().train()
    b = len(INFOCSE_SENTS)
    with torch.no_grad():
        with scaled_dropout(torch.arange(2 * b) // b):  # sentemb: the views one after the other
            t = m.losses(batch)
        with scaled_dropout(torch.arange(2 * b) % 2):  # the code: sentence by sentence
            ref = infocse_reference_loss(m, batch, INFOCSE_SCRIPT["mlm_eval"][backbone])
    return [float(t[k]) for k in ("contrastive", "aux_mlm", "loss")], [float(x) for x in ref]


def infocse_code_checks(m, model_dir):
    """What a loss on the model's own weights cannot see: ``cl_init``'s ``init_weights`` leaves the
    BatchNorm projection's Linear layers N(0, initializer_range) (BatchNorm untouched), and ``c_head``
    keeps that draw: the scripts' Hub checkpoints hold none, so ``train_cls_mlm.py`` loads no
    ``model.pt`` (``head_init: random``; here not the backbone's upper layers of ``init: backbone``)."""
    std = m.encoder.config.initializer_range
    for lin in (x for x in m.mlp.modules() if isinstance(x, torch.nn.Linear)):
        assert lin.bias is None and 0.7 < float(lin.weight.detach().std()) / std < 1.3
    top = _encoder(model_dir)[0].encoder.layer[-len(m.aux_head):].state_dict()
    for k, v in m.aux_head.state_dict().items():
        if v.dim() == 2:
            assert not torch.equal(v, top[k]) and 0.7 < float(v.std()) / std < 1.3, k


def infocse_code_compare(model_dir, args, backbone):
    infocse_code_checks(make_infocse(model_dir, args), model_dir)
    ours, ref = infocse_gap(make_infocse(model_dir, args), backbone)
    for o, r in zip(ours, ref):  # L_cl, L_aux and the total, each
        assert abs(o - r) < TOL_FP32 * abs(r) and o > 0, (ours, ref)


def _infocse_args(config, backbone):
    # tiny: 2 layers; its checkpoint has no MLM head, so the backbone's own path (init: backbone) stands in for
    # aux_checkpoint: model, which loads the same three parts from the run's model (tests/test_infocse.py)
    return {**code_args(config, "infocse-code", backbone), "skip_from": 1, "init": "backbone", "aux_checkpoint": None}


@pytest.mark.parametrize("backbone", ["bert-base-uncased", "bert-large-uncased"])
def test_infocse_code_loss_equals_the_authors_cl_forward(tiny_bert_dir, paper_config, backbone):
    infocse_code_compare(tiny_bert_dir, _infocse_args(paper_config, backbone), backbone)
    run = find_run(paper_config, "infocse-code", backbone)
    assert run.train["precision"] == "fp16"  # both scripts pass --fp16 (HF Trainer: autocast + GradScaler)


@pytest.mark.parametrize("backbone,switch", [("bert-base-uncased", s) for s in SWITCHES["infocse-base"]]
                         + [("bert-large-uncased", s) for s in SWITCHES["infocse-large"]])
def test_infocse_code_comparison_fails_with_a_switch_set_back(tiny_bert_dir, paper_config, backbone, switch):
    key = "infocse-large" if "large" in backbone else "infocse-base"
    args = {**_infocse_args(paper_config, backbone), switch: SWITCHES[key][switch]}
    with pytest.raises(AssertionError):
        infocse_code_compare(tiny_bert_dir, args, backbone)


def _encoder(model_dir):
    from sentemb.model.backbone import load_encoder

    return load_encoder(model_dir, pooling_layer=False)


def spread_(encoder, emb=1.0, rest=0.3):
    """Redraw the tiny BERT's matrices (embeddings N(0, emb²), the rest N(0, rest²)): at BERT's 0.02
    every sentence's [CLS] is nearly the same vector, all cosines ~1, and a loss on them is ~log(rows),
    blind to most of what it should check."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (emb if "embeddings" in name else rest))


# ----------------------------------------------------------------------------------------------- UNA
UNA_SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat"]


@pytest.fixture(scope="module")
def una_inputs(tmp_path_factory):
    """Corpus (the test sentences are lines 0..3), stand-in paraphrases (words reversed) and the
    TF-IDF statistics over both (``tfidf_para``)."""
    import random

    from conftest import TINY_WORDS
    from sentemb.stats.tfidf import write_tfidf

    d = tmp_path_factory.mktemp("una_code")
    rng = random.Random(7)
    lines = [" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 14))) for _ in range(40)]
    lines[:len(UNA_SENTS)] = UNA_SENTS
    (d / "corpus.txt").write_text("".join(x + "\n" for x in lines), "utf-8")
    (d / "paraphrases.txt").write_text("".join(" ".join(reversed(x.split())) + "\n" for x in lines), "utf-8")
    write_tfidf([d / "corpus.txt", d / "paraphrases.txt"], d / "tfidf_para.parquet", workers=1)
    return d


def make_una(model_dir, d, args, max_len=32):
    ctx = MethodContext(max_len=max_len, seed=0, corpus=d / "corpus.txt",
                        inputs={"tfidf_para": d / "tfidf_para.parquet", "paraphrases": d / "paraphrases.txt"})
    torch.manual_seed(0)
    m = get_method("una")(*_encoder(model_dir), args, ctx)
    spread_(m.encoder)
    return m


#: script/run_bertbase_una.sh: --temperature 0.05 --max_len 32 --aug_every_n_steps 5
UNA_SCRIPT = {"temperature": 0.05, "max_len": 32, "aug_every_n_steps": 5}


def una_reference_loss(m, samples, max_len=UNA_SCRIPT["max_len"]):
    """una.py's step in float64: ``tokenize`` (each sample's [anchor, positive] or, on a step with
    negatives, [anchor, positive, anchor_hn, positive_hn], padded to ``max_length``), the rows
    concatenated sample by sample, ``MLPLayer`` (Linear + Tanh) on [CLS], ``simcse_unsup_loss``
    (labels 1, 0, 3, 2, …; cosine matrix minus 1e12 on the diagonal, / temperature) and
    ``F.cross_entropy``."""
    tok = m.tokenizer
    data = [tok(s, max_length=max_len, truncation=True, padding="max_length", return_tensors="pt") for s in samples]
    ids, att, tt = (torch.cat([x[k] for x in data]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    cls = m.encoder(ids, att, tt, return_dict=True).last_hidden_state[:, 0].double()
    w, b = m.mlp.dense.weight.double(), m.mlp.dense.bias.double()
    y = torch.tanh(cls @ w.T + b)
    n = y.size(0)
    y_true = torch.arange(n)
    labels = (y_true - y_true % 2 * 2) + 1
    yn = y / y.norm(dim=-1, keepdim=True)
    sim = yn @ yn.T - torch.eye(n, dtype=torch.float64) * 1e12
    logits = sim / UNA_SCRIPT["temperature"]
    return (torch.logsumexp(logits, -1) - logits[torch.arange(n), labels]).mean()


def una_gap(m, d, step):
    """sentemb's loss and the reference's on step ``step`` of the batch UNA_SENTS (eval mode, float64);
    the reference reads the positives from the paraphrase file and gets the negatives sentemb drew."""
    made = []
    draw = m.augmenter.negative
    m.augmenter.negative = lambda s, rng: made.append(draw(s, rng)) or made[-1]
    batch = m.build_batch(UNA_SENTS, step=step, lines=[0, 1, 2, 3], micro=0)
    para = (d / "paraphrases.txt").read_text("utf-8").splitlines()
    samples = [[a, para[i]] for i, a in enumerate(UNA_SENTS)]
    if made:  # positive_hn = a copy of anchor_hn
        samples = [s + [neg, neg] for s, (neg, _) in zip(samples, made)]
    assert bool(made) == (step % UNA_SCRIPT["aug_every_n_steps"] == 0)
    m.double().eval()
    with torch.no_grad():
        return float(m.losses(batch)["loss"]), float(una_reference_loss(m, samples))


def una_code_checks(m, run):
    """What a loss on the model's own weights cannot see: ``MLPLayer``'s ``nn.Linear`` as PyTorch builds
    it (weights and bias uniform within 1/sqrt(h), the bias non-zero); fp32 (``--fp16_precision`` only
    enables a GradScaler, no autocast) and no gradient clipping (``una.py``: ``scaler.step`` straight
    after ``backward``)."""
    w, b = m.mlp.dense.weight.detach(), m.mlp.dense.bias.detach()
    bound = 1 / math.sqrt(w.size(1))
    assert float(b.abs().max()) > 0 and float(w.abs().max()) <= bound and float(w.std()) > 0.5 * bound / math.sqrt(3)
    assert run.train["precision"] == "fp32" and run.train["grad_clip"] is None


def una_code_compare(model_dir, d, args, run):
    una_code_checks(make_una(model_dir, d, args), run)
    for step in (0, 1):  # with the negatives (step % alpha == 0) and without
        ours, ref = una_gap(make_una(model_dir, d, args), d, step)
        assert abs(ours - ref) < TOL_FP32 * abs(ref) and ours > 0, (step, ours, ref)


def test_una_code_loss_equals_the_authors_step(tiny_bert_dir, una_inputs, paper_config):
    run = find_run(paper_config, "una-code", "bert-base-uncased")
    una_code_compare(tiny_bert_dir, una_inputs, code_args(paper_config, "una-code"), run)
    # the negatives' arithmetic of function/tfidf_una.py (its own tests in test_una.py) and the dev set
    # tokenized at max_len (data/dataset.py SimcseEvalDataset)
    args = code_args(paper_config, "una-code")
    assert (args["redraw"], args["selection_form"], args["rank_ties"]) == ("code", "code", "first_seen")
    assert run.train["dev_max_len"] == 32


@pytest.mark.parametrize("switch", sorted(SWITCHES["una"]))
def test_una_code_comparison_fails_with_a_switch_set_back(tiny_bert_dir, una_inputs, paper_config, switch):
    run = find_run(paper_config, "una-code", "bert-base-uncased")
    args = {**code_args(paper_config, "una-code"), switch: SWITCHES["una"][switch]}
    with pytest.raises(AssertionError):
        una_code_compare(tiny_bert_dir, una_inputs, args, run)


def test_every_code_run_selects_its_checkpoint_by_an_fp32_dev_evaluation(paper_config):
    """The authors' trainers (SimCSE's CLTrainer.evaluate and UNA's loop) score STS-B dev without
    autocast: a -code run does not take the config's eval_precision: auto (bf16 on CUDA)."""
    code_runs = [r for r in paper_config["runs"] if str(r.get("name", "")).endswith("-code")]
    assert {r["name"] for r in code_runs} >= {"una-code", "paser-code", "infocse-code"}
    for r in code_runs:
        assert (r.get("train") or {}).get("eval_precision") == "fp32", r["name"]
        # the HF Trainer 4.2.1's AdamW (transformers.optimization.AdamW) where the code trains with it
        want = "adamw" if r["name"] == "una-code" else "adamw_hf"  # UNA's run.py: torch.optim.AdamW
        assert (r.get("train") or {}).get("optimizer", "adamw") == want, r["name"]


# -------------------------------------------------------------------------------------------- SimCSE
SIMCSE_SCRIPT = {"temp": 0.05}  # run_unsup_example.sh: --temp 0.05 --pooler_type cls --mlp_only_train


def simcse_reference_loss(m, batch, temp=SIMCSE_SCRIPT["temp"]):
    """``cl_forward`` (princeton-nlp/SimCSE @49fa580, ``simcse/models.py`` ~l. 100-180) in float64:
    input_ids (bs, num_sent = 2, len) flattened sentence by sentence; pooler ``cls`` (last layer's
    [CLS]) and, with ``--mlp_only_train`` in training, ``MLPLayer`` (Linear + Tanh) over all bs·2 rows;
    z1, z2 = the two views; ``Similarity(temp)``: cosine / temp of every (z1_i, z2_j); CrossEntropyLoss
    against arange(bs)."""
    bsz = batch["input_ids"].size(0)
    ids, att, tt = (batch[k].repeat_interleave(2, 0) for k in ("input_ids", "attention_mask", "token_type_ids"))
    out = m.encoder(ids, attention_mask=att, token_type_ids=tt, return_dict=True)
    x = out.last_hidden_state[:, 0].double()
    if m.mlp is not None:
        x = torch.tanh(x @ m.mlp.dense.weight.double().T + m.mlp.dense.bias.double())
    x = x.view(bsz, 2, -1)
    z1, z2 = x[:, 0], x[:, 1]
    cos = (z1 @ z2.T) / (z1.norm(dim=-1)[:, None] * z2.norm(dim=-1)[None, :]) / temp
    return float((torch.logsumexp(cos, -1) - cos.diagonal()).mean())


def simcse_gap(model_dir, args):
    torch.manual_seed(0)
    m = get_method("simcse")(*_encoder(model_dir), args, MethodContext(max_len=16, seed=3, backbone="tiny"))
    spread_(m.encoder, 0.3, 0.1)
    batch = m.build_batch(INFOCSE_SENTS, micro=0)
    m.double().train()
    b = len(INFOCSE_SENTS)
    with torch.no_grad():
        with scaled_dropout(torch.arange(2 * b) // b):  # sentemb: the views one after the other
            ours = float(m.losses(batch)["loss"])
        with scaled_dropout(torch.arange(2 * b) % 2):  # the code: sentence by sentence
            ref = simcse_reference_loss(m, batch)
    return m, ours, ref


def test_simcse_loss_equals_the_authors_cl_forward(tiny_bert_dir, paper_config):
    """The configured SimCSE run (BERT-base, the spec's values: no -code run exists) against
    ``cl_forward`` in training mode, two distinct dropout views; and ``cl_init``'s ``init_weights`` on
    the MLP: N(0, initializer_range) weights, zero bias."""
    args = code_args(paper_config, "simcse")
    m, ours, ref = simcse_gap(tiny_bert_dir, args)
    assert abs(ours - ref) < TOL_FP32 * abs(ref) and ref > 0.1, (ours, ref)
    std = m.encoder.config.initializer_range
    w = _encoder(tiny_bert_dir)  # a fresh method: the MLP as initialised
    torch.manual_seed(0)
    fresh = get_method("simcse")(*w, args, MethodContext(max_len=16, seed=3, backbone="tiny")).mlp.dense
    assert 0.8 < float(fresh.weight.detach().std()) / std < 1.2 and not fresh.bias.any()


def test_simcse_comparison_fails_at_another_temperature(tiny_bert_dir, paper_config):
    """The comparison above can fail: τ = 0.1 against the script's --temp 0.05."""
    _, ours, ref = simcse_gap(tiny_bert_dir, {**code_args(paper_config, "simcse"), "temperature": 0.1})
    assert abs(ours - ref) > 1e-3 * abs(ref), (ours, ref)
