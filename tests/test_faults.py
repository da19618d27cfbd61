"""Faults of the storage under a run (issue 14 §2): a full disk during an atomic write, and cached
downloads damaged after they were verified (truncated weights, an edited STS file)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sentemb import SentembError
from sentemb.data.cache import MANIFEST, check_manifest, verify_cached, write_manifest
from sentemb.utils import atomic_path, sha256_file, write_json


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_during_an_atomic_write_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "out" / "eval_sts.json"
    monkeypatch.setattr(Path, "write_text", _enospc)
    with pytest.raises(SentembError, match=r"eval_sts\.json: no space left on device while writing it"):
        write_json(target, {"a": 1})
    assert list((tmp_path / "out").iterdir()) == []  # neither the final name nor a temporary file


def test_full_disk_halfway_through_a_directory_leaves_nothing(tmp_path):
    final = tmp_path / "model"
    with pytest.raises(SentembError, match=str(final)):
        with atomic_path(final, is_dir=True) as tmp:
            (tmp / "config.json").write_text("{}")
            (tmp / "model.safetensors").write_bytes(b"x" * 100)  # half of the weights, then the disk is full
            _enospc()
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_write_that_fails_halfway_leaves_no_temporary_file(tmp_path, monkeypatch):
    from sentemb.data.cache import write_file_manifest

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a line\n")
    real = Path.write_text

    def half(self, text, *a, **k):  # half the manifest written, then the disk is full
        real(self, text[: len(text) // 2], *a, **k)
        _enospc()

    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(OSError):
        write_file_manifest(corpus)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def _cached(tmp_path):
    d = tmp_path / "resources" / "models" / "m"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "sub").mkdir()
    (d / "sub" / "sts-test.csv").write_text("a\tb\t4.0\n")
    write_manifest(d)
    return d


def test_an_intact_or_merely_touched_cache_is_left_alone(tmp_path):
    d = _cached(tmp_path)
    assert check_manifest(d) == []
    os.utime(d / "sub" / "sts-test.csv", ns=(1, 1))  # new mtime, same bytes: sha256 decides
    assert check_manifest(d) == [] and verify_cached([d]) == [] and d.is_dir()
    # ... once: the run records the new mtime, so the next start compares stat() alone (a dry run
    # records nothing)
    os.utime(d / "sub" / "sts-test.csv", ns=(3, 3))
    os.utime(d, ns=(5, 5))
    assert verify_cached([d]) == [] and d.stat().st_mtime_ns == 5  # the folder's mtime kept (Snakemake's view)
    recorded = json.loads((d / MANIFEST).read_text())["files"]["sub/sts-test.csv"]
    assert recorded["mtime_ns"] == 3 and recorded["sha256"] == sha256_file(d / "sub" / "sts-test.csv")
    os.utime(d / "model.safetensors", ns=(2, 2))
    assert verify_cached([d], dry_run=True) == []
    assert json.loads((d / MANIFEST).read_text())["files"]["model.safetensors"]["mtime_ns"] != 2


def test_truncated_weights_and_an_edited_sts_file_are_moved_aside_naming_the_file(tmp_path):
    d = _cached(tmp_path)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    problems = check_manifest(d)
    assert len(problems) == 1 and "model.safetensors: size 1000 bytes, 4096" in problems[0]
    msgs = []
    moved = verify_cached([d], log=msgs.append)
    assert not d.exists() and len(moved) == 1 and moved[0].name.startswith("m.corrupt-")
    assert "model.safetensors" in msgs[0] and "fetched again" in msgs[0]

    d = _cached(tmp_path / "b")
    (d / "sub" / "sts-test.csv").write_text("a\tb\t1.0\n")  # same size, other content
    assert "sts-test.csv: content changed" in check_manifest(d)[0]


@pytest.mark.realdata
@pytest.mark.integration
def test_the_workflow_fetches_a_damaged_model_again(shared, tmp_path):
    """A real fetch writes the manifest; after truncating the weights the next DAG run fetches the
    model again from the mirror, and the result is the verified original."""
    from conftest import REPO

    env = {**os.environ, "SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": ""}
    shutil.copy(REPO / ".test" / "config.yaml", tmp_path / "config.yaml")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           f"--configfile={tmp_path / 'config.yaml'}", "--cores", "1", "resources/models/tiny-bert", "resources/data/senteval"]
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
    model, sts = tmp_path / "resources/models/tiny-bert", tmp_path / "resources/data/senteval"
    assert (model / MANIFEST).is_file() and (sts / MANIFEST).is_file()
    weights = next(model.glob("model.safetensors"))
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "model.safetensors: size" in p.stderr and "fetched again" in p.stderr
    assert weights.read_bytes() == good and check_manifest(model) == []
    assert check_manifest(sts) == []


def test_a_cut_or_edited_corpus_file_is_moved_aside_and_a_dry_run_moves_nothing(tmp_path):
    """The raw and the prepared corpus are single files: their hidden sidecar manifest is checked as a
    directory's manifest is (truncated, or the same size with other bytes); ``dry_run`` only reports."""
    from sentemb.data.cache import check_file_manifest, file_manifest_path, write_file_manifest

    f = tmp_path / "corpus" / "c.txt"
    f.parent.mkdir()
    f.write_text("one sentence\nanother one\n")
    write_file_manifest(f)
    assert file_manifest_path(f).name == ".c.txt.sentemb_manifest.json" and check_file_manifest(f) == []
    os.utime(f, ns=(1, 1))  # touched, the same bytes
    assert check_file_manifest(f) == [] and verify_cached([f]) == []
    assert json.loads(file_manifest_path(f).read_text())["mtime_ns"] == 1  # recorded: no sha256 next time
    f.write_text("one sentence\nanother two\n")  # same size, other bytes
    assert "c.txt: content changed" in check_file_manifest(f)[0]
    msgs = []
    assert len(verify_cached([f], log=msgs.append, dry_run=True)) == 1 and f.is_file()
    assert "a run (not -n) moves it aside" in msgs[0]
    moved = verify_cached([f], log=msgs.append)
    assert not f.exists() and moved[0].name.startswith("c.txt.corrupt-") and moved[0].is_file()
    assert not file_manifest_path(f).exists() and "made again by the rule that wrote it" in msgs[1]


