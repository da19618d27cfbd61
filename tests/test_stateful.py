"""Issue 39 §1-3: a method that keeps state across steps (the example ``examples/methods/esimcse.py``,
ESimCSE's momentum encoder and queue), the loop's promises to it (``Method.step``/``micro``,
``after_step``), and the contract's ``state_*`` checks, which catch the wrong ones written here (each
fails a named check). The example's run in the tiny DAG is in ``tests/test_workflow.py``; its
export through ``SentenceTransformer`` is the contract's ``export`` check, run below."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO
from sentemb import testing
from sentemb.methods import WEIGHTED

EXAMPLE = REPO / "examples" / "methods" / "esimcse.py"


@pytest.fixture(scope="module")
def example():
    """The example's module, imported as ``method_modules`` does; the registry restored afterwards."""
    import sentemb.methods as methods
    from sentemb.methods import import_method_module

    methods.registry()
    before = (dict(methods._REGISTRY), dict(methods._IMPORTED), dict(methods._SPEC))
    mod = sys.modules[import_method_module(str(EXAMPLE))]
    yield mod
    for d, old in zip((methods._REGISTRY, methods._IMPORTED, methods._SPEC), before):
        d.clear()
        d.update(old)


@pytest.fixture(scope="module")
def h(example, tiny_bert_dir, tiny_senteval, tmp_path_factory):
    return testing.harness(example.ESimCSE, tmp_path_factory.mktemp("h_esimcse"), model_dir=tiny_bert_dir,
                           senteval=tiny_senteval)


# ------------------------------------------------------------------------------------ the example's equations
def _reference_loss(h, pos, queue, t):
    """Wu et al. (2022) Eq. 3 written out per row in float64."""
    def cos(a, b):
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    out = []
    for i in range(len(h)):
        den = sum(np.exp(cos(h[i], p) / t) for p in pos) + sum(np.exp(cos(h[i], q) / t) for q in queue)
        out.append(-np.log(np.exp(cos(h[i], pos[i]) / t) / den))
    return float(np.mean(out))


def test_the_example_loss_is_eq3_and_infonce_without_a_queue(example):
    from sentemb.methods.simcse import info_nce

    g = torch.Generator().manual_seed(0)
    h, pos, queue = (torch.randn(n, 8, generator=g, dtype=torch.float64) for n in (6, 6, 5))
    for t in (0.05, 0.3):
        got = float(example.queue_info_nce(h, pos, queue, t))
        assert got == pytest.approx(_reference_loss(h.numpy(), pos.numpy(), queue.numpy(), t), rel=1e-5)
    assert float(example.queue_info_nce(h, pos, queue[:0], 0.1)) == pytest.approx(float(info_nce(h, pos, 0.1)), rel=1e-6)


def test_word_repetition_is_eq1(example):
    """Eq. 1: dup_len ≤ max(2, int(dup_rate·N)), every subword kept in order, each repeated at most once."""
    m = example
    rng = np.random.default_rng(0)
    lengths = set()
    for n in (1, 3, 10, 25):
        ids = list(range(100, 100 + n))
        for _ in range(50):
            rep = m.word_repetition(ids, 0.32, rng)
            dup = len(rep) - n
            assert 0 <= dup <= min(n, max(2, int(0.32 * n)))
            assert sorted(set(rep)) == ids and all(rep.count(t) in (1, 2) for t in ids)
            assert [t for i, t in enumerate(rep) if i == 0 or rep[i - 1] != t] == ids  # repeated in place
            lengths.add(dup)
    assert m.word_repetition(list(range(5)), 0.0, rng) == list(range(5)) and {0, 1, 2} <= lengths


def test_word_repetition_code_rule_is_the_authors_train_py(example):
    """dup_len: code (ESimCSE/train.py, --dup_type bpe): with the input length N + 2 ([CLS], [SEP]),
    L = int(dup_rate·(N+2)); none where L = 0, else random.randrange(min(10, L)): each of 0..min(10, L)−1
    about equally often, never more."""
    rng = np.random.default_rng(1)
    for n in (1, 4, 5, 10, 28, 40):
        top = int(0.32 * (n + 2))
        seen = {len(example.word_repetition(list(range(n)), 0.32, rng, "code")) - n for _ in range(600)}
        assert seen == (set(range(min(10, top))) if top > 0 else {0}), (n, seen)


