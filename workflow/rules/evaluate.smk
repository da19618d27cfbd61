# Stage `evaluate`: STS under the SentEval protocol (methods.md §0) for every trained run.
# Each job reads its resolved settings (rule eval_spec, sentemb.config.load.eval_spec: the only params,
# so a job reruns when its own kind's settings change) and the MLflow settings (rule
# tracking_options, read as `ancient`: a new URI or experiment reruns nothing); the commands get
# paths only (issue 28 §3).


rule tracking_options:
    """Where evaluation jobs record (sentemb.config.load.tracking_options); after the experiment exists."""
    input:
        TRACKING_MARKER if TRACKING else [],
    priority: PRIORITY["setup"]
    output:
        TRACKING_OPTIONS,
    params:
        options=tracking_options(CFG),
    log:
        f"{LOGS}/tracking_options.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.options)


rule eval_spec:
    """The resolved settings of one evaluation job of a run (kind: sts, encode_transfer, transfer)."""
    priority: PRIORITY["setup"]
    output:
        LAYOUT.eval_spec(RUN_DIR),
    params:
        spec=lambda w: eval_spec(CFG, w.kind, w.backbone, name=w.name, seed=int(w.seed)),
    log:
        f"{LOGS}/eval_spec/{{name}}/{{backbone}}/seed{{seed}}/{{kind}}.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.spec)


rule baseline_eval_spec:
    """The resolved settings of one evaluation job of an untrained baseline."""
    priority: PRIORITY["setup"]
    output:
        LAYOUT.eval_spec(BASE_DIR),
    params:
        spec=lambda w: eval_spec(CFG, w.kind, w.backbone, pooler=w.pooler),
    log:
        f"{LOGS}/eval_spec/baseline/{{backbone}}/{{pooler}}/{{kind}}.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.spec)


rule evaluate:
    input:
        model=f"{RUN_DIR}/model",
        data=EVAL_DATA,
        spec=LAYOUT.eval_spec(RUN_DIR, "sts"),
        tracking=ancient(TRACKING_OPTIONS),
    output:
        f"{RUN_DIR}/eval_sts.json",
    params:
        gpu_env=GPU_ENV,
    log:
        f"{LOGS}/evaluate/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/evaluate/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("evaluate", "cpus")
    priority: PRIORITY["evaluate"]
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb evaluate --model {input.model} --data-dir {input.data} --spec {input.spec}"
        " --tracking {input.tracking} --output {output} --quiet > {log} 2>&1"


# SentEval transfer tasks (issue 12 §1) for every run, when evaluation.transfer is set: the sentences
# are encoded in a GPU job (job_resources.evaluate), SentEval's classifier runs in a job that holds no
# GPU (job_resources.classify; issue 26 §4). The vectors in between are temporary.
rule encode_transfer:
    input:
        model=f"{RUN_DIR}/model",
        data=LAYOUT.eval_data("senteval"),
        spec=LAYOUT.eval_spec(RUN_DIR, "encode_transfer"),
    output:
        temp(f"{RUN_DIR}/transfer_features.npz"),
    params:
        gpu_env=GPU_ENV,
    log:
        f"{LOGS}/encode_transfer/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/encode_transfer/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("evaluate", "cpus")
    priority: PRIORITY["encode"]
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb encode-transfer --model {input.model} --data-dir {input.data} --spec {input.spec}"
        " --threads {threads} --output {output} --quiet > {log} 2>&1"


rule evaluate_transfer:
    input:
        features=f"{RUN_DIR}/transfer_features.npz",
        model=f"{RUN_DIR}/model",
        data=LAYOUT.eval_data("senteval"),
        spec=LAYOUT.eval_spec(RUN_DIR, "transfer"),
        tracking=ancient(TRACKING_OPTIONS),
    output:
        f"{RUN_DIR}/eval_transfer.json",
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
        "sentemb evaluate-transfer --features {input.features} --model {input.model} --data-dir {input.data}"
        " --spec {input.spec} --tracking {input.tracking} --workers {threads} --threads 1 --output {output} --quiet"
        " > {log} 2>&1"


# Untrained backbones as they are (config `baselines`, issue 12 §3): rows method=baseline, seed 0.
rule evaluate_baseline:
    input:
        model=LAYOUT.model(),
        data=EVAL_DATA,
        spec=LAYOUT.eval_spec(BASE_DIR, "sts"),
        tracking=ancient(TRACKING_OPTIONS),
    output:
        f"{BASE_DIR}/eval_sts.json",
    params:
        gpu_env=GPU_ENV,
    log:
        f"{LOGS}/evaluate_baseline/{{backbone}}/{{pooler}}.log",
    benchmark:
        f"benchmarks/evaluate_baseline/{{backbone}}/{{pooler}}.tsv"
    threads: res("evaluate", "cpus")
    priority: PRIORITY["evaluate_baseline"]
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb evaluate --model {input.model} --data-dir {input.data} --spec {input.spec}"
        " --tracking {input.tracking} --output {output} --quiet > {log} 2>&1"


rule encode_baseline_transfer:
    input:
        model=LAYOUT.model(),
        data=LAYOUT.eval_data("senteval"),
        spec=LAYOUT.eval_spec(BASE_DIR, "encode_transfer"),
    output:
        temp(f"{BASE_DIR}/transfer_features.npz"),
    params:
        gpu_env=GPU_ENV,
    log:
        f"{LOGS}/encode_baseline_transfer/{{backbone}}/{{pooler}}.log",
    benchmark:
        f"benchmarks/encode_baseline_transfer/{{backbone}}/{{pooler}}.tsv"
    threads: res("evaluate", "cpus")
    priority: PRIORITY["encode"]
    resources:
        gpu=res("evaluate", "gpu"),
        runtime=res("evaluate", "runtime"),
        mem_mb=res("evaluate", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb encode-transfer --model {input.model} --data-dir {input.data} --spec {input.spec}"
        " --threads {threads} --output {output} --quiet > {log} 2>&1"


rule evaluate_baseline_transfer:
    input:
        features=f"{BASE_DIR}/transfer_features.npz",
        model=LAYOUT.model(),
        data=LAYOUT.eval_data("senteval"),
        spec=LAYOUT.eval_spec(BASE_DIR, "transfer"),
        tracking=ancient(TRACKING_OPTIONS),
    output:
        f"{BASE_DIR}/eval_transfer.json",
    log:
        f"{LOGS}/evaluate_baseline_transfer/{{backbone}}/{{pooler}}.log",
    benchmark:
        f"benchmarks/evaluate_baseline_transfer/{{backbone}}/{{pooler}}.tsv"
    threads: res("classify", "cpus")
    resources:
        gpu=res("classify", "gpu"),
        runtime=res("classify", "runtime"),
        mem_mb=res("classify", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb evaluate-transfer --features {input.features} --model {input.model} --data-dir {input.data}"
        " --spec {input.spec} --tracking {input.tracking} --workers {threads} --threads 1 --output {output} --quiet"
        " > {log} 2>&1"
