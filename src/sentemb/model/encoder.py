"""The sentence encoder: a Hugging Face encoder + a pooler (+ an optional head), as one fast function
from sentences to embeddings (``EmbedFn``). STS and transfer evaluation, the training loop's STS-B dev
score and every method's ``embedder`` encode through it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import SentembError

EmbedFn = Callable[[Sequence[str]], np.ndarray]


class Embedder:
    """Encode sentences with a Hugging Face encoder and a pooler, fast.

    Unique sentences are encoded once, in batches of similar length (sorted by token count), under
    ``torch.inference_mode``, in fp32 as SentEval and the papers encode (``precision="bf16"``, or
    ``"auto"`` = bf16 on CUDA only, when asked for); results come back in input order as float32.

    ``cls_before_pooler`` on the CPU in fp32 (the evaluation pooler of every built-in method but
    SARCSE, which pools through its TextCNN: ``method``; the demo's case) runs
    the last Transformer layer for the [CLS] position only (``ClsLastLayer``): its output is all the
    pooler reads, and the other positions' queries and feed-forward in that layer are ~10% of the
    encoding's compute. The vectors equal the full forward's up to float rounding (~1e-6);
    ``cls_fast_path=False`` runs the full forward.
    """

    KEPT_PLANS = 4  # with keep_plan: how many sentence lists' batches are kept

    def __init__(self, model, tokenizer, pooler: str, *, batch_size: int = 128, max_length: int | None = None,
                 device=None, progress: bool = False, precision: str = "fp32", head=None, keep_plan: bool = False,
                 cls_fast_path: bool = True):
        import torch

        from .backbone import POOLERS, max_length_of

        if pooler not in POOLERS:
            raise SentembError(f"unknown pooler '{pooler}' (choose from {', '.join(POOLERS)})")
        self.model, self.tokenizer, self.pooler = model, tokenizer, pooler
        self.head = head  # optional module applied after pooling (a method's current head, e.g. SimCSE's MLP)
        self.batch_size = batch_size
        self.max_length = max_length or max_length_of(model, tokenizer)
        self.device = device if device is not None else next(model.parameters()).device
        self.progress = progress
        if precision not in ("auto", "bf16", "fp32"):
            raise SentembError(f"precision must be auto, bf16 or fp32, not '{precision}'")
        self.precision = precision
        self._torch = torch
        # keep_plan: the tokenized, length-sorted, padded batches of the last few sentence lists are
        # kept and reused when the same sentences come again (the loop's STS-B dev set: its first and
        # its second sentences, every eval_steps)
        self.keep_plan = keep_plan
        # keyed by (max_length, batch_size, sentences): a plan cut or batched otherwise is not reused
        self._plans: dict[tuple, list] = {}
        self._cls_last = ClsLastLayer.of(model) if cls_fast_path and pooler == "cls_before_pooler" else None

    @classmethod
    def from_dir(cls, model_dir: str | Path, pooler: str, *, device="auto", **kw) -> "Embedder":
        from .backbone import load_encoder
        from ..utils import resolve_device

        dev = resolve_device(device)
        model, tok = load_encoder(model_dir, device=dev)
        model.eval()
        return cls(model, tok, pooler, device=dev, **kw)

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        torch = self._torch
        from .backbone import needs_hidden_states, pool

        uniq = list(dict.fromkeys(sentences))
        key = (self.max_length, self.batch_size, tuple(uniq))
        plan = self._plans.get(key)
        if plan is None:
            plan = self.plan(uniq)
            if self.keep_plan:
                if len(self._plans) >= self.KEPT_PLANS:
                    self._plans.pop(next(iter(self._plans)))  # the oldest
                self._plans[key] = plan
        out: np.ndarray | None = None  # width from the first batch (a head may change it)
        was_training = self.model.training
        head_training = self.head is not None and self.head.training
        self.model.eval()
        if self.head is not None:
            self.head.eval()
        # "fp32" (default): the papers' and SentEval's test-time encoding; "bf16": autocast on any
        # device; "auto": bf16 on CUDA, fp32 elsewhere (faster, not the published protocol).
        use_bf16 = self.precision == "bf16" or (
            self.precision == "auto" and self.device.type == "cuda" and torch.cuda.is_bf16_supported())
        it = plan
        if self.progress:
            from tqdm import tqdm

            it = tqdm(plan, desc="encode", unit="batch", file=sys.stderr, mininterval=1 if sys.stderr.isatty() else 30)
        hs = needs_hidden_states(self.pooler)
        # fp32 on the CPU only: the GPU paths (bf16, CUDA graphs, compiled steps) stay as they were
        cls_last = self._cls_last if (self.device.type == "cpu" and not use_bf16) else None
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            for idx, batch in it:
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                if cls_last is not None:
                    vec = cls_last(batch)
                else:
                    outputs = self.model(**batch, output_hidden_states=hs, return_dict=True)
                    vec = pool(self.pooler, outputs, batch["attention_mask"])
                if self.head is not None:
                    vec = self.head(vec)
                if out is None:
                    out = np.empty((len(uniq), vec.shape[-1]), dtype=np.float32)
                out[idx] = vec.float().cpu().numpy()
        if was_training:
            self.model.train()
        if head_training:
            self.head.train()
        if out is None:
            out = np.empty((0, self.model.config.hidden_size), dtype=np.float32)
        pos = {s: i for i, s in enumerate(uniq)}
        return out[[pos[s] for s in sentences]]

    def plan(self, uniq: Sequence[str]) -> list[tuple[list[int], dict]]:
        """Tokenize once, sort by length (longest first), and pad each batch to its own longest
        sentence: [(positions in ``uniq``, CPU tensors)], pinned on CUDA for asynchronous copies."""
        enc = self.tokenizer(list(uniq), truncation=True, max_length=self.max_length, add_special_tokens=True)
        ids = enc["input_ids"]
        order = sorted(range(len(uniq)), key=lambda i: len(ids[i]), reverse=True)
        plan = []
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = self.tokenizer.pad({k: [enc[k][i] for i in idx] for k in enc.keys()}, return_tensors="pt")
            if self.device.type == "cuda":
                batch = {k: v.pin_memory() for k, v in batch.items()}
            plan.append((idx, dict(batch)))
        return plan


class _LastLayerInput(Exception):
    """Raised by ``ClsLastLayer``'s hook with the last layer's input: the forward stops there."""

    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden


class ClsLastLayer:
    """The raw last-layer [CLS] vector of a BERT/RoBERTa encoder (pooler ``cls_before_pooler``) with
    the last layer computed for [CLS] only: keys and values of every position, the query, attention
    output and feed-forward of position 0. The encoder runs as usual up to its last layer (a
    forward pre-hook takes that layer's input and stops the forward); the last layer is its own
    modules applied in the order of transformers' ``BertLayer`` (identical for RoBERTa).

    ``ClsLastLayer.of(model)`` is None for any other model (another architecture, a decoder,
    relative position attention, a wrapped module): those run the full forward."""

    TYPES = ("bert", "roberta")

    def __init__(self, model, layer):
        self.model, self.layer = model, layer

    @classmethod
    def of(cls, model) -> "ClsLastLayer | None":
        cfg = getattr(model, "config", None)
        layers = getattr(getattr(model, "encoder", None), "layer", None)
        if cfg is None or getattr(cfg, "model_type", None) not in cls.TYPES or getattr(cfg, "is_decoder", False):
            return None
        if getattr(cfg, "position_embedding_type", "absolute") not in (None, "absolute") or not layers:
            return None
        last = layers[-1]
        att = getattr(last, "attention", None)
        sa = getattr(att, "self", None)
        parts = (getattr(sa, "query", None), getattr(sa, "key", None), getattr(sa, "value", None),
                 getattr(att, "output", None), getattr(last, "intermediate", None), getattr(last, "output", None))
        if any(p is None for p in parts) or getattr(last, "crossattention", None) is not None:
            return None
        if cfg.hidden_size % cfg.num_attention_heads:
            return None
        return cls(model, last)

    def _stop(self, module, args, kwargs):
        raise _LastLayerInput(args[0] if args else kwargs["hidden_states"])

    def __call__(self, batch: dict):
        import torch
        import torch.nn.functional as F

        handle = self.layer.register_forward_pre_hook(self._stop, with_kwargs=True)
        try:
            self.model(**batch, return_dict=True)
            raise SentembError("ClsLastLayer: the encoder's forward never reached its last layer")
        except _LastLayerInput as stop:
            h = stop.hidden
        finally:
            handle.remove()
        cfg, last = self.model.config, self.layer
        sa = last.attention.self
        n, length, width = h.shape
        heads = cfg.num_attention_heads
        dim = width // heads
        h0 = h[:, :1]
        q = sa.query(h0).view(n, 1, heads, dim).transpose(1, 2)
        k = sa.key(h).view(n, length, heads, dim).transpose(1, 2)
        v = sa.value(h).view(n, length, heads, dim).transpose(1, 2)
        mask = batch["attention_mask"][:, None, None, :].to(dtype=torch.bool)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=dim ** -0.5)
        ctx = ctx.transpose(1, 2).reshape(n, 1, width)
        a = last.attention.output(ctx, h0)  # dense, dropout (eval: none), LayerNorm(+ [CLS] input)
        return last.output(last.intermediate(a), a)[:, 0]
