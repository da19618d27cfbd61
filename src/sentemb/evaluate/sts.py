"""STS evaluation under the SentEval protocol as SimCSE and the seed papers use it (methods.md §0).

Score = Spearman × 100 between the cosine similarity of the two sentence embeddings and the gold
score. STS12–16 are scored in the "all" setting (one Spearman over the concatenation of the
task's subsets); "mean" and "wmean" (the plain and pair-weighted mean of per-subset Spearman, as
SentEval reports them) are also computed. STS-B and SICK-R use their test split. ``avg`` is the mean
over the evaluated tasks. Sentences are never truncated below the model's maximum length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import SentembError
from ..model.encoder import EmbedFn, Embedder
from .senteval import TASKS, Pairs, load_task

def embedder_for(model_dir: str | Path, pooler: str, *, device="auto", batch_size: int = 128,
                 max_length: int | None = None, progress: bool = False, precision: str = "fp32") -> EmbedFn:
    """The embedder of a model directory: an encoder + ``pooler``, or, with ``pooler="method"``, the
    embedder the training method defines (``Method.load_embedder``, named by the model's ``sentemb.json``)."""
    if pooler != "method":
        return Embedder.from_dir(model_dir, pooler, device=device, batch_size=batch_size, max_length=max_length,
                                 progress=progress, precision=precision)
    from ..methods import get_method
    from ..utils import resolve_device

    if max_length is not None:  # the method's embedder builds its own rows (PromptBERT's template)
        raise SentembError(f"--max-length {max_length} does not apply with --pooler method: the method's embedder "
                           "sets its rows' length itself (leave --max-length out, or pick an encoder pooler)")
    meta_file = Path(model_dir) / "sentemb.json"
    if not meta_file.is_file():
        raise SentembError(f"--pooler method: {meta_file} not found (only models exported by `sentemb train` "
                           "carry their method's embedder; use an encoder pooler instead)")
    try:
        meta = json.loads(meta_file.read_text("utf-8"))
        name = meta["method"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SentembError(f"{meta_file}: no method name in it ({e!r})") from None
    _import_plugin(name, meta, Path(model_dir))
    return get_method(name).load_embedder(model_dir, resolve_device(device), batch_size, precision)


def _import_plugin(name: str, meta: dict, model_dir: Path) -> None:
    """A method from the user's code (config ``method_modules``) is imported before its embedder is
    looked up, as the training job imports it: by the ``method_module`` of the model's ``sentemb.json``,
    else of its run's ``run_config.json`` (the run directory holding ``model/``); paths relative to
    the working directory, as in the config."""
    from ..methods import import_method_module, registry

    if name in registry():
        return
    spec = meta.get("method_module")
    run_file = model_dir.parent / "run_config.json"
    if not spec and run_file.is_file():
        try:
            spec = json.loads(run_file.read_text("utf-8")).get("method_module")
        except (json.JSONDecodeError, AttributeError):
            spec = None
    if spec:
        import_method_module(spec, f"{model_dir}: method_module")


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    return np.nan_to_num((a * b).sum(1) / np.maximum(na * nb, 1e-12))


def aggregate(subsets: list[tuple[str, np.ndarray, np.ndarray]]) -> dict:
    """Per-subset Spearman/Pearson and the "all" / "mean" / "wmean" aggregates (SentEval's STSEval).

    ``subsets`` holds (name, system scores, gold scores). Figures are raw correlations (not × 100).
    """
    from scipy.stats import pearsonr, spearmanr

    per = {}
    for name, sys_s, gold in subsets:
        per[name] = {"spearman": float(spearmanr(sys_s, gold)[0]), "pearson": float(pearsonr(sys_s, gold)[0]), "n": int(len(gold))}
    n = np.array([v["n"] for v in per.values()], dtype=float)
    sp = np.array([v["spearman"] for v in per.values()])
    all_sys = np.concatenate([s for _, s, _ in subsets])
    all_gold = np.concatenate([g for _, _, g in subsets])
    return {
        "all": float(spearmanr(all_sys, all_gold)[0]),
        "mean": float(np.mean(sp)),
        "wmean": float(np.average(sp, weights=n)),
        "n": int(n.sum()),
        "subsets": per,
    }


def score_task(embed: EmbedFn, pairs: list[Pairs]) -> dict:
    subsets = []
    for p in pairs:
        e1, e2 = embed(p.sent1), embed(p.sent2)
        subsets.append((p.subset, cosine_pairs(e1, e2), np.asarray(p.gold, dtype=np.float64)))
    return aggregate(subsets)


def evaluate_sts(embed: EmbedFn, data_dir: str | Path, tasks: Sequence[str] = TASKS, setting: str = "all",
                 split: str = "test") -> dict:
    """Evaluate ``embed`` on ``tasks``; returns {task: Spearman×100, ..., "avg": ..., "details": {...}}.

    ``details[task]`` holds "all", "mean", "wmean", "n" and per-subset Spearman/Pearson/n, all × 100.
    """
    if setting not in ("all", "mean", "wmean"):
        raise SentembError(f"setting must be all, mean or wmean, not '{setting}'")
    loaded = {t: load_task(data_dir, t, split) for t in tasks}  # fail on bad data before encoding
    # One pass over all unique sentences of all tasks: sorting by length across tasks pads less.
    everything = [s for ps in loaded.values() for p in ps for s in (*p.sent1, *p.sent2)]
    cache_keys = list(dict.fromkeys(everything))
    cache = dict(zip(cache_keys, embed(cache_keys)))

    def cached(sents):
        return np.stack([cache[s] for s in sents])

    result, details = {}, {}
    for t, pairs in loaded.items():
        agg = score_task(cached, pairs)
        details[t] = _times100(agg)
        # STS-B and SICK-R have one split: all = mean = wmean = its Spearman.
        result[t] = details[t][setting]
    result["avg"] = float(np.mean([result[t] for t in tasks]))
    result["details"] = details
    result["n_sentences"] = len(cache_keys)
    if "STSBenchmark" in loaded and split == "test":  # from the same encoding pass (issue 12 §2)
        p = loaded["STSBenchmark"][0]
        result["geometry"] = geometry(cached(p.sent1), cached(p.sent2), np.asarray(p.gold, dtype=np.float64),
                                      cached(list(dict.fromkeys([*p.sent1, *p.sent2]))))
    return result


GOLD_BUCKETS = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def gold_bucket(gold: np.ndarray) -> np.ndarray:
    """Bucket index of each gold score: [0, 1) -> 0, [1, 2) -> 1, ..., [4, 5] -> 4 (5.0 joins the last)."""
    return np.clip(np.floor(np.asarray(gold, dtype=np.float64)), 0, 4).astype(int)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def alignment(a: np.ndarray, b: np.ndarray) -> float:
    """ℓ_align = E ‖f(x) − f(x⁺)‖² over positive pairs (Wang & Isola 2020, Eq. 2 with α = 2), on
    L2-normalised embeddings (SimCSE §5 / Fig. 2)."""
    return float(np.mean(np.sum((_unit(a) - _unit(b)) ** 2, axis=1)))


def uniformity(x: np.ndarray, t: float = 2.0) -> float:
    """ℓ_uniform = log E_{i<j} exp(−t ‖f(x_i) − f(x_j)‖²) over all distinct pairs (Wang & Isola 2020,
    Eq. 3, t = 2), L2-normalised; computed stably as a log-sum-exp."""
    from scipy.special import logsumexp

    u = _unit(x)
    n = len(u)
    if n < 2:
        return float("nan")
    sq = np.maximum(2.0 - 2.0 * (u @ u.T), 0.0)[np.triu_indices(n, k=1)]
    return float(logsumexp(-t * sq) - np.log(sq.size))


def geometry(e1: np.ndarray, e2: np.ndarray, gold: np.ndarray, sentences: np.ndarray) -> dict:
    """Embedding geometry on STS-B test (issue 12 §2): alignment over pairs with gold ≥ 4, uniformity
    over all distinct pairs of its unique sentences, and the cosine similarity of every pair grouped
    by gold bucket 0–1 … 4–5 (SARCSE App. D, PaSeR App. C) with per-bucket mean/std and the raw
    cosines (rounded to 4 decimals) for the density figure."""
    gold = np.asarray(gold, dtype=np.float64)
    pos = gold >= 4.0
    cos = cosine_pairs(e1, e2)
    b = gold_bucket(gold)
    buckets = {}
    for i, (lo, hi) in enumerate(GOLD_BUCKETS):
        c = cos[b == i]
        buckets[f"{lo}-{hi}"] = {"n": int(c.size), "mean": float(c.mean()) if c.size else None,
                                 "std": float(c.std(ddof=0)) if c.size else None,
                                 "cosines": [round(float(v), 4) for v in c]}
    return {"align": alignment(e1[pos], e2[pos]) if pos.any() else None, "n_align_pairs": int(pos.sum()),
            "uniform": uniformity(sentences), "n_uniform_sentences": int(len(sentences)),
            "cosine_buckets": buckets}


def _times100(agg: dict) -> dict:
    """The aggregate with every correlation × 100 (the unit of the task scores); counts unchanged."""
    out = {k: (100.0 * v if k in ("all", "mean", "wmean") else v) for k, v in agg.items() if k != "subsets"}
    out["subsets"] = {name: {"spearman": 100.0 * v["spearman"], "pearson": 100.0 * v["pearson"], "n": v["n"]}
                      for name, v in agg["subsets"].items()}
    return out


#: dev-evaluation batch on CUDA with a bf16 ``train.eval_precision`` (fp32 keeps the embedder's own,
#: ``sentemb.methods.base.DEV_BATCH``)
DEV_BATCH_CUDA = 512


def tune_dev_embedder(embed: EmbedFn, precision: str, device, max_len: int | None = None) -> EmbedFn:
    """The loop's dev embedder (``Method.embedder``) set to ``train.eval_precision``: fp32 leaves it
    as built (fp32, its own batch size: what was computed before the setting existed);
    bf16 / auto set its ``precision`` (auto: bf16 on CUDA only), and on CUDA, where bf16 applies,
    batches of ``DEV_BATCH_CUDA`` sentences. ``max_len`` (``train.dev_max_len``): the sentences are
    truncated to that many tokens (None: the embedder's own maximum). An embedder without a
    ``precision`` (or ``max_length``) attribute (a plug-in's own) is left as it is, with a warning
    (an error for ``max_len``: the run would select by another evaluation than it says). The dev set
    is tokenized once and reused when the embedder keeps its plan (``Embedder(keep_plan=True)``, the
    default ``Method.embedder``)."""
    import logging

    if max_len is not None:
        if not hasattr(embed, "max_length"):
            from .. import SentembError

            raise SentembError(f"train.dev_max_len {max_len}: the method's dev embedder {type(embed).__name__} has no "
                               "max_length setting; leave train.dev_max_len null for this method")
        embed.max_length = int(max_len)  # a kept plan is keyed by it (Embedder): none made before is reused

    if precision == "fp32":  # as built (an embedder asked for bf16 before is set back to fp32)
        if getattr(embed, "precision", "fp32") != "fp32":
            embed.precision = "fp32"
        return embed
    if not hasattr(embed, "precision"):
        logging.getLogger(__name__).warning("train.eval_precision %s: the method's dev embedder %s has no precision "
                                            "setting; it evaluates as it is", precision, type(embed).__name__)
        return embed
    embed.precision = precision
    if getattr(device, "type", str(device)) == "cuda" and hasattr(embed, "batch_size"):
        embed.batch_size = max(int(embed.batch_size), DEV_BATCH_CUDA)
    return embed


def stsb_dev(embed: EmbedFn, dev: list[Pairs]) -> float:
    """STS-B dev Spearman × 100 (``dev`` from ``load_task(root, "STSBenchmark", "dev")``, loaded once
    by the caller): the model-selection signal, every 125 steps (methods.md §0)."""
    return 100.0 * score_task(embed, dev)["all"]


def format_scores(scores: dict, tasks: Sequence[str]) -> str:
    head = " | ".join(f"{t:>15}" for t in [*tasks, "avg"])
    vals = " | ".join(f"{scores[t]:>15.2f}" for t in [*tasks, "avg"])
    return f"{head}\n{vals}"


def _training_run_id(model_dir) -> str | None:
    """The MLflow run that trained ``model_dir`` (recorded in its sentemb.json), if any."""
    meta = Path(model_dir) / "sentemb.json"
    try:
        return json.loads(meta.read_text("utf-8")).get("mlflow_run_id") if meta.is_file() else None
    except (OSError, ValueError):
        return None
