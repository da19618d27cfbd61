"""Transfer tasks under the SentEval protocol (methods.md §0 "Other evaluations"; issue 12 §1).

Frozen sentence embeddings, scikit-learn ``LogisticRegression`` (SentEval with ``usepytorch=False``),
as SimCSE, InfoCSE and ArcCSE report MR, CR, SUBJ, MPQA, SST-2, TREC and MRPC. This module
re-implements SentEval's ``senteval/{binary,sst,trec,mrpc}.py`` and ``senteval/tools/validation.py``
step for step, so that the folds, the regularisation grid, the ties and the roundings are SentEval's:

* MR, CR, SUBJ, MPQA (``InnerKFoldClassifier``): k = 10 stratified shuffled folds (seed 1111); in each
  outer fold C is chosen from {2^-2, …, 2^3} by an inner 10-fold CV on the outer training part
  (mean inner accuracy rounded to 2 decimals, first maximum wins), the classifier refit on the
  whole outer training part with that C and scored on the held-out fold. Test accuracy = mean of
  the per-fold accuracies (each rounded to 2 decimals); dev accuracy = mean of the best inner scores.
* SST-2 (``SplitClassifier``): C from {2^-2, …, 2^3} on the given dev split, test on the test split.
* TREC and MRPC (``KFoldClassifier``): C from {2^-1, …, 2^5} by 10-fold CV on the train split,
  refit on all of train, scored on the test split; MRPC also reports F1 of the positive class.
* Samples are ordered as SentEval orders them before the classifier sees them (stable sort by
  (number of tokens, label); MRPC by (len A, len B, label)), because that order decides the folds.
* Files are read as SentEval reads them: MR/CR/SUBJ/MPQA/TREC as latin-1, SST/MRPC as UTF-8,
  whitespace-tokenised and re-joined with single spaces (SimCSE's batcher). SUBJ: objective = 1.

**Open choice (MRPC features).** The papers and methods.md describe the MRPC features as
[u, v, |u − v|, u ⊙ v] (``mrpc_features="paper"``, the default); SentEval's code, which produced
the published numbers, uses [|u − v|, u ⊙ v] (``mrpc_features="code"``).

All sentences of a task are encoded once (unique sentences, length-sorted batches, by the same
``Embedder`` as ``sentemb evaluate``). Accuracies are × 100.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import SentembError

log = logging.getLogger(__name__)

TRANSFER_TASKS = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
SEED = 1111  # SentEval's default seed
KFOLD = 10  # SimCSE / InfoCSE / ArcCSE call SentEval with kfold=10
# SentEval's sklearn grids (validation.py, usepytorch=False)
REGS_INNER = [2.0**t for t in range(-2, 4)]  # InnerKFoldClassifier and SplitClassifier
REGS_KFOLD = [2.0**t for t in range(-1, 6)]  # KFoldClassifier
MRPC_FEATURES = ("paper", "code")

# task -> files under the SentEval data root (checked before any encoding)
TASK_FILES: dict[str, list[str]] = {
    "MR": ["MR/rt-polarity.pos", "MR/rt-polarity.neg"],
    "CR": ["CR/custrev.pos", "CR/custrev.neg"],
    "SUBJ": ["SUBJ/subj.objective", "SUBJ/subj.subjective"],
    "MPQA": ["MPQA/mpqa.pos", "MPQA/mpqa.neg"],
    "SST2": ["SST/binary/sentiment-train", "SST/binary/sentiment-dev", "SST/binary/sentiment-test"],
    "TREC": ["TREC/train_5500.label", "TREC/TREC_10.label"],
    "MRPC": ["MRPC/msr_paraphrase_train.txt", "MRPC/msr_paraphrase_test.txt"],
}
TREC_CLASSES = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}


@dataclass
class TransferTask:
    """One task's text in SentEval's classifier order. ``splits`` maps a split name (``all`` for
    the CV tasks; ``train``/``dev``/``test``; for MRPC ``train``/``test``) to its sentences (or
    (A, B) sentence lists for MRPC) and integer labels."""

    name: str
    kind: str  # "innerkfold" | "split" | "kfold" | "mrpc"
    splits: dict[str, tuple] = field(default_factory=dict)

    def sentences(self) -> list[str]:
        out: list[str] = []
        for x, _ in self.splits.values():
            if self.kind == "mrpc":
                out += list(x[0]) + list(x[1])
            else:
                out += list(x)
        return out


# ------------------------------------------------------------------------------------- loading
def _lines(path: Path, encoding: str) -> list[str]:
    if not path.is_file():
        raise SentembError(f"transfer data file not found: {path}")
    with open(path, encoding=encoding, newline=None) as f:
        return f.read().splitlines()


def _sorted(samples: list, labels: list[int]) -> tuple[list, list[int]]:
    """SentEval's order: stable sort by (number of tokens, label)."""
    z = sorted(zip(samples, labels), key=lambda t: (len(t[0]), t[1]))
    return [s for s, _ in z], [y for _, y in z]