def test_momentum_init_random_and_the_online_head_are_the_authors_models_py(example, h):
    """momentum_init: random: the momentum encoder starts from BERT's init (models.py copies the still-random
    encoder); momentum_head: online: the keys go through the training MLP itself, no momentum copy of it."""
    m = h.make()
    r = h.cls(*_encoder(h), {**h.args, "momentum_init": "random", "momentum_head": "online"}, m.ctx)
    std = r.encoder.config.initializer_range
    enc = dict(r.encoder.named_parameters())
    for name, p in r.momentum_encoder.named_parameters():
        if name.endswith("LayerNorm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif p.dim() == 2 and p.numel() > 200:
            assert not torch.equal(p, enc[name]) and abs(float(p.std()) / std - 1) < 0.2, name
    assert r.momentum_mlp is None and m.momentum_mlp is not None
    batch = r.build_batch(["a man plays the guitar", "the dog runs"], micro=0)
    with torch.no_grad():
        want = r.mlp(r.momentum_encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        return_dict=True).last_hidden_state[:, 0])
    assert torch.allclose(r.encode(batch).batch["k"], want, atol=1e-6)


def test_momentum_phase_code_is_one_update_more_before_the_first_keys(example, h):
    """momentum_phase: code, the authors' update inside the forward before the keys (models.py): step t's
    keys come from t + 1 updates, sentemb's after_step gives t, so the method starts with the one more,
    θ_m ← λθ_m + (1 − λ)θ_e from the starting encoder, computed here per parameter in float64; with
    momentum_init copy it changes nothing (θ_m = θ_e already)."""
    lam = 0.9
    args = {**h.args, "momentum": lam, "momentum_init": "random"}
    torch.manual_seed(0)
    paper = h.cls(*_encoder(h), args, h.make().ctx)
    torch.manual_seed(0)
    code = h.cls(*_encoder(h), {**args, "momentum_phase": "code"}, h.make().ctx)
    enc = dict(paper.encoder.named_parameters())
    moved = dict(code.momentum_encoder.named_parameters())
    for name, p in paper.momentum_encoder.named_parameters():
        want = lam * p.double() + (1 - lam) * enc[name].double()
        assert torch.allclose(moved[name].double(), want, atol=1e-6), name
    assert not torch.equal(moved["embeddings.word_embeddings.weight"],
                           dict(paper.momentum_encoder.named_parameters())["embeddings.word_embeddings.weight"])
    for name, p in paper.momentum_mlp.named_parameters():  # the ema head: a copy, so the update leaves it as it is
        assert torch.allclose(dict(code.momentum_mlp.named_parameters())[name], p, atol=1e-7), name
    copy_ = h.cls(*_encoder(h), {**h.args, "momentum_phase": "code"}, h.make().ctx)
    for name, p in copy_.momentum_encoder.named_parameters():
        assert torch.allclose(p, dict(copy_.encoder.named_parameters())[name], atol=1e-7), name


def _encoder(h):
    from sentemb.model.backbone import load_encoder

    return load_encoder(h.model_dir, pooling_layer=False)


def test_the_loop_tells_the_method_its_step_and_micro_batch_and_calls_the_hook_once_per_step(example, h):
    """``self.step``/``self.micro`` at every ``encode``, ``after_step`` once per optimizer step after
    the update, with ``grad_accum: 2`` and SAM (each micro-batch encoded twice; ``state_sam`` checks
    what the passes see), 2 steps of 2 micro-batches of 4."""
    from sentemb.train.loop import State, run_steps, setup

    with setup(testing.state_run(h, batch_size=4, grad_accum=2, sam_rho=0.05, max_steps=2), "/nonexistent", h.cls) as job:
        method, calls, hooks = job.method, [], []
        encode, hook = method.encode, method.after_step
        first = next(p for p in method.encoder.parameters() if p.requires_grad)

        def watched(batch):
            calls.append((method.step, method.micro))
            return encode(batch)

        def after(step):
            hooks.append((step, first.detach().clone()))
            return hook(step)

        method.encode, method.after_step = watched, after
        w = [first.detach().clone()]
        for _ in run_steps(job, State()):
            w.append(first.detach().clone())
    steps = 2
    assert calls == [(s, m) for s in range(steps) for m in [2 * s, 2 * s + 1] * 2]  # SAM: each micro twice
    assert [s for s, _ in hooks] == list(range(steps))
    assert all(torch.equal(p, w[s + 1]) and not torch.equal(p, w[s]) for s, p in hooks)  # after the update


