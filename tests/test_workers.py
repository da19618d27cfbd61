"""``train.workers`` (batches built in worker processes), ``train/data_wait`` and the priced, small dev
evaluation (``train.eval_precision``) of issue 36 §3-§4 (``sentemb.train.batches``, ``sentemb.train.loop``).

Every method on the tiny world of the method contract (``sentemb.testing.harness``), 3 steps: the
weights with ``workers: 2`` are those of batches built in line, bit for bit, uninterrupted and
killed-and-resumed; the workers are gone after a run, an error and a KeyboardInterrupt.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from sentemb import SentembError, testing
from sentemb.methods import registry

STEPS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny encoder and SentEval tree, shared by every method's harness."""
    root = tmp_path_factory.mktemp("workers")
    return testing.tiny_encoder_dir(root / "encoder"), testing.tiny_senteval(root / "senteval"), root


@pytest.fixture(scope="module", params=sorted(registry()))
def h(request, world):
    enc, senteval, root = world
    try:
        return testing.harness(request.param, root / request.param, model_dir=enc, senteval=senteval)
    except testing.CheckSkipped as e:
        pytest.skip(str(e))


def _cfg(h, **over):
    # fp32, dev evaluation at steps 2 and 3 (so the kept checkpoint is chosen too), 1 worker thread
    # of torch each way; the harness's 64 lines in batches of 16
    return h.run(**{"precision": "fp32", "max_steps": STEPS, "num_threads": 1, **over})


def _no_workers_left():
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_workers_give_the_weights_of_batches_built_in_line_and_resume(h, tmp_path):
    """workers 0 (in line, no prefetch thread) and workers 2: the same history and bit-identical
    weights; a run with workers 2 killed after 1 step (KeyboardInterrupt) and resumed with
    workers 2 too; no worker process outlives a run or the interrupt."""
    from sentemb.train.loop import train

    inline = train(_cfg(h, workers=0, prefetch=False), tmp_path / "inline", progress=False, method_cls=h.cls)
    workers = train(_cfg(h, workers=2), tmp_path / "workers", progress=False, method_cls=h.cls)
    _no_workers_left()
    assert workers["history"] == inline["history"]
    testing.same_model(tmp_path / "inline" / "model", tmp_path / "workers" / "model", f"{h.name}: workers 2")
    assert workers["workers"] == 2 and inline["workers"] == 0
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(h, workers=2), tmp_path / "resumed", stop_after=1, progress=False, method_cls=h.cls)
    _no_workers_left()
    resumed = train(_cfg(h, workers=2), tmp_path / "resumed", progress=False, method_cls=h.cls)
    _no_workers_left()
    assert resumed["history"] == inline["history"]
    testing.same_model(tmp_path / "inline" / "model", tmp_path / "resumed" / "model", f"{h.name}: resumed, workers 2")


@pytest.fixture(scope="module")
def simcse(world):
    enc, senteval, root = world
    return testing.harness("simcse", root / "simcse_only", model_dir=enc, senteval=senteval)


def test_an_error_in_a_worker_reaches_the_loop_with_the_methods_message(simcse, tmp_path, monkeypatch):
    from sentemb.train.loop import train

    real = simcse.cls.build_batch

    def broken(self, sentences, step=0, **kw):
        if step == 1:
            raise SentembError("simcse: a broken batch at step 1")
        return real(self, sentences, step, **kw)

    monkeypatch.setattr(simcse.cls, "build_batch", broken)
    with pytest.raises(SentembError, match="a broken batch at step 1"):
        train(_cfg(simcse, workers=2), tmp_path / "broken", progress=False)
    _no_workers_left()


def test_a_hung_worker_stops_the_run_after_worker_timeout_naming_the_key(simcse, tmp_path, monkeypatch):
    """A worker that hangs building step 1's batches (it sleeps well past the limit) stops the run after
    ``train.worker_timeout`` seconds with an error naming the key and the step, not never; the hung
    worker is stopped too."""
    from sentemb.train.loop import train

    real = simcse.cls.build_batch

    def hung(self, sentences, step=0, **kw):
        if step == 1:
            time.sleep(120)
        return real(self, sentences, step, **kw)

    monkeypatch.setattr(simcse.cls, "build_batch", hung)
    t0 = time.monotonic()
    with pytest.raises(SentembError, match=r"train\.worker_timeout: the batches of step 1 .* within 5 s"):
        train(_cfg(simcse, workers=1, worker_timeout=5), tmp_path / "hung", progress=False)
    assert time.monotonic() - t0 < 60  # the limit plus the DataLoader's 5 s join of the hung worker, not 120 s
    _no_workers_left()


