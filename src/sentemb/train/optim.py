"""The AdamW of ``transformers`` 4.2.1 (``train.optimizer: adamw_hf``): what the HF Trainer of the
SimCSE family's code (SimCSE, PaSeR, InfoCSE: transformers 4.2.1) steps with.

Loshchilov & Hutter's AdamW as ``transformers.optimization.AdamW`` (4.2.1) computes it, which
differs from ``torch.optim.AdamW`` in two places:

* ε is added to √v *before* the bias correction: the update is
  lr · (√(1−β₂ᵗ)/(1−β₁ᵗ)) · m / (√v + ε), i.e. torch's m̂/(√v̂ + ε′) with ε′ = ε/√(1−β₂ᵗ): 3.2e-7 at
  step 1 for ε = 1e-8, 1.0e-8 after a few thousand steps. It matters only where √v̂ is that small (a
  rarely seen token's embedding row).
* Weight decay is applied after the Adam update, p ← p − lr·wd·p on the updated p (torch decays
  first). The SimCSE-family scripts train with weight decay 0, where both agree.

Each parameter keeps its own step count. The Trainer 4.2.1 zeroes gradients (``model.zero_grad()``
on torch 1.x: a zero tensor, not None), so a parameter that had a gradient before and gets none on a
step still steps, on a zero gradient (its moments decay, its momentum moves it); one that never had
a gradient is skipped. This loop sets gradients to None, and the step reads a missing gradient of a
parameter with state as zeros. Two edge cases still differ, both for a parameter left unused on a
step: after a first step the GradScaler skipped (the Trainer's zeroed gradient exists, the state
here does not), and on the first step after a resume (the Trainer's gradients are None again). The step runs with ``torch._foreach_*`` ops over the parameters that
share a step count; no fused or capturable kernel, so ``train.update`` must be ``separate``.
"""

from __future__ import annotations

import math

import torch


class HFAdamW(torch.optim.Optimizer):
    """``transformers.optimization.AdamW`` (4.2.1) with ``correct_bias=True`` (see the module docstring)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"HFAdamW: invalid lr {lr}, betas {betas} or eps {eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = float(group["lr"])
            by_step: dict[int, tuple[list, list, list, list]] = {}
            for p in group["params"]:
                state = self.state[p]
                if p.grad is None and not state:  # never had a gradient: the Trainer's zero_grad leaves None
                    continue
                grad = p.grad if p.grad is not None else torch.zeros_like(p)  # zero_grad(): zeros, not None
                if grad.is_sparse:
                    raise RuntimeError("HFAdamW does not support sparse gradients")
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                ps, gs, ms, vs = by_step.setdefault(int(state["step"]), ([], [], [], []))
                ps.append(p)
                gs.append(grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            for t, (ps, gs, ms, vs) in by_step.items():
                torch._foreach_mul_(ms, beta1)
                torch._foreach_add_(ms, gs, alpha=1.0 - beta1)
                torch._foreach_mul_(vs, beta2)
                torch._foreach_addcmul_(vs, gs, gs, value=1.0 - beta2)
                denom = torch._foreach_sqrt(vs)
                torch._foreach_add_(denom, group["eps"])
                step_size = lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
                torch._foreach_addcdiv_(ps, ms, denom, value=-step_size)
                if group["weight_decay"] > 0.0:  # after the update, on the updated p (transformers 4.2.1)
                    torch._foreach_add_(ps, ps, alpha=-lr * group["weight_decay"])
        return loss