def test_the_queue_holds_every_step_s_keys_newest_first_and_the_momentum_encoder_moves(example, h):
    st = testing.state_after(h)
    size = h.args["queue_size"]
    assert int(st["queue_len"]) == size and bool((st["queue"].abs().sum(1) > 0).all())  # filled and wrapped
    m = h.make()
    assert {k for k in st if k.startswith("momentum_encoder.")} == {f"momentum_{k}" for k in m.state_dict()
                                                                      if k.startswith("encoder.")}
    moved = [float((st[f"momentum_{k}"] - st[k]).abs().max()) for k in st if k.startswith("encoder.")]
    start = [float((st[f"momentum_{k}"] - v).abs().max()) for k, v in m.state_dict().items() if k.startswith("encoder.")]
    assert max(moved) > 0 and max(start) > 0  # neither the encoder nor its start: an EMA between them


def test_keys_stashed_under_fp16_autocast_are_the_fp16_values_the_authors_queue_holds(example, h):
    """``train.precision: fp16`` (the authors' ``--fp16``): every key ``batch_terms`` stashes for the
    queue is an fp16 value (the momentum MLP's output under autocast), held exactly by the fp32
    buffer; under fp32 they are not all fp16 values (the check can fail)."""
    from sentemb.train.loop import autocast

    m = h.make()
    m.train()
    batch = m.build_batch(testing.SENTS, step=0, lines=list(range(len(testing.SENTS))), micro=0)
    for precision in ("fp16", "fp32"):
        m.take_stash("keys")
        with autocast(torch.device("cpu"), precision):
            m.losses(batch)
        (k,) = m.take_stash("keys")
        assert k.dtype == torch.float32
        assert bool((k.half().float() == k).all()) == (precision == "fp16"), precision
        m.enqueue(k)
        assert torch.equal(m.queue[: k.size(0)], k)


@pytest.mark.parametrize("check", ["arguments", "loss", "export", "state_chunked", "state_accum", "state_sam",
                                   "state_resume", "state_devices", "state_graphed", "state_epoch"])
def test_the_example_keeps_the_contract(example, h, check):
    """What ``sentemb check-method esimcse --config examples/methods/config.yaml`` runs (its other
    checks too: the weights' ``resume``, ``chunked``, ``devices`` and ``grad_norms``, which the
    debiased example's test runs through the CLI): ``state_accum`` skips (in-batch negatives)."""
    try:
        testing.run_check(h.cls, check, h)
    except testing.CheckSkipped as e:
        assert check == "state_accum" and "accum_equal" in str(e)


