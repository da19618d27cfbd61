#!/usr/bin/env python
"""Check ``sentemb evaluate-transfer`` against SentEval's own code on the same embeddings.

Each task's unique sentences are encoded once, exactly as ``sentemb.evaluate.transfer.evaluate_task`` encodes
them (the ``evaluate`` embedder), and cached as ``<cache>/<task>.npy`` + ``.json``. Then

* SentEval (a checkout of facebookresearch/SentEval given by ``--senteval``; nothing of it is in
  this repository) runs ``SE.eval(task)`` with SimCSE's ``evaluation.py`` test-mode parameters
  (``kfold 10``; ``usepytorch`` True with ``{nhid: 0, optim: adam, batch_size: 64, tenacity: 5,
  epoch_size: 4}``, or False for ``--classifier sklearn``) and a batcher that joins each sample's
  tokens with spaces (SimCSE's batcher) and looks the sentence up in the cache: SentEval's own file
  reading, sorting, folds and classifier on sentemb's vectors;
* sentemb runs ``evaluate_transfer`` on the same cached vectors.

It prints one JSON line per task and implementation: dev/test accuracy (MRPC also F1), wall and
CPU seconds of the classification (encoding excluded). SentEval's ``tools/classifier.py`` needs CUDA
and ``utils.py`` uses ``inspect.getargspec`` (gone in Python 3.11); on a CPU-only Python 3.11 patch
the checkout first (docs/evaluation.md)::

    sed -i "s/\\.cuda()//g; s/torch.device('cuda')/torch.device('cpu')/" SentEval/senteval/tools/classifier.py
    sed -i "s/inspect.getargspec(/inspect.getfullargspec(/" SentEval/senteval/utils.py
    python scripts/check_transfer_senteval.py --senteval SentEval --tasks MRPC,TREC --cache /tmp/emb
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TORCH_CLASSIFIER = {"nhid": 0, "optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4}  # SimCSE, test mode


def encode(tasks, args) -> None:
    """Cache every task's unique sentences and their vectors (skips tasks already cached)."""
    from sentemb.model.encoder import Embedder
    from sentemb.evaluate.transfer import load_transfer_task

    todo = [t for t in tasks if not (args.cache / f"{t}.npy").is_file()]
    if not todo:
        return
    emb = Embedder.from_dir(args.model, args.pooler, device=args.device, batch_size=args.batch_size)
    for t in todo:
        sents = list(dict.fromkeys(load_transfer_task(args.data_dir, t).sentences()))
        t0 = time.time()
        vecs = np.asarray(emb(sents), dtype=np.float32)
        np.save(args.cache / f"{t}.npy", vecs)
        (args.cache / f"{t}.json").write_text(json.dumps(sents), "utf-8")
        print(json.dumps({"task": t, "encoded": len(sents), "seconds": round(time.time() - t0, 1)}), flush=True)


def load(task, cache: Path):
    return np.load(cache / f"{task}.npy"), json.loads((cache / f"{task}.json").read_text("utf-8"))


def run_sentemb(task, args) -> dict:
    from sentemb.evaluate.transfer import evaluate_transfer

    vecs, sents = load(task, args.cache)

    def embed(xs):
        if list(xs) != sents:
            raise SystemExit(f"{task}: sentences differ from the cache; delete {args.cache / task}.*")
        return vecs

    t0, c0 = time.time(), time.process_time()
    d = evaluate_transfer(embed, args.data_dir, [task], classifier=args.classifier,
                          mrpc_mode=args.mrpc_features)["details"][task]
    return {"devacc": d["devacc"], "acc": d["acc"], "f1": d.get("f1"),
            "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}


def run_senteval(task, args) -> dict:
    sys.path.insert(0, str(args.senteval))
    import senteval

    vecs, sents = load(task, args.cache)
    pos = {s: i for i, s in enumerate(sents)}

    def batcher(params, batch):
        return np.stack([vecs[pos[" ".join(s)]] for s in batch])

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "downstream").symlink_to(Path(args.data_dir).resolve())  # SentEval reads <task_path>/downstream/
        params = {"task_path": d, "usepytorch": args.classifier == "pytorch", "kfold": 10, "seed": 1111,
                  "classifier": TORCH_CLASSIFIER}
        t0, c0 = time.time(), time.process_time()
        r = senteval.engine.SE(params, batcher, lambda p, s: None).eval(task)
    return {"devacc": float(r["devacc"]), "acc": float(r["acc"]), "f1": float(r["f1"]) if "f1" in r else None,
            "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--senteval", type=Path, default=None,
                   help="a facebookresearch/SentEval checkout (patched for CPU); not needed with --only sentemb")
    p.add_argument("--model", default=str(SHARED / "models" / "all-MiniLM-L6-v2"))
    p.add_argument("--pooler", default="avg")
    p.add_argument("--data-dir", default=str(SHARED / "data" / "senteval"))
    p.add_argument("--tasks", default="MR,CR,SUBJ,MPQA,SST2,TREC,MRPC")
    p.add_argument("--classifier", default="pytorch", choices=["pytorch", "sklearn"])
    p.add_argument("--mrpc-features", default="code", choices=["paper", "code"],
                   help="sentemb's MRPC features (SentEval's code computes `code`)")
    p.add_argument("--cache", type=Path, required=True, help="directory for the cached embeddings")
    p.add_argument("--only", choices=["senteval", "sentemb"], default=None, help="run one implementation")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (encoder and SentEval's classifier)")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.only != "sentemb" and not (args.senteval and (args.senteval / "senteval" / "engine.py").is_file()):
        p.error(f"--senteval: no senteval/engine.py under {args.senteval} (or --only sentemb)")
    tasks = [t for t in args.tasks.split(",") if t]
    args.cache.mkdir(parents=True, exist_ok=True)
    encode(tasks, args)
    for t in tasks:
        for name, fn in (("sentemb", run_sentemb), ("senteval", run_senteval)):
            if args.only in (None, name):
                print(json.dumps({"task": t, "impl": name, "classifier": args.classifier, **fn(t, args)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
