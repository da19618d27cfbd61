"""Every printed row of every seed table is attached or named (issue 29 §3): config/paper_tables.yaml
against config/paper_results.yaml and against the papers' text (../shared/seeds, realdata)."""

import copy
import statistics

import pytest

from conftest import REPO, SHARED
from sentemb.report.paper_tables import (audit_paper, audit_references, audit_text, counts, labels, load_inventory,
                                  mentions, normalise)
from sentemb.report.paper import load_paper_results
from sentemb.report.studies import load_published

PAPER_RESULTS = REPO / "config" / "paper_results.yaml"
INVENTORY = REPO / "config" / "paper_tables.yaml"


@pytest.fixture(scope="module")
def inv():
    return load_inventory(INVENTORY)


@pytest.fixture(scope="module")
def published():
    return load_paper_results(PAPER_RESULTS), load_published(PAPER_RESULTS)


@pytest.fixture(scope="module")
def seeds():
    d = (SHARED / "seeds") if SHARED is not None else None
    if d is None or not d.is_dir():
        pytest.skip(f"the seed papers are not in {d} (set SENTEMB_SHARED or place shared/ beside the repository)")
    return d


def _find(inv, paper, kind, number):
    p = next(p for p in inv["papers"] if p["paper"] == paper)
    return p, next(i for i in p["items"] if str(i.get(kind)) == number)


# ------------------------------------------------------------------------------------ (c), (d)
def test_every_row_is_attached_or_named_and_every_entry_is_printed(inv, published):
    """(c) every attached reference names an entry / study point of paper_results.yaml and every
    reason is listed; (d) every results entry and every study point is attached to a printed row."""
    results, studies = published
    assert audit_references(inv, results, studies) == []
    c = counts(inv)
    assert c["items"]["table"] >= 39 and c["rows_attached"] >= 150


def test_reference_checks_fail(inv, published):
    results, studies = published
    bad = copy.deepcopy(inv)
    _, t8 = _find(bad, "paser", "table", "8")
    t8["rows"][1]["attached"] = ["results:paser-code@bert-base-uncased/dev"]    # no such entry
    _, t4 = _find(bad, "paser", "table", "4")
    t4["rows"][-1]["omitted"] = "because"                                          # no such reason
    _, t3 = _find(bad, "sarcse", "table", "3")
    t3["rows"][0].pop("attached")                                                  # neither
    problems = "\n".join(audit_references(bad, results, studies))
    assert "'results:paser-code@bert-base-uncased/dev' names no entry" in problems
    assert "reason 'because' is not in `reasons`" in problems
    assert "row ['0 73.05']: neither attached nor omitted" in problems
    # ... and the entries only those rows carried are now unprinted
    assert "results:paser-code@bert-base-uncased/sts: no printed row" in problems
    assert "studies:sarcse-theta points {'theta': 0.0}: no printed row" in problems
    # an entry added to paper_results.yaml without a printed row
    extra = [*results, {"method": "simcse", "name": "simcse-x", "backbone": "bert-base-uncased", "table": "dev",
                        "source": "s", "scores": {"STSBenchmark": 1.0}}]
    assert audit_references(inv, extra, studies) == [
        "results:simcse-x@bert-base-uncased/dev: no printed row of config/paper_tables.yaml is attached to it"]


# ------------------------------------------------------------------------------------ (a), (b)
@pytest.mark.realdata
def test_every_table_and_row_of_the_papers_is_in_the_inventory(inv, published, seeds):
    """(a) every Table / Figure each paper mentions is an item (and no item is invented); (b) every
    listed row is printed in its table's region, and every printed data line carries a listed row;
    (e) the numbers printed on each attached row are its entries' numbers."""
    assert audit_text(inv, seeds) == []
    assert audit_text(inv, seeds, *published) == []


@pytest.mark.realdata
def test_a_misattached_row_fails(inv, published, seeds):
    """Two rows' attachments swapped, or an inconsistency not declared under `differs`, are found."""
    bad = copy.deepcopy(inv)
    _, t2 = _find(bad, "sarcse", "table", "2")
    a, b = t2["rows"][1], t2["rows"][7]  # SARCSE at batch 32 and at batch 192
    a["attached"], b["attached"] = b["attached"], a["attached"]
    _, c4 = _find(bad, "una", "table", "C4")
    c4["rows"][-1].pop("differs")  # .8235 printed, .8234 held
    problems = "\n".join(audit_text(bad, seeds, *published))
    assert "sarcse Table 2 row ['SARCSE 73.11']: its attached entries account for 1 of its printed numbers" in problems
    assert "sarcse Table 2 row ['SARCSE 73.05']" in problems
    assert "una Table C4 row ['0 .8161']: none of results:una-para-only@bert-base-uncased/dev's numbers" in problems
    # `differs` must name an attached entry and come with a note
    c4["rows"][-1]["differs"] = ["results:una@bert-base-uncased/dev"]
    assert any("`differs` 'results:una@bert-base-uncased/dev' must be attached" in x
               for x in audit_references(bad, *published))


