"""SARCSE: contrastive learning with a TextCNN autoencoder and a self-adaptive reconstruction loss
(the method spec §1; seed paper 000, Eqs. 1–12). No public code exists, so there is no
``code`` preset.

Rows of a batch: ``input_ids``/``attention_mask`` (B, L) as the tokenizer pads them; both dropout
views come from one forward pass over the 2B rows [x_1..x_B, x_1..x_B] (Eq. 2, as SimCSE).

What it computes, per view (X: last-layer states of the sentence's *real* tokens, N × d — no
<s>, </s>, padding, and on BERT-type tokenizers no [CLS]/[SEP]; Eq. 1):

* Encoder (Eq. 3): H_ks = maxpool_t act(Conv1d_ks(X)) ∈ R^{co_t}, ks = 3, 4, 5, kernel (ks × d),
  co_t = ``channels`` (500).
* Integration (Eq. 4): Z = Conv2d_{3×2}([H_3; H_4; H_5]) ∈ R^{co_c × (co_t − 1)}, co_c =
  ``integrate_channels`` (3); flattened (1497 dims) Z **is the sentence embedding**, for the
  contrastive loss and at inference (``eval_pooler = "method"``; no MLP head).
* Decoder (Eqs. 5–7): [H'_3; H'_4; H'_5] = ConvTranspose2d_{3×2}(Z) (row r of the transposed kernel
  is TransposedCNN_ks); H'_ks is spread back over the conv positions (``unpool``) and
  X'_ks = ConvTranspose1d_ks(·) ∈ R^{N × d}; X' = mean(X'_3, X'_4, X'_5).
* Self-adaptive reconstruction loss (Eqs. 8–10): f(w) = max(θ, 1 − λ·freq(w)) from the training
  corpus' token frequencies (input ``token_freq``); L_R = (1/N) Σ_i f(w_i)·‖x_i − x'_i‖² (MSE over
  the d features summed: see "The weight of L_R" below), averaged over the sentences of the batch;
  L_R⁺ alike on the second view.
* Total (Eqs. 11–12): L = α·L_I + β·L_R + γ·L_R⁺, L_I = InfoNCE(Z, Z⁺; τ) one direction, fp32.

Logged terms: ``loss``, ``contrastive`` (L_I), ``recon`` (L_R), ``recon_pos`` (L_R⁺); without a
decoder only ``loss`` and ``contrastive``. Weighted (``WEIGHTED``): α·L_I, β·L_R, γ·L_R⁺ under the same
names; ``train.log_grad_norms`` logs their gradient norms on the encoder + TextCNN (what Z is made of).

The weight of L_R (``mse_reduction``, issue 18 §4). Eq. 9 writes "MSE(x_i, x'_i)", "MSE is
mean-square error", for x_i ∈ R^d, with the 1/N over tokens written out. Read literally (``mean``:
‖x_i − x'_i‖²/d) the reconstruction is all but inert at the paper's β = γ = 2.5e-4: on the parameters it
shares with L_I its gradient is ~1e-4 of L_I's, so training would in effect be SimCSE on Z and
"w/o SAL" would equal "w/o SAL & decoder". (bf16 autocast does not round it away: an outside check
on a tiny RoBERTa, 2026-11-29, found the change it makes to the bf16 gradient along its fp32
gradient, cosine 0.83. Its size, not the precision, is the argument.) The paper says the opposite: Table 1, "SARCSE 78.09", "- w/o Self-Adaptive Loss (SAL)
77.15", "- w/o SAL & Decoder 75.26", and §3.3, "The performance is even worse than SimCSE. This
further illustrates the importance of reconstructing tokens in sentences"; App. A, "the process of
self-adaptive reconstruction can help the model to be optimized in another direction and reduce the
reliance on contrastive learning". A β of 2.5e-4 suits a loss of order 1e2–1e3 (β·L_R of order
0.1 beside L_I ≈ 1–3), which a squared error summed over d = 768 features is (L_R ≈ 540 on the
random roberta-base below) and a mean over them is not (≈ 0.7). Eqs. 9 and 11 are both per
sentence, so the batch reduction is common to the three terms: d is the only factor Eqs. 9–12
leave open. The default is therefore ``sum`` (‖x_i − x'_i‖²); ``mean`` keeps the literal reading
as the switch. Measured at initialisation
(``scripts/sarcse_recon_scale.py``: 32 sentences of wiki1m_head, max_len 32, train mode, seed 0;
paper values; ratio = ‖∇(β·L_R + γ·L_R⁺)‖ / ‖∇(α·L_I)‖ on encoder + TextCNN, encoder alone in
brackets):

    model                          d    L_I   MSE over d   β·L_R     γ·L_R⁺    ratio
    all-MiniLM-L6-v2 (pretrained) 384  2.847  mean         3.46e-05  3.43e-05  1.31e-04 (1.75e-04)
                                              sum          1.33e-02  1.32e-02  5.03e-02 (6.70e-02)
    roberta-base shape (random)   768  2.472  mean         1.74e-04  1.74e-04  1.24e-05 (1.34e-05)
                                              sum          1.34e-01  1.34e-01  9.55e-03 (1.03e-02)

Through the loop (``--train-steps 40``: MiniLM, batch 32, lr 1e-5, logged by
``train.log_grad_norms`` every 5 steps) (‖∇β·L_R‖ + ‖∇γ·L_R⁺‖)/‖∇α·L_I‖ goes 5.0e-2 → 3.0e-2 with
``sum`` and 1.3e-4 → 7.8e-5 with ``mean`` while ‖∇α·L_I‖ grows 4.0 → 4.7. With ``sum`` the
reconstruction is a few percent of the update's gradient, 2–13× bf16's relative precision, 2⁻⁸, taken
as a yardstick of "small" (mean: 30–300× below it); ``tests/test_sarcse.py`` recomputes the ratio on a random one-layer encoder of
width 768 (2.8e-2 with ``sum``, 3.6e-5 with ``mean``) and checks it against 2⁻⁸. Whether ``sum``
reproduces Table 1's 1.9-point decoder effect is for the paper runs to show (``sarcse-wo-sal`` vs
``sarcse-wo-sal-decoder``, with ``train.log_grad_norms: true``). The random roberta-base's states
are LayerNorm outputs (‖x‖² = d); the pretrained one's scale, which sets L_R, is not in the mirror:
``--roberta-dir`` measures it where it is.

Open choices (methods.md marks them **open**, or the paper leaves them implicit), each documented
here and switchable where cheap:

* Pooling over time: max-over-time (Kim 2014), over the sentence's own valid conv positions only.
* Short sentences (N < ks, down to N = 1): the sentence is zero-padded to the kernel width, giving
  one conv position (the same rule at training and inference, so Z never depends on the batch).
  A sentence with no real token (N = 0, e.g. an empty line) gets the Z of an all-zero input and is
  left out of the reconstruction mean.
* TextCNN non-linearity (``activation``): ReLU before pooling (Kim 2014); ``tanh`` / ``none``
  switchable. No non-linearity on Z nor in the decoder (X' must reach any real value).
* Spreading H'_ks back over N positions (``unpool``): ``repeat`` (default, methods.md's example:
  the same H'_ks at each of the N − ks + 1 conv positions, then a transposed 1-D conv of width ks);
  ``argmax`` (max-unpooling: each channel's value at the position where the encoder's max was).
* Target detachment (``detach_target``): x_i is not detached by default (the paper is silent), so
  L_R also trains the encoder through the target; ``true`` stops that gradient.
* MSE over the d features (``mse_reduction``): ``sum`` (default, ‖x_i − x'_i‖²) or ``mean`` (the
  literal "mean-square error", d times smaller): see "The weight of L_R" above.

Bucketed widths (``train.buckets``): the rows are padded to a bucket of the longest
(``Method.pad_rows``), and the compacted real-token states X then keep that width (Lc = L instead
of the longest row's N; ``compact(width=)``): the convolutions' valid positions, the pooling and
the reconstruction mask read each sentence's own N, so Z, L_I, L_R and L_R⁺ are those of the
unpadded batch (``tests/test_buckets.py``), and a step has one shape per bucket.

Ablations: ``self_adaptive: false`` (f ≡ 1, "w/o SAL"); ``decoder: false`` ("w/o SAL & decoder":
PLM + TextCNN encoder, contrastive only; no token frequencies needed). The θ and batch-size sweeps
are the studies ``sarcse-theta`` and ``sarcse-batch`` (``theta`` / ``train.batch_size`` varied).

Export: the HF encoder + ``1_SARCSE/`` (config.json, model.safetensors of the TextCNN encoder and
integrating conv) listed in ``modules.json`` as :class:`SarcseSTModule`, so
``SentenceTransformer(path, trust_remote_code=True)`` and ``sentemb evaluate --pooler method`` both
give Z.

Reference: the SARCSE paper (seed 000 in the shared data folder, ``seeds/000_*.txt``), §2, Eqs. 1–12, §3.1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import SentembError
from .base import WEIGHTED, Encoded, Method, arg
from .registry import register_method
from .simcse import info_nce

KERNEL_SIZES = (3, 4, 5)  # the paper's TextCNN windows (Eq. 3)
HEAD_DIR = "1_SARCSE"
ST_CLASS = "sentemb.methods.sarcse.SarcseSTModule"


# ------------------------------------------------------------------------------------ Eqs. 8-10
def token_weights(freq, theta: float, lam: float) -> torch.Tensor:
    """f(w) = max(θ, 1 − λ·freq(w)) for every token id (Eq. 8); ``freq`` indexed by token id."""
    freq = torch.as_tensor(np.array(freq, dtype=np.float64))
    return torch.clamp(1.0 - lam * freq, min=theta).float()  # (V,)


def reconstruction_loss(x: torch.Tensor, x_rec: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor,
                        reduction: str = "sum", count: torch.Tensor | int | None = None) -> torch.Tensor:
    """L_R of Eq. 9 (and L_R⁺ of Eq. 10), averaged over the sentences of the batch, in fp32.

    x, x_rec: (B, N, d) target and reconstructed token states; weights: (B, N) f(w_i); mask: (B, N)
    true at real tokens. Per sentence (1/N) Σ_i f(w_i)·MSE(x_i, x'_i) with MSE over d reduced by
    ``reduction``: ``sum`` (‖x_i − x'_i‖², the default reading) or ``mean`` (‖x_i − x'_i‖²/d, the
    literal one); sentences with no real token are left out of the batch mean. ``count``: divide the
    sum over sentences by the batch's number of sentences with a real token instead (a chunk's share,
    ``Method.row_terms``)."""
    if reduction not in ("mean", "sum"):
        raise SentembError(f"reconstruction_loss: reduction must be mean or sum, not {reduction!r}")
    with torch.autocast(device_type=x.device.type, enabled=False):
        sq = (x.float() - x_rec.float()) ** 2  # (B, N, d)
        mse = sq.mean(-1) if reduction == "mean" else sq.sum(-1)  # (B, N)
        m = mask.float()
        n = m.sum(1)  # (B,)
        per_sentence = (weights.float() * mse * m).sum(1) / n.clamp(min=1)  # (B,)
        has = (n > 0).float()
        if count is None:
            count = has.sum()
        return (per_sentence * has).sum() / torch.as_tensor(count, dtype=torch.float32, device=x.device).clamp(min=1)


# ------------------------------------------------------------------------------------ real tokens
def structural_ids(tokenizer) -> list[int]:
    """Ids that are never real tokens: [CLS]/[SEP]/<s>/</s>/padding (not [UNK]: it stands for a word)."""
    ids = {getattr(tokenizer, f"{k}_token_id", None) for k in ("cls", "sep", "bos", "eos", "pad")}
    return sorted(i for i in ids if i is not None)


def real_token_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: Sequence[int]) -> torch.Tensor:
    """(B, L) bool: attended positions whose id is not a structural special token (one comparison
    per id: no tensor built from host data, so the step stays graph-safe, ``train.graphs``)."""
    mask = attention_mask.bool()
    for i in special_ids:
        mask = mask & (input_ids != int(i))
    return mask


def compact(x: torch.Tensor, mask: torch.Tensor, min_len: int, width: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each row's real positions to the front, in order: returns (x_c, mask_c, index).

    x: (B, L, ...) ; mask: (B, L) bool. x_c: (B, Lc, ...) with zeros after the row's N real
    positions, Lc = max(max N, min_len); index: (B, Lc) source positions (for gathering ids).
    ``width`` (≥ every N, e.g. L): Lc = max(width, min_len) instead, a width that does not depend on
    the data (a bucketed batch's, ``train.buckets``) and needs no read of N on the host."""
    B, L = mask.shape
    n = mask.sum(1)  # (B,)
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # real positions first, in order
    lc = max(int(width) if width is not None else (int(n.max()) if B else 0), min_len)
    if lc > L:
        order = torch.cat([order, order.new_zeros(B, lc - L)], 1)
    index = order[:, :lc]  # (B, Lc)
    mask_c = torch.arange(lc, device=mask.device)[None, :] < n[:, None]  # (B, Lc)
    gather = index.view(B, lc, *([1] * (x.dim() - 2))).expand(B, lc, *x.shape[2:])
    x_c = torch.gather(x, 1, gather) * mask_c.view(B, lc, *([1] * (x.dim() - 2))).to(x.dtype)
    return x_c, mask_c, index


