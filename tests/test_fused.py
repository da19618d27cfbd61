"""``train.fuse_micro_batches`` (``sentemb.train.step.Fused``; issue 37): a step's micro-batches in one
forward and backward against the same micro-batches accumulated one by one, computed independently
(``Method.losses`` per micro-batch); ArcCSE's triplet weights; what it refuses; how the plan prices it.
The contract's check ``fused`` (tests/test_method_contract.py) runs the loop itself, with SAM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sentemb import SentembError, testing
from sentemb.config.settings import TrainSettings
from sentemb.methods.base import WEIGHTED, fusable_method
from sentemb.train.loop import setup
from sentemb.train.step import Fused, fused_backward


@pytest.fixture(scope="module")
def arccse(tmp_path_factory):
    # m' = 0.5: the hinge of Eq. 4 is non-zero on a random encoder, so the triplet term carries a gradient
    return testing.harness("arccse", tmp_path_factory.mktemp("arccse"), args={"min_words": 5, "triplet_margin": 0.5})


LONG = ["the quick brown fox jumps over the lazy dog again", "a man is playing a guitar on the stage tonight",
        "two dogs run across the green field in the sun", "the woman slices an onion in the small kitchen"]
SHORT = ["a cat", "dogs run", "it rains", "hello there"]


def _grads(method):
    return {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}


def _accumulated(job, batches):
    """The reference: each micro-batch's own ``Method.losses`` back-propagated / len(batches) from zero
    gradients; (the gradients, the logged terms summed over the micro-batches)."""
    job.opt.zero_grad(set_to_none=True)
    terms = {}
    for b in batches:
        out = job.method.losses(b)
        out.pop(WEIGHTED)
        (out["loss"] / len(batches)).backward()
        for k, v in out.items():
            terms[k] = terms.get(k, 0.0) + float(v.detach())
    return _grads(job.method), terms


def _fused_is_accumulated(job, batches, what: str) -> None:
    """``fused_backward`` over ``batches`` against ``_accumulated``: the gradients (fp64, 1e-10) and
    every logged term, with ArcCSE's hinge active (L_tri > 0: the triplet weighting is tested)."""
    ref, ref_terms = _accumulated(job, batches)
    assert ref_terms["triplet"] > 0
    job.opt.zero_grad(set_to_none=True)
    got_terms = {k: float(v) for k, v in fused_backward(job, list(enumerate(batches))).items()}
    testing.close(_grads(job.method), ref, what, rel=1e-10)
    assert got_terms.keys() == ref_terms.keys()
    for k in ref_terms:
        assert got_terms[k] == pytest.approx(ref_terms[k], rel=1e-6), (what, k, got_terms, ref_terms)


def test_fused_arccse_is_the_mean_of_its_micro_batches_with_unequal_triplet_counts(arccse):
    """Two micro-batches with 3 and 1 triplets (sentences of >= min_words words), dropout off: the
    fused backward's gradient and logged terms are those of Σ_j Method.losses(micro-batch j) / 2,
    each micro-batch's L_tri the mean over its own triplets (1/(k·T_j) weights, not one mean over
    the 4 triplets), its ArcCon over its own 8 sentences."""
    with setup(arccse.exact_run(dropout=0.0, grad_accum=2, fuse_micro_batches=2), "/nonexistent", arccse.cls) as job:
        method = job.method.double()  # fp64: the two computations agree to round-off of 1e-15, not fp32's 1e-5
        first = method.build_batch(LONG[:3] + SHORT, micro=0)
        second = method.build_batch(LONG[3:] + SHORT + SHORT[:3], micro=1)
        assert first["tri_index"].numel() == 3 and second["tri_index"].numel() == 1
        merged, spans = method.merge([first, second])
        assert spans == [(0, 7), (7, 15)]
        assert torch.allclose(merged["tri_weight"], torch.tensor([1 / 6] * 3 + [1 / 2]))
        assert merged["tri_index"].tolist() == first["tri_index"].tolist() + (second["tri_index"] + 7).tolist()

        _fused_is_accumulated(job, [first, second], "fused vs accumulated gradient")


