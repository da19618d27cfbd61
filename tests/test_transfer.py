"""Transfer tasks (SentEval protocol) and STS-B embedding geometry, against independent computations."""

import json
import math

import numpy as np
import pytest

from sentemb import SentembError
from sentemb.evaluate.sts import GOLD_BUCKETS, alignment, evaluate_sts, geometry, gold_bucket, uniformity
from sentemb.evaluate.transfer import (REGS_INNER, REGS_KFOLD, REGS_TORCH, TASK_FILES, LinearProbe, TorchProbeConfig,
                              evaluate_transfer, inner_kfold, inner_kfold_torch, kfold, kfold_torch,
                              load_transfer_task, mrpc_features, split_classifier, split_classifier_torch)


# ------------------------------------------------------------------------------ classifier protocol
def _separable(n=120, d=6, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    X = rng.normal(size=(n, d))
    X[:, 0] += np.where(y == 1, 6.0, -6.0)  # a wide margin along one axis
    return X, y


def _noise(n=400, d=6, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.permutation(np.arange(n) % 2)


def test_grids_are_senteval_sklearn_grids():
    assert REGS_INNER == [0.25, 0.5, 1, 2, 4, 8]
    assert REGS_KFOLD == [0.5, 1, 2, 4, 8, 16, 32]


def test_separable_set_is_learned_perfectly_and_noise_is_at_chance():
    X, y = _separable()
    r = inner_kfold(X, y)
    assert r["acc"] == 100.0 and r["devacc"] == 100.0
    assert len(r["C"]) == 10  # one choice per outer fold
    Xn, yn = _noise()
    rn = inner_kfold(Xn, yn)
    assert 35.0 < rn["acc"] < 65.0
    k = kfold(X[:80], y[:80], X[80:], y[80:])
    assert k["acc"] == 100.0
    s = split_classifier(X[:60], y[:60], X[60:90], y[60:90], X[90:], y[90:])
    assert s["acc"] == 100.0 and s["devacc"] == 100.0
    kn = kfold(Xn[:300], yn[:300], Xn[300:], yn[300:])
    assert 35.0 < kn["acc"] < 65.0


def test_inner_kfold_matches_an_explicit_reimplementation():
    """The protocol written out differently: folds by hand from StratifiedKFold indices, C chosen
    by comparing rounded mean accuracies in a loop (first maximum wins)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 4))
    y = (X[:, 0] + 0.8 * rng.normal(size=150) > 0).astype(int)
    folds = list(StratifiedKFold(10, shuffle=True, random_state=1111).split(X, y))
    accs, devs = [], []
    for tr, te in folds:
        best_c, best = None, -1.0
        for c in [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]:
            inner = StratifiedKFold(10, shuffle=True, random_state=1111).split(X[tr], y[tr])
            correct = [np.mean(LogisticRegression(C=c, random_state=1111).fit(X[tr][a], y[tr][a]).predict(X[tr][b])
                               == y[tr][b]) for a, b in inner]
            m = round(100 * sum(correct) / len(correct), 2)
            if m > best:
                best_c, best = c, m
        devs.append(best)
        pred = LogisticRegression(C=best_c, random_state=1111).fit(X[tr], y[tr]).predict(X[te])
        accs.append(round(100 * float(np.mean(pred == y[te])), 2))
    r = inner_kfold(X, y)
    assert r["acc"] == pytest.approx(round(sum(accs) / len(accs), 2))
    assert r["devacc"] == pytest.approx(round(sum(devs) / len(devs), 2))


def test_mrpc_features_layout():
    u = np.array([[1.0, -2.0]])
    v = np.array([[3.0, 5.0]])
    assert mrpc_features(u, v, "paper").tolist() == [[1, -2, 3, 5, 2, 7, 3, -10]]
    assert mrpc_features(u, v, "code").tolist() == [[2, 7, 3, -10]]
    with pytest.raises(SentembError, match="mrpc_features"):
        mrpc_features(u, v, "both")


# ------------------------------------------------------------------- SentEval's PyTorch classifier
def _ref_fit(X, y, dev=None, split=None, *, l2reg, nclasses, seed=1111, bs=64, tenacity=5, epoch_size=4,
             max_epoch=200):
    """SentEval's PyTorchClassifier/MLP(nhid=0) loop restated plainly (classifier.py, on CPU): global
    numpy and torch seeds, Sequential(Linear), CrossEntropyLoss, Adam with weight_decay set on the
    param group afterwards, one gather per mini-batch, best model deep-copied. Returns (model, best, nepoch)."""
    import copy

    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(X.shape[1], nclasses))
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters())
    opt.param_groups[0]["weight_decay"] = l2reg
    if dev is None:
        perm = np.random.permutation(len(X))
        cut = int(split * len(X))
        dev = (X[perm[:cut]], y[perm[:cut]])
        X, y = X[perm[cut:]], y[perm[cut:]]
    X, y = torch.from_numpy(X).float(), torch.from_numpy(y).long()
    dX, dy = torch.from_numpy(dev[0]).float(), torch.from_numpy(dev[1]).long()

    def acc(m, A, b):
        with torch.no_grad():
            return sum(int((m(A[i:i + bs]).max(1)[1] == b[i:i + bs]).sum()) for i in range(0, len(A), bs)) / len(A)

    nepoch, best, count, stop = 0, -1, 0, False
    while not stop and nepoch <= max_epoch:
        for _ in range(epoch_size):
            perm = np.random.permutation(len(X))
            for i in range(0, len(X), bs):
                idx = torch.from_numpy(perm[i:i + bs]).long()
                loss = loss_fn(model(X[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        nepoch += epoch_size
        a = acc(model, dX, dy)
        if a > best:
            best, kept = a, copy.deepcopy(model)
        else:
            if count >= tenacity:
                stop = True
            count += 1
    return kept, best, nepoch


@pytest.fixture
def one_thread():
    """The reference loop on one torch thread, as the protocol functions run (tiny products; two
    threads on a busy 2-core machine are many times slower)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _blobs(n=150, d=5, classes=2, seed=4):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    X = (rng.normal(size=(n, d)) + 0.8 * np.eye(classes, d)[y]).astype(np.float32)
    return X, y


def test_torch_grid_is_senteval_pytorch_grid():
    assert REGS_TORCH == [10**t for t in range(-5, -1)] == [1e-5, 1e-4, 1e-3, 1e-2]
    assert TorchProbeConfig() == TorchProbeConfig(batch_size=64, tenacity=5, epoch_size=4, max_epoch=200)


@pytest.mark.parametrize("mode,d,classes", [("validation_data", 5, 3), ("validation_split", 5, 3),
                                             ("validation_data", 384, 6)])
def test_linear_probe_is_sentevals_loop_bit_for_bit(mode, d, classes, one_thread):
    """At a toy width and at MiniLM's (384 dimensions, TREC's 6 classes: the real GEMM shapes)."""
    import torch

    X, y = _blobs(n=170, d=d, classes=classes)
    kw = {"validation_data": (X[130:], y[130:])} if mode == "validation_data" else {"validation_split": 0.05}
    ref, best, nepoch = _ref_fit(X[:130], y[:130], dev=kw.get("validation_data"), split=kw.get("validation_split"),
                                 l2reg=1e-3, nclasses=classes)
    probe = LinearProbe(d, classes, 1e-3)
    assert probe.fit(X[:130], y[:130], **kw) == best
    assert probe.nepoch == nepoch and nepoch > 4 * 6  # early stopping ran its course
    assert torch.equal(probe.model.weight, ref[0].weight) and torch.equal(probe.model.bias, ref[0].bias)
    with torch.no_grad():
        want = ref(torch.from_numpy(X[130:])).max(1)[1].numpy()
    assert probe.predict(X[130:]).tolist() == want.tolist()
    assert probe.score(X[130:], y[130:]) == float(np.mean(want == y[130:]))


@pytest.mark.parametrize("l2reg", [0.0, 1e-5, 1e-2])
def test_probe_step_is_autograd_and_torch_adam_bit_for_bit(l2reg, one_thread):
    """``_probe_gradients`` + ``_AdamUpdate`` against ``backward()`` + ``torch.optim.Adam`` over 300
    steps of batch 64 (and a last short batch), 384 dimensions, 6 classes: the same bits at every step."""
    import torch
    import torch.nn.functional as F

    from sentemb.evaluate.transfer import _AdamUpdate, _probe_gradients

    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(1000, 384, generator=g), torch.randint(0, 6, (1000,), generator=g)
    a, b = torch.nn.Linear(384, 6), torch.nn.Linear(384, 6)
    b.load_state_dict(a.state_dict())
    opt = torch.optim.Adam(a.parameters(), weight_decay=l2reg)
    ours = _AdamUpdate(torch.optim.Adam(b.parameters(), weight_decay=l2reg))
    unit = torch.ones(())  # the unit gradient LinearProbe.fit makes once; every other step makes its own
    for step in range(300):
        i = (step * 64) % 1000
        xb, yb = X[i:i + 64], y[i:i + 64]  # the step at i = 960 holds 40 rows
        loss = F.cross_entropy(a(xb), yb)
        opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            grads = _probe_gradients(xb, yb, b.weight, b.bias, unit if step % 2 else None)
        assert torch.equal(grads[0], a.weight.grad) and torch.equal(grads[1], a.bias.grad), step
        opt.step()
        with torch.no_grad():
            ours.step(grads)
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias), step
    assert not torch.equal(a.weight, torch.nn.Linear(384, 6).weight)  # it moved
    for bad in ({"amsgrad": True}, {"foreach": True}, {"maximize": True}):  # another update there: refused
        with pytest.raises(ValueError, match="plain Adam"):
            _AdamUpdate(torch.optim.Adam(b.parameters(), **bad))


def test_torch_protocols_match_the_reference_loop(one_thread):
    """KFoldClassifier, InnerKFoldClassifier and SplitClassifier (validation.py, usepytorch=True),
    k = 3, with every fit done by the restated loop above (a short early-stopping config, passed to both)."""
    from functools import partial

    import torch
    from sklearn.model_selection import StratifiedKFold

    short = dict(tenacity=1, epoch_size=2, max_epoch=40)
    cfg = TorchProbeConfig(**short)
    _ref = partial(_ref_fit, **short)
    X, y = _blobs(n=120, classes=3)
    # KFoldClassifier: per l2reg, fits early-stopped on each fold; refit with a 5 % split
    folds = list(StratifiedKFold(3, shuffle=True, random_state=1111).split(X[:90], y[:90]))
    scores = [round(100 * np.mean([_ref(X[a], y[a], dev=(X[b], y[b]), l2reg=r, nclasses=3)[1] for a, b in folds]), 2)
              for r in REGS_TORCH]
    best = int(np.argmax(scores))
    model, _, _ = _ref(X[:90], y[:90], split=0.05, l2reg=REGS_TORCH[best], nclasses=3)
    with torch.no_grad():
        pred = model(torch.from_numpy(X[90:])).max(1)[1].numpy()
    got = kfold_torch(X[:90], y[:90], X[90:], y[90:], k=3, config=cfg)
    assert got["devacc"] == max(scores) and got["l2reg"] == REGS_TORCH[best]
    assert got["yhat"].tolist() == pred.tolist() and got["acc"] == round(100 * float(np.mean(pred == y[90:])), 2)
    # InnerKFoldClassifier (binary)
    Xb, yb = _blobs(n=90, classes=2, seed=5)
    accs, devs = [], []
    for tr, te in StratifiedKFold(3, shuffle=True, random_state=1111).split(Xb, yb):
        inner = list(StratifiedKFold(3, shuffle=True, random_state=1111).split(Xb[tr], yb[tr]))
        sc = [round(100 * np.mean([_ref(Xb[tr][a], yb[tr][a], dev=(Xb[tr][b], yb[tr][b]), l2reg=r, nclasses=2)[1]
                                   for a, b in inner]), 2) for r in REGS_TORCH]
        devs.append(max(sc))
        m, _, _ = _ref(Xb[tr], yb[tr], split=0.05, l2reg=REGS_TORCH[int(np.argmax(sc))], nclasses=2)
        with torch.no_grad():
            accs.append(round(100 * float(np.mean(m(torch.from_numpy(Xb[te])).max(1)[1].numpy() == yb[te])), 2))
    got = inner_kfold_torch(Xb, yb, k=3, config=cfg)
    assert got["acc"] == round(float(np.mean(accs)), 2) and got["devacc"] == round(float(np.mean(devs)), 2)
    # SplitClassifier
    fits = [_ref(Xb[:50], yb[:50], dev=(Xb[50:70], yb[50:70]), l2reg=r, nclasses=2) for r in REGS_TORCH]
    sc = [round(100 * f[1], 2) for f in fits]
    with torch.no_grad():
        pred = fits[int(np.argmax(sc))][0](torch.from_numpy(Xb[70:])).max(1)[1].numpy()
    got = split_classifier_torch(Xb[:50], yb[:50], Xb[50:70], yb[50:70], Xb[70:], yb[70:], config=cfg)
    assert got["devacc"] == max(sc) and got["acc"] == round(100 * float(np.mean(pred == yb[70:])), 2)


def test_torch_path_is_deterministic_and_leaves_global_state_alone():
    import torch

    X, y = _blobs(n=90, classes=2, seed=6)
    np.random.seed(7)
    torch.manual_seed(7)
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    threads = torch.get_num_threads()
    a = inner_kfold_torch(X, y, k=3)
    torch.set_num_threads(2)
    try:
        b = inner_kfold_torch(X, y, k=3)
    finally:
        torch.set_num_threads(threads)
    assert a == b
    assert torch.get_num_threads() == threads  # the one-thread classifier restores the caller's setting
    assert np.array_equal(np.random.get_state()[1], np_state) and torch.equal(torch.get_rng_state(), torch_state)


def test_bad_classifier_names_the_key(tmp_path):
    root = _write_transfer_tree(tmp_path)
    with pytest.raises(SentembError, match=r"evaluation\.transfer_classifier.*svm"):
        evaluate_transfer(lambda s: np.zeros((len(s), 2)), root, ["TREC"], classifier="svm")


@pytest.mark.parametrize("value", ["svm", True])
def test_bad_transfer_classifier_in_config_names_the_key(value):
    import yaml

    from conftest import REPO
    from sentemb.config.load import validate_config

    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["evaluation"]["transfer_classifier"] = value
    with pytest.raises(SentembError, match=r"evaluation\.transfer_classifier"):
        validate_config(cfg)
    del cfg["evaluation"]["transfer_classifier"]
    assert validate_config(cfg)["evaluation"]["transfer_classifier"] == "pytorch"  # the schema's default


# ---------------------------------------------------------------------------------- data loading
def _write_transfer_tree(root):
    """A SentEval-shaped transfer tree: class words make every task separable."""
    rng = np.random.default_rng(0)
    filler = "the a of and to in is was for on".split()

    def sent(word):
        return " ".join([*rng.choice(filler, size=rng.integers(2, 6)), word])

    def w(rel, lines, enc="utf-8"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(l + "\n" for l in lines), encoding=enc)

    for task, (pos, neg) in {"MR": ("good", "bad"), "CR": ("good", "bad"), "SUBJ": ("dog", "cat"),
                             "MPQA": ("yes", "no")}.items():
        files = TASK_FILES[task]
        w(files[0], [sent(pos) for _ in range(40)], "latin-1")
        w(files[1], [sent(neg) for _ in range(40)], "latin-1")
    for split, n in (("train", 60), ("dev", 20), ("test", 20)):
        w(f"SST/binary/sentiment-{split}", [f"{sent(['bad', 'good'][i % 2])} \t{i % 2}" for i in range(n)])
    classes = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    words = ["one", "two", "three", "man", "city", "red"]
    w("TREC/train_5500.label", [f"{classes[i % 6]}:x {sent(words[i % 6])}" for i in range(120)], "latin-1")
    w("TREC/TREC_10.label", [f"{classes[i % 6]}:x {sent(words[i % 6])}" for i in range(30)], "latin-1")
    for split, n in (("train", 80), ("test", 30)):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            y = i % 2
            a = sent("dog")
            rows.append(f"{y}\t{i}\t{i + 1}\t{a}\t{a if y else sent('car')}")
        w(f"MRPC/msr_paraphrase_{split}.txt", rows)
    return root


def test_loaders_follow_senteval_order_and_labels(tmp_path):
    root = _write_transfer_tree(tmp_path)
    t = load_transfer_task(root, "SUBJ")
    x, y = t.splits["all"]
    assert len(x) == 80 and sum(y) == 40
    keys = [(len(s.split()), l) for s, l in zip(x, y)]
    assert keys == sorted(keys)  # SentEval sorts by (tokens, label) before the folds
    assert all(("dog" in s) == (l == 1) for s, l in zip(x, y))  # SUBJ: objective is class 1
    trec = load_transfer_task(root, "TREC")
    assert sorted(set(trec.splits["train"][1])) == [0, 1, 2, 3, 4, 5]
    assert not any(s.startswith("x ") for s in trec.splits["train"][0])  # the fine label is dropped
    mrpc = load_transfer_task(root, "MRPC")
    (a, b), y = mrpc.splits["train"]
    assert len(a) == len(b) == len(y) == 80  # header skipped (with its BOM)


def test_missing_task_file_is_named(tmp_path):
    root = _write_transfer_tree(tmp_path)
    (root / "CR" / "custrev.neg").unlink()
    with pytest.raises(SentembError, match=r"CR.*custrev\.neg"):
        load_transfer_task(root, "CR")


@pytest.mark.parametrize("classifier", ["pytorch", "sklearn"])
def test_cli_end_to_end_on_tiny_model(tmp_path, tiny_bert_dir, classifier):
    from sentemb.cli import main

    root = _write_transfer_tree(tmp_path / "se")
    out = tmp_path / "t.json"
    rc = main(["evaluate-transfer", "--model", str(tiny_bert_dir), "--pooler", "avg", "--data-dir", str(root),
               "--output", str(out), "--quiet", "--device", "cpu", "--kfold", "3", "--classifier", classifier,
               "--run-meta", "name=x", "--run-meta", "seed=1"])
    assert rc == 0
    d = json.loads(out.read_text())
    for t in ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]:
        assert 0.0 <= d[t] <= 100.0
        assert d["details"][t]["seconds"] >= 0
    assert d["avg"] == pytest.approx(np.mean([d[t] for t in ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]]))
    assert "MRPC_F1" in d and d["details"]["SST2"]["n"] == {"train": 60, "dev": 20, "test": 20}
    assert d["run"] == {"name": "x", "seed": 1}
    assert d["protocol"]["classifier"] == classifier
    assert all(d["details"][t]["classifier"] == classifier for t in d["details"])
    assert ("l2reg" if classifier == "pytorch" else "C") in d["details"]["TREC"]
    # a missing file fails before any model is loaded, naming the file
    (root / "TREC" / "TREC_10.label").unlink()
    assert main(["evaluate-transfer", "--model", str(tiny_bert_dir), "--pooler", "avg", "--data-dir", str(root),
                 "--tasks", "TREC", "--output", str(tmp_path / "u.json")]) == 2
    assert not (tmp_path / "u.json").exists()


