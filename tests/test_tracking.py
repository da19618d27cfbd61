"""MLflow tracking: concurrent jobs against one embedded SQLite store lose and corrupt nothing."""

import multiprocessing as mp

import pytest

from sentemb.tracking import Tracker, init_store, resolve_uri


def _job(uri: str, i: int) -> None:
    with Tracker(uri=uri, experiment="concurrent", run_name=f"job{i}", tags={"job": i},
                 params={"train": {"lr": 1e-5 * i, "batch_size": 64}}) as tr:
        for step in range(1, 21):
            tr.log_metrics({"train/loss": 1.0 / step + i, "train/lr": 0.1}, step)
        tr.log_metrics({"test/avg": 70.0 + i})


@pytest.mark.parametrize("pre_init", [True, False], ids=["store-initialised-first", "store-created-by-jobs"])
def test_eight_concurrent_jobs(tmp_path, pre_init):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if pre_init:
        init_store(uri, "concurrent")
    ctx = mp.get_context("spawn")
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
        assert sorted(m.step for m in hist) == list(range(1, 21))


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
