# Data acquisition: thin wrappers around `sentemb fetch-*` / `sentemb prepare-corpus` (sentemb.data.fetch).
# Expects LAYOUT (sentemb.config.paths), MIRROR (mirror directory or ""), LOGS and shell_options from common.smk.

import re


rule fetch_corpus:
    priority: PRIORITY["setup"]
    output:
        LAYOUT.raw_corpus(),
    log:
        f"{LOGS}/data/fetch_corpus_{{corpus}}.log",
    benchmark:
        f"benchmarks/data/fetch_corpus_{{corpus}}.tsv"
    wildcard_constraints:
        corpus=re.escape(CFG.corpus.name),
    params:
        repo=CFG.corpus.hub_repo,
        file=CFG.corpus.hub_file,
        opts=lambda wc: shell_options(
            revision=CFG.corpus.revision,
            sha256=CFG.corpus.sha256,
            expected_lines=CFG.corpus.expected_lines,
            mirror=MIRROR,
            mirror_path=CFG.corpus.mirror_path,
        ),
    localrule: True
    retries: 2
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-corpus --output {output:q} --hub-repo {params.repo:q} --hub-file {params.file:q} "
        "{params.opts} > {log:q} 2>&1"


rule prepare_corpus:
    input:
        LAYOUT.raw_corpus(),
    priority: PRIORITY["setup"]
    output:
        corpus=LAYOUT.corpus(),
        summary=LAYOUT.corpus_summary(),
    log:
        f"{LOGS}/data/prepare_corpus_{{corpus}}.log",
    benchmark:
        f"benchmarks/data/prepare_corpus_{{corpus}}.tsv"
    wildcard_constraints:
        corpus=re.escape(CFG.corpus.name),
    params:
        opts=lambda wc: shell_options(
            max_sentences=CFG.corpus.max_sentences, seed=CFG.corpus.sample_seed
        ),
        skip="--skip-bad-lines" if CFG.corpus.skip_bad_lines else "",
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb prepare-corpus --input {input:q} --output {output.corpus:q} {params.opts} {params.skip} "
        "> {log:q} 2>&1"


rule fetch_senteval:
    priority: PRIORITY["setup"]
    output:
        directory(LAYOUT.eval_data("senteval")),
    log:
        f"{LOGS}/data/fetch_senteval.log",
    params:
        opts=lambda wc: shell_options(
            url=CFG.senteval.url,
            sha256=CFG.senteval.sha256,
            mirror=MIRROR,
            mirror_path=CFG.senteval.mirror_path,
        ),
    localrule: True
    retries: 2
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-senteval --output {output:q} {params.opts} > {log:q} 2>&1"


rule fetch_senteval_raw:
    priority: PRIORITY["setup"]
    output:
        directory(LAYOUT.eval_data("senteval-raw")),
    log:
        f"{LOGS}/data/fetch_senteval_raw.log",
    params:
        opts=lambda wc: shell_options(mirror=MIRROR, mirror_path=CFG.senteval.raw_mirror_path),
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-senteval --raw --output {output:q} {params.opts} > {log:q} 2>&1"


rule fetch_model:
    priority: PRIORITY["setup"]
    output:
        directory(LAYOUT.model()),
    log:
        f"{LOGS}/data/fetch_model_{{backbone}}.log",
    wildcard_constraints:
        backbone="|".join(map(re.escape, CFG.backbones)),
    params:
        hub_id=lambda wc: CFG.backbones[wc.backbone].hub_id,
        opts=lambda wc: shell_options(
            revision=CFG.backbones[wc.backbone].revision,
            sha256=CFG.backbones[wc.backbone].sha256,
            mirror=MIRROR,
            mirror_path=CFG.backbones[wc.backbone].mirror_path,
            random_init=CFG.backbones[wc.backbone].random_init,
        ),
    localrule: True
    retries: 2
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-model --output {output:q} --hub-id {params.hub_id:q} {params.opts} > {log:q} 2>&1"


rule fetch_nltk:
    priority: PRIORITY["setup"]
    output:
        directory(LAYOUT.nltk()),
    log:
        f"{LOGS}/data/fetch_nltk.log",
    params:
        opts=lambda wc: shell_options(mirror=MIRROR),
    localrule: True
    retries: 2
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-nltk --output {output:q} {params.opts} > {log:q} 2>&1"


rule prepare_sts_corpus:
    """Built-in corpus `sts-unlabeled` (runs[].corpus): the sentences of STS12-16 (test), STS-B and
    SICK (all splits) from the fetched SentEval tree, as config sts_corpus says (ConSERT's loader by
    default: every line, duplicates kept; sentemb.data.fetch.sts_sentences)."""
    input:
        LAYOUT.eval_data("senteval"),
    priority: PRIORITY["setup"]
    output:
        corpus=LAYOUT.corpus("sts-unlabeled"),
        summary=LAYOUT.corpus_summary("sts-unlabeled"),
    log:
        f"{LOGS}/data/prepare_corpus_sts-unlabeled.log",
    benchmark:
        "benchmarks/data/prepare_corpus_sts-unlabeled.tsv"
    params:
        # config sts_corpus (ConSERT's loader by default); a change makes the corpus again (params trigger)
        # sts_corpus.max_sentences adds its sample's options (none by default: the command as before)
        opts=" ".join(f for f, on in (("--unscored", CFG.sts_corpus.unscored),
                                      ("--keep-duplicates", CFG.sts_corpus.keep_duplicates),
                                      (CFG.sts_corpus.sample_options, bool(CFG.sts_corpus.sample_options))) if on),
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb prepare-sts-corpus --senteval {input:q} --output {output.corpus:q} {params.opts} > {log:q} 2>&1"


# A configured corpus that is itself named `sts-unlabeled` is still made from SentEval.
ruleorder: prepare_sts_corpus > prepare_corpus
