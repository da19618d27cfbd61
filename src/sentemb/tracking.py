"""MLflow tracking: one run per training or evaluation job.

The default store is embedded: ``sqlite:///mlflow.db`` in the working directory (MLflow's own
default, so a plain ``mlflow ui`` finds it) with artifacts under ``./mlartifacts``. A tracking URI in
config (``tracking.uri``) or ``MLFLOW_TRACKING_URI`` points runs at a server instead; on a cluster
use a server, since SQLite must not be shared over NFS.

Creating a SQLite store from several processes at once races on the schema migration, so the
store and experiment are created once, under a file lock, by ``init_store`` (the workflow's
``init_tracking`` rule runs it before any job); writes retry on "database is locked".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)
DEFAULT_URI = "sqlite:///mlflow.db"
ARTIFACT_DIR = "mlartifacts"


def resolve_uri(uri: str | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``uri``, else the embedded SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or uri or DEFAULT_URI


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_lock(uri: str):
    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _retry(fn, *args, attempts: int = 8, **kw):
    for i in range(attempts):
        try:
            return fn(*args, **kw)
        except Exception as e:  # sqlite "database is locked" surfaces as MlflowException/OperationalError
            if "locked" not in str(e).lower() or i == attempts - 1:
                raise
            time.sleep(0.2 * 2**i)


def init_store(uri: str | None, experiment: str) -> str:
    """Create the store (schema) and the experiment if missing; return the experiment id. Idempotent."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    uri = resolve_uri(uri)
    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            return exp.experiment_id
        location = None
        db = _sqlite_path(uri)
        if db is not None:
            location = (db.resolve().parent / ARTIFACT_DIR).as_uri()
        return client.create_experiment(experiment, artifact_location=location)


def git_commit() -> str | None:
    """The commit of the sentemb source tree (not of the working directory), if it is a checkout."""
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


