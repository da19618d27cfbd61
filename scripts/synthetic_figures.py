#!/usr/bin/env python
"""A configuration's figures on synthetic per-run results, to look at them before anything is trained
(issue 29 §2).

Writes plausible result files for every job of the configuration (every run × backbone × seed, study
points included: ``train.json`` with an STS-B dev history, ``eval_sts.json`` with the seven STS tasks and
the geometry where the run is evaluated, ``eval_transfer.json`` where it runs the transfer tasks; every
untrained baseline), builds the paper table from them and ``config/paper_results.yaml``, then draws the
report figures (``sentemb.report.figures.draw_figures``) and every study's figure
(``sentemb.report.studies.draw_study_figure``) and saves them as the workflow does (PNG, SVG and PDF). The numbers are made up (fixed random seed): only the figures' layout means
anything. ``--check`` also runs the mechanical checks of tests/figure_checks.py on every figure.

    .venv/bin/python scripts/synthetic_figures.py                              # config/config.yaml
    .venv/bin/python scripts/synthetic_figures.py --config config/demo.yaml --out /tmp/figs_demo_synth --check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

#: a made-up STS Avg per method (the papers' neighbourhood), and each task's offset from the Avg
METHOD_AVG = {"simcse": 76.3, "sarcse": 77.4, "una": 77.0, "paser": 77.6, "infocse": 77.3, "arccse": 77.8}
TASK_OFFSET = {"STS12": -7.0, "STS13": 5.0, "STS14": -1.5, "STS15": 5.5, "STS16": 2.5, "STSBenchmark": 2.5,
               "SICKRelatedness": -7.0}
BACKBONE_SHIFT = {"roberta-base": 0.4, "bert-large-uncased": 1.8, "roberta-large": 2.3}
BASELINE_AVG = {"avg_static_last": 56.7, "avg_first_last": 59.0, "avg": 52.6, "cls_before_pooler": 31.4,
                "cls": 29.2, "avg_top2": 58.0}


def _unit(*key) -> float:
    """A fixed pseudo-random number in [-1, 1] per key (stable across runs of the script)."""
    h = hashlib.sha256(json.dumps(key, default=str).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**63 - 1.0


def _point_effect(run: dict, study: dict | None) -> float:
    """A smooth made-up effect of a study point's value(s): a bump around the middle of the grid."""
    if not study or not run["point"]:
        return 0.0
    effect = 0.0
    for key, value in run["point"].items():
        values = [p["point"][key] for p in study["expanded"] if key in p["point"]]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not nums or not isinstance(value, (int, float)) or isinstance(value, bool) or max(nums) == min(nums):
            continue
        lo, hi = min(nums), max(nums)
        if lo > 0 and hi / lo >= 10:  # a log grid: position by the logarithm
            t = (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo)) if value > 0 else -0.3
        else:
            t = (value - lo) / (hi - lo)
        effect += 2.0 - 6.0 * (t - 0.45) ** 2
    return effect


def run_avg(run: dict, study: dict | None) -> float:
    base = METHOD_AVG.get(run["method"], 76.0) + BACKBONE_SHIFT.get(run["backbone"], 0.0)
    if run["name"] != run["method"] and not run["point"]:
        base += 1.2 * _unit("variant", run["name"]) - 0.4  # an ablation: a little off the method
    return base + _point_effect(run, study)


def sts_scores(avg: float, rng: np.random.Generator, noise: float) -> dict[str, float]:
    shift = rng.normal(0, noise)
    return {t: round(float(np.clip(avg + off + shift + rng.normal(0, noise / 2), 0, 100)), 4)
            for t, off in TASK_OFFSET.items()}