# ------------------------------------------------------------------------------------ Eqs. 3-7
class TextCNNEncoder(nn.Module):
    """Eqs. 3–4: X (real tokens) -> Z ∈ R^{co_c × (co_t − 1)}. Also returns what the decoder needs."""

    def __init__(self, hidden: int, channels: int = 500, integrate_channels: int = 3, activation: str = "relu"):
        super().__init__()
        self.hidden, self.channels, self.integrate_channels, self.activation = hidden, channels, integrate_channels, activation
        self.convs = nn.ModuleList(nn.Conv1d(hidden, channels, ks) for ks in KERNEL_SIZES)  # TextCNN_ks, (ks × d)
        self.integrate = nn.Conv2d(1, integrate_channels, (len(KERNEL_SIZES), 2))  # CNN_{3×2}

    @property
    def dim(self) -> int:
        return self.integrate_channels * (self.channels - 1)

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return {"relu": F.relu, "tanh": torch.tanh, "none": lambda t: t}[self.activation](h)

    def forward(self, x_c: torch.Tensor, mask_c: torch.Tensor):
        """x_c: (B, Lc, d) compacted real-token states (zeros beyond N), Lc ≥ 5; mask_c: (B, Lc).
        Returns Z (B, co_c, co_t − 1), the number of valid positions per kernel [(B,)] and the
        argmax positions per kernel [(B, co_t)]."""
        n = mask_c.sum(1)  # (B,)
        xt = x_c.transpose(1, 2)  # (B, d, Lc)
        pooled, valid, argmax = [], [], []
        for ks, conv in zip(KERNEL_SIZES, self.convs):
            h = self.act(conv(xt))  # (B, co_t, Lc − ks + 1)
            p = torch.clamp(n - ks + 1, min=1)  # valid windows; N < ks: one zero-padded window
            ok = torch.arange(h.size(-1), device=h.device)[None, :] < p[:, None]  # (B, P)
            h = h.masked_fill(~ok[:, None, :], float("-inf"))
            v, i = h.max(-1)  # (B, co_t) max-over-time (Kim 2014)
            pooled.append(v)
            valid.append(p)
            argmax.append(i)
        stacked = torch.stack(pooled, 1).unsqueeze(1)  # (B, 1, 3, co_t)
        z = self.integrate(stacked).squeeze(2)  # (B, co_c, co_t − 1)
        return z, valid, argmax


