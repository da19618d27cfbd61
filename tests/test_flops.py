"""Counted FLOPs (sentemb.ops.flops) against FLOPs written out by hand, and the benchmark's use of them."""

import pytest
import torch


def test_counted_linear_and_attention_against_the_formula():
    """A linear layer and scaled-dot-product attention, forward + backward: 3 × the forward matmuls
    (the backward of a matmul is two matmuls of the same size), attention included."""
    from sentemb.ops.flops import counted

    b, l, h, heads, out = 3, 8, 16, 2, 24
    x = torch.randn(b, l, h, requires_grad=True)
    lin = torch.nn.Linear(h, out)

    def step():
        y = lin(x)
        q = x.view(b, l, heads, h // heads).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        (y.sum() + a.sum()).backward()

    _, flops = counted(step)
    linear = 2 * b * l * h * out
    attention = 2 * (2 * b * heads * l * l * (h // heads))  # QK^T and AV
    assert flops == 3 * (linear + attention)


def test_cpu_peak_is_a_positive_rate():
    from sentemb.ops.flops import cpu_peak_tflops

    peak = cpu_peak_tflops(n=256, repeats=2)
    assert 1e-4 < peak < 100  # TFLOP/s of one CPU: between a slow core and no CPU made
    bf16 = cpu_peak_tflops(n=256, repeats=2, dtype="bf16")  # the ceiling of bf16 rows (gpu-check --cpu)
    assert 1e-4 < bf16 < 400


def test_benchmark_counts_a_simcse_step_like_the_transformer_formula(tiny_bert_dir, tmp_path):
    """One SimCSE step counted through the loop's own code (``bench_method``) equals 6·N per token for
    the encoder's dense weights plus 12·layers·h·L per token for attention (PaLM App. B), per padded
    position: every sentence here is longer than max_len, so every batch is L = max_len wide. The
    formula leaves out small terms (the MLP head on 2B rows, the 2B×2B similarity, the unused BERT
    pooler's forward): about 0.5% at this size, so within 1%."""
    import random

    from transformers import AutoConfig

    from conftest import TINY_WORDS
    from sentemb.ops.benchmark import bench_method

    rng = random.Random(0)
    corpus = tmp_path / "long.txt"
    corpus.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(30)) + "\n" for _ in range(64)))
    max_len = 16
    secs, tok, padded, _, _, fpt = bench_method(tiny_bert_dir, corpus, 8, 2, 1, torch.device("cpu"), max_len, "fp32")
    cfg = AutoConfig.from_pretrained(tiny_bert_dir)
    h, layers, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    per_token = 6 * layers * (4 * h * h + 2 * h * inter) + 12 * layers * h * max_len
    # SimCSE's batch holds each sentence once and encodes it twice (two dropout views): per position
    # of the batch as built, two tokens go through the encoder.
    assert fpt == pytest.approx(2 * per_token, rel=0.01)
    assert padded == 8 * 2 * max_len  # 8 sentences, 2 timed steps, all max_len wide
    assert secs > 0 and tok == padded


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_gemms_compute_a_narrow_gemm_s_result_from_the_widened_inputs(dtype):
    """``fp32_gemms``: each matrix product of bf16/fp16 CPU tensors is the fp32 product of the same
    (exactly widened) inputs, rounded once to the input's dtype, in training and under inference_mode
    (where ``aten.linear`` reaches the mode whole); within the dtype's rounding of the CPU's own kernel;
    fp32 products untouched."""
    from sentemb.ops.flops import fp32_gemms

    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(s, generator=g).to(dtype) for s in ((5, 16), (16, 7), (7,)))
    a3, b3 = torch.randn(3, 5, 16, generator=g).to(dtype), torch.randn(3, 16, 7, generator=g).to(dtype)
    w = torch.randn(7, 16, generator=g).to(dtype)
    cases = {"mm": lambda: torch.mm(a, b), "addmm": lambda: torch.addmm(c, a, b), "bmm": lambda: torch.bmm(a3, b3),
             "baddbmm": lambda: torch.baddbmm(c, a3, b3), "matmul": lambda: a3 @ b,
             "linear": lambda: torch.nn.functional.linear(a3, w, c)}
    wide = lambda t: t.float()  # noqa: E731
    want = {"mm": wide(a) @ wide(b), "addmm": wide(c) + wide(a) @ wide(b), "bmm": wide(a3) @ wide(b3),
            "baddbmm": wide(c) + wide(a3) @ wide(b3), "matmul": wide(a3) @ wide(b),
            "linear": wide(a3) @ wide(w).T + wide(c)}
    for inference in (False, True):
        for name, f in cases.items():
            native = f()
            with torch.inference_mode(inference), fp32_gemms():
                got = f()
            assert got.dtype == dtype and got.shape == native.shape, name
            ref = want[name].to(dtype)
            assert torch.allclose(got.float(), ref.float(), rtol=2e-2 if dtype == torch.bfloat16 else 2e-3,
                                  atol=1e-2), name
            assert (got.float() - ref.float()).abs().max() <= (ref.float() - native.float()).abs().max() + 1e-2, name
    x = torch.randn(4, 4, generator=g)
    with fp32_gemms():
        assert torch.equal(x @ x, torch.mm(x, x))


def test_fp32_gemms_leave_a_bf16_step_s_counted_flops_and_saved_bytes_as_they_are(tiny_bert_dir):
    """What ``sentemb plan`` reads of a counted step under CPU bf16 autocast (``plan._count``): the
    FLOPs ``FlopCounterMode`` counts and the bytes and dtypes autograd saves are the same with the
    products in fp32; the gradients within bf16's rounding of the native step's."""
    from transformers import AutoModel

    from sentemb.ops.flops import counted, fp32_gemms

    model = AutoModel.from_pretrained(tiny_bert_dir)
    ids = torch.randint(5, 100, (4, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    for mode in ("native", "fp32"):
        model.zero_grad(set_to_none=True)
        saved = []

        def pack(t):
            saved.append((t.dtype, t.untyped_storage().nbytes()))
            return t

        def step():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                    torch.autocast("cpu", dtype=torch.bfloat16):
                h = model(input_ids=ids).last_hidden_state
            h.float().pow(2).mean().backward()

        with fp32_gemms() if mode == "fp32" else torch.autograd.set_grad_enabled(True):
            _, flops = counted(step)
        out[mode] = (flops, saved, [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert out["fp32"][0] == out["native"][0] > 0
    assert out["fp32"][1] == out["native"][1]
    for g32, gn in zip(out["fp32"][2], out["native"][2]):
        assert torch.allclose(g32, gn, rtol=0.05, atol=1e-3 * gn.abs().max().item() + 1e-6)