def test_fused_simcse_has_the_accumulated_gradient_of_micro_batches_of_other_widths(tmp_path):
    """SimCSE, micro-batches padded to different widths (merged at the widest): the gradient of one
    fused forward equals the sum of the two micro-batches' own losses / 2."""
    h = testing.harness("simcse", tmp_path)
    with setup(h.exact_run(dropout=0.0, grad_accum=2, fuse_micro_batches=2), "/nonexistent", h.cls) as job:
        method = job.method.double()
        first, second = method.build_batch(LONG), method.build_batch(SHORT + SHORT[:2])
        assert first["input_ids"].size(1) != second["input_ids"].size(1)
        job.opt.zero_grad(set_to_none=True)
        for b in (first, second):
            (method.losses(b)["loss"] / 2).backward()
        ref = _grads(method)
        job.opt.zero_grad(set_to_none=True)
        Fused(2).gradients(job, [(0, first), (1, second)], None)
        got = _grads(method)
    testing.close(got, ref, "fused vs accumulated gradient", rel=1e-10)


def test_fusable_is_declared_per_class_not_inherited():
    """A subclass changes the loss: it declares ``fusable`` again (the ESimCSE/debiased examples do not)."""
    from sentemb.methods import get_method

    assert fusable_method(get_method("simcse")) and fusable_method(get_method("arccse"))
    assert not any(fusable_method(get_method(m)) for m in ("una", "paser", "infocse", "sarcse"))

    class Child(get_method("simcse")):
        pass

    assert not fusable_method(Child)


def test_the_default_merge_refuses_rows_that_are_not_one_per_sentence(tmp_path):
    h = testing.harness("simcse", tmp_path)
    with setup(h.exact_run(), "/nonexistent", h.cls) as job:
        a, b = job.method.build_batch(LONG), job.method.build_batch(SHORT)
        b["pairs"] = torch.zeros(2 * len(SHORT), 3)
        a["pairs"] = torch.zeros(2 * len(LONG), 3)
        with pytest.raises(SentembError, match=r"merge: batch\['pairs'\] is not one row per sentence.*override Method.merge"):
            job.method.merge([a, b])


@pytest.mark.parametrize("train, match", [
    ({"grad_accum": 3}, r"must divide train.grad_accum 3"),
    ({"chunk_size": 4}, r"cannot be combined with train.chunk_size 4"),
    ({"dropout_rng": "counter"}, r"cannot be combined with train.dropout_rng counter"),
    ({"devices": 2}, r"cannot be combined with train.devices 2"),
])
def test_what_fusing_cannot_serve_is_refused_at_config_load(train, match):
    with pytest.raises(SentembError, match=r"cfg: train\.fuse_micro_batches 2 " + match):
        TrainSettings(fuse_micro_batches=2, **{"grad_accum": 2, **train}).check("cfg")
    # (the match: "cfg: train.fuse_micro_batches 2 " + the reason)
    TrainSettings(fuse_micro_batches=2, grad_accum=4, chunk_size="auto").check("cfg")  # auto: checked to fit at set-up
    TrainSettings(fuse_micro_batches=2, grad_accum=2, compile=True).check("cfg")  # the group's forward compiled


def test_a_method_that_does_not_declare_fusable_is_refused_naming_it(tmp_path):
    h = testing.harness("una", tmp_path)
    with pytest.raises(SentembError, match=r"fuse_micro_batches 2: method 'una' does not declare Method.fusable"):
        with setup(h.exact_run(grad_accum=2, fuse_micro_batches=2), "/nonexistent", h.cls):
            pass