class TextCNNDecoder(nn.Module):
    """Eqs. 5–7, the mirror of :class:`TextCNNEncoder`: Z -> X' (B, Lc, d)."""

    def __init__(self, hidden: int, channels: int = 500, integrate_channels: int = 3, unpool: str = "repeat"):
        super().__init__()
        self.unpool = unpool
        self.detranspose = nn.ConvTranspose2d(integrate_channels, 1, (len(KERNEL_SIZES), 2))  # TransposedCNN
        self.deconvs = nn.ModuleList(nn.ConvTranspose1d(channels, hidden, ks) for ks in KERNEL_SIZES)

    def forward(self, z: torch.Tensor, valid: list[torch.Tensor], argmax: list[torch.Tensor], length: int) -> torch.Tensor:
        h_rec = self.detranspose(z.unsqueeze(2)).squeeze(1)  # (B, 3, co_t): row r = H'_{ks_r}
        outs = []
        for r, (ks, deconv) in enumerate(zip(KERNEL_SIZES, self.deconvs)):
            positions = length - ks + 1
            hk = h_rec[:, r]  # (B, co_t)
            pos = torch.arange(positions, device=z.device)
            if self.unpool == "repeat":  # the same H' at each valid conv position
                ok = (pos[None, :] < valid[r][:, None]).to(hk.dtype)  # (B, P)
                spread = hk[:, :, None] * ok[:, None, :]  # (B, co_t, P)
            else:  # "argmax": max-unpooling to where the encoder's maximum was
                spread = hk[:, :, None] * (pos[None, None, :] == argmax[r][:, :, None]).to(hk.dtype)
            outs.append(deconv(spread))  # (B, d, Lc)
        return torch.stack(outs, 0).mean(0).transpose(1, 2)  # (B, Lc, d): X' = mean_ks X'_ks (Eq. 7)