def test_encode_then_classify_without_the_model_gives_the_one_job_numbers(tmp_path, tiny_bert_dir):
    """issue 26 §4: `encode-transfer` (the GPU job) + `evaluate-transfer --features` (the CPU job,
    no model loaded) = `evaluate-transfer` in one process, to the last digit; classifying the tasks
    in worker processes (--workers 3) changes nothing either."""
    from sentemb.cli import main

    root = _write_transfer_tree(tmp_path / "se")
    common = ["--data-dir", str(root), "--quiet", "--kfold", "3", "--tasks", "CR,SST2,TREC,MRPC"]
    assert main(["evaluate-transfer", "--model", str(tiny_bert_dir), "--pooler", "avg", "--device", "cpu",
                 "--output", str(tmp_path / "one.json"), *common]) == 0
    feats = tmp_path / "f" / "features.npz"
    assert main(["encode-transfer", "--model", str(tiny_bert_dir), "--pooler", "avg", "--device", "cpu",
                 "--output", str(feats), "--data-dir", str(root), "--quiet", "--tasks", "CR,SST2,TREC,MRPC"]) == 0
    assert sorted(p.name for p in feats.parent.iterdir()) == ["features.npz"]  # nothing half-written beside it
    for workers in ("1", "3"):
        out = tmp_path / f"split{workers}.json"
        assert main(["evaluate-transfer", "--features", str(feats), "--model", "/nowhere/not/loaded",
                     "--output", str(out), "--workers", workers, *common]) == 0
        one, split = json.loads((tmp_path / "one.json").read_text()), json.loads(out.read_text())
        for t in ("CR", "SST2", "TREC", "MRPC"):
            a, b = one["details"][t], split["details"][t]
            for key in ("acc", "devacc", "l2reg", "n", "f1", "n_sentences"):
                assert a.get(key) == b.get(key), (t, key, workers)
        assert split["avg"] == one["avg"] and split["MRPC_F1"] == one["MRPC_F1"]
        assert split["pooler"] == "avg" and split["workers"] == int(workers)
        assert split["classifier_cpu_seconds"] > 0


