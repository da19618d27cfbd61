"""Offline paraphrases of every corpus sentence: UNA's positives (methods.md §3, UNA App. C.1).

Default model ``tuner007/pegasus_paraphrase``; any seq2seq model + tokenizer loadable with
``AutoModelForSeq2SeqLM``/``AutoTokenizer`` works. Decoding: beam search (10 beams), one output,
``max_length`` 60 tokens, no sampling, so outputs are deterministic. Inputs are truncated to
``max_input_length`` (default: the smaller of the tokenizer's ``model_max_length`` and the model's
``max_position_embeddings``; 60 for pegasus_paraphrase). On CUDA generation runs under bf16 autocast
(``stats.paraphrase.precision: fp32``: without, as the UNA authors' ``data/augment/paraphrase.py``).

Sharding: shard i of N takes corpus lines ``i, i+N, i+2N, …`` (strided, so every shard gets a
similar length mix and finishes at about the same time). Within a shard the non-empty lines are
sorted by tokenized length (longest first, ties by line index) and cut into fixed batches of
``batch_size``; that plan depends only on the inputs, so a resumed run forms the very same batches
and produces byte-identical output. After each batch one JSON record (batch number, line indices,
texts) is appended to ``<output>.ckpt.jsonl`` and flushed + fsynced. A rerun after a kill reads the
checkpoint (dropping a torn last record), skips the batches it holds and continues; a checkpoint
written with other settings (corpus, model, shard, batch size, decoding, device type) is discarded.
The final shard output (JSONL ``{"line": i, "text": …}`` sorted by line, empty lines → ``""``) is
written atomically, then the checkpoint is removed. :func:`merge_paraphrases` checks that the shards
cover every corpus line exactly once and writes a text file line-aligned with the corpus.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from .. import SentembError
from ..data.corpus import count_corpus_lines, iter_lines

log = logging.getLogger(__name__)

# Shape of google/pegasus-large (which tuner007/pegasus_paraphrase fine-tunes), for benchmarks.
PEGASUS_LARGE_SHAPE = dict(
    vocab_size=96103, d_model=1024, encoder_layers=16, decoder_layers=16,
    encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
    decoder_ffn_dim=4096, max_position_embeddings=60, scale_embedding=True,
)
TINY_SHAPE = dict(
    d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
)


def clean(text: str) -> str:
    """One line of output: whitespace (newlines included) collapsed to single spaces."""
    return " ".join(text.split())


def build_random_pegasus(tokenizer, shape: dict | None = None, seed: int = 0):
    """A randomly initialised ``PegasusForConditionalGeneration`` whose special ids come from
    ``tokenizer`` (pad = decoder start, eos = sep/eos). For tests and throughput benchmarks."""
    import torch
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    shape = dict(TINY_SHAPE if shape is None else shape)
    shape["vocab_size"] = max(shape.get("vocab_size", 0), len(tokenizer))
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    pad = tokenizer.pad_token_id
    cfg = PegasusConfig(pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad,
                        forced_eos_token_id=eos, **shape)
    torch.manual_seed(seed)
    return PegasusForConditionalGeneration(cfg).eval()


def save_random_pegasus(output_dir, tokenizer_dir, shape: dict | None = None, seed: int = 0) -> Path:
    """Build :func:`build_random_pegasus` with the tokenizer in ``tokenizer_dir``; save both."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = build_random_pegasus(tok, shape, seed)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tok.save_pretrained(output_dir)
    return output_dir


