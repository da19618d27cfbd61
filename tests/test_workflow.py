"""Integration: the Snakemake DAG end to end on the tiny config (.test/config.yaml), via the CLI.

A randomly initialised 2-layer BERT with MiniLM's vocabulary, 192 real Wikipedia sentences, two
seeds, the real SentEval STS sets from the mirror (../shared), MLflow on an embedded store.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.realdata]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]


def smk(workdir: Path, *args, env=None, check=True):
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), f"--configfile={workdir / 'config.yaml'}",
           *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=1800)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


#: the example method that keeps state (issue 39 §3: ESimCSE's momentum encoder and queue), a queue of
#: 48 that fills and wraps within its 4 steps of 32. It is also the DAG's plug-in from a file of the
#: working directory, listed in method_modules as a user's would be (issue 27 §4; the simplest example,
#: debiased-simcse, runs its contract in tests/test_plugins.py)
STATEFUL_RUN = {"method": "esimcse", "backbone": "tiny-bert", "seeds": [1], "method_args": {"queue_size": 48},
                "train": {"max_steps": 4}}
#: the prompt-based example (issue 39 §3): its own evaluation embedding and exported module
PROMPT_RUN = {"method": "promptbert", "backbone": "tiny-bert", "seeds": [1], "train": {"max_steps": 4}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, shared):
    d = tmp_path_factory.mktemp("dag")
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    (d / "methods").mkdir()
    for f in ("esimcse.py", "promptbert.py", "promptbert_st.py"):
        shutil.copy(REPO / "examples" / "methods" / f, d / "methods" / f)
    cfg["method_modules"] = ["methods/esimcse.py", "methods/promptbert.py"]
    # The suite's time budget: UNA runs once, with the paraphrases (`una-para`: the TF-IDF negatives on
    # the same steps, plus the Pegasus positives), and the study's new point at one seed; table1's
    # `simcse` row keeps its two seeds (their mean and sample std are checked below).
    cfg["runs"] = [r for r in cfg["runs"] if r.get("name") != "una"] + [STATEFUL_RUN, PROMPT_RUN]
    cfg["studies"][0]["seeds"] = [1]
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return d


@pytest.fixture(scope="module")
def env(shared):
    # PATH without the virtual environment's bin: the rules must find `sentemb` without an activated venv.
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != str(Path(sys.executable).parent))
    return {"SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": "", "PATH": path}


def jobs(workdir):
    """(name, backbone, seed) of every training job the tiny config declares (its study's points included)."""
    from sentemb.config.load import jobs, load_config

    here = os.getcwd()
    os.chdir(workdir)  # method_modules are relative to the working directory (contextlib.chdir: Python 3.11)
    try:
        cfg = load_config(workdir / "config.yaml")
    finally:
        os.chdir(here)
    return [tuple(j) for j in jobs(cfg)]


@pytest.fixture(scope="module")
def ran(workdir, env):
    smk(workdir, "--cores", "2", "results/table1.csv", "report_all", "stats", "model_cards", env=env)
    return workdir


def test_lint_is_clean(workdir, env):
    p = smk(workdir, "--lint", env=env, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def test_table1_from_the_dag(ran):
    t = pd.read_csv(ran / "results" / "table1.csv")
    assert list(t.columns) == ["name", "method", "backbone", *TASKS, "Avg", "std", "n_seeds"]
    assert (t["method"] == "baseline").sum() == 1  # .test: baselines {tiny-bert: [avg]}, marked as such
    t = t[t["method"] != "baseline"]
    assert sorted(zip(t["name"], t["backbone"])) == sorted({(n, b) for n, b, _ in jobs(ran)})  # one row per run
    assert t[TASKS + ["Avg"]].notna().all().all()
    t = t[t["name"] == "simcse"].reset_index(drop=True)
    assert len(t) == 1 and t.loc[0, "n_seeds"] == 2 and t.loc[0, "backbone"] == "tiny-bert"
    evals = [json.loads((ran / f"results/runs/simcse/tiny-bert/seed{s}/eval_sts.json").read_text()) for s in (1, 2)]
    for task in TASKS:
        assert t.loc[0, task] == pytest.approx(sum(e[task] for e in evals) / 2, abs=0.01)
        assert -100 <= t.loc[0, task] <= 100
    avgs = [sum(e[t] for t in TASKS) / len(TASKS) for e in evals]
    assert t.loc[0, "std"] == pytest.approx(abs(avgs[0] - avgs[1]) / 2 ** 0.5, abs=0.01)  # sample std, 2 seeds
    assert evals[0]["details"]["STS12"]["n"] == 3108 and evals[0]["details"]["SICKRelatedness"]["n"] == 4927
    assert evals[0]["pooler"] == "cls_before_pooler"
    assert sum(line.startswith("| simcse |") for line in (ran / "results" / "table1.md").read_text().splitlines()) == 1
    mine = pd.read_csv(ran / "results" / "table1.csv").set_index("name").loc["esimcse"]  # the plug-in's row
    assert mine["method"] == "esimcse" and mine["n_seeds"] == 1 and -100 <= mine["Avg"] <= 100
    run = json.loads((ran / "results/runs/esimcse/tiny-bert/seed1/run_config.json").read_text())
    assert run["method_module"] == "methods/esimcse.py" and len(run["method_digest"]) == 64
    assert json.loads((ran / "results/runs/esimcse/tiny-bert/seed1/train.json").read_text())["steps"] == 4
    prompt = pd.read_csv(ran / "results" / "table1.csv").set_index("name").loc["promptbert"]  # through its template
    assert prompt["method"] == "promptbert" and -100 <= prompt["Avg"] <= 100
    model = ran / "results/runs/promptbert/tiny-bert/seed1/model"
    assert json.loads((model / "modules.json").read_text())[0]["type"] == "promptbert_st.PromptTransformer"
    assert json.loads((model / "sentemb.json").read_text())["pooler"] == "method"
    # PaSeR's corpus, sts_corpus.max_sentences: the rule passed the sample's options
    sts = ran / "resources" / "corpus" / "sts-unlabeled.txt"
    assert len(sts.read_text("utf-8").splitlines()) == 1000
    assert json.loads(Path(f"{sts}.json").read_text())["sentences_before_sample"] == 89_192


def test_report_end_of_the_dag(ran, env):
    res = ran / "results"
    tr = pd.read_csv(res / "table_transfer.csv")
    import yaml

    runs = yaml.safe_load((ran / "config.yaml").read_text())["runs"]
    with_transfer = {r["method"] for r in runs if r.get("transfer")}  # runs[].transfer over evaluation.transfer
    assert with_transfer == {"simcse"} and set(tr["method"]) == with_transfer | {"baseline"}
    assert tr["TREC"].between(0, 100).all()
    paper = pd.read_csv(res / "table_paper.csv", keep_default_na=False)
    assert (paper[paper["backbone"] == "tiny-bert"]["published"] == "").all()  # nothing published for tiny-bert
    ev = json.loads((res / "runs/simcse/tiny-bert/seed1/eval_sts.json").read_text())
    assert {"align", "uniform", "cosine_buckets"} <= set(ev["geometry"])
    for f in ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced"):
        assert (res / "figures" / f"{f}.png").stat().st_size > 5000 and (res / "figures" / f"{f}.svg").is_file()
    smk(ran, "--report", "results/report.html", env=env)
    assert (res / "report.html").stat().st_size > 10000


def test_report_renders_in_a_headless_browser(ran, env):
    """The HTML report in a real Chromium: the page is not blank (skipped where Chromium is absent)."""
    import numpy as np
    from PIL import Image

    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium on PATH (install the system package `chromium`)")
    html = ran / "results" / "report.html"
    if not html.is_file():
        smk(ran, "--report", "results/report.html", env=env)
    shot = ran / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                    "--window-size=1280,1600", f"--screenshot={shot}", html.as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = np.asarray(Image.open(shot).convert("L"))
    assert img.std() > 5  # something drawn, not a blank page
    text = html.read_text("utf-8", errors="replace")
    for f in ("table1_bars.png", "dev_curves.png", "align_uniform.png", "cosine_buckets.png", "paper_vs_reproduced.png",
              "table_paper.csv", "table_transfer.csv"):
        assert f in text  # every figure and table is embedded


def test_study_end_to_end(ran, env):
    """The tiny config's two-point study (SimCSE temperature 0.05 = the `simcse` run, reused; 0.1 a new
    run under results/runs/simcse-temp/temperature=0.1/), here at seed 1 only (the fixture): its runs,
    table, figure and report section. The reused point takes the study's seeds, not the run's two."""
    res = ran / "results"
    new = res / "runs" / "simcse-temp" / "temperature=0.1" / "tiny-bert"
    assert {p.name for p in new.iterdir()} == {"seed1"}
    assert json.loads((new / "seed1" / "run_config.json").read_text())["method_args"]["temperature"] == 0.1
    t = pd.read_csv(res / "studies" / "simcse-temp.csv")
    assert list(t["temperature"]) == [0.05, 0.1] and list(t["run"]) == ["simcse", "simcse-temp/temperature=0.1"]
    assert list(t["n_seeds"]) == [1, 1]
    for _, row in t.iterrows():
        val = json.loads((res / "runs" / row["run"] / "tiny-bert" / "seed1" / "eval_sts.json").read_text())["STSBenchmark"]
        assert row["mean"] == pytest.approx(val)
    assert "simcse-temp/temperature=0.1" in set(pd.read_csv(res / "table1.csv")["name"])  # an ordinary run
    assert (res / "studies" / "simcse-temp.png").stat().st_size > 5000 and (res / "studies" / "simcse-temp.svg").is_file()
    assert "| temperature |" in (res / "studies" / "simcse-temp.md").read_text()
    html = res / "report.html"
    if not html.is_file():
        smk(ran, "--report", "results/report.html", env=env)
    text = html.read_text("utf-8", errors="replace")
    assert "Studies" in text and "simcse-temp.png" in text and "simcse-temp.csv" in text
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ran / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sentemb-test").experiment_id],
                              "tags.study = 'simcse-temp'")
    assert sorted(r.data.tags["point"] for r in runs) == ["temperature=0.1"]


def test_stats_stage_in_the_dag(ran):
    stats = ran / "results" / "stats" / "wiki-tiny"
    freq = pd.read_parquet(stats / "token_freq.tiny-bert.parquet")
    assert freq["freq"].sum() == pytest.approx(1.0)
    assert len(pd.read_parquet(stats / "rake_top5.parquet")) == 192  # line-aligned with the corpus
    assert len(pd.read_parquet(stats / "tfidf.parquet")) > 100
    assert (stats / "summary.md").is_file()
    corpus = (ran / "resources" / "corpus" / "wiki-tiny.txt").read_text().splitlines()
    paraphrases = (stats / "paraphrases.txt").read_text().split("\n")[: len(corpus)]
    assert len((stats / "paraphrases.txt").read_text().splitlines()) == len(corpus) == 192
    assert len(pd.read_parquet(stats / "tfidf_para.parquet")) >= len(pd.read_parquet(stats / "tfidf.parquet"))
    assert any(p.strip() for p in paraphrases)


def test_every_job_is_an_mlflow_run(ran):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ran / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sentemb-test")
    runs = client.search_runs([exp.experiment_id])
    n = len(jobs(ran))
    rules = sorted(r.data.tags["rule"] for r in runs if r.data.tags["rule"] in ("train", "evaluate"))  # baselines: own tag
    assert rules == ["evaluate"] * n + ["train"] * n
    assert all(r.info.status == "FINISHED" for r in runs)
    train_run = next(r for r in runs if r.data.tags["rule"] == "train" and r.data.tags["method"] == "simcse")
    assert {"method", "backbone", "seed", "name", "git_commit", "git_dirty"} <= set(train_run.data.tags)
    assert train_run.data.tags["git_dirty"] in ("True", "False")
    assert "dev/stsb_spearman" in train_run.data.metrics and "train/loss" in train_run.data.metrics
    assert train_run.data.params["train.batch_size"] == "32"
    ev = next(r for r in runs if r.data.tags["rule"] == "evaluate")
    assert "test/avg" in ev.data.metrics
    mine = next(r for r in runs if r.data.tags["rule"] == "train" and r.data.tags["method"] == "esimcse")
    assert mine.info.status == "FINISHED" and mine.data.params["method_args.queue_size"] == "48"
    assert "train/contrastive" in mine.data.metrics


def test_rerun_has_nothing_to_do(ran, env):
    p = smk(ran, "-n", "results/table1.csv", "report_all", "model_cards", env=env)  # the cards rerun nothing
    assert "Nothing to be done" in p.stdout + p.stderr


def test_every_exported_model_has_a_card_with_its_results(ran):
    """Issue 29 §1: each run's model/README.md parses with huggingface_hub and its model-index holds
    the run's eval_sts.json (STS-B test) and eval_transfer.json; a dev-only run's card has no results."""
    from huggingface_hub import ModelCard

    cfg = yaml.safe_load((ran / "config.yaml").read_text())
    for name, backbone, seed in jobs(ran):
        d = ran / "results" / "runs" / name / backbone / f"seed{seed}"
        card = ModelCard.load(d / "model" / "README.md")
        assert card.data.library_name == "sentence-transformers" and f"sentemb run {name}," in card.text
        assert card.data.base_model is None  # the tiny backbone is randomly initialised: no base model
        got = {(e.dataset_type, e.metric_type): e.metric_value for e in card.data.eval_results or []}
        if (d / "eval_sts.json").is_file():
            sts = json.loads((d / "eval_sts.json").read_text())
            assert got[("mteb/stsbenchmark-sts", "cosine_spearman")] == sts["STSBenchmark"], d
            assert len([k for k in got if k[1] == "cosine_spearman"]) == len(TASKS)
        else:
            assert not got and "Not evaluated yet" in card.text, d
        if (d / "eval_transfer.json").is_file():
            assert got[("SentEval/TREC", "accuracy")] == json.loads((d / "eval_transfer.json").read_text())["TREC"]
        marker = json.loads((d / "model_card.json").read_text())
        assert marker["card"] == str(Path("results/runs") / name / backbone / f"seed{seed}" / "model" / "README.md")
    sarcse = ModelCard.load(ran / "results/runs/sarcse/tiny-bert/seed1/model/README.md")
    assert "trust_remote_code=True" in sarcse.text  # its own sentence-transformers module
    assert cfg["corpus"]["name"] in sarcse.text


def test_editing_a_plugin_reruns_its_jobs_and_nothing_else(ran, env):
    """Issue 27 §1: the plug-in's file digest is in its runs' settings, so an edit plans its run's
    jobs again (and what reads their results), no other training."""
    import re

    plugin = ran / "methods" / "esimcse.py"
    text = plugin.read_text()
    try:
        plugin.write_text(text + "\n# an edit\n")
        p = smk(ran, "-n", "results/table1.csv", env=env)
        out = p.stdout + p.stderr
        trained = set(re.findall(r"rule train:\n(?:\s+\S.*\n)*?\s+wildcards: name=([^,\n]+)", out))
        assert trained == {"esimcse"}, out[-3000:]
    finally:
        plugin.write_text(text)
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", env=env))


def _planned(out: str) -> dict[str, set]:
    """rule -> the run names (wildcard ``name``, else the rule's jobs as '') a dry run plans."""
    import re

    got: dict[str, set] = {}
    for m in re.finditer(r"^(?:local)?rule (\w+):\n((?:[ \t]+\S.*\n)*)", out, re.M):
        name = re.search(r"wildcards: .*?name=([^,\n]+)", m.group(2))
        got.setdefault(m.group(1), set()).add(name.group(1) if name else "")
    return got


def test_a_logging_knob_reruns_nothing_and_one_runs_lr_only_that_run(ran, env):
    """Issue 28 §2: after a finished DAG, changing weight-free settings (train.log_steps, save_steps,
    prefetch, num_threads) plans no training, pretraining or evaluation job (only the cheap
    run_options files, which training reads as `ancient`); changing one run's train.lr plans that
    run's training and what reads it, no other training."""
    cfg_file = ran / "config.yaml"
    text = cfg_file.read_text()
    cfg = yaml.safe_load(text)
    heavy = {"train", "pretrain", "evaluate", "evaluate_baseline", "encode_transfer", "evaluate_transfer",
             "run_config", "pretrain_config"}
    try:
        knobs = dict(cfg, train={**cfg["train"], "log_steps": cfg["train"]["log_steps"] + 3, "save_steps": 7,
                                 "prefetch": False, "num_threads": 1})
        cfg_file.write_text(yaml.safe_dump(knobs, sort_keys=False))
        planned = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", "report_all", env=env)))
        assert not set(planned) & heavy, planned
        assert "run_options" in planned and "pretrain_options" in planned, planned  # the change is seen
        # (SARCSE: no study point shares its settings; SimCSE's lr would also split off the
        # temperature study's point that is SimCSE's run, which is right but another case)
        runs = [dict(r) for r in cfg["runs"]]
        i = next(i for i, r in enumerate(runs) if r["method"] == "sarcse")
        runs[i] = {**runs[i], "train": {**(runs[i].get("train") or {}), "lr": 3e-4}}
        cfg_file.write_text(yaml.safe_dump(dict(cfg, runs=runs), sort_keys=False))
        planned = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", env=env)))
        name = runs[i].get("name") or runs[i]["method"]
        assert planned.get("train") == {name} and planned.get("run_config") == {name}, planned
        assert "pretrain" not in planned and name in planned.get("evaluate", set()), planned
    finally:
        cfg_file.write_text(text)
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", env=env))


def test_tracking_settings_rerun_nothing_and_an_evaluation_setting_only_its_kind(ran, env):
    """Issue 28 §2/§3: evaluation jobs read their resolved settings (rule eval_spec) and the MLflow
    settings as `ancient` (rule tracking_options): a new tracking URI plans no training or
    evaluation; a new transfer classifier plans the transfer classification (and the encoding its
    temporary features need), neither STS evaluation nor training."""
    cfg_file = ran / "config.yaml"
    text = cfg_file.read_text()
    cfg = yaml.safe_load(text)
    heavy = {"train", "pretrain", "evaluate", "evaluate_baseline", "encode_transfer", "evaluate_transfer",
             "encode_baseline_transfer", "evaluate_baseline_transfer", "run_config", "pretrain_config"}
    try:
        moved = dict(cfg, tracking={**(cfg.get("tracking") or {}), "uri": f"sqlite:///{ran / 'elsewhere.db'}"})
        cfg_file.write_text(yaml.safe_dump(moved, sort_keys=False))
        planned = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", "report_all", env=env)))
        assert not set(planned) & heavy, planned
        assert "init_tracking" in planned and "tracking_options" in planned, planned  # the change is seen
        other = "sklearn" if cfg.get("evaluation", {}).get("transfer_classifier") != "sklearn" else "pytorch"
        cfg_file.write_text(yaml.safe_dump(dict(cfg, evaluation={**cfg["evaluation"], "transfer_classifier": other}),
                                           sort_keys=False))
        planned = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", "report_all", env=env)))
        assert planned.get("evaluate_transfer") and planned.get("eval_spec"), planned
        assert not set(planned) & {"train", "pretrain", "evaluate", "evaluate_baseline", "run_config"}, planned
    finally:
        cfg_file.write_text(text)
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(smk(ran, "-n", "results/table1.csv", env=env))


def test_baseline_transfer_false_leaves_the_baselines_rows_out_and_reruns_only_the_table(ran, env):
    """``evaluation.baseline_transfer: false`` (config/demo.yaml's time budget): the DAG of the
    transfer table has the run's transfer jobs and none of the baselines'; after a finished DAG the
    change reruns the table alone, whose rows are then the runs'."""
    import csv

    cfg_file = ran / "config.yaml"
    text = cfg_file.read_text()
    cfg = yaml.safe_load(text)
    table = "results/table_transfer.csv"
    try:
        cfg_file.write_text(yaml.safe_dump(dict(cfg, evaluation={**cfg["evaluation"], "baseline_transfer": False}),
                                           sort_keys=False))
        whole = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", "-F", table, env=env)))
        assert {"encode_transfer", "evaluate_transfer", "table_transfer"} <= set(whole), whole
        assert not {"encode_baseline_transfer", "evaluate_baseline_transfer"} & set(whole), whole
        planned = _planned((lambda p: p.stdout + p.stderr)(smk(ran, "-n", table, env=env)))
        assert set(planned) == {"table_transfer"}, planned
        smk(ran, "--cores", "1", table, env=env)
        with open(ran / table, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows and all(r["method"] != "baseline" for r in rows), rows
    finally:
        cfg_file.write_text(text)
    smk(ran, "--cores", "1", table, env=env)  # the baselines' rows back for the tests after this one
    with open(ran / table, newline="") as fh:
        assert any(r["method"] == "baseline" for r in csv.DictReader(fh))


def test_malformed_config_names_the_key(tmp_path, env):
    cfg = (REPO / ".test" / "config.yaml").read_text().replace("lr: 1.0e-4", "lr: fast")
    (tmp_path / "config.yaml").write_text(cfg)
    p = smk(tmp_path, "-n", env=env, check=False)
    assert p.returncode != 0 and "train.lr" in p.stdout + p.stderr
    assert f"the Snakemake config ({tmp_path / 'config.yaml'})" in p.stdout + p.stderr  # and the file it is in


def test_an_argument_out_of_its_declared_range_fails_the_dry_run_naming_the_key(tmp_path, env):
    """Issue 27: ``runs[i].method_args: {margin_deg: 200}`` for ArcCSE used to pass ``snakemake -n``
    and fail on the GPU node after the encoder had loaded."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    i = next(i for i, r in enumerate(cfg["runs"]) if r["method"] == "arccse")
    cfg["runs"][i]["method_args"] = {**(cfg["runs"][i].get("method_args") or {}), "margin_deg": 200}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = smk(tmp_path, "-n", env=env, check=False)
    assert p.returncode != 0 and f"runs[{i}].method_args.margin_deg: 200 must be less than 180" in p.stdout + p.stderr


def test_a_missing_paper_results_file_fails_the_dry_run_naming_the_key(tmp_path, env):
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["paper_results"] = str(tmp_path / "nope.yaml")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = smk(tmp_path, "-n", env=env, check=False)
    assert p.returncode != 0 and f"config key 'paper_results': {tmp_path / 'nope.yaml'} not found" in p.stdout + p.stderr


def test_a_path_missing_from_the_mirror_fails_its_fetch_job_naming_the_config_key(tmp_path, env):
    """The mirror exists but a configured ``mirror_path`` is not in it: the fetch job's log names the key
    to set (session 23's probe: it named the path only)."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["backbones"]["tiny-bert"]["mirror_path"] = "models/not-there"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = smk(tmp_path, "--cores", "1", "resources/models/tiny-bert", env=env, check=False)
    assert p.returncode != 0
    log = (tmp_path / "results" / "logs" / "data" / "fetch_model_tiny-bert.log").read_text()
    assert "model sentence-transformers/all-MiniLM-L6-v2 not found in the mirror" in log
    assert "(config key backbones.tiny-bert.mirror_path: the path inside the mirror, 'models/not-there' now" in log
    assert not (tmp_path / "resources" / "models" / "tiny-bert").exists()


def test_missing_mirror_is_a_clear_error(tmp_path, env):
    shutil.copy(REPO / ".test" / "config.yaml", tmp_path / "config.yaml")
    p = smk(tmp_path, "-n", env={**env, "SENTEMB_MIRROR": str(tmp_path / "nowhere")}, check=False)
    assert p.returncode != 0 and "SENTEMB_MIRROR" in p.stdout + p.stderr and "does not exist" in p.stdout + p.stderr
