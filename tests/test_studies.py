"""Studies (issue 21): expansion into runs (names, grid, reuse, errors naming the key), the table's
statistics against an independent computation, the figure, the paper config's studies."""

import copy
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from conftest import REPO
from sentemb import SentembError
from sentemb.config.load import load_config, resolve_run, validate_config
from sentemb.report.studies import load_published, read_values, study_figure, study_table
from sentemb.config.studies import format_value, point_name, study_tags

BASE = {
    "backbones": {"bert": {"hub_id": "google-bert/bert-base-uncased"}},
    "runs": [{"method": "simcse", "backbone": "bert"},
             {"method": "sarcse", "backbone": "bert", "train": {"lr": 1.0e-5}}],
    "seeds": [1, 2],
}


def cfg(*studies, runs=None):
    c = copy.deepcopy(BASE)
    if runs is not None:
        c["runs"] = runs
    c["studies"] = list(studies)
    return validate_config(c)


def names(c):
    return [r["name"] for r in c["runs"]]


def test_names_are_canonical_and_filesystem_safe():
    assert format_value(0.3, "k") == "0.3" and format_value(1.0e-5, "k") == "1e-05" and format_value(10.0, "k") == "10"
    assert format_value(10, "k") == "10" and format_value(True, "k") == "true" and format_value("mean", "k") == "mean"
    assert format_value(1e20, "k") == "1e20"
    assert point_name("s", {"theta": 0.3, "batch_size": 64}, "w") == "s/theta=0.3,batch_size=64"
    with pytest.raises(SentembError, match="w.k"):
        format_value("a b", "w.k")


def test_one_key_becomes_named_runs_and_the_default_reuses_the_run():
    c = cfg({"name": "sarcse-theta", "method": "sarcse", "backbone": "bert", "train": {"lr": 1.0e-5},
             "vary": {"method_args.theta": [0.0, 0.1, 0.3]}, "seeds": [42]})
    assert names(c) == ["simcse", "sarcse", "sarcse-theta/theta=0", "sarcse-theta/theta=0.3"]
    exp = c["studies"][0]["expanded"]
    assert [p["run"] for p in exp] == ["sarcse-theta/theta=0", "sarcse", "sarcse-theta/theta=0.3"]
    assert [p["reused"] for p in exp] == [False, True, False]
    sarcse = c["runs"][1]
    assert sarcse["seeds"] == [1, 2, 42]  # the reused run trains the study's seed too
    run = resolve_run(c, "sarcse-theta/theta=0.3", "bert", 42).to_dict()
    assert run["method_args"]["theta"] == 0.3 and run["train"]["lr"] == 1.0e-5
    assert run["study"] == "sarcse-theta" and run["point"] == {"theta": 0.3}
    assert study_tags(resolve_run(c, "sarcse-theta/theta=0.3", "bert", 42)) == {"study": "sarcse-theta",
                                                                               "point": "theta=0.3"}
    assert study_tags(resolve_run(c, "simcse", "bert", 1)) == {}
    # validation is idempotent: a second pass finds the points already there
    again = validate_config(copy.deepcopy(c))
    assert names(again) == names(c) and again["studies"][0]["expanded"] == exp


def test_a_grid_of_two_keys_and_explicit_points():
    c = cfg({"name": "g", "method": "simcse", "backbone": "bert",
             "vary": {"method_args.temperature": [0.05, 0.1], "train.batch_size": [32, 64]}})
    assert [p["run"] for p in c["studies"][0]["expanded"]] == [
        "g/temperature=0.05,batch_size=32", "simcse", "g/temperature=0.1,batch_size=32", "g/temperature=0.1,batch_size=64"]
    c = cfg({"name": "p", "method": "simcse", "backbone": "bert",
             "points": [{"method_args.temperature": 0.1, "train.lr": 1.0e-5}, {"method_args.temperature": 0.2, "train.lr": 2.0e-5}]})
    assert names(c)[2:] == ["p/temperature=0.1,lr=1e-05", "p/temperature=0.2,lr=2e-05"]


def test_two_studies_share_a_point_and_a_seeds_study_sets_the_reference_seeds():
    c = cfg({"name": "a", "method": "simcse", "backbone": "bert", "vary": {"method_args.temperature": [0.1]}},
            {"name": "b", "method": "simcse", "backbone": "bert", "vary": {"method_args.temperature": [0.1, 0.2]}},
            {"name": "seeds", "method": "sarcse", "backbone": "bert", "train": {"lr": 1.0e-5}, "seeds": [5, 6, 7]})
    assert c["studies"][1]["expanded"][0]["run"] == "a/temperature=0.1"  # trained once
    assert c["studies"][2]["expanded"][0]["run"] == "sarcse" and c["studies"][2]["reference"] == "simcse"
    assert c["runs"][0]["seeds"] == [1, 2, 5, 6, 7] and c["runs"][1]["seeds"] == [1, 2, 5, 6, 7]


