"""The interface between the shared training loop and a method.

The loop owns data order, optimisation, precision, evaluation, checkpoints and tracking. A method
owns only (1) how a list of corpus sentences becomes model inputs (``build_batch``, run on CPU)
and (2) the named loss terms computed from those inputs (``losses``). Extra trainable modules
(heads, decoders) are submodules of the method, so the loop optimises them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn


@dataclass
class MethodContext:
    """What a method may read besides its own arguments."""

    max_len: int
    seed: int
    stats_dir: Path | None = None  # results/stats/<corpus>/ (token frequencies, TF-IDF, phrases, ...)
    extra: dict[str, Any] = field(default_factory=dict)


class Method(nn.Module):
    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}
    #: pooler used to evaluate the exported encoder (sentemb evaluate --pooler)
    eval_pooler: ClassVar[str] = "cls_before_pooler"
    #: corpus statistics the method reads from ``ctx.stats_dir`` (names of stats-stage outputs,
    #: e.g. "token_freq", "tfidf", "rake", "paraphrases"); the workflow makes training depend on them
    requires_stats: ClassVar[tuple[str, ...]] = ()

    def __init__(self, encoder: nn.Module, tokenizer, args: dict[str, Any], ctx: MethodContext):
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.args = {**self.defaults, **args}
        self.ctx = ctx

    @classmethod
    def pooler_for(cls, args: dict[str, Any]) -> str:
        """The evaluation pooler of a model trained with ``args`` (known before training)."""
        return cls.eval_pooler

    def build_batch(self, sentences: list[str], step: int = 0) -> dict[str, torch.Tensor]:
        """Turn corpus sentences into CPU tensors (dynamic padding, truncation to ``ctx.max_len``).

        ``step`` is the number of optimizer steps done so far (for schedules such as UNA's "every
        α batches"); it is restored on resume, so batches are the same after a restart."""
        raise NotImplementedError

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named loss terms; ``"loss"`` is the total that is back-propagated."""
        raise NotImplementedError

    def export_head(self) -> nn.Module | None:
        """A Linear+Tanh head to store in the encoder's pooler slot on export (or None)."""
        return None

    def embedder(self, pooler: str, device: torch.device):
        """What the loop's STS-B dev evaluation encodes sentences with (a callable list[str] ->
        array). Default: the encoder + ``pooler``; a method whose sentence embedding is not a pooled
        encoder output (e.g. SARCSE's TextCNN code) overrides this and ``export``."""
        from ..evaluate import Embedder

        # fp32 even on CUDA: model selection should not hinge on bf16 rounding (3,000 sentences: cheap).
        return Embedder(self.encoder, self.tokenizer, pooler, batch_size=128, device=device, precision="fp32")

    def export(self, out_dir: Path, pooler: str, meta: dict[str, Any]) -> None:
        """Write the trained sentence encoder to ``out_dir`` (HF + sentence-transformers layout)."""
        from ..models import export, max_length_of

        export(self.encoder, self.tokenizer, out_dir, pooler=pooler, head=self.export_head(),
               max_seq_length=max_length_of(self.encoder, self.tokenizer), meta=meta)