def embed_states(head: TextCNNEncoder, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 special_ids: Sequence[int]) -> torch.Tensor:
    """The SARCSE sentence embedding (flattened Z, (B, co_c·(co_t − 1))) from last-layer states."""
    mask = real_token_mask(input_ids, attention_mask, special_ids)
    x_c, mask_c, _ = compact(hidden, mask, max(KERNEL_SIZES))
    z, _, _ = head(x_c, mask_c)
    return z.flatten(1)


# ------------------------------------------------------------------------------------ token frequencies
def load_token_weights(path: Path, tokenizer, theta: float, lam: float) -> torch.Tensor:
    """f per token id from a ``token_freq`` parquet (sentemb.stats.frequency), checked against the
    backbone's tokenizer: a table of another tokenizer fails here, before step 1."""
    import pyarrow.parquet as pq

    from ..stats import read_metadata

    path = Path(path)
    if not path.is_file():
        raise SentembError(f"token frequency table {path} not found (workflow stage stats_token_freq)")
    table = pq.read_table(path, columns=["token_id", "token", "freq"])
    meta = read_metadata(path)
    size = len(tokenizer)
    named = f" (its metadata names tokenizer {meta.get('tokenizer')!r})" if meta.get("tokenizer") else ""
    if table.num_rows != size or meta.get("vocab_size", size) != size:
        raise SentembError(f"{path}: {table.num_rows} rows (vocab_size {meta.get('vocab_size')}) but the backbone's "
                           f"tokenizer has {size} tokens{named}: a token frequency table of another tokenizer")
    ids = table.column("token_id").to_numpy()
    if not np.array_equal(ids, np.arange(size)):
        raise SentembError(f"{path}: token_id is not 0..{size - 1} in order")
    tokens = table.column("token").to_pylist()
    ours = [t if t is not None else "" for t in tokenizer.convert_ids_to_tokens(list(range(size)))]
    if tokens != ours:
        k = next(i for i, (a, b) in enumerate(zip(tokens, ours)) if a != b)
        raise SentembError(f"{path}: token {k} is {tokens[k]!r} there but {ours[k]!r} in the backbone's tokenizer "
                           f"({size} tokens both){named}: a token frequency table of another tokenizer")
    return token_weights(table.column("freq").to_numpy(), theta, lam)