def test_features_that_do_not_match_the_data_are_refused(tmp_path, tiny_bert_dir):
    """A features file is checked against the task sentences as they are read now: another task,
    an edited data file, a truncated file each fail with the file named, and write nothing."""
    from sentemb.cli import main

    root = _write_transfer_tree(tmp_path / "se")
    feats = tmp_path / "features.npz"
    assert main(["encode-transfer", "--model", str(tiny_bert_dir), "--pooler", "avg", "--device", "cpu",
                 "--output", str(feats), "--data-dir", str(root), "--quiet", "--tasks", "CR"]) == 0
    out = tmp_path / "t.json"

    def classify(*extra):
        return main(["evaluate-transfer", "--features", str(feats), "--data-dir", str(root), "--output", str(out),
                     "--quiet", "--kfold", "3", *extra])

    assert classify("--tasks", "TREC") == 2 and not out.exists()  # not encoded
    with (root / "CR" / "custrev.pos").open("a", encoding="latin-1") as f:
        f.write("a sentence added after encoding\n")
    from sentemb.evaluate.transfer import load_transfer_task, read_features

    with pytest.raises(SentembError, match=r"features\.npz.*CR.*other sentences"):
        read_features(feats, load_transfer_task(root, "CR"))
    assert classify("--tasks", "CR") == 2 and not out.exists()
    feats.write_bytes(feats.read_bytes()[:100])
    with pytest.raises(SentembError, match=r"features\.npz: not a transfer features file"):
        read_features(feats, load_transfer_task(root, "CR"))
    assert main(["evaluate-transfer", "--data-dir", str(root), "--output", str(out), "--tasks", "CR"]) == 2


