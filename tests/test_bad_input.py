"""Bad input to the command line fails at once, naming the option, file or config key, with exit 2 and
no output left behind (the developers' guide: "never leaves a partial output that Snakemake would
mistake for a finished one"): sizes and seeds out of range, KEY=VALUE options, empty corpora."""

from __future__ import annotations

import argparse
import json

import pytest

from sentemb import SentembError
from sentemb.cli import main
from sentemb.cli.argtypes import fold_count, key_value, non_negative_int, port_int, positive_int, run_meta, seed_int


@pytest.mark.parametrize("fn, value, want", [
    (positive_int, "3", 3), (positive_int, 3, 3), (non_negative_int, "0", 0), (seed_int, "4294967295", 2**32 - 1),
    (key_value, "a=b=c", ("a", "b=c")), (run_meta, "seed=7", ("seed", 7)), (run_meta, "name=x", ("name", "x")),
    (port_int, "5000", 5000),
])
def test_argument_types_take_what_is_in_range(fn, value, want):
    assert fn(value) == want


@pytest.mark.parametrize("fn, value, words", [
    (positive_int, "0", "0 is not a positive integer"), (positive_int, "-2", "-2 is not a positive integer"),
    (positive_int, "8.5", "'8.5' is not an integer"), (positive_int, 8.5, "8.5 is not an integer"),
    (positive_int, True, "True is not an integer"), (non_negative_int, "-1", "-1 is negative"),
    (seed_int, "-1", "-1 is not a seed"), (seed_int, str(2**32), "is not a seed"),
    (key_value, "novalue", "'novalue' is not KEY=VALUE"), (key_value, "=x", "'=x' is not KEY=VALUE"),
    (run_meta, "seed=abc", "'abc' is not an integer"), (port_int, "70000", "70000 is not a TCP port"),
    (fold_count, "1", "1 folds: k-fold needs at least 2"),
])
def test_argument_types_refuse_what_is_out_of_range_in_their_own_words(fn, value, words):
    with pytest.raises(argparse.ArgumentTypeError, match=words.replace("(", r"\(")):
        fn(value)


@pytest.mark.parametrize("argv, words", [
    (["stats-rake", "--corpus", "c.txt", "--nltk-data", "n", "--output", "o.parquet", "--chunk-size", "0"],
     "argument --chunk-size: 0 is not a positive integer"),
    (["stats-freq", "--corpus", "c.txt", "--tokenizer", "t", "--output", "o.parquet", "--batch-size", "-1"],
     "argument --batch-size: -1 is not a positive integer"),
    (["run-config", "--config", "c.yaml", "--name", "x", "--backbone", "b", "--seed", "-1", "--output", "o.json"],
     "argument --seed: -1 is not a seed"),
    (["evaluate", "--model", "m", "--pooler", "avg", "--data-dir", "d", "--output", "o.json", "--run-meta", "foo"],
     "argument --run-meta: 'foo' is not KEY=VALUE"),
    (["evaluate", "--model", "m", "--pooler", "avg", "--data-dir", "d", "--output", "o.json", "--run-meta",
      "seed=abc"], "argument --run-meta: 'abc' is not an integer"),
    (["evaluate", "--model", "m", "--pooler", "avg", "--data-dir", "d", "--output", "o.json", "--tag", "foo"],
     "argument --tag: 'foo' is not KEY=VALUE"),
])
def test_options_out_of_range_stop_the_command_before_it_opens_anything(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_statistics_of_an_empty_corpus_are_refused_and_written_nowhere(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    out = tmp_path / "tfidf.parquet"
    assert main(["stats-tfidf", "--corpus", str(empty), "--output", str(out)]) == 2
    assert "empty.txt: the corpus holds no text (empty, or only blank lines)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]
    from sentemb.stats import chunked

    with pytest.raises(SentembError, match="chunk size must be at least 1, got 0"):
        list(chunked(range(3), 0))


def test_evaluate_without_a_task_is_refused_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "eval.json"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"pooler": "avg", "tasks": []}))
    for extra in (["--tasks", ","], ["--spec", str(spec)]):
        assert main(["evaluate", "--model", str(tmp_path / "absent"), "--data-dir", str(tmp_path), "--output",
                     str(out), *(["--pooler", "avg"] if extra[0] == "--tasks" else []), *extra]) == 2
        assert "--tasks: no task given" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("text, words", [
    ("seeds: [-1]\n", "config key 'seeds[0]': -1 is less than the minimum of 0"),
    ("runs:\n  - {method: simcse, backbone: minilm, seeds: [4294967296]}\n",
     "config key 'runs[0].seeds[0]': 4294967296 is greater than the maximum of 4294967295"),
    ("train: {batch_size: 16.0}\n", "config key train.batch_size: 16.0 is not an integer"),
    ("runs:\n  - {method: simcse, backbone: minilm, train: {batch_size: 16.0}}\n",
     "config key runs[0].train.batch_size: 16.0 is not an integer"),
    ("corpus: {sample_seed: 4294967296}\n", "config key 'corpus.sample_seed': 4294967296 is greater than the maximum"),
    ("baselines: {minilm: [avg, cls, avg]}\n", "config key 'baselines.minilm': pooler(s) avg listed twice"),
    ("experiment: ' '\n", "config key 'experiment': ' ' does not match"),
    ("studies:\n  - {name: s, method: simcse, backbone: minilm, vary: {}}\n",
     "'studies[0].vary': empty; give at least one key, or leave it out for a study over seeds"),
])
def test_config_values_that_would_fail_a_job_later_are_named_with_their_file(tmp_path, monkeypatch, capsys, text,
                                                                             words):
    from conftest import REPO

    from sentemb.config.load import load_config

    monkeypatch.chdir(REPO)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["check-config", "config/demo.yaml", str(bad)]) == 2
    err = capsys.readouterr().err
    assert words in err and f"invalid configuration in config/demo.yaml, {bad}" in err, err
    assert load_config("config/demo.yaml")  # the demo itself is fine


