"""Report end of the DAG: transfer table, paper-vs-reproduced table, figures, from hand-made JSONs."""

import json
import math
import statistics

import numpy as np
import pandas as pd
import pytest

from sentemb import SentembError
from sentemb.report.tables import ci95, collect, welch_p
from sentemb.report.figures import figures, method_colours
from sentemb.report.paper import load_paper_results, pm_markdown, table_paper, table_transfer
from sentemb.evaluate.senteval import TASKS
from sentemb.evaluate.transfer import TRANSFER_TASKS


def _sts(path, name, method, backbone, seed, base, pooler="cls_before_pooler", geometry=True):
    d = {t: base + i for i, t in enumerate(TASKS)}  # Avg = base + 3
    d.update(avg=base + 3, pooler=pooler, run={"name": name, "method": method, "backbone": backbone, "seed": seed})
    if geometry:
        rng = np.random.default_rng(seed)
        d["geometry"] = {"align": 0.2 + 0.01 * seed, "uniform": -2.0 - 0.1 * seed,
                         "cosine_buckets": {f"{i}-{i + 1}": {"n": 20, "mean": 0.1 * i, "std": 0.1,
                                                             "cosines": list(rng.normal(0.15 * i, 0.1, 20))}
                                            for i in range(5)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))
    return path


def _transfer(path, name, method, backbone, seed, base):
    d = {t: base + i for i, t in enumerate(TRANSFER_TASKS)}
    d.update(MRPC_F1=80.0 + seed, avg=base + 3, run={"name": name, "method": method, "backbone": backbone, "seed": seed})
    path.write_text(json.dumps(d))
    return path


def test_transfer_table_mean_and_std(tmp_path):
    ps = [_transfer(tmp_path / f"t{s}.json", "simcse", "simcse", "bert", s, b) for s, b in [(1, 80.0), (2, 84.0), (3, 85.0)]]
    t = table_transfer(collect(ps, [*TRANSFER_TASKS, "MRPC_F1"])).iloc[0]
    assert t["MR"] == pytest.approx(round(statistics.mean([80, 84, 85]), 2))
    assert t["MR_std"] == pytest.approx(round(statistics.stdev([80, 84, 85]), 2))
    assert t["Avg"] == pytest.approx(round(statistics.mean([83, 87, 88]), 2))
    assert t["MRPC_F1"] == pytest.approx(82.0) and t["n_seeds"] == 3
    one = table_transfer(collect(ps[:1], [*TRANSFER_TASKS, "MRPC_F1"]))  # one seed: no spread, not ± 0.00
    assert one["MR_std"].isna().all()
    assert "| simcse | simcse | bert | 80.00 |" in pm_markdown(one, ["MR"])


def test_transfer_table_header_names_the_classifier(tmp_path):
    from sentemb.cli import main
    from sentemb.report.paper import transfer_classifier

    def with_protocol(p, classifier):
        d = json.loads(p.read_text())
        d["protocol"] = {"classifier": classifier}
        p.write_text(json.dumps(d))
        return p

    ps = [with_protocol(_transfer(tmp_path / f"t{s}.json", "simcse", "simcse", "bert", s, 80.0 + s), "pytorch")
          for s in (1, 2)]
    assert main(["table-transfer", "--inputs", *map(str, ps), "--output", str(tmp_path / "t.csv"),
                 "--markdown", str(tmp_path / "t.md")]) == 0
    head = (tmp_path / "t.md").read_text().splitlines()[0]
    assert "classifier `pytorch`" in head and "SentEval's PyTorch logistic regression" in head
    old = with_protocol(_transfer(tmp_path / "old.json", "simcse", "simcse", "bert", 3, 80.0), "sklearn LogisticRegression")
    assert transfer_classifier([old]) == "sklearn"  # files written before the switch
    with pytest.raises(SentembError, match=r"evaluation\.transfer_classifier.*pytorch: .*t1\.json.*sklearn: .*old\.json"):
        transfer_classifier([*ps, old])


def test_welch_p_against_scipy_and_ci():
    from scipy import stats

    a, b = [76.1, 76.9, 75.8, 76.4], [75.0, 75.3, 76.2]
    assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    # by hand: Welch t and Welch–Satterthwaite degrees of freedom
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert welch_p(a, b) == pytest.approx(2 * stats.t.sf(abs(t), dof))
    assert welch_p([1.0], b) is None
    lo, hi = ci95([1.0, 2.0, 3.0])
    assert (lo, hi) == pytest.approx((2 - 4.302652729911275 / math.sqrt(3), 2 + 4.302652729911275 / math.sqrt(3)))
    assert ci95([5.0]) == (None, None)


