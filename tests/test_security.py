"""Security: crafted archives are refused, config is data only (issue 14 §5)."""

import io
import tarfile

import pytest

from sentemb import SentembError
from sentemb.config.load import load_config
from sentemb.data.fetch import _extract


def _tar(path, members):
    with tarfile.open(path, "w") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def _link(name, target, kind=tarfile.SYMTYPE):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, target
    return ti, None


@pytest.mark.parametrize("members, msg", [
    ([_file("../escape.txt")], "unsafe archive member"),
    ([_file("/abs/path.txt")], "unsafe archive member"),
    ([_file("STS/ok.txt"), _file("STS/../../escape.txt")], "unsafe archive member"),
    ([_link("STS/passwd", "/etc/passwd")], "is a link"),
    ([_link("STS/inside", "ok.txt")], "is a link"),
    ([_file("STS/ok.txt"), _link("STS/hard", "STS/ok.txt", tarfile.LNKTYPE)], "is a link"),
], ids=["dotdot", "absolute", "nested-dotdot", "symlink-out", "symlink-in", "hardlink"])
def test_crafted_tar_is_refused_and_nothing_is_written_outside(tmp_path, members, msg):
    archive = _tar(tmp_path / "evil.tar", members)
    dest = tmp_path / "a" / "b" / "dest"
    dest.mkdir(parents=True)
    with pytest.raises(SentembError, match=msg):
        _extract(archive, dest, "senteval.tar")
    assert not (tmp_path / "a" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    assert not any(p.is_symlink() for p in dest.rglob("*"))


def test_a_plain_tar_extracts(tmp_path):
    archive = _tar(tmp_path / "ok.tar", [_file("STS/a.txt", b"hello")])
    _extract(archive, tmp_path / "d", "ok.tar")
    assert (tmp_path / "d/STS/a.txt").read_bytes() == b"hello"


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system ['touch PWNED']",
                                 "!!python/object/new:builtins.dict {}",
                                 "!!python/name:os.system"])
def test_config_is_data_only(tmp_path, tag, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "c.yaml"
    p.write_text(f"backbones: {{b: {{hub_id: x/b}}}}\nruns: [{{method: simcse, backbone: b}}]\nexperiment: {tag}\n")
    with pytest.raises(SentembError, match="not valid YAML"):
        load_config(p)
    assert not (tmp_path / "PWNED").exists()
