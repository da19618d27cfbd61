"""What a job could not send to MLflow waits in a durable local queue and is sent, in order, later.

A tracking server that goes away (killed on the login node, restarted, a network hiccup) must never
cost a training run: the per-run JSON files are the pipeline's outputs and MLflow is a view of them.
So every write a job makes to the store is a *record* (create a run, log params/metrics/tags, a
dataset input, an artifact, a status change, retire an earlier run), and a record that cannot be
sent within ``tracking.wait_s`` seconds goes, with every later one, to a JSON-lines file beside the
job's outputs (``<run dir>/tracking_queue.jsonl``): one record a line, flushed and fsynced before the
job goes on, so a SIGKILL loses at most the line being written (a torn last line is cut off when the
queue is next opened). The queue is sent when the server answers again: later in the same job, by
the next job that starts (it replays every pending queue of the workflow first), or by ``sentemb
sync-tracking``.

Idempotence, so that a replay interrupted anywhere can simply be started again:

* ``<queue>.acked`` holds how many leading records the server has acknowledged (rewritten
  atomically after each one);
* a record whose fate is unknown (the one being sent when the connection broke, marked
  ``maybe_sent``; the first unacknowledged one of a replay, which a crash may have cut between
  sending and acknowledging; records of a run continued while the server was down, ``dedupe``) has
  its metrics compared with the run's history on the server: no step is logged twice;
* every run carries the tag ``sentemb.ref``, a reference made by the job; a run created from a queue
  is found again by it, so it is never created twice, and other jobs (an evaluation nested under a
  training run that so far exists only in a queue) can point at it as ``pending-<hex>``.

Only one process works on a queue at a time: its job holds ``.<queue>.lock`` while it runs, and a
replay skips a queue whose lock is taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

QUEUE_NAME = "tracking_queue.jsonl"  # a job's queue ends in this; sync-tracking finds them by it
REF_TAG = "sentemb.ref"
PENDING = "pending-"
#: HTTP answers worth waiting out: the server is restarting, overloaded or behind a proxy that is
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


class TrackingUnavailable(Exception):
    """The tracking server did not answer (or answered 5xx) for the whole wait."""


class Unresolved(Exception):
    """A record names a run (``pending-…``) that no replay has created on the server yet."""


def new_ref() -> str:
    return PENDING + uuid.uuid4().hex


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def http_status(e: BaseException) -> int | None:
    """The HTTP status of a failed MLflow REST call; None when no answer came at all."""
    text = str(e)
    if "failed with exception" in text or "Max retries exceeded" in text:
        return None  # connection refused or reset, timeout: the server never answered
    m = re.search(r"error code (\d{3}) != 200", text)
    if m:
        return int(m.group(1))
    get = getattr(e, "get_http_status_code", None)
    return get() if callable(get) else None


def short_error(e: BaseException, limit: int = 300) -> str:
    """The first line of ``e``'s message within ``limit`` characters, its end kept: urllib3's messages
    put the cause last ("... Failed to establish a new connection: [Errno 111] Connection refused"))."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if len(text) <= limit:
        return text
    return text[: limit // 2 - 2] + " … " + text[-(limit - limit // 2 - 1):]


def is_transient(e: BaseException) -> bool:
    """Worth waiting out: no answer at all, a timeout, 5xx, 429 (and SQLite's "database is locked")."""
    import requests

    if isinstance(e, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    text = str(e)
    if "locked" in text.lower() or "failed with exception" in text or "Max retries exceeded" in text:
        return True
    return http_status(e) in TRANSIENT_STATUS


@contextlib.contextmanager
def _one_attempt(timeout_s: float):
    """MLflow's own HTTP retries off for the calls inside (their backoff can block for minutes):
    ``call`` retries instead, within its own deadline."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(timeout_s)))}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def call(fn, *args, wait_s: float, **kw):
    """``fn(*args, **kw)`` against a remote store, retried while the error is transient for at most
    ``wait_s`` seconds (0: one attempt); then ``TrackingUnavailable``. Other errors raise at once."""
    deadline = time.monotonic() + wait_s
    delay = 0.25
    while True:
        left = deadline - time.monotonic()
        try:
            with _one_attempt(min(max(left, 2.0), 30.0)):
                return fn(*args, **kw)
        except Exception as e:
            if not is_transient(e):
                raise
            if time.monotonic() + delay > deadline:
                raise TrackingUnavailable(short_error(e)) from e
            time.sleep(delay)
            delay = min(delay * 2, 4.0)


class Queue:
    """One job's JSON-lines queue and its companions: ``.acked`` (count), ``.files/`` (artifacts),
    ``.<name>.lock``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.acked_path = self.path.with_name(self.path.name + ".acked")
        self.files = self.path.with_name(self.path.name + ".files")
        self._lock_fh = None
        self._count: int | None = None

    # ---- the lock: one process per queue
    def lock(self, blocking: bool = True, timeout_s: float = 60.0) -> bool:
        if self._lock_fh is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path.with_name(f".{self.path.name}.lock"), "w")
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_fh = fh
                return True
            except BlockingIOError:
                if not blocking or time.monotonic() - t0 > timeout_s:
                    fh.close()
                    return False
                time.sleep(0.2)

    def unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    # ---- reading
    def records(self) -> list[dict]:
        """Every complete record; a torn last line (a kill while writing it) is not one."""
        if not self.path.is_file():
            return []
        out = []
        with open(self.path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break
        return out

    def acked(self) -> int:
        try:
            return int(self.acked_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def pending(self) -> int:
        return max(0, len(self.records()) - self.acked())

    def set_acked(self, n: int) -> None:
        tmp = self.acked_path.with_name(self.acked_path.name + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(f"{n}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.acked_path)

    # ---- writing
    def _repair(self) -> None:
        """Cut a torn last line so that the next record starts on a line of its own."""
        data = self.path.read_bytes() if self.path.is_file() else b""
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)
        self._count = len(self.records())

    def append(self, rec: dict) -> None:
        if self._count is None:
            self._repair()
        rec = {"n": self._count, "t": int(time.time() * 1000), **rec}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._count += 1

    def keep_file(self, src: str | os.PathLike) -> str:
        """A copy of an artifact that waits with the queue (the original may be a temporary file)."""
        if self._count is None:
            self._repair()
        rel = f"{self._count}/{Path(src).name}"
        dest = self.files / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        with open(dest, "rb") as fh:
            os.fsync(fh.fileno())
        return rel

    def clear(self) -> None:
        """All acknowledged: the queue and its companions go (the lock file stays while held)."""
        for p in (self.path, self.acked_path):
            p.unlink(missing_ok=True)
        shutil.rmtree(self.files, ignore_errors=True)
        self._count = 0


class Sender:
    """Applies records to one store. ``ids`` maps ``pending-…`` references to MLflow run ids."""

    def __init__(self, uri: str, wait_s: float):
        self.uri, self.wait_s = uri, wait_s
        self._client = None
        self.ids: dict[str, str] = {}
        self.experiments: dict[str, str] = {}

    @property
    def client(self):
        """Made on first use: a SQLite store must be created by ``init_store`` (under its lock) first."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def do(self, fn, *args, **kw):
        """One store call: within the wait for a server; SQLite's lock retried as before."""
        if is_remote(self.uri):
            return call(fn, *args, wait_s=self.wait_s, **kw)
        from .store import _retry

        return _retry(fn, *args, **kw)

    def existing_experiment(self, name: str) -> str | None:
        """The id of experiment ``name`` if the store holds it (not deleted), else None; creates nothing
        (neither the experiment nor, for a SQLite file that is not there, the store)."""
        from .store import _sqlite_path

        if name not in self.experiments:
            db = _sqlite_path(self.uri)
            if db is not None and not db.is_file():
                return None
            exp = self.do(self.client.get_experiment_by_name, name)
            if exp is None or exp.lifecycle_stage == "deleted":
                return None
            self.experiments[name] = exp.experiment_id
        return self.experiments[name]

    def experiment_id(self, name: str) -> str:
        if name not in self.experiments:
            from .store import init_store

            self.experiments[name] = self.do(init_store, self.uri, name)
        return self.experiments[name]

    def resolve(self, ref: str | None, experiment: str) -> str | None:
        """The MLflow run id of ``ref`` (an id already, or a ``pending-…`` reference); None if absent."""
        if not ref or not ref.startswith(PENDING):
            return ref
        if ref not in self.ids:
            from mlflow.entities import ViewType

            runs = self.do(self.client.search_runs, [self.experiment_id(experiment)],
                           filter_string=f"tags.`{REF_TAG}` = '{ref}'", run_view_type=ViewType.ALL, max_results=1)
            if not runs:
                return None
            self.ids[ref] = runs[0].info.run_id
        return self.ids[ref]

    def run(self, run_id: str):
        try:
            return self.do(self.client.get_run, run_id)
        except TrackingUnavailable:
            raise
        except Exception:  # deleted, or from another store
            return None

    def apply(self, rec: dict, *, ambiguous: bool = False, final: bool = False) -> None:
        """Send one record. ``ambiguous``: it may have reached the store already (see the module
        docstring); ``final``: a run reference no queue will ever create is dropped, not waited for."""
        getattr(self, f"_{rec['op']}")(rec, ambiguous or rec.get("maybe_sent") or rec.get("dedupe"), final)

    def _target(self, rec: dict, final: bool) -> str | None:
        rid = self.resolve(rec["ref"], rec["experiment"])
        if rid is None:
            if final or not rec["ref"].startswith(PENDING):
                log.warning("record %s names run %s, which is not in %s: dropped", rec.get("n"), rec["ref"], self.uri)
                return None
            raise Unresolved(rec["ref"])
        return rid

    def _create(self, rec: dict, ambiguous: bool, final: bool) -> None:
        ref, exp = rec["ref"], rec["experiment"]
        if ambiguous and self.resolve(ref, exp) is not None:
            return
        tags = {**rec["tags"], REF_TAG: ref}
        parent = rec.get("parent")
        if parent:
            pid = self.resolve(parent, exp)
            if pid is None and parent.startswith(PENDING) and not final:
                raise Unresolved(parent)
            if pid is not None and self.run(pid) is not None:
                tags["mlflow.parentRunId"] = pid
        run = self.do(self.client.create_run, self.experiment_id(exp), start_time=rec.get("start_time"),
                      run_name=rec.get("run_name"), tags=tags)
        self.ids[ref] = run.info.run_id

    def _log(self, rec: dict, ambiguous: bool, final: bool) -> None:
        from mlflow.entities import Metric, Param, RunTag

        rid = self._target(rec, final)
        if rid is None or (rec.get("other") and self.run(rid) is None):
            return
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in rec.get("metrics", [])]
        params = rec.get("params") or {}
        if ambiguous:
            done = {(k, m.step) for k in {m.key for m in metrics}
                    for m in self.do(self.client.get_metric_history, rid, k)}
            metrics = [m for m in metrics if (m.key, m.step) not in done]
            if params:
                have = self.run(rid).data.params
                params = {k: v for k, v in params.items() if have.get(k) != v}
        tags = [RunTag(k, v) for k, v in (rec.get("tags") or {}).items()]
        params = [Param(k, v) for k, v in params.items()]
        for i in range(0, max(len(metrics), len(params), len(tags), 1), 100):
            if metrics[i:i + 100] or params[i:i + 100] or tags[i:i + 100]:
                self.do(self.client.log_batch, rid, metrics=metrics[i:i + 100], params=params[i:i + 100],
                        tags=tags[i:i + 100])

    def _inputs(self, rec: dict, ambiguous: bool, final: bool) -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag

        rid = self._target(rec, final)
        if rid is None:
            return
        inputs = [DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"], profile=d.get("profile")),
                               [InputTag("mlflow.data.context", d["context"])]) for d in rec["datasets"]]
        if ambiguous:
            have = {(i.dataset.name, i.dataset.digest) for i in self.run(rid).inputs.dataset_inputs}
            inputs = [i for i in inputs if (i.dataset.name, i.dataset.digest) not in have]
        if inputs:
            self.do(self.client.log_inputs, rid, datasets=inputs)

    def _artifact(self, rec: dict, ambiguous: bool, final: bool) -> None:
        rid = self._target(rec, final)
        if rid is not None:  # uploading the same file twice replaces it: idempotent
            self.do(self.client.log_artifact, rid, rec["file"], rec.get("artifact_path"))

    def _status(self, rec: dict, ambiguous: bool, final: bool) -> None:
        rid = self._target(rec, final)
        if rid is None:
            return
        if rec["status"] == "RUNNING":
            self.do(self.client.update_run, rid, status="RUNNING")
        else:
            self.do(self.client.set_terminated, rid, rec["status"], end_time=rec.get("end_time"))

    def _retire(self, rec: dict, ambiguous: bool, final: bool) -> None:
        """A job started afresh: its earlier run is marked KILLED (interrupted) or, if it had
        finished, tagged ``superseded_by`` and deleted (one run per job)."""
        from mlflow.entities import RunTag

        rid = self.resolve(rec["ref"], rec["experiment"])
        old = self.run(rid) if rid else None
        new = self.resolve(rec["by"], rec["experiment"])
        if old is None or old.info.lifecycle_stage != "active" or rid == new:
            return
        self.do(self.client.log_batch, rid, tags=[RunTag("superseded_by", new or rec["by"])])
        if old.info.status in ("RUNNING", "SCHEDULED"):
            self.do(self.client.set_terminated, rid, "KILLED")
            log.info("MLflow run %s of an interrupted job marked KILLED", rid)
        else:
            self.do(self.client.delete_run, rid)
            log.info("MLflow run %s (%s) superseded by %s and deleted", rid, old.info.status, new)


def replay(queue: Queue, sender: Sender, *, final: bool = False) -> int:
    """Send ``queue``'s unacknowledged records in order; the number still waiting (0: the queue is
    gone). Stops at the first record that cannot be sent (``TrackingUnavailable``, ``Unresolved`` or
    the store's own error propagate)."""
    recs = queue.records()
    start = queue.acked()
    for i in range(start, len(recs)):
        rec = recs[i]
        if rec["op"] == "artifact":
            rec = {**rec, "file": str(queue.files / rec["file"])}
        sender.apply(rec, ambiguous=i == start, final=final)
        queue.set_acked(i + 1)
    queue.clear()  # all acknowledged; nothing was appended meanwhile, the caller holds the lock
    return 0


def find_queues(root: str | os.PathLike) -> list[Queue]:
    """Every queue with records waiting under ``root``, oldest first (a training job's queue before
    the evaluation queues that name its run)."""
    queues = [Queue(p) for p in Path(root).rglob(f"*{QUEUE_NAME}") if p.is_file()]
    queues = [q for q in queues if q.pending()]

    def first_time(q: Queue) -> int:
        recs = q.records()
        return recs[q.acked()]["t"] if q.acked() < len(recs) else 0

    return sorted(queues, key=first_time)


def sync_all(root: str | os.PathLike, uri: str, *, wait_s: float, skip: Path | None = None) -> dict:
    """Replay every pending queue under ``root`` (in several passes, so that a queue naming a run
    another queue creates waits for it). Returns counts: queues, sent, waiting, busy (locked by a
    running job), and the last error."""
    queues = [q for q in find_queues(root) if skip is None or q.path.resolve() != skip.resolve()]
    out = {"queues": len(queues), "sent": 0, "waiting": 0, "busy": 0, "error": None}
    if not queues:
        return out
    sender = Sender(uri, wait_s)
    todo = list(queues)
    for attempt in range(len(queues) + 1):
        final = attempt == len(queues)
        left = []
        for q in todo:
            if not q.lock(blocking=False):
                out["busy"] += 1
                out["waiting"] += q.pending()
                continue
            before = q.pending()
            try:
                after = replay(q, sender, final=final)
                out["sent"] += before - after
            except Unresolved:
                out["sent"] += before - q.pending()
                left.append(q)
            except TrackingUnavailable as e:
                out["error"] = f"{uri} not answering: {e}"
                out["waiting"] += q.pending() + sum(x.pending() for x in todo[todo.index(q) + 1:])
                return out
            except Exception as e:  # the store refused a record: report it, leave the queue as it is
                out["error"] = f"{q.path} record {q.acked()}: {type(e).__name__}: {short_error(e)}"
                out["waiting"] += q.pending()
            finally:
                q.unlock()
        if not left:
            break
        todo = left
    return out