def test_classifier_estimate_scales_with_width_and_packs_tasks_longest_first():
    from sentemb.evaluate.transfer import CLASSIFIER_SECONDS_384, classifier_seconds, classifier_wall_seconds

    tasks = list(CLASSIFIER_SECONDS_384)
    at384 = [classifier_seconds(t, 384, mrpc_mode="code") for t in tasks]
    assert at384 == pytest.approx([CLASSIFIER_SECONDS_384[t] for t in tasks])  # the measured figures
    assert all(classifier_seconds(t, 1024) > classifier_seconds(t, 768) > classifier_seconds(t, 384) for t in tasks)
    assert classifier_seconds("MRPC", 384, mrpc_mode="paper") > classifier_seconds("MRPC", 384, mrpc_mode="code")
    assert classifier_seconds("MR", 384, classifier="sklearn") < 0.2 * classifier_seconds("MR", 384)
    # longest-processing-time-first packing, checked by hand: {154}, {145}, {142}, {57+15+14+7}
    assert classifier_wall_seconds(at384, 4) == pytest.approx(154)
    assert classifier_wall_seconds(at384, 1) == pytest.approx(sum(at384))
    assert classifier_wall_seconds([5.0, 4.0, 3.0, 3.0, 3.0], 2) == pytest.approx(10.0)  # {5,3}, {4,3,3}


