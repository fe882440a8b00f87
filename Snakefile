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


# Every measured case is a target too, so deleting one case's outputs reruns that case (and the
# tables and report built on it); the case list comes from the searches, joined in one checkpoint.
rule all:
    input:
        f"{RUN_DIR}/report.md",
        all_case_runs,
        all_case_analysis,
