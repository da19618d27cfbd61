"""``sentemb.ops.hostcheck`` (gpu-check's host rows) on the CPU with the tiny model: the same code the GPU
runs, so the rows cannot rot between lent GPUs."""

from pathlib import Path

import pytest

from sentemb.ops import hostcheck


def test_first_steps_counts_fewer_shapes_with_buckets(tiny_bert_dir, tmp_path):
    import random

    from sentemb.testing import TINY_WORDS

    rng = random.Random(3)
    corpus = tmp_path / "corpus.txt"  # 1-25 words a line: 3-27 tokens with [CLS] and [SEP]
    corpus.write_text("".join(" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(1, 25))) + "\n"
                              for _ in range(64)))
    from sentemb.ops import plan_check

    plan_check.RECORDED.clear()
    rows = {str(b): hostcheck.first_steps(tiny_bert_dir, corpus, "cpu", 2, 32, "simcse", None, {}, {}, b, 3, 3)
            for b in ("none", [8, 16])}
    # for sentemb plan-check: the mean of the steps that met no new shape, with those steps named
    for rec, (_, _, note) in zip(plan_check.RECORDED, rows.values()):
        if "steps meeting no new shape" in note:
            calm = note.split("steps meeting no new shape: ")[1].split(" ms/step")[0]
            assert rec["steady"] and f"{rec['ms']:.0f}" == calm and 0 < len(rec["only_steps"]) < 6, (rec, note)
            assert rec["steps"] == (0, 6) and 0 not in rec["only_steps"]  # the first step always meets a shape
        else:
            assert not rec["steady"] and rec["steps"] == (3, 6)
    plan_check.RECORDED.clear()
    import re

    shapes = {}
    for b, (what, value, note) in rows.items():
        assert "FAILED" not in value, value
        assert "ms/step (steps 1-3)" in value and "ms/step (steps 4-6)" in value
        shapes[b] = int(re.search(r"(\d+) distinct batch shapes", note).group(1))
        # the steps that met no shape for the first time are timed apart (a capture or a new kernel plan
        # is not a replay): each new shape is met in one step, the first step always meets one
        calm = re.search(r"steps meeting no new shape: \d+ ms/step \((\d+) of 6\)", note)
        met = 6 - (int(calm.group(1)) if calm else 0)
        assert 1 <= met <= shapes[b], (b, note)
    # pairs padded to their longer row take several widths in six steps; padded to the buckets 8, 16 and
    # max_len 32, at most three
    assert shapes["[8, 16]"] <= 3 < shapes["none"], shapes


def test_dev_eval_rows_time_both_precisions(tiny_bert_dir, tiny_senteval, monkeypatch):
    """The rows time the loop's dev embedder (Method.embedder's batch, eval_precision applied by
    tune_dev_embedder, the dev set tokenized once): the timed call builds no plan."""
    from sentemb.methods.base import DEV_BATCH
    from sentemb.model.encoder import Embedder

    plans, real = [], Embedder.plan
    monkeypatch.setattr(Embedder, "plan", lambda self, uniq: plans.append(len(uniq)) or real(self, uniq))
    clock, reads = hostcheck.time.perf_counter, []  # how many plans were built at each read of the clock
    monkeypatch.setattr(hostcheck.time, "perf_counter", lambda: reads.append(len(plans)) or clock())
    from sentemb.ops import plan_check

    monkeypatch.setattr(plan_check, "RECORDED", [])
    rows = hostcheck.dev_eval(tiny_bert_dir, tiny_senteval, "cpu", step_s=0.01, eval_steps=125)
    assert [r[0].split()[3] for r in rows] == ["fp32", "bf16"], rows
    # each evaluation recorded for sentemb plan-check (against the plan's DEV_EVAL_SECONDS), by precision
    assert [(r["kind"], r["precision"], r["batch"]) for r in plan_check.RECORDED] == [("dev_eval", "fp32", DEV_BATCH),
                                                                                      ("dev_eval", "bf16", DEV_BATCH)]
    assert [f"{r['ms'] / 1000:.2f} s" for r in plan_check.RECORDED] == [r[1] for r in rows]
    assert all(f"batch {DEV_BATCH}, tokenized once" in r[0] for r in rows), rows  # on a CPU bf16 keeps the batch
    assert len(plans) == 2 * 2, plans  # each precision: its first call, for the dev set's two sentence lists
    # the timed calls (between a start and an end read) build none: the plans come before each start
    assert len(reads) == 4 and reads[0] == reads[1] == 2 and reads[2] == reads[3] == 4, reads
    for what, value, note in rows:
        secs = float(value.split()[0])
        share = float(note.split("; ")[1].split("%")[0])
        lo, hi = (100 * x / (125 * 0.01 + x) for x in (secs - 0.005, secs + 0.005))  # secs printed to 0.01
        assert lo - 0.05 <= share <= hi + 0.05, (value, note)


