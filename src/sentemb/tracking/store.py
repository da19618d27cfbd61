"""The MLflow store itself: its URI, the file lock of a SQLite store, SQLite's "database is locked"
retry, and creating the store and experiment (``init_store``). Shared by ``sentemb.tracking.runs`` (a
job's run) and ``sentemb.tracking.queue`` (what waits for a server), so neither imports the other's
internals back."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from .. import SentembError

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
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise SentembError(f"MLflow experiment '{experiment}' (id {exp.experiment_id}) is deleted in {uri}: restore "
                               f"it (`mlflow experiments restore --experiment-id {exp.experiment_id}`) or set another "
                               f"`experiment` in config")
        if exp is not None:
            return exp.experiment_id
        location = None
        db = _sqlite_path(uri)
        if db is not None:
            location = (db.resolve().parent / ARTIFACT_DIR).as_uri()
        try:
            return client.create_experiment(experiment, artifact_location=location)
        except Exception as e:  # a server: another job created it meanwhile (no file lock spans hosts)
            if "RESOURCE_ALREADY_EXISTS" not in str(e) or client.get_experiment_by_name(experiment) is None:
                raise
            return client.get_experiment_by_name(experiment).experiment_id
