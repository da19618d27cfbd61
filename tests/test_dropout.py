"""Keyed dropout (``sentemb.model.dropout``, ``train.dropout_rng: keyed``): a row's mask is a function of its
sentence and view, never of how the batch is cut."""

import pytest
import torch
import torch.nn.functional as F

from sentemb import SentembError
from sentemb.model.dropout import keyed, rows


def _masks(start, stop, views=2, width=50, seed=3, micro=1):
    x = torch.ones(views * (stop - start), width)
    with keyed(seed, micro, start, stop):
        return (F.dropout(x, 0.3, True) != 0).float()


def test_a_rows_mask_does_not_depend_on_the_chunking():
    whole = _masks(0, 8)  # rows: view-major, [s0..s7 view 0, s0..s7 view 1]
    a, b = _masks(0, 3), _masks(3, 8)
    want = torch.cat([a[:3], b[:5], a[3:], b[5:]])
    assert torch.equal(whole, want)
    assert not torch.equal(whole[:8], whole[8:])  # the two views of a sentence: different masks
    assert not torch.equal(_masks(0, 8, micro=2), whole) and not torch.equal(_masks(0, 8, seed=4), whole)


def test_keyed_masks_keep_1_minus_p_and_scale_as_torch():
    x = torch.randn(64, 500)
    with keyed(0, 0, 0, 64):
        y = F.dropout(x, 0.3, True)
    kept = y != 0
    assert abs(float(kept.float().mean()) - 0.7) < 0.01
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    with keyed(0, 0, 0, 64):  # the k-th call of a context draws the k-th masks
        first, second = (F.dropout(torch.ones(64, 8), 0.5, True) for _ in range(2))
    assert not torch.equal(first, second)


def test_declared_rows_and_a_tensor_that_fits_no_layout():
    x = torch.ones(4, 40)
    with keyed(0, 0, 10, 12):  # interleaved a_1, p_1, a_2, p_2 of sentences 10 and 11
        with rows([0, 0, 1, 1], [0, 1, 0, 1]):
            inter = F.dropout(x, 0.5, True)
    with keyed(0, 0, 10, 12):
        major = F.dropout(x, 0.5, True)  # view-major: s10 v0, s11 v0, s10 v1, s11 v1
    assert torch.equal(inter[[0, 2, 1, 3]], major)
    with keyed(0, 0, 0, 3), pytest.raises(SentembError, match="4 rows in a chunk of 3 sentences"):
        F.dropout(x, 0.5, True)


def test_outside_a_context_dropout_is_torchs_own():
    x = torch.randn(8, 16)
    with keyed(0, 0, 0, 8):
        pass
    torch.manual_seed(5)
    a = F.dropout(x, 0.4, True)
    torch.manual_seed(5)
    b = torch.ops.aten.dropout(x, 0.4, True)
    assert torch.equal(a, b)
    with keyed(0, 0, 0, 8):
        assert torch.equal(F.dropout(x, 0.4, False), x)  # eval mode: identity


def test_sdpa_attention_dropout_is_keyed_and_equals_the_math_form_without_dropout():
    q, k, v = (torch.randn(4, 2, 5, 8) for _ in range(3))
    with keyed(0, 0, 0, 4):
        plain = F.scaled_dot_product_attention(q, k, v)  # dropout_p 0: torch's own kernel
        d1 = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    with keyed(0, 0, 0, 2):
        d_a = F.scaled_dot_product_attention(q[:2], k[:2], v[:2], dropout_p=0.2)
    torch.testing.assert_close(d1[:2], d_a)
    assert not torch.allclose(d1, plain)
