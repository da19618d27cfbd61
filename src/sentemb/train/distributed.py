"""One training job on several processes (``train.devices``), negatives across all of them.

``train.devices: N`` runs the job as N processes (``torchrun --standalone --nproc-per-node N``;
``sentemb train`` relaunches itself that way, so a Snakemake rule stays one line, and running it
under ``torchrun`` directly works too), NCCL on GPUs (one per process, ``cuda:LOCAL_RANK``) and gloo
on CPU. ``train.batch_size`` stays the paper's global batch:

* every rank builds the whole micro-batch (``Method.build_batch``, deterministic in (seed, micro):
  the batches and augmentations of the single-process run) and encodes its contiguous share of the
  sentences, ``Method.chunk(batch, lo, hi)`` with ``share(n, rank, world)``;
* the in-batch terms see every rank's embeddings: ``gather_rows`` concatenates the ranks' rows in
  rank order (= the whole batch's order, as gradient caching concatenates its chunks), with their
  gradient (``torch.distributed.nn.functional.all_gather``; SimCSE's ``cl_forward`` and
  sentence-transformers' ``gather_across_devices`` do the same). Every rank computes the same
  in-batch loss L; the backward of all_gather sums the N ranks' ∂L/∂E, so the in-batch terms are
  back-propagated as L/N;
* per-sentence terms (``Method.row_terms``) are normalised by the whole batch's counts, so the
  ranks' terms sum to the single-process term;
* gradients are **summed** over ranks once per optimizer step (``reduce_gradients``, after the last
  micro-batch; SAM's both passes each), which with the L/N above is exactly the single-process
  gradient (the usual "average" with per-sentence terms scaled by N is the same thing).

Random state: with ``train.dropout_rng: stream`` each rank reseeds its generators at every
optimizer step from (seed, step, rank) (``step_seed``), so ranks draw different masks and a resumed
job draws the masks of an uninterrupted one without saving N generator states; with ``keyed`` the
masks are those of the single-process run. Only rank 0 writes outputs, saves states, logs to MLflow
and evaluates on STS-B dev; its dev score is broadcast so that every rank keeps the same history and
best checkpoint decision.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from .. import SentembError

log = logging.getLogger(__name__)


def world_size() -> int:
    """Processes of this job (1 outside ``torchrun``)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(devices: int, device_setting: str, where: str) -> str:
    """Join the job's process group when ``devices`` > 1 (this process must run under torchrun with
    that many processes); returns the device this rank trains on (``device_setting`` with
    ``cuda`` made ``cuda:LOCAL_RANK``)."""
    import torch
    import torch.distributed as dist

    if devices == 1:
        return device_setting
    if not under_torchrun():
        raise SentembError(f"{where}: train.devices is {devices}: run it with `sentemb train` (which starts "
                           f"`torchrun --standalone --nproc-per-node {devices}` itself) or under torchrun")
    world = int(os.environ["WORLD_SIZE"])
    if world != devices:
        raise SentembError(f"{where}: train.devices is {devices} but torchrun started {world} processes")
    local = int(os.environ["LOCAL_RANK"])
    cuda = device_setting.startswith("cuda") or (device_setting == "auto" and torch.cuda.is_available())
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=torch.device(device) if cuda else None)
    return device


def share(n: int, r: int, world: int) -> tuple[int, int]:
    """Sentences ``[lo, hi)`` of a micro-batch of ``n`` that rank ``r`` encodes: contiguous, sizes
    differing by at most one (the first ``n % world`` ranks take one more)."""
    base, extra = divmod(n, world)
    lo = r * base + min(r, extra)
    return lo, lo + base + (1 if r < extra else 0)


