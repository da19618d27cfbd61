"""``sentemb plan-check`` (``sentemb.ops.plan_check``): ``sentemb plan``'s step price for steps measured
on a GPU, at the widths those very steps had."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sentemb import SentembError
from sentemb.ops import plan_check

ROOT = Path(__file__).resolve().parents[1]


def _row(**over) -> dict:
    return {**plan_check.measured_record("simcse B=64", "simcse", "bert-base-uncased", 64, 32, 0.0101, (8, 23),
                                         {"graphs": True, "compile": True, "buckets": [32]}), **over}


def test_the_steps_priced_are_the_steps_the_loop_trains_on(tiny_bert_dir, tmp_path):
    """``width_profile(steps=...)``: the widths of a length-sampled job's optimizer steps 3..9 (fused
    pairs of micro-batches, two per step) as the loop's own ``micro_batches`` builds them for a job of
    seed 0 on the same lines: the plan prices the widths that were timed, not an epoch's mean."""
    from sentemb.ops.benchmark import _bench_run
    from sentemb.ops.plan import Lengths, width_profile
    from sentemb.testing import TINY_WORDS
    from sentemb.train.batches import micro_batches
    from sentemb.train.loop import sentence_lengths, setup

    rng = np.random.default_rng(5)
    lines = [" ".join(rng.choice(TINY_WORDS, int(rng.integers(1, 60)))) for _ in range(200)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(lines) + "\n")
    run = _bench_run(tiny_bert_dir, corpus, 4, "cpu", 64, "fp32", "simcse", 10**9, None, {}, prefetch=False,
                     sampler="length", buckets=[16, 32, 48, 64], grad_accum=2, fuse_micro_batches=2)
    steps = list(range(3, 10))
    with setup(run, "/nonexistent") as job:
        tok = job.method.tokenizer
        loop_widths = []
        for s in steps:
            group = micro_batches(job, s)
            assert len(group) == 2
            loop_widths.append(max(b["input_ids"].shape[1] for _, b in group))  # the fused forward's width
    ids = tok(lines)["input_ids"]
    lengths = Lengths("test", np.array([len(x) for x in ids]), sentence_lengths(lines), lines)
    profile = width_profile(run, "bert-base-uncased", lengths, steps=steps)
    want = {w: loop_widths.count(w) / len(steps) for w in set(loop_widths)}
    assert profile["count"] == pytest.approx(want), (profile["count"], loop_widths)
    assert set(want) <= {16, 32, 48, 64} and len(want) > 1  # several widths: the check can fail
    # another window prices other widths (the restriction is used)
    other = width_profile(run, "bert-base-uncased", lengths, steps=[0, 1, 2])
    assert other["count"] != profile["count"] or other["batches"] != profile["batches"]