# ------------------------------------------------------------------------------------ wrong stateful methods
def _broken(example):
    """Wrong versions of the example, each fails one named check."""
    ESimCSE = example.ESimCSE

    class MomentumEveryEncode(ESimCSE):
        """The momentum update done on every ``encode`` call (gradient caching calls it twice per chunk)."""

        name = "broken-momentum-every-encode"

        def encode(self, batch):
            self.momentum_update()
            return super().encode(batch)

        def after_step(self, step):  # the queue only
            keys = self.take_stash("keys")
            if keys:
                self.enqueue(torch.cat(keys[::-1], 0))

    class EnqueueAtOnce(ESimCSE):
        """The keys enqueued during ``encode``: SAM's second pass sees its own keys."""

        name = "broken-enqueue-at-once"

        def encode(self, batch):
            enc = super().encode(batch)
            self.enqueue(enc.batch["k"])
            return enc

        def after_step(self, step):
            self.take_stash("keys")
            self.momentum_update()

    class UnsavedQueue(ESimCSE):
        """The queue kept in plain attributes, not buffers: a checkpoint does not hold it."""

        name = "broken-unsaved-queue"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            for key in ("queue", "queue_len"):
                value = self._buffers.pop(key)
                object.__setattr__(self, key, value)

    class PythonStash(ESimCSE):
        """The keys kept in a plain dict under ``self.micro`` (the example before ``Method.stash``):
        right in eager mode, but a replayed graph would stash once, at its capture."""

        name = "broken-python-stash"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._keys = {}

        def stash(self, name, value):
            self._keys[self.micro] = value.detach()

        def take_stash(self, name):
            keys = [self._keys[m] for m in sorted(self._keys)]
            self._keys.clear()
            return keys

    class ReplacedQueue(ESimCSE):
        """The queue rebuilt as a new tensor in ``after_step``: right in eager mode (and saved), but a
        captured graph would go on reading the first queue's memory."""

        name = "broken-replaced-queue"

        @torch.no_grad()
        def enqueue(self, keys):
            self.queue = torch.cat([keys.to(self.queue.dtype), self.queue], 0)[: self.queue.size(0)].clone()
            self.queue_len = torch.clamp(self.queue_len + keys.size(0), max=self.queue.size(0))

    class SlicedQueue(ESimCSE):
        """The queue sliced at its filled length, ``int(queue_len)``: a host read of a device value."""

        name = "broken-sliced-queue"

        def batch_terms(self, emb, batch):
            loss = example.queue_info_nce(emb["z1"], emb["z2"], self.queue[: int(self.queue_len)], self.args.temperature)
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    class PythonTau(ESimCSE):
        """A temperature annealed in ``after_step`` as a Python float (saved as extra state) and read by
        the loss: right in eager mode, but a replayed graph keeps the value of its capture."""

        name = "broken-python-tau"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.tau_now = 2 * self.args.temperature

        def batch_terms(self, emb, batch):
            loss = example.queue_info_nce(emb["z1"], emb["z2"], self.queue, self.tau_now, filled=self.queue_len)
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

        def after_step(self, step):
            super().after_step(step)
            self.tau_now = max(self.args.temperature, self.tau_now * 0.7)

        def get_extra_state(self):
            return {"tau_now": self.tau_now}

        def set_extra_state(self, state):
            self.tau_now = state["tau_now"]

    class ListQueue(ESimCSE):
        """The queue a Python list of key tensors, grown in ``after_step`` and read by the loss: a
        replayed graph reads the tensors the list held at its capture."""

        name = "broken-list-queue"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.qlist = []

        def batch_terms(self, emb, batch):
            queue = torch.cat(self.qlist, 0)[: self.queue.size(0)] if self.qlist else emb["k"][:0]
            loss = example.queue_info_nce(emb["z1"], emb["z2"], queue, self.args.temperature)
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

        def after_step(self, step):
            self.momentum_update()
            keys = self.take_stash("keys")
            if keys:
                self.qlist.insert(0, torch.cat(keys[::-1], 0))

    class CountedEpochs(ESimCSE):
        """The queue emptied from the second epoch on, counted in a Python attribute: a resumed job's
        first call is its first, so it keeps epoch 0's keys."""

        name = "broken-counted-epochs"

        def before_epoch(self, epoch):
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen > 1:
                self.queue.zero_()
                self.queue_len.zero_()

    class ReplacedOnEpoch(ESimCSE):
        """The queue replaced by new tensors at each epoch: a captured step reads the old ones."""

        name = "broken-replaced-on-epoch"

        def before_epoch(self, epoch):
            self.queue = torch.zeros_like(self.queue)
            self.queue_len = torch.zeros_like(self.queue_len)

    from sentemb.methods.simcse import SimCSE

    class ReplacedScale(SimCSE):
        """No ``after_step``: a buffer its loss reads, replaced by a new tensor in ``before_epoch``."""

        name = "broken-replaced-scale"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.register_buffer("scale", torch.ones(()))

        def before_epoch(self, epoch):
            self.scale = torch.full((), 1.0 + epoch)

        def batch_terms(self, emb, batch):
            out = super().batch_terms(emb, batch)
            loss = out[WEIGHTED]["contrastive"] * self.scale
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    return {c.name: c for c in (MomentumEveryEncode, EnqueueAtOnce, UnsavedQueue, PythonStash, ReplacedQueue,
                                SlicedQueue, PythonTau, ListQueue, CountedEpochs, ReplacedOnEpoch, ReplacedScale)}