def geometry(avg: float, rng: np.random.Generator, baseline: bool) -> dict:
    align = 0.45 - 0.004 * avg + rng.normal(0, 0.025) + (0.1 if baseline else 0)
    uniform = -4.2 + 0.03 * avg + rng.normal(0, 0.25) + (1.5 if baseline else 0)
    buckets = {}
    for b in range(5):
        centre = (0.9 if baseline else 0.25 + 0.14 * b) + (0.02 * b if baseline else 0)
        cos = np.clip(rng.normal(centre, 0.11 if not baseline else 0.04, 60), -1, 1)
        buckets[f"{b}-{b + 1}"] = {"n": 60, "mean": float(cos.mean()), "std": float(cos.std()),
                                   "cosines": [round(float(c), 4) for c in cos]}
    return {"align": float(align), "uniform": float(uniform), "n_align_pairs": 300, "n_uniform_sentences": 1000,
            "cosine_buckets": buckets}


def write(path: str | Path, body: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body), "utf-8")


def synthesize(config: dict) -> dict[str, list[Path]]:
    """Write every job's result files under the config's ``results_dir``; returns the file lists the
    report rules read (evals, train, transfer)."""
    from sentemb.config.load import baseline_transfer, baselines, jobs, tested, transfer_runs
    from sentemb.config.paths import Layout
    from sentemb.evaluate.transfer import TRANSFER_TASKS

    layout = Layout.of(config)
    studies = {s["name"]: s for s in config["studies"]}
    rng = np.random.default_rng(29)
    files: dict[str, list[Path]] = {"evals": [], "train": [], "transfer": []}
    seeds = {}  # the Snakefile's training jobs (sentemb.config.load.jobs), grouped by run
    for job in jobs(config):
        seeds.setdefault((job.name, job.backbone), []).append(job.seed)
    evaluated, transferred = tested(config), transfer_runs(config)
    for run in config["runs"]:
        key = (run["name"], run["backbone"])
        study = studies.get(run["study"] or "")
        avg = run_avg(run, study)
        steps = 1000 if run["backbone"].endswith("large") else 1500
        every = {**config["train"], **run["train"]}["eval_steps"]  # the run's train over the shared one
        transfer = key in transferred
        for seed in seeds[key]:
            meta = {"name": run["name"], "method": run["method"], "backbone": run["backbone"], "seed": seed}
            d = layout.run_dir(run["name"], run["backbone"], seed)
            best = avg + 4.0 + rng.normal(0, 0.5)
            history = [{"step": s, "dev_stsb": round(float(best - 7.0 * math.exp(-s / 300) + rng.normal(0, 0.3)), 4)}
                       for s in range(every, steps + 1, every)]
            write(f"{d}/train.json", {**meta, "steps": steps, "best_dev_stsb": max(h["dev_stsb"] for h in history),
                                      "best_step": max(history, key=lambda h: h["dev_stsb"])["step"], "history": history})
            files["train"].append(Path(f"{d}/train.json"))
            if key not in evaluated:
                continue
            sts = sts_scores(avg, rng, 0.6)
            write(f"{d}/eval_sts.json", {**sts, "avg": sum(sts.values()) / len(sts), "pooler": "cls_before_pooler",
                                         "geometry": geometry(avg, rng, False), "run": meta})
            files["evals"].append(Path(f"{d}/eval_sts.json"))
            if transfer:
                tr = {t: round(float(85.0 + 0.1 * (avg - 76) + rng.normal(0, 0.4) + 3 * _unit(t)), 2)
                      for t in TRANSFER_TASKS}
                write(f"{d}/eval_transfer.json", {**tr, "run": meta, "protocol": {"classifier": "pytorch"}})
                files["transfer"].append(Path(f"{d}/eval_transfer.json"))
    for backbone, pooler in baselines(config):
        d = layout.baseline_dir(backbone, pooler)
        meta = {"name": f"untrained-{pooler}", "method": "baseline", "backbone": backbone, "seed": 0}
        avg = BASELINE_AVG.get(pooler, 50.0) + BACKBONE_SHIFT.get(backbone, 0.0)
        sts = sts_scores(avg, rng, 0.0)
        write(f"{d}/eval_sts.json", {**sts, "avg": sum(sts.values()) / len(sts), "pooler": pooler,
                                     "geometry": geometry(avg, rng, True), "run": meta})
        files["evals"].append(Path(f"{d}/eval_sts.json"))
        if baseline_transfer(config):
            tr = {t: round(float(80.0 + 3 * _unit(t, pooler)), 2) for t in TRANSFER_TASKS}
            write(f"{d}/eval_transfer.json", {**tr, "run": meta, "protocol": {"classifier": "pytorch"}})
            files["transfer"].append(Path(f"{d}/eval_transfer.json"))
    return files


