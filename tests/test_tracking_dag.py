"""The tiny DAG tracked over HTTP by a real ``mlflow server`` that goes away (issue 22), and the UI
a researcher lands on.

One module fixture runs three DAGs of one small config (conftest ``simcse_dag_config``: SimCSE, one
seed, STS-B and SICK-R), from the suite's inputs of that DAG (``simcse_dag_inputs``):
the reference, tracked into an embedded SQLite store; ``killed``, tracked by a server that is
SIGKILLed once the training job has created its run and restarted only after training ended
(far longer than MLflow's own retries, lowered here as in the issue); ``away``, tracked by a server
that starts only after the DAG. The two HTTP DAGs run side by side, on the reference's resources.
Then ``sentemb sync-tracking``: each store must hold what the reference holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, simcse_dag_config
from sentemb.testing import copy_dag_inputs
from sentemb.tracking.server import MlflowServer, free_port
from sentemb.train.loop import COST_METRICS

pytestmark = [pytest.mark.integration, pytest.mark.realdata]
EXPERIMENT = "sentemb-test"
RUN = "results/runs/simcse/tiny-bert/seed1"
# throughput and time spent (wall-clock), and what a process counts of its own part of a resumed run
NONDETERMINISTIC = {"train/sentences_per_s", "train/tokens_per_s", "train/data_wait", "dev/eval_s",
                    *COST_METRICS.values()}
PER_PROCESS = {*COST_METRICS, "dev_evals"}  # train.json: this process's wait, evaluations and their share


def smk(workdir: Path, env: dict, *args: str, cores: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           f"--configfile={workdir / 'config.yaml'}", "--cores", str(cores), "results/table1.csv", *args]
    return subprocess.Popen(cmd, env=env, stdout=open(workdir / "smk.log", "a"), stderr=subprocess.STDOUT)


def finish(p: subprocess.Popen, workdir: Path, timeout: float = 900) -> None:
    assert p.wait(timeout) == 0, (workdir / "smk.log").read_text()[-4000:]


def wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def sync(workdir: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentemb", "sync-tracking", "--config", "config.yaml"], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dags(tmp_path_factory, shared, simcse_dag_inputs):
    root = tmp_path_factory.mktemp("tracked_dags")
    base = {**os.environ, "SENTEMB_MIRROR": str(shared), "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
            # a short wait before queueing, and MLflow's own retries shorter than the outage
            "SENTEMB_TRACKING_WAIT_S": "2", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    ref, killed, away = root / "reference", root / "killed", root / "away"
    for d in (ref, killed, away):
        simcse_dag_config(d)
    servers = [MlflowServer(root / "server_killed"), MlflowServer(root / "server_away", port=free_port())]
    env = {"reference": {**base, "MLFLOW_TRACKING_URI": ""}, "killed": {**base, "MLFLOW_TRACKING_URI": servers[0].uri},
           "away": {**base, "MLFLOW_TRACKING_URI": servers[1].uri}}
    t0 = time.monotonic()
    try:
        servers[0].launch()
        for d in (ref, killed, away):  # only training, evaluation and the table run in each DAG
            copy_dag_inputs(simcse_dag_inputs, d)  # the suite's inputs of this DAG (conftest)
        servers[0].ready()
        pr, pk, pa = smk(ref, env["reference"]), smk(killed, env["killed"]), smk(away, env["away"])
        wait_for(lambda: (killed / RUN / ".mlflow_run.json").is_file() or pk.poll() is not None, 600,
                 "the training job's MLflow run")
        servers[0].kill()
        killed_at = time.monotonic()
        wait_for(lambda: (killed / RUN / "train.json").is_file() or pk.poll() is not None, 600, "training to end")
        outage = time.monotonic() - killed_at
        servers[0].start()
        finish(pk, killed)
        finish(pa, away)
        servers[1].launch()
        finish(pr, ref)
        servers[1].ready()
        syncs = {"killed": sync(killed, env["killed"]), "away": sync(away, env["away"])}
        yield {"ref": ref, "killed": killed, "away": away, "servers": servers, "syncs": syncs, "outage": outage,
               "seconds": time.monotonic() - t0}
    finally:
        for s in servers:
            s.stop()


def snapshot(uri: str, workdir: Path) -> dict:
    """What a store holds, without what differs between stores by nature (ids, times, throughput)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(EXPERIMENT)
    runs = c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL)
    names = {r.info.run_id: r.info.run_name for r in runs}
    out = {}
    for r in runs:
        rid = r.info.run_id
        metrics = {k: sorted((m.step, None if k in NONDETERMINISTIC else round(m.value, 6))
                             for m in c.get_metric_history(rid, k)) for k in r.data.metrics}
        arts = {}
        for a in c.list_artifacts(rid):
            text = Path(c.download_artifacts(rid, a.path, str(workdir / "dl" / rid))).read_text()
            if a.path == "train.json":  # wall-clock time and run id apart
                text = {k: v for k, v in json.loads(text).items()
                        if "seconds" not in k and k != "mlflow_run_id" and k not in PER_PROCESS}
            elif a.path.startswith("eval_"):
                text = {k: v for k, v in json.loads(text).items() if k not in ("seconds", "sentences_per_second")}
            arts[a.path] = text
        out[r.info.run_name] = {
            "status": r.info.status, "stage": r.info.lifecycle_stage, "params": r.data.params, "metrics": metrics,
            "tags": {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.") and k != "sentemb.ref"},
            "parent": names.get(r.data.tags.get("mlflow.parentRunId")), "artifacts": arts,
            "inputs": sorted((i.dataset.name, i.dataset.digest) for i in r.inputs.dataset_inputs)}
    return out


def test_the_dag_survives_the_server_and_makes_the_same_tables(dags):
    assert dags["outage"] > 5, "the server was not away longer than MLflow's own retries"
    for name in ("killed", "away"):
        for f in ("table1.csv", "table1.md"):
            assert (dags[name] / "results" / f).read_bytes() == (dags["ref"] / "results" / f).read_bytes(), name
    log = (dags["away"] / "results/logs/train/simcse/tiny-bert/seed1.log").read_text()
    assert "records wait in" in log and str(Path(RUN) / "tracking_queue.jsonl") in log  # how many, and where
    killed_log = (dags["killed"] / "results/logs/train/simcse/tiny-bert/seed1.log").read_text()
    assert "tracking records go to" in killed_log


@pytest.mark.parametrize("name", ["killed", "away"])
def test_after_sync_the_store_holds_what_an_uninterrupted_run_holds(dags, name):
    from sentemb.tracking.queue import find_queues

    p = dags["syncs"][name]
    assert p.returncode == 0, p.stdout + p.stderr
    assert not find_queues(dags[name] / "results")
    server = dags["servers"][0 if name == "killed" else 1]
    got = snapshot(server.uri, dags[name])
    want = snapshot(f"sqlite:///{dags['ref'] / 'mlflow.db'}", dags["ref"])
    assert set(got) == set(want)
    for run in want:
        assert got[run] == want[run], run
    train = want["train/simcse/tiny-bert/seed1"]
    assert train["status"] == "FINISHED" and train["inputs"] == [("wiki-tiny", train["inputs"][0][1])]
    assert sorted(train["metrics"]["train/loss"]) == [(s, v) for s, v in train["metrics"]["train/loss"]]


def test_sentemb_ui_lands_on_the_runs_table_with_the_dataset_column(dags):
    """The link ``sentemb ui`` prints, opened in headless Chromium as a new user would: on the
    synced store of the DAG whose server was killed (its UI is the server's)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": "", "PYTHONPATH": str(REPO / "src")}
    local = subprocess.run([sys.executable, "-m", "sentemb", "ui", "--config", "config.yaml", "--print-only"],
                           cwd=dags["ref"], env=env, capture_output=True, text=True, timeout=120)
    assert local.stdout.strip().startswith("http://127.0.0.1:5000/#/experiments/"), local.stdout + local.stderr
    server = dags["servers"][0]
    p = subprocess.run([sys.executable, "-m", "sentemb", "ui", "--config", "config.yaml", "--tracking-uri",
                        server.uri], cwd=dags["killed"], env=env, capture_output=True, text=True, timeout=120)
    link = p.stdout.strip().splitlines()[-1]
    assert link.startswith(server.uri) and link.endswith("/runs?workflowType=machine_learning"), p.stdout + p.stderr
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking_uri=server.uri).get_experiment_by_name(EXPERIMENT)
    assert (dags["killed"] / "results/table1.md").read_text() in exp.tags["mlflow.note.content"]
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium on PATH (install the system package `chromium`)")
    shot = dags["killed"] / "mlflow_ui.png"
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
            "--window-size=1600,900"]
    dom = subprocess.run([*args, "--dump-dom", link], capture_output=True, text=True, timeout=180).stdout
    subprocess.run([*args, f"--screenshot={shot}", link], capture_output=True, timeout=180, check=True)
    import numpy as np
    from PIL import Image

    assert np.asarray(Image.open(shot).convert("L")).std() > 5  # something drawn
    assert "train/simcse/tiny-bert/seed1" in dom  # the runs table, not the GenAI overview
    assert "wiki-tiny" in dom  # the Dataset column