def test_graph_probe_is_skipped_without_cuda(tiny_bert_dir, tiny_corpus, tiny_senteval, tmp_path: Path):
    rows = hostcheck.rows(tiny_bert_dir, tiny_corpus, tiny_senteval, "cpu", tmp_path, {}, {}, None)
    probes = [r for r in rows if r[0].startswith("graph probe")]
    assert len(probes) == 4 and all(r[1] == "skipped" for r in probes), probes


def test_graph_probe_eager_half_runs_with_both_dropouts(tiny_bert_dir, tiny_corpus):
    for dropout in ("stream", "counter"):
        what, value, note = hostcheck.graph_probe(tiny_bert_dir, tiny_corpus, "cpu", 4, 16, steps=2, warmup=1,
                                                  dropout=dropout)
        assert value.startswith("eager ") and "graphed n/a" in value, (what, value)
        assert float(value.split()[1]) > 0 and f"{dropout} dropout" in what


def test_workers_row_reads_the_loops_data_wait(tiny_bert_dir, tiny_corpus, tmp_path):
    what, value, note = hostcheck.workers(tiny_bert_dir, tiny_corpus, "cpu", 8, 16, "simcse", None, {}, 2, 3, tmp_path)
    assert "ms/step waiting for data" in value and "end to end" in note, (what, value, note)
    assert float(value.split(";")[1].split()[0]) >= 0


def test_graphed_row_times_both_ways_and_counts_the_steps_flops(tiny_bert_dir, tiny_corpus, monkeypatch):
    from sentemb.ops import plan_check

    monkeypatch.setattr(plan_check, "RECORDED", [])
    what, value, note = hostcheck.graphed(tiny_bert_dir, tiny_corpus, "cpu", 4, 16, "simcse", None, {}, warm=1, timed=1)
    assert value.startswith("eager ") and "graphed " in value and "FAILED" not in value, (what, value)
    # both steps recorded for sentemb plan-check, with the settings they ran and the step timed (1 after 1)
    eager, graphed = plan_check.RECORDED
    assert (eager["train"]["graphs"], graphed["train"]["graphs"]) == (False, True)
    assert eager["steps"] == graphed["steps"] == (1, 2) and eager["batch"] == 4 and eager["max_len"] == 16
    # the row's figures are the recorded steps' (to the row's 0.1 ms; a record keeps 3 decimals, so a
    # figure on a rounding edge, 11.1496 -> 11.150, may print one digit off when rounded again)
    shown = {k: float(value.split(f"{k} ")[1].split(" ms/step")[0]) for k in ("eager", "graphed")}
    assert abs(shown["eager"] - eager["ms"]) <= 0.051 and abs(shown["graphed"] - graphed["ms"]) <= 0.051, (value, eager,
                                                                                                       graphed)
    # the attention kernel as it ran (auto resolved), and steady only when no graph was captured in the timed step
    assert eager["train"]["attention"] == graphed["train"]["attention"] == "sdpa"
    assert eager["steady"] == graphed["steady"] and (graphed["steady"] or "captured in the timed steps" in graphed["note"])
    # the graphed step's TFLOP/s come from the matmuls counted in one eager step (no peak on a CPU)
    tflops = float(note.split("; ")[-1].split(" TFLOP/s")[0])
    assert tflops > 0 and "% of the bf16 peak" not in note, note
    # the replay-alone split is a CUDA figure only
    assert "replayed" not in note, note