def test_paper_table_join(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text("""results:
  - {method: simcse, backbone: bert, table: sts, source: SimCSE T5, scores: {STS12: 70.0, Avg: 73.0}}
  - {method: baseline, backbone: bert, pooler: avg_static_last, table: sts, source: SimCSE T5, scores: {Avg: 40.0}}
""")
    sts = [_sts(tmp_path / f"s{s}.json", "simcse", "simcse", "bert", s, b) for s, b in [(1, 70.0), (2, 71.0), (3, 72.0)]]
    sts += [_sts(tmp_path / f"n{s}.json", "newm", "newm", "bert", s, b) for s, b in [(1, 73.0), (2, 74.0)]]
    sts += [_sts(tmp_path / "b.json", "bert-avg_static_last", "baseline", "bert", 0, 37.0, pooler="avg_static_last")]
    t = table_paper(collect(sts, TASKS), None, load_paper_results(pub))
    row = t[(t.method == "simcse") & (t.metric == "Avg")].iloc[0]
    assert row["published"] == 73.0 and row["reproduced"] == pytest.approx(74.0) and row["diff"] == pytest.approx(1.0)
    lo, hi = ci95([73.0, 74.0, 75.0])
    assert row["ci95_low"] == pytest.approx(round(lo, 2)) and row["published_in_ci95"] is True
    assert pd.isna(row["p_welch_vs_simcse"])  # SimCSE is the reference itself
    s12 = t[(t.method == "simcse") & (t.metric == "STS12")].iloc[0]
    assert s12["published"] == 70.0 and s12["published_in_ci95"] is True  # seeds 70, 71, 72: CI [68.5, 73.5]
    new_avg = t[(t.method == "newm") & (t.metric == "Avg")].iloc[0]
    assert pd.isna(new_avg["published"]) and pd.isna(new_avg["diff"])
    assert new_avg["source"] == "not reported"
    assert new_avg["p_welch_vs_simcse"] == pytest.approx(round(welch_p([76.0, 77.0], [73.0, 74.0, 75.0]), 4))
    base = t[(t.method == "baseline") & (t.metric == "Avg")].iloc[0]
    assert base["published"] == 40.0 and base["pooler"] == "avg_static_last" and pd.isna(base["published_in_ci95"])
    # CSV: a missing published value is an empty cell, not 0
    out = tmp_path / "p.csv"
    t.to_csv(out, index=False)
    back = pd.read_csv(out, keep_default_na=False)
    assert (back[(back.method == "newm")]["published"] == "").all()


def test_paper_results_file_of_the_repo_is_valid():
    from conftest import REPO

    entries = load_paper_results(REPO / "config" / "paper_results.yaml")
    simcse = next(e for e in entries if e["method"] == "simcse" and e["backbone"] == "bert-base-uncased")
    assert simcse["scores"]["Avg"] == 76.25
    for e in entries:  # each published Avg is the mean of its seven STS tasks (to rounding)
        if e["table"] == "sts" and len(e["scores"]) == 8:
            assert statistics.mean(v for k, v in e["scores"].items() if k != "Avg") == pytest.approx(e["scores"]["Avg"], abs=0.011)


def test_bad_paper_results_name_the_key(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("results:\n  - {method: x, backbone: y, table: sts, source: s, scores: {STS99: 1.0}}\n")
    with pytest.raises(SentembError, match=r"results\[0\].scores.*STS99"):
        load_paper_results(p)
    p.write_text("results:\n  - {method: x, backbone: y, table: sts, scores: {}}\n")
    with pytest.raises(SentembError, match="lacks 'source'"):
        load_paper_results(p)


def test_colours_fixed_per_method():
    a = method_colours(["una", "simcse", "baseline"])
    b = method_colours(["simcse", "una"])
    assert a["simcse"] == b["simcse"] and a["una"] == b["una"] and a["simcse"] != a["una"]


def test_figures_are_written_and_baseline_without_history_is_omitted(tmp_path):
    from PIL import Image

    runs = tmp_path / "results" / "runs"
    evals, trains = [], []
    for s in (1, 2):
        evals.append(_sts(runs / "simcse" / "bert" / f"seed{s}" / "eval_sts.json", "simcse", "simcse", "bert", s, 70.0 + s))
        tj = runs / "simcse" / "bert" / f"seed{s}" / "train.json"
        hist = [{"step": k * 10, "dev_stsb": 60 + k + s} for k in range(5)]
        hist.insert(1, {"step": 5, "train/grad_norm/contrastive": 0.3})  # a log step's record (train.log_grad_norms)
        tj.write_text(json.dumps({"history": hist}))
        trains.append(tj)
    evals.append(_sts(tmp_path / "results" / "baselines" / "bert" / "avg" / "eval_sts.json", "bert-avg", "baseline",
                      "bert", 0, 40.0, pooler="avg"))
    tj = tmp_path / "results" / "baselines" / "bert" / "avg" / "train.json"
    tj.write_text(json.dumps({"history": []}))  # a run without history: omitted, no crash
    trains.append(tj)
    paper = pd.DataFrame([{"table": "sts", "name": "simcse", "method": "simcse", "backbone": "bert", "pooler": "",
                           "metric": "Avg", "published": 76.25, "reproduced": 74.5, "ci95_low": 68.1, "ci95_high": 80.9}])
    files = figures(evals, trains, paper, tmp_path / "figs")
    names = sorted(p.name for p in files)
    for stem in ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced"):
        assert f"{stem}.png" in names and f"{stem}.svg" in names and f"{stem}.pdf" in names
        img = np.asarray(Image.open(tmp_path / "figs" / f"{stem}.png").convert("L"))
        assert img.shape[0] > 200 and img.std() > 10  # not blank


@pytest.mark.parametrize("patch, key", [
    ({"baselines": {"gpt-9": ["avg"]}}, "baselines.gpt-9"),
    ({"baselines": {"tiny-bert": ["mean"]}}, "baselines.tiny-bert"),
    ({"evaluation": {"transfer_tasks": ["MR", "SST5"]}}, "evaluation.transfer_tasks"),
    ({"evaluation": {"mrpc_features": "both"}}, "evaluation.mrpc_features"),
    ({"evaluation": {"transfer": "yes"}}, "evaluation.transfer"),
])
def test_bad_report_config_names_the_key(patch, key):
    import yaml

    from conftest import REPO
    from sentemb.config.load import validate_config

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    for k, v in patch.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) and k == "evaluation" else v
    with pytest.raises(SentembError, match=key.replace(".", r"\.").replace("-", r"\-")):
        validate_config(cfg)


def test_published_numbers_do_not_attach_to_ablations(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text("results:\n  - {method: simcse, backbone: bert, table: sts, source: T5, scores: {Avg: 73.0}}\n")
    sts = [_sts(tmp_path / "a.json", "simcse", "simcse", "bert", 1, 70.0),
           _sts(tmp_path / "b.json", "simcse-tau0.1", "simcse", "bert", 1, 60.0)]
    t = table_paper(collect(sts, TASKS), None, load_paper_results(pub)).set_index(["name", "metric"])
    assert t.loc[("simcse", "Avg"), "published"] == 73.0
    assert pd.isna(t.loc[("simcse-tau0.1", "Avg"), "published"])
    assert t.loc[("simcse-tau0.1", "Avg"), "source"] == "not reported"


def _train_json(path, name, method, backbone, seed, dev):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "method": method, "backbone": backbone, "seed": seed,
                                "best_dev_stsb": dev, "best_step": 250, "history": []}))
    return path


