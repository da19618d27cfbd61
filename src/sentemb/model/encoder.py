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
    """

    KEPT_PLANS = 4  # with keep_plan: how many sentence lists' batches are kept

    def __init__(self, model, tokenizer, pooler: str, *, batch_size: int = 128, max_length: int | None = None,
                 device=None, progress: bool = False, precision: str = "fp32", head=None, keep_plan: bool = False):
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
        self._plans: dict[tuple[str, ...], list] = {}

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
        key = tuple(uniq)
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
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
            for idx, batch in it:
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
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