@pytest.mark.realdata
def test_text_checks_fail_on_the_real_papers(inv, seeds):
    """The audit finds a forgotten table, a forgotten row, an invented row and a wrong seed file."""
    bad = copy.deepcopy(inv)
    paser, t4 = _find(bad, "paser", "table", "4")
    t4["rows"] = [r for r in t4["rows"] if r.get("omitted") != "combined-eda"]     # forget "+ SR + RD/RS"
    paser["items"] = [i for i in paser["items"] if str(i.get("table")) != "10"]     # forget Table 10
    _, t9 = _find(bad, "paser", "table", "9")
    t9["rows"].append({"row": "Top3 avg.", "omitted": "train-pooler"})              # a row not printed
    bad["papers"][0]["identify"] = "PaSeR"                                          # sarcse's file is not PaSeR
    problems = "\n".join(audit_text(bad, seeds))
    assert "paser: Table 10 is in the paper but not in the inventory" in problems
    assert "paser Table 4: printed row '+ SR + RD 77.2 77.5 64.5' is neither attached nor omitted" in problems
    assert "paser Table 4: printed row '+ SR + RS 77.3 77.6 63.1'" in problems
    assert "paser Table 9: 'Top3 avg.' is not printed in the table's region" in problems
    assert "sarcse: 'PaSeR' is not in its seed text" in problems


def test_text_checks_on_a_small_paper():
    text = ("We show the results in Table 1 and Figure 2.\n"
            "Model\tSTS-B\tAvg.\n"
            "SimCSE\t76.85\t76.25\n"
            "Other-BERT\t70.00\t71.00\n"
            "Ours\t80.00\t78.00\n"
            "Table 1: Results.\n")
    entry = {"paper": "p", "identify": "We show the results", "items": [
        {"table": "1", "region": ["Model STS-B", "Table 1:"], "rows": [
            {"row": "SimCSE", "attached": ["results:simcse@b/sts"]},
            {"row": "Ours", "attached": ["results:ours@b/sts"]}]},
        {"table": "3", "omitted": "no-scores"}]}
    problems = audit_paper(entry, text)
    assert sorted(problems) == ["p Table 1: printed row 'Other-BERT 70.00 71.00' is neither attached nor omitted",
                                "p: Figure 2 is in the paper but not in the inventory",
                                "p: Table 3 is in the inventory but not in the paper"]
    # a label that is only the start of another row's label does not cover that row
    entry["items"][0]["rows"].append({"row": "BERT", "omitted": "other-method"})
    assert "p Table 1: printed row 'Other-BERT 70.00 71.00'" in "\n".join(audit_paper(entry, text))
    entry["items"][0]["rows"][-1]["row"] = "Other-BERT"
    entry["items"].pop()
    assert audit_paper(entry, text) == ["p: Figure 2 is in the paper but not in the inventory"]
    assert mentions("see Table\n3. and Fig. 4") == {"table": {"3"}, "figure": {"4"}}
    assert normalise("BERT <sub>base</sub> $\\text{x}_{y}$ | 1.0 |") == "BERT base x y 1.0"


# ------------------------------------------------------------------------------------ the in-paper inconsistencies
def test_inconsistencies_are_recorded_next_to_their_rows(inv, published):
    results, studies = published
    paser = next(e for e in results if e["method"] == "paser" and e["table"] == "sts" and not e.get("name"))
    assert paser["scores"]["STSBenchmark"] == 79.19 and "79.3 / 65.4" in paser["note"]
    topk = {p["at"]["top_k"]: p["scores"] for p in studies["paser-topk"]["points"]}
    assert topk[5] == {"STSBenchmark": 79.3, "SICKRelatedness": 65.4}
    seeds = studies["una-para-seeds"]
    assert round(statistics.mean(p["scores"]["Avg"] for p in seeds["points"]), 2) == 76.97  # printed: .7698
    assert round(statistics.mean(p["scores"]["Avg"] for p in seeds["reference"]), 2) == 75.16  # printed: .7516
    assert ".7698" in seeds["note"] and "76.97" in seeds["note"]
    _, d7 = _find(inv, "una", "table", "D7")
    assert any(labels(r) == ["Mean (std.)"] and ".7698" in r["note"] for r in d7["rows"])
    # paser-code is Table 8's m = n = 1 row, not the full model's
    assert not any("paser-code" in e.get("also", []) for e in results)
    code = next(e for e in results if e.get("name") == "paser-code")
    assert code["method_args"]["signal_m"] == code["method_args"]["signal_n"] == 1.0
    assert code["scores"] == {"STSBenchmark": 78.7, "SICKRelatedness": 64.8}