@pytest.mark.realdata
def test_real_trec_on_minilm_matches_senteval(shared, minilm_dir):
    """all-MiniLM-L6-v2, mean pooling, TREC, the accuracies SentEval's own code (facebookresearch/SentEval,
    kfold=10) gives on this machine (docs/evaluation.md): 89.20 with usepytorch=False, 90.00 (dev
    85.23) with usepytorch=True and SimCSE's classifier config. One encoding serves both classifiers."""
    from sentemb.model.encoder import Embedder

    emb = Embedder.from_dir(minilm_dir, "avg", device="cpu")
    memo = {}

    def embed(sents):
        key = tuple(sents)
        if key not in memo:
            memo[key] = emb(sents)
        return memo[key]

    r = evaluate_transfer(embed, shared / "data" / "senteval", ["TREC"], classifier="sklearn")
    d = r["details"]["TREC"]
    assert d["n"] == {"train": 5452, "test": 500}
    assert r["TREC"] == pytest.approx(89.2, abs=0.01)
    assert d["devacc"] == pytest.approx(85.45, abs=0.1)
    r = evaluate_transfer(embed, shared / "data" / "senteval", ["TREC"], classifier="pytorch")
    assert len(memo) == 1
    assert r["TREC"] == pytest.approx(90.0, abs=0.01)
    assert r["details"]["TREC"]["devacc"] == pytest.approx(85.23, abs=0.01)
    assert r["details"]["TREC"]["l2reg"] == 1e-4


