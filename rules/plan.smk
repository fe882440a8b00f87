rule model:
    output:
        MODEL_JSON,
    input:
        model_file=config["model"],
    params:
        cfg=CONFIG_JSON,
        model=json.dumps(S.model.to_dict()["model"] | S.model.to_dict()["workload"], sort_keys=True),
    log:
        str(R.log("model")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune model --config {params.cfg} --out {output} > {log} 2>&1"


rule plan:
    output:
        parquet=report(str(R.plan_parquet), category="Plan"),
        csv=str(R.plan_csv),
    input:
        model=MODEL_JSON,
    params:
        cfg=CONFIG_JSON,
        plan=json.dumps({"tp": S.tp_sizes, "ops": S.ops, "hw": config.get("hardware")}, sort_keys=True),
    log:
        str(R.log("plan")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune plan --config {params.cfg} --out {output.parquet} > {log} 2>&1"