@pytest.mark.parametrize("study, key", [
    ({"vary": {"method_args.thetta": [0.1]}}, "studies[0].vary.method_args.thetta"),
    ({"vary": {"method_args.theta": ["high"]}}, "studies[0].vary.method_args.theta"),
    ({"vary": {"train.batch_sise": [32]}}, "studies[0].vary.train.batch_sise"),
    ({"vary": {"train.batch_size": [0.5]}}, "studies[0].vary.train.batch_size"),
    ({"vary": {"theta": [0.1]}}, "studies[0].vary.theta"),
    ({"vary": {"method_args.theta": [0.1, 0.1]}}, "studies[0].vary.method_args.theta"),
    ({"points": [{"method_args.theta": 0.1}, {"train.lr": 1.0}]}, "studies[0].points[1]"),
    ({"metric": "STS-B"}, "studies[0].metric"),
    ({"backbone": "roberta"}, "studies[0].backbone"),
    ({"method_args": {"theta": "x"}}, "studies[0].method_args.theta"),
    # the dev score of a run that keeps its last model is null: the study's table would have nothing to show
    ({"metric": "best_dev_stsb", "vary": {"train.model_selection": ["best_dev", "last"]}}, "studies[0].metric"),
])
def test_bad_keys_and_values_name_the_study_and_the_key(study, key):
    s = {"name": "s", "method": "sarcse", "backbone": "bert", "vary": {"method_args.theta": [0.2]}, **study}
    if "points" in study:
        s.pop("vary")
    with pytest.raises(SentembError, match=key.replace("[", r"\[").replace("]", r"\]")):
        cfg(s)


def test_seeds_study_needs_a_reference():
    with pytest.raises(SentembError, match=r"studies\[0\].reference"):
        cfg({"name": "s", "method": "sarcse", "backbone": "bert", "seeds": [1], "reference": "nope"})


def _files(tmp_path, values, kind="eval_sts"):
    paths = []
    for (name, seed), v in values.items():
        d = tmp_path / name / f"seed{seed}"
        d.mkdir(parents=True)
        body = {"run": {"name": name, "seed": seed}, "STSBenchmark": v} if kind == "eval_sts" else \
            {"name": name, "seed": seed, "best_dev_stsb": v}
        (d / f"{kind}.json").write_text(json.dumps(body))
        paths.append(d / f"{kind}.json")
    return paths


def test_table_statistics_match_an_independent_computation(tmp_path):
    c = cfg({"name": "t", "method": "simcse", "backbone": "bert", "metric": "STSBenchmark", "seeds": [1, 2, 3],
             "vary": {"method_args.temperature": [0.05, 0.1]}})
    spec = c["studies"][0]
    rng = np.random.default_rng(0)
    raw = {(p["run"], s): float(rng.normal(70, 3)) for p in spec["expanded"] for s in (1, 2, 3)}
    raw[("simcse", 9)] = 0.0  # a seed outside the study: not counted
    values = read_values(_files(tmp_path, raw), "STSBenchmark")
    t = study_table(spec, values, {"points": [{"at": {"method_args.temperature": 0.1}, "scores": {"STSBenchmark": 71.5}}]})
    for _, row in t.iterrows():
        v = np.array([raw[(row["run"], s)] for s in (1, 2, 3)])
        lo, hi = stats.t.interval(0.95, df=2, loc=v.mean(), scale=stats.sem(v))
        assert row["n_seeds"] == 3 and row["mean"] == pytest.approx(v.mean()) and row["std"] == pytest.approx(v.std(ddof=1))
        assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((lo, hi))
    assert list(t["temperature"]) == [0.05, 0.1]
    assert np.isnan(t.loc[0, "published"]) and t.loc[1, "published"] == 71.5


def test_sentemb_study_refuses_inputs_missing_a_point_and_writes_nothing(tmp_path, capsys, caplog):
    """``sentemb study`` given the results of some points only (a point's run not finished, a path
    mistyped): an error naming the missing (point, seed) pairs and no table, not a row of blanks."""
    from sentemb.cli import main

    c = cfg({"name": "t", "method": "simcse", "backbone": "bert", "metric": "STSBenchmark", "seeds": [1, 2],
             "vary": {"method_args.temperature": [0.05, 0.1]}})
    spec = c["studies"][0]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    runs = [p["run"] for p in spec["expanded"]]
    files = _files(tmp_path, {(runs[0], 1): 70.0, (runs[0], 2): 71.0, (runs[1], 1): 72.0})
    out = tmp_path / "t.csv"
    rc = main(["study", "--spec", str(tmp_path / "spec.json"), "--inputs", *map(str, files), "--output", str(out)])
    err = capsys.readouterr().err
    assert rc != 0 and not out.exists()
    assert f"study 't': no results for 1 of its 4 (point, seed) pairs among the 3 --inputs: {runs[1]} seed 2" in err
    # a file given without the metric (best_dev_stsb of a run keeping its last model is null): a warning and
    # a row without that seed, as before
    files += _files(tmp_path / "more", {(runs[1], 2): None})
    with caplog.at_level("WARNING"):
        assert main(["study", "--spec", str(tmp_path / "spec.json"), "--inputs", *map(str, files), "--output",
                     str(out)]) == 0
    assert f"1 result file(s) have no STSBenchmark (left out of the means): {runs[1]} seed 2" in caplog.text
    assert list(pd.read_csv(out)["n_seeds"]) == [2, 1]


