"""Sharpness-Aware Minimization (Foret et al., ICLR 2021), the arithmetic the training loop calls.

SAM minimises max_{‖ε‖₂ ≤ ρ} L(w + ε). With the first-order solution of the inner problem
(Foret et al. 2021, Eq. 2, p = 2)

    ε̂(w) = ρ · ∇L(w) / ‖∇L(w)‖₂,

the update uses the gradient taken at the perturbed weights (Eq. 3):

    g_SAM = ∇L(w)|_{w + ε̂(w)},    then the base optimizer (AdamW here) steps from w with g_SAM.

``ascend`` applies w ← w + ε̂ in place (keeping an exact copy of w), ``restore`` copies w back
bit-exactly (subtracting ε̂ again would not be exact in floating point). The loop
(``sentemb.train.step.SAM``) recomputes the gradient between the two on the same micro-batches
with the same dropout masks. ‖∇L‖ is the global L2 norm over every parameter that has a gradient,
as in Foret et al.'s code; 1e-12 guards a zero gradient (then ε̂ = 0 and the step is plain AdamW).
"""

from __future__ import annotations

from typing import Iterable

import torch

EPS = 1e-12


def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """‖∇L‖₂ over all parameters with a gradient (fp32 scalar)."""
    norms = [p.grad.detach().float().norm(2) for p in params if p.grad is not None]
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms), 2)


@torch.no_grad()
def ascend(params: Iterable[torch.nn.Parameter], rho: float) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """w ← w + ρ·g/‖g‖ for every parameter with a gradient g (Eq. 2); returns (parameter, saved w)."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return []
    scale = rho / (grad_norm(params) + EPS)  # one device scalar: no host sync
    saved = []
    for p in params:
        saved.append((p, p.detach().clone()))
        p.add_(p.grad * scale.to(device=p.device, dtype=p.dtype))
    return saved


@torch.no_grad()
def restore(saved: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """Put back the weights ``ascend`` saved (exact copy, not w + ε − ε)."""
    for p, w in saved:
        p.copy_(w)
