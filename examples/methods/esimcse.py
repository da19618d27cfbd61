"""ESimCSE: word repetition for the positive, a momentum-encoded queue for more negatives (Wu et al. 2022).

A method that keeps state across optimizer steps, written only against sentemb's public API, in a file
of its own (a plug-in: config key ``method_modules``): a momentum-updated copy of the encoder and a
FIFO queue of its sentence embeddings, changed in ``Method.after_step`` alone
(``docs/methods/writing-a-method.md``, "A method that keeps state").

Wu, Gao, Zang, Han, Wang, Hu (2022), "ESimCSE: Enhanced Sample Building Method for Contrastive
Learning of Unsupervised Sentence Embedding", COLING 2022 (arXiv:2109.04380), §3:

* Word repetition (§3.1, Eq. 1): the positive of sentence s = (x_1..x_N) (its subwords) is s with
  dup_len of its subwords repeated in place, dup_len drawn uniformly from [0, max(2, int(dup_rate·N))]
  and the repeated subwords a uniform sample of that many positions, so that a positive pair no
  longer shares its length;
* momentum contrast (§3.2, Eq. 2): a momentum encoder θ_m ← λ·θ_m + (1 − λ)·θ_e after every update
  of the encoder θ_e, whose embeddings of the batch's sentences enter a queue of size M (the oldest
  leave first) and serve as extra negatives;
* the loss (Eq. 3), with h_i the anchor, h_i⁺ its word-repeated positive, h_m⁺ the queue's embeddings:

      ℓ_i = −log  e^{cos(h_i, h_i⁺)/τ} / ( Σ_{j=1}^{B} e^{cos(h_i, h_j⁺)/τ} + Σ_{m=1}^{M} e^{cos(h_i, h_m⁺)/τ} ).

With ``queue_size: 0`` and ``dup_rate: 0`` it is SimCSE's InfoNCE (Gao et al. 2021, Eq. 1).

Where the state is and when it changes (the loop's promises, ``sentemb.methods.base``):

* ``momentum_encoder`` (and ``momentum_mlp``): frozen parameters (``requires_grad = False``, so the
  optimizer leaves them out), updated by Eq. 2 in ``after_step``. The authors' code differs in four
  places, each a switch (``dup_len``, ``momentum_init``, ``momentum_head``, ``momentum_phase``;
  docs/methods/esimcse.md);
* ``queue`` (M × d) and ``queue_len``: persistent buffers (saved and resumed with the weights),
  emptied in ``before_epoch`` under ``queue_reset: epoch`` (the authors' trainer), and
  written in ``after_step`` from the keys ``batch_terms`` stashed during the step
  (``self.stash("keys", k)``, kept per micro-batch): a repeated call (gradient caching, SAM's second
  pass, the contract's re-runs) overwrites its own stash and never sees its own keys in the queue;
* under ``train.graphs`` (a replayed CUDA graph runs no Python) the step is graph-safe: the queue is
  read whole, its empty rows masked out of Eq. 3 by ``queue_len`` on the device (no ``int()`` of
  it, no shape that changes while it fills), the stash is the graph's static output that the loop
  copies out after each replay, and ``after_step`` updates the momentum encoder and the queue in place;
* under ``train.devices: N`` ``batch_terms`` gets every rank's keys (the loop gathers ``Encoded.batch``),
  so every rank enqueues the same rows and every rank's state is the single process's.

Open choices: the momentum encoder runs in eval mode (no dropout: a key is a target, and it is then
the same in every chunking and pass) on the *original* sentences, through a momentum copy of the
training MLP (``momentum_head: online``: the training MLP itself, the authors' code); keys are stored in
fp32 buffers, which hold exactly the values the run's precision computes (fp16 ones under
``train.precision: fp16``, the authors' ``--fp16``: their queue's values); the queue is enqueued once per optimizer step in micro-batch order (newest first), so with
``grad_accum`` the step's micro-batches all see the queue of the step before. Defaults: λ = 0.995
(§3.2), dup_rate 0.32 and M = 160 (2.5 × the batch of 64; §4's BERT-base setting, and the authors'
``run.sh``'s).

Truncation (the positive's length): the repetition is applied to the sentence *as truncated* at
``max_len`` (its subwords between [CLS] and [SEP]), as the authors' code does (caskcsg/sentemb,
``ESimCSE/train.py``, ``--dup_type bpe`` in its ``run.sh``: the tokenizer truncates at
``max_seq_length``, then subwords other than [CLS]/[SEP] are repeated and the rows are not cut
again). So a positive is longer than its anchor by its dup_len, and may pass ``max_len`` by up to
max(2, int(dup_rate·(max_len − 2))) tokens (with ``dup_len: code`` at most 9): a sentence at ``max_len`` keeps the length difference
that the repetition is for. It is cut (its [SEP] kept) only at the encoder's positions
(``max_position_embeddings``, RoBERTa's less its 2 offset), never beyond; ``cut_positive: true``
cuts it back to ``max_len`` instead (repetition first, then the cut: the positive then loses the
tail of a long sentence and, at ``max_len``, its length difference). ``positive_limit`` is that
bound, and ``build_batch`` pads the rows past ``max_len`` through ``Method.width(n, limit)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sentemb.methods import WEIGHTED, Encoded, arg, ema_, register_method
from sentemb.methods.simcse import SimCSE


def word_repetition(ids: list[int], dup_rate: float, rng, rule: str = "paper") -> list[int]:
    """Eq. 1: the subwords ``ids`` (no special tokens) with dup_len of them repeated in place, the
    positions a uniform sample. ``rule`` (``dup_len``): ``paper``, dup_len ~ U{0, .., max(2,
    int(dup_rate·N))} (at most N); ``code``, the authors' ``train.py`` (``--dup_type bpe``): with L =
    int(dup_rate·(N + 2)) (their input length counts [CLS] and [SEP]), none where L = 0, else dup_len ~
    U{0, .., min(10, L) − 1} (``random.randrange(min(10, L))``)."""
    n = len(ids)
    if n == 0 or dup_rate <= 0:
        return list(ids)
    if rule == "code":
        top = int(dup_rate * (n + 2))
        dup_len = min(n, int(rng.integers(0, min(10, top)))) if top > 0 else 0
    else:
        dup_len = min(n, int(rng.integers(0, max(2, int(dup_rate * n)) + 1)))
    chosen = set(rng.choice(n, size=dup_len, replace=False).tolist()) if dup_len else set()
    out = []
    for i, t in enumerate(ids):
        out.extend((t, t) if i in chosen else (t,))
    return out


def queue_info_nce(h: torch.Tensor, pos: torch.Tensor, queue: torch.Tensor, temperature: float,
                   filled: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 3, the mean of ℓ_i over the batch: anchors ``h`` (B, d), positives ``pos`` (B, d), the
    queue's keys ``queue`` (M, d; M may be 0); fp32 regardless of autocast. ``filled`` (a 0-dim
    count on the device): only the queue's first ``filled`` rows count, the others are masked out of
    the denominator (the queue as one static shape, read without a host sync: ``train.graphs``)."""
    with torch.autocast(device_type=h.device.type, enabled=False):
        h = F.normalize(h.float(), dim=-1)
        logits = h @ F.normalize(pos.float(), dim=-1).T  # (B, B)
        if queue.size(0):
            extra = h @ F.normalize(queue.float(), dim=-1).T  # (B, M)
            if filled is not None:
                empty = torch.arange(queue.size(0), device=h.device) >= filled
                extra = extra.masked_fill(empty, float("-inf"))
            logits = torch.cat([logits, extra], 1)  # (B, B + M)
        return F.cross_entropy(logits / temperature, torch.arange(h.size(0), device=h.device))


