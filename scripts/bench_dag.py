"""How long Snakemake takes to parse the workflow and build the DAG: ``snakemake -n`` on each config.

Every ``snakemake`` invocation pays this before its first job starts (a dry run, a real run, and on a
cluster every job's own Snakemake, which parses the Snakefile again). It prints one table row per
config: its jobs, and the wall seconds of ``snakemake -n --configfile=CONFIG all`` (median of ``--repeat`` runs) with
this checkout's sources and, with ``--ref DIR``, with another checkout's (e.g. a ``git worktree`` of
an older commit: its ``src`` goes first on ``PYTHONPATH``, its Snakefile is read)::

    .venv/bin/python scripts/bench_dag.py
    git worktree add /tmp/ref/main 95e312a && ln -s "$PWD/../shared" /tmp/ref/shared
    .venv/bin/python scripts/bench_dag.py --ref /tmp/ref/main

The DAG is the same whatever the cache state: nothing is run, and ``results/`` need not exist.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dry_run(checkout: Path, config: str) -> tuple[float, int]:
    """(wall seconds, jobs) of one ``snakemake -n`` in ``checkout`` with its own sources."""
    path = [str(checkout / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", f"--configfile={config}", "all"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} in {checkout} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    total = re.search(r"^total\s+(\d+)", out.stdout + out.stderr, re.M)
    return seconds, int(total.group(1)) if total else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["config/demo.yaml", "config/config.yaml"],
                    help="config files, relative to the checkout")
    ap.add_argument("--repeat", type=int, default=3, help="runs per config and checkout (the median is printed)")
    ap.add_argument("--ref", type=Path, default=None, help="another checkout to time beside this one")
    args = ap.parse_args()
    checkouts = [("this checkout", ROOT)] + ([("--ref", args.ref.resolve())] if args.ref else [])
    head = "| config | jobs | " + " | ".join(f"{name} (s)" for name, _ in checkouts) + " |"
    print(head)
    print("|" + " --- |" * (2 + len(checkouts)))
    for config in args.configs:
        cells, jobs = [], None
        for _, checkout in checkouts:
            runs = [dry_run(checkout, config) for _ in range(args.repeat)]
            jobs = runs[0][1]
            cells.append(f"{statistics.median(s for s, _ in runs):.1f}")
        print(f"| {config} | {jobs} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
