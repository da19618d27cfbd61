"""Per-term gradient norms of a multi-loss method (``train.log_grad_norms``, issue 18 §4).

On every logged optimizer step the loop logs, for each weighted loss term t of the method
(``Method.losses``'s ``WEIGHTED`` dict, named as the method logs the term; ``loss`` when a method
names none), the L2 norm of the gradient the term contributes to that step,

    ‖g_t‖₂,  g_t = ∇_θ Σ_m t_m / accum   over the step's micro-batches m,
    θ = ``method.grad_norm_parameters()`` (the encoder's trainable parameters by default),

as ``train/grad_norm/<name>`` (MLflow, and the step's record in ``train.json``'s history). Ratios of
these answer "does term t move the encoder at all?" (SARCSE's β·L_R against L_I, for instance).

How, without touching training: before a micro-batch's own backward, ``torch.autograd.grad`` of each
term with ``retain_graph=True`` — it returns new tensors and never writes ``.grad``, draws no random
numbers, and the loop's backward then runs on the same graph: the weights are bit-identical with the
option on or off (tested; under ``train.compile`` see below). A method with one term needs no extra backward at all: its gradient is
the step's gradient, read from ``.grad`` after the step's last backward. With ``grad_accum > 1``
each term's gradient is summed over the micro-batches (one copy of θ's gradient per term, held
until the step's last micro-batch); with ``grad_accum: 1`` only the norms are kept. Under SAM the
norms are those of the first gradient (at w, the pass whose loss terms are logged). With the fp16
gradient scaler the scaled gradient is differentiated and its norm divided by the scale. Under
``train.compile`` a logged step runs eagerly (``MicroBatches.gradients``, both of SAM's passes): the per-term
``autograd.grad`` with ``retain_graph`` on a compiled graph, then the step's backward on it, gave a
wrong ``.grad`` (torch 2.13, CPU); the run's weights then equal the eager run's to fp32 rounding.

Cost: one partial backward (down to θ) per term on logged steps only, nothing on other steps. Measured
(``sentemb benchmark --grad-norms``, all-MiniLM-L6-v2, batch 64, max_len 32, CPU, 2 threads, every
step logged): simcse 4.81 s/step off, 4.65 on (one term: no extra backward, the difference is
noise); sarcse (3 terms) 11.57 s off, 24.01 on: +12.4 s = +108% per logged step, +11% of training
time at ``log_steps: 10``.
"""

from __future__ import annotations

from typing import Sequence

import torch


def _norm(grads: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """‖(g_1, …, g_k)‖₂ over the non-None tensors, fp32 on ``device`` (0 when there is none)."""
    norms = [g.detach().float().norm(2) for g in grads if g is not None]
    if not norms:
        return torch.zeros((), device=device)
    return torch.linalg.vector_norm(torch.stack(norms), 2)


class TermGradNorms:
    """Collects one optimizer step's per-term gradient norms: ``add`` each micro-batch's weighted
    terms before its backward, ``norms`` after the step's last backward (before clipping)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], accum: int, scaler: "torch.amp.GradScaler",
                 parts: bool = False):
        """``parts``: the caller hands in each term's gradient in parts (``add_grads``; gradient
        caching sums a term's gradient over chunks), so nothing is read from ``.grad``."""
        self.params = list(params)
        self.parts = parts
        self.accum, self.scaler = accum, scaler
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.sums: dict[str, list[torch.Tensor | None]] = {}  # grad_accum > 1: Σ_m g_t,m per parameter
        self.done: dict[str, torch.Tensor] = {}  # grad_accum 1: the norms themselves
        self.single: str | None = None  # a one-term method: read from .grad after the step

    def add(self, weighted: dict[str, torch.Tensor]) -> None:
        if len(weighted) == 1 and not (self.done or self.sums or self.parts):
            self.single = next(iter(weighted))
            return
        for name, term in weighted.items():
            grads: Sequence[torch.Tensor | None] = [None] * len(self.params)
            if term.requires_grad and self.params:  # a term without a graph (0 on this batch) has no gradient
                grads = torch.autograd.grad(self.scaler.scale(term / self.accum), self.params, retain_graph=True,
                                            allow_unused=True)
            if self.accum == 1 and not self.parts:
                self.done[name] = _norm(grads, self.device)
                continue
            acc = self.sums.setdefault(name, [None] * len(self.params))
            for i, g in enumerate(grads):
                if g is not None:
                    acc[i] = g if acc[i] is None else acc[i] + g

    def add_grads(self, name: str, grads: Sequence[torch.Tensor | None]) -> None:
        """Add one part of term ``name``'s (scaled, 1/accum-weighted) gradient on ``params``."""
        acc = self.sums.setdefault(name, [None] * len(self.params))
        for i, g in enumerate(grads):
            if g is not None:
                acc[i] = g if acc[i] is None else acc[i] + g

    def norms(self) -> dict[str, torch.Tensor]:
        """{name: ‖g_name‖₂} as device scalars (no host sync here)."""
        if self.single is not None:
            out = {self.single: _norm([p.grad for p in self.params], self.device)}
        else:
            out = {**self.done, **{name: _norm(gs, self.device) for name, gs in self.sums.items()}}
        if self.scaler.is_enabled():
            scale = self.scaler.get_scale()
            out = {k: v / scale for k, v in out.items()}
        return out
