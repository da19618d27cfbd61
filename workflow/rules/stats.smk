# Stage `stats`: corpus statistics computed once per corpus; training jobs only read them
# (shared/docs/methods.md §1-3). Thin rules around `sentemb stats-*` / `sentemb paraphrase*`
# (sentemb.stats). Expects LAYOUT, LOGS, MIRROR, shell_options and res() from common.smk.
# Outputs (sentemb.config.paths), under results/stats/<corpus>/:
#   token_freq.<backbone>.parquet   token frequency per backbone tokenizer (SARCSE)
#   tokens.<backbone>/              the corpus's token ids under that tokenizer (training reads them)
#   tfidf.parquet                   TF-IDF over the corpus (+ paraphrases if stats.tfidf_with_paraphrases)
#   tfidf_para.parquet              TF-IDF over corpus + paraphrases (UNA's second vocabulary)
#   rake_top<k>.parquet             RAKE top-k phrases per line (PaSeR; k = stats.rake_top_k)
#   paraphrase/shard<i>of<n>.jsonl  paraphrase shards (GPU jobs, resumable), merged into
#   paraphrases.txt                 one paraphrase per corpus line (UNA positives)
#   summary.md / summary.json       human-readable summary for the report

import shlex

from sentemb.stats.workflow import all_stats_targets, needs_paraphrases, stats_settings, stats_targets

STATS = stats_settings(CFG)  # config section `stats` with defaults (sentemb.stats.workflow.stats_settings)
_PARA = STATS["paraphrase"]
PARA_MODEL = _PARA["model"]
PARA_DIR = LAYOUT.paraphraser(_PARA["model_name"])
PARA_SHARDS = int(_PARA["shards"])
RAKE_TOP_K = int(STATS["rake_top_k"])
CORPUS_TXT = LAYOUT.corpus()
# All statistics of every corpus some run trains on (runs[].corpus), for `rule stats` (paraphrases
# only for a corpus that needs them).
STATS_TARGETS = stats_targets(CFG)
# What `rule all` asks: the statistics the configured runs read (Method.requires), all of STATS_TARGETS
# only with stats.corpus_report (sentemb.stats.workflow.all_stats_targets).
ALL_STATS_TARGETS = all_stats_targets(CFG)

rule fetch_paraphraser:
    """The seq2seq paraphrase model (default tuner007/pegasus_paraphrase), via `sentemb fetch-model`."""
    priority: PRIORITY["setup"]
    output:
        directory(PARA_DIR),
    log:
        f"{LOGS}/data/fetch_paraphraser.log",
    params:
        hub_id=PARA_MODEL["hub_id"],
        opts=lambda wc: shell_options(
            revision=PARA_MODEL["revision"],
            sha256=PARA_MODEL["sha256"],
            mirror=MIRROR,
            mirror_path=PARA_MODEL["mirror_path"],
            random_init=PARA_MODEL["random_init"],
        ),
    localrule: True
    retries: 2
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb fetch-model --output {output:q} --hub-id {params.hub_id:q} {params.opts} > {log:q} 2>&1"


rule stats_token_freq:
    input:
        corpus=CORPUS_TXT,
        model=LAYOUT.model(),
    output:
        LAYOUT.token_freq(),
    log:
        f"{LOGS}/stats/{{corpus}}/token_freq.{{backbone}}.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/token_freq.{{backbone}}.tsv"
    threads: res("stats", "cpus")
    priority: PRIORITY["stats"]
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "RAYON_NUM_THREADS={threads} sentemb stats-freq --corpus {input.corpus:q} --tokenizer {input.model:q} "
        "--output {output:q} > {log:q} 2>&1"


rule tokenize:
    """The corpus tokenized once per backbone tokenizer (memory-mapped ids; training steps read it
    instead of running the tokenizer: sentemb.data.tokens)."""
    input:
        corpus=CORPUS_TXT,
        model=LAYOUT.model(),
    output:
        directory(LAYOUT.tokens()),
    log:
        f"{LOGS}/stats/{{corpus}}/tokens.{{backbone}}.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/tokens.{{backbone}}.tsv"
    threads: res("stats", "cpus")
    priority: PRIORITY["stats"]
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "RAYON_NUM_THREADS={threads} sentemb tokenize-corpus --corpus {input.corpus:q} --model {input.model:q} "
        "--output {output:q} > {log:q} 2>&1"


rule stats_tfidf:
    input:
        corpus=CORPUS_TXT,
        extra=lambda wc: [LAYOUT.paraphrases(wc.corpus)] if STATS["tfidf_with_paraphrases"] else [],
    output:
        LAYOUT.tfidf(),
    log:
        f"{LOGS}/stats/{{corpus}}/tfidf.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/tfidf.tsv"
    threads: res("stats", "cpus")
    priority: PRIORITY["stats"]
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb stats-tfidf --corpus {input.corpus:q} --extra {input.extra:q} --workers {threads} "
        "--output {output:q} > {log:q} 2>&1"


rule stats_tfidf_para:
    input:
        corpus=CORPUS_TXT,
        paraphrases=LAYOUT.paraphrases(),
    output:
        LAYOUT.tfidf_para(),
    log:
        f"{LOGS}/stats/{{corpus}}/tfidf_para.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/tfidf_para.tsv"
    threads: res("stats", "cpus")
    priority: PRIORITY["stats"]
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb stats-tfidf --corpus {input.corpus:q} --extra {input.paraphrases:q} --workers {threads} "
        "--output {output:q} > {log:q} 2>&1"


