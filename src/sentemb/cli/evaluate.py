"""``sentemb`` commands of ``sentemb.evaluate.sts``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import SentembError
from ..evaluate.senteval import TASKS
from ..evaluate.sts import _training_run_id, embedder_for, evaluate_sts, format_scores
from .argtypes import positive_int, run_meta


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from ..utils import write_json
    from .spec import apply_spec, check_tracking_uri, evaluation_defaults

    apply_spec(args, evaluation_defaults("tasks", "setting", "batch_size", "precision", "experiment"),
               required=("pooler",))
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise SentembError(f"--tasks: no task given (known: {','.join(TASKS)})")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SentembError(f"--tasks: unknown task(s) {unknown} (known: {','.join(TASKS)})")
    if not Path(args.model).is_dir():
        raise SentembError(f"--model: model directory not found: {args.model}")
    check_tracking_uri(args)  # a malformed URI fails now, not after the work
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    embedder = embedder_for(args.model, args.pooler, device=args.device, batch_size=args.batch_size,
                            max_length=args.max_length, progress=not args.quiet, precision=args.precision)
    res = evaluate_sts(embedder, args.data_dir, tasks, args.setting)
    secs = time.time() - t0
    out = {t: round(res[t], 4) for t in tasks}
    out["avg"] = round(res["avg"], 4)
    out.update({
        "setting": args.setting, "pooler": args.pooler, "model": str(args.model), "data_dir": str(args.data_dir),
        "tasks": tasks, "n_sentences": res["n_sentences"], "seconds": round(secs, 2),
        "sentences_per_second": round(res["n_sentences"] / max(secs, 1e-9), 1),
        "details": res["details"],
    })
    if "geometry" in res:
        out["geometry"] = res["geometry"]
    if args.run_meta:
        out["run"] = dict(args.run_meta)  # pairs, the seed an int (argtypes.run_meta)
    print(format_scores(out, tasks))
    # The JSON is the job's real output: it appears (atomically) only once everything, tracking
    # included, has succeeded; MLflow gets a copy as artifact.
    if args.track:
        import tempfile

        from ..tracking.runs import Tracker

        tags = {**out.get("run", {}), **dict(args.tag)}
        tags.setdefault("rule", "evaluate")
        train_run = _training_run_id(args.model)
        out_path = Path(args.output)
        # Nested under the training run; a rerun after a kill retires the interrupted run (marker).
        with Tracker(uri=args.tracking_uri, experiment=args.experiment, run_name=args.run_name or f"eval:{args.model}",
                     tags=tags, params={"pooler": args.pooler, "setting": args.setting, "tasks": ",".join(tasks),
                                        "model": str(args.model), "data_dir": str(args.data_dir)},
                     marker=out_path.with_name(f".{out_path.name}.mlflow_run.json"), parent_run_id=train_run) as tr:
            test = {f"test/{t}": out[t] for t in tasks} | {"test/avg": out["avg"]}
            geo = out.get("geometry") or {}
            test |= {f"test/{k}": geo[k] for k in ("align", "uniform") if geo.get(k) is not None}
            test |= {f"test/cos_mean_{k}": v["mean"] for k, v in geo.get("cosine_buckets", {}).items()
                     if v["mean"] is not None}
            tr.log_metrics(test)
            if train_run:  # the test scores next to the training run's hyperparameters, in one MLflow view
                tr.log_metrics_to(train_run, test)
            with tempfile.TemporaryDirectory() as d:
                art = Path(d) / Path(args.output).name
                art.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
                tr.log_artifact(art)
    write_json(args.output, out)
    return 0


def register(sub) -> None:
    from .. import POOLERS
    from .spec import add_spec_options, add_tracking_options

    p = sub.add_parser("evaluate", help="STS evaluation (SentEval protocol) of a model directory")
    p.add_argument("--model", required=True, help="Hugging Face model directory or a sentemb checkpoint")
    p.add_argument("--pooler", default=None, choices=[*POOLERS, "method"],
                   help="how to pool the encoder's outputs; 'method': the embedder the training method defines "
                        "(read from the model's sentemb.json); required unless --spec gives it")
    p.add_argument("--data-dir", required=True, help="SentEval data root (holds STS/ and SICK/)")
    p.add_argument("--tasks", default=None, help="comma-separated (default: evaluation.tasks, all seven)")
    p.add_argument("--setting", default=None, choices=["all", "mean", "wmean"], help="default: evaluation.setting")
    p.add_argument("--output", required=True, help="metrics JSON")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: evaluation.batch_size")
    p.add_argument("--max-length", type=positive_int, default=None,
                   help="truncate rows to this many tokens (default: the model's maximum; refused with --pooler method)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cpu, cuda, cuda:N (default: %(default)s)")
    p.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"],
                   help="default: evaluation.precision, fp32 as SentEval and the papers; bf16: autocast; auto: bf16 "
                        "on CUDA only")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--run-meta", action="append", type=run_meta, default=[], metavar="KEY=VALUE",
                   help="run metadata stored in the JSON (name, method, backbone, seed) for the tables")
    add_tracking_options(p, "eval")
    add_spec_options(p)
    p.set_defaults(func=_cmd_evaluate)
