"""ArcCSE: additive angular margin contrastive loss + entailment of masked triplets (Zhang, Zhu,
Wang, Xu, Li, Zhao, "A Contrastive Framework for Learning Sentence Representations from Pairwise
and Triple-wise Perspective in Angular Space", ACL 2022; seed paper 004; the method spec §5).

Training, per batch of B sentences:

* **ArcCon** (paper Eq. 3). h_i, h_i⁺ = MLP([CLS]) of two dropout views (as unsupervised SimCSE; raw
  [CLS] at evaluation), θ_ij = arccos cos(h_i, h_j⁺)::

      L_arc = −(1/B) Σ_i log e^{ψ(θ_ii)/τ} / (e^{ψ(θ_ii)/τ} + Σ_{j≠i} e^{cos θ_ij/τ}),
      ψ(θ) = cos(θ + m) = cos θ·cos m − sin θ·sin m,   sin θ = √max(1 − cos²θ, ε),

  m = 10°, τ = 0.05 (``arccon_loss``). ``arccon: false`` replaces it by NT-Xent (the "w/o ArcCon"
  ablation).
* **Triplet entailment** (Eq. 4). For every sentence s of the batch with ≥ 25 words: s′ masks
  contiguous spans covering 20% of s, s″ enlarges that masked area to 40% (``nested_span_masks``);
  s, s′, s″ are encoded with dropout off and ::

      L_tri = (1/|T|) Σ_{s∈T} max(0, cos(h̄, h̄″) − cos(h̄, h̄′) + m′),   m′ = 0

  (``triplet_loss``; L_tri = 0 when no sentence of the batch has 25 words). By default
  (``triplet_pass: separate``) the triplet rows get a forward of their own. ``with_views`` encodes them
  in the views' forward instead, dropout applied to the view rows only
  (``sentemb.model.dropout.dropout_rows``): one encoder pass a step, the same FLOPs and about 16%
  fewer dispatched ops. On an H200 they take the same time when each runs in a process of its own
  (144 against 140 ms/step, ``docs/gpu/h200-2026-11-28c.md``); two earlier lends ranked them oppositely
  (177 against 141 ms/step, then 112 against 136, the slower each time the first row to meet the fused
  shapes in one process; ``docs/gpu/h200-2026-11-28b.md``); on the CPU ``with_views`` is 7% slower
  (every dropout site slices and concatenates the rows).
* **Total** (Eq. 5): L = L_arc + λ·L_tri, λ = 0.1. Logged terms: ``loss``, ``arccon``, ``triplet``,
  ``triplets`` (|T|, the number of triplets in the batch).

Optimisation is AdamW with Sharpness-Aware Minimization: that is the loop's ``train.sam_rho``
(``sentemb.train.sam``; 0.05 in the ArcCSE runs, Foret et al.'s default, as the paper gives none).
The runs encode a step's two micro-batches in one forward (``train.fuse_micro_batches: 2``,
``merge``): ArcCon and Eq. 4 stay each micro-batch's own.

Open choices (methods.md §5 **open**), with the switch that changes each:

* θ_ii + m > π (``beyond_pi``). cos(θ + m) would rise again there, rewarding a *larger* angle
  between the positives. Default ``shift``: for θ > π − m use ψ(θ) = cos θ − (1 − cos m). It equals
  cos(θ+m) = −1 at θ = π − m (continuous), decreases on [π − m, π], and stays below cos θ, so ψ is
  non-increasing on all of [0, π] and ArcCon ≥ NT-Xent everywhere (strictly larger for m > 0).
  ArcFace's fallback cos θ − m·sin m is not continuous at the switch, hence not used. ``raw`` keeps
  the literal cos(θ + m).
* ε = 1e-6 under the square root keeps the gradient finite at cos θ = ±1 (|dψ/dcos θ| ≤
  cos m + sin m/√ε); ``sin_eps``.
* Batch and update schedule ("batch size in {8, 16, 32}, parameters updated every 64 steps"): a
  loop setting, not a method argument. The paper runs read it as 64 sentences per update
  (``batch_size: 32, grad_accum: 2``); the literal reading is the named run ``arccse-accum64``
  (``grad_accum: 64``). In-batch negatives are those of one micro-batch either way. "We evaluate
  our model every 125 training steps" is read per run. The paper runs count updates of 64 sentences
  (``eval_steps: 125``), so their two rules use "step" for two things (32 sentences in the update
  rule, an update in the evaluation rule): an open choice. ``arccse-accum64`` counts micro-batches
  of 32 (``train.eval_unit: micro_batches``, ``sentemb.train.loop.eval_due``: 249 checks in its 488
  updates instead of 3).
* Maximum lengths: ArcCon truncates at ``train.max_len`` (the runs: 512 = the longest sentence of
  the batch for base models, 32 for large, as the paper); triplets have their own
  ``triplet_max_len`` (default 512 = the longest of the batch, capped at the model's position
  limit), since ≥ 25-word sentences exceed 32 tokens.
* §4.1 "During training, the sentences are sampled by length": the loop's ``train.sampler:
  length`` (``sentemb.train.loop.batch_schedule``), set in the ArcCSE runs: per epoch, batches of
  neighbours in whitespace-word-count order (ties in seeded random order), batch order shuffled.
  Open: the paper gives neither the length unit nor how batches are ordered; words (not word
  pieces) keep the schedule tokenizer-free. Bucketing changes which sentences are each other's
  in-batch negatives, hence ``random`` stays the loop's default for the other methods.
* ``triplet_mlp`` (default true): the triplet embeddings h̄ are MLP([CLS]) like ArcCon's, the
  paper's "sentence representation during training"; false uses the raw [CLS].
* ``mask_unit`` (default ``words``, as the paper's example masks whole words): the masking rate
  counts the tokenizer's pre-tokenized words (punctuation is a word) and a masked word masks all its
  word pieces; ``tokens`` counts and masks word pieces. [CLS]/[SEP] are never masked.
* ``mask_replace`` (default ``mask``): each masked word piece becomes [MASK]; ``delete`` removes it.
* Span lengths (the paper says only "contiguous segments"): SpanBERT's geometric distribution,
  ``span_p`` = 0.2 clipped at ``max_span`` = 10; spans are added until exactly round(rate·n) units
  are masked (the last span is cut to fit).
* The "≥ 25 words" filter (``min_words``) counts whitespace-separated words of the raw sentence.

Bucketed widths (``train.buckets``, ``sentemb.data.buckets``): the ArcCon rows are padded to a
bucket of their longest row and the triplet rows to a bucket of theirs, which may pass ``max_len``
(32 in the large runs) up to the triplets' truncation (``triplet_max_len`` within the model's
positions): past the last bucket the widths grow in half-octaves up to it (``Method.width(n, limit)``:
48, 64, 96, 128, 192, 256, 384, 512 at ``max_len`` 32). Spans are drawn over each sentence's own units and padded positions are
attention 0, so every logged term is the same with and without buckets (``tests/test_buckets.py``).
The number of triplet rows, 3·|T|, varies per batch (the sentences with ≥ ``min_words`` words).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .. import SentembError
from .base import WEIGHTED, Encoded, arg
from .registry import register_method
from .simcse import SimCSE, info_nce

TRIPLET_KEYS = ("tri_input_ids", "tri_attention_mask", "tri_index", "tri_weight")
#: the fewest triplets a graphed run's batch holds (``ArcCSE.build_triplets``: padded to a power of two)
TRIPLET_PAD_MIN = 8


# ------------------------------------------------------------------------------------ the equations
def positive_logit(cos: torch.Tensor, margin_deg: float, beyond_pi: str = "shift", sin_eps: float = 1e-6) -> torch.Tensor:
    """ψ(θ) = cos(θ + m) from cos θ, without arccos (ArcCSE Eq. 3's numerator), safe at cos θ = ±1.

    cos(θ + m) = cos θ·cos m − sin θ·sin m with sin θ = √max(1 − cos²θ, ``sin_eps``) (θ ∈ [0, π], so
    sin θ ≥ 0). ``beyond_pi="shift"``: where θ + m > π (cos θ < −cos m) ψ = cos θ − (1 − cos m),
    continuous at θ = π − m and decreasing, so ψ is non-increasing on [0, π]; ``"raw"``: cos(θ + m)."""
    m = math.radians(margin_deg)
    cos_m, sin_m = math.cos(m), math.sin(m)
    sin = torch.sqrt(torch.clamp(1.0 - cos * cos, min=sin_eps))  # clamp: zero gradient where |cos θ| ≈ 1
    arc = cos * cos_m - sin * sin_m
    if beyond_pi == "raw":
        return arc
    if beyond_pi != "shift":
        raise SentembError(f"beyond_pi: {beyond_pi!r} is not one of 'shift', 'raw'")
    return torch.where(cos >= -cos_m, arc, cos - (1.0 - cos_m))


def arccon_loss(h: torch.Tensor, h_pos: torch.Tensor, margin_deg: float = 10.0, temperature: float = 0.05, *,
                beyond_pi: str = "shift", sin_eps: float = 1e-6) -> torch.Tensor:
    """ArcCon loss, ArcCSE Eq. 3: cross-entropy of the B×B logits cos θ_ij / τ in which the diagonal
    (the positive pair) is replaced by ψ(θ_ii)/τ = cos(θ_ii + m)/τ (see ``positive_logit``).

    h, h_pos: (B, d) the two views' embeddings. Computed in fp32 regardless of autocast. With
    ``margin_deg = 0`` it is NT-Xent / InfoNCE (Gao et al. 2021, Eq. 1) exactly.

    Eager also in a compiled step (``train.compile``; ``eager_arccon``: a graph break, B×B work):
    Inductor's gradient of this normalise / diagonal-replace / cross-entropy chain was found wrong on
    the CPU, 16-54% off an fp64 reference (the compiled ArcCSE step with dropout on trained 1e-2 away
    from the eager weights; with dropout off every positive has cos 1, the clamp zeroes that path,
    and the two agreed). Unchecked on a GPU, so kept eager there too."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        h, h_pos = h.float(), h_pos.float()
        cos = F.normalize(h, dim=-1) @ F.normalize(h_pos, dim=-1).T  # (B, B): cos θ_ij
        pos = positive_logit(torch.diagonal(cos), margin_deg, beyond_pi, sin_eps)  # (B,)
        eye = torch.eye(cos.size(0), dtype=torch.bool, device=cos.device)
        logits = torch.where(eye, pos.unsqueeze(1).expand_as(cos), cos) / temperature
        return F.cross_entropy(logits, torch.arange(cos.size(0), device=cos.device))


def eager_arccon() -> None:
    """``arccon_loss`` under ``torch.compiler.disable`` for the rest of the process (``ArcCSE.batch_terms``
    looks it up here at each call): applied by a compiled run's set-up (``ArcCSE.prepare_compile``),
    not at import (the decorator imports ``torch._dynamo``: seconds in every command that lists the
    methods)."""
    global arccon_loss
    if not getattr(arccon_loss, "_sentemb_eager", False):
        arccon_loss = torch.compiler.disable(arccon_loss)
        arccon_loss._sentemb_eager = True



def triplet_loss(h: torch.Tensor, h_less: torch.Tensor, h_more: torch.Tensor, margin: float = 0.0,
                 count: int | torch.Tensor | None = None, valid: torch.Tensor | None = None,
                 weight: torch.Tensor | None = None) -> torch.Tensor:
    """ArcCSE Eq. 4, averaged over the triplets: mean max(0, cos(h̄, h̄″) − cos(h̄, h̄′) + m′) with
    h_less = h̄′ (20% masked), h_more = h̄″ (40% masked); 0 for no triplets. fp32. ``count``: divide
    the sum by the batch's number of triplets instead (a chunk's share, ``Method.row_terms``).
    ``valid`` (T,) bool: only these triplets count (the padding triplets of a graphed run,
    ``build_triplets``); the mean is then over them (0 when none). ``weight`` (T,): the weighted
    sum Σ_t w_t·hinge_t instead of a mean (fused micro-batches, ``ArcCSE.merge``)."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        if h.size(0) == 0:
            return h.float().sum() * 0.0
        h, h_less, h_more = h.float(), h_less.float(), h_more.float()
        hinge = F.relu(F.cosine_similarity(h, h_more, dim=-1) - F.cosine_similarity(h, h_less, dim=-1) + margin)
        if weight is not None:
            return (hinge * weight.to(hinge.dtype)).sum()
        if valid is not None:
            hinge = hinge * valid.to(hinge.dtype)
            if count is None:
                count = valid.sum()
        if count is None:
            return hinge.mean()
        return hinge.sum() / (count.clamp(min=1) if isinstance(count, torch.Tensor) else count)


def nested_span_masks(n_tokens: int, rates: Sequence[float], rng: np.random.Generator, *, span_p: float = 0.2,
                      max_span: int = 10) -> np.ndarray:
    """Nested masks of contiguous spans (ArcCSE §3.2): row k masks round(rates[k]·n_tokens) of the
    ``n_tokens`` units, row k+1's masked set contains row k's (the masked area is enlarged).

    Spans are added one at a time: a length L from a geometric distribution (``span_p``, clipped at
    ``max_span``; SpanBERT's choice) and at the units still to mask, a start uniform among the
    n − L + 1 places where the span fits; the span [start, start + L) is masked, except that where
    it overlaps earlier spans (merging with them) only its first still-needed unmasked units are
    taken, so every count is exact and every addition is one contiguous piece of the masked area.
    ``rates`` must be non-decreasing in [0, 1]. Returns a bool array (len(rates), n_tokens)."""
    rates = [float(r) for r in rates]
    if any(not 0.0 <= r <= 1.0 for r in rates) or any(b < a for a, b in zip(rates, rates[1:])):
        raise SentembError(f"mask rates must be non-decreasing within [0, 1], got {rates}")
    masked = np.zeros(n_tokens, dtype=bool)
    out = np.zeros((len(rates), n_tokens), dtype=bool)
    for k, rate in enumerate(rates):
        target = int(math.floor(rate * n_tokens + 0.5))
        count = int(masked.sum())
        while count < target:
            length = min(int(rng.geometric(span_p)), max_span, target - count)
            start = int(rng.integers(n_tokens - length + 1))
            new = start + np.flatnonzero(~masked[start : start + length])
            new = new[: target - count]  # a prefix: the taken units and the spans between stay one piece
            masked[new] = True
            count += len(new)
        out[k] = masked
    return out


@contextmanager
def dropout_off(module: torch.nn.Module):
    """Evaluation mode (no dropout) inside, the previous train/eval mode of every submodule after;
    gradients still flow."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.train(mode)


# ------------------------------------------------------------------------------------ the method
@register_method
class ArcCSE(SimCSE):
    """ArcCSE (methods.md §5): SimCSE's two dropout views under ArcCon + λ·triplet entailment."""

    name = "arccse"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of ArcCon (Eq. 3)", exclusive_minimum=0)
        margin_deg: float = arg(10.0, "additive angular margin m of ArcCon in degrees (Eq. 3)",
                                minimum=0, exclusive_maximum=180)
        arccon: bool = arg(True, "ArcCon loss; false = NT-Xent/InfoNCE (ablation 'w/o ArcCon')")
        beyond_pi: str = arg("shift", "positive logit where θ+m > π: cos θ − (1 − cos m) (continuous, "
                             "non-increasing; open choice) or the raw cos(θ+m)", choices=("shift", "raw"))
        sin_eps: float = arg(1e-6, "ε in sin θ = √max(1 − cos²θ, ε): finite gradient at cos θ = ±1",
                             exclusive_minimum=0, exclusive_maximum=1)
        triplet: bool = arg(True, "triplet entailment loss (Eq. 4); false = ablation 'w/o triplet'")
        triplet_weight: float = arg(0.1, "λ of L = L_arc + λ·L_tri (Eq. 5)", minimum=0)
        triplet_margin: float = arg(0.0, "m′ of the triplet loss (Eq. 4)", minimum=0)
        min_words: int = arg(25, "only sentences with at least this many (whitespace) words form triplets", minimum=1)
        mask_rate: float = arg(0.2, "masking rate of s′ (contiguous spans)", exclusive_minimum=0, exclusive_maximum=1)
        mask_rate_large: float = arg(0.4, "masking rate of s″ (s′'s masked area enlarged)",
                                     exclusive_minimum=0, exclusive_maximum=1)
        mask_unit: str = arg("words", "masking unit (open): pre-tokenized words or word pieces",
                             choices=("words", "tokens"))
        mask_replace: str = arg("mask", "masked units become [MASK] or are deleted (open)", choices=("mask", "delete"))
        span_p: float = arg(0.2, "geometric parameter of span lengths (SpanBERT; open)", exclusive_minimum=0, maximum=1)
        max_span: int = arg(10, "longest span in units (SpanBERT; open)", minimum=1)
        triplet_max_len: int = arg(512, "truncation of triplet sentences in tokens (paper: the longest of the "
                                        "batch; capped at the model's position limit)", minimum=4)
        triplet_mlp: bool = arg(True, "triplet embeddings pass through the training MLP (open)")
        triplet_pass: str = arg(
            "separate", "how the triplet rows are encoded: with_views - in the views' forward, with dropout on the "
            "views' rows only (sentemb.model.dropout.dropout_rows), one encoder pass a step instead of two, the "
            "views padded to the triplets' width where those are wider; separate - a forward of their own in "
            "evaluation mode, the default (on an H200 the two take the same time each in a process of its own, 140 "
            "against 144 ms; two earlier lends, each against the row that ran first in its process, ranked them "
            "oppositely; docs/gpu/h200-2026-11-28c.md; on the CPU with_views is 7% slower); auto - with_views where the triplet rows "
            "are no wider than the views, else separate (the default from 2026-11-27 to 11-28). The same "
            "embeddings with dropout off, and the same dropout masks with dropout_rng counter; with stream another "
            "random run. A compiled step (train.compile) and train.unpad encode them separately",
            choices=("auto", "with_views", "separate"))
        mlp: str = arg("train_only", "Linear+Tanh head on [CLS]: in training only (paper), kept at test time, "
                       "or none", choices=("train_only", "always", "none"))

    eval_pooler = "cls_before_pooler"
    width_groups = {"tri_": "triplets"}  # the triplet rows' own width (``Method.width``)
    schedule_args = ("min_words", "max_span")  # which sentences form triplets: rows, not shapes
    paper_train = {"sam_rho": 0.05}  # SAM, as config/config.yaml trains ArcCSE
    fusable = True  # ArcCon per micro-batch; the merge's triplets weighted per micro-batch (``merge``)
    contract_args = {"min_words": 5}  # the contract's short sentences form triplets too

    @classmethod
    def check(cls, args, config, where="method_args"):
        """Rules across ArcCSE's arguments (each one's range is declared on it)."""
        if args.mask_rate > args.mask_rate_large:
            raise SentembError(f"{where}.mask_rate/mask_rate_large: s″ enlarges s′'s masked area, so mask_rate "
                               f"({args.mask_rate}) must not exceed mask_rate_large ({args.mask_rate_large})")
        if args.triplet and args.triplet_mlp and args.mlp == "none":
            raise SentembError(f"{where}.triplet_mlp: true needs an MLP (mlp is 'none')")

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        a = self.args
        where = f"method '{self.name}'"
        # what needs the tokenizer (the rest is checked with the config: Args' bounds, ``check``)
        if a.triplet and a.mask_unit == "words" and not getattr(tokenizer, "is_fast", False):
            raise SentembError(f"{where}.mask_unit: 'words' needs a fast tokenizer (word ids); use 'tokens'")
        if a.triplet and a.mask_replace == "mask" and tokenizer.mask_token_id is None:
            raise SentembError(f"{where}.mask_replace: the tokenizer has no [MASK] token; use 'delete'")

    # -------------------------------------------------------------------------- batches
    def _triplet_len(self) -> int:
        limit = getattr(self.encoder.config, "max_position_embeddings", None) or self.args.triplet_max_len
        if getattr(self.encoder.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            limit -= 2  # RoBERTa's positions start at padding_idx + 1
        return min(self.args.triplet_max_len, limit)

    def build_triplets(self, sentences: Sequence[str], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """The rows [s_1..s_T, s′_1..s′_T, s″_1..s″_T] of the sentences with ≥ ``min_words`` words,
        padded to a bucket of the longest (``Method.width``, the longest itself without buckets):
        ``tri_input_ids``, ``tri_attention_mask`` of shape (3T, L); (0, 1)
        when there is no such sentence; ``tri_index`` (T,): each triplet's sentence in the batch.

        In a graphed run (``ctx.static``, ``train.graphs``) T is padded up to a power of two (at
        least ``TRIPLET_PAD_MIN``) with padding triplets ([CLS] [SEP] rows, ``tri_index`` −1) that Eq. 4
        leaves out: the number of long sentences, which varies from batch to batch, would otherwise
        make a new batch shape, and a new captured graph, nearly every step. A batch without a long
        sentence has no triplet rows there either (a batch shape of its own): padding triplets alone
        would cost an encoder pass (with SAM, two) whose loss and gradients are 0."""
        a = self.args
        index = [i for i, s in enumerate(sentences) if len(s.split()) >= a.min_words]
        long = [sentences[i] for i in index]
        if a.triplet and self.ctx.static and long:
            return self._padded_triplets(index, self._real_triplets(long, index, rng))
        if not a.triplet or not long:
            empty = torch.zeros((0, 1), dtype=torch.long)
            return {"tri_input_ids": empty, "tri_attention_mask": empty.clone(), "tri_index": torch.zeros(0, dtype=torch.long)}
        return self._real_triplets(long, index, rng)

    def _real_triplets(self, long: list[str], index: list[int], rng) -> dict[str, torch.Tensor]:
        """The triplet rows of the ``long`` sentences (``build_triplets``), at batch positions ``index``."""
        a, tok = self.args, self.tokenizer
        enc = tok(list(long), truncation=True, max_length=self._triplet_len(), return_special_tokens_mask=True)
        views: list[list[list[int]]] = [[], [], []]
        for k, ids in enumerate(enc["input_ids"]):
            special = enc["special_tokens_mask"][k]
            if a.mask_unit == "words":
                unit = [w if not sp else None for w, sp in zip(enc.word_ids(k), special)]
            else:
                unit = [p if not sp else None for p, sp in enumerate(special)]
            units = sorted({u for u in unit if u is not None})
            masks = nested_span_masks(len(units), (a.mask_rate, a.mask_rate_large), rng,
                                      span_p=a.span_p, max_span=a.max_span)
            views[0].append(list(ids))
            for v, row in ((1, masks[0]), (2, masks[1])):
                hidden = {units[j] for j in np.flatnonzero(row)}
                if a.mask_replace == "mask":
                    views[v].append([tok.mask_token_id if u in hidden else t for t, u in zip(ids, unit)])
                else:
                    views[v].append([t for t, u in zip(ids, unit) if u not in hidden])
        rows = views[0] + views[1] + views[2]
        # to a bucket (train.buckets), past max_len up to the triplets' own truncation (positions)
        width = self.width(max(len(r) for r in rows), limit=self._triplet_len())
        pad = tok.pad_token_id or 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            att[i, : len(r)] = 1
        return {"tri_input_ids": ids, "tri_attention_mask": att, "tri_index": torch.tensor(index, dtype=torch.long)}

    def _padded_triplets(self, index: list[int], real: dict) -> dict[str, torch.Tensor]:
        """``build_triplets`` with T padded (its docstring): the ``real`` triplets first, then padding
        triplets of [CLS] [SEP] with ``tri_index`` −1."""
        tok = self.tokenizer
        t = len(index)
        padded = max(TRIPLET_PAD_MIN, 1 << max(t - 1, 0).bit_length())
        cls_id = tok.cls_token_id if tok.cls_token_id is not None else (tok.bos_token_id or 0)
        sep_id = tok.sep_token_id if tok.sep_token_id is not None else (tok.eos_token_id or 0)
        width = real["tri_input_ids"].size(1)
        pad = tok.pad_token_id or 0
        ids = torch.full((3 * padded, width), pad, dtype=torch.long)
        att = torch.zeros((3 * padded, width), dtype=torch.long)
        ids[:, 0], ids[:, 1], att[:, :2] = cls_id, sep_id, 1
        for v in range(3):
            ids[v * padded : v * padded + t] = real["tri_input_ids"][v * t : (v + 1) * t]
            att[v * padded : v * padded + t] = real["tri_attention_mask"][v * t : (v + 1) * t]
        tri_index = torch.full((padded,), -1, dtype=torch.long)
        tri_index[:t] = torch.tensor(index, dtype=torch.long)
        return {"tri_input_ids": ids, "tri_attention_mask": att, "tri_index": tri_index}

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        """SimCSE's batch (truncated at ``ctx.max_len``) plus the triplet rows (``build_triplets``),
        whose masks are drawn from ``np_rng(micro)``."""
        batch = self.tokenize(sentences, lines)
        batch.update(self.build_triplets(sentences, self.np_rng(micro)))
        return batch

    def merge(self, batches):
        """k micro-batches as one (``Method.merge``, ``train.fuse_micro_batches``): SimCSE's rows by the
        default; the triplet rows [s; s′; s″] of all micro-batches, each block in micro-batch order,
        padded to the widest, ``tri_index`` moved to the merged sentence positions, and ``tri_weight``
        (T,) = 1/(k·T_j) for a triplet of micro-batch j with T_j triplets (a graphed run's padding
        triplets, ``tri_index`` -1, keep -1, weigh 0 and are not counted in T_j): the merge's weighted
        Eq. 4 sum is then the mean over the micro-batches of their own Eq. 4 means (``row_terms``),
        what accumulating them one by one computes."""
        merged, spans = super().merge([{k: v for k, v in b.items() if k not in TRIPLET_KEYS} for b in batches])
        if "tri_index" not in batches[0]:
            return merged, spans
        k = len(batches)
        counts = [int(b["tri_index"].numel()) for b in batches]
        width = max(int(b["tri_input_ids"].size(1)) for b in batches)
        ids, att = [], []
        for v in range(3):
            for b, t in zip(batches, counts):
                ids.append(self.pad_width("tri_input_ids", b["tri_input_ids"][v * t : (v + 1) * t], width))
                att.append(self.pad_width("tri_attention_mask", b["tri_attention_mask"][v * t : (v + 1) * t], width))
        first = batches[0]["tri_index"]
        merged["tri_input_ids"], merged["tri_attention_mask"] = torch.cat(ids), torch.cat(att)
        # a graphed run's padding triplets (tri_index -1, build_triplets) stay -1 and weigh 0: T_j counts
        # the real ones, with tensor ops (no host read inside a captured step)
        merged["tri_index"] = torch.cat([torch.where(b["tri_index"] >= 0, b["tri_index"] + a, b["tri_index"])
                                         for b, (a, _) in zip(batches, spans)]).to(first.dtype)
        weights = []
        for b in batches:
            valid = (b["tri_index"] >= 0).to(torch.float32)
            weights.append(valid / (k * valid.sum().clamp(min=1.0)))
        merged["tri_weight"] = torch.cat(weights) if weights else torch.zeros(0, device=first.device)
        return merged, spans

    # -------------------------------------------------------------------------- losses
    def encode_triplets(self, batch) -> torch.Tensor:
        """(3T, d) embeddings of the triplet rows with dropout off (gradients flow)."""
        with dropout_off(self.encoder):
            cls = self.encoder(input_ids=batch["tri_input_ids"], attention_mask=batch["tri_attention_mask"],
                               return_dict=True).last_hidden_state[:, 0]
        if self.args.triplet_mlp and self.mlp is not None:
            cls = self.mlp(cls)
        return cls

    def chunk(self, batch, start, stop):
        """SimCSE's rows ``[start, stop)`` and the triplets of those sentences (``tri_index`` made
        chunk-local); the triplet rows keep the batch's padding width.

        In a graphed run (``ctx.static``) the triplets are taken by position instead, a slice: the
        chunk of sentences ``[start, stop)`` of n takes triplet slots ``[start·T/n, stop·T/n)`` of the
        T (padded) ones, with their batch-wide ``tri_index`` (only its sign is read then: padding or
        not). Eqs. 4-5 see nothing of a triplet but its own three rows (encoded with dropout off), so
        each triplet counted once, in whichever chunk, gives the batch's L_tri; and a slice has no
        data-dependent shape, so gradient caching runs inside the graph."""
        out = super().chunk({k: v for k, v in batch.items() if k not in TRIPLET_KEYS}, start, stop)
        index = batch["tri_index"]
        t = index.numel()
        if self.ctx.static:
            n = self.n_sentences(batch)
            lo, hi = start * t // n, stop * t // n
            out.update(tri_input_ids=torch.cat([batch["tri_input_ids"][v * t + lo : v * t + hi] for v in range(3)]),
                       tri_attention_mask=torch.cat([batch["tri_attention_mask"][v * t + lo : v * t + hi] for v in range(3)]),
                       tri_index=index[lo:hi])
            return out
        sel = ((index >= start) & (index < stop)).nonzero().flatten()
        rows = torch.cat([sel, sel + t, sel + 2 * t])
        out.update(tri_input_ids=batch["tri_input_ids"][rows], tri_attention_mask=batch["tri_attention_mask"][rows],
                   tri_index=index[sel] - start)
        return out

    def _with_views(self, batch) -> bool:
        """Encode the triplet rows in the views' forward (``triplet_pass: with_views``); not while
        ``torch.compile`` traces the step (its dropout stays torch's own), nor with ``train.unpad``
        (hidden states of packed tokens have no sentence rows to exempt)."""
        from ..model.unpad import installed

        a = self.args
        tri = batch.get("tri_input_ids")
        if not a.triplet or a.triplet_pass == "separate" or tri is None or torch.compiler.is_compiling() \
                or installed(self.encoder):
            return False
        # auto: decided on widths every chunk and process share keeps (Method.chunk), so that a chunk without
        # triplet rows pads its views as the whole batch does (keyed masks depend on the padded width)
        return a.triplet_pass == "with_views" or int(tri.size(1)) <= int(batch["input_ids"].size(1))

    def encode(self, batch):
        """The two dropout views' MLP([CLS]) (``z1``, ``z2``: (n, d) each) and, with ``triplet_pass:
        with_views`` (or ``auto`` where the triplet rows are no wider than the views), the triplet
        rows' embeddings (``rows["triplets"]``, (3T, d)) from the same forward: rows [x; x; s; s′; s″]
        padded to the wider of the two widths, dropout on the first 2n rows only (``dropout_rows``),
        the attention masks keeping every row to its own tokens. A chunk without triplet rows still
        pads its views to the batch's triplet width, as the whole batch's forward does."""
        views = {k: v for k, v in batch.items() if k not in TRIPLET_KEYS}
        if not self._with_views(batch):
            z1, z2 = self.encode_views(views)  # (n, d) each
            return Encoded(batch={"z1": z1, "z2": z2})
        from ..model.dropout import dropout_rows

        n = views["input_ids"].size(0)
        tri = {"input_ids": batch["tri_input_ids"], "attention_mask": batch["tri_attention_mask"]}
        if "token_type_ids" in views:
            tri["token_type_ids"] = torch.zeros_like(tri["input_ids"])
        width = max(int(views["input_ids"].size(1)), int(tri["input_ids"].size(1)))
        rows = {k: torch.cat([self.pad_width(k, v, width)] * 2 + [self.pad_width(k, tri[k], width)])
                for k, v in views.items() if k in tri}
        with dropout_rows(2 * n):
            cls = self.encoder(**rows, return_dict=True).last_hidden_state[:, 0]
        h_tri = cls[2 * n :]
        cls = cls[: 2 * n]
        if self.mlp is not None:
            cls = self.mlp(cls)
            if self.args.triplet_mlp:
                h_tri = self.mlp(h_tri)
        return Encoded(batch={"z1": cls[:n], "z2": cls[n:]}, rows={"triplets": h_tri})

    @classmethod
    def prepare_compile(cls):
        eager_arccon()  # Inductor's gradient of ArcCon was wrong on the CPU (arccon_loss)

    def batch_terms(self, emb, batch):
        """ArcCon (Eq. 3) over the whole batch's two views (NT-Xent with ``arccon: false``)."""
        a = self.args
        z1, z2 = emb["z1"], emb["z2"]
        if a.arccon:
            arc = arccon_loss(z1, z2, a.margin_deg, a.temperature, beyond_pi=a.beyond_pi, sin_eps=a.sin_eps)
        else:
            arc = info_nce(z1, z2, a.temperature)
        n = (batch["tri_index"] >= 0).sum().float() if "tri_index" in batch else torch.zeros((), device=z1.device)
        return {"arccon": arc.detach(), "triplets": n, WEIGHTED: {"arccon": arc}}

    def row_terms(self, enc, chunk, batch):
        """λ·L_tri (Eqs. 4-5): the chunk's triplets, divided by the batch's number of triplets."""
        a = self.args
        total = batch["tri_index"].numel() if "tri_index" in batch else 0
        n = chunk["tri_index"].numel() if "tri_index" in chunk else 0
        device = chunk["input_ids"].device
        valid = None
        if self.ctx.static and n:  # padding triplets (build_triplets): counted by value, on the device
            valid = chunk["tri_index"] >= 0
            total = (batch["tri_index"] >= 0).sum()
        if a.triplet and n > 0:
            h = enc.rows["triplets"] if "triplets" in enc.rows else self.encode_triplets(chunk)  # (3n, d): [s, s′, s″]
            tri = triplet_loss(h[:n], h[n : 2 * n], h[2 * n :], a.triplet_margin, count=total, valid=valid,
                               weight=chunk.get("tri_weight"))
        else:
            tri = torch.zeros((), dtype=torch.float32, device=device)
        return {"triplet": tri.detach(), WEIGHTED: {"triplet": a.triplet_weight * tri}}
