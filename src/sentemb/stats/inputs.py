"""Input kinds: the statistics a method reads (``Method.requires``), one registry entry each (issue 27 §3).

An entry holds everything the pipeline needs to know about a kind of input:

* ``path``: where the workflow puts it in the results layout (``sentemb.config.load.input_path``, so
  the train rule's ``input:`` and the run's ``paths.inputs`` cannot disagree), from the layout and
  the config tree (``sentemb.config.settings.Config``);
* ``rule``: the workflow rule that makes it (``workflow/rules/*.smk``);
* ``build``: how to make it from a corpus file with the package's own code, in a scratch folder,
  for the tools that need one without the workflow: ``sentemb plan`` counts a step on it,
  ``sentemb gpu-check`` times one, and the method contract (``sentemb.testing``,
  ``sentemb check-method``) builds a tiny one. ``None`` where a stage makes it (``pretrained``: the
  method's own ``pretrain_stage``, which those tools run themselves).

A method that needs a statistic of its own registers one entry (``register_input``; in its own file
when it is a plug-in) with a ``build``: ``sentemb check-method``, ``plan`` and ``gpu-check`` build it
with it, and the workflow's rule ``make_input`` (``sentemb make-input KIND``) makes it once per
corpus and backbone under ``results/stats/<corpus>/inputs/<kind>.<backbone>/``. Such an input is
the folder its ``build`` wrote into (``folder``): ``ctx.inputs[kind]`` is that folder.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import SentembError


class InputUnavailable(SentembError):
    """An input cannot be built here (data it needs, e.g. the NLTK mirror, is absent)."""


@dataclass(frozen=True)
class InputKind:
    name: str
    what: str
    #: (layout, cfg, corpus, backbone, method) -> the path the workflow writes (``cfg``: the config
    #: tree, ``sentemb.config.settings.Config``); None: not in the DAG
    path: Callable[..., str] | None = None
    #: the workflow rule (or ``sentemb`` command) that makes it
    rule: str | None = None
    #: (work dir, corpus file, model dir, config) -> path, with the package's own code (``config``: a
    #: validated config, or {} for the defaults)
    build: Callable[[Path, Path, Path, dict], Path] | None = None
    #: the input is the folder ``build`` wrote into (a plug-in kind, made by rule ``make_input``)
    folder: bool = False
    #: made once per backbone (it reads the backbone's tokenizer), not once per corpus only
    per_backbone: bool = False
    #: (config mapping) -> the file or folder of data that ``build`` reads besides the corpus and the
    #: model (NLTK's stopwords and WordNet for ``rake`` and ``nltk``); None: none. ``sentemb plan``
    #: keeps a count made with the input only under that data's digest (``data_digest``)
    data: Callable[[dict], Path] | None = None


INPUTS: dict[str, InputKind] = {}


def register_input(kind: InputKind) -> InputKind:
    """Add ``kind`` to the registry; a built-in kind's name cannot be taken by another definition. A
    kind without a ``path`` (a plug-in's) is made by the workflow's generic rule ``make_input`` from
    its ``build``, into ``results/stats/<corpus>/inputs/<kind>.<backbone>/``."""
    import dataclasses
    import re

    old = INPUTS.get(kind.name)
    if old is not None and old.name in BUILTIN and old is not kind:
        raise SentembError(f"input kind '{kind.name}' is a built-in one; give yours another name")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", kind.name):
        raise SentembError(f"input kind '{kind.name}': use letters, digits, '_' and '-' only (it names a folder)")
    if kind.path is None:
        if kind.build is None:
            raise SentembError(f"input kind '{kind.name}': give it a build(work, corpus, model_dir, config) function")
        name = kind.name
        kind = dataclasses.replace(
            kind, rule="make_input", folder=True, per_backbone=True,
            path=lambda layout, cfg, corpus, backbone, method: f"{layout.stats_dir(corpus)}/inputs/{name}.{backbone}")
    INPUTS[kind.name] = kind
    return kind


def get_input(name: str, where: str = "input") -> InputKind:
    if name not in INPUTS:
        raise SentembError(f"{where}: unknown input kind '{name}' (known: {', '.join(INPUTS)}; a method's own "
                           "kind is added with sentemb.stats.inputs.register_input)")
    return INPUTS[name]


def build_input(name: str, work: str | Path, corpus: str | Path, model: str | Path, config=None) -> Path:
    """Input ``name`` made from ``corpus`` (and ``model``'s tokenizer) under ``work`` with its
    ``build``; ``config``: a validated config (its tree or its mapping) whose ``stats`` settings and
    ``resources_dir`` apply (None: the defaults). A ``build`` receives the mapping (its interface,
    plug-ins' included)."""
    import dataclasses

    from ..config.fields import to_dict

    if dataclasses.is_dataclass(config):  # the tree (sentemb.config.settings.Config): its mapping form
        config = to_dict(config)
    kind = get_input(name)
    if kind.build is None:
        raise SentembError(f"input '{name}' is made by a stage ({kind.rule}), not from a corpus")
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(kind.build(work, Path(corpus), Path(model), config or {}))
    return work if kind.folder else out


def data_digest(name: str, config=None) -> str | None:
    """sha256 of the data input ``name``'s ``build`` reads besides the corpus and the model (its
    ``data``: every file below that folder, relative path and bytes, in path order); None where the
    kind declares none or the data is absent here (its build then fails and says so)."""
    import dataclasses

    from ..config.fields import to_dict

    kind = get_input(name)
    if kind.data is None:
        return None
    if dataclasses.is_dataclass(config):
        config = to_dict(config)
    try:
        where = Path(kind.data(config or {})).resolve()
    except InputUnavailable:
        return None
    return _tree_digest(str(where), *_tree_stamp(where))


def _tree_stamp(root: Path) -> tuple:
    """What ``_tree_digest``'s cache is keyed on besides the path: each file's path, size and mtime
    (so a file replaced between two calls of one process is read again). Linked folders are followed
    (a mirror may link its corpora); the fetch's own manifest is left out (it records file times:
    the same data fetched twice would differ)."""
    import os

    from ..data.cache import MANIFEST

    if root.is_file():
        files = [root]
    else:
        files = sorted(Path(d) / f for d, _, names in os.walk(root, followlinks=True) for f in names
                       if f != MANIFEST and (Path(d) / f).is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


@functools.lru_cache(maxsize=16)
def _tree_digest(root: str, *stamp) -> str:
    import hashlib

    base = Path(root)
    h = hashlib.sha256()
    for path, _, _ in stamp:
        p = Path(path)
        rel = p.name if p == base else str(p.relative_to(base))
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------------------------ built-in kinds
def _token_freq(work, corpus, model, config):
    from .frequency import write_token_frequencies

    out = work / "token_freq.parquet"
    write_token_frequencies(corpus, model, out)
    return out


def _paraphrases(work, corpus, model, config):
    """A stand-in of the same shape (one line per corpus line: its words reversed); the workflow's
    are PEGASUS's, too heavy for a tool's scratch build."""
    out = work / "paraphrases.txt"
    if not out.is_file():
        lines = corpus.read_text("utf-8").splitlines()
        out.write_text("".join(" ".join(reversed(x.split())) + "\n" for x in lines), "utf-8")
    return out


def _tfidf(work, corpus, model, config, para=False):
    from .tfidf import write_tfidf

    out = work / ("tfidf_para.parquet" if para else "tfidf.parquet")
    write_tfidf([corpus, _paraphrases(work, corpus, model, config)] if para else [corpus], out, workers=1)
    return out


def nltk_mirror(config: dict | None = None) -> Path:
    """NLTK data (stopwords, WordNet): the config's ``resources_dir``/nltk_data where fetched, else the
    mirror's ``shared/nltk_data``; ``InputUnavailable`` naming where it was looked for."""
    from ..ops.shapes import shared_dirs

    resources = (config or {}).get("resources_dir")  # a build's config mapping (``build_input``)
    places = [Path(resources) / "nltk_data"] if resources else []
    places += [d / "nltk_data" for d in shared_dirs()]
    for d in places:
        if d.is_dir():
            return d
    raise InputUnavailable("needs NLTK data (stopwords, WordNet): `sentemb fetch-nltk`, or set SENTEMB_SHARED to a "
                           f"folder with nltk_data/ (looked in {', '.join(str(d) for d in places)})")


def _rake(work, corpus, model, config):
    from ..config.settings import StatsSettings
    from .rake import write_rake

    out = work / "rake.parquet"
    top_k = StatsSettings.from_dict(config.get("stats")).rake_top_k  # config {}: the declared defaults
    write_rake(corpus, nltk_mirror(config), out, top_k=int(top_k), workers=1)
    return out


BUILTIN: dict[str, InputKind] = {k.name: k for k in (
    InputKind("token_freq", "token frequencies of the corpus under the backbone's tokenizer (SARCSE's weights)",
              lambda layout, cfg, corpus, backbone, method: layout.token_freq(corpus, backbone),
              "stats_token_freq", _token_freq, per_backbone=True),
    InputKind("tfidf", "TF-IDF of the corpus's words (UNA's hard negatives)",
              lambda layout, cfg, corpus, backbone, method: layout.tfidf(corpus), "stats_tfidf", _tfidf),
    InputKind("tfidf_para", "TF-IDF over the corpus and its paraphrases (UNA with paraphrase positives)",
              lambda layout, cfg, corpus, backbone, method: layout.tfidf_para(corpus), "stats_tfidf_para",
              lambda w, c, m, cfg: _tfidf(w, c, m, cfg, para=True)),
    InputKind("paraphrases", "one PEGASUS paraphrase per corpus line (UNA's positives)",
              lambda layout, cfg, corpus, backbone, method: layout.paraphrases(corpus), "paraphrase_merge",
              _paraphrases),
    InputKind("rake", "RAKE phrases per corpus line, the top stats.rake_top_k (PaSeR's masking)",
              lambda layout, cfg, corpus, backbone, method: layout.rake(corpus, int(cfg.stats.rake_top_k)),
              "stats_rake", _rake, data=nltk_mirror),  # RAKE's stopword list
    InputKind("nltk", "NLTK stopwords and WordNet (PaSeR's synonym replacement)",
              lambda layout, cfg, corpus, backbone, method: layout.nltk(), "fetch_nltk",
              lambda w, c, m, cfg: nltk_mirror(cfg), data=nltk_mirror),
    InputKind("pretrained", "the method's own pretraining stage's model (Method.pretrain_stage: InfoCSE's stage 1)",
              lambda layout, cfg, corpus, backbone, method: f"{layout.pretrain_dir(method, backbone)}/model",
              "pretrain", None),
)}
INPUTS.update(BUILTIN)