# --------------------------------------------------------------------------------------- geometry
def test_alignment_and_uniformity_against_direct_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    na = a / np.sqrt((a**2).sum(1, keepdims=True))
    nb = b / np.sqrt((b**2).sum(1, keepdims=True))
    want_align = sum(float(((na[i] - nb[i]) ** 2).sum()) for i in range(7)) / 7
    assert alignment(a, b) == pytest.approx(want_align, rel=1e-10)
    x = rng.normal(size=(9, 5))
    nx = x / np.linalg.norm(x, axis=1, keepdims=True)
    terms = [math.exp(-2 * float(((nx[i] - nx[j]) ** 2).sum())) for i in range(9) for j in range(i + 1, 9)]
    assert uniformity(x) == pytest.approx(math.log(sum(terms) / len(terms)), rel=1e-10)
    assert uniformity(np.ones((4, 3))) == pytest.approx(0.0, abs=1e-12)  # collapsed space: log 1


def test_gold_buckets_at_edges():
    g = np.array([0.0, 0.999, 1.0, 1.5, 2.0, 3.999, 4.0, 4.6, 5.0])
    assert gold_bucket(g).tolist() == [0, 0, 1, 1, 2, 3, 4, 4, 4]
    assert [f"{lo}-{hi}" for lo, hi in GOLD_BUCKETS] == ["0-1", "1-2", "2-3", "3-4", "4-5"]


