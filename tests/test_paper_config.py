"""The paper configuration and its published numbers (issue 18 §1): `snakemake -n` plans every run of
config/config.yaml, and `sentemb table-paper` on synthetic per-run results puts every published number
of config/paper_results.yaml on the configured run it belongs to."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from sentemb.cli import main
from sentemb.config.load import load_config
from sentemb.report.paper import SHORT, load_paper_results
from sentemb.evaluate.senteval import TASKS
from sentemb.evaluate.transfer import TRANSFER_TASKS


@pytest.fixture(scope="module")
def paper_cfg():
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return load_config(REPO / "config" / "config.yaml")
    finally:
        os.chdir(cwd)


GEOMETRY = {"align": 0.2, "uniform": -2.0}  # STS-B test geometry, as sentemb evaluate writes it


def _seeds(cfg, run):
    return run.get("seeds") or cfg["seeds"]


def test_dry_run_plans_every_configured_run_and_baseline(paper_cfg, tmp_path):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           f"--configfile={REPO / 'config' / 'config.yaml'}", "-n", "table_paper", "studies"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "SENTEMB_MIRROR": "", "MLFLOW_TRACKING_URI": ""})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout + p.stderr
    for r in paper_cfg["runs"]:
        for s in _seeds(paper_cfg, r):
            assert f"results/runs/{r['name']}/{r['backbone']}/seed{s}/eval_sts.json" in out, (r["name"], r["backbone"], s)
    for b, poolers in paper_cfg["baselines"].items():
        for pooler in poolers:
            assert f"results/baselines/{b}/{pooler}/eval_sts.json" in out
    for study in paper_cfg["studies"]:  # every paper study: its table and figure (its points are runs above)
        assert f"results/studies/{study['name']}.csv" in out and f"results/studies/{study['name']}.png" in out


def test_table_paper_shows_every_published_number_on_its_run(paper_cfg, tmp_path):
    """Synthetic per-run JSON files for every configured run and seed (and baseline), in the layout the
    workflow writes; every published score of paper_results.yaml must come out on the row of the run (or
    `also` run / baseline pooler) it names, in the right table, and nowhere else."""
    sts, transfer, train = [], [], []

    def write(path, d):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(d))
        return str(path)

    for i, r in enumerate(paper_cfg["runs"]):
        for s in _seeds(paper_cfg, r):
            meta = {"name": r["name"], "method": r["method"], "backbone": r["backbone"], "seed": s}
            d = tmp_path / "runs" / r["name"] / r["backbone"] / f"seed{s}"
            sts.append(write(d / "eval_sts.json", {**{t: 60.0 + i / 10 for t in TASKS}, "run": meta,
                                                   "pooler": "cls_before_pooler", "geometry": GEOMETRY}))
            if paper_cfg["evaluation"]["transfer"] if r.get("transfer") is None else r["transfer"]:
                transfer.append(write(d / "eval_transfer.json", {**{t: 80.0 for t in TRANSFER_TASKS}, "run": meta}))
            train.append(write(d / "train.json", {**meta, "best_dev_stsb": 80.0 + i / 10, "history": []}))
    for b, poolers in paper_cfg["baselines"].items():
        for pooler in poolers:
            meta = {"name": f"untrained-{pooler}", "method": "baseline", "backbone": b, "seed": 0}
            d = tmp_path / "baselines" / b / pooler
            sts.append(write(d / "eval_sts.json", {**{t: 50.0 for t in TASKS}, "run": meta, "pooler": pooler,
                                                   "geometry": GEOMETRY}))
            transfer.append(write(d / "eval_transfer.json", {**{t: 80.0 for t in TRANSFER_TASKS}, "run": meta,
                                                             "pooler": pooler}))
    out = tmp_path / "table_paper.csv"
    assert main(["table-paper", "--sts", *sts, "--transfer", *transfer, "--train", *train,
                 "--published", str(REPO / "config" / "paper_results.yaml"), "--output", str(out)]) == 0
    t = pd.read_csv(out)
    entries = load_paper_results(REPO / "config" / "paper_results.yaml")
    expected = set()
    for e in entries:
        names = ([f"untrained-{e['pooler']}"] if e["method"] == "baseline"
                 else [e.get("name") or e["method"], *e.get("also", [])])
        for name in names:
            for metric, value in e["scores"].items():
                rows = t[(t["table"] == e["table"]) & (t["name"] == name) & (t["backbone"] == e["backbone"])
                         & (t["metric"] == SHORT.get(metric, metric))]
                assert len(rows) == 1, (e["source"], name, metric)
                assert rows.iloc[0]["published"] == pytest.approx(value), (e["source"], name, metric)
                assert rows.iloc[0]["source"] == e["source"]
                expected.add((e["table"], name, e["backbone"], SHORT.get(metric, metric)))
    published = t[t["published"].notna()]
    got = set(zip(published["table"], published["name"], published["backbone"], published["metric"]))
    assert got == expected  # no published number on a run the papers do not report it for
    # the dev rows carry the runs' best dev score, the sts rows their test score, the geometry rows the
    # STS-B test geometry (only for the runs a paper reports it for)
    dev = t[(t["table"] == "dev")]
    assert len(dev) and (dev["metric"] == "STS-B").all() and (dev["reproduced"] >= 80.0).all()
    assert (t[(t["table"] == "sts")]["reproduced"] < 80.0).all()
    geo = t[(t["table"] == "geometry")]
    assert set(geo["metric"]) == {"align", "uniform"} and set(geo["reproduced"]) == {0.2, -2.0}
    assert set(zip(geo["name"], geo["backbone"])) == {(n, e["backbone"]) for e in entries if e["table"] == "geometry"
                                                      for n in [e.get("name") or ("untrained-" + e["pooler"] if
                                                                e["method"] == "baseline" else e["method"]),
                                                                *e.get("also", [])]}  # the entry's runs, `also` too
