#!/usr/bin/env python
"""Time one mini-batch step of SentEval's PyTorch classifier (nhid 0, Adam, batch 64) three ways and
print a table: µs per step by feature width.

* ``senteval``: SentEval's ``trainepoch`` step as its code runs it: ``X[idx]`` gathered per
  mini-batch, ``nn.Sequential(nn.Linear)``, ``nn.CrossEntropyLoss``, ``zero_grad``, ``backward``,
  ``torch.optim.Adam.step``;
* ``autograd``: sentemb's loop before the direct gradients: one gather per pass, ``F.linear`` /
  ``F.cross_entropy``, ``backward``, ``torch.optim.Adam.step``;
* ``sentemb``: ``LinearProbe``'s step now (``_probe_gradients`` and ``_AdamUpdate`` under
  ``no_grad``), the same floats as the two above (tests/test_transfer.py).

One torch thread, as the classifier runs. The last lines fit ``a + b·d`` µs to the ``sentemb`` column
(``sentemb.evaluate.transfer.STEP_US``, the plan's per-width scaling of the classifier's cost)::

    .venv/bin/python scripts/bench_classifier.py                     # d = 384 ... 4096, 2 classes
    .venv/bin/python scripts/bench_classifier.py --dims 384 768 --classes 6 --steps 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _time(step, n: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean µs of ``n`` calls of ``step(i)``."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(n):
            step(i)
        out.append((time.perf_counter() - t) / n * 1e6)
    return float(np.median(out))


def bench(d: int, classes: int, steps: int, rounds: int, rows: int = 4096, bs: int = 64) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from sentemb.evaluate.transfer import _AdamUpdate, _probe_gradients

    g = torch.Generator().manual_seed(d)
    X, y = torch.randn(rows, d, generator=g), torch.randint(0, classes, (rows,), generator=g)
    perm = torch.randperm(rows, generator=g)
    Xp, yp = X.index_select(0, perm), y.index_select(0, perm)
    starts = list(range(0, rows - bs + 1, bs))

    model = torch.nn.Sequential(torch.nn.Linear(d, classes))
    loss_fn, opt = torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), weight_decay=1e-4)

    def senteval(i):
        idx = perm[starts[i % len(starts)]:starts[i % len(starts)] + bs]
        loss = loss_fn(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()

    lin = torch.nn.Linear(d, classes)
    W, b = lin.weight, lin.bias
    opt2 = torch.optim.Adam(lin.parameters(), weight_decay=1e-4)

    def autograd(i):
        s = starts[i % len(starts)]
        loss = F.cross_entropy(F.linear(Xp[s:s + bs], W, b), yp[s:s + bs])
        W.grad = b.grad = None
        loss.backward()
        opt2.step()

    lin3 = torch.nn.Linear(d, classes)
    adam = _AdamUpdate(torch.optim.Adam(lin3.parameters(), weight_decay=1e-4))

    def sentemb(i):
        s = starts[i % len(starts)]
        with torch.no_grad():
            adam.step(_probe_gradients(Xp[s:s + bs], yp[s:s + bs], lin3.weight, lin3.bias))

    return {name: _time(fn, steps, rounds) for name, fn in
            (("senteval", senteval), ("autograd", autograd), ("sentemb", sentemb))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[384, 768, 1024, 1536, 3072, 4096],
                    help="feature widths (default: %(default)s)")
    ap.add_argument("--classes", type=int, default=2, help="classes (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=1000, help="steps per round (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell; the median is shown (default: %(default)s)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    print(f"SentEval's PyTorch classifier step, batch 64, {args.classes} classes, one torch thread "
          f"(torch {torch.__version__}); µs per step, median of {args.rounds} x {args.steps} steps\n")
    print("| d | senteval | autograd (sentemb before) | sentemb | senteval / sentemb |")
    print("|---|---|---|---|---|")
    ours = []
    for d in args.dims:
        r = bench(d, args.classes, args.steps, args.rounds)
        ours.append(r["sentemb"])
        print(f"| {d} | {r['senteval']:.0f} | {r['autograd']:.0f} | {r['sentemb']:.0f} | "
              f"{r['senteval'] / r['sentemb']:.2f}x |", flush=True)
    if len(args.dims) > 1:
        b, a = np.polyfit(np.asarray(args.dims, float), np.asarray(ours), 1)
        print(f"\nsentemb ≈ {a:.0f} + {b:.3f}·d µs per step (STEP_US = ({a:.1f}, {b:.3f}))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