# ------------------------------------------------------------------------------------ the method
@register_method
class SARCSE(Method):
    name = "sarcse"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of InfoNCE on Z (Eq. 11)", exclusive_minimum=0)
        alpha: float = arg(1.0, "α: weight of the contrastive loss L_I (Eq. 12)", minimum=0)
        beta: float = arg(2.5e-4, "β: weight of the reconstruction loss L_R of the first view (Eq. 12)", minimum=0)
        gamma: float = arg(2.5e-4, "γ: weight of L_R⁺, the second (dropout) view (Eq. 12)", minimum=0)
        theta: float = arg(0.1, "θ: floor of the self-adaptive weight f(w) = max(θ, 1 − λ·freq(w)) (Eq. 8)",
                           minimum=0, maximum=1)
        lam: float = arg(50.0, "λ: slope of f(w) in the token frequency (Eq. 8)", minimum=0)
        channels: int = arg(500, "co_t: output channels of each TextCNN (Eq. 3)", minimum=1)
        integrate_channels: int = arg(3, "co_c: output channels of the (3 × 2) integrating CNN (Eq. 4)", minimum=1)
        self_adaptive: bool = arg(True, "f(w) from token frequencies; false = f ≡ 1 (ablation 'w/o SAL')")
        decoder: bool = arg(True, "the transposed-CNN decoder and L_R, L_R⁺; false = ablation 'w/o SAL & "
                            "decoder' (TextCNN encoder, contrastive loss only)")
        detach_target: bool = arg(False, "open: detach x_i as the reconstruction target (paper silent)")
        mse_reduction: str = arg("sum", "open: MSE(x_i, x'_i) of Eq. 9 over the d features: sum = the squared "
                                 "error ‖x_i − x'_i‖² (default: the reading under which β = 2.5e-4 lets L_R move the "
                                 "encoder, as the ablations of Table 1 require; module docstring), or mean = the "
                                 "literal 'mean-square error', d times smaller (L_R then ~1e-4 of the gradient)",
                                 choices=("sum", "mean"))
        activation: str = arg("relu", "open: TextCNN non-linearity before max-over-time pooling (Kim 2014: relu)",
                              choices=("relu", "tanh", "none"))
        unpool: str = arg("repeat", "open: how H'_ks is spread over the conv positions: repeat at every "
                          "position, or argmax (max-unpooling)", choices=("repeat", "argmax"))

    eval_pooler = "method"
    contract_args = {"channels": 40}  # 40 TextCNN channels on hidden 32 (paper: 500 on RoBERTa)

    @classmethod
    def requires(cls, args):
        return ("token_freq",) if args.decoder and args.self_adaptive else ()

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a = self.args
        for key in ("channels", "integrate_channels"):
            if getattr(a, key) < (2 if key == "channels" else 1):
                raise SentembError(f"method 'sarcse'.{key}: {getattr(a, key)} is too small")
        hidden = encoder.config.hidden_size
        self.special_ids = structural_ids(tokenizer)
        self.head = TextCNNEncoder(hidden, a.channels, a.integrate_channels, a.activation)
        self.decoder = TextCNNDecoder(hidden, a.channels, a.integrate_channels, a.unpool) if a.decoder else None
        if self.decoder is not None and a.self_adaptive:
            weights = load_token_weights(ctx.input("token_freq"), tokenizer, a.theta, a.lam)
        else:
            weights = torch.ones(len(tokenizer))  # f ≡ 1 ("w/o SAL")
        self.register_buffer("token_weight", weights, persistent=False)  # (V,) f(w) per token id

    # -------------------------------------------------------------------------------- training
    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        return self.tokenize(sentences, lines)

    def forward_views(self, batch):
        """Both dropout views in one pass. Returns Z (2B, dim) and, with a decoder, the compacted
        target X (2B, Lc, d), its reconstruction X' (2B, Lc, d), mask (2B, Lc) and weights (2B, Lc)."""
        doubled = {k: torch.cat([v, v], 0) for k, v in batch.items()}  # rows [x_1..x_B, x_1..x_B]
        hidden = self.encoder(**doubled, return_dict=True).last_hidden_state  # (2B, L, d)
        mask = real_token_mask(doubled["input_ids"], doubled["attention_mask"], self.special_ids)  # (2B, L)
        # Lc: the padded width L (with buckets a bucket: one shape per bucket), not the longest row's
        # real tokens (L − 2): no host read of the lengths (train.graphs), the same Z and L_R
        x_c, mask_c, index = compact(hidden, mask, max(KERNEL_SIZES), width=hidden.size(1))  # (2B, Lc, d), (2B, Lc)
        z, valid, argmax = self.head(x_c, mask_c)  # (2B, co_c, co_t − 1)
        out = {"z": z.flatten(1)}
        if self.decoder is not None:
            out["x_rec"] = self.decoder(z, valid, argmax, x_c.size(1))  # (2B, Lc, d)
            out["x"] = x_c.detach() if self.args.detach_target else x_c
            ids = torch.gather(doubled["input_ids"], 1, index)  # (2B, Lc)
            out["weights"] = self.token_weight[ids]  # (2B, Lc)
            out["mask"] = mask_c
        return out

    def encode(self, batch):
        """Z of both views (Eqs. 1-4) for the in-batch L_I; the decoder's target and reconstruction
        (Eqs. 5-7) for the chunk's L_R, L_R⁺."""
        b = batch["input_ids"].size(0)
        out = self.forward_views(batch)
        z = out.pop("z")
        return Encoded(batch={"z1": z[:b], "z2": z[b:]}, rows=out)

    def batch_terms(self, emb, batch):
        contrastive = info_nce(emb["z1"], emb["z2"], self.args.temperature)  # L_I (Eq. 11), fp32
        return {"contrastive": contrastive.detach(), WEIGHTED: {"contrastive": self.args.alpha * contrastive}}

    def row_terms(self, enc, chunk, batch):
        """β·L_R + γ·L_R⁺ (Eqs. 9-10, 12) of the chunk's sentences, each sentence's term divided by
        the batch's number of sentences with a real token."""
        a, out = self.args, enc.rows
        if self.decoder is None:
            return {WEIGHTED: {}}
        b = chunk["input_ids"].size(0)
        count = real_token_mask(batch["input_ids"], batch["attention_mask"], self.special_ids).any(1).sum()
        rec = [reconstruction_loss(out["x"][s], out["x_rec"][s], out["weights"][s], out["mask"][s],
                                   a.mse_reduction, count=count) for s in (slice(0, b), slice(b, None))]
        return {"recon": rec[0].detach(), "recon_pos": rec[1].detach(),
                WEIGHTED: {"recon": a.beta * rec[0], "recon_pos": a.gamma * rec[1]}}

    def grad_norm_parameters(self):
        """The encoder's and the TextCNN encoder's (Eqs. 3–4): together they make Z, and both L_I and
        L_R reach them (the decoder gets L_R's gradient only)."""
        return [p for p in (*self.encoder.parameters(), *self.head.parameters()) if p.requires_grad]

    # -------------------------------------------------------------------------------- embedding and export
    def embedder(self, pooler, device):
        return SarcseEmbedder(self.encoder, self.tokenizer, self.head, self.special_ids, device=device, precision="fp32")

    def export(self, out_dir, pooler, meta):
        from ..model.backbone import export, max_length_of

        out_dir = Path(out_dir)
        # the encoder (HF layout) with a placeholder pooling module, then the SARCSE module in its place
        export(self.encoder, self.tokenizer, out_dir, pooler="avg", head=None,
               max_seq_length=max_length_of(self.encoder, self.tokenizer), meta={**meta, "pooler": "method"})
        import shutil

        shutil.rmtree(out_dir / "1_Pooling", ignore_errors=True)
        save_head(self.head, self.special_ids, out_dir / HEAD_DIR)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": HEAD_DIR, "type": ST_CLASS},
        ]
        (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))

    @classmethod
    def load_embedder(cls, model_dir, device, batch_size=128, precision="fp32"):
        from ..model.backbone import load_encoder

        model_dir = Path(model_dir)
        encoder, tokenizer = load_encoder(model_dir, device=device)
        head, special_ids = load_head(model_dir / HEAD_DIR)
        return SarcseEmbedder(encoder, tokenizer, head.to(device), special_ids, device=device, batch_size=batch_size,
                              precision=precision)


