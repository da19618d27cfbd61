# Stage `evaluate`: STS under the SentEval protocol (methods.md §0) for every trained run.


rule evaluate:
    input:
        model=f"{RUN_DIR}/model",
        data=EVAL_DATA,
        tracking=TRACKING_MARKER if TRACKING else [],
    output:
        f"{RUN_DIR}/eval_sts.json",
    params:
        gpu_env=GPU_ENV,
        pooler=eval_pooler,
        tasks=",".join(CFG.evaluation.tasks),
        setting=CFG.evaluation.setting,
        batch_size=CFG.evaluation.batch_size,
        precision=CFG.evaluation.precision,
        method=lambda w: run_of(w)["method"],
        track=tracking_opts(),
    log:
        f"{LOGS}/evaluate/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/evaluate/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("evaluate", "cpus")
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb evaluate --model {input.model} --pooler {params.pooler} --data-dir {input.data}"
        " --tasks {params.tasks} --setting {params.setting} --batch-size {params.batch_size}"
        " --precision {params.precision}"
        " --output {output} --quiet --run-meta name={wildcards.name} --run-meta method={params.method}"
        " --run-meta backbone={wildcards.backbone} --run-meta seed={wildcards.seed}"
        " --run-name eval/{wildcards.name}/{wildcards.backbone}/seed{wildcards.seed} {params.track} > {log} 2>&1"


# SentEval transfer tasks (issue 12 §1) for every run, when evaluation.transfer is set: the sentences
# are encoded in a GPU job (job_resources.evaluate), SentEval's classifier runs in a job that holds no
# GPU (job_resources.classify; issue 26 §4). The vectors in between are temporary.
rule encode_transfer:
    input:
        model=f"{RUN_DIR}/model",
        data=LAYOUT.eval_data("senteval"),
    output:
        temp(f"{RUN_DIR}/transfer_features.npz"),
    params:
        gpu_env=GPU_ENV,
        pooler=eval_pooler,
        tasks=",".join(CFG.evaluation.transfer_tasks),
        batch_size=CFG.evaluation.batch_size,
        precision=CFG.evaluation.precision,
    log:
        f"{LOGS}/encode_transfer/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/encode_transfer/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("evaluate", "cpus")
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb encode-transfer --model {input.model} --pooler {params.pooler} --data-dir {input.data}"
        " --tasks {params.tasks} --batch-size {params.batch_size} --precision {params.precision} --threads {threads}"
        " --output {output} --quiet > {log} 2>&1"


rule evaluate_transfer:
    input:
        features=f"{RUN_DIR}/transfer_features.npz",
        model=f"{RUN_DIR}/model",
        data=LAYOUT.eval_data("senteval"),
        tracking=TRACKING_MARKER if TRACKING else [],
    output:
        f"{RUN_DIR}/eval_transfer.json",
    params:
        pooler=eval_pooler,
        tasks=",".join(CFG.evaluation.transfer_tasks),
        mrpc=CFG.evaluation.mrpc_features,
        classifier=CFG.evaluation.transfer_classifier,
        method=lambda w: run_of(w)["method"],
        track=tracking_opts(),
    log:
        f"{LOGS}/evaluate_transfer/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/evaluate_transfer/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("classify", "cpus")
    resources:
        gpu=res("classify", "gpu"),
        runtime=res("classify", "runtime"),
        mem_mb=res("classify", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb evaluate-transfer --features {input.features} --model {input.model} --pooler {params.pooler}"
        " --data-dir {input.data} --tasks {params.tasks} --mrpc-features {params.mrpc} --classifier {params.classifier}"
        " --workers {threads} --threads 1"
        " --output {output} --quiet --run-meta name={wildcards.name} --run-meta method={params.method}"
        " --run-meta backbone={wildcards.backbone} --run-meta seed={wildcards.seed}"
        " --run-name transfer/{wildcards.name}/{wildcards.backbone}/seed{wildcards.seed} {params.track} > {log} 2>&1"


# Untrained backbones as they are (config `baselines`, issue 12 §3): rows method=baseline, seed 0.
rule evaluate_baseline:
    input:
        model=LAYOUT.model(),
        data=EVAL_DATA,
        tracking=TRACKING_MARKER if TRACKING else [],
    output:
        f"{BASE_DIR}/eval_sts.json",
    params:
        gpu_env=GPU_ENV,
        tasks=",".join(CFG.evaluation.tasks),
        setting=CFG.evaluation.setting,
        batch_size=CFG.evaluation.batch_size,
        precision=CFG.evaluation.precision,
        track=tracking_opts(),
    log:
        f"{LOGS}/evaluate_baseline/{{backbone}}/{{pooler}}.log",
    threads: res("evaluate", "cpus")
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb evaluate --model {input.model} --pooler {wildcards.pooler} --data-dir {input.data}"
        " --tasks {params.tasks} --setting {params.setting} --batch-size {params.batch_size}"
        " --precision {params.precision} --output {output} --quiet"
        " --run-meta name=untrained-{wildcards.pooler} --run-meta method=baseline"
        " --run-meta backbone={wildcards.backbone} --run-meta seed=0 --tag rule=evaluate-baseline"
        " --run-name baseline/{wildcards.backbone}/{wildcards.pooler} {params.track} > {log} 2>&1"


rule encode_baseline_transfer:
    input:
        model=LAYOUT.model(),
        data=LAYOUT.eval_data("senteval"),
    output:
        temp(f"{BASE_DIR}/transfer_features.npz"),
    params:
        gpu_env=GPU_ENV,
        tasks=",".join(CFG.evaluation.transfer_tasks),
        batch_size=CFG.evaluation.batch_size,
        precision=CFG.evaluation.precision,
    log:
        f"{LOGS}/encode_baseline_transfer/{{backbone}}/{{pooler}}.log",
    threads: res("evaluate", "cpus")
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb encode-transfer --model {input.model} --pooler {wildcards.pooler} --data-dir {input.data}"
        " --tasks {params.tasks} --batch-size {params.batch_size} --precision {params.precision} --threads {threads}"
        " --output {output} --quiet > {log} 2>&1"


rule evaluate_baseline_transfer:
    input:
        features=f"{BASE_DIR}/transfer_features.npz",
        model=LAYOUT.model(),
        data=LAYOUT.eval_data("senteval"),
        tracking=TRACKING_MARKER if TRACKING else [],
    output:
        f"{BASE_DIR}/eval_transfer.json",
    params:
        tasks=",".join(CFG.evaluation.transfer_tasks),
        mrpc=CFG.evaluation.mrpc_features,
        classifier=CFG.evaluation.transfer_classifier,
        track=tracking_opts(),
    log:
        f"{LOGS}/evaluate_baseline_transfer/{{backbone}}/{{pooler}}.log",
    threads: res("classify", "cpus")
    resources:
        gpu=res("classify", "gpu"),
        runtime=res("classify", "runtime"),
        mem_mb=res("classify", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb evaluate-transfer --features {input.features} --model {input.model} --pooler {wildcards.pooler}"
        " --data-dir {input.data} --tasks {params.tasks} --mrpc-features {params.mrpc} --classifier {params.classifier}"
        " --workers {threads} --threads 1 --output {output} --quiet"
        " --run-meta name=untrained-{wildcards.pooler} --run-meta method=baseline"
        " --run-meta backbone={wildcards.backbone} --run-meta seed=0 --tag rule=evaluate-baseline-transfer"
        " --run-name baseline-transfer/{wildcards.backbone}/{wildcards.pooler} {params.track} > {log} 2>&1"
