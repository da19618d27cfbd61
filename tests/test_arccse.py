"""ArcCSE (methods.md §5) and SAM (train.sam_rho): each equation against an independent float64
computation written with explicit loops and angles, gradient flow, dropout on/off, nested masking,
and a hand-computed SAM + AdamW step on a two-parameter model."""

import contextlib
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sentemb import SentembError, testing
from sentemb.methods import WEIGHTED, MethodContext, get_method
from sentemb.methods.arccse import arccon_loss, nested_span_masks, positive_logit, triplet_loss
from sentemb.methods.simcse import info_nce
from sentemb.model.backbone import load_encoder

LONG = [  # >= 25 words each (from the tiny vocabulary)
    "the man plays the guitar in the park and the dog runs in the street with a cat that sits on the mat "
    "in the old house by the tree",
    "a woman eats an apple in the city and she is playing the piano for two old man who are sitting "
    "in the sun by the water and the sky is blue",
    "there is a big red car in the street and a small blue car by the house and they are very old and "
    "not good for the city here",
]
SHORT = ["a man plays the guitar", "the dog runs in the park", "red car", "a cat sits on the mat"]


# ------------------------------------------------------------------------------------ references
def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def ref_psi(theta: float, m: float, beyond_pi: str = "shift") -> float:
    """The positive logit from the angle itself: cos(θ+m), or past π the documented continuation."""
    if beyond_pi == "raw" or theta + m <= math.pi:
        return math.cos(theta + m)
    return math.cos(theta) - (1 - math.cos(m))


def ref_arccon(h, hp, margin_deg, tau, beyond_pi="shift", sin_eps=None) -> float:
    """ArcCSE Eq. 3 with explicit loops over angles θ_ij = arccos cos(h_i, h_j⁺), float64. With
    ``sin_eps`` the issue's sin θ = √max(1 − cos²θ, ε) replaces sin(θ) (matters only near θ = 0, π)."""
    m = math.radians(margin_deg)
    B = len(h)
    total = 0.0
    for i in range(B):
        theta = [math.acos(max(-1.0, min(1.0, _cos(h[i], hp[j])))) for j in range(B)]
        psi = ref_psi(theta[i], m, beyond_pi)
        if sin_eps is not None and (beyond_pi == "raw" or theta[i] + m <= math.pi):
            c = math.cos(theta[i])
            psi = c * math.cos(m) - math.sqrt(max(1 - c * c, sin_eps)) * math.sin(m)
        pos = math.exp(psi / tau)
        neg = sum(math.exp(math.cos(theta[j]) / tau) for j in range(B) if j != i)
        total += -math.log(pos / (pos + neg))
    return total / B


def ref_nt_xent(h, hp, tau) -> float:
    B = len(h)
    return sum(-math.log(math.exp(_cos(h[i], hp[i]) / tau) / sum(math.exp(_cos(h[i], hp[j]) / tau) for j in range(B)))
               for i in range(B)) / B


def ref_triplet(h, h1, h2, margin=0.0) -> float:
    vals = [max(0.0, _cos(h[k], h2[k]) - _cos(h[k], h1[k]) + margin) for k in range(len(h))]
    return sum(vals) / len(vals) if vals else 0.0


def t32(x):
    return torch.tensor(np.asarray(x), dtype=torch.float32)


# ------------------------------------------------------------------------------------ ArcCon
@pytest.mark.parametrize("margin", [0.0, 10.0, 25.0])
def test_arccon_matches_angle_loop(margin):
    rng = np.random.default_rng(1)
    h, hp = rng.normal(size=(7, 6)), rng.normal(size=(7, 6))
    hp[:3] = h[:3] + 0.3 * rng.normal(size=(3, 6))  # some close positives, some random
    got = arccon_loss(t32(h), t32(hp), margin, 0.05).item()
    assert got == pytest.approx(ref_arccon(h, hp, margin, 0.05), rel=2e-5)


def test_arccon_beyond_pi_matches_reference_in_both_modes():
    rng = np.random.default_rng(2)
    h = rng.normal(size=(5, 4))
    hp = -h + 0.05 * rng.normal(size=(5, 4))  # θ_ii close to π: θ_ii + 10° > π for every i
    for i in range(5):
        assert math.acos(_cos(h[i], hp[i])) + math.radians(10) > math.pi
    for mode in ("shift", "raw"):
        got = arccon_loss(t32(h), t32(hp), 10.0, 0.05, beyond_pi=mode).item()
        assert got == pytest.approx(ref_arccon(h, hp, 10.0, 0.05, mode), rel=2e-5)