def test_geometry_fields():
    e1 = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    e2 = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    g = geometry(e1, e2, np.array([4.5, 2.2, 0.1]), np.vstack([e1, e2]))
    assert g["align"] == pytest.approx(0.0) and g["n_align_pairs"] == 1
    assert g["cosine_buckets"]["2-3"]["cosines"] == [0.0]
    assert g["cosine_buckets"]["0-1"]["mean"] == pytest.approx(-1.0)
    assert g["cosine_buckets"]["1-2"] == {"n": 0, "mean": None, "std": None, "cosines": []}


def test_geometry_comes_from_the_sts_evaluation(tiny_senteval):
    from sentemb.evaluate.senteval import load_task

    calls = []

    def embed(sents):
        calls.append(len(sents))
        return np.stack([np.array([len(s), s.count("a") + 1.0, 1.0]) for s in sents])

    r = evaluate_sts(embed, tiny_senteval, ["STSBenchmark"])
    assert len(calls) == 1  # one encoding pass for scores and geometry
    p = load_task(tiny_senteval, "STSBenchmark")[0]
    e1, e2 = embed(p.sent1), embed(p.sent2)
    gold = np.array(p.gold)
    assert r["geometry"]["align"] == pytest.approx(alignment(e1[gold >= 4], e2[gold >= 4]))
    assert sum(v["n"] for v in r["geometry"]["cosine_buckets"].values()) == len(gold)


def test_avg_static_last_pooler_is_embeddings_plus_last_layer(tiny_bert_dir):
    """The papers' "first-last avg." rows: mean over real tokens of (embedding output + last layer) / 2,
    computed here from the model's modules directly."""
    import torch

    from sentemb.model.encoder import Embedder

    emb = Embedder.from_dir(tiny_bert_dir, "avg_static_last", device="cpu")
    got = emb(["the dog runs", "a cat"])
    model, tok = emb.model, emb.tokenizer
    want = []
    with torch.no_grad():
        for s in ["the dog runs", "a cat"]:
            ids = tok(s, return_tensors="pt")
            static = model.embeddings(input_ids=ids["input_ids"], token_type_ids=ids["token_type_ids"])[0]
            last = model(**ids).last_hidden_state[0]
            want.append(((static + last) / 2).mean(0).numpy())
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-4, atol=1e-5)
    first = Embedder.from_dir(tiny_bert_dir, "avg_first_last", device="cpu")(["the dog runs"])
    assert not np.allclose(first[0], got[0])  # the later code's variant differs
