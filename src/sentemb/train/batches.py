"""Where the training loop's batches come from, and how long the loop waits for them (issue 36 §3).

A step's batches are ``micro_batches(job, step)``: the method's CPU-side ``build_batch`` of each of
the step's micro-batches, a pure function of (seed, micro-batch) (``Method.np_rng(micro)``,
``Method.torch_rng(micro)``, never the global RNG, the weights or the device). So they can be built
anywhere, ahead of time, and the weights are the same:

* ``train.workers: 0``, ``train.prefetch: false`` - in line, on the loop's critical path;
* ``train.workers: 0``, ``train.prefetch: true`` (the old default) - ``Prefetcher``: one background
  thread builds step s + 1 while step s computes. It shares the interpreter (GIL) with the loop, so
  a Python-heavy ``build_batch`` (PaSeR's RAKE masking and EDA: ~260 ms a step against SimCSE's
  34 ms H200 step) still stalls it;
* ``train.workers: N`` - ``WorkerBatches``: a ``torch.utils.data.DataLoader`` over the optimizer
  steps (``StepBatches``: step -> ``micro_batches(job, step)``, ``batch_size=None``), ``num_workers=N``
  processes started with ``fork`` (they inherit the method, corpus and token cache without
  pickling; they only ever run ``build_batch``, never CUDA), the sampler starting at the resumed
  step, ``prefetch_factor`` 2 (so up to 2N steps ahead), pinned memory on CUDA, and a generator of
  its own for the workers' base seed (by default the DataLoader draws it from the global generator,
  which would shift every later dropout mask: another random run).
  ``TOKENIZERS_PARALLELISM=false`` is set before the fork (a Rust tokenizer used by the parent
  must not be used with its thread pool in a forked child), and NLTK's WordNet reader reopens its
  data files in each worker (``own_wordnet_files``: inherited open files share their offset across
  processes, which corrupts PaSeR's synonym look-ups). The workers are shut down by
  ``close`` (``Job.close``: at the end, on an error, on KeyboardInterrupt); an exception in a
  worker's ``build_batch`` is raised in the loop by the step that wants the batch, carrying the
  method's message and the worker's traceback; a worker that dies is reported by the DataLoader, and
  one that hangs by ``train.worker_timeout`` (the loop waits that long for a step's batches, then
  stops with an error naming the setting, the step and the workers' pids; the workers are stopped).
  With ``train.devices > 1`` every rank has its own N workers (each rank builds the whole
  micro-batch and encodes its share, ``sentemb.train.distributed``).

``fetch`` is how ``optimizer_step`` gets a step's batches: it measures the time the loop is
blocked getting them (the whole build when in line, the remainder of a build still in flight with
``prefetch`` or workers); ``log_step`` logs its mean per step over the log window as
``train/data_wait`` (seconds) and ``train.json`` gets the run's (this process's) total and mean,
``data_wait_s`` and ``data_wait_s_per_step``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

# ``Job`` and ``State`` in the annotations are ``sentemb.train.loop``'s (not imported: loop imports this)
log = logging.getLogger(__name__)


def micro_batches(job: Job, step: int, pin: bool = False) -> list[tuple[int, dict]]:
    """The method-built CPU batches of optimizer step ``step``: (global micro index, batch) per
    micro-batch. Deterministic in (seed, micro), so a resumed or re-run step sees the same data.
    ``pin``: in page-locked memory, so that the copy to the GPU is asynchronous."""
    out = []
    for k in range(job.accum):
        m = step * job.accum + k
        idx = job.micro[m]
        batch = job.method.build_batch([job.sentences[i] for i in idx], step=step, lines=idx, micro=m)
        if pin:
            batch = {key: v.pin_memory() for key, v in batch.items()}
        out.append((m, batch))
    return out


class Prefetcher:
    """Builds the next optimizer step's micro-batches (``micro_batches``) in one background thread
    while the current step computes, so batch construction is off the critical path; pinned memory
    on CUDA. Batches depend only on (seed, micro), never on the global RNG or the weights, so the
    data are the same as without it (``train.prefetch: false``)."""

    def __init__(self, job: Job):
        from concurrent.futures import ThreadPoolExecutor

        self.job, self.pin = job, job.device.type == "cuda"
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sentemb-batches")
        self.pending = None  # (step, Future)

    def get(self, step: int) -> list[tuple[int, dict]]:
        """The batches of ``step`` (built ahead if it was the step asked for next), and start
        building ``step + 1``."""
        if self.pending is not None and self.pending[0] == step:
            batches = self.pending[1].result()
        else:
            self.wait()
            batches = micro_batches(self.job, step, self.pin)
        self.pending = None
        if step + 1 < self.job.total:
            self.pending = (step + 1, self.pool.submit(micro_batches, self.job, step + 1, self.pin))
        return batches

    def wait(self) -> None:
        """Let the batch in flight finish (before the main thread uses the tokenizer itself, e.g. to
        evaluate: a fast tokenizer must not be used by two threads at once). Its error, if any, is
        raised by the ``get`` that wants it."""
        from concurrent.futures import wait

        if self.pending is not None:
            wait([self.pending[1]])

    def close(self) -> None:
        self.pending = None
        self.pool.shutdown(wait=True, cancel_futures=True)


class StepBatches:
    """A map-style dataset over optimizer steps: item ``step`` is ``micro_batches(job, step)``
    (what a ``WorkerBatches`` worker process computes)."""

    def __init__(self, job: Job):
        self.job = job

    def __len__(self) -> int:
        return self.job.total

    def __getitem__(self, step: int) -> list[tuple[int, dict]]:
        return micro_batches(self.job, int(step))


def _as_is(x: Any) -> Any:
    """The DataLoader's collate function: a step's batches are already what the loop takes."""
    return x


def _worker_init(_worker_id: int) -> None:
    # a forked worker builds batches one at a time: no tokenizer thread pool, one torch thread
    # (the DataLoader sets the latter itself)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    own_wordnet_files()


def own_wordnet_files() -> None:
    """In a forked worker: NLTK's ``WordNetCorpusReader`` reads synsets by ``seek`` + ``readline`` on
    data files it keeps open (``_data_file_map``). Files opened before the fork share one file
    offset with the parent and every sibling worker, so concurrent look-ups read each other's lines
    (PaSeR's EDA synonym replacement then fails with ``'NoneType' object has no attribute 'lemmas'``
    or, worse, gets another word's synonyms). Here every reader reopens its data files on first use
    in this process. Nothing to do where NLTK's WordNet reader was never imported."""
    import sys

    mod = sys.modules.get("nltk.corpus.reader.wordnet")
    if mod is None or getattr(mod.WordNetCorpusReader._data_file, "_sentemb_per_process", False):
        return
    inherited = mod.WordNetCorpusReader._data_file
    pid = os.getpid()

    def _data_file(self, pos):
        if self.__dict__.get("_sentemb_pid") != pid:
            self._data_file_map = {}  # the parent's open files are left to it (not closed: shared offsets)
            self._sentemb_pid = pid
        return inherited(self, pos)

    _data_file._sentemb_per_process = True
    mod.WordNetCorpusReader._data_file = _data_file


class WorkerBatches:
    """``train.workers: N``: the next steps' micro-batches built in N forked worker processes by a
    ``torch.utils.data.DataLoader`` (see the module docstring). ``get(step)`` returns the batches
    of ``step``; asked for another step than the next one (a resume, a test), it restarts the
    workers at that step. Same interface as ``Prefetcher``."""

    def __init__(self, job: Job, workers: int):
        if workers < 1:
            raise ValueError(f"WorkerBatches needs at least 1 worker, not {workers}")
        self.job, self.workers = job, int(workers)
        self.pin = job.device.type == "cuda"
        self._it = None  # the DataLoader's iterator: its workers run while it exists
        self._next: int | None = None  # the step it yields next

    def _start(self, step: int) -> None:
        import multiprocessing

        import torch
        from torch.utils.data import DataLoader

        # Before the fork: a child of a process whose Rust tokenizer has used its thread pool must
        # not use that pool (Hugging Face tokenizers warns and disables it; this says so up front).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        loader = DataLoader(StepBatches(self.job), batch_size=None, sampler=range(step, self.job.total),
                            num_workers=self.workers, collate_fn=_as_is, pin_memory=self.pin,
                            multiprocessing_context=multiprocessing.get_context("fork"),
                            worker_init_fn=_worker_init, prefetch_factor=2, persistent_workers=False,
                            timeout=float(self.job.settings.worker_timeout),  # 0: no limit
                            # the workers' base seed drawn from a generator of its own: the loop's
                            # global generator (dropout masks) must not advance when workers start
                            generator=torch.Generator().manual_seed(int(self.job.seed)))
        self._it, self._next = iter(loader), step
        log.debug("train.workers: %d worker processes building batches from step %d", self.workers, step)

    def get(self, step: int) -> list[tuple[int, dict]]:
        """The batches of ``step`` (an error of the worker that built them is raised here)."""
        if self._it is None or self._next != step:
            self.close()
            self._start(step)
        try:
            batches = next(self._it)
        except RuntimeError as e:
            pids = [getattr(w, "pid", None) for w in getattr(self._it, "_workers", ())]
            self.close()
            limit = self.job.settings.worker_timeout
            if limit and str(e).startswith("DataLoader timed out after"):  # torch's own message, not a worker's
                from .. import SentembError

                raise SentembError(
                    f"train.worker_timeout: the batches of step {step} did not come from the {self.workers} batch "
                    f"worker process(es) (pids {', '.join(map(str, pids)) or '?'}) within {limit:g} s; a worker is "
                    f"hung or far slower than a step's batches should be. Raise train.worker_timeout (0: no "
                    f"limit), or set train.workers 0 to build batches in the loop's process.") from None
            raise
        except BaseException:
            self.close()
            raise
        self._next = step + 1
        return batches

    def wait(self) -> None:
        """Nothing to wait for: the workers' tokenizers are their own (``Prefetcher.wait``)."""

    def close(self) -> None:
        """Stop and join the worker processes (idempotent)."""
        it, self._it, self._next = self._it, None, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def batch_source(job: Job) -> "Prefetcher | WorkerBatches | None":
    """What builds the loop's batches ahead: ``WorkerBatches`` with ``train.workers > 0``, else the
    ``Prefetcher`` thread with ``train.prefetch``, else nothing (built in line by ``fetch``)."""
    if job.settings.workers > 0:
        return WorkerBatches(job, job.settings.workers)
    return Prefetcher(job) if job.settings.prefetch else None


def fetch(job: Job, state: State) -> list[tuple[int, dict]]:
    """The batches of the coming optimizer step (``state.step``), from ``job.prefetch`` or built in
    line, and the time the loop was blocked getting them added to ``state`` (``data_wait``: the
    log window's, ``data_wait_total``: this process's)."""
    t0 = time.perf_counter()
    batches = job.prefetch.get(state.step) if job.prefetch is not None else micro_batches(job, state.step)
    waited = time.perf_counter() - t0
    state.data_wait += waited
    state.data_steps += 1
    state.data_wait_total += waited
    state.steps_run += 1
    return batches
