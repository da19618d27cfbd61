"""The data-acquisition stage: downloads over real HTTP, mirrors, verification, atomic outputs."""

from __future__ import annotations

import functools
import http.server
import io
import json
import shutil
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from sentemb import SentembError
from sentemb.cli import main
from sentemb.data.fetch import fetch_corpus, fetch_model, fetch_nltk, fetch_senteval, fetch_senteval_raw, prepare_corpus
from sentemb.evaluate.senteval import STS_SUBSETS, load_task
from sentemb.utils import sha256_file

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TINY_INIT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64}
# Scored pairs in the tree make_sts_tree builds (2 per STS subset; STS15/16 also hold an unscored one).
TINY_COUNTS = {"STS12": 10, "STS13": 6, "STS14": 12, "STS15": 10, "STS16": 10,
               "STSBenchmark": 3, "STSBenchmark/dev": 2, "SICKRelatedness": 3}


def make_sts_tree(root: Path) -> Path:
    """A tiny SentEval ``data/downstream`` tree with every STS/SICK file the readers need."""
    for task, subsets in STS_SUBSETS.items():
        d = root / "STS" / f"{task}-en-test"
        d.mkdir(parents=True)
        for sub in subsets:
            inputs = [f"a man plays the guitar {i}\ta man is playing music {i}" for i in range(2)]
            golds = ["4.2", "1.0"]
            if task in ("STS15", "STS16"):
                inputs.append("an unscored pair\tis dropped")
                golds.append("")
            (d / f"STS.input.{sub}.txt").write_text("\n".join(inputs) + "\n")
            (d / f"STS.gs.{sub}.txt").write_text("\n".join(golds) + "\n")
    stsb = root / "STS" / "STSBenchmark"
    stsb.mkdir()
    for split, n in (("dev", 2), ("test", 3), ("train", 4)):
        rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i}.5\ta dog runs {i}\ta dog is running" for i in range(n)]
        (stsb / f"sts-{split}.csv").write_text("\n".join(rows) + "\n")
    (root / "SICK").mkdir()
    for name, n in (("SICK_test_annotated.txt", 3), ("SICK_trial.txt", 2), ("SICK_train.txt", 2)):
        rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
        rows += [f"{i}\ta cat sits on the mat\tthe cat is sitting {i}\t{1 + i}.5\tNEUTRAL" for i in range(n)]
        (root / "SICK" / name).write_text("\n".join(rows) + "\n")
    return root


def make_archive(tree: Path, dest: Path, prefix: str = "SentEval/data/downstream") -> Path:
    """Pack ``tree`` under ``prefix`` as a tar, tar.gz or zip, chosen by ``dest``'s suffix."""
    if dest.suffix == ".zip":
        with zipfile.ZipFile(dest, "w") as zf:
            for p in sorted(tree.rglob("*")):
                zf.write(p, f"{prefix}/{p.relative_to(tree)}")
    else:
        with tarfile.open(dest, "w:gz" if dest.name.endswith(".gz") else "w") as tf:
            tf.add(tree, arcname=prefix)
    return dest


