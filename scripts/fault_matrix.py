#!/usr/bin/env python
"""Fault injection: kill the whole Snakemake process group at chosen points, unlock, rerun, check.

For every fault point the tiny DAG (``.test/config.yaml`` made smaller: one seed, SimCSE only, no
baseline, STS-B and SICK-R, a state save every 2 steps; the statistics stage, paraphrases in 2 shards
included, only when a chosen point kills inside it) is started in a fresh
working directory (holding the reference run's inputs where the point kills after they are made:
``INPUT_POINTS``); when the point's condition appears on disk the process group gets SIGKILL (no
clean-up code runs anywhere). Then ``snakemake --unlock`` and the same command again. Checked:

* recovered: the rerun succeeds;
* identical: ``results/table1.csv`` and ``.md`` equal an uninterrupted run's byte for byte;
* no partial output taken for finished: after the kill, every output Snakemake would *not* redo
  (its dry run) is complete, i.e. equal to the uninterrupted run's file where the file is
  deterministic (tables, corpus, statistics) and readable otherwise (JSON, model directories);
* MLflow: every finished job has exactly one FINISHED run, none is left RUNNING.

The point ``tracking_server_down`` kills no part of the DAG: the MLflow server it logs to over HTTP
is SIGKILLed while training runs and restarted after training; the DAG must finish by itself, and
after ``sentemb sync-tracking`` the server's store must hold one FINISHED run per job.

The points run side by side (``--jobs``, default: all of them at once) and next to the reference
run, each in its own working directory. The reference run makes the inputs first (``--omit-from
train``; ``--inputs DIR`` copies them from an earlier run of the DAG instead); the points that start
from them and the reference's own training, evaluation and tables then run together, and the points
that kill while inputs are made start at once. A point's partial outputs are judged once the
reference has finished (they are compared with its files).

    python scripts/fault_matrix.py --shared ../shared [--points train_after_save,evaluate] [--keep DIR] [--jobs N]
                                  [--inputs DIR]

Prints a table (fault point, hit, recovered, identical, partial outputs, MLflow FINISHED/KILLED/
RUNNING) and exits non-zero if any point failed. ``tests/test_fault_matrix.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["results/table1.csv", "stats"]


def _glob_any(root: Path, *patterns: str) -> bool:
    return any(True for p in patterns for _ in root.glob(p))


#: fault point -> condition on the working directory that triggers the kill
POINTS = {
    "fetch": lambda d: _glob_any(d, "results/logs/data/fetch_*.log"),
    "stats": lambda d: _glob_any(d, "results/logs/stats/*/token_freq.*.log", "results/logs/stats/*/tfidf*.log", "results/logs/stats/*/rake*.log"),
    "paraphrase_shard": lambda d: _glob_any(d, "results/stats/*/paraphrase/*.ckpt.jsonl"),
    "train_before_save": lambda d: _glob_any(d, "results/logs/train/**/*.log") and not _glob_any(d, "results/runs/**/.work/last.pt"),
    "train_after_save": lambda d: _glob_any(d, "results/runs/**/.work/last.pt"),
    "evaluate": lambda d: _glob_any(d, "results/logs/evaluate/**/*.log"),
    "table": lambda d: _glob_any(d, "results/logs/table1.log"),
    # not a kill of Snakemake: the MLflow server tracking the DAG over HTTP is SIGKILLed once training
    # has started and restarted after it ended; the DAG goes on, then `sentemb sync-tracking`
    "tracking_server_down": lambda d: _glob_any(d, "results/runs/**/.mlflow_run.json"),
}


#: the points that need the statistics stage in the DAG (the others run training and evaluation only)
STATS_POINTS = {"stats", "paraphrase_shard"}
#: the points that kill while the inputs are made (fetched, prepared, tokenized, counted): their working
#: directory starts empty. Every other point's starts with the reference run's inputs (``resources/`` and
#: ``results/stats/``, copied with their times), as a rerun after such a kill finds them: its DAG runs
#: training, evaluation and the tables, where its kill lands, without fetching and tokenizing again.
INPUT_POINTS = {"fetch", "stats", "paraphrase_shard"}


def targets(points) -> list[str]:
    """The DAG's targets: the ``stats`` target only where a point kills inside it."""
    return TARGETS if STATS_POINTS & set(points) else [t for t in TARGETS if t != "stats"]


