"""MLflow tracking: concurrent jobs against one embedded SQLite store lose and corrupt nothing."""

import json
import multiprocessing as mp

import pytest

from sentemb import SentembError
from sentemb.config.settings import TrackingSettings
from sentemb.tracking.runs import Tracker, init_store, resolve_uri


#: metric batches per writer: eight writers' transactions interleave throughout (the suite's time budget: 200
#: took 2.2 cores for 15 s)
STEPS = 100


def _job(uri: str, i: int) -> None:
    with Tracker(uri=uri, experiment="concurrent", run_name=f"job{i}", tags={"job": i},
                 params={"train": {"lr": 1e-5 * i, "batch_size": 64}}) as tr:
        for step in range(1, STEPS + 1):
            tr.log_metrics({"train/loss": 1.0 / step + i, "train/lr": 0.1}, step)
        tr.log_metrics({"test/avg": 70.0 + i})


@pytest.mark.parametrize("pre_init", [True, False], ids=["store-initialised-first", "store-created-by-jobs"])
def test_eight_concurrent_jobs(tmp_path, pre_init):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if pre_init:
        init_store(uri, "concurrent")
    # Eight processes of their own, each with its own connection to the store, as eight jobs are. They
    # fork from a server that imported MLflow once (the suite's time budget: a spawned process each
    # imported it again, about 3 CPU-s each). The server opens no store, so every connection is a child's.
    # (This module itself cannot be preloaded: the server does not put pytest's sys.path in place, so
    # each child imports it after the fork, to find ``_job``.)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["mlflow", "mlflow.store.tracking.sqlalchemy_store", "sentemb.tracking.runs"])
    procs = [ctx.Process(target=_job, args=(uri, i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * 8
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("concurrent")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 8
    for r in runs:
        i = int(r.data.tags["job"])
        assert r.info.status == "FINISHED"
        assert r.data.params["train.lr"] == str(1e-5 * i)
        assert r.data.metrics["test/avg"] == 70.0 + i
        hist = client.get_metric_history(r.info.run_id, "train/loss")
        assert sorted(m.step for m in hist) == list(range(1, STEPS + 1))
        assert [m.value for m in sorted(hist, key=lambda m: m.step)] == [1.0 / st + i for st in range(1, STEPS + 1)]


def test_failed_block_marks_run_failed_and_disabled_tracker_is_noop(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(RuntimeError):
        with Tracker(uri=uri, experiment="e", run_name="boom"):
            raise RuntimeError("x")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert run.info.status == "FAILED"
    with Tracker(uri=uri, experiment="e", enabled=False) as tr:
        tr.log_metrics({"a": 1.0})
    assert len(client.search_runs([client.get_experiment_by_name("e").experiment_id])) == 1


def test_env_overrides_config_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri(None) == "sqlite:///mlflow.db"
    assert resolve_uri("http://x:5000") == "http://x:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://server:5000")
    assert resolve_uri("http://x:5000") == "http://server:5000"


# ----------------------------------------------------------------------- the store tells the truth
def _runs(uri, exp="t"):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    e = c.get_experiment_by_name(exp)
    return c, (c.search_runs([e.experiment_id]) if e else [])


def _train_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, uri, **over):
    from test_train import run_cfg

    cfg = run_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, **over)
    cfg.tracking = TrackingSettings(enabled=True, uri=uri)
    return cfg


def test_a_resumed_job_continues_its_own_run_without_logging_a_step_twice(tiny_bert_dir, tiny_corpus, tiny_senteval,
                                                                          tmp_path):
    from sentemb.train.loop import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _train_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, uri, save_steps=2)
    with pytest.raises(KeyboardInterrupt):  # killed after step 3; state saved at step 3 by the test hook
        train(cfg, tmp_path / "run", stop_after=3, progress=False)
    c, runs = _runs(uri)
    assert [r.info.status for r in runs] == ["KILLED"]
    train(cfg, tmp_path / "run", progress=False)
    c, runs = _runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    rid = runs[0].info.run_id
    for key in ("train/loss", "dev/stsb_spearman", "dev/best"):  # dev/best: once at the last step, evaluated there
        steps = [m.step for m in c.get_metric_history(rid, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice for a step: {sorted(steps)}"
    assert sorted(m.step for m in c.get_metric_history(rid, "train/loss")) == list(range(1, 7))
    meta = json.loads((tmp_path / "run/model/sentemb.json").read_text())
    assert meta["mlflow_run_id"] == rid


def test_a_fresh_restart_marks_the_crashed_run_killed_and_a_rerun_supersedes(tiny_bert_dir, tiny_corpus,
                                                                            tiny_senteval, tmp_path):
    import shutil

    from sentemb.train.loop import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _train_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, uri)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "run", stop_after=2, progress=False)
    # a SIGKILL leaves the run RUNNING and its state possibly unsaved: simulate both
    c, (crashed,) = _runs(uri)
    c.update_run(crashed.info.run_id, status="RUNNING")
    shutil.rmtree(tmp_path / "run" / ".work")
    train(cfg, tmp_path / "run", progress=False)
    c, runs = _runs(uri)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    killed = next(r for r in runs if r.info.status == "KILLED")
    assert killed.info.run_id == crashed.info.run_id and "superseded_by" in killed.data.tags
    # the same job redone (e.g. Snakemake reruns an incomplete job): still one FINISHED run
    train(cfg, tmp_path / "run", progress=False)
    c, runs = _runs(uri)
    assert [r.info.status for r in runs].count("FINISHED") == 1


