"""``sentemb`` commands of ``sentemb.train.loop``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from .. import SentembError
from ..config.settings import Run
from ..train.loop import train
from ..utils import read_json, write_json
from .argtypes import seed_int


def job_run(args: argparse.Namespace, what: str) -> Run:
    """The resolved run (or pretraining stage) of ``--run-config``, with today's weight-free settings
    of ``--options`` over it (rule ``run_options``/``pretrain_options``), then ``--device`` and
    ``--no-track``: what ``sentemb train`` and ``sentemb pretrain`` both run."""
    try:
        run = Run.from_dict(read_json(args.run_config, f"--run-config ({what})"))
        missing = [k for k in ("model", "corpus") if k not in run.paths]
        if missing:
            raise SentembError(f"run config: 'paths' lacks {', '.join(missing)}")
    except SentembError as e:  # named by the file it came from
        raise SentembError(f"--run-config {args.run_config}: {e}") from None
    if args.options:
        from ..config.settings import apply_options

        run = apply_options(run, read_json(args.options, "--options"), str(args.options))
    if args.device:
        run.train.device = args.device
    if args.no_track:
        run.tracking = dataclasses.replace(run.tracking, enabled=False)
    return run


def run_job(command: str, args: argparse.Namespace, run: Run, label: str, fn) -> dict | None:
    """``fn(run, output_dir, progress=...)`` in this process, or on ``train.devices`` processes
    (``sentemb.train.distributed``: the command relaunched under torchrun); the summary it wrote,
    None on a rank other than 0."""
    from ..train import distributed

    if run.train.devices > 1 and not distributed.under_torchrun():
        distributed.relaunch(command, args, run.train.devices, label)
        return read_json(Path(args.output_dir) / "train.json", "train summary")
    try:
        summary = fn(run, args.output_dir, progress=not args.quiet)
    finally:
        distributed.shutdown()
    return summary if int(os.environ.get("RANK", "0")) == 0 else None  # under torchrun: rank 0 reports


def add_job_arguments(p: argparse.ArgumentParser, run_help: str, options_help: str) -> None:
    """The arguments of a training job (``sentemb train``, ``sentemb pretrain``): what ``job_run`` reads."""
    p.add_argument("--run-config", required=True, help=run_help)
    p.add_argument("--options", default=None, metavar="JSON", help=options_help)
    p.add_argument("--output-dir", required=True,
                   help="run directory: model/ and train.json are written here (a rerun resumes its checkpoint)")
    p.add_argument("--device", default=None, help="override train.device (auto, cpu, cuda, cuda:1)")
    p.add_argument("--no-track", action="store_true", help="no MLflow run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _cmd_train(args: argparse.Namespace) -> int:
    run = job_run(args, "run config")
    summary = run_job("train", args, run, f"run '{run.name}'", train)
    if summary is not None:
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
    add_job_arguments(p, "resolved run JSON (see `sentemb run-config`)",
                      "weight-free settings applied over the run config (sentemb.config.settings.run_options: "
                      "log_steps, save_steps, threads, device, chunking, tracking); the Snakefile's rule run_options "
                      "writes it")
    p.set_defaults(func=_cmd_train)
    q = sub.add_parser("run-config", help="write the resolved settings of one run from a config file")
    q.add_argument("--config", required=True, help="config YAML")
    q.add_argument("--name", required=True, help="run name (config runs[].name, default its method)")
    q.add_argument("--backbone", required=True, help="backbone name (config backbones)")
    q.add_argument("--seed", type=seed_int, required=True, help="training seed")
    q.add_argument("--output", required=True, help="resolved run JSON (for train --run-config)")
    q.set_defaults(func=_cmd_run_config)
