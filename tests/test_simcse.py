"""SimCSE: the loss against an independent computation, the MLP's role, gradient flow."""

import math

import numpy as np
import pytest
import torch

from sentemb.methods import MethodContext, get_method
from sentemb.methods.simcse import info_nce
from sentemb.model.backbone import load_encoder


def reference_info_nce(z1: np.ndarray, z2: np.ndarray, tau: float) -> float:
    """Eq. 1 of Gao et al. (2021) written out with loops in float64."""
    B = len(z1)
    cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    total = 0.0
    for i in range(B):
        denom = sum(math.exp(cos(z1[i], z2[j]) / tau) for j in range(B))
        total += -math.log(math.exp(cos(z1[i], z2[i]) / tau) / denom)
    return total / B


def test_info_nce_matches_reference():
    rng = np.random.default_rng(0)
    z1, z2 = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    got = info_nce(torch.tensor(z1, dtype=torch.float32), torch.tensor(z2, dtype=torch.float32), 0.05)
    assert got.item() == pytest.approx(reference_info_nce(z1, z2, 0.05), rel=1e-4)
    # one direction only: swapping the views changes the value
    swapped = info_nce(torch.tensor(z2, dtype=torch.float32), torch.tensor(z1, dtype=torch.float32), 0.05)
    assert swapped.item() == pytest.approx(reference_info_nce(z2, z1, 0.05), rel=1e-4)


def test_info_nce_is_fp32_under_bf16_autocast():
    z1, z2 = torch.randn(4, 8), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = info_nce(z1.bfloat16(), z2.bfloat16(), 0.05)
    assert loss.dtype == torch.float32


def _method(tiny_bert_dir, **args):
    torch.manual_seed(0)
    enc, tok = load_encoder(tiny_bert_dir)
    return get_method("simcse")(enc, tok, args, MethodContext(max_len=16, seed=0))


def test_simcse_loss_equals_reference_on_model_outputs(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    m.eval()  # no dropout: both views identical, so the reference can recompute them
    batch = m.build_batch(["a man plays guitar", "the dog runs in the park", "red car", "a cat sits on the mat"])
    assert batch["input_ids"].shape[1] <= 16
    loss = m.losses(batch)["loss"]
    with torch.no_grad():
        cls = m.encoder(**batch).last_hidden_state[:, 0]
        z = m.mlp(cls).double().numpy()
    assert loss.item() == pytest.approx(reference_info_nce(z, z, 0.05), rel=1e-4)


def test_dropout_views_differ_and_gradients_reach_encoder_and_mlp(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    m.train()
    batch = m.build_batch(["a man plays guitar", "the dog runs", "red car is big"])
    z1, z2 = m.encode_views(batch)
    assert not torch.allclose(z1, z2)  # dropout is the augmentation
    m.losses(batch)["loss"].backward()
    assert m.mlp.dense.weight.grad is not None and m.mlp.dense.weight.grad.abs().sum() > 0
    emb_grad = m.encoder.embeddings.word_embeddings.weight.grad
    assert emb_grad is not None and emb_grad.abs().sum() > 0


def test_mlp_used_in_training_only(tiny_bert_dir, tmp_path):
    from sentemb.model.encoder import Embedder
    from sentemb.model.backbone import export

    m = _method(tiny_bert_dir)
    m.eval()
    batch = m.build_batch(["a man plays guitar", "the dog runs"])
    with torch.no_grad():
        z_before = m.encode_views(batch)[0].clone()
    emb = Embedder(m.encoder, m.tokenizer, get_method("simcse").pooler_for(m.args), device=torch.device("cpu"))
    before = emb(["a man plays guitar"])
    with torch.no_grad():
        m.mlp.dense.weight.mul_(3.0)
        z_after = m.encode_views(batch)[0]
    assert not torch.allclose(z_after, z_before)  # training sees the MLP
    assert torch.allclose(z_before, torch.tanh(m.encoder(**batch).last_hidden_state[:, 0] @ (m.mlp.dense.weight / 3).T
                                               + m.mlp.dense.bias), atol=1e-5)
    assert np.allclose(emb(["a man plays guitar"]), before)  # evaluation does not
    # export: raw [CLS] is the eval pooler; the trained MLP sits in the pooler slot ("cls")
    export(m.encoder, m.tokenizer, tmp_path / "m", pooler="cls_before_pooler", head=m.export_head(), max_seq_length=64)
    enc2, _ = load_encoder(tmp_path / "m")
    assert torch.equal(enc2.pooler.dense.weight, m.mlp.dense.weight)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert np.allclose(st.encode(["a man plays guitar"]), before, atol=1e-5)


def test_pooler_for_mlp_settings():
    cls = get_method("simcse")
    assert cls.pooler_for(cls.make_args({"mlp": "train_only"})) == "cls_before_pooler"
    assert cls.pooler_for(cls.make_args({"mlp": "always"})) == "cls"


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg"])
def test_export_loads_in_sentence_transformers_with_the_same_pooling(tiny_bert_dir, tmp_path, pooler):
    from sentence_transformers import SentenceTransformer

    from sentemb.model.encoder import Embedder
    from sentemb.model.backbone import export

    m = _method(tiny_bert_dir, mlp="always")
    with torch.no_grad():
        m.mlp.dense.weight.normal_(std=0.5)  # make the head matter
    export(m.encoder, m.tokenizer, tmp_path / "m", pooler=pooler, head=m.export_head(), max_seq_length=64)
    sents = ["a man plays guitar", "the dog runs in the park"]
    ours = Embedder.from_dir(tmp_path / "m", pooler, device="cpu")(sents)
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu").encode(sents)
    assert np.allclose(st, ours, atol=1e-5)


def test_export_refuses_a_pooler_sentence_transformers_cannot_express(tiny_bert_dir, tmp_path):
    from sentemb import SentembError
    from sentemb.model.backbone import export

    m = _method(tiny_bert_dir)
    with pytest.raises(SentembError, match="avg_top2"):
        export(m.encoder, m.tokenizer, tmp_path / "m", pooler="avg_top2", max_seq_length=64)


def test_dev_embedder_with_mlp_always_is_the_current_mlp_on_cls(tiny_bert_dir, tmp_path):
    """Review fix (issue 6 §4): with ``mlp: always`` model selection must score MLP([CLS]) of the
    current weights, not the encoder's pooler slot (BERT's NSP pooler or a stale copy)."""
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    assert getattr(enc, "pooler", None) is None  # the pretrained NSP pooler is not loaded in training
    m = get_method("simcse")(enc, tok, {"mlp": "always"}, MethodContext(max_len=16, seed=0))
    sents = ["a man plays guitar", "the dog runs in the park", "red car"]
    pooler = get_method("simcse").pooler_for(m.args)
    for scale in (0.3, 0.9):  # the dev embedder follows every change of the MLP
        with torch.no_grad():
            m.mlp.dense.weight.normal_(std=scale)
            m.mlp.dense.bias.normal_(std=scale)
        got = m.embedder(pooler, torch.device("cpu"))(sents)
        m.eval()
        with torch.no_grad():
            b = tok(sents, padding=True, return_tensors="pt")
            cls = enc(**b).last_hidden_state[:, 0]
            want = torch.tanh(cls @ m.mlp.dense.weight.T + m.mlp.dense.bias).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
    # and the export's `cls` pooler is that same MLP (written into the checkpoint's pooler slot)
    from sentemb.evaluate.sts import embedder_for

    m.export(tmp_path / "m", pooler, meta={"method": "simcse"})
    np.testing.assert_allclose(embedder_for(tmp_path / "m", pooler, device="cpu")(sents), want, atol=1e-5)
