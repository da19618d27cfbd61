"""Transfer tasks under the SentEval protocol (methods.md §0 "Other evaluations"; issues 12 §1, 18 §2).

Frozen sentence embeddings and a linear classifier, as SimCSE, InfoCSE and ArcCSE report MR, CR,
SUBJ, MPQA, SST-2, TREC and MRPC. This module re-implements SentEval's
``senteval/{binary,sst,trec,mrpc}.py``, ``senteval/tools/validation.py`` and
``senteval/tools/classifier.py`` step for step, so that the folds, the regularisation grid, the
ties and the roundings are SentEval's.

**Open choice (classifier).** ``classifier="pytorch"`` (the default) is SentEval's
``usepytorch=True`` path with the classifier config of SimCSE's ``evaluation.py`` (test mode:
``kfold 10``, ``{nhid: 0, optim: adam, batch_size: 64, tenacity: 5, epoch_size: 4}``), which is what
the published SimCSE and InfoCSE transfer numbers came from (ArcCSE reprints SimCSE's and has no
public code); ``classifier="sklearn"`` is SentEval's ``usepytorch=False`` path (scikit-learn
``LogisticRegression``). The folds and the sample order are the same for both; the grids, the fits
and the early stopping differ:

* ``pytorch`` (``LinearProbe``: SentEval's ``PyTorchClassifier`` + ``MLP`` with nhid 0 = one
  ``nn.Linear`` + cross-entropy, Adam with torch's defaults and ``weight_decay`` = l2reg, mini-batches
  of 64 in a fresh numpy permutation per pass, the held-out data scored every ``epoch_size`` passes,
  the best model kept, training stopped at the (``tenacity`` + 1)-th evaluation without improvement,
  counted over the whole run, or after ``max_epoch``): l2reg from {1e-5, 1e-4, 1e-3, 1e-2} for all
  three protocols below. In the CV grids each fold's model early-stops on that fold's held-out part
  (as SentEval does); the final fit of MR/CR/SUBJ/MPQA/TREC/MRPC early-stops on a random 5 % of
  its training data (``validation_split=0.05``), SST-2's on the dev split.
* ``sklearn``: the C grids below, lbfgs with scikit-learn's defaults.

* MR, CR, SUBJ, MPQA (``InnerKFoldClassifier``): k = 10 stratified shuffled folds (seed 1111); in each
  outer fold C (sklearn) is chosen from {2^-2, …, 2^3} by an inner 10-fold CV on the outer training part
  (mean inner accuracy rounded to 2 decimals, first maximum wins), the classifier refit on the
  whole outer training part with that C and scored on the held-out fold. Test accuracy = mean of
  the per-fold accuracies (each rounded to 2 decimals); dev accuracy = mean of the best inner scores.
* SST-2 (``SplitClassifier``): C (sklearn) from {2^-2, …, 2^3} on the given dev split, test on the test split.
* TREC and MRPC (``KFoldClassifier``): C (sklearn) from {2^-1, …, 2^5} by 10-fold CV on the train split,
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

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import SentembError
from .senteval import TRANSFER_TASKS  # noqa: F401  (sentemb.evaluate.transfer.TRANSFER_TASKS, as before)

log = logging.getLogger(__name__)

SEED = 1111  # SentEval's default seed
KFOLD = 10  # SimCSE / InfoCSE / ArcCSE call SentEval with kfold=10
# SentEval's sklearn grids (validation.py, usepytorch=False)
REGS_INNER = [2.0**t for t in range(-2, 4)]  # InnerKFoldClassifier and SplitClassifier
REGS_KFOLD = [2.0**t for t in range(-1, 6)]  # KFoldClassifier
MRPC_FEATURES = ("paper", "code")
# Open choice (module docstring): SentEval's usepytorch=True path (the papers') or its sklearn path.
CLASSIFIERS = ("pytorch", "sklearn")
DEFAULT_CLASSIFIER = "pytorch"
# SentEval's PyTorch grid (validation.py, usepytorch=True: ``[10**t for t in range(-5, -1)]``), all protocols
REGS_TORCH = [10.0**t for t in range(-5, -1)]
VALIDATION_SPLIT = 0.05  # validation.py: held-out share of the final fit (InnerKFold- and KFoldClassifier)
# what each classifier is, in words (the output JSON's protocol and the transfer table's header)
CLASSIFIER_DESCRIPTIONS = {
    "pytorch": "SentEval's PyTorch logistic regression (nhid 0, Adam, batch 64, tenacity 5, epoch_size 4, "
               "l2reg 1e-5…1e-2)",
    "sklearn": "scikit-learn LogisticRegression (SentEval's usepytorch=False path and C grids)",
}

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
    raw = path.read_bytes()
    try:
        return raw.decode(encoding).splitlines()
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SentembError(f"{path}, line {line}: not valid {encoding} ({e.reason})") from None


def _trainable(task: TransferTask, files: list[Path]) -> TransferTask:
    """``task`` when a classifier can be fitted on it: every split holds samples, and the one it is
    trained on (``all`` or ``train``) both classes or more (else sklearn fails after the encoding)."""
    where = ", ".join(map(str, files))
    for name, (_, y) in task.splits.items():
        if not y:
            raise SentembError(f"transfer task {task.name}: its {name} split holds no samples ({where})")
    train = task.splits.get("all") or task.splits["train"]
    if len(set(train[1])) < 2:
        raise SentembError(f"transfer task {task.name}: its training samples are all of one class ({where})")
    return task


def check_folds(task: TransferTask, k: int) -> None:
    """A k-fold task (``innerkfold``, ``kfold``) needs at least ``k`` training samples."""
    if task.kind in ("innerkfold", "kfold"):
        n = len((task.splits.get("all") or task.splits["train"])[1])
        if n < k:
            raise SentembError(f"transfer task {task.name}: {n} training samples, fewer than the {k} folds (--kfold)")


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
        return _trainable(TransferTask(task, "innerkfold", {"all": ([_join(t) for t in x], y)}), files)
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
        return _trainable(TransferTask(task, "split", splits), files)
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
        return _trainable(TransferTask(task, "kfold", splits), files)
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
    return _trainable(TransferTask(task, "mrpc", splits), files)


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


# ------------------------------------------------------------------- SentEval's PyTorch classifier
@dataclass(frozen=True)
class TorchProbeConfig:
    """SentEval's classifier config as SimCSE's ``evaluation.py`` passes it in test mode
    (``{'nhid': 0, 'optim': 'adam', 'batch_size': 64, 'tenacity': 5, 'epoch_size': 4}``), and
    ``senteval/tools/classifier.py`` ``MLP``'s default for the rest (``max_epoch`` 200; dropout is
    unused with nhid 0). nhid 0 (one linear layer) and Adam with torch's defaults (lr 1e-3, betas
    (0.9, 0.999), eps 1e-8) are what every paper here used, so they are fixed, not switches."""

    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200


TORCH_PROBE = TorchProbeConfig()


class _one_torch_thread:
    """Run the classifier on one intra-op torch thread, restoring the caller's setting afterwards
    (``--threads`` still sets the encoder's). Its products are 64 × d by d × classes, too small to
    share: on this project's shared 2-core machine two threads were 8–16× slower than one and gave
    bit-identical weights (a CR fit; docs/evaluation.md). One thread also makes the numbers
    independent of the machine's thread count."""

    def __enter__(self):
        import torch

        self.n = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.n)
        return False