def test_the_plan_prices_fused_micro_batches_as_one_pass_at_the_widest_width():
    """``width_profile`` with ``fuse_micro_batches: 2``: half the batches, each at the widest of its
    pair, and a pair with a triplet runs the triplet pass; the row's step has half the encoder passes."""
    from dataclasses import replace

    from sentemb.ops.plan import Lengths, width_profile

    rng = np.random.default_rng(0)
    tokens = rng.integers(8, 60, 4096)
    words = (tokens * 0.7).astype(int)
    run = replace(testing.tiny_run("/m", "/c"), method="arccse", method_args={"min_words": 30},
                  train=TrainSettings(batch_size=32, grad_accum=2, sampler="random", max_len=64))
    lengths = Lengths(source="test", tokens=tokens, words=words)
    one = width_profile(run, "bert-base-uncased", lengths)
    two = width_profile(replace(run, train=replace(run.train, fuse_micro_batches=2)), "bert-base-uncased", lengths)
    assert two["batches"] == one["batches"] // 2
    mean = lambda p: sum(w * f for w, f in p["count"].items())  # noqa: E731
    assert mean(two) >= mean(one)
    assert all(two["triplet_batches"][w] >= 0.99 for w in two["triplet_batches"])  # 64 sentences: nearly always one


def test_arccse_merges_micro_batches_without_triplets(arccse):
    """A micro-batch without a sentence of min_words words has no triplet rows: merged with one that
    has, the weights are the other's alone; two without give an empty triplet set and L_tri = 0."""
    with setup(arccse.exact_run(dropout=0.0, grad_accum=2, fuse_micro_batches=2), "/nonexistent", arccse.cls) as job:
        method = job.method
        none, some = method.build_batch(SHORT, micro=0), method.build_batch(LONG[:2] + SHORT, micro=1)
        merged, _ = method.merge([none, some])
        assert merged["tri_weight"].tolist() == [0.25, 0.25] and merged["tri_index"].tolist() == [4, 5]
        assert merged["tri_input_ids"].shape == some["tri_input_ids"].shape
        merged, _ = method.merge([none, method.build_batch(SHORT[::-1], micro=1)])
        assert merged["tri_weight"].numel() == 0 and merged["tri_input_ids"].size(0) == 0
        terms = fused_backward(job, [(0, none), (1, method.build_batch(SHORT[::-1], micro=1))])
        assert float(terms["triplet"]) == 0.0 and float(terms["triplets"]) == 0.0


def test_fused_arccse_weighs_out_a_graphed_runs_padding_triplets(arccse):
    """In a graphed run (``ctx.static``) each micro-batch's triplets are padded up to a power of two
    with padding triplets (``tri_index`` -1). The merge keeps them out: T_j counts the real ones
    (weights 1/(k·T_j), 0 for padding) and their index stays -1. Dropout off, fp64: the fused
    backward is Σ_j Method.losses(micro-batch j) / 2, each micro-batch's own loss leaving its padding
    out (its ``valid`` mask)."""
    with setup(arccse.exact_run(dropout=0.0, grad_accum=2, fuse_micro_batches=2, graphs=True), "/nonexistent",
               arccse.cls) as job:
        method = job.method.double()
        assert method.ctx.static
        first = method.build_batch(LONG[:3] + SHORT, micro=0)
        second = method.build_batch(LONG[3:] + SHORT + SHORT[:3], micro=1)
        real = [int((b["tri_index"] >= 0).sum()) for b in (first, second)]
        assert real == [3, 1] and first["tri_index"].numel() > 3  # 3 real triplets padded
        merged, spans = method.merge([first, second])
        n = first["tri_index"].numel()
        want = [1 / 6] * 3 + [0.0] * (n - 3) + [1 / 2] + [0.0] * (second["tri_index"].numel() - 1)
        assert torch.allclose(merged["tri_weight"].double(), torch.tensor(want, dtype=torch.float64))
        assert (merged["tri_index"][3:n] == -1).all()

        _fused_is_accumulated(job, [first, second], "fused vs accumulated gradient, padded triplets")
