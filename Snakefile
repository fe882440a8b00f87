# tptune: which TP size and which TP comm/compute overlap config make each linear op fastest.
#   snakemake --cores 8 --resources gpus=8 [--configfile my-run.yaml]
#   snakemake -n                     # the plan of jobs
from snakemake.utils import min_version

min_version("9.21")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/plan.smk"
include: "rules/profile.smk"
include: "rules/search.smk"
include: "rules/report.smk"


rule all:
    input:
        f"{RUN_DIR}/report.md",
