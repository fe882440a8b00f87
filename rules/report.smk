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
        cfg=ancient(CONFIG_JSON),
    params:
        settings=lambda wc: json.dumps({"layer": S.config.get("layer"), "presets": S.config["search"].get("te_presets"),
                                        "decision": S.config["decision"], "timing": S.config["timing"]}, sort_keys=True),
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        f"{RUN_DIR}/logs/layer/tp{{tp}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune layer --config {input.cfg} --tp {wildcards.tp} --out {output} > {log} 2>&1"


rule decide:
    output:
        f"{RUN_DIR}/decisions.json",
        f"{RUN_DIR}/tp_comm_overlap_cfg.yaml",
        f"{RUN_DIR}/ub_cfgs.json",
        f"{RUN_DIR}/chunked_cfg.yaml",
    input:
        decisions=[f"{RUN_DIR}/search/{op}/final.json" for op in S.ops],
        measurements=f"{RUN_DIR}/measurements.parquet",
        layer=layer_files,
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
