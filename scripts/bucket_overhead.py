"""The cost and the reach of ``train.buckets`` on real batches (issue 36 §2; ``sentemb.data.buckets``).

For each method it builds real micro-batches as the loop does (wiki1m_head, the all-MiniLM-L6-v2
tokenizer and encoder, batch 64, ``sampler: length`` for ArcCSE and ``random`` for the others, the
loop's ``batch_schedule``), once without buckets and once with ``buckets: auto`` resolved for CUDA,
at ``max_len`` 32 and 512, and prints per group of row tensors (``batch_shapes``: sentences,
ArcCSE's triplets, PaSeR's decoder rows):

* ``overhead``: padded positions with buckets / without (rows x width summed over the batches: the
  factor on the group's token work, ``padding_overhead``);
* the distinct widths without and with buckets (the step shapes an epoch meets);
* the rows per batch (min-max): a row count that varies is a step shape too;
* ``--ladder``: the overhead of other ladders on the same batches (a ladder cut at max_len, as
  ``resolve_buckets`` does, and continued past it by doubling up to the group's limit).

Run: ``PYTHONPATH=src python scripts/bucket_overhead.py [--batches 50] [--shared ../shared]``
(``docs/methods-reference.md`` quotes its output). CPU only; about a minute per 50 batches.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

#: the methods' arguments here: the paper defaults, less what needs a stage or WordNet (neither
#: changes a width: InfoCSE's init, PaSeR's EDA replaces words by words)
ARGS = {"simcse": {}, "sarcse": {}, "arccse": {}, "una": {}, "infocse": {"init": "backbone", "skip_from": 3},
        "paser": {"eda": "none"}}
LADDERS = {
    "auto": None,  # AUTO_LADDER
    "16-24-32-48-64-128-256-512": (16, 24, 32, 48, 64, 128, 256, 512),  # the first auto ladder
    "16-32-48-64-96-128-256-512": (16, 32, 48, 64, 96, 128, 256, 512),
    "16-24-32-48-64-96-128-512": (16, 24, 32, 48, 64, 96, 128, 512),
    "16-24-32-48-64-96-192-512": (16, 24, 32, 48, 64, 96, 192, 512),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=50, help="per method (186 = one epoch of wiki1m_head at 64)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shared", default=os.environ.get("SENTEMB_SHARED", str(REPO.parent / "shared")))
    p.add_argument("--methods", default=",".join(ARGS))
    p.add_argument("--ladder", action="store_true", help="also price the other ladders of LADDERS")
    a = p.parse_args(argv)

    from sentemb.data.buckets import AUTO_LADDER, batch_shapes, bucket_width, resolve_buckets
    from sentemb.methods import MethodContext, get_method
    from sentemb.model.backbone import load_encoder
    from sentemb.stats.inputs import build_input
    from sentemb.train.loop import batch_schedule, sentence_lengths

    shared = Path(a.shared)
    corpus = shared / "data" / "wiki1m_head.txt"
    model = shared / "models" / "all-MiniLM-L6-v2"
    lines = corpus.read_text("utf-8").splitlines()
    work = Path(tempfile.mkdtemp(prefix="bucket_overhead-"))
    built: dict = {}
    print(f"{len(lines)} lines of {corpus}; {a.batches} batches of {a.batch_size}; tokenizer {model.name}")
    for name in a.methods.split(","):
        cls = get_method(name)
        args = ARGS[name]
        for n in cls.requires(cls.make_args(args)):
            built.setdefault(n, build_input(n, work / n, corpus, model))
        enc, tok = load_encoder(model, pooling_layer=False)
        m = cls(enc, tok, args, MethodContext(max_len=512, seed=1, backbone="minilm", model_dir=model,
                                              inputs=dict(built), corpus=corpus))
        length = name == "arccse"
        order = batch_schedule(len(lines), a.batch_size, 1, 1, sentence_lengths(lines) if length else None)
        order = order[: a.batches]
        limit = {"triplets": m._triplet_len() if name == "arccse" else None,
                 "decoder": m.args.max_target_len if name == "paser" else None}
        for max_len in (32, 512):
            m.ctx.max_len = max_len
            plain, padded = [], []
            for k, idx in enumerate(order):
                sents, ids = [lines[i] for i in idx], [int(i) for i in idx]
                for buckets, out in ((None, plain), (resolve_buckets("auto", max_len, "cuda"), padded)):
                    m.ctx.buckets = buckets
                    out.append(batch_shapes(m.build_batch(sents, step=k, lines=ids, micro=k), m.width_groups))
            print(f"\n{name} (sampler {'length' if length else 'random'}), max_len {max_len}, "
                  f"buckets {resolve_buckets('auto', max_len, 'cuda')}")
            for g in sorted({g for b in plain for g in b}):
                pairs = [(b[g], c[g]) for b, c in zip(plain, padded) if g in b]
                base = sum(r * w for (r, w), _ in pairs)
                with_b = sum(r * w for _, (r, w) in pairs)
                rows = [r for (r, _), _ in pairs]
                print(f"  {g:9s} overhead {with_b / base:.3f}  widths {len({w for (_, w), _ in pairs})} -> "
                      f"{sorted({w for _, (_, w) in pairs})}  rows {min(rows)}-{max(rows)} "
                      f"({len(set(rows))} counts) in {len(pairs)}/{len(plain)} batches")
                if a.ladder:
                    for lname, ladder in LADDERS.items():
                        bk = resolve_buckets(list(ladder or AUTO_LADDER), max_len, "cuda")
                        cost = sum(r * bucket_width(w, bk, limit.get(g)) for (r, w), _ in pairs)
                        n = len({bucket_width(w, bk, limit.get(g)) for (_, w), _ in pairs})
                        print(f"    ladder {lname:28s} overhead {cost / base:.3f}  widths {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
