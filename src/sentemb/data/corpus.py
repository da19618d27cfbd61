"""Corpus readers: the one place a corpus file (one sentence per line) is read.

Convention shared by every reader: lines are split on ``\\n`` only (a trailing ``\\r`` is dropped;
other Unicode line separators stay inside the line, so line numbers agree with ``wc -l``; a last
line without ``\\n`` still counts). Every line must be UTF-8; otherwise :class:`sentemb.SentembError`
names the file and the 1-based line. :func:`iter_lines` keeps empty (or whitespace-only) lines, so
statistics stay aligned with the corpus lines; :func:`read_corpus` (training) refuses them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from .. import SentembError


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yield the lines of a corpus file as ``str`` without the line terminator (see module doc)."""
    path = Path(path)
    if not path.is_file():
        raise SentembError(f"corpus file not found: {path}")
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SentembError(
                    f"{path}:{i}: line {i} is not valid UTF-8 (byte {raw[e.start:e.start + 1]!r} at "
                    f"column {e.start + 1}); re-create the corpus with 'sentemb prepare-corpus'"
                ) from None


def require_text(path: str | os.PathLike) -> Path:
    """``path``, refused naming it when it is missing or holds no text: statistics of an empty corpus
    would be written as a finished, empty output that no line of the training corpus lines up with."""
    path = Path(path)
    if not path.is_file():
        raise SentembError(f"corpus file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip() and not any(line.strip() for line in iter_lines(path)):
        raise SentembError(f"{path}: the corpus holds no text (empty, or only blank lines)")
    return path


def count_corpus_lines(path: str | os.PathLike) -> int:
    """Number of lines as :func:`iter_lines` sees them (a last line without ``\\n`` counts)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def read_corpus(path: str | os.PathLike) -> list[str]:
    """The training sentences: every line UTF-8 (:func:`iter_lines`) and not blank."""
    sents = []
    for i, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            raise SentembError(f"{path}:{i}: line {i} is empty (prepare the corpus with `sentemb prepare-corpus`)")
        sents.append(line)
    if len(sents) < 2:
        raise SentembError(f"{path}: a training corpus needs at least 2 sentences, found {len(sents)}")
    return sents
