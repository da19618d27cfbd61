"""SARCSE (methods.md §1): Eqs. 3-12 against float64 loop references, the real-token mask on BERT and
RoBERTa tokenizers, Z's shape and batch independence, gradient paths, ablations, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentemb import SentembError
from sentemb.methods import MethodContext, get_method
from sentemb.methods.sarcse import (KERNEL_SIZES, TextCNNDecoder, TextCNNEncoder, compact, reconstruction_loss,
                                    token_weights)
from sentemb.model.backbone import load_encoder

SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "cat",
         "she eats an apple in the house", "two old men are playing music in the street"]


# ------------------------------------------------------------------------------------ references
def ref_token_weights(freq, theta, lam):
    return [theta if 1.0 - lam * f < theta else 1.0 - lam * f for f in freq]


def ref_recon(x, x_rec, w, mask, reduction="mean"):
    """Eq. 9 with loops: mean over sentences with ≥ 1 real token of (1/N) Σ_i f_i·MSE(x_i, x'_i)."""
    per = []
    for b in range(len(x)):
        n, s = 0, 0.0
        for i in range(len(x[b])):
            if not mask[b][i]:
                continue
            n += 1
            sq = [(float(x[b][i][e]) - float(x_rec[b][i][e])) ** 2 for e in range(len(x[b][i]))]
            s += float(w[b][i]) * (sum(sq) / len(sq) if reduction == "mean" else sum(sq))
        if n:
            per.append(s / n)
    return sum(per) / len(per)


def ref_encode(X, head: TextCNNEncoder):
    """Eqs. 3-4 for one sentence X (n, d) with explicit loops: zero-pad to the kernel width, ReLU,
    max over the max(1, n − ks + 1) windows, then the (3 × 2) integrating conv. Returns (Z, H, argmax)."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    H, arg = [], []
    for ks, conv in zip(KERNEL_SIZES, head.convs):
        W, bias = conv.weight.detach().double().numpy(), conv.bias.detach().double().numpy()  # (C, d, ks)
        Xp = np.zeros((max(n, ks), d))
        Xp[:n] = X
        P = max(1, n - ks + 1)
        h = np.empty((W.shape[0], P))
        for c in range(W.shape[0]):
            for p in range(P):
                h[c, p] = max(0.0, bias[c] + sum(W[c, j, k] * Xp[p + k, j] for k in range(ks) for j in range(d)))
        H.append(h.max(1))
        arg.append(h.argmax(1))
    H = np.stack(H)  # (3, C)
    K, kb = head.integrate.weight.detach().double().numpy(), head.integrate.bias.detach().double().numpy()  # (O,1,3,2)
    C = H.shape[1]
    Z = np.empty((K.shape[0], C - 1))
    for o in range(K.shape[0]):
        for t in range(C - 1):
            Z[o, t] = kb[o] + sum(K[o, 0, r, s] * H[r, t + s] for r in range(3) for s in range(2))
    return Z, H, arg


def ref_decode(Z, n, dec: TextCNNDecoder, arg=None):
    """Eqs. 5-7 for one sentence with loops: transposed (3 × 2) conv, H'_ks spread over the valid
    windows (repeat, or at the encoder's argmax), transposed TextCNN, mean over ks. Returns (n, d)."""
    T = dec.detranspose.weight.detach().double().numpy()  # (O, 1, 3, 2)
    tb = float(dec.detranspose.bias.detach()[0])
    O, Tlen = Z.shape
    C = Tlen + 1
    Hr = np.full((3, C), tb)
    for o in range(O):
        for t in range(Tlen):
            for r in range(3):
                for s in range(2):
                    Hr[r, t + s] += Z[o, t] * T[o, 0, r, s]
    outs = []
    for r, (ks, deconv) in enumerate(zip(KERNEL_SIZES, dec.deconvs)):
        W, bias = deconv.weight.detach().double().numpy(), deconv.bias.detach().double().numpy()  # (C, d, ks)
        P = max(1, n - ks + 1)
        spread = np.zeros((C, P))
        for c in range(C):
            for p in range(P):
                if arg is None or arg[r][c] == p:
                    spread[c, p] = Hr[r, c]
        Xr = np.tile(bias, (n, 1))
        for j in range(n):
            for p in range(P):
                if 0 <= j - p < ks:
                    Xr[j] += spread[:, p] @ W[:, :, j - p]
        outs.append(Xr)
    return sum(outs) / 3.0


def ref_info_nce(z1, z2, tau):
    cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    B = len(z1)
    return sum(-math.log(math.exp(cos(z1[i], z2[i]) / tau) / sum(math.exp(cos(z1[i], z2[j]) / tau) for j in range(B)))
               for i in range(B)) / B


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def freq_table(tiny_bert_dir, tmp_path_factory):
    import random

    from conftest import TINY_WORDS
    from sentemb.stats.frequency import write_token_frequencies

    d = tmp_path_factory.mktemp("sarcse_freq")
    rng = random.Random(0)
    corpus = d / "corpus.txt"
    corpus.write_text("".join("the " + " ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(3, 12))) + "\n"
                              for _ in range(60)), "utf-8")
    out = d / "token_freq.tiny.parquet"
    write_token_frequencies(corpus, tiny_bert_dir, out)
    return out


def make(model_dir, freq=None, seed=0, **args):
    torch.manual_seed(seed)
    enc, tok = load_encoder(model_dir, pooling_layer=False)
    ctx = MethodContext(max_len=32, seed=seed, model_dir=model_dir, inputs={"token_freq": freq} if freq else {})
    return get_method("sarcse")(enc, tok, args, ctx)


def real_states(m, batch):
    """Per row, the last-layer states of its real tokens, selected by id with a python loop."""
    with torch.no_grad():
        hidden = m.encoder(**batch).last_hidden_state.double().numpy()
    skip = {m.tokenizer.cls_token_id, m.tokenizer.sep_token_id, m.tokenizer.pad_token_id}
    rows = []
    for b, ids in enumerate(batch["input_ids"].tolist()):
        keep = [i for i, t in enumerate(ids) if batch["attention_mask"][b, i] and t not in skip]
        rows.append((hidden[b, keep], [ids[i] for i in keep]))
    return rows


# ------------------------------------------------------------------------------------ Eqs. 8-9
def test_token_weights_are_theta_above_the_cut_and_linear_below():
    theta, lam = 0.1, 50.0  # cut at freq = (1 − θ)/λ = 1.8%
    freq = [0.0, 0.001, 0.01, 0.0179, 0.0181, 0.05, 0.3]
    got = token_weights(np.array(freq), theta, lam).tolist()
    assert got == pytest.approx(ref_token_weights(freq, theta, lam), abs=1e-7)
    assert got[-3:] == pytest.approx([theta] * 3) and got[0] == 1.0 and got[2] == pytest.approx(0.5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reconstruction_loss_matches_loops_and_ignores_masked_positions(reduction):
    rng = np.random.default_rng(0)
    x, xr = rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 6, 4))
    w = rng.uniform(0.1, 1, size=(3, 6))
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=bool)  # row 3: no real token
    t = lambda a: torch.tensor(a, dtype=torch.float32)
    got = reconstruction_loss(t(x), t(xr), t(w), torch.tensor(mask), reduction).item()
    assert got == pytest.approx(ref_recon(x, xr, w, mask, reduction), rel=1e-5)
    x2 = x.copy()
    x2[~mask] = 1e3  # garbage at padding/special positions changes nothing
    assert reconstruction_loss(t(x2), t(xr), t(w), torch.tensor(mask), reduction).item() == pytest.approx(got, rel=1e-6)


