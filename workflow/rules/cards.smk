# Stage `model_card` (issue 29 §1): every exported model carries a model card (model/README.md) with
# the run's results (sentemb.report.model_card). `sentemb train` already wrote the card without results when
# it exported the model; this rule rewrites it once the run's evaluations exist. Its declared output
# is <run dir>/model_card.json: model/ stays the train rule's directory output, whose age Snakemake
# reads from model/.snakemake_timestamp, so the card written into it makes no rule look outdated.
# Its input functions (card_evaluations, card_dataset, card_outputs) are at the end of common.smk.


rule model_card:
    """The run's model card with its results (`sentemb model-card`): model/README.md, rewritten;
    model_card.json records what was written."""
    input:
        model=f"{RUN_DIR}/model",
        run=f"{RUN_DIR}/run_config.json",
        train=f"{RUN_DIR}/train.json",
        evaluations=card_evaluations,
        published=PUBLISHED,
        # the model the encoder started from (runs[].weights, else the backbone), whose card the card cites
        backbone=lambda w: resolved(w).paths["model"],
    output:
        f"{RUN_DIR}/model_card.json",
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output[0]),
        dataset=card_dataset,
    log:
        f"{LOGS}/model_card/{{name}}/{{backbone}}/seed{{seed}}.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb model-card --run-dir {params.run_dir} --paper-results {input.published} {params.dataset}"
        " --output {output} > {log} 2>&1"


rule model_cards:
    """Every run's model card (`snakemake model_cards`)."""
    input:
        card_outputs(),