@pytest.mark.parametrize("method, check, message", [
    ("broken-momentum-every-encode", "state_chunked", "chunk_size 4 vs the whole batch: state"),
    ("broken-enqueue-at-once", "state_sam", "the second pass vs the first: state 'queue"),
    ("broken-unsaved-queue", "state_resume", "killed after step 1 and resumed vs uninterrupted: state"),
    ("broken-python-stash", "state_graphed", "keeps Python state in its step, which a replayed graph does not redo: "
                                             "it changes PythonStash._keys during the step; it reads self.micro"),
    ("broken-replaced-queue", "state_graphed", "replaced queue, queue_len with new tensors since its step was captured"),
    ("broken-sliced-queue", "state_graphed", "in batch_terms: aten._local_scalar_dense reads a device value on the host"),
    ("broken-python-tau", "state_graphed", "changed PythonTau.tau_now between steps (in after_step, or anywhere "
                                           "outside the step), and its step reads it: a replayed graph keeps the value "
                                           "it read at its capture"),
    ("broken-list-queue", "state_graphed", "changed ListQueue.qlist between steps (in after_step"),
    ("broken-counted-epochs", "state_epoch", "killed at the end of epoch 0 and resumed vs uninterrupted: state"),
    ("broken-replaced-on-epoch", "state_epoch", "replaced queue, queue_len with new tensors since its step was captured"),
    ("broken-replaced-scale", "state_epoch", "replaced scale with new tensors since its step was captured"),
])
def test_a_wrong_stateful_method_fails_a_named_check(example, h, method, check, message, tmp_path):
    cls = _broken(example)[method]
    args = h.args if issubclass(cls, example.ESimCSE) else {}
    broken = testing.Harness(cls=cls, args=args, model_dir=h.model_dir, corpus=h.corpus, senteval=h.senteval,
                             inputs=h.inputs, work=tmp_path)
    with pytest.raises(testing.CheckFailed, match=re.escape(message)):
        testing.run_check(cls, check, broken)


def test_the_example_config_carries_the_papers_published_row_next_to_the_seed_papers(monkeypatch, tmp_path):
    """The example config's ``published`` rows add ESimCSE's (Wu et al. 2022, Table 1, BERT-base,
    reprinted in InfoCSE Table 2) to the repository's (``write_published``, the workflow's rule
    ``published``): table_paper places it next to SimCSE's."""
    import pandas as pd

    from sentemb.config.load import load_config
    from sentemb.report.paper import load_paper_results, table_paper, write_published

    monkeypatch.chdir(REPO)
    config = load_config(REPO / "examples" / "methods" / "config.yaml")
    assert "esimcse" in [r["method"] for r in config["runs"]]
    out = write_published(REPO / "config" / "paper_results.yaml", config["published"], tmp_path / "published.yaml")
    entries = load_paper_results(out)
    own = load_paper_results(REPO / "config" / "paper_results.yaml")
    assert entries[: len(own)] == own  # every seed paper's row, then the example's
    mine = [e for e in entries if e["method"] == "esimcse"]
    assert len(mine) == 1 and mine[0]["backbone"] == "bert-base-uncased" and mine[0]["scores"]["Avg"] == 78.27
    assert sum(mine[0]["scores"][t] for t in mine[0]["scores"] if t != "Avg") / 7 == pytest.approx(78.27, abs=0.01)
    tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    sts = pd.DataFrame([{"name": n, "method": n, "backbone": "bert-base-uncased", "seed": s, **{t: v + s for t in tasks}}
                        for n, v in (("simcse", 76.0), ("esimcse", 78.0)) for s in (1, 2)])
    t = table_paper(sts, None, entries).set_index(["name", "metric"])
    assert t.loc[("esimcse", "Avg"), "published"] == 78.27 and t.loc[("simcse", "Avg"), "published"] == 76.25
    assert "Wu et al. 2022" in t.loc[("esimcse", "Avg"), "source"]


def test_the_positive_is_the_repetition_of_the_truncated_sentence_cut_only_where_asked(example, h):
    """Truncation (the module docstring): Eq. 1 is applied to the sentence as truncated at ``max_len``
    (16), as the authors' code does (``--dup_type bpe``), and the positive is kept whole: up to
    max(2, int(dup_rate·14)) tokens past ``max_len``, never past the encoder's positions, its [SEP]
    last; with ``cut_positive`` it is that repetition cut back to ``max_len`` (repeat, then cut)."""
    import random

    from sentemb.methods import MethodContext
    from sentemb.model.backbone import load_encoder

    rng = random.Random(0)
    sentences = [" ".join(rng.sample(testing.TINY_WORDS, n)) for n in (3, 10, 14, 20, 30, 40)]  # distinct words
    for cut in (False, True):
        enc, tok = load_encoder(h.model_dir, pooling_layer=False)
        ctx = MethodContext(max_len=16, seed=3, backbone="tiny", model_dir=h.model_dir, inputs={},
                                    corpus=h.corpus)
        m = example.ESimCSE(enc, tok, {**h.args, "dup_rate": 0.5, "cut_positive": cut}, ctx)
        assert m.positive_limit() == (16 if cut else enc.config.max_position_embeddings)
        b = m.build_batch(sentences, micro=0)
        draws, longest = m.np_rng(0), 0
        for ids, mask, rep, rmask in zip(b["input_ids"].tolist(), b["attention_mask"].tolist(),
                                         b["rep_input_ids"].tolist(), b["rep_attention_mask"].tolist()):
            anchor = [t for t, k in zip(ids, mask) if k]
            pos = [t for t, k in zip(rep, rmask) if k]
            assert len(anchor) <= 16 and anchor[-1] == pos[-1] == tok.sep_token_id and pos[0] == tok.cls_token_id
            repeated = example.word_repetition(anchor[1:-1], 0.5, draws)  # Eq. 1 on the truncated sentence
            assert pos[1:-1] == (repeated[:14] if cut else repeated)
            assert len(pos) <= (16 if cut else 16 + max(2, int(0.5 * 14)))
            longest = max(longest, len(pos))
        assert (longest == 16) if cut else (longest > 16)  # the long sentences' positives pass max_len uncut
        assert b["input_ids"].size(1) == b["rep_input_ids"].size(1) >= longest