rule stats_rake:
    input:
        corpus=CORPUS_TXT,
        nltk=LAYOUT.nltk(),
    output:
        LAYOUT.rake(),
    wildcard_constraints:
        k=r"\d+",
    log:
        f"{LOGS}/stats/{{corpus}}/rake_top{{k}}.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/rake_top{{k}}.tsv"
    threads: res("stats", "cpus")
    priority: PRIORITY["stats"]
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb stats-rake --corpus {input.corpus:q} --nltk-data {input.nltk:q} --top-k {wildcards.k} "
        "--workers {threads} --output {output:q} > {log:q} 2>&1"


rule paraphrase_shard:
    """One shard (lines i, i+n, ...) of the paraphrases; a killed job resumes from its checkpoint
    (<output>.ckpt.jsonl, kept by Snakemake's cleanup since it is not a declared output)."""
    input:
        corpus=CORPUS_TXT,
        model=PARA_DIR,
    priority: PRIORITY["stats"]
    output:
        LAYOUT.paraphrase_shard(),
    wildcard_constraints:
        shard=r"\d+",
        nshards=r"\d+",
    log:
        f"{LOGS}/stats/{{corpus}}/paraphrase_shard{{shard}}of{{nshards}}.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/paraphrase_shard{{shard}}of{{nshards}}.tsv"
    params:
        # stats.paraphrase.precision fp32 through the environment (sentemb paraphrase's --precision default):
        # the default leaves the command and the params as they were, so no finished shard is rerun
        gpu_env=GPU_ENV + ("SENTEMB_PARAPHRASE_PRECISION=fp32 " if _PARA["precision"] == "fp32" else ""),
        batch_size=_PARA["batch_size"],
        num_beams=_PARA["num_beams"],
        max_length=_PARA["max_length"],
    threads: res("paraphrase", "cpus")
    resources:
        gpu=res("paraphrase", "gpu"),
        runtime=res("paraphrase", "runtime"),
        mem_mb=res("paraphrase", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb paraphrase --corpus {input.corpus:q} --model {input.model:q} --shard {wildcards.shard} "
        "--num-shards {wildcards.nshards} --batch-size {params.batch_size} --num-beams {params.num_beams} "
        "--max-length {params.max_length} --threads {threads} --output {output:q} >> {log:q} 2>&1"


rule paraphrase_merge:
    input:
        corpus=CORPUS_TXT,
        shards=expand(LAYOUT.paraphrase_shard(nshards=PARA_SHARDS), shard=range(PARA_SHARDS), allow_missing=True),
    priority: PRIORITY["stats"]
    output:
        LAYOUT.paraphrases(),
    log:
        f"{LOGS}/stats/{{corpus}}/paraphrase_merge.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/paraphrase_merge.tsv"
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb paraphrase-merge --inputs {input.shards:q} --corpus {input.corpus:q} --output {output:q} "
        "> {log:q} 2>&1"


rule stats_summary:
    input:
        corpus=CORPUS_TXT,
        freq=expand(LAYOUT.token_freq(), backbone=CFG.backbones, allow_missing=True),
        tfidf=LAYOUT.tfidf(),
        rake=LAYOUT.rake(top_k=RAKE_TOP_K),
        paraphrases=lambda wc: [LAYOUT.paraphrases(wc.corpus)] if needs_paraphrases(CFG, wc.corpus) else [],
    output:
        md=report(LAYOUT.stats_summary(ext="md"), caption="../report/stats_summary.rst", category="Corpus statistics"),
        json=LAYOUT.stats_summary(ext="json"),
    log:
        f"{LOGS}/stats/{{corpus}}/summary.log",
    benchmark:
        f"benchmarks/stats/{{corpus}}/summary.tsv"
    params:
        para=lambda wc, input: f"--paraphrases {shlex.quote(input.paraphrases[0])}" if input.paraphrases else "",
        title=lambda wc: f"Corpus statistics: {wc.corpus}",
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb stats-summary --corpus {input.corpus:q} --freq {input.freq:q} --tfidf {input.tfidf:q} "
        "--rake {input.rake:q} {params.para} --title {params.title:q} --output {output.md:q} > {log:q} 2>&1"


rule make_input:
    """An input kind a plug-in method registers (sentemb.stats.inputs.register_input), made by its own
    build from the corpus and the backbone's tokenizer; ctx.inputs[kind] is this folder."""
    input:
        corpus=CORPUS_TXT,
        model=LAYOUT.model(),
    priority: PRIORITY["stats"]
    output:
        directory(f"{LAYOUT.stats_dir()}/inputs/{{kind}}.{{backbone}}"),
    params:
        modules=lambda wc: " ".join(f"--method-module {shlex.quote(m)}" for m in CFG.method_modules),
    log:
        f"{LOGS}/stats/{{corpus}}/inputs/{{kind}}.{{backbone}}.log",
    wildcard_constraints:
        kind=r"[A-Za-z0-9_-]+",
    threads: res("stats", "cpus")
    resources:
        runtime=res("stats", "runtime"),
        mem_mb=res("stats", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb make-input {wildcards.kind} --corpus {input.corpus:q} --model {input.model:q} {params.modules} "
        "--output {output:q} > {log:q} 2>&1"