@register_method
class ESimCSE(SimCSE):
    """SimCSE's encoder and MLP; the positive is the word-repeated sentence; a momentum queue adds negatives."""

    name = "esimcse"

    @dataclass
    class Args(SimCSE.Args):
        dup_rate: float = arg(0.32, "maximum share of a sentence's subwords repeated in its positive (Eq. 1; 0 = "
                              "SimCSE's dropout-only positive)", minimum=0, maximum=1)
        momentum: float = arg(0.995, "λ of the momentum encoder's update θ_m ← λθ_m + (1 − λ)θ_e (Eq. 2)",
                              minimum=0, exclusive_maximum=1)
        queue_size: int = arg(160, "M, the momentum-encoded sentence embeddings kept as extra negatives (Eq. 3; "
                              "0 = none)", minimum=0)
        cut_positive: bool = arg(False, "cut the word-repeated positive back to max_len after the repetition "
                                 "(false: as the authors' code, the repetition of the max_len-truncated sentence "
                                 "is kept whole, up to the encoder's positions)")
        dup_len: str = arg("paper", "how many subwords are repeated: paper - U{0..max(2, int(dup_rate*N))} (Eq. 1); "
                           "code - U{0..min(10, L)-1} with L = int(dup_rate*(N+2)), none where L = 0 (train.py)",
                           choices=("paper", "code"))
        momentum_init: str = arg("copy", "the momentum encoder's start: a copy of the encoder (the paper's reading), "
                                 "or random - BERT's init, N(0, initializer_range) (code: from_pretrained fills "
                                 "only bert.*, and cl_init's init_weights draws momentum_model afresh; 0.995^t of it "
                                 "is left at step t)", choices=("copy", "random"))
        momentum_head: str = arg("ema", "the keys' MLP: ema - a momentum copy of the training MLP, updated by Eq. 2; "
                                 "online - the training MLP itself, without gradient (code: models.py applies "
                                 "cls.mlp to the momentum encoder's output)", choices=("ema", "online"))
        momentum_phase: str = arg("paper", "when Eq. 2 runs: paper - after every update of the encoder (§3.2), so "
                                  "step t's keys come from t updates; code - before each step's keys, inside the "
                                  "forward (models.py), so step t's keys come from t + 1: the same updates and one "
                                  "more, from the starting encoder, done here when the method is built (a no-op "
                                  "with momentum_init copy)", choices=("paper", "code"))
        queue_reset: str = arg("never", "when the queue is emptied: never - it carries over from epoch to epoch (the "
                               "paper is silent); epoch - at the start of every epoch (code: trainers.py empties it "
                               "in its epoch loop); the same on the recipe's one epoch", choices=("never", "epoch"))

    # tiny encoder: a queue that fills and wraps within the contract's 3 steps of 16, and a momentum
    # that moves visibly per update (so a wrong number of updates shows); the queue emptied per epoch,
    # which only state_epoch's runs reach (the others stay within epoch 0)
    contract_args = {"queue_size": 24, "momentum": 0.5, "queue_reset": "epoch"}

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        self.momentum_encoder = copy.deepcopy(encoder).requires_grad_(False).eval()
        if self.args.momentum_init == "random":  # BERT's _init_weights over every module (the code's)
            _reinit_(self.momentum_encoder, getattr(encoder.config, "initializer_range", 0.02))
        self.momentum_mlp = None
        if self.mlp is not None and self.args.momentum_head == "ema":
            self.momentum_mlp = copy.deepcopy(self.mlp).requires_grad_(False).eval()
        if self.args.momentum_phase == "code":  # the code's update before step 0's keys (a resume loads over it)
            self.momentum_update()
        d = encoder.config.hidden_size
        self.register_buffer("queue", torch.zeros(self.args.queue_size, d))  # newest first
        self.register_buffer("queue_len", torch.zeros((), dtype=torch.long))

    def train(self, mode: bool = True):
        super().train(mode)
        self.momentum_encoder.eval()  # keys without dropout (module docstring)
        if self.momentum_mlp is not None:
            self.momentum_mlp.eval()
        return self

    # ------------------------------------------------------------------ batches
    def positive_limit(self) -> int:
        """The longest a positive row may be (with its [CLS] and [SEP]): ``max_len`` with
        ``cut_positive``, else the encoder's positions (module docstring, "Truncation")."""
        if self.args.cut_positive:
            return self.ctx.max_len
        cfg = self.encoder.config
        limit = getattr(cfg, "max_position_embeddings", None) or 512
        if getattr(cfg, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            limit -= 2  # RoBERTa's positions start at padding_idx + 1
        return limit

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        """Rows: ``input_ids``/``attention_mask``/(``token_type_ids``) the sentences (truncated at
        ``max_len``), ``rep_*`` their word-repeated positives (Eq. 1 on the truncated sentence's
        subwords, from ``np_rng(micro)``; at most ``positive_limit()`` long, [SEP] kept), both padded
        to one width."""
        from sentemb.data.buckets import pad_to

        batch = self.tokenize(sentences, lines)
        rng = self.np_rng(micro)
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        limit = self.positive_limit()
        rows = []
        for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
            real = [t for t, m in zip(ids, mask) if m][1:-1]  # the subwords, without [CLS] and [SEP]
            rep = word_repetition(real, self.args.dup_rate, rng, self.args.dup_len)[: limit - 2]  # repeat, then cut
            rows.append([cls_id, *rep, sep_id])
        longest = max(len(r) for r in rows)
        if longest > limit:  # never: the cut above (a check, not a second truncation)
            raise AssertionError(f"esimcse: a positive of {longest} tokens, more than its limit {limit}")
        width = self.width(max(int(batch["input_ids"].size(1)), longest), limit=limit)
        out = {k: pad_to(v, width, pad if k == "input_ids" else 0) for k, v in batch.items()}
        out["rep_input_ids"] = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        out["rep_attention_mask"] = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        if "token_type_ids" in batch:
            out["rep_token_type_ids"] = torch.zeros_like(out["rep_input_ids"])
        return out

    # ------------------------------------------------------------------ the loss
    def encode(self, batch) -> Encoded:
        """One forward over [s_1..s_n, s'_1..s'_n] (the sentences, then their repetitions): h, h⁺
        through the MLP; the keys k of the sentences from the momentum encoder (no graph)."""
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch]
        both = {k: torch.cat([batch[k], batch[f"rep_{k}"]], 0) for k in keys}
        cls = self.encoder(**both, return_dict=True).last_hidden_state[:, 0]  # (2n, d)
        if self.mlp is not None:
            cls = self.mlp(cls)
        n = batch["input_ids"].size(0)
        with torch.no_grad():
            k = self.momentum_encoder(**{key: batch[key] for key in keys}, return_dict=True).last_hidden_state[:, 0]
            if self.momentum_mlp is not None:
                k = self.momentum_mlp(k)
            elif self.mlp is not None and self.args.momentum_head == "online":
                k = self.mlp(k)
        return Encoded(batch={"z1": cls[:n], "z2": cls[n:], "k": k.float()})  # (n, d) each

    def batch_terms(self, emb, batch):
        """Eq. 3 against the queue as the step began (its filled rows: ``queue_len``, read on the
        device); this micro-batch's keys (every rank's) stashed for ``after_step``."""
        loss = queue_info_nce(emb["z1"], emb["z2"], self.queue, self.args.temperature, filled=self.queue_len)
        self.stash("keys", emb["k"].float())
        return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    # ------------------------------------------------------------------ the state, once per step
    def before_epoch(self, epoch: int) -> None:
        """``queue_reset: epoch``: the queue emptied before each epoch's first step (in place: a graphed
        step reads these buffers); never: nothing (the queue of epoch e − 1 serves epoch e)."""
        if self.args.queue_reset == "epoch":
            self.queue.zero_()
            self.queue_len.zero_()

    def after_step(self, step: int) -> None:
        """Eq. 2 on the updated encoder, then the step's keys into the queue (micro-batch order, newest first)."""
        self.momentum_update()
        keys = self.take_stash("keys")
        if keys:
            self.enqueue(torch.cat(keys[::-1], 0))  # the last micro-batch's first

    @torch.no_grad()
    def momentum_update(self) -> None:
        """Eq. 2: θ_m ← λ·θ_m + (1 − λ)·θ_e for the encoder and the MLP (``ema_``: one fused update)."""
        ema_(self.momentum_encoder, self.encoder, self.args.momentum)
        if self.momentum_mlp is not None:
            ema_(self.momentum_mlp, self.mlp, self.args.momentum)

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """``keys`` (k, d) to the front of the queue; beyond M the oldest leave. In place and without
        a host sync: the whole queue shifts (rows past ``queue_len`` are masked out of Eq. 3), and
        ``queue_len`` grows on the device."""
        size = self.queue.size(0)
        if size:
            self.queue.copy_(torch.cat([keys.to(self.queue.dtype), self.queue], 0)[:size])
            self.queue_len.add_(keys.size(0)).clamp_(max=size)

def _reinit_(model: torch.nn.Module, std: float) -> None:
    """BERT's initialisation as transformers 4.2.1's ``BertPreTrainedModel._init_weights`` draws it over
    every module of ``model``: Linear and Embedding weights N(0, std) (the padding row too), Linear
    biases 0, LayerNorm 1/0."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                m.weight.normal_(0.0, std)
                if isinstance(m, torch.nn.Linear) and m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, torch.nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()


__all__ = ["ESimCSE", "queue_info_nce", "word_repetition"]