def test_reconstruction_loss_weights_come_from_the_frequency_table(tiny_bert_dir, freq_table):
    import pyarrow.parquet as pq

    m = make(tiny_bert_dir, freq_table)
    t = pq.read_table(freq_table).to_pydict()
    want = ref_token_weights(t["freq"], 0.1, 50.0)
    assert m.token_weight.tolist() == pytest.approx(want, abs=1e-6)
    the = m.tokenizer.convert_tokens_to_ids("the")
    assert t["freq"][the] > 0.018 and m.token_weight[the].item() == pytest.approx(0.1)  # "the" drops to θ


# ------------------------------------------------------------------------------------ real tokens
def test_special_tokens_are_excluded_on_bert_and_roberta_tokenizers(tiny_bert_dir, tiny_roberta_dir):
    from sentemb.methods.sarcse import real_token_mask, structural_ids

    for d, specials in ((tiny_bert_dir, ("[CLS]", "[SEP]", "[PAD]")), (tiny_roberta_dir, ("<s>", "</s>", "<pad>"))):
        m = make(d, decoder=False)
        batch = m.build_batch(["a cat", "the dog runs in the park"])
        mask = real_token_mask(batch["input_ids"], batch["attention_mask"], structural_ids(m.tokenizer))
        for b, ids in enumerate(batch["input_ids"].tolist()):
            toks = m.tokenizer.convert_ids_to_tokens(ids)
            want = [t not in specials for t in toks]
            assert mask[b].tolist() == want, (d.name, toks)
            assert toks[0] == specials[0] and specials[1] in toks  # there were specials to exclude
            n_real = len(m.tokenizer(["a cat", "the dog runs in the park"][b], add_special_tokens=False)["input_ids"])
            assert sum(want) == n_real


