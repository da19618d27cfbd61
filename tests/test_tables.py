"""Table 1: mean over seeds per run name × backbone, sample std of Avg, n_seeds."""

import json
import math
import statistics

import pytest

from sentemb import SentembError
from sentemb.evaluate.senteval import TASKS
from sentemb.report.tables import collect, table1, to_markdown


def _eval_json(path, name, backbone, seed, base):
    scores = {t: base + i for i, t in enumerate(TASKS)}  # Avg = base + 3
    path.write_text(json.dumps({**scores, "avg": base + 3,
                                "run": {"name": name, "method": "simcse", "backbone": backbone, "seed": seed}}))
    return path


def test_table1_means_std_and_groups(tmp_path):
    paths = [_eval_json(tmp_path / f"{n}{b}{s}.json", n, b, s, base)
             for n, b, s, base in [("simcse", "bert", 1, 70.0), ("simcse", "bert", 2, 74.0),
                                   ("simcse", "bert", 3, 75.0), ("simcse", "roberta", 1, 60.0)]]
    t = table1(collect(paths)).set_index(["name", "backbone"])
    bert = t.loc[("simcse", "bert")]
    assert bert["STS12"] == pytest.approx(round(statistics.mean([70, 74, 75]), 2))
    assert bert["SICKRelatedness"] == pytest.approx(round(statistics.mean([76, 80, 81]), 2))
    assert bert["Avg"] == pytest.approx(round(statistics.mean([73, 77, 78]), 2))
    assert bert["std"] == pytest.approx(round(statistics.stdev([73, 77, 78]), 2))  # sample std over seeds
    assert bert["n_seeds"] == 3
    rob = t.loc[("simcse", "roberta")]
    assert (rob["Avg"], rob["n_seeds"]) == (63.0, 1) and math.isnan(rob["std"])  # one seed: no spread, not 0.00
    md = to_markdown(table1(collect(paths)))
    assert "| simcse | simcse | roberta | 60.00 |" in md and md.splitlines()[-1].endswith("| 63.00 |  | 1 |"), md


def test_results_without_run_metadata_are_rejected(tmp_path):
    p = tmp_path / "e.json"
    p.write_text(json.dumps({"STS12": 1.0}))
    with pytest.raises(SentembError, match="run metadata"):
        collect([p])


def test_a_seed_given_twice_or_results_of_the_wrong_shape_are_refused_naming_the_file(tmp_path):
    """The same (name, backbone, seed, pooler) twice would count one seed twice: a shifted mean and a
    spread that was never measured (``std`` 0.00 with n_seeds 1)."""
    a = _eval_json(tmp_path / "a.json", "simcse", "bert", 1, 70.0)
    b = _eval_json(tmp_path / "b.json", "simcse", "bert", 1, 71.0)
    with pytest.raises(SentembError, match=r"b\.json and .*a\.json: the same run \(name 'simcse', backbone 'bert', "
                                           r"seed 1, pooler None\) given twice"):
        collect([a, b])
    with pytest.raises(SentembError, match="given twice"):
        collect([a, a])
    assert len(collect([a, _eval_json(tmp_path / "c.json", "simcse", "bert", 2, 71.0)])) == 2
    for doc, words in (([1, 2], "expected a JSON object of results, found list"),
                       ({"STS12": 1.0, "run": {"name": "x", "method": "m", "backbone": "b", "seed": 1.7}},
                        "run metadata seed 1.7 is not an integer"),
                       ({"STS12": "81.0", "run": {"name": "x", "method": "m", "backbone": "b", "seed": 1}},
                        "scores that are not numbers: {'STS12': '81.0'}"),
                       ({"run": {"name": "x", "method": "m", "backbone": "b", "seed": 1}}, "holds none of the scores")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        with pytest.raises(SentembError, match=r"bad\.json: " + words.replace("(", r"\(").replace("{", r"\{")
                           .replace(".", r"\.")):
            collect([bad])


def test_table_writes_both_files_or_neither(tmp_path, capsys):
    from sentemb.cli import main

    a = _eval_json(tmp_path / "a.json", "simcse", "bert", 1, 70.0)
    (tmp_path / "md").mkdir()  # the Markdown's path is a directory: its write fails
    out = tmp_path / "t.csv"
    assert main(["table", "--inputs", str(a), "--output", str(out), "--markdown", str(tmp_path / "md")]) == 2
    assert "md: cannot be written there (is a directory); nothing was written" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".t.csv*"))
    assert main(["table", "--inputs", str(a), "--output", str(out), "--markdown", str(tmp_path / "t.md")]) == 0
    assert out.exists() and (tmp_path / "t.md").exists()
