"""The one training loop every method shares (in the spirit of nanoGPT's ``train.py``).

It owns data order, optimisation (AdamW, linear decay, grad clipping), precision (bf16 autocast
on CUDA, fp32 on CPU; methods compute logits and losses in fp32), periodic STS-B dev evaluation
with best-checkpoint selection (methods.md §0), resumable checkpoints, and MLflow logging. A
method contributes only its batch construction and loss terms (``sentemb.methods.base.Method``).

Outputs of ``train(run, out_dir)``:
    out_dir/model/       the best checkpoint by STS-B dev (HF + sentence-transformers layout)
    out_dir/train.json   summary (best dev, steps, throughput, history)
    out_dir/.work/       resume state; removed after success
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import sys
import time
from pathlib import Path

from typing import TYPE_CHECKING

from . import SentembError
from .utils import atomic_path, write_json

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger(__name__)


def read_corpus(path: str | Path) -> list[str]:
    """The training sentences: every line UTF-8 (``sentemb.utils.iter_lines``) and not blank."""
    from .utils import iter_lines

    sents = []
    for i, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            raise SentembError(f"{path}:{i}: line {i} is empty (prepare the corpus with `sentemb prepare-corpus`)")
        sents.append(line)
    if len(sents) < 2:
        raise SentembError(f"{path}: a training corpus needs at least 2 sentences, found {len(sents)}")
    return sents


def batch_schedule(n: int, batch_size: int, epochs: float, seed: int) -> list[np.ndarray]:
    """Micro-batches of corpus indices: a fresh seeded permutation per epoch, no length bucketing
    (bucketing would change which sentences are each other's in-batch negatives). A trailing
    batch of one sentence is dropped (no negatives)."""
    import numpy as np
    per_epoch = n // batch_size + (1 if n % batch_size >= 2 else 0)
    total = max(1, int(round(epochs * per_epoch)))
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < total:
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        chunks = [perm[i : i + batch_size] for i in range(0, n, batch_size)]
        out.extend(c for c in chunks if len(c) >= 2)
        epoch += 1
    return out[:total]


def _precision(name: str, device: torch.device) -> torch.dtype | None:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[name]


def _rng_state() -> dict:
    import numpy as np
    import torch

    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    import numpy as np
    import torch

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def build_optimizer(module: torch.nn.Module, lr: float, weight_decay: float, device: torch.device):
    """AdamW; biases and LayerNorm weights are not decayed (the HF Trainer's convention)."""
    import torch

    decay, no_decay = [], []
    for n, p in module.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in n or "layer_norm" in n else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, fused=device.type == "cuda")


def lr_lambda(schedule: str, total: int, warmup: int):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return step / warmup
        if schedule == "constant":
            return 1.0
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def train(run: dict, out_dir: str | Path, *, progress: bool = True, stop_after: int | None = None) -> dict:
    """Train one run (a resolved run config, see ``sentemb.config.resolve_run``) into ``out_dir``.

    ``stop_after`` ends the process-equivalent of a kill after that many optimizer steps (tests).
    """
    import torch

    from .evaluate import stsb_dev
    from .senteval import load_task
    from .methods import MethodContext, get_method
    from .models import load_encoder
    from .tracking import Tracker
    from .utils import resolve_device, seed_everything

    out_dir = Path(out_dir)
    tc, paths, seed = run["train"], run["paths"], int(run["seed"])
    work = out_dir / ".work"
    device = resolve_device(tc.get("device", "auto"))
    if tc.get("num_threads"):
        torch.set_num_threads(tc["num_threads"])
    amp = _precision(tc["precision"], device)
    if device.type == "cuda":
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
        else:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    sentences = read_corpus(paths["corpus"])
    dev_pairs = load_task(paths["senteval"], "STSBenchmark", "dev")  # read once; bad data fails before step 1
    seed_everything(seed)
    encoder, tokenizer = load_encoder(paths["model"], dropout=tc.get("dropout"))
    method_cls = get_method(run["method"])
    ctx = MethodContext(max_len=tc["max_len"], seed=seed, backbone=run["backbone"], model_dir=Path(paths["model"]),
                        inputs={k: Path(v) for k, v in paths.get("inputs", {}).items()}, corpus=Path(paths["corpus"]))
    method = method_cls(encoder, tokenizer, run["method_args"], ctx).to(device)
    pooler = method_cls.pooler_for(method.args)
    step_fn = method.losses
    if tc.get("compile"):
        step_fn = torch.compile(method.losses)

    micro = batch_schedule(len(sentences), tc["batch_size"], tc["epochs"], seed)
    accum = tc["grad_accum"]
    total = len(micro) // accum
    if tc.get("max_steps"):
        total = min(total, tc["max_steps"])
    if total < 1:
        raise SentembError(f"run '{run['name']}': the corpus gives no full optimizer step "
                           f"({len(micro)} micro-batches, grad_accum {accum})")
    opt = build_optimizer(method, tc["lr"], tc["weight_decay"], device)
    warmup = int(tc["warmup_ratio"] * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc["lr_schedule"], total, warmup))
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)

    step, best, history = 0, {"dev": -math.inf, "step": 0}, []
    state_file = work / "last.pt"
    # Resume only the same run: settings changed since the kill mean a fresh start (stale .work removed).
    fingerprint = json.dumps({k: run[k] for k in ("method", "backbone", "seed", "train", "method_args", "paths")},
                             sort_keys=True, default=str)
    st = torch.load(state_file, map_location=device, weights_only=False) if state_file.is_file() else None
    if st is not None and st.get("fingerprint") != fingerprint:
        log.warning("%s was saved by a run with other settings: starting afresh", state_file)
        st = None
    if st is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        method.load_state_dict(st["method"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        scaler.load_state_dict(st["scaler"])
        step, best, history = st["step"], st["best"], st["history"]
        _set_rng_state(st["rng"])
        kept = work / "best" / "sentemb.json"  # the best export can be newer than the last state save
        if kept.is_file():
            meta_best = json.loads(kept.read_text("utf-8"))
            if meta_best["dev_stsb"] > best["dev"]:
                best = {"dev": meta_best["dev_stsb"], "step": meta_best["step"]}
        log.info("resumed from %s at step %d/%d", state_file, step, total)

    embedder = method.embedder(pooler, device)
    meta = {"method": run["method"], "name": run["name"], "backbone": run["backbone"], "seed": seed}

    def evaluate_and_keep() -> float:
        dev = stsb_dev(embedder, dev_pairs)
        history.append({"step": step, "dev_stsb": dev})
        if dev > best["dev"]:
            best.update(dev=dev, step=step)
            with atomic_path(work / "best", is_dir=True) as tmp:
                method.export(tmp, pooler, meta={**meta, "step": step, "dev_stsb": dev})
        return dev

    def save_state() -> None:
        check_finite()  # never checkpoint weights that a non-finite loss has touched
        with atomic_path(state_file) as tmp:
            torch.save({"fingerprint": fingerprint, "method": method.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "scaler": scaler.state_dict(), "step": step, "best": best, "history": history,
                        "rng": _rng_state()}, tmp)

    tags = {"method": run["method"], "name": run["name"], "backbone": run["backbone"], "seed": seed, "rule": "train"}
    trk = run.get("tracking", {})
    tracker = Tracker(uri=trk.get("uri"), experiment=run.get("experiment", "sentemb"), enabled=trk.get("enabled", True),
                      run_name=f"train/{run['name']}/{run['backbone']}/seed{seed}", tags=tags, params=run)
    method.train()
    sum_terms: dict[str, torch.Tensor] = {}
    n_terms = n_sent = n_tok = 0
    pending: list[tuple[int, torch.Tensor, dict]] = []  # (step, loss finite?, terms) not yet checked

    def check_finite() -> None:
        """Raise on the first non-finite loss since the last check (one device sync per check, so
        the GPU is not stalled every step); runs before every log, evaluation and checkpoint."""
        if not pending:
            return
        flags = torch.stack([f for _, f, _ in pending]).cpu()
        if not bool(flags.all()):
            bad_step, _, terms = pending[int((~flags).nonzero()[0])]
            shown = {key: float(v) for key, v in terms.items()}
            raise SentembError(f"run '{run['name']}' seed {seed}: loss is {shown['loss']} at step {bad_step} "
                               f"(terms {shown}); lower the learning rate or train in fp32")
        pending.clear()
    t_log = t_start = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=step, desc=f"train {run['name']}", unit="step", file=sys.stderr,
                   mininterval=1 if sys.stderr.isatty() else 30)
    with tracker:
        while step < total:
            for k in range(accum):
                m = step * accum + k
                idx = micro[m]
                batch = method.build_batch([sentences[i] for i in idx], step=step, lines=idx, micro=m)
                n_sent += len(idx)
                if "attention_mask" in batch:
                    n_tok += int(batch["attention_mask"].sum())
                batch = {key: v.to(device, non_blocking=True) for key, v in batch.items()}
                with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                    terms = step_fn(batch)
                loss = terms["loss"]
                scaler.scale(loss / accum).backward()
                detached = {key: v.detach() for key, v in terms.items()}
                pending.append((step + 1, torch.isfinite(loss.detach()), detached))  # checked without a sync
                for key, v in detached.items():
                    sum_terms[key] = sum_terms[key] + v if key in sum_terms else v
                n_terms += 1
            if tc.get("grad_clip"):
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(method.parameters(), tc["grad_clip"])
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if bar is not None:
                bar.update(1)
            if step % tc["log_steps"] == 0 or step == total:
                check_finite()
                now = time.perf_counter()
                dt = now - t_log
                metrics = {f"train/{key}": float(v) / n_terms for key, v in sum_terms.items()}
                metrics.update({"train/lr": sched.get_last_lr()[0], "train/sentences_per_s": n_sent / dt,
                                "train/tokens_per_s": n_tok / dt})
                tracker.log_metrics(metrics, step)
                if bar is not None:
                    bar.set_postfix(loss=f"{metrics['train/loss']:.4f}")
                sum_terms, n_terms, n_sent, n_tok = {}, 0, 0, 0
                t_log = now
            if step % tc["eval_steps"] == 0 or (step == total and tc["eval_at_end"]):
                check_finite()
                t0 = time.perf_counter()
                dev = evaluate_and_keep()
                method.train()
                tracker.log_metrics({"dev/stsb_spearman": dev, "dev/best": best["dev"]}, step)
                log.info("step %d: STS-B dev %.2f (best %.2f at step %d)", step, dev, best["dev"], best["step"])
                t_log += time.perf_counter() - t0  # evaluation time is not training throughput
            if step % tc["save_steps"] == 0 and step < total:
                save_state()
            if stop_after is not None and step >= stop_after and step < total:
                save_state()
                raise KeyboardInterrupt(f"stopped after {step} steps (test hook)")
        if bar is not None:
            bar.close()
        if not (work / "best").is_dir():
            raise SentembError(f"run '{run['name']}': no checkpoint was evaluated (set train.eval_at_end: true)")
        summary = {
            **meta, "steps": total, "best_step": best["step"], "best_dev_stsb": best["dev"], "history": history,
            "train_seconds_this_process": round(time.perf_counter() - t_start, 2),
            "pooler": pooler, "device": str(device), "precision": str(amp or "fp32"),
        }
        with atomic_path(out_dir / "model", is_dir=True) as tmp:
            shutil.rmtree(tmp)
            shutil.copytree(work / "best", tmp)
        write_json(out_dir / "train.json", summary)
        tracker.log_metrics({"dev/best": best["dev"]}, total)
        tracker.log_artifact(out_dir / "train.json")
        tracker.set_tags({"best_step": best["step"]})
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _cmd_train(args: argparse.Namespace) -> int:
    path = Path(args.run_config)
    if not path.is_file():
        raise SentembError(f"--run-config: file not found: {path}")
    try:
        run = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise SentembError(f"{path}: not valid JSON ({e})") from None
    if args.device:
        run["train"]["device"] = args.device
    if args.no_track:
        run.setdefault("tracking", {})["enabled"] = False
    summary = train(run, args.output_dir, progress=not args.quiet)
    print(f"best STS-B dev {summary['best_dev_stsb']:.2f} at step {summary['best_step']}/{summary['steps']} "
          f"-> {Path(args.output_dir) / 'model'}")
    return 0


def _cmd_run_config(args: argparse.Namespace) -> int:
    from .config import load_config, resolve_run

    cfg = load_config(args.config)
    write_json(args.output, resolve_run(cfg, args.name, args.backbone, args.seed))
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="train one run (method x backbone x seed)")
    p.add_argument("--run-config", required=True, help="resolved run JSON (see `sentemb run-config`)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--device", default=None, help="override train.device (auto, cpu, cuda, cuda:1)")
    p.add_argument("--no-track", action="store_true", help="no MLflow run")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_train)
    q = sub.add_parser("run-config", help="write the resolved settings of one run from a config file")
    q.add_argument("--config", required=True)
    q.add_argument("--name", required=True)
    q.add_argument("--backbone", required=True)
    q.add_argument("--seed", type=int, required=True)
    q.add_argument("--output", required=True)
    q.set_defaults(func=_cmd_run_config)