def test_graphed_row_sets_the_plans_estimate_beside_the_measured_step(tiny_bert_dir, tiny_corpus, monkeypatch):
    """With a peak (on a GPU: by its name), the row says what ``sentemb plan`` prices that step at:
    ``step_seconds`` of the counted FLOPs and the encoder passes the plan counts (SimCSE: one; SAM: two)."""
    from sentemb.ops import benchmark

    monkeypatch.setattr(benchmark, "_peak", lambda device, override: 1e-3)  # TFLOP/s: compute-bound at this peak
    # gradient caching, chunks of 2 of 4: two grad passes, and the no-grad first pass (1/3 each) once over
    # the batch (train.chunk_first_pass auto, counter masks) or once per chunk
    chunked = {"dropout_rng": "counter", "chunk_size": 2}
    for train, passes in (({}, "1 passes"), ({"sam_rho": 0.05}, "2 passes"), (chunked, "2.33333 passes"),
                          ({**chunked, "chunk_first_pass": "chunks"}, "2.66667 passes")):
        what, value, note = hostcheck.graphed(tiny_bert_dir, tiny_corpus, "cpu", 4, 16, "simcse", None, {}, train=train,
                                              warm=1, timed=1)
        assert "FAILED" not in value and "% of the bf16 peak" in note, (what, value, note)
        plan = note.split("sentemb plan's graphed step at this GPU's peak ")[1]
        assert float(plan.split(" ms")[0]) > 0 and passes in plan, note


def test_a_plug_in_method_s_graphed_row_runs_in_its_own_process_and_counts_its_momentum_encoder(
        tiny_bert_dir, tiny_corpus, monkeypatch):
    """gpu-check times every method but SimCSE in a process of its own (``_isolated``): a plug-in
    method is registered there by importing its module again (found on the H200, 2026-11-28: the row
    said ``unknown method 'esimcse'``). Its passes as the plan counts them include ESimCSE's momentum
    encoder's no-grad forward (1 + 1/3)."""
    from sentemb.methods import import_method_module
    from sentemb.ops import benchmark

    import_method_module(str(Path(__file__).resolve().parents[1] / "examples" / "methods" / "esimcse.py"))
    kw = dict(model=str(tiny_bert_dir), corpus=str(tiny_corpus), device="cpu", batch=4, max_len=16, method="esimcse",
              margs={"queue_size": 8}, inputs={}, train={}, warm=1, timed=1)
    what, value, note = hostcheck._isolated(kw)
    assert value.startswith("eager ") and "FAILED" not in value, (what, value, note)
    monkeypatch.setattr(benchmark, "_peak", lambda device, override: 1e-3)
    what, value, note = hostcheck.graphed(**kw)
    assert "FAILED" not in value and "1.33333 passes" in note, (what, value, note)


def test_the_profile_row_names_the_ops_that_take_the_step(tiny_bert_dir, tiny_corpus):
    """``--host-parts profile``: a method's steps under ``torch.profiler`` (on the CPU the ops' self
    time stands for the GPU's busy time): wall and busy ms a step, the aten ops a step, the top ops."""
    what, value, note = hostcheck.profile_steps(tiny_bert_dir, tiny_corpus, "cpu", 4, 16, "arccse",
                                                {"triplet_pass": "with_views", "min_words": 1}, {},
                                                {"grad_accum": 2, "sam_rho": 0.05, "fuse_micro_batches": 2}, 1, 1)
    assert "FAILED" not in value and "triplet_pass with_views" in what, (what, value, note)
    wall, busy = (float(x.split(" ms/step")[0]) for x in value.split(", "))
    assert 0 < busy <= 1.5 * wall, value
    assert int(note.split(" aten ops")[0]) > 100 and "top: aten::" in note, note