def save_head(head: TextCNNEncoder, special_ids: Sequence[int], d: Path) -> None:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "hidden": head.hidden, "channels": head.channels, "integrate_channels": head.integrate_channels,
        "activation": head.activation, "special_ids": list(map(int, special_ids))}, indent=2))
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(d / "model.safetensors"))


def load_head(d: Path) -> tuple[TextCNNEncoder, list[int]]:
    from safetensors.torch import load_file

    cfg_file = Path(d) / "config.json"
    if not cfg_file.is_file():
        raise SentembError(f"{cfg_file} not found: not a SARCSE export")
    cfg = json.loads(cfg_file.read_text("utf-8"))
    head = TextCNNEncoder(cfg["hidden"], cfg["channels"], cfg["integrate_channels"], cfg["activation"])
    head.load_state_dict(load_file(str(Path(d) / "model.safetensors")))
    return head.eval(), cfg["special_ids"]


class SarcseEmbedder:
    """list[str] -> Z (n, co_c·(co_t − 1)) float32: encoder + TextCNN head, length-sorted batches,
    no truncation below the model's maximum (methods.md §0)."""

    def __init__(self, encoder, tokenizer, head, special_ids, *, device, batch_size=128, precision="fp32"):
        from ..model.backbone import max_length_of

        self.encoder, self.tokenizer, self.head, self.special_ids = encoder, tokenizer, head, special_ids
        self.device, self.batch_size, self.precision = torch.device(device), batch_size, precision
        self.max_length = max_length_of(encoder, tokenizer)

    def __call__(self, sentences):
        uniq = list(dict.fromkeys(sentences))
        enc = self.tokenizer(uniq, truncation=True, max_length=self.max_length)
        order = sorted(range(len(uniq)), key=lambda i: len(enc["input_ids"][i]), reverse=True)
        out = np.empty((len(uniq), self.head.dim), dtype=np.float32)
        modes = (self.encoder.training, self.head.training)
        self.encoder.eval()
        self.head.eval()
        bf16 = self.precision == "bf16" or (self.precision == "auto" and self.device.type == "cuda"
                                            and torch.cuda.is_bf16_supported())
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            for k in range(0, len(order), self.batch_size):
                idx = order[k : k + self.batch_size]
                batch = self.tokenizer.pad({key: [enc[key][i] for i in idx] for key in enc.keys()}, return_tensors="pt")
                batch = {key: v.to(self.device) for key, v in batch.items()}
                hidden = self.encoder(**batch, return_dict=True).last_hidden_state
                z = embed_states(self.head, hidden, batch["input_ids"], batch["attention_mask"], self.special_ids)
                out[idx] = z.float().cpu().numpy()
        self.encoder.train(modes[0])
        self.head.train(modes[1])
        pos = {s: i for i, s in enumerate(uniq)}
        return out[[pos[s] for s in sentences]]