def test_dev_rows_compare_with_the_best_dev_score_never_a_test_score(tmp_path):
    """Issue 18 §1: a published STS-B *dev* number (ablation tables) is compared with the run's best dev
    Spearman from train.json; the run's STS-B test score (eval_sts.json) stays on its `sts` row."""
    from sentemb.report.paper import collect_dev

    pub = tmp_path / "paper.yaml"
    pub.write_text("""results:
  - {method: m, backbone: b, table: sts, source: T1, scores: {STSBenchmark: 80.0, Avg: 77.0}}
  - {method: m, backbone: b, table: dev, source: T4, scores: {STSBenchmark: 85.0}}
  - {method: m, name: m-abl, backbone: b, table: dev, source: T4 ablation, scores: {STSBenchmark: 83.0}}
""")
    sts = [_sts(tmp_path / f"s{s}.json", "m", "m", "b", s, 70.0) for s in (1, 2)]
    sts += [_sts(tmp_path / "a.json", "m-abl", "m", "b", 1, 60.0)]
    train = [_train_json(tmp_path / f"t{s}/train.json", "m", "m", "b", s, d) for s, d in ((1, 84.0), (2, 86.5))]
    train += [_train_json(tmp_path / "ta/train.json", "m-abl", "m", "b", 1, 82.25),
              _train_json(tmp_path / "tn/train.json", "m-last", "m", "b", 1, None)]  # no dev evaluation
    dev = collect_dev(train)
    assert sorted(dev["name"]) == ["m", "m", "m-abl"]
    t = table_paper(collect(sts, TASKS), None, load_paper_results(pub), dev).set_index(["table", "name", "metric"])
    assert t.loc[("dev", "m", "STS-B"), "published"] == 85.0
    assert t.loc[("dev", "m", "STS-B"), "reproduced"] == pytest.approx(85.25)  # mean of 84.0 and 86.5
    assert t.loc[("dev", "m-abl", "STS-B"), "reproduced"] == pytest.approx(82.25)
    assert t.loc[("dev", "m-abl", "STS-B"), "diff"] == pytest.approx(-0.75)
    # the test-set row keeps the test score (70 + index of STS-B in TASKS)
    assert t.loc[("sts", "m", "STS-B"), "reproduced"] == pytest.approx(70.0 + TASKS.index("STSBenchmark"))
    assert t.loc[("sts", "m", "STS-B"), "published"] == 80.0
    assert ("dev", "m", "Avg") not in t.index  # a dev table has no average
    assert pd.isna(t.loc[("sts", "m-abl", "Avg"), "published"])  # the ablation's test Avg is not reported


