# Stage `pretrain`: a method's pretraining stage (Method.pretrain_stage), once per method x backbone (not
# per seed or run). Settings: methods.<method>.pretrain. A run whose method requires `pretrained`
# reads results/pretrain/{method}/{backbone}/model (sentemb.config.paths, sentemb.config.load.input_path), so its training jobs
# depend on this rule.
from sentemb.train.pretrain import resolve_pretrain

PRETRAIN_DIR = LAYOUT.pretrain_dir()


rule pretrain_config:
    """The resolved settings of one pretraining stage (what `sentemb pretrain` reads and MLflow records)."""
    priority: PRIORITY["setup"]
    output:
        f"{PRETRAIN_DIR}/pretrain_config.json",
    params:
        fingerprint=lambda w: fingerprint(resolve_pretrain(CFG, w.method, w.backbone)),
    log:
        f"{LOGS}/pretrain_config/{{method}}/{{backbone}}.log",
    wildcard_constraints:
        method=r"[A-Za-z0-9_-]+",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], resolve_pretrain(CFG, wildcards.method, wildcards.backbone).to_dict())


rule pretrain_options:
    """The stage's weight-free settings (as rule run_options), `ancient` for rule pretrain."""
    priority: PRIORITY["setup"]
    output:
        f"{PRETRAIN_DIR}/pretrain_options.json",
    params:
        options=lambda w: run_options(resolve_pretrain(CFG, w.method, w.backbone)),
    log:
        f"{LOGS}/pretrain_options/{{method}}/{{backbone}}.log",
    wildcard_constraints:
        method=r"[A-Za-z0-9_-]+",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.options)


rule pretrain:
    input:
        run=f"{PRETRAIN_DIR}/pretrain_config.json",
        options=ancient(f"{PRETRAIN_DIR}/pretrain_options.json"),
        model=LAYOUT.model(),
        corpus=lambda w: resolve_pretrain(CFG, w.method, w.backbone).paths["corpus"],
        tokens=lambda w: resolve_pretrain(CFG, w.method, w.backbone).paths.get("tokens", []),
        # a new tracking URI reruns no training. The experiment's marker stays the input (not the
        # MLflow settings file, which would spare training a new experiment or tracking.enabled):
        # Snakemake reruns a job whose set of inputs changed, so moving it reruns every trained job once
        tracking=ancient(TRACKING_MARKER) if TRACKING else [],
    output:
        model=directory(f"{PRETRAIN_DIR}/model"),
        summary=f"{PRETRAIN_DIR}/train.json",
    params:
        gpu_env=lambda w: GPU_ENV + (f"SENTEMB_JOB_GPUS={pretrain_devices(w)} " if GPU_ENV and pretrain_devices(w) > 1 else ""),
        outdir=lambda wildcards, output: os.path.dirname(output.summary),
    wildcard_constraints:
        method=r"[A-Za-z0-9_-]+",
    log:
        f"{LOGS}/pretrain/{{method}}/{{backbone}}.log",
    benchmark:
        f"benchmarks/pretrain/{{method}}/{{backbone}}.tsv"
    threads: res("pretrain", "cpus")
    priority: PRIORITY["pretrain"]
    resources:
        gpu=lambda w: res("pretrain", "gpu") * pretrain_devices(w),
        runtime=res("pretrain", "runtime"),
        mem_mb=res("pretrain", "mem_mb"),
    conda:
        "../envs/sentemb.yaml"
    shell:
        "{params.gpu_env}sentemb pretrain --run-config {input.run} --options {input.options} --output-dir {params.outdir} "
        "--quiet > {log} 2>&1"
