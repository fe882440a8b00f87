# tptune: which TP size and which TP comm/compute overlap config make each linear op fastest.
#   snakemake --cores 8 --resources gpus=8 [--configfile my-run.yaml]
#   snakemake -n                     # the plan of jobs
from snakemake.utils import min_version

min_version("9.21")


configfile: "config/config.yaml"


# Snakemake's default prefix, and fd 3 on Snakemake's own stderr: a job whose log cannot be written (a full
# disk) still says why on the console (tptune.cli.main._say), and a measuring job says the run's progress
# there (tptune.cli.progress) while its own output goes to its log.
shell.prefix("set -euo pipefail; exec 3>&2; export TPTUNE_CONSOLE_FD=3; ")


# Bookkeeping runs where snakemake runs (under Slurm: the submitting host), never as a cluster job;
# only measurement and trace analysis are submitted.
localrules:
    model,
    plan,
    search_step,
    search_result,
    tp_results,
    tp_point,
    tp_step,
    op_final,
    searches_done,
    collect,
    decide,
    packing_plan,
    packing_decide,
    report,
    check_run,
    all,


include: "rules/common.smk"
include: "rules/plan.smk"
include: "rules/calibrate.smk"
include: "rules/analyze.smk"
include: "rules/search.smk"
include: "rules/packing.smk"
include: "rules/report.smk"


# Every session's analysis is a target too; the session list comes from the searches, joined in
# one checkpoint. A session is re-measured by deleting (or snakemake -R) its search-step or
# TP-point file: a setting is re-measured with the settings it is compared to, never alone.
rule all:
    input:
        str(R.report_md),
        str(R.status_json),
        all_session_records,
        all_session_analysis,