# ------------------------------------------------------------------------------------ Eqs. 3-7
@pytest.mark.parametrize("n", [1, 2, 4, 5, 32])
def test_z_is_3_by_499_and_the_same_alone_and_in_a_padded_batch(n):
    torch.manual_seed(0)
    head = TextCNNEncoder(hidden=8)  # paper sizes: 500 channels, 3 integrating channels
    x = torch.randn(1, n, 8)
    alone, mask_a, _ = compact(x, torch.ones(1, n, dtype=torch.bool), 5)
    z_alone, _, _ = head(alone, mask_a)
    assert z_alone.shape == (1, 3, 499) and z_alone.flatten(1).shape == (1, 1497)
    # inside a batch: after a [CLS]-like position, before [SEP]-like + padding, beside a 40-token row
    big = torch.randn(2, 42, 8)
    mask = torch.zeros(2, 42, dtype=torch.bool)
    big[0, 1 : n + 1] = x[0]
    mask[0, 1 : n + 1] = True
    mask[1, 1:41] = True
    xc, mc, _ = compact(big, mask, 5)
    z_batch, _, _ = head(xc, mc)
    torch.testing.assert_close(z_batch[0], z_alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("unpool", ["repeat", "argmax"])
def test_encoder_and_decoder_match_loop_references(unpool):
    torch.manual_seed(1)
    d, C = 5, 7
    head = TextCNNEncoder(d, C, 2)
    dec = TextCNNDecoder(d, C, 2, unpool)
    lengths = [1, 3, 4, 6, 9]
    x = torch.randn(len(lengths), 9, d)
    mask = torch.arange(9)[None, :] < torch.tensor(lengths)[:, None]
    xc, mc, _ = compact(x * mask[..., None], mask, 5)
    with torch.no_grad():
        z, valid, arg = head(xc, mc)
        xr = dec(z, valid, arg, xc.size(1))
    for b, n in enumerate(lengths):
        Z, H, a = ref_encode(x[b, :n].numpy(), head)
        np.testing.assert_allclose(z[b].numpy(), Z, atol=1e-5)
        X_rec = ref_decode(z[b].double().numpy(), n, dec, a if unpool == "argmax" else None)
        np.testing.assert_allclose(xr[b, :n].numpy(), X_rec, atol=1e-5)


def test_loss_equals_reference_on_model_outputs(tiny_bert_dir, freq_table):
    m = make(tiny_bert_dir, freq_table, channels=6, beta=0.5, gamma=0.25)  # weights that make L_R visible
    m.eval()  # no dropout: both views identical, so the reference can recompute them
    batch = m.build_batch(SENTS)
    terms = m.losses(batch)
    z, lr = [], []
    for X, ids in real_states(m, batch):
        Z, _, _ = ref_encode(X, m.head)
        z.append(Z.ravel())
        Xr = ref_decode(Z, len(ids), m.decoder)
        w = [m.token_weight[i].item() for i in ids]
        lr.append(ref_recon([X], [Xr], [w], [[True] * len(ids)], m.args.mse_reduction))
    z = np.stack(z)
    want_c, want_r = ref_info_nce(z, z, 0.05), sum(lr) / len(lr)
    assert terms["contrastive"].item() == pytest.approx(want_c, rel=1e-4)
    assert terms["recon"].item() == pytest.approx(want_r, rel=1e-4)
    assert terms["recon_pos"].item() == pytest.approx(want_r, rel=1e-4)
    assert terms["loss"].item() == pytest.approx(want_c + 0.5 * want_r + 0.25 * want_r, rel=1e-4)
    assert terms["loss"].dtype == torch.float32


# ------------------------------------------------------------------------------------ gradients
def _hidden_grad(m, batch):
    """d loss / d last-layer states (2B, L, d), captured with a forward hook."""
    saved = {}

    def hook(module, inputs, out):
        out.last_hidden_state.retain_grad()
        saved["h"] = out.last_hidden_state

    handle = m.encoder.register_forward_hook(hook)
    m.zero_grad()
    terms = m.losses(batch)
    terms["loss"].backward()
    handle.remove()
    return saved["h"], terms


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_detach_target_removes_exactly_the_target_path_of_the_gradient(tiny_bert_dir, freq_table, reduction):
    common = dict(channels=6, alpha=0.0, beta=1.0, gamma=0.5, mse_reduction=reduction)
    full, det = make(tiny_bert_dir, freq_table, **common), make(tiny_bert_dir, freq_table, detach_target=True, **common)
    det.load_state_dict(full.state_dict())
    full.eval(), det.eval()
    batch = full.build_batch(SENTS[:4])
    h_full, _ = _hidden_grad(full, batch)
    h_det, _ = _hidden_grad(det, batch)
    emb = full.encoder.embeddings.word_embeddings.weight
    assert det.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # still trains the encoder via Z
    assert emb.grad.abs().sum() > 0
    # the difference is the target path alone: dL/dx_i = w_view · 2·f_i·(x_i − x'_i) / (N·(d or 1)) / B
    with torch.no_grad():
        out = full.forward_views(batch)
    B, d = batch["input_ids"].size(0), h_full.size(-1)
    diff = (h_full.grad - h_det.grad).double()
    skip = {full.tokenizer.cls_token_id, full.tokenizer.sep_token_id, full.tokenizer.pad_token_id}
    for row in range(2 * B):
        ids = batch["input_ids"][row % B].tolist()
        real = [i for i, t in enumerate(ids) if batch["attention_mask"][row % B, i] and t not in skip]
        n = len(real)
        w_view = 1.0 if row < B else 0.5
        for k, pos in enumerate(real):
            x, xr = out["x"][row, k].double(), out["x_rec"][row, k].double()
            f = float(full.token_weight[ids[pos]])
            want = w_view * 2 * f * (x - xr) / (n * (d if reduction == "mean" else 1)) / B
            torch.testing.assert_close(diff[row, pos], want, atol=1e-6, rtol=1e-4)
        others = [i for i in range(len(ids)) if i not in real]
        assert torch.all(diff[row, others].abs() < 1e-8)  # special tokens and padding are no targets


def test_contrastive_gradient_reaches_encoder_head_and_decoder(tiny_bert_dir, freq_table):
    m = make(tiny_bert_dir, freq_table, channels=6)
    m.train()
    terms = m.losses(m.build_batch(SENTS))
    assert set(terms) == {"loss", "contrastive", "recon", "recon_pos", "weighted"}
    terms["loss"].backward()
    for mod in (m.encoder.embeddings.word_embeddings, m.head.convs[2], m.head.integrate, m.decoder.deconvs[0],
                m.decoder.detranspose):
        assert mod.weight.grad is not None and mod.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------ ablations and config
def test_ablations_w_o_sal_and_w_o_decoder(tiny_bert_dir, freq_table):
    cls = get_method("sarcse")
    assert cls.requires(cls.make_args({})) == ("token_freq",)
    assert cls.requires(cls.make_args({"self_adaptive": False})) == () and cls.requires(cls.make_args({"decoder": False})) == ()
    no_sal = make(tiny_bert_dir, None, self_adaptive=False, channels=6)
    assert no_sal.decoder is not None and torch.all(no_sal.token_weight == 1)
    no_dec = make(tiny_bert_dir, None, decoder=False, channels=6)
    assert no_dec.decoder is None and not any("decoder" in k for k in no_dec.state_dict())
    terms = no_dec.losses(no_dec.build_batch(SENTS[:3]))
    assert set(terms) == {"loss", "contrastive", "weighted"} and set(terms["weighted"]) == {"contrastive"}
    assert terms["loss"].item() == pytest.approx(terms["contrastive"].item())


def test_bad_arguments_name_the_key():
    cls = get_method("sarcse")
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.mse_reduction: 'median' is not one of"):
        cls.validate_args({"mse_reduction": "median"}, "runs[1].method_args")
    with pytest.raises(SentembError, match=r"methods\.sarcse\.theta: "):
        cls.validate_args({"theta": "high"}, "methods.sarcse")


def test_a_frequency_table_of_another_tokenizer_is_refused_before_step_1(tiny_bert_dir, tiny_roberta_dir, freq_table,
                                                                        tmp_path):
    import pyarrow.parquet as pq

    from sentemb.stats import read_metadata, write_parquet

    table, meta = pq.read_table(freq_table), read_metadata(freq_table)
    short = tmp_path / "short.parquet"
    write_parquet(table.slice(0, table.num_rows - 3), short, {**meta, "vocab_size": table.num_rows - 3})
    with pytest.raises(SentembError, match=rf"{short}: {table.num_rows - 3} rows .* tokenizer has {table.num_rows} tokens"):
        make(tiny_bert_dir, short)
    with pytest.raises(SentembError, match=r"short.parquet: .* rows .* has 261 tokens"):
        make(tiny_roberta_dir, short)
    # same size, other vocabulary: the tokens disagree
    import pyarrow as pa

    tokens = table.column("token").to_pylist()
    tokens[7], tokens[8] = tokens[8], tokens[7]
    other = tmp_path / "other.parquet"
    write_parquet(table.set_column(1, "token", pa.array(tokens)), other, {**meta, "tokenizer": "models/roberta-base"})
    with pytest.raises(SentembError, match=r"other.parquet: token 7 is .* 'models/roberta-base'"):
        make(tiny_bert_dir, other)
    with pytest.raises(SentembError, match="input 'token_freq' was not provided"):
        make(tiny_bert_dir, None)


# ------------------------------------------------------------------------------------ export
def test_export_at_paper_size_gives_1497_dims_in_every_loader(tiny_roberta_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from sentemb.evaluate.sts import embedder_for

    m = make(tiny_roberta_dir, decoder=False)  # 500 channels, 3 integrating channels
    dev = m.embedder("method", torch.device("cpu"))(SENTS)
    alone = np.concatenate([m.embedder("method", torch.device("cpu"))([s]) for s in SENTS])
    np.testing.assert_allclose(alone, dev, atol=1e-5)  # a sentence's Z does not depend on its batch
    m.export(tmp_path / "m", "method", meta={"method": "sarcse"})
    assert (tmp_path / "m/1_SARCSE/model.safetensors").is_file() and not (tmp_path / "m/1_Pooling").exists()
    ours = embedder_for(tmp_path / "m", "method", device="cpu")(SENTS)
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    assert dev.shape == (len(SENTS), 1497) and st.get_embedding_dimension() == 1497
    np.testing.assert_allclose(ours, dev, atol=1e-5)
    np.testing.assert_allclose(st.encode(SENTS), dev, atol=1e-5)


# ------------------------------------------------------------------------------------ the weight of L_R (issue 18 §4)
def test_weighted_terms_are_the_logged_terms_times_alpha_beta_gamma(tiny_bert_dir, freq_table):
    m = make(tiny_bert_dir, freq_table, channels=6, alpha=0.7, beta=0.5, gamma=0.25)
    m.train()
    terms = m.losses(m.build_batch(SENTS))
    w = terms["weighted"]
    assert set(w) == {"contrastive", "recon", "recon_pos"} and all(v.requires_grad for v in w.values())
    for name, weight in (("contrastive", 0.7), ("recon", 0.5), ("recon_pos", 0.25)):
        assert float(w[name].detach()) == pytest.approx(weight * float(terms[name]), rel=1e-6)
    params = m.grad_norm_parameters()
    assert {id(p) for p in m.head.parameters()} <= {id(p) for p in params}  # encoder + TextCNN: Z's makers
    assert not {id(p) for p in m.decoder.parameters()} & {id(p) for p in params}


@pytest.fixture(scope="module")
def wide_bert_dir(tiny_bert_dir, tmp_path_factory):
    """A random 1-layer BERT of roberta-base's width (d = 768, 12 heads) on the tiny vocabulary."""
    import shutil

    from transformers import BertConfig, BertModel

    d = tmp_path_factory.mktemp("wide_bert")
    for f in tiny_bert_dir.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, d / f.name)
    n_vocab = len((tiny_bert_dir / "vocab.txt").read_text().split())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=n_vocab, hidden_size=768, num_hidden_layers=1, num_attention_heads=12,
                         intermediate_size=256, max_position_embeddings=64)).save_pretrained(d)
    return d