def _join(tokens: list[str]) -> str:
    return " ".join(tokens)


def load_transfer_task(data_dir: str | Path, task: str) -> TransferTask:
    """Load ``task`` from SentEval's processed ``data/downstream`` layout, as SentEval loads it."""
    root = Path(data_dir)
    if task not in TASK_FILES:
        raise SentembError(f"unknown transfer task '{task}' (known: {', '.join(TRANSFER_TASKS)})")
    if not root.is_dir():
        raise SentembError(f"SentEval data directory not found: {root}")
    for rel in TASK_FILES[task]:
        if not (root / rel).is_file():
            raise SentembError(f"transfer task {task}: data file not found: {root / rel}")
    files = [root / rel for rel in TASK_FILES[task]]
    if task in ("MR", "CR", "SUBJ", "MPQA"):
        pos = [l.split() for l in _lines(files[0], "latin-1")]  # SUBJ: objective is SentEval's "pos"
        neg = [l.split() for l in _lines(files[1], "latin-1")]
        x, y = _sorted(pos + neg, [1] * len(pos) + [0] * len(neg))
        return TransferTask(task, "innerkfold", {"all": ([_join(t) for t in x], y)})
    if task == "SST2":
        splits = {}
        for name, f in zip(("train", "dev", "test"), files):
            xs, ys = [], []
            for i, line in enumerate(_lines(f, "utf-8"), start=1):
                if not line.strip():
                    continue
                cols = line.strip().split("\t")
                if len(cols) < 2 or cols[1] not in ("0", "1"):
                    raise SentembError(f"{f}, line {i}: expected 'sentence<TAB>0|1'")
                xs.append(cols[0].split())
                ys.append(int(cols[1]))
            xs, ys = _sorted(xs, ys)
            splits[name] = ([_join(t) for t in xs], ys)
        return TransferTask(task, "split", splits)
    if task == "TREC":
        splits = {}
        for name, f in zip(("train", "test"), files):
            xs, ys = [], []
            for i, line in enumerate(_lines(f, "latin-1"), start=1):
                if not line.strip():
                    continue
                target, _, rest = line.strip().partition(":")
                if target not in TREC_CLASSES or " " not in rest:
                    raise SentembError(f"{f}, line {i}: expected 'CLASS:fine question' with CLASS in {list(TREC_CLASSES)}")
                xs.append(rest.split(" ", 1)[1].split())
                ys.append(TREC_CLASSES[target])
            xs, ys = _sorted(xs, ys)
            splits[name] = ([_join(t) for t in xs], ys)
        return TransferTask(task, "kfold", splits)
    # MRPC: header line, columns quality, id1, id2, string1, string2
    splits = {}
    for name, f in zip(("train", "test"), files):
        rows = []
        for i, line in enumerate(_lines(f, "utf-8")[1:], start=2):
            if not line.strip():
                continue
            cols = line.strip().split("\t")
            if len(cols) < 5 or cols[0] not in ("0", "1"):
                raise SentembError(f"{f}, line {i}: expected 5 tab-separated columns with quality 0|1")
            rows.append((cols[3].split(), cols[4].split(), int(cols[0])))
        rows.sort(key=lambda z: (len(z[0]), len(z[1]), z[2]))
        splits[name] = (([_join(a) for a, _, _ in rows], [_join(b) for _, b, _ in rows]), [y for *_, y in rows])
    return TransferTask(task, "mrpc", splits)


