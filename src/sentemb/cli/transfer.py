"""``sentemb`` commands of ``sentemb.evaluate.transfer``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import SentembError
from ..evaluate.senteval import TRANSFER_TASKS
from ..evaluate.transfer import (
    CLASSIFIERS, CLASSIFIER_DESCRIPTIONS, KFOLD, MRPC_FEATURES, SEED, check_folds, classify_tasks,
    encode_task, evaluate_transfer, load_transfer_task, log, read_features_meta, summarize, write_features)
from .argtypes import fold_count, positive_int, run_meta, seed_int


def _task_list(spec: str) -> list[str]:
    tasks = [t.strip() for t in spec.split(",") if t.strip()]
    if not tasks:
        raise SentembError(f"--tasks: no transfer task given (known: {','.join(TRANSFER_TASKS)})")
    unknown = [t for t in tasks if t not in TRANSFER_TASKS]
    if unknown:
        raise SentembError(f"--tasks: unknown transfer task(s) {unknown} (known: {','.join(TRANSFER_TASKS)})")
    return tasks


def _cmd_encode(args: argparse.Namespace) -> int:
    """``sentemb encode-transfer``: the GPU half of the transfer evaluation (every task's sentences
    encoded once), written for ``sentemb evaluate-transfer --features`` (the CPU half)."""
    import torch

    from ..evaluate.sts import embedder_for
    from .spec import apply_spec, evaluation_defaults

    apply_spec(args, {"tasks": evaluation_defaults("transfer_tasks")["transfer_tasks"],
                      **evaluation_defaults("batch_size", "precision")}, required=("pooler",))
    tasks = _task_list(args.tasks)
    if not Path(args.model).is_dir():
        raise SentembError(f"--model: model directory not found: {args.model}")
    loaded = [load_transfer_task(args.data_dir, t) for t in tasks]  # a missing file fails before the model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    embed = embedder_for(args.model, args.pooler, device=args.device, batch_size=args.batch_size,
                         max_length=args.max_length, progress=not args.quiet, precision=args.precision)
    vectors, enc = {}, {}
    for task in loaded:
        vectors[task.name], enc[task.name] = encode_task(embed, task)
        log.info("%s: %d sentences encoded at %.0f/s", task.name, enc[task.name]["n_sentences"],
                 enc[task.name]["sentences_per_second"])
    meta = {"model": str(args.model), "pooler": args.pooler, "data_dir": str(args.data_dir), "tasks": tasks,
            "dim": int(next(iter(vectors.values())).shape[1]) if vectors else 0, "precision": args.precision,
            "encoding": enc, "seconds": round(time.time() - t0, 2)}
    write_features(args.output, vectors, loaded, meta)
    n = sum(e["n_sentences"] for e in enc.values())
    print(f"{n} sentences of {len(tasks)} tasks encoded ({meta['dim']}-d) -> {args.output}")
    return 0


def _cmd_transfer(args: argparse.Namespace) -> int:
    import torch

    from ..evaluate.sts import _training_run_id, embedder_for
    from ..utils import write_json
    from .spec import apply_spec, check_tracking_uri, evaluation_defaults

    apply_spec(args, {"tasks": evaluation_defaults("transfer_tasks")["transfer_tasks"],
                      **evaluation_defaults("batch_size", "precision", "mrpc_features", "classifier", "experiment")})
    tasks = _task_list(args.tasks)
    if args.features:
        fmeta = read_features_meta(args.features)
        model, pooler = args.model or fmeta.get("model"), args.pooler or fmeta.get("pooler")
        if args.pooler and fmeta.get("pooler") and args.pooler != fmeta["pooler"]:
            raise SentembError(f"--pooler {args.pooler}: {args.features} was encoded with pooler {fmeta['pooler']}")
        missing = [t for t in tasks if t not in fmeta.get("tasks", [])]
        if missing:
            raise SentembError(f"--tasks: {args.features} holds no vectors of {missing} (encoded: "
                               f"{','.join(fmeta.get('tasks', []))})")
    else:
        if not args.model or not args.pooler:
            raise SentembError("--model and --pooler are required (unless --features names a file of "
                               "`sentemb encode-transfer`)")
        model, pooler = args.model, args.pooler
        if not Path(model).is_dir():
            raise SentembError(f"--model: model directory not found: {model}")
    for t in tasks:  # a missing or unusable file fails before the model is loaded
        check_folds(load_transfer_task(args.data_dir, t), args.kfold)
    check_tracking_uri(args)  # a malformed URI fails now, not after the work
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    if args.features:
        details = classify_tasks(args.features, args.data_dir, tasks, k=args.kfold, seed=args.seed,
                                 mrpc_mode=args.mrpc_features, classifier=args.classifier, workers=args.workers)
        for t in tasks:
            details[t].update(fmeta["encoding"][t])
            details[t]["seconds"] = round(details[t]["encode_seconds"] + details[t]["classifier_seconds"], 2)
        res = summarize(tasks, details)
    else:
        embed = embedder_for(model, pooler, device=args.device, batch_size=args.batch_size,
                             max_length=args.max_length, progress=not args.quiet, precision=args.precision)
        res = evaluate_transfer(embed, args.data_dir, tasks, k=args.kfold, seed=args.seed, mrpc_mode=args.mrpc_features,
                                classifier=args.classifier, workers=args.workers)
    out = {t: res[t] for t in tasks}
    if "MRPC_F1" in res:
        out["MRPC_F1"] = res["MRPC_F1"]
    out["avg"] = res["avg"]
    n_sent = sum(d["n_sentences"] for d in res["details"].values())
    enc = sum(d["encode_seconds"] for d in res["details"].values())
    out.update({
        "protocol": {"classifier": args.classifier, "classifier_description": CLASSIFIER_DESCRIPTIONS[args.classifier],
                     "kfold": args.kfold, "seed": args.seed, "mrpc_features": args.mrpc_features},
        "pooler": pooler, "model": str(model), "data_dir": str(args.data_dir), "tasks": tasks,
        "n_sentences": n_sent, "seconds": round(time.time() - t0, 2),
        "classifier_cpu_seconds": round(sum(d["classifier_seconds"] for d in res["details"].values()), 2),
        "workers": args.workers, "sentences_per_second": round(n_sent / max(enc, 1e-9), 1), "details": res["details"],
    })
    if args.features:
        out["features"] = str(args.features)
    if args.run_meta:
        out["run"] = dict(args.run_meta)  # pairs, the seed an int (argtypes.run_meta)
    print(" | ".join(f"{t}: {out[t]:.2f}" for t in [*tasks, "avg"]))
    if args.track:
        import tempfile

        from ..tracking.runs import Tracker

        tags = {**out.get("run", {}), **dict(args.tag)}
        tags.setdefault("rule", "evaluate-transfer")
        train_run = _training_run_id(model)
        out_path = Path(args.output)
        with Tracker(uri=args.tracking_uri, experiment=args.experiment,
                     run_name=args.run_name or f"transfer:{model}", tags=tags,
                     params={"pooler": pooler, "tasks": ",".join(tasks), "model": str(model),
                             "data_dir": str(args.data_dir), "mrpc_features": args.mrpc_features,
                             "classifier": args.classifier},
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
    from .. import POOLERS
    from .spec import add_spec_options, add_tracking_options

    e = sub.add_parser("encode-transfer", help="encode the SentEval transfer tasks' sentences (the GPU half of "
                                               "evaluate-transfer) into a features file")
    e.add_argument("--model", required=True, help="Hugging Face model directory or a sentemb checkpoint")
    e.add_argument("--pooler", default=None, choices=[*POOLERS, "method"], help="required unless --spec gives it")
    e.add_argument("--data-dir", required=True, help="SentEval data root (holds MR/, CR/, SUBJ/, MPQA/, SST/, TREC/, MRPC/)")
    e.add_argument("--tasks", default=None, help="comma-separated (default: evaluation.transfer_tasks, all seven)")
    e.add_argument("--output", required=True, help="features file (.npz) for evaluate-transfer --features")
    e.add_argument("--batch-size", type=positive_int, default=None, help="default: evaluation.batch_size")
    e.add_argument("--max-length", type=positive_int, default=None,
                   help="truncate rows to this many tokens (default: the model's maximum; refused with --pooler method)")
    e.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cpu, cuda, cuda:N (default: %(default)s)")
    e.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"], help="default: evaluation.precision")
    e.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    add_spec_options(e, tracking=False)
    e.set_defaults(func=_cmd_encode)

    p = sub.add_parser("evaluate-transfer", help="SentEval transfer tasks (a linear classifier on frozen embeddings)")
    p.add_argument("--model", default=None, help="Hugging Face model directory or a sentemb checkpoint (with "
                   "--features: only named in the output and tracking, default the one the features came from)")
    p.add_argument("--pooler", default=None, choices=[*POOLERS, "method"],
                   help="as evaluate's --pooler; required unless --spec or --features gives it (with --features it "
                        "must be the features' pooler)")
    p.add_argument("--features", default=None, help="classify the vectors of `sentemb encode-transfer` (no model "
                   "is loaded, no GPU used)")
    p.add_argument("--workers", type=positive_int, default=1, help="tasks classified at once, each in a process of its own "
                   "on one thread (the same numbers as 1)")
    p.add_argument("--data-dir", required=True, help="SentEval data root (holds MR/, CR/, SUBJ/, MPQA/, SST/, TREC/, MRPC/)")
    p.add_argument("--tasks", default=None, help="comma-separated (default: evaluation.transfer_tasks, all seven)")
    p.add_argument("--output", required=True, help="metrics JSON")
    p.add_argument("--mrpc-features", default=None, choices=MRPC_FEATURES,
                   help="paper: [u, v, |u-v|, u*v] (methods.md); code: [|u-v|, u*v] (SentEval's code); default: "
                        "evaluation.mrpc_features (paper)")
    p.add_argument("--classifier", default=None, choices=CLASSIFIERS,
                   help="pytorch: SentEval's usepytorch=True path, what the papers used; sklearn: its "
                        "LogisticRegression path (default: config key evaluation.transfer_classifier, pytorch)")
    p.add_argument("--kfold", type=fold_count, default=KFOLD,
                   help="folds of SentEval's cross-validation (default: %(default)s)")
    p.add_argument("--seed", type=seed_int, default=SEED, help="SentEval's classifier seed")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: evaluation.batch_size (without --features)")
    p.add_argument("--max-length", type=positive_int, default=None,
                   help="truncate rows to this many tokens (default: the model's maximum; refused with --pooler method; "
                        "without --features)")
    p.add_argument("--device", default="auto",
                   help="encoding device (without --features): auto (CUDA when available), cpu, cuda, "
                        "cuda:N (default: %(default)s)")
    p.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"],
                   help="default: evaluation.precision, fp32 as SentEval and the papers; bf16: autocast; auto: bf16 "
                        "on CUDA only")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--run-meta", action="append", type=run_meta, default=[], metavar="KEY=VALUE",
                   help="run metadata stored in the JSON (name, method, backbone, seed) for the tables")
    add_tracking_options(p, "transfer")
    add_spec_options(p)
    p.set_defaults(func=_cmd_transfer)