def gather_rows(t: "torch.Tensor", with_grad: bool = True, sizes: list[int] | None = None
                ) -> tuple["torch.Tensor", list[int]]:
    """Every rank's ``t`` concatenated along dim 0 in rank order, and each rank's row count. Ranks
    may hold different numbers of rows (padded to the largest for the collective). A floating
    tensor that requires grad is gathered with its gradient (the backward sums every rank's
    ∂/∂(its rows)). ``sizes``: every rank's row count when the caller knows them (``share_sizes``),
    so that nothing is read on the host (``train.graphs``); else they are exchanged."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if sizes is None:
        n = torch.tensor([t.size(0)], device=t.device)
        got = [torch.zeros_like(n) for _ in range(world)]
        dist.all_gather(got, n)
        sizes = [int(s) for s in got]
    top = max(max(sizes), 1)
    pad = t
    if t.size(0) < top:
        pad = torch.cat([t, t.new_zeros((top - t.size(0), *t.shape[1:]))], 0)
    if with_grad and t.is_floating_point() and t.requires_grad:
        from torch.distributed.nn.functional import all_gather

        parts = list(all_gather(pad.contiguous()))
    else:
        parts = [torch.empty_like(pad) for _ in range(world)]
        dist.all_gather(parts, pad.detach().contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes)], 0), sizes


def share_sizes(t: "torch.Tensor", n: int, rank: int, world: int) -> list[int]:
    """Every rank's row count of a tensor like ``t``, this rank's rows of its share of a micro-batch
    of ``n`` sentences (``share``), ``t.size(0) // share`` rows per sentence: known without a
    collective."""
    lo, hi = share(n, rank, world)
    per = t.size(0) // max(hi - lo, 1)
    return [per * (b - a) for a, b in (share(n, r, world) for r in range(world))]


def sum_scalars(values: dict, same_keys: bool = False) -> dict:
    """{name: scalar tensor} summed over ranks; a name some rank lacks (a term without rows in its
    share) counts 0 there. Keys in the order of their first appearance on the lowest rank.
    ``same_keys``: every rank holds the same names in the same order (``train.graphs``: nothing
    exchanged on the host)."""
    import torch
    import torch.distributed as dist

    if same_keys:
        keys = list(values)
    else:
        names: list = [None] * dist.get_world_size()
        dist.all_gather_object(names, list(values))
        keys = list(dict.fromkeys(k for ks in names for k in ks))
    if not keys:
        return {}
    device = next(iter(values.values())).device if values else _device()
    flat = torch.stack([values[k].detach().float().reshape(()) if k in values else torch.zeros((), device=device)
                        for k in keys])
    dist.all_reduce(flat)
    return dict(zip(keys, flat.unbind(0)))


def _device():
    import torch
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def reduce_gradients(params) -> None:
    """Sum ``.grad`` over ranks (flattened into one buffer). A parameter with a gradient on some
    rank only (a term without rows in another rank's share) gets zeros elsewhere first; one with
    no gradient anywhere keeps None (the optimizer skips it, as the single-process run does)."""
    import torch
    import torch.distributed as dist

    params = [p for p in params if p.requires_grad]
    if not params:
        return
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    live = [p for p, h in zip(params, has.tolist()) if h]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for dtype in sorted({p.grad.dtype for p in live}, key=str):
        group = [p for p in live if p.grad.dtype == dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        offset = 0
        for p in group:
            k = p.grad.numel()
            p.grad.copy_(flat[offset : offset + k].view_as(p.grad))
            offset += k


def broadcast(obj):
    """Rank 0's ``obj`` on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def step_seed(seed: int, step: int, r: int) -> int:
    """The generator seed of rank ``r`` at optimizer step ``step`` (``train.dropout_rng: stream``)."""
    from ..model.dropout import mix

    return mix(seed, step, r, 0x5E17)


def launch(devices: int, argv: list[str]) -> int:
    """Run ``sentemb <argv>`` as ``devices`` processes under ``torchrun --standalone`` (a free
    rendezvous port, one node) and return its exit status. The children inherit the environment
    (``CUDA_VISIBLE_DEVICES`` lists the job's GPUs) but not the GPU-slot request: this process has
    claimed the slots already."""
    env = {k: v for k, v in os.environ.items() if k != "SENTEMB_GPU_SLOTS"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}",
           "-m", "sentemb", *argv]
    if "OMP_NUM_THREADS" not in env:  # torchrun would set 1: give each process its share of the cores
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // devices))
    log.info("train.devices %d: %s", devices, " ".join(cmd))
    p = subprocess.Popen(cmd, env=env)
    try:
        return p.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM here: torchrun stops its ranks (each in a session of its
        import signal          # own, out of reach of a signal to this process group), then this one goes

        p.send_signal(signal.SIGTERM)  # torchrun passes it on, and kills a rank still alive 30 s later
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise


def relaunch(command: str, args, devices: int, what: str) -> None:
    """``sentemb <command>`` (train, pretrain: ``--run-config``, ``--output-dir`` and their flags
    from ``args``) run again as ``devices`` processes (``launch``); raises naming ``what`` when they
    fail."""
    argv = [command, "--run-config", str(args.run_config), "--output-dir", str(args.output_dir)]
    argv += (["--options", str(args.options)] if getattr(args, "options", None) else [])
    argv += (["--device", args.device] if getattr(args, "device", None) else [])
    argv += (["--no-track"] if getattr(args, "no_track", False) else []) + (["--quiet"] if args.quiet else [])
    rc = launch(devices, argv)
    if rc:
        raise SentembError(f"{what}: the {devices} processes of train.devices (torchrun) exited with status {rc}; "
                           "the first error is above")


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
