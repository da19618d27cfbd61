"""One GPU per local job on a machine with several GPUs (``local_gpus`` in config).

Snakemake's ``--resources gpu=N`` only limits how many GPU jobs run at once; it does not say which
GPU each one gets, so without this every job would train on ``cuda:0``. A GPU job claims a free
slot: an exclusive ``flock`` on ``<lock_dir>/gpu<i>.lock``, held by the process for its whole life
and released by the kernel when it exits, crashes or is killed (no stale locks to clean up). The slot
becomes ``CUDA_VISIBLE_DEVICES`` before torch initialises CUDA. With ``CUDA_VISIBLE_DEVICES`` already
set (e.g. ``0,2,5``), slot i maps to its i-th entry. On Slurm the scheduler assigns GPUs itself:
leave ``local_gpus`` unset there.

A job of several processes (``train.devices: N``) gets ``$SENTEMB_JOB_GPUS`` = N and claims N slots
at once (all or none, so that two such jobs never each hold half of what they need), and
``CUDA_VISIBLE_DEVICES`` lists all of them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from .. import SentembError

log = logging.getLogger(__name__)
ENV_SLOTS = "SENTEMB_GPU_SLOTS"
ENV_LOCK_DIR = "SENTEMB_GPU_LOCK_DIR"
ENV_JOB_GPUS = "SENTEMB_JOB_GPUS"
DEFAULT_LOCK_DIR = ".snakemake/gpu_slots"

_held: list = []  # the open lock files of this process's slots (kept open = slots held)


def claim(n_slots: int, lock_dir: str | os.PathLike = DEFAULT_LOCK_DIR, *, timeout: float | None = None,
          poll: float = 0.5) -> int:
    """Block until one of ``n_slots`` slots is free, hold it for the life of the process, return its index."""
    return claim_many(n_slots, 1, lock_dir, timeout=timeout, poll=poll)[0]


def claim_many(n_slots: int, count: int, lock_dir: str | os.PathLike = DEFAULT_LOCK_DIR, *,
               timeout: float | None = None, poll: float = 0.5) -> list[int]:
    """Block until ``count`` of ``n_slots`` slots are free at once, hold them all for the life of the
    process, return their indices (all or none: slots taken while others are missing are released
    before waiting again)."""
    if n_slots < 1:
        raise SentembError(f"${ENV_SLOTS}: needs a positive number of GPU slots, not {n_slots}")
    if count > n_slots:
        raise SentembError(f"a job of {count} GPUs (train.devices) cannot run with {n_slots} local GPUs "
                           f"(config local_gpus)")
    d = Path(lock_dir)
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    while True:
        got = []
        for i in range(n_slots):
            fh = open(d / f"gpu{i}.lock", "a+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            got.append((i, fh))
            if len(got) == count:
                break
        if len(got) == count:
            for _, fh in got:
                fh.seek(0)
                fh.truncate()
                fh.write(f"{os.getpid()}\n")
                fh.flush()
            _held.extend(fh for _, fh in got)
            return [i for i, _ in got]
        for _, fh in got:
            fh.close()  # releases the lock
        if timeout is not None and time.monotonic() - t0 > timeout:
            want = "free GPU slot" if count == 1 else f"{count} free GPU slots"
            raise SentembError(f"no {want} among {n_slots} in {d} after {timeout:.0f} s")
        time.sleep(poll)


def device_for_slot(slot: int, visible: str | None) -> str:
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else []
    if ids:
        if slot >= len(ids):
            raise SentembError(f"GPU slot {slot} but CUDA_VISIBLE_DEVICES lists only {len(ids)} devices ({visible})")
        return ids[slot]
    return str(slot)


def claim_from_env() -> int | None:
    """If ``$SENTEMB_GPU_SLOTS`` is set: claim a slot and set ``CUDA_VISIBLE_DEVICES`` (call before CUDA starts)."""
    value = os.environ.get(ENV_SLOTS)
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        raise SentembError(f"${ENV_SLOTS}: {value!r} is not a number of GPUs") from None
    count = int(os.environ.get(ENV_JOB_GPUS) or 1)
    if count > 1:
        slots = claim_many(n, count, os.environ.get(ENV_LOCK_DIR, DEFAULT_LOCK_DIR))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(device_for_slot(i, visible) for i in slots)
        log.info("GPU slots %s of %d -> CUDA_VISIBLE_DEVICES=%s", slots, n, os.environ["CUDA_VISIBLE_DEVICES"])
        return slots[0]
    slot = claim(n, os.environ.get(ENV_LOCK_DIR, DEFAULT_LOCK_DIR))
    os.environ["CUDA_VISIBLE_DEVICES"] = device_for_slot(slot, os.environ.get("CUDA_VISIBLE_DEVICES"))
    log.info("GPU slot %d of %d -> CUDA_VISIBLE_DEVICES=%s", slot, n, os.environ["CUDA_VISIBLE_DEVICES"])
    return slot