@pytest.mark.realdata
def test_a_measured_row_is_priced_as_sentemb_plan_prices_the_job(shared, tmp_path):
    """A SimCSE row at max_len 32 (every step at width 32) gets exactly the step time ``sentemb plan``
    gives the same run as a training job of a configuration, graphed and compiled and eager; the
    table says within or off against the 25% target, and ``--strict`` fails on a row that is off."""
    import dataclasses

    from sentemb.cli import main
    from sentemb.config.load import load_config
    from sentemb.ops import plan as P

    config = load_config(ROOT / "config" / "config.yaml")
    corpus = shared / "data" / "wiki1m_head.txt"
    rows = [_row(), _row(what="eager B=64", train={}, ms=34.0, steps=[3, 8]), _row(what="off", ms=1000.0),
            _row(what="compiled B=512", batch=512, ms=49.2, train={"compile": True, "buckets": [32]}),
            _row(what="built in line", ms=14.0, build_ms=3.9), _row(what="a method of nobody's", method="nope"),
            _row(what="dev eval base", kind="dev_eval", batch=512, max_len=512, ms=100.0, steps=[1, 2], train={}),
            _row(what="dev eval large", kind="dev_eval", model="bert-large-uncased", batch=512, max_len=512, ms=100.0,
                 steps=[1, 2], train={}, precision="fp32")]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"gpu": "H200", "corpus": "data/wiki1m_head.txt", "rows": rows}))
    header, measured = plan_check.load_measured(path)
    priced = plan_check.price_measured(measured, config, corpus, "H200")
    # the reference: the plan's own pricing of a configured job with these settings (resolve_run's run,
    # the job's whole-epoch width profile: at max_len 32 every batch is 32 wide)
    from sentemb.config.load import resolve_run
    from sentemb.config.settings import Config

    cfg = Config.of(config)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, P._frozen_imports():
        counter = P.Counter(cfg, Path(tmp), corpus)
        base = resolve_run(cfg, "simcse", "bert-base-uncased", 42)
        cases = ((0, 64, {"graphs": True, "compile": True, "buckets": [32]}), (1, 64, {}),
                 (3, 512, {"compile": True, "buckets": [32]}))  # compile alone: its floor, and the compiled MFU
        for i, batch, over in cases:
            row, seconds, profile = priced[i]
            run = dataclasses.replace(base, train=dataclasses.replace(base.train, batch_size=batch, max_len=32,
                                                                      grad_accum=1, **over))
            job = P._priced_row(counter, "train", "x", run, cfg, "H200", None, 1.5, {})
            assert profile["count"] == {32: 1.0}
            assert seconds == pytest.approx(job.step_s, rel=1e-9), row.what
    assert priced[0][1] < priced[1][1] / 2  # the graphed step is priced at its own floor
    # the in-line batch building is taken off the measured step (the plan prices the step without it), and a
    # row that cannot be priced is said so while the others are priced
    assert priced[4][1] == priced[0][1] and plan_check.verdict(priced[4][0].step_ms(), 1000 * priced[4][1])[1]
    assert isinstance(priced[5][1], str) and "nope" in priced[5][1]
    # a dev evaluation: the plan's measured seconds of one (BERT-base's), scaled by the encoder's forward FLOPs
    assert priced[6][1] == P.DEV_EVAL_SECONDS["bf16"] and priced[7][1] > 3 * P.DEV_EVAL_SECONDS["fp32"]
    assert abs(priced[3][1] - 0.0492) < 0.1 * 0.0492  # compiled alone at B 512: the graphed step's time, not eager's
    out = tmp_path / "out.json"
    assert main(["plan-check", str(path), "--config", str(ROOT / "config" / "config.yaml"), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["what"] for r in got] == ["simcse B=64", "eager B=64", "off", "compiled B=512", "built in line",
                                        "a method of nobody's", "dev eval base", "dev eval large"]
    assert got[5]["plan_ms"] is None and "nope" in got[5]["not_priced"]
    assert got[0]["plan_ms"] == pytest.approx(1000 * priced[0][1], rel=1e-6)
    assert got[2]["error"] < -0.9
    assert main(["plan-check", str(path), "--config", str(ROOT / "config" / "config.yaml"), "--strict"]) == 1
    # the corpus is found by its name and checked against the one measured
    path.write_text(json.dumps({"gpu": "H200", "corpus": "data/wiki1m_head.txt", "corpus_lines": 5, "rows": rows[:1]}))
    with pytest.raises(SentembError, match="corpus data/wiki1m_head.txt is not .*give --corpus"):
        plan_check.resolve_corpus(None, plan_check.load_measured(path)[0], path)


def test_bad_rows_are_refused_naming_the_file_the_row_and_the_key(tmp_path):
    path = tmp_path / "rows.json"
    for bad, says in (({"steps": [5, 5]}, "rows[1].steps"), ({"steps": [True, 3]}, "rows[1].steps"),
                      ({"ms": 0}, "rows[1].ms"), ({"batch": "64"}, "rows[1].batch"), ({"batch": True}, "rows[1].batch"),
                      ({"build_ms": 20.0}, "rows[1].build_ms"),
                      ({"only_steps": [30]}, "rows[1].only_steps"), ({"colour": 1}, "rows[1]: unknown key(s) colour"),
                      ({"train": {"batch_size": 8}}, "rows[1].train.batch_size"),
                      ({"train": {"attention": "bogus"}}, "rows[1].train.attention"),
                      ({"train": {"chunk_size": "many"}}, "rows[1]: train.chunk_size"),
                      ({"kind": "eval"}, "rows[1].kind"), ({"kind": "dev_eval", "precision": "fp8"}, "rows[1].precision"),
                      ({"steady": "no"}, "rows[1].steady: 'no' is not true or false"),
                      ({"ms": float("nan")}, "rows[1].ms: nan is not a positive number"),
                      ({"ms": float("inf")}, "rows[1].ms: inf is not a positive number"),
                      ({"build_ms": float("nan")}, "rows[1].build_ms: nan")):
        path.write_text(json.dumps({"rows": [_row(), _row(**bad)]}))
        with pytest.raises(SentembError, match=re.escape(f"rows.json: {says}")):
            plan_check.load_measured(path)
    path.write_text(json.dumps({"rows": [{k: v for k, v in _row().items() if k != "steps"}]}))
    with pytest.raises(SentembError, match=r"rows\[0\]: missing steps"):
        plan_check.load_measured(path)
    with pytest.raises(SentembError, match=r"rows\.json: its header's corpus 5 is not a path; give --corpus"):
        plan_check.resolve_corpus(None, {"corpus": 5}, path)
    path.write_bytes(b'{"rows": [], "gpu": "\xff"}')
    with pytest.raises(SentembError, match=r"rows\.json: not a readable JSON file"):
        plan_check.load_measured(path)


def test_a_gpu_the_rows_file_names_and_the_plan_does_not_know_is_named_as_the_files(tmp_path, capsys):
    from sentemb.cli import main

    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"gpu": "Z9000", "rows": [_row()]}))
    assert main(["plan-check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: its \"gpu\" 'Z9000': unknown GPU (known:" in err and "give --gpu" in err and "--gpu Z9000" not in err


def test_recorded_rows_are_written_after_each_row(tmp_path, monkeypatch):
    """``gpu-check --rows-json``: the file holds every row recorded so far (a run stopped by its time
    limit keeps them); the model is kept by its directory's name (a backbone name)."""
    monkeypatch.setattr(plan_check, "RECORDED", [])
    monkeypatch.setattr(plan_check, "_RECORD_TO", None)
    path = tmp_path / "rows.json"
    plan_check.record_to(path, {"gpu": "H200", "corpus": "data/c.txt"})
    assert json.loads(path.read_text())["rows"] == []
    plan_check.record("a", "simcse", "/tmp/x/bert-base-uncased", 64, 32, 0.01, (8, 23), {"buckets": (32,)})
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "H200" and doc["rows"][0]["model"] == "bert-base-uncased"
    assert doc["rows"][0]["train"] == {"buckets": [32]} and doc["rows"][0]["ms"] == 10.0
    plan_check.add_recorded([dict(doc["rows"][0], what="b")])
    header, rows = plan_check.load_measured(path)
    assert [r.what for r in rows] == ["a", "b"] and rows[0].steps == (8, 23)
    assert header["complete"] is False  # until the command ends normally
    plan_check.record_complete()
    assert json.loads(path.read_text())["complete"] is True


def test_plan_check_warns_on_the_rows_of_a_run_that_stopped_early(tmp_path, capsys, shared):
    from sentemb.cli import main

    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"gpu": "H200", "corpus": "data/wiki1m_head.txt", "complete": False, "rows": [_row()]}))
    main(["plan-check", str(path), "--config", "config/demo.yaml", "--corpus", str(shared / "data" / "wiki1m_head.txt")])
    assert "holds the rows of a gpu-check that did not end normally" in capsys.readouterr().err


