# Stage `train`: one job per run name x backbone x seed.


rule init_tracking:
    """Create the MLflow store and experiment once, before parallel jobs (a SQLite store created
    concurrently by several jobs fails)."""
    priority: PRIORITY["setup"]
    output:
        TRACKING_MARKER,
    params:
        experiment=CFG.experiment,
        uri=f"--tracking-uri {CFG.tracking.uri}" if CFG.tracking.uri else "",
    log:
        f"{LOGS}/init_tracking.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb init-tracking --experiment {params.experiment} {params.uri} --output {output} > {log} 2>&1"


rule run_config:
    """The resolved settings of one run (what `sentemb train` reads and MLflow records). Its only
    parameter is the run's fingerprint (sentemb.config.settings.fingerprint: the settings that change the
    weights), so a logging knob reruns neither it nor the training."""
    priority: PRIORITY["setup"]
    output:
        f"{RUN_DIR}/run_config.json",
    params:
        fingerprint=lambda w: fingerprint(run_of(w)),
    log:
        f"{LOGS}/run_config/{{name}}/{{backbone}}/seed{{seed}}.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], run_of(wildcards))


rule run_options:
    """Today's weight-free settings of the run (sentemb.config.settings.run_options: log_steps, save_steps,
    threads, device, chunking, tracking), applied by `sentemb train --options`; `ancient` as the
    train rule's input, so rewriting it reruns no training."""
    priority: PRIORITY["setup"]
    output:
        f"{RUN_DIR}/run_options.json",
    params:
        options=lambda w: run_options(run_of(w)),
    log:
        f"{LOGS}/run_options/{{name}}/{{backbone}}/seed{{seed}}.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.options)


rule train:
    input:
        unpack(method_inputs),
        run=f"{RUN_DIR}/run_config.json",
        options=ancient(f"{RUN_DIR}/run_options.json"),
        # runs[].weights: the entry the encoder starts from; its tokenizer is checked against the backbone's
        model=lambda w: resolved(w).paths["model"],
        backbone_model=lambda w: resolved(w).paths.get("backbone_model", []),
        corpus=lambda w: resolved(w).paths["corpus"],
        tokens=lambda w: resolved(w).paths.get("tokens", []),
        senteval=LAYOUT.eval_data("senteval"),
        # a new tracking URI reruns no training. The experiment's marker stays the input (not the
        # MLflow settings file, which would spare training a new experiment or tracking.enabled):
        # Snakemake reruns a job whose set of inputs changed, so moving it reruns every trained job once
        tracking=ancient(TRACKING_MARKER) if TRACKING else [],
    output:
        model=directory(f"{RUN_DIR}/model"),
        summary=f"{RUN_DIR}/train.json",
    params:
        gpu_env=train_gpu_env,
        outdir=lambda wildcards, output: os.path.dirname(output.summary),
    log:
        f"{LOGS}/train/{{name}}/{{backbone}}/seed{{seed}}.log",
    benchmark:
        f"benchmarks/train/{{name}}/{{backbone}}/seed{{seed}}.tsv"
    threads: res("train", "cpus")
    priority: PRIORITY["train"]
    resources:
        gpu=train_gpus,
        runtime=res("train", "runtime"),
        mem_mb=res("train", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb train --run-config {input.run} --options {input.options} --output-dir {params.outdir} "
        "--quiet > {log} 2>&1"
