"""``sentemb`` commands of ``sentemb.ops.gpucheck``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .. import SentembError
from ..ops.gpucheck import _row, check, methods_to_check
from .argtypes import non_negative_int, positive_int


def _cmd_gpu_check(args: argparse.Namespace) -> int:
    import torch

    if args.cpu_gemms and not args.cpu:
        raise SentembError("--cpu-gemms: only with --cpu (a GPU multiplies bf16 in its own units)")
    if not args.cpu and not torch.cuda.is_available():
        print("sentemb gpu-check: no CUDA device is visible (torch.cuda.is_available() is False; torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}). Run it on a GPU node, e.g. "
              "`srun --gpus=1 sentemb gpu-check`, with a CUDA build of torch in the environment (`--cpu` runs the "
              "same checks on this CPU at a toy size: a test of the command, not figures for a GPU).", file=sys.stderr)
        return 2
    if args.cpu and not (args.method and args.no_dag and args.no_epoch):
        print("sentemb gpu-check --cpu: the GPU's rows at a toy size on this CPU, a test of the command (its figures "
              "say nothing of a GPU). Every method, the tiny DAG and the one-epoch run take a long while on a "
              "laptop; the quick try is --method simcse --no-dag --no-epoch.", file=sys.stderr,
              flush=True)
    from ..ops.flops import CPU_GEMMS_ENV
    gemms = None
    if args.cpu:
        env = os.environ.get(CPU_GEMMS_ENV) or None
        if args.cpu_gemms and env and env != args.cpu_gemms:
            raise SentembError(f"--cpu-gemms {args.cpu_gemms} and {CPU_GEMMS_ENV}={env} disagree: give one")
        gemms = args.cpu_gemms or env or "fp32"
    from ..ops.benchmark import _method_args as parse_method_args
    from ..ops.shapes import ARCHITECTURES, write_model_dir

    shared = Path(args.shared)
    minilm = shared / "models" / "all-MiniLM-L6-v2"
    model = Path(args.model) if args.model else minilm
    sts_model = Path(args.sts_model) if args.sts_model else (minilm if args.model in ARCHITECTURES else model)
    corpus = Path(args.corpus) if args.corpus else shared / "data" / "wiki1m_head.txt"
    senteval = Path(args.senteval) if args.senteval else shared / "data" / "senteval"
    for what, p in (("--model", model), ("--sts-model", sts_model), ("--corpus", corpus), ("--senteval", senteval)):
        if not p.exists() and not (what == "--model" and args.model in ARCHITECTURES):
            raise SentembError(f"{what}: {p} does not exist (give it, or --shared pointing at a shared/ folder)")
    if args.model in ARCHITECTURES:  # random weights at the published shape (the speed and memory are the same)
        os.environ.setdefault("SENTEMB_SHARED", str(shared))  # its BERT tokenizer: the mirror's MiniLM vocabulary
        tmp = tempfile.mkdtemp(prefix="sentemb-gpucheck-model-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # at exit, also after Ctrl-C or SIGTERM
        model = write_model_dir(args.model, Path(tmp) / args.model)
    config_file = Path(model) / "config.json"
    if config_file.is_file():  # a --max-len past the model's positions fails inside the first row otherwise
        mcfg = json.loads(config_file.read_text("utf-8"))
        positions = mcfg.get("max_position_embeddings")
        if isinstance(positions, int) and mcfg.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
            positions -= 2  # RoBERTa's positions start after its padding index
        if isinstance(positions, int) and args.max_len > positions:
            raise SentembError(f"--max-len {args.max_len}: the model ({model}) has {positions} positions")
    from ..ops.hostcheck import PARTS, check_environment

    unknown = [x for x in (args.host_parts or "").split(",") if x and x not in PARTS]
    if unknown:
        raise SentembError(f"--host-parts: {', '.join(unknown)} unknown (known: {', '.join(PARTS)})")
    host = args.host or args.only_host
    if args.host_parts and not host:
        raise SentembError("--host-parts chooses among the host rows: give --host (with the other rows) or --only-host")
    parts = tuple(x for x in args.host_parts.split(",") if x) if args.host_parts else PARTS[:4]
    _check_outputs(args)
    tasks = _check_senteval(senteval, args.sts_tasks, classic=not args.only_host, dev=host and "dev_eval" in parts)
    if host:
        check_environment(parts)  # SENTEMB_TUNE / _PROFILE / _TUNE_BATCHES: before any row, not after them
    device = "cpu" if args.cpu else "cuda"
    batches = tuple(args.batch_size or ((8,) if args.cpu else (64, 512)))
    from ..methods import load_method_modules

    if args.config:  # its method_modules (the user's methods) are imported when it is validated
        from ..config.load import load_config

        load_config(args.config)
    load_method_modules(args.method_module or None, "--method-module")
    methods = methods_to_check(args.method)
    if args.rows_json:  # written after every measured step from here on
        from ..ops.plan_check import record_to

        record_to(args.rows_json, _rows_header(device, corpus))
    t = time.perf_counter()
    os.environ.setdefault("SENTEMB_SHARED", str(shared))  # the NLTK data of PaSeR's RAKE input, MiniLM's vocabulary
    with _cpu_gemms(gemms):
        lines = check(model, corpus, senteval, device, batches, args.steps, args.warmup,
                      args.max_len, methods, not args.no_dag, Path(__file__).resolve().parents[3],
                      tasks, sts_model,
                      parse_method_args(args.method_args, list(methods)), None if args.no_epoch else args.epoch_batch,
                      host=host, classic=not args.only_host,
                      host_parts=parts if args.host_parts else None)
    if gemms:
        lines.append(_row("CPU bf16 matrix products", "fp32 GEMMs of the bf16 inputs" if gemms == "fp32" else
                          "this CPU's own bf16 kernels", "--cpu-gemms: fp32 (default) is a native bf16 GEMM's result up "
                          "to the order of its sums; native is ~200x slower in a backward on a CPU without bf16 units"))
    lines.append(_row("gpu-check wall time", f"{time.perf_counter() - t:.0f} s", ""))
    if args.rows_json:
        from ..ops.plan_check import RECORDED, record_complete

        record_complete()
        print(f"{len(RECORDED)} measured steps in {args.rows_json} (sentemb plan-check {args.rows_json})",
              file=sys.stderr)
    if args.plan_check:
        lines += ["", *_plan_check(args.config, device, corpus)]
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")
        Path(args.output).with_suffix(".json").write_text(json.dumps({"lines": lines}, indent=2))
    return 0


@contextlib.contextmanager
def _cpu_gemms(gemms: str | None):
    """The rows under ``--cpu-gemms``: ``SENTEMB_CPU_BF16_GEMMS`` set for their subprocesses (sentemb
    train, evaluate) and put back after them, and this process's products as the variable says
    (``cpu_gemms_from_env``, as ``sentemb``'s entry point reads it)."""
    from unittest import mock

    from ..ops.flops import CPU_GEMMS_ENV, cpu_gemms_from_env

    if gemms is None:
        yield
        return
    with mock.patch.dict(os.environ, {CPU_GEMMS_ENV: gemms}), cpu_gemms_from_env():
        yield


def _check_outputs(args) -> None:
    """``--output`` (and the ``<output>.json`` beside it) and ``--rows-json``: their folders exist and
    no two of them are one file, checked before any row runs."""
    files = {}
    if args.output:
        files["--output"] = Path(args.output)
        files["--output's JSON twin"] = Path(args.output).with_suffix(".json")
    if args.rows_json:
        files["--rows-json"] = Path(args.rows_json)
    for what, f in files.items():
        if f.is_dir():
            raise SentembError(f"{what}: {f} is a directory; give a file name")
        if not f.parent.is_dir():
            raise SentembError(f"{what}: the folder {f.parent} does not exist")
    if args.output and Path(args.output).suffix == ".json":
        raise SentembError(f"--output {args.output}: the table is Markdown, and its lines go to the name with .json "
                           "beside it, the same file here; give --output a name ending in .md")
    seen: dict = {}
    for what, f in files.items():
        key = f.resolve()
        if key in seen:
            raise SentembError(f"{what} and {seen[key]} are the same file, {f} (--output FILE also writes "
                               f"FILE's name with .json); give --rows-json another name")
        seen[key] = what


def _check_senteval(senteval: Path, sts_tasks: str | None, classic: bool, dev: bool) -> tuple[str, ...] | None:
    """The STS tasks of the fp32/bf16 rows (``--sts-tasks``; None: all), their files read once before any
    row runs where those rows run (``classic``), and STS-B dev where the host rows evaluate it (``dev``)."""
    from ..evaluate.senteval import TASKS, load_task

    tasks = tuple(t for t in sts_tasks.split(",") if t) if sts_tasks else None
    unknown = [t for t in tasks or () if t not in TASKS]
    if unknown:
        raise SentembError(f"--sts-tasks: {', '.join(unknown)} unknown (known: {', '.join(TASKS)})")
    if classic:
        for t in tasks or TASKS:
            load_task(senteval, t)
    if dev or classic:
        load_task(senteval, "STSBenchmark", "dev")
    return tasks


def _plan_check(config: str | None, device: str, corpus: Path) -> list[str]:
    """``sentemb plan-check`` of the steps this run measured (``--plan-check``): the plan's price of
    each beside it, priced on this machine's CPU after the rows (``config``: the backbones the model
    is found among; default the repository's ``config/config.yaml``). Printed as it is made."""
    from ..config.load import load_config
    from ..ops.gpus import GPUS
    from ..ops.plan import DEFAULT_GPU
    from ..ops.plan_check import RECORDED, Measured, backbone_for, format_check, price_measured

    cfg = load_config(config or Path(__file__).resolve().parents[3] / "config" / "config.yaml")
    header = _rows_header(device, corpus)
    rows, skipped = [], []
    for r in RECORDED:
        try:
            backbone_for(cfg, r["model"], r["what"])
        except SentembError as e:
            skipped.append(str(e))
            continue
        rows.append(Measured(**r))
    gpu = header["gpu"] if header["gpu"] in GPUS else DEFAULT_GPU
    out = format_check(price_measured(rows, cfg, corpus, gpu), gpu, header, corpus).splitlines() if rows else \
        ["sentemb plan-check: no measured step to price"]
    if rows and device == "cpu":  # gpu-check --cpu: a CPU's step against a GPU's price says nothing
        out = [("no verdict: measured on this CPU (--cpu); the plan prices a GPU's step" if "steady rows within" in x
                else x.replace("OFF by more than", "(CPU) off by more than").replace("| within |", "| (CPU) |"))
               for x in out]
        out.insert(1, f"(this device, {header['device']}, is a CPU: priced for {gpu} to show the pricing runs, "
                      "not to judge it)")
    elif rows and header["gpu"] not in GPUS:
        out.insert(1, f"(this device, {header['device']}, is none of sentemb.ops.gpus: priced for {gpu})")
    out += [f"not priced: {x}" for x in dict.fromkeys(skipped)]
    print("\n".join(out), flush=True)
    return out


def _rows_header(device: str, corpus: Path) -> dict:
    """The header of ``--rows-json`` (``sentemb plan-check``): the GPU (a ``sentemb.ops.gpus`` name when
    the device's name has one), torch, the checkout's commit and the corpus (found again by its file
    name under a mirror's ``data/``)."""
    import subprocess

    import torch

    from ..ops.gpus import GPUS

    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu x{torch.get_num_threads()}"
    gpu = next((k for k in sorted(GPUS, key=len, reverse=True) if k in name.upper()), None)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    from ..ops.plan_check import corpus_identity

    return {"source": "sentemb gpu-check " + " ".join(sys.argv[2:]), "gpu": gpu, "device": name,
            "torch": torch.__version__, "commit": commit, "corpus": f"data/{corpus.name}", **corpus_identity(corpus)}


def register(sub) -> None:
    p = sub.add_parser("gpu-check", help="measure on the visible CUDA device what CPU machines cannot (paste the table)")
    p.add_argument("--shared", default=str(Path.cwd().parent / "shared"),
                   help="a folder laid out like shared/ (models/all-MiniLM-L6-v2, data/wiki1m_head.txt, data/senteval)")
    p.add_argument("--model", default=None,
                   help="model directory, or an architecture name (bert-base-uncased, bert-large-uncased, roberta-base, "
                        "roberta-large): random weights at the published shape (default: the mirror's MiniLM)")
    p.add_argument("--sts-model", default=None,
                   help="real weights for the STS rows (fp32/bf16, one epoch): default --model, or the mirror's MiniLM "
                        "when --model is an architecture name")
    p.add_argument("--method-args", action="append", default=[], metavar="NAME=JSON",
                   help="arguments of one method, e.g. 'paser={\"eda\": \"rs\"}' (repeatable)")
    p.add_argument("--epoch-batch", type=positive_int, default=64, help="batch of the one-epoch SimCSE run (default 64)")
    p.add_argument("--no-epoch", action="store_true", help="skip the one-epoch SimCSE run")
    p.add_argument("--corpus", default=None,
                   help="training sentences, one per line (default: <--shared>/data/wiki1m_head.txt)")
    p.add_argument("--senteval", default=None, help="SentEval data root (default: <--shared>/data/senteval)")
    p.add_argument("--batch-size", type=positive_int, action="append", help="default 64 and 512")
    p.add_argument("--method", action="append", metavar="NAME",
                   help="a registered method (repeatable; default every one: the six and imported plug-ins)")
    p.add_argument("--config", default=None, help="a config whose method_modules (the user's methods) to import; "
                                                  "with --plan-check, whose backbones the model is among")
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module with @register_method classes (repeatable)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per training row (default: %(default)s)")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed warm-up steps before them (default: %(default)s)")
    p.add_argument("--max-len", type=positive_int, default=32, help="training truncation in tokens (default: %(default)s)")
    p.add_argument("--no-dag", action="store_true", help="skip the tiny DAG")
    p.add_argument("--sts-tasks", default=None, help="comma-separated STS tasks of the fp32/bf16 comparison (default all 7)")
    p.add_argument("--output", default=None, help="also write the table (Markdown) here, and its lines as JSON "
                                                  "beside it (the name with .json)")
    p.add_argument("--plan-check", action="store_true",
                   help="after the table, price every training step measured as sentemb plan does and print the "
                        "plan's error on each (sentemb plan-check; the model found among --config's backbones, "
                        "default config/config.yaml)")
    p.add_argument("--rows-json", default=None,
                   help="also write every training step measured (its settings and ms/step) here, after each row: "
                        "sentemb plan-check FILE prices them as sentemb plan does")
    p.add_argument("--host", action="store_true",
                   help="also the host rows (sentemb.ops.hostcheck): first steps with train.buckets none/auto, "
                        "train.workers 0/2, STS-B dev evaluation fp32/bf16, and a CUDA-graph probe of the step")
    p.add_argument("--only-host", action="store_true", help="only the host rows (and the methods' inputs they need)")
    p.add_argument("--host-parts", default=None,
                   help="comma-separated parts of the host rows (default first_steps,workers,graph,dev_eval; also "
                        "graph_methods: the graph probe of every checked method at B 64; compile: torch.compile "
                        "reduce-overhead of SimCSE's step; graphed: the loop's step eager and as CUDA graphs; tune: "
                        "SimCSE's compiled graphed step with each switch aimed at issue 37's targets (SENTEMB_TUNE, "
                        "SENTEMB_TUNE_BATCHES choose the rows); profile: steps under torch.profiler, busy against "
                        "wall time and the top kernels: SimCSE's compiled graphed B 512 counter step whole and in "
                        "chunks of 128, its compiled step with each attention kernel, ArcCSE's paper step with each "
                        "triplet_pass (SENTEMB_PROFILE chooses SimCSE steps instead); docs/plan-and-benchmarks.md); "
                        "the graph probe runs at each --batch-size")
    p.add_argument("--cpu", action="store_true",
                   help="run the same checks on the CPU at batch 8 (tests; the figures mean nothing for a GPU; a "
                        "toy only with the test's reduced flags, docs/plan-and-benchmarks.md)")
    p.add_argument("--cpu-gemms", choices=("fp32", "native"), default=None,
                   help="with --cpu: the bf16 rows' matrix products as fp32 GEMMs of the bf16 inputs (fp32, the "
                        "default: a CPU without bf16 units, e.g. AVX2, emulates them ~200x slower in a backward) or "
                        "the CPU's own bf16 kernels (native); sets SENTEMB_CPU_BF16_GEMMS for the rows' subprocesses")
    p.set_defaults(func=_cmd_gpu_check)