def test_geometry_rows_compare_alignment_and_uniformity_and_notes_are_kept(tmp_path):
    """Issue 29 §3: a published `geometry` row (SARCSE Table 4) is compared with the runs' STS-B test
    alignment / uniformity (eval_sts.json `geometry`), to three decimals, only for the runs and baselines
    it names; an entry's `note` is kept by the loader and shown on its rows."""
    from sentemb.report.paper import collect_geometry, paper_markdown

    pub = tmp_path / "paper.yaml"
    pub.write_text("""results:
  - {method: m, backbone: b, table: sts, source: T1, note: "T1 and T4 disagree; T1 used", scores: {Avg: 77.0}}
  - {method: m, backbone: b, table: geometry, source: T4, scores: {align: 0.213, uniform: -2.618}}
  - {method: baseline, backbone: b, pooler: avg_static_last, table: geometry, source: T4, scores: {align: 0.021}}
""")
    sts = [_sts(tmp_path / f"s{s}.json", "m", "m", "b", s, 70.0) for s in (1, 2)]  # align 0.2 + 0.01 s
    sts += [_sts(tmp_path / "o.json", "other", "other", "b", 1, 70.0)]
    sts += [_sts(tmp_path / "b.json", "untrained-avg_static_last", "baseline", "b", 0, 40.0, pooler="avg_static_last")]
    sts += [_sts(tmp_path / "n.json", "m-old", "m", "b", 1, 70.0, geometry=False)]  # no geometry: left out
    geo = collect_geometry(sts)
    assert sorted(geo["name"]) == ["m", "m", "other", "untrained-avg_static_last"]
    entries = load_paper_results(pub)
    assert entries[0]["note"] == "T1 and T4 disagree; T1 used"
    t = table_paper(collect(sts, TASKS), None, entries, None, geo).set_index(["table", "name", "metric"])
    assert t.loc[("geometry", "m", "align"), "published"] == 0.213
    assert t.loc[("geometry", "m", "align"), "reproduced"] == pytest.approx(0.215)  # mean of 0.21, 0.22
    assert t.loc[("geometry", "m", "uniform"), "reproduced"] == pytest.approx(-2.15)
    assert t.loc[("geometry", "m", "uniform"), "diff"] == pytest.approx(0.468)
    assert t.loc[("geometry", "untrained-avg_static_last", "align"), "published"] == 0.021
    assert t.loc[("geometry", "untrained-avg_static_last", "uniform"), "source"] == "not reported"
    assert not any(k[0] == "geometry" and k[1] == "other" for k in t.index)  # no published geometry
    assert ("geometry", "m", "Avg") not in t.index
    assert t.loc[("sts", "m", "Avg"), "note"] == "T1 and T4 disagree; T1 used"
    assert t.loc[("sts", "other", "Avg"), "note"] == "" and t.loc[("geometry", "m", "align"), "note"] == ""
    md = paper_markdown(t.reset_index())
    assert "| note |" in md.splitlines()[0] and "| 0.213 | 0.215 |" in md
    p = tmp_path / "bad.yaml"
    p.write_text("results:\n  - {method: m, backbone: b, table: geometry, source: s, scores: {alignment: 0.2}}\n")
    with pytest.raises(SentembError, match=r"results\[0\].scores has unknown metric.*alignment"):
        load_paper_results(p)


