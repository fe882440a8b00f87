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


rule decide:
    output:
        f"{RUN_DIR}/decisions.json",
        f"{RUN_DIR}/tp_comm_overlap_cfg.yaml",
        f"{RUN_DIR}/ub_cfgs.json",
        f"{RUN_DIR}/chunked_cfg.yaml",
    input:
        decisions=[f"{RUN_DIR}/search/{op}/final.json" for op in S.ops],
        measurements=f"{RUN_DIR}/measurements.parquet",
        cfg=ancient(CONFIG_JSON),
    log:
        f"{RUN_DIR}/logs/decide.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune decide --config {input.cfg} --decisions {input.decisions} > {log} 2>&1"


rule report:
    output:
        f"{RUN_DIR}/report.md",
    input:
        plan=f"{RUN_DIR}/plan.parquet",
        measurements=f"{RUN_DIR}/measurements.parquet",
        decisions=f"{RUN_DIR}/decisions.json",
        cfg=ancient(CONFIG_JSON),
    log:
        f"{RUN_DIR}/logs/report.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune report --config {input.cfg} --out {output} > {log} 2>&1"