def test_data_wait_and_dev_evaluation_are_priced(simcse, tmp_path, monkeypatch):
    """train/data_wait in MLflow on every log step; train.json's data_wait_s(_per_step), dev_eval_s,
    dev_evals and dev_eval_share; MLflow's totals at the last step."""
    from sentemb.tracking.runs import Tracker
    from sentemb.train.loop import train

    logged = []
    monkeypatch.setattr(Tracker, "log_metrics", lambda self, metrics, step=None: logged.append((step, dict(metrics))))
    for workers in (0, 1):
        logged.clear()
        summary = train(_cfg(simcse, workers=workers), tmp_path / f"w{workers}", progress=False)
        on_disk = json.loads((tmp_path / f"w{workers}" / "train.json").read_text())
        for key in ("data_wait_s", "data_wait_s_per_step", "dev_eval_s", "dev_eval_share", "dev_evals"):
            assert on_disk[key] == summary[key] and summary[key] >= 0, key
        assert summary["dev_evals"] == 2 and summary["dev_eval_s"] > 0 and 0 < summary["dev_eval_share"] < 1
        assert summary["data_wait_s_per_step"] == pytest.approx(summary["data_wait_s"] / STEPS, abs=1e-4)
        assert summary["eval_precision"] == "fp32"
        waits = [m["train/data_wait"] for _, m in logged if "train/loss" in m]
        assert len(waits) == STEPS and all(w >= 0 for w in waits)
        assert sum(waits) == pytest.approx(summary["data_wait_s"], abs=1e-3)
        evals = [m["dev/eval_s"] for _, m in logged if "dev/stsb_spearman" in m]
        assert len(evals) == 2 and sum(evals) == pytest.approx(summary["dev_eval_s"], abs=1e-2)
        last = {k: v for s, m in logged if s == STEPS for k, v in m.items()}
        assert last["dev/eval_share"] == summary["dev_eval_share"]
        assert last["train/data_wait_s_per_step"] == summary["data_wait_s_per_step"]
    _no_workers_left()


def test_eval_precision_is_a_weights_setting_added_at_fp32(simcse):
    """eval_precision can keep another checkpoint, so it is in the fingerprint, except at fp32, its
    value before it existed (ADDED_DEFAULTS: finished jobs are not rerun)."""
    import dataclasses

    from sentemb.config.settings import ADDED_DEFAULTS, fingerprint, weight_free_keys

    assert "eval_precision" not in weight_free_keys() and ADDED_DEFAULTS["eval_precision"] == "fp32"
    run = _cfg(simcse)
    before = json.loads(fingerprint(run))
    assert "eval_precision" not in before["train"]
    bf16 = dataclasses.replace(run, train=dataclasses.replace(run.train, eval_precision="bf16"))
    assert json.loads(fingerprint(bf16))["train"]["eval_precision"] == "bf16"
    assert fingerprint(dataclasses.replace(run, train=dataclasses.replace(run.train, workers=3))) == fingerprint(run)


def test_dev_embedder_takes_the_eval_precision(simcse):
    """fp32 leaves the method's dev embedder as built; bf16 sets it (batches of 512 only on CUDA)."""
    import torch

    from sentemb.evaluate.sts import DEV_BATCH_CUDA, tune_dev_embedder

    m = simcse.make()
    e = m.embedder("cls_before_pooler", torch.device("cpu"))
    assert tune_dev_embedder(e, "fp32", torch.device("cpu")).precision == "fp32" and e.batch_size == 128
    assert tune_dev_embedder(e, "bf16", torch.device("cpu")).precision == "bf16" and e.batch_size == 128
    assert tune_dev_embedder(e, "auto", torch.device("cuda")).batch_size == DEV_BATCH_CUDA
    assert e.precision == "auto"


