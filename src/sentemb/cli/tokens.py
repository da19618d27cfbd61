"""``sentemb`` commands of ``sentemb.data.tokens``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import argparse

from ..data.tokens import TokenCache


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from ..model.backbone import load_tokenizer
    from ..data.corpus import read_corpus

    tok = load_tokenizer(args.model)
    sentences = read_corpus(args.corpus)
    cache = TokenCache.build(sentences, tok, corpus=args.corpus)
    cache.save(args.output)
    print(f"{len(cache)} lines, {cache.meta['tokens']} tokens ({cache.meta['seconds']} s) -> {args.output}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("tokenize-corpus", help="tokenize a corpus once for training (memory-mapped token ids)")
    p.add_argument("--model", required=True, help="model (tokenizer) directory")
    p.add_argument("--corpus", required=True, help="sentences, one per line")
    p.add_argument("--output", required=True, help="cache directory (ids.npy, offsets.npy, meta.json)")
    p.set_defaults(func=_cmd_tokenize)
