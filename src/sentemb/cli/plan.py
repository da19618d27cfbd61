"""``sentemb`` commands of ``sentemb.ops.plan``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .. import SentembError

from ..ops.plan import (DEFAULT_GPU, DEFAULT_MARGIN, DEFAULT_MFU, GPU_MEMORY_GB, default_count_store, format_plan, gpu_spec,
                        plan)
from .argtypes import positive_int, non_negative_float, positive_float, share


THREADS_HELP = ("torch's CPU threads for the counts (default: torch's, one per core). On a machine other jobs "
                "load, 1 is faster: the threads of each small operation wait on each other (the demo's plan, two "
                "busy processes beside it on 2 cores: 60 s with 2 threads, 36 s with 1; idle, 20.5 and 20.9 s)")


def _set_threads(n: int | None) -> None:
    """``--threads``: torch's intra-op threads while the plan counts (None: left as they are)."""
    if n is None:
        return
    if n < 1:
        raise SentembError(f"--threads: {n}; give 1 or more")
    import torch

    torch.set_num_threads(n)


def _quiet_counting(verbose: bool) -> None:
    """The plan counts each job on models, corpora and inputs of its own (random weights, a few lines):
    their loading bars and the warnings the methods and the loop give about them (an InfoCSE model
    "has no MLM head", a shape captured) concern none of the user's files, so only the plan's own
    progress and its warnings are shown; ``sentemb -v`` shows everything."""
    if verbose:
        return
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    for name in ("sentemb.methods", "sentemb.train", "sentemb.stats", "sentemb.data", "sentemb.model"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..config.load import load_config

    config = load_config(args.config)
    _quiet_counting(args.verbose)
    _set_threads(args.threads)
    graphs = {"on": True, "off": False}.get(args.graphs)
    compile_ = {"on": True, "off": False}.get(args.compile)
    store = default_count_store() if not args.count_cache else (
        None if args.count_cache.lower() == "none" else Path(args.count_cache))
    rows = plan(config, args.gpu, args.mfu, args.margin, lengths_from=args.lengths_from, graphs=graphs,
                compile=compile_, count_store=store)
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    print(format_plan(rows, gpu_spec(args.gpu)[0], args.mfu))
    return 0


def _cmd_plan_check(args: argparse.Namespace) -> int:
    from ..config.load import load_config
    from ..ops.plan_check import format_check, load_measured, price_measured, resolve_corpus, verdict

    from ..methods import load_method_modules

    config = load_config(args.config)  # its method_modules are imported as it is validated
    load_method_modules(args.method_module or None, "--method-module")  # rows of a plug-in method
    _quiet_counting(args.verbose)
    _set_threads(args.threads)
    header, rows = load_measured(args.rows)
    if not rows:
        raise SentembError(f"{args.rows}: no rows")
    if header.get("complete") is False:  # older files have no such key: nothing is said of them
        print(f"sentemb plan-check: {args.rows} holds the rows of a gpu-check that did not end normally (a time "
              "limit, an error): the rows it measured are priced, the others were never run", file=sys.stderr)
    if not args.gpu and not header.get("gpu"):
        raise SentembError(f"{args.rows}: its device ({header.get('device', 'not named')}) is none of the GPUs the plan "
                           f"knows ({', '.join(GPU_MEMORY_GB)}); give --gpu")
    try:
        gpu = gpu_spec(args.gpu or header["gpu"])[0]
    except SentembError as e:  # named by where the name came from: the option, or the rows file
        raise SentembError(str(e) if args.gpu else f"{args.rows}: its \"gpu\" {header['gpu']!r}: "
                           f"{str(e).split(': ', 1)[1]}; give --gpu") from None
    corpus = resolve_corpus(args.corpus, header, Path(args.rows))
    priced = price_measured(rows, config, corpus, gpu)
    print(format_check(priced, gpu, header, corpus, args.tolerance))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{**dataclasses.asdict(r), "plan_ms": None if isinstance(s, str) else round(1000 * s, 3),
              "error": None if isinstance(s, str) else round(verdict(r.step_ms(), 1000 * s)[0], 4),
              "not_priced": s if isinstance(s, str) else None,
              "widths": {str(w): f for w, f in p.get("count", {}).items()}} for r, s, p in priced], indent=1))
    bad = [r for r, s, _ in priced
           if isinstance(s, str) or (r.steady and not verdict(r.step_ms(), 1000 * s, args.tolerance)[1])]
    return 1 if args.strict and bad else 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="estimate every job's FLOPs, GPU-hours and GPU memory (CPU only, no network)")
    p.add_argument("--config", required=True, help="the configuration to estimate (YAML)")
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU the estimate is for ({', '.join(GPU_MEMORY_GB)})")
    p.add_argument("--mfu", type=share, default=DEFAULT_MFU,
                   help="share of the GPU's bf16 peak a training step reaches (default: measured on an H200, "
                        "0.24 for hidden 768, 0.30 for 1024)")
    p.add_argument("--margin", type=positive_float, default=DEFAULT_MARGIN,
                   help="flag a job whose runtime or mem_mb request is below the estimate x this")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--lengths-from", default=None,
                   help="a text file of corpus sentences to price every training job's lengths at (default: the "
                        "token cache, the prepared corpus, the mirror's corpus or its head sample; see "
                        "docs/plan-and-benchmarks.md)")
    p.add_argument("--graphs", choices=("config", "on", "off"), default="config",
                   help="price the training steps with train.graphs as each run sets it (config), or as if every "
                        "run set it on or off: the CUDA-graphed step's measured floor (docs/plan-and-benchmarks.md). "
                        "A run with train.fuse_micro_batches > 1 keeps it (each fused group one graph)")
    p.add_argument("--compile", choices=("config", "on", "off"), default="config",
                   help="the same for train.compile: a graphed step with compile is priced at the fused step's "
                        "measured floor and MFU by its train.attention kernel (width 768; docs/plan-and-benchmarks.md); "
                        "a fused run keeps its fused micro-batches (the group's encoder forward compiled); without "
                        "graphs, the compiled step launched from the host is priced at its measured floor where one "
                        "was measured (width 768, attention auto or sdpa), else as eager")
    p.add_argument("--threads", type=positive_int, default=None, help=THREADS_HELP)
    p.add_argument("--count-cache", default=None, metavar="DIR",
                   help="where the step counts are kept and reused by the next plan: a count is reused only for the "
                        "same counted job (shape, width, train settings, method arguments), stats settings, method "
                        "file, sentemb sources and library versions (sentemb.ops.plan.CountStore); batch building is "
                        "timed anew every time. Default $SENTEMB_PLAN_CACHE, else $XDG_CACHE_HOME/sentemb/plan-counts "
                        "or ~/.cache/sentemb/plan-counts; 'none': count everything, keep nothing")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("plan-check", help="sentemb plan's step estimate against steps measured on a GPU "
                                          "(gpu-check --rows-json, docs/gpu/*.rows.json)")
    p.add_argument("rows", help="a measured-rows JSON file (sentemb gpu-check --rows-json; docs/gpu/*.rows.json)")
    p.add_argument("--config", default="config/config.yaml", help="the configuration whose backbones the rows name")
    p.add_argument("--gpu", default=None, help="GPU to price for (default: the file's gpu)")
    p.add_argument("--corpus", default=None,
                   help="the corpus the rows were measured on (default: the file's corpus, found in the mirror or "
                        "shared/)")
    p.add_argument("--tolerance", type=non_negative_float, default=0.25,
                   help="a steady row is within when |plan - measured| <= this x measured (issue 37: 0.25)")
    p.add_argument("--json", default=None, help="also write each row with the plan's figure here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a steady row is off or a row cannot be priced")
    p.add_argument("--threads", type=positive_int, default=None, help=THREADS_HELP)
    p.add_argument("--method-module", action="append", default=[],
                   help="a Python file or module with @register_method classes, for rows of a plug-in method "
                        "(repeatable)")
    p.set_defaults(func=_cmd_plan_check)
