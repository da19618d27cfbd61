"""The statistics stage's settings as the workflow reads them (``workflow/rules/stats.smk``): the
config section ``stats`` with defaults, the corpora some run trains on, which need paraphrases, and
every statistic's path. Apart from ``sentemb.stats`` (the writers), since these read the validated
config: the writers do not depend on the config module (no import cycle through ``sentemb.stats.inputs``)."""

from __future__ import annotations

from ..config.paths import Layout


def stats_settings(config: dict) -> dict:
    """The config section ``stats`` with defaults filled in (used by workflow/rules/stats.smk).

    ``paraphrase.enabled`` is resolved to a bool: if unset (null), paraphrases are made when
    ``tfidf_with_paraphrases`` is set or a configured run's method lists "paraphrases" or
    "tfidf_para" in ``Method.requires(args)``. ``paraphrase.model_name`` names the model's directory.
    """
    from ..config.settings import StatsSettings

    s = StatsSettings.from_dict(config["stats"]).to_dict()
    para = s["paraphrase"]
    para["model_name"] = para["model"]["hub_id"].rstrip("/").split("/")[-1]
    if para["enabled"] is None:
        from ..config.load import run_requires

        needed = {n for r in config["runs"] for n in run_requires(config, r)}
        para["enabled"] = bool(s["tfidf_with_paraphrases"] or needed & {"paraphrases", "tfidf_para"})
    s["paraphrase"] = para
    return s


def run_corpora(config: dict) -> list[str]:
    """The corpora some run trains on (``runs[].corpus``, default ``corpus.name``), in first-use
    order; statistics are computed once for each of them."""
    from ..config.load import corpus_of

    out: list[str] = []
    for r in config["runs"]:
        c = corpus_of(config, r)
        if c not in out:
            out.append(c)
    return out


def needs_paraphrases(config: dict, corpus: str) -> bool:
    """Paraphrases of ``corpus``: when ``tfidf_with_paraphrases`` is set or a run on this corpus
    requires them; ``stats.paraphrase.enabled`` (true/false) decides for the configured corpus
    (``corpus.name``) only, so a built-in corpus of one run (sts-unlabeled) is never paraphrased
    for nothing."""
    from ..config.load import corpus_of, run_requires

    explicit = config["stats"]["paraphrase"]["enabled"]
    if explicit is not None and corpus == config["corpus"]["name"]:
        return bool(explicit)
    if config["stats"]["tfidf_with_paraphrases"]:
        return True
    needed = {n for r in config["runs"] if corpus_of(config, r) == corpus for n in run_requires(config, r)}
    return bool(needed & {"paraphrases", "tfidf_para"})


def stats_targets(config: dict, corpus: str | None = None, paraphrases: bool | None = None) -> list[str]:
    """Paths of all statistics of ``corpus`` for ``rule all``; without ``corpus``, of every corpus
    some run uses (``run_corpora``). The paraphrase outputs only if ``paraphrases`` (default: when
    that corpus needs them, see ``needs_paraphrases``)."""
    if corpus is None:
        return [t for c in run_corpora(config) or [config["corpus"]["name"]]
                for t in stats_targets(config, c, paraphrases)]
    layout = Layout.of(config)
    targets = [layout.token_freq(corpus, b) for b in config["backbones"]]
    targets += [layout.tfidf(corpus), layout.rake(corpus, stats_settings(config)["rake_top_k"]),
                layout.stats_summary(corpus)]
    if needs_paraphrases(config, corpus) if paraphrases is None else paraphrases:
        targets += [layout.paraphrases(corpus), layout.tfidf_para(corpus)]
    return targets
