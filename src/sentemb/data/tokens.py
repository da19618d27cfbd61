"""The corpus tokenized once per tokenizer, so that a training step never runs the tokenizer.

``TokenCache`` holds every corpus line's token ids *without* special tokens and untruncated, as one
flat int32 array plus line offsets (``ids.npy``, ``offsets.npy``, memory-mapped when loaded), and
``meta.json`` (the tokenizer's fingerprint, the corpus's sha256 and line count, the special tokens
around a single sentence). ``batch(lines, max_len)`` returns exactly what

    tokenizer([corpus[i] for i in lines], padding=True, truncation=True, max_length=max_len,
              return_tensors="pt")

returns (same keys, values and dtypes): truncation keeps the first ``max_len − n_special`` content
tokens, then the special tokens are put around them, then rows are padded to the batch's longest.
That equality is tested on the real corpus for every tokenizer in the repository's fixtures.

The workflow writes one cache per corpus and backbone (rule ``tokenize``,
``results/stats/<corpus>/tokens.<backbone>/``); without one, ``sentemb.train.loop`` tokenizes the corpus
in memory once at set-up. A method that rewrites sentences (UNA, PaSeR, ArcCSE's triplets)
tokenizes its own rows in ``build_batch`` (UNA through ``Method.tokenize_rows``: its anchors from the
cache, each other distinct row once); the loop still builds
those batches one step ahead, in a background thread (``sentemb.train.loop.Prefetcher``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import SentembError
from ..utils import sha256_file

log = logging.getLogger(__name__)

FORMAT = 1
_CHUNK = 20_000  # sentences per tokenizer call when building


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides token ids: the backend's full serialisation (vocabulary, normaliser,
    pre-tokenizer, model) when the tokenizer is a fast one, else its vocabulary; plus its class,
    special tokens and padding side."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        # truncation/padding are per-call settings that transformers writes into the backend on every
        # call (and that a saved tokenizer.json carries): they do not decide the ids of a sentence
        state.pop("truncation", None)
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode("utf-8"))
    h.update(json.dumps([type(tokenizer).__name__, tokenizer.all_special_ids, tokenizer.padding_side,
                         list(tokenizer.model_input_names)]).encode("utf-8"))
    return h.hexdigest()


def _special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens a single sentence gets before and after its content ([CLS] … [SEP] for
    BERT, <s> … </s> for RoBERTa), found by tokenizing a probe with and without them."""
    probe = "sentemb probe sentence"
    full = tokenizer(probe)["input_ids"]
    content = tokenizer(probe, add_special_tokens=False)["input_ids"]
    for i in range(len(full) - len(content) + 1):
        if full[i : i + len(content)] == content:
            return list(full[:i]), list(full[i + len(content):])
    raise SentembError(f"tokenizer {type(tokenizer).__name__}: a sentence's tokens with special tokens do not "
                       "contain its tokens without them; this tokenizer cannot be cached (train.token_cache: false)")