# ---------------------------------------------------------------------------------- classifiers
def _logreg(c: float, seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, random_state=seed)


def _quiet():
    """Silence sklearn's ConvergenceWarning (SentEval runs lbfgs with its default max_iter too) and
    fit on one BLAS/OpenMP thread: lbfgs on a few thousand rows is ~10x faster single-threaded than
    with threads contending over such small products (measured on this project's 2-core CI)."""
    import contextlib
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    ctx = contextlib.ExitStack()
    ctx.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore", ConvergenceWarning)
    ctx.enter_context(threadpool_limits(1))
    return ctx


def inner_kfold(X: np.ndarray, y: np.ndarray, *, k: int = KFOLD, seed: int = SEED,
                regs: Sequence[float] = REGS_INNER) -> dict:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA): outer k-fold test, inner k-fold
    choice of C. Returns {"devacc", "acc"} × 100 rounded as SentEval rounds them."""
    from sklearn.model_selection import StratifiedKFold

    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    inner = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    dev, test, chosen = [], [], []
    ctx = _quiet()
    try:
        for tr, te in skf.split(X, y):
            Xtr, ytr = X[tr], y[tr]
            scores = []
            for c in regs:
                s = []
                for itr, ite in inner.split(Xtr, ytr):
                    s.append(_logreg(c, seed).fit(Xtr[itr], ytr[itr]).score(Xtr[ite], ytr[ite]))
                scores.append(round(100 * np.mean(s), 2))
            best = int(np.argmax(scores))
            dev.append(np.max(scores))
            chosen.append(regs[best])
            test.append(round(100 * _logreg(regs[best], seed).fit(Xtr, ytr).score(X[te], y[te]), 2))
    finally:
        ctx.__exit__(None, None, None)
    return {"devacc": round(float(np.mean(dev)), 2), "acc": round(float(np.mean(test)), 2), "C": chosen}


def kfold(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray, *, k: int = KFOLD,
          seed: int = SEED, regs: Sequence[float] = REGS_KFOLD) -> dict:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): C by k-fold CV on train, refit, test.
    Returns {"devacc", "acc", "C", "yhat"}."""
    from sklearn.model_selection import StratifiedKFold

    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    scores = []
    ctx = _quiet()
    try:
        for c in regs:
            s = [_logreg(c, seed).fit(Xtr[a], ytr[a]).score(Xtr[b], ytr[b]) for a, b in skf.split(Xtr, ytr)]
            scores.append(round(100 * np.mean(s), 2))
        best = int(np.argmax(scores))
        clf = _logreg(regs[best], seed).fit(Xtr, ytr)
    finally:
        ctx.__exit__(None, None, None)
    return {"devacc": float(np.max(scores)), "acc": round(100 * clf.score(Xte, yte), 2), "C": regs[best],
            "yhat": clf.predict(Xte)}


def split_classifier(Xtr, ytr, Xdev, ydev, Xte, yte, *, seed: int = SEED, regs: Sequence[float] = REGS_INNER) -> dict:
    """SentEval's ``SplitClassifier`` (SST-2): C on the dev split, test on the test split."""
    ctx = _quiet()
    try:
        scores = [round(100 * _logreg(c, seed).fit(Xtr, ytr).score(Xdev, ydev), 2) for c in regs]
        best = int(np.argmax(scores))
        clf = _logreg(regs[best], seed).fit(Xtr, ytr)
    finally:
        ctx.__exit__(None, None, None)
    return {"devacc": float(np.max(scores)), "acc": round(100 * clf.score(Xte, yte), 2), "C": regs[best]}


def mrpc_features(a: np.ndarray, b: np.ndarray, mode: str = "paper") -> np.ndarray:
    """Pair features: ``paper`` = [u, v, |u − v|, u ⊙ v] (methods.md; InfoCSE/ArcCSE's description),
    ``code`` = [|u − v|, u ⊙ v] (SentEval's ``mrpc.py``)."""
    if mode == "paper":
        return np.concatenate([a, b, np.abs(a - b), a * b], axis=1)
    if mode == "code":
        return np.concatenate([np.abs(a - b), a * b], axis=1)
    raise SentembError(f"mrpc_features must be one of {MRPC_FEATURES}, not '{mode}'")


