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

Each of the three is a handful of multi-tensor (``torch._foreach_*``) ops over all the parameters,
not a few eager ops per parameter tensor: for BERT-base's 199 tensors, 10 dispatched ops a SAM
step (ascend into the previous step's copies, then restore) instead of 1,398, counted on the CPU
(``tests/test_arccse.py`` checks that the count does not grow with the tensors). That is host time an
eager GPU step pays, and a graphed one pays between its replays (unmeasured on a GPU). The
arithmetic is the same per element; ‖g‖ may differ in its last bits, the multi-tensor norm summing
in another order. The scaled gradient is one multi-tensor temporary, a gradient's size, made after
the backward, when the activations are gone.
"""

from __future__ import annotations

from typing import Iterable

import torch

EPS = 1e-12


def _by_device_dtype(tensors: Iterable[torch.Tensor]) -> dict[tuple, list[torch.Tensor]]:
    """``tensors`` grouped by (device, dtype), in order: the groups a multi-tensor op takes."""
    groups: dict[tuple, list] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


@torch.no_grad()
def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """‖∇L‖₂ over all parameters with a gradient (fp32 scalar): the L2 norm of the per-tensor norms,
    those in one multi-tensor ``torch._foreach_norm`` per device and dtype (fp32; other dtypes are
    converted first)."""
    groups = _by_device_dtype(p.grad for p in params if p.grad is not None)
    if not groups:
        return torch.zeros(())
    device = next(iter(groups))[0]
    norms = []
    for (_, dtype), gs in groups.items():
        norms += [n.to(device) for n in torch._foreach_norm(gs if dtype == torch.float32 else [g.float() for g in gs], 2)]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


@torch.no_grad()
def ascend(params: Iterable[torch.nn.Parameter], rho: float,
           into: list[torch.Tensor] | None = None) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """w ← w + ρ·g/‖g‖ for every parameter with a gradient g (Eq. 2); returns (parameter, saved w).
    ``into``: tensors shaped as those parameters to save w in (the same ones every step, e.g. the
    previous step's saved tensors), instead of new ones."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return []
    scale = rho / (grad_norm(params) + EPS)  # one device scalar: no host sync
    if into is None or len(into) != len(params) or any(
            w.shape != p.shape or w.dtype != p.dtype or w.device != p.device for w, p in zip(into, params)):
        into = [torch.empty_like(p) for p in params]
    torch._foreach_copy_(into, params)
    for (device, dtype), ps in _by_device_dtype(params).items():
        torch._foreach_add_(ps, torch._foreach_mul([p.grad for p in ps], scale.to(device=device, dtype=dtype)))
    return list(zip(params, into))


@torch.no_grad()
def restore(saved: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """Put back the weights ``ascend`` saved (exact copy, not w + ε − ε)."""
    if saved:
        torch._foreach_copy_([p for p, _ in saved], [w for _, w in saved])