@pytest.mark.realdata
@pytest.mark.integration
def test_the_workflow_prepares_a_cut_corpus_again_and_a_dry_run_leaves_it(shared, tmp_path):
    """A corpus cut after it was prepared (a full disk, a stray `head`): ``snakemake -n`` says so and
    leaves it; the next run moves it aside and prepares it again, the original sentences."""
    from conftest import REPO

    env = {**os.environ, "SENTEMB_MIRROR": str(shared), "MLFLOW_TRACKING_URI": ""}
    shutil.copy(REPO / ".test" / "config.yaml", tmp_path / "config.yaml")
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
            f"--configfile={tmp_path / 'config.yaml'}", "--cores", "1"]
    corpus = tmp_path / "resources/corpus/wiki-tiny.txt"
    target = "resources/corpus/wiki-tiny.txt"  # relative to -d, as the rule's output
    subprocess.run([*base, target], check=True, capture_output=True, env=env, timeout=600)
    good = corpus.read_bytes()
    corpus.write_bytes(good[: len(good) // 2])
    p = subprocess.run([*base, "-n", target], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "wiki-tiny.txt: size" in p.stderr and "a run (not -n)" in p.stderr, p.stderr[-3000:]
    assert corpus.read_bytes() == good[: len(good) // 2] and not list(corpus.parent.glob("*.corrupt-*"))
    p = subprocess.run([*base, target], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "made again by the rule that wrote it" in p.stderr, p.stderr[-3000:]
    assert corpus.read_bytes() == good and len(list(corpus.parent.glob("wiki-tiny.txt.corrupt-*"))) == 1