def test_ema_is_the_per_parameter_momentum_update_of_eq_2():
    """``sentemb.methods.ema_`` (one fused ``lerp_`` per dtype) against the per-tensor reference
    θ_m ← λ·θ_m + (1 − λ)·θ_e, in fp64 and across two dtypes; the online module is untouched and
    gets no gradient history; mismatched modules are refused by name."""
    from torch import nn

    from sentemb import SentembError
    from sentemb.methods import ema_

    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)).double()
    target = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)).double().requires_grad_(False)
    target[2].float()  # a second dtype group
    ref = [m.detach().clone().double() * 0.9 + 0.1 * p.detach() for m, p in zip(target.parameters(), online.parameters())]
    before = [p.detach().clone() for p in online.parameters()]
    ema_(target, online, 0.9)
    for m, r in zip(target.parameters(), ref):
        tol = 1e-15 if m.dtype == torch.float64 else 1e-6
        assert torch.allclose(m.double(), r.to(m.dtype).double(), atol=tol, rtol=0), (m.dtype, (m.double() - r).abs().max())
        assert m.grad_fn is None
    assert all(torch.equal(p, b) for p, b in zip(online.parameters(), before))
    with pytest.raises(SentembError, match="target parameters"):
        ema_(nn.Linear(5, 4).requires_grad_(False), online, 0.9)
    with pytest.raises(SentembError, match="shape"):
        ema_(nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 2)).requires_grad_(False), online, 0.9)
    trained = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)).double()  # a momentum copy left trainable
    with pytest.raises(SentembError, match=r"must not be trained, but 6 require grad \(0.weight, 0.bias, 1.weight ...\)"):
        ema_(trained, online, 0.9)


def test_momentum_keys_in_the_loss_are_chunked_as_the_whole_batch(example, h, tmp_path):
    """MoCo's form: the momentum encoder's keys (made under no_grad, no graph) are the positives of the
    loss, not detached by the method. Gradient caching gives them a cached gradient in its first pass
    (it cannot tell them from the other embeddings) and must pass it on to nothing, as the unchunked
    step does; it raised torch's "element 1 of tensors does not require grad" before."""
    class KeysAsPositives(example.ESimCSE):
        name = "keys-as-positives"

        def batch_terms(self, emb, batch):
            loss = example.queue_info_nce(emb["z1"], emb["k"], self.queue, self.args.temperature, filled=self.queue_len)
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    keys = testing.Harness(cls=KeysAsPositives, args=h.args, model_dir=h.model_dir, corpus=h.corpus,
                           senteval=h.senteval, inputs=h.inputs, work=tmp_path)
    for check in ("chunked", "state_chunked"):
        testing.run_check(KeysAsPositives, check, keys)


def test_a_loss_that_reads_the_step_passes_grad_norms(example, h, tmp_path):
    """Reading ``self.step`` is allowed in an eager run (a schedule); ``grad_norms``' fresh backward must
    tell its reference method the step and micro-batch the loop told the trained one (it kept step 0)."""
    class ReadsStep(example.ESimCSE):
        name = "reads-step"

        def batch_terms(self, emb, batch):
            t = self.args.temperature * (1 + 1.0 / (1 + self.step))
            loss = example.queue_info_nce(emb["z1"], emb["z2"], self.queue, t, filled=self.queue_len)
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    reads = testing.Harness(cls=ReadsStep, args=h.args, model_dir=h.model_dir, corpus=h.corpus,
                            senteval=h.senteval, inputs=h.inputs, work=tmp_path)
    testing.run_check(ReadsStep, "grad_norms", reads)
    with pytest.raises(testing.CheckFailed, match="it reads self.step during the step"):
        testing.run_check(ReadsStep, "graphs", reads)


