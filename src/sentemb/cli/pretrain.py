"""``sentemb`` commands of ``sentemb.train.pretrain``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from ..config.settings import Run
from ..train.pretrain import resolve_pretrain, run_pretrain
from ..utils import read_json, write_json


def _cmd_pretrain(args: argparse.Namespace) -> int:
    run = Run.from_dict(read_json(args.run_config, "run config"))
    if args.options:  # today's weight-free settings (rule pretrain_options), as `sentemb train --options`
        from ..config.settings import apply_options

        run = apply_options(run, read_json(args.options, "options"), str(args.options))
    if args.device:
        run.train.device = args.device
    if args.no_track:
        run.tracking = dataclasses.replace(run.tracking, enabled=False)
    import os

    from ..train import distributed

    if run.train.devices > 1 and not distributed.under_torchrun():  # as `sentemb train` (sentemb.train.distributed)
        distributed.relaunch("pretrain", args, run.train.devices, f"pretraining stage of '{run.method}'")
        summary = read_json(Path(args.output_dir) / "train.json", "train summary")
    else:
        try:
            summary = run_pretrain(run, args.output_dir, progress=not args.quiet)
        finally:
            distributed.shutdown()
        if int(os.environ.get("RANK", "0")) != 0:
            return 0
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
    p.add_argument("--run-config", required=True, help="resolved stage JSON (see `sentemb pretrain-config`)")
    p.add_argument("--options", default=None, metavar="JSON", help="weight-free settings over the stage JSON "
                   "(sentemb.config.settings.run_options), as for `sentemb train`")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--device", default=None, help="override train.device (auto, cpu, cuda, cuda:1)")
    p.add_argument("--no-track", action="store_true", help="no MLflow run")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_pretrain)
    q = sub.add_parser("pretrain-config", help="write the resolved settings of a method's pretraining stage")
    q.add_argument("--config", required=True)
    q.add_argument("--method", required=True)
    q.add_argument("--backbone", required=True)
    q.add_argument("--output", required=True)
    q.set_defaults(func=_cmd_pretrain_config)
