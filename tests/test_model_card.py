"""Model cards (issue 29 §1): every exported model carries a README.md that huggingface_hub parses,
whose results are the run's evaluation files, and which says how to load the model.

Real tiny models are trained and exported (``sentemb.train.loop.train``), evaluated with the real
``sentemb evaluate`` (so eval_sts.json has its real format), and the card is read back with
``huggingface_hub.ModelCard.load``; expectations come from those files, from hashlib/git run here,
and from the facts the test writes itself (the published numbers, the backbone's own card).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from sentemb import SentembError
from sentemb.cli import main as cli
from sentemb.testing import SENTS, tiny_run
from sentemb.train.loop import train

from conftest import REPO

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
HUB_ID = "org/tiny-bert"  # an id no table of known backbones holds: the license must come from its card
PUBLISHED = {"STSBenchmark": 76.85, "Avg": 76.25}


def card_of(model_dir: Path) -> ModelCard:
    return ModelCard.load(model_dir / "README.md")


def results(card: ModelCard) -> dict[tuple[str, str], float]:
    """(dataset type, metric type) -> value of the card's model-index."""
    return {(e.dataset_type, e.metric_type): e.metric_value for e in card.data.eval_results or []}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def backbone(tiny_bert_dir, tmp_path_factory) -> Path:
    """The tiny BERT with a model card of its own (as a mirror copy of a Hub model has): license mit."""
    d = tmp_path_factory.mktemp("backbone") / "tiny-bert"
    shutil.copytree(tiny_bert_dir, d)
    (d / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n# tiny\n")
    return d


def trained(root: Path, backbone: Path, corpus: Path, senteval: Path, method: str, **over) -> Path:
    """A run directory as the DAG leaves it after training: run_config.json, model/, train.json."""
    run = tiny_run(backbone, corpus, senteval, method, **over)
    run.backbone_hub_id = HUB_ID
    run_dir = root / method / "tiny" / f"seed{run.seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "run_config.json").write_text(json.dumps(run.to_dict(), indent=2))
    train(run, run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from sentemb.testing import tiny_corpus

    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", lines=64)


@pytest.fixture(scope="module")
def simcse(tmp_path_factory, backbone, corpus, tiny_senteval) -> Path:
    return trained(tmp_path_factory.mktemp("runs"), backbone, corpus, tiny_senteval, "simcse")


@pytest.fixture(scope="module")
def sarcse(tmp_path_factory, backbone, corpus, tiny_senteval) -> Path:
    """SARCSE exports its own sentence-transformers module (sentemb.methods.sarcse.SarcseSTModule)."""
    return trained(tmp_path_factory.mktemp("runs"), backbone, corpus, tiny_senteval, "sarcse",
                   method_args={"channels": 40, "self_adaptive": False}, max_steps=2)


def evaluate(run_dir: Path, senteval: Path, pooler: str) -> dict:
    """``sentemb evaluate`` as the rule runs it: eval_sts.json in its real format."""
    run = json.loads((run_dir / "run_config.json").read_text())
    meta = [a for k in ("name", "method", "backbone", "seed") for a in ("--run-meta", f"{k}={run[k]}")]
    assert cli(["evaluate", "--model", str(run_dir / "model"), "--pooler", pooler, "--data-dir", str(senteval),
                "--output", str(run_dir / "eval_sts.json"), "--quiet", *meta]) == 0
    return json.loads((run_dir / "eval_sts.json").read_text())


def write_transfer(run_dir: Path) -> dict:
    """eval_transfer.json as ``sentemb evaluate-transfer`` writes it (two tasks, MRPC with its F1)."""
    run = json.loads((run_dir / "run_config.json").read_text())
    doc = {"TREC": 61.2, "MRPC": 70.55, "MRPC_F1": 80.14, "avg": 65.875,
           "protocol": {"classifier": "sklearn", "classifier_description": "scikit-learn LogisticRegression",
                        "kfold": 10, "seed": 1111, "mrpc_features": "paper"},
           "pooler": "cls_before_pooler", "model": str(run_dir / "model"), "data_dir": "senteval",
           "tasks": ["TREC", "MRPC"], "n_sentences": 100, "seconds": 1.0, "details": {},
           "run": {k: run[k] for k in ("name", "method", "backbone", "seed")}}
    (run_dir / "eval_transfer.json").write_text(json.dumps(doc, indent=2))
    return doc


@pytest.fixture(scope="module")
def paper_results(tmp_path_factory) -> Path:
    """Published rows for the tiny SimCSE run: STS and dev; a transfer row pinned to another temperature."""
    p = tmp_path_factory.mktemp("paper") / "paper_results.yaml"
    p.write_text(f"""results:
  - method: simcse
    backbone: tiny
    table: sts
    source: "Test paper, Table 1"
    scores: {json.dumps(PUBLISHED)}
  - method: simcse
    backbone: tiny
    table: dev
    source: "Test paper, Table 9"
    scores: {{STSBenchmark: 82.45}}
  - method: simcse
    backbone: tiny
    method_args: {{temperature: 0.1}}
    table: transfer
    source: "Test paper, Table 3 (tau 0.1)"
    scores: {{TREC: 90.0}}
""")
    return p


@pytest.fixture(scope="module")
def evaluated(simcse, tiny_senteval, paper_results) -> dict:
    """The SimCSE run evaluated (STS, transfer) and its card rewritten by `sentemb model-card`."""
    export_card = (simcse / "model" / "README.md").read_text()
    sts = evaluate(simcse, tiny_senteval, "cls_before_pooler")
    transfer = write_transfer(simcse)
    assert cli(["model-card", "--run-dir", str(simcse), "--paper-results", str(paper_results),
                "--dataset", "princeton-nlp/datasets-for-simcse", "--output", str(simcse / "model_card.json")]) == 0
    return {"sts": sts, "transfer": transfer, "export_card": export_card, "card": card_of(simcse / "model"),
            "text": (simcse / "model" / "README.md").read_text()}


# ---------------------------------------------------------------------------------------- the export's card
def test_export_writes_a_card_without_results(evaluated, simcse, corpus):
    """`sentemb train` leaves a card in model/ before any evaluation: the Hub's front matter, no
    model-index, and train.json's provenance (the corpus digest and size, the commit) in its body."""
    card = ModelCard(evaluated["export_card"])  # as training left it, before `sentemb model-card`
    d = card.data
    assert d.library_name == "sentence-transformers" and d.pipeline_tag == "sentence-similarity"
    assert {"sentence-similarity", "simcse"} <= set(d.tags) and d.base_model == HUB_ID
    assert d.license == "mit" and d.language == ["en"]  # from the backbone's own card
    assert d.eval_results is None and "model-index" not in d.to_dict()
    assert "Not evaluated yet" in card.text
    prov = json.loads((simcse / "train.json").read_text())["provenance"]
    assert prov["corpus"]["sha256"] == sha256(corpus)
    assert prov["corpus"]["sentences"] == len(corpus.read_text().splitlines()) == 64
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert prov["git_commit"] == (head or None)
    assert sha256(corpus) in card.text and "64 sentences" in card.text
    if head:
        assert head in card.text


# ---------------------------------------------------------------------------------------- the card with results
def test_model_index_holds_the_runs_results(evaluated, simcse):
    """STS-B test (and every STS task, every transfer task) in the model-index equals the run's JSON,
    each with its metric and the SentEval protocol named."""
    card, sts, tr = evaluated["card"], evaluated["sts"], evaluated["transfer"]
    got = results(card)
    assert got[("mteb/stsbenchmark-sts", "cosine_spearman")] == sts["STSBenchmark"]
    hub = {"STS12": "mteb/sts12-sts", "STS13": "mteb/sts13-sts", "STS14": "mteb/sts14-sts", "STS15": "mteb/sts15-sts",
           "STS16": "mteb/sts16-sts", "STSBenchmark": "mteb/stsbenchmark-sts", "SICKRelatedness": "mteb/sickr-sts"}
    assert {t: got[(hub[t], "cosine_spearman")] for t in TASKS} == {t: sts[t] for t in TASKS}
    assert got[("SentEval/TREC", "accuracy")] == tr["TREC"] and got[("SentEval/MRPC", "accuracy")] == tr["MRPC"]
    assert got[("SentEval/MRPC", "f1")] == tr["MRPC_F1"]
    sts_results = [e for e in card.data.eval_results if e.metric_type == "cosine_spearman"]
    assert len(sts_results) == len(TASKS)
    for e in sts_results:
        assert e.task_type == "sentence-similarity" and e.dataset_split == "test"
        assert e.metric_config == "senteval-all" and e.metric_args["protocol"] == "SentEval"
        assert "x 100" in e.metric_name and e.metric_args["pooler"] == "cls_before_pooler"
    assert card.data.datasets == ["princeton-nlp/datasets-for-simcse"]
    assert set(card.data.metrics) == {"cosine_spearman", "accuracy", "f1"}
    marker = json.loads((simcse / "model_card.json").read_text())
    assert marker["sha256"] == sha256(simcse / "model" / "README.md") and marker["results"] == {"sts": True,
                                                                                              "transfer": True}


def test_body_sets_results_beside_the_published_row(evaluated):
    """The STS table puts this seed's score next to the published one of the run's row; a published
    row pinned to other settings (temperature 0.1) is not attached; the dev score is compared too."""
    text, sts = evaluated["text"], evaluated["sts"]
    row = next(line for line in text.splitlines() if line.startswith("| STS-B |"))
    assert row == f"| STS-B | {sts['STSBenchmark']:.2f} | {PUBLISHED['STSBenchmark']:.2f} |"
    avg = next(line for line in text.splitlines() if line.startswith("| Avg |"))
    assert avg == f"| Avg | {sts['avg']:.2f} | {PUBLISHED['Avg']:.2f} |"
    row = next(line for line in text.splitlines() if line.startswith("| STS12 |"))
    assert row == f"| STS12 | {sts['STS12']:.2f} |  |"  # not published: empty, never 0
    assert "Published: Test paper, Table 1." in text
    assert "Table 3 (tau 0.1)" not in text and "| TREC | 61.20 |" in text
    assert "Published STS-B dev score of this row: 82.45 (Test paper, Table 9)" in text


def test_a_published_average_stands_only_beside_an_average_over_the_same_tasks(evaluated, simcse, tmp_path,
                                                                             paper_results):
    """Evaluated on STS-B alone, the run's Avg is not the papers' seven-task Avg: no published Avg."""
    d = tmp_path / "run"
    shutil.copytree(simcse, d)
    doc = json.loads((d / "eval_sts.json").read_text())
    doc = {**{k: v for k, v in doc.items() if k not in TASKS}, "STSBenchmark": doc["STSBenchmark"],
           "avg": doc["STSBenchmark"], "tasks": ["STSBenchmark"]}
    (d / "eval_sts.json").write_text(json.dumps(doc))
    assert cli(["model-card", "--run-dir", str(d), "--paper-results", str(paper_results)]) == 0
    text = (d / "model" / "README.md").read_text()
    assert f"| Avg | {doc['avg']:.2f} |  |" in text.splitlines()
    assert f"| STS-B | {doc['STSBenchmark']:.2f} | {PUBLISHED['STSBenchmark']:.2f} |" in text.splitlines()
    sts = [k for k in results(card_of(d / "model")) if k[1] == "cosine_spearman"]
    assert sts == [("mteb/stsbenchmark-sts", "cosine_spearman")]


def test_body_says_what_defines_the_model(evaluated, simcse):
    """The resolved run's settings, the seed, the method and its paper's BibTeX with SimCSE's."""
    text = evaluated["text"]
    run = json.loads((simcse / "run_config.json").read_text())
    block = re.search(r"### Training Hyperparameters\n.*?```json\n(.*?)```", text, re.S).group(1)
    shown = json.loads(block)
    assert shown["train"] == run["train"] and shown["method_args"] == run["method_args"]
    assert shown["seed"] == run["seed"] == 7 and "paths" not in shown
    assert "- **Seed:** 7" in text
    assert "SimCSE: Simple Contrastive Learning of Sentence Embeddings" in text
    assert text.count("```bibtex") == 1 and "@inproceedings{gao2021simcse," in text  # SimCSE's run: one paper
    assert "SentEval protocol" in text and "cls_before_pooler" in text


def test_the_model_still_loads_and_embeds_after_its_card(evaluated, simcse):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from sentemb.evaluate.sts import embedder_for

    st = SentenceTransformer(str(simcse / "model"), device="cpu").encode(SENTS, convert_to_numpy=True)
    ours = embedder_for(simcse / "model", "cls_before_pooler", device="cpu")(SENTS)
    np.testing.assert_allclose(st, ours, atol=1e-5)
    assert "trust_remote_code=True" not in evaluated["text"]  # only built-in modules: no remote code


def test_a_method_with_its_own_module_says_how_to_load_it(sarcse):
    """SARCSE's export lists sentemb.methods.sarcse.SarcseSTModule: its card says to pass
    trust_remote_code=True, and that is how the model loads."""
    from sentence_transformers import SentenceTransformer

    text = (sarcse / "model" / "README.md").read_text()
    modules = json.loads((sarcse / "model" / "modules.json").read_text())
    custom = [m["type"] for m in modules if not m["type"].startswith("sentence_transformers.")]
    assert custom == ["sentemb.methods.sarcse.SarcseSTModule"]
    assert f"`{custom[0]}`" in text and 'SentenceTransformer("path/to/model", trust_remote_code=True)' in text
    assert "--pooler method" in text
    card = card_of(sarcse / "model")
    assert "sarcse" in card.data.tags and card.data.eval_results is None
    assert "@misc{liu-sarcse," in text and "@inproceedings{gao2021simcse," in text  # its paper and SimCSE's
    emb = SentenceTransformer(str(sarcse / "model"), device="cpu", trust_remote_code=True).encode(SENTS)
    assert emb.shape[0] == len(SENTS)


# ---------------------------------------------------------------------------------------- no, stale or bad results
def test_a_run_not_yet_evaluated_has_a_card_without_results(sarcse, paper_results):
    assert not (sarcse / "eval_sts.json").exists()
    assert cli(["model-card", "--run-dir", str(sarcse), "--paper-results", str(paper_results)]) == 0
    card = card_of(sarcse / "model")
    assert card.data.eval_results is None and "model-index" not in card.data.to_dict()
    assert "Not evaluated yet" in card.text and "| STS-B |" not in card.text


def test_results_older_than_the_model_are_left_out(evaluated, simcse, tmp_path, caplog):
    """An eval_sts.json older than train.json is an earlier model's: no results rather than wrong ones."""
    d = tmp_path / "run"
    shutil.copytree(simcse, d)
    t = (d / "train.json").stat().st_mtime
    for f in ("eval_sts.json", "eval_transfer.json"):
        os.utime(d / f, (t - 60, t - 60))
    assert cli(["model-card", "--run-dir", str(d)]) == 0
    assert card_of(d / "model").data.eval_results is None
    assert "older than" in caplog.text and "eval_sts.json" in caplog.text


@pytest.mark.parametrize("bad", ["another run", "not json", "no number"])
def test_bad_results_are_an_error_naming_the_file_and_leave_the_card_whole(evaluated, simcse, tmp_path, bad):
    d = tmp_path / "run"
    shutil.copytree(simcse, d)
    before = (d / "model" / "README.md").read_bytes()
    f = d / "eval_sts.json"
    doc = json.loads(f.read_text())
    if bad == "another run":
        doc["run"]["seed"] = 8
        f.write_text(json.dumps(doc))
    elif bad == "not json":
        f.write_text('{"STS12": 1.0,')
    else:
        doc["STSBenchmark"] = "n/a"
        f.write_text(json.dumps(doc))
    with pytest.raises(SentembError, match=re.escape(str(f))):
        from sentemb.report.model_card import write_run_card

        write_run_card(d)
    assert (d / "model" / "README.md").read_bytes() == before
    assert not [p.name for p in (d / "model").iterdir() if p.name.startswith(".README")]  # no temporary left


def test_a_run_without_its_resolved_settings_is_an_error_naming_the_file(evaluated, simcse, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(simcse, d)
    (d / "run_config.json").unlink()
    assert cli(["model-card", "--run-dir", str(d)]) == 2  # SentembError -> exit 2, message on stderr
    from sentemb.report.model_card import write_run_card

    with pytest.raises(SentembError, match=re.escape(str(d / "run_config.json"))):
        write_run_card(d)


# ---------------------------------------------------------------------------------------- backbones and methods
def test_a_randomly_initialised_backbone_is_no_base_model(simcse, tmp_path):
    """A backbone built by `fetch_model` with random_init (the tiny DAG's) has only a borrowed
    tokenizer: no base_model, no license, and the body says so."""
    from sentemb.report.model_card import CardInputs, render

    d = tmp_path / "random"
    d.mkdir()
    (d / "sentemb_source.json").write_text(json.dumps({"hub_id": "sentence-transformers/all-MiniLM-L6-v2",
                                                       "random_init": {"model_type": "bert", "hidden_size": 32}}))
    run = json.loads((simcse / "run_config.json").read_text())
    run["backbone_hub_id"] = "sentence-transformers/all-MiniLM-L6-v2"
    run["paths"] = {**run["paths"], "model": str(d)}
    card = ModelCard(render(CardInputs(run=run, model_dir=simcse / "model")))
    assert card.data.base_model is None and card.data.license is None
    assert "randomly initialised" in card.text
    # the title does not call it the pretrained model: only the tokenizer is all-MiniLM-L6-v2's
    assert "# SimCSE on a randomly initialised bert (tokenizer of sentence-transformers/all-MiniLM-L6-v2)" in card.text
    assert f"tokens (trained on sentences cut at {run['train']['max_len']} tokens)" in card.text


def test_a_plugin_method_is_named_by_its_file_and_digest(simcse):
    from sentemb.report.model_card import CardInputs, render

    plugin = REPO / "examples" / "methods" / "debiased.py"
    run = {**json.loads((simcse / "run_config.json").read_text()), "name": "debiased-simcse",
           "method": "debiased-simcse", "method_module": str(plugin), "method_digest": sha256(plugin)}
    text = render(CardInputs(run=run, model_dir=simcse / "model"))
    first_line = plugin.read_text().split('"""')[1].splitlines()[0]
    assert f"`{plugin}`" in text and sha256(plugin) in text and first_line in text
    assert "debiased-simcse" in ModelCard(text).data.tags


def test_every_builtin_method_has_a_citation_on_its_page():
    """The card's BibTeX comes from docs/methods/<method>.md: every registered method has one."""
    from sentemb.methods import registry
    from sentemb.report.model_card import method_page

    for name, cls in registry().items():
        if not cls.__module__.startswith("sentemb.methods."):
            continue
        page = method_page(name)
        assert page.bibtex.startswith("@") and page.title and page.display != name, name


def test_the_command_imports_no_torch(evaluated, simcse, tmp_path):
    """`sentemb model-card` runs once per run in the DAG: it must start without torch/transformers."""
    d = tmp_path / "run"
    shutil.copytree(simcse, d)
    code = ("import sys; from sentemb.cli import main; rc = main(['model-card', '--run-dir', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=120)
    assert p.stdout.split()[-3:] == ["0", "False", "False"], p.stdout + p.stderr
    assert results(card_of(d / "model")) == results(evaluated["card"])
