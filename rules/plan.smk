rule model:
    output:
        f"{RUN_DIR}/model.json",
    input:
        model_file=config["model"],
    params:
        model=json.dumps(S.model.to_dict()["model"] | S.model.to_dict()["workload"], sort_keys=True),
    log:
        f"{RUN_DIR}/logs/model.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune model --config {CONFIG_JSON} --out {output} > {log} 2>&1"


rule plan:
    output:
        parquet=report(f"{RUN_DIR}/plan.parquet", category="Plan"),
        csv=f"{RUN_DIR}/plan.csv",
    input:
        model=f"{RUN_DIR}/model.json",
    params:
        plan=json.dumps({"tp": S.tp_sizes, "ops": S.ops, "hw": config.get("hardware")}, sort_keys=True),
    log:
        f"{RUN_DIR}/logs/plan.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune plan --config {CONFIG_JSON} --out {output.parquet} > {log} 2>&1"
