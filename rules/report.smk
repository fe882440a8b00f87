rule collect:
    output:
        f"{RUN_DIR}/measurements.parquet",
        f"{RUN_DIR}/measurements.csv",
    input:
        runs=all_case_runs,
        analysis=all_case_analysis,
    log:
        f"{RUN_DIR}/logs/collect.log",
    shell:
        "tptune collect --run-dir {RUN_DIR} --run-jsons {input.runs} --out {output[0]} > {log} 2>&1"


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
    shell:
        "tptune decide --config {input.cfg} --run-dir {RUN_DIR} --decisions {input.decisions} > {log} 2>&1"


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
    shell:
        "tptune report --config {input.cfg} --run-dir {RUN_DIR} --out {output} > {log} 2>&1"