class Paraphraser:
    """Batched deterministic beam-search paraphrasing with a seq2seq model."""

    def __init__(self, model, tokenizer, device="auto", num_beams: int = 10, max_length: int = 60,
                 max_input_length: int | None = None, precision: str = "bf16"):
        import torch

        from ..utils import resolve_device

        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.num_beams, self.max_length = num_beams, max_length
        if max_input_length is None:
            limits = [getattr(tokenizer, "model_max_length", None),
                      getattr(model.config, "max_position_embeddings", None)]
            limits = [x for x in limits if isinstance(x, int) and 0 < x < 100_000]
            max_input_length = min(limits) if limits else 512
        self.max_input_length = max_input_length
        if precision not in ("bf16", "fp32"):
            raise SentembError(f"paraphrase: precision must be bf16 or fp32, not {precision!r} (stats.paraphrase.precision)")
        self.precision = precision if self.device.type == "cuda" else "fp32"  # the CPU generates in fp32
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if self.precision == "bf16" else contextlib.nullcontext())

    @classmethod
    def from_pretrained(cls, model_dir, **kw) -> Paraphraser:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        if not (Path(model_dir) / "config.json").is_file():
            raise SentembError(f"paraphrase model directory {model_dir} has no config.json")
        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir))
            model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir))
        except (OSError, ValueError) as e:
            raise SentembError(f"cannot load a seq2seq model and tokenizer from {model_dir}: {e}") from None
        return cls(model, tok, **kw)

    def lengths(self, texts: Sequence[str]) -> list[int]:
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_input_length,
                             return_attention_mask=False, return_token_type_ids=False)
        return [len(x) for x in enc["input_ids"]]

    def __call__(self, texts: Sequence[str]) -> list[str]:
        import torch

        tok = self.tokenizer
        enc = tok(list(texts), return_tensors="pt", padding=True, truncation=True,
                  max_length=self.max_input_length, return_token_type_ids=False)
        enc = {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask")}
        with torch.inference_mode(), self.autocast:
            out = self.model.generate(**enc, num_beams=self.num_beams, num_return_sequences=1,
                                      max_length=self.max_length, do_sample=False)
        out = out.cpu().clone()
        out[out >= len(tok)] = tok.unk_token_id  # ids of a padded embedding matrix
        return [clean(t) for t in tok.batch_decode(out, skip_special_tokens=True)]


def _fingerprint(corpus, model_dir, shard, num_shards, batch_size, p: Paraphraser) -> dict:
    from ..utils import sha256_file

    mdir = Path(model_dir)
    files = sorted((f.name, f.stat().st_size) for f in mdir.iterdir() if f.is_file())
    cfg = mdir / "config.json"
    return {
        "corpus_sha256": sha256_file(corpus), "model": str(mdir.resolve()), "model_files": files,
        "config_sha256": sha256_file(cfg) if cfg.exists() else None,
        "shard": shard, "num_shards": num_shards, "batch_size": batch_size,
        "num_beams": p.num_beams, "max_length": p.max_length,
        "max_input_length": p.max_input_length, "device_type": p.device.type,
        # fp32 on CUDA only: every other job generates as it did before the setting existed (bf16 on CUDA,
        # fp32 on the CPU), and its checkpoint still resumes
        **({"precision": "fp32"} if p.device.type == "cuda" and p.precision == "fp32" else {}),
    }


def _read_checkpoint(path: Path, fingerprint: dict, plan: list[list[int]]) -> dict[int, list[str]]:
    """Finished batches {batch: texts} from a checkpoint; truncates a torn tail, discards a stale one."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    nl = data.find(b"\n")
    try:
        header = json.loads(data[:nl]) if nl >= 0 else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        log.warning("checkpoint %s was written with other settings (or is unreadable): starting over", path)
        path.unlink()
        return {}
    good_end, done = nl + 1, {}
    for raw in data[nl + 1:].split(b"\n")[:-1]:  # what follows the last b"\n" is a torn record
        try:
            rec = json.loads(raw)
            b = rec["batch"]
            ok = 0 <= b < len(plan) and rec["lines"] == plan[b] and len(rec["texts"]) == len(plan[b])
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            break
        done[b] = rec["texts"]
        good_end += len(raw) + 1
    if good_end < len(data):
        log.warning("checkpoint %s: dropping %d bytes of an interrupted record", path, len(data) - good_end)
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return done


def paraphrase_shard(corpus, model_dir, output, shard: int = 0, num_shards: int = 1,
                     batch_size: int = 32, num_beams: int = 10, max_length: int = 60,
                     device: str = "auto", max_input_length: int | None = None,
                     max_batches: int | None = None, precision: str = "bf16") -> dict:
    """Paraphrase shard ``shard`` of ``num_shards`` of ``corpus`` into ``output`` (JSONL), resumably.

    ``max_batches`` stops after that many new batches without writing ``output`` (the checkpoint
    stays; used by tests to simulate an interruption and by time-limited jobs). Returns a summary.
    """
    from ..utils import atomic_path

    if not (0 <= shard < num_shards):
        raise SentembError(f"paraphrase: shard {shard} is not in 0..{num_shards - 1}")
    if batch_size < 1 or num_beams < 1 or max_length < 2:
        raise SentembError("paraphrase: batch_size and num_beams must be >= 1, max_length >= 2")
    output = Path(output)
    para = Paraphraser.from_pretrained(model_dir, device=device, num_beams=num_beams,
                                       max_length=max_length, max_input_length=max_input_length,
                                       precision=precision)
    mine = {i: line for i, line in enumerate(iter_lines(corpus)) if i % num_shards == shard}
    todo = [i for i, line in mine.items() if line.strip()]
    lens = para.lengths([mine[i] for i in todo]) if todo else []
    order = [i for _, i in sorted(zip((-n for n in lens), todo))]
    plan = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]

    ckpt = output.with_name(output.name + ".ckpt.jsonl")
    output.parent.mkdir(parents=True, exist_ok=True)
    fp = _fingerprint(corpus, model_dir, shard, num_shards, batch_size, para)
    done = _read_checkpoint(ckpt, fp, plan)
    log.info("paraphrase shard %d/%d: %d lines, %d batches, %d already done (%s)", shard, num_shards,
             len(mine), len(plan), len(done), para.device)
    new = 0
    with open(ckpt, "ab") as f:
        if f.tell() == 0:
            f.write(json.dumps({"fingerprint": fp}).encode() + b"\n")
        for b, idx in enumerate(plan):
            if b in done:
                continue
            if max_batches is not None and new >= max_batches:
                return {"finished": False, "batches_done": len(done), "batches": len(plan)}
            texts = para([mine[i] for i in idx])
            f.write(json.dumps({"batch": b, "lines": idx, "texts": texts}).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
            done[b] = texts
            new += 1
            if new % 50 == 0:
                log.info("shard %d: %d/%d batches", shard, len(done), len(plan))
    result = {i: "" for i in mine}
    for b, texts in done.items():
        result.update(zip(plan[b], texts))
    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"line": i, "text": result[i]}, ensure_ascii=False) + "\n" for i in sorted(result))
    ckpt.unlink()
    return {"finished": True, "lines": len(mine), "batches": len(plan), "new_batches": new}


def merge_paraphrases(shards: Sequence[str | os.PathLike], corpus, output) -> int:
    """Merge shard outputs into a text file with one paraphrase per corpus line; returns lines."""
    from ..utils import atomic_path

    for path in (corpus, *shards):
        if not os.path.isfile(path):
            raise SentembError(f"paraphrase-merge: {path} not found")
    n = count_corpus_lines(corpus)
    texts: list[str | None] = [None] * n
    for path in shards:
        with open(path, "rb") as f:
            for k, raw in enumerate(f, start=1):
                try:
                    rec = json.loads(raw.decode("utf-8"))
                    i, t = int(rec["line"]), clean(rec["text"])
                except (ValueError, KeyError, TypeError):  # ValueError: bad JSON or bytes that are not UTF-8
                    raise SentembError(f"{path}:{k}: not a paraphrase record (a UTF-8 JSON line "
                                       '{"line": N, "text": ...})') from None
                if not 0 <= i < n:
                    raise SentembError(f"{path}:{k}: line {i} is outside the corpus ({n} lines) {corpus}")
                if texts[i] is not None:
                    raise SentembError(f"{path}:{k}: corpus line {i} appears in more than one shard")
                texts[i] = t
    missing = [i for i, t in enumerate(texts) if t is None]
    if missing:
        raise SentembError(f"paraphrase shards {list(map(str, shards))} miss {len(missing)} of {n} "
                           f"corpus lines (first: line {missing[0]}); are all shards given?")
    with atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(t + "\n")
    return n