@pytest.mark.parametrize("where", ["hidden module", "non-persistent buffer"])
def test_state_a_checkpoint_leaves_out_fails_resume_naming_it(example, h, tmp_path, where):
    """A momentum encoder kept where ``state_dict`` does not look (in a list: not a submodule), or a queue
    registered ``persistent=False``: right until a resume, which starts it afresh. ``resume`` names it
    (before: the EMA-in-a-list variant passed every check, its state_* checks skipped)."""
    ESimCSE = example.ESimCSE

    class HiddenMomentum(ESimCSE):
        name = "broken-hidden-momentum"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._copies = [self._modules.pop("momentum_encoder")]

        def train(self, mode=True):
            torch.nn.Module.train(self, mode)
            self._copies[0].eval()
            return self

        def encode(self, batch):
            self.__dict__["momentum_encoder"] = self._copies[0]  # the parent's encode reads it
            try:
                return super().encode(batch)
            finally:
                del self.__dict__["momentum_encoder"]

        def momentum_update(self):
            from sentemb.methods import ema_

            ema_(self._copies[0], self.encoder, self.args.momentum)
            if self.momentum_mlp is not None:
                ema_(self.momentum_mlp, self.mlp, self.args.momentum)

    class NonPersistentQueue(ESimCSE):
        name = "broken-nonpersistent-queue"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            for key in ("queue", "queue_len"):
                self.register_buffer(key, self._buffers.pop(key), persistent=False)

    cls, words = {"hidden module": (HiddenMomentum, "self._copies[0].embeddings.word_embeddings.weight (a module in a "
                                    "plain attribute, not a submodule)"),
                  "non-persistent buffer": (NonPersistentQueue, "queue (a non-persistent buffer)")}[where]
    broken = testing.Harness(cls=cls, args=h.args, model_dir=h.model_dir, corpus=h.corpus, senteval=h.senteval,
                             inputs=h.inputs, work=tmp_path)
    with pytest.raises(testing.CheckFailed, match=re.escape(words) + ".* changed between steps, but no checkpoint "
                                                                     "holds it"):
        testing.run_check(cls, "resume", broken)


def test_references_to_saved_tensors_and_constants_built_on_first_use_pass_resume(example, h, tmp_path):
    """What the resume hint must not blame (a review found the first form of it failing these): a list
    that refers to a registered module (so as not to register it twice), and a cache of constants
    filled on first use; the method resumes bit-identically."""
    class Cached(example.ESimCSE):
        name = "cached-references"

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._emb = [self.encoder.embeddings.word_embeddings]
            self._eye = {}

        def batch_terms(self, emb, batch):
            n = emb["z1"].size(0)
            eye = self._eye.setdefault(n, torch.eye(n, device=emb["z1"].device))
            out = super().batch_terms(emb, batch)
            loss = out[WEIGHTED]["contrastive"] + 0.0 * (eye.sum() + self._emb[0].weight[0, 0])
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    ok = testing.Harness(cls=Cached, args=h.args, model_dir=h.model_dir, corpus=h.corpus, senteval=h.senteval,
                         inputs=h.inputs, work=tmp_path)
    testing.run_check(Cached, "resume", ok)
    assert testing.changed_unsaved(ok) == []


def test_after_a_failed_loss_check_the_later_crashes_say_so(example, tmp_path):
    """A loss that is a vector (reduction none) fails ``loss`` in its own words; the checks after it then
    crash in torch's ("grad can be implicitly created only for scalar outputs"), which now point back."""
    import torch.nn.functional as F

    class VectorLoss(example.ESimCSE):
        name = "vector-loss"

        def batch_terms(self, emb, batch):
            z1, z2 = F.normalize(emb["z1"].float(), dim=-1), F.normalize(emb["z2"].float(), dim=-1)
            loss = F.cross_entropy(z1 @ z2.T / 0.05, torch.arange(z1.size(0), device=z1.device), reduction="none")
            self.stash("keys", emb["k"].float())
            return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    res = {r.check: r for r in testing.check_method(VectorLoss, tmp_path, ["loss", "chunked"], report=None)}
    assert res["loss"].status == "FAIL" and "not an fp32 scalar" in res["loss"].message
    assert res["chunked"].status == "FAIL" and res["chunked"].message.endswith("(the loss check failed: fix that first, "
                                                                               "the later checks train on that loss)")


