"""InfoCSE (methods.md §4): masking, the auxiliary MLM losses against explicit recomputations, where
the gradient flows and where it is blocked, the pretraining stage and its hand-over to stage 2."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_WORDS
from sentemb import SentembError
from sentemb.methods import MethodContext, get_method
from sentemb.methods.infocse import InfoCSE, InfoCSEPretrain, aux_mlm_loss, mask_tokens
from sentemb.config.settings import TrackingSettings
from sentemb.train.pretrain import run_pretrain

SENTS = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat",
         "she eats an apple in the house", "two old men are playing music in the street"]


def _ctx(model_dir, inputs=None, seed=3):
    return MethodContext(max_len=16, seed=seed, backbone="tiny", model_dir=model_dir, inputs=inputs or {})


def _make(cls, model_dir, args, inputs=None, seed=3):
    from sentemb.model.backbone import load_encoder

    enc, tok = load_encoder(model_dir, pooling_layer=False)
    return cls(enc, tok, args, _ctx(model_dir, inputs, seed))


def _run(model_dir, corpus, **over):
    """The stage-1 run (``resolve_pretrain``'s shape): 2 steps, the final weights, no MLflow."""
    from conftest import tiny_run

    run = tiny_run(model_dir, corpus, None, "infocse", seed=5, method_args={"skip_from": 1}, name="infocse-pretrain",
                   **{"max_steps": 2, "eval_steps": 1, "eval_at_end": False, "model_selection": "last", **over})
    run.progress, run.rule, run.run_name = False, "pretrain", "pretrain/infocse/tiny"
    return run


@pytest.fixture(scope="module")
def pretrained(tiny_bert_dir, tmp_path_factory):
    """Stage 1 run by the shared loop (2 steps) on a tiny corpus: the directory stage 2 reads."""
    d = tmp_path_factory.mktemp("infocse_pre")
    rng = random.Random(2)
    corpus = d / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 12))) + "\n"
                              for _ in range(40)), "utf-8")
    summary = run_pretrain(_run(tiny_bert_dir, corpus), d / "out", progress=False)
    assert summary["steps"] == 2
    return d / "out" / "model"


@pytest.fixture
def stage2(tiny_bert_dir, pretrained):
    def make(**args):
        return _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, **args}, {"pretrained": pretrained})
    return make


def _ce(logits: np.ndarray, target: int) -> float:
    m = max(logits)
    return -(logits[target] - (m + math.log(sum(math.exp(x - m) for x in logits))))


