"""Debiased SimCSE: SimCSE's two dropout views with the debiased contrastive loss (Chuang et al. 2020).

A method written only against sentemb's public API, in a file of its own (a plug-in: config key
``method_modules``).

Chuang, Robinson, Lin, Torralba, Jegelka (2020), "Debiased Contrastive Learning", NeurIPS, Eq. (6)
with M = 1 positive: in-batch "negatives" of an unsupervised contrastive loss are drawn from the
data, so with class prior τ⁺ a share τ⁺ of them are in fact positives. The debiased loss corrects
the negatives' term by the positive's:

    ℓ_i = −log  e^{s_ii} / (e^{s_ii} + N·g_i),
    g_i = max( (1/(1 − τ⁺)) · ( (1/N) Σ_{j≠i} e^{s_ij} − τ⁺·e^{s_ii} ),  e^{−1/t} ),

with s_ij = cos(z1_i, z2_j)/t (SimCSE's two dropout views, temperature t), N = B − 1 negatives per
row, and e^{−1/t} the smallest value e^{s} can take (cos ≥ −1), which keeps g positive. With
τ⁺ = 0 it is SimCSE's InfoNCE (Gao et al. 2021, Eq. 1) exactly: N·g_i = Σ_{j≠i} e^{s_ij}.

Use it from a config next to SimCSE::

    method_modules: [examples/methods/debiased.py]
    runs:
      - {method: simcse, backbone: bert-base-uncased}
      - {method: debiased-simcse, backbone: bert-base-uncased, method_args: {tau_plus: 0.1}}

Open choice (the paper leaves it to the estimator): the positive's logit in the correction is the
same s_ii as in the numerator (Chuang et al.'s code does the same with M = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sentemb.methods import WEIGHTED, arg, register_method
from sentemb.methods.simcse import SimCSE


def debiased_info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float, tau_plus: float) -> torch.Tensor:
    """Mean over rows of ℓ_i above (Chuang et al. 2020, Eq. 6, M = 1); fp32 regardless of autocast."""
    with torch.autocast(device_type=z1.device.type, enabled=False):
        z1 = torch.nn.functional.normalize(z1.float(), dim=-1)
        z2 = torch.nn.functional.normalize(z2.float(), dim=-1)
        s = z1 @ z2.T / temperature  # (B, B)
        b = s.size(0)
        # shift by the row maximum for stability; every term below carries the same factor e^{-c}
        c = s.max(dim=1, keepdim=True).values.detach()
        e = torch.exp(s - c)
        pos = e.diagonal()
        off = ~torch.eye(b, dtype=torch.bool, device=s.device)
        n = b - 1
        neg_mean = (e * off).sum(dim=1) / n
        floor = torch.exp(torch.full_like(pos, -1.0 / temperature) - c.squeeze(1))
        g = torch.maximum((neg_mean - tau_plus * pos) / (1.0 - tau_plus), floor)
        return torch.log1p(n * g / pos).mean()  # = −log(pos / (pos + N·g)), without the cancellation


@register_method
class DebiasedSimCSE(SimCSE):
    """SimCSE's encoding (two dropout views, MLP in training) with the debiased loss."""

    name = "debiased-simcse"

    @dataclass
    class Args(SimCSE.Args):
        tau_plus: float = arg(0.1, "τ⁺, the class prior: the expected share of false negatives in a batch "
                              "(Chuang et al. 2020, Eq. 6; 0 = SimCSE's InfoNCE)", minimum=0, exclusive_maximum=1)

    def batch_terms(self, emb, batch):
        loss = debiased_info_nce(emb["z1"], emb["z2"], self.args.temperature, self.args.tau_plus)
        return {"contrastive": loss.detach(), WEIGHTED: {"contrastive": loss}}


__all__ = ["DebiasedSimCSE", "debiased_info_nce"]
