"""Tracking against a real ``mlflow server`` on 127.0.0.1 that goes away (issue 22).

Tracker-level here: an outage inside a job (a TCP proxy in front of the server is cut and
restored, so the outage starts and ends at once), a job that ends while the server is away and
``sync-tracking`` afterwards, several jobs logging at once, and the errors no wait can fix
(basic-auth credentials, a malformed URI, a deleted experiment). The tiny DAG with the server
SIGKILLed, and the UI a researcher lands on: ``test_tracking_dag.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
import time

import pytest

from conftest import REPO
from sentemb import SentembError
from sentemb.tracking.server import MlflowServer, free_port
from sentemb.tracking.runs import Tracker
from sentemb.tracking.queue import Queue, sync_all

pytestmark = [pytest.mark.integration]


class Proxy:
    """127.0.0.1:port -> the server; ``down()`` refuses new connections and cuts open ones."""

    def __init__(self, target_port: int):
        self.target, self.port = target_port, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.listener = None
        self.conns: list[socket.socket] = []

    def up(self) -> "Proxy":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(16)
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()
        return self

    def down(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (a bare close does not)
        except OSError:
            pass
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self.conns = []

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


ADMIN_PASSWORD = "sentemb-Test-pw-7"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A plain server and the basic-auth one of docs/tracking.md, started side by side."""
    root = tmp_path_factory.mktemp("mlflow_servers")
    plain = MlflowServer(root / "plain")
    auth = MlflowServer(root / "auth", app_name="basic-auth", env={
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD, "MLFLOW_FLASK_SERVER_SECRET_KEY": "test"})
    try:
        plain.launch()
        try:
            import flask_wtf  # noqa: F401  MLflow's basic-auth app needs mlflow[auth]
            auth.launch()
        except ImportError:
            auth = None
        yield {"plain": plain.ready(), "auth": auth.ready() if auth else None}
    finally:
        plain.stop()
        if auth:
            auth.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers["plain"]


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _only_run(uri, experiment):
    c = _client(uri)
    (run,) = c.search_runs([c.get_experiment_by_name(experiment).experiment_id])
    return c, run


def test_an_outage_inside_a_job_neither_fails_nor_stalls_it_and_is_sent_later_in_the_job(server, tmp_path, caplog):
    proxy = Proxy(server.port).up()
    art = tmp_path / "summary.json"
    art.write_text('{"ok": 1}\n')
    with Tracker(uri=proxy.uri, experiment="outage", run_name="job", params={"lr": 0.1},
                 marker=tmp_path / "run" / ".mlflow_run.json", wait_s=1.0) as tr:
        tr.retry_every_s = 0.3
        for step in (1, 2):
            tr.log_metrics({"train/loss": 1.0 / step}, step)
        proxy.down()
        t0 = time.monotonic()
        for step in (3, 4, 5):
            tr.log_metrics({"train/loss": 1.0 / step}, step)
        tr.log_artifact(art)
        tr.set_tags({"best_step": 4})
        assert time.monotonic() - t0 < 8, "the outage held the job up beyond its wait"
        queue = Queue(tmp_path / "run" / "tracking_queue.jsonl")
        assert queue.pending() >= 5 and tr.offline
        proxy.up()
        time.sleep(0.4)
        tr.log_metrics({"train/loss": 1.0 / 6}, 6)  # the server answers again: the queue goes first
        assert not tr.offline and not queue.path.exists()
    assert "tracking records go to" in caplog.text and "answers again" in caplog.text
    c, run = _only_run(server.uri, "outage")
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1" and run.data.tags["best_step"] == "4"
    hist = c.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in hist) == [1, 2, 3, 4, 5, 6]
    assert [a.path for a in c.list_artifacts(run.info.run_id)] == ["summary.json"]
    proxy.down()


def test_a_job_that_ends_while_the_server_is_away_is_synced_afterwards_exactly_once(server, tmp_path, caplog):
    from sentemb.cli import main

    proxy = Proxy(server.port)  # nothing listens yet: the server is away for the whole job
    results = tmp_path / "results"
    (results / ".tracking").mkdir(parents=True)
    run_dir = results / "runs" / "a"
    t0 = time.monotonic()
    with Tracker(uri=proxy.uri, experiment="away", run_name="train", params={"seed": 1},
                 marker=run_dir / ".mlflow_run.json", wait_s=0.5) as tr:
        for step in range(1, 4):
            tr.log_metrics({"train/loss": 1.0 / step, "dev/best": 0.5}, step)
        # a step logged twice by the job itself stays twice (another value: MLflow's store keeps one
        # of two records equal in key, value, step and millisecond timestamp)
        tr.log_metrics({"dev/best": 0.6}, 3)
    train_ref = tr.run_id
    assert train_ref.startswith("pending-") and time.monotonic() - t0 < 10
    assert "records wait in" in caplog.text and str(run_dir / "tracking_queue.jsonl") in caplog.text
    # an evaluation nested under the training run that so far exists only in a queue
    out = run_dir / "eval_sts.json"
    with Tracker(uri=proxy.uri, experiment="away", run_name="eval", parent_run_id=train_ref,
                 marker=out.with_name(".eval_sts.json.mlflow_run.json"), wait_s=0.5) as ev:
        ev.log_metrics({"test/avg": 70.0})
        ev.log_metrics_to(train_ref, {"test/avg": 70.0})
    assert (run_dir / "eval_sts.json.tracking_queue.jsonl").is_file()
    proxy.up()
    # a replay cut off after sending but before acknowledging must not log anything twice
    res = sync_all(results, proxy.uri, wait_s=5)
    assert res["sent"] > 0 and res["waiting"] == 0 and res["error"] is None
    assert main(["sync-tracking", "--config", str(REPO / ".test" / "config.yaml"), "--results-dir", str(results),
                 "--tracking-uri", proxy.uri]) == 0  # nothing left: a no-op
    c = _client(server.uri)
    runs = {r.info.run_name: r for r in c.search_runs([c.get_experiment_by_name("away").experiment_id])}
    assert set(runs) == {"train", "eval"} and {r.info.status for r in runs.values()} == {"FINISHED"}
    tid = runs["train"].info.run_id
    assert runs["eval"].data.tags["mlflow.parentRunId"] == tid
    assert sorted(m.step for m in c.get_metric_history(tid, "train/loss")) == [1, 2, 3]
    assert sorted(m.step for m in c.get_metric_history(tid, "dev/best")) == [1, 2, 3, 3]
    assert runs["train"].data.metrics["test/avg"] == 70.0 and runs["train"].data.params["seed"] == "1"
    proxy.down()


