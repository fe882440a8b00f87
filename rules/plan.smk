rule model:
    output:
        f"{RUN_DIR}/model.json",
    input:
        model_file=config["model"],
    params:
        cfg=CONFIG_JSON,
        model=json.dumps(S.model.to_dict()["model"] | S.model.to_dict()["workload"], sort_keys=True),
    log:
        f"{RUN_DIR}/logs/model.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune model --config {params.cfg} --out {output} > {log} 2>&1"


rule plan:
    output:
        parquet=report(f"{RUN_DIR}/plan.parquet", category="Plan"),
        csv=f"{RUN_DIR}/plan.csv",
    input:
        model=f"{RUN_DIR}/model.json",
    params:
        cfg=CONFIG_JSON,
        plan=json.dumps({"tp": S.tp_sizes, "ops": S.ops, "hw": config.get("hardware")}, sort_keys=True),
    log:
        f"{RUN_DIR}/logs/plan.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune plan --config {params.cfg} --out {output.parquet} > {log} 2>&1"
