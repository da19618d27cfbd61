"""The cluster path on a real Slurm (issue 14 §3): a single-node slurmctld/slurmd/munged on this
machine (recipe in shared/docs/slurm.md), the tiny DAG submitted with the repository's workflow
profile, checked against a local run of the same DAG; on the cluster each training job runs as
two processes (``train.devices: 2``, issue 26 §3) in one Slurm job.

Skipped with a reason where Slurm's daemons are not installed (`.ci/run` installs them). Daemons are
started in a scratch directory and stopped by PID.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, simcse_dag_config
from sentemb.testing import copy_dag_inputs

SLURMCTLD, SLURMD, MUNGED = "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"
pytestmark = [pytest.mark.slurm, pytest.mark.realdata, pytest.mark.integration,
              pytest.mark.skipif(not (shutil.which("sbatch") and os.path.exists(SLURMCTLD) and os.path.exists(MUNGED)),
                                 reason="Slurm not installed (apt-get install slurm-wlm munge; .ci/run does this)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the single-node Slurm recipe runs its daemons as root")]

CONF = """ClusterName=sentembtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SlurmctldPort={port}
SlurmdPort={port2}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
ReturnToService=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
InactiveLimit=0
KillWait=30
SlurmctldTimeout=120
SlurmdTimeout=300
Waittime=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={ncpu} RealMemory={mem}
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout, what):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    base = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "log", "run"):
        (base / d).mkdir()
    host = socket.gethostname().split(".")[0]
    mem = int(int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) / 1024 * 0.8)
    (base / "slurm.conf").write_text(CONF.format(host=host, base=base, ncpu=os.cpu_count(), mem=mem,
                                                 port=_free_port(), port2=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
    # Job steps (srun inside the batch script) look for the configuration at the compiled-in path,
    # not $SLURM_CONF: install it there for the test's lifetime when the machine has none.
    system_conf = Path("/etc/slurm/slurm.conf")
    placed = False
    if system_conf.exists() and system_conf.read_text() != (base / "slurm.conf").read_text():
        pytest.skip(f"{system_conf} exists (a Slurm installation of this machine): not starting a test cluster over it")
    if not system_conf.exists():
        system_conf.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(base / "slurm.conf", system_conf)
        placed = True
    procs, munged_pid = [], None
    try:
        if not Path("/run/munge/munged.pid").is_file() or subprocess.run(["munge", "-n"], capture_output=True).returncode:
            subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "755", "/run/munge"], check=True)
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", MUNGED], check=True)
            _wait(lambda: Path("/run/munge/munged.pid").is_file(), 10, "munged")
            munged_pid = int(Path("/run/munge/munged.pid").read_text())
        ctld = subprocess.Popen([SLURMCTLD, "-D", "-c"], env=env, stdout=open(base / "log/ctld.out", "w"),
                                stderr=subprocess.STDOUT)
        procs.append(ctld)
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0, 30,
              "slurmctld")
        procs.append(subprocess.Popen([SLURMD, "-D"], env=env, stdout=open(base / "log/slurmd.out", "w"),
                                      stderr=subprocess.STDOUT))
        _wait(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                               text=True).stdout, 30, "slurmd idle")
        yield env
    finally:  # stop by PID, never by name: slurmd, slurmctld, then munged
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if munged_pid:
            try:
                os.kill(munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if placed:
            system_conf.unlink(missing_ok=True)


#: Snakemake with the Slurm plugin's status polls at most 2 s apart. The plugin adds 10 s to its poll
#: interval after every poll in which no job finished (up to 180 s, hard-coded in
#: ``snakemake_executor_plugin_slurm``): this test took 108 s alone under that backoff, 88 s with the cap.
#: Only how often ``squeue`` is asked changes, not what is submitted or run.
POLL_2S = """
import snakemake_executor_plugin_slurm as slurm
from snakemake.cli import main

_p = slurm.Executor.next_seconds_between_status_checks
slurm.Executor.next_seconds_between_status_checks = property(_p.fget, lambda self, v: _p.fset(self, min(v, 2)))
main()
"""


def _smk(workdir, *args, env, poll_2s=False):
    head = [sys.executable, "-c", POLL_2S] if poll_2s else [sys.executable, "-m", "snakemake"]
    cmd = [*head, "-s", str(REPO / "Snakefile"), "-d", str(workdir), f"--configfile={workdir / 'config.yaml'}", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def test_tiny_dag_on_a_real_slurm_matches_the_local_run(slurm, shared, simcse_dag_inputs, tmp_path):
    # PATH keeps the venv first: Slurm jobs inherit the submitting shell's environment (slurm.md).
    env = {**slurm, "SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    # one SimCSE run at one seed: the point is the cluster path, not the methods; one training and one
    # evaluation job per side, from the suite's inputs of this DAG (conftest simcse_dag_inputs: model,
    # corpus, SentEval, the token cache): on the cluster, training, evaluation and the table are what run
    # as Slurm jobs, and the local run's meanwhile (the cluster's jobs mostly wait on Slurm)
    for d in (local, cluster):
        cfg = yaml.safe_load((simcse_dag_config(d) / "config.yaml").read_text())
        # keyed dropout masks: the same for one process and for two (issue 26 §3)
        cfg["train"] = {**cfg.get("train", {}), "dropout_rng": "keyed"}
        if d is cluster:  # the cluster trains each run as one Slurm job of two processes (gloo on CPU)
            cfg["train"]["devices"] = 2
        (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        assert copy_dag_inputs(simcse_dag_inputs, d) == ["resources", "results/stats"]
    pool = ThreadPoolExecutor(max_workers=1)
    local_run = pool.submit(_smk, local, "--cores", "1", "results/table1.csv", env=env)
    try:
        p = _smk(cluster, "--workflow-profile", str(REPO / "profiles" / "slurm"), "--jobs", "2",
                 # what a user without an accounting database edits: partition and status command
                 "--default-resources", "slurm_partition=debug", "runtime=10", "mem_mb=1000",
                 "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
                 "--latency-wait", "5", "results/table1.csv", env=env, poll_2s=True)
    finally:
        local_run.result()
        pool.shutdown()
    out = p.stdout + p.stderr
    # Training and evaluation ran as Slurm jobs (the plugin names the job id and the rule's log folder).
    job_ids = {}
    for rule in ("train", "evaluate"):
        m = re.search(rf"submitted with SLURM jobid (\d+) \(log: \S*/rule_{rule}/", out)
        assert m, f"no Slurm job of rule {rule} in Snakemake's output:\n{out[-3000:]}"
        job_ids[rule] = m.group(1)
    tiny = cfg["job_resources"]
    for rule, jid in job_ids.items():
        info = subprocess.run(["scontrol", "show", "job", jid], env=slurm, capture_output=True, text=True).stdout
        assert "JobState=COMPLETED" in info, info
        assert f"MinMemoryNode={tiny[rule]['mem_mb']}M" in info, info
        assert re.search(rf"NumCPUs={tiny[rule]['cpus']}\b", info), info
        assert "Partition=debug" in info, info
    # one Slurm job per training run, which ran as two processes (rank 0 writes train.json with devices)
    import json

    summaries = sorted((cluster / "results" / "runs").rglob("train.json"))
    assert summaries and all(json.loads(f.read_text())["devices"] == 2 for f in summaries)
    assert len(re.findall(r"submitted with SLURM jobid \d+ \(log: \S*/rule_train/", out)) == len(summaries)
    a = pd.read_csv(local / "results" / "table1.csv")
    b = pd.read_csv(cluster / "results" / "table1.csv")
    # two processes sum the gradient in another order: the same model to fp32 round-off (Spearman × 100)
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=0.05)