@pytest.mark.realdata
def test_the_plan_stays_within_25_percent_of_the_lends_steady_rows(shared):
    """The rows the H200 measured on the fifth and sixth lends (``docs/gpu/*.rows.json``, transcribed
    from their tables): a change to the plan's constants or its pricing that takes a steady row out of
    issue 37's 25% fails here. The compiled, not graphed, rows were 17-62% off before
    ``COMPILED_FLOOR_BY_ATTENTION``."""
    from sentemb.config.load import load_config

    rows = []
    for name in ("h200-2026-11-28b.rows.json", "h200-2026-11-28c.rows.json"):
        header, got = plan_check.load_measured(ROOT / "docs" / "gpu" / name)
        assert header["gpu"] == "H200"
        rows += got
    corpus = plan_check.resolve_corpus(None, header, ROOT / "docs" / "gpu" / name)
    priced = plan_check.price_measured(rows, load_config(ROOT / "config" / "config.yaml"), corpus, "H200")
    steady = [(r.what, r.ms, round(1000 * s, 1)) for r, s, _ in priced if r.steady]
    assert len(steady) == 21
    off = [x for x in steady if not plan_check.verdict(x[1], x[2])[1]]
    assert not off, off
    alone = [(r.ms, s) for r, s, _ in priced if r.train.get("compile") and not r.train.get("graphs")]
    assert len(alone) == 4


