"""``sentemb`` commands of ``sentemb.train.pretrain``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..train.pretrain import resolve_pretrain, run_pretrain
from ..utils import write_json
from .train import add_job_arguments, job_run, run_job


def _cmd_pretrain(args: argparse.Namespace) -> int:
    run = job_run(args, "pretraining stage")
    summary = run_job("pretrain", args, run, f"pretraining stage of '{run.method}'", run_pretrain)
    if summary is not None:
        print(f"pretrained {run.method} on {run.backbone}: {summary['steps']} steps -> "
              f"{Path(args.output_dir) / 'model'}")
    return 0


def _cmd_pretrain_config(args: argparse.Namespace) -> int:
    from ..config.load import load_config

    cfg = load_config(args.config)
    write_json(args.output, resolve_pretrain(cfg, args.method, args.backbone).to_dict())
    return 0


def register(sub) -> None:
    p = sub.add_parser("pretrain", help="run a method's pretraining stage (once per method x backbone)")
    add_job_arguments(p, "resolved stage JSON (see `sentemb pretrain-config`)",
                      "weight-free settings over the stage JSON (sentemb.config.settings.run_options), as for "
                      "`sentemb train`")
    p.set_defaults(func=_cmd_pretrain)
    q = sub.add_parser("pretrain-config", help="write the resolved settings of a method's pretraining stage")
    q.add_argument("--config", required=True, help="config YAML")
    q.add_argument("--method", required=True, help="a method with a pretraining stage")
    q.add_argument("--backbone", required=True, help="backbone name (config backbones)")
    q.add_argument("--output", required=True, help="resolved stage JSON (for pretrain --run-config)")
    q.set_defaults(func=_cmd_pretrain_config)