def test_a_graphed_only_row_prices_itself_from_its_eager_twins_count(tiny_bert_dir, tiny_corpus, monkeypatch):
    """``graphed(eager=False)`` (gpu-check's ``tune`` rows: variants of one step) times the graphed
    step alone; its TFLOP/s are its eager twin's counted FLOPs (same method, batch and max_len) over
    its own time, and a step never counted has none."""
    from sentemb.ops import benchmark

    monkeypatch.setattr(benchmark, "_peak", lambda device, override: 1e-3)
    monkeypatch.setattr(hostcheck, "_COUNTED", {})
    kw = dict(model=tiny_bert_dir, corpus=tiny_corpus, device="cpu", batch=4, max_len=16, method="simcse",
              margs=None, inputs={}, warm=1, timed=1)
    what, value, note = hostcheck.graphed(**kw, eager=False)
    assert value.startswith("graphed ") and "eager" not in value and "TFLOP/s" not in note, (what, value, note)
    hostcheck.graphed(**kw)
    what, value, note = hostcheck.graphed(**kw, train={"update": "fused"}, eager=False)
    assert "update fused" in what and "FAILED" not in value, (what, value)
    ms = float(value.split()[1])
    tflops = float(note.split(" TFLOP/s")[0].split("; ")[-1])
    flops = hostcheck._COUNTED[("simcse", 4, 16)][0]
    # to the printed precision: ms to 0.05 (a relative 0.05/ms: 1.1% at the 4.6 ms seen under load), TFLOP/s
    # to 3 significant digits (0.5%)
    assert abs(tflops - flops / (ms / 1000) / 1e12) <= (0.05 / ms + 0.005) * tflops, (note, flops, ms)
    # a chunked variant does other arithmetic (gradient caching's extra forward): it never borrows the count
    what, value, note = hostcheck.graphed(**kw, train={"chunk_size": 2, "dropout_rng": "counter"}, eager=False)
    assert "FAILED" not in value and "TFLOP/s" not in note, (what, value, note)
    # update graphed needs graphs: its eager twin runs the separate update (else the row would be refused)
    what, value, note = hostcheck.graphed(**kw, train={"update": "graphed"})
    assert "update graphed" in what and value.startswith("eager ") and "FAILED" not in value, (what, value)


def test_a_first_steps_row_runs_in_a_process_of_its_own(tiny_bert_dir, tiny_corpus):
    """gpu-check's first-steps rows each run in a fresh process on a GPU (``_isolated(kw,
    "first_steps")``): in one process a later row found the kernels and plans an earlier one built
    (the H200's two lends ranked ArcCSE's triplet passes oppositely). The row comes back whole."""
    kw = dict(model=str(tiny_bert_dir), corpus=str(tiny_corpus), device="cpu", batch=2, max_len=32, method="simcse",
              margs=None, inputs={}, train={}, buckets="none", first=2, then=2)
    from sentemb.ops import plan_check

    plan_check.RECORDED.clear()
    what, value, note = hostcheck._isolated(kw, "first_steps")
    assert what.startswith("first steps simcse B=2x1") and "ms/step (steps 1-2)" in value, (what, value, note)
    # the step it measured comes back from its process, for sentemb plan-check
    (rec,) = plan_check.RECORDED
    assert rec["what"].startswith(what) and rec["model"] == Path(tiny_bert_dir).name and rec["method"] == "simcse"
    plan_check.RECORDED.clear()
    assert "distinct batch shapes" in note, note


def test_tune_rows_take_a_variant_list_and_a_batch_size(tiny_bert_dir, tiny_corpus, monkeypatch):
    """gpu-check's ``tune``: the default rows end with B 512's counter masks outside the compiled code
    and traced (``counter_kernel: inline``), whole and in chunks; ``SENTEMB_TUNE`` (variants over the
    compiled graphed base, the first with its eager twin) and ``SENTEMB_TUNE_BATCHES`` (512 only, 8
    standing for it on a CPU) choose the rows. Which rows run, in order (the rows themselves:
    ``test_a_graphed_only_row_prices_itself_from_its_eager_twins_count``, and the inline chunked
    step compiled in ``tests/test_graphs.py``)."""
    calls = []
    monkeypatch.setattr(hostcheck, "graphed", lambda **kw: calls.append(kw) or (f"B={kw['batch']}", "ok", ""))
    monkeypatch.delenv("SENTEMB_TUNE", raising=False)
    monkeypatch.delenv("SENTEMB_TUNE_BATCHES", raising=False)
    hostcheck.tune_rows(tiny_bert_dir, tiny_corpus, "cpu", toy=True)
    tail = [(c["batch"], c["train"].get("counter_kernel"), c["train"].get("chunk_size")) for c in calls[-4:]]
    assert tail == [(8, None, None), (8, None, 2), (8, "inline", None), (8, "inline", 2)], tail
    assert all(c["train"]["compile"] and c["train"]["dropout_rng"] == "counter" for c in calls[-4:])
    calls.clear()
    monkeypatch.setenv("SENTEMB_TUNE", '[{"dropout_rng": "counter", "counter_kernel": "inline"}, {"update": "fused"}]')
    monkeypatch.setenv("SENTEMB_TUNE_BATCHES", "512")
    rows = hostcheck.tune_rows(tiny_bert_dir, tiny_corpus, "cpu", toy=True)
    assert len(rows) == 2 and [c["batch"] for c in calls] == [8, 8], calls
    assert [c["eager"] for c in calls] == [True, False] and calls[0]["train"]["counter_kernel"] == "inline"
    monkeypatch.setenv("SENTEMB_TUNE_BATCHES", " 64 , 512")
    calls.clear()
    hostcheck.tune_rows(tiny_bert_dir, tiny_corpus, "cpu", toy=True)
    assert [c["batch"] for c in calls] == [4, 4, 8, 8], calls


