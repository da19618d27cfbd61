"""``sentemb`` commands of ``sentemb.data.fetch``: their arguments (paths and overrides) and how they
call it."""

from __future__ import annotations

import os

from .. import SentembError
from ..utils import json_object
from ..data.fetch import (
    MIRROR_ENV, fetch_corpus, fetch_model, fetch_nltk, fetch_senteval, fetch_senteval_raw, prepare_corpus,
    prepare_sts_corpus)
from .argtypes import positive_int, seed_int


def _mirror(args) -> str | None:
    return args.mirror or os.environ.get(MIRROR_ENV) or None


def _model_key(output: str) -> str:
    """The config key of a fetched model's mirror path, from where the workflow puts it
    (``sentemb.config.paths``): a backbone under ``models/<name>``, the paraphraser under ``paraphraser/``."""
    from pathlib import Path

    out = Path(output)
    if out.parent.name == "paraphraser":
        return "stats.paraphrase.model.mirror_path"
    return f"backbones.{out.name if out.parent.name == 'models' else '<name>'}.mirror_path"


def _random_init_arg(text: str | None) -> dict | None:
    return None if text is None else json_object(text, "--random-init", "a JSON object of HF config keys")


def _cmd_fetch_corpus(args) -> None:
    fetch_corpus(args.output, hub_repo=args.hub_repo, hub_file=args.hub_file, revision=args.revision,
                 mirror=_mirror(args), mirror_path=args.mirror_path, sha256=args.sha256,
                 expected_lines=args.expected_lines, config_key=args.config_key or "corpus.mirror_path")


def _cmd_prepare_corpus(args) -> None:
    prepare_corpus(args.input, args.output, max_sentences=args.max_sentences, seed=args.seed,
                   skip_bad_lines=args.skip_bad_lines)


def _cmd_prepare_sts_corpus(args) -> None:
    prepare_sts_corpus(args.senteval, args.output, keep_duplicates=args.keep_duplicates, unscored=args.unscored,
                       max_sentences=args.max_sentences, seed=args.seed)


def _cmd_fetch_senteval(args) -> None:
    fetch = fetch_senteval_raw if args.raw else fetch_senteval
    default = "data/senteval-raw" if args.raw else "data/senteval"
    key = args.config_key or ("senteval.raw_mirror_path" if args.raw else "senteval.mirror_path")
    fetch(args.output, url=args.url, sha256=args.sha256, mirror=_mirror(args), mirror_path=args.mirror_path or default,
          config_key=key)


def _cmd_fetch_model(args) -> None:
    fetch_model(args.output, hub_id=args.hub_id, revision=args.revision, mirror=_mirror(args),
                mirror_path=args.mirror_path, sha256=args.sha256, random_init=_random_init_arg(args.random_init),
                config_key=args.config_key or _model_key(args.output))


def _cmd_fetch_nltk(args) -> None:
    packages = [p.strip() for p in args.packages.split(",") if p.strip()]
    if not packages:
        raise SentembError("--packages: give at least one NLTK package name")
    kw = {"mirror_path": args.mirror_path} if args.mirror_path else {}
    fetch_nltk(args.output, packages=packages, mirror=_mirror(args), **kw)


def register(subparsers) -> None:
    """Add the fetch-* and prepare-corpus subcommands."""
    def command(name, func, help, **required):
        p = subparsers.add_parser(name, help=help, description=help)
        for flag, kw in required.items():
            p.add_argument(f"--{flag.replace('_', '-')}", required=True, **kw)
        p.set_defaults(func=func)
        return p

    def mirror_opts(p, keyed=True):
        p.add_argument("--mirror", help=f"local mirror directory laid out like the shared/ data folder (default ${MIRROR_ENV})")
        p.add_argument("--mirror-path", help="path of the input inside the mirror")
        if keyed:  # fetch-nltk's mirror path has no config key
            p.add_argument("--config-key", help="the config key that sets --mirror-path, named when the path is not "
                           "in the mirror (default: the workflow's key for this input, as its output path says)")

    p = command("fetch-corpus", _cmd_fetch_corpus, "Fetch the raw training corpus and verify it.",
                output={"help": "raw corpus file to write"},
                hub_repo={"help": "Hugging Face dataset repository"},
                hub_file={"help": "the corpus file in it (the mirror's default path: data/<file>)"})
    p.add_argument("--revision",
                   help="hub revision: branch, tag or commit (default: the latest; not used with a mirror)")
    p.add_argument("--sha256", help="expected sha256 of the file (checked when given)")
    p.add_argument("--expected-lines", type=positive_int, help="expected line count (checked when given)")
    mirror_opts(p)

    p = command("prepare-corpus", _cmd_prepare_corpus, "Check the raw corpus line by line and (sub)sample it.",
                input={"help": "raw corpus (fetch-corpus output)"},
                output={"help": "training corpus, one sentence per line (summary in <output>.json)"})
    p.add_argument("--max-sentences", type=positive_int,
                   help="keep a seeded random sample of this many lines, in corpus order (default: all)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the --max-sentences sample (default: %(default)s)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip empty lines, non-UTF-8 lines and lines holding a NUL byte instead of failing")

    p = command("prepare-sts-corpus", _cmd_prepare_sts_corpus,
                "Write the sts-unlabeled corpus: the sentences of STS12-16 (test), STS-B and SICK (all "
                "splits) from a SentEval tree (by default the scored pairs, deduplicated; the workflow passes config "
                "sts_corpus).",
                senteval={"help": "SentEval data root (fetch-senteval output)"},
                output={"help": "corpus file, one sentence per line (summary in <output>.json)"})
    p.add_argument("--keep-duplicates", action="store_true", help="keep repeated sentences")
    p.add_argument("--unscored", action="store_true",
                   help="also STS12-16's pairs without a gold score (every line of the input files); with "
                        "--keep-duplicates this is ConSERT's loader, PaSeR's corpus, what the workflow makes by "
                        "default (config sts_corpus)")
    p.add_argument("--max-sentences", type=positive_int,
                   help="keep a seeded random sample of this many sentences, in corpus order (default: all; config "
                        "sts_corpus.max_sentences)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the --max-sentences sample (default: %(default)s; config sts_corpus.sample_seed)")

    p = command("fetch-senteval", _cmd_fetch_senteval, "Fetch the SentEval STS/SICK data and verify the pair counts.",
                output={"help": "SentEval data directory to write"})
    p.add_argument("--url", help="archive (tar, tar.gz, zip) to download when no mirror is used")
    p.add_argument("--sha256", help="sha256 of the --url archive (checked when given; not for a mirror)")
    p.add_argument("--raw", action="store_true", help="the STS sets as originally published (data/senteval-raw)")
    mirror_opts(p)

    p = command("fetch-model", _cmd_fetch_model, "Fetch a pretrained encoder and check that it loads.",
                output={"help": "model directory to write"},
                hub_id={"help": "Hugging Face model id (the mirror's default path: models/<its last part>)"})
    p.add_argument("--revision",
                   help="hub revision: branch, tag or commit (default: the latest; not used with a mirror)")
    p.add_argument("--sha256", help="sha256 of the weights file")
    p.add_argument("--random-init", help="JSON object of HF config keys: build a random model instead")
    mirror_opts(p)

    p = command("fetch-nltk", _cmd_fetch_nltk, "Fetch NLTK data packages and check that they load.",
                output={"help": "NLTK data directory to write"})
    p.add_argument("--packages", default="stopwords,wordnet", help="comma-separated NLTK package ids")
    mirror_opts(p, keyed=False)