def test_dev_max_len_truncates_the_dev_sentences_as_the_tokenizer_does(simcse, world, tmp_path):
    """train.dev_max_len (UNA's code: its dev set tokenized at max_len 32): the dev embedder encodes
    each sentence cut to that many tokens, as one forward of tokenizer(s, truncation=True,
    max_length=n) would; null keeps the whole sentence. The loop's job takes the setting."""
    import numpy as np
    import torch

    from sentemb.evaluate.sts import tune_dev_embedder
    from sentemb.train.loop import setup

    m = simcse.make()
    m.eval()
    sents = ["the man plays a guitar in the park with his old dog and a red car " * 2, "a cat sits on a mat"]
    tok = m.tokenizer

    def reference(n):
        with torch.no_grad():
            return torch.stack([m.encoder(**tok(s, truncation=n is not None, max_length=n, return_tensors="pt"))
                                .last_hidden_state[0, 0] for s in sents]).numpy()

    assert len(tok(sents[0])["input_ids"]) > 12
    whole = m.embedder("cls_before_pooler", torch.device("cpu"))
    cut = tune_dev_embedder(m.embedder("cls_before_pooler", torch.device("cpu")), "fp32", torch.device("cpu"), 12)
    assert np.allclose(whole(sents), reference(None), atol=1e-5) and np.allclose(cut(sents), reference(12), atol=1e-5)
    assert not np.allclose(cut(sents)[0], whole(sents)[0], atol=1e-3) and np.allclose(cut(sents)[1], whole(sents)[1])
    # an embedder that kept the whole sentences' plan (the loop's, after an evaluation) cuts them once told to
    tune_dev_embedder(whole, "fp32", torch.device("cpu"), 12)
    assert np.allclose(whole(sents), reference(12), atol=1e-5)
    job = setup(simcse.run(max_steps=1, dev_max_len=12), tmp_path / "out")
    try:
        assert job.embedder.max_length == 12
    finally:
        job.close()


@pytest.mark.realdata
def test_bf16_dev_evaluation_of_minilm_is_within_0_05_of_fp32(minilm_dir, shared):
    """STS-B dev of all-MiniLM-L6-v2 through the loop's dev embedder (``Method.embedder``: tokenized
    once, the plan kept): bf16 within 0.05 (Spearman x 100) of fp32 on the first 750 pairs (half of
    dev, to keep the test short); the seconds of each are printed (issue 36 §4)."""
    import dataclasses

    import torch

    from sentemb.evaluate.senteval import load_task
    from sentemb.evaluate.sts import stsb_dev, tune_dev_embedder
    from sentemb.methods import MethodContext, get_method
    from sentemb.model.backbone import load_encoder
    from sentemb.ops.flops import fp32_gemms

    dev = [dataclasses.replace(p, sent1=p.sent1[:750], sent2=p.sent2[:750], gold=p.gold[:750])
           for p in load_task(shared / "data" / "senteval", "STSBenchmark", "dev")]
    enc, tok = load_encoder(minilm_dir, pooling_layer=False)
    cls = get_method("simcse")
    m = cls(enc, tok, cls.resolve_args({}), MethodContext(max_len=32, seed=0, backbone="minilm", model_dir=minilm_dir))
    e = m.embedder("avg", torch.device("cpu"))
    scores = {}
    for precision in ("fp32", "bf16"):  # one embedder: bf16 reuses the plan (tokenized dev set) fp32 built
        tune_dev_embedder(e, precision, torch.device("cpu"))
        t0 = time.perf_counter()
        with fp32_gemms():  # bf16 inputs and outputs, fp32 sums: a bf16 GEMM's result, 8x faster on an AVX2 CPU
            scores[precision] = stsb_dev(e, dev)
        print(f"STS-B dev (750 pairs) {precision}: {scores[precision]:.3f} in {time.perf_counter() - t0:.2f} s")
    assert abs(scores["bf16"] - scores["fp32"]) <= 0.05, scores
    assert scores["fp32"] > 80