# ------------------------------------------------------------------------------------ sentence-transformers
_ST_CLASS = None


def _st_module_class():
    """sentence-transformers module computing Z from the Transformer module's token embeddings; built
    on first use so that importing the method registry does not import sentence-transformers."""
    global _ST_CLASS
    if _ST_CLASS is not None:
        return _ST_CLASS
    try:
        from sentence_transformers.base.modules import Module  # sentence-transformers >= 6
    except ImportError:  # pragma: no cover - sentence-transformers 5
        from sentence_transformers.models import Module
    from sentence_transformers.util import load_dir_path

    class SarcseSTModule(Module):
        """SARCSE's TextCNN encoder + integrating CNN (Eqs. 3–4) as a sentence-transformers module."""

        config_keys = ["hidden", "channels", "integrate_channels", "activation", "special_ids"]

        def __init__(self, hidden: int, channels: int = 500, integrate_channels: int = 3, activation: str = "relu",
                     special_ids: list[int] | None = None):
            super().__init__()
            self.hidden, self.channels, self.integrate_channels, self.activation = hidden, channels, integrate_channels, activation
            self.special_ids = list(special_ids or [])
            self.head = TextCNNEncoder(hidden, channels, integrate_channels, activation)

        def forward(self, features, **kwargs):
            features["sentence_embedding"] = embed_states(self.head, features["token_embeddings"], features["input_ids"],
                                                          features["attention_mask"], self.special_ids)
            return features

        def get_embedding_dimension(self) -> int:
            return self.head.dim

        get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers < 6

        def save(self, output_path, *args, safe_serialization: bool = True, **kwargs):
            save_head(self.head, self.special_ids, Path(output_path))

        @classmethod
        def load(cls, model_name_or_path, subfolder: str = "", token=None, cache_folder=None, revision=None,
                 local_files_only: bool = False, **kwargs):
            d = load_dir_path(model_name_or_path, subfolder=subfolder, token=token, cache_folder=cache_folder,
                              revision=revision, local_files_only=local_files_only)
            head, special_ids = load_head(Path(d))
            cfg = json.loads((Path(d) / "config.json").read_text("utf-8"))
            module = cls(cfg["hidden"], cfg["channels"], cfg["integrate_channels"], cfg["activation"], special_ids)
            module.head = head
            return module

    SarcseSTModule.__module__ = __name__
    SarcseSTModule.__qualname__ = "SarcseSTModule"
    _ST_CLASS = SarcseSTModule
    return _ST_CLASS


def __getattr__(name: str):  # PEP 562: ``sentemb.methods.sarcse.SarcseSTModule`` on demand
    if name == "SarcseSTModule":
        return _st_module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
