"""Options from a resolved spec (issue 28 §3): a workflow job passes paths only (``--spec``,
``--tracking``), a person may still give any option on the command line. An option given explicitly
wins, then the spec, then the declared default (``sentemb.config.settings.EvaluationSettings``), so no
default is written in an argument parser."""

from __future__ import annotations

import argparse
from typing import Any

from .. import SentembError
from ..utils import read_json
from .argtypes import key_value


def apply_spec(args: argparse.Namespace, defaults: dict[str, Any], required: tuple[str, ...] = ()) -> None:
    """Fill the options of ``args`` left unset (None, or an empty list for KEY=VALUE options) from
    ``args.spec`` and ``args.tracking`` (JSON files whose keys are option names), then from
    ``defaults``. Lists become the comma form of ``--tasks``; mappings the KEY=VALUE form. An option
    of ``required`` still unset is an error naming it."""
    for attr in ("spec", "tracking"):
        path = getattr(args, attr, None)
        if not path:
            continue
        spec = read_json(path, f"--{attr}")
        if not isinstance(spec, dict):
            raise SentembError(f"--{attr} {path}: expected a JSON object of option values")
        for key, value in spec.items():
            if not hasattr(args, key):
                raise SentembError(f"--{attr} {path}: '{key}' is not an option of this command")
            have = getattr(args, key)
            value = _checked(args, key, value, f"--{attr} {path}")
            if key == "track":
                args.track = bool(have or value)
            elif have is None or have == []:
                setattr(args, key, _as_option(value, _pair_type(args, key), f"--{attr} {path}: '{key}'"))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, _as_option(value))
    missing = [k for k in required if getattr(args, k) is None]
    if missing:
        raise SentembError("missing " + ", ".join(f"--{k.replace('_', '-')}" for k in missing)
                           + " (give it, or a --spec that holds it)")


def _checked(args: argparse.Namespace, key: str, value: Any, where: str) -> Any:
    """``value`` as the parser would have taken it from the command line: its type, its choices."""
    action = (getattr(args, "_spec_actions", None) or {}).get(key)
    if action is None or value is None or isinstance(value, (list, dict)):
        return value
    if action.type is not None:
        try:
            value = action.type(value)
        except argparse.ArgumentTypeError as e:  # sentemb.cli.argtypes: its own words (range, form)
            raise SentembError(f"{where}: '{key}' = {value!r}: {e}") from None
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", action.type)
            raise SentembError(f"{where}: '{key}' = {value!r} is not {kind}") from None
    if action.choices is not None and value not in action.choices:
        raise SentembError(f"{where}: '{key}' = {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def _pair_type(args: argparse.Namespace, key: str):
    """The type a KEY=VALUE option converts each item with (``argtypes.key_value``, ``run_meta``), if any."""
    action = (getattr(args, "_spec_actions", None) or {}).get(key)
    return getattr(action, "type", None)


def _as_option(value: Any, pair_type=None, where: str = "") -> Any:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):  # KEY=VALUE items, converted as the command line's would be
        items = [f"{k}={v}" for k, v in value.items()]
        if pair_type is None:
            return items
        try:
            return [pair_type(item) for item in items]
        except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
            raise SentembError(f"{where}: {e}") from None
    return value


def evaluation_defaults(*keys: str) -> dict[str, Any]:
    """The declared defaults of ``evaluation`` (and the config's ``experiment``) under the commands'
    option names."""
    from ..config.settings import Config, EvaluationSettings

    ev = EvaluationSettings()
    names = {"tasks": ev.tasks, "setting": ev.setting, "batch_size": ev.batch_size, "precision": ev.precision,
             "transfer_tasks": ev.transfer_tasks, "mrpc_features": ev.mrpc_features,
             "classifier": ev.transfer_classifier, "experiment": Config().experiment}
    return {k: names[k] for k in keys}


def add_tracking_options(p: argparse.ArgumentParser, run_prefix: str) -> None:
    """The MLflow options of an evaluation command (``evaluate``: run names ``eval:<model>``,
    ``evaluate-transfer``: ``transfer:<model>``)."""
    p.add_argument("--track", action="store_true", help="record an MLflow run")
    p.add_argument("--experiment", default=None,
                   help="MLflow experiment (default: --spec's or --tracking's, else sentemb)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: --tracking's, else sqlite:///mlflow.db; $MLFLOW_TRACKING_URI, "
                        "when set, wins)")
    p.add_argument("--run-name", default=None, help=f"MLflow run name (default: --spec's, else {run_prefix}:<model>)")
    p.add_argument("--tag", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="extra MLflow run tag (repeatable)")


def check_tracking_uri(args: argparse.Namespace) -> None:
    """With ``--track``, a malformed tracking URI fails at the command's start, not after its work."""
    if args.track:
        from ..tracking.runs import check_uri
        from ..tracking.store import resolve_uri

        check_uri(resolve_uri(args.tracking_uri))


def add_spec_options(p: argparse.ArgumentParser, tracking: bool = True) -> None:
    p.add_argument("--spec", default=None, help="the job's resolved settings (JSON whose keys are this command's "
                                                "options; rule eval_spec, sentemb.config.load.eval_spec); an option "
                                                "given on the command line wins over it")
    if tracking:
        p.add_argument("--tracking", default=None, help="MLflow settings (JSON: track, experiment, tracking_uri; "
                                                        "rule tracking_options)")
    p.set_defaults(_spec_actions={a.dest: a for a in p._actions})  # a spec value is checked as the option