@pytest.mark.realdata
@pytest.mark.parametrize("batch,max_len,sampler", [(8, 32, "random"), (16, 512, "length")])
def test_the_plans_arccse_flops_are_the_loops_own_on_each_step_priced(shared, tmp_path, batch, max_len, sampler):
    """ArcCSE's step (B × 2 fused, SAM, the CUDA bucket ladder), eager and graphed: the FLOPs the plan
    prices each optimizer step at (``width_profile(steps=[s])``, ``job_measures``, ``step_time``) are
    the FLOPs the loop's own step counts (``sentemb.ops.flops.counted`` around ``run_steps``) on the
    same real sentences, every step of an epoch of 400 lines: the triplet rows at the loop's own
    widths (past max_len 32: 48 ... 192 ... up to the triplets' truncation), and a graphed run's
    padding of T (``build_triplets``; counted through the eager path with static batches, the
    tensors a graph replays). Random batches of 8 at max_len 32 (the large models'): 0-8 long
    sentences in a micro-batch, most of them padded to 8; length-sampled batches of 16 at max_len 512
    (the paper's, at B 16): all long or all short, a few padded to 16. Graphed with ``update: graphed``
    (the count is of an eager step: the update counts no FLOP). Before session 18 the plan counted a
    graphed run's padding on the 4 sentences of a count padded to 8."""
    import dataclasses

    import torch

    from sentemb.config.load import load_config
    from sentemb.config.settings import Config
    from sentemb.data.buckets import AUTO_LADDER
    from sentemb.ops import plan as P
    from sentemb.ops.benchmark import _bench_run
    from sentemb.ops.flops import counted, fp32_gemms
    from sentemb.ops.shapes import backbone_architecture, write_model_dir
    from sentemb.train.loop import State, run_steps, setup

    cfg = Config.of(load_config(ROOT / ".test" / "config.yaml"))
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("".join((shared / "data" / "wiki1m_head.txt").read_text("utf-8").splitlines(True)[:400]), "utf-8")
    arch = backbone_architecture(cfg, "tiny-bert")
    model = write_model_dir(arch, tmp_path / "tiny-bert")
    ladder = [w for w in AUTO_LADDER if w < max_len] + [max_len]  # what buckets: auto is on CUDA
    train = {"grad_accum": 2, "sam_rho": 0.05, "sampler": sampler, "buckets": ladder, "fuse_micro_batches": 2,
             "prefetch": False}
    steps = range(400 // (2 * batch))
    for graphs in (False, True):
        over = {"graphs": True, "update": "graphed"} if graphs else {}
        row = plan_check.Measured("x", "arccse", "tiny-bert", batch, max_len, 1.0, (0, len(steps)), {**train, **over})
        with P._frozen_imports():
            counter = P.Counter(cfg, tmp_path / f"count-{graphs}", corpus, sample=None)
            run = plan_check.measured_run(row, corpus)
            lengths = counter.lengths(run.corpus, run.backbone)
            priced = []
            for s in steps:
                profile = P.width_profile(run, arch, lengths, steps=[s])
                priced.append(P.step_time(run, arch, P.job_measures(counter, run, profile), profile["count"], "H100")[1])
        real_run = _bench_run(model, corpus, batch, "cpu", max_len, "bf16", "arccse", 10**9, None, {}, **train)
        torch.manual_seed(0)
        with setup(real_run, "/nonexistent") as job:
            job.method.ctx = dataclasses.replace(job.method.ctx, static=graphs)  # the batches a graph replays
            state = State()
            with fp32_gemms():  # bf16 products in fp32 (the plan's own count's): the same FLOPs, 8x sooner here
                real = [counted(lambda: list(run_steps(job, state, 1)))[1] for _ in steps]
        assert priced == pytest.approx(real, rel=0.01), (graphs, priced, real)
        assert len(set(real)) > 2  # steps of several widths and triplet counts: the check can fail
