# The run's resolved config, config.json. Parsing happens in every dry run and before Snakemake takes
# its lock, so nothing is written then: an invocation that goes on to run jobs writes it in onstart
# (after Snakemake's lock, never in a dry run, before any job) when it is new or a setting changed,
# holding the run's lock (workflow.start_run) for as long as it runs, so an invocation beside it is
# refused before it changes anything. No job takes config.json as an input (a job upstream of all
# would hide every other job's params from Snakemake's rerun check): what reruns is decided by each
# job's params (rules/common.smk), and a measuring job refuses a config.json that gives its session
# other measurement settings than the workflow scheduled it with.
onstart:
    try:
        run_lock.start_run(RUN_DIR, CONFIG_JSON, RESOLVED_CONFIG)
    except TptuneError as exc:
        raise WorkflowError(str(exc)) from None


rule collect:
    output:
        parquet=f"{RUN_DIR}/measurements.parquet",
        csv=f"{RUN_DIR}/measurements.csv",
    input:
        records=all_session_records,
        analysis=all_session_analysis,
    params:
        sessions=all_session_jsons,
    log:
        f"{RUN_DIR}/logs/collect.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune collect --sessions {params.sessions} --out {output.parquet} > {log} 2>&1"


# The layer stage: per TP, the block session (GPU), and the run's tuned preset it measures.
rule layer:
    output:
        f"{RUN_DIR}/layer/tp{{tp}}.json",
    input:
        unpack(calibration_input),
        points=layer_inputs,
        model=f"{RUN_DIR}/model.json",
    params:
        cfg=CONFIG_JSON,
        measurement=layer_measurement,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        f"{RUN_DIR}/logs/layer/tp{{tp}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune layer --config {params.cfg} --tp {wildcards.tp} --out {output}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


# decisions.json names the files it wrote (meta.files: one set per TP, and the model TP's under the plain
# names only when there is one), so they are not outputs Snakemake could expect in every run.
rule decide:
    output:
        f"{RUN_DIR}/decisions.json",
    input:
        decisions=[f"{RUN_DIR}/search/{op}/final.json" for op in S.ops],
        measurements=f"{RUN_DIR}/measurements.parquet",
        layer=layer_files,
    params:
        cfg=CONFIG_JSON,
        config=RESOLVED_CONFIG,
    log:
        f"{RUN_DIR}/logs/decide.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune decide --config {params.cfg} --decisions {input.decisions} > {log} 2>&1"


rule report:
    output:
        f"{RUN_DIR}/report.md",
    input:
        plan=f"{RUN_DIR}/plan.parquet",
        measurements=f"{RUN_DIR}/measurements.parquet",
        decisions=f"{RUN_DIR}/decisions.json",
    params:
        cfg=CONFIG_JSON,
        config=RESOLVED_CONFIG,
    log:
        f"{RUN_DIR}/logs/report.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune report --config {params.cfg} --out {output} > {log} 2>&1"


# The run's last job: it fails (and the run ends non-zero) when a stage had no successful member; the
# report, written before it, says which at its top. Re-runs once the failed sessions are re-measured.
rule check_run:
    output:
        f"{RUN_DIR}/status.json",
    input:
        f"{RUN_DIR}/report.md",
    params:
        run_dir=lambda wc, output: os.path.dirname(output[0]),
    log:
        f"{RUN_DIR}/logs/check_run.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune check-run {params.run_dir} --out {output} > {log} 2>&1"
