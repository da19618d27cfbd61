"""Evaluator: poolers, SentEval aggregation, readers, and the published MiniLM figure."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from types import SimpleNamespace

from sentemb import SentembError
from sentemb.model.encoder import Embedder
from sentemb.evaluate.sts import aggregate, cosine_pairs, evaluate_sts
from sentemb.model.backbone import pool
from sentemb.evaluate.senteval import load_task


def _outputs():
    torch.manual_seed(0)
    hs = tuple(torch.randn(2, 4, 3) for _ in range(4))  # embeddings + 3 layers
    return SimpleNamespace(last_hidden_state=hs[-1], hidden_states=hs, pooler_output=torch.randn(2, 3)), hs


def test_poolers_match_hand_computation():
    out, hs = _outputs()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    last = hs[-1]
    assert torch.equal(pool("cls_before_pooler", out, mask), last[:, 0])
    assert torch.equal(pool("cls", out, mask), out.pooler_output)
    exp_avg = torch.stack([last[0, :3].mean(0), last[1, :2].mean(0)])
    assert torch.allclose(pool("avg", out, mask), exp_avg)
    fl = (hs[1] + hs[-1]) / 2  # SimCSE: hidden_states[1] is the first Transformer layer
    assert torch.allclose(pool("avg_first_last", out, mask), torch.stack([fl[0, :3].mean(0), fl[1, :2].mean(0)]))
    t2 = (hs[-1] + hs[-2]) / 2
    assert torch.allclose(pool("avg_top2", out, mask), torch.stack([t2[0, :3].mean(0), t2[1, :2].mean(0)]))
    with pytest.raises(SentembError, match="unknown pooler"):
        pool("max", out, mask)


def test_aggregation_all_mean_wmean_against_scipy():
    rng = np.random.default_rng(0)
    subsets = []
    for name, n in [("a", 7), ("b", 13), ("c", 4)]:
        gold = rng.uniform(0, 5, n)
        subsets.append((name, gold + rng.normal(0, 1.5, n), gold))
    agg = aggregate(subsets)
    per = [spearmanr(s, g)[0] for _, s, g in subsets]
    assert agg["all"] == pytest.approx(spearmanr(np.concatenate([s for _, s, _ in subsets]),
                                                 np.concatenate([g for *_, g in subsets]))[0])
    assert agg["mean"] == pytest.approx(np.mean(per))
    assert agg["wmean"] == pytest.approx((7 * per[0] + 13 * per[1] + 4 * per[2]) / 24)
    assert agg["subsets"]["b"]["n"] == 13 and agg["n"] == 24
    # "all" differs from the mean when subsets are on different scales: the settings are distinct
    assert agg["all"] != pytest.approx(agg["mean"])


def test_cosine_pairs():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[2.0, 0.0], [-1.0, -1.0], [1.0, 0.0]])
    assert np.allclose(cosine_pairs(a, b), [1.0, -1.0, 0.0])


def test_embedder_dedupes_and_keeps_order(tiny_bert_dir):
    emb = Embedder.from_dir(tiny_bert_dir, "avg", device="cpu", batch_size=2)
    sents = ["a man plays guitar", "the dog", "a man plays guitar", "the sun is big and red today"]
    out = emb(sents)
    assert out.shape == (4, 32) and np.allclose(out[0], out[2])
    single = emb(["the dog"])
    assert np.allclose(single[0], out[1], atol=1e-5)  # padding in a batch does not change a vector


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_cls_last_layer_for_cls_only_equals_the_full_forward(arch, tiny_bert_dir, tiny_roberta_dir):
    """cls_before_pooler on the CPU computes the last layer for [CLS] only (ClsLastLayer): the same
    vectors as the full forward up to float rounding, padding included; other poolers, bf16 and
    other architectures take the full forward."""
    from sentemb.model.encoder import ClsLastLayer

    model_dir = tiny_bert_dir if arch == "bert" else tiny_roberta_dir
    sents = ["a man plays guitar", "the dog", "x", "the sun is big and red today and the sky is blue"]
    fast = Embedder.from_dir(model_dir, "cls_before_pooler", device="cpu", batch_size=3)
    full = Embedder.from_dir(model_dir, "cls_before_pooler", device="cpu", batch_size=3, cls_fast_path=False)
    assert fast._cls_last is not None and full._cls_last is None
    ref = full(sents)
    with torch.no_grad():  # and the plain Hugging Face forward, one sentence at a time (no padding)
        one = np.stack([full.model(**full.tokenizer([s], return_tensors="pt")).last_hidden_state[0, 0].numpy()
                        for s in sents])
    got = fast(sents)
    assert np.allclose(got, ref, atol=1e-5) and np.allclose(got, one, atol=1e-5)
    assert fast.model.encoder.layer[-1]._forward_pre_hooks == {}  # the hook is gone after each batch
    assert Embedder.from_dir(model_dir, "avg", device="cpu")._cls_last is None
    assert ClsLastLayer.of(torch.nn.Linear(2, 2)) is None


def test_evaluate_end_to_end_on_tiny_tree(tiny_bert_dir, tiny_senteval):
    emb = Embedder.from_dir(tiny_bert_dir, "cls_before_pooler", device="cpu")
    res = evaluate_sts(emb, tiny_senteval)
    tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    assert set(tasks) <= set(res)
    assert res["avg"] == pytest.approx(np.mean([res[t] for t in tasks]))
    d = res["details"]["STS12"]
    assert set(d["subsets"]) == {"MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"}
    assert res["STS12"] == d["all"]  # the "all" setting, × 100 like the per-subset figures
    assert d["mean"] == pytest.approx(np.mean([v["spearman"] for v in d["subsets"].values()]))
    assert res["STSBenchmark"] == res["details"]["STSBenchmark"]["all"] == res["details"]["STSBenchmark"]["mean"]
    mean = evaluate_sts(emb, tiny_senteval, ["STS12"], setting="mean")
    assert mean["STS12"] == pytest.approx(d["mean"])


def test_readers_drop_empty_gold_and_ignore_extra_columns(tmp_path):
    d = tmp_path / "STS" / "STS16-en-test"
    d.mkdir(parents=True)
    subsets = ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]
    for s in subsets:
        (d / f"STS.input.{s}.txt").write_text("a  b\tc d\tsrc1\tsrc2\ne f\tg h\tx\ty\ni j\tk l\n")
        (d / f"STS.gs.{s}.txt").write_text("3.0\n\n1.5\n")
    pairs = load_task(tmp_path, "STS16")
    assert [len(p) for p in pairs] == [2] * 5
    assert pairs[0].sent1 == ["a b", "i j"] and pairs[0].gold == [3.0, 1.5]


def test_missing_and_bad_data_files_name_the_file(tmp_path, tiny_senteval, tiny_bert_dir):
    (tmp_path / "STS" / "STS12-en-test").mkdir(parents=True)
    with pytest.raises(SentembError, match="STS.input.MSRpar.txt"):
        load_task(tmp_path, "STS12")
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(tiny_senteval, bad)
    (bad / "STS" / "STSBenchmark" / "sts-test.csv").write_bytes(b"x\ty\tz\t1\t\xff\xfe\tb\n")
    with pytest.raises(SentembError, match=r"sts-test.csv, line 1: not valid UTF-8"):
        load_task(bad, "STSBenchmark")
    # CLI: error names the file and no output JSON is left behind
    from sentemb.cli import main

    out = tmp_path / "eval.json"
    rc = main(["evaluate", "--model", str(tiny_bert_dir), "--pooler", "avg", "--data-dir", str(bad),
               "--output", str(out), "--quiet"])
    assert rc == 2 and not out.exists()
    assert not list(tmp_path.glob(".eval.json.tmp-*"))


@pytest.mark.parametrize("scores, msg", [
    (["1.0", "nan", "4.0"], r"sts-test\.csv, line 2: gold score 'nan' is not a finite number"),
    (["2.5", "inf", "4.0"], r"sts-test\.csv, line 2: gold score 'inf' is not a finite number"),
    (["3.0", "3.0", "3.0"], r"sts-test\.csv: all 3 gold scores are 3\.0; a correlation needs"),
    (["3.0"], r"sts-test\.csv: 1 scored pair\(s\); a correlation needs"),
])
def test_gold_scores_that_make_every_correlation_nan_are_refused_naming_the_file(tmp_path, scores, msg):
    """float() reads "nan" and "inf", and a subset whose gold scores are all equal (or one pair) has no
    Spearman: each would write NaN into the results with exit 0."""
    d = tmp_path / "STS" / "STSBenchmark"
    d.mkdir(parents=True)
    (d / "sts-test.csv").write_text("".join(f"g\tf\ty\t{i}\t{x}\ta{i} b\tc d{i}\n" for i, x in enumerate(scores)))
    with pytest.raises(SentembError, match=msg):
        load_task(tmp_path, "STSBenchmark")
    sts = tmp_path / "STS" / "STS12-en-test"
    sts.mkdir(parents=True)
    for sub in ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"):
        (sts / f"STS.input.{sub}.txt").write_text("a b\tc d\ne f\tg h\n")
        (sts / f"STS.gs.{sub}.txt").write_text("2.0\n2.0\n" if sub == "MSRvid" else "1.0\n2.0\n")
    with pytest.raises(SentembError, match=r"STS\.gs\.MSRvid\.txt: all 2 gold scores are 2\.0"):
        load_task(tmp_path, "STS12")
    assert len(load_task(tmp_path, "STS12", unscored=True)) == 5  # the corpus builder reads sentences only


@pytest.mark.realdata
def test_minilm_stsb_test_reproduces_mteb(shared, tmp_path):
    """all-MiniLM-L6-v2, masked mean pooling, raw STS-B test: the published MTEB figure 82.03."""
    from sentemb.cli import main

    out = tmp_path / "minilm.json"
    rc = main(["evaluate", "--model", str(shared / "models" / "all-MiniLM-L6-v2"), "--pooler", "avg",
               "--data-dir", str(shared / "data" / "senteval-raw"), "--tasks", "STSBenchmark",
               "--output", str(out), "--quiet"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["STSBenchmark"] == pytest.approx(82.03, abs=0.01)
    assert res["details"]["STSBenchmark"]["n"] == 1379


def test_test_time_encoding_is_fp32_unless_asked(tiny_bert_dir):
    """Issue 18 §3: STS and transfer encodings run in fp32 on every device by default (SentEval and
    the papers encode in fp32); bf16 autocast only when asked for. The reference is a plain fp32
    forward of the same model, pooled by hand."""
    from sentemb.config.load import load_schema

    assert load_schema()["properties"]["evaluation"]["properties"]["precision"]["default"] == "fp32"
    sents = ["a b c", "the cat sat on the mat", "x"]
    emb = Embedder.from_dir(tiny_bert_dir, "avg", device="cpu")
    assert emb.precision == "fp32"
    tok = emb.tokenizer(sents, padding=True, return_tensors="pt")
    with torch.no_grad():
        last = emb.model(**tok).last_hidden_state
    m = tok["attention_mask"].unsqueeze(-1).float()
    ref = ((last * m).sum(1) / m.sum(1)).numpy()
    got = emb(sents)
    assert np.allclose(got, ref, atol=1e-5)
    bf16 = Embedder.from_dir(tiny_bert_dir, "avg", device="cpu", precision="bf16")(sents)
    assert not np.allclose(bf16, ref, atol=1e-5)  # bf16 is really a different (rounded) encoding
    # the CLI defaults follow: none in the parser, the declared one (EvaluationSettings) when unset
    from sentemb.cli import build_parser
    from sentemb.cli.spec import evaluation_defaults

    p = build_parser()
    for cmd in ("evaluate", "evaluate-transfer", "encode-transfer"):
        args = p.parse_args([cmd, "--model", "m", "--pooler", "avg", "--data-dir", "d", "--output", "o"])
        assert args.precision is None, cmd  # no default in the parser: the command fills the declared one
    assert evaluation_defaults("precision") == {"precision": "fp32"}


def test_an_evaluation_job_reads_its_resolved_spec(tmp_path, monkeypatch):
    """Issue 28 §3: ``eval_spec`` resolves one evaluation job's settings (a run's pooler is its
    method's unless evaluation.pooler says otherwise; a baseline's is its own), each kind holding
    only its own settings; the command fills what the command line leaves unset from ``--spec`` and
    ``--tracking``, then from the declared defaults, and an explicit option wins."""
    from sentemb.cli import build_parser
    from sentemb.cli.spec import apply_spec, evaluation_defaults
    from sentemb.config.load import eval_spec, tracking_options, validate_config

    config = validate_config({"backbones": {"b": {"hub_id": "x/y"}}, "experiment": "e",
                              "runs": [{"method": "simcse", "backbone": "b"}, {"method": "infocse", "backbone": "b"}],
                              "evaluation": {"tasks": ["STS12", "SICKRelatedness"], "transfer_tasks": ["MR"],
                                             "transfer_classifier": "sklearn", "batch_size": 16}})
    sts = eval_spec(config, "sts", "b", name="simcse", seed=3)
    assert sts == {"pooler": "cls_before_pooler", "tasks": ["STS12", "SICKRelatedness"], "setting": "all",
                   "batch_size": 16, "precision": "fp32",
                   "run_meta": {"name": "simcse", "method": "simcse", "backbone": "b", "seed": 3},
                   "run_name": "eval/simcse/b/seed3", "tag": {}}
    assert eval_spec(config, "encode_transfer", "b", name="simcse", seed=3) == {
        "pooler": "cls_before_pooler", "tasks": ["MR"], "batch_size": 16, "precision": "fp32"}
    base = eval_spec(config, "transfer", "b", pooler="avg")
    assert base == {"pooler": "avg", "tasks": ["MR"], "mrpc_features": "paper", "classifier": "sklearn",
                    "run_meta": {"name": "untrained-avg", "method": "baseline", "backbone": "b", "seed": 0},
                    "run_name": "baseline-transfer/b/avg", "tag": {"rule": "evaluate-baseline-transfer"}}
    assert tracking_options(config) == {"track": True, "experiment": "e", "tracking_uri": None}
    spec, track = tmp_path / "spec.json", tmp_path / "tracking.json"
    spec.write_text(json.dumps(sts))
    track.write_text(json.dumps(tracking_options(config)))
    p = build_parser()
    args = p.parse_args(["evaluate", "--model", "m", "--data-dir", "d", "--output", "o", "--spec", str(spec),
                         "--tracking", str(track), "--batch-size", "8"])
    apply_spec(args, evaluation_defaults("tasks", "setting", "batch_size", "precision", "experiment"),
               required=("pooler",))
    assert (args.pooler, args.tasks, args.setting, args.batch_size, args.precision) == (
        "cls_before_pooler", "STS12,SICKRelatedness", "all", 8, "fp32")  # --batch-size given: it wins
    # converted as --run-meta converts each KEY=VALUE (sentemb.cli.argtypes.run_meta): the seed an int
    assert sorted(args.run_meta) == [("backbone", "b"), ("method", "simcse"), ("name", "simcse"), ("seed", 3)]
    assert (args.track, args.experiment, args.tracking_uri, args.run_name) == (True, "e", None, "eval/simcse/b/seed3")
    bare = p.parse_args(["evaluate", "--model", "m", "--data-dir", "d", "--output", "o"])
    with pytest.raises(SentembError, match="missing --pooler"):
        apply_spec(bare, evaluation_defaults("tasks"), required=("pooler",))
    for doc, match in (({"poolr": "avg"}, "'poolr' is not an option"),
                       ({"pooler": "max"}, "'pooler' = 'max' is not one of"),
                       ({"batch_size": "eight"}, "'batch_size' = 'eight': 'eight' is not an integer"),
                       ({"batch_size": 0}, "'batch_size' = 0: 0 is not a positive integer"),
                       ({"run_meta": {"seed": "x"}}, "'run_meta': 'x' is not an integer")):
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        bad = p.parse_args(["evaluate", "--model", "m", "--data-dir", "d", "--output", "o", "--spec",
                            str(tmp_path / "bad.json")])
        with pytest.raises(SentembError, match=match):
            apply_spec(bad, {})
    # the command itself reads the spec: the embedder is built with the spec's pooler, batch size
    # and the declared default precision (no model is loaded: the stub stops there)
    import sentemb.cli.evaluate as cli_evaluate

    seen = {}

    def stub(model, pooler, **kw):
        seen.update(pooler=pooler, **kw)
        raise SentembError("stub: stop before encoding")

    (tmp_path / "model").mkdir()
    monkeypatch.setattr(cli_evaluate, "embedder_for", stub)
    from sentemb.cli import main

    rc = main(["evaluate", "--model", str(tmp_path / "model"), "--data-dir", "d", "--output", str(tmp_path / "o.json"),
               "--spec", str(spec), "--tracking", str(track), "--quiet"])
    assert rc == 2 and (seen["pooler"], seen["batch_size"], seen["precision"]) == ("cls_before_pooler", 16, "fp32")
    with pytest.raises(SentembError, match="give a run"):
        eval_spec(config, "sts", "b", name="simcse", seed=1, pooler="avg")


def test_max_length_with_the_methods_embedder_is_refused_not_ignored(tmp_path):
    """``--pooler method`` hands the rows to the method's embedder (PromptBERT's template sets their
    length): a ``--max-length`` given with it was dropped silently; now it is an error naming both."""
    from sentemb.evaluate.sts import embedder_for

    with pytest.raises(SentembError, match=r"--max-length 16 does not apply with --pooler method"):
        embedder_for(tmp_path, "method", max_length=16)


def test_a_malformed_tracking_uri_fails_evaluate_before_it_evaluates(tmp_path, capsys, monkeypatch):
    """``sentemb evaluate --track`` with a mistyped URI stopped only after the whole evaluation, writing
    nothing; now it stops at its start (the model directory is empty: evaluating it would fail later)."""
    from sentemb.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # it would win over --tracking-uri
    rc = main(["evaluate", "--model", str(tmp_path), "--pooler", "avg", "--data-dir", str(tmp_path / "none"),
               "--tasks", "STSBenchmark", "--track", "--tracking-uri", "htp://127.0.0.1:5124",
               "--output", str(tmp_path / "e.json")])
    assert rc != 0 and "MLflow tracking URI 'htp://127.0.0.1:5124' is malformed" in capsys.readouterr().err
    assert not (tmp_path / "e.json").exists()
