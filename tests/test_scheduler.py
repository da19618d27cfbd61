"""sentemb.ops.scheduler: Snakemake's re-evaluation timers, one pending at a time.

The unit tests drive the patched method on a stand-in scheduler; the last test runs a real Snakemake
on a Snakefile of sleeping jobs and counts its scheduling passes with and without the patch, so that
it fails both where the installed Snakemake no longer multiplies its passes (the patch is then dead
code to remove) and where the patch stops taking effect."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from sentemb.ops.scheduler import coalesce_reevaluations


def _scheduler_class():
    class Scheduler:
        def __init__(self):
            self._open_jobs = threading.Semaphore(0)

        def _schedule_reevalutation(self, delay):  # Snakemake's own: one timer per call
            threading.Timer(delay, lambda: self._open_jobs.release()).start()

    return Scheduler


def _releases(sem: threading.Semaphore) -> int:
    n = 0
    while sem.acquire(blocking=False):
        n += 1
    return n


def test_many_requests_start_one_timer_and_one_pass():
    cls = _scheduler_class()
    assert coalesce_reevaluations(cls) is True
    s = cls()
    for _ in range(50):
        s._schedule_reevalutation(0.2)
    assert len(s._sentemb_pending_reevaluations) == 1  # one timer, not fifty
    time.sleep(0.5)
    assert _releases(s._open_jobs) == 1
    s._schedule_reevalutation(0.05)  # after it fired, a request starts a timer again
    time.sleep(0.3)
    assert _releases(s._open_jobs) == 1


def test_an_earlier_deadline_is_kept_and_a_later_one_dropped():
    cls = _scheduler_class()
    coalesce_reevaluations(cls)
    s = cls()
    s._schedule_reevalutation(5)  # e.g. the queue-input wait (10 s in Snakemake)
    t0 = time.monotonic()
    s._schedule_reevalutation(0.05)  # the rate limit's window: must not wait behind the 5 s timer
    assert s._open_jobs.acquire(timeout=2) and time.monotonic() - t0 < 2
    s._schedule_reevalutation(10)  # later than the pending 5 s one: dropped
    assert len(s._sentemb_pending_reevaluations) == 1


def test_timers_are_daemons_so_the_process_exits_without_waiting_for_them():
    code = ("import threading\nfrom sentemb.ops.scheduler import coalesce_reevaluations\n"
            "class S:\n    def __init__(self): self._open_jobs = threading.Semaphore(0)\n"
            "    def _schedule_reevalutation(self, delay): pass\n"
            "coalesce_reevaluations(S)\nS()._schedule_reevalutation(60)\n")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert time.monotonic() - t0 < 20


def test_idempotent_and_inert_where_the_method_is_missing():
    cls = _scheduler_class()
    assert coalesce_reevaluations(cls) and coalesce_reevaluations(cls)
    assert cls._schedule_reevalutation.__wrapped__.__qualname__.endswith("Scheduler._schedule_reevalutation")

    class Other:
        pass

    assert coalesce_reevaluations(Other) is False and not hasattr(Other, "_schedule_reevalutation")


SNAKEFILE = """
import os
from snakemake.scheduling.job_scheduler import JobScheduler
from sentemb.ops.scheduler import coalesce_reevaluations

if os.environ["COALESCE"] == "1":
    assert coalesce_reevaluations()
_select = JobScheduler.job_selector

def _counted(self, jobs):
    with open("passes.txt", "a") as f:
        f.write("pass\\n")
    return _select(self, jobs)

JobScheduler.job_selector = _counted

rule all:
    input: expand("out/{i}", i=range(16))

rule one:
    output: "out/{i}"
    shell: "sleep 0.5; touch {output}"
"""


@pytest.mark.integration
def test_a_real_snakemake_runs_one_pass_per_event_and_second_not_one_chain_per_finished_job(tmp_path):
    """16 jobs of 0.5 s on one core, 8+ s: Snakemake's own timers run about k passes a second once
    k jobs have finished (about 16 * 17 / 2 * 0.5 = 68 timer passes); one pending timer runs one a
    second (about 8), next to the one pass each finished job starts."""
    procs, passes, took = {}, {}, {}
    t0 = time.monotonic()
    for coalesce in ("0", "1"):  # side by side: the jobs sleep
        d = tmp_path / f"coalesce{coalesce}"
        d.mkdir()
        (d / "Snakefile").write_text(SNAKEFILE)
        procs[coalesce] = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "-s", str(d / "Snakefile"),
                                            "-d", str(d)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           env={**os.environ, "COALESCE": coalesce})
    for coalesce, p in procs.items():
        out, _ = p.communicate(timeout=300)
        took[coalesce] = time.monotonic() - t0
        assert p.returncode == 0, out[-3000:]
        passes[coalesce] = len((tmp_path / f"coalesce{coalesce}" / "passes.txt").read_text().splitlines())
    assert passes["1"] <= 16 + took["1"] + 8, (passes, took)  # one per finished job, one a second, slack
    assert passes["0"] > 2 * passes["1"], (passes, took)  # the multiplying chains this patch removes
