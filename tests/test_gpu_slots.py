"""Several GPUs on one machine: each job claims its own slot; a killed job's slot is free again."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sentemb import SentembError
from sentemb.ops.gpu_slots import claim, device_for_slot

HOLD = """
import os, sys, time
from sentemb.ops.gpu_slots import claim_from_env
claim_from_env()
open(sys.argv[1], "w").write(os.environ["CUDA_VISIBLE_DEVICES"])
time.sleep(float(sys.argv[2]))
"""


def _start(tmp_path, i, hold, n=3, extra_env=None):
    env = {**os.environ, "SENTEMB_GPU_SLOTS": str(n), "SENTEMB_GPU_LOCK_DIR": str(tmp_path / "locks"), **(extra_env or {})}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra_env or {})
    return subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / f"job{i}"), str(hold)], env=env)


def _wait_for(path, timeout=60):
    t0 = time.monotonic()
    while not (path.is_file() and path.read_text()):
        assert time.monotonic() - t0 < timeout, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def test_parallel_jobs_never_share_a_slot_and_a_killed_jobs_slot_is_freed(tmp_path):
    jobs = [_start(tmp_path, i, hold=30) for i in range(3)]
    got = [_wait_for(tmp_path / f"job{i}") for i in range(3)]
    assert sorted(got) == ["0", "1", "2"]  # three jobs, three different GPUs
    waiting = _start(tmp_path, 3, hold=0)  # a fourth job waits: all slots are taken
    time.sleep(1.5)
    assert not (tmp_path / "job3").exists() and waiting.poll() is None
    victim = got.index("1")
    jobs[victim].send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
    assert _wait_for(tmp_path / "job3") == "1"
    assert waiting.wait(30) == 0
    for j in jobs:
        j.kill()
        j.wait()


def test_slots_map_onto_an_existing_cuda_visible_devices(tmp_path):
    assert device_for_slot(1, "0,2,5") == "2" and device_for_slot(0, None) == "0"
    with pytest.raises(SentembError, match="lists only 2 devices"):
        device_for_slot(2, "3,4")
    j = _start(tmp_path, 0, hold=0, n=2, extra_env={"CUDA_VISIBLE_DEVICES": "4,7"})
    assert j.wait(60) == 0 and (tmp_path / "job0").read_text() == "4"


def test_no_free_slot_times_out_with_a_clear_error(tmp_path):
    assert claim(1, tmp_path / "l") == 0  # this process holds slot 0
    code = "from sentemb.ops.gpu_slots import claim; claim(1, %r, timeout=0.5)" % str(tmp_path / "l")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode != 0 and "no free GPU slot among 1" in p.stderr


def test_a_job_of_several_gpus_claims_them_all_at_once(tmp_path):
    """``train.devices: 2`` on 3 local GPUs (``SENTEMB_JOB_GPUS=2``): the job sees both of its GPUs; a
    second such job waits (one slot free is not enough) and starts when the first ends."""
    two = {"SENTEMB_JOB_GPUS": "2"}
    first = _start(tmp_path, 0, hold=3, extra_env=two)
    assert sorted(_wait_for(tmp_path / "job0").split(",")) == ["0", "1"]
    second = _start(tmp_path, 1, hold=0, extra_env=two)
    time.sleep(1.0)
    assert not (tmp_path / "job1").exists() and second.poll() is None  # slot 2 alone is not enough
    assert first.wait(30) == 0 and second.wait(30) == 0
    assert len(set((tmp_path / "job1").read_text().split(","))) == 2
    from sentemb.ops.gpu_slots import claim_many

    with pytest.raises(SentembError, match="a job of 4 GPUs .* with 3 local GPUs"):
        claim_many(3, 4, tmp_path / "other")