class Tracker:
    """A context manager around one MLflow run; a no-op when ``enabled`` is False.

    Metrics are buffered and written with ``log_batch`` (one write per logging step, not per value).
    The run ends FINISHED on success and FAILED, with the error text as tag ``error``, when the
    block raises.

    ``marker`` makes the store tell the truth across kills and reruns of one job: the file holds
    the id of the job's run (and ``key``, e.g. the settings' fingerprint). On the next start of the
    job, with ``resume`` (the job continues from its own saved state under the same ``key``), the
    run is continued: set RUNNING again, and metrics at steps it already holds are not logged a
    second time (a resumed job recomputes them identically). Otherwise the earlier run is retired:
    a RUNNING one (a killed job) is marked KILLED, a finished one whose outputs are being redone is
    tagged ``superseded_by`` and deleted, so each finished job has exactly one FINISHED run.
    """

    def __init__(self, *, uri: str | None = None, experiment: str = "sentemb", run_name: str | None = None,
                 tags: dict | None = None, params: dict | None = None, enabled: bool = True,
                 marker: str | os.PathLike | None = None, key: str | None = None, resume: bool = False,
                 parent_run_id: str | None = None):
        self.enabled = enabled
        self.uri, self.experiment, self.run_name = resolve_uri(uri), experiment, run_name
        self.tags = {k: str(v) for k, v in (tags or {}).items() if v is not None}
        self.params = params or {}
        self.marker, self.key, self.resume = (Path(marker) if marker else None), key, resume
        self.parent_run_id = parent_run_id
        self.client = self.run_id = None
        self.continued = False
        self.skip_until = -1  # metrics at steps <= this are already in the continued run

    def _previous(self) -> dict | None:
        if self.marker is None or not self.marker.is_file():
            return None
        try:
            prev = json.loads(self.marker.read_text("utf-8"))
            return prev if isinstance(prev, dict) and prev.get("run_id") else None
        except (OSError, json.JSONDecodeError):
            return None

    def _run_of(self, run_id: str):
        try:
            return self.client.get_run(run_id)
        except Exception:  # deleted, or from another store
            return None

    def __enter__(self) -> "Tracker":
        if not self.enabled:
            return self
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        exp_id = init_store(self.uri, self.experiment)
        self.client = MlflowClient(tracking_uri=self.uri)
        prev = self._previous()
        old = self._run_of(prev["run_id"]) if prev else None
        if old is not None and self.resume and prev.get("key") == self.key and old.info.lifecycle_stage == "active":
            self.run_id, self.continued = old.info.run_id, True
            _retry(self.client.update_run, self.run_id, status="RUNNING")
            steps = [m.step for k in old.data.metrics for m in _retry(self.client.get_metric_history, self.run_id, k)]
            self.skip_until = max(steps, default=-1)
            log.info("continuing MLflow run %s (metrics up to step %d already logged)", self.run_id, self.skip_until)
            return self
        tags = {"git_commit": git_commit(), **self.tags}
        if self.parent_run_id and self._run_of(self.parent_run_id) is not None:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = _retry(self.client.create_run, exp_id, run_name=self.run_name,
                     tags={k: str(v) for k, v in tags.items() if v is not None})
        self.run_id = run.info.run_id
        if old is not None and old.info.lifecycle_stage == "active":
            self._retire(old)
        self._write_marker()
        params = [Param(k, v) for k, v in _flatten(self.params).items()]
        for i in range(0, len(params), 100):
            _retry(self.client.log_batch, self.run_id, params=params[i : i + 100])
        return self

    def _retire(self, old) -> None:
        from mlflow.entities import RunTag

        rid = old.info.run_id
        _retry(self.client.log_batch, rid, tags=[RunTag("superseded_by", self.run_id)])
        if old.info.status in ("RUNNING", "SCHEDULED"):
            _retry(self.client.set_terminated, rid, "KILLED")
            log.info("MLflow run %s of an interrupted job marked KILLED", rid)
        else:  # finished or failed, but the job is being redone: one run per job
            _retry(self.client.delete_run, rid)
            log.info("MLflow run %s (%s) superseded by %s and deleted", rid, old.info.status, self.run_id)

    def _write_marker(self) -> None:
        if self.marker is None:
            return
        from .utils import atomic_path

        self.marker.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.marker) as tmp:
            Path(tmp).write_text(json.dumps({"run_id": self.run_id, "key": self.key}), "utf-8")

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        if not self.enabled or step <= self.skip_until:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        _retry(self.client.log_batch, self.run_id, metrics=ms)

    def log_metrics_to(self, run_id: str, metrics: dict[str, float], step: int = 0) -> bool:
        """Also log ``metrics`` onto another run of this store (e.g. test scores onto the training
        run, next to its hyperparameters); False if that run is not in this store."""
        if not self.enabled or self._run_of(run_id) is None:
            return False
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        _retry(self.client.log_batch, run_id, metrics=[Metric(k, float(v), ts, step) for k, v in metrics.items()])
        return True

    def set_tags(self, tags: dict) -> None:
        if self.enabled:
            from mlflow.entities import RunTag

            _retry(self.client.log_batch, self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self.enabled:
            _retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def __exit__(self, exc_type, exc, tb) -> None:
        if not (self.enabled and self.run_id is not None):
            return
        if exc_type is not None:
            from mlflow.entities import RunTag

            text = f"{exc_type.__name__}: {exc}"[:5000]
            try:
                _retry(self.client.log_batch, self.run_id, tags=[RunTag("error", text)])
            except Exception:  # never hide the job's own error behind a tracking one
                log.exception("could not record the error on MLflow run %s", self.run_id)
            # A kill-like interruption (Ctrl-C, SIGTERM turned into KeyboardInterrupt) is KILLED.
            status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
            _retry(self.client.set_terminated, self.run_id, status)
            return
        _retry(self.client.set_terminated, self.run_id, "FINISHED")


def _cmd_init(args) -> int:
    from .utils import write_json

    exp_id = init_store(args.tracking_uri, args.experiment)
    uri = resolve_uri(args.tracking_uri)
    print(f"MLflow store {uri}: experiment '{args.experiment}' (id {exp_id})")
    if args.output:
        write_json(args.output, {"tracking_uri": uri, "experiment": args.experiment, "experiment_id": exp_id})
    return 0


def register(sub) -> None:
    p = sub.add_parser("init-tracking", help="create the MLflow store and experiment once, before parallel jobs")
    p.add_argument("--experiment", required=True)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--output", default=None, help="marker JSON for the workflow")
    p.set_defaults(func=_cmd_init)
