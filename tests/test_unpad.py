"""Padding-free training forward (sentemb.model.unpad, train.unpad; issue 13).

The reference is the model's own padded forward: with dropout off, packing the real tokens and
attending within each sentence must give the same states on every real token, and the same
gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sentemb import SentembError
from sentemb.model.backbone import load_encoder
from sentemb.model.unpad import install, packed_forward

from conftest import assert_same_model, simcse_run

SENTS = ["the dog runs in the park", "a man", "she eats an apple in the house with the cat",
         "red car", "two old men are playing music in the street"]


@pytest.fixture(params=["bert", "roberta"])
def model_dir(request, tiny_bert_dir, tiny_roberta_dir):
    return tiny_bert_dir if request.param == "bert" else tiny_roberta_dir


def batch(tok):
    return dict(tok(SENTS, padding=True, return_tensors="pt"))


def test_packed_forward_equals_the_padded_forward_on_every_real_token(model_dir):
    torch.manual_seed(0)
    enc, tok = load_encoder(model_dir, dropout=0.0, pooling_layer=False)
    enc.train()
    b = batch(tok)
    mask = b["attention_mask"].bool()
    assert (~mask).any()  # the batch has padding to remove
    ref = enc(**b, output_hidden_states=True, return_dict=True)
    got = packed_forward(enc, b["input_ids"], b["attention_mask"], b.get("token_type_ids"), output_hidden_states=True)
    assert got.last_hidden_state.shape == ref.last_hidden_state.shape
    torch.testing.assert_close(got.last_hidden_state[mask], ref.last_hidden_state[mask], rtol=1e-5, atol=1e-6)
    assert len(got.hidden_states) == len(ref.hidden_states)
    for g, r in zip(got.hidden_states, ref.hidden_states):
        torch.testing.assert_close(g[mask], r[mask], rtol=1e-5, atol=1e-6)
    assert float(got.last_hidden_state[~mask].detach().abs().sum()) == 0.0  # padded positions are zeros


def test_gradients_equal_the_padded_forwards(model_dir):
    def grads(packed: bool):
        torch.manual_seed(0)
        enc, tok = load_encoder(model_dir, dropout=0.0, pooling_layer=False)
        enc.train()
        if packed:
            install(enc)
        b = batch(tok)
        out = enc(**b, return_dict=True).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).float()
        ((out * m).pow(2).sum() + out[:, 0].pow(3).sum()).backward()
        return {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}

    padded, packed = grads(False), grads(True)
    assert padded.keys() == packed.keys() and len(padded) > 10
    for n in padded:
        torch.testing.assert_close(packed[n], padded[n], rtol=1e-4, atol=1e-6, msg=n)


def test_evaluation_and_other_calls_use_the_models_own_forward(tiny_bert_dir, monkeypatch):
    import sentemb.model.unpad as unpad

    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    install(enc)
    calls = []
    real = unpad.packed_forward
    monkeypatch.setattr(unpad, "packed_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    b = batch(tok)
    enc.eval()
    enc(**b, return_dict=True)
    enc.train()
    enc(**b, output_attentions=True, return_dict=True)  # attentions asked for: the model's own forward
    assert calls == []
    enc(**b, return_dict=True)
    assert calls == [1]


def test_a_deep_copy_runs_its_own_weights(tiny_bert_dir):
    enc, tok = load_encoder(tiny_bert_dir, dropout=0.0, pooling_layer=False)
    install(enc)
    twin = copy.deepcopy(enc)
    assert twin.forward.__self__ is twin
    with torch.no_grad():
        twin.embeddings.word_embeddings.weight.mul_(2)
    enc.train(), twin.train()
    b = batch(tok)
    assert not torch.allclose(enc(**b).last_hidden_state, twin(**b).last_hidden_state)


def test_unsupported_encoders_and_settings_are_refused_by_key(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    from transformers import DistilBertConfig, DistilBertModel

    from sentemb.train.loop import train

    distil = DistilBertModel(DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32))
    with pytest.raises(SentembError, match="train.unpad: padding-free training supports .* not 'distilbert'"):
        install(distil, "train.unpad")
    run = simcse_run(tiny_bert_dir, tiny_corpus, tiny_senteval, max_steps=2, compile=True, unpad=True)
    with pytest.raises(SentembError, match="train.unpad and train.compile cannot be combined"):
        train(run, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "model").exists()


def test_unpadded_training_resumes_bit_identically(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path):
    from sentemb.train.loop import train

    run = simcse_run(tiny_bert_dir, tiny_corpus, tiny_senteval, unpad=True)
    full = train(run, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(run, tmp_path / "run", stop_after=3, progress=False)
    res = train(run, tmp_path / "run", progress=False)
    assert res["history"] == full["history"]
    assert_same_model(tmp_path / "full/model", tmp_path / "run/model")
