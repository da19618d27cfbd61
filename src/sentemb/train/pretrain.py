"""A method's pretraining stage (``Method.pretrain_stage``), once per method and backbone.

``sentemb pretrain-config`` writes the resolved settings of the stage of one method on one backbone
(from ``methods.<method>.pretrain``); ``sentemb pretrain`` runs it into ``--output-dir`` (its
``model/`` is what a run whose method requires ``pretrained`` reads). The stage uses the shared
training loop (``sentemb.train.loop.train`` with the stage's Method class: resumable ``.work/`` state, atomic ``model/``), MLflow run
``pretrain/<method>/<backbone>`` tagged ``rule: pretrain``.
"""

from __future__ import annotations

from pathlib import Path

from .. import SentembError
from ..config.fields import fields
from ..config.settings import Config, Run


def resolve_pretrain(config: dict | Config, method: str, backbone: str) -> Run:
    """The complete settings of the pretraining stage of ``method`` on ``backbone`` (a run
    ``sentemb.train.loop.train`` reads; ``resolve_run`` with the stage's own settings): ``train`` = the
    config's train settings, then the method's ``pretrain_train_defaults``, then the train keys of
    ``methods.<method>.pretrain``; its ``corpus`` and ``seed`` (``PretrainStage``) from that block.
    ``config``: the config tree (``sentemb.config.settings.Config``) or a validated mapping."""
    from ..config.load import resolve_run
    from ..methods import get_method
    from ..config.settings import PretrainStage, TrainSettings

    cfg = Config.of(config)
    cls = get_method(method)
    if cls.pretrain_stage is None:
        raise SentembError(f"method '{method}' has no pretraining stage")
    if backbone not in cfg.backbones:
        raise SentembError(f"backbone '{backbone}' is not declared in config key 'backbones' "
                           f"(declared: {sorted(cfg.backbones)})")
    for i, run in enumerate(cfg.runs):
        if run.method == method and "pretrain" in run.method_args:
            raise SentembError(f"config key 'runs[{i}].method_args.pretrain': the pretraining stage is shared by "
                               f"every run of '{method}' on a backbone; set it in methods.{method}.pretrain")
    margs = cls.resolve_args(cfg.methods.get(method, {}), where=f"methods.{method}")
    block = margs["pretrain"] or {}
    train_keys = {f.name for f in fields(TrainSettings)}
    train = {**cfg.train.to_dict(), **cls.pretrain_train_defaults, **{k: v for k, v in block.items() if k in train_keys}}
    stage = PretrainStage(**{f.name: block[f.name] for f in fields(PretrainStage) if f.name in block})
    return resolve_run(cfg, f"{method}-pretrain", backbone, stage.seed, method=method, train=train,
                       method_args=margs, corpus=stage.corpus or cfg.corpus.name, inputs={},
                       run_name=f"pretrain/{method}/{backbone}", rule="pretrain")


def run_pretrain(run: Run | dict, out_dir: str | Path, *, progress: bool = True) -> dict:
    """Run a resolved stage (``resolve_pretrain``) into ``out_dir``: the shared loop trains the Method
    class the method declares as its ``pretrain_stage``."""
    from ..methods import get_method
    from .loop import train

    run = Run.from_dict(run)
    stage = get_method(run.method).pretrain_stage
    if stage is None:
        raise SentembError(f"method '{run.method}' has no pretraining stage")
    return train(run, out_dir, method_cls=stage, progress=progress)