def _shake(module, scale=0.3):
    """Large random weights, so that attention (and hence the padding mask) visibly matters."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)


# ------------------------------------------------------------------------------------ masking
def test_masking_is_80_10_10_at_the_rate_and_never_touches_special_or_padding():
    rng = np.random.default_rng(0)
    n, L, V, MASK = 400, 50, 1000, 4
    ids = rng.integers(10, V, (n, L))
    maskable = np.ones((n, L), bool)
    maskable[:, 0] = maskable[:, -1] = False  # [CLS], [SEP]
    maskable[: n // 2, 40:] = False  # padding
    x, y = mask_tokens(ids, maskable, 0.15, np.random.default_rng(1), MASK, V)
    chosen = y != -100
    assert not chosen[~maskable].any() and (x[~maskable] == ids[~maskable]).all()
    assert abs(chosen.sum() / maskable.sum() - 0.15) < 0.01
    assert (y[chosen] == ids[chosen]).all()
    k = chosen.sum()
    as_mask = (x[chosen] == MASK).sum() / k
    kept = (x[chosen] == ids[chosen]).sum() / k
    other = 1 - as_mask - kept  # random replacements (a random draw equal to the original counts as kept)
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(other - 0.1) < 0.02
    assert (x[~chosen] == ids[~chosen]).all()


def test_whole_word_masking_masks_every_piece_of_a_chosen_word():
    ids = np.arange(100, 100 + 6 * 200).reshape(200, 6)
    word_ids = np.tile(np.array([-1, 0, 0, 1, 1, -1]), (200, 1))
    _, y = mask_tokens(ids, word_ids >= 0, 0.3, np.random.default_rng(0), 4, 2000, word_ids)
    ch = y != -100
    assert (ch[:, 1] == ch[:, 2]).all() and (ch[:, 3] == ch[:, 4]).all() and ch[:, 1].any()
    assert not ch[:, [0, 5]].any()


def test_stage2_batch_masks_40_percent_of_real_tokens_deterministically(stage2):
    m = stage2()
    sents = SENTS * 40
    b = m.build_batch(sents, micro=3)
    special = set(m.tokenizer.all_special_ids)
    maskable = (b["attention_mask"] == 1) & ~torch.tensor(np.isin(b["input_ids"].numpy(), list(special)))
    chosen = b["mlm_labels"] != -100
    assert not chosen[~maskable].any()
    assert abs(float(chosen.sum()) / float(maskable.sum()) - 0.4) < 0.03
    assert torch.equal(b["mlm_labels"][chosen], b["input_ids"][chosen])
    assert torch.equal(m.build_batch(sents, micro=3)["mlm_input_ids"], b["mlm_input_ids"])
    assert not torch.equal(m.build_batch(sents, micro=4)["mlm_labels"], b["mlm_labels"])
    v = stage2(aux_inputs="view").build_batch(SENTS, micro=3)  # one masked copy per view (code)
    assert v["mlm_input_ids"].shape[0] == 2 * len(SENTS)


# ------------------------------------------------------------------------------------ losses
def test_aux_mlm_loss_equals_an_explicit_per_sentence_recomputation(stage2):
    torch.manual_seed(0)
    m = stage2().eval()
    _shake(m.aux_head)
    b = m.build_batch(SENTS, micro=1)
    B, L, H = b["input_ids"].shape[0], b["input_ids"].shape[1], 32
    cls = torch.randn(B, H)
    lower = torch.randn(B, L - 1, H)
    got = aux_mlm_loss(cls, lower, b["mlm_labels"], m.aux_head, m.aux_mlm, attention_mask=b["attention_mask"])
    terms = []
    with torch.no_grad():
        for i in range(B):  # one sentence at a time, only its real tokens: no padding mask needed
            n = int(b["attention_mask"][i].sum())
            x = torch.cat([cls[i : i + 1], lower[i, : n - 1]])[None]
            for layer in m.aux_head:
                out = layer(x)
                x = out[0] if isinstance(out, tuple) else out
            t = m.aux_mlm
            hid = t.LayerNorm(torch.nn.functional.gelu(t.dense(x[0])))
            logits = (hid @ t.weight.T + t.bias).numpy()
            for j in range(n):
                if int(b["mlm_labels"][i, j]) != -100:
                    terms.append(_ce(logits[j], int(b["mlm_labels"][i, j])))
    assert terms
    assert float(got.detach()) == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_no_masked_token_gives_zero_not_nan(stage2):
    m = stage2()
    labels = torch.full((2, 5), -100)
    cls = torch.randn(2, 32, requires_grad=True)
    out = aux_mlm_loss(cls, torch.randn(2, 4, 32), labels, m.aux_head, m.aux_mlm)
    assert float(out) == 0.0 and out.requires_grad
    out.backward()


def test_stage1_losses_equal_explicit_masked_position_cross_entropy(tiny_bert_dir):
    torch.manual_seed(0)
    m = _make(InfoCSEPretrain, tiny_bert_dir, {"skip_from": 1}).eval()
    _shake(m.aux_head)
    b = m.build_batch(SENTS, micro=2)
    assert (b["mlm_labels"] != -100).any()
    terms = m.losses(b)
    with torch.no_grad():
        out = m.encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_hidden_states=True)
        W = m.encoder.embeddings.word_embeddings.weight  # shared output matrix (Eq. 6)
        t = m.mlm_head

        def logits_of(x):
            return (t.LayerNorm(torch.nn.functional.gelu(t.dense(x))) @ W.T + t.bias).numpy()

        mlm, aux = [], []
        for i in range(len(SENTS)):
            n = int(b["attention_mask"][i].sum())
            lg = logits_of(out.last_hidden_state[i, :n])
            x = torch.cat([out.last_hidden_state[i, :1], out.hidden_states[1][i, 1:n]])[None]  # [h; M^{>0}]
            for layer in m.aux_head:
                o = layer(x)
                x = o[0] if isinstance(o, tuple) else o
            la = logits_of(x[0])
            for j in range(n):
                y = int(b["mlm_labels"][i, j])
                if y != -100:
                    mlm.append(_ce(lg[j], y))
                    aux.append(_ce(la[j], y))
    assert float(terms["mlm"]) == pytest.approx(np.mean(mlm), rel=1e-5)
    assert float(terms["aux_mlm"]) == pytest.approx(np.mean(aux), rel=1e-5)
    assert float(terms["loss"]) == pytest.approx(np.mean(mlm) + np.mean(aux), rel=1e-5)
    assert set(terms) == {"loss", "aux_mlm", "mlm", "weighted"}


def test_lambda_zero_is_simcse_exactly(stage2, tiny_bert_dir):
    m = stage2(aux_weight=0.0)
    s = get_method("simcse")(m.encoder, m.tokenizer, {}, m.ctx)
    s.mlp.load_state_dict(m.mlp.state_dict())
    m.train(), s.train()
    b = m.build_batch(SENTS, micro=0)
    torch.manual_seed(7)
    ours = m.losses(b)
    torch.manual_seed(7)
    ref = s.losses(s.build_batch(SENTS, micro=0))
    assert torch.equal(ours["loss"], ref["loss"]) and torch.equal(ours["contrastive"], ref["contrastive"])
    assert float(ours["aux_mlm"]) > 0 and set(ours) == {"loss", "contrastive", "aux_mlm", "weighted"}
    m2 = stage2(aux_weight=0.5)
    m2.load_state_dict(m.state_dict())
    m2.train()
    torch.manual_seed(7)
    t = m2.losses(b)
    assert float(t["loss"]) == pytest.approx(float(t["contrastive"]) + 0.5 * float(t["aux_mlm"]), rel=1e-6)


# ------------------------------------------------------------------------------------ gradients
def test_aux_input_is_h_then_the_frozen_copys_detached_states(stage2):
    m = stage2()
    m.train()
    assert not m.aux_lower.training  # frozen copy stays in eval mode under train()
    b = m.build_batch(SENTS, micro=0)
    seen = {}
    m.aux_head[0].register_forward_hook(lambda mod, inp, out: seen.setdefault("x", inp[0]))
    torch.manual_seed(1)
    z1, z2, h = m.encode_views(b)
    m.aux_loss(h, b)
    x = seen["x"]
    n = len(SENTS)
    assert torch.equal(x[:, 0], h[:n])  # h: view 1's [CLS] of the unmasked sentence (aux_inputs: sentence)
    with torch.no_grad():
        ref = m.aux_lower(input_ids=b["mlm_input_ids"], attention_mask=b["attention_mask"],
                          token_type_ids=b["token_type_ids"]).last_hidden_state
    assert torch.allclose(x[:, 1:], ref[:, 1:], atol=1e-6)
    lower_keys = {k for k, _ in m.aux_lower.named_parameters()}
    assert len(m.aux_lower.encoder.layer) == 1 and all(not p.requires_grad for p in m.aux_lower.parameters())
    assert lower_keys  # a separate copy, not the main encoder's modules
    assert all(p is not q for p in m.aux_lower.parameters() for q in m.encoder.parameters())


def test_gradient_reaches_the_encoder_only_through_h_and_the_frozen_copy_gets_none(stage2):
    from sentemb.train.loop import build_optimizer

    m = stage2(aux_weight=1.0)
    m.train()
    opt_params = {id(p) for g in build_optimizer(m, 1e-3, 0.0, torch.device("cpu")).param_groups for p in g["params"]}
    assert not any(id(p) in opt_params for p in m.aux_lower.parameters())
    assert all(id(p) in opt_params for p in [*m.aux_head.parameters(), *m.aux_mlm.parameters(), *m.encoder.parameters()])
    b = m.build_batch(SENTS, micro=0)
    torch.manual_seed(0)
    m.losses(b)["loss"].backward()
    assert all(p.grad is None for p in m.aux_lower.parameters())
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in m.aux_head.parameters())
    assert float(m.aux_mlm.weight.grad.abs().sum()) > 0
    assert float(m.encoder.encoder.layer[-1].output.dense.weight.grad.abs().sum()) > 0

    # L_aux alone w.r.t. the main encoder's last-layer states: non-zero only at [CLS]
    m.zero_grad(set_to_none=True)
    doubled = {k: torch.cat([b[k], b[k]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    H = m.encoder(**doubled).last_hidden_state
    H.retain_grad()
    m.aux_loss(H[:, 0], b).backward()
    n = len(SENTS)
    assert torch.count_nonzero(H.grad[:, 1:]) == 0
    has_mask = (b["mlm_labels"] != -100).any(1)  # a sentence without a masked token adds nothing
    assert has_mask.sum() >= 4
    assert torch.equal(H.grad[:n, 0].abs().sum(-1) > 0, has_mask)  # view 1 feeds the auxiliary network
    assert torch.count_nonzero(H.grad[n:, 0]) == 0


def test_without_detach_the_lower_auxiliary_layers_are_trained(stage2):
    m = stage2(aux_weight=1.0, detach=False)
    m.train()
    assert m.aux_lower.training and all(p.requires_grad for p in m.aux_lower.parameters())
    torch.manual_seed(0)
    m.losses(m.build_batch(SENTS, micro=0))["loss"].backward()
    assert float(m.aux_lower.encoder.layer[0].output.dense.weight.grad.abs().sum()) > 0


# ------------------------------------------------------------------------------------ stages
def test_pretrain_output_is_what_stage2_starts_from(stage2, pretrained, tiny_bert_dir):
    meta = json.loads((pretrained / "infocse_aux.json").read_text())
    assert meta["skip_from"] == 1 and meta["head_layers"] == 2 and meta["step"] == 2
    enc = load_file(str(pretrained / "model.safetensors"))
    head = load_file(str(pretrained / "aux_head.safetensors"))
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    k = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(enc[k], base[k])  # stage 1 trained the encoder
    m = stage2()
    sd = m.encoder.state_dict()
    assert all(torch.equal(sd[key], enc[key]) for key in sd)  # main encoder from stage 1
    low = m.aux_lower.state_dict()
    assert all(torch.equal(low[key], enc[key]) for key in low)  # auxiliary lower layers from stage 1 too
    for key, v in m.aux_head.state_dict().items():
        assert torch.equal(v, head[f"c_head.{key}"])
    assert torch.equal(m.aux_mlm.weight, head["cls.predictions.decoder.weight"])
    assert torch.equal(head["cls.predictions.decoder.weight"], enc["embeddings.word_embeddings.weight"])  # tied W
    assert torch.equal(m.aux_mlm.dense.weight, head["cls.predictions.transform.dense.weight"])


def test_aux_checkpoint_skips_the_stage_and_refuses_a_headless_or_mismatched_one(tiny_bert_dir, pretrained, tmp_path):
    assert InfoCSE.requires(InfoCSE.make_args({})) == ("pretrained",)
    assert InfoCSE.requires(InfoCSE.make_args({"aux_checkpoint": str(pretrained)})) == ()
    assert InfoCSE.requires(InfoCSE.make_args({"init": "backbone"})) == ()
    m = _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(pretrained)})
    assert torch.equal(m.aux_mlm.bias, load_file(str(pretrained / "aux_head.safetensors"))["cls.predictions.bias"])
    with pytest.raises(SentembError, match=rf"{tiny_bert_dir}.*no auxiliary head layers"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(tiny_bert_dir)})
    from transformers import BertConfig, BertModel

    other = tmp_path / "wide"
    BertModel(BertConfig(vocab_size=80, hidden_size=48, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(other)
    with pytest.raises(SentembError, match=rf"{other}: hidden size 48 differs from the backbone's 32"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(other)})
    # a Condenser layout: HF weights with cls.predictions.* and the head layers in model.pt
    cond = tmp_path / "condenser"
    cond.mkdir()
    for f in ("config.json", "model.safetensors"):
        (cond / f).write_bytes((pretrained / f).read_bytes())
    head = load_file(str(pretrained / "aux_head.safetensors"))
    torch.save({k: v for k, v in head.items() if k.startswith("c_head.")}, cond / "model.pt")
    with pytest.raises(SentembError, match=rf"{cond}: no MLM head"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(cond)})


def test_no_pretraining_ablation_takes_the_backbones_layers(tiny_bert_dir):
    m = _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "init": "backbone"})
    top = m.encoder.encoder.layer[-2:].state_dict()
    assert all(torch.equal(v, top[k]) for k, v in m.aux_head.state_dict().items())


def test_layer_arguments_are_checked_against_the_backbone(tiny_bert_dir, pretrained):
    with pytest.raises(SentembError, match=r"skip_from = 6 .*methods\.infocse\.skip_from"):
        _make(InfoCSE, tiny_bert_dir, {"init": "backbone"})  # the paper's 6 on a 2-layer backbone
    with pytest.raises(SentembError, match=r"skip_from = 2 .*methods\.infocse\.skip_from"):
        _make(InfoCSEPretrain, tiny_bert_dir, {"skip_from": 2})
    with pytest.raises(SentembError, match=r"cls_layer = 3 .*methods\.infocse\.cls_layer"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "init": "backbone", "cls_layer": 3})
    with pytest.raises(SentembError, match=r"head_layers"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(pretrained), "head_layers": 3})


# ------------------------------------------------------------------------------------ config
def _config(**infocse):
    from sentemb.config.load import validate_config

    return validate_config({"backbones": {"b": {"hub_id": "x/b"}},
                            "methods": {"infocse": infocse},
                            "runs": [{"method": "infocse", "backbone": "b"}, {"method": "infocse", "backbone": "b",
                                                                               "name": "nopre", "method_args": {"init": "backbone"}}],
                            "seeds": [1, 2]})


def test_pretrain_stage_is_keyed_by_method_and_backbone_and_read_from_one_block():
    from sentemb.config.load import run_inputs
    from sentemb.train.pretrain import resolve_pretrain

    cfg = _config(pretrain={"max_steps": 7, "mask_unit": "word"})
    pre = resolve_pretrain(cfg, "infocse", "b")
    assert pre.run_name == "pretrain/infocse/b" and pre.rule == "pretrain"
    assert pre.train.max_steps == 7 and pre.train.lr == 1e-4 and pre.train.epochs == 8
    assert pre.train.model_selection == "last" and pre.method_args["pretrain"]["mask_unit"] == "word"
    assert run_inputs(cfg, "infocse", "b") == {"pretrained": "results/pretrain/infocse/b/model"}
    assert run_inputs(cfg, "nopre", "b") == {}
    with pytest.raises(SentembError, match=r"methods\.infocse\.pretrain\.epoch: unknown pretrain setting"):
        _config(pretrain={"epoch": 1})
    with pytest.raises(SentembError, match=r"methods\.infocse\.pretrain\.lr: "):
        _config(pretrain={"lr": -1})
    cfg["runs"][0]["method_args"] = {"pretrain": {"max_steps": 1}}
    with pytest.raises(SentembError, match=r"runs\[0\]\.method_args\.pretrain"):
        resolve_pretrain(cfg, "infocse", "b")
    with pytest.raises(SentembError, match="has no pretraining stage"):
        resolve_pretrain(cfg, "simcse", "b")


@pytest.mark.parametrize("key,value,good", [("lr", -1, 1e-4), ("epochs", "8", 8), ("max_steps", 0, 7),
                                            ("chunk_size", "big", 128), ("precision", "fp8", "bf16"),
                                            ("warmup_ratio", 2.0, 0.1)])
def test_pretrain_block_errors_match_jsonschema_validate(key, value, good):
    """The pretrain block's train keys are checked with validators built once; the message is the one
    ``jsonschema.validate`` (schema checked on every call, the best match of the errors) gives."""
    import jsonschema

    from sentemb.config.settings import section_schema
    from sentemb.methods.infocse import validate_pretrain_block

    schema = section_schema("train", defaults=False)["properties"][key]
    with pytest.raises(jsonschema.ValidationError) as ref:
        jsonschema.validate(value, schema)
    with pytest.raises(SentembError) as got:
        validate_pretrain_block({key: value}, "methods.infocse.pretrain")
    assert str(got.value) == f"methods.infocse.pretrain.{key}: {ref.value.message}"
    jsonschema.validate(good, schema)
    validate_pretrain_block({key: good}, "methods.infocse.pretrain")  # a good value passes


def test_pretrain_cli_resumes_bit_identically_and_logs_its_own_mlflow_run(tiny_bert_dir, pretrained, tmp_path):
    from mlflow.tracking import MlflowClient

    from sentemb.cli import main
    from sentemb.train.loop import train

    corpus = pretrained.parent.parent / "corpus.txt"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = _run(tiny_bert_dir, corpus, max_steps=3)
    run.tracking = TrackingSettings(enabled=True, uri=uri)
    (tmp_path / "pre.json").write_text(json.dumps(run.to_dict()))
    with pytest.raises(KeyboardInterrupt):  # a kill after step 1 (the shared loop's test hook)
        train(run, tmp_path / "resumed", method_cls=InfoCSEPretrain, stop_after=1, progress=False)
    assert (tmp_path / "resumed/.work/last.pt").is_file() and not (tmp_path / "resumed/model").exists()
    assert main(["pretrain", "--run-config", str(tmp_path / "pre.json"), "--output-dir", str(tmp_path / "resumed"),
                 "--quiet"]) == 0
    assert main(["pretrain", "--run-config", str(tmp_path / "pre.json"), "--output-dir", str(tmp_path / "full"),
                 "--quiet", "--no-track"]) == 0
    for f in ("model.safetensors", "aux_head.safetensors"):
        a, b = load_file(str(tmp_path / "full/model" / f)), load_file(str(tmp_path / "resumed/model" / f))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    assert not (tmp_path / "resumed/.work").exists()
    c = MlflowClient(tracking_uri=uri)
    (r,) = c.search_runs([c.get_experiment_by_name("t").experiment_id])
    assert r.info.run_name == "pretrain/infocse/tiny" and r.data.tags["rule"] == "pretrain"
    assert r.info.status == "FINISHED"
    assert {"train/loss", "train/aux_mlm", "train/mlm"} <= set(r.data.metrics)
    assert sorted(m.step for m in c.get_metric_history(r.info.run_id, "train/loss")) == [1, 2, 3]


def test_code_switches_run(stage2):
    for args in ({"mlp": "batchnorm", "aux_inputs": "view"}, {"mlp": "none", "cls_layer": 1}):
        m = stage2(aux_weight=1.0, **args)
        m.train()
        t = m.losses(m.build_batch(SENTS, micro=0))
        assert torch.isfinite(t["loss"]) and float(t["aux_mlm"]) > 0
        t["loss"].backward()
        assert float(m.aux_head[0].output.dense.weight.grad.abs().sum()) > 0


def test_aux_mlm_loss_takes_a_bare_output_matrix():
    torch.manual_seed(0)
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    layers = torch.nn.ModuleList([BertLayer(BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16))])
    layers.eval()
    W = torch.randn(11, 8)
    cls, lower = torch.randn(2, 8), torch.randn(2, 3, 8)
    labels = torch.tensor([[-100, 3, -100, -100], [-100, -100, -100, 7]])
    got = aux_mlm_loss(cls, lower, labels, layers, W)
    with torch.no_grad():
        x = layers[0](torch.cat([cls[:, None], lower], 1))
        x = x[0] if isinstance(x, tuple) else x
        ref = (_ce((x[0, 1] @ W.T).numpy(), 3) + _ce((x[1, 3] @ W.T).numpy(), 7)) / 2
    assert float(got.detach()) == pytest.approx(ref, rel=1e-5)


def test_head_init_random_starts_the_head_layers_fresh_as_the_authors_scripts(tiny_bert_dir, pretrained, tmp_path):
    """The authors' scripts name the Hub's headless Condenser: train_cls_mlm.py loads model.pt only from a
    local directory, so c_head keeps init_weights' draw (Linear N(0, initializer_range), biases 0,
    LayerNorm 1/0) while the encoder and the MLM head come from the checkpoint."""
    from safetensors.torch import save_file

    head = load_file(str(pretrained / "aux_head.safetensors"))
    headless = tmp_path / "condenser-headless"  # HF weights with cls.predictions.*, no c_head anywhere
    headless.mkdir()
    (headless / "config.json").write_bytes((pretrained / "config.json").read_bytes())
    weights = load_file(str(pretrained / "model.safetensors"))
    save_file({**{f"bert.{k}": v for k, v in weights.items()},
               **{k: v.contiguous() for k, v in head.items() if k.startswith("cls.predictions.")}},
              str(headless / "model.safetensors"))
    with pytest.raises(SentembError, match=rf"{headless}: no auxiliary head layers.*head_init: random"):
        _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "aux_checkpoint": str(headless)})
    std = json.loads((tiny_bert_dir / "config.json").read_text())["initializer_range"]
    makers = {"headless": {"aux_checkpoint": str(headless)}, "stage 1": {}, "backbone": {"init": "backbone"}}
    for what, extra in makers.items():
        m = _make(InfoCSE, tiny_bert_dir, {"skip_from": 1, "head_init": "random", **extra}, {"pretrained": pretrained})
        state = m.aux_head.state_dict()
        pre = {k[len("c_head."):]: v for k, v in head.items() if k.startswith("c_head.")}
        top = m.encoder.encoder.layer[-2:].state_dict()
        ws = [v for k, v in state.items() if k.endswith(".weight") and v.dim() == 2]
        assert len(ws) == 2 * 6, what  # q, k, v, attention output, intermediate, output per layer
        flat = torch.cat([w.flatten() for w in ws])
        assert abs(float(flat.std()) / std - 1) < 0.05 and abs(float(flat.mean())) < 0.1 * std, what
        for k, v in state.items():
            if "LayerNorm.weight" in k:
                assert torch.equal(v, torch.ones_like(v)), (what, k)
            elif k.endswith(".bias"):
                assert torch.equal(v, torch.zeros_like(v)), (what, k)
            if v.dim() == 2:  # neither the checkpoint's head layers nor the backbone's upper layers
                assert not torch.equal(v, pre[k]) and not torch.equal(v, top[k]), (what, k)
        if what != "backbone":  # the MLM head and the encoder still come from the checkpoint
            assert torch.equal(m.aux_mlm.bias, head["cls.predictions.bias"]), what
            assert torch.equal(m.encoder.embeddings.word_embeddings.weight,
                               weights["embeddings.word_embeddings.weight"]), what
        assert all(p.requires_grad for p in m.aux_head.parameters()), what


@pytest.mark.parametrize("names", ["today", "google"])
def test_aux_checkpoint_model_takes_encoder_lower_copy_and_mlm_head_from_the_loaded_checkpoint(tiny_bert_dir, tmp_path,
                                                                                          names):
    """``aux_checkpoint: model`` (infocse-code with ``runs[].weights``: the Hub's Condenser): the encoder, the
    frozen lower copy and the MLM head are the run's own model's, as ``train_cls_mlm.py`` loads them from
    ``--model_name_or_path``; the head layers fresh (``head_init: random``); no stage-1 input is declared.
    ``google``: the checkpoint names its LayerNorm tensors gamma/beta, as the Hub's BERT and Condenser
    files of that age do."""
    from conftest import mlm_checkpoint

    d, ref = mlm_checkpoint(tiny_bert_dir, tmp_path / "condenser", legacy=names == "google", seed=4)
    args = {"skip_from": 1, "aux_checkpoint": "model", "head_init": "random"}
    assert InfoCSE.requires(InfoCSE.make_args(InfoCSE.resolve_args(args))) == ()
    m = _make(InfoCSE, d, args)
    want = ref.bert.state_dict()
    for k, v in m.encoder.state_dict().items():
        assert torch.equal(v, want[k]), k
    for k, v in m.aux_lower.state_dict().items():
        assert torch.equal(v, want[k]), k
    p = ref.cls.predictions
    assert torch.equal(m.aux_mlm.dense.weight, p.transform.dense.weight) and torch.equal(m.aux_mlm.bias, p.bias)
    assert torch.equal(m.aux_mlm.LayerNorm.weight, p.transform.LayerNorm.weight)
    # a checkpoint without one: the head starts fresh (W = the word embeddings), as the code's lm_head would
    bare = _make(InfoCSE, tiny_bert_dir, args)
    assert torch.equal(bare.aux_mlm.W, bare.encoder.get_input_embeddings().weight) and not bare.aux_mlm.bias.any()
