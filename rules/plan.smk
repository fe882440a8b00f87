# A dry run (snakemake -n) says the run's predicted wall time on this node before anything is measured
# (tptune plan writes it to wall_predicted.json in a real run): once, in the main process (never in a
# cluster job, which parses this file again), and nothing here can stop planning (cli.wall.dry_run_line).
if getattr(workflow.output_settings, "dryrun", False) and workflow.is_main_process:
    from tptune.cli.wall import dry_run_line

    print(dry_run_line(S), file=sys.stderr)


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