def make_config(dest: Path, points=tuple(POINTS)) -> None:
    from sentemb.testing import simcse_dag_config

    # no study, baseline or transfer: they add time, not coverage, here (the kills hit the run's own jobs)
    cfg = simcse_dag_config(REPO / ".test" / "config.yaml")
    cfg["train"]["save_steps"] = 2
    cfg.setdefault("stats", {}).setdefault("paraphrase", {})["enabled"] = "paraphrase_shard" in points
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def smk_cmd(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            f"--configfile={workdir / 'config.yaml'}", *args]


def run(workdir: Path, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(smk_cmd(workdir, *args), capture_output=True, text=True, env=env, timeout=1800)
    if check and p.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed in {workdir}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def run_and_kill(workdir: Path, env: dict, cond, timeout: float = 900) -> bool:
    """Start the DAG in its own process group; SIGKILL the group when ``cond`` holds. True if it did."""
    proc = subprocess.Popen(smk_cmd(workdir, "--cores", "2", *TARGETS), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            if cond(workdir):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.02)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_with_tracking_server_down(workdir: Path, env: dict) -> tuple[bool, bool, Path]:
    """The DAG tracked by a real ``mlflow server`` that is SIGKILLed while training runs (longer
    than MLflow's own retries) and restarted after it; then ``sentemb sync-tracking``. Returns (hit,
    recovered: the DAG and the sync succeeded without a rerun, the server's SQLite store)."""
    sys.path.insert(0, str(REPO / "src"))
    from sentemb.tracking.server import MlflowServer

    server = MlflowServer(workdir / "mlflow_server").start()
    env = {**env, "MLFLOW_TRACKING_URI": server.uri, "SENTEMB_TRACKING_WAIT_S": "2",
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    try:
        proc = subprocess.Popen(smk_cmd(workdir, "--cores", "2", *TARGETS), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        hit = False
        while proc.poll() is None and not hit:
            hit = POINTS["tracking_server_down"](workdir)
            time.sleep(0.05)
        if hit:
            server.kill()
            while proc.poll() is None and not _glob_any(workdir, "results/runs/**/train.json"):
                time.sleep(0.2)
            server.start()
        ok = proc.wait() == 0
        sync = subprocess.run([sys.executable, "-m", "sentemb", "sync-tracking", "--config", "config.yaml"],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        return hit, ok and sync.returncode == 0, workdir / "mlflow_server" / "mlflow.db"
    finally:
        server.stop()


def planned_outputs(workdir: Path, env: dict) -> set[str]:
    """Outputs Snakemake would (re)create: from its dry run's ``output:`` lines."""
    p = run(workdir, env, "-n", "--cores", "2", *TARGETS, check=False)
    out = set()
    for line in (p.stdout + p.stderr).splitlines():
        line = line.strip()
        if line.startswith("output:"):
            out.update(x.strip() for x in line[len("output:"):].split(","))
    return out


DETERMINISTIC = (".csv", ".md", ".txt", ".parquet", ".jsonl")


def partial_outputs(workdir: Path, ref: Path, planned: set[str]) -> list[str]:
    """Files that exist, are not going to be redone, and are not complete."""
    bad = []
    for base in ("resources", "results"):
        for f in sorted((workdir / base).rglob("*")):
            rel = f.relative_to(workdir).as_posix()
            if not f.is_file() or "/.work/" in rel or rel.startswith("results/.tracking") or ".ckpt." in rel:
                continue
            if any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in planned):
                continue
            twin = ref / rel
            if rel.endswith("/model/README.md"):  # a model card: names its MLflow run, so never byte-equal
                text = f.read_text("utf-8", errors="replace")
                if not (text.startswith("---\n") and "library_name: sentence-transformers" in text):
                    bad.append(rel)
            elif f.suffix in DETERMINISTIC and not rel.endswith("summary.md") and twin.is_file():
                if f.read_bytes() != twin.read_bytes():
                    bad.append(rel)
            elif f.suffix == ".json":
                try:
                    json.loads(f.read_text("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    bad.append(rel)
            elif twin.is_file() and f.stat().st_size != twin.stat().st_size and f.suffix in (".safetensors", ".bin"):
                bad.append(rel)
    return bad


def mlflow_statuses(workdir: Path, db: Path | None = None) -> tuple[dict[str, int], list[str]]:
    """Counts by status, and the jobs (run names) that do not have exactly one FINISHED run."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db or workdir / 'mlflow.db'}")
    exp = c.get_experiment_by_name(yaml.safe_load((workdir / "config.yaml").read_text()).get("experiment", "sentemb"))
    runs = c.search_runs([exp.experiment_id]) if exp else []
    counts: dict[str, int] = {}
    finished: dict[str, int] = {}
    for r in runs:
        counts[r.info.status] = counts.get(r.info.status, 0) + 1
        finished.setdefault(r.info.run_name, 0)
        if r.info.status == "FINISHED":
            finished[r.info.run_name] += 1
    return counts, [name for name, n in finished.items() if n != 1]


def run_point(point: str, d: Path, ref: Path, env: dict, ref_done: threading.Event) -> tuple:
    """One fault point in its working directory ``d`` (inputs already there where it needs them); its
    partial outputs are judged once the reference run (``ref``) has finished. Returns its table row."""
    db = d / "mlflow.db"
    rerun = None
    if point == "tracking_server_down":  # the DAG is not killed: it must finish by itself
        hit, recovered, db = run_with_tracking_server_down(d, env)
        partial = []
        ref_done.wait()
    else:
        hit = run_and_kill(d, env, POINTS[point])
        run(d, env, "--unlock")
        planned = planned_outputs(d, env) if hit else set()
        ref_done.wait()  # the reference's files are what a kept output is compared with
        partial = partial_outputs(d, ref, planned) if hit else []
        rerun = run(d, env, "--cores", "2", *TARGETS, check=False)
        recovered = rerun.returncode == 0
    identical = recovered and all((d / f).read_bytes() == (ref / f).read_bytes()
                                  for f in ("results/table1.csv", "results/table1.md"))
    counts, not_one = mlflow_statuses(d, db) if db.exists() else ({}, [])
    ok = recovered and identical and not partial and not not_one and counts.get("RUNNING", 0) == 0
    if not recovered:
        print(f"--- {point}: rerun failed:\n{rerun.stderr[-2000:] if rerun else ''}", flush=True)
    return point, hit, recovered, identical, partial, counts, not_one, ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.environ.get("SENTEMB_SHARED", str(REPO.parent / "shared")))
    ap.add_argument("--points", default=",".join(POINTS), help=f"comma-separated subset of {','.join(POINTS)}")
    ap.add_argument("--keep", default=None, help="keep the working directories here")
    ap.add_argument("--inputs", default=None,
                    help="a folder holding this DAG's inputs (resources/ and results/stats/ of a run of it, e.g. "
                         "`snakemake --omit-from train`): the reference and the points that start from inputs "
                         "copy them from there instead of the reference making them")
    ap.add_argument("--jobs", type=int, default=0,
                    help="fault points run side by side, next to the reference run (default 0: every point at once)")
    args = ap.parse_args(argv)
    points = [p for p in args.points.split(",") if p]
    unknown = set(points) - set(POINTS)
    if unknown:
        ap.error(f"unknown fault points {sorted(unknown)}")
    if args.jobs < 0:
        ap.error("--jobs must be 0 (all at once) or more")
    env = {**os.environ, "SENTEMB_MIRROR": str(Path(args.shared).resolve()), "MLFLOW_TRACKING_URI": ""}
    root = Path(args.keep or tempfile.mkdtemp(prefix="fault_matrix_"))
    root.mkdir(parents=True, exist_ok=True)
    ref = root / "reference"
    TARGETS[:] = targets(points)  # every run, kill and dry run of this invocation
    dirs = {}
    for name in ["reference", *points]:
        dirs[name] = root / name
        shutil.rmtree(dirs[name], ignore_errors=True)
        dirs[name].mkdir()
        make_config(dirs[name], points)
    sys.path.insert(0, str(REPO / "src"))
    from sentemb.testing import copy_dag_inputs

    t0 = time.monotonic()
    ref_done = threading.Event()
    ref_error: list[BaseException] = []

    def reference() -> None:  # its own thread, never queued behind a point that waits for it
        try:
            run(ref, env, "--cores", "2", *TARGETS)
            print(f"uninterrupted reference run: {time.monotonic() - t0:.0f} s", flush=True)
        except BaseException as e:  # noqa: BLE001 - raised again below
            ref_error.append(e)
        finally:
            ref_done.set()  # a point waiting for a failed reference goes on (and the run fails below)

    pool = ThreadPoolExecutor(max_workers=args.jobs or len(points))
    try:
        # the points that kill while the inputs are made start empty, at once
        futures = {p: pool.submit(run_point, p, dirs[p], ref, env, ref_done) for p in points if p in INPUT_POINTS}
        try:
            if args.inputs:
                copy_dag_inputs(args.inputs, ref)
            else:
                run(ref, env, "--cores", "2", "--omit-from", "train", *TARGETS)  # the reference's inputs
        except BaseException:
            ref_done.set()
            raise
        for p in points:  # every other point starts with them, as a rerun after such a kill finds them
            if p not in INPUT_POINTS:
                copy_dag_inputs(ref, dirs[p])
        ref_thread = threading.Thread(target=reference, daemon=True)
        ref_thread.start()
        futures.update({p: pool.submit(run_point, p, dirs[p], ref, env, ref_done) for p in points
                        if p not in INPUT_POINTS})
        ref_thread.join()  # first: a failed reference is the error to report, not a point's missing table
        if ref_error:
            raise ref_error[0]
        rows = [futures[p].result() for p in points]
    finally:
        pool.shutdown(wait=True)
    failed = sum(not r[7] for r in rows)
    print(f"\n{'fault point':<18} {'hit':<4} {'recovered':<9} {'identical':<9} {'partial outputs':<16} "
          f"{'MLflow FINISHED/KILLED/RUNNING':<31} {'ok':<3}")
    for point, hit, rec, ident, partial, counts, not_one, ok in rows:
        ml = f"{counts.get('FINISHED', 0)}/{counts.get('KILLED', 0)}/{counts.get('RUNNING', 0)}"
        if not_one:
            ml += f" (not one FINISHED: {','.join(not_one)})"
        print(f"{point:<18} {'yes' if hit else 'no':<4} {'yes' if rec else 'no':<9} {'yes' if ident else 'no':<9} "
              f"{(', '.join(partial) or 'none')[:16]:<16} {ml:<31} {'yes' if ok else 'NO':<3}")
    hits = sum(r[1] for r in rows)
    print(f"\n{len(rows)} fault points, {hits} hit, {sum(r[7] for r in rows)} recovered identically "
          f"with a truthful MLflow store; total {time.monotonic() - t0:.0f} s")
    for point, *_, partial, _c, _n, _ok in rows:
        if partial:
            print(f"{point}: partial outputs taken for finished: {partial}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