def _probe_gradients(X, y, W, b, unit=None) -> tuple:
    """``(W.grad, b.grad)`` that ``F.cross_entropy(F.linear(X, W, b), y).backward()`` leaves, by the
    aten ops its graph runs (torch 2.13): ``linear`` is ``addmm(b, X, W.t())``; ``cross_entropy`` is
    ``nll_loss`` (mean) of ``log_softmax``; backward: ``nll_loss_backward`` of a unit gradient,
    ``_log_softmax_backward_data``, then addmm's ``mm_mat2_backward`` (``g.t().mm(X)``, the weight
    being a transposed operand) and the bias's broadcast summed back (``g.sum(0)``). Call it under
    ``torch.no_grad()``. Bit-identical to the autograd step (tests/test_transfer.py) and free of the
    graph's bookkeeping, which was half of the classifier's time. ``unit``: the loss's unit gradient
    (``torch.ones((), dtype=...)`` of the logits' dtype), made once by a caller that steps many times."""
    import torch
    import torch.nn.functional as F

    aten = torch.ops.aten
    z = F.linear(X, W, b)
    lsm = torch.log_softmax(z, 1)
    _, total_weight = aten.nll_loss_forward(lsm, y, None, 1, -100)  # reduction 1 = mean, ignore_index -100
    if unit is None or unit.dtype != z.dtype:
        unit = torch.ones((), dtype=z.dtype)
    g = aten.nll_loss_backward(unit, lsm, y, None, 1, -100, total_weight)
    g = aten._log_softmax_backward_data(g, lsm, 1, z.dtype)
    return g.t().mm(X), g.sum(0)