def test_tune_batches_that_are_not_the_rows_sizes_are_refused(tiny_bert_dir, tiny_corpus, monkeypatch):
    """``SENTEMB_TUNE_BATCHES`` names the tune rows' batch sizes (64, 512); anything else is an error
    naming the variable, before any row runs."""
    from sentemb import SentembError

    for bad in ("256", "x", ",", "64;512"):
        monkeypatch.setenv("SENTEMB_TUNE_BATCHES", bad)
        with pytest.raises(SentembError, match="SENTEMB_TUNE_BATCHES"):
            hostcheck.tune_rows(tiny_bert_dir, tiny_corpus, "cpu", toy=True)


def test_profile_rows_put_the_chunked_step_beside_the_whole(tiny_bert_dir, tiny_corpus, monkeypatch):
    """``--host-parts profile`` starts with the compiled graphed B 512 step with counter masks, whole
    then in chunks of 128 (8 and 2 on a CPU), busy against wall time per step: where issue 37's
    chunked step loses its time. ``SENTEMB_PROFILE`` profiles its own list instead and leaves out the
    part's other rows; anything but a JSON list of objects is refused, naming the variable,
    before any row runs. The row itself on a chunked counter step (uncompiled, on the CPU)."""
    from sentemb import SentembError

    calls = []
    monkeypatch.setattr(hostcheck, "profile_steps",
                        lambda model, corpus, device, b, max_len, method, margs, inputs, train, *a, **k:
                        calls.append((method, b, dict(train))) or ("p", "ok", ""))
    monkeypatch.delenv("SENTEMB_PROFILE", raising=False)
    hostcheck.rows(tiny_bert_dir, tiny_corpus, None, "cpu", Path("/nonexistent"), {}, {"simcse": {}}, 1.0,
                   parts=("profile",))
    first = [(b, t.get("chunk_size"), t["dropout_rng"], t["graphs"], t["compile"]) for _, b, t in calls[:2]]
    assert first == [(8, None, "counter", True, True), (8, 2, "counter", True, True)], calls
    assert len(calls) > 2  # the part's other rows follow
    calls.clear()
    monkeypatch.setenv("SENTEMB_PROFILE", '[{"counter_kernel": "inline", "dropout_rng": "counter"}, {"batch": 64}]')
    hostcheck.rows(tiny_bert_dir, tiny_corpus, None, "cpu", Path("/nonexistent"), {}, {"simcse": {}}, 1.0,
                   parts=("profile",))
    assert [(b, t.get("counter_kernel")) for _, b, t in calls] == [(8, "inline"), (64, None)], calls
    monkeypatch.setattr(hostcheck, "first_steps", lambda **kw: pytest.fail("a row ran before the refusal"))
    for bad in ("{", '{"a": 1}', "[1]"):
        monkeypatch.setenv("SENTEMB_PROFILE", bad)
        with pytest.raises(SentembError, match="SENTEMB_PROFILE"):
            hostcheck.rows(tiny_bert_dir, tiny_corpus, None, "cpu", Path("/nonexistent"), {},
                           {"simcse": {}, "arccse": {}}, 1.0, parts=("first_steps", "profile"))
    monkeypatch.undo()
    what, value, note = hostcheck.profile_steps(tiny_bert_dir, tiny_corpus, "cpu", 4, 16, "simcse", None, {},
                                                {"dropout_rng": "counter", "chunk_size": 2}, 1, 1)
    assert "FAILED" not in value and "chunk_size 2" in what and "top: aten::" in note, (what, value, note)