class TokenCache:
    """Token ids of every corpus line under one tokenizer (see the module docstring)."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, meta: dict):
        self.ids, self.offsets, self.meta = ids, offsets, meta
        self.prefix = np.asarray(meta["prefix"], dtype=np.int64)
        self.suffix = np.asarray(meta["suffix"], dtype=np.int64)
        self.pad_id = int(meta["pad_id"])
        self.left = meta["padding_side"] == "left"
        self.names = list(meta["input_names"])
        self._content_len = np.diff(np.asarray(offsets, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    # ------------------------------------------------------------------ build, save, load
    @classmethod
    def build(cls, sentences: Sequence[str], tokenizer, *, corpus: str | Path | None = None) -> "TokenCache":
        """Tokenize ``sentences`` (the corpus lines, in order) without special tokens."""
        if tokenizer.pad_token_id is None:
            raise SentembError(f"tokenizer {type(tokenizer).__name__} has no pad token; it cannot pad a batch")
        fingerprint = tokenizer_fingerprint(tokenizer)
        prefix, suffix = _special_frame(tokenizer)
        t0 = time.perf_counter()
        lengths = np.empty(len(sentences), dtype=np.int64)
        parts = []
        for start in range(0, len(sentences), _CHUNK):
            chunk = tokenizer(list(sentences[start : start + _CHUNK]), add_special_tokens=False)["input_ids"]
            lengths[start : start + len(chunk)] = [len(x) for x in chunk]
            parts.append(np.fromiter((t for x in chunk for t in x), dtype=np.int32,
                                     count=int(lengths[start : start + len(chunk)].sum())))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        meta = {"format": FORMAT, "tokenizer": type(tokenizer).__name__, "fingerprint": fingerprint,
                "prefix": prefix, "suffix": suffix, "pad_id": int(tokenizer.pad_token_id),
                "padding_side": tokenizer.padding_side, "input_names": list(tokenizer.model_input_names),
                "lines": len(sentences), "tokens": int(len(ids)),
                "corpus": str(corpus) if corpus else None,
                "corpus_sha256": sha256_file(corpus) if corpus else None,
                "seconds": round(time.perf_counter() - t0, 2)}
        log.info("tokenized %d lines (%d tokens) in %.1f s", len(sentences), len(ids), meta["seconds"])
        return cls(ids, offsets, meta)

    def save(self, out_dir: str | Path) -> None:
        """Write ``ids.npy``, ``offsets.npy``, ``meta.json`` into ``out_dir`` atomically."""
        from ..utils import atomic_path

        with atomic_path(Path(out_dir), is_dir=True) as tmp:
            np.save(tmp / "ids.npy", np.ascontiguousarray(self.ids, dtype=np.int32))
            np.save(tmp / "offsets.npy", np.ascontiguousarray(self.offsets, dtype=np.int64))
            (tmp / "meta.json").write_text(json.dumps(self.meta, indent=2) + "\n", "utf-8")

    @classmethod
    def load(cls, cache_dir: str | Path, tokenizer=None, *, corpus: str | Path | None = None,
             lines: int | None = None) -> "TokenCache":
        """Memory-map a saved cache; with ``tokenizer`` / ``corpus`` / ``lines``, check that it was
        made by this tokenizer from this corpus (an error names the file and what differs)."""
        d = Path(cache_dir)
        meta_file = d / "meta.json"
        if not meta_file.is_file():
            raise SentembError(f"{meta_file}: not found (make the token cache with `sentemb tokenize-corpus`)")
        try:
            meta = json.loads(meta_file.read_text("utf-8"))
        except json.JSONDecodeError as e:
            raise SentembError(f"{meta_file}: not valid JSON ({e})") from None
        if meta.get("format") != FORMAT:
            raise SentembError(f"{meta_file}: format {meta.get('format')!r}, this sentemb reads {FORMAT}; "
                               "delete the directory and re-run")
        if tokenizer is not None and meta["fingerprint"] != tokenizer_fingerprint(tokenizer):
            raise SentembError(f"{meta_file}: made by another tokenizer than the model's "
                               f"({meta['tokenizer']}, fingerprint {meta['fingerprint'][:12]}…); re-run `sentemb tokenize-corpus`")
        if lines is not None and meta["lines"] != lines:
            raise SentembError(f"{meta_file}: {meta['lines']} lines, but the corpus has {lines}")
        if corpus is not None and meta.get("corpus_sha256") and meta["corpus_sha256"] != sha256_file(corpus):
            raise SentembError(f"{meta_file}: made from another corpus than {corpus} (sha256 differs); "
                               "re-run `sentemb tokenize-corpus`")
        try:
            ids = np.load(d / "ids.npy", mmap_mode="r")
            offsets = np.load(d / "offsets.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            raise SentembError(f"{d}: cannot read the token arrays ({e})") from None
        if len(offsets) != meta["lines"] + 1 or len(ids) != meta["tokens"] or int(offsets[-1]) != len(ids):
            raise SentembError(f"{d}: ids.npy/offsets.npy do not match meta.json (damaged cache; delete it and re-run)")
        return cls(ids, np.asarray(offsets), meta)

    # ------------------------------------------------------------------ batches
    def lengths(self, max_len: int) -> np.ndarray:
        """Every line's sequence length after truncation to ``max_len`` (special tokens included)."""
        n_special = len(self.prefix) + len(self.suffix)
        return np.minimum(self._content_len, max_len - n_special) + n_special

    def batch(self, lines: Sequence[int], max_len: int) -> dict:
        """The padded batch of corpus ``lines`` (see the module docstring), as int64 CPU tensors."""
        import torch

        lines = np.asarray(lines, dtype=np.int64)
        n_pre, n_suf = len(self.prefix), len(self.suffix)
        keep = np.minimum(self._content_len[lines], max_len - n_pre - n_suf)
        if (keep < 0).any():
            raise SentembError(f"max_len {max_len} leaves no room for the {n_pre + n_suf} special tokens")
        seq = keep + n_pre + n_suf
        width = int(seq.max()) if len(seq) else 0
        ids = np.full((len(lines), width), self.pad_id, dtype=np.int64)
        att = np.zeros((len(lines), width), dtype=np.int64)
        for r, (line, k, n) in enumerate(zip(lines, keep, seq)):
            start = width - n if self.left else 0
            o = self.offsets[line]
            ids[r, start : start + n_pre] = self.prefix
            ids[r, start + n_pre : start + n_pre + k] = self.ids[o : o + k]
            ids[r, start + n_pre + k : start + n] = self.suffix
            att[r, start : start + n] = 1
        out = {}
        for name in self.names:
            if name == "input_ids":
                out[name] = torch.from_numpy(ids)
            elif name == "attention_mask":
                out[name] = torch.from_numpy(att)
            elif name == "token_type_ids":  # a single sentence is segment 0; pads too
                out[name] = torch.zeros_like(out.get("input_ids", torch.from_numpy(ids)))
            else:
                raise SentembError(f"token cache: the tokenizer's input '{name}' is not supported "
                                   "(train.token_cache: false)")
        return out


def load_or_build(cache_dir: str | Path | None, tokenizer, sentences: Sequence[str], corpus: str | Path) -> TokenCache:
    """The run's token cache: the workflow's (checked against the tokenizer and the corpus) when
    ``cache_dir`` is given, else the corpus tokenized in memory now."""
    if cache_dir:
        return TokenCache.load(cache_dir, tokenizer, corpus=corpus, lines=len(sentences))
    return TokenCache.build(sentences, tokenizer, corpus=None)
