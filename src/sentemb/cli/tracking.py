"""``sentemb`` commands of ``sentemb.tracking.runs``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .. import SentembError
from ..tracking.queue import QUEUE_NAME, Sender, TrackingUnavailable, call, is_remote, sync_all
from ..tracking.runs import check_uri, log, refused_message, set_note, ui_link, wait_time
from ..tracking.store import init_store, resolve_uri
from .argtypes import non_empty, port_int


def _cmd_init(args) -> int:
    from ..utils import write_json

    uri = resolve_uri(args.tracking_uri)
    check_uri(uri)
    exp_id = None
    try:
        exp_id = call(init_store, uri, args.experiment, wait_s=wait_time()) if is_remote(uri) else \
            init_store(uri, args.experiment)
        print(f"MLflow store {uri}: experiment '{args.experiment}' (id {exp_id})")
    except TrackingUnavailable as e:  # jobs queue their records and send them when it answers
        print(f"MLflow server {uri} not answering ({e}): jobs keep their tracking records in "
              f"<run dir>/{QUEUE_NAME} until it answers; `sentemb sync-tracking` sends them")
    except SentembError:
        raise
    except Exception as e:
        if not is_remote(uri):
            raise
        raise SentembError(refused_message(uri, e)) from None
    if args.output:
        write_json(args.output, {"tracking_uri": uri, "experiment": args.experiment, "experiment_id": exp_id})
    return 0


def _workflow_settings(args) -> tuple[str, str, Path, float]:
    """(tracking URI, experiment, results directory, wait) from ``--config`` and the overrides."""
    from ..config.load import load_config

    config = load_config(args.config)
    tracking = config["tracking"]
    uri = args.tracking_uri or resolve_uri(tracking["uri"])
    check_uri(uri)
    return uri, config["experiment"], Path(args.results_dir or config["results_dir"]), wait_time(tracking["wait_s"])


def _cmd_sync(args) -> int:
    uri, experiment, results, wait_s = _workflow_settings(args)
    if not results.is_dir():  # a mistyped directory would report "0 queues" and exit 0
        raise SentembError(f"results directory {results} not found (--results-dir, or config results_dir)")
    res = sync_all(results, uri, wait_s=max(wait_s, 30.0))
    print(f"{res['queues']} tracking queue(s) under {results}: {res['sent']} record(s) sent to {uri}, "
          f"{res['waiting']} waiting" + (f" ({res['busy']} queue(s) in use by running jobs)" if res["busy"] else ""))
    if res["error"]:
        print(f"sentemb sync-tracking: {res['error']}", file=sys.stderr)
        return 1
    try:
        if set_note(uri, experiment, results / "table1.md"):
            print(f"experiment '{experiment}': description note := {results / 'table1.md'}")
        elif (results / "table1.md").is_file():
            print(f"experiment '{experiment}' (config experiment) is not in {uri}: no note set (is --config the "
                  "config the runs were made with?)")
    except Exception as e:  # the note is a convenience; the runs are what sync is for
        log.warning("could not set the experiment note: %s", e)
    return 0 if not res["waiting"] else 1


def _cmd_ui(args) -> int:
    uri, experiment, results, _ = _workflow_settings(args)
    exp_id = None
    try:  # looked up, never created; --print-only writes nothing (not even the note)
        exp_id = Sender(uri, 10.0).existing_experiment(experiment)
        if exp_id is None:
            print(f"sentemb ui: experiment '{experiment}' (config experiment of {args.config}) is not in {uri} yet "
                  "(the workflow's first job creates it): the link opens the list of experiments", file=sys.stderr)
        elif not args.print_only:
            set_note(uri, experiment, results / "table1.md")
    except Exception as e:
        log.warning("MLflow store %s: %s", uri, str(e).splitlines()[0] if str(e) else type(e).__name__)
    if is_remote(uri):  # a server already serves the UI
        print(ui_link(uri, exp_id))
        return 0
    link = ui_link(f"http://{args.host}:{args.port}", exp_id)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port), "--workers", "1"]
    if args.print_only:
        print(link)
        return 0
    _port_free(args.host, args.port)
    print(f"MLflow UI on {uri}: open {link}   (Ctrl-C stops it)", flush=True)
    proc = subprocess.Popen(cmd, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the UI server stopped too, then exit 130 or 143
        proc.terminate()
        proc.wait()
        raise


def _port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on: ``mlflow ui`` would fail to bind and exit 0 after the
    link was printed, and the link would open that other server's runs. Every address ``host`` resolves
    to is tried (``localhost``: IPv4 and IPv6); an error other than "in use" is left to the server."""
    import errno
    import socket

    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
            try:
                sock.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise SentembError(f"--port {port}: {host}:{port} is in use ({e.strerror}); pick a free port, "
                                       f"e.g. --port {port + 1}") from None


def register(sub) -> None:
    p = sub.add_parser("init-tracking", help="create the MLflow store and experiment once, before parallel jobs")
    p.add_argument("--experiment", required=True, type=non_empty, help="MLflow experiment to create (config experiment)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: sqlite:///mlflow.db; $MLFLOW_TRACKING_URI, when set, wins)")
    p.add_argument("--output", default=None, help="marker JSON for the workflow")
    p.set_defaults(func=_cmd_init)
    for name, func, text in (
            ("sync-tracking", _cmd_sync, "send the tracking records jobs queued while the MLflow server was away"),
            ("ui", _cmd_ui, "MLflow's UI on the configured store; prints the link to the runs table")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", default="config/config.yaml", help="the workflow's config (default: %(default)s)")
        p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else config tracking.uri")
        p.add_argument("--results-dir", default=None, help="default: config results_dir")
        if name == "ui":
            p.add_argument("--host", default="127.0.0.1",
                           help="address the local UI server listens on (default: %(default)s; a remote store's "
                                "server is only linked)")
            p.add_argument("--port", type=port_int, default=5000, help="its port (default: %(default)s)")
            p.add_argument("--print-only", action="store_true", help="print the link, start nothing")
        p.set_defaults(func=func)
