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

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from .. import SentembError
from .store import (ARTIFACT_DIR, DEFAULT_URI, _retry, _sqlite_path, _store_lock,  # noqa: F401
                            init_store, resolve_uri)
from .queue import (PENDING, QUEUE_NAME, Queue, Sender, TrackingUnavailable, Unresolved, http_status,
                             is_remote, new_ref, replay, short_error, sync_all)

log = logging.getLogger(__name__)
DEFAULT_WAIT_S = 30.0  # config tracking.wait_s: how long a job waits for an absent server before queueing
WAIT_ENV = "SENTEMB_TRACKING_WAIT_S"
RETRY_EVERY_S = 30.0  # while records wait in the queue: how often a job tries the server again
SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks")


def wait_time(wait_s: float | None = None) -> float:
    """``wait_s`` (config ``tracking.wait_s``), else ``$SENTEMB_TRACKING_WAIT_S``, else ``DEFAULT_WAIT_S``."""
    if wait_s is None:
        env = os.environ.get(WAIT_ENV)
        try:
            wait_s = float(env) if env else DEFAULT_WAIT_S
        except ValueError:
            raise SentembError(f"${WAIT_ENV}={env!r} is not a number of seconds") from None
    return float(wait_s)


def check_uri(uri: str) -> None:
    """A tracking URI MLflow can use, else an error naming it and where it comes from."""
    u = urlparse(uri)
    problem = None
    if "://" not in uri or u.scheme.split("+")[0] not in SCHEMES:
        problem = f"expected one of {', '.join(s + '://' for s in SCHEMES)}"
    elif u.scheme in ("http", "https"):
        try:
            if not u.hostname or (u.port is not None and not 0 < u.port < 65536):
                problem = "no host"
        except ValueError as e:
            problem = str(e)
    if problem:
        raise SentembError(f"MLflow tracking URI {uri!r} is malformed ({problem}); set MLFLOW_TRACKING_URI or config "
                           f"tracking.uri to e.g. http://HOST:5000 or sqlite:///mlflow.db")


def refused_message(uri: str, e: BaseException) -> str:
    """Why a tracking server refused a job at its start, and what to set."""
    status = http_status(e)
    text = short_error(e)
    if status in (401, 403):
        return (f"MLflow server {uri} refused the credentials (HTTP {status}): set MLFLOW_TRACKING_USERNAME and "
                f"MLFLOW_TRACKING_PASSWORD to a user of its basic-auth app (nothing was trained)")
    return (f"MLflow server {uri} refused the job's tracking ({text}); check MLFLOW_TRACKING_URI (or config "
            f"tracking.uri), MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD and the experiment (nothing was "
            f"trained)")


def queue_beside(marker: Path) -> Path:
    """A job's tracking queue, beside its run marker: ``<run dir>/tracking_queue.jsonl`` for
    ``.mlflow_run.json``, ``eval_sts.json.tracking_queue.jsonl`` for ``.eval_sts.json.mlflow_run.json``."""
    stem = marker.name.removesuffix("mlflow_run.json").strip(".")
    return marker.with_name(f"{stem}.{QUEUE_NAME}" if stem else QUEUE_NAME)


def workflow_root(path: Path) -> Path | None:
    """The results directory a queue lies under: the nearest parent holding ``.tracking/`` (the
    ``init_tracking`` rule's marker directory)."""
    for parent in Path(path).resolve().parents:
        if (parent / ".tracking").is_dir():
            return parent
    return None


def file_digest(path: Path) -> tuple[str, int]:
    """MLflow's dataset digest of a file (the first 8 hex digits of its sha256) and its line count."""
    import hashlib

    h, lines = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            lines += block.count(b"\n")
    return h.hexdigest()[:8], lines


