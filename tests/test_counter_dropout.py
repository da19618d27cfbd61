"""Counter-based keyed dropout (``sentemb.model.dropout``, mode ``counter``; issue 37 §2): masks computed
from (seed, micro-batch, call, sentence, view, coordinates) with integer tensor ops. Checked against
what a mask must be: its rate, its independence, and its invariance to chunking and padding."""

import math

import torch
import torch.nn.functional as F

from sentemb.model.dropout import counter_keep_mask, keyed, mix


def _mask(shape, p, key=mix(7, 3), sentences=None, views=None, call=0):
    r = shape[0]
    s = torch.arange(r) if sentences is None else torch.as_tensor(sentences)
    v = torch.zeros(r, dtype=torch.int64) if views is None else torch.as_tensor(views)
    return counter_keep_mask(key, s, v, shape, p, call)


def test_rate_is_the_configured_one():
    for p in (0.1, 0.5):
        m = _mask((64, 32, 96), p)
        n = m.numel()
        kept = float(m.float().mean())
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(kept - (1 - p)) < 5 * sigma, (p, kept)
        # per row and per feature too: no row or coordinate is favoured
        rows = m.float().mean(dim=(1, 2))
        assert float(rows.std()) < 4 * math.sqrt(p * (1 - p) / (32 * 96)), p
        feats = m.float().mean(dim=(0, 1))
        assert float(feats.std()) < 4 * math.sqrt(p * (1 - p) / (64 * 32)), p


def test_masks_are_uncorrelated_between_views_calls_and_neighbours():
    a = _mask((256, 128), 0.5, views=torch.zeros(256, dtype=torch.int64)).float()
    b = _mask((256, 128), 0.5, views=torch.ones(256, dtype=torch.int64)).float()
    c = _mask((256, 128), 0.5, call=1).float()  # the next dropout call
    d = _mask((256, 128), 0.5, key=mix(7, 4)).float()  # the next micro-batch
    bound = 5 / math.sqrt(a.numel())
    for other in (b, c, d):
        assert abs(float(torch.corrcoef(torch.stack([a.flatten(), other.flatten()]))[0, 1])) < bound
    # neighbouring positions and rows
    assert abs(float(torch.corrcoef(torch.stack([a[:, :-1].flatten(), a[:, 1:].flatten()]))[0, 1])) < bound
    assert abs(float(torch.corrcoef(torch.stack([a[:-1].flatten(), a[1:].flatten()]))[0, 1])) < bound


def test_a_position_keeps_its_mask_whatever_the_padded_width():
    hidden = _mask((8, 20, 16), 0.1)
    wider = _mask((8, 32, 16), 0.1)
    assert torch.equal(hidden, wider[:, :20])
    attn = _mask((8, 4, 20, 20), 0.1)
    attn_wide = _mask((8, 4, 32, 32), 0.1)
    assert torch.equal(attn, attn_wide[:, :, :20, :20])


def test_chunks_draw_the_unchunked_masks():
    torch.manual_seed(0)
    x = torch.randn(16, 10, 8)  # two views of 8 sentences, view-major as SimCSE doubles a batch
    with keyed(5, 2, 0, 8, mode="counter"):
        whole = F.dropout(x, 0.3, True)
    parts = []
    for lo, hi in ((0, 3), (3, 8)):
        rows = torch.cat([x[lo:hi], x[8 + lo : 8 + hi]])
        with keyed(5, 2, lo, hi, mode="counter"):
            parts.append(F.dropout(rows, 0.3, True))
    got = torch.cat([parts[0][:3], parts[1][:5], parts[0][3:], parts[1][5:]])
    assert torch.equal(whole, got)
    # the two views of a sentence get different masks, and the kept values are scaled by 1/(1-p)
    assert not torch.equal(whole[0] != 0, whole[8] != 0)
    kept = whole != 0
    assert torch.allclose(whole[kept], x[kept] / 0.7)