def test_arccon_at_zero_margin_is_nt_xent_and_larger_with_a_margin():
    rng = np.random.default_rng(3)
    for trial in range(5):
        h, hp = rng.normal(size=(6, 8)), rng.normal(size=(6, 8))
        if trial % 2:
            hp = h + 0.5 * rng.normal(size=(6, 8))
        nt = ref_nt_xent(h, hp, 0.05)
        assert arccon_loss(t32(h), t32(hp), 0.0, 0.05).item() == pytest.approx(nt, rel=2e-5, abs=1e-6)
        assert torch.equal(arccon_loss(t32(h), t32(hp), 0.0, 0.05), info_nce(t32(h), t32(hp), 0.05))
        thetas = [math.acos(_cos(h[i], hp[i])) for i in range(6)]
        assert all(t + math.radians(10) <= math.pi for t in thetas)
        assert arccon_loss(t32(h), t32(hp), 10.0, 0.05).item() > nt + 1e-3


def test_positive_logit_is_non_increasing_on_0_pi_and_continuous_at_the_switch():
    theta = np.linspace(0.0, math.pi, 20001)
    cos = torch.tensor(np.cos(theta), dtype=torch.float64)
    psi = positive_logit(cos, 10.0, sin_eps=1e-12).numpy()
    assert np.all(np.diff(psi) <= 1e-12)
    m = math.radians(10)
    np.testing.assert_allclose(psi, [ref_psi(t, m) for t in theta], atol=1e-6)  # sin_eps costs ≤ 1e-6 at the ends
    assert np.all(psi <= np.cos(theta) + 1e-12)  # never above NT-Xent's logit
    below, above = positive_logit(torch.tensor([math.cos(math.pi - m - 1e-9), math.cos(math.pi - m + 1e-9)],
                                               dtype=torch.float64), 10.0, sin_eps=1e-12)
    assert abs(float(below) - float(above)) < 1e-7 and float(below) == pytest.approx(-1.0, abs=1e-7)
    # the literal cos(θ+m) rises again past π − m: what the "shift" continuation prevents
    raw = positive_logit(cos, 10.0, beyond_pi="raw", sin_eps=1e-12).numpy()
    assert np.max(np.diff(raw)) > 1e-6


