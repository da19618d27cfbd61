"""A method's pretraining stage (``Method.pretrain``), once per method and backbone.

``sentemb pretrain-config`` writes the resolved settings of the stage of one method on one backbone
(from ``methods.<method>.pretrain``); ``sentemb pretrain`` runs it into ``--output-dir`` (its
``model/`` is what a run whose method requires ``pretrained`` reads). The stage uses the shared
training loop (``sentemb.train.train``: resumable ``.work/`` state, atomic ``model/``), MLflow run
``pretrain/<method>/<backbone>`` tagged ``rule: pretrain``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import SentembError
from .args import fields
from .settings import Run
from .utils import write_json

#: keys of ``methods.<method>.pretrain`` read here (the rest are train keys or the method's own)
STAGE_KEYS = ("corpus", "seed")


def pretrain_methods(config: dict) -> list[str]:
    """Methods of the configured runs that have a pretraining stage."""
    from .methods import get_method

    return sorted({r["method"] for r in config["runs"] if get_method(r["method"]).pretrain is not None})


def resolve_pretrain(config: dict, method: str, backbone: str) -> Run:
    """The complete settings of the pretraining stage of ``method`` on ``backbone`` (a run
    ``sentemb.train.train`` reads; ``resolve_run`` with the stage's own settings): ``train`` = the
    config's train settings, then the method's ``pretrain_train_defaults``, then the train keys of
    ``methods.<method>.pretrain``; its ``corpus`` and ``seed`` (``PretrainStage``) from that block."""
    from .config import resolve_run
    from .methods import get_method
    from .settings import PretrainStage, TrainSettings

    cls = get_method(method)
    if cls.pretrain is None:
        raise SentembError(f"method '{method}' has no pretraining stage")
    if backbone not in config["backbones"]:
        raise SentembError(f"backbone '{backbone}' is not declared in config key 'backbones' "
                           f"(declared: {sorted(config['backbones'])})")
    for i, run in enumerate(config["runs"]):
        if run["method"] == method and "pretrain" in (run.get("method_args") or {}):
            raise SentembError(f"config key 'runs[{i}].method_args.pretrain': the pretraining stage is shared by "
                               f"every run of '{method}' on a backbone; set it in methods.{method}.pretrain")
    margs = cls.resolve_args((config.get("methods") or {}).get(method, {}), where=f"methods.{method}")
    block = margs.get("pretrain") or {}
    train_keys = {f.name for f in fields(TrainSettings)}
    train = {**config["train"], **cls.pretrain_train_defaults, **{k: v for k, v in block.items() if k in train_keys}}
    stage = PretrainStage(**{f.name: block[f.name] for f in fields(PretrainStage) if f.name in block})
    return resolve_run(config, f"{method}-pretrain", backbone, stage.seed, method=method, train=train,
                       method_args=margs, corpus=stage.corpus or config["corpus"]["name"], inputs={},
                       run_name=f"pretrain/{method}/{backbone}", rule="pretrain")


def pretrain_dir(config: dict, method: str, backbone: str) -> str:
    return f"{config['results_dir']}/pretrain/{method}/{backbone}"


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from .methods import get_method

    path = Path(args.run_config)
    if not path.is_file():
        raise SentembError(f"--run-config: file not found: {path}")
    try:
        run = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise SentembError(f"{path}: not valid JSON ({e})") from None
    run = Run.from_dict(run)
    cls = get_method(run.method)
    if cls.pretrain is None:
        raise SentembError(f"{path}: method '{run.method}' has no pretraining stage")
    if args.device:
        run.train.device = args.device
    if args.no_track:
        run.tracking = {**run.tracking, "enabled": False}
    run.progress = not args.quiet
    summary = cls.pretrain(run, args.output_dir)
    print(f"pretrained {run.method} on {run.backbone}: {summary['steps']} steps -> "
          f"{Path(args.output_dir) / 'model'}")
    return 0


def _cmd_pretrain_config(args: argparse.Namespace) -> int:
    from .config import load_config

    cfg = load_config(args.config)
    write_json(args.output, resolve_pretrain(cfg, args.method, args.backbone).to_dict())
    return 0


def register(sub) -> None:
    p = sub.add_parser("pretrain", help="run a method's pretraining stage (once per method x backbone)")
    p.add_argument("--run-config", required=True, help="resolved stage JSON (see `sentemb pretrain-config`)")
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
