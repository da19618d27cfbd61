"""The statistics stage's settings as the workflow reads them (``workflow/rules/stats.smk``): the
config section ``stats`` with defaults, the corpora some run trains on, which need paraphrases, and
every statistic's path. Apart from ``sentemb.stats`` (the writers), since these read the validated
config: the writers do not depend on the config module (no import cycle through ``sentemb.stats.inputs``).

Each function takes the config tree (``sentemb.config.settings.Config``; the Snakefile passes its
``CFG``) or a validated mapping, and reads the tree's attributes."""

from __future__ import annotations

from ..config.paths import Layout
from ..config.settings import Config


def stats_settings(config: dict | Config) -> dict:
    """The config section ``stats`` with defaults filled in (used by workflow/rules/stats.smk).

    ``paraphrase.enabled`` is resolved to a bool: if unset (null), paraphrases are made when
    ``tfidf_with_paraphrases`` is set or a configured run's method lists "paraphrases" or
    "tfidf_para" in ``Method.requires(args)``. ``paraphrase.model_name`` names the model's directory.
    """
    cfg = Config.of(config)
    s = cfg.stats.to_dict()
    para = s["paraphrase"]
    para["model_name"] = cfg.stats.paraphrase.model.hub_id.rstrip("/").split("/")[-1]
    if cfg.stats.paraphrase.enabled is None:
        from ..config.load import run_requires

        needed = {n for r in cfg.runs for n in run_requires(cfg, r)}
        para["enabled"] = bool(cfg.stats.tfidf_with_paraphrases or needed & {"paraphrases", "tfidf_para"})
    return s


def run_corpora(config: dict | Config) -> list[str]:
    """The corpora some run trains on (``runs[].corpus``, default ``corpus.name``), in first-use
    order; statistics are computed once for each of them."""
    cfg = Config.of(config)
    out: list[str] = []
    for r in cfg.runs:
        c = cfg.corpus_of(r)
        if c not in out:
            out.append(c)
    return out


def needs_paraphrases(config: dict | Config, corpus: str) -> bool:
    """Paraphrases of ``corpus``: when ``tfidf_with_paraphrases`` is set or a run on this corpus
    requires them; ``stats.paraphrase.enabled`` (true/false) decides for the configured corpus
    (``corpus.name``) only, so a built-in corpus of one run (sts-unlabeled) is never paraphrased
    for nothing."""
    from ..config.load import run_requires

    cfg = Config.of(config)
    explicit = cfg.stats.paraphrase.enabled
    if explicit is not None and corpus == cfg.corpus.name:
        return bool(explicit)
    if cfg.stats.tfidf_with_paraphrases:
        return True
    needed = {n for r in cfg.runs if cfg.corpus_of(r) == corpus for n in run_requires(cfg, r)}
    return bool(needed & {"paraphrases", "tfidf_para"})


def stats_targets(config: dict | Config, corpus: str | None = None, paraphrases: bool | None = None) -> list[str]:
    """Paths of all statistics of ``corpus`` for ``rule all``; without ``corpus``, of every corpus
    some run uses (``run_corpora``). The paraphrase outputs only if ``paraphrases`` (default: when
    that corpus needs them, see ``needs_paraphrases``)."""
    cfg = Config.of(config)
    if corpus is None:
        return [t for c in run_corpora(cfg) or [cfg.corpus.name] for t in stats_targets(cfg, c, paraphrases)]
    layout = Layout.of(cfg)
    # every declared backbone's tokenizer, but an entry named only as runs[].weights (starting weights, no tokenizer
    # of a run's own)
    weights_only = {r.weights for r in cfg.runs} - {r.backbone for r in cfg.runs} - set(cfg.baselines)
    targets = [layout.token_freq(corpus, b) for b in cfg.backbones if b not in weights_only]
    targets += [layout.tfidf(corpus), layout.rake(corpus, cfg.stats.rake_top_k), layout.stats_summary(corpus)]
    if needs_paraphrases(cfg, corpus) if paraphrases is None else paraphrases:
        targets += [layout.paraphrases(corpus), layout.tfidf_para(corpus)]
    return targets


def all_stats_targets(config: dict | Config) -> list[str]:
    """What ``rule all`` asks of the statistics stage: the inputs the configured runs read (their
    methods' ``Method.requires`` with their arguments: ``sentemb.config.load.run_inputs``, as the
    train rule's ``input:``); with ``stats.corpus_report`` every statistic of every training corpus
    and its summary (``stats_targets``, what ``snakemake stats`` builds); and the configured corpus's
    paraphrases where ``stats.paraphrase.enabled`` is set to true. So a config of SimCSE runs plans
    no RAKE, TF-IDF or paraphrase job."""
    from ..config.load import jobs, run_inputs

    cfg = Config.of(config)
    out: list[str] = list(stats_targets(cfg)) if cfg.stats.corpus_report else []
    corpora = run_corpora(cfg)
    if cfg.stats.paraphrase.enabled and cfg.corpus.name in corpora:
        out.append(Layout.of(cfg).paraphrases(cfg.corpus.name))
    for name, backbone in dict.fromkeys((j.name, j.backbone) for j in jobs(cfg)):
        out.extend(run_inputs(cfg, name, backbone).values())
    return list(dict.fromkeys(out))