def test_a_hand_edited_run_config_is_named_with_its_file_and_key(tmp_path, capsys, tiny_bert_dir):
    from sentemb.config.settings import Run

    good = Run(name="r", method="simcse", backbone="b", seed=1,
               paths={"model": str(tiny_bert_dir), "corpus": "c.txt", "senteval": "s"}).to_dict()
    out = tmp_path / "out"
    cases = [([good], "expected a JSON object of settings, found list"),
             ({k: v for k, v in good.items() if k != "name"}, "missing key(s) name"),
             ({**good, "seed": "1"}, "'seed' = '1' is not an integer"),
             ({**good, "paths": {"model": "m"}}, "'paths' lacks corpus"),
             ({**good, "paths": ["m"]}, "'paths' = ['m'] is not a mapping")]
    for doc, words in cases:
        f = tmp_path / "run.json"
        f.write_text(json.dumps(doc))
        assert main(["train", "--run-config", str(f), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--run-config {f}: run config: {words}" in err, err
        assert not out.exists()
    # an unknown method is named before anything loads (here the corpus and model paths lead nowhere)
    f.write_text(json.dumps({**good, "method": "simcsee", "paths": {"model": "no-model", "corpus": "no.txt",
                                                                    "senteval": "s"}}))
    assert main(["train", "--run-config", str(f), "--output-dir", str(tmp_path / "out2")]) == 2
    assert "unknown method 'simcsee'" in capsys.readouterr().err and not (tmp_path / "out2" / "model").exists()
    f.write_text(json.dumps(good))
    opts = tmp_path / "options.json"
    opts.write_text("[1]")
    assert main(["train", "--run-config", str(f), "--options", str(opts), "--output-dir", str(out)]) == 2
    assert "expected a JSON object" in capsys.readouterr().err and not out.exists()
    opts.write_bytes(b'{"train": {"log_steps": 5, "x": "\xff"}}')
    assert main(["train", "--run-config", str(f), "--options", str(opts), "--output-dir", str(out)]) == 2
    assert f"cannot read --options {opts}" in capsys.readouterr().err and not out.exists()


def test_an_unwritable_output_is_named_but_an_unreadable_input_is_not_blamed_on_it(tmp_path):
    import errno

    from sentemb.utils import atomic_path

    (tmp_path / "out.json").mkdir()
    with pytest.raises(SentembError, match=r"out\.json: cannot be written there \(is a directory\)"):
        with atomic_path(tmp_path / "out.json") as tmp:
            tmp.write_text("{}")
    with pytest.raises(PermissionError):  # reading a source inside the block: its own error, not the output's
        with atomic_path(tmp_path / "other.json"):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "mirror" / "vocab.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_weights_cut_short_are_refused_and_the_old_pickle_format_is_left_to_the_loader(tmp_path):
    import zipfile

    from sentemb.model.backbone import check_weights

    d = tmp_path / "m"
    d.mkdir()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.")  # torch < 1.6: a pickle
    check_weights(d)
    with zipfile.ZipFile(d / "pytorch_model.bin", "w") as z:
        z.writestr("archive/data.pkl", b"x" * 4096)
    check_weights(d)
    whole = (d / "pytorch_model.bin").read_bytes()
    (d / "pytorch_model.bin").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SentembError, match=r"pytorch_model\.bin: not a whole PyTorch checkpoint"):
        check_weights(d)


def test_a_stand_in_tokenizer_at_real_shapes_loads_and_a_model_trained_from_it_stays_marked(tmp_path):
    """``sentemb.ops.shapes.write_model_dir`` pairs RoBERTa's 50265-row embedding with a byte-level
    stand-in tokenizer of a few hundred ids (no network for the real one): marked, it is not taken for
    a cut vocabulary, and an export of a model trained from it carries the mark."""
    from sentemb.model.backbone import STAND_IN_TOKENIZER, export, load_encoder, load_tokenizer
    from sentemb.ops.shapes import ARCHITECTURES, write_model_dir

    arch = {**ARCHITECTURES["roberta-base"], "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
    d = write_model_dir(arch, tmp_path / "rb", num_layers=1)
    assert (d / STAND_IN_TOKENIZER).is_file()
    enc, tok = load_encoder(d)
    assert len(tok) < enc.config.vocab_size // 2 == 50265 // 2
    export(enc, tok, tmp_path / "out", pooler="avg", max_seq_length=32)
    assert (tmp_path / "out" / STAND_IN_TOKENIZER).is_file() and len(load_tokenizer(tmp_path / "out")) == len(tok)
    (tmp_path / "out" / STAND_IN_TOKENIZER).unlink()
    with pytest.raises(SentembError, match="its vocabulary file is missing, cut or another model's"):
        load_tokenizer(tmp_path / "out")


def test_transfer_data_that_no_classifier_can_fit_is_refused_before_encoding(tmp_path):
    from sentemb.evaluate.transfer import check_folds, load_transfer_task

    cr = tmp_path / "CR"
    cr.mkdir()
    (cr / "custrev.pos").write_text("")
    (cr / "custrev.neg").write_text("bad one\nworse\n")
    with pytest.raises(SentembError, match=r"transfer task CR: its training samples are all of one class \(.*custrev"):
        load_transfer_task(tmp_path, "CR")
    (cr / "custrev.pos").write_text("good\nfine\nnice\n")
    task = load_transfer_task(tmp_path, "CR")
    check_folds(task, 5)
    with pytest.raises(SentembError, match="transfer task CR: 5 training samples, fewer than the 10 folds"):
        check_folds(task, 10)
    sst = tmp_path / "SST" / "binary"
    sst.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (sst / f"sentiment-{split}").write_text("good film\t1\nbad film\t0\n")
    (sst / "sentiment-dev").write_bytes(b"good film\t1\nbad \xff film\t0\n")
    with pytest.raises(SentembError, match=r"sentiment-dev, line 2: not valid utf-8"):
        load_transfer_task(tmp_path, "SST2")
    (sst / "sentiment-test").write_text("\n")
    (sst / "sentiment-dev").write_text("good film\t1\n")
    with pytest.raises(SentembError, match="transfer task SST2: its test split holds no samples"):
        load_transfer_task(tmp_path, "SST2")


def test_a_results_or_resources_dir_that_is_a_file_is_named_by_its_key(tmp_path, monkeypatch, capsys):
    from conftest import REPO

    monkeypatch.chdir(REPO)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for key in ("results_dir", "resources_dir"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"{key}: {afile}/below\n")
        assert main(["check-config", "config/demo.yaml", str(bad)]) == 2
        assert f"config key '{key}': {afile} exists and is not a directory" in capsys.readouterr().err


def test_tracking_commands_refuse_an_empty_experiment_and_a_missing_results_dir(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["init-tracking", "--experiment", " ", "--tracking-uri", f"sqlite:///{tmp_path}/t.db"])
    assert e.value.code == 2 and "argument --experiment: ' ' is empty" in capsys.readouterr().err
    from conftest import REPO

    rc = main(["sync-tracking", "--config", str(REPO / "config" / "demo.yaml"), "--results-dir",
               str(tmp_path / "no_such_dir"), "--tracking-uri", f"sqlite:///{tmp_path}/t.db"])
    assert rc == 2 and "no_such_dir not found (--results-dir, or config results_dir)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_make_input_refuses_an_empty_corpus(tmp_path, capsys, tiny_bert_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "made"
    assert main(["make-input", "tfidf", "--corpus", str(empty), "--model", str(tiny_bert_dir), "--output",
                 str(out)]) == 2
    assert "the corpus holds no text" in capsys.readouterr().err and not out.exists()


def test_stats_summary_names_a_file_that_is_not_its_statistics_and_refuses_nothing_to_summarise(tmp_path, capsys):
    out = tmp_path / "summary.md"
    assert main(["stats-summary", "--output", str(out)]) == 2
    assert "nothing to summarise" in capsys.readouterr().err and not out.exists()
    garbled = tmp_path / "tfidf.parquet"
    garbled.write_text("{}")
    assert main(["stats-summary", "--tfidf", str(garbled), "--output", str(out)]) == 2
    assert "tfidf.parquet: not a parquet file of `sentemb stats-tfidf` with columns term, df, s" in \
        capsys.readouterr().err and not out.exists()


def test_study_and_transfer_tables_name_json_of_the_wrong_shape(tmp_path, capsys):
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    spec = tmp_path / "spec.json"
    for doc, words in (([1], "expected the object rule study_spec writes"),
                       ({"name": "x"}, "missing ['metric', 'expanded', 'seeds']")):
        spec.write_text(json.dumps(doc))
        assert main(["study", "--spec", str(spec), "--inputs", str(listed), "--output", str(tmp_path / "o.csv")]) == 2
        assert words in capsys.readouterr().err
    assert main(["table-transfer", "--inputs", str(listed), "--output", str(tmp_path / "t.csv")]) == 2
    assert "list.json: expected a JSON object of results, found list" in capsys.readouterr().err
    from sentemb.report.studies import read_values

    with pytest.raises(SentembError, match="list.json: expected a JSON object of results, found list"):
        read_values([listed], "Avg")
    bad = tmp_path / "e.json"
    bad.write_text(json.dumps({"STS12": "80", "run": {"name": "x", "seed": 1}}))
    with pytest.raises(SentembError, match="e.json: STS12 '80' is not a number"):
        read_values([bad], "STS12")
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "t.csv").exists()


def test_figures_with_a_paper_table_that_is_not_one_write_no_figure(tmp_path, capsys):
    e = tmp_path / "eval_sts.json"
    e.write_text(json.dumps({"STS12": 70.0, "STSBenchmark": 75.0, "avg": 72.5,
                             "run": {"name": "simcse", "method": "simcse", "backbone": "b", "seed": 1}}))
    out = tmp_path / "figures"
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    for paper, words in ((tmp_path / "nope.csv", "not a readable table_paper.csv (FileNotFoundError"),
                         (empty, "not a readable table_paper.csv (EmptyDataError"),
                         (other, "not sentemb table-paper's CSV (no column(s) table, method, metric, published")):
        assert main(["figures", "--evals", str(e), "--paper", str(paper), "--output-dir", str(out)]) == 2
        assert words in capsys.readouterr().err
        assert not out.exists() or not list(out.iterdir())


def test_a_figure_that_fails_halfway_leaves_none_of_the_figures(tmp_path, monkeypatch):
    from sentemb.report import figures as fig_module

    e = tmp_path / "eval_sts.json"
    e.write_text(json.dumps({"STS12": 70.0, "STSBenchmark": 75.0, "avg": 72.5,
                             "run": {"name": "simcse", "method": "simcse", "backbone": "b", "seed": 1}}))

    def broken(*a, **k):
        raise SentembError("drawing failed")

    monkeypatch.setattr(fig_module, "cosine_buckets", broken)  # the fourth of five figures
    out = tmp_path / "figures"
    with pytest.raises(SentembError, match="drawing failed"):
        fig_module.figures([e], [], None, out)
    assert list(out.iterdir()) == []  # table1_bars, dev_curves, align_uniform were drawn, none was left
    monkeypatch.undo()
    written = fig_module.figures([e], [], None, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written) and len(written) == 15


@pytest.mark.parametrize("extra, words", [
    (["--keyed"], "--keyed: not read by the per-method table"),
    (["--chunked", "4", "--peak-tflops", "1"], "--peak-tflops: not read by --chunked"),
    (["--overhead", "--method", "una"], "--method: not read by --overhead"),
    (["--eval-every", "10"], "--eval-every: not read by the per-method table (no mode flag) (--eval-every needs --senteval)"),
    (["--grad-norms", "--sam-rho", "0.1"], "--sam-rho: not read by --grad-norms"),
    (["--peak-tflops", "nan"], "argument --peak-tflops: 'nan' is not a finite number"),
    (["--build-only", "--keyed", "--rounds", "5"], "--build-only times build_batch alone; it cannot be combined with "
                                                   "--keyed, --rounds"),
])
def test_benchmark_refuses_options_its_mode_would_drop(tmp_path, capsys, extra, words):
    """A probe found these accepted and silently dropped (exit 0, a table without their effect)."""
    try:
        rc = main(["benchmark", "--model", str(tmp_path / "m"), "--corpus", str(tmp_path / "c.txt"), *extra])
    except SystemExit as e:  # argparse's own refusals (the typed options)
        rc = e.code
    assert rc == 2 and words in capsys.readouterr().err
