"""``sentemb`` commands of ``sentemb.train.loop``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from .. import SentembError
from ..config.settings import Run
from ..train.loop import train
from ..utils import write_json


def _cmd_train(args: argparse.Namespace) -> int:
    path = Path(args.run_config)
    if not path.is_file():
        raise SentembError(f"--run-config: file not found: {path}")
    try:
        run = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise SentembError(f"{path}: not valid JSON ({e})") from None
    run = Run.from_dict(run)
    if args.options:  # today's weight-free settings (rule run_options), over those the run config was written with
        from ..config.settings import apply_options

        opts = Path(args.options)
        try:
            run = apply_options(run, json.loads(opts.read_text("utf-8")), str(opts))
        except (OSError, json.JSONDecodeError) as e:
            raise SentembError(f"--options {opts}: {e}") from None
    if args.device:
        run.train.device = args.device
    if args.no_track:
        run.tracking = dataclasses.replace(run.tracking, enabled=False)
    from ..train import distributed

    if run.train.devices > 1 and not distributed.under_torchrun():
        distributed.relaunch("train", args, run.train.devices, f"run '{run.name}'")
        summary = json.loads((Path(args.output_dir) / "train.json").read_text("utf-8"))
    else:
        try:
            summary = train(run, args.output_dir, progress=not args.quiet)
        finally:
            distributed.shutdown()
        if int(os.environ.get("RANK", "0")) != 0:  # under torchrun: rank 0 reports
            return 0
    print(f"{_summary_line(summary)} -> {Path(args.output_dir) / 'model'}")
    return 0


def _summary_line(summary: dict) -> str:
    """The closing line of ``sentemb train``: the selected checkpoint, by STS-B dev or (no dev
    evaluation, ``train.model_selection: last``) the final weights."""
    where = f"at step {summary['best_step']}/{summary['steps']}"
    if summary["best_dev_stsb"] is None:
        return f"final weights {where} (train.model_selection: last, no STS-B dev evaluation)"
    return f"best STS-B dev {summary['best_dev_stsb']:.2f} {where}"


def _cmd_run_config(args: argparse.Namespace) -> int:
    from ..config.load import load_config, resolve_run

    cfg = load_config(args.config)
    write_json(args.output, resolve_run(cfg, args.name, args.backbone, args.seed).to_dict())
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="train one run (method x backbone x seed)")
    p.add_argument("--run-config", required=True, help="resolved run JSON (see `sentemb run-config`)")
    p.add_argument("--options", default=None, metavar="JSON",
                   help="weight-free settings applied over the run config (sentemb.config.settings.run_options: log_steps, "
                        "save_steps, threads, device, chunking, tracking); the Snakefile's rule run_options writes it")
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