def test_a_row_in_a_fresh_process_past_its_time_limit_costs_that_row_only(monkeypatch):
    """``in_fresh_process`` (gpu-check's isolated rows, ``benchmark --counter-compile``'s): the JSON
    payloads of the lines with its tag, the exit code; a process past its time limit is killed and
    says so. An isolated gpu-check row that times out is a failed row, not the end of gpu-check."""
    from sentemb.ops import benchmark

    script = ("import json, sys, time; a = json.loads(sys.argv[1]); print('X ' + json.dumps(a['v'])); "
              "print('Y 1', flush=True); time.sleep(a['s']); sys.exit(a['rc'])")
    assert benchmark.in_fresh_process(script, {"v": [1, 2], "s": 0, "rc": 3}, "X ")[:2] == ([[1, 2]], 3)
    got, code, err = benchmark.in_fresh_process(script, {"v": 1, "s": 60, "rc": 0}, "X ", timeout=3)
    assert (got, code) == ([], None) and "no result in 3 s" in err, err
    monkeypatch.setattr(benchmark, "in_fresh_process", lambda *a, **k: ([], None, "killed: no result in 900 s"))
    what, value, note = hostcheck._isolated(dict(method="simcse", batch=4))
    assert what == "graphed simcse B=4" and value == "FAILED: no result in 900 s", (what, value, note)


def test_tune_variants_that_are_not_a_list_of_settings_are_refused_naming_the_variable(tiny_bert_dir, tiny_corpus,
                                                                                      monkeypatch):
    """``SENTEMB_TUNE`` is read as ``SENTEMB_PROFILE`` is: a JSON list of train settings, anything
    else refused naming the variable before any row runs."""
    from sentemb import SentembError

    monkeypatch.setattr(hostcheck, "graphed", lambda **kw: pytest.fail("a row ran before the refusal"))
    monkeypatch.delenv("SENTEMB_TUNE_BATCHES", raising=False)
    for bad in ("{", '{"update": "fused"}', '["fused"]'):
        monkeypatch.setenv("SENTEMB_TUNE", bad)
        with pytest.raises(SentembError, match="SENTEMB_TUNE"):
            hostcheck.tune_rows(tiny_bert_dir, tiny_corpus, "cpu", toy=True)


def test_graphed_rows_time_every_method_at_both_batches(tiny_bert_dir, tiny_corpus, monkeypatch):
    """``--host-parts graphed`` (issue 37: "every method at B 64 and B 512, chunked, SAM"): SimCSE's
    rows, then every other method at B 64 and then at B 512 with its paper ``sam_rho``, each in a
    process of its own on a GPU (in this process on a CPU, 4 and 8 standing for 64 and 512)."""
    calls = []
    fake = lambda **kw: calls.append(kw) or (f"{kw['method']} B={kw['batch']}", "ok", "")  # noqa: E731
    monkeypatch.setattr(hostcheck, "graphed", fake)
    monkeypatch.setattr(hostcheck, "_isolated", lambda kw, fn="graphed": fake(**kw))
    usable = {m: {} for m in ("simcse", "arccse", "una")}
    hostcheck.graphed_rows(tiny_bert_dir, tiny_corpus, "cpu", {}, usable, toy=True)
    others = [(c["method"], c["batch"], c["train"].get("sam_rho")) for c in calls if c["method"] != "simcse"]
    assert others == [("arccse", 4, 0.05), ("una", 4, None), ("arccse", 8, 0.05), ("una", 8, None)], others
    simcse = [(c["batch"], c["train"]) for c in calls if c["method"] == "simcse"]
    assert (8, {"dropout_rng": "counter", "chunk_size": 2}) in simcse and (4, {"sam_rho": 0.05}) in simcse
