"""train.optimizer adamw_hf: transformers 4.2.1's AdamW (the SimCSE family's HF Trainer) against a float64
loop written from its source, where it differs from torch's, and in the loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentemb import SentembError
from sentemb.train.optim import HFAdamW


def reference_hf_adamw(params, grads_per_step, lr, wd, betas=(0.9, 0.999), eps=1e-8):
    """transformers/optimization.py AdamW.step (v4.2.1) in float64, parameter by parameter, after the
    Trainer's model.zero_grad() (torch 1.x: zeros): a parameter without a gradient yet is skipped (None),
    one that had a gradient before and gets none now steps on a zero gradient."""
    b1, b2 = betas
    p = [x.astype(np.float64).copy() for x in params]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    t = [0] * len(p)
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            if g is None:
                if t[i] == 0:
                    continue
                g = np.zeros_like(p[i])
            g = g.astype(np.float64)
            t[i] += 1
            m[i] = m[i] * b1 + (1 - b1) * g
            v[i] = v[i] * b2 + (1 - b2) * g * g
            denom = np.sqrt(v[i]) + eps
            step_size = lr * math.sqrt(1 - b2 ** t[i]) / (1 - b1 ** t[i])
            p[i] = p[i] - step_size * m[i] / denom
            if wd > 0:
                p[i] = p[i] - lr * wd * p[i]
    return p


def _run(opt_cls, params, grads_per_step, **kw):
    ps = [torch.nn.Parameter(torch.tensor(x, dtype=torch.float64)) for x in params]
    opt = opt_cls([{"params": ps, "weight_decay": kw.pop("weight_decay", 0.0)}], **kw)
    for grads in grads_per_step:
        for p, g in zip(ps, grads):
            p.grad = None if g is None else torch.tensor(g, dtype=torch.float64)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_hf_adamw_is_transformers_4_2_adamw(wd):
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(4, 3)), rng.normal(size=5)]
    # tiny gradients (a rare token's row: √v̂ near ε) and a parameter without a gradient on step 2
    steps = [[rng.normal(size=(4, 3)) * 1e-7, rng.normal(size=5)] for _ in range(6)]
    steps[0][1] = None  # no gradient yet: skipped
    steps[3][1] = None  # a gradient before, none now: a zero gradient (the Trainer's zero_grad)
    ours, opt = _run(HFAdamW, params, steps, lr=1e-3, weight_decay=wd)
    ref = reference_hf_adamw(params, steps, 1e-3, wd)
    for a, b in zip(ours, ref):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-15)
    assert [opt.state[p]["step"] for p in opt.param_groups[0]["params"]] == [6, 5]
    torch_ours, _ = _run(torch.optim.AdamW, params, steps, lr=1e-3, weight_decay=wd)
    assert not np.allclose(torch_ours[0], ref[0], rtol=1e-6)  # ε before the bias correction: another update


def test_the_loop_builds_it_and_refuses_a_fused_update(tiny_bert_dir, tiny_senteval, tmp_path):
    from test_method_contract import run_cfg

    from sentemb.config.settings import TrainSettings
    from sentemb.train.loop import State, build_optimizer, run_steps, setup

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"a man plays the guitar number {i}\n" for i in range(40)))
    cfg = run_cfg("simcse", tiny_bert_dir, {"corpus": corpus, "inputs": {}, "args": {}}, tiny_senteval,
                  optimizer="adamw_hf", model_selection="last", max_steps=2)
    with setup(cfg, "/nonexistent") as job:
        assert isinstance(job.opt, HFAdamW)
        before = [p.detach().clone() for p in job.method.encoder.parameters()]
        assert len(list(run_steps(job, State()))) == 2
        assert {s["step"] for s in job.opt.state.values()} == {2}  # every trained tensor stepped twice
        assert any(not torch.equal(b, p) for b, p in zip(before, job.method.encoder.parameters()))
    with pytest.raises(SentembError, match=r"train\.optimizer adamw_hf .*train\.update fused"):
        TrainSettings.from_dict({"optimizer": "adamw_hf", "update": "fused"}).check("train")
    with pytest.raises(SentembError, match=r"train\.update: separate"):
        build_optimizer(torch.nn.Linear(2, 2), 1e-3, 0.0, torch.device("cpu"), fused=True, kind="adamw_hf")