def test_seeds_study_table_is_mean_std_ci_and_welch_against_the_reference(tmp_path):
    c = cfg({"name": "v", "method": "sarcse", "backbone": "bert", "train": {"lr": 1.0e-5},
             "metric": "best_dev_stsb", "seeds": [1, 2, 3, 4]})
    spec = c["studies"][0]
    raw = {("sarcse", s): 80 + s * 0.5 for s in (1, 2, 3, 4)} | {("simcse", s): 78 + s * 0.3 for s in (1, 2, 3, 4)}
    values = read_values(_files(tmp_path, raw, "train"), "best_dev_stsb")
    t = study_table(spec, values, {"points": [{"at": {"seed": 1}, "scores": {"best_dev_stsb": 81.0}},
                                              {"at": {"seed": 2}, "scores": {"best_dev_stsb": 83.0}}]})
    a, b = [raw[("sarcse", s)] for s in (1, 2, 3, 4)], [raw[("simcse", s)] for s in (1, 2, 3, 4)]
    assert list(t["role"]) == ["study", "reference"] and list(t["run"]) == ["sarcse", "simcse"]
    assert t.loc[0, "mean"] == pytest.approx(np.mean(a)) and t.loc[1, "std"] == pytest.approx(np.std(b, ddof=1))
    assert t.loc[0, "p_welch_vs_reference"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert t.loc[0, "published"] == 82.0 and t.loc[0, "published_std"] == pytest.approx(np.std([81, 83], ddof=1))


@pytest.mark.parametrize("vary", [{"method_args.temperature": [0.02, 0.05, 0.1]},
                                  {"method_args.temperature": [0.05, 0.1], "train.batch_size": [32, 64]}, None])
def test_figure_is_written(tmp_path, vary):
    study = {"name": "f", "method": "simcse", "backbone": "bert", "metric": "Avg"}
    if vary:
        study["vary"] = vary
    else:
        study["method"], study["train"] = "sarcse", {"lr": 1.0e-5}
    spec = cfg(study)["studies"][0]
    runs = [p["run"] for p in spec["expanded"]] + ([spec["reference"]] if spec.get("reference") else [])
    values = {(r, s): 70.0 + i + s for i, r in enumerate(runs) for s in spec["seeds"]}
    first = spec["expanded"][0]["point"] or {"seed": 1}
    out = study_figure(spec, values, {"points": [{"at": first, "scores": {"Avg": 72.0}}]}, tmp_path / "f.png")
    assert [p.suffix for p in out] == [".png", ".svg", ".pdf"] and out[0].stat().st_size > 5000


def test_every_paper_study_is_planned_with_its_published_values(monkeypatch):
    """config/config.yaml's studies: each published point of paper_results.yaml is a point of its study,
    and the runs they replaced (e.g. infocse-mask0.1) are study points the published dev rows name."""
    monkeypatch.chdir(REPO)
    c = load_config(REPO / "config" / "config.yaml")
    studies = {s["name"]: s for s in c["studies"]}
    published = load_published(REPO / "config" / "paper_results.yaml")
    assert set(published) <= set(studies)
    for name, entry in published.items():
        spec = studies[name]
        for p in entry.get("points") or []:
            if spec.get("reference"):
                assert p["at"]["seed"] in spec["seeds"]
                continue
            at = {k.split(".")[-1]: v for k, v in p["at"].items()}
            assert any(set(at) == set(q["point"]) and all(at[k] == q["point"][k] if isinstance(at[k], str)
                                                           else np.isclose(at[k], q["point"][k]) for k in at)
                       for q in spec["expanded"]), (name, p["at"])
            assert set(p["scores"]) >= {spec["metric"]}, name
    runs = {r["name"] for r in c["runs"]}
    assert {"infocse-mask/mask_rate=0.1", "infocse-lambda/aux_weight=0.005", "arccse-margin/margin_deg=2"} <= runs
    assert not {"infocse-mask0.1", "arccse-m5", "arccse-mask10-30"} & runs
    assert studies["sarcse-theta"]["expanded"][1]["run"] == "sarcse"  # θ = 0.1 is the paper's run
    assert studies["una-para-seeds"]["reference"] == "una-simcse" and len(studies["una-para-seeds"]["seeds"]) == 10
