"""Cached downloads that stay what was verified: a manifest per fetched directory, checked on every run.

A fetch rule verifies its input once (line counts, pair counts, sha256, "it loads") and then the
directory sits in ``resources/`` for weeks. A model file truncated by a full disk or an STS file
edited by hand would afterwards be read silently, because Snakemake sees an existing output and
never runs the fetch again. So every fetch writes ``.sentemb_manifest.json`` (size, mtime and
sha256 of each file) into the directory before it is renamed into place, and
:func:`verify_cached` checks it when a workflow starts: by ``stat`` (cheap), and by sha256 only
for files whose size or mtime changed. A directory that no longer matches its manifest is moved
aside (``<name>.corrupt-<time>``, kept for inspection) with a message naming the file, so the DAG
fetches it again from the hub or the mirror.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..utils import sha256_file

MANIFEST = ".sentemb_manifest.json"


def write_manifest(directory: str | os.PathLike) -> Path:
    """Record size, mtime and sha256 of every file under ``directory`` in its manifest."""
    directory = Path(directory)
    files = {}
    for f in sorted(directory.rglob("*")):
        if f.is_file() and f.name != MANIFEST:
            st = f.stat()
            files[f.relative_to(directory).as_posix()] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                           "sha256": sha256_file(f)}
    out = directory / MANIFEST
    out.write_text(json.dumps({"files": files}, indent=1) + "\n", "utf-8")
    return out


def check_manifest(directory: str | os.PathLike) -> list[str]:
    """Problems of ``directory`` against its manifest (empty: intact, or no manifest to check)."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return []
    try:
        files = json.loads(path.read_text("utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
        return [f"{path}: unreadable manifest"]
    problems = []
    for rel, want in files.items():
        f = directory / rel
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        st = f.stat()
        if st.st_size != want["size"]:
            problems.append(f"{f}: size {st.st_size} bytes, {want['size']} when it was fetched and verified")
        elif st.st_mtime_ns != want["mtime_ns"] and sha256_file(f) != want["sha256"]:
            problems.append(f"{f}: content changed since it was fetched and verified (sha256 differs)")
    return problems


def verify_cached(directories, log=print) -> list[Path]:
    """Check each existing cached directory; move a damaged one aside so that it is fetched again.

    Returns the directories moved aside. ``log`` receives one message per damaged directory."""
    moved = []
    for d in map(Path, directories):
        if not d.is_dir():
            continue
        problems = check_manifest(d)
        if problems:
            aside = d.with_name(f"{d.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            d.rename(aside)
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            log(f"sentemb: cached input {d} is damaged ({shown}); moved to {aside.name}, it will be fetched again")
            moved.append(aside)
    return moved


def verify_resources(resources_dir: str | os.PathLike) -> list[Path]:
    """:func:`verify_cached` over every fetched directory under ``resources_dir`` (models, data,
    NLTK data), messages on stderr; what a workflow calls when it starts."""
    import sys

    root = Path(resources_dir)
    dirs = [p for pattern in ("models/*", "data/*", "nltk_data") for p in root.glob(pattern)
            if not p.name.startswith(".") and ".corrupt-" not in p.name]
    return verify_cached(dirs, log=lambda msg: print(msg, file=sys.stderr))
