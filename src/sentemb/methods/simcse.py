"""Unsupervised SimCSE (Gao et al., 2021; the method spec §0).

Each sentence is encoded twice in one forward pass of 2B sequences; the two dropout masks are the
only augmentation. With z1, z2 the two views' [CLS] vectors passed through a freshly initialised
MLP (training only), the loss is InfoNCE (Gao et al. 2021, Eq. 1):

    ℓ_i = −log  exp(cos(z1_i, z2_i)/τ) / Σ_j exp(cos(z1_i, z2_j)/τ),   τ = 0.05,

i.e. cross-entropy of the B×B logit matrix S_ij = cos(z1_i, z2_j)/τ against arange(B), one
direction. Logits and loss are computed in fp32 even under bf16 autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataclasses import dataclass

from ..model.backbone import MLPHead
from .base import WEIGHTED, Encoded, Method, arg
from .registry import register_method


def info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """InfoNCE over in-batch negatives, Eq. 1 of Gao et al. (2021); fp32 regardless of autocast."""
    with torch.autocast(device_type=z1.device.type, enabled=False):
        z1, z2 = z1.float(), z2.float()
        sim = F.normalize(z1, dim=-1) @ F.normalize(z2, dim=-1).T / temperature
        return F.cross_entropy(sim, torch.arange(z1.size(0), device=z1.device))


@register_method
class SimCSE(Method):
    name = "simcse"

    @dataclass
    class Args:
        temperature: float = arg(0.05, "τ of InfoNCE (Eq. 1)", exclusive_minimum=0)
        mlp: str = arg("train_only", "Linear+Tanh head on [CLS]: in training only (unsup. SimCSE), "
                       "kept at test time, or none", choices=("train_only", "always", "none"))

    eval_pooler = "cls_before_pooler"
    fusable = True  # rows encoded independently, InfoNCE per micro-batch, no per-sentence term (Method.fusable)

    @classmethod
    def pooler_for(cls, args):
        # With the MLP kept at test time ("always"), the exported pooler slot holds it: pooler "cls".
        return "cls" if args.mlp == "always" else "cls_before_pooler"

    def __init__(self, encoder, tokenizer, args, ctx):
        super().__init__(encoder, tokenizer, args, ctx)
        hidden = encoder.config.hidden_size
        self.mlp = MLPHead(hidden, getattr(encoder.config, "initializer_range", 0.02)) if self.args.mlp != "none" else None

    def build_batch(self, sentences, step=0, *, lines=None, micro=0):
        return self.tokenize(sentences, lines)

    def encode_views(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Both dropout views in one forward pass: rows [x_1..x_B, x_1..x_B]; returns MLP(CLS) per view."""
        doubled = {k: torch.cat([v, v], 0) for k, v in batch.items()}
        cls = self.encoder(**doubled, return_dict=True).last_hidden_state[:, 0]
        if self.mlp is not None:
            cls = self.mlp(cls)
        b = batch["input_ids"].size(0)
        return cls[:b], cls[b:]

    def encode(self, batch) -> Encoded:
        z1, z2 = self.encode_views(batch)
        return Encoded(batch={"z1": z1, "z2": z2})

    def batch_terms(self, emb, batch):
        loss = info_nce(emb["z1"], emb["z2"], self.args.temperature)
        return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}

    def export_head(self):
        return self.mlp
