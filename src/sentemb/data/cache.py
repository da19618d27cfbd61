"""Cached downloads that stay what was verified: a manifest per fetched directory, checked on every run.

A fetch rule verifies its input once (line counts, pair counts, sha256, "it loads") and then the
directory sits in ``resources/`` for weeks. A model file truncated by a full disk or an STS file
edited by hand would afterwards be read silently, because Snakemake sees an existing output and
never runs the fetch again. So every fetch writes ``.sentemb_manifest.json`` (size, mtime and
sha256 of each file) into the directory before it is renamed into place, and
:func:`verify_cached` checks it when a workflow starts: by ``stat`` (cheap), and by sha256 only
for files whose mtime changed (whose new mtime is then recorded when the bytes are the same). A directory that no longer matches its manifest is moved
aside (``<name>.corrupt-<time>``, kept for inspection) with a message naming the file, so the DAG
fetches it again from the hub or the mirror.

A fetched or prepared single file (the raw and the prepared training corpus, ``corpus/*.txt``) has
the same record in a hidden sidecar, ``.<name>.sentemb_manifest.json`` (:func:`write_file_manifest`):
a corpus truncated or edited after it was verified is moved aside as a directory is, so that the
rule that made it runs again instead of training on other sentences. Under ``snakemake -n`` nothing
is moved: :func:`verify_resources` then only says what a run would move.
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


def check_manifest(directory: str | os.PathLike, refresh: bool = False) -> list[str]:
    """Problems of ``directory`` against its manifest (empty: intact, or no manifest to check).
    ``refresh``: where a file's mtime changed but its bytes did not (a copy or a checkout that did not
    keep times), record the new mtime, so that the next check is a ``stat`` again, not a sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        return []
    try:
        files = json.loads(path.read_text("utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
        return [f"{path}: unreadable manifest"]
    problems, touched = [], False
    for rel, want in files.items():
        f = directory / rel
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        st = f.stat()
        if st.st_size != want["size"]:
            problems.append(f"{f}: size {st.st_size} bytes, {want['size']} when it was fetched and verified")
        elif st.st_mtime_ns != want["mtime_ns"]:
            if sha256_file(f) != want["sha256"]:
                problems.append(f"{f}: content changed since it was fetched and verified (sha256 differs)")
            else:
                want["mtime_ns"], touched = st.st_mtime_ns, True
    if refresh and touched and not problems:
        st = directory.stat()
        try:
            _write_whole(path, json.dumps({"files": files}, indent=1) + "\n")
            # the folder's own mtime as it was: Snakemake must not see a fetched model as newer than its runs
            os.utime(directory, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:  # a read-only cache: the check still holds, it will hash again next time
            pass
    return problems


def _write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader sees the old or the new."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, "utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill: no half-written file left beside the manifest
        tmp.unlink(missing_ok=True)
        raise


def file_manifest_path(path: str | os.PathLike) -> Path:
    """The hidden sidecar manifest of a single cached file."""
    path = Path(path)
    return path.with_name(f".{path.name}{MANIFEST}")


def write_file_manifest(path: str | os.PathLike, sha256: str | None = None) -> Path:
    """Record size, mtime and sha256 of the file ``path`` (complete, in place) in its sidecar;
    ``sha256``: its digest where the caller has just computed it (a corpus is hashed once)."""
    path = Path(path)
    st = path.stat()
    out = file_manifest_path(path)
    _write_whole(out, json.dumps({"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,  # whole or absent
                                  "sha256": sha256 or sha256_file(path)}) + "\n")
    return out


def drop_file_manifest(path: str | os.PathLike) -> None:
    """Remove a file's sidecar before the file is written anew (a stale one would call the new file
    damaged while its own is being written)."""
    file_manifest_path(path).unlink(missing_ok=True)


def check_file_manifest(path: str | os.PathLike, refresh: bool = False) -> list[str]:
    """Problems of the file ``path`` against its sidecar (empty: intact, or no sidecar to check);
    ``refresh`` as in :func:`check_manifest`."""
    path = Path(path)
    side = file_manifest_path(path)
    if not side.is_file():
        return []
    try:
        want = json.loads(side.read_text("utf-8"))
        size, mtime, digest = want["size"], want["mtime_ns"], want["sha256"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return [f"{side}: unreadable manifest"]
    st = path.stat()
    if st.st_size != size:
        return [f"{path}: size {st.st_size} bytes, {size} when it was written and verified"]
    if st.st_mtime_ns != mtime:
        if sha256_file(path) != digest:
            return [f"{path}: content changed since it was written and verified (sha256 differs)"]
        if refresh:
            try:
                write_file_manifest(path, digest)
            except OSError:  # a read-only cache: hashed again next time
                pass
    return []


def verify_cached(paths, log=print, dry_run: bool = False) -> list[Path]:
    """Check each existing cached directory (its manifest) or file (its sidecar); move a damaged one
    aside so that it is fetched or made again. ``dry_run``: move nothing, only say so.

    Returns the paths moved aside (with ``dry_run``, those that would be). ``log`` receives one
    message per damaged path."""
    moved = []
    for d in map(Path, paths):
        is_file = d.is_file()
        if d.is_dir():
            problems = check_manifest(d, refresh=not dry_run)
        elif is_file:
            problems = check_file_manifest(d, refresh=not dry_run)
        else:
            continue
        if problems:
            aside = d.with_name(f"{d.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            again = ("made again by the rule that wrote it (replaced on purpose? delete its "
                     f"{file_manifest_path(d).name} first, or give it a corpus.name of its own)") if is_file \
                else "fetched again"
            if dry_run:
                log(f"sentemb: cached input {d} is damaged ({shown}); a run (not -n) moves it aside and it will be "
                    f"{again}")
            else:
                d.rename(aside)
                if is_file:
                    file_manifest_path(d).unlink(missing_ok=True)
                log(f"sentemb: cached input {d} is damaged ({shown}); moved to {aside.name}, it will be {again}")
            moved.append(aside)
    return moved


def verify_resources(resources_dir: str | os.PathLike, dry_run: bool = False) -> list[Path]:
    """:func:`verify_cached` over every fetched directory under ``resources_dir`` (models, data,
    NLTK data) and the corpus files, messages on stderr; what a workflow calls when it starts
    (``dry_run`` under ``snakemake -n``)."""
    import sys

    root = Path(resources_dir)
    paths = [p for pattern in ("models/*", "data/*", "nltk_data", "corpus/*") for p in root.glob(pattern)
             if not p.name.startswith(".") and ".corrupt-" not in p.name]
    return verify_cached(paths, log=lambda msg: print(msg, file=sys.stderr), dry_run=dry_run)
