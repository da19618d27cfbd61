"""``train.graphs`` (``sentemb.train.graphs``; issue 37) on the CPU: the same static-shape step a CUDA
graph captures, run eagerly, against the eager loop; the capture check; the settings it refuses.
The capture itself needs a GPU (``sentemb gpu-check --host-parts graphed``)."""

from __future__ import annotations

import pytest
import torch

from sentemb import SentembError, testing
from sentemb.config.settings import TrainSettings
from sentemb.train.graphs import capture_hazards
from sentemb.train.step import Graphed
from sentemb.train.loop import State, micro_batches, run_steps, setup

METHODS = ("simcse", "arccse", "sarcse", "infocse", "paser", "una")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    cache = {}

    def get(method):
        if method not in cache:
            try:
                cache[method] = testing.harness(method, tmp_path_factory.mktemp(method))
            except testing.CheckSkipped as e:
                pytest.skip(str(e))
        return cache[method]

    return get


def _train(run, steps=3, cls=None):
    """``steps`` optimizer steps of the loop; the method's whole state and the strategy."""
    with setup(run, "/nonexistent", cls) as job:
        torch.manual_seed(3)
        state = State()
        for _ in run_steps(job, state, steps):
            pass
        sd = {k: v.detach().clone() for k, v in job.method.state_dict().items() if torch.is_tensor(v)}
        return sd, job.strategy


def _same(a: dict, b: dict, rel: float, what: str) -> None:
    testing.close({k: v.float() for k, v in a.items() if v.is_floating_point()},
                  {k: v.float() for k, v in b.items() if v.is_floating_point()}, what, rel, floor="whole")
    moved = [k for k in a if a[k].is_floating_point()]
    assert moved, what


@pytest.mark.parametrize("method", METHODS)
def test_graphed_training_is_the_eager_training(worlds, method):
    """Dropout off, 2 steps of 2 accumulated micro-batches: graphs on trains to the eager weights
    (every parameter, buffer and head)."""
    h = worlds(method)
    eager, _ = _train(h.exact_run(dropout=0.0, grad_accum=2), steps=2, cls=h.cls)
    graphed, strategy = _train(h.exact_run(dropout=0.0, grad_accum=2, graphs=True), steps=2, cls=h.cls)
    assert repr(strategy) == "Graphed(Plain())" and strategy.captures >= 1
    _same(graphed, eager, 1e-4, f"{method}: graphed vs eager weights")
    init, _ = _train(h.exact_run(dropout=0.0, grad_accum=2), steps=0, cls=h.cls)
    assert any(not torch.equal(init[k], eager[k]) for k in eager if eager[k].is_floating_point())


@pytest.mark.parametrize("method", ["simcse", "una", "paser", "arccse"])
def test_graphed_chunks_train_as_the_whole_batch_with_dropout_on(worlds, method):
    """Gradient caching inside the graphed step, counter dropout on: the weights of the unchunked
    graphed run (the masks are keyed, so chunking draws the same ones). PaSeR's decoder rows are one
    per sentence in a graphed run, and ArcCSE's triplets are taken by position, so their chunks are
    slices."""
    h = worlds(method)
    whole, _ = _train(h.exact_run(dropout_rng="counter", graphs=True), steps=2, cls=h.cls)
    chunked, strategy = _train(h.exact_run(dropout_rng="counter", graphs=True, chunk_size=4), steps=2, cls=h.cls)
    assert repr(strategy) == "Graphed(Chunked())"
    _same(chunked, whole, testing.REL, f"{method}: chunked graphed weights")
    eager, _ = _train(h.exact_run(dropout_rng="counter"), steps=2, cls=h.cls)  # eager counter: the same masks
    _same(whole, eager, testing.REL, f"{method}: graphed vs eager, counter dropout on")


@pytest.mark.parametrize("method", ["una", "paser"])
def test_the_inline_counter_kernel_draws_the_same_masks_in_the_graphed_chunked_step(worlds, method):
    """``train.counter_kernel: inline`` without compile (its tensors made at each context's entry, the
    form a compiled encoder traces) in the graphed chunked step of the methods that declare their rows
    (``rows()``: UNA's pairs, PaSeR's decoder rows): the eager kernel's weights; the capture check
    passes (its device constants are made before it, ``warm_inline``)."""
    h = worlds(method)
    over = dict(dropout_rng="counter", graphs=True, chunk_size=4)
    eager, _ = _train(h.exact_run(counter_kernel="eager", **over), steps=2, cls=h.cls)
    inline, strategy = _train(h.exact_run(counter_kernel="inline", **over), steps=2, cls=h.cls)
    assert repr(strategy) == "Graphed(Chunked())"
    _same(inline, eager, 1e-6, f"{method}: counter_kernel inline vs eager")


def test_a_shape_past_the_graph_limit_runs_eagerly_with_its_own_dropout_key(worlds, monkeypatch):
    """More batch shapes than ``MAX_GRAPHS``: the others run eagerly (``Graphed.overflow``), and with
    counter masks they read their own micro-batch's key, not the one the last replay left in the
    static key tensor: the weights of the eager counter run. (``capture`` is forced on so that the
    CPU takes the limit's path; nothing is captured here.)"""
    from sentemb.train import step

    h = worlds("simcse")
    over = dict(dropout_rng="counter", buckets=list(range(2, 33, 2)), max_len=32, batch_size=4, grad_accum=2)
    eager, _ = _train(h.exact_run(**over), steps=3, cls=h.cls)
    monkeypatch.setattr(step, "MAX_GRAPHS", 1)
    with setup(h.exact_run(graphs=True, **over), "/nonexistent", h.cls) as job:
        job.strategy.capture = True
        torch.manual_seed(3)
        for _ in run_steps(job, State(), 3):
            pass
        assert job.strategy.overflow > 0, "no micro-batch came past the limit"
        graphed = {k: v.detach().clone() for k, v in job.method.state_dict().items() if torch.is_tensor(v)}
    _same(graphed, eager, testing.REL, "simcse: past the graph limit, counter dropout on")


def test_the_fused_counter_kernel_trains_to_the_same_weights(worlds):
    """``train.counter_kernel: fused`` (the counter hash compiled, Inductor's CPU code here) in the
    graphed, chunked step: the same masks, so bit for bit the weights of the eager kernel."""
    h = worlds("simcse")
    over = dict(dropout_rng="counter", graphs=True, chunk_size=4)
    eager, _ = _train(h.exact_run(counter_kernel="eager", **over), steps=2, cls=h.cls)
    fused, _ = _train(h.exact_run(counter_kernel="fused", **over), steps=2, cls=h.cls)
    assert eager.keys() == fused.keys() and all(torch.equal(eager[k], fused[k]) for k in eager)
    init, _ = _train(h.exact_run(**over), steps=0, cls=h.cls)
    assert any(not torch.equal(init[k], eager[k]) for k in eager if eager[k].is_floating_point())


def test_graphs_with_compile_train_as_graphs_without(worlds):
    """``train.compile`` inside the graphed step (Inductor's CPU code here; on CUDA the capture records
    the compiled kernels): dropout on (torch's generator, ``fallback_random``) and SAM, the weights of
    the graphed eager-kernel run to fp32 tolerance, and the compiled function is the one that ran."""
    from torch._dynamo.utils import counters

    h = worlds("simcse")
    plain, _ = _train(h.exact_run(graphs=True, sam_rho=0.05), steps=2, cls=h.cls)
    torch._dynamo.reset()
    counters.clear()
    with setup(h.exact_run(graphs=True, sam_rho=0.05, compile=True), "/nonexistent", h.cls) as job:
        assert job.step_fn is not job.method.losses
        compiled_encode, encodes = job.encode_fn, []
        job.encode_fn = lambda batch: encodes.append(1) or compiled_encode(batch)  # which path the step took
        torch.manual_seed(3)
        for _ in run_steps(job, State(), 2):
            pass
        # Dynamo compiled the losses (the capture check's pass under a dispatch mode must not make
        # it skip the frame for good)
        assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
        compiled = {k: v.detach().clone() for k, v in job.method.state_dict().items() if torch.is_tensor(v)}
        assert repr(job.strategy) == "SAM(Graphed(Plain()))"
    _same(compiled, plain, 1e-4, "simcse: graphed with compile vs graphed")