class _Synonyms:
    """Item i: the synset names of a slice of words, read through one WordNet reader."""

    def __init__(self, reader, words, per=50):
        self.reader, self.words, self.per = reader, words, per

    def __len__(self):
        return len(self.words) // self.per

    def __getitem__(self, i):
        return [[s.name() for s in self.reader.synsets(w)] for w in self.words[i * self.per : (i + 1) * self.per]]


def test_forked_workers_read_wordnet_through_files_of_their_own(tmp_path):
    """PaSeR's EDA reads WordNet (seek + readline on files the reader keeps open): workers forked from a
    process whose reader had opened them shared their offsets and read each other's lines. With
    ``own_wordnet_files`` (run by every worker) 2 workers give the parent's synsets."""
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    from sentemb.methods.paser import load_wordnet
    from sentemb.stats.inputs import InputUnavailable, nltk_mirror
    from sentemb.train.batches import _worker_init

    try:
        reader = load_wordnet(nltk_mirror())
    except (InputUnavailable, SentembError) as e:
        pytest.skip(str(e))
    lemmas = sorted(w for w in reader.all_lemma_names("n") if w.isalpha())
    _Synonyms(reader, lemmas[1::97][:200])[0]  # the parent opens the data files (other words: none cached)
    ds = _Synonyms(reader, lemmas[::11][:4000], per=20)
    loader = DataLoader(ds, batch_size=None, num_workers=2, worker_init_fn=_worker_init,
                        multiprocessing_context=mp.get_context("fork"))
    got = list(loader)
    assert got == [ds[i] for i in range(len(ds))]


def test_no_library_thread_comes_or_goes_before_the_workers_fork(tiny_bert_dir, monkeypatch):
    """``train.workers`` forks the batch workers once the model is loaded: a Python thread ending at
    that moment can leave the child's interpreter locked (a rank's worker hung 15 minutes in this
    suite on 2026-11-28, in ``os.fork``'s after-fork handler). Hugging Face's checkpoint loading
    left its thread pool's threads to end on their own, and tqdm's monitor thread came and went
    with each progress bar; after ``no_thread_churn`` (the loop's setup, with workers) neither
    loading a model nor a progress bar starts a thread. (The libraries' defaults are put back
    first: an earlier job of this process may have turned them off.)"""
    import threading

    import tqdm
    from huggingface_hub.utils import tqdm as hf_tqdm
    from transformers import AutoModel

    from sentemb.utils import no_thread_churn

    monkeypatch.setenv("HF_DEACTIVATE_ASYNC_LOAD", "0")
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 10)
    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or real_start(self))
    with open(os.devnull, "w") as devnull:
        AutoModel.from_pretrained(tiny_bert_dir)
        with tqdm.tqdm(total=1, file=devnull) as bar:
            bar.update()
        assert started, "no thread started before no_thread_churn: the check below could not fail"
        monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD")
        no_thread_churn()
        assert os.environ["HF_DEACTIVATE_ASYNC_LOAD"] == "1"
        started.clear()
        AutoModel.from_pretrained(tiny_bert_dir)
        for cls in (tqdm.tqdm, hf_tqdm):
            with cls(total=1, file=devnull) as bar:
                bar.update()
    assert started == [], started
    assert not any(t.name == "tqdm_monitor" for t in threading.enumerate())


def test_setup_makes_the_device_current_and_the_fork_safe(world, tmp_path, monkeypatch):
    """The loop's setup calls ``use_device`` (a job on cuda:N makes it current: its CUDA graphs are
    captured there; ``tests/test_graphs.py``) and, with ``train.workers``, ``no_thread_churn`` before
    the model loads; a job without workers leaves the libraries' threads alone."""
    import torch

    from sentemb import utils
    from sentemb.train.loop import setup

    enc, senteval, _ = world
    h = testing.harness("simcse", tmp_path / "h", model_dir=enc, senteval=senteval)
    churn, devices = [], []
    monkeypatch.setattr(utils, "no_thread_churn", lambda: churn.append(True))
    monkeypatch.setattr(utils, "use_device", lambda d: devices.append(d) or None)
    for n in (0, 1):
        with setup(_cfg(h, workers=n), tmp_path / f"workers{n}", method_cls=h.cls):
            assert len(churn) == n
    assert devices == [torch.device("cpu")] * 2, devices
