"""One pending re-evaluation timer in Snakemake's job scheduler, not one per scheduling pass.

Snakemake (9.x, ``snakemake.scheduling.job_scheduler``) applies ``--max-jobs-per-timespan`` (default
``100/1s``) by ending every scheduling pass that leaves jobs waiting with
``_schedule_reevalutation(timespan)``: a ``threading.Timer`` that releases the scheduler's semaphore
one timespan later, which starts another pass. A pass started by a timer starts a timer again, and so
does every pass started by a job finishing. Each finished job therefore adds one more chain of passes
once a second for as long as any job waits for a core: after 100 finished jobs the scheduler runs 100
passes a second, each of which stats every input of every waiting job
(``JobScheduler.update_input_sizes``) and runs the job selector.

Measured on the tiny test DAG (``.test/config.yaml`` with the three example plug-ins: 127 jobs,
``--cores 2``, the project's 2-core machine, ``/usr/bin/time``): 583 CPU-seconds and 5 min 5 s without
this, 503 CPU-seconds and 4 min 27 s with it, the jobs unchanged. On a cluster the same passes run on
the login node for as long as the workflow runs.

``coalesce_reevaluations()`` replaces that method so that a request is dropped when a timer that
fires no later is already pending: the scheduler still runs a pass within one timespan of every
request (the rate limit's window and the queue-input wait behave as before), but the passes no
longer multiply. The timers are daemon threads, so Snakemake no longer waits up to one timespan for
the last of them before it exits. The Snakefile calls this (``workflow/rules/common.smk``); a
Snakemake without the method is left as it is.
"""

from __future__ import annotations

import threading
import time

_MARK = "_sentemb_coalesced"
_LOCK = threading.Lock()
_PENDING = "_sentemb_pending_reevaluations"  # on the scheduler: deadlines (time.monotonic) of its timers


def coalesce_reevaluations(scheduler_cls=None) -> bool:
    """Patch ``scheduler_cls._schedule_reevalutation`` (Snakemake's ``JobScheduler`` by default; the
    misspelling is Snakemake's). Idempotent. Returns whether the method is (now) the coalescing one:
    False where the class or the method does not exist (another Snakemake), which changes nothing."""
    if scheduler_cls is None:
        try:
            from snakemake.scheduling.job_scheduler import JobScheduler as scheduler_cls
        except ImportError:
            return False
    original = scheduler_cls.__dict__.get("_schedule_reevalutation")
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    def _schedule_reevalutation(self, delay) -> None:
        deadline = time.monotonic() + float(delay)
        with _LOCK:
            pending = self.__dict__.setdefault(_PENDING, [])
            if any(d <= deadline for d in pending):
                return  # a pass runs no later than this request asks for, and ends with a request of its own
            pending.append(deadline)

        def fire() -> None:
            with _LOCK:
                pending.remove(deadline)
            self._open_jobs.release()

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timer.start()

    setattr(_schedule_reevalutation, _MARK, True)
    _schedule_reevalutation.__wrapped__ = original
    _schedule_reevalutation.__doc__ = "Snakemake's re-evaluation timer, one pending at a time (sentemb.ops.scheduler)."
    scheduler_cls._schedule_reevalutation = _schedule_reevalutation
    return True