class _AdamUpdate:
    """``torch.optim.Adam.step`` for the given gradients of its parameters, with the optimizer's own
    hyperparameters: its single-tensor update for CPU tensors (torch 2.13 ``_single_tensor_adam``,
    not capturable, no AMSGrad, L2 ``weight_decay`` added to the gradient) in the same ops and
    order, without the optimizer's per-step dispatch. The step count is a Python number, as
    ``step_t.item()`` gives it there. The hyperparameters are read from the optimizer's group at
    every step (SentEval sets ``param_groups[0]['weight_decay']`` after building it); any setting
    that would take another code path there is refused."""

    def __init__(self, optimizer):
        import torch

        if len(optimizer.param_groups) != 1:
            raise ValueError("_AdamUpdate restates one parameter group")
        self.group = group = optimizer.param_groups[0]
        other = [k for k in ("amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable",
                             "decoupled_weight_decay") if group.get(k)]
        if isinstance(group["lr"], torch.Tensor):
            other.append("a tensor lr")
        if any(p.is_complex() or p.device.type != "cpu" for p in group["params"]):
            other.append("complex or non-CPU parameters")
        if other:
            raise ValueError(f"_AdamUpdate restates plain Adam on real CPU tensors only, not with {', '.join(other)}")
        self.params = list(group["params"])
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = 0

    def step(self, grads) -> None:
        g = self.group
        lr, (beta1, beta2), eps, weight_decay = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        self.steps += 1
        step = float(self.steps)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        for param, grad, exp_avg, exp_avg_sq in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            if weight_decay != 0:
                grad = grad.add(param, alpha=weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)


