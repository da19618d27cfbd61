# Stage `report`: tables and figures from the per-run metrics JSON files (issue 12). The HTML report:
#   snakemake --report results/report.html   (after the targets are built)
# Figures: PNG (in the report), SVG and PDF, drawn with sentemb.report.style (issue 29 §2).

from sentemb.config.studies import study_train_inputs


rule table1:
    input:
        eval_outputs(),
        baseline_outputs(),
    output:
        csv=report(LAYOUT.table("table1", "csv"), caption="../report/table1.rst", category="Tables"),
        md=LAYOUT.table("table1", "md"),
    log:
        f"{LOGS}/table1.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb table --inputs {input} --output {output.csv} --markdown {output.md} > {log} 2>&1"


rule table_transfer:
    input:
        transfer_outputs(),
    output:
        csv=report(LAYOUT.table("table_transfer", "csv"), caption="../report/table_transfer.rst", category="Tables"),
        md=LAYOUT.table("table_transfer", "md"),
    log:
        f"{LOGS}/table_transfer.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb table-transfer --inputs {input} --output {output.csv} --markdown {output.md} > {log} 2>&1"


if CFG.published:

    rule published:
        """paper_results' published rows plus the config's own (config key `published`, e.g. a plug-in's
        paper), merged: what table_paper, the studies and the model cards read."""
        input:
            PAPER_RESULTS,
        priority: PRIORITY["setup"]
        output:
            PUBLISHED,
        params:
            rows=CFG.published,
        localrule: True
        run:
            from sentemb.report.paper import write_published

            write_published(input[0], params.rows, output[0])


rule table_paper:
    input:
        sts=eval_outputs() + baseline_outputs(),
        transfer=transfer_outputs(),
        train=train_summaries(),
        published=PUBLISHED,
    output:
        csv=report(LAYOUT.table("table_paper", "csv"), caption="../report/table_paper.rst", category="Tables"),
        md=LAYOUT.table("table_paper", "md"),
    log:
        f"{LOGS}/table_paper.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb table-paper --sts {input.sts} --transfer {input.transfer} --train {input.train}"
        " --published {input.published}"
        " --output {output.csv} --markdown {output.md} > {log} 2>&1"


rule figures:
    input:
        evals=eval_outputs() + baseline_outputs(),
        train=train_summaries(),
        paper=LAYOUT.table("table_paper", "csv"),
    output:
        **{
            f"{f}_png": report(LAYOUT.figure(f, "png"), caption=f"../report/fig_{f}.rst", category="Figures")
            for f in FIGURES
        },
        **{f"{f}_svg": LAYOUT.figure(f, "svg") for f in FIGURES},
        **{f"{f}_pdf": LAYOUT.figure(f, "pdf") for f in FIGURES},
    params:
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        f"{LOGS}/figures.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb figures --evals {input.evals} --train {input.train} --paper {input.paper}"
        " --output-dir {params.outdir} > {log} 2>&1"


# Studies (issue 21): one table and one figure per config `studies` entry, from its points' results.
rule study_spec:
    """The expanded study (its points and the runs they map to), what `sentemb study` reads."""
    priority: PRIORITY["setup"]
    output:
        LAYOUT.study(ext="spec.json"),
    params:
        spec=lambda w: study_spec(config, w.study),
    log:
        f"{LOGS}/studies/{{study}}.spec.log",
    localrule: True
    run:
        from sentemb.utils import write_json

        write_json(output[0], params.spec)


rule study:
    input:
        spec=LAYOUT.study(ext="spec.json"),
        results=lambda w: study_inputs(CFG, STUDIES[w.study]),
        train=lambda w: study_train_inputs(CFG, STUDIES[w.study]),  # the points' dev curves
        published=PUBLISHED,
    output:
        csv=report(LAYOUT.study(ext="csv"), caption="../report/study.rst", category="Studies",
                   subcategory="{study}"),
        md=LAYOUT.study(ext="md"),
        png=report(LAYOUT.study(ext="png"), caption="../report/study.rst", category="Studies",
                   subcategory="{study}"),
        svg=LAYOUT.study(ext="svg"),
        pdf=LAYOUT.study(ext="pdf"),
    log:
        f"{LOGS}/studies/{{study}}.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb study --spec {input.spec} --inputs {input.results} --train {input.train}"
        " --published {input.published} --output {output.csv} --markdown {output.md} --figure {output.png}"
        " > {log} 2>&1"


rule studies:
    """Every study's table and figure (`snakemake studies`)."""
    input:
        STUDY_TARGETS,


rule report_all:
    """Every table and figure (`snakemake report_all`, then `snakemake --report results/report.html`)."""
    input:
        LAYOUT.table("table1", "csv"),
        REPORT_TARGETS,