def test_also_attaches_a_published_row_to_a_variant_run(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text("results:\n  - {method: m, name: m-x, also: [m-code], backbone: b, table: sts, source: T,"
                   " scores: {Avg: 77.0}}\n")
    sts = [_sts(tmp_path / "a.json", "m-x", "m", "b", 1, 70.0), _sts(tmp_path / "c.json", "m-code", "m", "b", 1, 72.0),
           _sts(tmp_path / "d.json", "m", "m", "b", 1, 71.0)]
    t = table_paper(collect(sts, TASKS), None, load_paper_results(pub)).set_index(["name", "metric"])
    assert t.loc[("m-x", "Avg"), "published"] == 77.0 and t.loc[("m-code", "Avg"), "published"] == 77.0
    assert pd.isna(t.loc[("m", "Avg"), "published"])
    p = tmp_path / "twice.yaml"
    p.write_text("results:\n  - {method: m, backbone: b, table: sts, source: T, scores: {Avg: 1.0}}\n"
                 "  - {method: m, name: n, also: [m], backbone: b, table: sts, source: U, scores: {Avg: 2.0}}\n")
    with pytest.raises(SentembError, match=r"results\[1\] gives run 'm' on 'b' a second sts row"):
        load_paper_results(p)


def _mini_config(runs, baselines=None):
    from sentemb.config.load import validate_config

    cfg = {"experiment": "x", "corpus": {"name": "c", "hub_repo": "r", "hub_file": "f"},
           "backbones": {"bert": {"hub_id": "h"}}, "runs": runs, "baselines": baselines or {}}
    validate_config(cfg)
    return cfg


def test_published_rows_are_checked_against_the_configured_runs(tmp_path):
    """Issue 18 §1: a published row whose run/backbone no configured run has fails, as does a row whose
    settings the named run does not have, and a configured run with the settings of a published row
    filed under another name."""
    from sentemb.report.paper_tables import check_against_config

    def entries(text):
        p = tmp_path / "p.yaml"
        p.write_text("results:\n" + text)
        return load_paper_results(p)

    cfg = _mini_config([{"method": "una", "backbone": "bert"},
                        {"name": "una-para", "method": "una", "backbone": "bert", "method_args": {"paraphrase": True}},
                        {"name": "una-code", "method": "una", "backbone": "bert",
                         "method_args": {"paraphrase": True, "redraw": "code"}}],
                       baselines={"bert": ["avg"]})
    good = ("  - {method: una, backbone: bert, method_args: {paraphrase: false}, table: sts, source: T1, scores: {Avg: 76.1}}\n"
            "  - {method: una, name: una-para, also: [una-code], backbone: bert, method_args: {paraphrase: true},"
            " table: sts, source: T1, scores: {Avg: 77.7}}\n"
            "  - {method: baseline, backbone: bert, pooler: avg, table: sts, source: T5, scores: {Avg: 50.0}}\n")
    check_against_config(entries(good), cfg)
    # a row no run reproduces (name or backbone)
    with pytest.raises(SentembError, match=r"results\[0\].*no configured run 'una-para-only' on backbone 'bert'"):
        check_against_config(entries("  - {method: una, name: una-para-only, backbone: bert, table: sts, source: T,"
                                     " scores: {Avg: 1.0}}\n"), cfg)
    with pytest.raises(SentembError, match="no configured run 'una' on backbone 'roberta'"):
        check_against_config(entries("  - {method: una, backbone: roberta, table: sts, source: T, scores: {Avg: 1.0}}\n"), cfg)
    # the paraphrase + UNA numbers filed under `una`, which trains without paraphrases
    with pytest.raises(SentembError, match=r"needs method_args.paraphrase = True, but run 'una'.*has False"):
        check_against_config(entries("  - {method: una, backbone: bert, method_args: {paraphrase: true}, table: sts,"
                                     " source: T, scores: {Avg: 77.7}}\n"), cfg)
    # una-code has una-para's settings but is not listed: its published numbers are filed elsewhere
    with pytest.raises(SentembError, match="run 'una-code' on 'bert' has the settings of 'una-para'"):
        check_against_config(entries(good.replace(", also: [una-code]", "")), cfg)
    # a baseline the config does not evaluate
    with pytest.raises(SentembError, match="no baseline 'bert' with pooler 'avg_static_last'"):
        check_against_config(entries("  - {method: baseline, backbone: bert, pooler: avg_static_last, table: sts,"
                                     " source: T, scores: {Avg: 1.0}}\n"), cfg)


def test_every_published_number_of_the_repo_is_on_a_configured_run(monkeypatch):
    """config/paper_results.yaml against config/config.yaml (the check above, on the shipped files)."""
    from conftest import REPO
    from sentemb.config.load import load_config
    from sentemb.report.paper_tables import check_against_config

    monkeypatch.chdir(REPO)
    check_against_config(load_paper_results(REPO / "config" / "paper_results.yaml"),
                         load_config(REPO / "config" / "config.yaml"))