def test_another_step_or_seed_draws_other_masks():
    x = torch.ones(4, 64)
    with keyed(5, 2, 0, 4, mode="counter"):
        a = F.dropout(x, 0.5, True)
        a2 = F.dropout(x, 0.5, True)  # the next call of the same forward
    with keyed(5, 3, 0, 4, mode="counter"):
        b = F.dropout(x, 0.5, True)
    with keyed(6, 2, 0, 4, mode="counter"):
        c = F.dropout(x, 0.5, True)
    with keyed(5, 2, 0, 4, mode="counter"):
        again = F.dropout(x, 0.5, True)
    assert torch.equal(a, again)
    assert not torch.equal(a, a2) and not torch.equal(a, b) and not torch.equal(a, c)


def test_a_key_tensor_replaces_seed_and_micro():
    """What a captured graph does: one key tensor, the step's key copied into it before each replay."""
    from sentemb.model.dropout import key_words

    x = torch.ones(4, 64)
    key = key_words(mix(5, 2))
    with keyed(0, 0, 0, 4, mode="counter", key=key):
        a = F.dropout(x, 0.5, True)
    with keyed(5, 2, 0, 4, mode="counter"):
        b = F.dropout(x, 0.5, True)
    assert torch.equal(a, b)
    key.copy_(key_words(mix(5, 3)))
    with keyed(0, 0, 0, 4, mode="counter", key=key):
        c = F.dropout(x, 0.5, True)
    with keyed(5, 3, 0, 4, mode="counter"):
        d = F.dropout(x, 0.5, True)
    assert torch.equal(c, d) and not torch.equal(a, c)


def test_counter_dropout_gives_chunked_and_bucketed_runs_the_plain_gradient(tmp_path):
    """Through the loop (``train.dropout_rng: counter``, dropout on): chunks of 4, and padding to a
    wider bucket, give the plain step's gradient; chunked ``stream`` masks do not (the control)."""
    from sentemb.testing import close, harness, step_gradients

    h = harness("simcse", tmp_path)
    ref, _ = step_gradients(h.exact_run(dropout_rng="counter"), h.cls)
    chunked, chunk = step_gradients(h.exact_run(dropout_rng="counter", chunk_size=4), h.cls)
    assert chunk == 4
    close(chunked, ref, "counter dropout, chunked gradient")
    # the first batch's longest row is 32 tokens: at max_len 40 it is padded to 32, with the bucket 36 to 36
    wide, _ = step_gradients(h.exact_run(dropout_rng="counter", max_len=40), h.cls)
    bucketed, _ = step_gradients(h.exact_run(dropout_rng="counter", max_len=40, buckets=[36]), h.cls)
    close(bucketed, wide, "counter dropout, bucketed gradient")
    stream, _ = step_gradients(h.exact_run(chunk_size=4), h.cls)
    plain, _ = step_gradients(h.exact_run(), h.cls)
    diff = sum(float((stream[k] - plain[k]).norm()) for k in plain) / sum(float(plain[k].norm()) for k in plain)
    assert diff > 1e-3, diff  # the control: stream masks are drawn per chunk, another draw than the whole batch's
    stream_wide, _ = step_gradients(h.exact_run(max_len=40), h.cls)
    stream_bucketed, _ = step_gradients(h.exact_run(max_len=40, buckets=[36]), h.cls)
    diff = sum(float((stream_bucketed[k] - stream_wide[k]).norm()) for k in stream_wide) / \
        sum(float(stream_wide[k].norm()) for k in stream_wide)
    assert diff > 1e-3, diff  # stream masks are drawn over the padded shape