@pytest.mark.parametrize("mode", ["shift", "raw"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_arccon_gradient_is_finite_at_cos_plus_minus_one(mode, sign):
    h = torch.randn(4, 6, requires_grad=True)
    hp = (sign * h.detach()).clone().requires_grad_(True)  # cos θ_ii = ±1 exactly (up to rounding)
    loss = arccon_loss(h, hp, 10.0, 0.05, beyond_pi=mode)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(h.grad).all() and torch.isfinite(hp.grad).all()
    assert h.grad.abs().sum() > 0


def test_arccon_gradient_in_a_compiled_step_is_the_fp64_one():
    """Views whose positives have cos < 1 (dropout on): the gradient of ArcCon called from a compiled
    function, after a compiled run's set-up (``ArcCSE.prepare_compile``), is the fp64 one. Inductor's
    own was 16-54% off on the CPU; the loss is kept eager (``torch.compiler.disable``)."""
    from sentemb.methods import arccse

    get_method("arccse").prepare_compile()
    torch.manual_seed(0)
    z = torch.randn(16, 32)
    z1, z2 = z + 0.3 * torch.randn(16, 32), z + 0.3 * torch.randn(16, 32)

    def grad(fn, dtype):
        a, b = z1.to(dtype).clone().requires_grad_(), z2.to(dtype).clone().requires_grad_()
        fn(a, b).backward()
        return a.grad.double()

    torch._dynamo.reset()
    compiled = grad(torch.compile(lambda a, b: arccse.arccon_loss(a * 1.0, b * 1.0) * 2.0), torch.float32) / 2
    ref = grad(arccon_loss, torch.float64)
    assert float((compiled - ref).norm() / ref.norm()) < 1e-5
    torch._dynamo.reset()


def test_arccon_is_fp32_under_bf16_autocast():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = arccon_loss(torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16(), 10.0, 0.05)
    assert loss.dtype == torch.float32


# ------------------------------------------------------------------------------------ triplets
def test_triplet_loss_zero_when_the_less_masked_view_is_closer_positive_otherwise():
    rng = np.random.default_rng(4)
    h = rng.normal(size=(5, 6))
    near, far = h + 0.1 * rng.normal(size=(5, 6)), h + 2.0 * rng.normal(size=(5, 6))
    assert triplet_loss(t32(h), t32(near), t32(far)).item() == 0.0
    swapped = triplet_loss(t32(h), t32(far), t32(near)).item()
    assert swapped > 0 and swapped == pytest.approx(ref_triplet(h, far, near), rel=1e-5)
    mixed1, mixed2 = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
    for margin in (0.0, 0.2):
        assert triplet_loss(t32(h), t32(mixed1), t32(mixed2), margin).item() == pytest.approx(
            ref_triplet(h, mixed1, mixed2, margin), rel=1e-5, abs=1e-7)
    empty = triplet_loss(torch.zeros(0, 6), torch.zeros(0, 6), torch.zeros(0, 6))
    assert empty.item() == 0.0 and torch.isfinite(empty)


# ------------------------------------------------------------------------------------ masking
def _runs(row):
    """(start, length) of each maximal run of True."""
    out, start = [], None
    for i, v in enumerate(list(row) + [False]):
        if v and start is None:
            start = i
        if not v and start is not None:
            out.append((start, i - start))
            start = None
    return out


def test_nested_span_masks_rates_nesting_and_determinism():
    for n in range(0, 80):
        masks = nested_span_masks(n, (0.2, 0.4), np.random.default_rng([7, n]))
        assert masks.shape == (2, n) and masks.dtype == bool
        for k, rate in enumerate((0.2, 0.4)):
            assert abs(int(masks[k].sum()) - rate * n) <= 1  # within ±1 unit (exactly the rounded count)
            assert int(masks[k].sum()) == int(math.floor(rate * n + 0.5))
        assert np.all(masks[1] >= masks[0])  # the 40% set contains the 20% set
        again = nested_span_masks(n, (0.2, 0.4), np.random.default_rng([7, n]))
        assert np.array_equal(masks, again)


def test_nested_span_masks_are_contiguous_spans():
    # one span long enough for the whole budget: the 20% mask is one contiguous run, and the 40%
    # mask grows from it by whole spans (each new one a contiguous piece, possibly merged)
    for seed in range(30):
        masks = nested_span_masks(50, (0.2, 0.4), np.random.default_rng(seed), span_p=1e-9, max_span=50)
        assert len(_runs(masks[0])) == 1 and _runs(masks[0])[0][1] == 10
        assert len(_runs(masks[1])) <= 3 and sum(n for _, n in _runs(masks[1])) == 20
    # default SpanBERT lengths: far fewer runs than masked units (spans, not scattered tokens)
    rng = np.random.default_rng(0)
    n_runs = n_masked = 0
    for _ in range(200):
        m = nested_span_masks(40, (0.2, 0.4), rng)[1]
        n_runs += len(_runs(m))
        n_masked += int(m.sum())
    assert n_runs < 0.6 * n_masked
    # span_p = 1: every span has length 1 (the geometric law is what sets the lengths)
    m = nested_span_masks(1000, (0.2,), np.random.default_rng(0), span_p=1.0)[0]
    assert sum(length for _, length in _runs(m)) == 200 and len(_runs(m)) > 100


def test_nested_span_masks_refuses_decreasing_rates():
    with pytest.raises(SentembError, match="non-decreasing"):
        nested_span_masks(10, (0.4, 0.2), np.random.default_rng(0))


# ------------------------------------------------------------------------------------ the method
def _method(tiny_bert_dir, seed=0, **args):
    torch.manual_seed(0)
    enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
    return get_method("arccse")(enc, tok, args, MethodContext(max_len=16, seed=seed))


def _words_of_row(tok, ids, att):
    return [tok.convert_ids_to_tokens(int(i)) for i, a in zip(ids, att) if a]


def test_triplet_rows_mask_whole_words_nested_at_20_and_40_percent(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    batch = m.build_batch(SHORT[:2] + LONG, micro=3)
    assert batch["input_ids"].shape[1] <= 16  # ArcCon truncates at max_len; the triplets do not
    ids, att = batch["tri_input_ids"], batch["tri_attention_mask"]
    T = len(LONG)
    assert ids.shape[0] == 3 * T
    for k, sent in enumerate(LONG):
        full = _words_of_row(m.tokenizer, ids[k], att[k])
        assert full == m.tokenizer.convert_ids_to_tokens(m.tokenizer(sent)["input_ids"])  # s itself, untruncated
        words = sent.split()  # the tiny vocabulary has one piece per word
        masked = []
        for v in (1, 2):
            row = _words_of_row(m.tokenizer, ids[v * T + k], att[v * T + k])
            assert len(row) == len(full) and row[0] == "[CLS]" and row[-1] == "[SEP]"
            hidden = {i for i, t in enumerate(row[1:-1]) if t == "[MASK]"}
            assert all(row[1 + i] == words[i] for i in range(len(words)) if i not in hidden)
            masked.append(hidden)
        assert len(masked[0]) == int(math.floor(0.2 * len(words) + 0.5))
        assert len(masked[1]) == int(math.floor(0.4 * len(words) + 0.5))
        assert masked[0] <= masked[1]
    # deterministic in (seed, micro); another micro masks elsewhere
    same = _method(tiny_bert_dir).build_batch(SHORT[:2] + LONG, micro=3)
    assert all(torch.equal(batch[k], same[k]) for k in batch)
    other = m.build_batch(SHORT[:2] + LONG, micro=4)
    assert not torch.equal(other["tri_input_ids"], ids)


def test_delete_and_token_units(tiny_bert_dir):
    m = _method(tiny_bert_dir, mask_replace="delete")
    b = m.build_batch(LONG, micro=0)
    lens = b["tri_attention_mask"].sum(1).tolist()
    T = len(LONG)
    for k, sent in enumerate(LONG):
        n = len(sent.split())
        assert lens[k] - lens[T + k] == int(math.floor(0.2 * n + 0.5))
        assert lens[k] - lens[2 * T + k] == int(math.floor(0.4 * n + 0.5))
    # word pieces as the unit: a word split into pieces can be partly masked
    m = _method(tiny_bert_dir, mask_unit="tokens")
    sent = " ".join(["xy"] * 30)  # 30 words of 2 pieces each: 60 pieces
    b = m.build_batch([sent], micro=0)
    assert int(b["tri_attention_mask"][0].sum()) == 62
    row = b["tri_input_ids"][1][b["tri_attention_mask"][1].bool()]
    assert int((row == m.tokenizer.mask_token_id).sum()) == 12  # 20% of 60 pieces, not of 30 words


def test_no_long_sentence_gives_a_zero_finite_triplet_term(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    m.train()
    batch = m.build_batch(SHORT, micro=0)
    assert batch["tri_input_ids"].shape[0] == 0
    terms = m.losses(batch)
    assert terms["triplet"].item() == 0.0 and terms["triplets"].item() == 0.0
    assert torch.isfinite(terms["loss"]) and terms["loss"].item() == pytest.approx(terms["arccon"].item())
    terms["loss"].backward()


def test_loss_equals_reference_on_model_outputs(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    m.eval()  # both ArcCon views identical without dropout, so the reference can recompute them
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # a random model whose triplet term is not zero
    batch = m.build_batch(SHORT + LONG, micro=1)
    terms = m.losses(batch)
    with torch.no_grad():
        z = m.mlp(m.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                  .last_hidden_state[:, 0]).double().numpy()
        cls = m.encoder(input_ids=batch["tri_input_ids"], attention_mask=batch["tri_attention_mask"]).last_hidden_state[:, 0]
        h = m.mlp(cls).double().numpy()
    T = len(LONG)
    # identical views: θ_ii = 0, where the ε of sin θ = √max(1 − cos²θ, ε) is what sets the logit
    arc, tri = ref_arccon(z, z, 10.0, 0.05, sin_eps=1e-6), ref_triplet(h[:T], h[T:2 * T], h[2 * T:])
    assert terms["arccon"].item() == pytest.approx(arc, rel=1e-4)
    assert terms["triplet"].item() == pytest.approx(tri, rel=1e-4, abs=1e-7)
    assert terms["triplets"].item() == T and tri > 0  # both terms matter here
    assert terms["loss"].item() == pytest.approx(arc + 0.1 * tri, rel=1e-4)


def test_triplets_without_dropout_arccon_with_it_and_gradients_through_every_view(tiny_bert_dir):
    m = _method(tiny_bert_dir)
    m.train()
    batch = m.build_batch(SHORT + LONG, micro=0)
    h1, h2 = m.encode_triplets(batch), m.encode_triplets(batch)
    assert torch.equal(h1, h2)  # dropout off: the same embeddings twice
    assert m.encoder.training and all(mod.training for mod in m.encoder.modules())  # mode restored
    z1, z2 = m.encode_views({k: v for k, v in batch.items() if not k.startswith("tri_")})
    assert not torch.allclose(z1, z2)  # ArcCon's views still differ by dropout
    # the triplet term's gradient reaches s, s′ and s″ (nothing detached) and the encoder
    T = len(LONG)
    h = m.encode_triplets(batch)
    h.retain_grad()
    loss = triplet_loss(h[:T], h[T:2 * T], h[2 * T:], margin=1.0)  # margin 1: every triplet active
    loss.backward()
    for v in range(3):
        assert h.grad[v * T:(v + 1) * T].abs().sum() > 0
    assert m.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert m.mlp.dense.weight.grad.abs().sum() > 0


def test_triplet_mlp_switch_and_ablations(tiny_bert_dir):
    m = _method(tiny_bert_dir, triplet_mlp=False)
    m.eval()
    batch = m.build_batch(LONG, micro=0)
    with torch.no_grad():
        cls = m.encoder(input_ids=batch["tri_input_ids"], attention_mask=batch["tri_attention_mask"]).last_hidden_state[:, 0]
        assert torch.allclose(m.encode_triplets(batch), cls)
    m = _method(tiny_bert_dir, triplet=False)
    b = m.build_batch(LONG, micro=0)
    assert b["tri_input_ids"].shape[0] == 0 and m.losses(b)["triplets"].item() == 0
    m = _method(tiny_bert_dir, arccon=False)
    m.eval()
    b = m.build_batch(SHORT, micro=0)
    with torch.no_grad():
        z = m.mlp(m.encoder(**{k: v for k, v in b.items() if not k.startswith("tri_")}).last_hidden_state[:, 0])
        assert m.losses(b)["arccon"].item() == pytest.approx(ref_nt_xent(z.double().numpy(), z.double().numpy(), 0.05),
                                                             rel=1e-4)


def test_eval_pooler_is_raw_cls():
    cls = get_method("arccse")
    assert cls.pooler_for(cls.make_args({})) == "cls_before_pooler"


def test_bad_arguments_name_the_key(tiny_bert_dir):
    cls = get_method("arccse")
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.mask_rate/mask_rate_large: .* must not exceed"):
        cls.check(cls.make_args({"mask_rate": 0.5, "mask_rate_large": 0.4}), {}, "runs[1].method_args")
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.triplet_mlp: true needs an MLP"):
        cls.check(cls.make_args({"mlp": "none"}), {}, "runs[1].method_args")
    cls.check(cls.make_args({"mlp": "none", "triplet_mlp": False}), {}, "runs[1].method_args")
    with pytest.raises(SentembError, match=r"runs\[1\]\.method_args\.mask_unit: 'chars' is not one of"):
        cls.validate_args({"mask_unit": "chars"}, "runs[1].method_args")
    with pytest.raises(SentembError, match=r"method 'arccse'\.margin_deg: -1\.0 is below the minimum 0"):
        _method(tiny_bert_dir, margin_deg=-1.0)
    with pytest.raises(SentembError, match=r"margin_deg: 200 must be less than 180"):
        cls.validate_args({"margin_deg": 200}, "runs[0].method_args")


# ------------------------------------------------------------------------------------ SAM
class Quadratic(torch.nn.Module):
    """L(w; x, a) = Σ_k a_k x_k (w_k − c_k)² + w_1 w_2 with a = torch.rand(2): a stand-in for a
    dropout mask drawn from the global RNG on every forward."""

    c = (0.3, -0.2)

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([[0.7, -1.1]]))  # 2-D: AdamW's weight-decay group
        self.seen = []  # (w, a) of every forward

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        return {"x": torch.tensor([1.0 + len(sentences[0]), 2.0 + micro], dtype=torch.float32)}

    def losses(self, batch):
        a = torch.rand(2)
        self.seen.append((self.w.detach().clone().double(), a.double()))
        w = self.w[0]
        loss = (a * batch["x"] * (w - torch.tensor(self.c)) ** 2).sum() + w[0] * w[1]
        return {"loss": loss}


def grad_q(w, x, a):
    """∇L of Quadratic, by hand, float64."""
    c = np.array(Quadratic.c)
    return 2 * a * x * (w - c) + np.array([w[1], w[0]])


def _quadratic_job(rho, accum=2, lr=0.1, wd=0.1):
    from sentemb.train.loop import State, build_optimizer, lr_lambda
    from sentemb.train.step import strategy_for

    model = Quadratic()
    opt = build_optimizer(model, lr, wd, torch.device("cpu"))
    from sentemb.config.settings import TrainSettings

    job = SimpleNamespace(settings=TrainSettings(sam_rho=rho, grad_clip=None), accum=accum, micro=[np.array([i, i + 1]) for i in range(8)],
                          sentences=["ab", "abc", "abcd", "a", "abcde", "ab", "abc", "abcdef", "a"],
                          method=model, device=torch.device("cpu"), amp=None, step_fn=model.losses, opt=opt,
                          sched=torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda("constant", 10, 0)),
                          scaler=torch.amp.GradScaler("cpu", enabled=False), prefetch=None)
    job.strategy = strategy_for(job, "the quadratic job")
    return job, State()


def _hand_steps(rho, n_steps, accum=2, lr=0.1, wd=0.1, betas=(0.9, 0.999), eps=1e-8):
    """SAM (Foret et al. Eqs. 2-3) + AdamW (Loshchilov & Hutter), by hand; 'dropout masks' a drawn
    from the global RNG in the loop's order (step k: micro-batches k·accum…, pass 1 then pass 2)."""
    job, _ = _quadratic_job(rho, accum, lr, wd)
    w = np.array([0.7, -1.1])
    m = v = np.zeros(2)
    perturbed = []
    for t in range(1, n_steps + 1):
        xs = []
        for k in range(accum):
            mi = (t - 1) * accum + k
            xs.append(job.method.build_batch([job.sentences[job.micro[mi][0]]], micro=mi)["x"].double().numpy())
        a = [torch.rand(2).double().numpy() for _ in range(accum)]  # the same draws in both passes
        g = sum(grad_q(w, xs[k], a[k]) for k in range(accum)) / accum
        if rho:
            e = rho * g / (np.linalg.norm(g) + 1e-12)
            perturbed.append(w + e)
            g = sum(grad_q(w + e, xs[k], a[k]) for k in range(accum)) / accum
        w = w * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        mhat, vhat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        w = w - lr * mhat / (np.sqrt(vhat) + eps)
    return w, perturbed


@pytest.mark.parametrize("rho", [0.05, None])
def test_sam_step_equals_hand_computed_sam_adamw(rho):
    from sentemb.train.loop import optimizer_step

    torch.manual_seed(11)
    want, perturbed = _hand_steps(rho, 3)
    torch.manual_seed(11)
    job, state = _quadratic_job(rho)
    for _ in range(3):
        optimizer_step(job, state)
    np.testing.assert_allclose(job.method.w.detach().double().numpy()[0], want, rtol=1e-5, atol=1e-6)
    seen = job.method.seen
    if rho:
        assert len(seen) == 3 * 2 * 2  # 3 steps x 2 passes x 2 micro-batches
        for step in range(3):
            first, second = seen[4 * step: 4 * step + 2], seen[4 * step + 2: 4 * step + 4]
            for (w1, a1), (w2, a2) in zip(first, second):
                assert torch.equal(a1, a2)  # the second pass sees the first pass's "dropout masks"
                np.testing.assert_allclose(w2.numpy()[0], perturbed[step], rtol=1e-6)  # w + ρ·g/‖g‖
    else:
        assert len(seen) == 3 * 2
    # SAM changes the update (the test would not tell them apart otherwise)
    if rho:
        plain, _ = _hand_steps(None, 3)
        assert np.abs(plain - want).max() > 1e-4


def test_sam_restores_weights_exactly():
    from sentemb.train import sam

    p = torch.nn.Parameter(torch.randn(5, 3))
    p.grad = torch.randn(5, 3)
    before = p.detach().clone()
    saved = sam.ascend([p], 0.05)
    e = p.detach() - before
    assert float(torch.linalg.vector_norm(e)) == pytest.approx(0.05, rel=1e-5)
    np.testing.assert_allclose(e.numpy(), (0.05 * p.grad / p.grad.norm()).numpy(), rtol=1e-4, atol=1e-7)
    sam.restore(saved)
    assert torch.equal(p.detach(), before)
    q = torch.nn.Parameter(torch.ones(2))
    q.grad = torch.zeros(2)  # zero gradient: no perturbation, no NaN
    sam.restore(sam.ascend([q], 0.05))
    assert torch.equal(q.detach(), torch.ones(2))


def test_sam_perturbs_every_tensor_in_a_fixed_number_of_ops():
    """``sam.ascend`` / ``restore`` over many parameter tensors: w + ρ·g/‖g‖ per element against a
    per-tensor reference (‖g‖ from the per-tensor norms, Foret et al.'s global norm), tensors
    without a gradient left alone, w back bit-exactly, the saved tensors reused when passed as
    ``into``, and the dispatched ops a fixed number whatever the number of tensors (multi-tensor
    ops: host time an eager GPU step would otherwise pay per tensor)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from sentemb.train import sam

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[func.__name__] += 1
            return func(*args, **(kwargs or {}))

    def params(n):
        torch.manual_seed(n)
        ps = [torch.nn.Parameter(torch.randn(3 + i % 4, 2)) for i in range(n)]
        for p in ps[:-1]:
            p.grad = torch.randn_like(p)
        return ps  # the last has no gradient

    ops = {}
    for n in (8, 64):
        ps = params(n)
        before = [p.detach().clone() for p in ps]
        scale = 0.05 / math.sqrt(sum(float(p.grad.double().norm()) ** 2 for p in ps[:-1]))
        saved = sam.ascend(ps, 0.05)
        for p, b in zip(ps[:-1], before):
            torch.testing.assert_close(p.detach(), b + scale * p.grad, rtol=1e-6, atol=1e-7)
        assert torch.equal(ps[-1].detach(), before[-1]) and len(saved) == n - 1
        sam.restore(saved)
        assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before))
        with Count() as c:  # a step after the first: its saved tensors reused
            again = sam.ascend(ps, 0.05, into=[w for _, w in saved])
            sam.restore(again)
        ops[n] = sum(c.n.values())
        assert all(w2 is w for (_, w2), (_, w) in zip(again, saved))
        assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before))
    assert ops[8] == ops[64] <= 30, ops


def test_sam_with_fp16_is_refused_naming_the_key(tiny_bert_dir, tiny_senteval, tmp_path):
    from test_method_contract import run_cfg

    from sentemb.train.loop import setup

    inputs = {"corpus": tmp_path / "c.txt", "inputs": {}, "args": {}}
    cfg = run_cfg("arccse", tiny_bert_dir, inputs, tiny_senteval, precision="fp16", sam_rho=0.05)
    with pytest.raises(SentembError, match=r"train\.sam_rho .*train\.precision fp16"):
        setup(cfg, tmp_path / "out")


def test_sam_rho_in_the_schema():
    from sentemb.config.load import validate_config

    base = {"backbones": {"b": {"hub_id": "x/y"}}, "runs": [{"method": "arccse", "backbone": "b"}]}
    cfg = validate_config({**base, "train": {"sam_rho": 0.05}})
    assert cfg["train"]["sam_rho"] == 0.05
    assert validate_config(dict(base))["train"]["sam_rho"] is None
    with pytest.raises(SentembError, match=r"runs\[0\]\.train\.sam_rho"):
        validate_config({**base, "runs": [{"method": "arccse", "backbone": "b", "train": {"sam_rho": -1}}]})
    with pytest.raises(SentembError, match=r"runs\[1\]\.train': SAM .*cannot be combined with train\.precision fp16"):
        validate_config({**base, "train": {"precision": "fp16"},
                         "runs": [{"method": "simcse", "backbone": "b"},
                                  {"method": "arccse", "backbone": "b", "train": {"sam_rho": 0.05}}]})


def test_resume_with_sam_is_bit_identical_and_sam_changes_training(tiny_bert_dir, tiny_senteval, tmp_path):
    import random

    from conftest import TINY_WORDS
    from safetensors.torch import load_file
    from test_method_contract import run_cfg

    from sentemb.train.loop import train

    rng = random.Random(2)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(4, 30))) + "\n"
                              for _ in range(48)), "utf-8")
    inputs = {"corpus": corpus, "inputs": {}, "args": {"min_words": 20}}
    cfg = run_cfg("arccse", tiny_bert_dir, inputs, tiny_senteval, sam_rho=0.05, max_steps=3)
    full = train(cfg, tmp_path / "full", progress=False)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "resumed", stop_after=1, progress=False)
    res = train(cfg, tmp_path / "resumed", progress=False)
    assert res["history"] == full["history"]
    plain = train(run_cfg("arccse", tiny_bert_dir, inputs, tiny_senteval, max_steps=3), tmp_path / "plain",
                  progress=False)
    f = "model.safetensors"
    a, b, c = (load_file(tmp_path / d / "model" / f) for d in ("full", "resumed", "plain"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # SAM was really on


# ------------------------------------------------------------------------------------ triplet_pass
def _grads(m):
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def test_dropout_rows_leaves_the_rows_past_k_as_in_evaluation_mode(tiny_bert_dir):
    """``dropout_rows(k)``: one training-mode forward in which rows k.. are what evaluation mode gives
    them alone (hidden-state dropout and SDPA's attention dropout both off there), while rows ..k get
    dropout (they differ from evaluation mode, and ``nn.Dropout`` zeroes a share p of their elements)."""
    from sentemb.model.dropout import dropout_rows

    m = _method(tiny_bert_dir)
    batch = m.build_batch(SHORT + LONG[:2], micro=0)
    ids, att = batch["input_ids"], batch["attention_mask"]
    k = 3
    with torch.no_grad():
        m.encoder.eval()
        ref = m.encoder(input_ids=ids[k:], attention_mask=att[k:]).last_hidden_state
        plain = m.encoder(input_ids=ids[:k], attention_mask=att[:k]).last_hidden_state
        m.encoder.train()
        torch.manual_seed(1)
        with dropout_rows(k):
            got = m.encoder(input_ids=ids, attention_mask=att).last_hidden_state
    torch.testing.assert_close(got[k:], ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[:k], plain, atol=1e-3)
    drop = torch.nn.Dropout(0.25).train()
    with dropout_rows(100):
        out = drop(torch.ones(300, 1000))
    assert float((out[100:] == 1).all()) and abs(float((out[:100] == 0).float().mean()) - 0.25) < 0.01


@pytest.mark.parametrize("rng", ["counter", "eval"])
def test_triplets_with_views_are_the_separate_pass_in_one_forward(tiny_bert_dir, rng):
    """``triplet_pass: with_views`` against ``separate``: the same loss terms and gradient, with
    dropout on under ``counter`` masks (keyed by sentence, view and position, not by the padded width or
    the rows beside them) and with dropout off; one encoder pass instead of two."""
    from sentemb.model.dropout import keyed

    out = {}
    for mode in ("with_views", "separate"):
        m = _method(tiny_bert_dir, triplet_margin=0.5, triplet_pass=mode)  # m′ 0.5: Eq. 4's hinge is active
        if rng == "eval":
            m.eval()
        batch = m.build_batch(SHORT + LONG, micro=2)
        assert batch["tri_input_ids"].size(1) != batch["input_ids"].size(1)  # the merge pads the narrower rows
        calls = []
        hook = m.encoder.encoder.layer[0].register_forward_hook(lambda *a: calls.append(1))
        n = batch["input_ids"].size(0)
        with keyed(7, 2, 0, n, mode="counter") if rng == "counter" else contextlib.nullcontext():
            terms = m.losses(batch)
        hook.remove()
        terms["loss"].backward()
        out[mode] = ({k: float(v) for k, v in terms.items() if k != WEIGHTED}, _grads(m), len(calls))
    (t1, g1, c1), (t2, g2, c2) = out["with_views"], out["separate"]
    assert (c1, c2) == (1, 2)
    assert t1["triplet"] > 0
    for k in t2:
        assert t1[k] == pytest.approx(t2[k], rel=1e-5, abs=1e-7), k
    testing.close(g1, g2, "with_views vs separate gradient", rel=1e-4)


@pytest.mark.parametrize("mode", ["with_views", "auto"])
def test_a_chunk_without_triplets_pads_its_views_as_the_whole_batch_does(tmp_path, mode):
    """Gradient caching with keyed (CPU-generator) masks, which depend on the padded width: with
    ``min_words: 27`` some chunk of 4 holds no long sentence, so no triplet row. It still takes the
    batch's view width (``with_views`` pads to the triplets' width in every chunk; ``auto`` decides
    on the widths every chunk keeps), so the chunked gradient is the unchunked one (contract check
    ``chunked``). Before, such a chunk encoded its views at their own width: 0.2% off."""
    h = testing.harness("arccse", tmp_path, args={"min_words": 27, "triplet_pass": mode})
    testing.check_chunked(h)


def test_the_triplet_passes_of_each_triplet_pass(tiny_bert_dir):
    """``triplet_pass``: the default, ``separate`` (measured faster than ``with_views`` on the H200
    and the CPU), two encoder passes whatever the widths; ``with_views`` one, the views padded to the
    triplets' width where max_len cuts the views shorter (the large runs' 32); ``auto`` one where
    the triplet rows are no wider than the views (max_len above the long sentences, as the base
    runs' 512), two where max_len cuts the views shorter."""
    def calls(max_len, mode):
        torch.manual_seed(0)
        enc, tok = load_encoder(tiny_bert_dir, pooling_layer=False)
        m = get_method("arccse")(enc, tok, {"triplet_pass": mode} if mode else {}, MethodContext(max_len=max_len, seed=0))
        batch = m.build_batch(SHORT + LONG, micro=0)
        n = []
        hook = m.encoder.encoder.layer[0].register_forward_hook(lambda *a: n.append(1))
        m.losses(batch)
        hook.remove()
        return len(n), batch["tri_input_ids"].size(1) <= batch["input_ids"].size(1)

    assert calls(512, None) == (2, True) and calls(16, None) == (2, False)
    assert calls(512, "auto") == (1, True)
    assert calls(16, "auto") == (2, False)
    assert calls(512, "with_views") == (1, True)
    assert calls(16, "with_views") == (1, False)


def test_the_methods_listing_gives_the_whole_first_paragraph_of_the_summary(capsys):
    """``sentemb methods``: a module docstring whose first paragraph wraps over lines is listed whole
    (it was cut at its first line: "... (Zhang, Zhu,")."""
    from sentemb.cli import main

    assert main(["methods"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("arccse: "))
    assert "Angular Space" in line and "ACL 2022" in line and line.rstrip().endswith(")."), line