def paper_table(files: dict[str, list[Path]], published: Path):
    """The table ``sentemb table-paper`` writes, read back as ``sentemb figures`` reads it."""
    import pandas as pd

    from sentemb.report.paper import collect_dev, load_paper_results, table_paper
    from sentemb.evaluate.senteval import TASKS
    from sentemb.report.tables import collect
    from sentemb.evaluate.transfer import TRANSFER_TASKS

    t = table_paper(collect(files["evals"], TASKS),
                    collect(files["transfer"], [*TRANSFER_TASKS]) if files["transfer"] else None,
                    load_paper_results(published), collect_dev(files["train"]))
    with tempfile.TemporaryDirectory() as tmp:  # through a CSV, as the workflow passes it
        t.to_csv(Path(tmp) / "t.csv", index=False)
        back = pd.read_csv(Path(tmp) / "t.csv")
    return back.astype(object).where(back.notna(), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"))
    ap.add_argument("--published", default=str(REPO / "config" / "paper_results.yaml"))
    ap.add_argument("--out", default="/tmp/figs_paper", help="where the figures go (results under <out>/results)")
    ap.add_argument("--check", action="store_true", help="run tests/figure_checks.py on every figure")
    ap.add_argument("--formats", nargs="+", default=["png", "svg", "pdf"], choices=["png", "svg", "pdf"],
                    help="the files written per figure (default: all three, as the workflow)")
    args = ap.parse_args(argv)

    import matplotlib.pyplot as plt

    from sentemb import SentembError
    from sentemb.config.load import load_config
    from sentemb.report.style import save
    from sentemb.report.figures import dev_histories, draw_figures
    from sentemb.report.studies import draw_study_figure, load_published, read_values
    from sentemb.config.studies import study_inputs, study_train_inputs

    out = Path(args.out)
    cwd = os.getcwd()
    os.chdir(REPO)  # the config's relative paths (mirror, corpora) are the repository's
    try:
        config = load_config(args.config)
    finally:
        os.chdir(cwd)
    config["results_dir"] = str(out / "results")
    files = synthesize(config)
    try:
        paper = paper_table(files, Path(args.published))
    except SentembError as e:
        print(f"no paper table ({e}): paper_vs_reproduced is drawn empty", file=sys.stderr)
        paper = None
    try:
        published = load_published(args.published)
    except SentembError as e:
        print(f"no published study values ({e})", file=sys.stderr)
        published = {}
    checks = None
    if args.check:
        sys.path.insert(0, str(REPO / "tests"))
        from figure_checks import problems as checks
    failed = 0
    n_jobs = len(files["train"])
    print(f"{n_jobs} jobs, {len(files['evals'])} eval_sts.json, {len(files['transfer'])} eval_transfer.json "
          f"under {out / 'results'}")
    for stem, fig in draw_figures(files["evals"], files["train"], paper):
        found = checks(fig) if checks else []
        failed += bool(found)
        for p in save(fig, out / stem, args.formats):
            print(p, *(["FAILS:", *found] if found and p.suffix == ".png" else []))
        plt.close(fig)
    for study in config["studies"]:
        values = read_values(study_inputs(config, study), study["metric"])
        histories = dev_histories(study_train_inputs(config, study))
        fig = draw_study_figure(json.loads(json.dumps(study)), values, published.get(study["name"]), histories)
        found = checks(fig) if checks else []
        failed += bool(found)
        for p in save(fig, out / "studies" / study["name"], args.formats):
            print(p, *(["FAILS:", *found] if found and p.suffix == ".png" else []))
        plt.close(fig)
    if checks:
        print(f"{failed} figure(s) fail the checks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