def test_the_first_pass_of_gradient_caching_takes_the_whole_batch_with_counter_masks(tmp_path, monkeypatch):
    """``train.chunk_first_pass`` (issue 37 §3): with counter (or keyed) masks the graph-free first
    pass of a chunked step encodes the whole micro-batch in one forward (``auto``, ``whole``), or
    chunk by chunk (``chunks``); the gradient is the plain step's either way. With stream masks
    ``auto`` stays chunk by chunk (each chunk's random state is replayed)."""
    from sentemb.testing import close, harness, step_gradients

    h = harness("simcse", tmp_path)
    calls = []
    encode = h.cls.encode

    def spy(self, batch):
        calls.append(("grad" if torch.is_grad_enabled() else "nograd", self.n_sentences(batch)))
        return encode(self, batch)

    monkeypatch.setattr(h.cls, "encode", spy)
    ref = {rng: step_gradients(h.exact_run(dropout_rng=rng), h.cls)[0] for rng in ("counter", "keyed")}
    n = calls[0][1]
    assert calls == [("grad", n)] * 2 and n > 8
    for mode, rng, first in (("auto", "counter", [n]), ("whole", "counter", [n]), ("chunks", "counter", [4] * (n // 4)),
                             ("auto", "keyed", [n]), ("auto", "stream", [4] * (n // 4))):
        calls.clear()
        grads, chunk = step_gradients(h.exact_run(dropout_rng=rng, chunk_size=4, chunk_first_pass=mode), h.cls)
        assert chunk == 4
        assert [k for w, k in calls if w == "nograd"] == first, (mode, rng, calls)
        assert [k for w, k in calls if w == "grad"] == [4] * (n // 4), (mode, rng, calls)
        if rng != "stream":
            close(grads, ref[rng], f"chunk_first_pass {mode}, dropout_rng {rng}: the chunked gradient")


def test_the_fused_kernel_draws_the_eager_masks_bit_for_bit():
    """``train.counter_kernel: fused`` (``torch.compile`` of the same hash; here Inductor's CPU code):
    the same bits as the eager ops, for hidden-state and attention-weight shapes, several widths
    (one compiled kernel per rank: dynamic shapes), calls, views, a device key tensor, and through
    ``keyed`` dropout itself."""
    from sentemb.model.dropout import key_words

    key = key_words(mix(3, 9))
    for shape, call in (((6, 20, 16), 0), ((6, 32, 16), 5), ((6, 4, 20, 20), 2), ((6, 4, 12, 12), 37)):
        s = torch.tensor([0, 1, 2, 0, 1, 2])
        v = torch.tensor([0, 0, 0, 1, 1, 1])
        for p in (0.1, 0.5):
            eager = counter_keep_mask(key, s, v, shape, p, call)
            fused = counter_keep_mask(key, s, v, shape, p, call, kernel="fused")
            assert fused.dtype == torch.bool and fused.shape == eager.shape
            assert torch.equal(fused, eager), (shape, call, p)
    x = torch.randn(12, 9, 8)
    with keyed(5, 2, 0, 6, mode="counter"):
        a = F.dropout(x, 0.3, True)
    with keyed(5, 2, 0, 6, mode="counter", kernel="fused"):
        b = F.dropout(x, 0.3, True)
    assert torch.equal(a, b)


def test_a_failing_compile_falls_back_to_the_eager_ops_with_a_warning(monkeypatch, caplog):
    """No compiler on the machine (no Triton, no C++ toolchain): ``fused`` warns once and computes the
    same masks with the eager ops."""
    from sentemb.model import dropout

    def broken():
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(dropout, "_fused", lambda: lambda *a: broken())
    monkeypatch.setattr(dropout, "_FUSED_FAILED", [])
    s, v = torch.arange(4), torch.zeros(4, dtype=torch.int64)
    with caplog.at_level("WARNING", logger="sentemb.model.dropout"):
        got = counter_keep_mask(mix(1, 2), s, v, (4, 6, 5), 0.2, 3, kernel="fused")
        again = counter_keep_mask(mix(1, 2), s, v, (4, 6, 5), 0.2, 3, kernel="fused")
    assert torch.equal(got, counter_keep_mask(mix(1, 2), s, v, (4, 6, 5), 0.2, 3)) and torch.equal(got, again)
    warned = [r for r in caplog.records if "counter_kernel fused" in r.getMessage()]
    assert len(warned) == 1 and "no compiler here" in warned[0].getMessage()


def test_the_inline_kernel_compiles_without_a_break_and_draws_the_eager_masks(monkeypatch):
    """``train.counter_kernel: inline``: ``keyed`` puts the key, the chunk's start and the coordinates
    on the device at its entry, so ``torch.compile`` traces the dropout with the code around it. One
    ``fullgraph`` compilation (a graph break would raise) serves every chunk start and micro-batch
    (no recompilation), and hidden-state masks, SDPA's attention-weight masks and ``rows()`` layouts
    are the eager kernel's bit for bit."""
    from torch._dynamo.utils import counters

    from sentemb.model import dropout

    monkeypatch.setattr(F, "dropout", F.dropout)  # compile_inline replaces them for the process
    monkeypatch.setattr(F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    monkeypatch.setattr(dropout, "_INSTALLED", dropout._INSTALLED)
    dropout.compile_inline()
    torch.manual_seed(0)
    x, q = torch.randn(12, 9, 8), torch.randn(12, 2, 5, 4)
    pairs = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]), torch.tensor([0, 1] * 6)

    def f(x, q):
        h = F.dropout(x, 0.3, True) * 2.0 + 1.0  # a neighbour for Inductor to fuse the mask with
        a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)
        with dropout.rows(*pairs):
            u = F.dropout(x, 0.1, True)
        return h, a, u

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    for seed, micro, start in ((5, 2, 0), (5, 3, 6), (8, 3, 12)):
        with keyed(seed, micro, start, start + 6, mode="counter"):
            want = f(x, q)
        with keyed(seed, micro, start, start + 6, mode="counter", kernel="inline", device="cpu"):
            got = compiled(x, q)
        for w, g, what in zip(want, got, ("hidden", "attention", "rows")):
            # a mask bit that differed would differ by the whole value; rounding stays far below
            assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (seed, micro, start, what)
        assert not torch.equal(got[0], compiled(x, q)[0])  # outside a context: torch's own dropout
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # the keyed trace and the plain one
    assert not counters["graph_break"], dict(counters["graph_break"])
    with keyed(1, 1, 0, 6, mode="counter", kernel="eager"):
        eager = F.dropout(x, 0.5, True)
    with keyed(1, 1, 0, 6, mode="counter", kernel="inline", device="cpu"):
        assert torch.equal(F.dropout(x, 0.5, True), eager)  # and uncompiled, exactly the eager masks


def test_the_inline_kernel_reads_a_given_key_and_one_device_entry(monkeypatch):
    """A given key (a captured graph's static input) is the context's key itself, never replaced by
    a host copy; ``cuda`` without an index is the current device, as a tensor made there reports it
    (so a graph's key on ``cuda:0`` matches a job on ``cuda``); a key on another device than the
    masks' is refused; a longer ``arange`` keeps the shorter one alive (captured graphs may read it)."""
    from sentemb import SentembError
    from sentemb.model import dropout
    from sentemb.model.dropout import key_words

    key = key_words(mix(4, 1))
    with keyed(0, 0, 0, 4, mode="counter", kernel="inline", key=key, device="cpu") as ctx:
        assert ctx.key is key
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert dropout._device("cuda") == torch.device("cuda:0") and dropout._device("cpu") == torch.device("cpu")
    monkeypatch.setattr(dropout, "_device", lambda d: torch.device("meta"))
    try:
        with keyed(0, 0, 0, 4, mode="counter", kernel="inline", key=key, device="cpu"):
            raise AssertionError("a key on another device was taken")
    except SentembError as e:
        assert "key tensor is on cpu" in str(e)
    monkeypatch.undo()
    monkeypatch.setattr(dropout, "_ARANGED", {})
    monkeypatch.setattr(dropout, "_SUPERSEDED", [])
    short = dropout._aranged(torch.device("cpu"))
    longer = dropout._aranged(torch.device("cpu"), 3 * short.size(0))
    assert longer.size(0) >= 3 * short.size(0) and dropout._SUPERSEDED == [short]
    assert torch.equal(longer[: short.size(0)], short)
