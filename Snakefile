# sentemb: data -> corpus statistics -> train (method x backbone x seed) -> evaluate -> tables.
# Usage: snakemake --cores 8 results/table1.csv            (config/config.yaml, the paper setting)
#        snakemake --cores 2 --configfile=config/demo.yaml results/table1.csv  (small CPU demo;
#        note the '=': a bare --configfile would swallow the target as a second config file)
from snakemake.utils import min_version

min_version("9.0")


# The paper configuration is the default; a --configfile replaces it rather than being merged into it
# (a merge would add the paper's backbones to every other config).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/cards.smk"


rule all:
    input:
        LAYOUT.table("table1", "csv"),
        LAYOUT.table("table1", "md"),
        REPORT_TARGETS,
        ALL_STATS_TARGETS,
        card_outputs(),
    default_target: True


rule stats:
    """All corpus statistics of every corpus some run trains on (`snakemake stats`)."""
    input:
        STATS_TARGETS,