def test_a_failing_job_ends_failed_with_the_error(tiny_bert_dir, tmp_path, tiny_senteval):
    from sentemb import SentembError
    from sentemb.train.loop import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bad = tmp_path / "corpus.txt"
    bad.write_text("one sentence\n\nanother\n")
    cfg = _train_cfg(tiny_bert_dir, bad, tiny_senteval, uri)
    with pytest.raises(SentembError, match="line 2 is empty"):
        train(cfg, tmp_path / "run", progress=False)
    _, (run,) = _runs(uri)
    assert run.info.status == "FAILED" and "line 2 is empty" in run.data.tags["error"]


def test_evaluation_is_nested_under_the_training_run_and_logs_test_scores_onto_it(tiny_bert_dir, tiny_corpus,
                                                                                   tiny_senteval, tmp_path):
    from sentemb.cli import main
    from sentemb.train.loop import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train(_train_cfg(tiny_bert_dir, tiny_corpus, tiny_senteval, uri), tmp_path / "run", progress=False)
    out = tmp_path / "run" / "eval_sts.json"
    assert main(["evaluate", "--model", str(tmp_path / "run/model"), "--pooler", "cls_before_pooler", "--data-dir",
                 str(tiny_senteval), "--tasks", "STSBenchmark,SICKRelatedness", "--output", str(out), "--quiet",
                 "--track", "--experiment", "t", "--tracking-uri", uri, "--run-name", "eval"]) == 0
    c, runs = _runs(uri)
    tr = next(r for r in runs if r.data.tags.get("rule") == "train")
    ev = next(r for r in runs if r.info.run_name == "eval")
    assert ev.data.tags["mlflow.parentRunId"] == tr.info.run_id
    assert tr.data.metrics["test/avg"] == pytest.approx(json.loads(out.read_text())["avg"])


def test_sentemb_ui_refuses_a_port_another_server_holds():
    """``sentemb ui --port P`` where another process listens on P: ``mlflow ui`` failed to bind and exited
    0 after the link was printed (which opened the other server's runs); now an error before the link."""
    import socket

    from sentemb.cli.tracking import _port_free

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SentembError, match=rf"--port {port}: 127.0.0.1:{port} is in use"):
            _port_free("127.0.0.1", port)
    _port_free("127.0.0.1", port)  # closed: free again


def test_a_long_tracking_error_keeps_its_cause_at_the_end():
    """urllib3 puts the cause last ("... [Errno 111] Connection refused"): a cut at 300 characters lost it."""
    from sentemb.tracking.queue import short_error

    e = ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=5124): Max retries exceeded with url: "
                        "/api/2.0/mlflow/runs/log-batch" + "?x=1" * 80 + " (Caused by NewConnectionError("
                        "\"Failed to establish a new connection: [Errno 111] Connection refused\"))\nsecond line")
    text = short_error(e)
    assert len(text) <= 300 and text.startswith("HTTPConnectionPool(host='127.0.0.1'") and " … " in text
    assert text.endswith("[Errno 111] Connection refused\"))") and "second line" not in text
    assert short_error(ValueError("short")) == "short" and short_error(ValueError()) == "ValueError"


def test_ui_and_sync_create_no_experiment_and_print_only_writes_nothing(tmp_path, monkeypatch, capsys):
    """A walkthrough found ``sentemb ui --print-only --config other.yaml`` creating the other config's
    experiment with this results directory's Table 1 as its note, and ``sync-tracking --config`` (the
    docs' paper config) doing the same. They now look the experiment up: absent, they say so and
    create nothing; ``--print-only`` writes nothing even when it is there; without a store, none is made."""
    import yaml
    from mlflow.tracking import MlflowClient

    from conftest import REPO
    from sentemb.cli import main

    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg.update(experiment="mine", results_dir=str(tmp_path / "results"))
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table1.md").write_text("| method | Avg |\n| --- | --- |\n| simcse | 70.0 |\n")
    db = tmp_path / "store.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    assert main(["ui", "--config", "cfg.yaml", "--print-only"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "http://127.0.0.1:5000/" and "experiment 'mine'" in out.err and not db.exists()
    init_store(f"sqlite:///{db}", "other")
    assert main(["sync-tracking", "--config", "cfg.yaml"]) == 0
    assert "experiment 'mine' (config experiment) is not in" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert client.get_experiment_by_name("mine") is None
    exp_id = init_store(f"sqlite:///{db}", "mine")
    assert main(["ui", "--config", "cfg.yaml", "--print-only"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"/#/experiments/{exp_id}/runs?workflowType=machine_learning")
    assert "mlflow.note.content" not in client.get_experiment(exp_id).tags  # --print-only wrote nothing
    assert main(["sync-tracking", "--config", "cfg.yaml"]) == 0
    assert "| simcse | 70.0 |" in client.get_experiment(exp_id).tags["mlflow.note.content"]