# ------------------------------------------------------------------------------------- evaluation
def evaluate_task(embed: Callable[[Sequence[str]], np.ndarray], task: TransferTask, *, k: int = KFOLD,
                  seed: int = SEED, mrpc_mode: str = "paper") -> dict:
    """Encode every sentence of ``task`` once, then run SentEval's classifier for its kind."""
    t0 = time.time()
    sents = list(dict.fromkeys(task.sentences()))
    vecs = np.asarray(embed(sents), dtype=np.float32) if sents else np.zeros((0, 1), np.float32)
    pos = {s: i for i, s in enumerate(sents)}
    t_enc = time.time() - t0

    def E(xs):
        return vecs[[pos[s] for s in xs]]

    out: dict = {}
    if task.kind == "innerkfold":
        x, y = task.splits["all"]
        r = inner_kfold(E(x), np.asarray(y), k=k, seed=seed)
        out.update(n={"all": len(y)})
    elif task.kind == "split":
        (xa, ya), (xd, yd), (xt, yt) = (task.splits[s] for s in ("train", "dev", "test"))
        r = split_classifier(E(xa), np.asarray(ya), E(xd), np.asarray(yd), E(xt), np.asarray(yt), seed=seed)
        out.update(n={"train": len(ya), "dev": len(yd), "test": len(yt)})
    elif task.kind == "kfold":
        (xa, ya), (xt, yt) = task.splits["train"], task.splits["test"]
        r = kfold(E(xa), np.asarray(ya), E(xt), np.asarray(yt), k=k, seed=seed)
        r.pop("yhat")
        out.update(n={"train": len(ya), "test": len(yt)})
    else:
        from sklearn.metrics import f1_score

        ((a_tr, b_tr), ytr), ((a_te, b_te), yte) = task.splits["train"], task.splits["test"]
        Ftr = mrpc_features(E(a_tr), E(b_tr), mrpc_mode)
        Fte = mrpc_features(E(a_te), E(b_te), mrpc_mode)
        r = kfold(Ftr, np.asarray(ytr), Fte, np.asarray(yte), k=k, seed=seed)
        r["f1"] = round(100 * float(f1_score(np.asarray(yte), r.pop("yhat"))), 2)
        out.update(n={"train": len(ytr), "test": len(yte)}, features=mrpc_mode)
    out.update(r)
    out["n_sentences"] = len(sents)
    out["encode_seconds"] = round(t_enc, 2)
    out["seconds"] = round(time.time() - t0, 2)
    out["sentences_per_second"] = round(len(sents) / max(t_enc, 1e-9), 1)
    return out


def evaluate_transfer(embed, data_dir: str | Path, tasks: Sequence[str] = TRANSFER_TASKS, *, k: int = KFOLD,
                      seed: int = SEED, mrpc_mode: str = "paper") -> dict:
    """All ``tasks``: {task: accuracy × 100, "MRPC_F1": …, "avg": mean accuracy, "details": {…}}.
    Every task's files are read (and checked) before anything is encoded."""
    loaded = [load_transfer_task(data_dir, t) for t in tasks]
    res: dict = {}
    details = {}
    for task in loaded:
        d = evaluate_task(embed, task, k=k, seed=seed, mrpc_mode=mrpc_mode)
        log.info("%s: acc %.2f (dev %.2f) in %.1f s", task.name, d["acc"], d["devacc"], d["seconds"])
        details[task.name] = d
        res[task.name] = d["acc"]
        if "f1" in d:
            res["MRPC_F1"] = d["f1"]
    res["avg"] = round(float(np.mean([res[t] for t in tasks])), 4) if tasks else float("nan")
    res["details"] = details
    return res