def git_commit() -> str | None:
    """The commit of the sentemb source tree (not of the working directory), if it is a checkout."""
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty() -> bool | None:
    """Whether that source tree has uncommitted changes to tracked files (None if it is no checkout):
    a run with a commit and ``git_dirty`` false ran the committed code."""
    try:
        # --no-optional-locks: parallel jobs must not take the index lock a user's `git commit` needs
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(Path(__file__).parent), "status", "--porcelain",
                              "--untracked-files=no"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.strip())


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

    With a tracking server (``http(s)://``), the server can go away without costing the job: a
    write that gets no answer within ``wait_s`` seconds (config ``tracking.wait_s``, else
    ``$SENTEMB_TRACKING_WAIT_S``, else ``DEFAULT_WAIT_S``) goes, with every later one, to ``queue``
    (default: beside ``marker``), which is sent in order when the server answers again
    (``sentemb.tracking.queue``). An error that waiting cannot fix (credentials refused, a malformed
    URI, a deleted experiment) fails the job at the start, before any training step.
    """

    def __init__(self, *, uri: str | None = None, experiment: str = "sentemb", run_name: str | None = None,
                 tags: dict | None = None, params: dict | None = None, enabled: bool = True,
                 marker: str | os.PathLike | None = None, key: str | None = None, resume: bool = False,
                 parent_run_id: str | None = None, queue: str | os.PathLike | None = None,
                 wait_s: float | None = None):
        self.enabled = enabled
        self.uri, self.experiment, self.run_name = resolve_uri(uri), experiment, run_name
        self.tags = {k: str(v) for k, v in (tags or {}).items() if v is not None}
        self.params = params or {}
        self.marker, self.key, self.resume = (Path(marker) if marker else None), key, resume
        self.parent_run_id = parent_run_id
        self.wait_s = wait_time(wait_s)
        self.retry_every_s = RETRY_EVERY_S  # while the server is away: how often to try it again
        if queue is None and self.marker is not None:
            queue = queue_beside(self.marker)
        self.queue = Queue(queue) if queue is not None else None
        self.remote = is_remote(self.uri)
        self.sender: Sender | None = None
        self.client = self.run_id = None  # run_id: the MLflow run id, or "pending-…" until the server has it
        self.continued = False
        self.skip_until = -1  # metrics at steps <= this are already in the continued run
        self.offline = False  # records go to the queue (the server did not answer, or records wait there)
        self._next_try = 0.0

    # ------------------------------------------------------------------ state of the store
    def _previous(self) -> dict | None:
        if self.marker is None or not self.marker.is_file():
            return None
        try:
            prev = json.loads(self.marker.read_text("utf-8"))
            return prev if isinstance(prev, dict) and prev.get("run_id") else None
        except (OSError, ValueError):
            return None

    def _run_of(self, run_id: str):
        rid = self.sender.resolve(run_id, self.experiment)
        return self.sender.run(rid) if rid else None

    # ------------------------------------------------------------------ start
    def __enter__(self) -> "Tracker":
        if not self.enabled:
            return self
        check_uri(self.uri)
        self.sender = Sender(self.uri, self.wait_s)
        if self.remote:
            if self.queue is None:
                self.queue = Queue(Path.cwd() / "tracking_queues" / f"{new_ref()}.{QUEUE_NAME}")
            self.queue.lock()
        try:
            self._start()
        except BaseException:
            if self.queue is not None:
                self.queue.unlock()
            raise
        return self

    def _start(self) -> None:
        try:
            self.sender.experiment_id(self.experiment)
            if self.remote:
                self._send_waiting()
        except TrackingUnavailable as e:
            self._go_offline(f"MLflow server {self.uri} not answering ({e})")
        except SentembError:
            raise
        except Exception as e:  # the server answered, and no wait will change its answer
            if not self.remote:
                raise
            raise SentembError(refused_message(self.uri, e)) from None
        self.client = self.sender.client
        prev = self._previous()
        if self.offline:
            self._start_offline(prev)
        else:
            self._start_online(prev)
        self._write_marker()
        params = _flatten(self.params)
        names = list(params)
        for i in range(0, len(names), 100):
            self._write({"op": "log", "params": {k: params[k] for k in names[i:i + 100]}})

    def _send_waiting(self) -> None:
        """This job's own waiting records (an earlier attempt of it), then every other pending
        queue of the workflow (``<results>/…``): the server answers, so they go first."""
        if self.queue.pending():
            try:
                replay(self.queue, self.sender)
            except Exception as e:  # unreachable, refused, or naming a run not synced yet
                self._go_offline(f"{self.queue.pending()} earlier tracking records could not be sent ({e})")
                return
        root = workflow_root(self.queue.path)
        if root is not None:
            try:
                res = sync_all(root, self.uri, wait_s=self.wait_s, skip=self.queue.path)
                if res["sent"]:
                    log.info("sent %d tracking records that other jobs had queued under %s", res["sent"], root)
            except Exception:  # another job's queue must never stop this one
                log.warning("could not send the other jobs' queued tracking records", exc_info=True)

    def _start_online(self, prev: dict | None) -> None:
        old = self._run_of(prev["run_id"]) if prev else None
        if old is not None and self.resume and prev.get("key") == self.key and old.info.lifecycle_stage == "active":
            self.run_id, self.continued = old.info.run_id, True
            self._write({"op": "status", "status": "RUNNING"})
            steps = [m.step for k in old.data.metrics for m in self.sender.do(self.client.get_metric_history,
                                                                              self.run_id, k)]
            self.skip_until = max(steps, default=-1)
            log.info("continuing MLflow run %s (metrics up to step %d already logged)", self.run_id, self.skip_until)
            return
        active = old is not None and old.info.lifecycle_stage == "active"
        self._create(old.info.run_id if active else None)

    def _start_offline(self, prev: dict | None) -> None:
        """Decided from the marker alone: the server cannot be asked what it holds."""
        if prev and self.resume and prev.get("key") == self.key:
            self.run_id, self.continued = prev["run_id"], True
            self._write({"op": "status", "status": "RUNNING", "dedupe": True})
            return
        self._create(prev["run_id"] if prev else None)

    def _create(self, retire: str | None) -> None:
        ref = new_ref()
        commit = git_commit()
        tags = {"git_commit": commit, **({"git_dirty": git_dirty()} if commit else {}), **self.tags}
        self.run_id = ref
        self._write({"op": "create", "run_name": self.run_name, "start_time": int(time.time() * 1000),
                     "tags": {k: str(v) for k, v in tags.items() if v is not None}, "parent": self.parent_run_id})
        if self.sender.ids.get(ref):
            self.run_id = self.sender.ids[ref]  # created: the server's id from now on
        if retire:
            self._write({"op": "retire", "ref": retire, "by": self.run_id})

    def _write_marker(self) -> None:
        if self.marker is None:
            return
        from ..utils import atomic_path

        self.marker.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.marker) as tmp:
            Path(tmp).write_text(json.dumps({"run_id": self.run_id, "key": self.key}), "utf-8")

    # ------------------------------------------------------------------ every write goes through here
    def _write(self, rec: dict) -> None:
        rec = {"ref": self.run_id, "experiment": self.experiment, **rec}
        if self.continued and self.offline and rec["ref"] == self.run_id:
            rec["dedupe"] = True  # a run continued blind: its history decides at replay
        if not self.offline:
            try:
                self.sender.apply(rec, final=not self.remote)  # SQLite: a run only a queue knows is dropped
                return
            except (TrackingUnavailable, Unresolved) as e:
                rec["maybe_sent"] = isinstance(e, TrackingUnavailable)
                self._go_offline(f"MLflow server {self.uri} not answering ({e})")
            except Exception as e:
                if not self.remote:
                    raise
                log.error("MLflow server %s refused a tracking record (%s); it waits in the queue", self.uri, e)
                self._go_offline(f"MLflow server {self.uri} refused a record")
        self._enqueue(rec)
        self._maybe_flush()

    def _enqueue(self, rec: dict) -> None:
        if rec["op"] == "artifact":
            rec = {**rec, "file": self.queue.keep_file(rec["file"])}
        self.queue.append(rec)

    def _go_offline(self, why: str) -> None:
        if not self.remote:
            raise TrackingUnavailable(why)
        if not self.offline:
            log.warning("%s: tracking records go to %s from now on and are sent when the server answers again",
                        why, self.queue.path)
        self.offline = True
        self._next_try = time.monotonic() + self.retry_every_s

    def _maybe_flush(self, wait_s: float = 0.0, force: bool = False) -> None:
        """While records wait: every ``retry_every_s`` seconds, one try to send them (one request
        when the server is still away, so the job is not held up)."""
        if not (force or time.monotonic() >= self._next_try):
            return
        self._next_try = time.monotonic() + self.retry_every_s
        sender = Sender(self.uri, wait_s)
        sender.ids, sender.experiments = self.sender.ids, self.sender.experiments
        try:
            n = self.queue.pending()
            replay(self.queue, sender)
        except (TrackingUnavailable, Unresolved):
            return
        except Exception as e:
            log.error("MLflow server %s refused a queued tracking record (%s); it keeps waiting", self.uri, e)
            return
        self.offline = False
        if isinstance(self.run_id, str) and self.run_id in self.sender.ids:
            self.run_id = self.sender.ids[self.run_id]
        log.info("MLflow server %s answers again: %d queued tracking records sent", self.uri, n)

    # ------------------------------------------------------------------ what jobs log
    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        if not self.enabled or step <= self.skip_until:
            return
        ts = int(time.time() * 1000)
        self._write({"op": "log", "metrics": [[k, float(v), ts, step] for k, v in metrics.items()]})

    def log_metrics_to(self, run_id: str, metrics: dict[str, float], step: int = 0) -> bool:
        """Also log ``metrics`` onto another run of this store (e.g. test scores onto the training
        run, next to its hyperparameters); False if that run is not in this store (while the server
        is away: queued, and dropped at replay if the run never appears)."""
        if not self.enabled:
            return False
        if not self.offline:
            try:
                if self._run_of(run_id) is None and not str(run_id).startswith(PENDING):
                    return False
            except TrackingUnavailable as e:
                self._go_offline(f"MLflow server {self.uri} not answering ({e})")
        ts = int(time.time() * 1000)
        self._write({"op": "log", "ref": run_id, "other": True,
                     "metrics": [[k, float(v), ts, step] for k, v in metrics.items()]})
        return True

    def set_tags(self, tags: dict) -> None:
        if self.enabled:
            self._write({"op": "log", "tags": {k: str(v) for k, v in tags.items()}})

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self.enabled:
            self._write({"op": "artifact", "file": str(path), "artifact_path": artifact_path})

    def log_dataset(self, path: str | os.PathLike, name: str, context: str = "train") -> None:
        """The corpus a run trains on, as an MLflow dataset input (name, digest, source): the
        runs table's Dataset column and the run's lineage."""
        if not self.enabled:
            return
        path = Path(path)
        digest, lines = file_digest(path)
        self._write({"op": "inputs", "datasets": [{
            "name": name, "digest": digest, "source_type": "local", "context": context,
            "source": json.dumps({"uri": str(path)}), "profile": json.dumps({"num_rows": lines})}]})

    # ------------------------------------------------------------------ end
    def __exit__(self, exc_type, exc, tb) -> None:
        if not (self.enabled and self.run_id is not None):
            if self.queue is not None:
                self.queue.unlock()
            return
        try:
            end = int(time.time() * 1000)
            if exc_type is not None:
                text = f"{exc_type.__name__}: {exc}"[:5000]
                try:
                    self._write({"op": "log", "tags": {"error": text}})
                except Exception:  # never hide the job's own error behind a tracking one
                    log.exception("could not record the error on MLflow run %s", self.run_id)
                # A kill-like interruption (Ctrl-C, SIGTERM turned into KeyboardInterrupt) is KILLED.
                status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
                self._write({"op": "status", "status": status, "end_time": end})
            else:
                self._write({"op": "status", "status": "FINISHED", "end_time": end})
            if self.offline:
                self._maybe_flush(wait_s=self.wait_s, force=True)
            if self.offline:
                log.warning("MLflow server %s still not answering: %d tracking records wait in %s; they are sent "
                            "by the next job that reaches it, or run `sentemb sync-tracking`", self.uri,
                            self.queue.pending(), self.queue.path)
        finally:
            if self.queue is not None:
                self.queue.unlock()


NOTE_TAG = "mlflow.note.content"  # the experiment's description in MLflow's UI
UI_QUERY = "?workflowType=machine_learning"  # MLflow 3 opens an experiment on its GenAI overview otherwise


def ui_link(base: str, experiment_id: str | None) -> str:
    """The page a researcher should land on: the experiment's runs table, in model-training mode."""
    base = base.rstrip("/")
    return f"{base}/#/experiments/{experiment_id}/runs{UI_QUERY}" if experiment_id else f"{base}/"


def set_note(uri: str, experiment: str, table_md: Path, wait_s: float = 10.0) -> bool:
    """The experiment's description note := the latest ``table1.md`` (False if there is none yet, or if
    the store holds no such experiment: a note alone never creates one)."""
    if not table_md.is_file():
        return False
    sender = Sender(uri, wait_s)
    exp_id = sender.existing_experiment(experiment)
    if exp_id is None:
        return False
    text = (f"**Table 1** (`{table_md}`, {time.strftime('%Y-%m-%d %H:%M', time.localtime(table_md.stat().st_mtime))})"
            f"\n\n{table_md.read_text('utf-8')}")
    sender.do(sender.client.set_experiment_tag, exp_id, NOTE_TAG, text)
    return True