class LinearProbe:
    """SentEval's ``PyTorchClassifier`` + ``MLP`` with nhid = 0 (``senteval/tools/classifier.py``), on CPU.

    The same torch ops in the same order as SentEval, so the same floats on CPU:

    * ``__init__``: SentEval seeds the global numpy RNG (``np.random.seed(seed)``) and torch
      (``torch.manual_seed(seed)``) and then builds ``nn.Linear(dim, nclasses)``; here a private
      ``np.random.RandomState(seed)`` (the same stream as the seeded global one) and torch's CPU
      generator seeded inside ``torch.random.fork_rng``, so no global RNG state changes. Loss
      ``nn.CrossEntropyLoss()``'s mean (SentEval's later ``size_average = False`` assignment has no
      effect on a constructed loss since torch 0.4.1), optimizer ``torch.optim.Adam`` with
      ``weight_decay = l2reg`` (SentEval sets ``param_groups[0]['weight_decay']``).
    * ``fit`` (``fit`` + ``prepare_split`` + ``trainepoch``): with ``validation_split`` the first
      ``int(split · n)`` entries of one RandomState permutation are held out; then, while not stopped and
      ``nepoch <= max_epoch``: ``epoch_size`` passes, each over a fresh permutation in mini-batches of
      ``batch_size`` (forward, loss, ``zero_grad``, ``backward``, ``step``), ``nepoch += epoch_size``,
      accuracy on the held-out data; a better accuracy keeps a copy of the model, otherwise the
      stop fires once ``tenacity`` earlier non-improvements were counted (the count is never reset).
      The best model is restored. Shortcuts that give the same floats: each pass's rows are gathered
      once (``index_select`` by the permutation, then slices) instead of per mini-batch; the step
      calls what the modules' ``forward`` calls (``F.linear``, ``F.cross_entropy``); the gradients
      are the aten backward ops autograd records for them, called directly without a graph
      (``_probe_gradients``); and Adam's update is torch's own single-tensor update restated
      (``_AdamUpdate``). Bit for bit against the restated SentEval loop with ``torch.optim.Adam``
      and ``backward()`` (``tests/test_transfer.py``, at 5 and at 384 dimensions). Per step at 384
      dimensions (``scripts/bench_classifier.py``, 2 classes, one thread, this project's 2-core
      machine): 200 µs, against 400 µs with ``backward()`` and ``Adam.step`` and 518 µs for
      SentEval's own step.
    * ``score``/``predict``: the model in batches of ``batch_size``, ``max(1)[1]`` as the class.
    """

    def __init__(self, dim: int, nclasses: int, l2reg: float, *, seed: int = SEED,
                 config: TorchProbeConfig = TORCH_PROBE):
        import torch

        self.config = config
        self.rng = np.random.RandomState(seed)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            self.model = torch.nn.Linear(dim, nclasses)
        self.optimizer = torch.optim.Adam(self.model.parameters(), weight_decay=l2reg)  # its hyperparameters
        self.adam = _AdamUpdate(self.optimizer)
        self.nepoch = 0

    @staticmethod
    def _tensors(X, y):
        import torch

        return (torch.as_tensor(np.asarray(X), dtype=torch.float32),
                torch.as_tensor(np.asarray(y), dtype=torch.int64))

    def fit(self, X: np.ndarray, y: np.ndarray, *, validation_data: tuple | None = None,
            validation_split: float | None = None) -> float:
        """Train with early stopping on ``validation_data`` or on a random ``validation_split`` of
        (X, y); returns the best held-out accuracy (in [0, 1]) and keeps that model."""
        import torch

        cfg = self.config
        if validation_data is not None:
            Xtr, ytr = self._tensors(X, y)
            Xdv, ydv = self._tensors(*validation_data)
        elif validation_split:
            perm = self.rng.permutation(len(X))
            cut = int(validation_split * len(X))
            X, y = np.asarray(X), np.asarray(y)
            Xtr, ytr = self._tensors(X[perm[cut:]], y[perm[cut:]])
            Xdv, ydv = self._tensors(X[perm[:cut]], y[perm[:cut]])
        else:
            raise SentembError("LinearProbe.fit needs validation_data or validation_split (SentEval's early stopping)")
        if len(Xdv) == 0:
            raise SentembError(f"transfer classifier: no held-out samples for early stopping ({len(X)} training "
                               f"samples, validation_split={validation_split})")
        n, bs = len(Xtr), cfg.batch_size
        W, b = self.model.weight, self.model.bias
        unit = torch.ones((), dtype=torch.result_type(Xtr[:1], W))  # the loss's unit gradient, in the logits' dtype
        self.nepoch, best, bad, stop, best_state = 0, -1.0, 0, False, None
        while not stop and self.nepoch <= cfg.max_epoch:
            self.model.train()
            for _ in range(cfg.epoch_size):
                perm = torch.from_numpy(self.rng.permutation(n)).long()
                Xp, yp = Xtr.index_select(0, perm), ytr.index_select(0, perm)
                with torch.no_grad():
                    for i in range(0, n, bs):
                        self.adam.step(_probe_gradients(Xp[i:i + bs], yp[i:i + bs], W, b, unit))
            self.nepoch += cfg.epoch_size
            acc = self._score(Xdv, ydv)
            if acc > best:
                best = acc
                best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            else:
                if bad >= cfg.tenacity:
                    stop = True
                bad += 1
        self.model.load_state_dict(best_state)
        return best

    def _logits_batches(self, X):
        import torch

        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(X), self.config.batch_size):
                yield i, self.model(X[i:i + self.config.batch_size])

    def _score(self, X, y) -> float:
        bs = self.config.batch_size
        correct = sum(int(out.max(1)[1].eq(y[i:i + bs]).sum()) for i, out in self._logits_batches(X))
        return 1.0 * correct / len(X)

    def score(self, X: np.ndarray, y: np.ndarray) -> float:
        return self._score(*self._tensors(X, y))

    def predict(self, X: np.ndarray) -> np.ndarray:
        Xt, _ = self._tensors(X, np.zeros(0))
        parts = [out.max(1)[1].numpy() for _, out in self._logits_batches(Xt)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _nclasses(*ys) -> int:
    return int(max(int(np.max(y)) for y in ys if len(y))) + 1


def inner_kfold_torch(X: np.ndarray, y: np.ndarray, *, k: int = KFOLD, seed: int = SEED,
                      regs: Sequence[float] = REGS_TORCH, nclasses: int | None = None,
                      config: TorchProbeConfig = TORCH_PROBE) -> dict:
    """SentEval's ``InnerKFoldClassifier`` with ``usepytorch=True`` (MR, CR, SUBJ, MPQA): the folds of
    ``inner_kfold``; every inner fit early-stops on its inner held-out fold and is scored there; the
    outer refit with the chosen l2reg early-stops on a random 5 % of the outer training part.
    The inner score is ``fit``'s best held-out accuracy, which is what SentEval's ``clf.score`` of the
    restored best model on the same fold returns. Returns {"devacc", "acc", "l2reg"}."""
    from sklearn.model_selection import StratifiedKFold

    nclasses = nclasses or _nclasses(y)
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    inner = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    dev, test, chosen = [], [], []
    with _one_torch_thread():
        for tr, te in skf.split(X, y):
            Xtr, ytr = X[tr], y[tr]
            scores = []
            for reg in regs:
                s = [LinearProbe(X.shape[1], nclasses, reg, seed=seed, config=config)
                     .fit(Xtr[a], ytr[a], validation_data=(Xtr[b], ytr[b])) for a, b in inner.split(Xtr, ytr)]
                scores.append(round(100 * np.mean(s), 2))
            best = int(np.argmax(scores))
            dev.append(np.max(scores))
            chosen.append(regs[best])
            clf = LinearProbe(X.shape[1], nclasses, regs[best], seed=seed, config=config)
            clf.fit(Xtr, ytr, validation_split=VALIDATION_SPLIT)
            test.append(round(100 * clf.score(X[te], y[te]), 2))
    return {"devacc": round(float(np.mean(dev)), 2), "acc": round(float(np.mean(test)), 2), "l2reg": chosen}


def kfold_torch(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray, *, k: int = KFOLD,
                seed: int = SEED, regs: Sequence[float] = REGS_TORCH, nclasses: int | None = None,
                config: TorchProbeConfig = TORCH_PROBE) -> dict:
    """SentEval's ``KFoldClassifier`` with ``usepytorch=True`` (TREC, MRPC): l2reg by k-fold CV on train
    (each fold's fit early-stops on that fold), refit on train with a random 5 % held out for early
    stopping, test. Returns {"devacc", "acc", "l2reg", "yhat"}."""
    from sklearn.model_selection import StratifiedKFold

    nclasses = nclasses or _nclasses(ytr, yte)
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    scores = []
    with _one_torch_thread():
        for reg in regs:
            s = [LinearProbe(Xtr.shape[1], nclasses, reg, seed=seed, config=config)
                 .fit(Xtr[a], ytr[a], validation_data=(Xtr[b], ytr[b])) for a, b in skf.split(Xtr, ytr)]
            scores.append(round(100 * np.mean(s), 2))
        best = int(np.argmax(scores))
        clf = LinearProbe(Xtr.shape[1], nclasses, regs[best], seed=seed, config=config)
        clf.fit(Xtr, ytr, validation_split=VALIDATION_SPLIT)
        yhat = clf.predict(Xte)
        acc = round(100 * clf.score(Xte, yte), 2)
    return {"devacc": float(np.max(scores)), "acc": acc, "l2reg": regs[best], "yhat": yhat}


def split_classifier_torch(Xtr, ytr, Xdev, ydev, Xte, yte, *, seed: int = SEED, regs: Sequence[float] = REGS_TORCH,
                           nclasses: int | None = None, config: TorchProbeConfig = TORCH_PROBE) -> dict:
    """SentEval's ``SplitClassifier`` with ``usepytorch=True`` (SST-2): per l2reg a fit that early-stops
    on the dev split, l2reg by dev accuracy, test on the test split. SentEval then refits with the
    chosen l2reg, the same seed and the same data, which gives the same model: the grid's is kept."""
    nclasses = nclasses or _nclasses(ytr, ydev, yte)
    scores, models = [], []
    with _one_torch_thread():
        for reg in regs:
            clf = LinearProbe(Xtr.shape[1], nclasses, reg, seed=seed, config=config)
            clf.fit(Xtr, ytr, validation_data=(Xdev, ydev))
            scores.append(round(100 * clf.score(Xdev, ydev), 2))
            models.append(clf)
        best = int(np.argmax(scores))
        acc = round(100 * models[best].score(Xte, yte), 2)
    return {"devacc": float(np.max(scores)), "acc": acc, "l2reg": regs[best]}


def mrpc_features(a: np.ndarray, b: np.ndarray, mode: str = "paper") -> np.ndarray:
    """Pair features: ``paper`` = [u, v, |u − v|, u ⊙ v] (methods.md; InfoCSE/ArcCSE's description),
    ``code`` = [|u − v|, u ⊙ v] (SentEval's ``mrpc.py``)."""
    if mode == "paper":
        return np.concatenate([a, b, np.abs(a - b), a * b], axis=1)
    if mode == "code":
        return np.concatenate([np.abs(a - b), a * b], axis=1)
    raise SentembError(f"mrpc_features must be one of {MRPC_FEATURES}, not '{mode}'")


# ------------------------------------------------------------------------------------- evaluation
def _check_classifier(classifier: str) -> None:
    if classifier not in CLASSIFIERS:
        raise SentembError(f"transfer classifier (config key evaluation.transfer_classifier, CLI --classifier) "
                           f"must be one of {CLASSIFIERS}, not '{classifier}'")


def task_sentences(task: TransferTask) -> list[str]:
    """The task's distinct sentences in first-seen order: what is encoded, once each."""
    return list(dict.fromkeys(task.sentences()))


def sentences_digest(sents: Sequence[str]) -> str:
    """sha256 of the encoded sentences, stored next to their vectors so that a features file is
    never classified against other text than it was encoded from."""
    import hashlib

    return hashlib.sha256("\n".join(sents).encode("utf-8")).hexdigest()


def encode_task(embed: Callable[[Sequence[str]], np.ndarray], task: TransferTask) -> tuple[np.ndarray, dict]:
    """Stage 1 of a task, the only one a GPU helps: every distinct sentence encoded once.
    Returns the vectors (rows in ``task_sentences`` order) and the encoding's counts."""
    t0 = time.time()
    sents = task_sentences(task)
    vecs = np.asarray(embed(sents), dtype=np.float32) if sents else np.zeros((0, 1), np.float32)
    t_enc = time.time() - t0
    return vecs, {"n_sentences": len(sents), "encode_seconds": round(t_enc, 2),
                  "sentences_per_second": round(len(sents) / max(t_enc, 1e-9), 1)}


def classify_task(task: TransferTask, vecs: np.ndarray, *, k: int = KFOLD, seed: int = SEED,
                  mrpc_mode: str = "paper", classifier: str = DEFAULT_CLASSIFIER) -> dict:
    """Stage 2 of a task, CPU only: SentEval's classifier for its kind (``classifier``: ``pytorch`` =
    SentEval's usepytorch=True path, ``sklearn`` = its sklearn path) on the vectors of
    ``encode_task`` (rows in ``task_sentences`` order)."""
    _check_classifier(classifier)
    torch_path = classifier == "pytorch"
    sents = task_sentences(task)
    if len(vecs) != len(sents):
        raise SentembError(f"transfer task {task.name}: {len(vecs)} vectors for {len(sents)} sentences")
    pos = {s: i for i, s in enumerate(sents)}

    def E(xs):
        return vecs[[pos[s] for s in xs]]

    out: dict = {}
    t1 = time.time()
    if task.kind == "innerkfold":
        x, y = task.splits["all"]
        r = (inner_kfold_torch(E(x), np.asarray(y), k=k, seed=seed, nclasses=2) if torch_path
             else inner_kfold(E(x), np.asarray(y), k=k, seed=seed))
        out.update(n={"all": len(y)})
    elif task.kind == "split":
        (xa, ya), (xd, yd), (xt, yt) = (task.splits[s] for s in ("train", "dev", "test"))
        args = (E(xa), np.asarray(ya), E(xd), np.asarray(yd), E(xt), np.asarray(yt))
        r = split_classifier_torch(*args, seed=seed, nclasses=2) if torch_path else split_classifier(*args, seed=seed)
        out.update(n={"train": len(ya), "dev": len(yd), "test": len(yt)})
    elif task.kind == "kfold":
        (xa, ya), (xt, yt) = task.splits["train"], task.splits["test"]
        args = (E(xa), np.asarray(ya), E(xt), np.asarray(yt))
        r = (kfold_torch(*args, k=k, seed=seed, nclasses=len(TREC_CLASSES)) if torch_path
             else kfold(*args, k=k, seed=seed))
        r.pop("yhat")
        out.update(n={"train": len(ya), "test": len(yt)})
    else:
        from sklearn.metrics import f1_score

        ((a_tr, b_tr), ytr), ((a_te, b_te), yte) = task.splits["train"], task.splits["test"]
        Ftr = mrpc_features(E(a_tr), E(b_tr), mrpc_mode)
        Fte = mrpc_features(E(a_te), E(b_te), mrpc_mode)
        args = (Ftr, np.asarray(ytr), Fte, np.asarray(yte))
        r = kfold_torch(*args, k=k, seed=seed, nclasses=2) if torch_path else kfold(*args, k=k, seed=seed)
        r["f1"] = round(100 * float(f1_score(np.asarray(yte), r.pop("yhat"))), 2)
        out.update(n={"train": len(ytr), "test": len(yte)}, features=mrpc_mode)
    out.update(r)
    out["classifier"] = classifier
    out["classifier_seconds"] = round(time.time() - t1, 2)
    return out


def evaluate_task(embed: Callable[[Sequence[str]], np.ndarray], task: TransferTask, *, k: int = KFOLD,
                  seed: int = SEED, mrpc_mode: str = "paper", classifier: str = DEFAULT_CLASSIFIER) -> dict:
    """``encode_task`` then ``classify_task``: one task end to end in this process."""
    _check_classifier(classifier)
    vecs, enc = encode_task(embed, task)
    out = classify_task(task, vecs, k=k, seed=seed, mrpc_mode=mrpc_mode, classifier=classifier)
    out.update(enc)
    out["seconds"] = round(enc["encode_seconds"] + out["classifier_seconds"], 2)
    return out


# ------------------------------------------------------------- features: encode here, classify there
FEATURES_FORMAT = 1


def write_features(path: str | Path, vectors: dict[str, np.ndarray], tasks: Sequence[TransferTask], meta: dict) -> Path:
    """Write ``sentemb encode-transfer``'s file: per task its vectors (float32, rows in
    ``task_sentences`` order) and the digest of those sentences, plus ``meta`` (model, pooler,
    encoding counts per task) as JSON. Written to a temporary name and renamed, so a killed job
    never leaves a file that looks finished. Uncompressed ``.npz`` (no pickle)."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"meta": np.array(json.dumps({**meta, "format": FEATURES_FORMAT}))}
    for t in tasks:
        arrays[f"{t.name}"] = np.ascontiguousarray(vectors[t.name], dtype=np.float32)
        arrays[f"{t.name}.digest"] = np.array(sentences_digest(task_sentences(t)))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def _features(path: str | Path):
    """The open features file and its checked JSON ``meta`` (one read of the archive); a clear error
    naming the file when it is not one."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise SentembError(f"transfer features file not found: {path} (written by `sentemb encode-transfer`)")
    try:
        z = np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise SentembError(f"{path}: not a transfer features file of `sentemb encode-transfer` ({e!r}); "
                           "delete it and encode again") from None
    with z:
        try:
            meta = json.loads(str(z["meta"]))
        except (zipfile.BadZipFile, OSError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise SentembError(f"{path}: not a transfer features file of `sentemb encode-transfer` ({e!r}); "
                               "delete it and encode again") from None
        if meta.get("format") != FEATURES_FORMAT:
            raise SentembError(f"{path}: features format {meta.get('format')!r}, this sentemb reads "
                               f"{FEATURES_FORMAT}; encode again")
        yield z, meta


def read_features_meta(path: str | Path) -> dict:
    """The JSON ``meta`` of a features file; a clear error naming the file when it is not one."""
    with _features(path) as (_, meta):
        return meta


def read_features(path: str | Path, task: TransferTask) -> np.ndarray:
    """The vectors of ``task`` from a features file, checked against the task's sentences as they
    are read now (a changed data file or another task list is an error, never a silent mismatch)."""
    with _features(path) as (z, _):
        if task.name not in z.files:
            held = sorted(f for f in z.files if f != "meta" and not f.endswith(".digest"))
            raise SentembError(f"{path}: no vectors of transfer task {task.name} (it holds {', '.join(held)}); "
                               "encode with that task in --tasks")
        vecs, digest = z[task.name], str(z[f"{task.name}.digest"])
    sents = task_sentences(task)
    if digest != sentences_digest(sents) or len(vecs) != len(sents):
        raise SentembError(f"{path}: the vectors of {task.name} were encoded from other sentences than the data "
                           f"directory holds now ({len(sents)} distinct sentences); encode again")
    return vecs


def _classify_from_file(features: str, data_dir: str, task: str, k: int, seed: int, mrpc_mode: str,
                        classifier: str) -> dict:
    """One task's classifier in a worker process: it reads its own task and vectors (nothing large
    crosses the process boundary)."""
    t = load_transfer_task(data_dir, task)
    return classify_task(t, read_features(features, t), k=k, seed=seed, mrpc_mode=mrpc_mode, classifier=classifier)


#: CPU seconds of SentEval's PyTorch classifier per task for 384-d vectors (MRPC: its 768-d ``code``
#: features) on this project's 2-core CPU (docs/evaluation.md): the seconds measured with the autograd
#: loop (MR 279, CR 110, SUBJ 297, MPQA 273, SST2 26, TREC 28, MRPC 14) × 0.52, the CPU
#: time of ``LinearProbe.fit`` with the direct gradients over the autograd loop's on the same CR fits,
#: side by side (2026-11-30; the same steps: the same floats stop early at the same epoch). The order in
#: which worker processes take tasks (longest first) and ``sentemb plan``'s classifier estimate.
CLASSIFIER_SECONDS_384 = {"MR": 145, "CR": 57, "SUBJ": 154, "MPQA": 142, "SST2": 14, "TREC": 15, "MRPC": 7}
#: sklearn's path costs about this share of the PyTorch one (docs/evaluation.md: 69 vs 534 s)
SKLEARN_COST_SHARE = 0.13
#: one mini-batch step of the PyTorch classifier costs about STEP_US[0] + STEP_US[1] · features µs
#: (``LinearProbe`` on one thread, batch 64, 2 classes, 384…4096 features; this project's CPU,
#: ``scripts/bench_classifier.py``, 2026-11-30): only the ratio between widths is used
STEP_US = (172.0, 0.048)


def feature_dim(task: str, dim: int, mrpc_mode: str = "paper") -> int:
    """The classifier's input width for ``task`` on ``dim``-d sentence vectors."""
    if task != "MRPC":
        return dim
    return 4 * dim if mrpc_mode == "paper" else 2 * dim


def classifier_seconds(task: str, dim: int, *, mrpc_mode: str = "paper", classifier: str = DEFAULT_CLASSIFIER) -> float:
    """Estimated CPU seconds of ``task``'s classifier on ``dim``-d vectors: the measured 384-d cost
    scaled by the per-step cost at the feature width (same number of steps: early stopping is
    assumed to stop where it did at 384-d)."""
    base_dim = feature_dim(task, 384, "code")
    a, b = STEP_US
    s = CLASSIFIER_SECONDS_384[task] * (a + b * feature_dim(task, dim, mrpc_mode)) / (a + b * base_dim)
    return s * (SKLEARN_COST_SHARE if classifier == "sklearn" else 1.0)


def classifier_wall_seconds(seconds: Sequence[float], workers: int) -> float:
    """Wall time of tasks of these CPU ``seconds`` on ``workers`` processes, longest first (as
    ``classify_tasks`` submits them)."""
    loads = [0.0] * max(1, min(workers, len(seconds) or 1))
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def classify_tasks(features: str | Path, data_dir: str | Path, tasks: Sequence[str], *, k: int = KFOLD,
                   seed: int = SEED, mrpc_mode: str = "paper", classifier: str = DEFAULT_CLASSIFIER,
                   workers: int = 1) -> dict[str, dict]:
    """Every task's classifier from a features file, ``workers`` tasks at a time in their own
    processes (longest first). Each task's classifier has its own seeded RNGs and runs on one
    thread, so the numbers are those of ``workers=1`` (tests/test_transfer.py checks it)."""
    _check_classifier(classifier)
    loaded = {t: load_transfer_task(data_dir, t) for t in tasks}
    for t in loaded.values():  # every task's vectors checked before the first fit
        read_features(features, t)
    opts = dict(k=k, seed=seed, mrpc_mode=mrpc_mode, classifier=classifier)
    workers = max(1, min(workers, len(tasks)))
    out: dict[str, dict] = {}
    if workers == 1:
        for t in tasks:
            out[t] = classify_task(loaded[t], read_features(features, loaded[t]), **opts)
            log.info("%s: acc %.2f (dev %.2f), classifier %.1f s", t, out[t]["acc"], out[t]["devacc"],
                     out[t]["classifier_seconds"])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(tasks, key=lambda t: -CLASSIFIER_SECONDS_384[t])
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that has started torch's threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_classify_from_file, str(features), str(data_dir), t, k, seed, mrpc_mode, classifier): t
                   for t in order}
        try:
            for f in as_completed(futures):
                t = futures[f]
                out[t] = f.result()
                log.info("%s: acc %.2f (dev %.2f), classifier %.1f s", t, out[t]["acc"], out[t]["devacc"],
                         out[t]["classifier_seconds"])
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the tasks not started are dropped, the running ones
            pool.shutdown(wait=False, cancel_futures=True)  # ended, not waited for (spawned workers
            for proc in list(getattr(pool, "_processes", {}).values()):  # keep the default SIGTERM)
                proc.terminate()
            raise
    return {t: out[t] for t in tasks}


def summarize(tasks: Sequence[str], details: dict[str, dict]) -> dict:
    """{task: accuracy × 100, "MRPC_F1": …, "avg": mean accuracy, "details": {…}} of per-task results."""
    res: dict = {}
    for t in tasks:
        res[t] = details[t]["acc"]
        if "f1" in details[t]:
            res["MRPC_F1"] = details[t]["f1"]
    res["avg"] = round(float(np.mean([res[t] for t in tasks])), 4) if tasks else float("nan")
    res["details"] = {t: details[t] for t in tasks}
    return res


def evaluate_transfer(embed, data_dir: str | Path, tasks: Sequence[str] = TRANSFER_TASKS, *, k: int = KFOLD,
                      seed: int = SEED, mrpc_mode: str = "paper", classifier: str = DEFAULT_CLASSIFIER,
                      workers: int = 1) -> dict:
    """All ``tasks``: {task: accuracy × 100, "MRPC_F1": …, "avg": mean accuracy, "details": {…}}.
    Every task's files are read (and checked) before anything is encoded. With ``workers`` > 1 the
    tasks are encoded here, then classified ``workers`` at a time in processes of their own."""
    _check_classifier(classifier)
    loaded = [load_transfer_task(data_dir, t) for t in tasks]
    details = {}
    if workers <= 1 or len(loaded) <= 1:
        for task in loaded:
            d = evaluate_task(embed, task, k=k, seed=seed, mrpc_mode=mrpc_mode, classifier=classifier)
            log.info("%s: acc %.2f (dev %.2f) in %.1f s", task.name, d["acc"], d["devacc"], d["seconds"])
            details[task.name] = d
        return summarize(tasks, details)
    import tempfile

    vectors, enc = {}, {}
    for task in loaded:
        vectors[task.name], enc[task.name] = encode_task(embed, task)
    with tempfile.TemporaryDirectory(prefix="sentemb-transfer-") as d:
        feats = write_features(Path(d) / "features.npz", vectors, loaded, {"encoding": enc})
        details = classify_tasks(feats, data_dir, tasks, k=k, seed=seed, mrpc_mode=mrpc_mode, classifier=classifier,
                                 workers=workers)
    for t in tasks:
        details[t].update(enc[t])
        details[t]["seconds"] = round(enc[t]["encode_seconds"] + details[t]["classifier_seconds"], 2)
    return summarize(tasks, details)