@pytest.fixture(scope="module")
def http_root(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 serving a temporary directory: yields (directory, base url)."""
    root = tmp_path_factory.mktemp("www")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def tiny_tar(http_root, tmp_path_factory):
    """The tiny tree as a tar served over HTTP: (url, sha256)."""
    root, base = http_root
    tar = make_archive(make_sts_tree(tmp_path_factory.mktemp("tree")), root / "senteval.tar")
    return f"{base}/senteval.tar", sha256_file(tar)


def assert_clean(out: Path) -> None:
    """Neither ``out`` nor a temporary sibling of it is left behind."""
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


# ----------------------------------------------------------------------------- SentEval over HTTP


def test_fetch_senteval_http(tmp_path, tiny_tar):
    url, sha = tiny_tar
    out = tmp_path / "res" / "senteval"
    fetch_senteval(out, url=url, sha256=sha, expected_counts=TINY_COUNTS)
    assert sorted(p.name for p in out.iterdir()) == [".sentemb_manifest.json", "SICK", "STS"]  # + what was verified
    assert len(load_task(out, "STSBenchmark")[0]) == 3
    assert [len(p) for p in load_task(out, "STS16")] == [2] * 5
    assert [p.name for p in out.parent.iterdir()] == ["senteval"]  # no temporary leftovers


@pytest.mark.parametrize("name", ["flat.tar.gz", "flat.zip"])
def test_fetch_senteval_other_formats_and_depths(tmp_path, http_root, name):
    root, base = http_root
    make_archive(make_sts_tree(tmp_path / "tree"), root / name, prefix="downstream")
    out = tmp_path / "senteval"
    fetch_senteval(out, url=f"{base}/{name}", expected_counts=TINY_COUNTS)
    assert len(load_task(out, "SICKRelatedness")[0]) == 3


def test_fetch_senteval_sha256_mismatch(tmp_path, tiny_tar):
    out = tmp_path / "senteval"
    with pytest.raises(SentembError, match="sha256 mismatch") as e:
        fetch_senteval(out, url=tiny_tar[0], sha256="0" * 64, expected_counts=TINY_COUNTS)
    assert tiny_tar[0] in str(e.value)
    assert_clean(out)


def test_fetch_senteval_wrong_counts(tmp_path, tiny_tar):
    out = tmp_path / "senteval"
    with pytest.raises(SentembError, match=r"STS12: 10 pairs, expected 3108") as e:
        fetch_senteval(out, url=tiny_tar[0])  # the real published counts
    assert tiny_tar[0] in str(e.value) and ".tmp-" not in str(e.value)
    assert_clean(out)


def test_fetch_senteval_404(tmp_path, http_root):
    out = tmp_path / "senteval"
    with pytest.raises(SentembError, match=r"download of http://127\.0\.0\.1:\d+/missing\.tar failed: HTTP 404"):
        fetch_senteval(out, url=f"{http_root[1]}/missing.tar")
    assert_clean(out)


def test_fetch_senteval_rejects_unsafe_and_foreign_archives(tmp_path, http_root):
    root, base = http_root
    with tarfile.open(root / "evil.tar", "w") as tf:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(SentembError, match=r"unsafe archive member '\.\./evil\.txt'"):
        fetch_senteval(tmp_path / "a", url=f"{base}/evil.tar")
    (root / "notes.txt").write_text("not an archive")
    with pytest.raises(SentembError, match="not a tar or zip archive"):
        fetch_senteval(tmp_path / "b", url=f"{base}/notes.txt")
    (tmp_path / "other" / "x").mkdir(parents=True)
    make_archive(tmp_path / "other", root / "other.tar")
    with pytest.raises(SentembError, match="no STS/STSBenchmark directory"):
        fetch_senteval(tmp_path / "c", url=f"{base}/other.tar")
    assert not (tmp_path / "evil.txt").exists() and not (root.parent / "evil.txt").exists()


# ----------------------------------------------------------------------------- mirrors


@pytest.fixture
def mirror(tmp_path, tiny_bert_dir):
    """A small mirror laid out like ../shared."""
    m = tmp_path / "mirror"
    make_sts_tree(m / "data" / "senteval")
    make_sts_tree(m / "data" / "senteval-raw")
    (m / "data" / "wiki1m_head.txt").write_text("".join(f"sentence number {i} .\n" for i in range(20)))
    shutil.copytree(tiny_bert_dir, m / "models" / "tiny-bert")
    sw = m / "nltk_data" / "corpora" / "stopwords"
    sw.mkdir(parents=True)
    (sw / "english").write_text("the\na\nof\n")
    return m


def test_fetch_senteval_mirror(tmp_path, mirror):
    fetch_senteval(tmp_path / "se", mirror=mirror, expected_counts=TINY_COUNTS)
    fetch_senteval_raw(tmp_path / "raw", mirror=mirror, expected_counts=TINY_COUNTS)
    assert len(load_task(tmp_path / "raw", "STS12")) == 5
    with pytest.raises(SentembError, match=r"mirror: .*/mirror/data/nowhere does not exist"):
        fetch_senteval(tmp_path / "x", mirror=mirror, mirror_path="data/nowhere")
    with pytest.raises(SentembError, match="mirror directory .*/absent does not exist"):
        fetch_senteval(tmp_path / "x", mirror=tmp_path / "absent")
    with pytest.raises(SentembError, match="no canonical download"):
        fetch_senteval_raw(tmp_path / "x")
    assert_clean(tmp_path / "x")


def test_fetch_corpus_mirror(tmp_path, mirror):
    src = mirror / "data" / "wiki1m_head.txt"
    out = tmp_path / "corpus" / "wiki.raw.txt"
    fetch_corpus(out, hub_repo="r", hub_file="f.txt", mirror=mirror, mirror_path="data/wiki1m_head.txt",
                 sha256=sha256_file(src), expected_lines=20)
    assert out.read_bytes() == src.read_bytes()
    bad = tmp_path / "bad.txt"
    with pytest.raises(SentembError, match=r"wiki1m_head\.txt: 20 lines, expected 21"):
        fetch_corpus(bad, hub_repo="r", hub_file="f", mirror=mirror, mirror_path="data/wiki1m_head.txt",
                     expected_lines=21)
    with pytest.raises(SentembError, match=r"wiki1m_head\.txt: sha256 mismatch"):
        fetch_corpus(bad, hub_repo="r", hub_file="f", mirror=mirror, mirror_path="data/wiki1m_head.txt",
                     sha256="0" * 64)
    with pytest.raises(SentembError, match=r"corpus not found in the mirror: .*data/f\.txt does not exist"):
        fetch_corpus(bad, hub_repo="r", hub_file="f.txt", mirror=mirror)
    assert_clean(bad)


def test_fetch_corpus_hub(tmp_path, monkeypatch):
    import huggingface_hub

    cached = tmp_path / "cache" / "snapshots" / "abc" / "wiki.txt"
    cached.parent.mkdir(parents=True)
    cached.write_text("one\ntwo\n")
    calls = []

    def fake_download(**kw):
        calls.append(kw)
        if kw["filename"] != "wiki.txt":
            raise huggingface_hub.errors.EntryNotFoundError("404 Client Error: Entry Not Found")
        return str(cached)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    fetch_corpus(tmp_path / "c.txt", hub_repo="org/data", hub_file="wiki.txt", revision="v1", expected_lines=2)
    assert calls == [{"repo_id": "org/data", "filename": "wiki.txt", "repo_type": "dataset", "revision": "v1"}]
    assert (tmp_path / "c.txt").read_text() == "one\ntwo\n"
    with pytest.raises(SentembError, match="download of org/data/gone.txt from the Hugging Face hub failed"):
        fetch_corpus(tmp_path / "d.txt", hub_repo="org/data", hub_file="gone.txt")


def test_fetch_model_mirror(tmp_path, mirror):
    weights = mirror / "models" / "tiny-bert" / "model.safetensors"
    out = tmp_path / "models" / "tiny"
    fetch_model(out, hub_id="someone/tiny-bert", mirror=mirror, sha256=sha256_file(weights))
    source = json.loads((out / "sentemb_source.json").read_text())
    assert source["source"] == "mirror" and source["sha256"] == sha256_file(weights)
    assert source["path"].endswith("models/tiny-bert")
    bad = tmp_path / "models" / "bad"
    with pytest.raises(SentembError, match=r"tiny-bert/model\.safetensors: sha256 mismatch"):
        fetch_model(bad, hub_id="someone/tiny-bert", mirror=mirror, sha256="0" * 64)
    with pytest.raises(SentembError, match=r"model x/absent not found in the mirror: .*models/absent does not exist"):
        fetch_model(bad, hub_id="x/absent", mirror=mirror)
    weights.unlink()
    with pytest.raises(SentembError, match="no weights file"):
        fetch_model(bad, hub_id="someone/tiny-bert", mirror=mirror)
    assert_clean(bad)


def test_a_model_without_its_tokenizer_or_with_cut_weights_is_refused_naming_the_file(tmp_path, mirror, tiny_bert_dir):
    """transformers 5 builds a 5-token tokenizer from a directory without a vocabulary, which maps every
    word to [UNK]: fetch-model, the encoder's loader and the statistics refuse it, as they refuse a
    safetensors file cut short (its header names more bytes than it has) and a cut vocabulary."""
    from sentemb.model.backbone import load_encoder, load_tokenizer
    from sentemb.stats.frequency import load_tokenizer as stats_tokenizer

    src = mirror / "models" / "tiny-bert"
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()
    bad = tmp_path / "models" / "notok"
    for load in (lambda: fetch_model(bad, hub_id="someone/tiny-bert", mirror=mirror), lambda: load_encoder(src),
                 lambda: stats_tokenizer(src), lambda: load_tokenizer(src)):
        with pytest.raises(SentembError, match=r"tiny-bert: the tokenizer has \d+ tokens, config\.json's vocab_size is "
                                               r"\d+: its vocabulary file is missing, cut or another model's"):
            load()
    assert_clean(bad)

    cut = tmp_path / "cut"
    shutil.copytree(tiny_bert_dir, cut)
    whole = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SentembError, match=r"cut/model\.safetensors: not a whole safetensors file"):
        load_encoder(cut)
    shutil.copytree(cut, mirror / "models" / "cut")
    with pytest.raises(SentembError, match=r"cut/model\.safetensors: not a whole safetensors file"):
        fetch_model(bad, hub_id="someone/cut", mirror=mirror)
    assert_clean(bad)

    (cut / "model.safetensors").write_bytes(whole)
    words = (cut / "vocab.txt").read_text().splitlines()
    (cut / "tokenizer.json").unlink()
    (cut / "vocab.txt").write_text("\n".join(words[: len(words) // 3]) + "\n")
    with pytest.raises(SentembError, match=rf"cut: the tokenizer has \d+ tokens, config\.json's vocab_size is "
                                           rf"{len(words)}"):
        load_encoder(cut)
    (cut / "config.json").write_text("{}")  # no vocab_size to compare with: only special tokens is refused
    (cut / "vocab.txt").unlink()
    with pytest.raises(SentembError, match=r"cut: the tokenizer has only its \d+ special tokens: no vocabulary file"):
        load_tokenizer(cut)


def test_fetch_model_random_init_is_deterministic(tmp_path, mirror):
    from transformers import AutoConfig, AutoTokenizer

    (mirror / "models" / "tiny-bert" / "model.safetensors").unlink()  # only the tokenizer is needed
    for name in ("a", "b"):
        fetch_model(tmp_path / name, hub_id="x/tiny-bert", mirror=mirror, random_init=TINY_INIT)
    assert sha256_file(tmp_path / "a" / "model.safetensors") == sha256_file(tmp_path / "b" / "model.safetensors")
    cfg = AutoConfig.from_pretrained(tmp_path / "a")
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (32, 2)
    assert cfg.vocab_size == len(AutoTokenizer.from_pretrained(tmp_path / "a"))
    assert json.loads((tmp_path / "a" / "sentemb_source.json").read_text())["random_init"] == TINY_INIT
    with pytest.raises(SentembError, match="must name 'model_type'"):
        fetch_model(tmp_path / "c", hub_id="x/tiny-bert", mirror=mirror, random_init={"hidden_size": 8})


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_fetch_model_hub(tmp_path, tiny_bert_dir, monkeypatch, weights):
    """snapshot_download gets the config/tokenizer/weights patterns; .bin only without safetensors."""
    import fnmatch

    import huggingface_hub
    import torch
    from safetensors.torch import load_file

    repo = tmp_path / "repo"
    shutil.copytree(tiny_bert_dir, repo)
    (repo / "README.md").write_text("not fetched")
    torch.save(load_file(repo / "model.safetensors"), repo / "pytorch_model.bin")
    if weights == "pytorch_model.bin":
        (repo / "model.safetensors").unlink()
    calls = []

    def fake_snapshot(repo_id, revision=None, allow_patterns=None):
        calls.append(allow_patterns)
        snap = tmp_path / "cache" / f"snap{len(calls)}" / "0123abcd"
        for p in repo.iterdir():
            if any(fnmatch.fnmatch(p.name, pat) for pat in allow_patterns):
                snap.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, snap / p.name)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    out = tmp_path / "out"
    fetch_model(out, hub_id="org/tiny", revision="main", sha256=sha256_file(repo / weights))
    assert sorted(p.name for p in out.iterdir() if "model" in p.name) == [weights]
    assert not (out / "README.md").exists()
    assert len(calls) == (1 if weights == "model.safetensors" else 2)
    source = json.loads((out / "sentemb_source.json").read_text())
    assert (source["source"], source["commit"], source["revision"]) == ("hub", "0123abcd", "main")


def test_fetch_nltk_mirror(tmp_path, mirror):
    fetch_nltk(tmp_path / "nltk", packages=["stopwords"], mirror=mirror)
    assert (tmp_path / "nltk" / "corpora" / "stopwords" / "english").read_text() == "the\na\nof\n"
    sw = mirror / "nltk_data" / "corpora"
    with zipfile.ZipFile(sw / "stopwords.zip", "w") as zf:
        zf.writestr("stopwords/english", "an\nthe\n")
    shutil.rmtree(sw / "stopwords")
    fetch_nltk(tmp_path / "nltk2", packages=["stopwords"], mirror=mirror)
    assert (tmp_path / "nltk2" / "corpora" / "stopwords.zip").is_file()
    with pytest.raises(SentembError, match=r"'wordnet' not found in the mirror: no .*nltk_data/<category>/wordnet"):
        fetch_nltk(tmp_path / "nltk3", mirror=mirror)
    (sw / "stopwords.zip").unlink()
    (sw / "stopwords").mkdir()  # present but without the english list
    with pytest.raises(SentembError, match="'stopwords' in .* cannot be loaded"):
        fetch_nltk(tmp_path / "nltk3", packages=["stopwords"], mirror=mirror)
    assert_clean(tmp_path / "nltk3")


def test_fetch_nltk_downloader(tmp_path, monkeypatch):
    import nltk

    def fake_download(pkg, download_dir, quiet, raise_on_error):
        assert raise_on_error
        if pkg != "stopwords":
            raise ValueError(f"Package {pkg!r} not found in index")
        (Path(download_dir) / "corpora" / "stopwords").mkdir(parents=True)
        (Path(download_dir) / "corpora" / "stopwords" / "english").write_text("the\n")
        return True

    monkeypatch.setattr(nltk, "download", fake_download)
    fetch_nltk(tmp_path / "nltk", packages=["stopwords"])
    with pytest.raises(SentembError, match=r"nltk.download\('nope'\) failed: Package 'nope' not found"):
        fetch_nltk(tmp_path / "bad", packages=["nope"])
    assert_clean(tmp_path / "bad")


# ----------------------------------------------------------------------------- prepare_corpus


def test_prepare_corpus_subsample(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"".join(f"line {i}  with  spaces \r\n".encode() for i in range(100)))
    s1 = prepare_corpus(raw, tmp_path / "a.txt", max_sentences=10, seed=1)
    prepare_corpus(raw, tmp_path / "b.txt", max_sentences=10, seed=1)
    prepare_corpus(raw, tmp_path / "c.txt", max_sentences=10, seed=2)
    a = (tmp_path / "a.txt").read_text().splitlines()
    assert a == (tmp_path / "b.txt").read_text().splitlines() != (tmp_path / "c.txt").read_text().splitlines()
    assert len(a) == 10 and a == sorted(a, key=lambda l: int(l.split()[1]))  # original order
    assert a[0].endswith(" spaces ") and "  with  " in a[0]  # only the line ending is stripped
    assert s1["lines_in"] == 100 and s1["lines_out"] == 10
    assert json.loads((tmp_path / "a.txt.json").read_text())["lines_out"] == 10
    full = prepare_corpus(raw, tmp_path / "d.txt", max_sentences=1000)
    assert full["lines_out"] == 100
    # the plan's length sample of the same clean file at the same size and seed is the same sample (one
    # draw, sentemb.utils.seeded_sample)
    from sentemb.ops.plan import _sample_lines

    plain = tmp_path / "plain.txt"
    plain.write_text("".join(f"line {i}\n" for i in range(100)))
    prepare_corpus(plain, tmp_path / "e.txt", max_sentences=10, seed=1)
    assert _sample_lines(plain, 10, seed=1) == ((tmp_path / "e.txt").read_text().splitlines(), 100)
    assert [int(l.split()[1]) for l in a] == [int(l.split()[1]) for l in _sample_lines(plain, 10, seed=1)[0]]


@pytest.mark.parametrize("bad,message,key", [(b"   \n", "line 3: empty line", "skipped_empty"),
                                             (b"caf\xe9\n", "line 3: not valid UTF-8", "skipped_non_utf8"),
                                             (b"a\x00b\n", "line 3: holds a NUL byte", "skipped_nul")])
def test_prepare_corpus_bad_lines(tmp_path, bad, message, key):
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"first\nsecond\n" + bad + b"fourth\n")
    out = tmp_path / "out.txt"
    with pytest.raises(SentembError, match=f"raw.txt, {message}"):
        prepare_corpus(raw, out)
    assert_clean(out)
    assert not Path(f"{out}.json").exists()
    summary = prepare_corpus(raw, out, skip_bad_lines=True)
    assert out.read_text() == "first\nsecond\nfourth\n"
    assert summary[key] == 1 and summary["lines_in"] == 4 and summary["lines_out"] == 3


def test_prepare_corpus_removes_the_byte_order_mark_opening_the_file_only(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_bytes("\ufefffirst\nsecond \ufeffword\n".encode("utf-8"))
    summary = prepare_corpus(raw, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "first\nsecond \ufeffword\n"
    assert summary["bom_removed"] is True
    raw.write_bytes(b"first\nsecond\n")
    assert prepare_corpus(raw, tmp_path / "out.txt")["bom_removed"] is False


def test_prepare_corpus_too_small(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_bytes(b"only one\n\n")
    with pytest.raises(SentembError, match="only 1 usable line"):
        prepare_corpus(raw, tmp_path / "out.txt", skip_bad_lines=True)


# ----------------------------------------------------------------------------- CLI


def test_cli(tmp_path, mirror, http_root, monkeypatch, capsys):
    out = tmp_path / "c.txt"
    monkeypatch.setenv("SENTEMB_MIRROR", str(mirror))  # the fallback when --mirror is absent
    assert main(["fetch-corpus", "--output", str(out), "--hub-repo", "r", "--hub-file", "f",
                 "--mirror-path", "data/wiki1m_head.txt", "--expected-lines", "20"]) == 0
    assert main(["prepare-corpus", "--input", str(out), "--output", str(tmp_path / "p.txt"),
                 "--max-sentences", "5", "--seed", "3"]) == 0
    assert len((tmp_path / "p.txt").read_text().splitlines()) == 5
    assert main(["fetch-nltk", "--output", str(tmp_path / "n"), "--packages", "stopwords"]) == 0
    assert main(["fetch-model", "--output", str(tmp_path / "m"), "--hub-id", "x/tiny-bert",
                 "--random-init", "{not json"]) == 2
    assert "--random-init: not valid JSON" in capsys.readouterr().err
    monkeypatch.delenv("SENTEMB_MIRROR")
    url = f"{http_root[1]}/missing.tar"
    assert main(["fetch-senteval", "--output", str(tmp_path / "s"), "--url", url]) == 2
    err = capsys.readouterr().err
    assert "sentemb fetch-senteval: error:" in err and f"download of {url} failed: HTTP 404" in err
    assert main(["fetch-senteval", "--raw", "--output", str(tmp_path / "s")]) == 2
    assert "no canonical download" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real data


@pytest.mark.realdata
def test_real_senteval_mirror(tmp_path, shared):
    counts = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
              "STSBenchmark": 1379, "STSBenchmark/dev": 1500, "SICKRelatedness": 4927}
    fetch_senteval(tmp_path / "se", mirror=shared, expected_counts=counts)
    fetch_senteval(tmp_path / "se-default", mirror=shared)  # the same counts are the default
    fetch_senteval_raw(tmp_path / "raw", mirror=shared)


@pytest.mark.realdata
def test_real_senteval_http(tmp_path, shared, http_root):
    root, base = http_root
    with tarfile.open(root / "real.tar", "w") as tf:
        for sub in ("STS", "SICK"):
            tf.add(shared / "data" / "senteval" / sub, arcname=f"SentEval/data/downstream/{sub}")
    fetch_senteval(tmp_path / "se", url=f"{base}/real.tar", sha256=sha256_file(root / "real.tar"))
    assert len(load_task(tmp_path / "se", "STSBenchmark")[0]) == 1379


@pytest.mark.realdata
def test_real_model_mirror(tmp_path, shared):
    out = tmp_path / "minilm"
    fetch_model(out, hub_id="sentence-transformers/all-MiniLM-L6-v2", mirror=shared, sha256=MINILM_SHA256)
    assert json.loads((out / "sentemb_source.json").read_text())["sha256"] == MINILM_SHA256
    assert (out / "1_Pooling" / "config.json").is_file()


@pytest.mark.realdata
def test_real_corpus_and_nltk_mirror(tmp_path, shared):
    fetch_corpus(tmp_path / "wiki.raw.txt", hub_repo="princeton-nlp/datasets-for-simcse", hub_file="wiki1m_for_simcse.txt",
                 mirror=shared, mirror_path="data/wiki1m_head.txt", expected_lines=11913)
    summary = prepare_corpus(tmp_path / "wiki.raw.txt", tmp_path / "wiki.txt")
    assert summary["lines_out"] == 11913 - summary["skipped_empty"] - summary["skipped_non_utf8"]
    fetch_nltk(tmp_path / "nltk", mirror=shared)
    assert (tmp_path / "nltk" / "corpora" / "wordnet" / "data.noun").is_file()


def test_a_path_missing_from_the_mirror_is_named_by_its_config_key(tmp_path, capsys):
    """Each fetch command names the config key that sets its mirror path (inferred: the workflow's rules
    pass none, so that existing results do not rerun), or the one given with --config-key."""
    from sentemb.cli import main
    from sentemb.cli.data import _model_key

    assert _model_key("resources/models/bert-base") == "backbones.bert-base.mirror_path"
    assert _model_key("resources/paraphraser/pegasus") == "stats.paraphrase.model.mirror_path"
    assert _model_key("somewhere/else") == "backbones.<name>.mirror_path"
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for argv, key in ((["fetch-corpus", "--output", str(tmp_path / "c.txt"), "--hub-repo", "r", "--hub-file", "f.txt"],
                       "corpus.mirror_path"),
                      (["fetch-senteval", "--output", str(tmp_path / "se")], "senteval.mirror_path"),
                      (["fetch-senteval", "--raw", "--output", str(tmp_path / "ser")], "senteval.raw_mirror_path"),
                      (["fetch-model", "--output", str(tmp_path / "paraphraser" / "p"), "--hub-id", "x/p"],
                       "stats.paraphrase.model.mirror_path"),
                      (["fetch-model", "--output", str(tmp_path / "m"), "--hub-id", "x/m", "--config-key", "mine.path"],
                       "mine.path")):
        assert main([*argv, "--mirror", str(mirror)]) == 2
        assert f"not found in the mirror: {mirror}/" in (err := capsys.readouterr().err) and f"(config key {key}:" in err
