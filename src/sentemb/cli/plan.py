"""``sentemb`` commands of ``sentemb.ops.plan``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ..ops.plan import DEFAULT_GPU, DEFAULT_MARGIN, DEFAULT_MFU, GPU_MEMORY_GB, format_plan, gpu_spec, plan


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..config.load import load_config

    config = load_config(args.config)
    graphs = {"on": True, "off": False}.get(args.graphs)
    compile_ = {"on": True, "off": False}.get(args.compile)
    rows = plan(config, args.gpu, args.mfu, args.margin, lengths_from=args.lengths_from, graphs=graphs,
                compile=compile_)
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    print(format_plan(rows, gpu_spec(args.gpu)[0], args.mfu))
    return 0


def register(sub) -> None:
    p = sub.add_parser("plan", help="estimate every job's FLOPs, GPU-hours and GPU memory (CPU only, no network)")
    p.add_argument("--config", required=True)
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU the estimate is for ({', '.join(GPU_MEMORY_GB)})")
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                   help="share of the GPU's bf16 peak a training step reaches (default: measured on an H200, "
                        "0.24 for hidden 768, 0.30 for 1024)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
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
                        "graphs it changes nothing in the estimate")
    p.set_defaults(func=_cmd_plan)