def test_replaying_a_queue_again_after_a_crash_logs_no_step_twice(server, tmp_path):
    proxy = Proxy(server.port)
    with Tracker(uri=proxy.uri, experiment="crash", run_name="r", marker=tmp_path / ".mlflow_run.json",
                 wait_s=0.2) as tr:
        for step in range(1, 4):
            tr.log_metrics({"loss": float(step)}, step)
    q = Queue(tmp_path / "tracking_queue.jsonl")
    lines = q.path.read_bytes()
    proxy.up()
    assert sync_all(tmp_path, proxy.uri, wait_s=5)["waiting"] == 0
    # the crash: every record sent, the acknowledgements lost, a torn line at the end
    q.path.write_bytes(lines + b'{"op": "log", "ref": ')
    q.set_acked(2)
    assert sync_all(tmp_path, proxy.uri, wait_s=5)["waiting"] == 0
    c, run = _only_run(server.uri, "crash")
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3]
    assert run.info.status == "FINISHED"
    proxy.down()


def _http_job(uri: str, i: int) -> None:
    with Tracker(uri=uri, experiment="concurrent-http", run_name=f"job{i}", tags={"job": i},
                 params={"train": {"lr": 1e-5 * i}}, wait_s=20) as tr:
        for step in range(1, 51):
            tr.log_metrics({"train/loss": 1.0 / step + i}, step)
        tr.log_metrics({"test/avg": 70.0 + i})


def test_four_jobs_logging_to_one_server_at_once_lose_nothing(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # queues of Trackers without a marker land here
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_http_job, args=(server.uri, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * 4
    c = _client(server.uri)
    runs = c.search_runs([c.get_experiment_by_name("concurrent-http").experiment_id])
    assert len(runs) == 4
    for r in runs:
        i = int(r.data.tags["job"])
        assert r.info.status == "FINISHED" and r.data.metrics["test/avg"] == 70.0 + i
        hist = sorted(c.get_metric_history(r.info.run_id, "train/loss"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in hist] == [(s, 1.0 / s + i) for s in range(1, 51)]


# ----------------------------------------------------------------- errors no wait can fix: at the start
def test_malformed_uri_and_deleted_experiment_fail_at_the_start(server, tmp_path):
    for uri in ("http//127.0.0.1:5000", "http://127.0.0.1:99999", "htp://x"):
        with pytest.raises(SentembError, match="MLFLOW_TRACKING_URI"):
            with Tracker(uri=uri, experiment="x", marker=tmp_path / ".mlflow_run.json"):
                pytest.fail("the block ran")
    c = _client(server.uri)
    c.delete_experiment(c.create_experiment("gone"))
    with pytest.raises(SentembError, match="'gone'.*deleted"):
        with Tracker(uri=server.uri, experiment="gone", marker=tmp_path / ".mlflow_run.json"):
            pytest.fail("the block ran")


def test_basic_auth_recipe_logs_with_the_right_credentials_and_fails_at_start_with_wrong_ones(servers, tmp_path,
                                                                                             monkeypatch, capsys):
    """The recipe of docs/tracking.md: ``mlflow server --app-name basic-auth``, credentials in
    ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``."""
    from sentemb.cli import main

    srv = servers["auth"]
    if srv is None:
        pytest.skip("MLflow's basic-auth app needs mlflow[auth] (Flask-WTF): pip install 'mlflow[auth]'")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    assert main(["init-tracking", "--experiment", "auth", "--tracking-uri", srv.uri]) == 2  # before any job
    err = capsys.readouterr().err
    assert srv.uri in err and "MLFLOW_TRACKING_USERNAME" in err and "401" in err
    with pytest.raises(SentembError, match="MLFLOW_TRACKING_PASSWORD"):
        with Tracker(uri=srv.uri, experiment="auth", marker=tmp_path / ".mlflow_run.json", wait_s=5):
            pytest.fail("the block ran")
    assert not (tmp_path / "tracking_queue.jsonl").exists() or not Queue(tmp_path / "tracking_queue.jsonl").pending()
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    assert main(["init-tracking", "--experiment", "auth", "--tracking-uri", srv.uri]) == 0
    with Tracker(uri=srv.uri, experiment="auth", run_name="ok", marker=tmp_path / ".mlflow_run.json") as tr:
        tr.log_metrics({"loss": 1.0}, 1)
    c, run = _only_run(srv.uri, "auth")
    assert run.info.status == "FINISHED" and run.data.metrics["loss"] == 1.0
