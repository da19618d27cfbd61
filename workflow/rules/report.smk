# Stage `report`: tables (and, later, figures) from the per-run metrics JSON files.


rule table1:
    input:
        eval_outputs(),
    output:
        csv=report(f"{RESULTS}/table1.csv", caption="../report/table1.rst", category="Tables"),
        md=f"{RESULTS}/table1.md",
    log:
        f"{LOGS}/table1.log",
    localrule: True
    conda:
        "../envs/sentemb.yaml"
    shell:
        "sentemb table --inputs {input} --output {output.csv} --markdown {output.md} > {log} 2>&1"
