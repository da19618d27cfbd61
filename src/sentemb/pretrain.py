"""A method's pretraining stage (``Method.pretrain_stage``), once per method and backbone.

``sentemb pretrain-config`` writes the resolved settings of the stage of one method on one backbone
(from ``methods.<method>.pretrain``); ``sentemb pretrain`` runs it into ``--output-dir`` (its
``model/`` is what a run whose method requires ``pretrained`` reads). The stage uses the shared
training loop (``sentemb.train.train`` with the stage's Method class: resumable ``.work/`` state, atomic ``model/``), MLflow run
``pretrain/<method>/<backbone>`` tagged ``rule: pretrain``.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from . import SentembError
from .layout import Layout
from .utils import read_json, write_json


def resolve_pretrain(config: dict, method: str, backbone: str) -> dict:
    """The complete settings of the pretraining stage of ``method`` on ``backbone`` (a run config
    ``sentemb.train.train`` reads): ``train`` = the config's train settings, then the method's
    ``pretrain_train_defaults``, then the train keys of ``methods.<method>.pretrain``."""
    from .config import load_schema
    from .methods import get_method

    cls = get_method(method)
    if cls.pretrain_stage is None:
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
    train_keys = set(load_schema()["$defs"]["train_props"])
    train = copy.deepcopy(config["train"])
    train.update(cls.pretrain_train_defaults)
    train.update({k: v for k, v in block.items() if k in train_keys})
    corpus = block.get("corpus") or config["corpus"]["name"]
    seed = int(block.get("seed", 42))
    return {
        "name": f"{method}-pretrain",
        "method": method,
        "backbone": backbone,
        "backbone_hub_id": config["backbones"][backbone]["hub_id"],
        "seed": seed,
        "train": train,
        "method_args": margs,
        "experiment": config["experiment"],
        "tracking": config["tracking"],
        "corpus": corpus,
        "run_name": f"pretrain/{method}/{backbone}",
        "rule": "pretrain",
        "paths": Layout.of(config).job_paths(corpus, backbone, {}, token_cache=train.get("token_cache", True)),
    }


def run_pretrain(run: dict, out_dir: str | Path, *, progress: bool = True) -> dict:
    """Run a resolved stage (``resolve_pretrain``) into ``out_dir``: the shared loop trains the Method
    class the method declares as its ``pretrain_stage``."""
    from .methods import get_method
    from .train import train

    stage = get_method(run["method"]).pretrain_stage
    if stage is None:
        raise SentembError(f"method '{run['method']}' has no pretraining stage")
    return train(run, out_dir, method_cls=stage, progress=progress)


def _cmd_pretrain(args: argparse.Namespace) -> int:
    run = read_json(args.run_config, "run config")
    if args.device:
        run["train"]["device"] = args.device
    if args.no_track:
        run.setdefault("tracking", {})["enabled"] = False
    summary = run_pretrain(run, args.output_dir, progress=not args.quiet)
    print(f"pretrained {run['method']} on {run['backbone']}: {summary['steps']} steps -> "
          f"{Path(args.output_dir) / 'model'}")
    return 0


def _cmd_pretrain_config(args: argparse.Namespace) -> int:
    from .config import load_config

    cfg = load_config(args.config)
    write_json(args.output, resolve_pretrain(cfg, args.method, args.backbone))
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