# ------------------------------------------------------------------------------------ the epoch hook
@pytest.mark.parametrize("per_epoch, accum, steps", [(4, 1, 9), (4, 3, 7), (5, 2, 9), (2, 3, 5), (1, 2, 4)])
def test_epochs_begun_are_the_steps_holding_each_epochs_first_micro_batch(per_epoch, accum, steps):
    """``Method.before_epoch(e)`` runs before the optimizer step holding micro-batch e·per_epoch, the
    epoch's first: counted here micro-batch by micro-batch."""
    from sentemb.train.loop import epochs_begun

    want: dict[int, list[int]] = {}
    for m in range(steps * accum):  # micro-batch m belongs to epoch m // per_epoch and to step m // accum
        if m % per_epoch == 0:
            want.setdefault(m // accum, []).append(m // per_epoch)
    assert {s: list(epochs_begun(s, accum, per_epoch)) for s in range(steps) if len(epochs_begun(s, accum, per_epoch))} \
        == want


@pytest.fixture(scope="module")
def h_reset(example, tiny_bert_dir, tiny_senteval, tmp_path_factory):
    """The example with ``queue_reset: epoch`` and a queue that never wraps in these runs (200 rows)."""
    return testing.harness(example.ESimCSE, tmp_path_factory.mktemp("h_esimcse_reset"), model_dir=tiny_bert_dir,
                           senteval=tiny_senteval, args={"queue_size": 200, "momentum": 0.5, "queue_reset": "epoch"})


@pytest.mark.parametrize("reset", ["never", "epoch"])
def test_queue_reset_epoch_empties_the_queue_before_each_epochs_first_step(example, h_reset, reset):
    """``queue_reset: epoch`` (the authors' trainer sets its queue to None at the top of its epoch loop):
    64 lines at batch 32 are 2 steps an epoch, so over 5 steps the hook runs before steps 0, 2 and 4,
    and the queue the loss reads at each step holds the keys of that epoch's earlier steps only; with
    ``never`` (the default) every earlier step's."""
    from sentemb.train.loop import State, run_steps, setup

    run = testing.state_run(h_reset, batch_size=32, epochs=3, max_steps=5)
    run.method_args = {**run.method_args, "queue_reset": reset}
    with setup(run, "/nonexistent", h_reset.cls) as job:
        method, seen, begun = job.method, [], []
        terms, hook = method.batch_terms, method.before_epoch

        def watched(emb, batch):
            seen.append((method.step, int(method.queue_len)))
            return terms(emb, batch)

        def epoch(e):
            begun.append((method.step, e))
            return hook(e)

        method.batch_terms, method.before_epoch = watched, epoch
        for _ in run_steps(job, State()):
            pass
    assert begun == [(0, 0), (2, 1), (4, 2)]
    since = {0: 0, 1: 1, 2: 0, 3: 1, 4: 0} if reset == "epoch" else {s: s for s in range(5)}
    assert seen == [(s, 32 * since[s]) for s in range(5)]


def test_queue_reset_epoch_resumes_bit_identically_across_an_epoch_boundary(example, h_reset):
    """Killed after step 2 (the last of epoch 0; the checkpoint is saved after ``after_step``) and
    resumed, the hook empties the queue before step 2 as in the uninterrupted run: the whole state
    after 4 steps is the same bit for bit; graphed (each step captured once, the hook's in-place
    ``zero_`` outside the graph) it is the eager run's."""
    from sentemb.train.loop import resume, run_steps, save_state, setup

    over = {"batch_size": 32, "epochs": 2, "max_steps": 4}
    out = h_reset.scratch("reset-resume")
    with setup(testing.state_run(h_reset, **over), out, h_reset.cls) as job:
        state = resume(job)
        for _ in run_steps(job, state, 2):
            pass
        save_state(job, state)
    with setup(testing.state_run(h_reset, **over), out, h_reset.cls) as job:
        state = resume(job)
        assert state.step == 2 and int(job.method.queue_len) == 64  # as saved: epoch 0's keys, before the hook
        for _ in run_steps(job, state):
            pass
        got = testing.method_state(job.method)
    whole = testing.state_after(h_reset, **over)
    testing.same_state(got, whole, "resumed across the epoch boundary", exact=True)
    assert int(whole["queue_len"]) == 64  # epoch 1's two steps only
    testing.same_state(testing.state_after(h_reset, graphs=True, **over), whole, "graphed vs eager")