def test_the_default_reading_gives_the_reconstruction_a_gradient_that_survives_bf16(wide_bert_dir):
    """Issue 18 §4. With the paper's β = γ = 2.5e-4 the reconstruction must move what Z is made of
    (Table 1: "w/o SAL" 77.15 against "w/o SAL & decoder" 75.26 — the decoder's whole effect).

    Recomputed here from the forward pass's states X, X' (not from the method's loss code): per
    token, the squared error summed over the d features (the default reading of MSE in Eq. 9) or
    averaged over them (``mse_reduction: mean``, the literal "mean-square error"). On encoder +
    TextCNN, ‖∇(β·L_R + γ·L_R⁺)‖ / ‖∇L_I‖ must exceed bf16's relative precision 2⁻⁸ (a component
    below it is rounded away in the encoder's bf16 backward, the project's GPU precision); with the
    mean it is exactly d = 768 times smaller and below it. "w/o SAL" (f ≡ 1), paper sizes
    (500 channels), one random layer of roberta-base's width."""
    import torch.nn.functional as F

    m = make(wide_bert_dir, self_adaptive=False)
    a = m.args
    assert a.mse_reduction == "sum" and a.beta == a.gamma == 2.5e-4 and a.channels == 500
    m.train()
    batch = m.build_batch(SENTS)
    b = len(SENTS)
    torch.manual_seed(0)
    out = m.forward_views(batch)
    z = out["z"]
    sim = F.cosine_similarity(z[:b, None, :], z[None, b:, :], dim=-1) / a.temperature
    l_i = F.cross_entropy(sim, torch.arange(b))  # Eq. 11, mean over the anchors

    def recon(per_token):  # Eqs. 9-10 with f ≡ 1: (1/N) Σ_i per_token((x_i − x'_i)²), mean over sentences
        mask = out["mask"].float()
        e = per_token((out["x"] - out["x_rec"]) ** 2) * mask  # (2B, Lc)
        per_sentence = e.sum(1) / mask.sum(1)
        return a.beta * per_sentence[:b].mean(), a.gamma * per_sentence[b:].mean()

    r_sum, r_mean = recon(lambda sq: sq.sum(-1)), recon(lambda sq: sq.mean(-1))
    torch.manual_seed(0)  # the same dropout masks: the method's own weighted terms are the sum reading's
    w = m.losses(batch)["weighted"]
    assert float(w["recon"].detach()) == pytest.approx(float(r_sum[0].detach()), rel=1e-5)
    assert float(w["recon_pos"].detach()) == pytest.approx(float(r_sum[1].detach()), rel=1e-5)

    params = [*m.encoder.parameters(), *m.head.parameters()]

    def norm(t):
        g = torch.autograd.grad(t, params, retain_graph=True, allow_unused=True)
        return float(torch.stack([x.double().norm() for x in g if x is not None]).norm())

    g_i = norm(l_i)
    ratio_sum, ratio_mean = norm(r_sum[0] + r_sum[1]) / g_i, norm(r_mean[0] + r_mean[1]) / g_i
    assert ratio_sum / ratio_mean == pytest.approx(768, rel=1e-3)
    assert ratio_sum > 2**-8 > ratio_mean, (ratio_sum, ratio_mean)
