"""Data acquisition: fetch, verify and cache every external input of the pipeline.

Each input comes either from its real source (the Hugging Face hub, an HTTP archive, the NLTK
downloader) or from a local *mirror* directory laid out like the project's ``shared/`` data folder (``data/senteval``,
``data/senteval-raw``, ``data/wiki1m_*.txt``, ``models/<name>``, ``nltk_data``). Everything is
verified before it is renamed into place (:func:`sentemb.utils.atomic_path`), so a failed fetch
never leaves a partial output. Bad input raises :class:`sentemb.SentembError` naming the file,
line or option at fault. torch, transformers, huggingface_hub and nltk are imported lazily.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from pathlib import Path, PurePosixPath

from .. import SentembError
from ..evaluate.senteval import verify_counts
from ..utils import atomic_path, count_lines, seeded_sample, sha256_file, write_json
from .cache import drop_file_manifest, write_file_manifest, write_manifest

log = logging.getLogger(__name__)

PathLike = str | os.PathLike
TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "*.model",
]
MODEL_FILES = TOKENIZER_FILES + [
    "config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
    "*/config.json",  # sentence-transformers module configs, e.g. 1_Pooling/config.json
]
SAFETENSORS_FILES = ["*.safetensors", "model.safetensors.index.json"]
BIN_FILES = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
SOURCE_FILE = "sentemb_source.json"
#: the environment variable naming the mirror directory (over config key ``mirror``)
MIRROR_ENV = "SENTEMB_MIRROR"


# ----------------------------------------------------------------------------- helpers


def mirror_dir(config: dict) -> Path | None:
    """The local mirror directory: ``$SENTEMB_MIRROR`` if set, else config key ``mirror``."""
    value = os.environ.get(MIRROR_ENV) or config["mirror"]
    if not value:
        return None
    p = Path(value).expanduser()
    if not p.is_dir():
        src = f"${MIRROR_ENV}" if os.environ.get(MIRROR_ENV) else "config key 'mirror'"
        raise SentembError(f"{src}: mirror directory {p} does not exist")
    return p.resolve()


def _mirror_source(mirror: PathLike, mirror_path: str, what: str, config_key: str | None = None) -> Path:
    """``mirror/mirror_path``, or an error naming the missing mirror directory or path, and the config key
    that sets the path (``config_key``, the workflow's ``--config-key``) where there is one."""
    root = Path(mirror).expanduser()
    if not root.is_dir():
        raise SentembError(f"mirror directory {root} does not exist")
    src = root / mirror_path
    if not src.exists():
        where = (f" (config key {config_key}: the path inside the mirror, {mirror_path!r} now; set it, or "
                 f"put the input there)" if config_key else "")
        raise SentembError(f"{what} not found in the mirror: {src} does not exist{where}")
    return src


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy the files of ``src`` into ``dst``.

    Unlike ``shutil.copytree`` it does not copy permissions, so a read-only mirror gives a
    writable copy, and it follows symlinks (the Hugging Face cache links snapshots to blobs).
    """
    for dirpath, _, files in os.walk(src, followlinks=True):
        for name in files:
            rel = (Path(dirpath) / name).relative_to(src)
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(dirpath) / name, dst / rel)


def _check_sha256(path: Path, expected: str | None, name: PathLike) -> str:
    """The sha256 of ``path``; an error naming ``name`` when it differs from ``expected``."""
    actual = sha256_file(path)
    if expected and actual != expected.lower():
        raise SentembError(f"{name}: sha256 mismatch: got {actual}, expected {expected}")
    return actual


def _hub_call(what: str, fn, *args, **kwargs) -> Path:
    """Call a huggingface_hub download function; its failures become a SentembError."""
    try:
        return Path(fn(*args, **kwargs))
    except Exception as e:  # hub errors span requests/httpx/OSError/ValueError subclasses
        raise SentembError(f"download of {what} from the Hugging Face hub failed: {type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------- corpus


def fetch_corpus(
    output: PathLike, *, hub_repo: str, hub_file: str, revision: str | None = None,
    mirror: PathLike | None = None, mirror_path: str | None = None, sha256: str | None = None,
    expected_lines: int | None = None, config_key: str | None = None,
) -> Path:
    """Fetch the raw training corpus: ``mirror/mirror_path`` (default ``data/<hub_file>``) or the
    hub dataset file ``hub_repo/hub_file``; check its sha256 and line count when given."""
    if mirror:
        src = _mirror_source(mirror, mirror_path or f"data/{hub_file}", "corpus", config_key)
    else:
        from huggingface_hub import hf_hub_download

        src = _hub_call(f"{hub_repo}/{hub_file}", hf_hub_download, repo_id=hub_repo, filename=hub_file,
                        repo_type="dataset", revision=revision)
    drop_file_manifest(output)
    with atomic_path(output) as tmp:
        shutil.copyfile(src, tmp)
        digest = _check_sha256(tmp, sha256, src)
        if expected_lines is not None and (n := count_lines(tmp)) != expected_lines:
            raise SentembError(f"{src}: {n} lines, expected {expected_lines}")
    # a later truncation or edit is found when a workflow starts (data.cache); the digest just taken
    write_file_manifest(output, digest)
    log.info("corpus %s -> %s", src, output)
    return Path(output)


def prepare_corpus(
    input: PathLike, output: PathLike, *, max_sentences: int | None = None, seed: int = 0,
    skip_bad_lines: bool = False,
) -> dict:
    """Check the raw corpus line by line and write the training corpus (one sentence a line).

    Every line must be valid UTF-8, not blank and free of NUL bytes, else an error names the line (or,
    with ``skip_bad_lines``, it is skipped and counted). Line endings and a UTF-8 byte-order mark
    opening the file are stripped, the text is kept as is. With ``max_sentences`` below the number of lines, a seeded random subsample is kept in its
    original order (``sentemb.utils.seeded_sample``). The summary is returned and written to ``<output>.json``.
    """
    lines: list[str] = []
    skipped = {"empty": 0, "non_utf8": 0, "nul": 0}
    bom = False
    with open(input, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\n").rstrip(b"\r")
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (a file saved on Windows)
                raw, bom = raw[3:], True
            try:
                text = raw.decode("utf-8")
                problem = (None if text.strip() and "\x00" not in text else
                           ("nul", "holds a NUL byte (binary data?)") if text.strip() else ("empty", "empty line"))
            except UnicodeDecodeError as e:
                problem = ("non_utf8", f"not valid UTF-8 (byte {e.start + 1}: {e.reason})")
            if problem is None:
                lines.append(text)
            elif skip_bad_lines:
                skipped[problem[0]] += 1
            else:
                raise SentembError(f"{input}, line {lineno}: {problem[1]} (set corpus.skip_bad_lines to skip such lines)")
    n_in = len(lines) + sum(skipped.values())
    if len(lines) < 2:
        raise SentembError(f"{input}: only {len(lines)} usable line(s); a training corpus needs at least 2")
    if max_sentences is not None and max_sentences < len(lines):
        if max_sentences < 2:
            raise SentembError(f"max_sentences must be at least 2, not {max_sentences}")
        lines = seeded_sample(lines, max_sentences, seed)
    summary = {
        "input": str(input), "lines_in": n_in, "lines_out": len(lines), "skipped_empty": skipped["empty"],
        "skipped_non_utf8": skipped["non_utf8"], "skipped_nul": skipped["nul"], "bom_removed": bom,
        "max_sentences": max_sentences, "seed": seed,
    }
    drop_file_manifest(output)
    with atomic_path(output) as tmp:
        tmp.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        write_json(f"{output}.json", summary)
    write_file_manifest(output)  # a later truncation or edit is found when a workflow starts (data.cache)
    log.info("corpus %s: %d lines in, %d out, %d empty, %d non-UTF-8 and %d with a NUL byte skipped%s", input,
             n_in, len(lines), skipped["empty"], skipped["non_utf8"], skipped["nul"],
             "; the byte-order mark removed" if bom else "")
    return summary


# ----------------------------------------------------------------------------- SentEval


def _download(url: str, dest: Path, sha256: str | None) -> None:
    """Stream ``url`` into ``dest``; check its sha256 when given."""
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except urllib.error.HTTPError as e:
        raise SentembError(f"download of {url} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SentembError(f"download of {url} failed: {getattr(e, 'reason', e)}") from None
    _check_sha256(dest, sha256, url)


def _extract(archive: Path, dest: Path, name: str) -> None:
    """Extract a tar (any compression) or zip archive, refusing absolute or ``..`` members, links
    and device files (tar's "data" filter as a second line of defence)."""
    def check(member: str) -> None:
        p = PurePosixPath(member.replace("\\", "/"))
        if p.is_absolute() or ".." in p.parts:
            raise SentembError(f"{name}: unsafe archive member {member!r} (absolute path or '..')")

    if tarfile.is_tarfile(archive):
        with tarfile.open(archive, "r:*") as tf:
            for m in tf.getmembers():
                check(m.name)
                if m.issym() or m.islnk():  # data archives need no links; a link can point anywhere
                    raise SentembError(f"{name}: archive member {m.name!r} is a link (to {m.linkname!r}); refused")
                if not (m.isfile() or m.isdir()):
                    raise SentembError(f"{name}: archive member {m.name!r} is not a regular file or directory; refused")
            try:
                tf.extractall(dest, filter="data")
            except tarfile.FilterError as e:
                raise SentembError(f"{name}: unsafe archive member: {e}") from None
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for n in zf.namelist():
                check(n)
            zf.extractall(dest)
    else:
        raise SentembError(f"{name}: not a tar or zip archive")


def _sts_root(tree: Path, name: str) -> Path:
    """The shallowest directory under ``tree`` that holds ``STS/STSBenchmark``."""
    roots = sorted((p.parent.parent for p in tree.rglob("STSBenchmark") if p.is_dir() and p.parent.name == "STS"),
                   key=lambda p: len(p.parts))
    if not roots:
        raise SentembError(f"{name}: no STS/STSBenchmark directory in the archive")
    return roots[0]


def _fetch_sts_tree(output_dir, url, sha256, mirror, mirror_path, expected_counts, config_key=None) -> Path:
    """Copy (mirror) or download and extract (url) an STS tree into ``output_dir``, then verify it."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{output_dir.name}.dl-", dir=output_dir.parent) as work, \
            atomic_path(output_dir, is_dir=True) as tmp:
        if mirror:
            source = _mirror_source(mirror, mirror_path, "SentEval data", config_key)
            _copy_tree(source, tmp)
        else:
            source, archive = url, Path(work) / "archive"
            _download(url, archive, sha256)
            _extract(archive, Path(work) / "tree", url)
            for child in _sts_root(Path(work) / "tree", url).iterdir():
                child.rename(tmp / child.name)
        try:
            counts = verify_counts(tmp, expected_counts)
        except SentembError as e:
            raise SentembError(f"{source}: {str(e).replace(str(tmp), str(output_dir))}") from None
        write_manifest(tmp)
    log.info("SentEval data %s -> %s: %s", source, output_dir, counts)
    return output_dir


def fetch_senteval(
    output_dir: PathLike, *, url: str | None = None, sha256: str | None = None, mirror: PathLike | None = None,
    mirror_path: str = "data/senteval", expected_counts: dict[str, int] | None = None,
    config_key: str | None = None,
) -> Path:
    """Fetch SentEval's processed ``data/downstream`` tree (STS12–16, STS-B, SICK at least).

    From a mirror, ``mirror/mirror_path`` is copied; otherwise the archive at ``url`` (tar, tar.gz
    or zip, such as SimCSE's ``senteval.tar``) is downloaded, its sha256 checked, and the directory
    holding ``STS/STSBenchmark`` becomes ``output_dir``. The scored pairs per split must equal
    ``expected_counts`` (default: the published counts, ``sentemb.evaluate.senteval.EXPECTED_PAIRS``).
    """
    if not mirror and not url:
        raise SentembError("SentEval data: give a download url or a mirror directory")
    return _fetch_sts_tree(output_dir, url, sha256, mirror, mirror_path, expected_counts, config_key)


def fetch_senteval_raw(
    output_dir: PathLike, *, url: str | None = None, sha256: str | None = None, mirror: PathLike | None = None,
    mirror_path: str = "data/senteval-raw", expected_counts: dict[str, int] | None = None,
    config_key: str | None = None,
) -> Path:
    """Like :func:`fetch_senteval` for the STS sets as originally published (no canonical archive:
    a mirror or an explicit archive url is required)."""
    if not mirror and not url:
        raise SentembError(
            "raw STS data (evaluation.data: senteval-raw) has no canonical download: set a mirror "
            f"(config key 'mirror' or ${MIRROR_ENV}) holding {mirror_path}, or give an archive url"
        )
    return _fetch_sts_tree(output_dir, url, sha256, mirror, mirror_path, expected_counts, config_key)


# ----------------------------------------------------------------------------- models


def _weights_file(d: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (d / name).is_file():
            return d / name
    return None


def _load_check(what: str, d: Path, fn):
    """Load something with transformers; any failure becomes a SentembError naming ``d``."""
    try:
        return fn(str(d))
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, ... for bad files
        raise SentembError(f"{d}: {what} cannot be loaded by transformers: {type(e).__name__}: {e}") from None


def fetch_model(
    output_dir: PathLike, *, hub_id: str, revision: str | None = None, mirror: PathLike | None = None,
    mirror_path: str | None = None, sha256: str | None = None, random_init: dict | None = None,
    config_key: str | None = None,
) -> Path:
    """Fetch a pretrained encoder in Hugging Face layout and check that it loads.

    Source: ``mirror/mirror_path`` (default ``models/<last part of hub_id>``) copied whole, or a
    hub snapshot of its config, tokenizer, sentence-transformers and weights files (safetensors,
    else ``pytorch_model.bin``). ``sha256`` is that of the single weights file. With
    ``random_init`` (HF config keys including ``model_type``) only the tokenizer is taken from the
    source and a model with those settings is initialised with seed 0 (``sha256`` is not checked).
    ``sentemb_source.json`` in the output records the provenance.
    """
    from transformers import AutoConfig

    from ..model.backbone import check_weights, load_tokenizer

    mirror_path = mirror_path or f"models/{hub_id.rstrip('/').split('/')[-1]}"
    if random_init is not None and "model_type" not in random_init:
        raise SentembError(f"random_init for {hub_id} must name 'model_type' (e.g. bert), got {sorted(random_init)}")
    with atomic_path(output_dir, is_dir=True) as tmp:
        if mirror:
            src = _mirror_source(mirror, mirror_path, f"model {hub_id}", config_key)
            commit = None
        else:
            from huggingface_hub import snapshot_download

            def snap(patterns):
                return _hub_call(hub_id, snapshot_download, hub_id, revision=revision, allow_patterns=patterns)

            if random_init is not None:
                src = snap(TOKENIZER_FILES + ["config.json"])
            else:
                src = snap(MODEL_FILES + SAFETENSORS_FILES)
                if not any(src.glob("*.safetensors")):
                    src = snap(MODEL_FILES + BIN_FILES)
            commit = src.name  # the cache's snapshots/<commit hash>
        if random_init is None:
            _copy_tree(src, tmp)
        else:
            _random_model(src, tmp, random_init)
        weights = _weights_file(tmp)
        if weights is None:
            raise SentembError(f"model {hub_id} from {src}: no weights file (model.safetensors or pytorch_model.bin)")
        if not (tmp / "config.json").is_file():
            raise SentembError(f"model {hub_id} from {src}: config.json missing")
        _load_check("config.json", tmp, AutoConfig.from_pretrained)
        try:  # no vocabulary file (transformers would build a 5-token tokenizer), weights cut short
            load_tokenizer(tmp)
            check_weights(tmp)
        except SentembError as e:  # named by where the files came from, not by the temporary copy
            raise SentembError(f"model {hub_id}: {str(e).replace(str(tmp), str(src))}") from None
        actual = _check_sha256(weights, None if random_init else sha256, f"{src}/{weights.name}")
        write_json(tmp / SOURCE_FILE, {
            "hub_id": hub_id, "revision": revision, "commit": commit, "source": "mirror" if mirror else "hub",
            "path": str(Path(src).resolve()) if mirror else None, "weights": weights.name, "sha256": actual,
            "random_init": random_init,
        })
        write_manifest(tmp)
    log.info("model %s from %s -> %s", hub_id, src, output_dir)
    return Path(output_dir)


def _random_model(src: Path, dest: Path, random_init: dict) -> None:
    """Save the tokenizer of ``src`` and a seed-0 random model built from ``random_init`` into ``dest``."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    tok = _load_check("the tokenizer", src, AutoTokenizer.from_pretrained)
    settings = {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id, **random_init}
    try:
        cfg = AutoConfig.for_model(**settings)
    except (ValueError, TypeError) as e:
        raise SentembError(f"random_init {random_init}: not a valid model configuration: {e}") from None
    torch.manual_seed(0)
    AutoModel.from_config(cfg).save_pretrained(dest)
    tok.save_pretrained(dest)


# ----------------------------------------------------------------------------- NLTK


def _nltk_verify(root: Path, packages) -> None:
    """Load each package with NLTK reading only from ``root`` (stopwords and wordnet are read)."""
    import nltk
    from nltk.corpus.reader import StopwordsCorpusReader, WordNetCorpusReader
    from nltk.corpus.util import LazyCorpusLoader

    probes = {
        "stopwords": lambda: LazyCorpusLoader("stopwords", StopwordsCorpusReader, r"(?!README|\.).*",
                                              encoding="utf8").words("english"),
        "wordnet": lambda: LazyCorpusLoader("wordnet", WordNetCorpusReader, None).synsets("dog"),
    }
    saved = list(nltk.data.path)
    nltk.data.path[:] = [str(root)]
    try:
        for pkg in packages:
            try:
                with warnings.catch_warnings():  # wordnet without omw warns that it is monolingual
                    warnings.simplefilter("ignore", UserWarning)
                    ok = probes[pkg]() if pkg in probes else bool(list(root.glob(f"*/{pkg}*")))
            except (LookupError, OSError, ValueError) as e:
                raise SentembError(f"NLTK package '{pkg}' in {root} cannot be loaded: {e}") from None
            if not ok:
                raise SentembError(f"NLTK package '{pkg}' in {root} loads but is empty")
    finally:
        nltk.data.path[:] = saved


def fetch_nltk(
    output_dir: PathLike, *, packages=("stopwords", "wordnet"), mirror: PathLike | None = None,
    mirror_path: str = "nltk_data",
) -> Path:
    """Build an NLTK data directory holding ``packages``: copied from ``mirror/mirror_path``
    (``<category>/<pkg>/`` or ``<category>/<pkg>.zip``) or fetched by ``nltk.download``; then
    load each from it."""
    with atomic_path(output_dir, is_dir=True) as tmp:
        if mirror:
            src = _mirror_source(mirror, mirror_path, "NLTK data")
            for pkg in packages:
                found = sorted(src.glob(f"*/{pkg}")) + sorted(src.glob(f"*/{pkg}.zip"))
                if not found:
                    raise SentembError(f"NLTK package '{pkg}' not found in the mirror: no {src}/<category>/{pkg}[.zip]")
                for p in found:
                    if p.is_dir():
                        _copy_tree(p, tmp / p.relative_to(src))
                    else:
                        (tmp / p.parent.name).mkdir(exist_ok=True)
                        shutil.copyfile(p, tmp / p.relative_to(src))
        else:
            import nltk

            for pkg in packages:
                try:
                    ok = nltk.download(pkg, download_dir=str(tmp), quiet=True, raise_on_error=True)
                except (ValueError, OSError) as e:
                    raise SentembError(f"nltk.download('{pkg}') failed: {e}") from None
                if not ok:
                    raise SentembError(f"nltk.download('{pkg}') failed")
        _nltk_verify(tmp, packages)
        write_manifest(tmp)
    log.info("NLTK data %s -> %s", ", ".join(packages), output_dir)
    return Path(output_dir)


# ----------------------------------------------------------------------------- built-in corpora

#: Built-in corpora made by a data rule from fetched data (name -> what makes it); every other
#: corpus name is the configured ``corpus`` (fetched + prepared).
BUILTIN_CORPORA = {"sts-unlabeled": "sentemb prepare-sts-corpus (the STS sentences of the fetched SentEval tree)"}

#: (task, split) read by ``prepare_sts_corpus``, in this order.
STS_CORPUS_SPLITS = ([(t, "test") for t in ("STS12", "STS13", "STS14", "STS15", "STS16")]
                     + [("STSBenchmark", s) for s in ("train", "dev", "test")]
                     + [("SICKRelatedness", s) for s in ("train", "dev", "test")])


def sts_sentences(senteval_dir: PathLike, keep_duplicates: bool = False, unscored: bool = False) -> list[str]:
    """The unlabeled sentences of the seven STS datasets (PaSeR's corpus, methods.md §2).

    Splits (``STS_CORPUS_SPLITS``): STS12–16 test sets (every subset SentEval evaluates: only the pairs
    with a gold score, the evaluated ones, unless ``unscored``: every line of the input files),
    STS-B train + dev + test and SICK train + trial + test. Both sentences of every pair, in file
    order (sentence 1 before sentence 2), whitespace-normalised as the evaluator reads them. Gold
    scores are not used. Duplicates (the same string after normalisation) are dropped, the first
    occurrence kept, unless ``keep_duplicates``. Empty sentences are dropped (a corpus line must not be
    blank). ``unscored`` and ``keep_duplicates`` together are ConSERT's loader (``data_utils.py``
    ``load_datasets(need_label=False, no_pair=True)``), which PaSeR follows (config ``sts_corpus``)."""
    from ..evaluate.senteval import load_task

    out, seen = [], set()
    for task, split in STS_CORPUS_SPLITS:
        for pairs in load_task(senteval_dir, task, split, unscored=unscored):
            for a, b in zip(pairs.sent1, pairs.sent2):
                for s in (a, b):
                    if not s or (not keep_duplicates and s in seen):
                        continue
                    seen.add(s)
                    out.append(s)
    return out


def prepare_sts_corpus(senteval_dir: PathLike, output: PathLike, keep_duplicates: bool = False,
                       unscored: bool = False, max_sentences: int | None = None, seed: int = 0) -> dict:
    """Write the ``sts-unlabeled`` corpus (``sts_sentences``), one sentence per line, and a summary
    ``<output>.json``. With ``max_sentences`` below their number, a seeded random sample of the
    sentences is kept in corpus order (config ``sts_corpus.max_sentences``; drawn as
    ``prepare_corpus`` draws the configured corpus's: ``sentemb.utils.seeded_sample``)."""
    sents = sts_sentences(senteval_dir, keep_duplicates, unscored)
    if not sents:
        raise SentembError(f"{senteval_dir}: no STS sentences found")
    n_all = len(sents)
    if max_sentences is not None and max_sentences < 2:
        raise SentembError(f"max_sentences must be at least 2, not {max_sentences}")
    sents = seeded_sample(sents, max_sentences, seed)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    drop_file_manifest(output)
    with atomic_path(output) as tmp:
        Path(tmp).write_text("".join(s + "\n" for s in sents), encoding="utf-8")
    write_file_manifest(output)  # checked when a workflow starts, as the training corpus is (data.cache)
    summary = {"corpus": "sts-unlabeled", "senteval": str(senteval_dir), "sentences": len(sents),
               "keep_duplicates": keep_duplicates, "unscored": unscored, "splits": [f"{t}/{s}" for t, s in STS_CORPUS_SPLITS]}
    if max_sentences is not None:  # absent otherwise: a summary of all sentences reads as before the key
        summary.update(sentences_before_sample=n_all, max_sentences=max_sentences, seed=seed)
    write_json(f"{output}.json", summary)
    log.info("sts-unlabeled: %d sentences -> %s", len(sents), output)
    return summary
