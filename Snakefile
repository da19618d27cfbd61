# sentemb: data -> corpus statistics -> train (method x backbone x seed) -> evaluate -> tables.
# Usage: snakemake --cores 8 results/table1.csv            (config/config.yaml, the paper setting)
#        snakemake --cores 2 --configfile config/demo.yaml  (small CPU demo)
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


rule all:
    input:
        f"{RESULTS}/table1.csv",
        f"{RESULTS}/table1.md",
    default_target: True


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