def test_counter_dropout_under_compile_refuses_torchs_multihead_attention_dropout(worlds, monkeypatch):
    """PaSeR's decoder (torch's ``nn.MultiheadAttention``, one opaque op to Dynamo) with attention
    dropout, compiled with counter masks: refused naming the modules and the ways out (it crashed in
    Dynamo's words); BART's layout has no attention dropout and is served."""
    import torch.nn.functional as F

    from sentemb.model import dropout

    # compile_safe replaces F.dropout for the rest of the process: put back what this worker had
    monkeypatch.setattr(F, "dropout", F.dropout)
    monkeypatch.setattr(F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    monkeypatch.setattr(dropout, "_INSTALLED", dropout._INSTALLED)
    h = worlds("paser")
    with pytest.raises(SentembError, match=r"cannot serve the attention dropout of torch's nn\.MultiheadAttention "
                                           r"\(decoder\.layers\.layers\.0\.self_attn, .*decoder_dropout_layout: bart"):
        with setup(h.exact_run(compile=True, dropout_rng="counter"), "/nonexistent", h.cls):
            pass
    run = h.run({**h.args, "decoder_dropout_layout": "bart"}, compile=True, dropout_rng="counter", precision="fp32")
    with setup(run, "/nonexistent", h.cls) as job:
        assert job.step_fn is not job.method.losses
    torch._dynamo.reset()


def test_per_term_grad_norms_leave_a_compiled_run_at_the_eager_weights(worlds):
    """``log_grad_norms`` (``autograd.grad(retain_graph=True)`` per term, then the step's backward)
    under ``train.compile``, a method of two terms, step 1 compiled and step 2 logged: the eager
    run's weights. On a compiled graph that sequence gave a wrong ``.grad`` (2.8e-2 off): a logged
    step runs eagerly."""
    h = worlds("infocse")
    over = dict(dropout=0.0, log_grad_norms=True, log_steps=2)
    eager, _ = _train(h.exact_run(**over), steps=2, cls=h.cls)
    torch._dynamo.reset()
    compiled, _ = _train(h.exact_run(compile=True, **over), steps=2, cls=h.cls)
    torch._dynamo.reset()
    _same(compiled, eager, 1e-4, "infocse: compiled with per-term norms vs eager")


@pytest.mark.parametrize("graphs, chunk, kernel", [(True, None, "auto"), (False, None, "auto"), (True, 4, "auto"),
                                                   (True, 4, "inline")])
def test_compile_with_counter_dropout_trains_as_the_eager_counter_run(worlds, monkeypatch, graphs, chunk, kernel):
    """``train.compile`` with ``dropout_rng: counter`` (``sentemb.model.dropout.compile_safe``: each
    dropout a graph break, run outside the compiled code), graphed and not, and in the graphed chunked
    step (``Method.encode`` compiled, ``job.encode_fn``), dropout on: the weights of the eager counter
    run (the same masks; another draw would be ~1e-2 away) to fp32 tolerance, and Dynamo compiled the
    code between the dropouts (several graphs). With ``counter_kernel: inline`` the masks are traced
    with the encoder (``compile_inline``): no graph break, one graph for the chunks and one for the
    graph-free first pass, and the same weights."""
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from sentemb.model import dropout

    # compile_safe replaces F.dropout for the rest of the process: put back what this worker had
    monkeypatch.setattr(F, "dropout", F.dropout)
    monkeypatch.setattr(F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    monkeypatch.setattr(dropout, "_INSTALLED", dropout._INSTALLED)
    h = worlds("simcse")
    over = dict(dropout_rng="counter", graphs=graphs, chunk_size=chunk)
    eager, _ = _train(h.exact_run(**over), steps=2, cls=h.cls)
    torch._dynamo.reset()
    counters.clear()
    with setup(h.exact_run(compile=True, counter_kernel=kernel, **over), "/nonexistent", h.cls) as job:
        assert job.step_fn is not job.method.losses
        compiled_encode, encodes = job.encode_fn, []
        job.encode_fn = lambda batch: encodes.append(1) or compiled_encode(batch)  # which path the step took
        torch.manual_seed(3)
        for _ in run_steps(job, State(), 2):
            pass
        assert counters["stats"]["unique_graphs"] >= 2, dict(counters["stats"])
        assert repr(job.strategy) == {(True, None): "Graphed(Plain())", (False, None): "Plain()",
                                      (True, 4): "Graphed(Chunked())"}[graphs, chunk]
        # chunked: the chunks and the first pass go through the compiled encode (chunked_backward), and
        # Method.losses never runs, so the graphs counted above are the compiled encode's; whole: none does
        assert (len(encodes) > 0) == bool(chunk), (chunk, len(encodes))
        if kernel == "inline":
            assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 2, \
                (dict(counters["graph_break"]), dict(counters["stats"]))
        compiled = {k: v.detach().clone() for k, v in job.method.state_dict().items() if torch.is_tensor(v)}
    _same(compiled, eager, 1e-4, f"simcse: compiled vs eager, counter dropout on, graphs {graphs}")


def test_sam_with_graphs_is_eager_sam(worlds):
    h = worlds("simcse")
    eager, _ = _train(h.exact_run(dropout=0.0, sam_rho=0.05), cls=h.cls)
    graphed, strategy = _train(h.exact_run(dropout=0.0, sam_rho=0.05, graphs=True), cls=h.cls)
    assert repr(strategy) == "SAM(Graphed(Plain()))"
    _same(graphed, eager, 1e-4, "SAM graphed vs eager")


def test_a_method_whose_chunks_depend_on_the_data_is_refused_naming_its_line(worlds):
    """A ``chunk`` that selects rows by their values (as ArcCSE's and PaSeR's do in an eager run) has a
    data-dependent shape: refused with its line. The built-in ones take a static layout in a graphed
    run (``test_graphed_chunks_train_as_the_whole_batch_with_dropout_on``)."""
    h = worlds("simcse")

    class ByValue(h.cls):
        def chunk(self, batch, start, stop):
            out = super().chunk(batch, start, stop)
            keep = (out["attention_mask"].sum(1) >= 0).nonzero().flatten()  # every row, found by value
            return {k: v[keep] for k, v in out.items()}

    with pytest.raises(SentembError, match=r"train\.graphs: method 'simcse' cannot be captured.*test_graphs\.py:\d+ in "
                                           r"chunk: aten\.nonzero"):
        _train(h.exact_run(dropout_rng="counter", graphs=True, chunk_size=4), steps=1, cls=ByValue)


def test_masks_are_fresh_per_micro_batch_and_the_same_on_a_repeat(worlds):
    """Counter dropout in the graphed step: the static key gets each micro-batch's key, so the same
    static batch replayed as micro-batch 1 draws other masks than as 0, and 0 again the first ones."""
    h = worlds("simcse")
    with setup(h.exact_run(dropout_rng="counter", graphs=True), "/nonexistent", h.cls) as job:
        (_, batch), = micro_batches(job, 0)[:1]
        strategy = job.strategy
        assert isinstance(strategy, Graphed)
        losses = [float(strategy.backward(job, batch, m, None)["loss"]) for m in (0, 1, 0)]
        assert job.dropout_key is not None and strategy.captures == 1
    assert losses[0] != losses[1] and losses[0] == losses[2]


def test_resume_with_graphs_is_bit_identical(worlds, tmp_path):
    import json

    h = worlds("simcse")
    run = h.exact_run(dropout_rng="counter", graphs=True, save_steps=1)
    testing.kill_and_resume(run, tmp_path, "graphs resume", method_cls=h.cls)
    # train.json says what the graphs did (this process): no CUDA graphs on a CPU, one replay a micro-batch
    got = json.loads((tmp_path / "full" / "train.json").read_text())["graphs"]
    assert got["cuda_graphs"] is False and got["eager_past_the_shape_limit"] == 0
    assert 1 <= got["shapes"] <= got["replays"] == run.train.max_steps * run.train.grad_accum, got


@pytest.mark.parametrize("graphs", [False, True])
def test_a_compiled_run_on_the_cpu_resumes_bit_identically_at_several_widths(worlds, tmp_path, graphs):
    """``train.compile`` on the CPU runs with torch's deterministic algorithms (``loop.cpu_deterministic``):
    with 2 threads Inductor's CPU backward summed some gradients in a varying order, so a killed and
    resumed compiled run differed from the uninterrupted one in its last bits. Batches of several widths
    (padded to the longest; graphed: three buckets), 2 threads, bit for bit; the flags are put back."""
    import torch

    h = worlds("simcse")
    over = {"graphs": True, "buckets": [8, 16, 32]} if graphs else {}
    run = h.exact_run(dropout_rng="counter", compile=True, save_steps=1, **over)
    threads, before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    try:
        testing.kill_and_resume(run, tmp_path, f"compiled{' graphed' if graphs else ''} resume", method_cls=h.cls)
    finally:
        torch.set_num_threads(threads)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_resume_with_the_graphed_update_is_bit_identical(worlds, tmp_path):
    """``train.update: graphed``: the learning rates are device tensors in the saved optimizer state;
    a killed run resumes to the uninterrupted run's weights, bit for bit."""
    h = worlds("simcse")
    testing.kill_and_resume(h.exact_run(dropout_rng="counter", graphs=True, update="graphed", save_steps=1), tmp_path,
                            "graphed update resume", method_cls=h.cls)


@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_the_graphed_update_trains_as_the_separate_one(worlds, method):
    """``train.update: graphed`` (the clip, fused AdamW and the zeroing as one graph a step; on the
    CPU the same body eagerly) with SAM, a warm-up and the clip: 3 steps of 2 micro-batches, dropout
    off, separate's weights to rounding (update fused's tolerance). The rate is a float32 tensor
    that the schedule fills in place (the object a captured step reads stays the same)."""
    h = worlds(method)
    over = dict(dropout=0.0, grad_accum=2, sam_rho=0.05, graphs=True, warmup_ratio=0.5, grad_clip=0.01)
    separate, _ = _train(h.exact_run(**over), steps=3, cls=h.cls)
    graphed, strategy = _train(h.exact_run(update="graphed", **over), steps=3, cls=h.cls)
    assert repr(strategy) == "SAM(Graphed(Plain()))" and strategy.inner.updates is not None
    _same(graphed, separate, 1e-5, f"{method}: update graphed vs separate")
    with setup(h.exact_run(update="graphed", **over), "/nonexistent", h.cls) as job:
        rates = [g["lr"] for g in job.opt.param_groups]
        assert all(torch.is_tensor(r) and r.dtype == torch.float32 for r in rates)
        state = State()
        for _ in run_steps(job, state, 1):
            pass
        assert all(a is b for a, b in zip([g["lr"] for g in job.opt.param_groups], rates))  # filled in place
        want = job.sched.base_lrs[0] * job.sched.lr_lambdas[0](job.sched.last_epoch)
        assert float(rates[0]) == pytest.approx(want, rel=1e-7) and want > 0


def test_the_graphed_update_captures_one_graph_per_set_of_gradients(worlds, monkeypatch):
    """``UpdateGraphs`` as on CUDA, with a stand-in for the capture (a "graph" whose replay runs the
    captured body): the first update runs eagerly (AdamW's state is made there), the second
    captures, later ones replay; a step that hands over another set of gradients (a parameter no
    micro-batch wrote has none) captures its own graph, and the first set replays its first one; a
    parameter's first gradient after that is applied eagerly (its AdamW state made outside any
    capture: every capture finds every gradient's state), then captured. Trained through the loop,
    the weights are separate's."""
    from sentemb.train import step as step_mod

    captured = []

    class Replay:
        def __init__(self, job):
            self.job, self.replays = job, 0

        def replay(self):
            self.replays += 1
            step_mod.update_body(self.job)

    def capture(self, job):
        missing = [p for g in job.opt.param_groups for p in g["params"] if p.grad is not None and not job.opt.state.get(p)]
        assert not missing, "AdamW state would be made inside the capture"
        captured.append(Replay(job))
        return captured[-1]

    monkeypatch.setattr(step_mod.UpdateGraphs, "_capture", capture)
    init = step_mod.UpdateGraphs.__init__
    monkeypatch.setattr(step_mod.UpdateGraphs, "__init__", lambda self, capture: init(self, True))
    h = worlds("simcse")
    over = dict(dropout=0.0, grad_accum=2, graphs=True, grad_clip=0.01, batch_size=8)  # 64 lines: 4 steps
    separate, _ = _train(h.exact_run(**over), steps=4, cls=h.cls)
    graphed, strategy = _train(h.exact_run(update="graphed", **over), steps=4, cls=h.cls)
    assert [c.replays for c in captured] == [3], "step 1 eager, then one graph replayed"
    _same(graphed, separate, 1e-5, "update graphed (stand-in captures) vs separate")  # as update fused's test
    captured.clear()
    with setup(h.exact_run(update="graphed", **over), "/nonexistent", h.cls) as job:
        updates = step_mod.UpdateGraphs(True)
        params = [p for g in job.opt.param_groups for p in g["params"]]
        for p in params:
            p.grad = torch.ones_like(p)
        for _ in range(3):
            updates.apply(job)
        assert len(updates.graphs) == 1 and captured[0].replays == 2
        kept, params[0].grad = params[0].grad, None
        updates.apply(job)
        assert len(updates.graphs) == 2 and captured[1].replays == 1
        params[0].grad = kept
        updates.apply(job)
        assert len(updates.graphs) == 2 and captured[0].replays == 3
    with setup(h.exact_run(update="graphed", **over), "/nonexistent", h.cls) as job:  # a late first gradient
        captured.clear()
        updates = step_mod.UpdateGraphs(True)
        params = [p for g in job.opt.param_groups for p in g["params"]]
        for p in params[1:]:
            p.grad = torch.ones_like(p)
        updates.apply(job)
        updates.apply(job)
        assert len(captured) == 1
        params[0].grad = torch.ones_like(params[0])
        updates.apply(job)  # params[0] has no AdamW state yet: eagerly
        assert len(captured) == 1 and job.opt.state.get(params[0])
        updates.apply(job)
        assert len(captured) == 2 and captured[1].replays == 1


def test_the_graphed_update_needs_graphs():
    with pytest.raises(SentembError, match=r"cfg: train\.update graphed needs train\.graphs: true"):
        TrainSettings(update="graphed").check("cfg")
    TrainSettings(update="graphed", graphs=True).check("cfg")


def test_the_capture_check_names_each_hazard_and_its_line():
    x = torch.arange(6.0)

    def step():
        y = x * 2
        if bool(y.sum() > 0):  # a host read
            y = y + torch.tensor([1.0])  # host data
        torch.nonzero(y)  # a data-dependent shape
        return y[y > 3]  # another: boolean-mask indexing

    with capture_hazards(torch.device("cpu")) as found:
        step()
    ops = {h.op: h for h in found}
    assert {"_local_scalar_dense", "lift_fresh", "nonzero", "index"} <= set(ops)
    assert all("test_graphs.py:" in str(h) and "in step" in str(h) for h in found)
    with capture_hazards(torch.device("cpu")) as clean:
        (x * 2).clamp(min=0).sum()
    assert clean == []


def test_a_hazard_in_the_backward_names_the_methods_own_backward_or_else_the_autograd_node():
    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            if float(g.sum()) > 1e9:  # a host read in the method's own backward
                g = g * 0
            return g * 2

    def loop_side_backward(loss):  # stands for the loop calling .backward(): not the method's line
        loss.backward()

    x = torch.randn(6, requires_grad=True)
    with capture_hazards(torch.device("cpu")) as found:
        loop_side_backward(Doubled.apply(x).sum())
    assert [str(h).split(": aten")[0] for h in found] == \
        [f"tests/test_graphs.py:{Doubled.backward.__code__.co_firstlineno + 2} in backward"], found
    with capture_hazards(torch.device("cpu")) as found:
        loop_side_backward(x[x > 0].sum())  # index's backward (index_put) runs no Python of the method's
    where = {h.op: h.where for h in found}
    assert where["index"].startswith("tests/test_graphs.py:") and where["index_put"] == "the backward of IndexBackward0", where


@pytest.mark.parametrize("train, match", [
    ({"dropout_rng": "keyed"}, r"train\.graphs cannot be combined with train\.dropout_rng keyed"),
    ({"unpad": True}, r"train\.graphs cannot be combined with train\.unpad .*; set train\.unpad: false"),
    ({"precision": "fp16"}, r"train\.graphs cannot be combined with train\.precision fp16"),
    ({"chunk_size": 4}, r"train\.graphs cannot be combined with train\.chunk_size 4 with train\.dropout_rng stream"),
    ({"chunk_size": "auto"}, r"train\.graphs cannot be combined with train\.chunk_size auto with train\.dropout_rng stream"),
    ({"devices": 2, "device": "cuda"}, r"train\.graphs cannot be combined with train\.devices 2 on train\.device cuda .*; set train\.devices: 1"),
])
def test_what_graphs_cannot_serve_is_refused_at_config_load(train, match):
    with pytest.raises(SentembError, match="cfg: " + match):
        TrainSettings(graphs=True, **train).check("cfg")
    TrainSettings(graphs=True, dropout_rng="counter", chunk_size=4).check("cfg")  # this one it serves
    TrainSettings(graphs=True, devices=2).check("cfg")  # device auto: the job refuses it if it starts on a GPU


def test_arccse_pads_its_triplet_count_in_a_graphed_run_and_eq4_ignores_the_padding(worlds):
    """A graphed run's ArcCSE batch holds a power-of-two number of triplets (padding rows with
    ``tri_index`` −1), so that the varying number of long sentences does not make a new graph nearly
    every step; the real rows are the eager ones and Eq. 4 leaves the padding out."""
    from dataclasses import replace

    import numpy as np

    from sentemb.methods.arccse import TRIPLET_PAD_MIN, triplet_loss

    h = worlds("arccse")
    m = h.make()
    words = list(testing.TINY_WORDS)
    long = " ".join(words[:12] * 2)
    sents = [long, "two words", long, long, "x y"]
    plain = m.build_triplets(sents, np.random.default_rng(0))
    m.ctx = replace(m.ctx, static=True)
    padded = m.build_triplets(sents, np.random.default_rng(0))
    t, big = plain["tri_index"].numel(), padded["tri_index"].numel()
    assert t == 3 and big == TRIPLET_PAD_MIN
    assert padded["tri_index"][:t].tolist() == plain["tri_index"].tolist() and (padded["tri_index"][t:] == -1).all()
    w = plain["tri_input_ids"].size(1)
    for v in range(3):
        assert torch.equal(padded["tri_input_ids"][v * big : v * big + t, :w], plain["tri_input_ids"][v * t : (v + 1) * t])
    torch.manual_seed(0)
    emb = torch.randn(3 * big, 8)
    real = torch.cat([emb[v * big : v * big + t] for v in range(3)])
    want = triplet_loss(real[:t], real[t : 2 * t], real[2 * t :], 0.3)
    got = triplet_loss(emb[:big], emb[big : 2 * big], emb[2 * big :], 0.3, valid=padded["tri_index"] >= 0)
    assert float(want) > 0 and torch.allclose(got, want)
    # a batch without a long sentence has no triplet rows in a graphed run either (as eager): padding triplets
    # alone would cost an encoder pass (two with SAM) for a loss and gradients of 0
    none = m.build_triplets(["two words", "x y"], np.random.default_rng(0))
    assert none["tri_index"].numel() == 0 and none["tri_input_ids"].shape[0] == 0


def test_the_strategy_of_a_graphed_run_and_its_refusal_on_several_gpus():
    from types import SimpleNamespace

    from sentemb.train.step import strategy_for

    def job(world=1, device="cpu", **train):
        return SimpleNamespace(run=SimpleNamespace(name="r"), settings=TrainSettings(graphs=True, **train), world=world,
                               chunk=train.get("chunk_size"), device=torch.device(device))

    assert repr(strategy_for(job())) == "Graphed(Plain())"
    assert repr(strategy_for(job(sam_rho=0.05))) == "SAM(Graphed(Plain()))"
    assert repr(strategy_for(job(chunk_size=4, dropout_rng="counter"))) == "Graphed(Chunked())"
    assert repr(strategy_for(job(world=2, devices=2))) == "Graphed(Sharded())"  # CPU processes: served
    with pytest.raises(SentembError, match=r"run 'r': train\.graphs cannot be combined with train\.devices 2 on CUDA"):
        strategy_for(job(world=2, devices=2, device="cuda"))


def test_the_plan_prices_a_graphed_step_at_the_graphed_floor():
    from dataclasses import replace

    from sentemb.ops.plan import GRAPHED_STEP_FLOOR_S_PER_LAYER, STEP_FLOOR_S_PER_LAYER, _with_graphs, step_seconds

    tiny = 1e9  # FLOPs far below either floor
    assert step_seconds(tiny, 12, 2, 1e15, 0.24) == pytest.approx(STEP_FLOOR_S_PER_LAYER * 24)
    assert step_seconds(tiny, 12, 2, 1e15, 0.24, graphs=True) == pytest.approx(GRAPHED_STEP_FLOOR_S_PER_LAYER * 24)
    big = 1e16  # compute-bound: the graph changes nothing
    assert step_seconds(big, 12, 2, 1e15, 0.24, graphs=True) == step_seconds(big, 12, 2, 1e15, 0.24)
    run = replace(testing.tiny_run("/m", "/c"), train=TrainSettings())
    assert _with_graphs(run, True).train.graphs and not _with_graphs(run, False).train.graphs
    assert _with_graphs(run, None) is run
    both = _with_graphs(run, True, True).train
    assert both.graphs and both.compile and not _with_graphs(run, None, False).train.compile
    # a fused run keeps its fused micro-batches graphed and compiled (the loop serves both since session 13)
    fused = replace(run, train=TrainSettings(grad_accum=2, fuse_micro_batches=2))
    assert _with_graphs(fused, True, True).train.fuse_micro_batches == 2


def test_the_plan_prices_a_compiled_graphed_step_at_its_measured_floor_and_mfu():
    """``train.graphs`` with ``train.compile``: the fused step's floor, and its MFU at width 768 only
    (measured there; a wider encoder keeps the uncompiled figure)."""
    from sentemb.ops.plan import (COMPILED_GRAPHED_FLOOR_S_PER_LAYER, COMPILED_GRAPHED_MFU,
                                  GRAPHED_STEP_FLOOR_S_PER_LAYER, MEASURED_MFU, mfu_for, step_seconds)

    assert COMPILED_GRAPHED_FLOOR_S_PER_LAYER < GRAPHED_STEP_FLOOR_S_PER_LAYER
    assert step_seconds(1e9, 12, 1, 1e15, 0.24, graphs=True, compiled=True) == pytest.approx(
        COMPILED_GRAPHED_FLOOR_S_PER_LAYER * 12)
    # compile without graphs: the eager floor (the host still dispatches every kernel)
    assert step_seconds(1e9, 12, 1, 1e15, 0.24, graphs=False, compiled=True) == step_seconds(1e9, 12, 1, 1e15, 0.24)
    assert mfu_for("bert-base-uncased", compiled=True) == COMPILED_GRAPHED_MFU[768] > MEASURED_MFU[768]
    assert mfu_for("roberta-large", compiled=True) == MEASURED_MFU[1024]
    assert mfu_for("bert-base-uncased", 0.5, compiled=True) == 0.5
    # a wider encoder: its own graphed floor, which compile leaves as it is (unmeasured compiled)
    from sentemb.ops.plan import GRAPHED_FLOOR_BY_WIDTH

    wide = step_seconds(1e9, 24, 1, 1e15, 0.3, graphs=True, width=1024)
    assert wide == pytest.approx(GRAPHED_FLOOR_BY_WIDTH[1024] * 24) and GRAPHED_FLOOR_BY_WIDTH[1024] > GRAPHED_STEP_FLOOR_S_PER_LAYER
    assert step_seconds(1e9, 24, 1, 1e15, 0.3, graphs=True, compiled=True, width=1024) == wide


def test_the_plan_prices_the_compiled_graphed_step_by_its_attention_kernel():
    """``train.attention``: the default ``auto`` (the memory-efficient kernel on CUDA) is priced at the
    sixth lend's measured step, ``sdpa`` (cuDNN's kernel on the H200) at its own, slower one; a wider
    encoder keeps its graphed floor and uncompiled MFU whatever the kernel (unmeasured there)."""
    from sentemb.ops.plan import (COMPILED_GRAPHED_BY_ATTENTION, COMPILED_GRAPHED_FLOOR_S_PER_LAYER,
                                  COMPILED_GRAPHED_MFU, MEASURED_MFU, mfu_for, step_seconds)

    floor = {a: step_seconds(1e9, 12, 1, 1e15, 0.3, graphs=True, compiled=True, attention=a)
             for a in ("auto", "sdpa_efficient", "sdpa", "sdpa_math")}
    assert floor["auto"] == floor["sdpa_efficient"] == pytest.approx(12 * COMPILED_GRAPHED_FLOOR_S_PER_LAYER)
    assert floor["sdpa"] == pytest.approx(12 * COMPILED_GRAPHED_BY_ATTENTION["sdpa"][0])
    assert floor["sdpa"] > floor["sdpa_math"] > floor["auto"]
    mfu = {a: mfu_for("bert-base-uncased", compiled=True, attention=a) for a in ("auto", "sdpa", "eager")}
    assert mfu["auto"] == COMPILED_GRAPHED_MFU[768] > mfu["sdpa"] == mfu["eager"] > MEASURED_MFU[768]
    assert mfu_for("roberta-large", compiled=True, attention="sdpa") == MEASURED_MFU[1024]
    # uncompiled, the kernel does not enter the price (measured with cuDNN's only)
    assert step_seconds(1e9, 12, 1, 1e15, 0.3, graphs=True, attention="sdpa") == step_seconds(1e9, 12, 1, 1e15, 0.3,
                                                                                              graphs=True)


@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_graphed_two_processes_train_as_one_with_counter_dropout(worlds, tmp_path, method):
    """``train.devices: 2`` (two gloo processes) with graphs on and counter dropout: the weights of one
    graphed process (the chunked check's tolerance), as ``sentemb check-method``'s devices check.
    ArcCSE: each rank's share of the triplets is taken by position (its ``chunk`` in a graphed run)."""
    import json
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from sentemb.train.loop import train

    h = worlds(method)
    over = dict(dropout_rng="counter", graphs=True, max_steps=2)
    train(h.exact_run(**over), tmp_path / "one", progress=False, method_cls=h.cls)
    (tmp_path / "run2.json").write_text(json.dumps(h.exact_run(devices=2, **over).to_dict()), "utf-8")
    r = subprocess.run([sys.executable, "-m", "sentemb", "train", "--run-config", str(tmp_path / "run2.json"),
                        "--output-dir", str(tmp_path / "two"), "--no-track", "--quiet"], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for f in sorted((tmp_path / "one" / "model").rglob("*.safetensors")):
        testing.close(load_file(tmp_path / "two" / "model" / f.relative_to(tmp_path / "one" / "model")), load_file(f),
                      f"devices 2 graphed: {f.name}", floor="whole")


def test_a_step_that_reads_its_step_number_or_bumps_python_state_is_refused_naming_it(worlds):
    """What a replay would not redo is refused at the capture check (on the CPU too), naming it: a
    loss that reads ``self.step`` (a schedule: the replay would keep the captured step), a counter
    bumped in the step. ``tests/test_stateful.py`` runs the stateful example graphed (``state_graphed``)."""
    h = worlds("simcse")

    class Scheduled(h.cls):
        def batch_terms(self, emb, batch):
            out = super().batch_terms(emb, batch)
            return out if self.step >= 0 else {}

    class Counting(h.cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = 0

        def encode(self, batch):
            self.calls += 1
            return super().encode(batch)

    class KeepsLast(h.cls):
        def encode(self, batch):
            enc = super().encode(batch)
            self.last = enc.batch["z1"].detach()  # a new attribute, read later
            return enc

    class Nested(h.cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.seen = {"z": []}

        def encode(self, batch):
            enc = super().encode(batch)
            self.seen["z"].append(enc.batch["z1"].detach())  # a list inside a dict
            return enc

    class Centre(h.cls):
        """A plain tensor attribute read in the step and rebuilt (not updated in place) by the hook."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.centre = torch.zeros(())

        def batch_terms(self, emb, batch):
            out = super().batch_terms(emb, batch)
            out["weighted"] = {k: v + 0 * self.centre for k, v in out["weighted"].items()}
            return out

        def after_step(self, step):
            self.centre = self.centre * 0.9 + 0.1

    run = h.exact_run(dropout=0.0, graphs=True)
    with pytest.raises(SentembError, match=r"keeps Python state in its step.*it reads self\.step during the step"):
        _train(run, steps=1, cls=Scheduled)
    with pytest.raises(SentembError, match=r"it changes Counting\.calls during the step"):
        _train(run, steps=1, cls=Counting)
    with pytest.raises(SentembError, match=r"it sets KeepsLast\.last during the step"):
        _train(run, steps=1, cls=KeepsLast)
    with pytest.raises(SentembError, match=r"it changes Nested\.seen during the step"):
        _train(run, steps=1, cls=Nested)
    with pytest.raises(SentembError, match=r"replaced centre with new tensors since its step was captured"):
        _train(run, steps=2, cls=Centre)
    _train(h.exact_run(dropout=0.0), steps=1, cls=Counting)  # eager: served


def test_paser_in_a_graphed_run_has_one_decoder_row_per_sentence_and_the_eager_loss(worlds):
    """PaSeR under ``train.graphs`` (``ctx.static``): a sentence without a target phrase gets a padding
    decoder row (one attended pad token, no label), so the rows' count is the batch's (no new graph
    per count) and a chunk's rows are a slice; the loss and its chunks' sum are the eager batch's
    (dropout off), where such sentences have no row."""
    from dataclasses import replace

    h = worlds("paser")
    m = h.make().eval()
    lines = list(range(8))
    sentences = [x.rstrip("\n") for x in h.corpus.read_text("utf-8").splitlines()[:8]]
    for i in (1, 4, 5):  # no RAKE phrase: no target
        m.phrases[i] = []
    eager = m.build_batch(sentences, lines=lines, micro=7)
    m.ctx = replace(m.ctx, static=True)
    static = m.build_batch(sentences, lines=lines, micro=7)
    assert eager["dec_rows"].tolist() == [0, 2, 3, 6, 7] and static["dec_rows"].tolist() == list(range(8))
    assert (static["dec_labels"][[1, 4, 5]] == -100).all() and static["dec_attention_mask"][[1, 4, 5]].sum(1).tolist() == [1, 1, 1]
    assert torch.equal(static["dec_labels"][[0, 2, 3, 6, 7]], eager["dec_labels"])
    with torch.no_grad():
        got = m.losses(static)
        parts = [m.row_terms(m.encode(c), c, static) for c in (m.chunk(static, 0, 3), m.chunk(static, 3, 8))]
        m.ctx = replace(m.ctx, static=False)
        ref = m.losses(eager)
    for k in ("gen", "mlm", "loss"):
        assert float(got[k]) == pytest.approx(float(ref[k]), rel=1e-5), k
    for k in ("gen", "mlm"):
        assert float(sum(p[k] for p in parts)) == pytest.approx(float(ref[k]), rel=1e-5), k
    with capture_hazards(torch.device("cpu")) as hazards:
        m.ctx = replace(m.ctx, static=True)
        m.chunk(static, 3, 8)
    assert not hazards, hazards


def test_a_paser_step_without_targets_leaves_the_decoder_and_mlm_head_to_the_optimizer_as_eager(worlds):
    """A graphed step runs PaSeR's decoder and MLM head on every batch, writing their parameters zero
    gradients where the eager step, on a batch without a phrase target or a masked token, writes
    none; AdamW would still move them (momentum, weight decay). ``static_idle_parameters`` names
    them: graphed trains to the eager weights, the step with targets first, then two without."""

    h = worlds("paser")

    class LaterWithout(h.cls):  # steps 1 and 2: no phrase target, no masked token
        def build_batch(self, sentences, step=0, **kw):
            b = super().build_batch(sentences, step, **kw)
            if step >= 1:
                b["dec_labels"] = torch.full_like(b["dec_labels"], -100)
                b["mlm_labels"] = torch.full_like(b["mlm_labels"], -100)
            return b

    args = {**h.args, **getattr(h.cls, "contract_no_dropout", {}), "mlm_head_tied": False}
    over = {"precision": "fp32", "model_selection": "last", "prefetch": False, "token_cache": False,
            "dropout": 0.0, "weight_decay": 0.1}
    first, _ = _train(h.run(args, **over), steps=1, cls=LaterWithout)
    eager, _ = _train(h.run(args, **over), steps=3, cls=LaterWithout)
    graphed_first, _ = _train(h.run(args, graphs=True, **over), steps=1, cls=LaterWithout)
    graphed, strategy = _train(h.run(args, graphs=True, **over), steps=3, cls=LaterWithout)
    assert repr(strategy) == "Graphed(Plain())"
    idle = [k for k in eager if k.startswith(("decoder.layers.", "decoder.embed_positions", "mlm_head."))]
    assert idle and all(torch.equal(eager[k], first[k]) for k in idle)  # eager: untouched after step 0
    _same(graphed, eager, 1e-4, "paser: graphed vs eager weights, steps without targets")
    moved = [k for k in idle if not torch.equal(graphed[k], graphed_first[k])]
    assert not moved, moved  # graphed: untouched after step 0 too
    assert not torch.equal(graphed["decoder.embed_positions.weight"], _train(h.run(args, **over), 0, LaterWithout)[0]["decoder.embed_positions.weight"])


class _GatedHead(__import__("sentemb.methods.simcse", fromlist=["SimCSE"]).SimCSE):
    """SimCSE with an extra head that only even steps use: eagerly it is skipped on odd steps (no
    gradient), the static step runs it times 0 (zero gradients)."""

    name = "gated-head"
    declare = True

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        self.extra = torch.nn.Linear(encoder.config.hidden_size, 4)

    def build_batch(self, sentences, step=0, **kw):
        b = super().build_batch(sentences, step, **kw)
        b["use_extra"] = torch.full((b["input_ids"].size(0),), float(step % 2 == 0))
        return b

    def batch_terms(self, emb, batch):
        from sentemb.methods import WEIGHTED

        out = super().batch_terms(emb, batch)
        z = emb["z1"] if "z1" in emb else next(iter(emb.values()))
        if self.ctx.static:
            out[WEIGHTED]["extra"] = self.extra(z.float()).pow(2).mean() * batch["use_extra"][0]
        elif bool(batch["use_extra"][0]):
            out[WEIGHTED]["extra"] = self.extra(z.float()).pow(2).mean()
        return out

    def static_idle_parameters(self, batch):
        return list(self.extra.parameters()) if self.declare and not batch["use_extra"][0] else []


@pytest.mark.parametrize("variant", ["declared", "undeclared", "wrongly declared"])
def test_the_graphs_check_names_parameters_the_static_step_gives_a_zero_gradient(tmp_path, variant):
    """``check-method``'s ``graphs``: a parameter only the static step gives a (zero) gradient must be
    named by ``static_idle_parameters``, and only such a one."""

    class Method(_GatedHead):
        declare = variant != "undeclared"

        def static_idle_parameters(self, batch):
            if variant == "wrongly declared":  # the word embeddings: every step uses them
                return list(self.encoder.embeddings.word_embeddings.parameters())
            return super().static_idle_parameters(batch)

    h = testing.harness(Method, tmp_path)
    if variant == "declared":
        testing.check_graphs(h)
        return
    with pytest.raises(testing.CheckFailed) as e:
        testing.check_graphs(h)
    if variant == "undeclared":
        assert "step 1 micro-batch 2: the static (graphed) step writes zero gradients to extra.bias, extra.weight" in str(e.value)
        assert "name them in Method.static_idle_parameters(batch)" in str(e.value)
    else:
        assert "names encoder.embeddings.word_embeddings.weight, which an eager step gives a gradient" in str(e.value)


@pytest.mark.parametrize("mode", ["counter", "generator"])
def test_paser_keyed_masks_do_not_depend_on_whether_a_chunk_runs_the_decoder(worlds, mode):
    """Dropout on, keyed masks (``dropout_rng`` counter/keyed): the decoder's calls take a block of
    their own (``call_block``), so the MLM forward after it draws the same masks whether the decoder
    ran (a graphed batch: always; a chunk with a target) or not (an eager chunk without one): the
    graphed batch's losses are the eager batch's, and the eager chunks' sum is the whole batch's."""
    from dataclasses import replace

    from sentemb.model.dropout import keyed

    h = worlds("paser")
    m = h.make().train()
    sentences = [x.rstrip("\n") for x in h.corpus.read_text("utf-8").splitlines()[:8]]
    for i in (1, 4, 5):  # no target: the eager chunk [4, 6) has no decoder row
        m.phrases[i] = []
    eager = m.build_batch(sentences, lines=list(range(8)), micro=7)
    m.ctx = replace(m.ctx, static=True)
    static = m.build_batch(sentences, lines=list(range(8)), micro=7)
    with torch.no_grad():
        with keyed(5, 7, 0, 8, mode=mode):
            got = m.losses(static)
        m.ctx = replace(m.ctx, static=False)
        with keyed(5, 7, 0, 8, mode=mode):
            ref = m.losses(eager)
        parts = []
        for a, b in ((0, 4), (4, 6), (6, 8)):
            c = m.chunk(eager, a, b)
            with keyed(5, 7, a, b, mode=mode):
                parts.append(m.row_terms(m.encode(c), c, eager))
    assert float(parts[1]["phrases"]) == 0  # the decoder skipped there
    for k in ("gen", "mlm"):
        assert float(got[k]) == pytest.approx(float(ref[k]), rel=1e-5), k
        assert float(sum(p[k] for p in parts)) == pytest.approx(float(ref[k]), rel=1e-5), k


def test_arccse_in_a_graphed_run_chunks_its_triplets_by_position_and_keeps_the_batch_triplet_loss(worlds):
    """ArcCSE's ``chunk`` in a graphed run (``ctx.static``): the triplet slots ``[start·T/n, stop·T/n)``,
    a slice (no capture hazard); over any chunking every triplet is counted once, so the chunks' L_tri
    (Eqs. 4-5, normalised by the batch's valid triplets) sum to the batch's, padding slots left out."""
    from dataclasses import replace

    h = worlds("arccse")
    m = h.make().eval()
    m.ctx = replace(m.ctx, static=True)
    m.args = replace(m.args, triplet_margin=10.0)  # every triplet inside the hinge: each one counts
    sentences = [x.rstrip("\n") for x in h.corpus.read_text("utf-8").splitlines()[:8]]
    batch = m.build_batch(sentences, lines=list(range(8)), micro=3)
    t = batch["tri_index"].numel()
    batch["tri_index"][[1, 5, 6][: max(0, t - 1)]] = -1  # as padding slots
    with torch.no_grad():
        whole = float(m.row_terms(m.encode(batch), batch, batch)["triplet"])
        assert whole > 0
        for bounds in ([(0, 8)], [(0, 4), (4, 8)], [(0, 3), (3, 5), (5, 8)], [(i, i + 1) for i in range(8)]):
            chunks = [m.chunk(batch, a, b) for a, b in bounds]
            assert sum(c["tri_index"].numel() for c in chunks) == t
            got = sum(float(m.row_terms(m.encode(c), c, batch)["triplet"]) for c in chunks)
            assert got == pytest.approx(whole, rel=1e-5), bounds
    with capture_hazards(torch.device("cpu")) as hazards:
        m.chunk(batch, 3, 5)
    assert not hazards, hazards


# ------------------------------------------- issue 37, session 12: what could take the step under its targets


def test_the_clip_divisor_is_clip_grad_norm_s_factor_inverted():
    """``clip_divisor``: 1 / (``clip_grad_norm_``'s factor clamped at 1), the total norm computed here in
    fp64 over every gradient flattened (mixed dtypes, a parameter without gradient)."""
    from sentemb.train.step import clip_divisor

    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((7, 5), (11,), (3, 3, 2))]
    params.append(torch.nn.Parameter(torch.randn(4, generator=g).to(torch.bfloat16)))
    params.append(torch.nn.Parameter(torch.randn(2)))  # no gradient: not in the norm
    for p, scale in zip(params[:4], (1.0, 3.0, 0.5, 2.0)):
        p.grad = (scale * torch.randn(p.shape, generator=g)).to(p.dtype)
    total = torch.cat([p.grad.double().flatten() for p in params[:4]]).norm().item()
    for max_norm in (0.1, 1.0, 2 * total):
        want = max(1.0, (total + 1e-6) / max_norm)
        got = clip_divisor(params, max_norm)
        assert got.dtype == torch.float32 and got.dim() == 0
        assert abs(got.item() - want) <= 1e-6 * want, (max_norm, got.item(), want)
    # against clip_grad_norm_ itself, on the fp32 gradients the loop has (it takes a bf16 tensor's norm in
    # bf16): its clipped gradients are g / d to rounding
    fp32 = params[:3]
    for max_norm in (0.1, 1.0, 1e3):
        d = clip_divisor(fp32, max_norm)
        clipped = [torch.nn.Parameter(p.detach().clone()) for p in fp32]
        for c, p in zip(clipped, fp32):
            c.grad = p.grad.clone()
        torch.nn.utils.clip_grad_norm_(clipped, max_norm)
        for c, p in zip(clipped, fp32):
            assert torch.allclose(c.grad, p.grad / d, rtol=1e-6, atol=0), max_norm


@pytest.mark.parametrize("clip", [1e-3, 1e3])
def test_the_fused_update_trains_as_the_separate_clip_and_step(worlds, clip):
    """``train.update: fused`` (the clip's factor as fused AdamW's ``grad_scale``) against the clip
    and the optimizer as two steps, graphed, 3 steps of 2 accumulated micro-batches, dropout off: the
    same weights to fp32 rounding, whether the clip bites (1e-3: it changes the weights, checked) or
    not (1e3)."""
    h = worlds("simcse")
    over = dict(dropout=0.0, grad_accum=2, graphs=True, grad_clip=clip)
    separate, _ = _train(h.exact_run(**over), steps=3, cls=h.cls)
    fused, _ = _train(h.exact_run(update="fused", **over), steps=3, cls=h.cls)
    _same(fused, separate, 1e-5, f"update fused vs separate, grad_clip {clip}")
    if clip < 1:  # the clip bites: without it the weights are elsewhere
        loose, _ = _train(h.exact_run(**{**over, "grad_clip": None}), steps=3, cls=h.cls)
        assert max((loose[k] - separate[k]).abs().max().item() for k in separate if separate[k].is_floating_point()) > 1e-4


def test_compile_mode_and_compile_random_reach_torch_compile_and_inductor(worlds, monkeypatch):
    """``train.compile_mode`` is torch.compile's ``mode``; ``compile_random`` sets Inductor's
    ``fallback_random`` (eager: torch's dropout kernels; inductor: Inductor's own Philox); a job
    compiled under other such settings than the last one drops Dynamo's cache first
    (``fresh_compile_cache``), one under the same keeps it."""
    import torch._dynamo
    import torch._inductor.config

    from sentemb.train import loop

    modes, resets = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **k: modes.append(mode) or fn)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(torch._inductor.config, "fallback_random", torch._inductor.config.fallback_random)
    monkeypatch.setattr(loop, "_COMPILED_UNDER", [])
    h = worlds("simcse")
    for over, mode, fallback, reset in (({}, None, True, 0), ({}, None, True, 0),
                                        ({"compile_random": "inductor"}, None, False, 1),
                                        ({"compile_mode": "max-autotune-no-cudagraphs"}, "max-autotune-no-cudagraphs",
                                         True, 1)):
        modes.clear()
        resets.clear()
        with setup(h.exact_run(compile=True, **over), "/nonexistent", h.cls):
            assert modes == [mode, mode] and torch._inductor.config.fallback_random is fallback, (over, modes)
            assert len(resets) == reset, over


def test_settings_the_fused_update_and_inductor_dropout_cannot_serve_are_refused():
    from sentemb.train.step import check_settings

    for train, key in (({"update": "fused", "precision": "fp16"}, "train.update fused"),
                       ({"compile": True, "compile_random": "inductor", "dropout_rng": "counter"},
                        "train.compile_random inductor")):
        with pytest.raises(SentembError, match=key):
            check_settings(TrainSettings(**train), "run 'r'")


def test_inductor_dropout_is_another_random_run_of_the_compiled_step(worlds):
    """``compile_random: inductor`` with dropout on, graphed and compiled (Inductor's CPU code): the
    masks are Inductor's, so the weights leave those of the ``eager``-random compiled run (which are
    the eager run's, ``test_graphs_with_compile_train_as_graphs_without``) by far more than rounding;
    the same seed gives the same weights again (its seeds are drawn from torch's generator)."""
    h = worlds("simcse")
    over = dict(graphs=True, compile=True)
    eager_rng, _ = _train(h.exact_run(**over), steps=2, cls=h.cls)
    runs = [_train(h.exact_run(compile_random="inductor", **over), steps=2, cls=h.cls)[0] for _ in range(2)]
    _same(runs[1], runs[0], 1e-6, "compile_random inductor, the same seed twice")
    assert max((runs[0][k] - eager_rng[k]).abs().max().item() for k in eager_rng
               if eager_rng[k].is_floating_point()) > 1e-4


@pytest.mark.parametrize("attention", ["sdpa_math", "sdpa_efficient", "eager"])
def test_each_attention_kernel_trains_to_the_sdpa_weights(worlds, attention):
    """``train.attention``: another kernel for the same attention. Dropout off, graphed (the capture
    check passes), 2 steps of 2 accumulated micro-batches: the weights of the default ``sdpa`` run to
    fp32 rounding."""
    h = worlds("simcse")
    over = dict(dropout=0.0, grad_accum=2, graphs=True)
    sdpa, _ = _train(h.exact_run(**over), steps=2, cls=h.cls)
    other, _ = _train(h.exact_run(attention=attention, **over), steps=2, cls=h.cls)
    _same(other, sdpa, 1e-4, f"attention {attention} vs sdpa")
    with setup(h.exact_run(attention=attention, **over), "/nonexistent", h.cls) as job:  # the other kernel is the one set
        impl = job.method.encoder.config._attn_implementation
        assert impl == ("eager" if attention == "eager" else "sdpa"), impl
        assert torch.backends.cuda.flash_sdp_enabled() is (attention in ("sdpa", "eager"))


def test_the_sdpa_backend_is_restricted_while_the_job_runs_and_put_back_after():
    """``sdpa_efficient`` and ``sdpa_math`` set the process's SDPA backend flags for the job's life
    (``Job.close`` puts them back); ``sdpa`` and ``eager`` leave them alone."""
    from sentemb.train.loop import sdpa_backend

    flags = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
             torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)
    before = [f() for f in flags]
    assert sdpa_backend("sdpa") is None and sdpa_backend("eager") is None
    for attention, want in (("sdpa_math", [False, False, True, False]), ("sdpa_efficient", [False, True, True, False])):
        undo = sdpa_backend(attention)
        try:
            assert [f() for f in flags] == want, attention
        finally:
            undo()
        assert [f() for f in flags] == before, attention


def test_attention_auto_is_the_memory_efficient_kernel_on_cuda_and_torchs_pick_elsewhere(worlds):
    """``train.attention: auto`` (the default): ``sdpa_efficient`` on a CUDA device (faster than the
    cuDNN kernel torch picks on an H200 at short rows), ``sdpa`` on the CPU and with ``unpad`` (its
    packed forward has its own attention); any other value as written. A CPU job under the default
    leaves the SDPA flags alone and records the kernel it ran."""
    from sentemb.train.loop import resolve_attention

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_attention("auto", cuda) == "sdpa_efficient" and resolve_attention("auto", cpu) == "sdpa"
    assert resolve_attention("auto", cuda, unpad=True) == "sdpa"
    for other in ("sdpa", "sdpa_efficient", "sdpa_math", "eager"):
        assert resolve_attention(other, cuda) == resolve_attention(other, cpu) == other
    h = worlds("simcse")
    run = h.exact_run(dropout=0.0)
    assert run.train.attention == "auto"
    flash = torch.backends.cuda.flash_sdp_enabled()
    with setup(run, "/nonexistent", h.cls) as job:
        assert job.attention == "sdpa" and not job.restore
        assert torch.backends.cuda.flash_sdp_enabled() is flash


def test_the_resolved_attention_kernel_is_the_one_the_job_sets(worlds, monkeypatch):
    """What ``auto`` does on CUDA, on the CPU: with ``resolve_attention`` answering ``sdpa_efficient``
    (as it does on a CUDA device), the job restricts the SDPA backend to it while it runs, records
    it, and puts the flags back when it closes."""
    from sentemb.train import loop

    monkeypatch.setattr(loop, "resolve_attention", lambda attention, device, unpad=False: "sdpa_efficient")
    h = worlds("simcse")
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())
    with setup(h.exact_run(dropout=0.0), "/nonexistent", h.cls) as job:
        assert job.attention == "sdpa_efficient" and len(job.restore) == 1
        assert not torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()) == before


@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_graphed_fused_micro_batches_train_as_the_eager_fused_step(worlds, method):
    """``fuse_micro_batches: 2`` with ``graphs``: each group of two micro-batches is one unit (a flat
    batch, ``Fused.units``), captured and replayed as one graph. Dropout off, with SAM (ArcCSE's
    paper step), 3 steps of 2 micro-batches: the eager fused run's weights."""
    h = worlds(method)
    over = dict(dropout=0.0, grad_accum=2, fuse_micro_batches=2, sam_rho=0.05)
    eager, _ = _train(h.exact_run(**over), steps=3, cls=h.cls)
    graphed, strategy = _train(h.exact_run(graphs=True, **over), steps=3, cls=h.cls)
    assert repr(strategy) == "SAM(Graphed(Fused(2)))" and strategy.inner.captures >= 1
    assert all("|" in k for e in strategy.inner.entries.values() for k in e.batch)  # a flat unit per key
    _same(graphed, eager, 1e-4, f"{method}: graphed fused vs eager fused weights")


@pytest.mark.parametrize("method", ["simcse", "arccse"])
def test_compiled_fused_micro_batches_train_as_the_eager_fused_step(worlds, method):
    """``fuse_micro_batches: 2`` with ``train.compile`` and ``graphs`` (what the plan's ``--compile on``
    prices ArcCSE's paper runs as): each fused group's encoder forward is the compiled
    ``job.encode_fn``, inside the group's graph. Dropout off, with SAM, 2 steps of 2 micro-batches:
    the eager fused run's weights; Dynamo compiled the encoder (its frame counted)."""
    from torch._dynamo.utils import counters

    h = worlds(method)
    over = dict(dropout=0.0, grad_accum=2, fuse_micro_batches=2, sam_rho=0.05)
    eager, _ = _train(h.exact_run(**over), steps=2, cls=h.cls)
    counters.clear()
    compiled, strategy = _train(h.exact_run(graphs=True, compile=True, **over), steps=2, cls=h.cls)
    assert repr(strategy) == "SAM(Graphed(Fused(2)))"
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
    _same(compiled, eager, 1e-4, f"{method}: compiled graphed fused vs eager fused weights")


def test_a_compiled_job_runs_the_attention_kernel_it_asks_for_after_another_job_compiled(worlds):
    """``train.compile`` with ``attention: sdpa_math`` after a compiled ``sdpa`` job in the same
    process (gpu-check's rows): the compiled step runs the math attention (``bmm``), not the flash
    kernel the first job compiled (dropout off: with dropout torch's CPU SDPA takes the math path
    anyway)."""
    from torch.profiler import profile

    h = worlds("simcse")

    def attention_ops(**over):
        with setup(h.exact_run(compile=True, dropout=0.0, **over), "/nonexistent", h.cls) as job:
            state = State()
            for _ in run_steps(job, state, 1):  # compiled here
                pass
            with profile() as prof:
                for _ in run_steps(job, state, 1):
                    pass
        return {e.key for e in prof.key_averages() if "attention" in e.key or e.key == "aten::bmm"}

    assert any("flash_attention" in k for k in attention_ops()), "sdpa on the CPU: torch's flash kernel"
    ops = attention_ops(attention="sdpa_math")
    assert "aten::bmm" in ops and not any("flash_attention" in k for k in ops), ops


def test_the_restricted_backend_is_not_served_from_aotautograds_cache():
    """``sdpa_backend`` turns AOTAutograd's compile cache off while a restriction holds (and back on
    after): that cache keys Dynamo's graph, which holds SDPA undecomposed, so a function compiled
    before would be served with the kernel of its first compilation. Here: SDPA compiled with
    torch's choice (the CPU flash kernel), then, after ``torch._dynamo.reset``, compiled again under
    ``sdpa_math``: the math kernels (``bmm``) run."""
    import torch._functorch.config as functorch_config
    import torch.nn.functional as F
    from torch.profiler import profile

    from sentemb.train.loop import sdpa_backend

    def attend(q, m):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=m)

    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    m = torch.ones(2, 1, 8, 8, dtype=torch.bool)

    def ops(fn):
        with profile() as prof:
            fn(q, m).sum().backward()
        return {e.key for e in prof.key_averages() if "attention" in e.key or e.key == "aten::bmm"}

    before = functorch_config.enable_autograd_cache
    torch._dynamo.reset()
    try:
        assert any("flash_attention" in k for k in ops(torch.compile(attend)))
        torch._dynamo.reset()
        undo = sdpa_backend("sdpa_math")
        try:
            assert functorch_config.enable_autograd_cache is False
            got = ops(torch.compile(attend))
        finally:
            undo()
        assert functorch_config.enable_autograd_cache is before
        assert "aten::bmm" in got and not any("flash_attention" in k for k in got), got
    finally:
        torch._dynamo.reset()


def test_a_job_on_a_cuda_device_by_index_makes_it_current(monkeypatch):
    """A CUDA graph is captured on a stream of the current device: a job on ``cuda:1`` makes cuda:1
    current (else its capture, made on cuda:0's stream, would record none of its kernels and replay
    an empty graph). ``cuda`` without an index and the CPU leave the current device alone. The
    device that was current is returned, for the job to put back when it closes. (The capture
    itself needs a GPU; this checks the call, and ``tests/test_workers.py``'s
    ``test_setup_makes_the_device_current_and_the_fork_safe`` that setup makes it.)"""
    from sentemb.utils import use_device

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert [use_device(torch.device(name)) for name in ("cpu", "cuda", "cuda:1")] == [None, None, 0]
    assert calls == [torch.device("cuda:1")], calls


def test_a_compile_cache_reset_forgets_the_warmed_fused_masks(monkeypatch):
    """``fresh_compile_cache`` drops the compiled code when a job compiles under other settings, and
    with it the record that ``warm_fused`` compiled the fused mask: the next capture warms it again
    rather than compiling it inside its warm-up passes."""
    from sentemb.model import dropout
    from sentemb.train import loop

    monkeypatch.setattr(loop, "_COMPILED_UNDER", [("a",)])
    monkeypatch.setattr(dropout, "_WARM", {"cuda:0"})
    loop.fresh_compile_cache(("a",))
    assert dropout._WARM == {"cuda:0"}  # the same settings: nothing dropped
    loop.fresh_compile_cache(("b",))
    assert dropout._WARM == set()