# ---------------------------------------------------------------------------------------- CLI
def _cmd_transfer(args: argparse.Namespace) -> int:
    import torch

    from .evaluate import _training_run_id, embedder_for
    from .utils import write_json

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TRANSFER_TASKS]
    if unknown:
        raise SentembError(f"--tasks: unknown transfer task(s) {unknown} (known: {','.join(TRANSFER_TASKS)})")
    if not Path(args.model).is_dir():
        raise SentembError(f"--model: model directory not found: {args.model}")
    for t in tasks:  # a missing file fails before the model is loaded
        load_transfer_task(args.data_dir, t)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    embed = embedder_for(args.model, args.pooler, device=args.device, batch_size=args.batch_size,
                         max_length=args.max_length, progress=not args.quiet, precision=args.precision)
    res = evaluate_transfer(embed, args.data_dir, tasks, k=args.kfold, seed=args.seed, mrpc_mode=args.mrpc_features)
    out = {t: res[t] for t in tasks}
    if "MRPC_F1" in res:
        out["MRPC_F1"] = res["MRPC_F1"]
    out["avg"] = res["avg"]
    n_sent = sum(d["n_sentences"] for d in res["details"].values())
    enc = sum(d["encode_seconds"] for d in res["details"].values())
    out.update({
        "protocol": {"classifier": "sklearn LogisticRegression", "kfold": args.kfold, "seed": args.seed,
                     "mrpc_features": args.mrpc_features},
        "pooler": args.pooler, "model": str(args.model), "data_dir": str(args.data_dir), "tasks": tasks,
        "n_sentences": n_sent, "seconds": round(time.time() - t0, 2),
        "sentences_per_second": round(n_sent / max(enc, 1e-9), 1), "details": res["details"],
    })
    if args.run_meta:
        meta = dict(kv.split("=", 1) for kv in args.run_meta)
        if "seed" in meta:
            meta["seed"] = int(meta["seed"])
        out["run"] = meta
    print(" | ".join(f"{t}: {out[t]:.2f}" for t in [*tasks, "avg"]))
    if args.track:
        import tempfile

        from .tracking import Tracker

        tags = {**out.get("run", {}), **dict(kv.split("=", 1) for kv in args.tag)}
        tags.setdefault("rule", "evaluate-transfer")
        train_run = _training_run_id(args.model)
        out_path = Path(args.output)
        with Tracker(uri=args.tracking_uri, experiment=args.experiment,
                     run_name=args.run_name or f"transfer:{args.model}", tags=tags,
                     params={"pooler": args.pooler, "tasks": ",".join(tasks), "model": str(args.model),
                             "data_dir": str(args.data_dir), "mrpc_features": args.mrpc_features},
                     marker=out_path.with_name(f".{out_path.name}.mlflow_run.json"), parent_run_id=train_run) as tr:
            m = {f"transfer/{t}": out[t] for t in tasks} | {"transfer/avg": out["avg"]}
            tr.log_metrics(m)
            if train_run:
                tr.log_metrics_to(train_run, m)
            with tempfile.TemporaryDirectory() as d:
                art = Path(d) / out_path.name
                art.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
                tr.log_artifact(art)
    write_json(args.output, out)
    return 0


def register(sub) -> None:
    from . import POOLERS

    p = sub.add_parser("evaluate-transfer", help="SentEval transfer tasks (logistic regression on frozen embeddings)")
    p.add_argument("--model", required=True, help="Hugging Face model directory or a sentemb checkpoint")
    p.add_argument("--pooler", required=True, choices=[*POOLERS, "method"])
    p.add_argument("--data-dir", required=True, help="SentEval data root (holds MR/, CR/, SUBJ/, MPQA/, SST/, TREC/, MRPC/)")
    p.add_argument("--tasks", default=",".join(TRANSFER_TASKS))
    p.add_argument("--output", required=True, help="metrics JSON")
    p.add_argument("--mrpc-features", default="paper", choices=MRPC_FEATURES,
                   help="paper: [u, v, |u-v|, u*v] (methods.md); code: [|u-v|, u*v] (SentEval's code)")
    p.add_argument("--kfold", type=int, default=KFOLD)
    p.add_argument("--seed", type=int, default=SEED, help="SentEval's classifier seed")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="fp32", choices=["auto", "bf16", "fp32"],
                   help="fp32 (default, as SentEval and the papers); bf16: autocast; auto: bf16 on CUDA only")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--run-meta", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--track", action="store_true")
    p.add_argument("--experiment", default="sentemb")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--run-name", default=None)
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=_cmd_transfer)
