#!/usr/bin/env python
"""How much SARCSE's reconstruction weighs against its contrastive loss, for both readings of
"MSE(x_i, x'_i)" in the paper's Eq. 9 (issue 18 §4; ``mse_reduction`` in sentemb.methods.sarcse).

On one batch of corpus sentences (train mode: dropout on, one fixed seed; one forward pass, so both
readings see the same dropout masks, states X, X' and weights f(w)) it prints

* L_I (Eq. 11), β·L_R and γ·L_R⁺ (Eqs. 9, 10, 12) with the MSE over the d features taken as a
  ``mean`` (the literal "mean-square error") or a ``sum`` (the squared error ‖x_i − x'_i‖²);
* ‖∇(β·L_R + γ·L_R⁺)‖ / ‖∇(α·L_I)‖, the norms of the two gradients on the parameters both terms
  share: the encoder + the TextCNN/integrating CNN that make Z (and the encoder alone).

Everything is computed here from the method's building blocks (``forward_views``, ``info_nce``,
``reconstruction_loss``), not from the loop's ``train.log_grad_norms``, so it doubles as a check of
that option.

Two models:

* ``minilm``: the real pretrained all-MiniLM-L6-v2 (d = 384) of ../shared;
* ``roberta-base``: a randomly initialised RoBERTa of roberta-base's shape (d = 768, 12 layers,
  12 heads, FFN 3072, vocabulary 50265, 514 positions, 1 token type, padding id 1; 124.1M parameters without the pooler),
  built from a config in code (no download). It is fed MiniLM's WordPiece ids (all < 30522 ≤ 50265,
  none clipped; [unused0] = 1 never occurs, so RoBERTa's position ids are the usual ones), and the
  SARCSE real-token mask and f(w) come from that tokenizer. Its last layer is a fresh LayerNorm, so
  every state feature has unit variance: the *scale* of x (which sets L_R) is that of a
  LayerNorm output, not of the pretrained roberta-base's last layer. ``--roberta-dir DIR`` measures
  the real pretrained roberta-base instead (its own BPE tokenizer and token frequencies).

The token frequencies are the corpus's for the model's tokenizer (sentemb.stats.frequency), θ = 0.1, λ = 50, α = 1, β = γ = 2.5e-4, τ = 0.05, 500 TextCNN channels: the paper's values.

With ``--train-steps K`` it then trains MiniLM K steps with each reading through the shared loop
(``train.log_grad_norms: true``, lr 1e-5 as the paper, fp32, no dev evaluation) and prints the
logged norms ‖∇(α·L_I)‖, ‖∇(β·L_R)‖, ‖∇(γ·L_R⁺)‖ and (‖∇(β·L_R)‖ + ‖∇(γ·L_R⁺)‖) / ‖∇(α·L_I)‖ every
``--log-steps``: does the reconstruction keep (or lose) its weight as training goes on?

    PYTHONPATH=src python scripts/sarcse_recon_scale.py            # both models, batch 32, max_len 32
    PYTHONPATH=src python scripts/sarcse_recon_scale.py --models minilm --batch-size 64
    PYTHONPATH=src python scripts/sarcse_recon_scale.py --models --train-steps 40 --log-steps 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

ROBERTA_BASE = dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                    bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)


def load_model(which: str, minilm_dir: Path, roberta_dir: Path | None, seed: int):
    """(encoder, tokenizer, directory of the tokenizer) of ``which``."""
    import torch
    from transformers import RobertaConfig, RobertaModel

    from sentemb.model.backbone import load_encoder

    torch.manual_seed(seed)
    if which == "roberta-base" and roberta_dir is not None:
        return (*load_encoder(roberta_dir, pooling_layer=False), roberta_dir)
    enc, tok = load_encoder(minilm_dir, pooling_layer=False)
    if which == "roberta-base":
        enc = RobertaModel(RobertaConfig(**ROBERTA_BASE), add_pooling_layer=False)
    return enc, tok, minilm_dir


def grad_norm(out, params):
    import torch

    gs = torch.autograd.grad(out, params, retain_graph=True, allow_unused=True)
    return float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in gs if g is not None])))


def measure(which: str, minilm_dir: Path, roberta_dir: Path | None, corpus: Path, batch_size: int, max_len: int,
            seed: int, tmp: Path) -> dict:
    import torch

    from sentemb.methods import MethodContext, get_method
    from sentemb.methods.sarcse import reconstruction_loss
    from sentemb.methods.simcse import info_nce
    from sentemb.stats.frequency import write_token_frequencies

    enc, tok, tok_dir = load_model(which, minilm_dir, roberta_dir, seed)
    freq = tmp / f"token_freq.{Path(tok_dir).name}.parquet"
    if not freq.is_file():
        write_token_frequencies(corpus, tok_dir, freq)
    ctx = MethodContext(max_len=max_len, seed=seed, model_dir=Path(tok_dir), inputs={"token_freq": freq})
    m = get_method("sarcse")(enc, tok, {}, ctx)  # the paper's values (α, β, γ, θ, λ, τ, channels)
    a = m.args
    m.train()
    sents = [s for s in corpus.read_text("utf-8").splitlines() if s.strip()][:batch_size]
    batch = m.tokenize(sents)
    b = len(sents)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = m.forward_views(batch)
    z = out["z"]
    l_i = a["alpha"] * info_nce(z[:b], z[b:], a["temperature"])
    name = (Path(roberta_dir).name if roberta_dir else "roberta-base (random)") if which == "roberta-base" else which
    res = {"model": name, "d": enc.config.hidden_size, "L_I": float(l_i.detach()),
           "x2": float((out["x"] ** 2).sum(-1)[out["mask"]].mean())}  # mean ‖x_i‖² over real tokens
    shared = [p for p in list(m.encoder.parameters()) + list(m.head.parameters()) if p.requires_grad]
    encoder = [p for p in m.encoder.parameters() if p.requires_grad]
    g_i, g_i_enc = grad_norm(l_i, shared), grad_norm(l_i, encoder)
    res.update(g_I=g_i, g_I_enc=g_i_enc)
    for red in ("mean", "sum"):
        rec = [reconstruction_loss(out["x"][s], out["x_rec"][s], out["weights"][s], out["mask"][s], red)
               for s in (slice(0, b), slice(b, None))]
        wr, wr_pos = a["beta"] * rec[0], a["gamma"] * rec[1]
        g_r, g_r_enc = grad_norm(wr + wr_pos, shared), grad_norm(wr + wr_pos, encoder)
        res[red] = {"beta_L_R": float(wr.detach()), "gamma_L_R_pos": float(wr_pos.detach()), "g_R": g_r, "ratio": g_r / g_i,
                    "ratio_enc": g_r_enc / g_i_enc}
    res["seconds"] = time.perf_counter() - t0
    return res


def train_trajectory(minilm_dir: Path, corpus: Path, freq: Path, reduction: str, steps: int, batch_size: int,
                     max_len: int, log_steps: int, seed: int, out_dir: Path) -> list[dict]:
    """K steps of SARCSE on MiniLM through the shared loop with ``train.log_grad_norms``; the history."""
    from sentemb.methods import get_method
    from sentemb.train.loop import train

    tc = {"epochs": 1, "max_steps": steps, "batch_size": batch_size, "grad_accum": 1, "lr": 1e-5,
          "weight_decay": 0.0, "warmup_ratio": 0.0, "lr_schedule": "linear", "grad_clip": 1.0, "max_len": max_len,
          "eval_steps": 10**9, "eval_at_end": False, "log_steps": log_steps, "save_steps": 10**9, "precision": "fp32",
          "dropout": None, "device": "cpu", "num_threads": None, "compile": False, "model_selection": "last",
          "log_grad_norms": True}
    run = {"name": f"sarcse-{reduction}", "method": "sarcse", "backbone": "minilm", "seed": seed, "train": tc,
           "method_args": get_method("sarcse").resolve_args({"mse_reduction": reduction}), "experiment": "scale",
           "tracking": {"enabled": False, "uri": None},
           "paths": {"model": str(minilm_dir), "corpus": str(corpus), "senteval": None, "inputs": {"token_freq": str(freq)}}}
    return train(run, out_dir / reduction, progress=False)["history"]


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = REPO.parent / "shared"
    p.add_argument("--minilm", type=Path, default=shared / "models" / "all-MiniLM-L6-v2")
    p.add_argument("--corpus", type=Path, default=shared / "data" / "wiki1m_head.txt")
    p.add_argument("--roberta-dir", type=Path, default=None,
                   help="a pretrained roberta-base (HF layout): measure it instead of the random one")
    p.add_argument("--models", nargs="*", default=["minilm", "roberta-base"], choices=["minilm", "roberta-base"])
    p.add_argument("--train-steps", type=int, default=0, help="then train MiniLM this many steps with each reading")
    p.add_argument("--log-steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(w, args.minilm, args.roberta_dir, args.corpus, args.batch_size, args.max_len, args.seed, Path(d))
                for w in args.models]
        freq = Path(d) / f"token_freq.{args.minilm.name}.parquet"
        if args.train_steps and not freq.is_file():
            from sentemb.stats.frequency import write_token_frequencies

            write_token_frequencies(args.corpus, args.minilm, freq)
        runs = {red: train_trajectory(args.minilm, args.corpus, freq, red, args.train_steps, args.batch_size,
                                      args.max_len, args.log_steps, args.seed, Path(d) / "runs")
                for red in ("mean", "sum")} if args.train_steps else {}
    print(f"SARCSE at initialisation: {args.batch_size} sentences of {args.corpus.name}, max_len {args.max_len}, "
          f"seed {args.seed}, train mode; α 1, β = γ 2.5e-4 (paper)")
    print("ratio = ‖∇(β·L_R + γ·L_R⁺)‖ / ‖∇(α·L_I)‖ on encoder + TextCNN (on the encoder alone)")
    print(f"{'model':<21} {'d':>4} {'mean ‖x‖²':>10} {'L_I':>7} {'MSE over d':>11} {'β·L_R':>10} {'γ·L_R⁺':>10} "
          f"{'ratio':>9} {'(encoder)':>10}")
    for r in rows:
        for red in ("mean", "sum"):
            q = r[red]
            print(f"{r['model']:<21} {r['d']:>4} {r['x2']:>10.1f} {r['L_I']:>7.3f} {red:>11} {q['beta_L_R']:>10.2e} "
                  f"{q['gamma_L_R_pos']:>10.2e} {q['ratio']:>9.2e} {q['ratio_enc']:>10.2e}")
    if runs:
        print()
        print(f"SARCSE on MiniLM through the loop (train.log_grad_norms), batch {args.batch_size}, lr 1e-5, fp32, "
              f"seed {args.seed}; grad norms on encoder + TextCNN at the logged step")
        print("ratio = (‖∇β·L_R‖ + ‖∇γ·L_R⁺‖) / ‖∇α·L_I‖")
        print(f"{'MSE over d':>10} {'step':>5} {'‖∇α·L_I‖':>10} {'‖∇β·L_R‖':>10} {'‖∇γ·L_R⁺‖':>10} {'ratio':>9}")
        for red, hist in runs.items():
            for h in hist:
                g = {k.rsplit("/", 1)[1]: v for k, v in h.items() if k.startswith("train/grad_norm/")}
                if g:
                    print(f"{red:>10} {h['step']:>5} {g['contrastive']:>10.3e} {g['recon']:>10.3e} "
                          f"{g['recon_pos']:>10.3e} {(g['recon'] + g['recon_pos']) / g['contrastive']:>9.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
