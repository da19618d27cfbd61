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
