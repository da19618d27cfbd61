"""Small shared helpers: atomic writes, seeding, device selection."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from . import SentembError

import numpy as np


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it onto ``final`` only if the block succeeds.

    A crash or exception inside the block leaves no (partial) ``final`` behind, so Snakemake never
    mistakes an interrupted job for a finished one. Directories replace an existing ``final`` whole.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
        os.chmod(tmp, 0o755)
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if is_dir:
            old = None
            if final.exists():
                old = final.with_name(f".{final.name}.old-{os.getpid()}")
                shutil.rmtree(old, ignore_errors=True)
                final.rename(old)
            tmp.rename(final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
    except BaseException as e:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise SentembError(f"{final}: {os.strerror(e.errno).lower()} while writing it; nothing was written "
                               f"(the partial temporary file was removed): free space and run again") from e
        ours = {str(tmp), str(final)}  # an error of reading an input inside the block is not the output's
        if (isinstance(e, OSError) and e.errno in (errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS)
                and ({str(e.filename), str(e.filename2)} & ours or str(e.filename).startswith(str(tmp) + os.sep))):
            raise SentembError(f"{final}: cannot be written there ({os.strerror(e.errno).lower()}); nothing was "
                               "written") from e
        raise


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def read_json(path: str | os.PathLike, what: str = "results"):
    """The JSON document in ``path``; an error naming ``what`` and the file when it is missing or bad."""
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as e:  # ValueError: json's decode error, and bytes that are not UTF-8
        raise SentembError(f"cannot read {what} {path}: {e}") from None


def json_object(text: str, where: str, what: str = "a JSON object") -> dict:
    """``text`` parsed as a JSON object (a command-line value); an error naming ``where`` otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SentembError(f"{where}: not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise SentembError(f"{where}: expected {what}, got {text!r}")
    return value


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def seeded_sample(items: list, size: int | None, seed: int) -> list:
    """``size`` of ``items`` drawn without replacement by ``np.random.default_rng(seed)``, kept in their
    order; all of them when ``size`` is None or not below their number. The one draw of the configured
    corpus's ``corpus.max_sentences``, of ``sts_corpus.max_sentences`` (``sentemb.data.fetch``) and of
    the plan's length sample (``sentemb.ops.plan``): the same items, size and seed give the same sample
    wherever it is drawn."""
    if size is None or size >= len(items):
        return list(items)
    keep = np.sort(np.random.default_rng(seed).choice(len(items), size=size, replace=False))
    return [items[i] for i in keep]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) for a deterministic run."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str | None = "auto"):
    """``auto``/None: CUDA where torch sees a GPU, else the CPU; otherwise the device named, refused
    with a message when torch does not know the name or the device is not there (a CUDA device on a
    machine or build without one, an index past the GPUs)."""
    import torch

    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise SentembError(f"device {device!r}: not a device torch knows ({str(e).splitlines()[0][:120]}); "
                           "use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SentembError(f"device {device!r}: no CUDA device is visible (torch {torch.__version__}, CUDA build "
                               f"{torch.version.cuda}); use cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SentembError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return dev


def no_thread_churn() -> None:
    """Keep the libraries from starting and ending Python threads around a fork (``train.workers``:
    the batch workers are forked once the model is loaded). A thread that ends while the process
    forks can leave the interpreter's thread list locked in the child, which then hangs in
    ``os.fork``'s after-fork handler (``_PyThreadState_DeleteExcept``; seen in this project's suite on
    2026-11-28: a rank's batch worker of ``train.devices: 2`` stuck for 15 minutes after its model
    loaded). Two libraries did that here:

    - Hugging Face transformers loads a checkpoint's tensors in a thread pool that it shuts down
      without waiting (``shutdown(wait=False)``), so its threads end at any time after the load:
      ``HF_DEACTIVATE_ASYNC_LOAD=1`` loads them in the calling thread (the same tensors; a variable
      the user set is left as it is). It is set in ``os.environ``: for the rest of the process and
      the processes it starts.
    - tqdm starts a monitor thread with a progress bar (the weight loading's) and ends it when no bar
      is left: ``tqdm.monitor_interval = 0`` (a running monitor is stopped). The monitor also
      refreshes a bar that has not printed for ``maxinterval`` seconds; without it a bar prints when
      it advances, as the loop's does every step.

    Idempotent; not undone when the job closes."""
    import tqdm

    os.environ.setdefault("HF_DEACTIVATE_ASYNC_LOAD", "1")
    tqdm.tqdm.monitor_interval = 0  # read through each bar's class: subclasses too
    classes = [tqdm.tqdm]
    for cls in classes:  # a running monitor stands on the class of the bar that started it (Hugging Face's)
        classes += cls.__subclasses__()
        monitor = cls.__dict__.get("monitor")
        if monitor is not None:
            cls.monitor = None
            monitor.exit()


def use_device(device) -> "int | None":
    """Make ``device`` (a ``torch.device``) the process's current CUDA device when it names one by
    index (``train.device: cuda:1``), and return the device that was current before (None where
    nothing changed): the job puts it back when it closes. A CUDA graph is captured on a stream of
    the current device (``torch.cuda.graph`` without ``stream=``): a job on cuda:1 with cuda:0
    current would capture nothing of its step (its kernels run on cuda:1's streams) and replay an
    empty graph. ``train.devices: N`` sets each process's device itself (``sentemb.train.distributed``)."""
    import torch

    if device.type != "cuda" or device.index is None:
        return None
    before = torch.cuda.current_device()
    torch.cuda.set_device(device)
    return before


def count_lines(path: str | os.PathLike) -> int:
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
    return n


def sha256_file(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def expose_cli() -> None:
    """Put this interpreter's scripts directory (where the ``sentemb`` command is installed) on PATH,
    so workflow rules find ``sentemb`` when Snakemake runs from a virtual environment that is not
    activated (``.venv/bin/snakemake ...``). Child processes inherit it."""
    import sysconfig

    scripts = sysconfig.get_path("scripts")
    path = os.environ.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, path]) if path else scripts

